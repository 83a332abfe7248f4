"""The whole book as one PDF: every chapter and lab, math typeset, figures in, code wrapped, not cut.

    python tools/pdf.py                       # -> _build/html/backprop-by-hand.pdf (the site links it)
    python tools/pdf.py --out book.pdf        # somewhere else
    python tools/pdf.py --path-output DIR     # build in DIR/_build (tests/test_site.py does this)

Sphinx's ``singlehtml`` builder writes the book as one page (the same toc, the committed outputs,
nothing executed); headless Chromium, the one the browser tests use, waits until MathJax has
typeset every formula and every image has loaded, then prints the page with the print rules
of ``_static/custom.css`` (code wraps, headings stay with their text, no sidebars).
``tools/book.sh`` runs this after the website when Chromium is installed.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
PDF_NAME = "backprop-by-hand.pdf"


def build_singlehtml(path_output: Path, toc: Path | None = None) -> Path:
    """Run ``jupyter-book build --builder singlehtml``; return the folder holding the one page."""
    cmd = [
        sys.executable,
        "-c",
        "import sys; from jupyter_book.cli.main import main; sys.argv[0] = 'jupyter-book'; main()",
        "build",
        "--builder",
        "singlehtml",
        "--path-output",
        str(path_output),
        str(ROOT),
    ]
    if toc:
        cmd[-1:-1] = ["--toc", str(toc)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(
            f"pdf: the singlehtml build failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    return path_output / "_build" / "singlehtml"


def _serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/"


WAIT_FOR_PAGE = """async () => {
  const imgs = Array.from(document.querySelectorAll('img'));
  for (const img of imgs) if (img.loading === 'lazy') img.loading = 'eager';
  await Promise.all(imgs.map(img => img.complete ? null :
      new Promise(r => { img.addEventListener('load', r); img.addEventListener('error', r); })));
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) await MathJax.startup.promise;
  return [document.querySelectorAll('mjx-container').length, imgs.length];
}"""

# Code boxes wider than the printed column would be cut on paper.
CUT_CODE = (
    """() => [...document.querySelectorAll('pre')].filter(p => p.scrollWidth > p.clientWidth + 1).length"""
)
A4_COLUMN_PX = 688  # (210 mm − 2 × 14 mm margins) at 96 px per inch


def print_pdf(folder: Path, out: Path, browser=None) -> tuple[int, int, int]:
    """Print ``folder``'s single page to ``out``; returns (formulas typeset, images, code boxes cut).

    ``browser``: a Playwright Chromium already running (the browser tests' own); else one is started.
    """
    if browser is None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            try:
                return print_pdf(folder, out, browser)
            finally:
                browser.close()
    page_name = next(p.name for p in sorted(folder.glob("*.html")) if p.name != "index.html")
    server, url = _serve(folder)
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    try:
        # Nothing leaves this machine: the book is self-contained.
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(url) else r.abort())
        page.goto(url + page_name, wait_until="load", timeout=300_000)
        page.set_default_timeout(300_000)
        formulas, images = page.evaluate(WAIT_FOR_PAGE)
        page.emulate_media(media="print")
        page.set_viewport_size({"width": A4_COLUMN_PX, "height": 900})
        cut = page.evaluate(CUT_CODE)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.pdf(
            path=str(out),
            format="A4",
            print_background=True,
            margin={"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"},
            display_header_footer=True,
            header_template="<span></span>",
            footer_template=(
                '<div style="font-size:8px;width:100%;text-align:center;color:#666">'
                'Backprop by Hand · <span class="pageNumber"></span> / <span class="totalPages"></span></div>'
            ),
        )
    finally:
        page.close()
        server.shutdown()
    return formulas, images, cut


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path-output", type=Path, default=ROOT, help="build in DIR/_build (default: the repo)")
    ap.add_argument("--toc", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help=f"default: <path-output>/_build/html/{PDF_NAME}")
    args = ap.parse_args(argv)
    if not Path(CHROMIUM).exists():
        sys.exit(f"pdf: no Chromium at {CHROMIUM} (set CHROMIUM=...; apt-get install chromium)")
    start = time.time()
    folder = build_singlehtml(args.path_output.resolve(), args.toc)
    built = time.time()
    out = args.out or args.path_output.resolve() / "_build" / "html" / PDF_NAME
    formulas, images = print_pdf(folder, out)
    size = out.stat().st_size / 1e6
    print(
        f"pdf: {out} ({size:.1f} MB, {formulas} formulas, {images} images) in {time.time() - start:.0f} s "
        f"({built - start:.0f} s singlehtml build)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
