"""The website, checked the way a reader meets it.

* Without a browser: the site builds with ``jupyter-book build -W -n`` (no warnings), every
  internal link and anchor resolves, and no page asks another host for a script, stylesheet,
  image or frame.
* In headless Chromium (marker ``browser``; Debian's ``chromium`` driven by Playwright, no
  browser download): every page loads with no JavaScript error and no request leaving
  localhost, its math is typeset, its images load, its Colab button points at its notebook in
  the repository of _config.yml, and its animations and widgets respond.  Every code box has
  the same type size and none scrolls sideways at 1280 px; at 390 px every figure can be read at
  full size; the drawers close when their links are followed; search works in English and
  Chinese, and only search.html loads the search index.  Screenshots of the landing page and
  a chapter at desktop and phone widths go to ``_build/screenshots/`` (never the committed
  ``screenshots/``: a test run changes no tracked file; ``tools/screenshots.sh`` retakes those).
* The whole-book PDF printer (tools/pdf.py) runs end to end on a small table of contents.

Environment: ``CHROMIUM`` (default /usr/bin/chromium; a missing path skips the browser tests:
``tests/conftest.py``),
``SITE_HTML`` (test an already built site instead of building one), ``SITE_TOC`` (build with
another table of contents), ``SITE_SOURCE`` (build another copy of the book),
``SITE_SCREENSHOTS`` (default _build/screenshots/; a relative path is taken from the repository
root), ``SITE_SCREENSHOTS_ALL`` (1: the whole review set).  See pages/testing.md.
"""

from __future__ import annotations

import functools
import html
import http.server
import io
import os
import posixpath
import re
import subprocess
import sys
import threading
import unicodedata
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(os.environ.get("SITE_SOURCE", ROOT)).resolve()  # the book to build
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TOC = Path(os.environ.get("SITE_TOC", SOURCE / "_toc.yml"))
# Screenshots go to a build folder: a test run changes no tracked file.  tools/screenshots.sh
# retakes the committed review set (SITE_SCREENSHOTS=screenshots SITE_SCREENSHOTS_ALL=1).
SCREENSHOTS = ROOT / os.environ.get("SITE_SCREENSHOTS", "_build/screenshots")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}

import pdf as _pdf  # noqa: E402
from pdf import PDF_NAME, print_pdf  # noqa: E402

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
TABLET = {"width": 900, "height": 844}


# ---------------------------------------------------------------------------------------------
# what the site should contain
# ---------------------------------------------------------------------------------------------


def _toc_docnames(toc_path: Path) -> list[str]:
    """Every document of the table of contents, root first (docnames, no suffix)."""
    toc = yaml.safe_load(toc_path.read_text())
    names = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                names.append(node["file"])
            for key in ("parts", "chapters", "sections"):
                for child in node.get(key, []) or []:
                    walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(toc)
    return [posixpath.splitext(n)[0] if n.endswith((".md", ".ipynb")) else n for n in names]


DOCNAMES = _toc_docnames(TOC)
# the Chinese edition's pages of the reading part (tools/i18n.py), served under zh/
ZH_DOCNAMES = ["zh/" + d for d in DOCNAMES if not d.startswith("labs/") and d != "pages/testing"]


def _config() -> dict:
    return yaml.safe_load((SOURCE / "_config.yml").read_text())


def _colab_url(docname: str) -> str:
    """Where a page's Colab button must point: its notebook in the configured repository; on a
    Chinese page (``zh/…``) the Chinese notebook, zh/chapters/NN.ipynb, where there is one (the labs
    are English)."""
    cfg = _config()
    repo = cfg["repository"]
    org_repo = urllib.parse.urlparse(repo["url"]).path.strip("/")
    book = (repo.get("path_to_book") or "").strip("/")
    source = docname.removeprefix("zh/")
    if docname.startswith("zh/") and (SOURCE / "zh" / (source + ".ipynb")).exists():
        source = docname
    path = posixpath.join(book, source + ".ipynb") if book else source + ".ipynb"
    colab = cfg["launch_buttons"]["colab_url"].rstrip("/")
    return f"{colab}/github/{org_repo}/blob/{repo.get('branch', 'main')}/{path}"


def _is_notebook(docname: str) -> bool:
    return (SOURCE / (docname + ".ipynb")).exists()


# ---------------------------------------------------------------------------------------------
# build once per session
# ---------------------------------------------------------------------------------------------


def _book_build_if_fresh() -> Path | None:
    """_build/html as `bash tools/book.sh` left it (both editions, built with -W -n), if it was built
    after the last change to any file of the repository: building the same sources again proves
    nothing more (CI runs book.sh just before the tests). None if there is none, or it is older."""
    html = ROOT / "_build" / "html"
    if SOURCE != ROOT or "SITE_TOC" in os.environ or not (html / "zh" / "index.html").exists():
        return None
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode != 0:
        return None
    built = (html / "index.html").stat().st_mtime
    for name in filter(None, listed.stdout.split("\0")):
        path = ROOT / name
        if path.exists() and path.stat().st_mtime >= built:
            return None
    return html


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The built site's html folder: SITE_HTML, else tools/book.sh's build if it is fresh, else a
    fresh -W -n build in a temp folder."""
    if os.environ.get("SITE_HTML"):
        html = Path(os.environ["SITE_HTML"]).resolve()
        assert (html / "index.html").exists(), f"SITE_HTML={html} holds no built site"
        return html
    if (html := _book_build_if_fresh()) is not None:
        return html
    out = tmp_path_factory.mktemp("site")
    steps = [
        [sys.executable, str(ROOT / "tools" / "web" / "vendor.py"), "--book", str(SOURCE)],
        [
            sys.executable,
            "-c",
            "import sys; from jupyter_book.cli.main import main; sys.argv[0] = 'jupyter-book'; main()",
            "build",
            "-W",
            "-n",
            "--keep-going",
            "--path-output",
            str(out),
            "--toc",
            str(TOC),
            str(SOURCE),
        ],
    ]
    for cmd in steps:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.fail(
                f"{'vendor.py' if 'vendor' in cmd[1] else 'jupyter-book build'} failed (exit {proc.returncode}):\n"
                + (proc.stdout + proc.stderr)[-6000:],
                pytrace=False,
            )
    html = out / "_build" / "html"
    if SOURCE == ROOT:  # the Chinese edition beside it, as tools/book.sh builds it (tools/i18n.py)
        import i18n

        i18n.build(out=out / "zh", site=html / "zh", toc=TOC)
    return html


def _pages(site: Path) -> list[Path]:
    """Every HTML page of both editions (not the assets under _static/, _vendor/, _sources/, zh/_static/ …)."""
    return sorted(
        p
        for p in site.rglob("*.html")
        if not any(part.startswith("_") for part in p.relative_to(site).parts[:-1])
    )


# ---------------------------------------------------------------------------------------------
# without a browser: links and anchors, nothing fetched from elsewhere
# ---------------------------------------------------------------------------------------------


class _Refs(HTMLParser):
    """Collects a page's ids and the URLs it links to or loads."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[tuple[str, str]] = []  # (tag, url) for <a href>
        self.loads: list[tuple[str, str]] = []  # (tag, url) a browser fetches by itself

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key) and (key == "id" or tag == "a"):
                self.ids.add(a[key])
        if tag == "a" and a.get("href"):
            self.links.append((tag, a["href"]))
        elif tag in ("img", "script", "iframe", "source", "video", "audio", "embed") and a.get("src"):
            self.loads.append((tag, a["src"]))
        if tag in ("img", "source") and a.get("srcset"):
            for cand in a["srcset"].split(","):
                if cand.strip():
                    self.loads.append((tag, cand.split()[0]))
        elif tag == "link" and a.get("href"):
            rel = (a.get("rel") or "").lower()
            if any(r in rel.split() for r in ("stylesheet", "icon", "preload", "modulepreload")):
                self.loads.append((tag, a["href"]))
            else:
                self.links.append((tag, a["href"]))


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> _Refs:
    refs = _Refs()
    refs.feed(path.read_text(encoding="utf-8"))
    return refs


def _external(url: str) -> bool:
    return bool(urllib.parse.urlparse(url).scheme) or url.startswith("//")


def test_every_toc_page_is_built(site):
    missing = [d for d in DOCNAMES if not (site / (d + ".html")).exists()]
    assert not missing, f"pages in {TOC.name} but not in the built site: {missing}"


def test_internal_links_and_anchors_resolve(site):
    broken = []
    for page in _pages(site):
        rel_page = page.relative_to(site).as_posix()
        for tag, url in _parse(page).links + _parse(page).loads:
            if _external(url) or url.startswith(("mailto:", "javascript:", "data:")):
                continue
            # printed after the site by tools/pdf.py (tools/book.sh); see test_the_pdf_printer
            if url == PDF_NAME:
                continue
            parts = urllib.parse.urlsplit(url)
            target_rel = (
                posixpath.normpath(
                    posixpath.join(posixpath.dirname(rel_page), urllib.parse.unquote(parts.path))
                )
                if parts.path
                else rel_page
            )
            target = site / target_rel
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{rel_page}: <{tag}> {url} (no file {target_rel})")
                continue
            frag = urllib.parse.unquote(parts.fragment)
            if frag and target.suffix == ".html" and frag not in _parse(target).ids:
                broken.append(f"{rel_page}: <{tag}> {url} (no anchor #{frag})")
    assert not broken, "broken internal links:\n" + "\n".join(broken)


def test_pages_fetch_nothing_from_other_hosts(site):
    remote = [
        f"{p.relative_to(site)}: <{tag}> {url}"
        for p in _pages(site)
        for tag, url in _parse(p).loads
        if _external(url)
    ]
    assert not remote, "the site must work offline; these load from the internet:\n" + "\n".join(remote)


def test_every_figure_has_alt_text_that_says_what_it_shows(site):
    """18 chapter figures had their file's path as alt text (what a screen reader read out, or a
    reader whose image did not load saw); each now has a sentence (cell metadata mystnb.image.alt)."""
    paths = []
    for page in _pages(site):
        for alt in re.findall(r'<img alt="([^"]*)"', page.read_text(encoding="utf-8")):
            if not alt.strip() or re.search(r"\.(png|svg|jpe?g|gif)$|_images/", alt):
                paths.append(f"{page.relative_to(site)}: {alt[:60]!r}")
    assert not paths, f"{len(paths)} images whose alt text is a path or empty: {paths[:5]}"


def test_mathjax_and_widget_javascript_are_served_locally(site):
    assert (site / "_vendor" / "mathjax" / "startup.js").is_file()
    assert (site / "_vendor" / "widgets" / "embed.js").is_file()
    fonts = list((site / "_vendor" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    assert fonts, "MathJax's CHTML fonts were not copied"


def test_notebook_pages_have_colab_and_download_buttons(site):
    notebooks = [d for d in DOCNAMES if _is_notebook(d)]
    for d in notebooks:
        refs = _parse(site / (d + ".html"))
        hrefs = {url for _, url in refs.links}
        assert _colab_url(d) in hrefs, f"{d}: no Colab button to {_colab_url(d)}"
        assert any(h.endswith(f"_sources/{d}.ipynb") for h in hrefs), f"{d}: no .ipynb download"


def test_the_chinese_sites_colab_and_download_buttons_give_chinese_notebooks(site):
    """A chapter's Colab button on the Chinese site opens zh/chapters/NN.ipynb, which is committed,
    and its download is that notebook; a lab's (English only) stays the English notebook's."""
    chapters = [d for d in DOCNAMES if d.startswith("chapters/") and _is_notebook(d)]
    assert chapters
    for d in chapters:
        hrefs = {url for _, url in _parse(site / "zh" / (d + ".html")).links}
        colab = _colab_url("zh/" + d)
        assert colab.endswith(f"/zh/{d}.ipynb") and colab in hrefs, f"zh/{d}: {sorted(hrefs)[:3]}"
        assert (SOURCE / "zh" / (d + ".ipynb")).is_file(), (
            f"the Colab button opens zh/{d}.ipynb: not committed"
        )
        download = (site / "zh" / "_sources" / (d + ".ipynb")).read_bytes()
        assert download == (SOURCE / "zh" / (d + ".ipynb")).read_bytes(), (
            f"zh/{d}: the download is not the Chinese notebook"
        )
    labs = [d for d in DOCNAMES if d.startswith("labs/lab") and _is_notebook(d)]
    for d in labs:
        hrefs = {url for _, url in _parse(site / "zh" / (d + ".html")).links}
        assert _colab_url(d) in hrefs, f"zh/{d}: the lab's Colab button should stay {_colab_url(d)}"


# ---------------------------------------------------------------------------------------------
# in headless Chromium
# ---------------------------------------------------------------------------------------------


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def server(site):
    """The built site on http://127.0.0.1:<port>/ (a thread of this process)."""
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site))
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium (only for tests marked ``browser``: conftest skips them without it)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # Playwright gives every launch a new, empty user-data-dir of its own.
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


class _Visit:
    """One page opened in a fresh context, with what it logged and requested."""

    def __init__(self, browser, url, viewport=DESKTOP, phone=False):
        self.errors: list[str] = []
        self.remote: list[str] = []
        opts = {"viewport": viewport}
        if phone:
            opts.update(device_scale_factor=2, is_mobile=True, has_touch=True)
        self.context = browser.new_context(**opts)
        # Requests to other hosts are recorded and refused: nothing leaves this machine.
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.goto(url, wait_until="load")
        self.page.wait_for_load_state("networkidle")

    def _route(self, route):
        url = route.request.url
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme in ("data", "blob", "about") or parsed.hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            self.remote.append(url)
            route.abort()

    def close(self):
        self.context.close()


JS_RAW_MATH = """() => {
  const root = document.querySelector('main') || document.body;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const skip = new Set(['PRE', 'CODE', 'SCRIPT', 'STYLE', 'TEXTAREA', 'MJX-CONTAINER']);
  const found = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    let el = n.parentElement, inside = false;
    while (el && el !== root) { if (skip.has(el.tagName)) { inside = true; break; } el = el.parentElement; }
    if (inside) continue;
    const t = n.textContent;
    if (t.includes('$$') || t.includes('\\\\(') || t.includes('\\\\[')) found.push(t.trim().slice(0, 80));
  }
  return found;
}"""

JS_WIDE_EQUATIONS = """() => [...document.querySelectorAll('mjx-container[display="true"]')]
  .filter(m => m.scrollWidth > m.parentElement.clientWidth + 1)
  .map(m => `${Math.round(m.scrollWidth)} px in ${m.parentElement.clientWidth} px: ${m.textContent.slice(0, 40)}`)"""

# Every code box on a page (cell code, printed output, Markdown ``` blocks, shell commands) has
# cell code's size, 0.75rem (_static/custom.css).  `wide` (1280 px): none scrolls sideways.  At
# 390 and 900 px a box may scroll inside itself, as cell code does on a phone, but its edge
# stays on the screen and nothing is clipped (overflow-x auto).
JS_CODE_BOXES = """(wide) => {
  const w = document.documentElement.clientWidth, problems = [];
  const size = 0.75 * parseFloat(getComputedStyle(document.documentElement).fontSize);
  for (const p of document.querySelectorAll('main pre')) {
    const kind = p.closest('.cell_output') ? 'output' : p.closest('div.cell') ? 'code' : 'block';
    const line = p.textContent.split('\\n').reduce((a, l) => l.length > a.length ? l : a, '').trim().slice(0, 50);
    const px = parseFloat(getComputedStyle(p).fontSize);
    if (Math.abs(px - size) > 0.01) problems.push(`${kind} at ${px} px, not 0.75rem (${size} px): ${line}`);
    if (p.scrollWidth <= p.clientWidth + 1) continue;
    const right = p.getBoundingClientRect().right, ox = getComputedStyle(p).overflowX;
    if (wide) problems.push(`${kind} scrolls sideways, ${p.scrollWidth} px in ${p.clientWidth} px: ${line}`);
    else if (right > w + 1 || !['auto', 'scroll'].includes(ox))
      problems.push(`${kind} ${p.scrollWidth} px in ${p.clientWidth} px, overflow-x ${ox}, ` +
                    `right edge ${Math.round(right)} of ${w} px: ${line}`);
  }
  return problems;
}"""

# Every formula in MathJax's fonts and every piece of code in a monospace font, on both editions
# (a CSS rule for Chinese prose once outranked both, and drew them in the CJK sans font); code on
# a Chinese page names a monospace font with CJK glyphs.
JS_FONTS = r"""() => {
  const problems = [], fam = e => getComputedStyle(e).fontFamily;
  const code = [...document.querySelectorAll('main pre, main code, main kbd, main samp')];
  const prose = code.filter(e => !/monospace\s*$/.test(fam(e)));
  if (prose.length) problems.push(`${prose.length} of ${code.length} code elements not in a monospace font ` +
                                  `(${fam(prose[0])}): ${prose[0].textContent.trim().slice(0, 40)}`);
  const glyphs = [...document.querySelectorAll('main mjx-container[jax="CHTML"] mjx-c')];
  const other = glyphs.filter(e => !/^MJX/.test(fam(e)));
  if (other.length) problems.push(`${other.length} of ${glyphs.length} formula glyphs not in MathJax's fonts ` +
                                  `(${fam(other[0])}): ${other[0].closest('mjx-container').textContent.slice(0, 40)}`);
  if (document.documentElement.lang === 'zh-CN' && code.length && !/CJK|Mono SC|Micro Hei Mono/.test(fam(code[0])))
    problems.push(`code on a Chinese page has no monospace font with CJK glyphs: ${fam(code[0])}`);
  return problems;
}"""


JS_IMAGES = """async () => {
  const imgs = Array.from(document.querySelectorAll('main img'));
  for (const img of imgs) if (img.loading === 'lazy') img.loading = 'eager';
  await Promise.all(imgs.map(img => img.complete ? null :
      new Promise(r => { img.addEventListener('load', r); img.addEventListener('error', r); })));
  return imgs.filter(img => !(img.naturalWidth > 0)).map(img => img.currentSrc || img.src || img.outerHTML.slice(0, 80));
}"""


def _check_math(page) -> list[str]:
    problems = []
    n_math = page.locator("main .math").count()
    if n_math:
        loaded = page.evaluate("() => !!(window.MathJax && window.MathJax.startup)")
        if not loaded:
            page.wait_for_function(
                "() => window.MathJax && window.MathJax.startup && window.MathJax.startup.promise",
                timeout=15000,
            )
        page.evaluate("() => MathJax.startup.promise")
        untypeset = page.evaluate(
            "() => Array.from(document.querySelectorAll('main .math'))"
            ".filter(e => !e.querySelector('mjx-container')).map(e => e.textContent.slice(0, 60))"
        )
        if untypeset:
            problems.append(f"{len(untypeset)} of {n_math} formulas not typeset, e.g. {untypeset[:3]}")
    raw = page.evaluate(JS_RAW_MATH)
    if raw:
        problems.append(f"raw TeX delimiters in the text: {raw[:3]}")
    return problems


def _check_animations(page) -> list[str]:
    """matplotlib to_jshtml(): moving the slider or clicking 'next frame' changes the frame."""
    problems = []
    anims = page.locator("main div.animation")
    for i in range(anims.count()):
        anim = anims.nth(i)
        img, slider = anim.locator("img").first, anim.locator("input.anim-slider").first
        n_max = int(slider.get_attribute("max") or 0)
        if n_max < 1:
            continue
        before = img.get_attribute("src")
        slider.fill(str(n_max))
        after_slider = img.get_attribute("src")
        if after_slider == before:
            problems.append(f"animation {i}: moving the slider did not change the frame")
        anim.locator("button[onclick$='first_frame()']").click()
        anim.locator("button[onclick$='next_frame()']").click()
        if slider.input_value() != "1" or img.get_attribute("src") == after_slider:
            problems.append(f"animation {i}: 'next frame' did not advance (slider {slider.input_value()})")
    return problems


def _check_widgets(page) -> list[str]:
    """Embedded ipywidgets (saved widget state) render, and sliders answer the keyboard."""
    views = page.locator("script[type='application/vnd.jupyter.widget-view+json']").count()
    if not views:
        return []
    try:
        page.wait_for_selector("main .jupyter-widgets", timeout=15000)
    except Exception:
        return [f"{views} saved widget views, none rendered"]
    problems = []
    sliders = page.locator("main .widget-slider .noUi-handle, main .widget-slider .ui-slider-handle")
    for i in range(sliders.count()):
        box = sliders.nth(i).locator("xpath=ancestor::*[contains(@class,'widget-slider')][1]")
        readout = box.locator(".widget-readout").first
        if readout.count() == 0 or box.locator("[disabled]").count():
            continue
        before = readout.text_content() if readout.count() else None
        sliders.nth(i).focus()
        page.keyboard.press("ArrowRight")
        page.keyboard.press("ArrowLeft") if readout.text_content() == before else None
        if readout.text_content() == before:
            problems.append(f"widget slider {i} did not respond to the keyboard")
    return problems


@pytest.mark.browser
@pytest.mark.parametrize("docname", DOCNAMES + ZH_DOCNAMES)
def test_page_in_browser(browser, server, site, docname):
    visit = _Visit(browser, server + docname + ".html")
    source = docname.removeprefix("zh/")  # a Chinese page shows the same notebook
    try:
        page = visit.page
        problems = _check_math(page)
        problems += page.evaluate(JS_FONTS)
        # At 1280 px no display equation is wider than the text column (long ones are aligned lines).
        wide = page.evaluate(JS_WIDE_EQUATIONS)
        if wide:
            problems.append(f"display equations wider than the column: {wide}")
        # At 1280 px no code box scrolls sideways (88-column cells fit; outputs and other blocks
        # wrap), and every one has cell code's size.
        code = page.evaluate(JS_CODE_BOXES, True)
        if code:
            problems.append(f"{len(code)} code boxes break the size rule: {code[:4]}")
        broken = page.evaluate(JS_IMAGES)
        if broken:
            problems.append(f"images that did not load: {broken}")
        if _is_notebook(source):
            hrefs = page.eval_on_selector_all(
                "a[href*='colab.research.google.com']", "els => els.map(e => e.href)"
            )
            if _colab_url(docname) not in hrefs:
                problems.append(f"Colab button {hrefs} should point at {_colab_url(docname)}")
        if docname.startswith("zh/"):
            problems += page.evaluate(JS_CHINESE_PAGE)
        problems += _check_animations(page)
        problems += _check_widgets(page)
        # the same page at 900 px (a tablet; no touch, as at 1280): resized, not loaded again (a load
        # per page and width cost 80 s of the suite); the layout follows the width as on a load
        page.set_viewport_size(TABLET)
        problems += [f"at 900 px: {p}" for p in _too_wide(page)]
        problems += visit.errors
        if visit.remote:
            problems.append(f"requests that left localhost: {sorted(set(visit.remote))}")
    finally:
        visit.close()
    assert not problems, f"{docname}:\n  " + "\n  ".join(problems)


# A Chinese page: lang zh-CN, its prose in Chinese (no paragraph left in English), shown in a
# font that has the glyphs (a CJK character as wide as a Latin em, not a missing-glyph box).
JS_CHINESE_PAGE = r"""() => {
  const problems = [];
  if (document.documentElement.lang !== 'zh-CN') problems.push(`lang is ${document.documentElement.lang}`);
  const english = [...document.querySelectorAll('main article p, main article li > p, main article h1, main article h2')]
    .filter(p => !p.closest('.cell_output, .output, pre, table, .bbh-english-only, dl.glossary dt'))
    .map(p => { const c = p.cloneNode(true); c.querySelectorAll('mjx-container, code, .headerlink').forEach(e => e.remove());
                return c.textContent.trim(); })
    .filter(t => /[A-Za-z]{3,}(\s+[A-Za-z]{3,}){3,}/.test(t) && !/[\u4e00-\u9fff]/.test(t));
  if (english.length) problems.push(`${english.length} paragraphs in English only: ${english[0].slice(0, 80)}`);
  const probe = document.createElement('span');
  probe.textContent = '反向传播链式法则梯度';
  probe.style.cssText = 'position:absolute;visibility:hidden;white-space:nowrap';
  document.querySelector('main article').appendChild(probe);
  const perChar = probe.getBoundingClientRect().width / 10, em = parseFloat(getComputedStyle(probe).fontSize);
  probe.remove();
  if (!(perChar > 0.8 * em && perChar < 1.2 * em)) problems.push(`a CJK character is ${perChar} px wide at ${em} px: no CJK font?`);
  return problems;
}"""


# The pages committed under screenshots/ for review, at 1280 and 390 px.  The test command takes
# the first two; SITE_SCREENSHOTS_ALL=1 takes them all (pages/testing.md says when to commit them).
SCREENSHOT_PAGES = {
    "landing": "intro",
    "ch01": "chapters/01_cat_mlp",
    "ch04": "chapters/04_custom_functions",
    "ch06": "chapters/06_attention_backward",
    "ch10": "chapters/10_flash_attention",
    "ch11": "chapters/11_training_by_hand",
    "lab06": "labs/lab06_attention_backward",
    "glossary": "pages/glossary",
}


@pytest.mark.browser
def test_screenshots(browser, server, site, capsys):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    wanted = [(k, d) for k, d in SCREENSHOT_PAGES.items() if d in DOCNAMES]
    if os.environ.get("SITE_SCREENSHOTS_ALL") != "1":
        wanted = wanted[:2]
    shots = []
    for label, viewport, phone in (("1280", DESKTOP, False), ("390", PHONE, True)):
        opts = {"viewport": viewport}
        if phone:
            opts.update(device_scale_factor=2, is_mobile=True, has_touch=True)
        context = browser.new_context(**opts)
        try:
            page = context.new_page()
            for name, docname in wanted:
                page.goto(server + docname + ".html", wait_until="load")
                if page.locator("main .math").count():
                    page.wait_for_function(
                        "() => window.MathJax && MathJax.startup && MathJax.startup.promise"
                    )
                    page.evaluate("() => MathJax.startup.promise")
                page.evaluate(JS_IMAGES)
                height = page.evaluate("() => document.documentElement.scrollHeight")
                path = SCREENSHOTS / f"{name}-{label}.png"
                # The top 2400 px through a window that tall: a full-page capture cut the sticky
                # page-contents sidebar at a different height on each run.
                page.set_viewport_size({"width": viewport["width"], "height": min(height, 2400)})
                page.wait_for_timeout(200)
                page.screenshot(path=str(path))
                page.set_viewport_size(viewport)
                shots.append(path)
        finally:
            context.close()
    for path in shots:
        assert path.stat().st_size > 10_000, f"{path} looks empty"
    with capsys.disabled():
        print(f"\n[site] {len(shots)} screenshots ({', '.join(n for n, _ in wanted)}): {SCREENSHOTS}")


# ---------------------------------------------------------------------------------------------
# phones and tablets: drawers, reading order, width, weight
# ---------------------------------------------------------------------------------------------

DRAWERS = {
    "primary": ("#pst-primary-sidebar-modal", "Chapters and labs"),
    "secondary": ("#pst-secondary-sidebar-modal", "Contents"),
}


@pytest.mark.browser
@pytest.mark.parametrize("edition", ["", "zh/"])
@pytest.mark.parametrize("width", [390, 900])
@pytest.mark.parametrize("drawer", sorted(DRAWERS))
def test_the_visible_drawer_buttons_open_the_chapter_list_and_the_page_contents(
    browser, server, site, width, drawer, edition
):
    """☰ and ☷ open their drawers below the desktop widths (pydata-sphinx-theme#2451: a hidden
    duplicate took the click), and a tap on a section in the ☷ drawer closes it and shows that
    section (the drawer stayed open over 293 of 390 px: _static/reader.js)."""
    dialog, expected = DRAWERS[drawer]
    if edition:  # the Chinese site's drawers: its part caption, the theme's own word for Contents
        import i18n

        expected = {"primary": i18n.translations("intro")["Chapters and labs"], "secondary": "目录"}[drawer]
    visit = _Visit(
        browser,
        server + edition + "chapters/06_attention_backward.html",
        viewport={"width": width, "height": 844},
        phone=width < 600,
    )
    try:
        page = visit.page
        button = page.locator(f"button.{drawer}-toggle:visible")
        assert button.count() == 1, f"{button.count()} visible {drawer} toggles at {width} px"
        button.first.click()
        page.wait_for_timeout(300)
        opened = page.evaluate(f"() => !!document.querySelector('{dialog}')?.open")
        text = page.evaluate(f"() => document.querySelector('{dialog}')?.innerText || ''")
        assert opened and expected in text, (
            f"{drawer} drawer at {width} px: open={opened}, shows {text[:80]!r}"
        )
        if drawer == "secondary":
            _follow_a_contents_link(page, dialog, width)
        assert not visit.errors, visit.errors
    finally:
        visit.close()


JS_FOLLOWED = """([dialog, href]) => {
  const target = document.getElementById(decodeURIComponent(href.slice(1)));
  const h = target.querySelector('h1, h2, h3, h4') || target;
  const r = h.getBoundingClientRect();
  const hit = document.elementFromPoint(Math.min(r.left + 20, innerWidth - 1), r.top + r.height / 2);
  return {open: !!document.querySelector(dialog)?.open, hash: location.hash, top: r.top,
          seen: !!hit && h.contains(hit), scrolled: scrollY};
}"""


def _follow_a_contents_link(page, dialog: str, width: int) -> None:
    """Tap a section in the middle of the open ☷ drawer: it closes, the section is at the top, uncovered."""
    links = page.locator(f"{dialog} a[href^='#']")
    assert links.count() >= 3, f"{links.count()} links in the Contents drawer"
    link = links.nth(links.count() // 2)
    href = link.get_attribute("href")
    (link.tap if width < 600 else link.click)()
    page.wait_for_timeout(500)
    state = page.evaluate(JS_FOLLOWED, [dialog, href])
    assert not state["open"], f"at {width} px the Contents drawer stays open after {href} is followed"
    assert state["hash"] == href and state["scrolled"] > 0, state
    assert 0 <= state["top"] < 844 / 2 and state["seen"], (
        f"at {width} px the section {href} is not shown at the top of the screen: {state}"
    )


# ---------------------------------------------------------------------------------------------
# search: the index only where search runs; English and Chinese found; the icon beside the text
# ---------------------------------------------------------------------------------------------

SEARCH_SCRIPTS = ("searchindex.js", "searchtools.js", "language_data.js")


def test_only_the_search_page_loads_the_search_index(site, capsys):
    """pydata-sphinx-theme put searchindex.js (146 KiB) render-blocking in every page's head."""
    loading = {
        p.relative_to(site).as_posix(): [
            u for tag, u in _parse(p).loads if tag == "script" and u.split("?")[0].endswith(SEARCH_SCRIPTS)
        ]
        for p in _pages(site)
    }
    assert len(loading.get("search.html", [])) == 3, f"search.html loads {loading.get('search.html')}"
    search_pages = ("search.html", "zh/search.html")
    elsewhere = {page: urls for page, urls in loading.items() if urls and page not in search_pages}
    assert not elsewhere, f"{len(elsewhere)} pages besides search.html load the search scripts: " + ", ".join(
        list(elsewhere)[:5]
    )
    with capsys.disabled():
        size = (site / "searchindex.js").stat().st_size
        print(f"\n[site] searchindex.js ({size / 1024:.0f} KiB) is loaded by search.html only")


JS_SEARCH_FIELD = """() => {
  const form = document.querySelector('.bd-search-container form.bd-search');
  const icon = form.querySelector('.fa-magnifying-glass').getBoundingClientRect();
  const input = form.querySelector('input'), r = input.getBoundingClientRect(), cs = getComputedStyle(input);
  const text = {left: r.left + parseFloat(cs.borderLeftWidth) + parseFloat(cs.paddingLeft) + parseFloat(cs.textIndent),
                top: r.top + parseFloat(cs.paddingTop), bottom: r.bottom - parseFloat(cs.paddingBottom)};
  const overlap = icon.right > text.left && icon.left < r.right && icon.bottom > text.top && icon.top < text.bottom;
  return {overlap, icon: [icon.left, icon.right], text: text.left, query: input.value,
          results: document.querySelectorAll('#search-results ul.search li').length,
          summary: (document.querySelector('#search-results .search-summary') || {}).textContent || ''};
}"""


@pytest.mark.browser
def test_search_finds_english_and_chinese_with_its_icon_beside_the_query(browser, server, site):
    """search.html finds 'gradient' and 反向传播 (1280 px), and its magnifier does not cover the query (1280, 390 px)."""
    for viewport, phone, queries in ((DESKTOP, False, ["gradient", "反向传播"]), (PHONE, True, ["反向传播"])):
        visit = _Visit(browser, "about:blank", viewport, phone)
        try:
            for query in queries:
                visit.page.goto(server + "search.html?q=" + urllib.parse.quote(query), wait_until="load")
                visit.page.wait_for_function(
                    "() => (document.querySelector('#search-results .search-summary') || {}).textContent",
                    timeout=20000,
                )
                field = visit.page.evaluate(JS_SEARCH_FIELD)
                width = viewport["width"]
                assert field["query"] == query and field["results"] > 0, f"{query!r} at {width} px: {field}"
                assert not field["overlap"], (
                    f"at {width} px the magnifier ({field['icon']}) covers the query, which starts at {field['text']}"
                )
            assert not visit.errors, visit.errors
        finally:
            visit.close()


JS_RESULTS = """() => [...document.querySelectorAll('#search-results ul.search li')].map(li => ({
  href: li.querySelector('a').getAttribute('href'),
  snippet: (li.querySelector('p.context') || {}).textContent || null}))"""


def _article_text(path: Path) -> str:
    """A page's article as text: no tags, no scripts (what Sphinx's search indexes, roughly)."""
    page = path.read_text(encoding="utf-8")
    article = page[page.find("<main") : page.rfind("</main>")]
    article = re.sub(r"<(script|style)\b.*?</\1>", " ", article, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", article))


@pytest.mark.browser
def test_chinese_search_finds_words_in_body_text_and_shows_formulas_as_text(browser, server, site):
    """zh/search.html?q=反向计算 finds every page whose text says it (the browser cuts the query into
    the words jieba indexed: 反向, 计算), and no snippet shows TeX (\\partial, \\(, $)."""
    query = "反向计算"
    pages = [d for d in ZH_DOCNAMES if query in _article_text(site / (d + ".html"))]
    assert len(pages) >= 5, pages  # the phrase is common in the chapters: the test must see it
    visit = _Visit(browser, "about:blank", DESKTOP, False)
    try:
        visit.page.goto(server + "zh/search.html?q=" + urllib.parse.quote(query), wait_until="load")
        visit.page.wait_for_function(
            """() => { const li = document.querySelectorAll('#search-results ul.search li');
                       return li.length && [...li].every(l => l.querySelector('p.context'))
                              && (document.querySelector('#search-results .search-summary') || {}).textContent; }""",
            timeout=30000,
        )
        results = visit.page.evaluate(JS_RESULTS)
        found = {r["href"].split(".html")[0] for r in results}
        missing = [d for d in pages if d.removeprefix("zh/") not in found]
        assert not missing, (
            f"{query!r}: {len(missing)} of the {len(pages)} pages that say it not found: {missing}"
        )
        tex = [r["snippet"][:120] for r in results if re.search(r"\\[A-Za-z]+|\\[()\[\]]|\$", r["snippet"])]
        assert not tex, f"{len(tex)} of {len(results)} snippets show TeX: {tex[:2]}"
        assert any("∂" in r["snippet"] for r in results), "no snippet shows a formula as text"
        assert not visit.errors, visit.errors
    finally:
        visit.close()


def test_each_lab_comes_right_after_its_chapter_and_instructors_are_out_of_the_way(site):
    """Prev/next: chapter N → lab N → chapter N+1; the instructors' page is the last page, after the reference."""
    chapters = [d for d in DOCNAMES if d.startswith("chapters/")]
    for ch in chapters:
        lab = "labs/lab" + ch.split("/")[1]
        if lab in DOCNAMES:
            assert DOCNAMES.index(lab) == DOCNAMES.index(ch) + 1, (ch, lab)
            html = (site / f"{ch}.html").read_text(encoding="utf-8")
            nxt = re.search(r'<link rel="next"[^>]*href="([^"]+)"', html)
            assert nxt and nxt.group(1).endswith(f"{lab}.html"), (
                f"{ch}'s next page is {nxt and nxt.group(1)}, not {lab}"
            )
    assert DOCNAMES[-1] == "labs/instructors", DOCNAMES[-3:]


# A phone's viewport: nothing may scroll the page sideways (a code box may scroll inside itself).
JS_PAGE_OVERFLOW = """() => {
  const w = document.documentElement.clientWidth;
  const wide = [];
  for (const el of document.querySelectorAll('main *')) {
    const r = el.getBoundingClientRect();
    if (r.right > w + 1 && !el.closest('pre, .highlight, .output, mjx-container, .table-wrapper, .cell_output, table'))
      wide.push(`${el.tagName.toLowerCase()}.${el.className}: ${Math.round(r.right)} px`);
  }
  return [document.documentElement.scrollWidth - w, wide.slice(0, 3)];
}"""


def _too_wide(page) -> list[str]:
    """What makes the page at its present width scroll sideways or break the code size rule
    (JS_CODE_BOXES: a box may scroll inside itself, within the screen), and fonts (JS_FONTS)."""
    problems = []
    extra, wide = page.evaluate(JS_PAGE_OVERFLOW)
    if extra > 1:
        problems.append(f"{extra} px wider than the screen: {wide}")
    return problems + page.evaluate(JS_CODE_BOXES, False) + page.evaluate(JS_FONTS)


@pytest.fixture(scope="module")
def on_a_phone(browser, server, site):
    """Every page at 390 px, in one phone context (a new context per page would cost a minute), each
    loaded once: {"wide": what scrolls sideways, "figures": (problems, scales, opened) of
    ``_figures_on_a_phone`` on the pages that show figures}. Chapter 1 of each edition waits for
    MathJax, so that formulas' fonts are seen at this width too (every page waits at 1280 in
    test_page_in_browser)."""
    context = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
    wide, figures = [], ([], [], 0)
    with_figures = set(_figure_pages(site))
    try:
        page = context.new_page()
        for docname in DOCNAMES + ZH_DOCNAMES:
            page.goto(server + docname + ".html", wait_until="load")
            if docname.endswith("chapters/01_cat_mlp"):
                page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
                page.evaluate("() => MathJax.startup.promise")
                assert page.locator('main mjx-container[jax="CHTML"] mjx-c').count() > 100, docname
            wide += [f"{docname}: {p}" for p in _too_wide(page)]
            if docname in with_figures:
                figures = _figures_on_a_phone(page, docname, *figures)
    finally:
        context.close()
    return {"wide": wide, "figures": figures}


@pytest.mark.browser
def test_no_page_scrolls_sideways_on_a_phone_or_tablet(on_a_phone):
    """Every page at 390 px (``on_a_phone``; at 900 px: test_page_in_browser): the page never
    scrolls sideways, every code box keeps the code size rule, and formulas and code keep their
    fonts."""
    assert not on_a_phone["wide"], "at 390 px:\n  " + "\n  ".join(on_a_phone["wide"])


JS_WIDE_FORMULA = """() => {
  const wide = [...document.querySelectorAll('main mjx-container[display="true"]')]
    .filter(m => m.scrollWidth > m.clientWidth + 8 && m.getBoundingClientRect().height > 10);
  if (!wide.length) return null;
  wide[0].scrollIntoView({block: 'center'});
  return wide.length;
}"""


def _edge_darkness(png: bytes) -> tuple[float, float]:
    """The mean darkness (0 white, 1 black) of the leftmost and the rightmost 4 px of a screenshot."""
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("L")
    w, h = img.size
    edge = lambda x0: 1 - sum(img.crop((x0, 0, x0 + 4, h)).getdata()) / (4 * h * 255)  # noqa: E731
    return edge(0), edge(w - 4)


@pytest.mark.browser
def test_a_formula_wider_than_a_phone_shows_that_it_scrolls(browser, server, site):
    """At 390 px 29 display formulas were cut at the column's edge with no sign that they scroll
    (a phone shows no scrollbar until touched): a shadow marks the edge a formula goes on past, and
    moves to the other edge once it is scrolled to its end."""
    visit = _Visit(browser, f"{server}chapters/06_attention_backward.html", PHONE, True)
    try:
        page = visit.page
        page.evaluate("() => MathJax.startup.promise")
        assert page.evaluate(JS_WIDE_FORMULA), "no display formula wider than a phone on chapter 6"
        box = (
            page.locator('main mjx-container[display="true"]')
            .filter(has=page.locator("mjx-math"))
            .evaluate_all(
                "ms => ms.findIndex(m => m.scrollWidth > m.clientWidth + 8 && m.getBoundingClientRect().height > 10)"
            )
        )
        formula = page.locator('main mjx-container[display="true"]').nth(box)
        left, right = _edge_darkness(formula.screenshot())
        assert right > left + 0.02, f"at the start: no shadow on the right edge ({left:.3f}, {right:.3f})"
        formula.evaluate("m => { m.scrollLeft = m.scrollWidth; }")
        left, right = _edge_darkness(formula.screenshot())
        assert left > right + 0.02, f"at the end: no shadow on the left edge ({left:.3f}, {right:.3f})"
    finally:
        visit.close()


# ---------------------------------------------------------------------------------------------
# figures a phone can read: shown at their size, or a tap opens them at it (_static/reader.js)
# ---------------------------------------------------------------------------------------------

FIGURE_IMAGES = "main div.cell_output img, main div.animation img"

JS_FIGURE = """(img) => {
  const r = img.getBoundingClientRect();
  const hint = img.nextElementSibling && img.nextElementSibling.matches('button.bbh-zoom-hint')
    ? img.nextElementSibling : null;
  return {width: r.width, natural: img.naturalWidth, cursor: getComputedStyle(img).cursor,
          hint: !!hint && !hint.hidden && hint.getBoundingClientRect().height > 0,
          src: img.currentSrc || img.src, animated: !!img.closest('div.animation')};
}"""

JS_OPENED = """() => {
  const d = document.querySelector('dialog.bbh-zoom');
  if (!d || !d.open) return null;
  const img = d.querySelector('img'), r = img.getBoundingClientRect(), box = d.getBoundingClientRect();
  const close = d.querySelector('.bbh-zoom__close').getBoundingClientRect();
  return {width: r.width, natural: img.naturalWidth, complete: img.complete, src: img.currentSrc || img.src,
          covers: box.width >= innerWidth - 1 && box.height >= innerHeight - 1,
          closeVisible: close.width >= 24 && close.top >= 0 && close.right <= innerWidth + 1,
          hint: (d.querySelector('.bbh-zoom__hint') || {}).textContent || ''};
}"""


def _figure_pages(site: Path) -> list[str]:
    """The pages that show a notebook figure or an animation (read from the built HTML)."""
    found = re.compile(r'<img [^>]*src="[./]*_images/|<div class="animation">')
    return [d for d in DOCNAMES if found.search((site / (d + ".html")).read_text(encoding="utf-8"))]


def _figures_on_a_phone(page, docname, problems, scales, opened):
    """Each figure of the page (at 390 px) shown at its natural size, or opened at it by a tap; the
    problems, scales and count of figures opened so far, with this page's added."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.evaluate(JS_IMAGES)
    figures = page.locator(FIGURE_IMAGES)
    for i in range(figures.count()):
        img = figures.nth(i)
        where = f"{docname} figure {i + 1}"
        img.scroll_into_view_if_needed()
        fig = img.evaluate(JS_FIGURE)
        scales.append(fig["width"] / fig["natural"])
        if fig["width"] >= fig["natural"] - 1:
            continue  # shown at its size
        if not fig["hint"] or fig["cursor"] != "zoom-in":
            problems.append(
                f"{where} at {scales[-1]:.2f} of its size has no visible hint "
                f"(hint {fig['hint']}, cursor {fig['cursor']})"
            )
        img.tap()
        try:
            page.wait_for_function("() => document.querySelector('dialog.bbh-zoom')?.open", timeout=3000)
        except PlaywrightTimeout:
            problems.append(f"{where}: shown at {scales[-1]:.2f} of its size, and a tap does not open it")
            continue
        view = page.evaluate(JS_OPENED)
        if not (view["complete"] and view["src"] == fig["src"] and view["natural"] == fig["natural"]):
            problems.append(f"{where}: the overlay shows another image ({view['src'][:60]})")
        if view["width"] < view["natural"] - 0.5 or not view["covers"] or not view["closeVisible"]:
            problems.append(
                f"{where}: opened at {view['width']:.0f} px for {view['natural']} px "
                f"(covers {view['covers']}, × visible {view['closeVisible']})"
            )
        if fig["animated"]:
            page.locator("dialog.bbh-zoom button[data-step='next']").click()
            stepped = page.evaluate(JS_OPENED)
            if stepped["src"] == view["src"] or stepped["src"] != img.evaluate("i => i.src"):
                problems.append(f"{where}: › in the overlay did not show the animation's next frame")
        # The first figure closes with ×, the others with Escape.
        if opened == 0:
            page.locator("dialog.bbh-zoom .bbh-zoom__close").tap()
        else:
            page.keyboard.press("Escape")
        if page.evaluate(JS_OPENED) is not None:
            problems.append(f"{where}: the overlay did not close")
            page.evaluate("() => document.querySelector('dialog.bbh-zoom').close()")
        opened += 1
    return problems, scales, opened


@pytest.mark.browser
def test_every_figure_can_be_read_at_full_size_on_a_phone(on_a_phone, capsys):
    """At 390 px each figure of every page is shown at its natural size, or a tap on it opens it
    at its natural size (1 image px per CSS px, where tests/test_figures.py's 9 px rule holds)
    in an overlay the reader scrolls or pinches, with a visible hint, a zoom cursor, a × button
    and Escape to close; an animation's overlay steps through its frames."""
    problems, scales, opened = on_a_phone["figures"]
    with capsys.disabled():
        small = [s for s in scales if s < 0.999]
        print(
            f"\n[site] {len(scales)} figures at 390 px: {len(scales) - len(small)} at their size, "
            f"{opened} opened at full size (shown at {min(scales, default=1):.2f}-{max(small, default=1):.2f})"
        )
    assert scales, "no figure found on any page"
    assert not problems, "\n  ".join(problems)


# Chapter pages without live widgets (a widget page also loads the widgets' JavaScript).
WEIGHED = [
    "chapters/01_cat_mlp",
    "chapters/05_losses_and_flow",
    "chapters/06_attention_backward",
    "chapters/10_flash_attention",
]


@pytest.mark.browser
@pytest.mark.parametrize("docname", WEIGHED)
def test_a_chapter_page_weighs_at_most_2_5_mb_cold(browser, server, site, docname, capsys):
    sizes = {}
    context = browser.new_context(viewport=DESKTOP)
    try:
        page = context.new_page()
        page.on("response", lambda r: sizes.__setitem__(r.url, len(r.body())) if r.ok else None)
        page.goto(server + docname + ".html", wait_until="networkidle")
    finally:
        context.close()
    total = sum(sizes.values())
    with capsys.disabled():
        print(f"\n[site] {docname}: {total / 1e6:.2f} MB cold in {len(sizes)} requests")
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    assert total <= 2.5e6, f"{docname}: {total / 1e6:.2f} MB; biggest {biggest}"


# ---------------------------------------------------------------------------------------------
# labs: no solution or hidden test anywhere in the built site (checked on the session's build)
# ---------------------------------------------------------------------------------------------

import labs as _labs  # noqa: E402

CROSS_LAB_MIN = 40


@pytest.mark.parametrize("lab", _labs.labs())
def test_no_lab_solution_or_hidden_test_in_the_built_site(site, lab):
    secrets = _labs.secret_snippets(_labs.read_nb(_labs.source_path(lab)))
    assert secrets, f"{lab}: found no solution text to look for"
    for page in site.rglob("*"):
        if page.suffix in (".html", ".ipynb", ".txt", ".md", ".js") and page.is_file():
            text = (
                page.read_text(errors="replace")
                .replace("&quot;", '"')
                .replace("&#39;", "'")
                .replace("&gt;", ">")
                .replace("&lt;", "<")
                .replace("&amp;", "&")
            )
            # Another lab's page may share a short, generic line with this lab's solution
            # ('if window is not None:'); there only a solution line of CROSS_LAB_MIN characters counts.
            other_lab = page.name.startswith("lab") and not page.name.startswith(lab)
            found = [
                s for s in secrets if _labs.found(s, text) and (not other_lab or len(s) >= CROSS_LAB_MIN)
            ]
            assert not found, f"{page.relative_to(site)} shows {found[0]!r} from {lab}'s solutions"


# ---------------------------------------------------------------------------------------------
# the whole-book PDF: tools/book.sh prints it after the site (minutes, so not here); here the
# printer runs on a small page and the landing page must link the file it writes
# ---------------------------------------------------------------------------------------------


def test_the_landing_page_links_the_whole_book_pdf(site):
    assert f'href="{PDF_NAME}"' in (site / "intro.html").read_text(encoding="utf-8")


@pytest.mark.browser
def test_the_pdf_printer_prints_code_without_cutting_it(browser, tmp_path):
    line = "grad_W = grad_Y.T @ X  # " + "(out, B) @ (B, in) -> (out, in) " * 6  # wider than A4
    css = (ROOT / "_static" / "custom.css").read_text(encoding="utf-8")
    text = "".join(f"<h2>Section {i}</h2><p>{'text ' * 300}</p>" for i in range(8))
    (tmp_path / "book.html").write_text(
        f"<html><head><style>{css}</style></head><body><h1>Backprop</h1>"
        f"<div class='cell'><div class='cell_input'><pre>{line}</pre></div></div>{text}</body></html>",
        encoding="utf-8",
    )
    out = tmp_path / "out" / PDF_NAME
    done = print_pdf(tmp_path, out, browser)
    data = out.read_bytes()
    assert data.startswith(b"%PDF") and done.pages >= 2, (done.pages, len(data))
    assert (done.formulas, done.images, done.cut) == (0, 0, []), (
        "the print CSS should wrap the long code line"
    )


def test_the_pdf_command_fails_when_a_code_box_would_be_cut(tmp_path, monkeypatch, capsys):
    """tools/book.sh stops on it: pdf.py exits 1 and names the box's longest line."""
    out = tmp_path / PDF_NAME

    def fake_print(folder, out, browser=None, **options):
        out.write_bytes(b"%PDF-1.4")
        return _pdf.Printed(formulas=3, images=1, cut=["x = torch.ones(1)  # a very long line"], pages=1)

    monkeypatch.setattr(_pdf, "build_singlehtml", lambda path_output, toc=None, config=None: tmp_path)
    monkeypatch.setattr(_pdf, "print_pdf", fake_print)
    assert _pdf.main(["--out", str(out)], browser=object()) == 1
    printed = capsys.readouterr()
    assert "1 code boxes cut" in printed.out and "a very long line" in printed.err, printed


def test_the_pdf_command_fails_when_a_page_is_empty(tmp_path, monkeypatch, capsys):
    """A page with nothing but the footer (an empty code frame once): exit 1, the pages named."""
    out = tmp_path / PDF_NAME

    def fake_print(folder, out, browser=None, **options):
        out.write_bytes(b"%PDF-1.4")
        return _pdf.Printed(formulas=3, images=1, empty=[47, 89], pages=100)

    monkeypatch.setattr(_pdf, "build_singlehtml", lambda path_output, toc=None, config=None: tmp_path)
    monkeypatch.setattr(_pdf, "print_pdf", fake_print)
    assert _pdf.main(["--out", str(out)], browser=object()) == 1
    printed = capsys.readouterr()
    assert "0 code boxes cut, 2 empty-frame pages" in printed.out and "pages 47, 89" in printed.err, printed


def test_the_pdf_empty_page_check_flags_a_page_that_is_only_a_grey_frame():
    """empty_pages: a grey frame under the footer is an empty page; text or an image on it is not."""
    import pypdf
    from pypdf.generic import DecodedStreamObject, DictionaryObject, NameObject

    footer = b"BT /F1 8 Tf 250 20 Td (Backprop by Hand \\267 2 / 3) Tj ET"  # in the 16 mm margin
    frame = b"0.97 0.97 0.97 rg 40 50 515 740 re f "
    pages = {
        "frame": frame + footer,
        "frame and code": frame + b"BT /F1 10 Tf 60 700 Td (import inspect) Tj ET " + footer,
        "nothing": footer,
        "image": b"q 100 0 0 100 100 400 cm BI /W 1 /H 1 /CS /G /BPC 8 ID \x80 EI Q " + footer,
    }
    writer = pypdf.PdfWriter()
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    for content in pages.values():
        page = writer.add_blank_page(595, 842)
        stream = DecodedStreamObject()
        stream.set_data(content)
        page[NameObject("/Contents")] = writer._add_object(stream)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})}
        )
    data = io.BytesIO()
    writer.write(data)
    reader = pypdf.PdfReader(io.BytesIO(data.getvalue()))
    assert "import inspect" in reader.pages[1].extract_text()  # the test's PDF reads as meant
    assert _pdf.empty_pages(reader) == [1, 3], list(pages)


def _cell(lines: list[str], output: list[str] = ()) -> str:
    """A code cell as myst-nb writes it in the book: a framed input, its output under it."""
    out = (
        "<div class='cell_output docutils container'><div class='output stream highlight-myst-ansi "
        f"notranslate'><div class='highlight'><pre>{chr(10).join(output)}</pre></div></div></div>"
        if output
        else ""
    )
    return (
        "<div class='cell docutils container'><div class='cell_input docutils container'>"
        "<div class='highlight-python notranslate'><div class='highlight'><pre>"
        f"{chr(10).join(lines)}</pre></div></div></div>{out}</div>"
    )


@pytest.mark.browser
def test_the_pdf_printer_breaks_a_cell_taller_than_a_page_without_an_empty_frame(browser, tmp_path):
    """The book printed an empty grey frame alone on a page before tall cells (the theme keeps each
    code box whole, inside a cell kept whole): with the book's own style sheets, a cell taller than
    a page, one whose input alone is, and one a little taller than what is left of a page print
    with no empty page, every line printed; the small cell goes whole to the next page."""
    import myst_nb
    import pydata_sphinx_theme
    import pypdf
    import sphinx_book_theme

    sheets = [
        Path(pydata_sphinx_theme.__file__).parent
        / "theme/pydata_sphinx_theme/static/styles/pydata-sphinx-theme.css",
        Path(sphinx_book_theme.__file__).parent
        / "theme/sphinx_book_theme/static/styles/sphinx-book-theme.css",
        Path(myst_nb.__file__).parent / "static/mystnb.css",
        ROOT / "_static" / "custom.css",
    ]
    css = "".join(f"<style>{p.read_text(encoding='utf-8')}</style>" for p in sheets)
    # A4 holds about 57 lines of code in these styles, 265 mm high
    tall = [f"tall_{i} = step(tall_{i - 1})  # line {i}" for i in range(1, 81)]  # about 1.4 pages
    over = [f"over_{i} = step(over_{i - 1})" for i in range(1, 61)]  # its input a little over a page
    small = [f"small_{i} = step(small_{i - 1})" for i in range(1, 13)]  # about 60 mm
    (tmp_path / "book.html").write_text(
        f"<html><head>{css}</head><body><div class='bd-main'><div class='bd-content'>"
        f"<article class='bd-article'><h1>Backprop</h1><p>Lead.</p>{_cell(tall, ['tall done'])}"
        f"<p>A short paragraph.</p>{_cell(over, ['over done'] * 8)}"
        # a page's paragraph 215 mm high: the small cell does not fit under it
        "<p style='break-before: page; height: 215mm'>Before the small cell.</p>"
        f"{_cell(small, ['small done'])}<p>The end.</p></article></div></div></body></html>",
        encoding="utf-8",
    )
    out = tmp_path / "out" / PDF_NAME
    done = print_pdf(tmp_path, out, browser)
    reader = pypdf.PdfReader(out)
    texts = [page.extract_text() for page in reader.pages]
    where = {
        line: [n for n, text in enumerate(texts, 1) if line in text]
        for line in [
            *tall,
            *over,
            small[0],
            small[-1],
            "Before the small cell.",
            "tall done",
            "over done",
            "small done",
        ]
    }
    assert done.empty == _pdf.empty_pages(reader) == [], (
        f"pages {done.empty} of {done.pages} print nothing (an empty code frame?)"
    )
    assert all(where.values()), [line for line, pages in where.items() if not pages]  # nothing lost
    before = where["Before the small cell."][0]
    assert where[small[0]] == where[small[-1]] == where["small done"] == [before + 1], where  # kept whole
    assert max(where[tall[-1]]) > min(where[tall[0]]), "the tall cell should break across pages"


# A small book for the printer's end-to-end run: the introduction, a chapter with its lab, a
# reference page, in the parts of _toc.yml.
PDF_TOC = """format: jb-book
root: intro
parts:
  - caption: Chapters and labs
    chapters:
      - file: chapters/01_cat_mlp
        sections:
          - file: labs/lab01_cat_mlp
  - caption: Reference
    chapters:
      - file: pages/notation
"""

PDF_SUMMARY = re.compile(
    r"pdf: (?P<out>\S+) \((?P<mb>[\d.]+) MB, (?P<pages>\d+) pages\): (?P<formulas>\d+) formulas, "
    r"(?P<images>\d+) images, (?P<cut>\d+) code boxes cut, (?P<empty>\d+) empty-frame pages; contents (?P<contents>\d+) entries, "
    r"outline (?P<bookmarks>\d+) bookmarks"
)


def _pdf_fonts(reader) -> set[str]:
    """The base names of the fonts a PDF embeds (subset prefixes like ABCDEF+ dropped)."""
    names = set()
    for page in reader.pages:
        fonts = (page.get("/Resources") or {}).get("/Font") or {}
        for ref in fonts.values():
            base = str(ref.get_object().get("/BaseFont", ""))
            names.add(base.lstrip("/").split("+", 1)[-1])
    return names


@pytest.mark.browser
def test_a_folded_cell_prints_unfolded(browser, server, site):
    """The PDF printed 4 folded cells as a "Show code cell content" title over nothing; pdf.py opens
    them and hides the fold's title in print: chapter 2's folded cell shows its code on paper."""
    visit = _Visit(browser, f"{server}chapters/02_chain_rule.html")
    try:
        page = visit.page
        page.add_style_tag(content=_pdf.BOOK_CSS)
        assert page.evaluate(_pdf.OPEN_HIDDEN_CELLS) >= 1
        page.emulate_media(media="print")
        shown = page.evaluate(
            """() => [...document.querySelectorAll('div.tag_hide-cell')].map(c => [
                 c.querySelector('pre').getBoundingClientRect().height,
                 getComputedStyle(c.querySelector('summary')).display])"""
        )
        assert shown and all(h > 20 and d == "none" for h, d in shown), shown
    finally:
        visit.close()


@pytest.mark.browser
def test_the_whole_book_pdf_has_a_contents_page_and_an_outline(browser, tmp_path, capsys):
    """tools/pdf.py's main, end to end on a small book: its summary line, a first page listing the
    chapter, its lab and the reference page with the pages they start on, and bookmarks."""
    import pypdf

    toc = tmp_path / "toc.yml"
    toc.write_text(PDF_TOC, encoding="utf-8")
    out = tmp_path / PDF_NAME
    rc = _pdf.main(["--path-output", str(tmp_path), "--toc", str(toc), "--out", str(out)], browser=browser)
    printed = capsys.readouterr().out
    summary = PDF_SUMMARY.search(printed)
    assert rc == 0 and summary, printed
    reader = pypdf.PdfReader(out)
    assert int(summary["pages"]) == len(reader.pages) and summary["cut"] == summary["empty"] == "0", printed
    assert int(summary["formulas"]) > 100 and int(summary["images"]) >= 1, printed

    def flat(text: str) -> str:  # one space between words; the PDF's ligatures (ﬁ, ﬂ) as letters
        return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text)).strip()

    top = [item for item in reader.outline if not isinstance(item, list)]
    titles = [item.title for item in top]
    assert titles[0] == "Introduction" and len(titles) == 4, titles
    assert titles[1].startswith("1. The cat MLP") and titles[2].startswith("Lab 1 ·"), titles
    assert titles[3] == "Notation", titles
    assert int(summary["bookmarks"]) > len(top) and isinstance(reader.outline[1], list), "no sections"
    contents = flat(reader.pages[0].extract_text())
    assert contents.startswith("Backprop by Hand Contents"), contents[:200]
    for item in top:
        number = reader.get_destination_page_number(item) + 1
        assert f"{item.title} {number}" in contents, (
            f"the contents page lacks '{item.title} {number}': {contents}"
        )
        if item.title != "Introduction":  # its title is the book's, on the contents page
            assert flat(reader.pages[number - 1].extract_text()).startswith(item.title), (
                f"page {number} does not start with {item.title!r}"
            )
    assert "Chapters and labs" in contents and "Reference" in contents, contents
    assert reader.page_mode == "/UseOutlines"
    assert reader.metadata.title == "Backprop by Hand", reader.metadata
    fonts = _pdf_fonts(reader)
    assert any("Mono" in f for f in fonts), f"no monospace font embedded: {sorted(fonts)}"


@pytest.mark.browser
def test_the_chinese_pdf_has_its_own_title_contents_and_captions(browser, tmp_path, capsys):
    """pdf.py --language zh_CN on the small book: the Chinese title, 目录, the parts' captions and
    the chapter's title from the catalogs, page numbers that point at those pages."""
    import i18n
    import pypdf

    toc = tmp_path / "toc.yml"
    toc.write_text(PDF_TOC, encoding="utf-8")
    out = tmp_path / PDF_NAME
    argv = ["--path-output", str(tmp_path), "--toc", str(toc), "--out", str(out), "--language", "zh_CN"]
    rc = _pdf.main(argv, browser=browser)
    printed = capsys.readouterr().out
    assert rc == 0 and PDF_SUMMARY.search(printed), printed
    reader = pypdf.PdfReader(out)
    contents = re.sub(r"\s+", " ", reader.pages[0].extract_text())
    book_title = i18n.translations("intro").get("Backprop by Hand", "?")  # the landing page's heading
    assert contents.startswith(f"{book_title} {i18n.PDF_LABELS['contents']}"), contents[:200]
    captions = i18n.translations("intro")
    assert captions.get("Chapters and labs", "?") in contents and captions.get("Reference", "?") in contents
    top = [item.title for item in reader.outline if not isinstance(item, list)]
    assert top[0] == i18n.PDF_LABELS["introduction"] and len(top) == 4, top
    chapter = i18n.translations("chapters/01_cat_mlp").get("1. The cat MLP by hand", "1. The cat MLP by hand")
    assert top[1].replace(" ", "") == chapter.replace("\\", "").replace(" ", ""), (top[1], chapter)
    assert reader.metadata.title.startswith(book_title), reader.metadata  # the book's, not a page's
    # code in a monospace font (the CJK sans drew it once: JS_FONTS checks the pages themselves)
    fonts = _pdf_fonts(reader)
    assert any("Mono" in f for f in fonts), f"no monospace font embedded: {sorted(fonts)}"


# ---------------------------------------------------------------------------------------------
# the Chinese edition (tools/i18n.py): beside the English site, under zh/
# ---------------------------------------------------------------------------------------------


def test_every_page_has_a_language_switch_to_the_same_page_of_the_other_edition(site):
    """English → zh/<page>, zh/<page> → English <page>; the link checker above resolves them."""
    missing = []
    for p in _pages(site):
        rel = p.relative_to(site).as_posix()
        if rel in ("index.html", "zh/index.html") or rel.endswith(("genindex.html", "search.html")):
            continue
        m = re.search(
            r'<a class="[^"]*bbh-language-switch[^"]*" href="([^"]+)"', p.read_text(encoding="utf-8")
        )
        page = rel.removeprefix("zh/")
        want = ("zh/" + page) if not rel.startswith("zh/") else page
        if not m or posixpath.normpath(posixpath.join(posixpath.dirname(rel), m.group(1))) != want:
            missing.append(f"{rel}: {m and m.group(1)}")
    assert not missing, f"{len(missing)} pages without a switch to the same page: {missing[:5]}"


JS_SWITCH_IN_ROW = """() => {
  const mid = (el) => { const r = el.getBoundingClientRect(); return (r.top + r.bottom) / 2; };
  return {switch: mid(document.querySelector('a[data-bbh-language-switch]')),
          buttons: mid(document.querySelector('.article-header-buttons .theme-switch-button, .article-header-buttons button'))};
}"""


# a section (past the first three) whose heading is followed by more than a screen and a half
# before the next heading
JS_LONG_SECTION = """() => {
  const heads = [...document.querySelectorAll('main article section[id] > :is(h1, h2, h3, h4)')];
  const top = h => h.getBoundingClientRect().top + window.scrollY;
  for (let i = 3; i + 1 < heads.length; i++)
    if (top(heads[i + 1]) - top(heads[i]) > 1.5 * window.innerHeight) return heads[i].parentElement.id;
  return null;
}"""


@pytest.mark.browser
def test_the_language_switch_lands_on_the_same_section(browser, server, site):
    """A reader in a section of chapter 1 switches language and is at the same section, both ways."""
    html = (site / "chapters" / "01_cat_mlp.html").read_text(encoding="utf-8")
    section = re.findall(r'<section id="([^"]+)"', html)[2]
    for viewport, phone in ((PHONE, True), (DESKTOP, False)):  # in the header's row of buttons
        v = _Visit(browser, f"{server}zh/chapters/01_cat_mlp.html", viewport, phone)
        try:
            row = v.page.evaluate(JS_SWITCH_IN_ROW)
            assert abs(row["switch"] - row["buttons"]) < 8, f"at {viewport['width']} px: {row}"
        finally:
            v.close()
    visit = _Visit(browser, f"{server}chapters/01_cat_mlp.html#{section}")
    try:
        for want in (f"zh/chapters/01_cat_mlp.html#{section}", f"chapters/01_cat_mlp.html#{section}"):
            visit.page.click("a[data-bbh-language-switch]")
            visit.page.wait_for_load_state("load")
            assert visit.page.url == server + want, visit.page.url
            top = visit.page.evaluate(
                f"() => document.getElementById({section!r}).getBoundingClientRect().top"
            )
            assert -5 < top < 300, f"{want}: the section is at {top} px, not in view"
        assert not visit.errors, visit.errors
    finally:
        visit.close()
    # No #hash: a reader who scrolled into a section (past its heading, and the next heading
    # not yet in view) lands on it too.
    visit = _Visit(browser, f"{server}chapters/01_cat_mlp.html", PHONE, True)
    try:
        visit.page.evaluate("() => MathJax.startup.promise")  # typeset first: it moves the headings
        inner = visit.page.evaluate(JS_LONG_SECTION)
        assert inner, "chapter 1 has no section longer than a phone's screen"
        for want in (f"zh/chapters/01_cat_mlp.html#{inner}", f"chapters/01_cat_mlp.html#{inner}"):
            visit.page.wait_for_load_state("load")
            visit.page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
            visit.page.evaluate("() => MathJax.startup.promise")
            visit.page.evaluate(f"() => document.getElementById({inner!r}).scrollIntoView()")
            visit.page.evaluate("() => window.scrollBy(0, 150)")
            # a tap where the button is: page.click() would first scroll the sticky header's
            # button "into view", some 400 px up the page, which no reader's tap does
            with visit.page.expect_navigation():
                visit.page.evaluate("() => document.querySelector('a[data-bbh-language-switch]').click()")
            assert visit.page.url == server + want, f"scrolled into #{inner}, landed on {visit.page.url}"
        visit.page.evaluate("() => window.scrollTo(0, 0)")  # at the top: the other edition's top
        with visit.page.expect_navigation():
            visit.page.evaluate("() => document.querySelector('a[data-bbh-language-switch]').click()")
        assert visit.page.url == server + "zh/chapters/01_cat_mlp.html", visit.page.url
    finally:
        visit.close()


@pytest.mark.browser
def test_the_figure_buttons_speak_the_page_language(browser, server, site):
    """reader.js's words: "⤢ Full size" on an English page, "⤢ 原尺寸" on a Chinese one (390 px); an
    aside's title ("What the source articles got wrong", a <details> in the notebook) the same way."""
    for docname, want, title in (
        ("chapters/02_chain_rule", "⤢ Full size", "What the source articles got wrong"),
        ("zh/chapters/02_chain_rule", "⤢ 原尺寸", "源文章中的错误"),
    ):
        visit = _Visit(browser, f"{server}{docname}.html", PHONE, True)
        try:
            visit.page.evaluate(JS_IMAGES)
            hints = visit.page.eval_on_selector_all(
                "button.bbh-zoom-hint:not([hidden])", "els => els.map(e => e.textContent)"
            )
            assert hints and set(hints) == {want}, f"{docname}: {hints}"
            got = visit.page.eval_on_selector_all(
                "details.bbh-errata > summary", "els => els.map(e => e.textContent.trim())"
            )
            assert len(got) == 2 and set(got) == {title}, f"{docname}: {got}"
        finally:
            visit.close()


def test_each_glossary_link_of_the_chinese_edition_names_the_term_it_points_at(site):
    """A notebook's glossary links are Markdown links; Sphinx's translation once gave every link of a
    translated paragraph the last English link's target (反向传播 pointed at the chain rule). Each
    Chinese link's text holds the glossary's Chinese for the entry it points at."""
    import i18n

    terms = i18n.glossary_terms()
    by_id = i18n.term_ids(terms)
    link = re.compile(
        r'href="(?:\.\./)*pages/glossary\.html#(term-[^"]+)"><span class="xref std std-term">([^<]*)<'
    )
    wrong, seen = [], 0
    for page in _pages(site / "zh"):
        for target, text in link.findall(page.read_text(encoding="utf-8")):
            term = by_id.get(target)
            if term:
                seen += 1
                # a name kept as it is (LayerNorm for layer normalization) has no Chinese to compare
                if terms[term] not in text and re.search(r"[\u4e00-\u9fff]", text):
                    wrong.append(f"{page.relative_to(site)}: {text!r} -> {target}")
    assert seen > 40 and not wrong, f"{len(wrong)} of {seen}: {wrong[:5]}"


def test_a_lab_page_of_the_chinese_edition_says_in_one_line_that_it_stays_english(site):
    for lab in [d for d in DOCNAMES if d.startswith("labs/lab")]:
        zh = (site / "zh" / f"{lab}.html").read_text(encoding="utf-8")
        assert zh.count('class="bbh-english-only"') == 1, lab
        assert 'class="bbh-english-only"' not in (site / f"{lab}.html").read_text(encoding="utf-8")


def test_chinese_search_indexes_words_not_single_characters(site):
    """Sphinx's Chinese splitter (with jieba) indexes words (链式法则, 梯度), not single characters."""
    import json

    index = (site / "zh" / "searchindex.js").read_text(encoding="utf-8")
    words = json.loads(index[index.index("(") + 1 : index.rindex(")")])["terms"]
    chinese = [w for w in words if re.fullmatch(r"[\u4e00-\u9fff]+", w)]
    assert {"链式法则", "梯度"} <= set(words), sorted(chinese)[:20]
    assert sum(len(w) > 1 for w in chinese) > 0.5 * len(chinese), (
        f"mostly single characters: {sorted(chinese)[:20]}"
    )


@pytest.mark.browser
def test_chinese_search_finds_a_word(browser, server, site):
    visit = _Visit(browser, server + "zh/search.html?q=" + urllib.parse.quote("链式法则"))
    try:
        visit.page.wait_for_function(
            "() => (document.querySelector('#search-results .search-summary') || {}).textContent",
            timeout=20000,
        )
        results = visit.page.evaluate(
            "() => document.querySelectorAll('#search-results ul.search li').length"
        )
        assert results > 0 and not visit.errors, (results, visit.errors)
    finally:
        visit.close()
