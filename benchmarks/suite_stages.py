"""How long each stage of the test suite takes, one by one, and the whole run in parallel.

    python benchmarks/suite_stages.py [--jobs 2] [--out benchmarks/results/suite_stages.json]
    python benchmarks/suite_stages.py --page   # pages/testing.md's table, from the last tools/test.sh run

``--page`` copies the figures of the last full ``bash tools/test.sh`` run (its stage table,
``_build/test-stages.txt``) into ``pages/testing.md``, between the ``stages`` markers, saying whether it
met the suite's budget, and refuses when that run failed or was not the full run;
``tests/test_suite_stages.py`` checks what the page holds. Nothing is written for a run that failed:
a committed figure is always one of a passing run.

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


PAGE = ROOT / "pages" / "testing.md"
BEGIN, END = "<!-- stages: begin -->", "<!-- stages: end -->"
BUDGET_S = {"full": 600, "fast": 120}  # quiet, 2 cores (issue 31): the full run and the fast tier


def parse_run(text: str) -> dict:
    """What a tools/test.sh stage table says: {stage: (tests, seconds)}, the totals, the run's line."""
    rows, run = {}, {}
    for line in text.splitlines():
        m = re.match(r"^(.+?)\s+(\d+) tests\s+([\d.]+) s(?:$| of test time, (\d+) s wall)", line)
        if m and m.group(1).strip() == "all stages":
            run.update(tests=int(m.group(2)), test_time=float(m.group(3)), wall=int(m.group(4)))
        elif m:
            rows[m.group(1).strip()] = (int(m.group(2)), float(m.group(3)))
        m = re.match(r"^\[test\] (?:(?P<tier>\w+) run, )?install (\d+) s, tests (\d+) s .* exit (\d+)$", line)
        if m:
            run.update(tier=m.group("tier") or "full", tests_s=int(m.group(3)), exit=int(m.group(4)))
    return {"stages": rows, **run}


def page_block(text: str) -> str:
    """The text between the stages markers of pages/testing.md."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"pages/testing.md has no {BEGIN} … {END} block")
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def write_page(stages_file: Path, page: Path = PAGE) -> str | None:
    """Put the last run's stage table into the page; the reason not to, if any."""
    if not stages_file.exists():
        return f"no {stages_file}: run `bash tools/test.sh` first"
    text = stages_file.read_text(encoding="utf-8")
    run = parse_run(text)
    if run.get("exit") != 0 or run.get("tier") != "full":
        return f"the last run was not a passing full run ({run.get('tier')}, exit {run.get('exit')})"
    if list(run["stages"]) != list(STAGE_NAMES) or "wall" not in run:
        return f"the last run's table has the stages {list(run['stages'])}, not {STAGE_NAMES}"
    table = [ln for ln in text.splitlines() if not ln.startswith(("figures:", "  ["))]
    when = time.strftime("%Y-%m-%d")
    cpu = _cpu()
    block = (
        "\n```text\n" + "\n".join(ln for ln in table if ln.strip()) + "\n```\n\n"
        f"(`bash tools/test.sh` on {cpu}, {os.cpu_count()} cores, {when}; written by "
        "`python benchmarks/suite_stages.py --page` from that run.) "
        + (
            f"**Within the budget**: {run['tests_s']} s of at most {BUDGET_S['full']} s.\n"
            if run["tests_s"] <= BUDGET_S["full"]
            else f"**Over the budget**: {run['tests_s']} s, the budget is {BUDGET_S['full']} s.\n"
        )
    )
    old = page.read_text(encoding="utf-8")
    page.write_text(old.replace(BEGIN + page_block(old) + END, BEGIN + block + END), encoding="utf-8")
    return None


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "suite_stages.json")
    ap.add_argument(
        "--page", action="store_true", help="write the last tools/test.sh run's table into pages/testing.md"
    )
    ap.add_argument("--stages-file", type=Path, default=ROOT / "_build" / "test-stages.txt")
    args = ap.parse_args()
    if args.page:
        why = write_page(args.stages_file)
        print(why or f"wrote the stage table of {args.stages_file} into {PAGE.relative_to(ROOT)}")
        return 1 if why else 0
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
    failed = [
        n for n, r in [*stages.items(), ("fast", result["fast"]), ("full", result["full"])] if r["exit"]
    ]
    if failed:  # a committed figure is one of a passing run
        print(f"not written: {', '.join(failed)} failed", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
