"""The warm start (``tools/grader/zygote.py``): a worker forked into its sandbox, torch already imported,
must be confined exactly as one that starts cold (``python worker.py`` under bubblewrap), and the
zygote must start no worker at all on a request it cannot check."""

import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
import sandbox  # noqa: E402

import labs  # noqa: E402

pytestmark = [pytest.mark.sandbox]

# what the worker's process sees of itself and its sandbox: every value but the namespaces' ids and the
# parent's pid (1, bubblewrap's init, when cold; 0, outside the namespace, when forked in)
FACTS = r"""
import ctypes, os, resource, socket
def _status():
    return dict(ln.split(":", 1) for ln in open("/proc/self/status").read().splitlines() if ":" in ln)
_st = _status()
def _net():
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(("192.0.2.1", 9))
        return "reached"
    except OSError as e:
        return e.errno
FACTS = {
    "pid": os.getpid(),
    "ids": [_st["Uid"].split(), _st["Gid"].split(), _st["Groups"].strip()],
    "caps": {k: _st[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
    "no_new_privs": _st["NoNewPrivs"].strip(),
    "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),
    "limits": {k: resource.getrlimit(getattr(resource, k))
               for k in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_CORE")},
    "env": sorted((k, v) for k, v in os.environ.items() if k != "MPLBACKEND"),
    "cwd": os.getcwd(),
    "home": sorted(os.listdir(".")),
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "network": _net(),
    "hostname": socket.gethostname(),
    "mounts": sorted(ln.split()[4] for ln in open("/proc/self/mountinfo")),
    "cgroup": open("/proc/self/cgroup").read(),
    "readable": [os.access(p, os.R_OK) for p in READ],
    "ns": {n: os.readlink(f"/proc/self/ns/{n}") for n in ("mnt", "pid", "net", "ipc", "uts")},
}
"""


def _facts(zygote: str | None, run: labs.Run) -> dict:
    """FACTS as a worker computes them, forked from ``zygote`` or (None) started cold."""
    import harness
    import reach

    read = [str(ROOT / "labs" / "source"), str(ROOT / "tests"), str(run.dir)]
    code = f"READ = {read!r}\n" + FACTS
    with tempfile.TemporaryDirectory() as d:
        home = Path(d) / "home"
        home.mkdir()
        (home / "submission.ipynb").write_text("{}")
        argv = sandbox.command(
            home,
            sandbox.worker_argv(),
            helpers_dir=ROOT / "helpers",
            uid=run.next_uid(),
            cpu_s=99,
            hold=bool(zygote),
        )
        cells = [reach.Cell(1, code, "added", None)]
        student = harness.Student(argv, {}, 120, 60, cells, reap=True, zygote=zygote)
        try:
            assert not student.errors, student.errors
            return json.loads(json.dumps(student.peer.request({"op": "get"}, "FACTS", True)))
        finally:
            student.close()


def test_a_worker_forked_from_the_zygote_sees_what_a_cold_one_sees():
    if os.geteuid() != 0:
        pytest.skip("the warm start needs root (setns)")
    run = labs.Run()
    try:
        zygote = run.zygote(at_once=True)
        assert zygote, "the zygote did not start"
        warm, cold = _facts(zygote, run), _facts(None, run)
    finally:
        run.close()
    host = {n: os.readlink(f"/proc/self/ns/{n}") for n in ("mnt", "pid", "net", "ipc", "uts")}
    for facts in (warm, cold):
        assert all(facts["ns"][n] != host[n] for n in host), facts["ns"]
        assert facts["pid"] == 2 and facts["processes"] == [1, 2], facts["processes"]
        uid = facts["ids"][0][0]
        assert sandbox.UID_BASE <= int(uid) < sandbox.UID_BASE + sandbox.UID_COUNT
        assert facts["ids"] == [[uid] * 4, [uid] * 4, ""]
        assert set(facts["caps"].values()) == {"0000000000000000"} and facts["no_new_privs"] == "1"
        assert facts["network"] != "reached" and facts["readable"] == [False, False, False]
        assert facts["limits"]["RLIMIT_CPU"] == [99, 99] and facts["limits"]["RLIMIT_CORE"] == [0, 0]
    same = {k: v for k, v in warm.items() if k not in ("ns", "ids")}
    assert same == {k: v for k, v in cold.items() if k not in ("ns", "ids")}


def test_the_zygote_refuses_a_job_it_cannot_check():
    import zygote as z

    bases = sandbox.whole_limits()["bases"]
    good = {"uid": sandbox.UID_BASE, "cgroups": [], "limits": {}, "env": {}}
    limits = {k: 1 for k in ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_CORE")}
    for bad in (
        {**good, "uid": 0},
        {**good, "uid": sandbox.SANDBOX_UID},  # the holder's user, not a leased one
        {**good, "uid": True},
        {**good, "extra": 1},
        {**good, "cgroups": ["/sys/fs/cgroup"] * len(bases) or ["/x"]},
        {**good, "limits": {**limits, "RLIMIT_AS": -1}},
        {**good, "env": {"A": 1}},
        [],
    ):
        with pytest.raises(ValueError):
            z.check_job(bad, bases)
    if not bases:
        assert z.check_job({**good, "limits": limits}, bases)["uid"] == sandbox.UID_BASE


def test_a_process_outside_any_sandbox_gets_no_worker_from_the_zygote():
    """A request naming a process in the zygote's own namespaces (a plain `sleep`): the worker's first
    check fails and nothing of the worker runs, however well-formed the job."""
    if os.geteuid() != 0:
        pytest.skip("the warm start needs root (setns)")
    run = labs.Run()
    sleeper = subprocess.Popen(["sleep", "60"])
    groups = []
    try:
        path = run.zygote(at_once=True)
        assert path
        whole = sandbox.whole_limits()
        if whole["kind"] in ("cgroup1", "cgroup2"):
            groups = sandbox.make_cgroups(whole["bases"], sleeper.pid, 512, 64)
        uid = run.next_uid()
        spec = {"process_memory_mb": 512, "cpu_s": 10, "nproc": 64, "fsize_mb": 16}
        job = {
            "uid": uid,
            "cgroups": [str(g) for g in groups],
            "limits": sandbox.process_limits(spec),
            "env": {},
        }
        pidfd = os.pidfd_open(sleeper.pid)
        worker_in, to_worker = os.pipe()
        from_worker, worker_out = os.pipe()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            socket.send_fds(s, [json.dumps(job).encode()], [pidfd, worker_in, worker_out])
        for fd in (pidfd, worker_in, worker_out):
            os.close(fd)
        os.write(to_worker, b"x" * 16)
        deadline = time.monotonic() + 30
        got = b""
        while time.monotonic() < deadline:
            chunk = os.read(from_worker, 4096)
            if not chunk:
                break
            got += chunk
        assert got == b"", got  # closed, and not a byte of the worker's protocol
        assert uid not in sandbox.uids_in_use()
        log = (run.dir / "zygote.log").read_text()
        assert "no worker: OSError: a namespace of the zygote's own is still the worker's" in log, log
    finally:
        sleeper.kill()
        sleeper.wait()
        for g in groups:
            sandbox.remove_cgroup(g)
        run.close()


def test_a_run_of_one_notebook_stays_cold_and_a_run_of_two_starts_warm():
    """The zygote costs one import of torch: worth it from a run's second notebook, the published
    solutions timed first included (``grading_run`` sets ``planned``)."""
    if os.geteuid() != 0:
        pytest.skip("the warm start needs root (setns)")
    for planned, first_is_warm in ((1, False), (2, True)):
        run = labs.Run()
        run.planned = planned
        try:
            first, second = run.zygote(), run.zygote()
            assert (first is not None) == first_is_warm and second is not None, (planned, first, second)
        finally:
            run.close()
    cold = labs.Run()
    try:
        cold.warm = False  # BBH_ZYGOTE=0, the fallback, --unsafe, or not root
        cold.planned = 5
        assert cold.zygote() is None and cold.zygote(at_once=True) is None
    finally:
        cold.close()


def test_a_zygote_that_is_gone_costs_no_student_anything():
    """The red team killed a run's zygote: every notebook after it crashed, blamed on the student. A
    worker whose zygote cannot be reached starts cold in the same sandbox's command; a run whose
    zygote died starts the rest cold."""
    if os.geteuid() != 0:
        pytest.skip("the warm start needs root (setns)")
    run = labs.Run()
    try:
        facts = _facts(str(run.dir / "no-such-zygote.sock"), run)  # a held command, started cold
        assert facts["pid"] == 2 and facts["processes"] == [1, 2] and facts["ids"][0][0] != "0"
        assert run.zygote(at_once=True)
        run._zygote.kill()
        run._zygote.wait()
        assert run.zygote() is None
    finally:
        run.close()


def test_bbh_zygote_0_starts_every_worker_cold(monkeypatch):
    """instructors.md's switch: with BBH_ZYGOTE=0 a run never starts a zygote, however many it grades."""
    monkeypatch.setenv("BBH_ZYGOTE", "0")
    run = labs.Run()
    try:
        run.planned = 200
        assert not run.warm and run.zygote() is None and run.zygote(at_once=True) is None
        assert run._zygote is None
    finally:
        run.close()
