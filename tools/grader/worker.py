"""The student's side of grading: run the submitted notebook, then answer the harness's calls.

Runs inside the sandbox (``sandbox.py``), as its own process, with the submission as its only
file. It never sees a hidden test: the harness (another process) sends values and asks for the
student's functions to be called on them; this process sends back what they return, by value
(``wire.py``). Before any student code runs it puts guards on autograd's entry points and on
the course's reference functions, so that an exercise asking for a gradient "by hand" can tell
when it was answered with them instead.

    python worker.py [NOTEBOOK]      # protocol on stdin/stdout; the student's prints go nowhere;
                                     # the cells it runs come from the harness, not from NOTEBOOK
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import resource
import signal
import sys

# the protocol keeps the real stdin/stdout; the student's prints and reads get /dev/null
_IN, _OUT = os.fdopen(os.dup(0), "rb", buffering=0), os.fdopen(os.dup(1), "wb")
_EXIT = os._exit  # a capped child's own exit: the notebook's os._exit is replaced (run_notebook) or its own
_NULL = os.open(os.devnull, os.O_RDWR)
for _fd in (0, 1, 2):
    os.dup2(_NULL, _fd)
os.environ.setdefault("MPLBACKEND", "Agg")

import torch  # noqa: E402

# python -I leaves this folder off sys.path
from helpers.labcontract import method_of, module_at  # noqa: E402

wire = module_at("wire", os.path.join(os.path.dirname(os.path.abspath(__file__)), "wire.py"))

# bound here, before any student code runs: a submission that rebinds helpers.memory.saved_in_graph
# (a plain attribute assignment, which reach.py does not flag) does not change what these names call
from helpers.labcheck import _is_todo_error as IS_STUB  # noqa: E402  (the self-check's "· not implemented yet")
from helpers.labcontract import changed_tensor as CHANGED_TENSOR  # noqa: E402
from helpers.labcontract import run_probe as RUN_PROBE  # noqa: E402
from helpers.labcontract import traced as TRACED  # noqa: E402
from helpers.memory import saved_in_graph  # noqa: E402

# a probe that raised because the answer is still the stub (a `...` in it): said as such, not as an error
STUB_REPLY = {"result": None, "over": False, "stub": True, "changed": []}

AUTOGRAD = "autograd"


def _codes(module) -> frozenset:
    """Every code object of a module's functions, nested ones included (taken before student code runs)."""
    out, todo = set(), [v.__code__ for v in vars(module).values() if hasattr(v, "__code__")]
    while todo:
        code = todo.pop()
        if code not in out:
            out.add(code)
            todo += [c for c in code.co_consts if isinstance(c, type(code))]
    return frozenset(out)


# a probe's own backward pass (helpers.labcontract: backward_through, traced, ...) is the grader's: the
# engine is entered from one of these, with nothing but torch in between (a student's function the
# probe called is a frame of its own, so its autograd call is not the probe's)
PROBE_CODES = _codes(sys.modules["helpers.labcontract"])
TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


# where the grader's own frames come from: a probe the grader called has only these beneath it, one a
# student's answer called has the answer's frame (red team 5: an answer calling backward_through got
# autograd's gradients in every by-hand exercise)
TRUSTED_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (torch, os, sys.modules["helpers.labcontract"])
) + (os.path.dirname(os.path.abspath(__file__)) + os.sep,)  # the last: the grader's folder (traced's too)


# this module's own frame: what lies beneath it started the worker (the zygote's frames, when forked in)
START = sys._getframe(0)


def _from_probe() -> bool:
    f = sys._getframe(2)  # the caller of run_backward's caller
    while f is not None and f.f_code.co_filename.startswith(TORCH_DIR):
        f = f.f_back
    if f is None or f.f_code not in PROBE_CODES:
        return False
    while f is not None and f is not START:  # and the probe was the grader's call, not the answer's
        if not f.f_code.co_filename.startswith(TRUSTED_DIRS):
            return False
        f = f.f_back
    # a stack that ends before the worker's start is another thread's: a probe an answer started there
    # (red team s10 laundered autograd through check_contract in a thread: 17/17 on lab 10)
    return f is START


STATE = {"exercise": None, "forbidden": {}, "violations": {}, "ours": False, "bound": {}}


class ByHandError(RuntimeError):
    """Raised inside a student's function that used what its exercise forbids."""


def _violate(what: str):
    ex = STATE["exercise"]
    STATE["violations"].setdefault(ex, what)
    raise ByHandError(f"{what} is not allowed in {ex}, which asks for the gradient by hand")


def _forbidden(what: str) -> bool:
    return STATE["exercise"] is not None and what in STATE["forbidden"].get(STATE["exercise"], ())


def _guard(what: str, fn):
    def guarded(*args, **kwargs):
        if _forbidden(what):
            _violate(what)
        return fn(*args, **kwargs)

    guarded.__name__, guarded.__doc__ = getattr(fn, "__name__", what), getattr(fn, "__doc__", None)
    return guarded


class _Engine:
    """autograd's engine behind a guard: every gradient torch computes passes through run_backward."""

    def __init__(self, engine):
        run = engine.run_backward

        def run_backward(*args, **kwargs):
            if STATE["ours"]:  # the harness asked for this backward (a Function's test)
                STATE["ours"] = False
            elif _forbidden(AUTOGRAD) and not _from_probe():
                _violate(AUTOGRAD)
            return run(*args, **kwargs)

        self.run_backward = run_backward
        self.queue_callback = engine.queue_callback
        self.is_checkpoint_valid = engine.is_checkpoint_valid


# what computes a gradient without autograd's engine (whose guard sees only backward passes):
# forward-mode AD, the functional API (its forward-mode strategy), functorch's transforms; guarded
# where they are defined, and every other name they are bound to (torch.func.jacfwd) with them
NO_ENGINE = (
    ("torch.autograd.forward_ad", ("make_dual", "unpack_dual")),
    ("torch", ("_make_dual", "_unpack_dual")),  # their C twins (red team 5, under a forward_ad.dual_level)
    ("torch.autograd.functional", ("jacobian", "hessian", "jvp", "vjp", "hvp", "vhp")),
    ("torch._functorch.eager_transforms", ("jacfwd", "jacrev", "jvp", "vjp", "hessian", "linearize")),
    ("torch._functorch.apis", ("grad", "grad_and_value")),
    ("torch.func", ("grad", "grad_and_value", "vjp", "jvp", "jacrev", "jacfwd", "hessian", "linearize")),
)
# fused kernels a forbidden function is one name of (`torch.ops.aten._scaled_dot_product_attention_math`)
KERNELS = {"torch.nn.functional.scaled_dot_product_attention": "scaled_dot_product"}


def _guard_in(module: str, attr: str, what: str, guarded: dict) -> None:
    """Put ``module.attr`` behind the guard for ``what`` (``guarded``: id of the original -> its guard)."""

    try:
        mod = importlib.import_module(module)
    except ImportError:  # 'torch.nn.Module.register_full_backward_hook': an attribute of a class
        parent, _, name = module.rpartition(".")
        try:
            mod = getattr(importlib.import_module(parent), name)
        except (ImportError, AttributeError, ValueError):
            return
    fn = getattr(mod, attr, None)
    if fn is None:
        return
    if id(fn) not in guarded:
        guarded[id(fn)] = _guard(what, fn)
    setattr(mod, attr, guarded[id(fn)])


def _guard_kernels(what: str, word: str) -> None:
    """The aten operators behind a forbidden function, guarded under its name."""
    # the first op on the meta device (a case's device="meta") imports torch's meta registrations, which
    # read `aten.<op>.default` of every operator: done here, while the operators are still torch's own
    torch.ones(1, 1, device="meta").tril()
    aten = torch.ops.aten
    # dir(aten) lists only the operators already looked up: ask the dispatcher for all of them
    names = {
        n.split("::", 1)[1].split(".")[0]
        for n in torch._C._dispatch_get_all_op_names()
        if n.startswith("aten::")
    }
    for name in sorted(n for n in names if word in n and "backward" not in n):
        try:
            plain = getattr(aten, name)
            setattr(aten, name, _guard(what, plain))
        except (AttributeError, RuntimeError, TypeError):
            pass


def _guard_aliases(guarded: dict) -> None:
    """Every other name a guarded function is bound to in torch and helpers (`from x import f` made before)."""
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "torch" or name.startswith(("torch.", "helpers"))):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:
            continue
        for k, v in items:
            g = guarded.get(id(v))
            if g is not None and v is not g:
                try:
                    setattr(mod, k, g)
                except (AttributeError, TypeError):
                    pass


def _no_thread(start):
    """A by-hand exercise's call may start no thread: the work rules' trace and this module's frame walk see
    their own thread only (red team s10: finite differences in a thread, 10/10 on lab 4)."""

    def start_new_thread(*args, **kwargs):
        if STATE["exercise"] is not None and STATE["forbidden"].get(STATE["exercise"]):
            _violate(wire.THREAD)
        return start(*args, **kwargs)

    return start_new_thread


def install_guards(forbidden: dict) -> None:
    """Guard autograd and the named reference functions ('helpers.cat_mlp.backward') before student code runs."""
    import _thread
    import threading

    import torch.autograd.variable as variable

    STATE["forbidden"] = {ex: set(names) for ex, names in forbidden.items()}
    # every Python thread starts here (threading.Thread.start calls threading._start_new_thread)
    _thread.start_new_thread = threading._start_new_thread = _no_thread(_thread.start_new_thread)
    variable.Variable._execution_engine = _Engine(variable.Variable._execution_engine)
    # a second, unguarded engine (`torch._C._ImperativeEngine()`) takes `_C`: reach.py refuses it
    guarded: dict = {}
    for module, names in NO_ENGINE:
        for name in names:
            _guard_in(module, name, AUTOGRAD, guarded)
    for what in sorted({n for names in forbidden.values() for n in names if n != AUTOGRAD}):
        module, _, attr = what.rpartition(".")
        _guard_in(module, attr, what, guarded)
        if what in KERNELS:
            _guard_kernels(what, KERNELS[what])
    _guard_aliases(guarded)


class CellTimeout(BaseException):
    """A cell ran past its time limit: it stops there, and the notebook goes on with the next cell."""


def _first_line(src: str) -> str:
    return next((ln.strip() for ln in src.splitlines() if ln.strip()), "")[:60]


def reap() -> None:
    """End every process but this one in the sandbox's PID namespace (its init, pid 1, is spared by kill)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:  # nothing else running
        pass


def run_notebook(cells: list, cell_timeout: float | None = None, own_namespace: bool = False) -> list[dict]:
    """Execute the code cells ([number, source] each, as the harness read and checked them) in order,
    in one namespace; [{cell, ename, evalue}] for each that raised.

    The cells come from the harness, never from the notebook's file: a notebook that rewrites its
    file runs, after a restart, the same code as before, the code the harness read.

    Each cell may run ``cell_timeout`` seconds (wall clock): then a ``CellTimeout`` is raised in it
    (again every second, should it catch it), it is reported, and the next cell runs, so one stray
    loop costs that cell, not the notebook. Before each cell the harness is told which one runs,
    so a loop that cannot be stopped is still named when the whole notebook times out.

    With ``own_namespace`` (the sandbox: this process is alone in a PID namespace but for its init),
    every process a cell started ends with the cell: a daemon or a fork bomb costs its own cell,
    not the grading's time or the class's cores.
    """
    from IPython.core.interactiveshell import InteractiveShell

    main, real_exit = os.getpid(), os._exit

    def no_exit(*args):
        if os.getpid() != main:  # a forked child exits for real (it must never read the protocol)
            real_exit(0)
        raise SystemExit("os._exit")

    os._exit = os.abort = no_exit  # a notebook that exits mid-way ends that cell, not its grading
    shell = InteractiveShell.instance()
    shell.showtraceback = lambda *a, **k: None
    # a line that starts with a magic's name (`time x = f()`) runs as that magic only with automagic on,
    # which IPython's transformer, and so the grader's reader, does not see: off, it is the SyntaxError the
    # reader reads (red team s8 ran `time fetch = getattr` unread)
    shell.automagic = False
    errors = []
    running = [False]

    def on_alarm(signum, frame):
        if running[0]:
            raise CellTimeout()

    before = signal.signal(signal.SIGALRM, on_alarm) if cell_timeout else None
    for number, src in cells:
        if PEER is not None:
            PEER.request({"op": "progress"}, {"cell": number}, True)
        try:
            running[0] = True
            if cell_timeout:
                signal.setitimer(signal.ITIMER_REAL, cell_timeout, 1.0)
            result = shell.run_cell(src, store_history=False, silent=True)
            exc = result.error_before_exec or result.error_in_exec
        except BaseException as e:  # noqa: BLE001 - SystemExit and friends end one cell, not grading
            exc = e
        finally:
            running[0] = False
            if cell_timeout:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if own_namespace and os.getpid() == main:
                reap()
        if isinstance(exc, CellTimeout):
            errors.append(
                {
                    "cell": number,
                    "ename": "TimeoutError",
                    "evalue": f"still running after {cell_timeout:g} s, stopped there (the cells after it ran): "
                    f"`{_first_line(src)}`",
                }
            )
        elif exc is not None:
            text = f"{exc.msg} (line {exc.lineno})" if isinstance(exc, SyntaxError) else str(exc)
            errors.append(
                {
                    "cell": number,
                    "ename": type(exc).__name__,
                    "evalue": (text.strip().splitlines() or [""])[0][:160],
                }
            )
    if cell_timeout:
        signal.signal(signal.SIGALRM, before)
    STATE["ns"] = shell.user_ns
    return errors


def _snapshot(t: torch.Tensor):
    """(value, version counter, .grad's value, .grad's id): what ``_changed`` and ``on_call`` compare."""
    return (t.detach().clone(), t._version, None if t.grad is None else t.grad.detach().clone(), id(t.grad))


def _changed(t, snap) -> bool:
    value, version, grad, grad_id = snap
    now = t.grad
    return (
        CHANGED_TENSOR(t, value, version)
        or id(now) != grad_id
        or (now is not None and (now.shape != grad.shape or not torch.equal(now, grad)))
    )


GRAPHS: dict[int, tuple] = {}


def on_call(fn, args, kwargs, opts):
    """Call a student's function for the harness; report what it changed in its arguments."""
    ins = wire.tensors((args, kwargs))
    snaps = [_snapshot(t) for t in ins]
    STATE["exercise"] = opts.get("exercise")
    try:
        if opts.get("track"):
            with torch.enable_grad():
                result = fn(*args, **kwargs)
            outs = wire.tensors(result)
            GRAPHS[len(GRAPHS) + 1] = ([t for t in ins if t.requires_grad], outs, STATE["exercise"])
            graph = len(GRAPHS)
        else:
            result, graph = fn(*args, **kwargs), None
    finally:
        STATE["exercise"] = None
    saved = saved_tensors(ins, wire.tensors(result)) if graph else [[], []]
    # [index, value, .grad, whether .grad is still the same tensor object (edited in place)]
    changed = [
        [i, t.detach(), t.grad, id(t.grad) == s[3]]
        for i, (t, s) in enumerate(zip(ins, snaps))
        if _changed(t, s)
    ]
    return {"result": result, "changed": changed, "graph": graph, "saved": saved}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.storage_offset() == b.storage_offset()
        and a.dtype == b.dtype
    )


def saved_tensors(ins: list, outs: list) -> list:
    """What the graph a call built keeps for backward, as the harness can rebuild it.

    Each saved tensor is one of the call's inputs ({"input": i}), outputs ({"output": j}), or a
    view of a storage sent whole ({"storage": k, offset, shape, stride, dtype}), so the harness's
    saved-tensor hooks (``helpers.memory.SavedTensors``) count storages as they would here; one a
    custom Function's ctx holds as an attribute is marked "held", and the harness holds it on its
    node's ctx in turn (``helpers.memory.ctx_attributes`` sees it on both sides).
    """
    storages, keys, entries = [], {}, []
    for _node, name, t in saved_in_graph(outs):
        i = next((i for i, x in enumerate(ins) if _same(t, x)), None)
        j = next((j for j, x in enumerate(outs) if _same(t, x)), None)
        held = {"held": True} if name.startswith("ctx.") else {}  # on ctx as an attribute, not saved
        if i is not None:
            entries.append({"input": i, **held})
        elif j is not None:
            entries.append({"output": j, **held})
        else:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in keys:
                keys[ptr] = len(storages)
                storages.append(torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).clone())
            entries.append(
                {
                    "storage": keys[ptr],
                    "offset": t.storage_offset(),
                    "shape": list(t.shape),
                    "stride": list(t.stride()),
                    "dtype": t.dtype,
                    **held,
                }
            )
    return [entries, storages]


def synced(work):
    """A handler that runs with the harness's random stream and hands the stream back after."""

    def handler(msg, value):
        payload, rng = value
        torch.set_rng_state(rng)
        try:
            result = work(msg, payload)
        except (EOFError, BrokenPipeError, KeyboardInterrupt):
            raise
        except BaseException as e:  # noqa: BLE001 - the call raised: its error, and the state it left, go back
            if isinstance(e, wire.RemoteError):  # raised further along a nested call: the original
                result = {"raised": [e.kind, e.message]}
            else:
                result = {"raised": [type(e).__name__, (str(e).splitlines() or [""])[0][:300]]}
        result["rng"] = torch.get_rng_state()
        result["mutated"] = PEER.mutated()
        result["modules"] = PEER.module_echo()
        return result

    return handler


def harness_call(msg, value) -> dict:
    fn = PEER.objects.get(msg.get("ref"))
    if fn is None:
        raise wire.WireError("unknown handle")
    args, kwargs = value
    return on_call(fn, args, kwargs, msg.get("opts") or {})


def backward(msg, value) -> dict:
    """Gradients of a tracked call's outputs with respect to its inputs, for the harness's autograd, and
    the gradients it was given that the student's backward wrote into ([index, value after]), so that
    the harness's copies change as the caller's did here."""
    given = [g.clone() if isinstance(g, torch.Tensor) else None for g in value]
    grads = _backward(msg, value)
    written = [
        [i, g.detach()]
        for i, (g, b) in enumerate(zip(value, given))
        if isinstance(g, torch.Tensor) and not torch.equal(g, b)
    ]
    return {"grads": grads, "written": written}


def _backward(msg, value):
    ins, outs, exercise = GRAPHS[int(msg["graph"])]
    pairs = [(o, g) for o, g in zip(outs, value) if g is not None and o.requires_grad]
    if not pairs or not ins:
        return [None] * len(ins)
    STATE["exercise"], STATE["ours"] = exercise, True
    try:
        grads = torch.autograd.grad(
            [o for o, _ in pairs], ins, [g for _, g in pairs], allow_unused=True, retain_graph=True
        )
    finally:
        STATE["exercise"], STATE["ours"] = None, False
    return list(grads)


def _memory_now() -> tuple[int, int]:
    """(VmSize, VmData) of this process in bytes: what RLIMIT_AS and RLIMIT_DATA limit."""
    got = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmSize:", "VmData:")):
                got[line.split(":")[0]] = int(line.split()[1]) * 1024
    return got["VmSize"], got["VmData"]


def _limit_growth(budget: int) -> None:
    """Let this process's memory grow by ``budget`` bytes at most, counted by the kernel: a hard RLIMIT_AS
    (new mappings) and RLIMIT_DATA (also a thread arena's reserved space made writable), after holding
    every free block of 256 KiB or more that glibc's heaps already have (a block served from one would not
    grow anything): with both limits at the present size, every malloc that succeeds is such a block."""
    hard_as = resource.getrlimit(resource.RLIMIT_AS)[1]
    hard_data = resource.getrlimit(resource.RLIMIT_DATA)[1]
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.mallopt(-3, 64 << 10)  # M_MMAP_THRESHOLD, fixed: no dynamic rise after a free
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        libc = None
    size_now, data_now = _memory_now()  # nothing below grows either: the blocks held were free already
    if libc is not None:
        resource.setrlimit(resource.RLIMIT_AS, (size_now, hard_as))
        resource.setrlimit(resource.RLIMIT_DATA, (data_now, hard_data))
        try:
            for size in (64 << 20, 16 << 20, 4 << 20, 1 << 20, 256 << 10):
                misses = 0
                for _ in range(1 << 14):  # glibc tries one other arena per failed call: misses in a row
                    if libc.malloc(size):
                        misses = 0  # held until the child exits
                    else:
                        misses += 1
                        if misses == 4:
                            break
        except (MemoryError, OSError):  # Python itself found no room: draining stops there
            pass
        # measured again: holding a thread arena's free space can raise VmData past the limit set above
        # (its reserved pages made writable), and a limit below the present size leaves no budget at all
        size_now, data_now = (max(a, b) for a, b in zip(_memory_now(), (size_now, data_now)))
    resource.setrlimit(resource.RLIMIT_AS, (size_now + budget, size_now + budget))
    resource.setrlimit(resource.RLIMIT_DATA, (data_now + budget, data_now + budget))


def _over_memory(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or "can't allocate memory" in str(e) or "out of memory" in str(e)


def _values_changed(ins: list, before: list) -> list[int]:
    """Which of a call's tensor arguments it changed (shape, dtype or values, or wrote in place), by index."""
    return [
        i for i, (t, (value, version)) in enumerate(zip(ins, before)) if CHANGED_TENSOR(t, value, version)
    ]


def capped(msg, value):
    """One call (through a probe of helpers.labcontract) in a forked child whose memory may grow by at
    most ``budget`` bytes: the kernel enforces the limits (hard RLIMIT_AS and RLIMIT_DATA, which the child
    cannot raise), so "never forms an out × in matrix" is measured outside any code the student could answer.
    After :func:`_limit_growth`, a tensor larger than 256 KiB is always new memory, which the limits
    count, whatever free space the notebook left in glibc's heaps.
    The child sends the reply itself: {"result": outputs, "over": False}, or {"result": None, "over":
    True} when an allocation failed; the parent only waits. ``budget`` None: no limit and no child, the
    call runs in this process and the reply is returned. With ``trace``
    the reply also holds what the call computed ("trace": helpers.labcontract.traced's record), which
    the stated rules of the exercise are judged on."""
    fn, args, kwargs, inner, options, budget, trace = value
    exercise = (msg.get("opts") or {}).get("exercise")
    ins = wire.tensors((args, kwargs))
    before = [
        (t.detach().clone(), t._version) for t in ins
    ]  # the harness sent copies: what changed is said, as on_call does
    if not budget:  # no memory cap to hold: no child, the call runs here
        STATE["exercise"] = exercise  # the probe's own backward pass is told apart by its frame
        try:
            if trace:
                out, seen = TRACED(inner, fn, args, kwargs, options, TRUSTED_DIRS[-1:])
                reply = {"result": out, "over": False, "trace": seen}
            else:
                reply = {"result": RUN_PROBE(inner, fn, args, kwargs, options), "over": False}
            reply["changed"] = _values_changed(ins, before)
        except Exception as e:
            if not IS_STUB(e):
                raise
            reply = STUB_REPLY
        finally:
            STATE["exercise"], STATE["ours"] = None, False
        if not wire.values_only(reply):
            if wire.stub_value(reply["result"]):  # `...` cannot cross: the answer is still the stub
                return STUB_REPLY
            raise TypeError("returned an object that is not a value")
        return reply
    said, tell = os.pipe()  # the child's by-hand violations, back to this process's STATE
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        os.close(said)
        try:
            torch.set_num_threads(1)  # no new thread (and its malloc arena) to count against the budget
            STATE["exercise"] = exercise  # the probe's own backward pass is told apart by its frame
            if budget:
                _limit_growth(int(budget))
            try:
                if trace:  # the stated rules' measure, taken where the call runs
                    out, seen = TRACED(inner, fn, args, kwargs, options, TRUSTED_DIRS[-1:])
                    reply = {"result": out, "over": False, "trace": seen}
                else:
                    reply = {"result": RUN_PROBE(inner, fn, args, kwargs, options), "over": False}
                reply["changed"] = _values_changed(ins, before)
                if not wire.values_only(reply):  # a handle made here would die with this process
                    if not wire.stub_value(reply["result"]):
                        raise TypeError("returned an object that is not a value")
                    reply = STUB_REPLY
                PEER.send({"kind": "reply"}, reply, True)
            except BaseException as e:  # noqa: BLE001 - the student's error is the answer
                if _over_memory(e):  # with what the call computed before (labcontract.traced), if it fits
                    partial = getattr(e, "partial_trace", None) if trace else None
                    try:
                        PEER.send({"kind": "reply"}, {"result": None, "over": True, "trace": partial}, True)
                    except MemoryError:
                        PEER.send({"kind": "reply"}, {"result": None, "over": True}, True)
                elif IS_STUB(e):
                    PEER.send({"kind": "reply"}, STUB_REPLY, True)
                else:
                    PEER.send({"kind": "reply", "error": type(e).__name__, "message": str(e)[:300]})
            code = 0
        finally:
            try:  # at most a pipe's buffer, written before exit: the parent reads after waitpid
                os.write(tell, json.dumps(STATE["violations"]).encode()[:4096])
            finally:
                _EXIT(code)
    os.close(tell)
    _, status = os.waitpid(pid, 0)
    try:
        for ex, what in json.loads(os.read(said, 4096) or b"{}").items():
            STATE["violations"].setdefault(ex, what)
    except ValueError:  # cut short: the reply itself says what happened
        pass
    finally:
        os.close(said)
    if os.waitstatus_to_exitcode(status) == 0:
        return wire.REPLIED
    raise MemoryError("the call ended without an answer (killed at its memory budget?)")


def bind(msg, value) -> None:
    """Names of the notebook bound to the harness's handles (its references of earlier exercises) until the
    next bind; bind {} puts the student's own back. A hidden test grades an exercise with the references of
    the earlier ones it calls, so a mistake there costs points once."""
    ns = STATE["ns"]
    for name, old in STATE["bound"].items():
        if old is _ABSENT:
            ns.pop(name, None)
        else:
            ns[name] = old
    STATE["bound"] = {}
    for name, handle in dict(value or {}).items():
        if isinstance(name, str) and isinstance(handle, wire.Remote):
            STATE["bound"][name] = ns.get(name, _ABSENT)
            ns[name] = handle


_ABSENT = object()


def start(msg, value) -> dict:
    """Guards, then the student's notebook."""
    install_guards(value.get("forbidden", {}))
    limit = value.get("cell_timeout")
    cells = [
        (c[0], c[1])
        for c in value.get("cells") or []
        if isinstance(c, list) and len(c) == 2 and isinstance(c[0], int) and isinstance(c[1], str)
    ]
    timeout = float(limit) if isinstance(limit, (int, float)) else None
    return {"errors": run_notebook(cells, timeout, own_namespace=value.get("reap") is True and _alone())}


def _alone() -> bool:
    """True in a PID namespace of our own: we are pid 2 (never so on a host), under bubblewrap's init
    (parent 1) or forked in by the zygote (parent 0: outside the namespace), its holder being pid 1."""
    return os.getpid() == 2 and os.getppid() in (0, 1)


PEER: wire.Peer = None  # set by main()


def main() -> None:
    global PEER
    # a Function's apply, for the harness, is its own_apply: graded by its own backward
    peer = PEER = wire.Peer(_IN, _OUT, serve_dunder=True, on_call=on_call, on_getattr=method_of)
    peer.accept_code = True  # the harness's test functions (portable) are compiled here
    peer.handlers = {
        "call": synced(harness_call),
        "start": start,
        "names": lambda msg, v: sorted(k for k in STATE["ns"] if not k.startswith("_")),
        "get": lambda msg, v: STATE["ns"][v],
        "backward": synced(backward),
        "capped": capped,
        "bind": bind,
        "violations": lambda msg, v: dict(STATE["violations"]),
    }
    while True:
        try:
            msg, blobs = peer.receive()
        except EOFError:
            return
        peer.serve(msg, blobs)


if __name__ == "__main__":
    main()
