"""The README's commands are what CI runs (tools/readme_commands.py, .ci/run), and the book build
reads only the book's own sources wherever the README's virtual environment sits (tools/web/book_sources.py)."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
import book_sources  # noqa: E402
import readme_commands  # noqa: E402

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_has_exactly_the_book_and_the_test_command():
    assert readme_commands.commands(README) == ["bash tools/book.sh", "bash tools/test.sh"]


def test_ci_runs_the_readmes_commands_in_its_venv_inside_the_clone():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "tools/readme_commands.py --venv" in ci and "< <(python3 tools/readme_commands.py)" in ci
    assert readme_commands.venv_command(README) == "python3 -m venv .venv && . .venv/bin/activate"
    assert "bash tools/test.sh" not in ci.replace("# ", "")  # no command of its own beside the README's


def test_a_readme_without_the_block_is_a_one_line_error():
    with pytest.raises(ValueError, match="no ```bash block"):
        readme_commands.commands("## The two commands\n\nnothing here\n")


def test_the_book_excludes_a_venv_and_build_folders_inside_the_clone(tmp_path):
    for rel in (
        ".venv/lib/python3.11/site-packages/pkg/README.md",
        "venv/lib/site-packages/x.md",
        "build/html/index.md",
        "chapters/01_x.ipynb",
        "chapters/.ipynb_checkpoints/01_x-checkpoint.ipynb",
        "intro.md",
        "notes.md",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    patterns = book_sources.outside_the_book(tmp_path, ["intro", "chapters/01_x"])
    from sphinx.util.matching import Matcher

    excluded = Matcher(patterns)
    for rel in (".venv", "venv", "build", "notes.md", "chapters/.ipynb_checkpoints"):
        assert excluded(rel), rel
    for rel in ("intro.md", "chapters", "chapters/01_x.ipynb"):
        assert not excluded(rel), rel
