"""tools/web/glossary_links.py: a Markdown link to a glossary entry is a glossary reference."""

import subprocess
import sys
from pathlib import Path

import pytest

WEB = Path(__file__).resolve().parents[1] / "tools" / "web"


def _build(tmp_path: Path, text: str) -> subprocess.CompletedProcess:
    (tmp_path / "pages").mkdir()
    (tmp_path / "chapters").mkdir()
    (tmp_path / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(WEB)!r})\nextensions = ['myst_parser', 'glossary_links']\n"
    )
    (tmp_path / "index.md").write_text("# Home\n\n```{toctree}\npages/glossary\nchapters/c1\n```\n")
    (tmp_path / "pages" / "glossary.md").write_text(
        "# Glossary\n\n```{glossary}\nchain rule\n  The derivative of a composition.\n```\n"
    )
    (tmp_path / "chapters" / "c1.md").write_text(f"# Chapter\n\n{text}\n")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-q",
            "-W",
            "-n",
            "-b",
            "html",
            str(tmp_path),
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
    )


@pytest.mark.slow
def test_a_markdown_link_to_a_glossary_entry_is_a_term_reference(tmp_path):
    p = _build(tmp_path, "The [chain rule](../pages/glossary.md#term-chain-rule) applied.")
    assert p.returncode == 0, p.stderr
    html = (tmp_path / "out" / "chapters" / "c1.html").read_text()
    assert 'href="../pages/glossary.html#term-chain-rule"><span class="xref std std-term">chain rule' in html


@pytest.mark.slow
def test_a_link_to_an_entry_the_glossary_lacks_fails_the_build(tmp_path):
    p = _build(tmp_path, "The [chain rle](../pages/glossary.md#term-chain-rle) applied.")
    assert (
        p.returncode != 0
        and "a glossary link to 'term-chain-rle': the glossary has no such entry" in p.stderr
    )
