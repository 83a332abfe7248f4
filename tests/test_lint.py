"""ruff (configured in pyproject.toml [tool.ruff]) passes: lint and format.

Over the package, the tests, the tools, the benchmarks and the notebooks' text sources
(chapters/src/, labs/source/src/).  Fix with ``ruff check --fix PATH`` and ``ruff format PATH``;
after formatting a text source, carry it into its notebook with
``jupytext --sync --from py:percent chapters/src/NN_name.py`` (outputs kept) and check nbval.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbtool  # tools/ is on sys.path (tests/conftest.py)
import pytest

ROOT = Path(__file__).resolve().parents[1]
TEXT_DIRS = [f"{d}/{nbtool.TEXT_DIR}" for d in nbtool.PAIRED_DIRS]
PATHS = ["helpers", "tests", "tools", "benchmarks", "labs/source/contracts", *TEXT_DIRS]


def _ruff_argv() -> list[str]:
    try:
        import ruff  # noqa: F401  (the wheel ships the binary; `python -m ruff` runs it)
    except ImportError:
        exe = shutil.which("ruff")
        if exe is None:
            pytest.fail("ruff is not installed: pip install -r requirements.txt", pytrace=False)
        return [exe]
    return [sys.executable, "-m", "ruff"]


def _ruff(*args: str) -> subprocess.CompletedProcess:
    # no .ruff_cache in the clone: a test run writes nothing there (tests/test_grader.py checks the tree)
    env = dict(os.environ, RUFF_NO_CACHE="true")
    return subprocess.run([*_ruff_argv(), *args], cwd=ROOT, capture_output=True, text=True, env=env)


def test_ruff_is_the_pinned_version():
    """Another ruff version formats differently: use the one requirements.txt pins."""
    pin = re.search(r"^ruff==(\S+)", (ROOT / "requirements.txt").read_text(), re.M)
    assert pin, "requirements.txt pins no ruff version"
    version = _ruff("--version").stdout.split()[-1]
    assert version == pin.group(1), f"ruff {version} installed, requirements.txt pins {pin.group(1)}"


def test_ruff_sees_every_text_source():
    """pyproject's exclusions (labs/source's notebooks) must not hide the lab sources' texts."""
    shown = {Path(line).resolve() for line in _ruff("check", "--show-files", *PATHS).stdout.split()}
    texts = {nbtool.text_of(p).resolve() for p in nbtool.paired_notebooks() if nbtool.text_of(p).exists()}
    assert texts, "no text sources found"
    missed = sorted(str(t.relative_to(ROOT)) for t in texts - shown)
    assert not missed, f"ruff does not check: {missed}"


def test_ruff_check():
    run = _ruff("check", "--output-format", "concise", *PATHS)
    if run.returncode != 0:
        pytest.fail(
            f"ruff check (fix: ruff check --fix <path>, or by hand):\n{run.stdout}{run.stderr}", pytrace=False
        )


def test_ruff_format():
    run = _ruff("format", "--check", "--output-format", "concise", *PATHS)
    if run.returncode != 0:
        pytest.fail(
            f"ruff format --check (fix: ruff format <path>):\n{run.stdout}{run.stderr}", pytrace=False
        )
