"""The Chinese edition: message catalogs from the book's own sources, their coverage, and its build.

    python tools/i18n.py update      # extract the English text (Sphinx gettext) and update locales/zh_CN/*.po
    python tools/i18n.py coverage    # per page: translated, fuzzy, untranslated (exit 1 if a required page is not complete)
    python tools/i18n.py build       # the Chinese site into _build/html/zh/ (from committed outputs, like the English one)
    python tools/i18n.py check       # every translation keeps the math, code, links and roles of its English, with the glossary's terms
    python tools/i18n.py apply PAGE FILE.json   # set translations {msgid: msgstr} into PAGE's catalog (fuzzy flags cleared)
    python tools/i18n.py notebooks   # the Chinese notebooks, zh/chapters/*.ipynb, from the chapters and the catalogs
    python tools/i18n.py notebooks --check      # exit 1 if a committed Chinese notebook is not what the sources give

Only prose is translated. Sphinx's gettext builder extracts every paragraph, heading, list item
and table cell of every page (one ``.pot`` per page: ``gettext_compact: false`` in _config.yml)
and ``sphinx-intl`` keeps one ``.po`` per page in ``locales/zh_CN/LC_MESSAGES/``. Code cells, their
outputs and the figures are not in the catalogs (Sphinx leaves literal blocks out by default),
so the Chinese pages show the same notebooks' code and outputs: nbval and the helpers keep one
owner. myst-nb (1.4.0, since MyST-NB#600) parses a translated paragraph of a notebook as Markdown, not as notebook
JSON (the gettext problem other projects met with ``.ipynb`` sources), so the notebooks
themselves are the sources and no copy of them exists.

An English edit changes a paragraph's msgid: ``update`` then marks its Chinese *fuzzy* (the old
translation kept as a suggestion), and ``coverage`` fails until someone translates it again
and removes the fuzzy flag (CONTRIBUTING.md, "The Chinese edition").

The Chinese site's Colab and download buttons open Chinese notebooks: ``zh/chapters/NN.ipynb``,
written by ``notebooks`` from the English notebook and the same catalogs. Each Markdown paragraph,
heading, list item and table cell is replaced by its translation (the catalog's msgid is the
block's Markdown, as MyST's parser gives it); code cells and their outputs are the English
notebook's, byte for byte, so nbval's check of the English notebook covers them. The files are
committed (Colab opens them from GitHub); a test regenerates them and compares.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LANGUAGE = "zh_CN"
LOCALES = ROOT / "locales"
CATALOGS = LOCALES / LANGUAGE / "LC_MESSAGES"
# The reading part, translated in full (issue: the landing page, chapters 1-11, notation, glossary).
# Labs stay English for now (their prompts are being rewritten) and say so on the Chinese site.
REQUIRED = ("intro", "chapters/", "pages/notation", "pages/glossary")
TITLE = "手推反向传播 · Backprop by Hand"
PDF_LABELS = {"contents": "目录", "introduction": "简介"}  # tools/pdf.py's contents page
# The Chinese notebooks (``notebooks``): zh/chapters/NN.ipynb, the path the Chinese site's Colab
# button opens (tools/web/translated_notebooks.py) and its download button serves.
NOTEBOOKS = ROOT / "zh"


def jupyter_book(*args: str) -> None:
    """``jupyter-book ARGS`` with this Python (no reliance on a console script on PATH); its
    output is shown only when it fails (a one-line error, then the build's last lines)."""
    code = "import sys; from jupyter_book.cli.main import main; sys.argv[0] = 'jupyter-book'; main()"
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(
            f"i18n: jupyter-book {args[0]} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}"
        )


def extract(out: Path = ROOT / "_build" / "i18n") -> Path:
    """The English text of every page as .pot files (Sphinx's gettext builder); returns their folder."""
    shutil.rmtree(out / "_build" / "gettext", ignore_errors=True)
    jupyter_book(
        "build", ".", "--builder", "custom", "--custom-builder", "gettext", "--path-output", str(out)
    )
    return out / "_build" / "gettext"


def update() -> None:
    """Carry the English text into locales/zh_CN: new paragraphs empty, changed ones fuzzy."""
    pot = extract()
    subprocess.run(
        [sys.executable, "-m", "sphinx_intl", "update", "-p", str(pot), "-d", str(LOCALES), "-l", LANGUAGE],
        cwd=ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    for path in CATALOGS.rglob("*.po"):  # the labs and the testing page stay English: no catalog to keep
        if not is_required(path.relative_to(CATALOGS).with_suffix("").as_posix()):
            path.unlink()


@dataclass
class Coverage:
    page: str  # 'chapters/01_cat_mlp'
    total: int
    translated: int
    fuzzy: int
    required: bool

    @property
    def untranslated(self) -> int:
        return self.total - self.translated - self.fuzzy

    @property
    def complete(self) -> bool:
        return self.translated == self.total


def is_required(page: str) -> bool:
    """Whether a page belongs to the reading part that must be translated in full."""
    return any(page == r or (r.endswith("/") and page.startswith(r)) for r in REQUIRED)


def read_catalog(path: Path):
    """A .po file as a babel Catalog (fuzzy entries kept, with their flag)."""
    from babel.messages.pofile import read_po

    with path.open("rb") as f:
        return read_po(f, abort_invalid=True)


def messages(catalog) -> list:
    """The catalog's real messages (not the header, not obsolete ones)."""
    return [m for m in catalog if m.id]


def coverage() -> list[Coverage]:
    """Coverage of every page's catalog, in page order."""
    rows = []
    for path in sorted(CATALOGS.rglob("*.po")):
        page = path.relative_to(CATALOGS).with_suffix("").as_posix()
        msgs = messages(read_catalog(path))
        fuzzy = sum(1 for m in msgs if m.fuzzy)
        translated = sum(1 for m in msgs if m.string and not m.fuzzy)
        rows.append(Coverage(page, len(msgs), translated, fuzzy, is_required(page)))
    return rows


def print_coverage(rows: list[Coverage]) -> bool:
    """Prints one line per page; True when every required page is complete."""
    ok = True
    for r in rows:
        share = r.translated / r.total if r.total else 1.0
        mark = "✓" if r.complete else ("✗" if r.required else "·")
        extra = f", {r.fuzzy} fuzzy, {r.untranslated} untranslated" if not r.complete else ""
        print(f"{mark} {r.page:<38} {r.translated:4d}/{r.total:<4d} {share:6.1%}{extra}")
        ok &= r.complete or not r.required
    return ok


# What a translation must carry over unchanged: math, code spans, link targets, role targets.
MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+?\$", re.S)
CODE = re.compile(r"``.+?``|`[^`]+`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
ROLE = re.compile(r"\{(\w+)\}`(?:[^`<]*<)?([^`<>]+?)>?`")


def glossary_terms() -> dict[str, str]:
    """Each glossary term's one Chinese rendering, from pages/glossary.md (term line, then 中文 line)."""
    text = (ROOT / "pages" / "glossary.md").read_text(encoding="utf-8")
    block = text[text.index("```{glossary}") :]
    lines = [ln for ln in block.splitlines()[2:] if ln.strip() and not ln.startswith("```")]
    terms = {}
    for term, zh in zip(lines, lines[1:]):
        if not term.startswith(" ") and not zh.startswith(" ") and re.search(r"[\u4e00-\u9fff]", zh):
            terms[term.strip()] = zh.strip()
    return terms


# a notebook links a glossary term with Markdown (Colab and JupyterLab show a {term} role raw)
GLOSSARY_LINK = re.compile(r"\]\([./]*pages/glossary\.md#(term-[^)\s]+)\)")


def term_ids(terms: dict[str, str]) -> dict[str, str]:
    """{the id Sphinx gives a glossary term's entry: the term} (``term-dead-ReLU``)."""
    from sphinx.util.nodes import _make_id

    return {_make_id("term-" + t): t for t in terms}


def _roles(text: str) -> list[tuple[str, str]]:
    return sorted((kind, target.strip().lower()) for kind, target in ROLE.findall(text))


def has_prose(msgid: str, terms: dict[str, str]) -> bool:
    """Whether a message holds English words to translate: not a display formula (LaTeX only,
    kept as it is), not a glossary term's own name (its entry's English line; the Chinese line
    under it is the term's rendering, and translating the name would define the term twice)."""
    if msgid.strip() in terms:
        return False
    words = re.sub(r"\\[A-Za-z]+", " ", MATH.sub(" ", CODE.sub(" ", ROLE.sub(" ", msgid))))
    formula = "\\" in msgid and "$" not in msgid  # a display formula: LaTeX, no inline $ as prose has
    return re.search(r"[A-Za-z]{4,}", words) is not None and not formula


def problems(msgid: str, msgstr: str, terms: dict[str, str]) -> list[str]:
    """What a translation changed that it must keep: [] when it is faithful in form."""
    out = []
    without_roles = lambda t: ROLE.sub("", t)  # noqa: E731  (a role's text is translated)
    for name, pattern in (("math", MATH), ("code", CODE)):
        a, b = sorted(pattern.findall(without_roles(msgid))), sorted(pattern.findall(without_roles(msgstr)))
        if a != b:
            from collections import Counter

            differ = list((Counter(a) - Counter(b)) + (Counter(b) - Counter(a)))
            out.append(f"{name} changed: {differ[0][:60]!r}")
    if sorted(LINK.findall(msgid)) != sorted(LINK.findall(msgstr)):
        out.append("a link target changed")
    if _roles(msgid) != _roles(msgstr):
        out.append(f"roles changed: {_roles(msgid)} -> {_roles(msgstr)}")
    for kind, target in ROLE.findall(msgid):
        zh = terms.get(target.strip()) or terms.get(target.strip().lower())
        if kind == "term" and zh and zh not in msgstr:
            out.append(f"the glossary term {target.strip()!r} is not rendered as {zh}")
    by_id = term_ids(terms)
    for target in GLOSSARY_LINK.findall(msgid):  # a notebook's glossary link: [text](…/glossary.md#term-…)
        term = by_id.get(target)
        if term and terms[term] not in msgstr:
            out.append(f"the glossary term {term!r} is not rendered as {terms[term]}")
    if re.match(r"(\d+\.|[-*+]) ", msgstr):  # a translation is parsed as a paragraph of Markdown
        out.append(
            "starts like a Markdown list or heading: escape it ('1\\. …'), or the paragraph is not translated"
        )
    if re.search(r"[\u4e00-\u9fff]", msgstr) is None and has_prose(msgid, terms):
        out.append("no Chinese in the translation")
    return out


def check() -> list[str]:
    """Every problem of every translated message: 'page: msgid…: problem'."""
    terms = glossary_terms()
    found = []
    for path in sorted(CATALOGS.rglob("*.po")):
        page = path.relative_to(CATALOGS).with_suffix("").as_posix()
        for m in messages(read_catalog(path)):
            if m.string:
                found += [f"{page}: {m.id[:50]!r}: {p}" for p in problems(m.id, m.string, terms)]
    return found


def translations(page: str) -> dict[str, str]:
    """{English: Chinese} of a page's translated messages (the PDF's part captions come from intro)."""
    path = CATALOGS / f"{page}.po"
    if not path.exists():
        return {}
    return {m.id: m.string for m in messages(read_catalog(path)) if m.string and not m.fuzzy}


def apply(page: str, translations: dict[str, str]) -> int:
    """Set msgid -> msgstr in a page's catalog (clearing fuzzy); returns how many were set."""
    from babel.messages.pofile import write_po

    path = CATALOGS / f"{page}.po"
    catalog = read_catalog(path)
    done = 0
    for m in messages(catalog):
        if m.id in translations:
            m.string = translations[m.id]
            m.flags.discard("fuzzy")
            done += 1
    unknown = set(translations) - {m.id for m in messages(catalog)}
    if unknown:
        raise SystemExit(f"apply: {len(unknown)} msgid(s) not in {path.name}: {next(iter(unknown))[:60]!r}")
    with path.open("wb") as f:
        write_po(f, catalog)
    return done


def _markdown_parser():
    """MyST's Markdown parser with the book's extensions (_config.yml's parse: myst_enable_extensions)."""
    from markdown_it.renderer import RendererHTML
    from myst_parser.config.main import MdParserConfig
    from myst_parser.parsers.mdit import create_md_parser

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    extensions = set(config.get("parse", {}).get("myst_enable_extensions", []))
    return create_md_parser(MdParserConfig(enable_extensions=extensions), RendererHTML)


def errata_title(lang: str) -> str:
    """The title of the asides on what the seeds got wrong, in ``lang`` ('en', 'zh'): reader.js's
    ``WORDS[lang].errata`` (the site's one owner; a notebook has no script to translate its <summary>)."""
    js = (ROOT / "_static" / "reader.js").read_text(encoding="utf-8")
    return re.search(lang + r": \{.*?errata: \"([^\"]+)\"", js, re.S).group(1)


LINK_TARGET = re.compile(r"(\]\()([^)\s#]+)([^)\s]*\))")


def _relink(text: str, page: str) -> str:
    """Relative links of ``page``'s Markdown, made to work from zh/: to the Chinese notebook where
    there is one, else to the English file (GitHub's viewer follows relative links)."""

    def target(m: re.Match) -> str:
        href = m.group(2)
        if re.match(r"[a-z]+:", href) or href.startswith("/"):
            return m.group(0)
        dest = os.path.normpath(os.path.join(os.path.dirname(page), href))  # relative to the repository
        here = os.path.dirname(f"zh/{page}")
        zh = NOTEBOOKS / dest
        new = os.path.relpath(
            f"zh/{dest}" if zh.suffix == ".ipynb" and is_required(dest[:-6]) else dest, here
        )
        return m.group(1) + new + m.group(3)

    return LINK_TARGET.sub(target, text)


def translate_markdown(text: str, tr: dict[str, str], parser=None) -> tuple[str, list[str]]:
    """A Markdown cell with every block the catalog translates replaced by its translation;
    returns (the text, the English of each block with prose that has no translation)."""
    parser = parser or _markdown_parser()
    lines = text.split("\n")
    missing = []
    tokens = parser.parse(text)
    # bottom-up, so that a replaced block does not move the lines of those above it
    for i in sorted(range(len(tokens)), key=lambda i: (tokens[i].map or [0])[0], reverse=True):
        tok = tokens[i]
        if tok.type != "inline" or not tok.map or not tok.content.strip():
            continue
        msgid = tok.content.replace("\n", " ").strip()
        zh = tr.get(msgid)
        if zh is None:
            if has_prose(msgid, {}):
                missing.append(msgid)
            continue
        start, end = tok.map
        first = tok.content.split("\n")[0]
        at = lines[start].find(first)
        if i > 0 and tokens[i - 1].type in ("th_open", "td_open") or end - start == 1:
            # a table cell shares its line with the row's other cells: replace the text in place
            lines[start] = lines[start][:at] + zh + lines[start][at + len(first) :]
        else:
            prefix = lines[start][:at]  # a list marker, a quote's '>', indentation
            body = zh.replace("\n", "\n" + " " * len(prefix))
            lines[start:end] = [prefix + body]
    return "\n".join(lines), missing


def translate_notebook(path: Path, parser=None) -> tuple[dict, list[str]]:
    """The Chinese notebook of chapter ``path`` (its JSON) and the English blocks left untranslated."""
    page = path.relative_to(ROOT).with_suffix("").as_posix()
    tr = translations(page)
    summary = f"<summary>{errata_title('en')}</summary>", f"<summary>{errata_title('zh')}</summary>"
    nb = json.loads(path.read_text(encoding="utf-8"))
    missing = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text, left = translate_markdown("".join(cell["source"]), tr, parser)
        text = _relink(text.replace(*summary), page)
        missing += left
        cell["source"] = text.splitlines(keepends=True)
    return nb, missing


def notebook_text(nb: dict) -> str:
    """A notebook as nbformat writes it (one-space indent, a final newline), the chapters' format."""
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def notebooks(check: bool = False) -> list[str]:
    """Writes (or with ``check`` compares) zh/chapters/*.ipynb; returns what is wrong: a stale or
    missing file, a block without translation."""
    parser = _markdown_parser()
    problems = []
    for path in sorted((ROOT / "chapters").glob("[0-9]*.ipynb")):
        nb, missing = translate_notebook(path, parser)
        rel = path.relative_to(ROOT).as_posix()
        problems += [f"{rel}: no translation for {m[:60]!r}" for m in missing]
        out = NOTEBOOKS / rel
        text = notebook_text(nb)
        if check:
            if not out.exists() or out.read_text(encoding="utf-8") != text:
                problems.append(
                    f"zh/{rel} is not what the sources give: run `python tools/i18n.py notebooks`"
                )
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
    return problems


def zh_config(out: Path) -> Path:
    """The English _config.yml with the Chinese edition's settings, written under ``out``."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    sphinx_config = config.setdefault("sphinx", {}).setdefault("config", {})
    sphinx_config["language"] = LANGUAGE
    sphinx_config["html_title"] = TITLE
    # myst-nb's toggle of a hidden cell (its default, "Show code cell {type}", is English)
    sphinx_config["nb_code_prompt_show"] = "显示代码单元"
    sphinx_config["nb_code_prompt_hide"] = "隐藏代码单元"
    # paths in _config.yml are relative to the book's root; this file lives elsewhere
    sphinx_config["locale_dirs"] = [str(LOCALES)]
    sphinx_config["html_extra_path"] = [str(ROOT / p) for p in sphinx_config.get("html_extra_path", [])]
    config["sphinx"]["local_extensions"] = {
        k: str(ROOT / v) for k, v in config["sphinx"].get("local_extensions", {}).items()
    }
    config["title"] = TITLE
    out.mkdir(parents=True, exist_ok=True)
    path = out / "_config.yml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def zh_toc(out: Path, toc: Path = ROOT / "_toc.yml") -> Path:
    """The table of contents with its parts' captions in Chinese (from the landing page's catalog).

    sphinx-external-toc inserts the toctrees after Sphinx has translated the page, so the
    sidebar's captions would stay English; the Chinese build reads this copy instead."""
    data = yaml.safe_load(toc.read_text(encoding="utf-8"))
    captions = translations("intro")
    for part in data.get("parts", []):
        if part.get("caption") in captions:
            part["caption"] = captions[part["caption"]]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "_toc.yml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def build(
    extra: list[str] = (), out: Path | None = None, site: Path | None = None, toc: Path = ROOT / "_toc.yml"
) -> Path:
    """The Chinese site, built like the English one (from ``toc``) into ``out`` (default
    _build/zh), copied to ``site`` (default _build/html/zh, beside the English site); returns ``site``."""
    out = out or ROOT / "_build" / "zh"
    site = site or ROOT / "_build" / "html" / "zh"
    config = zh_config(out)
    args = ["--config", str(config), "--toc", str(zh_toc(out, toc)), "--path-output", str(out)]
    shutil.rmtree(out / "_build" / "html", ignore_errors=True)
    jupyter_book("build", "-W", "-n", "--keep-going", *args, *extra, ".")
    shutil.rmtree(site, ignore_errors=True)
    shutil.copytree(out / "_build" / "html", site)
    return site


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("update", "coverage", "build", "check", "apply", "notebooks"))
    args, extra = ap.parse_known_args(argv)
    if args.command == "notebooks":
        found = notebooks(check="--check" in extra)
        print(
            "\n".join(found) or f"i18n notebooks: {NOTEBOOKS.name}/chapters/*.ipynb are what the sources give"
        )
        return 1 if found else 0
    if args.command == "check":
        found = check()
        print(
            "\n".join(found) or "i18n check: every translation keeps its math, code, links, roles and terms"
        )
        return 1 if found else 0
    if args.command == "apply":
        page, file = extra
        n = apply(page, json.loads(Path(file).read_text(encoding="utf-8")))
        print(f"{page}: {n} translations set")
        return 0
    if args.command == "update":
        update()
        print_coverage(coverage())  # updating is not failing: coverage says what is left
        return 0  # updating is not failing: coverage says what is left
    if args.command == "coverage":
        return 0 if print_coverage(coverage()) else 1
    site = build(extra)
    print(f"Chinese site built: {site / 'index.html'}")
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main(sys.argv[1:]))
