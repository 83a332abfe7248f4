"""Gradescope: a lab's autograder zip, and the run_autograder inside it.

    python tools/labs.py gradescope LAB [--out autograder.zip] [--timeout S] [--skip-question ex6]
                                        [--visibility after_due_date]

The zip holds ``setup.sh`` (Gradescope runs it once, as root, when it builds the image: Python, the
CPU build of torch, the course's pinned packages, bubblewrap), ``run_autograder`` (run once per
submission, as root) and ``course/``: the grader (``tools/``), the ``helpers`` package, the lab
sources and the lab's contract (on the grader's side only: no student process sees them), the
student notebooks and the chapters (what ``grade`` reads to tell a solution line from public code).

``run_autograder`` runs ``python course/tools/grader/gradescope.py run``: the submission in
``$AUTOGRADER_ROOT/submission`` (default /autograder) is graded by ``tools/labs.py``'s ``grade_one``
in a ``grading_run``, as ``grade`` grades a student, in bubblewrap where it works and otherwise in
the fallback without namespaces (``tools/grader/sandbox.py``); nowhere else. ``results/results.json``
gets one test per exercise (the student's feedback line and the notes on it; ``--visibility``, by
default after the due date), the notes on the notebook as the top-level output, and one hidden test
for the instructor (status, review, flags, which sandbox). A submission that cannot be graded, or a
machine where no sandbox holds, still gets a results.json that says so in one line, with score 0.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
import labs  # noqa: E402  (tools/: run_autograder puts it on PYTHONPATH, as the tests' pythonpath does)

COURSE = "course"  # where the zip holds the course, under /autograder/source
CONFIG = "gradescope.json"
# Gradescope's visibility values (gradescope-autograders.readthedocs.io, "Autograder Specifications")
VISIBILITY = ("hidden", "after_due_date", "after_published", "visible")
# what grading imports besides torch, pinned as requirements.txt pins them (the helpers' own are unpinned there)
PACKAGES = (
    "numpy",
    "matplotlib",
    "ipywidgets",
    "einops",
    "tqdm",
    "nbformat",
    "ipykernel",
    "hypothesis",
    "pyyaml",
)
FORCE = "BACKPROP_SANDBOX"  # "user": the fallback even where bubblewrap works (how the fallback is tested)
NOT_GRADED = ("timeout", "crashed", "corrupt", "wrong-lab", "not-a-notebook")
INSTRUCTOR_TEST = "Instructor only: status, review, flags, sandbox"
TIME = (2020, 1, 1, 0, 0, 0)  # every zip entry's date: the same sources make the same zip


def torch_pin() -> tuple[str, str]:
    """(torch version, index URL) as tools/install.sh installs them."""
    text = (labs.ROOT / "tools" / "install.sh").read_text()
    version = re.search(r"TORCH_VERSION=\$\{TORCH_VERSION:-([^}]+)\}", text).group(1)
    index = re.search(r"TORCH_INDEX_URL=\$\{TORCH_INDEX_URL:-([^}]+)\}", text).group(1)
    return version, index


def requirements() -> str:
    """The zip's requirements.txt: the lines of requirements.txt naming PACKAGES, as pinned there."""
    lines = []
    for line in (labs.ROOT / "requirements.txt").read_text().splitlines():
        name = re.split(r"[=<>;\[ ]", line.strip(), maxsplit=1)[0].lower()
        if name in PACKAGES:
            lines.append(line.strip())
    missing = set(PACKAGES) - {re.split(r"[=<>;\[ ]", x, maxsplit=1)[0].lower() for x in lines}
    if missing:
        raise SystemExit(f"requirements.txt names no {', '.join(sorted(missing))}")
    return (
        "# what the autograder installs besides torch (pins from the course's requirements.txt)\n"
        + "\n".join(lines)
        + "\n"
    )


def setup_sh() -> str:
    """Gradescope's setup.sh: run once, as root, when the image is built."""
    version, index = torch_pin()
    return f"""#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# bubblewrap: the sandbox; util-linux: prlimit and setpriv (the limits, and the fallback's user)
apt-get install -y -q --no-install-recommends python3 python3-venv python3-pip bubblewrap util-linux
python3 -m venv /autograder/venv
/autograder/venv/bin/pip install -q --index-url {index} "torch=={version}"
/autograder/venv/bin/pip install -q -r /autograder/source/requirements.txt
/autograder/venv/bin/pip install -q --no-deps -e /autograder/source/{COURSE}
# the grader's folders readable by the sandbox's user; the lab sources and contracts root's alone
chmod 755 /autograder /autograder/source /autograder/source/{COURSE}
chmod -R go-rwx /autograder/source/{COURSE}/labs/source
/autograder/venv/bin/python -c "import torch, IPython, helpers; print('[setup] torch', torch.__version__, 'helpers', helpers.__file__)"
"""


RUN_AUTOGRADER = f"""#!/usr/bin/env bash
# Gradescope runs this once per submission, as root; it writes $AUTOGRADER_ROOT/results/results.json.
ROOT="${{AUTOGRADER_ROOT:-/autograder}}"
PYTHONPATH="$ROOT/source/{COURSE}/tools" exec "$ROOT/venv/bin/python" \\
  "$ROOT/source/{COURSE}/tools/grader/gradescope.py" run --root "$ROOT"
"""


def course_files(lab: str) -> list[Path]:
    """What the autograder needs of the course, relative to its root."""
    root = labs.ROOT
    out = [Path("pyproject.toml"), Path("README.md"), Path("tools/labs.py"), Path("tools/nbtool.py")]
    out += [p.relative_to(root) for p in sorted((root / "tools" / "grader").glob("*.py"))]
    out += [
        p.relative_to(root)
        for p in sorted((root / "helpers").rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    ]
    out += [p.relative_to(root) for p in sorted(labs.LABS.glob("lab*.ipynb"))]
    out += [p.relative_to(root) for p in sorted(labs.SOURCES.glob("lab*.ipynb"))]
    out += [labs.GIVEN_HISTORY.relative_to(root), Path("labs/source/contracts/contract.py")]
    out += [labs.contract_path(lab).relative_to(root)]
    out += [p.relative_to(root) for p in sorted((root / "chapters").glob("*.ipynb"))]
    return out


def build(
    lab: str,
    out: Path | None = None,
    timeout: float | None = None,
    skip=(),
    visibility: str = "after_due_date",
) -> Path:
    """Write the lab's autograder zip (default: beside its default gradebook, outside the repository)."""
    if visibility not in VISIBILITY:
        raise SystemExit(f"--visibility: expected one of {', '.join(VISIBILITY)}, got {visibility!r}")
    if timeout is not None and not 1 <= timeout <= labs.DEFAULT_TIMEOUT:
        raise SystemExit(f"--timeout: expected seconds from 1 to {labs.DEFAULT_TIMEOUT}, got {timeout:g}")
    labs.graded_questions(lab, skip)  # an unknown question is a one-line error here, not on Gradescope
    out = Path(out) if out else labs.default_out(lab).with_name("gradescope_autograder.zip")
    out.parent.mkdir(parents=True, exist_ok=True)
    labs._ensure_ignored(out)  # it holds the solutions: never committed by accident
    config = {"lab": lab, "timeout": timeout, "skip": list(skip), "visibility": visibility}

    def put(z: zipfile.ZipFile, name: str, data: bytes, mode: int = 0o644) -> None:
        info = zipfile.ZipInfo(name, TIME)
        info.external_attr = (0o100000 | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, data)

    tmp = out.with_name(out.name + ".part")
    tmp.touch(mode=0o600)  # the solutions: readable by the instructor alone, wherever it is written
    os.chmod(tmp, 0o600)
    with zipfile.ZipFile(tmp, "w") as z:
        put(z, "setup.sh", setup_sh().encode(), 0o755)
        put(z, "run_autograder", RUN_AUTOGRADER.encode(), 0o755)
        put(z, "requirements.txt", requirements().encode())
        put(z, CONFIG, (json.dumps(config, indent=1) + "\n").encode())
        for rel in course_files(lab):
            put(z, f"{COURSE}/{rel.as_posix()}", (labs.ROOT / rel).read_bytes())
    os.replace(tmp, out)
    return out


# ------------------------------------------------------------------ inside Gradescope


def sandbox_mode() -> tuple[str | None, str]:
    """("bwrap" | "user" | None, one line on why): bubblewrap where it works, else the fallback, else none."""
    forced = os.environ.get(FORCE, "")
    if forced not in ("", "user"):
        raise SystemExit(f"{FORCE}: expected 'user' or nothing, got {forced!r}")
    bwrap = "forced by " + FORCE + "=user" if forced else labs.sandbox.missing_reason()
    if bwrap is None:
        return "bwrap", "bubblewrap: own PID, network and mount namespaces"
    user = labs.sandbox.user_mode_reason()
    if user is None:
        return "user", (
            f"the fallback without namespaces (bubblewrap: {bwrap}): an unprivileged user of its own, "
            "network refused by a seccomp filter, the lab sources root's alone"
        )
    return None, f"no sandbox holds here: bubblewrap: {bwrap}; the fallback: {user}"


def _about(q: str, note: str) -> bool:
    """Whether a note is about exercise ``q`` (names it as a word): it goes with that exercise's test."""
    return re.search(rf"(?<![\w]){re.escape(q)}(?![\w])", note) is not None


def results(lab: str, row: dict, detail: dict, qs, skipped, sandbox_line: str, config: dict) -> dict:
    """Gradescope's results.json for one graded row: a test per exercise, the instructor's hidden test."""
    parts = labs.feedback_parts(lab, row, detail, qs, skipped)
    visibility = config.get("visibility") or "after_due_date"
    notes = parts["notes"]
    tests = []
    for number, (q, pts) in enumerate(qs, 1):
        score = 0.0 if row[q] == labs.PENDING else float(row[q])
        own = [n for n in notes if _about(q, n)]
        tests.append(
            {
                "name": q,
                "number": str(number),
                "score": score,
                "max_score": float(pts),
                "status": "passed" if score >= pts else "failed",
                "output": "\n".join([parts["questions"][q].strip(), *own]),
                "visibility": visibility,
            }
        )
    general = [n for n in notes if not any(_about(q, n) for q, _ in qs)]
    if row["status"] in NOT_GRADED:  # one line: what happened, and why
        output = f"{row['status']}: {labs.STATUS_HELP[row['status']]}" + (
            f" ({'; '.join(notes)})" if notes else ""
        )
    else:
        later = {
            "after_due_date": "after the due date",
            "after_published": "once grades are published",
            "hidden": "never (your instructor shares them)",
            "visible": "now",
        }[visibility]
        # Before then, no score and no status: "review" (or a lower total) shown at once would tell a
        # student which of their constructs the allow-list holds, submission after submission.
        head = parts["head"] if visibility == "visible" else parts["head"][:1]
        shows = (
            "Per exercise, how many hidden tests pass shows"
            if visibility == "visible"
            else "Your score, and per exercise how many hidden tests pass, show"
        )
        output = "\n".join(
            head
            + [f"{shows} {later}."]
            + [ln.strip() for ln in parts["skipped"]]
            + (["", "Notes:"] + [f"  {n}" for n in general] if general else [])
            + [""]
            + labs.FEEDBACK_TAIL
        )
    instructor = "\n".join(
        [
            f"status: {row['status']}",
            # the student names the file: one line, control characters shown, never a forged "review:" line
            f"graded file: {ascii(row['graded_file']) if row['graded_file'] else '-'}",
            f"review: {row['review'] or 'none'}",
            f"flags: {row['flags'] or 'none'}",
            f"sandbox: {sandbox_line}",
        ]
    )
    tests.append(
        {
            "name": INSTRUCTOR_TEST,
            "score": 0.0,
            "max_score": 0.0,
            "output": instructor,
            "visibility": "hidden",
        }
    )
    return {
        "score": float(row["total"]),
        "output": output,
        "visibility": "visible",
        "stdout_visibility": "hidden",  # the run's stdout has the instructor's lines
        "tests": tests,
        "extra_data": {"lab": lab, "status": row["status"]},
    }


def not_graded(line: str, lab: str | None = None) -> dict:
    """results.json for a submission nobody graded (no sandbox, a broken grader): one line, score 0."""
    return {
        "score": 0.0,
        "output": line,
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": [],
        "extra_data": {"lab": lab, "status": "not graded"},
    }


def grade_here(root: Path, config: dict) -> dict:
    """Grade the submission under ``root`` as ``grade`` grades a student; its results.json."""
    lab = config["lab"]
    skip = list(config.get("skip") or [])
    qs = labs.graded_questions(lab, skip)
    skipped = [q for q, _ in labs.questions(lab) if q in skip]
    mode, line = sandbox_mode()
    print(f"[gradescope] {lab}: sandbox: {line}", flush=True)
    if mode is None:
        return not_graded(f"Not graded: the autograder refuses to run your notebook here ({line}).", lab)
    if mode == "user":  # no mount namespace hides them: root's alone (the probe checks it did)
        os.chmod(labs.SOURCES, 0o700)
    sub = labs.collect.one_student(root / "submission", "submission")
    where = ((root / "submission", "<submission>"), (root, "<autograder>"))
    nb, bad = labs.read_submission(sub.path)
    if bad or labs.identify(nb, lab)[0] == "wrong-lab":  # nothing of it runs: no sandbox to set up
        row, detail = labs.grade_one(None, lab, sub, qs, 0, skip, False, labs.all_secrets(), where)
        line, timeout = f"{line} (not started: nothing to run)", 0
    else:
        try:
            with labs.grading_run(lab, qs, config.get("timeout"), skip, False, mode) as (run, timeout):
                row, detail = labs.grade_one(
                    run, lab, sub, qs, timeout, skip, False, labs.all_secrets(), where
                )
        except SystemExit as e:  # the grader's refusal: nobody is graded
            return not_graded(f"Not graded: {str(e).removeprefix('refusing to grade: ')}.", lab)
    if mode == "user":  # before results.json: nothing this submission left stays for the next one
        labs.sandbox.remove_leftovers(labs.sandbox.sandbox_uids())
    _, flagged = labs.similarity_flags(lab, [(row, detail)])
    row["flags"] = "; ".join(filter(None, [row["flags"], *flagged.get(row["submission"], [])]))
    out = results(lab, row, detail, qs, skipped, f"{line}; time limit {timeout:.0f} s", config)
    print(labs.feedback_text(lab, row, detail, qs, skipped), flush=True)
    print(out["tests"][-1]["output"], flush=True)
    return out


def run(root: Path) -> dict:
    """run_autograder: grade ``root``/submission, write ``root``/results/results.json (always); its content."""
    t0 = time.monotonic()
    res = root / "results"
    res.mkdir(parents=True, exist_ok=True)
    os.chmod(res, 0o700)  # no submission reads or plants anything here
    lab = None
    try:
        config = json.loads((root / "source" / CONFIG).read_text())
        lab = config["lab"]
        out = grade_here(root, config)
    except BaseException as e:  # noqa: BLE001 - whatever broke, the student gets a result that says so
        traceback.print_exc()
        out = not_graded(
            f"Not graded: the autograder failed ({type(e).__name__}); your instructor can see why in its output.",
            lab,
        )
    out["execution_time"] = round(time.monotonic() - t0)
    tmp = res / ".results.json.part"
    tmp.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, res / "results.json")
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "run" and argv[1] == "--root":
        out = run(Path(argv[2]))
        print(
            f"[gradescope] score {out['score']:g}: {out['output'].splitlines()[0] if out['output'] else ''}"
        )
        return 0
    print("usage: gradescope.py run --root AUTOGRADER_ROOT (run_autograder's command)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
