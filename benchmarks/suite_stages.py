"""How long each stage of the test suite takes, one by one, and the whole run in parallel.

    python benchmarks/suite_stages.py [--jobs 2] [--out benchmarks/results/suite_stages.json]

Each stage of ``tests/conftest.py``'s ``STAGES`` runs alone (``pytest --stage NAME``, one
process, no xdist), then the fast tier (``--fast``) and the full run as ``tools/test.sh`` runs it
(``-n JOBS --dist loadscope``), all in this one run, so the ratios hold on any machine: the
full run's wall time over the sum of the stages' is what the parallel run saves. The load
average before and after is recorded (a busy machine is slower). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from conftest import STAGE_NAMES  # noqa: E402

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0"]


def timed(args: list[str]) -> dict:
    """Wall seconds and exit code of one pytest run (its last summary line kept)."""
    env = dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    t0 = time.monotonic()
    out = subprocess.run(PYTEST + args, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    counts = [
        ln for ln in out.stdout.splitlines() if re.search(r"\d+ (passed|failed|deselected|skipped)", ln)
    ]
    return {
        "seconds": round(seconds, 1),
        "exit": out.returncode,
        "summary": (counts[-1:] or [""])[0].strip("= "),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "suite_stages.json")
    args = ap.parse_args()
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores", "load_before": os.getloadavg()[0]}
    stages = {}
    for name in STAGE_NAMES:
        stages[name] = timed(["--stage", name])
        print(f"{name:<28} {stages[name]['seconds']:7.1f} s  {stages[name]['summary']}", flush=True)
    result["stages"] = stages
    result["fast"] = timed(["--fast", "-n", str(args.jobs), "--dist", "loadscope"])
    print(
        f"{'fast tier (--fast)':<28} {result['fast']['seconds']:7.1f} s  {result['fast']['summary']}",
        flush=True,
    )
    result["full"] = timed(["-n", str(args.jobs), "--dist", "loadscope"])
    print(f"{'full run':<28} {result['full']['seconds']:7.1f} s  {result['full']['summary']}", flush=True)
    serial = sum(s["seconds"] for s in stages.values())
    result["stages_one_by_one_seconds"] = round(serial, 1)
    result["full_over_stages"] = round(result["full"]["seconds"] / serial, 2)
    result["load_after"] = os.getloadavg()[0]
    print(
        f"stages one by one: {serial:.0f} s; full run on {args.jobs} workers: {result['full']['seconds']:.0f} s "
        f"({result['full_over_stages']:.2f}× of it); load average {result['load_before']:.1f} → {result['load_after']:.1f}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
