"""Contract self-checks for the labs (chapter 1 on, like labcheck): a function against recorded reference outputs.

    check_contract("lab02", "ex2", dense_backward)

prints one line, naming the failing *case class* in words before any number:

* ``✓ Exercise 2 · dense_backward: matches the recorded reference in all 8 case classes (X is 1-D (in,), …)``
* ``✗ Exercise 2 · dense_backward fails when X is 1-D (in,) — works when X is 2-D (R, in); …: grad_W has
  shape (4,), expected (4, 3)`` (the part after the colon is ``helpers.labcheck``'s diagnosis of
  the first failing case: a shape, a dtype, a factor, the transpose, a known mistake, …)
* ``· Exercise 2 · dense_backward: not implemented yet``

The cases and the reference outputs are values (``helpers/data/labNN_name.contract.json``),
recorded at release from the instructor's contract module (``labs/source/contracts/``, not
shipped): this module holds no reference solution, only the format's reader, the comparison
rule (one rule, :func:`disagreement`, for the self-check and the hidden tests) and the
public scalar functions that exercises on functions are called with (:data:`FUNCTIONS`).
:func:`hidden_check` is the hidden tests' entry: it loads the instructor's module from the
checkout and fails outside it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import importlib.util
import inspect
import json
import os
import re
import sys
import threading
from pathlib import Path

import torch

from helpers.checks import close
from helpers.labcheck import CheckResult, Stub, _is_todo_error, error_text, evaluate, on_device, own_codes

__all__ = [
    "check_contract",
    "evaluate_contract",
    "disagreement",
    "FUNCTIONS",
    "encode",
    "decode",
    "hidden_check",
    "Made",
    "PROBES",
    "ByHand",
    "by_hand",
    "probe",
    "run_probe",
]

DATA = Path(__file__).resolve().parent / "data"
TODO = "not implemented yet"


# ------------------------------------------------------------ public test functions
# Functions handed to an exercise that takes a function (lab 2's gradient check): data by name.


def x_sin_x_plus_prod(x):
    """Σ x·sin(x) + Π x: every entry of the gradient depends on the others."""
    return (x * x.sin()).sum() + x.prod()


def sum_of_cubes(x):
    """Σ x³: its central difference along u is exactly uᵀ∇f + ε² Σ u³."""
    return (x**3).sum()


def log_sum_exp(x):
    """log Σ exp(x) over every entry."""
    return x.reshape(-1).logsumexp(0)


FUNCTIONS = {f.__name__: f for f in (x_sin_x_plus_prod, sum_of_cubes, log_sum_exp)}


# ------------------------------------------------------------------------ probes
# How a case calls an answer that is not "a function returning its outputs": an autograd.Function
# tested through autograd, a step that updates its arguments in place. A probe is course code
# (it runs in the learner's process for the self-check and in the grader's harness for the hidden
# tests, where the answer is a handle on the learner's object); the outputs it returns are judged.

PROBES: dict = {}


def probe(fn):
    """Register ``fn(answer, args, kwargs, **options) -> outputs`` as a probe a contract may name."""
    PROBES[fn.__name__] = fn
    return fn


def _given(value):
    """The answer's return value; NotImplementedError for a stub's None or `...` (the check says "not yet")."""
    if value is None or value is Ellipsis:
        raise Stub("returned None")
    return value


def own_apply(cls):
    """``cls.apply``, checked: every output autograd tracks has ``cls``'s own node as its grad_fn, so
    the gradient judged is what ``cls.backward`` computes, never autograd's derivative of whatever
    ``apply`` became (a Function graded as a Function)."""
    plain = cls.apply

    def apply(*args, **kwargs):
        out = plain(*args, **kwargs)
        for t in out if isinstance(out, (tuple, list)) else (out,):
            node = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
            mine = getattr(node, "_forward_cls", None)
            if node is not None and not (isinstance(mine, type) and issubclass(mine, cls)):
                raise TypeError(
                    f"{cls.__name__}.apply returned a tensor whose gradient autograd would take through "
                    f"{type(node).__name__}, not through {cls.__name__}.backward: use the Function's own apply"
                )
        return out

    return apply


def method_of(answer, method: str | None):
    """``answer``'s ``method`` (an autograd.Function's ``apply`` through ``own_apply``), or ``answer`` itself."""
    if not method:
        return answer
    if method == "apply" and isinstance(answer, type) and issubclass(answer, torch.autograd.Function):
        return own_apply(answer)
    return getattr(answer, method)


@probe
def returns_and_changes(answer, args, kwargs, changed=(), result=True):
    """(result, args[i] after the call for i in changed): a step that updates its arguments in place."""
    out = answer(*args, **kwargs)
    after = tuple(args[i] for i in changed)
    if not result:
        return after[0] if len(after) == 1 else after
    return (_given(out), *after) if after else _given(out)


@probe
def backward_through(answer, args, kwargs, wrt=(0,), grad_output=None, method="apply"):
    """(outputs…, ∂L/∂args[i] for i in wrt) with L = Σ ⟨grad_output, output⟩: an autograd.Function
    (``answer.apply``, or ``method=None`` for a function) judged by what autograd gets from it."""
    f = method_of(answer, method)
    args = list(args)
    for i in wrt:
        args[i] = args[i].detach().requires_grad_()  # the caller's storage: a forward writing into it shows
    out = _given(f(*args, **kwargs))
    outs = out if isinstance(out, tuple) else (out,)
    grads = grad_output if isinstance(grad_output, tuple) else (grad_output,)
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return (*[o.detach() if isinstance(o, torch.Tensor) else o for o in outs], *(args[i].grad for i in wrt))


def run_probe(name: str | None, answer, args, kwargs, options: dict | None = None):
    """The outputs of one case: ``answer(*args, **kwargs)``, or through the named probe."""
    if not name:
        return answer(*args, **kwargs)
    return PROBES[name](answer, args, kwargs, **(options or {}))


# ------------------------------------------------------------ memory: what a call must not form

_FACTORY = re.compile(r"new_\w+|\w+_like")  # x.new_full(...), torch.zeros_like(x): x's values are not read
_PRODUCT_OPS = ("mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_addmm_activation")
# ops that evaluate a nonlinearity (a power with a fractional exponent too): a difference along one direction
# runs the forward's again, where a derived backward of softmax reuses P (rule "nonlinear")
_NONLINEAR_OPS = frozenset(
    "exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sigmoid tanh erf erfc erfinv sin cos tan sinh cosh "
    "asin acos atan atan2 logit xlogy _softmax _log_softmax softmax log_softmax logsumexp special_erfcx".split()
)


def _nonlinear(name: str, a: tuple) -> bool:
    """Whether the op ``name`` (called on ``a``) evaluates a nonlinearity: an op of ``_NONLINEAR_OPS`` (or its
    in-place form), or a power whose exponent is not a whole number (x ** 0.5, x ** -1.5; a tensor of them)."""
    if name.endswith("_") and not name.startswith("_"):
        name = name[:-1]
    if name == "pow":
        e = a[1] if len(a) > 1 else None
        return not (isinstance(e, (int, float)) and float(e).is_integer())
    return name in _NONLINEAR_OPS


def _boundary(answer):
    """The grader's peer when ``answer`` is a handle across its boundary (tools/grader/wire.py), else None."""
    if type(answer).__name__ != "Remote":
        return None
    try:
        peer = object.__getattribute__(answer, "_peer")
    except AttributeError:
        return None
    return peer if callable(getattr(type(peer), "capped", None)) else None


# what a broken work rule costs, said where the rule is (dropped where the learner's earlier answer broke it
# and the hidden tests run the course's in its place)
GRADED = "0 points for the exercise when graded"
OVER = "over its {} MiB memory budget"  # a capped call's output where it needed more (failed_part reads it)


def _over(cap: int) -> str:
    return OVER.format(f"{cap / 2**20:g}")


def _multiply_adds(name: str, a: tuple, out: torch.Tensor) -> int:
    """The multiply–adds of one matrix product: every output entry sums k products (k: the shared dim)."""
    if name in ("dot", "vdot"):
        return a[0].numel()
    if name == "addbmm":  # Σ over the batch of (m, k) @ (k, n)
        return a[1].shape[0] * out.numel() * a[1].shape[-1]
    first = a[1] if name in ("addmm", "baddbmm", "addmv", "_addmm_activation") else a[0]
    return out.numel() * first.shape[-1]


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# files whose reading of a tensor's values is not the answer's: torch's own, and this module's (the probes);
# not the standard library's (red team 6: functools.singledispatch(torch.Tensor.tolist)(t) read from there)
_NOT_THE_ANSWER = (_TORCH_DIR, __file__)


def _the_answer_reads(depth: int, not_the_answer: tuple) -> bool:
    """Whether the code that asked for a tensor's values ``depth`` frames up (torch's own frames skipped:
    ``__array__``, ``__format__``, the printer) is the answer's: not in a file under ``not_the_answer``."""
    f = sys._getframe(depth + 1)
    while f is not None and f.f_code.co_filename.startswith(_TORCH_DIR):
        f = f.f_back
    return f is not None and not f.f_code.co_filename.startswith(not_the_answer)


# Reading values out of tensors into Python or NumPy: work done there is not a tensor op, so no rule sees
# it (finite differences in NumPy wrote no tensor entries). ``.item()`` and float() go through the
# dispatcher (_local_scalar_dense, counted there); ``_READS`` do not, and count through wrappers put on
# torch.Tensor once, when this module is imported: before any answer is defined, so a reference to the
# method an answer keeps (``_vals = torch.Tensor.tolist``, red team 6) is the counting one. A bool
# tensor's values are bits a loop branches on (``if h[i] > 0``): counted apart ("branches"), since
# comparisons can read a float bit by bit.
# ``apply_``, ``map_`` and ``map2_`` hand every entry to a Python function, with no op the dispatcher sees
# (red team 10 read whole tensors so, for differences in plain Python)
_READS = ("numpy", "tolist", "__repr__", "apply_", "map_", "map2_")
_READING: list = []  # the trace modes running (``traced``): one may run inside another's probe


def _read(mode, t: torch.Tensor, n: int, depth: int) -> None:
    """Count ``n`` values of ``t`` read out by the answer, unless they are integers or bits made from the
    integer arguments alone (``mode.free``: class indices, red team 8's honest ``int(target[r])``, the rows
    a mask of them keeps): given data, no derivative. The storage decides, not the view's dtype: red team
    9 read every float argument free as ``x.view(torch.int64)``, bits and all."""
    if not t.is_floating_point() and t.untyped_storage().data_ptr() in mode.free:
        return
    if _the_answer_reads(depth + 1, mode.not_the_answer):
        mode.seen["branches" if t.dtype == torch.bool else "exits"] += n


def _counting_reads() -> None:
    """Wraps torch.Tensor's ``_READS`` (once per process) to count the entries they read while a trace runs."""
    for name in _READS:
        plain = getattr(torch.Tensor, name)
        if getattr(plain, "_counts_reads", False):
            continue

        def read(self, *a, _plain=plain, **kw):
            for mode in _READING:
                for t in (self, *(x for x in a if isinstance(x, torch.Tensor))):  # map_'s other tensors too
                    _read(mode, t, t.numel(), 1)
            return _plain(self, *a, **kw)

        read._counts_reads = True
        read.__name__ = read.__qualname__ = name
        read.__doc__ = plain.__doc__
        setattr(torch.Tensor, name, read)


_counting_reads()


def _hands_out_a_value(func, out, ins: list) -> bool:
    """Whether an op hands the caller a number its inputs' values decide, by what it returns rather than by
    name: a Python scalar (``torch.equal``, ``allclose``: a bit each, red team 12), or a tensor whose shape
    the values decide (torch's ``dynamic_output_shape`` tag: ``nonzero``, ``masked_select``, ``x[mask]``,
    ``repeat_interleave``: its length). Indexing by integer tensors has the index's shape: nothing read."""
    if isinstance(out, (bool, int, float)):
        return True
    if torch.Tag.dynamic_output_shape not in func.tags:
        return False
    return func.overloadpacket.__name__ != "index" or any(t.dtype in (torch.bool, torch.uint8) for t in ins)


def _deciding(ins: list) -> torch.Tensor:
    """The input whose values decide such a number: a mask (its bits: "branches"), else integers (counts,
    classes, repeats), else the first input."""
    for kinds in ((torch.bool, torch.uint8), None):
        for t in ins:
            if (t.dtype in kinds) if kinds else not t.is_floating_point():
                return t
    return ins[0]


def _trace_mode():
    """A TorchDispatchMode that keeps what a call computes, op by op, backward too (``.seen``): the
    matrix products (last two dims, and "forward" or "backward": whether autograd's engine ran it) and
    their multiply–adds, the largest tensor the call wrote (new
    memory, or memory it did not get as an argument written in place: a buffer allocated before the
    call counts whole; views write nothing, and ``.given``, the arguments' storages, are the call's
    to change), the largest tensor an op that makes new memory read at once, and the names of the ops."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Trace(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):  # torch's documented opt-out: else the first use imports dynamo (2 s)
            return False

        def __init__(self):
            super().__init__()
            self.seen = {
                "products": [],
                "multiply_adds": 0,
                "largest": [0, []],
                "reads": [0, "", []],
                "writes": 0,
                "exits": 0,
                "branches": 0,
                "nonlinear": 0,
            }
            self.ops: set = set()
            self.given: set = set()  # data_ptr of the call's arguments' storages
            self.written: set = set()  # those of them an op wrote into
            # storages of integers and bits made from integer arguments alone (those first), no float in
            # them: an op's output joins when every tensor it read is here, and leaves when written otherwise
            self.free: set = set()
            self.not_the_answer: tuple = _NOT_THE_ANSWER  # files whose reads of values are not the answer's

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            out = func(*a, **(kw or {}))
            name, seen = func.overloadpacket.__name__, self.seen
            self.ops.add(name)
            ins = _tensors_in([*a, *(kw or {}).values()])
            if not func.is_view:  # a view writes nothing; every other op writes each entry it returns
                seen["writes"] += sum(t.numel() for t in _tensors_in(out))
                self.written |= {t.untyped_storage().data_ptr() for t in _tensors_in(out)} & self.given
                free = all(t.untyped_storage().data_ptr() in self.free for t in ins)
                for t in _tensors_in(out):  # memory reused after a free integer tensor leaves with its write
                    ptr = t.untyped_storage().data_ptr()
                    (self.free.add if free and not t.is_floating_point() else self.free.discard)(ptr)
            if _nonlinear(name, a):
                seen["nonlinear"] += sum(t.numel() for t in _tensors_in(out))
            if name == "_local_scalar_dense":  # .item(), float(t); bool(h[i] > 0) reads a bit
                _read(self, a[0], 1, 1)
            elif ins and _hands_out_a_value(func, out, ins):
                _read(self, _deciding(ins), 1, 1)
            if not isinstance(out, torch.Tensor):
                return out
            ptr, size = out.untyped_storage().data_ptr(), out.untyped_storage().nbytes()
            new = ptr not in {t.untyped_storage().data_ptr() for t in ins}
            if (new or (not func.is_view and ptr not in self.given)) and size > seen["largest"][0]:
                seen["largest"] = [size, list(out.shape)]
            if new:
                # a view reads nothing; nor does a factory that takes only its input's shape and dtype
                if not func.is_view and ins and not _FACTORY.fullmatch(name):
                    widest = max(ins, key=lambda t: t.numel())
                    if widest.numel() > seen["reads"][0]:
                        seen["reads"] = [widest.numel(), name, list(widest.shape)]
            if name in _PRODUCT_OPS:  # with where: a product in forward and one in backward read alike
                where = "forward" if torch._C._current_autograd_node() is None else "backward"
                seen["products"].append((*out.shape[-2:], where))
                seen["multiply_adds"] += _multiply_adds(name, a, out)
            return out

    return Trace()


def traced(inner, answer, args, kwargs, options, not_the_answer: tuple = ()) -> tuple:
    """(the inner probe's outputs, what the call computed: ``_trace_mode``'s record, its op names sorted, and
    "ungated": each custom Function's backward that returned a gradient for an input that needs none).
    ``not_the_answer``: more folders whose code's reads of values are the caller's own (the grader's wire
    sending a tensor to a reference), not the answer's."""
    from torch.autograd.function import BackwardCFunction

    mode, ungated, plain = _trace_mode(), [], BackwardCFunction.apply
    mine = _tensors_in([*args, *kwargs.values()])
    mine += [
        t
        for v in [*args, *kwargs.values()]
        if isinstance(v, torch.nn.Module)
        for t in v.state_dict().values()
    ]
    mode.given = {t.untyped_storage().data_ptr() for t in mine}
    mode.free = {
        t.untyped_storage().data_ptr()
        for t in mine
        if not (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool)
    }
    mode.not_the_answer = _NOT_THE_ANSWER + tuple(not_the_answer)

    def apply(node, *grads):  # the engine calls this for every custom Function's backward
        out = plain(node, *grads)
        outs = out if isinstance(out, tuple) else (out,)
        for i, (g, need) in enumerate(zip(outs, node.needs_input_grad)):
            if isinstance(g, torch.Tensor) and not need:
                ungated.append(f"{type(node).__name__.removesuffix('Backward')}'s input {i}")
        return out

    BackwardCFunction.apply = apply
    _READING.append(mode)
    try:  # backward on this thread, where the mode sees it
        with torch.autograd.set_multithreading_enabled(False), mode:
            out = _given(run_probe(inner, answer, args, kwargs, options))
    except BaseException as e:
        # what the call computed before it raised (out of memory under a cap): every measure only grows,
        # so a rule it already breaks is broken (``measured`` judges it; the grader's worker sends it back)
        with contextlib.suppress(BaseException):
            e.partial_trace = {**mode.seen, "ops": sorted(mode.ops), "ungated": list(ungated), "aliases": []}
        raise
    finally:
        BackwardCFunction.apply = plain
        _READING.pop()
    given = {t.untyped_storage().data_ptr() for t in _tensors_in([*args, *kwargs.values()])}
    outs = out if isinstance(out, tuple) else (out,)
    aliases = [
        k
        for k, o in enumerate(outs)
        if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in given
    ]
    return out, {**mode.seen, "ops": sorted(mode.ops), "ungated": ungated, "aliases": aliases}


def _watched(inner, answer, args, kwargs, options):
    """(the inner probe's outputs, the matrix products formed (last two dims, "forward" or "backward"), the
    largest new tensor in bytes), watched while the call runs, backward too."""
    out, seen = traced(inner, answer, args, kwargs, options)
    return out, seen["products"], seen["largest"][0]


# ------------------------------------------------------------ stated rules, measured
# A rule the prompt states that values cannot show ("compute g @ B once", "never build the (Nq, Nk) bias",
# "see each block once", "do not call torch.softmax"), declared once on the exercise (``rules``) and
# measured by ``traced`` on the call and on the reference's call on the same case: in the learner's
# process for the self-check, in the grader's worker for the hidden tests (``HarnessPeer.capped``).
RULES = {  # name: what is measured; a number is a factor of the reference's measure, a function of the case's
    # arguments gives the bound itself (where the reference computes it another way: full matrices)
    "multiply_adds": "the multiply–adds of every matrix product",
    "largest": "the bytes of the largest new tensor",
    "reads": "the entries of the largest tensor one op (not a view) reads at once",
    # finite differences run the forward pass once per input entry: on a large case that is the number of
    # inputs times what the derived backward writes (the work grows with the product of the sizes)
    "writes": "the tensor entries every op writes, summed (forward and backward)",
    # work done on values read out of tensors is not measured by the rules above
    "exits": "the tensor entries the answer reads out into Python or NumPy (.item(), float(), .tolist(), .numpy(), printing)",
    # a comparison read out (if h[i] > 0) is a bit: a branch per entry is derived work, 30 bits per value
    # rebuild the value (red team 6 did, to difference a forward in Python)
    "branches": "the bool entries the answer reads out (if h[i] > 0; bool(), .tolist() of a mask)",
    # a difference along one direction (the upstream gradient) is the whole vector–Jacobian product where
    # the Jacobian is symmetric (softmax), for two more evaluations of the forward's nonlinearity
    "nonlinear": "the entries ops that evaluate a nonlinearity (exp, log, sqrt, tanh, softmax, x ** 0.5) write",
    "avoids": "no op whose name holds one of the words given (forward or backward)",
    "gated": "a custom Function's backward returns None for every input that needs no gradient",
    "new": "every tensor the call returns is new memory: no argument, no view of one",
}
_AMOUNT = {
    "multiply_adds": lambda m: m["multiply_adds"],
    "largest": lambda m: m["largest"][0],
    "reads": lambda m: m["reads"][0],
    "writes": lambda m: m["writes"],
    "exits": lambda m: m.get("exits", 0),
    "branches": lambda m: m.get("branches", 0),
    "nonlinear": lambda m: m.get("nonlinear", 0),
}


# what a rule allows beyond the factor × the reference's: a few scalars read out (a count, a norm, a printed
# loss) do no work that grows with the sizes; finite differences read every entry of the inputs
ALLOWANCE = {"exits": 8}


def two_per_entry(*args, **kwargs) -> int:
    """The "branches" bound of a case: two comparisons read out per entry of its tensors, and 8 more."""
    return 2 * sum(t.numel() for t in _tensors_in([*args, *kwargs.values()])) + ALLOWANCE["exits"]


def rule_bounds(rules: dict, args, kwargs, ref: dict) -> dict:
    """{rule: the most a call may use on this case} for the measured rules: the declared function of the
    case's arguments, or the declared factor × the reference's call (``ref``: ``traced``'s record) plus the
    rule's ``ALLOWANCE``."""
    return {
        rule: arg(*args, **kwargs) if callable(arg) else arg * _AMOUNT[rule](ref) + ALLOWANCE.get(rule, 0)
        for rule, arg in (rules or {}).items()
        if rule in _AMOUNT
    }


def measured(name, answer, args, kwargs, options, rules) -> tuple:
    """(the case's outputs, what the call computed or None): traced where the call runs when ``rules``."""
    if not rules:
        return run_probe(name, answer, args, kwargs, options), None
    peer = _boundary(answer)
    if peer is not None:  # under the case's memory cap, if it has one (the kernel's measure stays)
        reply = peer.capped(answer, args, kwargs, name, options, (options or {}).get("cap"), trace=True)
        if reply["over"]:  # the probe's own words for it (run again through its capped path), and the
            # rules judged on what the call computed before its memory ran out (red team 12: a reader of
            # every value that ran out of memory kept the rest of the exercise's points)
            return run_probe(name, answer, args, kwargs, options), reply.get("trace")
        return reply["result"], reply["trace"]
    return traced(name, answer, args, kwargs, options)


# The rules that say a call was not derived by hand: breaking one costs the whole exercise in the hidden
# tests (``not_by_hand``), as calling autograd does, where another rule costs its case class.
BY_HAND_RULES = {
    "writes": "finite differences (work that grows with the number of inputs times a forward pass)",
    "exits": "values read out of tensors into Python or NumPy, where no work is measured",
    "branches": "values read out of tensors bit by bit (comparisons), where no work is measured",
    "nonlinear": "the forward's nonlinearity evaluated again (a difference along one direction, not a backward)",
}


def not_by_hand(rules: dict, seen: dict | None, bounds: dict) -> str | None:
    """What a call did that no derived backward does (``BY_HAND_RULES``'s words for the first of them it
    broke), or None."""
    if seen is None:
        return None
    for rule in BY_HAND_RULES:
        if rule in (rules or {}) and rule in bounds and _AMOUNT[rule](seen) > bounds[rule]:
            return BY_HAND_RULES[rule]
    return None


def _kib(n: int) -> str:
    return f"{n / 2**10:,.4g} KiB" if n < 2**20 else f"{n / 2**20:,.4g} MiB"


def broken_rule(rules: dict, seen: dict, bounds: dict) -> str | None:
    """The first stated rule (``RULES``) a call broke, in words, or None (``bounds``: ``rule_bounds``)."""
    for rule, arg in (rules or {}).items():
        if rule in bounds and _AMOUNT[rule](seen) > bounds[rule]:
            if rule == "multiply_adds":
                return (
                    f"uses {seen['multiply_adds']:,} multiply–adds where {bounds[rule]:,.0f} suffice "
                    "(a product computed twice, or one nobody asked for)"
                )
            if rule == "largest":
                n, shape = seen["largest"]
                return f"uses a {tuple(shape)} tensor ({_kib(n)}) where nothing needs more than {_kib(bounds[rule])}"
            if rule == "writes":
                return (
                    f"writes {seen['writes']:,} tensor entries where {bounds[rule]:,.0f} suffice: its work grows "
                    "with the number of inputs times a forward pass (finite differences, not a backward): "
                    f"{GRADED}"
                )
            if rule == "exits":
                return (
                    f"reads {seen['exits']:,} values out of tensors into Python or NumPy (.item(), float(), "
                    f".tolist(), .numpy(), printing) where {bounds[rule]:,.0f} suffice: work done there is not "
                    f"measured, so a backward must compute with tensors ({GRADED})"
                )
            if rule == "branches":
                return (
                    f"reads {seen['branches']:,} comparisons out of tensors (if h[i] > 0, bool(), a mask's "
                    f".tolist()) where {bounds[rule]:,.0f} suffice (two per entry): that many rebuild values "
                    f"bit by bit ({GRADED})"
                )
            if rule == "nonlinear":
                return (
                    f"evaluates exp, log, sqrt, softmax and such on {seen['nonlinear']:,} entries where "
                    f"{bounds[rule]:,.0f} suffice: the forward run again (a difference along one direction, "
                    f"not a backward): {GRADED}"
                )
            _, op, shape = seen["reads"]
            return f"uses {op} on a {tuple(shape)} tensor at once, where no step needs more than {bounds[rule]:,.0f} entries"
        if rule == "avoids":
            used = [o for o in seen["ops"] if any(w in o for w in arg) and "backward" not in o]
            if used:
                return f"uses {' and '.join(used)} (torch's own), which the prompt rules out"
        if rule == "new" and arg and seen["aliases"]:
            return (
                f"uses an argument's memory for output {seen['aliases'][0]}: it returns the argument "
                "(or a view of it), where the prompt asks for a new tensor"
            )
        if rule == "gated" and arg and seen["ungated"]:
            return (
                f"uses its backward to return a gradient for {seen['ungated'][0]}, which needs none "
                "(ctx.needs_input_grad says which inputs need one)"
            )
    return None


@probe
def within_budget(answer, args, kwargs, cap=None, inner=None, n_outputs=1, **options):
    """The inner probe's outputs; with cap (bytes), each of them "over its … MiB memory budget" when the call
    needs a tensor of more than cap bytes. In the learner's process a TorchDispatchMode watches every new
    tensor; across the grader's boundary the kernel measures it, not code in the learner's process: the call
    runs in a child of the worker whose memory may grow by cap bytes at most (hard RLIMIT_AS and RLIMIT_DATA
    after the free space of glibc's heaps is held, tools/grader/worker.py); what must not be formed is
    sized at four times cap or more."""
    if cap is None:
        return run_probe(inner, answer, args, kwargs, options)
    peer = _boundary(answer)
    if peer is not None:
        reply = peer.capped(answer, args, kwargs, inner, options, cap)
        over, out = reply["over"], reply["result"]
    else:
        out, _, largest = _watched(inner, answer, args, kwargs, options)
        over = largest > cap
    if over:
        return _over(cap) if n_outputs == 1 else (_over(cap),) * n_outputs
    return out


_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.bool,
    )
}


class Made:
    """An object a case hands the learner's function, recorded as how to build it (no pickle):
    ``Made("torch.nn.Linear", 3, 2, state={"weight": W, "bias": b})`` is ``nn.Linear(3, 2)`` with
    those parameters. ``path`` is a class or function under ``torch.nn.``, ``torch.optim.`` or ``helpers.``."""

    def __init__(self, path: str, *args, state: dict | None = None, **kwargs):
        if not path.startswith(_MAKERS):
            raise ValueError(f"path: expected a name under {', '.join(_MAKERS)}, got {path!r}")
        self.path, self.args, self.kwargs, self.state = path, args, kwargs, state

    def __repr__(self) -> str:
        return f"Made({self.path!r})"


_MAKERS = ("torch.nn.", "torch.optim.", "helpers.")


_DRAWS: dict = {}  # large recorded draws, made once per process: {node as JSON: tensor}
_DRAWERS = ("helpers.device.randn", "helpers.device.rand")


def _build(node: dict):
    """The object a {"make": ...} node describes: the named class called with its args, then its state.
    A large draw (helpers.device.randn of a million numbers or more) is made once and cloned after."""
    path = str(node["make"])
    if not path.startswith(_MAKERS):
        raise ValueError(f"cannot build {path!r}")
    if path in _DRAWERS and "state" not in node:
        key = json.dumps(node, sort_keys=True)
        if key not in _DRAWS:
            t = _make(path, node)
            if t.numel() < 1 << 20:
                return t
            while len(_DRAWS) >= 8:
                _DRAWS.pop(next(iter(_DRAWS)))
            _DRAWS[key] = t
        return _DRAWS[key].clone()
    return _make(path, node)


def _make(path: str, node: dict):
    module, _, name = path.rpartition(".")
    obj = getattr(importlib.import_module(module), name)(
        *decode(node.get("args", {"tuple": []})), **decode(node.get("kwargs", {"dict": {}}))
    )
    if "state" in node:
        with torch.no_grad():
            obj.load_state_dict(decode(node["state"]))
    return obj


# ------------------------------------------------------------------- the format


def encode(value):
    """A case's value as JSON: tensors (values, shape, dtype, layout), sizes, tuples, functions by name."""
    if isinstance(value, torch.Tensor) and value.device.type == "meta":  # made where `device` said: no values
        return {"meta": list(value.shape), "dtype": str(value.dtype)[6:]}
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        node = {"tensor": t.reshape(-1).tolist(), "shape": list(t.shape), "dtype": str(t.dtype)[6:]}
        if t.dim() >= 2 and not t.is_contiguous() and t.mT.is_contiguous():
            node["layout"] = "transposed"  # a view whose last two dims are swapped in memory
        return node
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, Made):
        node = {"make": value.path, "args": encode(tuple(value.args)), "kwargs": encode(dict(value.kwargs))}
        if value.state is not None:
            node["state"] = encode(dict(value.state))
        return node
    if isinstance(value, torch.dtype):
        return {"dtype_of": str(value).removeprefix("torch.")}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": {str(k): encode(v) for k, v in value.items()}}
    if callable(value):
        name = getattr(value, "__name__", "")
        if FUNCTIONS.get(name) is not value:
            raise ValueError(f"only the functions of helpers.labcontract.FUNCTIONS are data, not {value!r}")
        return {"function": name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"cannot record a {type(value).__name__}")


def decode(node):
    """The value :func:`encode` wrote (a transposed layout comes back as a non-contiguous view)."""
    if isinstance(node, list):
        return [decode(v) for v in node]
    if not isinstance(node, dict):
        return node
    if "tensor" in node:
        t = torch.tensor(node["tensor"], dtype=_DTYPES[node["dtype"]]).reshape(node["shape"])
        if node.get("layout") == "transposed":
            t = t.mT.contiguous().mT
        return t
    if "meta" in node:
        return torch.empty(node["meta"], dtype=_DTYPES[node["dtype"]], device="meta")
    if "size" in node:
        return torch.Size(node["size"])
    if "tuple" in node:
        return tuple(decode(v) for v in node["tuple"])
    if "dict" in node:
        return {k: decode(v) for k, v in node["dict"].items()}
    if "function" in node:
        return FUNCTIONS[node["function"]]
    if "make" in node:
        return _build(node)
    if "dtype_of" in node:
        return _DTYPES[node["dtype_of"]]
    raise ValueError(f"unknown recorded value {sorted(node)}")


def data_path(lab: str) -> Path:
    """helpers/data/labNN_name.contract.json for 'lab02' or 'lab02_chain_rule'."""
    hits = sorted(DATA.glob(f"{lab}*.contract.json")) if len(lab) == 5 else [DATA / f"{lab}.contract.json"]
    if len(hits) != 1 or not hits[0].exists():
        raise FileNotFoundError(f"no recorded contract for {lab} in {DATA}")
    return hits[0]


def load(lab: str) -> dict:
    """The lab's recorded contract (read once while the file stays the same: a self-check reads it
    per call, and lab 10's is 1 MB of JSON). Callers only read it."""
    path = data_path(lab)
    stat = path.stat()
    return _read_json(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_json(path: Path, mtime_ns: int, size: int) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


# ------------------------------------------------------------ the comparison rule


def _parts(value, n: int):
    if n == 1:
        return [value]
    if isinstance(value, tuple) and len(value) == n:  # the prompts promise a tuple: (grad_X, grad_W, grad_b)
        return list(value)
    return None


def disagreement(got, expected, outputs, atol: float, rtol: float) -> str | None:
    """None if ``got`` is ``expected`` (same structure, types, shapes, dtypes; values within atol +
    rtol·|ref|), else why not, in a few words. The self-check and the hidden tests both judge with this."""
    got_parts, exp_parts = _parts(got, len(outputs)), _parts(expected, len(outputs))
    if got_parts is None and isinstance(got, dict):  # a dict probe's answer with other keys: name them
        missing = [o for o in outputs if o not in got]
        extra = [str(k) for k in got if k not in outputs]
        said = [f"missing from the returned dict: {', '.join(missing)}"] if missing else []
        said += (
            [f"the returned dict has keys the prompt does not ask for: {', '.join(extra)}"] if extra else []
        )
        if said:
            return "; ".join(said)
    if got_parts is None:
        what = (
            f"a {type(got).__name__} of {len(got)}" if isinstance(got, (list, tuple)) else type(got).__name__
        )
        return f"returned {what}, expected a tuple of {len(outputs)} ({', '.join(outputs)})"
    for name, g, e in zip(outputs, got_parts, exp_parts):
        why = _differs(name, g, e, atol, rtol)
        if why:
            return why
    return None


def failed_part(got, expected, outputs, atol: float, rtol: float) -> str:
    """What ``disagreement`` found wrong, in words that carry no value the answer chose (a hidden test's
    note: an output's name, the memory budget, the kind of value), never a number or a returned string."""
    got_parts, exp_parts = _parts(got, len(outputs)), _parts(expected, len(outputs))
    if got_parts is None:
        return "the returned dict's keys" if isinstance(got, dict) else "the kind of value returned"
    for name, g, e in zip(outputs, got_parts, exp_parts):
        if _differs(name, g, e, atol, rtol):
            if isinstance(g, str) and re.fullmatch(re.escape(OVER).replace(r"\{\}", r"[\d.e+-]+"), g):
                return "the call's memory budget"
            return name
    return "the returned value"


def _differs(name: str, g, e, atol: float, rtol: float) -> str | None:
    """Why one output ``g`` is not ``e``: a tensor, a number (an int stays an int), None, a str, or a
    list/tuple/dict of those."""
    if isinstance(e, torch.Tensor):
        if isinstance(g, str):  # a probe's words for what went wrong ("no gradient reached parameter 2")
            return f"{name}: {g}"
        if not isinstance(g, torch.Tensor):
            return f"{name} is a {type(g).__name__}, expected a tensor"
        if tuple(g.shape) != tuple(e.shape):
            return f"{name} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
        if g.dtype != e.dtype:
            return f"{name} has dtype {g.dtype}, expected {e.dtype}"
        if "meta" in (g.device.type, e.device.type):
            return on_device(name, g, e)
        if e.dtype == torch.bool or not (e.is_floating_point() or e.is_complex()):
            return None if torch.equal(g.cpu(), e.cpu()) else f"{name} differs from the reference"
        return None if bool(close(g, e, atol, rtol).all()) else f"{name} differs from the reference"
    if e is None or isinstance(e, (bool, str)):
        return None if type(g) is type(e) and g == e else f"{name} is {_short(g)}, expected {_short(e)}"
    if isinstance(e, int):
        if type(g) is not int:
            return f"{name} is a {type(g).__name__}, expected an int"
        return None if g == e else f"{name} is {g}, expected {e}"
    if isinstance(e, float):
        if type(g) not in (float, int):
            return f"{name} is a {type(g).__name__}, expected a float"
        return None if bool(close(float(g), e, atol, rtol)) else f"{name} is {g:.6g}, expected {e:.6g}"
    if isinstance(e, (list, tuple)):
        if type(g) is not type(e) or len(g) != len(e):
            return f"{name} is {_short(g)}, expected a {type(e).__name__} of {len(e)}"
        for i, (a, b) in enumerate(zip(g, e)):
            why = _differs(f"{name}[{i}]", a, b, atol, rtol)
            if why:
                return why
        return None
    if isinstance(e, dict):
        if not isinstance(g, dict) or set(g) != set(e):
            keys = list(g) if isinstance(g, dict) else type(g).__name__
            return f"{name} has keys {keys}, expected {list(e)}"
        for k in e:
            why = _differs(f"{name}[{k!r}]", g[k], e[k], atol, rtol)
            if why:
                return why
        return None
    raise TypeError(f"cannot compare a {type(e).__name__}")


def _short(v) -> str:
    text = repr(v) if v is None or isinstance(v, (bool, int, float, str)) else f"a {type(v).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


def changed_tensor(t: torch.Tensor, value: torch.Tensor, version: int) -> bool:
    """t is not the tensor it was (``value``, ``version`` taken before a call): its shape, dtype or values,
    or written in place at all, even to the same values (its version counter moved: ``grad_O.mul_(1.0)``
    kept every value and passed, where the prompt says the arguments are left alone). The one test of
    "an argument was changed", here and in the grader's worker."""
    return (
        t._version != version
        or t.shape != value.shape
        or t.dtype != value.dtype
        or t.device != value.device
        # a meta tensor holds no values: its version counter says whether it was written
        or (t.device.type != "meta" and not torch.equal(t.detach(), value.detach()))
    )


def _versions(v):
    """The version counters of the tensors in an argument, in its structure (``_same`` reads them)."""
    if isinstance(v, torch.Tensor):
        return v._version
    if isinstance(v, (tuple, list)) and not isinstance(v, torch.Size):
        return [_versions(x) for x in v]
    return None


def _same(a, b, version=None) -> bool:
    """a is still b (a's version counter still ``version``, where given): values, and .grad (a gradient left
    on an argument is a change, as the grader's worker sees it)."""
    if isinstance(a, torch.Tensor):
        if not isinstance(b, torch.Tensor) or changed_tensor(
            a, b, a._version if version is None else version
        ):
            return False
        return (a.grad is None) == (b.grad is None) and (a.grad is None or torch.equal(a.grad, b.grad))
    if isinstance(a, (tuple, list)):
        versions = version if isinstance(version, list) else [None] * len(a)
        return len(a) == len(b) and all(_same(x, y, v) for x, y, v in zip(a, b, versions))
    return True


def _clone(v):
    if isinstance(v, torch.Tensor):
        return v.clone()  # keeps a transposed layout (clone preserves the strides of a dense view)
    if isinstance(v, tuple) and not isinstance(v, torch.Size):
        return tuple(_clone(x) for x in v)
    if isinstance(v, list):
        return [_clone(x) for x in v]
    return v


class ByHand(Exception):
    """An answer to a by-hand exercise called what the exercise asks the learner to write."""


def _resolve(name: str):
    """(owner, attribute, object) of a dotted name such as 'helpers.cat_mlp.backward'."""
    module, attr = name.rsplit(".", 1)
    try:
        owner = importlib.import_module(module)
    except ImportError:  # 'torch.Tensor.backward': an attribute of a class
        owner = _resolve(module)[2]
    return owner, attr, getattr(owner, attr)


def by_hand(fn, forbidden=()):
    """fn, called with what its exercise forbids ('autograd', reference functions by dotted name)
    raising ByHand while it runs; fn itself if nothing is forbidden. An autograd.Function comes back as a
    subclass whose backward runs so guarded: autograd's own call into it is the check's, a call the
    backward makes is the answer's (a newcomer's backward that called torch.autograd.grad got ✓ here
    and 0 in the hidden tests, whose worker guards autograd's engine)."""
    if not forbidden or not callable(fn):
        return fn
    names = [n for n in forbidden if n != "autograd"]
    if "autograd" in forbidden:
        names += ["torch.autograd.backward", "torch.autograd.grad", "torch.Tensor.backward"]
    # the work rules' trace sees its own thread only, so no thread may start (the grader's worker refuses
    # one too: red team s10 ran finite differences in a thread for 10/10)
    names.append("threading.Thread.start")

    def refuse(name):
        what = "autograd" if name.startswith(("torch.autograd.", "torch.Tensor.backward")) else name
        what = "a thread" if name == "threading.Thread.start" else what
        said = f"uses {what} ({name.rsplit('.', 1)[1]}), where this exercise asks for it by hand"

        def refused(*args, **kwargs):
            raise ByHand(said)

        return refused

    def run(f, *args, **kwargs):
        saved = []  # (owner, attribute, original): module attributes and f's own global names
        _REFUSING.append(saved)
        try:
            # every original first: once Adam.step is replaced, AdamW's (inherited) would read as the stop
            for name, (owner, attr, obj) in [(n, _resolve(n)) for n in names]:
                stop = refuse(name)
                own = not isinstance(owner, type) or attr in vars(owner)
                saved.append((owner, attr, obj if own else _INHERITED))
                setattr(owner, attr, stop)
                space = getattr(inspect.unwrap(f), "__globals__", {})
                for k, v in list(space.items()):
                    if v is obj:  # 'from helpers.cat_mlp import backward' in the learner's notebook
                        saved.append((space, k, v))
                        space[k] = stop
            return f(*args, **kwargs)
        finally:
            _REFUSING.remove(saved)
            _put(saved)

    if isinstance(fn, type):
        if not (issubclass(fn, torch.autograd.Function) and "backward" in vars(fn)):
            return fn
        plain = fn.backward

        def checked_backward(ctx, *grads):
            return run(plain, ctx, *grads)

        attrs = {
            "backward": staticmethod(checked_backward),
            "__qualname__": fn.__qualname__,
            "__doc__": fn.__doc__,
        }
        return type(fn.__name__, (fn,), {"__module__": fn.__module__, **attrs})

    def guarded(*args, **kwargs):
        return run(fn, *args, **kwargs)

    guarded.__wrapped__ = fn
    return guarded


_REFUSING: list = []  # the (owner, attribute, original) patches of the by_hand guards now running


_INHERITED = object()  # a class attribute the class did not hold itself (AdamW.step is Adam's)


def _put(entries) -> None:
    for owner, attr, obj in reversed(entries):
        if isinstance(owner, dict):
            owner[attr] = obj
        elif obj is _INHERITED:  # inherited again, whatever was set meanwhile (an optimizer's step hooks)
            if attr in vars(owner):
                delattr(owner, attr)
        else:
            setattr(owner, attr, obj)


def unguarded(ref):
    """ref, run with what by_hand refuses put back meanwhile: a reference an answer is graded with (an
    earlier exercise's) may use autograd where the answer may not."""

    def reference(*args, **kwargs):
        patches = [e for saved in _REFUSING for e in saved]
        now = [(o, a, o[a] if isinstance(o, dict) else getattr(o, a)) for o, a, _ in patches]
        _put(patches)
        try:
            return ref(*args, **kwargs)
        finally:
            _put(list(reversed(now)))

    return reference


def _parameter_names(fn) -> list[str]:
    """The names of fn's positional parameters (forward's for an autograd.Function); [] if unknown."""
    if not (inspect.isfunction(fn) or isinstance(fn, type)):  # the grader's handle: ask it nothing
        return []
    target = fn.forward if isinstance(fn, type) and hasattr(fn, "forward") else fn
    try:
        return [p.name for p in inspect.signature(target).parameters.values() if p.name != "ctx"]
    except (TypeError, ValueError):
        return []


def _changed(fn, given, args, given_kw, kwargs, versions=None, names=None) -> list[str]:
    """The arguments (by ``names``, else the function's own) a run left different from their recorded
    values, or wrote in place (``versions``: ``_versions((given, given_kw))`` before the run)."""
    names = names or _parameter_names(fn)
    pos, kw = versions if versions is not None else ([None] * len(given), {})
    out = [
        names[i] if i < len(names) else f"number {i + 1}"
        for i, (g, a, v) in enumerate(zip(given, args, pos))
        if not _same(g, a, v)
    ]
    return out + [k for k in kwargs if not _same(given_kw.get(k), kwargs[k], kw.get(k))]


def not_in_place(allowed, changed: list[str]) -> list[str]:
    """Those of the ``changed`` arguments the exercise does not let the answer change: ``allowed`` is its
    ``in_place`` (True: any; a list of names: those; False: none)."""
    return [] if allowed is True else [n for n in changed if n not in (allowed or ())]


def _run_case(fn, case: dict, spec: dict) -> tuple[str, str | None]:
    """('pass' | 'fail' | 'todo' | 'partial' | 'error', reason) of one recorded case of an exercise ``spec``."""
    args, kwargs = decode(case["args"]), decode(case.get("kwargs", {"dict": {}}))
    given, given_kw = _clone(args), _clone(kwargs)
    versions = _versions(list(given)), {k: _versions(v) for k, v in given_kw.items()}
    answer = by_hand(fn, spec.get("by_hand", ()))
    options = decode(case.get("options", {"dict": {}}))
    try:
        got, seen = measured(
            spec.get("probe"), answer, given, given_kw, options, case.get("rules", spec.get("rules"))
        )
    except ByHand as e:
        return "fail", str(e)
    except Exception as e:  # noqa: BLE001 - a learner's error is a verdict
        return ("todo", None) if _is_todo_error(e, own_codes(fn)) else ("error", error_text(e))
    if (
        got is None
        or got is Ellipsis
        or (isinstance(got, (tuple, list)) and got and all(v is None or v is Ellipsis for v in got))
    ):
        return "todo", None
    outputs = spec["outputs"]
    if len(outputs) > 1 and isinstance(got, (tuple, list)) and any(v is Ellipsis for v in got):
        return "partial", None  # some outputs still `...`: labcheck says which
    allowed = spec.get("in_place")
    changed = (
        []
        if allowed is True
        else not_in_place(allowed, _changed(fn, given, args, given_kw, kwargs, versions))
    )
    if changed:
        return (
            "fail",
            f"changed its argument{'s' if len(changed) > 1 else ''} {' and '.join(changed)} in place",
        )
    why = disagreement(got, decode(case["expected"]), outputs, case["atol"], case["rtol"])
    if why is None and seen is not None:
        why = broken_rule(case.get("rules", spec.get("rules")), seen, case.get("bounds", {}))
    return ("fail", why) if why else ("pass", None)


def _diagnosis(fn, case: dict, spec: dict, why: str, ruled_out=frozenset()) -> str:
    """labcheck's one-line diagnosis of the failing case (factors, transpose, terms, recorded mistakes,
    less those ``ruled_out``: mistakes that would fail a class the learner's answer passes)."""
    mistakes = {
        out: {label: decode(v) for label, v in by_label.items() if label not in ruled_out}
        for out, by_label in case.get("mistakes", {}).items()
    }
    mistakes = {out: m for out, m in mistakes.items() if m}
    args, kwargs = decode(case["args"]), decode(case.get("kwargs", {"dict": {}}))
    try:
        got = run_probe(
            spec.get("probe"),
            by_hand(fn, spec.get("by_hand", ())),
            args,
            kwargs,
            decode(case.get("options", {"dict": {}})),
        )
    except ByHand as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a learner's error is a verdict
        return f"error in your code: {error_text(e)}"
    result = evaluate(
        got,
        decode(case["expected"]),
        args=decode(case["args"]),
        kwargs=decode(case.get("kwargs", {"dict": {}})),
        outputs=tuple(spec["outputs"]),
        name=spec["title"],
        atol=case["atol"],
        rtol=case["rtol"],
        factors=decode(case.get("factors", {"dict": {}})) or None,
        terms={out: decode(t) for out, t in case.get("terms", {}).items()} or None,
        mistakes=mistakes or None,
    )
    prefix = f"✗ {spec['title']}: "
    if result.status in ("fail", "error") and result.line.startswith(prefix):
        outputs = tuple(spec["outputs"])
        return result.line[len(prefix) :] + _one_tensor(got, decode(case["expected"]), outputs)
    return why


def _named(value, outputs: tuple) -> dict:
    """{output name: value} of a dict answer, or of a tuple one by the exercise's output names."""
    if isinstance(value, dict):
        return dict(value)
    return dict(zip(outputs, value)) if isinstance(value, tuple) else {}


def _one_tensor(got, expected, outputs: tuple) -> str:
    """' (h and a are one tensor: …)' when two outputs the answer returned share memory where the
    reference's values differ, so both cannot be right (an in-place op, a = h.relu_(), changed h)."""
    want, seen = _named(expected, outputs), {}
    for name, t in _named(got, outputs).items():
        if isinstance(t, torch.Tensor) and t.numel() and t.device.type != "meta":
            ptr = t.untyped_storage().data_ptr()
            first, e = seen.get(ptr), want.get(name)
            if first is not None and not (
                isinstance(e, torch.Tensor)
                and isinstance(want.get(first), torch.Tensor)
                and want[first].shape == e.shape
                and torch.equal(want[first], e)
            ):
                return (
                    f" ({first} and {name} are one tensor: an in-place op such as relu_ or clamp_ "
                    f"made {name} by changing {first})"
                )
            seen.setdefault(ptr, str(name))
    return ""


def _ruled_out(spec: dict, working: list[str]) -> set[str]:
    """The recorded mistakes the learner cannot have made: each would fail a class their answer passes
    (two mistakes that give the same numbers in the failing class are told apart by the others)."""
    return {
        label
        for cls in spec["classes"]
        if cls["name"] in working
        for case in cls["cases"]
        for by_label in case.get("mistakes", {}).values()
        for label in by_label
    }


def _listed(names: list[str], most: int = 2, sep: str = ", ") -> str:
    return sep.join(names[:most]) + (f" (and {len(names) - most} more)" if len(names) > most else "")


# case classes are listed with "; " between them: 145 of their names hold a comma ("W2 (k, n_h), k > 1")
CLASSES = "; "


def evaluate_contract(lab: str, exercise: str, fn) -> CheckResult:
    """The self-check's verdict on every public case, class by class; nothing printed."""
    spec = load(lab)["exercises"][exercise]
    title, outputs = spec["title"], spec["outputs"]
    verdicts = []  # (class name, status, reason, case)
    for cls in spec["classes"]:
        status, why, bad = "pass", None, None
        for case in cls["cases"]:
            status, why = _run_case(fn, case, spec)
            if status != "pass":
                bad = case
                break
        verdicts.append((cls["name"], status, why, bad))
    if any(s == "todo" for _, s, _, _ in verdicts) and not any(s == "pass" for _, s, _, _ in verdicts):
        return CheckResult("todo", f"· {title}: {TODO}")
    failing = [v for v in verdicts if v[1] != "pass"]
    working = [name for name, s, _, _ in verdicts if s == "pass"]
    n_cases = sum(len(c["cases"]) for c in spec["classes"])
    if not failing:
        return CheckResult(
            "pass",
            f"✓ {title}: matches the recorded reference in all {len(verdicts)} case classes ({n_cases} cases)",
        )
    name, status, why, case = failing[0]
    if status == "partial":
        return evaluate(
            fn, decode(case["expected"]), args=decode(case["args"]), outputs=tuple(outputs), name=title
        )
    detail = (
        f"returned None where {_listed(list(outputs), 3)} {'is' if len(outputs) == 1 else 'are'} expected"
        if status == "todo"
        else f"error in your code: {why}"
        if status == "error"
        else why
        if why.startswith(("changed its argument", "uses "))
        else _diagnosis(fn, case, spec, why, _ruled_out(spec, working))
    )
    fails = [v[0] for v in failing]
    if working:
        head = (
            f"✗ {title} fails when {_listed(fails, sep=CLASSES)} — works when {_listed(working, sep=CLASSES)}"
        )
    else:
        head = f"✗ {title} fails in every case class ({_listed(fails, sep=CLASSES)})"
    earlier, replaced = _earlier_failing(lab, exercise, fn)
    if earlier and replaced:
        # graded, the course's answers to those exercises run in place of the learner's, so a rule broken
        # through them costs nothing here (a newcomer's Jacobian in lab 4 ex1 read as ex2's "0 points")
        detail = detail.replace(f": {GRADED}", "").replace(f" ({GRADED})", "")
        earlier += " (graded, this exercise runs with the course's in place of yours)"
    return CheckResult("fail", f"{head}: {detail}{earlier}")


def _names_used(obj, depth: int = 0) -> set[str]:
    """The global names a function (or an autograd.Function's own methods, and functions nested in them) reads."""
    if isinstance(obj, type):
        methods = [
            getattr(v, "__func__", v)
            for v in vars(obj).values()
            if isinstance(v, (staticmethod, classmethod))
        ]
        methods += [v for v in vars(obj).values() if inspect.isfunction(v)]
        return set().union(*(_names_used(m, depth + 1) for m in methods)) if methods else set()
    if inspect.isfunction(obj):
        obj = inspect.unwrap(obj)  # @once_differentiable's wrapper reads none of backward's names
    code = obj if inspect.iscode(obj) else getattr(obj, "__code__", None)
    if code is None or depth > 4:
        return set()
    names = set(code.co_names)
    for c in code.co_consts:
        if inspect.iscode(c):
            names |= _names_used(c, depth + 1)
    return names


def _earlier_failing(lab: str, exercise: str, fn) -> tuple[str, bool]:
    """(' — your causal_mask (Exercise 1) fails its own self-check: fix it first', whether the hidden tests
    run the course's answers to all of them in place of the learner's) when fn calls the learner's answers
    to earlier exercises that are wrong (each one named: one bug, not two), else ('', False)."""
    space = getattr(fn, "__globals__", None) or getattr(getattr(fn, "forward", None), "__globals__", None)
    if not space:
        return "", False
    exercises = load(lab)["exercises"]
    calls = set(exercises[exercise].get("calls", ()))
    order = list(exercises)
    used = _names_used(fn)
    failing, names = [], set()
    for name in order[: order.index(exercise)]:
        spec = exercises[name]
        other = space.get(spec["function"])
        if spec["function"] in used and other is not None and other is not fn:
            if evaluate_contract(lab, name, other).status in ("fail", "error"):
                failing.append(f"{spec['function']} ({spec['title'].split(' · ')[0]})")
                names.add(name)
    if not failing:
        return "", False
    verb = "fails its own self-check" if len(failing) == 1 else "fail their own self-checks"
    said = f" — your {' and your '.join(failing)} {verb}: fix {'it' if len(failing) == 1 else 'them'} first"
    return said, names <= calls


def check_contract(lab: str, exercise: str, fn) -> None:
    """Print one ✓/✗/· line: ``fn`` against the exercise's recorded cases, class by class."""
    print(evaluate_contract(lab, exercise, fn).line)


# ------------------------------------------------------------------ hidden side


_LOADING = threading.RLock()


def module_at(name: str, path: Path):
    """The module ``name`` loaded from the file ``path`` (once per process; sys.modules keeps it). One
    thread at a time: another thread would get the module half run (``grade --jobs 2`` read a
    submission with a ``reach`` that had no ``as_run`` yet); the loading thread itself may import back."""
    with _LOADING:
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            # registered before it runs: a lab's contract imports `contract`, which may import back
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        return sys.modules[name]


def instructor_module(lab: str):
    """The lab's contract module from the instructor's checkout (labs/source/contracts/; never shipped),
    loaded from its file with the machinery it imports (``contract``): the one place anything finds it."""
    root = Path(__file__).resolve().parents[1] / "labs" / "source" / "contracts"
    name = data_path(lab).name.removesuffix(".contract.json") if len(lab) == 5 else lab
    if not (root / f"{name}.py").exists():
        raise RuntimeError(f"the hidden tests of {name} run in the instructor's checkout only")
    module_at("contract", root / "contract.py")
    return module_at(name, root / f"{name}.py")


def hidden_check(lab: str, exercise: str, fn, case_class: str) -> None:
    """A hidden test: ``fn`` on the hidden cases of one case class; AssertionError naming the class."""
    instructor_module(lab).CONTRACT.hidden_check(exercise, fn, case_class)


@probe
def dict_entries(answer, args, kwargs, keys=()):
    """(out[k] for k in keys) of an answer that returns a dict (one with other keys as it is; not a dict: TypeError)."""
    out = _given(answer(*args, **kwargs))
    if not isinstance(out, dict):
        raise TypeError(f"returned a {type(out).__name__}, expected a dict with keys {', '.join(keys)}")
    return tuple(out[k] for k in keys) if set(out) == set(keys) else out


def _what_was_saved(records, outs, args) -> list[str]:
    """Each saved storage in words: "the output", "the output 2", "input 1" (by position) or "another tensor"."""
    named = {}
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            named.setdefault(a.untyped_storage().data_ptr(), f"input {i}")
    for k, o in enumerate(outs):
        if isinstance(o, torch.Tensor):
            named[o.untyped_storage().data_ptr()] = "the output" if len(outs) == 1 else f"output {k}"
    words = [named.get(r["storage"], "another tensor") for r in records if r["counted"]]
    return sorted(words)


def _held_on_ctx(outs, ctx_attributes) -> list[dict]:
    """Records of the tensors (one per storage) the outputs' ctx holds as attributes (``ctx.Z = Z``):
    kept alive for backward as surely as saved ones, but out of save_for_backward's checks (and a
    reference cycle with an output), so said apart from them. (Across the grader's boundary the
    worker reports them as held, and the harness's node holds them on its ctx the same way.)"""
    seen, held = set(), []
    nodes = {o.grad_fn for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None}
    for node in nodes:
        for name, t in ctx_attributes(node):
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                held.append({"storage": key, "counted": True, "name": name})
    return held


@probe
def backward_and_saved(
    answer, args, kwargs, wrt=(0,), grad_output=None, report=None, saves=True, count=True, which=False
):
    """(outputs…, args[i].grad for i in report (None where args[i] needs no gradient), "2 tensors" saved (if saves; "no tensor held on ctx" unless count; with which, also what they are: "1 tensor: the output"), "left unchanged" or "changed in place"): an autograd.Function judged by what autograd gets, what it saved for backward (saved-tensor hooks) and what its backward did to grad_output."""
    from helpers.memory import SavedTensors, ctx_attributes

    args = list(args)
    for i in wrt:
        args[i] = args[i].detach().requires_grad_()  # the caller's storage: a forward writing into it shows
    grads = grad_output if isinstance(grad_output, tuple) else (grad_output,)
    before = [None if g is None else g.clone() for g in grads]
    with SavedTensors() as saved:
        out = _given(method_of(answer, "apply")(*args, **kwargs))
    outs = out if isinstance(out, tuple) else (out,)
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    kept = all(g is None or torch.equal(g, b) for g, b in zip(grads, before))
    got = [args[i].grad for i in (wrt if report is None else report)]
    n = f"{saved.count} tensor{'' if saved.count == 1 else 's'}" if count else "no tensor held on ctx"
    if count and which and saved.count:
        n += ": " + ", ".join(_what_was_saved(saved.records, outs, args))
    held = _held_on_ctx(outs, ctx_attributes)
    if held:  # said whether counted or not: a tensor on ctx is never what the prompt asks for
        k = len(held)
        # its name (ctx.eps) says which: a float kept as a tensor reads as a tensor too (a newcomer's)
        names = ", ".join(h["name"] for h in held)
        what = (
            f"{k} tensor{'' if k == 1 else 's'} held on ctx as an attribute, {names}, not saved with "
            "save_for_backward" + (": " + ", ".join(_what_was_saved(held, outs, args)) if which else "")
        )
        # uncounted, the saved ones are not compared: what is held leads (a newcomer read "'not counted (and
        # 1 tensor held …)', expected 'not counted'" as the same)
        n = f"{n} (and {what})" if count else what
    extra = (n,) if saves else ()
    said = "left unchanged" if kept else "changed in place"
    return (*[o.detach() if isinstance(o, torch.Tensor) else o for o in outs], *got, *extra, said)


@probe
def at_each(answer, args, kwargs, steps=()):
    """(the values' type names, float(answer(s, *args, **kwargs)) for s in steps as a float64 tensor): a
    schedule. The type first: a tensor returned for a float also rounds the values, and the ✗ names
    the cause first (a newcomer's float32 `torch.cos` was told "lr per step is wrong" by 5e-10)."""
    values = [answer(s, *args, **kwargs) for s in steps]
    if all(v is None or v is Ellipsis for v in values):
        raise Stub("returned None")
    kinds = ", ".join(sorted({type(v).__name__ for v in values}))
    return kinds, torch.tensor([float(v) for v in values], dtype=torch.float64)


@probe
def trained_with(answer, args, kwargs, optimizer="torch.optim.SGD", hp=None, stale=0.0):
    """(the parameters after, as one vector; the returned losses as a float64 tensor; their type names) of
    answer(model, opt, *args[1:]): model = args[0], opt = the named torch.optim optimizer over its parameters;
    with ``stale``, every parameter arrives with .grad = stale (a caller's leftover: zero_grad comes first)."""
    model = args[0]
    if stale:
        for p in model.parameters():
            p.grad = torch.full_like(p, float(stale))
    if not str(optimizer).startswith("torch.optim."):
        raise ValueError(f"optimizer: expected a name under torch.optim., got {optimizer!r}")
    opt = getattr(torch.optim, str(optimizer).rpartition(".")[2])(model.parameters(), **(hp or {}))
    losses = list(_given(answer(model, opt, *args[1:], **kwargs)))
    kinds = ", ".join(sorted({type(v).__name__ for v in losses}))
    params = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    return params, torch.tensor([float(v) for v in losses], dtype=torch.float64), kinds


@probe
def none_as_text(answer, args, kwargs):
    """answer(*args, **kwargs) with each None output written 'None' (labcheck's diagnosis cannot take a None)."""
    out = _given(answer(*args, **kwargs))
    if isinstance(out, tuple):
        return tuple("None" if v is None else v for v in out)
    return out


# ------------------------------------------------------------ lab 5's probes (appended)


def _hooks_on(model) -> int:
    """How many forward, forward-pre, backward and backward-pre hooks the model's modules hold."""
    kinds = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return sum(len(getattr(m, k, None) or {}) for m in model.modules() for k in kinds)


@probe
def recorded_and_hooks_left(answer, args, kwargs, raises=False):
    """What answer(model, …) returned, a dict, with one more entry, "hooks left on the model" (a count);
    with raises (a case whose loss raises): {"raised": the exception's class name or "nothing", that count}."""
    if raises:
        try:
            _given(answer(*args, **kwargs))
            raised = "nothing"
        except ByHand:
            raise
        except Exception as e:  # noqa: BLE001 - the case is built to raise: which error is the output
            raised = getattr(e, "kind", None) or type(e).__name__  # across the grader's wire: its kind
        return {"raised": raised, "hooks left on the model": _hooks_on(args[0])}
    out = _given(answer(*args, **kwargs))
    return {**out, "hooks left on the model": _hooks_on(args[0])} if isinstance(out, dict) else out


@probe
def clipped_leaves(answer, args, kwargs):
    """(total, how many None .grads were filled in, the other .grads after, concatenated, how many of those were
    replaced, not changed in place) for answer(params, …), params built as leaves whose .grad is args[0]'s
    tensors (a torch.Size: a parameter whose .grad is None, which must stay None)."""
    specs = args[0]
    dtype = next((g.dtype for g in specs if isinstance(g, torch.Tensor)), torch.float64)
    params = []
    for g in specs:
        p = torch.zeros(tuple(g.shape if isinstance(g, torch.Tensor) else g), dtype=dtype, requires_grad=True)
        if isinstance(g, torch.Tensor):
            p.grad = g.detach().clone()
        params.append(p)
    before = [p.grad for p in params]
    total = _given(answer(params, *args[1:], **kwargs))
    had = [(p, b) for p, b in zip(params, before) if b is not None]
    grads = [p.grad.detach().reshape(-1) for p, _ in had if p.grad is not None]
    after = torch.cat(grads) if grads else torch.zeros(0, dtype=dtype)
    filled = sum(p.grad is not None for p, b in zip(params, before) if b is None)
    return total, filled, after, sum(p.grad is not b for p, b in had)


# ------------------------------------------------------------ lab 8's probes (appended)


@probe
def products_formed(answer, args, kwargs, forbid=(), inner=None, returned=(), cap=None, **options):
    """(with returned = names of the first outputs: which of them are not None, "grad_x, grad_B" or "none"; the
    inner probe's outputs with None written 'None'; per group of shapes in forbid "none formed" or
    "formed (m, n)", with "in forward" or "in backward" where autograd ran a backward): the matrix products
    (their last two dims, either way round) the call forms, backward too.
    With cap (bytes; returned given): a call that needs a tensor of more than cap bytes is "over its memory
    budget" (measured as :func:`within_budget` does)."""
    peer = _boundary(answer)
    if peer is not None:  # across the grader's boundary the call runs, and is watched, in the worker
        reply = peer.capped(answer, args, kwargs, inner, options, cap, trace=True)
        if reply["over"]:
            return (_over(cap), *["not computed"] * len(returned), *["not measured"] * len(forbid))
        seen = reply["trace"]
        out, largest = _given(reply["result"]), seen["largest"][0]
        seen = [tuple(p) for p in seen["products"]]
    else:
        out, seen, largest = _watched(inner, answer, args, kwargs, options)
    outs = out if isinstance(out, tuple) else (out,)
    verdicts = []
    passes = any(s[2] == "backward" for s in seen)  # a Function's call: forward, then autograd's backward
    for group in forbid:
        hit = [s for s in seen if any(tuple(s[:2]) in (tuple(g), tuple(g)[::-1]) for g in group)]
        where = f" in {hit[0][2]}" if hit and passes else ""
        verdicts.append(f"formed {tuple(hit[0][:2])}{where}" if hit else "none formed")
    given = [n for n, v in zip(returned, outs) if v is not None]
    head = (", ".join(given) or "none",) if returned else ()
    if cap is not None and largest > cap and all(v == "none formed" for v in verdicts):
        head = (_over(cap),)
    return (*head, *["None" if v is None else v for v in outs], *verdicts)


@probe
def backward_reporting(answer, args, kwargs, wrt=(0,), report=(0,), grad_output=None, method="apply"):
    """backward_through's (outputs…, gradients), the gradients listed for every index of report (None where
    that input needs none, as autograd leaves it)."""
    got = backward_through(answer, args, kwargs, wrt=wrt, grad_output=grad_output, method=method)
    n = len(got) - len(wrt)
    by_index = dict(zip(wrt, got[n:]))
    return (*got[:n], *(by_index.get(i) for i in report))


@probe
def layer_after(answer, args, kwargs, layer=0):
    """(what answer(layer, …) returned: "the layer" or a type, the weight after, the bias after ('None' without
    one), "the same Parameter" or "a new object", "True" or "False" (weight.requires_grad), "no graph" or "a graph"):
    an in-place step."""
    obj = args[layer]
    before, values, version = obj.weight, obj.weight.detach().clone(), obj.weight._version
    out = answer(*args, **kwargs)
    if (out is None or out is Ellipsis) and obj.weight is before and torch.equal(before.detach(), values):
        raise Stub("returned None and changed nothing")
    # values changed with the version counter still: written through .data, which a pending backward
    # that saved the weight cannot notice (a newcomer's `layer.weight.data += …` got ✓ before)
    unseen = obj.weight is before and version == before._version and not torch.equal(before.detach(), values)
    return (
        "the layer" if out is obj else "None" if out is None else f"a {type(out).__name__}",
        obj.weight.detach().clone(),
        "None" if obj.bias is None else obj.bias.detach().clone(),
        "the same Parameter, changed through .data (autograd cannot see it)"
        if unseen
        else "the same Parameter"
        if obj.weight is before
        else "a new object",
        str(bool(obj.weight.requires_grad)),
        "no graph" if obj.weight.grad_fn is None else "a graph",
    )


def frozen_linear(in_features, out_features, bias=True, dtype=None):
    """nn.Linear(in_features, out_features) with requires_grad False on its parameters (a frozen base layer)."""
    return torch.nn.Linear(in_features, out_features, bias=bias, dtype=dtype).requires_grad_(False)


# ------------------------------------------------------------ lab 9's blocks, losses and probes (appended)
# The blocks and losses a lab-9 case hands the learner's code cross the grader's boundary as their source
# (``__portable_source__``, tools/grader/wire.py), so that they run beside the learner's autograd.

BLOCK_LOG: list = []  # lab 9's blocks, each run with a graph: ["run", key, x.requires_grad]; ["grad", key]


def ffn_block(x, W1, b1, W2, b2):
    """y = x + GELU(x W1ᵀ + b1) W2ᵀ + b2 (lab 9's residual block); a run with a graph is logged in BLOCK_LOG."""
    y = x + torch.nn.functional.gelu(x @ W1.T + b1) @ W2.T + b2
    if torch.is_grad_enabled() and y.requires_grad:
        key = float(W1.detach().reshape(-1)[0])
        BLOCK_LOG.append(["run", key, bool(x.requires_grad)])
        y.register_hook(lambda g: BLOCK_LOG.append(["grad", key]))
    return y


def ffn_dropout(x, W1, b1, W2, b2):
    """y = x + dropout₀.₃(GELU(x W1ᵀ + b1)) W2ᵀ + b2 (lab 9): every call draws a fresh mask; logged like ffn_block."""
    a = torch.nn.functional.dropout(torch.nn.functional.gelu(x @ W1.T + b1), p=0.3, training=True)
    y = x + a @ W2.T + b2
    if torch.is_grad_enabled() and y.requires_grad:
        BLOCK_LOG.append(["run", float(W1.detach().reshape(-1)[0]), bool(x.requires_grad)])
    return y


def fp16_tiny_loss(W):
    """1e-9 · Σ (tanh(x Wᵀ) − t)², computed in float16 from a float32 W (3, 4): its float16 gradients underflow."""
    from helpers.device import randn

    x, t = randn(16, 4, seed=902), randn(16, 3, seed=903)
    return 1e-9 * ((torch.tanh(x.half() @ W.half().T).float() - t) ** 2).sum()


def fp16_tanh_loss(W, b):
    """Σ (tanh(x Wᵀ + b) − t)², the layer in float16 from float32 W (3, 4), b (3,): large scales overflow."""
    from helpers.device import randn

    x, t = 3 * randn(16, 4, seed=104), randn(16, 3, seed=204)
    return ((torch.tanh(x.half() @ W.half().T + b.half()).float() - t) ** 2).sum()


def fp16_linear_loss(W, b):
    """Σ (x Wᵀ + b)², the layer in float16 from float32 W (3, 4), b (3,), x = 4·randn: overflows sooner."""
    from helpers.device import randn

    x = 4 * randn(32, 4, seed=913)
    return ((x.half() @ W.half().T + b.half()).float() ** 2).sum()


def fp16_uneven_loss(W, b):
    """Σ (x Wᵀ + b) ∘ k in float16 from float32 W (3, 4), b (3,), k = (1, 10, 1000): at some scales only k = 1000 overflows."""
    from helpers.device import randn

    x, k = randn(16, 4, seed=923), torch.tensor([1.0, 10.0, 1000.0])
    return ((x.half() @ W.half().T + b.half()) * k.half()).float().sum()


def _portable_source(*fns):
    for f in fns:
        f.__portable_source__ = inspect.getsource(f)
        FUNCTIONS[f.__name__] = f


def fp16_bias_overflow_loss(W, b):
    """Σ x Wᵀ + 4000·Σ b in float16 from float32 W (3, 4), b (3,): at scales 32–128 only b's gradient overflows."""
    from helpers.device import randn

    x = randn(16, 4, seed=933)
    return (x.half() @ W.half().T).float().sum() + (b.half() * 4000).float().sum()


_portable_source(
    ffn_block,
    ffn_dropout,
    fp16_tiny_loss,
    fp16_tanh_loss,
    fp16_linear_loss,
    fp16_uneven_loss,
    fp16_bias_overflow_loss,
)


def _leafy(v, grad=True):
    if isinstance(v, torch.Tensor):
        return v.detach().clone().requires_grad_(grad)
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        return type(v)(_leafy(u, grad) for u in v)
    return v


def _tensors_in(v) -> list:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        return [t for u in v for t in _tensors_in(u)]
    return []


def _segments_order(log, keys) -> str:
    """The order the logged runs with a graph re-ran the stack's segments in (a backward between two ends one)."""
    firsts, new = [], True
    for event in log:
        if event[0] == "grad":
            new = True
        elif new:
            firsts.append(keys.index(event[1]) if event[1] in keys else -1)
            new = False
    if len(firsts) <= 1:
        return "one segment" if firsts else "none re-run"
    if firsts == sorted(firsts, reverse=True) and len(set(firsts)) == len(firsts):
        return "last to first"
    return "first to last" if firsts == sorted(firsts) else "in another order"


@probe
def checkpoint_run(answer, args, kwargs, method=None, x_at=0, data_x=False, frozen=(), grad_output=None, **o):
    """(per name in report: "peak" the most blocks holding a graph at once, "order" the segments' re-run order,
    "data_x" re-runs whose input required grad though x is data, "saved" the bytes saved for backward in x's
    bytes, "after" a draw after backward, "held" the tensors ctx holds as attributes; then y, grad_x (None for a data x), the parameters' gradients in one
    vector): a checkpoint (lab 9) run seeded, forward then backward, its blocks watched through BLOCK_LOG."""
    from helpers.memory import SavedTensors, ctx_attributes

    seed, between, report = o.get("seed", 0), o.get("between", 0), o.get("report", ())
    f = method_of(answer, method)
    args = list(args)
    x = args[x_at] = args[x_at].detach().clone().requires_grad_(not data_x)
    for i, v in enumerate(args):
        if i != x_at:
            args[i] = _leafy(v)
    params = [t for i, v in enumerate(args) if i != x_at for t in _tensors_in(v)]
    for k in frozen:
        params[k].requires_grad_(False)
    keys = [float(W.detach().reshape(-1)[0]) for W in params[::4]]
    BLOCK_LOG.clear()
    torch.manual_seed(seed)
    with SavedTensors(exclude=params) as saved:
        y = _given(f(*args, **kwargs))
    held = len(_held_on_ctx((y,), ctx_attributes))  # "save x and the parameters, nothing else": ctx.Z = Z too
    if between:
        torch.rand(between)
    wanted = ([] if data_x else [x]) + [p for p in params if p.requires_grad]
    grads = list(torch.autograd.grad(y, wanted, grad_output, allow_unused=True))
    drawn = torch.rand(4) if "after" in report else None
    grad_x = None if data_x else grads.pop(0)
    missing = [k for k, g in enumerate(grads) if g is None]
    flat = f"no gradient reached parameter {missing[0]}" if missing else None
    flat = torch.cat([g.reshape(-1) for g in grads]) if flat is None else flat
    live, peak = 0, 0
    for event in BLOCK_LOG:
        live += 1 if event[0] == "run" else -1
        peak = max(peak, live)
    n_data = sum(1 for e in BLOCK_LOG if e[0] == "run" and e[2] and e[1] == keys[0]) if data_x else 0
    extra = {
        "peak": f"{peak} block{'' if peak == 1 else 's'}",
        "order": _segments_order(BLOCK_LOG, keys),
        "data_x": f"{n_data} re-run{'' if n_data == 1 else 's'}",
        "saved": f"{saved.total_bytes / (x.numel() * x.element_size()):g} × x's bytes",
        "after": drawn,
        "held": f"{held} tensor{'' if held == 1 else 's'} held on ctx",
    }
    return (*(extra[r] for r in report), y.detach(), grad_x, flat)


@probe
def scaler_step(answer, args, kwargs, stale=None):
    """(scale, tracker, "stepped"/"skipped" (a bool's meaning; another type as itself), the parameters after in one
    vector) of answer(params, loss_fn, …), params built as fresh leaves from args[0]: a loss-scaling step (lab 9).
    ``stale``: each parameter arrives with a leftover ``.grad`` of that value (a step that reads ``.grad``
    after its own ``backward()`` adds it in)."""
    params = [p.detach().clone().requires_grad_() for p in args[0]]
    for p in params if stale is not None else ():
        p.grad = torch.full_like(p, stale)
    out = _given(answer(params, *args[1:], **kwargs))
    if not isinstance(out, tuple) or len(out) != 3:
        return out
    scale, tracker, stepped = out
    said = ("stepped" if stepped else "skipped") if isinstance(stepped, bool) else stepped
    return scale, tracker, said, torch.cat([p.detach().reshape(-1) for p in params])


# ------------------------------------------------------------ lab 3's probes and functions (appended)


def _micro_leaves(numbers, before):
    from helpers.micrograd import Value

    leaves = [Value(x) for x in numbers]
    for v in leaves:
        v.grad = before
    return leaves


def _micro_backward(root) -> None:
    """root.grad = 1, then every rule once, users first (the course engine's order; leaves keep .grad)."""
    from helpers.micrograd import topological_order

    root.grad = 1.0
    for v in reversed(topological_order(root)):
        v._backward()


_MICRO_EXPRESSIONS = {
    # name: (number of leaves, expression on the answer `op` and the leaves)
    "x·x·3 + 2x": lambda op, x: (
        op(op(x, x), _micro_leaves([3.0], 0.0)[0]) + op(x, _micro_leaves([2.0], 0.0)[0])
    ),
    "x·y·x": lambda op, x, y: op(op(x, y), x),
    "(x²)^1.5 + x⁻¹": lambda op, x: op(op(x, 2), 1.5) + op(x, -1),
    "x^k · x^k": lambda op, x, k: op(x, k) * op(x, k),
    "op(x) + op(x)": lambda op, x: op(x) + op(x),
    "op(op(x) · 2 − 0.5)": lambda op, x: op(op(x) * 2.0 - 0.5),
    "op(x − c) with x = c": lambda op, x, c: op(x - c),
}


@probe
def value_rule(answer, args, kwargs, values=1, grad=2.5, before=0.5, same=False, expression=None):
    """(out.data, the input Values' .grad) for a micrograd operation: args[:values] become
    helpers.micrograd Values (with .grad = before; one Value for all if same), the rest are passed
    as they are; then out.grad = grad and one out._backward(); or, with an ``expression`` of
    _MICRO_EXPRESSIONS, the expression built on it and backward run by the course engine."""
    leaves = _micro_leaves(args[:1] if same else args[:values], 0.0 if expression else before)
    given = [leaves[0]] * values if same else leaves
    if expression:
        out = _given(_MICRO_EXPRESSIONS[expression](answer, *given, *args[values:]))
        _micro_backward(out)
    else:
        out = _given(answer(*given, *args[values:], **kwargs))
        out.grad = grad
        out._backward()
    return float(out.data), torch.tensor([float(v.grad) for v in leaves], dtype=torch.float64)


def _micro_graph(spec):
    """(leaves, root, every node) of a graph spec: [leaf numbers, ops, root index]; an op is
    ["*", i, j], ["+", i, j], ["*c", i, c], ["+c", i, c], ["tanh"|"relu"|"exp", i] or ["chain", i, n]
    (n steps of v·1.0001 + 0.0); node i is the i-th leaf or op result."""
    from helpers.micrograd import Value

    numbers, ops, root = spec
    nodes = [Value(x) for x in numbers]
    for op in ops:
        kind, i = op[0], op[1]
        v = nodes[i]
        if kind == "*":
            v = v * nodes[op[2]]
        elif kind == "+":
            v = v + nodes[op[2]]
        elif kind == "*c":
            v = v * op[2]
        elif kind == "+c":
            v = v + op[2]
        elif kind == "chain":
            for _ in range(op[2]):
                v = v * 1.0001 + 0.0
        else:
            v = getattr(v, kind)()
        nodes.append(v)
    return nodes[: len(numbers)], nodes[root], nodes


@probe
def dependency_counts(answer, args, kwargs):
    """The counts answer(root) gives, sorted, as an int64 tensor (the harness sees the learner's keys
    as ids of its own, so only the counts are compared), for the graph of args[0] (see _micro_graph)."""
    _, root, _ = _micro_graph(args[0])
    counts = _given(answer(root, **kwargs))
    if not isinstance(counts, dict):
        return counts
    if not all(
        type(k) is int for k in counts
    ):  # the prompt's {id(v): n}; a Value cannot cross the grader's wire
        return f"keyed by {type(next(k for k in counts if type(k) is not int)).__name__}, not by id(v)"
    return torch.tensor(sorted(int(n) for n in counts.values()), dtype=torch.int64)


@probe
def backward_run(answer, args, kwargs):
    """(the leaves' .grad, rules never run, rules run more than once, rules run before a user's rule)
    after answer(root) on the graph of args[0], every rule wrapped to record when it runs."""
    from helpers.micrograd import topological_order

    leaves, root, _ = _micro_graph(args[0])
    inner = [v for v in topological_order(root) if v._parents]
    calls: list = []

    def counted(v):
        rule = v._backward

        def run():
            calls.append(id(v))
            rule()

        return run

    for v in inner:
        v._backward = counted(v)
    answer(root, **kwargs)
    if inner and not calls and float(root.grad) == 0.0:
        raise Stub("backward ran no rule and left root.grad at 0")  # a stub: "not yet"
    first: dict = {}
    for k, i in enumerate(calls):
        first.setdefault(i, k)
    users: dict = {id(v): [] for v in inner}
    for v in inner:
        for p in v._parents:
            if id(p) in users:
                users[id(p)].append(id(v))
    never = sum(id(v) not in first for v in inner)
    runs = collections.Counter(calls)  # (calls.count per rule was quadratic: 12 s of lab 3's catalog)
    twice = sum(runs[id(v)] > 1 for v in inner)
    early = sum(
        id(v) in first and any(u not in first or first[u] > first[id(v)] for u in users[id(v)]) for v in inner
    )
    grads = torch.tensor([float(v.grad) for v in leaves], dtype=torch.float64)
    return grads, never, twice, early


def _requiring_grad(*ts):
    return [t.requires_grad_() if not t.requires_grad else t for t in ts]


def mul_self(x):
    """Σ x·x: mul saves x twice, an input (x marked as requiring grad)."""
    (x,) = _requiring_grad(x)
    return (x * x).sum()


def exp_times_exp(x):
    """Σ exp(x)·exp(x) with two exps: two outputs, each saved by its exp and by mul."""
    (x,) = _requiring_grad(x)
    return (x.exp() * x.exp()).sum()


def square_of_exp(x):
    """Σ exp(x)²: one exp output, saved by exp and twice by mul."""
    (x,) = _requiring_grad(x)
    y = x.exp()
    return (y * y).sum()


def sin_of_a_slice(X, W):
    """Σ sin((X Wᵀ)[:, :2]): sin saves a view at offset 0 of the whole product."""
    (W,) = _requiring_grad(W)
    return (X @ W.T)[:, :2].sin().sum()


def sin_of_two_slices(X, W):
    """Σ sin(P[:, :2]) + Σ sin(P[:, 3:]), P = X Wᵀ: two saved views of one storage, at offsets 0 and 3."""
    (W,) = _requiring_grad(W)
    P = X @ W.T
    return P[:, :2].sin().sum() + P[:, 3:].sin().sum()


def matmul_of_an_input_slice(X, W):
    """Σ X[:, 1:] Wᵀ: mm saves a view of the input X at an offset (an input's storage: 0 bytes)."""
    (W,) = _requiring_grad(W)
    return (X[:, 1:] @ W.T).tanh().sum()


def mlp_softmax(X, Wa, Wb):
    """Σ softmax(relu(X Waᵀ) Wbᵀ): linear, relu, linear, softmax."""
    Wa, Wb = _requiring_grad(Wa, Wb)
    return torch.softmax((X @ Wa.T).relu() @ Wb.T, dim=-1).sum()


for _f in (
    mul_self,
    exp_times_exp,
    square_of_exp,
    sin_of_a_slice,
    sin_of_two_slices,
    matmul_of_an_input_slice,
    mlp_softmax,
):
    FUNCTIONS[_f.__name__] = _f
    # the grader sends it to the learner's process as its source, so that autograd runs there and the
    # learner's saved_tensors_hooks see what it saves (tools/grader/wire.py, "portable functions")
    _f.__portable_source__ = inspect.getsource(_f)


# ------------------------------------------------------------ lab 10's probe (appended)


@probe
def backward_saving(
    answer, args, kwargs, wrt=(0,), report=(0,), grad_output=None, method="apply", tracked=False
):
    """(outputs…, [which outputs autograd tracks, if tracked], args[i].grad for i in report (None where it
    needs none), the sorted shapes of the tensors the first output's grad_fn keeps for backward (saved, or
    held on ctx as attributes), as one string): an autograd.Function that saves nothing N × N, and marks
    an output it has no gradient for (a log-sum-exp L) non-differentiable."""
    from helpers.memory import ctx_attributes

    f = method_of(answer, method)
    args = list(args)
    for i in wrt:
        args[i] = args[i].detach().requires_grad_()  # the caller's storage: a forward writing into it shows
    out = _given(f(*args, **kwargs))
    outs = out if isinstance(out, tuple) else (out,)
    node = getattr(outs[0], "grad_fn", None)
    saved_shapes = sorted(
        tuple(int(n) for n in t.shape) for t in (getattr(node, "saved_tensors", None) or ())
    )
    held_shapes = sorted(tuple(int(n) for n in t.shape) for _, t in ctx_attributes(node))
    shapes = [str(s) for s in saved_shapes] + [f"{s} held on ctx" for s in held_shapes]
    saved = ", ".join(shapes) or "nothing"  # one string: a ✗ can show it whole
    marks = ()
    if tracked:  # across the grader's boundary an output keeps requires_grad as the student's code left it
        on = [f"output {k}" for k, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad]
        marks = (", ".join(on) or "none",)
    grads = grad_output if isinstance(grad_output, tuple) else (grad_output,)
    if grad_output is not None and len(outs) != len(grads):  # one gradient per output the case expects
        raise TypeError(
            f"returned a tuple of {len(outs)} where one tensor is expected"
            if len(grads) == 1
            else f"returned {len(outs)} outputs where {len(grads)} are expected"
        )
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None]
    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    got = [args[i].grad if i in wrt else None for i in report]
    return (*[o.detach() if isinstance(o, torch.Tensor) else o for o in outs], *marks, *got, saved)
