"""A warm start for the worker: torch, IPython and the course's helpers imported once, then forked into
each submission's own sandbox.

    python -I zygote.py        # started by tools/labs.py's Run, as root, in the sandbox's environment;
                               # its listening socket is its stdin; it prints "ready" once imported

A fresh worker spends about 3 s of CPU importing torch before the notebook's first cell (on a 2-core
machine, most of a lab 1 grading). Here each request on the socket is a held sandbox (``sandbox.py``'s
``command(hold=True)``, built by bubblewrap as every sandbox is): a pidfd of its first process, the
job that process printed (the leased user id, the submission's cgroups, the per-process limits, the
environment) and the worker's two pipe ends. A child joins the cgroups and the sandbox's namespaces
(setns), forks the worker into its PID namespace; the worker drops to the leased user with no
capability, under the limits, and runs ``worker.py`` as ``python -I worker.py`` would, its imports done.

This process never holds a submission's data, a hidden test or a solution: a worker forked from it
inherits its memory. It fails closed: a step that does not hold (a job outside the leases or the
cgroups, namespaces that are this process's own, a capability left) ends the child before one line
of the worker runs; the harness then sees the worker's pipes close.
"""

from __future__ import annotations

import builtins
import ctypes
import importlib.machinery
import json
import os
import resource
import signal
import socket
import sys
import types
from pathlib import Path

from helpers.labcontract import module_at

HERE = Path(__file__).resolve().parent
sandbox = module_at("sandbox", str(HERE / "sandbox.py"))  # python -I leaves this folder off sys.path

NAMESPACES = {"mnt": 0x00020000, "pid": 0x20000000, "net": 0x40000000, "ipc": 0x08000000, "uts": 0x04000000}
CLONE_NEWCGROUP = 0x02000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 4, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_libc = ctypes.CDLL(None, use_errno=True)


def _own_namespaces() -> dict[str, str]:
    """This process's namespaces ({name: "mnt:[4026531840]"}): a worker must be in none of them."""
    return {name: os.readlink(f"/proc/self/ns/{name}") for name in NAMESPACES}


def check_job(job, bases: list[str]) -> dict:
    """``job`` as the holder printed it, checked (ValueError otherwise): a leased user id, cgroups of
    the grader's own under ``bases``, the per-process limits, string environment variables."""
    if not isinstance(job, dict) or set(job) != {"uid", "cgroups", "limits", "env"}:
        raise ValueError("job: expected uid, cgroups, limits and env")
    uid = job["uid"]
    if type(uid) is not int or not sandbox.UID_BASE <= uid < sandbox.UID_BASE + sandbox.UID_COUNT:
        raise ValueError(
            f"job uid: expected a leased id in [{sandbox.UID_BASE}, {sandbox.UID_BASE + sandbox.UID_COUNT})"
        )
    groups = job["cgroups"]
    if not isinstance(groups, list) or len(groups) != len(bases):
        raise ValueError("job cgroups: expected one under each base")
    for d, base in zip(groups, bases):
        p = Path(str(d))
        if p.parent != Path(base) or not p.name.startswith(sandbox.CGROUP_PREFIX) or not p.is_dir():
            raise ValueError(f"job cgroup {d}: expected {base}/{sandbox.CGROUP_PREFIX}<pid>")
    limits = job["limits"]
    names = ("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_CORE")
    if (
        not isinstance(limits, dict)
        or set(limits) != set(names)
        or any(type(v) is not int or v < 0 for v in limits.values())
    ):
        raise ValueError(f"job limits: expected {', '.join(names)}, each a whole number")
    env = job["env"]
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError("job env: expected strings")
    return job


def _status() -> dict[str, str]:
    return dict(ln.split(":", 1) for ln in Path("/proc/self/status").read_text().splitlines() if ":" in ln)


def _drop(uid: int) -> None:
    """Become ``uid`` (and its group) with no capability, no supplementary group, no new privileges,
    and check it (OSError otherwise): setpriv's --reuid --regid --clear-groups --inh-caps=-all
    --bounding-set=-all --no-new-privs."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"cannot drop capability {cap} from the bounding set")
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # from root to another user: the permitted and effective sets empty
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # as exec makes a cold worker (setresuid cleared it)
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot set no_new_privs")
    st = _status()
    ids = [int(x) for x in st["Uid"].split() + st["Gid"].split()]
    caps = [int(st[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
    if ids != [uid] * 8 or any(caps) or st["Groups"].strip() or st["NoNewPrivs"].strip() != "1":
        raise OSError("the worker kept an id, a group or a capability it must not have")


def _limit(limits: dict[str, int]) -> None:
    """The per-process limits (``sandbox.process_limits``), as prlimit sets them."""
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def _worker(job: dict, fd_in: int, fd_out: int) -> None:
    """In the sandbox's namespaces, as the worker's own process: drop, limit, then run worker.py."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    os.setsid()
    _drop(job["uid"])
    _limit(job["limits"])
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(fd_in, 0)
    os.dup2(fd_out, 1)
    os.dup2(null, 2)
    os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    os.environ.clear()
    os.environ.update(job["env"], PWD=sandbox.HOME)  # PWD: as bubblewrap's --chdir sets it
    os.chdir(sandbox.HOME)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import random

    random.seed()  # a fresh process's streams, not the zygote's (torch seeds itself afresh at import too)
    sys.modules["torch"].seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()
    sys.argv = [f"{sandbox.GRADER}/worker.py", f"{sandbox.HOME}/submission.ipynb"]
    del sys.modules["sandbox"]  # the worker's modules, as a fresh process has them
    _run_as_main(sys.argv[0])


def _run_as_main(path: str) -> None:
    """Run the file ``path`` as ``python path`` runs a script: its own ``__main__`` module, which
    multiprocessing's ``__mp_main__`` names too (torch imported multiprocessing here, in the zygote)."""
    main = types.ModuleType("__main__")
    main.__file__, main.__builtins__, main.__cached__ = path, builtins, None
    main.__loader__ = importlib.machinery.SourceFileLoader("__main__", path)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = main
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    exec(code, main.__dict__)


def _enter(job: dict, pidfd: int, fd_in: int, fd_out: int, own: dict) -> None:
    """The child: join the submission's cgroups and the sandbox's namespaces, then fork the worker
    into its PID namespace and wait for it (a PID namespace takes in only the children of who joined)."""
    for d in job["cgroups"]:
        Path(d, "cgroup.procs").write_text(str(os.getpid()))
    # every namespace at once (a pidfd); the cgroup one too, the same as ours where bubblewrap made none
    if _libc.setns(pidfd, sum(NAMESPACES.values()) | CLONE_NEWCGROUP) != 0:
        raise OSError(ctypes.get_errno(), "setns into the sandbox failed")
    pid = os.fork()
    if pid == 0:
        try:
            # /proc is the sandbox's now: only this child, in its PID namespace, can read its own
            now = {name: os.readlink(f"/proc/self/ns/{name}") for name in NAMESPACES}
            if any(now[name] == own[name] for name in NAMESPACES):
                raise OSError("a namespace of the zygote's own is still the worker's")
            _worker(job, fd_in, fd_out)
        except BaseException as e:  # noqa: BLE001 - before the worker's first line: fail closed
            print(f"zygote: no worker: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        finally:
            os._exit(0)
    os.close(fd_in)
    os.close(fd_out)
    os.waitpid(pid, 0)


def serve(listener: socket.socket) -> None:
    """Fork a worker for each request on ``listener`` (one at a time: a fork takes a few milliseconds)."""
    own = _own_namespaces()
    bases = sandbox.whole_limits()["bases"]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    while True:
        conn, _ = listener.accept()
        fds, job = [], None
        try:
            conn.settimeout(10)
            msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
            if len(fds) != 3:
                raise ValueError(f"expected 3 descriptors, got {len(fds)}")
            job = check_job(json.loads(msg), bases)
        except (OSError, ValueError) as e:
            print(f"zygote: request refused: {e}", file=sys.stderr, flush=True)
        finally:
            conn.close()
            if job is None:  # refused: closed at once, so the harness sees its worker's pipes close now
                for fd in fds:
                    os.close(fd)
        if job is None:
            continue
        pidfd, fd_in, fd_out = fds
        child = os.fork()
        if child == 0:
            try:
                listener.close()
                _enter(job, pidfd, fd_in, fd_out, own)
            except BaseException as e:  # noqa: BLE001 - fail closed: no worker runs
                print(f"zygote: no worker: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)


def main() -> None:
    listener = socket.socket(fileno=os.dup(0))
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.environ.setdefault("MPLBACKEND", "Agg")  # as worker.py sets it before its imports
    # the worker's imports (worker.py's own run again in each worker, cheap once these are loaded)
    import IPython.core.interactiveshell  # noqa: F401
    import torch  # noqa: F401

    import helpers.labcheck  # noqa: F401
    import helpers.labcontract  # noqa: F401
    import helpers.memory  # noqa: F401

    if len(os.listdir("/proc/self/task")) != 1:  # a fork copies one thread: another's locks stay held
        raise SystemExit("zygote: a thread started while importing; not forking from here")
    own = os.pidfd_open(os.getpid())  # setns on a pidfd (Linux 5.8): joining our own UTS namespace
    if _libc.setns(own, NAMESPACES["uts"]) != 0:  # changes nothing; where it fails, the run starts cold
        raise SystemExit(f"zygote: this kernel cannot setns on a pidfd (errno {ctypes.get_errno()})")
    os.close(own)
    print("ready", flush=True)
    serve(listener)


if __name__ == "__main__":
    main()
