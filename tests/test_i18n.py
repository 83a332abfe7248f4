"""The Chinese edition (tools/i18n.py): complete, current and faithful in form for the reading part.

A reader never meets a paragraph half in one language: every message of the landing page,
chapters 1-11, notation and glossary is translated and not fuzzy, the catalogs hold exactly the
English text the sources have now (an English edit without `python tools/i18n.py update` fails
here), and every translation keeps its math, code, links and roles, with the glossary's one
Chinese rendering of each term it references.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
import i18n  # noqa: E402

REQUIRED_PAGES = {
    "intro",
    "pages/glossary",
    "pages/notation",
    *(
        p.with_suffix("").relative_to(ROOT).as_posix()
        for p in sorted((ROOT / "chapters").glob("[0-9]*.ipynb"))
    ),
}


def test_every_page_of_the_reading_part_has_a_catalog_and_nothing_else_does():
    pages = {r.page for r in i18n.coverage()}
    assert pages == REQUIRED_PAGES, pages ^ REQUIRED_PAGES
    assert all(i18n.is_required(p) for p in REQUIRED_PAGES)
    assert not i18n.is_required("labs/lab01_cat_mlp") and not i18n.is_required("pages/testing")


def test_the_reading_part_is_translated_in_full_with_nothing_fuzzy(capsys):
    rows = i18n.coverage()
    with capsys.disabled():  # the coverage per page, in the test log
        print()
        ok = i18n.print_coverage(rows)
    assert ok, [f"{r.page}: {r.untranslated} untranslated, {r.fuzzy} fuzzy" for r in rows if not r.complete]


def test_the_catalogs_hold_the_english_the_sources_have_now(tmp_path):
    """The .po files were updated after the last English edit (else a changed paragraph shows in English)."""
    pot = i18n.extract(tmp_path)
    for page in sorted(REQUIRED_PAGES):
        now = {m.id for m in i18n.messages(i18n.read_catalog(pot / f"{page}.pot"))}
        have = {m.id for m in i18n.messages(i18n.read_catalog(i18n.CATALOGS / f"{page}.po"))}
        assert now == have, (
            f"{page}: the English changed; run `python tools/i18n.py update` and translate "
            f"{len(now - have)} new or changed message(s), e.g. {sorted(now - have)[:1]}"
        )


def test_every_translation_keeps_math_code_links_roles_and_the_glossarys_terms():
    assert i18n.check() == []


def test_the_checker_catches_what_a_translation_must_not_change():
    terms = i18n.glossary_terms()
    en = "The {term}`chain rule` gives $\\partial L/\\partial x$ for `x`, see [notation](notation.md)."
    good = "{term}`链式法则 <chain rule>` 给出 `x` 的 $\\partial L/\\partial x$，见[记号](notation.md)。"
    assert i18n.problems(en, good, terms) == []
    bad = {
        "math": "{term}`链式法则 <chain rule>` 给出 `x` 的 $\\partial L / \\partial x$，见[记号](notation.md)。",
        "code": "{term}`链式法则 <chain rule>` 给出 x 的 $\\partial L/\\partial x$，见[记号](notation.md)。",
        "link": "{term}`链式法则 <chain rule>` 给出 `x` 的 $\\partial L/\\partial x$，见[记号](glossary.md)。",
        "roles": "链式法则给出 `x` 的 $\\partial L/\\partial x$，见[记号](notation.md)。",
        "glossary": "{term}`链式规则 <chain rule>` 给出 `x` 的 $\\partial L/\\partial x$，见[记号](notation.md)。",
    }
    for what, text in bad.items():
        assert i18n.problems(en, text, terms), what
    assert i18n.problems("1. The cat MLP by hand", "1. 手推猫咪 MLP", terms)  # a Markdown list, dropped
    assert i18n.problems("1. The cat MLP by hand", "1\\. 手推猫咪 MLP", terms) == []
    assert i18n.problems("Every gradient by hand.", "Every gradient by hand.", terms)  # not translated


def test_each_glossary_term_has_one_chinese_rendering():
    terms = i18n.glossary_terms()
    text = (ROOT / "pages" / "glossary.md").read_text(encoding="utf-8")
    entries = text[text.index("```{glossary}") :].count("\n  ")  # definition lines, at least one per term
    assert len(terms) >= 30 and entries >= len(terms)
    assert terms["backpropagation"] == "反向传播" and terms["chain rule"] == "链式法则"
    assert len(set(terms.values())) == len(terms)  # no two terms share a rendering


@pytest.mark.parametrize("page", ["chapters/01_cat_mlp"])
def test_apply_sets_translations_and_refuses_an_unknown_message(tmp_path, monkeypatch, page):
    import shutil

    catalogs = tmp_path / "LC_MESSAGES"
    (catalogs / "chapters").mkdir(parents=True)
    shutil.copy(i18n.CATALOGS / f"{page}.po", catalogs / f"{page}.po")
    monkeypatch.setattr(i18n, "CATALOGS", catalogs)
    first = i18n.messages(i18n.read_catalog(catalogs / f"{page}.po"))[0]
    assert i18n.apply(page, {first.id: "一"}) == 1
    assert i18n.translations(page)[first.id] == "一"
    with pytest.raises(SystemExit, match="not in 01_cat_mlp.po"):
        i18n.apply(page, {"no such paragraph": "无"})


# ---------------------------------------------------------------------------------------------
# the Chinese notebooks (zh/chapters/*.ipynb): what the Chinese site's Colab and download buttons give
# ---------------------------------------------------------------------------------------------


def test_the_chinese_notebooks_are_committed_as_the_chapters_and_catalogs_give_them():
    """Every block of prose has its translation, and zh/ holds what `i18n.py notebooks` writes now."""
    assert i18n.notebooks(check=True) == []


@pytest.mark.parametrize("path", sorted((ROOT / "chapters").glob("[0-9]*.ipynb")), ids=lambda p: p.stem)
def test_a_chinese_notebook_has_the_english_code_and_outputs_and_chinese_prose(path):
    """Code cells and their outputs byte for byte (nbval's check of the English covers them);
    each Markdown cell with English words in it has Chinese in it."""
    import json

    english = json.loads(path.read_text(encoding="utf-8"))
    chinese = json.loads((i18n.NOTEBOOKS / "chapters" / path.name).read_text(encoding="utf-8"))
    assert [c["cell_type"] for c in chinese["cells"]] == [c["cell_type"] for c in english["cells"]]
    assert chinese["metadata"] == english["metadata"]
    for en, zh in zip(english["cells"], chinese["cells"]):
        if en["cell_type"] == "code":
            assert zh == en
        elif i18n.has_prose("".join(en["source"]), {}):
            assert re.search(r"[\u4e00-\u9fff]", "".join(zh["source"])), "".join(en["source"])[:80]


def test_translate_markdown_replaces_each_block_where_it_stands_and_names_what_it_cannot():
    text = "\n".join(
        [
            "# 1. A heading",
            "",
            "A paragraph over",
            "two lines with $x^2$.",
            "",
            "1. an item that",
            "   wraps",
            "- another",
            "",
            "> a quote",
            "",
            "| name | what |",
            "| --- | --- |",
            "| `f` | a function |",
            "",
            "Nothing translates this sentence at all.",
        ]
    )
    tr = {
        "1. A heading": "1\\. 标题",
        "A paragraph over two lines with $x^2$.": "跨两行的段落，含 $x^2$。",
        "an item that wraps": "会换行的一项",
        "another": "另一项",
        "a quote": "引文",
        "name": "名称",
        "what": "含义",
        "a function": "一个函数",
    }
    out, missing = i18n.translate_markdown(text, tr)
    assert out.split("\n") == [
        "# 1\\. 标题",
        "",
        "跨两行的段落，含 $x^2$。",
        "",
        "1. 会换行的一项",
        "- 另一项",
        "",
        "> 引文",
        "",
        "| 名称 | 含义 |",
        "| --- | --- |",
        "| `f` | 一个函数 |",
        "",
        "Nothing translates this sentence at all.",
    ]
    assert missing == ["Nothing translates this sentence at all."]


def test_a_chinese_notebooks_relative_links_lead_where_the_english_ones_do():
    """From zh/chapters/: a chapter to its Chinese notebook, anything else to the English file."""
    text = (
        "[glossary](../pages/glossary.md#term-chain-rule), [next](02_chain_rule.ipynb), "
        "[lab](../labs/lab01_cat_mlp.ipynb), [web](https://pytorch.org/docs), [here](#the-network)"
    )
    assert i18n._relink(text, "chapters/01_cat_mlp") == (
        "[glossary](../../pages/glossary.md#term-chain-rule), [next](02_chain_rule.ipynb), "
        "[lab](../../labs/lab01_cat_mlp.ipynb), [web](https://pytorch.org/docs), [here](#the-network)"
    )


@pytest.mark.slow
def test_the_chinese_notebook_of_chapter_1_runs_and_reproduces_its_outputs(tmp_path):
    """What the Chinese Colab button opens executes: nbval on zh/chapters/01_cat_mlp.ipynb."""
    import subprocess
    import sys

    nb = i18n.NOTEBOOKS / "chapters" / "01_cat_mlp.ipynb"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT), str(nb)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
