"""Every code cell of every notebook fits 88 columns: the width of a code box on the site at 1280 px.

Text sources are formatted at 88 columns (``chapters/src/ruff.toml``, ``labs/source/src/ruff.toml``);
this test also catches what a formatter leaves long (comments, strings) and the student notebooks
that ``tools/labs.py release`` writes.  The browser test in ``tests/test_site.py`` checks the same
boxes as rendered.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = 88
NOTEBOOKS = sorted(
    [*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("labs/*.ipynb"), *ROOT.glob("labs/source/*.ipynb")]
)


def long_lines(path: Path, columns: int = COLUMNS) -> list[str]:
    """'cell C, line L: N columns' for each code line wider than ``columns``."""
    nb = nbformat.read(path, as_version=4)
    found = []
    for c, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for n, line in enumerate(cell.source.splitlines(), 1):
            if len(line) > columns:
                found.append(f"cell {c}, line {n}: {len(line)} columns: {line.strip()[:50]}…")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_code_cells_fit_88_columns(path):
    found = long_lines(path)
    assert not found, f"{path.relative_to(ROOT)}: {len(found)} code lines over {COLUMNS} columns:\n  " + (
        "\n  ".join(found[:10])
    )


def test_the_check_sees_a_long_line(tmp_path):
    wide = "y = " + "1 + " * 30 + "1"  # 125 columns
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1\n" + wide)])
    path = tmp_path / "wide.ipynb"
    nbformat.write(nb, path)
    (found,) = long_lines(path)
    assert found.startswith("cell 0, line 2: 125 columns: y = 1 + 1")
    assert long_lines(path, columns=125) == []
