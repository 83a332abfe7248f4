"""The two installs (tools/install.sh): the contributor's (requirements.txt) and the learner's
(requirements-learner.txt, `--learner`), and the learner's size as benchmarks/learner_install.py
measured it in a fresh venv."""

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_MIB = 1024  # issue 34: a learner's venv besides torch, at most 1 GB


def _reqs(name: str) -> dict[str, str]:
    """{package: its requirement line without comments} of a requirements file."""
    out = {}
    for line in (ROOT / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out[re.split(r"[=<>;\[ ]", line, maxsplit=1)[0].lower()] = line
    return out


def test_the_learners_requirements_are_the_contributors_pins_without_the_tooling():
    learner, everything = _reqs("requirements-learner.txt"), _reqs("requirements.txt")
    assert set(learner) <= set(everything), set(learner) - set(everything)
    assert all(learner[p] == everything[p] for p in learner), {
        p: (learner[p], everything[p]) for p in learner
    }
    tooling = {"jupyter-book", "sphinx", "pytest", "nbval", "playwright", "triton", "ruff", "hypothesis"}
    assert not tooling & set(learner), tooling & set(learner)
    assert "jupyterlab" in learner  # README: `jupyter lab`


def test_the_learners_install_measured_in_a_fresh_venv_is_within_1_gb_besides_torch():
    """benchmarks/learner_install.py's record: size, and chapter 1 executed in that venv; measured with
    the requirements-learner.txt there is now (run it again after changing the file)."""
    import learner_install

    got = json.loads((ROOT / "benchmarks" / "results" / "learner_install.json").read_text())
    assert got["requirements_sha256"] == learner_install.requirements_sha(), (
        "requirements-learner.txt changed since it was measured: python benchmarks/learner_install.py"
    )
    assert got["besides_torch_mib"] <= BUDGET_MIB, got
    assert abs(got["venv_mib"] - got["torch_mib"] - got["besides_torch_mib"]) < 0.2, got
    assert got["chapter01_executed_seconds"] > 0, got


def test_install_refuses_an_unknown_option_in_one_line():
    p = subprocess.run(["bash", "tools/install.sh", "--lerner"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip() == "usage: bash tools/install.sh [--learner]", p.stderr
