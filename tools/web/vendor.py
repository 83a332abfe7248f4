"""Copy the JavaScript and fonts the website serves itself (no CDN) into _build/offline/.

    python tools/web/vendor.py                  # npm ci (when needed), then copy
    python tools/web/vendor.py --book DIR       # the same for a copy of the book in DIR

The packages come from the npm registry at build time, pinned by tools/web/package-lock.json:

* ``mathjax`` (v3): its loader, the TeX input and CommonHTML output, its fonts and the
  extensions TeX loads on demand (``_vendor/mathjax/``; _config.yml sets ``mathjax_path`` to it);
* ``@jupyter-widgets/html-manager``: the embed bundle that renders saved widget state,
  with the icon fonts it loads next to itself (``_vendor/widgets/``; _config.yml sets
  myst-nb's ``nb_ipywidgets_js`` to it, so no require.js and no CDN are used).

_config.yml lists ``_build/offline`` in ``html_extra_path``: Sphinx copies its contents
to the root of the built site.  (They cannot live in ``_static/``: Jupyter Book adds every
.js/.css file found there to every page.)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

WEB = Path(__file__).resolve().parent
ROOT = WEB.parents[1]
OUT = ROOT / "_build" / "offline"
NODE = WEB / "node_modules"

# MathJax: startup.js loads the components _config.yml's mathjax3_config names (core, the TeX
# input with its autoloaded extensions, CHTML output and its fonts). Not tex-chtml.js: that
# combined bundle also carries the right-click menu (416 KB of its 1.1 MB), which the site
# does not need. The menu and accessibility parts stay copied for anything that asks for them.
MATHJAX_FILES = [
    "startup.js",
    "core.js",
    "input",
    "output/chtml.js",
    "output/chtml",
    "ui",
    "a11y",
    "sre",
    "adaptors",
]
MATHJAX_ENTRY = "startup.js"
WIDGETS_ENTRY = "embed.js"


def _installed_matches_lock() -> bool:
    """True when node_modules holds exactly the versions package-lock.json pins."""
    lock = json.loads((WEB / "package-lock.json").read_text())
    for path, meta in lock.get("packages", {}).items():
        if not path or meta.get("dev") or meta.get("optional"):
            continue
        pkg = WEB / path / "package.json"
        if not pkg.exists() or json.loads(pkg.read_text()).get("version") != meta.get("version"):
            return False
    return True


def npm_ci() -> None:
    """Install the pinned packages (skipped when node_modules already matches the lock)."""
    if NODE.is_dir() and _installed_matches_lock():
        return
    npm = shutil.which("npm")
    if npm is None:
        sys.exit("[web] npm not found: install Node.js (it brings npm), then run this again")
    print("[web] npm ci (tools/web/package-lock.json)", flush=True)
    subprocess.run(
        [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"], cwd=WEB, check=True
    )


def _copy(src: Path, dst: Path) -> None:
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.map"))
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def copy_assets(out: Path = OUT) -> Path:
    """Copy MathJax and the widget embed bundle into ``out/_vendor``; return that folder."""
    vendor = out / "_vendor"
    if vendor.exists():
        shutil.rmtree(vendor)
    mathjax = NODE / "mathjax" / "es5"
    for rel in MATHJAX_FILES:
        _copy(mathjax / rel, vendor / "mathjax" / rel)
    _copy(NODE / "mathjax" / "LICENSE", vendor / "mathjax" / "LICENSE")
    dist = NODE / "@jupyter-widgets" / "html-manager" / "dist"
    # embed.js finds its fonts next to itself (webpack's automatic public path).
    for f in dist.iterdir():
        if (
            f.name == WIDGETS_ENTRY
            or f.name.endswith(".LICENSE.txt")
            or f.suffix in {".woff", ".woff2", ".ttf", ".eot", ".svg"}
        ):
            _copy(f, vendor / "widgets" / f.name)
    # MathJax 2 API that @jupyter-widgets/controls still calls (MathJax 3 has no Hub).
    _copy(WEB / "mathjax2-hub-shim.js", vendor / "widgets" / "mathjax2-hub-shim.js")
    for entry in (vendor / "mathjax" / MATHJAX_ENTRY, vendor / "widgets" / WIDGETS_ENTRY):
        if not entry.is_file():
            sys.exit(f"[web] {entry} is missing after the copy")
    return vendor


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--book", type=Path, default=ROOT, help="the book's folder (default: this repo)")
    args = ap.parse_args()
    npm_ci()
    vendor = copy_assets(args.book.resolve() / "_build" / "offline")
    size = sum(p.stat().st_size for p in vendor.rglob("*") if p.is_file())
    print(f"[web] offline assets: {vendor} ({size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
