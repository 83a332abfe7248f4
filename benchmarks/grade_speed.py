"""How long `tools/labs.py grade` takes for a class: N submissions of one lab, sandboxed, --jobs J.

    python benchmarks/grade_speed.py [--lab lab01] [--n 200] [--jobs 2] [--stallers K] [--out FILE]

The class is a realistic mix made from the lab's own solutions: 60% complete, 25% with the last
exercise missing, 10% empty, 5% with a cell that raises. Everything is measured in this one run
(wall-clock seconds of the whole `grade` call, and per submission); the machine's load average
before and after is recorded, since a busy machine is slower. Not a test.

With ``--stallers K`` the class is graded twice in the same run, at the command's own time limit
(calibrated on the solutions, as `grade` without --timeout): as made, then with K more notebooks
that stall (a first cell that catches whatever stops it, so only the notebook's time limit ends
it); the result holds both times and their ratio (issue 33: at most 1.2 for 200 and 2).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the folders pyproject's pytest `pythonpath` gives the tests, whose notebook builders this reuses
for folder in ("tools", "tools/grader", "tests"):
    sys.path.insert(0, str(ROOT / folder))
from test_grader import STUBBORN_LOOP, _solutions, _submission  # noqa: E402

import labs  # noqa: E402


def make_class(lab: str, n: int, folder: Path) -> None:
    """n notebooks: 60% complete, 25% last exercise missing, 10% empty, 5% raising."""
    sol = _solutions(lab)
    kinds = [
        ("complete", 60, _submission(lab, sol)),
        ("partial", 25, _submission(lab, sol[:-1])),
        ("empty", 10, _submission(lab)),
        ("raising", 5, _submission(lab, sol, insert=[(0, "1 / 0")])),
    ]
    k = 0
    for name, share, text in kinds:
        for _ in range(round(n * share / 100)):
            (folder / f"student{k:03d}_{name}.ipynb").write_text(text)
            k += 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", default="lab01")
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "grade_speed.json")
    ap.add_argument("--stallers", type=int, default=0, help="grade again with this many stalling notebooks")
    a = ap.parse_args(argv)
    lab = labs.resolve_lab(a.lab)
    with tempfile.TemporaryDirectory(prefix="grade-speed-") as d:
        subs = Path(d) / "subs"
        subs.mkdir()
        make_class(lab, a.n, subs)
        n = len(list(subs.iterdir()))
        # the command's own limit with stallers (what they cost is that limit); else the old fixed one
        timeout = None if a.stallers else labs.DEFAULT_TIMEOUT
        load0 = os.getloadavg()
        t0 = time.monotonic()
        rows = labs.grade(lab, subs, Path(d) / "out" / "gradebook.csv", timeout=timeout, jobs=a.jobs)
        seconds = time.monotonic() - t0
        stalled = None
        if a.stallers:
            sol = _solutions(lab)
            for k in range(a.stallers):
                text = _submission(lab, sol, insert=[(0, STUBBORN_LOOP)])
                (subs / f"student{n + k:03d}_stalls.ipynb").write_text(text)
            t1 = time.monotonic()
            more = labs.grade(lab, subs, Path(d) / "out" / "stalled.csv", timeout=timeout, jobs=a.jobs)
            stalled = {
                "stallers": a.stallers,
                "seconds": round(time.monotonic() - t1, 1),
                "ratio": round((time.monotonic() - t1) / seconds, 3),
                "stallers_status": sorted(r["status"] for r in more if r["submission"].endswith("_stalls")),
            }
        load1 = os.getloadavg()
    statuses = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
    result = {
        "lab": lab,
        "submissions": n,
        "jobs": a.jobs,
        "seconds": round(seconds, 1),
        "seconds_per_submission": round(seconds / n, 2),
        "minutes_for_200": round(seconds / n * 200 / 60, 1),
        "statuses": statuses,
        "load_before": [round(x, 2) for x in load0],
        "load_after": [round(x, 2) for x in load1],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "sandboxed": True,
        **({"with_stallers": stalled} if stalled else {}),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
