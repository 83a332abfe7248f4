"""The Gradescope autograder (`tools/labs.py gradescope`, tools/grader/gradescope.py), tested without Gradescope.

The lab 1 zip is unpacked into a temporary root shaped like Gradescope's /autograder (source/, the
zip's contents; submission/; results/; run_autograder; venv/, the Python setup.sh would make: here
this venv's packages, hard-linked, with the unpacked course's helpers), and run_autograder grades
honest and empty notebooks in bubblewrap, honest and hostile ones in the fallback without namespaces
(forced with BACKPROP_SANDBOX=user), each to the total `tools/labs.py grade` gives the same notebook.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[1]
import gradescope  # noqa: E402
import sandbox  # noqa: E402
from test_grader import FORGED, HOSTILE, _solutions, _submission  # noqa: E402  (the red team's notebooks)

import labs  # noqa: E402

LAB = "lab01_cat_mlp"
TIMEOUT = (
    60  # the red team's batch limit (test_grader.BATCH_TIMEOUT): the zip is built with it, grade runs with it
)

# Gradescope's results.json, from "Autograder Specifications", "Output format"
# (https://gradescope-autograders.readthedocs.io/en/latest/specs/): top-level score (required unless each
# test has one), execution_time, output, output_format, visibility, stdout_visibility, extra_data, tests,
# leaderboard; each test: score, max_score, status ("passed"/"failed"), name, name_format, number, output,
# output_format, tags, visibility, extra_data. Visibility: hidden, after_due_date, after_published, visible.
VISIBILITY = {"enum": ["hidden", "after_due_date", "after_published", "visible"]}
FORMAT = {"enum": ["text", "html", "simple_format", "md", "ansi"]}
TEST = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "score", "max_score", "output", "visibility"],
    "properties": {
        "score": {"type": "number"},
        "max_score": {"type": "number"},
        "status": {"enum": ["passed", "failed"]},
        "name": {"type": "string"},
        "name_format": FORMAT,
        "number": {"type": "string"},
        "output": {"type": "string"},
        "output_format": FORMAT,
        "tags": {"type": "array", "items": {"type": "string"}},
        "visibility": VISIBILITY,
        "extra_data": {"type": "object"},
    },
}
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["score", "output", "tests", "visibility", "stdout_visibility"],
    "properties": {
        "score": {"type": "number"},
        "execution_time": {"type": "number"},
        "output": {"type": "string"},
        "output_format": FORMAT,
        "visibility": VISIBILITY,
        "stdout_visibility": VISIBILITY,
        "extra_data": {"type": "object"},
        "tests": {"type": "array", "items": TEST},
        "leaderboard": {"type": "array"},
    },
}

# what a Gradescope-specific hostile cell reaches: the network, the lab sources, results.json; it says so
TMP_PLANT = "/tmp/bbh-gradescope-planted"  # what a fallback submission writes to the shared /tmp
LOCK_PLANT = "/run/lock/bbh-gradescope-planted"  # and to another world-writable folder (red team 6)
REACH = (
    f"open({TMP_PLANT!r}, 'w').write('hidden inputs')\n"
    f"try:\n    open({LOCK_PLANT!r}, 'w').write('hidden inputs')\nexcept OSError:\n    pass\n"
    # a System V segment anyone may read (IPC_PRIVATE, IPC_CREAT | 0666): it outlived its grading
    "import ctypes\ntry:\n    ctypes.CDLL(None).shmget(0, 4096, 0o1666)\nexcept Exception:\n    pass\n"
    "import os, socket\nfound = []\ntry:\n    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "    s.connect(('192.0.2.1', 9))\n    found.append('network')\nexcept OSError:\n    pass\n"
    "for p in ('{root}/labs/source', '{root}/labs/source/contracts/{lab}.py'):\n"
    "    if os.access(p, os.R_OK):\n        found.append('read ' + p)\n"
    "try:\n    open('{out}', 'w').write({forged!r})\n    found.append('wrote results.json')\nexcept OSError:\n    pass\n"
    "status = open('/proc/self/status').read()\n"
    "if os.getuid() == 0 or 'CapEff:\\t0000000000000000' not in status or 'NoNewPrivs:\\t1' not in status:\n"
    "    found.append('privileges')\n"
    "raise ValueError('reached: ' + (', '.join(found) or 'nothing'))"
)
TIMES: dict[str, float] = {}


def _unpack(zip_path: Path, dest: Path) -> None:
    """Unzip as Gradescope does, keeping the modes the zip records (zipfile's extractall drops them)."""
    with zipfile.ZipFile(zip_path) as z:
        for info in z.infolist():
            z.extract(info, dest)
            mode = info.external_attr >> 16 & 0o777
            if mode:
                os.chmod(dest / info.filename, mode)


def _venv(root: Path) -> None:
    """root/venv: the Python setup.sh makes (its packages pip-installed there, here hard links to this
    venv's; the course's helpers from root/source/course, as `pip install -e` would give)."""
    base = _base_python() or Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    mine = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()))
    site = root / "venv" / "lib" / ver / "site-packages"
    shutil.rmtree(site)
    if subprocess.run(["cp", "-al", str(mine), str(site)], capture_output=True).returncode:
        pytest.skip(
            "the fake /autograder's venv hard-links this venv's packages: needs them on the temp folder's filesystem"
        )
    for p in site.glob("__editable__*backprop*"):
        p.unlink()
    (site / "backprop_course.pth").write_text(str(root / "source" / gradescope.COURSE) + "\n")


def _readable_by_all(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o005 == 0o005 for p in [path, *path.parents] if p.is_dir())


def _base_python() -> Path | None:
    """A Python of this version that the fallback's user can run, as Gradescope's image has (a pyenv
    Python under /root is not one), or None."""
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    mine = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    for p in (mine, Path("/usr/bin") / ver, Path("/usr/local/bin") / ver):
        if not p.exists() or not _readable_by_all(p.resolve().parent):
            continue
        where = subprocess.run(
            [str(p), "-c", "import sys, venv; print(sys.base_prefix)"], capture_output=True, text=True
        )
        if where.returncode == 0 and _readable_by_all(Path(where.stdout.strip()) / "lib" / ver):
            return p.resolve()
    return None


@pytest.fixture(scope="module")
def zip_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("zip") / "autograder.zip"
    assert labs.main(["gradescope", LAB, "--out", str(out), "--timeout", str(TIMEOUT)]) == 0
    return out


@pytest.fixture(scope="module")
def autograder(zip_path):
    """A Gradescope-shaped /autograder (world-readable where Gradescope's is: the fallback's user reads Python there)."""
    base = Path(tempfile.mkdtemp(prefix="gradescope-test-", dir="/tmp"))
    os.chmod(base, 0o755)
    root = base / "autograder"
    root.mkdir(mode=0o755)
    for d in ("source", "submission", "results"):
        (root / d).mkdir(mode=0o755)
    _unpack(zip_path, root / "source")
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    _venv(root)
    yield root
    subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


def _run(root: Path, files: dict, mode: str = "bwrap") -> dict:
    """run_autograder on a submission folder holding ``files`` ({name: text or bytes}); its results.json."""
    sub, res = root / "submission", root / "results"
    for d in (sub, res):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(mode=0o755)
    for name, data in files.items():
        (sub / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", gradescope.FORCE)}
    env["AUTOGRADER_ROOT"] = str(root)
    if mode == "user":
        env[gradescope.FORCE] = "user"
    t0 = time.monotonic()
    p = subprocess.run(
        [str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    TIMES[f"{'+'.join(files) or 'nothing'} ({mode})"] = time.monotonic() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = json.loads((res / "results.json").read_text())
    jsonschema.validate(out, SCHEMA)
    out["_stdout"] = p.stdout
    return out


def _notebooks(root: Path) -> dict:
    sol = _solutions(LAB)
    fill = {
        "root": str(root / "source" / gradescope.COURSE),
        "subs": str(root / "submission"),
        "out": str(root / "results" / "results.json"),
        "lab": LAB,
        "forged": FORGED,
        "snippet": labs.secret_snippets(labs.read_nb(labs.source_path(LAB)))[0],
    }
    hostile = [REACH] + [
        HOSTILE[k] for k in ("fake_output", "monkeypatch", "daemon", "leak_feedback", "rewrite_tests")
    ]
    return {
        "honest": _submission(LAB, sol),
        "empty": _submission(LAB),
        "hostile": _submission(LAB, insert=[(0, code.format(**fill)) for code in hostile]),
    }


def _sandbox_processes() -> list[str]:
    """Processes of a sandbox user (UID_BASE..) in this PID namespace: what a fallback submission left
    running (bubblewrap's, a concurrent test's gradings, each have a PID namespace of their own)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                status = dict(ln.split(":", 1) for ln in (d / "status").read_text().splitlines() if ":" in ln)
                uid, nspid = int(status["Uid"].split()[0]), status.get("NSpid", "").split()
            except (OSError, KeyError, ValueError):
                continue
            own = labs.sandbox.UID_BASE <= uid < labs.sandbox.UID_BASE + labs.sandbox.UID_COUNT
            if own and len(nspid) <= 1:
                out.append(f"{d.name} uid {uid}")
    return out


def _sandbox_segments() -> list[str]:
    """System V shared-memory segments a sandbox user owns (/proc/sysvipc/shm: id and uid)."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines() if Path("/proc/sysvipc/shm").exists() else []
    if not lines:
        return []
    head = lines[0].split()
    at_id, at_uid = head.index("shmid"), head.index("uid")
    uids = sandbox.sandbox_uids()
    return [r.split()[at_id] for r in lines[1:] if int(r.split()[at_uid]) in uids]


@pytest.fixture(scope="module")
def graded(autograder, tmp_path_factory):
    """Every run, once: {(notebook, mode): results.json}, and grade's rows {notebook: row} on the same notebooks."""
    nbs = _notebooks(autograder)
    got = {}
    user = _base_python() is not None
    for name, text in nbs.items():
        if name != "hostile" or not user:  # the hostile one where Gradescope most likely runs it: the
            got[name, "bwrap"] = _run(autograder, {f"{name}.ipynb": text})  # fallback (bwrap: test_grader)
    for name in ("honest", "hostile") if user else ():
        got[name, "user"] = _run(autograder, {f"{name}.ipynb": nbs[name]}, "user")
        # removed before results.json is written, not just after (the next submission may start at once)
        got[name, "user"]["_at_results"] = [p for p in (TMP_PLANT, LOCK_PLANT) if os.path.exists(p)] + [
            f"SysV shm {row}" for row in _sandbox_segments()
        ]
        for _ in range(50):  # the guardian kills and removes what the submission left, just after it ends
            if not _sandbox_processes() and not os.path.exists(TMP_PLANT):
                break
            time.sleep(0.1)
        got[name, "user"]["_left"] = _sandbox_processes()
        got[name, "user"]["_planted"] = os.path.exists(TMP_PLANT)
    subs = tmp_path_factory.mktemp("subs")
    for name, text in nbs.items():
        (subs / f"{name}.ipynb").write_text(text)
    out = tmp_path_factory.mktemp("grades") / "gradebook.csv"
    t0 = time.monotonic()
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "labs.py"),
            "grade",
            LAB,
            str(subs),
            "--out",
            str(out),
            "--timeout",
            str(TIMEOUT),
        ],
        capture_output=True,
        text=True,
    )
    TIMES[f"grade, {len(nbs)} notebooks"] = time.monotonic() - t0
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    import csv

    rows = {r["submission"]: r for r in csv.DictReader(out.open(encoding="utf-8"))}
    feedback = {n: (out.parent / "gradebook_feedback" / f"{n}.txt").read_text() for n in nbs}
    return got, rows, feedback, user


# ------------------------------------------------------------------ the zip


@pytest.mark.slow
def test_the_command_writes_a_zip_for_every_lab_with_its_own_contract_only(tmp_path):
    for lab in labs.labs():
        out = tmp_path / f"{lab}.zip"
        assert labs.main(["gradescope", lab, "--out", str(out)]) == 0
        with zipfile.ZipFile(out) as z:
            names = set(z.namelist())
            modes = {i.filename: i.external_attr >> 16 & 0o777 for i in z.infolist()}
            config = json.loads(z.read(gradescope.CONFIG))
        assert {"setup.sh", "run_autograder", "requirements.txt", gradescope.CONFIG} <= names
        assert modes["setup.sh"] == modes["run_autograder"] == 0o755
        assert out.stat().st_mode & 0o777 == 0o600  # it holds the solutions: the instructor's alone
        assert config == {"lab": lab, "timeout": None, "skip": [], "visibility": "after_due_date"}
        contracts = {n for n in names if n.startswith(f"{gradescope.COURSE}/labs/source/contracts/")}
        assert contracts == {f"{gradescope.COURSE}/labs/source/contracts/{x}.py" for x in ("contract", lab)}
        assert f"{gradescope.COURSE}/tools/grader/gradescope.py" in names


def test_bad_arguments_are_one_line_errors_naming_the_argument(tmp_path):
    for argv, start in [
        (["gradescope", "lab99"], "unknown lab 'lab99'"),
        (["gradescope", LAB, "--visibility", "soon"], "--visibility: expected one of hidden, after_due_date"),
        (["gradescope", LAB, "--skip-question", "ex9"], "lab01_cat_mlp has no question ex9"),
        (["gradescope", LAB, "--timeout", "0"], "--timeout: expected seconds from 1 to 300"),
    ]:
        with pytest.raises(SystemExit) as e:
            labs.main([*argv, "--out", str(tmp_path / "x.zip")])
        assert str(e.value).startswith(start) and "\n" not in str(e.value), e.value
    assert not (tmp_path / "x.zip").exists()


def test_setup_sh_is_valid_bash_and_installs_what_the_course_pins(zip_path, tmp_path):
    with zipfile.ZipFile(zip_path) as z:
        setup, reqs = z.read("setup.sh").decode(), z.read("requirements.txt").decode()
    (tmp_path / "setup.sh").write_text(setup)
    assert subprocess.run(["bash", "-n", str(tmp_path / "setup.sh")]).returncode == 0
    version = re.search(r"TORCH_VERSION:-([^}]+)\}", (ROOT / "tools" / "install.sh").read_text()).group(1)
    assert f'"torch=={version}"' in setup and "download.pytorch.org/whl/cpu" in setup
    assert "bubblewrap" in setup and "util-linux" in setup and "pip install -q --no-deps -e" in setup
    assert "chmod -R go-rwx /autograder/source/course/labs/source" in setup and "[setup] torch" in setup
    pinned = {ln.strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()}
    lines = [ln for ln in reqs.splitlines() if ln and not ln.startswith("#")]
    assert lines and all(ln in pinned for ln in lines), lines
    assert {re.split(r"[=<>;]", ln)[0].lower() for ln in lines} == set(gradescope.PACKAGES)


# ------------------------------------------------------------------ grading in a Gradescope-shaped /autograder


@pytest.mark.sandbox
@pytest.mark.slow
def test_every_total_equals_grade_on_the_same_notebooks_in_bubblewrap_and_the_fallback(graded, figure):
    got, rows, _, user = graded
    figure("[gradescope] seconds per run_autograder: " + ", ".join(f"{k} {v:.1f}" for k, v in TIMES.items()))
    assert float(rows["honest"]["total"]) == 11 and float(rows["empty"]["total"]) == 0
    # the released notebook as it is: every exercise reads "not written yet", none "raised"
    for t in got["empty", "bwrap"]["tests"]:
        if t["name"] != gradescope.INSTRUCTOR_TEST:
            assert "not written yet" in t["output"] and "raised" not in t["output"], t
    for (name, mode), res in got.items():
        assert res["score"] == float(rows[name]["total"]), (name, mode, res["score"], rows[name])
        exercises = [t for t in res["tests"] if t["name"] != gradescope.INSTRUCTOR_TEST]
        assert [t["name"] for t in exercises] == [q for q, _ in labs.questions(LAB)]
        for (
            t
        ) in exercises:  # each exercise's points as grade's gradebook has them (pending review: 0 for now)
            cell = rows[name][t["name"]]
            assert t["score"] == (0.0 if cell == labs.PENDING else float(cell)), (name, mode, t, cell)
            assert t["visibility"] == "after_due_date", t
        assert sum(t["score"] for t in exercises) == res["score"]
        assert sum(t["max_score"] for t in exercises) == 11
    if not user:
        pytest.skip("the fallback was not run: no Python of this version here that other users can run")


@pytest.mark.sandbox
@pytest.mark.slow
def test_each_exercise_shows_the_students_feedback_line_as_grade_writes_it(graded):
    got, _, feedback, _ = graded
    for (name, _mode), res in got.items():
        lines = [
            ln.strip()
            for ln in feedback[name].replace("feedback for " + name, "feedback for submission").splitlines()
        ]
        for t in res["tests"]:
            if t["name"] != gradescope.INSTRUCTOR_TEST:
                assert t["output"].splitlines()[0] in lines, (t["output"], feedback[name])
                assert all(n in feedback[name] for n in t["output"].splitlines()[1:])
        assert res["output"].splitlines()[:1] == lines[:1]  # the title; the score shows with the tests
        assert (
            "Your score, and per exercise how many hidden tests pass, show after the due date."
            in res["output"]
        )
        # no oracle: a submission sent to review looks, until the due date, like any other
        assert "Score:" not in res["output"] and "review" not in res["output"].lower(), res["output"]
        assert res["output"].endswith("\n".join(labs.FEEDBACK_TAIL))
        assert res["_stdout"].startswith(f"[gradescope] {LAB}: sandbox: ")


@pytest.mark.sandbox
@pytest.mark.slow
def test_review_flags_and_the_sandbox_used_are_only_in_the_hidden_instructor_test(graded):
    got, rows, _, _ = graded
    for (name, mode), res in got.items():
        hidden = [t for t in res["tests"] if t["visibility"] == "hidden"]
        assert [t["name"] for t in hidden] == [gradescope.INSTRUCTOR_TEST] and hidden[0]["max_score"] == 0
        text = hidden[0]["output"]
        assert f"status: {rows[name]['status']}" in text and "flags:" in text and "review:" in text
        assert (
            "sandbox: bubblewrap" if mode == "bwrap" else "sandbox: the fallback without namespaces"
        ) in text
        assert res["stdout_visibility"] == "hidden"
        shown = res["output"] + "".join(t["output"] for t in res["tests"] if t["visibility"] != "hidden")
        assert "sandbox" not in shown and "flags" not in shown, shown


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_hostile_notebook_reaches_nothing_forges_nothing_and_leaks_no_hidden_material(graded):
    got, _, _, _ = graded
    secrets = labs.all_secrets()
    for (name, mode), res in got.items():
        text = json.dumps({k: v for k, v in res.items() if k != "_stdout"}, ensure_ascii=False)
        assert not [s for s in secrets if labs.found(s, text)], (name, mode)
        assert "LEAK" not in text and "99.0" not in text
        if name == "hostile":
            assert re.search(r"cell \d+: ValueError: reached: nothing", res["output"]), (mode, res["output"])
            assert res["score"] == 0
        if mode == "user":
            assert res["_left"] == [], res["_left"]  # the daemon it started did not outlive it
            assert not res["_planted"]  # nor a file it left in the shared /tmp for the next submission
            assert res["_at_results"] == [], res["_at_results"]  # nor in /run/lock, nor a SysV segment
            assert "limits: fallback without namespaces" in res["_stdout"]


@pytest.mark.sandbox
@pytest.mark.slow
def test_corrupt_and_wrong_lab_notebooks_get_a_one_line_result(autograder):
    other = (ROOT / "labs" / "lab02_chain_rule.ipynb").read_text()
    for files, start in [
        ({"lab01.ipynb": b'{"cells": ['}, "corrupt: not a readable notebook"),
        ({"lab02.ipynb": other}, "wrong-lab: a notebook for another lab"),
    ]:
        res = _run(autograder, files, "user" if "lab02.ipynb" in files else "bwrap")
        assert res["score"] == 0 and res["output"].startswith(start) and "\n" not in res["output"], res[
            "output"
        ]
        assert all(t["score"] == 0 for t in res["tests"])


def test_where_no_sandbox_holds_nothing_is_graded_and_results_json_says_why(tmp_path, monkeypatch):
    root = tmp_path / "autograder"
    (root / "source").mkdir(parents=True)
    (root / "submission").mkdir()
    (root / "source" / gradescope.CONFIG).write_text(json.dumps({"lab": LAB, "timeout": None, "skip": []}))
    (root / "submission" / "a.ipynb").write_text(_submission(LAB))
    monkeypatch.setenv(gradescope.FORCE, "user")
    monkeypatch.setattr(labs.sandbox, "user_mode_reason", lambda: "setpriv (util-linux) not installed")
    monkeypatch.setattr(labs, "grading_run", lambda *a, **k: pytest.fail("graded without a sandbox"))
    res = gradescope.run(root)
    jsonschema.validate(res, SCHEMA)
    assert res["score"] == 0 and res["tests"] == [] and "\n" not in res["output"]
    assert res["output"].startswith(
        "Not graded: the autograder refuses to run your notebook here (no sandbox"
    )
    assert "setpriv (util-linux) not installed" in res["output"]
    assert json.loads((root / "results" / "results.json").read_text())["output"] == res["output"]


def test_the_fallbacks_filter_refuses_inet_sockets_and_io_uring_and_allows_unix_ones():
    import ctypes
    import socket

    pid = os.fork()
    if pid == 0:  # the filter stays on this child: it reports by its exit status
        code = 1
        try:
            labs.sandbox.deny_network()
            try:
                socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            except PermissionError:
                a, b = socket.socketpair(socket.AF_UNIX)
                libc = ctypes.CDLL(None, use_errno=True)
                params = ctypes.create_string_buffer(120)
                if libc.syscall(425, 1, params) == -1 and ctypes.get_errno() == 13:  # io_uring_setup: EACCES
                    code = 0
        finally:
            os._exit(code)
    assert os.waitpid(pid, 0)[1] == 0


@pytest.mark.sandbox
@pytest.mark.parametrize(
    "found, says", [({"network": True}, "reaches the network"), ({"readable": ["/x"]}, "can read /x")]
)
def test_the_probe_refuses_a_sandbox_that_reaches_the_network_or_reads_the_sources(monkeypatch, found, says):
    got = {"helpers": str(ROOT / "helpers" / "__init__.py"), "network": False, "readable": [], **found}
    monkeypatch.setattr(labs, "PROBE", f"print({json.dumps(json.dumps(got))})")
    run = labs.Run("user" if labs.sandbox.user_mode_reason() is None else "bwrap")
    try:
        problem = labs.setup_problem(run, False)
    finally:
        run.close()
    assert problem and says in problem and "\n" not in problem, problem


def test_every_note_a_hidden_test_leads_to_names_its_exercise():
    """Notes that name an exercise go with its test (hidden until the due date); one that named none was
    shown at once, a bit of a hidden input per submission (red team 8: spin in a hidden test when the
    input says so, and "could not be restarted in time" appeared). Read from the harness's source."""
    import ast

    import harness

    tree = ast.parse(Path(harness.__file__).read_text())
    grade = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "grade")
    appends = [
        n.args[0]
        for n in ast.walk(grade)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "append"
        and ast.unparse(n.func.value) == "result['notes']"
    ]
    assert len(appends) >= 5
    for note in appends:
        assert "{q.name}" in ast.unparse(note), ast.unparse(note)
    assert gradescope._about("ex3", "ex3: grading stopped here: the notebook could not be restarted in time")
