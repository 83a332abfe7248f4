"""Every chapter and lab runs where Triton is not installed (every macOS machine: no wheels).

Each notebook that mentions Triton is executed in a kernel whose interpreter cannot find the
``triton`` package (a ``sitecustomize`` on PYTHONPATH hides it from the import system, so
``import triton`` raises ModuleNotFoundError and ``importlib.util.find_spec("triton")`` is
None, exactly as when it is not installed).  It must run to the end, and a notebook whose code
uses Triton must say in one line what it skipped.
"""

import re
import tempfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]

HIDE_TRITON = '''\
"""tests/test_no_triton.py: this interpreter behaves as if the triton package were not installed."""
import importlib.machinery as _machinery

_find_spec = _machinery.PathFinder.find_spec.__func__


def _without_triton(cls, name, path=None, target=None):
    if name == "triton" or name.startswith("triton."):
        return None
    return _find_spec(cls, name, path, target)


_machinery.PathFinder.find_spec = classmethod(_without_triton)
'''

# A line that says what was skipped: "... skipped ..." / "skipping ..." naming Triton.
SKIP_LINE = re.compile(r"^(?=.*\bskip(?:ped|ping|s)?\b)(?=.*triton).*$", re.I | re.M)


def _mentions_triton(path: Path) -> bool:
    return "triton" in path.read_text().lower()


def _code_uses_triton(nb) -> bool:
    return any(c.cell_type == "code" and "triton" in c.source.lower() for c in nb.cells)


NOTEBOOKS = sorted(
    p for d in ("chapters", "labs", "labs/source") for p in (ROOT / d).glob("*.ipynb") if _mentions_triton(p)
)


def _stream_text(nb) -> str:
    return "".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    )


def test_the_triton_notebooks_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in NOTEBOOKS}
    assert {"chapters/10_flash_attention.ipynb", "labs/lab10_flash_attention.ipynb"} <= names


def test_the_blocker_hides_triton(tmp_path):
    """The sitecustomize really makes triton absent (else the notebook test proves nothing)."""
    import subprocess
    import sys

    (tmp_path / "sitecustomize.py").write_text(HIDE_TRITON)
    probe = (
        "import importlib.util\n"
        "assert importlib.util.find_spec('triton') is None\n"
        "try:\n    import triton\nexcept ModuleNotFoundError:\n    print('absent')\n"
        "import helpers.flash_triton as ft\nprint(ft.HAS_TRITON)"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["absent", "False"]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_runs_without_triton(path, monkeypatch):
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    with tempfile.TemporaryDirectory() as blocker, tempfile.TemporaryDirectory() as cwd:
        Path(blocker, "sitecustomize.py").write_text(HIDE_TRITON)
        # The kernel inherits this environment; the helpers come from the installed package.
        monkeypatch.setenv("PYTHONPATH", blocker)
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
        client = NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": cwd}})
        try:
            client.execute()
        except CellExecutionError as e:
            last = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip().splitlines()[-1]  # no ANSI colours
            pytest.fail(f"{path.relative_to(ROOT)} fails without Triton: {last}", pytrace=False)
    if _code_uses_triton(nb):
        lines = SKIP_LINE.findall(_stream_text(nb))
        assert lines, (
            f"{path.relative_to(ROOT)} ran without Triton but printed no line saying what it "
            "skipped (e.g. 'Triton is not installed: skipped the Triton kernels')"
        )
