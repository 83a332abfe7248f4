"""Sphinx extension: notebook outputs must not load anything from the internet.

Loaded from _config.yml (``sphinx: local_extensions``).  matplotlib's ``to_jshtml()``
animations embed ``<link href="https://maxcdn.../font-awesome.min.css">`` for their button
icons; the theme already ships Font Awesome (its JavaScript draws ``<i class="fa fa-play">``
as SVG, old icon names included), so that link is dropped.  Any other HTML output that would
fetch a script, stylesheet, image or frame from another host is a build warning (and so an
error under ``-W``): save it into the notebook, or serve it from _static/.

It also removes inline scripts that Sphinx 7.4 emits twice (a JavaScript error otherwise).
"""

from __future__ import annotations

import re

from docutils import nodes
from sphinx.util import logging

logger = logging.getLogger(__name__)

# Stylesheets we know are redundant on this site (served locally by the theme).
REDUNDANT_LINKS = re.compile(
    r'<link\b[^>]*\bhref=["\']https?://maxcdn\.bootstrapcdn\.com/font-awesome/[^"\']*["\'][^>]*>\s*', re.I
)
# Anything else that a browser would fetch on its own from a remote host.
REMOTE_FETCH = re.compile(
    r'<(script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(src|href)\s*=\s*["\']((?:https?:)?//[^"\']+)',
    re.I,
)
REMOTE_CSS = re.compile(r'@import\s+(?:url\()?["\']?((?:https?:)?//[^"\')\s]+)', re.I)


def _offline_raw_html(app, doctree, docname):
    for node in list(doctree.findall(nodes.raw)):
        if "html" not in node.get("format", "").split():
            continue
        text = node.astext()
        new = REDUNDANT_LINKS.sub("", text)
        if new != text:
            node.replace_self(nodes.raw(new, new, **{k: node[k] for k in ("format",) if k in node}))
        for m in list(REMOTE_FETCH.finditer(new)) + list(REMOTE_CSS.finditer(new)):
            url = m.groups()[-1]
            logger.warning(
                "notebook output loads %s from the internet; the site must work offline (save it locally)",
                url,
                location=(docname, node.line),
                type="offline",
                subtype="remote",
            )


def _dedupe_scripts(app, pagename, templatename, context, doctree):
    """Drop repeated inline scripts: Sphinx 7.4 re-adds body-only scripts registered by
    extensions (filename None vs ''), and a repeated ``const`` is a JavaScript error."""
    files = context.get("script_files")
    if not isinstance(files, list):
        return
    seen, keep = set(), []
    for js in files:
        attrs = getattr(js, "attributes", {})
        key = (getattr(js, "filename", js) or "", tuple(sorted(attrs.items())))
        if key not in seen:
            seen.add(key)
            keep.append(js)
    files[:] = keep


def setup(app):
    app.connect("doctree-resolved", _offline_raw_html)
    app.connect("html-page-context", _dedupe_scripts, priority=900)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
