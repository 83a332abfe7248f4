"""Shared fixtures and the markers that skip a test where its machine lacks something.

Markers (declared in pyproject.toml), each skipped with a one-line reason when what it needs
is missing, so a test file never re-implements the check:

* ``gpu``: a CUDA GPU (``torch.cuda.is_available()``);
* ``browser``: Chromium (``CHROMIUM``, default /usr/bin/chromium) and Playwright;
* ``sandbox``: the grader's sandbox (bubblewrap that can make namespaces, setpriv, prlimit:
  ``tools/grader/sandbox.py``'s ``missing_reason``);
* ``triton``: the ``triton`` package (importable: a wheel exists for this platform).

``slow`` is informational (deselect with ``-m "not slow"``).

Stages (``STAGES`` below) group every test by what it checks; ``tools/test.sh`` prints the
time of each at the end of a run.  ``--fast`` keeps the fast tier (unit tests, lint, text
sources, lab-format checks: no notebook execution, no sandboxed grading, no browser);
``--stage NAME`` keeps one stage (``benchmarks/suite_stages.py`` times them one by one).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


# ------------------------------------------------------------------ what this machine lacks
# Each returns None when the requirement is met, else the reason to skip (one line).
# Cached and computed only when a test with the marker is collected (torch is slow to import).


@functools.lru_cache(maxsize=None)
def missing_gpu() -> str | None:
    import torch

    return None if torch.cuda.is_available() else "needs a CUDA GPU (torch.cuda.is_available() is False)"


@functools.lru_cache(maxsize=None)
def missing_browser() -> str | None:
    if not Path(CHROMIUM).exists():
        return (
            f"needs Chromium: none at {CHROMIUM} "
            "(apt-get install chromium, or set CHROMIUM=/path/to/chromium)"
        )
    if importlib.util.find_spec("playwright") is None:
        return "needs Playwright (pip install playwright)"
    return None


@functools.lru_cache(maxsize=None)
def missing_sandbox() -> str | None:
    import sandbox

    reason = sandbox.missing_reason()
    return None if reason is None else f"needs the grader's sandbox: {reason}"


@functools.lru_cache(maxsize=None)
def missing_triton() -> str | None:
    return None if importlib.util.find_spec("triton") is not None else "needs Triton (pip install triton)"


MISSING = {
    "gpu": missing_gpu,
    "browser": missing_browser,
    "sandbox": missing_sandbox,
    "triton": missing_triton,
}


# ------------------------------------------------------------------ stages and tiers
# (name, test files or notebook folders it holds); a test belongs to the first stage that names
# its file, and the rest are unit tests. Order: the order of the summary table.
STAGES = (
    ("unit tests", ()),
    ("lint", ("tests/test_lint.py",)),
    ("text sources", ("tests/test_sources.py",)),
    (
        "lab format",
        (
            "tests/test_labs.py",
            "tests/test_notebooks.py",
            "tests/test_notebook_columns.py",
            "tests/test_layering.py",
        ),
    ),
    ("Chinese edition", ("tests/test_i18n.py",)),
    ("notebooks: chapters (nbval)", ("chapters/",)),
    ("notebooks: labs (nbval)", ("labs/",)),
    ("no-Triton run", ("tests/test_no_triton.py",)),
    ("mistake catalogs", ("tests/test_mutants.py",)),
    ("grading in the sandbox", ()),  # every test marked sandbox
    ("site and browser", ("tests/test_site.py",)),
)
STAGE_NAMES = [name for name, _ in STAGES]
FAST_STAGES = {"unit tests", "lint", "text sources", "lab format", "Chinese edition"}
# markers whose tests never belong to the fast tier, whatever their stage
NOT_FAST = ("slow", "browser", "sandbox", "gpu")
# started first under xdist, so that the longest stages do not run alone at the end
FIRST = ("tests/test_grader.py", "tests/test_site.py", "tests/test_mutants.py", "tests/test_no_triton.py")


def stage_of(nodeid: str, sandboxed: bool = False) -> str:
    """The stage a test belongs to, from its node id ('tests/test_lint.py::test_ruff_check')."""
    if sandboxed:
        return "grading in the sandbox"
    path = nodeid.split("::")[0]
    for name, prefixes in STAGES:
        if any(path == p or (p.endswith("/") and path.startswith(p)) for p in prefixes):
            return name
    return "unit tests"


def pytest_addoption(parser):
    group = parser.getgroup("backprop-by-hand")
    group.addoption(
        "--fast",
        action="store_true",
        help="the fast tier: unit tests, lint, text sources, lab-format checks (no notebooks, sandbox or browser)",
    )
    group.addoption("--stage", choices=STAGE_NAMES, default=None, help="run only this stage's tests")


def _keep(config, item) -> bool:
    stage = stage_of(item.nodeid, item.get_closest_marker("sandbox") is not None)
    if config.getoption("--stage") and stage != config.getoption("--stage"):
        return False
    if config.getoption("--fast"):
        return stage in FAST_STAGES and not any(item.get_closest_marker(m) for m in NOT_FAST)
    return True


def pytest_collection_modifyitems(config, items):
    if config.getoption("--fast") or config.getoption("--stage"):
        kept = [i for i in items if _keep(config, i)]
        dropped = [i for i in items if not _keep(config, i)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    # the longest files first (a stable sort keeps each file's own order)
    items.sort(key=lambda i: next((k for k, f in enumerate(FIRST) if i.nodeid.startswith(f)), len(FIRST)))
    for item in items:
        for name, missing in MISSING.items():
            if item.get_closest_marker(name) is not None and (reason := missing()):
                item.add_marker(pytest.mark.skip(reason=f"{name}: {reason}"))


# ------------------------------------------------------------------ time per stage, clean tree
# Reports reach the controlling process under xdist too, so the sums cover every worker.
_TIMES: dict[str, list[float]] = {}
_START = {"wall": time.monotonic(), "tree": None}


def _tracked_changes() -> str | None:
    """`git status` of the tracked files (None outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _tracked_state() -> dict | None:
    """Each changed tracked file with the hash of its content: what a test run must leave as it was."""
    status = _tracked_changes()
    if status is None:
        return None
    import hashlib

    state = {}
    for line in status.splitlines():
        path = ROOT / line[3:].split(" -> ")[-1]
        state[line[3:]] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else line[:2]
    return state


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_sessionstart(session):
    if not _is_worker(session.config):
        _START["wall"] = time.monotonic()
        _START["tree"] = _tracked_state()
        FIGURES_FILE.unlink(missing_ok=True)


# Figures a test measures and the run should show (the catalogs' if-and-only-if counts, case classes
# per exercise): pytest-xdist hides a worker's prints, so each goes to a file that the controller
# prints after pytest's summary.
FIGURES_FILE = Path(os.environ.get("BBH_FIGURES_FILE", ROOT / "_build" / "test-figures.txt"))


@pytest.fixture
def figure():
    """figure("…"): one line for the run's "figures" section (printed last, whatever the worker)."""

    def put(line: str) -> None:
        FIGURES_FILE.parent.mkdir(parents=True, exist_ok=True)
        with FIGURES_FILE.open(
            "a", encoding="utf-8"
        ) as f:  # one short append per line: workers do not interleave
            f.write(line.replace("\n", " ") + "\n")

    return put


def pytest_runtest_logreport(report):
    entry = _TIMES.setdefault(stage_of(report.nodeid, "sandbox" in report.keywords), [0, 0.0])
    entry[1] += report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        entry[0] += 1


def pytest_sessionfinish(session, exitstatus):
    if _is_worker(session.config) or _START["tree"] is None:
        return
    after = _tracked_state()
    changed = sorted(
        k for k in set(after or {}) | set(_START["tree"]) if (after or {}).get(k) != _START["tree"].get(k)
    )
    session.config._bbh_changed = changed
    if changed and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def stage_table() -> list[str]:
    """The time-per-stage lines: each stage's tests and summed seconds, then the total and the wall time."""
    width = max(len(n) for n in STAGE_NAMES)
    lines = [
        f"{name:<{width}}  {_TIMES[name][0]:5d} tests  {_TIMES[name][1]:7.1f} s"
        for name in STAGE_NAMES
        if name in _TIMES
    ]
    total = sum(s for _, s in _TIMES.values())
    wall = time.monotonic() - _START["wall"]
    count = sum(n for n, _ in _TIMES.values())
    return lines + [
        f"{'all stages':<{width}}  {count:5d} tests  {total:7.1f} s of test time, {wall:.0f} s wall"
    ]


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The time per stage, and the tracked files a run changed. With BBH_STAGES_FILE set (tools/test.sh
    sets it), the table goes to that file instead, which test.sh prints last, after pytest's summary."""
    if _is_worker(config) or not _TIMES:
        return
    tr = terminalreporter
    changed = getattr(config, "_bbh_changed", [])
    figures = sorted(FIGURES_FILE.read_text(encoding="utf-8").splitlines()) if FIGURES_FILE.exists() else []
    lines = (["figures:", *[f"  {f}" for f in figures], ""] if figures else []) + stage_table()
    if changed:
        lines.append(
            f"FAILED: the run changed {len(changed)} tracked file(s): {', '.join(changed[:10])} "
            "(a test must write only to a temporary or build folder)"
        )
    out = os.environ.get("BBH_STAGES_FILE")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
        return
    tr.section("time per stage")
    for line in lines:
        tr.write_line(line, red=line.startswith("FAILED"))


# ------------------------------------------------------------------ shared fixtures


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository's root folder."""
    return ROOT


@pytest.fixture
def close_figures():
    """Close every matplotlib figure a test opened (plots and widgets tests)."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def _layernorm_backward_without_mean_path(x, mu, rstd, weight, grad_y, needs=(True, True, True)):
    """The classic slip: forget that μ depends on x, i.e. drop the −mean(g) term of grad_x."""
    x_hat = (x - mu) * rstd
    g = grad_y * weight
    grad_x = rstd * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
    D = x.shape[-1]
    return grad_x, (grad_y * x_hat).reshape(-1, D).sum(0), grad_y.reshape(-1, D).sum(0)


@pytest.fixture
def broken_layernorm_backward():
    """A LayerNorm backward with the signature of ``helpers.functions.layernorm_backward`` and
    no mean path: monkeypatch it in, and a test of the real one must fail."""
    return _layernorm_backward_without_mean_path
