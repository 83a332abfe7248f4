"""Sphinx extension: on the Chinese site, a chapter's Colab and download buttons give its Chinese notebook.

Loaded from _config.yml (``sphinx: local_extensions``). sphinx-book-theme links every launch
button to the page's own source in the repository (``…/blob/main/chapters/01_cat_mlp.ipynb``) and
its download button to the copy Sphinx keeps in ``_sources/``: on the Chinese site both are the
English notebook. Where ``zh/<page>.ipynb`` exists (``python tools/i18n.py notebooks`` writes one
per chapter), the launch buttons point at it (``…/blob/main/zh/chapters/01_cat_mlp.ipynb``) and it
replaces the English copy in ``_sources/``. Pages without one (the labs, still English) keep the
English links. The English site is left as it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

FOLDER = "zh"  # tools/i18n.py's NOTEBOOKS, relative to the book's root


def _chinese(app) -> bool:
    return (app.config.language or "").startswith("zh")


def _notebook(app, pagename: str) -> Path:
    return Path(app.srcdir) / FOLDER / f"{pagename}.ipynb"


def _relink(buttons, old: str, new: str) -> None:
    """Every launch button's url ending in the English notebook's repository path, made the Chinese one's."""
    for button in buttons:
        if isinstance(button, dict):
            url = button.get("url")
            if isinstance(url, str) and url.startswith("http") and url.endswith(old):
                button["url"] = url[: -len(old)] + new
            _relink(button.get("buttons", []), old, new)


def launch_buttons(app, pagename, templatename, context, doctree) -> None:
    if _chinese(app) and _notebook(app, pagename).exists():
        _relink(context.get("header_buttons", []), f"/{pagename}.ipynb", f"/{FOLDER}/{pagename}.ipynb")


def downloads(app, exception) -> None:
    """The Chinese notebooks in place of the English ones under _sources/ (the download button's)."""
    if exception is None and _chinese(app) and app.builder.format == "html":
        for docname in app.env.found_docs:
            source = _notebook(app, docname)
            target = Path(app.outdir) / "_sources" / f"{docname}.ipynb"
            if source.exists() and target.exists():
                shutil.copyfile(source, target)


def setup(app):
    # after sphinx-book-theme's own html-page-context handler (priority 500) has made the buttons
    app.connect("html-page-context", launch_buttons, priority=900)
    app.connect("build-finished", downloads)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
