"""Shared fixtures and the markers that skip a test where its machine lacks something.

Markers (declared in pyproject.toml), each skipped with a one-line reason when what it needs
is missing, so a test file never re-implements the check:

* ``gpu``: a CUDA GPU (``torch.cuda.is_available()``);
* ``browser``: Chromium (``CHROMIUM``, default /usr/bin/chromium) and Playwright;
* ``sandbox``: the grader's sandbox (bubblewrap that can make namespaces, setpriv, prlimit:
  ``tools/grader/sandbox.py``'s ``missing_reason``);
* ``triton``: the ``triton`` package (importable: a wheel exists for this platform).

``slow`` is informational (deselect with ``-m "not slow"``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tools") not in sys.path:  # nbtool, labs: tests import them by name
    sys.path.insert(0, str(ROOT / "tools"))

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
    sys.path.insert(0, str(ROOT / "tools" / "grader"))  # as tests/test_grader.py imports it
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


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name, missing in MISSING.items():
            if item.get_closest_marker(name) is not None and (reason := missing()):
                item.add_marker(pytest.mark.skip(reason=f"{name}: {reason}"))


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
