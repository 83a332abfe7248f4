"""Whole-submission limits of the grader's sandbox (``tools/grader/sandbox.py``), red-team style.

Limits were per process: four children at 1.75 GiB each held 7 GiB under the "6 GiB" cap, 3 GiB
were written to the sandbox's home and /tmp (no quota), and two concurrent ``grade`` runs handed
out the same sandbox user ids. Here each hostile program runs in the real sandbox, with small
limits passed in so that every case takes seconds and little of the machine's memory.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
import sandbox  # noqa: E402

PY = [sys.executable, "-I", "-c"]
SMALL = {"memory_mb": 512, "process_memory_mb": 2048, "disk_mb": 16, "nproc": 64, "notice": False}

# four children that each fill 200 MiB and hold it: 800 MiB together, under a 512 MiB submission
FOUR_CHILDREN = """
import os, signal, time
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        try:
            b = bytearray(200 << 20)
            for j in range(0, len(b), 4096):
                b[j] = 1
        except MemoryError:  # SIGTERM: the grader's worker makes a child's os._exit(n) exit 0
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.5)
        os._exit(0)
    kids.append(pid)
print(*[os.waitpid(k, 0)[1] for k in kids])
"""

# a submission that writes 64 MiB to its home and to /tmp (16 MiB each here), then what it can still do
FILL_DISK = """
import errno, os
for where in (os.path.expanduser("~"), "/tmp"):
    try:
        with open(os.path.join(where, "big"), "wb") as f:
            for _ in range(64):
                f.write(b"x" * (1 << 20))
                f.flush()
        print(where, "wrote 64 MiB")
    except OSError as e:
        print(where, errno.errorcode[e.errno], os.path.getsize(os.path.join(where, "big")) >> 20)
print(open("submission.ipynb").read())
"""


def _home(tmp_path, text="the notebook") -> Path:
    home = tmp_path / "home"
    home.mkdir()
    (home / "submission.ipynb").write_text(text)
    return home


def _run(tmp_path, code, timeout=60, **kw) -> subprocess.CompletedProcess:
    cmd = sandbox.command(_home(tmp_path), PY + [code], helpers_dir=ROOT / "helpers", **{**SMALL, **kw})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _whole() -> dict:
    return sandbox.whole_limits()


def _cgroups(holder: int) -> list[Path]:
    return [Path(b) / f"{sandbox.CGROUP_PREFIX}{holder}" for b in _whole()["bases"]]


def _gone(paths, timeout=10.0) -> bool:
    end = time.monotonic() + timeout
    while any(p.exists() for p in paths):
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def test_the_limits_notice_is_one_line_naming_what_applies():
    line = sandbox.limits_notice(memory_mb=6144, nproc=256, disk_mb=512)
    assert line.startswith("limits: ") and "\n" not in line, line
    kind = _whole()["kind"]
    expect = {
        "cgroup2": "cgroup v2 memory.max 6 GiB, pids.max 256 per submission",
        "cgroup1": "cgroup v1 memory.limit_in_bytes 6 GiB, pids.max 256 per submission",
        "systemd": "systemd scope MemoryMax 6 GiB, TasksMax 256 per submission",
        "process": "per process only (",
    }[kind]
    assert expect in line, line
    assert "home and /tmp: tmpfs of 512 MiB each" in line or "bubblewrap too old" in line, line


def test_the_notice_is_printed_once_per_process(tmp_path, capsys):
    home = _home(tmp_path)
    sandbox._NOTICED.discard(sandbox.limits_notice(memory_mb=300, nproc=7))
    for _ in range(3):
        sandbox.command(home, ["true"], helpers_dir=ROOT / "helpers", memory_mb=300, nproc=7)
    out = capsys.readouterr().out.splitlines()
    assert out == [sandbox.limits_notice(memory_mb=300, nproc=7)], out


def test_cgroup_v2_is_used_below_our_own_cgroup_or_a_delegated_parent_never_systemds(tmp_path, monkeypatch):
    """The choice of where submissions' cgroups go, on a made-up cgroup v2 tree (this machine may
    have none): our own cgroup when it can hand out memory and pids (the root can), else an ancestor
    that already does, unless systemd runs the machine (then its scopes, not our siblings)."""
    root = tmp_path / "cg"
    own = root / "a" / "b"
    own.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    made = []
    monkeypatch.setattr(sandbox, "_can_make", lambda base, files, test: made.append(base) or True)
    mounts = [("cgroup2", root, ["/", "rw"])]
    assert sandbox._cgroup2(mounts, "0::/\n", False) == ([str(root)], "")  # the root: switched on
    assert (root / "cgroup.subtree_control").read_text() == "+memory +pids"
    (own / "cgroup.subtree_control").mkdir()  # cannot be written (the kernel: EBUSY, it holds processes)
    (root / "a" / "cgroup.subtree_control").write_text("memory pids\n")
    assert sandbox._cgroup2(mounts, "0::/a/b\n", False) == ([str(root / "a")], "")
    bases, why = sandbox._cgroup2(mounts, "0::/a/b\n", True)
    assert bases == [] and why.startswith("cgroup v2"), why
    (root / "cgroup.controllers").write_text("cpu io\n")  # memory and pids held by cgroup v1
    assert sandbox._cgroup2(mounts, "0::/\n", False) == (
        [],
        "cgroup v2 has no memory and pids controllers here",
    )
    assert sandbox._cgroup2([], "0::/\n", False) == ([], "no cgroup v2 mounted")
    assert made == [root, root / "a"]


@pytest.mark.sandbox
def test_four_children_cannot_hold_more_than_the_whole_submissions_memory(tmp_path):
    """Each child stays far under the per-process cap (2 GiB here); together they pass the
    submission's 512 MiB, so the kernel stops some of them (SIGKILL, or MemoryError)."""
    if _whole()["kind"] == "process":
        pytest.skip(f"no whole-submission limit on this machine: {_whole()['why']}")
    p = _run(tmp_path, FOUR_CHILDREN)
    statuses = [int(s) for s in p.stdout.split()]
    assert len(statuses) == 4, (p.stdout, p.stderr)
    assert statuses.count(0) < 4, statuses  # not all four held their 200 MiB at once
    assert all(s in (0, 9, 15) for s in statuses), statuses  # 9: SIGKILL (OOM), 15: MemoryError


@pytest.mark.sandbox
def test_the_same_children_run_when_the_submission_may_hold_them(tmp_path):
    """The control: with 1.5 GiB for the submission the same four children all finish."""
    if _whole()["kind"] == "process":
        pytest.skip(f"no whole-submission limit on this machine: {_whole()['why']}")
    p = _run(tmp_path, FOUR_CHILDREN, memory_mb=1536)
    assert [int(s) for s in p.stdout.split()] == [0, 0, 0, 0], (p.stdout, p.stderr)


@pytest.mark.sandbox
def test_a_fork_bomb_stops_at_the_submissions_process_count(tmp_path):
    """pids.max (or RLIMIT_NPROC of its own user) counts all the submission's processes."""
    code = (
        "import os, time\nn = 0\nwhile True:\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n"
        "    n += 1\nprint(n, flush=True)\nos._exit(0)"
    )
    p = _run(tmp_path, code, nproc=20)
    assert p.stdout.strip() and int(p.stdout) < 20, (p.stdout, p.stderr)


@pytest.mark.sandbox
def test_writing_past_the_tmpfs_size_is_enospc_in_the_submissions_own_space(tmp_path):
    """Home and /tmp are tmpfs of ``disk_mb`` each: 64 MiB into 16 MiB stops at 16 with ENOSPC;
    the notebook is in the home, and nothing is written to the grading machine's folder."""
    if not sandbox.size_option_works():
        pytest.skip("this bubblewrap has no --size")
    p = _run(tmp_path, FILL_DISK)
    lines = p.stdout.splitlines()
    assert len(lines) == 3, p.stdout + p.stderr
    assert lines[0].split()[:2] == ["/home/student", "ENOSPC"], lines
    assert lines[1].split()[:2] == ["/tmp", "ENOSPC"], lines
    assert int(lines[0].split()[2]) <= 16 and int(lines[1].split()[2]) <= 16, lines
    assert lines[2] == "the notebook", lines
    assert sorted(os.listdir(tmp_path / "home")) == [
        "submission.ipynb"
    ]  # what the sandbox wrote stayed in its tmpfs
    assert (tmp_path / "home" / "submission.ipynb").read_text() == "the notebook"


@pytest.mark.sandbox
def test_the_notebook_is_in_a_writable_home_and_each_start_gets_it_afresh(tmp_path):
    home = _home(tmp_path, "v1")
    code = (
        "import os\nprint(os.getcwd(), sorted(os.listdir('.')), open('submission.ipynb').read())\n"
        "open('submission.ipynb', 'w').write('rewritten'); os.mkdir('d'); print(open('submission.ipynb').read())"
    )
    cmd = sandbox.command(home, PY + [code], helpers_dir=ROOT / "helpers", **SMALL)
    for _ in range(2):  # a restarted worker sees the notebook as handed in, not as the last run left it
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert p.stdout.splitlines() == ["/home/student ['submission.ipynb'] v1", "rewritten"], (
            p.stdout + p.stderr
        )
    assert (home / "submission.ipynb").read_text() == "v1" and sorted(os.listdir(home)) == [
        "submission.ipynb"
    ]


@pytest.mark.sandbox
def test_two_concurrent_sandboxes_get_different_users_released_afterwards(tmp_path):
    """Two grade runs both ask for UID_BASE (each counts from there): each sandbox gets its own."""
    if os.geteuid() != 0:
        pytest.skip("sandbox users exist only when grading as root")
    procs = []
    for k in range(2):
        home = tmp_path / f"h{k}"
        home.mkdir()
        cmd = sandbox.command(
            home,
            PY + ["import os, sys, time; print(os.getuid(), flush=True); sys.stdin.read()"],
            helpers_dir=ROOT / "helpers",
            uid=sandbox.UID_BASE,
            **SMALL,
        )
        procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    uids = [int(p.stdout.readline()) for p in procs]
    assert uids[0] != uids[1] and all(
        sandbox.UID_BASE <= u < sandbox.UID_BASE + sandbox.UID_COUNT for u in uids
    )
    leases = [sandbox.LEASES / str(u) for u in uids]
    assert [f.read_text() for f in leases] == [str(p.pid) for p in procs]
    for p in procs:
        p.communicate("", timeout=30)
    assert _gone(leases), "the leases outlived their sandboxes"


@pytest.mark.sandbox
def test_a_killed_sandbox_leaves_no_cgroup_and_no_lease(tmp_path):
    """The harness ends a worker with SIGKILL: the guardian still removes its cgroup and lease."""
    cmd = sandbox.command(
        _home(tmp_path),
        PY + ["import os, time; print(os.getuid(), flush=True); time.sleep(60)"],
        helpers_dir=ROOT / "helpers",
        **SMALL,
    )
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    uid = int(p.stdout.readline())
    groups = _cgroups(p.pid)
    assert all(g.is_dir() for g in groups) and len(groups) == {"cgroup1": 2, "cgroup2": 1}.get(
        _whole()["kind"], 0
    )
    for g in groups:
        assert str(p.pid) in (g / "cgroup.procs").read_text().split()
    p.kill()
    p.wait()
    lease = [sandbox.LEASES / str(uid)] if os.geteuid() == 0 else []
    assert _gone(groups + lease), "a cgroup or the lease outlived its sandbox"


@pytest.mark.sandbox
def test_a_cgroup_left_by_a_killed_grading_is_removed_by_the_next(tmp_path):
    """The guardian can be killed too (SIGKILL of everything): the next submission sweeps its cgroup."""
    if _whole()["kind"] not in ("cgroup1", "cgroup2"):
        pytest.skip("no cgroups here")
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = sandbox.make_cgroups(_whole()["bases"], dead.pid, 64, 8)
    assert stale and all(d.is_dir() for d in stale)
    p = _run(tmp_path, "print('ok')")
    assert p.stdout.strip() == "ok", p.stderr
    assert _gone(stale, 2)


# ------------------------------------------------------------------ a class's run, through `grade`

LAB = "lab01_cat_mlp"
# in a notebook cell: four children of 300 MiB each under a 1 GiB submission; the cell raises only if
# all four held their memory at once (what the per-process cap let through)
HOG_CELL = FOUR_CHILDREN.replace("200 << 20", "300 << 20").replace(
    "print(*[os.waitpid(k, 0)[1] for k in kids])",
    "st = [os.waitpid(k, 0)[1] for k in kids]\nif st == [0, 0, 0, 0]:\n    raise RuntimeError('four children held 1.2 GiB')",
)
# in a notebook cell: 100 MiB into the home's 64 MiB
FILL_CELL = "import pathlib\npathlib.Path('big').write_bytes(b'x' * (100 << 20))"


def _notebook(answers, insert=None):
    import nbformat

    import labs

    nb = labs.read_nb(labs.student_path(LAB))
    slots = [c for c in nb.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
    for cell, ans in zip(slots, answers):
        cell.source = ans
    if insert is not None:
        nb.cells.insert(nb.cells.index(slots[0]) + 1, nbformat.v4.new_code_cell(insert))
    return nbformat.writes(nb)


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_memory_hog_and_a_disk_filler_are_each_their_own_row_and_the_run_completes(
    tmp_path, monkeypatch, capsys
):
    """Graded by the real `grade`, each submission with 1 GiB for all its processes (4 GiB a process)
    and a 64 MiB home: the hog's children are stopped (the cell would raise if all four held their
    300 MiB) and its notebook is graded; the filler's cell gets ENOSPC, named in its notes, and the
    rest of its notebook is graded; the honest classmate graded after them gets 11 of 11."""
    import csv

    import test_grader

    import labs

    if _whole()["kind"] == "process" or not sandbox.size_option_works():
        pytest.skip(f"no whole-submission limits on this machine: {_whole()['why']}")
    real = sandbox.command
    small = {"memory_mb": 1024, "process_memory_mb": 4096, "disk_mb": 64}
    monkeypatch.setattr(sandbox, "command", lambda home, argv, **kw: real(home, argv, **{**kw, **small}))
    sol = test_grader._solutions(LAB)
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "a_hog.ipynb").write_text(_notebook(sol, HOG_CELL))
    (subs / "b_filler.ipynb").write_text(_notebook(sol, FILL_CELL))
    (subs / "c_honest.ipynb").write_text(_notebook(sol))
    labs.grade(LAB, subs, tmp_path / "g.csv", timeout=120)
    with (tmp_path / "g.csv").open(encoding="utf-8") as f:
        rows = {r["submission"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"a_hog", "b_filler", "c_honest"}, rows
    assert rows["c_honest"]["status"] == "ok" and rows["c_honest"]["total"] == "11", rows["c_honest"]
    hog, filler = rows["a_hog"], rows["b_filler"]
    # the cell ran (its error would be a note) and the notebook was graded
    assert hog["status"] in ("ok", "review") and "four children" not in hog["notes"], hog
    assert filler["status"] in ("errors", "review") and "No space left on device" in filler["notes"], filler
    # each scores its honest work, or waits for the instructor (the added cell is not by-hand tensor work)
    for row in (hog, filler):
        assert row["total"] == "11" or {row[f"ex{i}"] for i in range(1, 7)} == {"review"}, row
    out = capsys.readouterr().out
    assert out.count("limits: ") == 1 and "1 GiB" in out, out


@pytest.mark.sandbox
def test_a_sandbox_whose_cgroup_cannot_be_made_does_not_start_and_says_why_in_one_line(tmp_path):
    """Fail closed: no run without the limits the notice names (grade's start-up probe shows this line)."""
    import json

    cmd = sandbox.command(_home(tmp_path), PY + ["print('ran')"], helpers_dir=ROOT / "helpers", **SMALL)
    spec = json.loads(cmd[-1])
    spec["whole"] = {"kind": "cgroup1", "bases": [str(tmp_path / "no-such-cgroup")], "why": ""}
    proc = subprocess.Popen(
        cmd[:-1] + [json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 125 and out == "", (proc.returncode, out)
    assert err.startswith("sandbox: cannot start: ") and err.count("\n") == 1, err
    leases = sandbox.LEASES.glob("[0-9]*") if sandbox.LEASES.is_dir() else []
    assert not [f for f in leases if f.read_text() == str(proc.pid)]  # its lease was ended


def test_leftovers_are_removed_from_every_shared_folder_however_many_there_are(tmp_path, monkeypatch):
    """Red team 7 filled the first shared folder with 200,500 files of its own to use up the walk's limit,
    and its file in a later folder outlived its grading: the limit counts only others' entries, per folder."""
    first, later = tmp_path / "dev_shm", tmp_path / "var_tmp"
    for d in (first, later):
        d.mkdir()
        d.chmod(0o1777)
    mine = os.getuid()
    for i in range(60):
        (first / f"j{i}").write_text("")
    (first / "sub").mkdir()
    (first / "sub" / "deep").write_text("x")
    (later / "hidden inputs").write_text("x")
    other = tmp_path / "not shared"
    other.mkdir()
    (other / "keep").write_text("x")
    monkeypatch.setattr(sandbox, "shared_dirs", lambda: [str(first), str(later)])
    sandbox._remove_owned({mine}, limit=10)
    assert list(first.iterdir()) == [] and list(later.iterdir()) == []
    assert (other / "keep").exists()  # only the shared folders are walked
    (later / "someone else's").write_text("x")
    sandbox._remove_owned({mine + 1}, limit=10)  # another user's files stay
    assert (later / "someone else's").exists()
