"""The committed text sources (chapters/src/*.py, labs/source/src/*.py) match their notebooks.

A pair agrees on every cell's type, source and tags (outputs live only in the ipynb).  A
failure names the file and the command that fixes it; the tests on a copy prove the check
fails when a text and its notebook drift apart.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import jupytext
import nbformat
import nbtool  # tools/ is on sys.path (tests/conftest.py)
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAIRED = nbtool.paired_notebooks()


def test_every_chapter_and_lab_source_is_paired():
    stems = {p.stem for p in PAIRED}
    assert {p.stem for p in (ROOT / "chapters").glob("*.ipynb")} <= stems
    assert {p.stem for p in (ROOT / "labs" / "source").glob("*.ipynb")} <= stems
    assert not any(p.parent == ROOT / "labs" for p in PAIRED), "student notebooks are generated, not paired"


@pytest.mark.parametrize("nb_path", PAIRED, ids=lambda p: p.stem)
def test_text_source_matches_notebook(nb_path):
    problem = nbtool.sync_problem(nb_path)
    assert problem is None, problem


def test_no_text_source_without_a_notebook():
    orphans = [m for m in nbtool.sync_problems() if "no notebook" in m]
    assert not orphans, "\n".join(orphans)


def test_jupytext_knows_the_pairing():
    """`jupytext --sync` and Jupyter's jupytext extension pair the same files as nbtool."""
    from jupytext.config import find_jupytext_configuration_file, load_jupytext_configuration_file
    from jupytext.paired_paths import paired_paths

    for nb_path in PAIRED[:1] + PAIRED[-1:]:
        config = load_jupytext_configuration_file(find_jupytext_configuration_file(str(nb_path.parent)))
        formats = config.default_formats(str(nb_path))
        paths = [Path(p) for p, _ in paired_paths(str(nb_path), "ipynb", formats)]
        assert paths == [nb_path, nbtool.text_of(nb_path)]


def test_text_sources_are_not_collected_as_tests_or_pages():
    """pytest collects test_*.py only, and the site builds only _toc.yml's files."""
    texts = [nbtool.text_of(p) for p in PAIRED]
    assert not [t for t in texts if t.name.startswith("test_") or t.name.endswith("_test.py")]
    toc = (ROOT / "_toc.yml").read_text()
    assert f"/{nbtool.TEXT_DIR}/" not in toc
    assert "only_build_toc_files: true" in (ROOT / "_config.yml").read_text()


# ------------------------------------------------------------------ the check can fail (on a copy)


@pytest.fixture
def copy(tmp_path):
    """A paired chapter (notebook, text source, jupytext.toml) copied under tmp_path/chapters."""
    nb_path = next(p for p in PAIRED if p.parent.name == "chapters")
    dest = tmp_path / "chapters"
    (dest / nbtool.TEXT_DIR).mkdir(parents=True)
    shutil.copy(nb_path.parent / "jupytext.toml", dest)
    shutil.copy(nb_path, dest)
    nbtool.write_text(dest / nb_path.name)  # a text that matches (the repo's may be stale right now)
    return dest / nb_path.name


def _edit_text(nb_path, old, new, count=1):
    text_path = nbtool.text_of(nb_path)
    text = text_path.read_text()
    assert old in text
    text_path.write_text(text.replace(old, new, count))


def test_copy_agrees_and_sync_is_idempotent(copy, tmp_path):
    assert nbtool.sync_problems(tmp_path) == []
    assert nbtool.write_text(copy) is False  # nothing to rewrite
    text = nbtool.text_of(copy).read_text()
    assert text.startswith("# %%"), "no jupytext header: the text is only cells"
    assert '# %% tags=["remove-cell"]' in text  # the Colab setup cell keeps its tag


def test_edited_prose_fails_with_one_line_naming_file_and_fix(copy, tmp_path):
    _edit_text(copy, "# # ", "# # Edited: ")  # the title, in the text only
    problems = nbtool.sync_problems(tmp_path)
    assert len(problems) == 1 and "\n" not in problems[0]
    msg = problems[0]
    assert str(nbtool.text_of(copy)) in msg and copy.name in msg
    assert "(source)" in msg and "nbtool.py build" in msg and "nbtool.py sync" in msg


def test_edited_code_in_the_notebook_fails(copy, tmp_path):
    nb = nbformat.read(copy, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    code[-1].source += "\nx_new = 1"
    nbformat.write(nb, copy)
    (msg,) = nbtool.sync_problems(tmp_path)
    assert "(source)" in msg
    nbtool.write_text(copy)  # `sync` is the fix
    assert nbtool.sync_problems(tmp_path) == []


def test_changed_tags_and_cell_type_fail(copy, tmp_path):
    _edit_text(copy, '# %% tags=["remove-cell"]', "# %%")
    (msg,) = nbtool.sync_problems(tmp_path)
    assert "(tags)" in msg
    nbtool.write_text(copy)
    _edit_text(copy, "# %% [markdown]", "# %% [raw]")
    (msg,) = nbtool.sync_problems(tmp_path)
    assert "(cell type)" in msg


def test_added_cell_missing_text_and_orphan_text_fail(copy, tmp_path):
    text_path = nbtool.text_of(copy)
    text_path.write_text(text_path.read_text() + "\n# %%\nextra = 1\n")
    (msg,) = nbtool.sync_problems(tmp_path)
    assert "cells" in msg
    text_path.rename(text_path.with_name("99_orphan.py"))
    problems = nbtool.sync_problems(tmp_path)
    assert len(problems) == 2
    assert any("missing" in m and "nbtool.py sync" in m for m in problems)
    assert any("99_orphan.py: no notebook" in m for m in problems)


def test_sync_check_command_exits_1_and_names_the_file(copy):
    _edit_text(copy, "# # ", "# # Edited: ")
    cmd = [sys.executable, str(ROOT / "tools" / "nbtool.py"), "sync", "--check", str(copy)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode == 1
    assert nbtool.text_of(copy).name in run.stdout
    subprocess.run(cmd[:3] + [str(copy)], check=True, capture_output=True)  # sync NB: the fix
    assert subprocess.run(cmd, capture_output=True, text=True).returncode == 0


def test_build_from_a_text_executes_keeps_ids_and_rewrites_the_text(tmp_path):
    """build TEXT.py: the notebook next to src/ is executed, the setup cell added, ids kept."""
    folder = tmp_path / "chapters"
    (folder / nbtool.TEXT_DIR).mkdir(parents=True)
    shutil.copy(ROOT / "chapters" / "jupytext.toml", folder)
    text_path = folder / nbtool.TEXT_DIR / "99_tiny.py"
    text_path.write_text("# %% [markdown]\n# # Tiny\n\n# %%\nprint(6 * 7)\n")
    nbtool.build(text_path)
    nb_path = folder / "99_tiny.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    assert nb.cells[1].source.startswith(nbtool.SETUP_MARK)
    assert nb.cells[2].outputs[0]["text"] == "42\n"
    ids = [c.id for c in nb.cells]

    text_path.write_text(text_path.read_text().replace("# # Tiny", "# # Tiny, edited"))
    nbtool.build(text_path, nb_path)
    nb = nbformat.read(nb_path, as_version=4)
    assert [c.id for c in nb.cells] == ids  # jupytext carried the ids over
    assert nb.cells[0].source == "# Tiny, edited"
    assert "jupytext" not in nb.metadata
    # the text now holds the setup cell too: the pair agrees
    assert nbtool.sync_problem(nb_path) is None
    assert jupytext.read(text_path).cells[1].source.startswith(nbtool.SETUP_MARK)


# A MyST role ({term}`chain rule`) is raw text in Colab and JupyterLab, where the notebooks are read:
# chapter 1's first line read "{term}`Backpropagation <backpropagation>`". A notebook names a glossary
# term with a Markdown link (tools/web/glossary_links.py makes it a glossary reference on the site).
# The same for a directive (```{admonition} …, :::{note}): the asides are <details> blocks, which
# both Jupyter and the site render.
ROLE_IN_PROSE = re.compile(r"\{[a-z][\w:-]*\}`")
DIRECTIVE = re.compile(r"^\s*(?:`{3,}|:{3,})\{[a-z][\w:-]*\}", re.M)


# the Chinese notebooks (tools/i18n.py notebooks) too: the Chinese site's Colab button opens them
COLAB_OPENS = PAIRED + sorted((ROOT / "zh" / "chapters").glob("*.ipynb"))


@pytest.mark.parametrize(
    "nb_path", COLAB_OPENS, ids=lambda p: ("zh-" if p.parts[-3] == "zh" else "") + p.stem
)
def test_no_myst_role_or_directive_in_a_notebooks_markdown(nb_path):
    nb = nbformat.read(nb_path, as_version=4)
    raw = [
        (i, m.group(0).strip())
        for i, c in enumerate(nb.cells)
        if c.cell_type == "markdown"
        for pattern in (ROLE_IN_PROSE, DIRECTIVE)
        for m in pattern.finditer(c.source)
    ]
    assert not raw, f"{nb_path.name}: MyST syntax Colab shows raw (cell, what): {raw[:5]}"
