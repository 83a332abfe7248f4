"""Sphinx extension: read only the book's own sources, wherever a venv or a build folder sits.

Loaded from _config.yml (``sphinx: local_extensions``).  Sphinx walks the whole source folder,
hidden folders included, so a virtual environment at ``.venv`` inside the clone (the README's
own suggestion) put every README of site-packages into the build (178 "document isn't included
in any toctree" warnings, which ``-W`` turns into a failed build).  ``only_build_toc_files``
does not help: sphinx-external-toc lists what to exclude with ``glob``, which skips hidden
folders.  So, once the table of contents is parsed, every top-level entry of the source folder
that holds no page of the table of contents is excluded (the walk never enters it), and so is
every hidden file or folder below.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath


def toc_top_levels(docnames) -> set[str]:
    """The first path component of each page of the table of contents ('intro', 'chapters', …)."""
    return {PurePosixPath(d).parts[0] for d in docnames}


def outside_the_book(srcdir: Path, docnames) -> list[str]:
    """Exclude patterns for the top-level entries of ``srcdir`` that hold no page of the book."""
    keep = toc_top_levels(docnames)
    patterns = []
    for entry in sorted(srcdir.iterdir()):
        stem = entry.name.split(".")[0] if entry.is_file() else entry.name
        if entry.name.startswith(".") or stem not in keep:
            patterns.append(entry.name + ("/**" if entry.is_dir() else ""))
            if entry.is_dir():
                patterns.append(entry.name)
    return patterns + ["**/.*"]


def _exclude_outside(app, config):
    site_map = getattr(config, "external_site_map", None)
    if site_map is None:  # no external ToC: nothing to go by
        return
    docnames = [str(d) for d in site_map]
    config.exclude_patterns = list(config.exclude_patterns) + outside_the_book(Path(app.srcdir), docnames)


def setup(app):
    # after sphinx-external-toc (priority 900) has parsed _toc.yml into config.external_site_map
    app.connect("config-inited", _exclude_outside, priority=950)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
