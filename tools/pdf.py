"""The whole book as one PDF: every chapter and lab, math typeset, figures in, code wrapped, not cut.

    python tools/pdf.py                       # -> _build/html/backprop-by-hand.pdf (the site links it)
    python tools/pdf.py --out book.pdf        # somewhere else
    python tools/pdf.py --path-output DIR     # build in DIR/_build (tests/test_site.py does this)
    python tools/pdf.py --tagged              # a tagged (accessible) PDF, about 2.5 times the size

Sphinx's ``singlehtml`` builder writes the book as one page (the same toc, the committed outputs,
nothing executed); headless Chromium, the one the browser tests use, waits until MathJax has
typeset every formula and every image has loaded, then prints the page with the print rules
of ``_static/custom.css`` (code wraps, headings stay with their text, no sidebars) and those
below (each chapter and lab starts a page; the contents page).

The first page is a contents page: the book's parts, each chapter with its lab under it and the
reference pages, with the page each starts on.  Those numbers come from the PDF itself: the book
is printed once with placeholders, the page of each entry is read back from the PDF's named
destinations (Chromium writes one for every element a link points to), then printed again with
the numbers, which take the placeholders' width so that no page moves; the numbers are checked
against the second print.  The PDF's outline (bookmarks) is written with pypdf from the page's
headings: each chapter, lab and reference page at the top level, its sections under it.
(Chromium's own ``outline`` option needs a tagged PDF and takes its titles from the printed lines:
headings that wrap lose a space, formulas vanish, some titles come out twice.)

It prints one line: pages, formulas, images, code boxes cut, empty-frame pages, contents entries
and bookmarks.  A code box too wide for the A4 column would be cut on paper, and a page with
nothing on it but the footer wastes paper (there were empty grey code frames before tall cells,
see _static/custom.css, and a blank page before a lab, see BOOK_CSS): the PDF is still written,
the boxes and pages are named, and the exit status is 1.  ``tools/book.sh`` runs this after the website when Chromium
is installed.
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import io
import logging
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
PDF_NAME = "backprop-by-hand.pdf"
TITLE = "Backprop by Hand"
# the contents page's own words (tools/i18n.py has the Chinese edition's)
LABELS = {"contents": "Contents", "introduction": "Introduction"}


def build_singlehtml(path_output: Path, toc: Path | None = None, config: Path | None = None) -> Path:
    """Run ``jupyter-book build --builder singlehtml``; return the folder holding the one page.

    ``config``: another _config.yml (the Chinese edition's, tools/i18n.py's ``zh_config``)."""
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
    if config:
        cmd[-1:-1] = ["--config", str(config)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(
            f"pdf: the singlehtml build failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    return path_output / "_build" / "singlehtml"


def read_toc(path: Path) -> list[list]:
    """The parts of a jb-book table of contents: [[caption, [[docname, level], ...]], ...].

    Chapters are level 1 and the pages under them (each chapter's lab) level 2; a toc without
    parts is one part without a caption.
    """
    import yaml

    toc = yaml.safe_load(path.read_text(encoding="utf-8"))

    def docs(nodes, level):
        for node in nodes or []:
            if "file" in node:
                yield [
                    os.path.splitext(node["file"])[0]
                    if node["file"].endswith((".md", ".ipynb"))
                    else node["file"],
                    min(level, 2),
                ]
            yield from docs(node.get("sections"), level + 1)

    parts = toc.get("parts") or [{"chapters": toc.get("chapters")}]
    return [[part.get("caption") or "", list(docs(part.get("chapters"), 1))] for part in parts]


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

# A cell the site shows folded ("Show code cell content") prints unfolded: on paper a fold is a
# heading with nothing under it; so do the asides ("What the source articles got wrong"), under
# their title. Returns how many cells it opened.
OPEN_HIDDEN_CELLS = """() => { const folded = [...document.querySelectorAll('div.cell details.hide')];
  folded.forEach(d => { d.open = true; d.classList.add('bbh-printed-open'); });
  document.querySelectorAll('details.bbh-errata').forEach(d => { d.open = true; });  // title kept
  return folded.length; }"""

# Code boxes wider than the printed column would be cut on paper: the longest line of each.
CUT_CODE = """() => [...document.querySelectorAll('pre')].filter(p => p.scrollWidth > p.clientWidth + 1)
  .map(p => p.textContent.split('\\n').reduce((a, l) => l.length > a.length ? l : a, '').trim().slice(0, 60))"""
A4_COLUMN_PX = 688  # (210 mm − 2 × 14 mm margins) at 96 px per inch

MARGIN = {"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"}  # the footer is in the bottom one
PLACEHOLDER = "000"  # a page number before it is known: as wide as any the book will need

# The book's print layout on top of _static/custom.css and the theme's print rules.
BOOK_CSS = """
@media print {
  /* a folded cell, opened (OPEN_HIDDEN_CELLS): its code and output without the fold's title */
  details.bbh-printed-open > summary { display: none !important; }  /* the theme sets it, more specific */
  /* each chapter, lab and reference page starts a page (singlehtml: a span, then its section);
     the break goes before the span, the target of links to the page, made a block: inline after
     a full page, it printed a blank page of its own before the section's break */
  span[id^="document-"]:has(+ section) { display: block; break-before: page; }
  #bbh-contents { break-after: page; font-size: 0.88rem; }
  #bbh-contents h2 { font-size: 1.5rem; margin: 0.8rem 0 0.3rem; padding: 0; border: 0; }
  #bbh-contents .bbh-part { font-weight: 700; margin: 0.6rem 0 0.1rem; color: #1f3a5f; }
  #bbh-contents a { display: flex; align-items: last baseline; gap: 0.35rem; color: inherit;
                    text-decoration: none !important; line-height: 1.35; margin: 0.1rem 0;
                    break-inside: avoid; }
  #bbh-contents a .bbh-dots { flex: 1 1 1rem; border-bottom: 1px dotted #888; }
  #bbh-contents a .bbh-page { flex: none; min-width: 3ch; text-align: right;
                              font-variant-numeric: tabular-nums; }
  #bbh-contents a.bbh-level-2 { padding-left: 1.6rem; color: #333; }
}
"""

# Puts the contents page in place of the theme's print-only page contents (#jb-print-toc), from
# the table of contents' parts (read_toc: the captions, the chapters, their labs under them), each
# entry titled as its page's first heading; lists the headings for the outline.
# Returns {contents: [[id, title, level]], outline: [[level, title, id]]}; ids are headings' ids.
PREPARE_BOOK = r"""([placeholder, parts, labels]) => {
  const text = (el) => {
    const c = el.cloneNode(true);
    c.querySelectorAll('.headerlink, mjx-assistive-mml').forEach(e => e.remove());
    const items = window.MathJax && MathJax.startup && MathJax.startup.document
      ? MathJax.startup.document.getMathItemsWithin(el) : [];
    const tex = new Map(items.map(m => [m.typesetRoot, m.math]));
    const copies = c.querySelectorAll('mjx-container'), originals = el.querySelectorAll('mjx-container');
    copies.forEach((m, i) => m.replaceWith(document.createTextNode(texToText(tex.get(originals[i]) || ''))));
    return c.textContent.replace(/\s+/g, ' ').trim();
  };
  const symbols = {partial: '∂', nabla: '∇', theta: 'θ', alpha: 'α', beta: 'β', gamma: 'γ', eta: 'η',
                   lambda: 'λ', mu: 'μ', sigma: 'σ', top: 'ᵀ', cdot: '·', times: '×', circ: '∘',
                   odot: '⊙', otimes: '⊗', sqrt: '√', sum: 'Σ', to: '→', leftarrow: '←', approx: '≈'};
  const texToText = (tex) => tex
    .replace(/\\hat\s*\{?\s*y\s*\}?/g, 'ŷ')
    .replace(/\\(mathrm|mathbf|text|operatorname)\s*\{([^}]*)\}/g, '$2')
    .replace(/\\[,;:! ]/g, ' ')
    .replace(/\\([A-Za-z]+) ?/g, (m, name) => symbols[name] ?? name)
    .replace(/\^\{?([0-9])\}?/g, (m, d) => '⁰¹²³⁴⁵⁶⁷⁸⁹'[d])
    .replace(/[{}]/g, '').replace(/\^ᵀ/g, 'ᵀ').replace(/\s+/g, ' ').trim();

  const docSection = (docname) => {
    const span = document.getElementById('document-' + docname);
    const sec = span && span.nextElementSibling;
    return sec && sec.tagName === 'SECTION' ? sec : null;
  };
  // Section ids repeat across documents ('summary', 'common-mistakes'), and a destination goes to
  // the first element of its name: each heading gets an id of its own, and entries point at it.
  let n = 0;
  const target = (heading) => heading.id || (heading.id = 'bbh-h' + (++n));
  const title = (sec) => sec.querySelector('h1, h2, h3, h4, h5, h6');
  const article = document.querySelector('article.bd-article');
  const root = article && article.querySelector(':scope > section');
  const contents = [], outline = [];
  const toc = document.querySelector('#jb-print-toc');
  if (toc && root && parts) {
    const nav = document.createElement('nav');
    nav.id = 'bbh-contents';
    nav.setAttribute('aria-label', labels.contents);
    nav.innerHTML = '<h2></h2>';
    nav.querySelector('h2').textContent = labels.contents;
    const row = (id, label, level) => {
      const a = document.createElement('a');
      a.href = '#' + id;
      a.className = 'bbh-level-' + level;
      a.dataset.target = id;
      a.innerHTML = '<span class="bbh-title"></span><span class="bbh-dots"></span><span class="bbh-page"></span>';
      a.querySelector('.bbh-title').textContent = label;
      a.querySelector('.bbh-page').textContent = placeholder;
      nav.appendChild(a);
      contents.push([id, label, level]);
    };
    row(root.id || (root.id = 'bbh-introduction'), labels.introduction, 1);
    for (const [caption, docnames] of parts) {
      if (caption) {
        const part = document.createElement('div');
        part.className = 'bbh-part';
        part.textContent = caption;
        nav.appendChild(part);
      }
      for (const [docname, level] of docnames) {
        const sec = docSection(docname);
        if (sec && title(sec)) row(target(title(sec)), text(title(sec)), level);
      }
    }
    toc.replaceChildren(nav);
  }
  // The outline: each document's title at level 1, its own headings under it by their depth in it.
  if (root && !root.id) root.id = 'bbh-introduction';
  const documents = root ? [[root, labels.introduction]] : [];
  for (const span of document.querySelectorAll('span[id^="document-"]')) {
    const sec = span.nextElementSibling;
    if (sec && sec.tagName === 'SECTION') documents.push([sec, null]);
  }
  const isDocument = new Set(documents.map(([sec]) => sec));
  for (const [sec, name] of documents) {
    const heads = [...sec.querySelectorAll('h1, h2, h3, h4, h5, h6')].filter(h => {
      let s = h.closest('section');
      while (s && !isDocument.has(s)) s = s.parentElement.closest('section');
      return s === sec;  // not a heading of a document nested in this one (a chapter's lab)
    });
    if (!heads.length) continue;
    const top = +heads[0].tagName[1];
    // The introduction's title is hidden in print (the theme shows the book's title instead).
    outline.push([1, name || text(heads[0]), sec === root ? root.id : target(heads[0])]);
    for (const h of heads.slice(1)) outline.push([Math.min(6, +h.tagName[1] - top + 1), text(h), target(h)]);
  }
  // Chromium writes a named destination for each element that a link points to: link them all.
  const links = document.createElement('div');
  links.hidden = true;
  for (const id of new Set([...contents.map(c => c[0]), ...outline.map(o => o[2])])) {
    const a = document.createElement('a');
    a.href = '#' + id;
    links.appendChild(a);
  }
  document.body.appendChild(links);
  return {contents, outline};
}"""

FILL_PAGES = """(pages) => {
  for (const a of document.querySelectorAll('#bbh-contents a[data-target]'))
    a.querySelector('.bbh-page').textContent = String(pages[a.dataset.target] ?? '?');
}"""


@dataclass
class Printed:
    """What print_pdf made."""

    formulas: int = 0
    images: int = 0
    cut: list[str] = field(default_factory=list)  # the longest line of each code box cut on paper
    empty: list[int] = field(default_factory=list)  # pages with nothing but the footer (empty_pages)
    pages: int = 0
    contents: list[tuple[str, str, int, int]] = field(default_factory=list)  # (id, title, level, page)
    bookmarks: int = 0
    passes: int = 0


def _pdf_pages(data: bytes, ids) -> tuple[object, dict[str, int]]:
    """The PDF read with pypdf, and the 1-based page of each id's named destination."""
    try:
        import pypdf
    except ImportError:
        sys.exit("pdf: needs pypdf, pinned in requirements.txt: pip install -r requirements.txt")

    logging.getLogger("pypdf").setLevel(logging.ERROR)  # Chromium's trailer /Size is a few objects short
    reader = pypdf.PdfReader(io.BytesIO(data))
    dests = reader.named_destinations
    pages = {}
    for id_ in ids:
        dest = dests.get("/" + id_) or dests.get(id_)
        if dest is not None:
            pages[id_] = reader.get_destination_page_number(dest) + 1
    return reader, pages


SHOWN_TEXT = re.compile(rb"(?<![A-Za-z])(?:Tj|TJ)(?![A-Za-z])")  # the operators that show a string
FOOTER_STRINGS = 12  # the footer shows 5 strings (6 in Chinese); a page showing more has text of its own


def empty_pages(reader, margin_pt: float = float(MARGIN["top"][:-2]) * 72 / 25.4) -> list[int]:
    """The 1-based pages with no text between the top and bottom margins and no image.

    Such a page holds the footer and at most frames and rules: Chromium printed a tall cell's
    grey input frame alone on a page, its code on the next (see _static/custom.css), and once a
    blank page before a lab (BOOK_CSS).  Text is placed by pypdf's text visitor (PDF space: y
    from the page's bottom); an image is a drawn XObject or an inline image.  Only pages showing
    few strings are read that closely (reading every page's text takes 15 s for the book).
    """
    from pypdf.generic import ContentStream

    empty = []
    for number, page in enumerate(reader.pages, 1):
        contents = page.get_contents()
        data = contents.get_data() if contents is not None else b""
        if len(SHOWN_TEXT.findall(data)) > FOOTER_STRINGS:
            continue
        height, body = float(page.mediabox.height), []

        def visit(text, cm, tm, font, size, height=height, body=body):
            y = tm[4] * cm[1] + tm[5] * cm[3] + cm[5]  # the text's origin: Tm, then the CTM
            if text.strip() and margin_pt < y < height - margin_pt:
                body.append(text)

        page.extract_text(visitor_text=visit)
        if body or (
            contents is not None
            and any(op in (b"Do", b"INLINE IMAGE") for _, op in ContentStream(contents, reader).operations)
        ):
            continue
        empty.append(number)
    return empty


def _with_outline(reader, outline, out: Path, title: str = TITLE) -> int:
    """Write ``reader``'s PDF to ``out`` with ``outline`` ([level, title, id]) as its bookmarks."""
    import pypdf
    from pypdf.generic import Fit

    writer = pypdf.PdfWriter(clone_from=reader)
    dests = reader.named_destinations
    parents: list = [None]  # parents[level - 1]: the item that new items of `level` go under
    n = 0
    for level, label, id_ in outline:  # not `title`: that is the document's (a bug once)
        dest = dests.get("/" + id_) or dests.get(id_)
        if dest is None or not label:
            continue
        level = min(level, len(parents))  # never deeper than one under the last item
        top = dest.get("/Top")
        fit = Fit.xyz(left=dest.get("/Left"), top=top, zoom=None) if top is not None else Fit.fit()
        item = writer.add_outline_item(
            title=label,
            page_number=reader.get_destination_page_number(dest),
            parent=parents[level - 1],
            fit=fit,
            is_open=False,
        )
        del parents[level:]
        parents.append(item)
        n += 1
    writer.page_mode = "/UseOutlines"
    writer.add_metadata({"/Title": title})
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:
        writer.write(f)
    return n


def print_pdf(
    folder: Path,
    out: Path,
    browser=None,
    tagged: bool = False,
    toc: Path | None = None,
    title: str = TITLE,
    captions: dict | None = None,
    labels: dict | None = None,
) -> Printed:
    """Print ``folder``'s single page to ``out`` with an outline, and a contents page from ``toc``.

    ``browser``: a Playwright Chromium already running (the browser tests' own); else one is started.
    ``toc``: the table of contents the page was built from (read_toc); without it, no contents page.
    """
    if browser is None:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            try:
                return print_pdf(folder, out, browser, tagged, toc, title, captions, labels)
            finally:
                browser.close()
    page_name = next(p.name for p in sorted(folder.glob("*.html")) if p.name != "index.html")
    server, url = _serve(folder)
    page = browser.new_page(viewport={"width": 1100, "height": 900})
    done = Printed()
    try:
        # Nothing leaves this machine: the book is self-contained.
        page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(url) else r.abort())
        page.goto(url + page_name, wait_until="load", timeout=300_000)
        page.set_default_timeout(300_000)
        done.formulas, done.images = page.evaluate(WAIT_FOR_PAGE)
        parts = [[(captions or {}).get(c, c), docs] for c, docs in read_toc(toc)] if toc else None
        book = page.evaluate(PREPARE_BOOK, [PLACEHOLDER, parts, labels or LABELS])
        page.add_style_tag(content=BOOK_CSS)
        page.evaluate(OPEN_HIDDEN_CELLS)
        page.emulate_media(media="print")
        page.set_viewport_size({"width": A4_COLUMN_PX, "height": 900})
        done.cut = page.evaluate(CUT_CODE)
        ids = [c[0] for c in book["contents"]]

        def print_once(final: bool) -> bytes:
            done.passes += 1
            return page.pdf(
                format="A4",
                print_background=True,
                tagged=tagged and final,
                margin=MARGIN,
                display_header_footer=True,
                header_template="<span></span>",
                footer_template=(
                    '<div style="font-size:8px;width:100%;text-align:center;color:#666">'
                    f'{html.escape(title)} · <span class="pageNumber"></span> / <span class="totalPages"></span></div>'
                ),
            )

        # Print with placeholders, read each entry's page, print with the numbers; the numbers
        # take the placeholders' width, so the second print has the same pages (checked).
        reader, pages = _pdf_pages(print_once(final=not ids), ids)
        for _ in range(3):
            if not ids:
                break
            page.evaluate(FILL_PAGES, pages)
            reader, printed = _pdf_pages(print_once(final=True), ids)
            if printed == pages:
                break
            pages = printed
        else:
            raise RuntimeError(f"pdf: the contents' page numbers did not settle: {pages}")
        missing = [i for i in ids if i not in pages]
        if missing:
            raise RuntimeError(f"pdf: no destination in the PDF for contents entries {missing}")
        done.contents = [(i, title, level, pages[i]) for i, title, level in book["contents"]]
        done.pages = len(reader.pages)
        done.empty = empty_pages(reader)
        done.bookmarks = _with_outline(reader, book["outline"], out, title)
    finally:
        page.close()
        server.shutdown()
    return done


def main(argv: list[str], browser=None) -> int:
    """Build the singlehtml book, print it; 1 when a code box would be cut on paper or a page is empty."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path-output", type=Path, default=ROOT, help="build in DIR/_build (default: the repo)")
    ap.add_argument("--toc", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None, help=f"default: <path-output>/_build/html/{PDF_NAME}")
    ap.add_argument("--tagged", action="store_true", help="a tagged (accessible) PDF, about 2.5 times larger")
    ap.add_argument(
        "--language", choices=("en", "zh_CN"), default="en", help="zh_CN: the Chinese edition (tools/i18n.py)"
    )
    args = ap.parse_args(argv)
    if browser is None and not Path(CHROMIUM).exists():
        sys.exit(f"pdf: no Chromium at {CHROMIUM} (set CHROMIUM=...; apt-get install chromium)")
    start = time.time()
    title, captions, labels, config, path_output = TITLE, None, LABELS, None, args.path_output.resolve()
    out = args.out or path_output / "_build" / "html" / PDF_NAME
    if args.language != "en":
        import i18n  # tools/, beside this file

        path_output = path_output / "_build" / "zh-pdf"
        config = i18n.zh_config(path_output)
        title, captions, labels = i18n.TITLE, i18n.translations("intro"), i18n.PDF_LABELS
        out = args.out or args.path_output.resolve() / "_build" / "html" / "zh" / PDF_NAME
    folder = build_singlehtml(path_output, args.toc, config)
    built = time.time()
    done = print_pdf(
        folder,
        out,
        browser,
        tagged=args.tagged,
        toc=args.toc or ROOT / "_toc.yml",
        title=title,
        captions=captions,
        labels=labels,
    )
    size = out.stat().st_size / 1e6
    print(
        f"pdf: {out} ({size:.1f} MB, {done.pages} pages): {done.formulas} formulas, {done.images} images, "
        f"{len(done.cut)} code boxes cut, {len(done.empty)} empty-frame pages; "
        f"contents {len(done.contents)} entries, outline {done.bookmarks} bookmarks; "
        f"{time.time() - start:.0f} s ({built - start:.0f} s singlehtml build, {done.passes} prints)",
        flush=True,
    )
    if done.cut:
        print(
            f"pdf: {len(done.cut)} code boxes are wider than the A4 column and would be cut on paper; "
            "their longest lines:\n  " + "\n  ".join(done.cut),
            file=sys.stderr,
        )
    if done.empty:
        print(
            f"pdf: {len(done.empty)} pages hold nothing but the footer (an empty code frame?): pages "
            + ", ".join(map(str, done.empty)),
            file=sys.stderr,
        )
    return 1 if done.cut or done.empty else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
