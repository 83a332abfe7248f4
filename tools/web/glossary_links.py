"""Sphinx extension: a notebook's Markdown link to a glossary entry is a glossary reference.

Loaded from _config.yml (``sphinx: local_extensions``). A notebook names a glossary term with a plain
Markdown link, ``[chain rule](../pages/glossary.md#term-chain-rule)``: Colab and JupyterLab show a
MyST ``{term}`` role as raw text, and a link reads as a link there. On the site MyST would resolve it
as a link to a heading of pages/glossary and warn that ``term-chain-rule`` is no heading; this
post-transform runs first and makes each such link what the role made, a reference to the term's
entry (``std-term``), and a link to an entry the glossary does not have is a warning (``-W``: a
failed build), as an unknown term was.
"""

from __future__ import annotations

from docutils import nodes
from sphinx import addnodes
from sphinx.transforms import SphinxTransform
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging
from sphinx.util.nodes import make_refnode

GLOSSARY = "pages/glossary"
logger = logging.getLogger(__name__)


class MarkGlossaryLinks(SphinxTransform):
    """Each glossary link gets a target of its own, "pages/glossary#term-…", before the Chinese
    edition's translation (Sphinx's Locale transform, priority 20). Locale copies the attributes of the
    English paragraph's reference onto the translated one with the same (domain, type, target), and
    every glossary link's target was "pages/glossary": each pointed at the paragraph's last term. The
    translated paragraph's own links (parsed without this transform) then keep their own targets, in
    whatever order the translation has them, and ``GlossaryLinks`` resolves both kinds."""

    default_priority = 15

    def apply(self, **kwargs) -> None:
        for node in self.document.findall(addnodes.pending_xref):
            if (
                node.get("reftype") == "myst"
                and node.get("reftarget") == GLOSSARY
                and (node.get("reftargetid") or "").startswith("term-")
            ):
                node["reftype"], node["reftarget"] = "glossary", f"{GLOSSARY}#{node['reftargetid']}"


class GlossaryLinks(SphinxPostTransform):
    """[text](…/glossary.md#term-…) -> a reference to that glossary entry (before MyST resolves links)."""

    default_priority = 8  # MyST's reference resolver is 9

    def run(self, **kwargs) -> None:
        entries = {
            labelid
            for (kind, _), (docname, labelid) in self.env.get_domain("std").objects.items()
            if kind == "term" and docname == GLOSSARY
        }
        for node in list(self.document.findall(addnodes.pending_xref)):
            if node.get("reftype") == "glossary":  # marked before Locale
                target = node["reftarget"].partition("#")[2]
            elif node.get("reftype") == "myst" and node.get("reftarget") == GLOSSARY:  # a translated one
                target = node.get("reftargetid") or ""
                if not target.startswith("term-"):
                    continue
            else:
                continue
            if target not in entries:
                logger.warning(
                    f"a glossary link to {target!r}: the glossary has no such entry", location=node
                )
                node.replace_self(node[0].deepcopy())
                continue
            inner = nodes.inline("", "", classes=["xref", "std", "std-term"])
            inner.extend(child.deepcopy() for child in node[0].children)
            fromdoc = node.get("refdoc", self.env.docname)
            node.replace_self(make_refnode(self.app.builder, fromdoc, GLOSSARY, target, inner))


def setup(app):
    app.add_transform(MarkGlossaryLinks)
    app.add_post_transform(GlossaryLinks)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
