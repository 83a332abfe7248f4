"""The website, checked the way a reader meets it.

* Without a browser: the site builds with ``jupyter-book build -W -n`` (no warnings), every
  internal link and anchor resolves, and no page asks another host for a script, stylesheet,
  image or frame.
* In headless Chromium (marker ``browser``; Debian's ``chromium`` driven by Playwright, no
  browser download): every page loads with no JavaScript error and no request leaving
  localhost, its math is typeset, its images load, its Colab button points at its notebook in
  the repository of _config.yml, and its animations and widgets respond.  Screenshots of the
  landing page and a chapter at desktop and phone widths go to ``screenshots/``.

Environment: ``CHROMIUM`` (default /usr/bin/chromium; a missing path skips the browser tests:
``tests/conftest.py``),
``SITE_HTML`` (test an already built site instead of building one), ``SITE_TOC`` (build with
another table of contents), ``SITE_SOURCE`` (build another copy of the book),
``SITE_SCREENSHOTS`` (default screenshots/).  See pages/testing.md.
"""

from __future__ import annotations

import functools
import http.server
import os
import posixpath
import re
import subprocess
import sys
import threading
import urllib.parse
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(os.environ.get("SITE_SOURCE", ROOT)).resolve()  # the book to build
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TOC = Path(os.environ.get("SITE_TOC", SOURCE / "_toc.yml"))
SCREENSHOTS = Path(os.environ.get("SITE_SCREENSHOTS", ROOT / "screenshots"))
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

sys.path.insert(0, str(ROOT / "tools"))
from pdf import PDF_NAME, print_pdf  # noqa: E402

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}


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


def _config() -> dict:
    return yaml.safe_load((SOURCE / "_config.yml").read_text())


def _colab_url(docname: str) -> str:
    """Where a page's Colab button must point: its notebook in the configured repository."""
    cfg = _config()
    repo = cfg["repository"]
    org_repo = urllib.parse.urlparse(repo["url"]).path.strip("/")
    book = (repo.get("path_to_book") or "").strip("/")
    path = posixpath.join(book, docname + ".ipynb") if book else docname + ".ipynb"
    colab = cfg["launch_buttons"]["colab_url"].rstrip("/")
    return f"{colab}/github/{org_repo}/blob/{repo.get('branch', 'main')}/{path}"


def _is_notebook(docname: str) -> bool:
    return (SOURCE / (docname + ".ipynb")).exists()


# ---------------------------------------------------------------------------------------------
# build once per session
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The built site's html folder: SITE_HTML, or a fresh -W -n build in a temp folder."""
    if os.environ.get("SITE_HTML"):
        html = Path(os.environ["SITE_HTML"]).resolve()
        assert (html / "index.html").exists(), f"SITE_HTML={html} holds no built site"
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
    return out / "_build" / "html"


def _pages(site: Path) -> list[Path]:
    """Every HTML page of the site (not the assets under _static/, _vendor/, _sources/)."""
    return sorted(p for p in site.rglob("*.html") if not p.relative_to(site).parts[0].startswith("_"))


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

JS_SCROLLING_CODE = """() => [...document.querySelectorAll('main div.cell pre')]
  .filter(p => p.scrollWidth > p.clientWidth + 1)
  .map(p => `${p.closest('.cell_output') ? 'output' : 'code'} ${p.scrollWidth} px in ${p.clientWidth} px: ` +
            p.textContent.split('\\n').reduce((a, l) => l.length > a.length ? l : a, '').trim().slice(0, 50))"""

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
@pytest.mark.parametrize("docname", DOCNAMES)
def test_page_in_browser(browser, server, site, docname):
    visit = _Visit(browser, server + docname + ".html")
    try:
        page = visit.page
        problems = _check_math(page)
        # At 1280 px no display equation is wider than the text column (long ones are aligned lines).
        wide = page.evaluate(JS_WIDE_EQUATIONS)
        if wide:
            problems.append(f"display equations wider than the column: {wide}")
        # At 1280 px no code cell or output scrolls sideways (88 columns fit; outputs wrap).
        scrolling = page.evaluate(JS_SCROLLING_CODE)
        if scrolling:
            problems.append(f"{len(scrolling)} code boxes scroll sideways: {scrolling[:4]}")
        broken = page.evaluate(JS_IMAGES)
        if broken:
            problems.append(f"images that did not load: {broken}")
        if _is_notebook(docname):
            hrefs = page.eval_on_selector_all(
                "a[href*='colab.research.google.com']", "els => els.map(e => e.href)"
            )
            if _colab_url(docname) not in hrefs:
                problems.append(f"Colab button {hrefs} should point at {_colab_url(docname)}")
        problems += _check_animations(page)
        problems += _check_widgets(page)
        problems += visit.errors
        if visit.remote:
            problems.append(f"requests that left localhost: {sorted(set(visit.remote))}")
    finally:
        visit.close()
    assert not problems, f"{docname}:\n  " + "\n  ".join(problems)


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
                page.screenshot(
                    path=str(path),
                    full_page=True,
                    clip={"x": 0, "y": 0, "width": viewport["width"], "height": min(height, 2400)},
                )
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
@pytest.mark.parametrize("width", [390, 900])
@pytest.mark.parametrize("drawer", sorted(DRAWERS))
def test_the_visible_drawer_buttons_open_the_chapter_list_and_the_page_contents(
    browser, server, site, width, drawer
):
    """☰ and ☷ open their drawers below the desktop widths (pydata-sphinx-theme#2451: a hidden duplicate took the click)."""
    dialog, expected = DRAWERS[drawer]
    visit = _Visit(
        browser,
        server + "chapters/06_attention_backward.html",
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


@pytest.mark.browser
def test_no_page_scrolls_sideways_on_a_phone(browser, server, site):
    """Every page at 390 px, in one phone context (a new context per page would cost a minute)."""
    context = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True)
    problems = []
    try:
        page = context.new_page()
        for docname in DOCNAMES:
            page.goto(server + docname + ".html", wait_until="load")
            extra, wide = page.evaluate(JS_PAGE_OVERFLOW)
            if extra > 1:
                problems.append(f"{docname} is {extra} px wider than the screen: {wide}")
    finally:
        context.close()
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
    formulas, images, cut = print_pdf(tmp_path, out, browser)
    data = out.read_bytes()
    pages = len(re.findall(rb"/Type\s*/Page\b", data))
    assert data.startswith(b"%PDF") and pages >= 2, (pages, len(data))
    assert (formulas, images, cut) == (0, 0, 0), "the print CSS should wrap the long code line"
