"""The learner's install, measured: a fresh venv, `bash tools/install.sh --learner` in it, its size
besides torch, and chapter 1 executed with it (`jupyter nbconvert --execute`).

    python benchmarks/learner_install.py [--keep DIR] [--out benchmarks/results/learner_install.json]

Writes the figures (and the sha256 of requirements-learner.txt they were measured with);
tests/test_install.py checks them against the budget (1 GiB besides torch) and that the file has not
changed since.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements-learner.txt"
TORCH_DIRS = ("torch", "functorch", "torchgen")  # torch's own folders; its dependencies count


def size_mib(path: Path) -> float:
    """MiB of the files under ``path`` (links not followed)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            p = Path(dirpath) / f
            if not p.is_symlink():
                total += p.stat().st_size
    return total / 2**20


def requirements_sha() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]


def measure(venv: Path) -> dict:
    """Install into a fresh venv at ``venv``; its figures."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    t0 = time.monotonic()
    env = {**os.environ, "PYTHON": str(py)}
    subprocess.run(["bash", "tools/install.sh", "--learner"], cwd=ROOT, env=env, check=True)
    seconds = time.monotonic() - t0
    site = next((venv / "lib").glob("python3*/site-packages"))
    torch_mib = sum(size_mib(site / d) for d in TORCH_DIRS if (site / d).exists())
    torch_mib += sum(size_mib(p) for p in site.glob("torch-*.dist-info"))
    total = size_mib(venv)
    with tempfile.TemporaryDirectory() as out:
        t1 = time.monotonic()
        subprocess.run(
            [
                str(venv / "bin" / "jupyter"),
                "nbconvert",
                "--to",
                "notebook",
                "--execute",
                "chapters/01_cat_mlp.ipynb",
                "--output-dir",
                out,
                "--ExecutePreprocessor.timeout=600",
            ],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        chapter_s = time.monotonic() - t1
    return {
        "venv_mib": round(total, 1),
        "torch_mib": round(torch_mib, 1),
        "besides_torch_mib": round(total - torch_mib, 1),
        "install_seconds": round(seconds, 1),
        "chapter01_executed_seconds": round(chapter_s, 1),
        "requirements_sha256": requirements_sha(),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="make the venv here and keep it")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learner_install.json")
    a = ap.parse_args(argv)
    if a.keep:
        got = measure(a.keep)
    else:
        with tempfile.TemporaryDirectory() as d:
            got = measure(Path(d) / "venv")
    a.out.write_text(json.dumps(got, indent=2) + "\n")
    print(json.dumps(got, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
