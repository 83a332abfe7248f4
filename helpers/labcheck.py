"""Self-checks for the labs: run the learner's code, compare with a reference, say it in one line.

    evaluate(linear_backward, expected, args=(grad_Y, X, W), outputs=("grad_X", "grad_W", "grad_b"),
             name="Exercise 2 · linear_backward").line

is exactly one line, never a traceback (``helpers.labcontract.check_contract``, every lab's
self-check, prints it for the failing case it diagnoses):

* ``✓ name: grad_X, grad_W, grad_b match (max|Δ| 2.2e-16; atol 1e-10, rtol 1e-08)``
* ``✗ name: grad_W is wrong: largest error 1.3e+00 at [2, 0] (got 0.4, expected -0.9; ...)``
* ``✗ name: grad_W has shape (3, 4), expected (4, 3) (transposed?)`` (or dtype, or type)
* ``· name: not implemented yet`` - the function raised ``NotImplementedError``,
  returned ``None``/``...``, or tripped over a ``...`` still in the code
* ``✗ name: grad_W is 1/B × the expected value (B = 8)`` - one constant ratio to the reference,
  named by the exercise's ``factors`` (or ``2.5 × the expected value everywhere``); also
  ``grad_x has the sign flipped (−1 × the expected value)``, ``grad_W is the transpose of the
  expected value``, ``grad_W is zero everywhere``
* ``✗ name: grad_x matches the expected value minus the skip path (that term is missing)``
  (or ``plus … (counted twice?)``) - one of the exercise's declared ``terms``
* ``✗ name: grad_a matches W2ᵀ·dŷ times a (the ReLU's gate applied a step early)`` - one of the
  exercise's declared ``mistakes`` (a known wrong answer, computed from the reference)
* ``✗ name: grad_h is wrong only where h = 0 (1 of 4 entries): relu'(0) is 0`` - the wrong
  entries all lie in one of the exercise's declared ``regions``; undeclared, ``… is wrong only
  at indices 8–10 of dim 2 (of 11)`` when they fill one contiguous range of at most half of one
  dimension
* ``✗ name: grad_Q is wrong by a factor that differs along dim 1 (of 2): 5, 1.67 × the expected
  value`` - one ratio per index of one dim (a per-head scale), checked before any index range;
  ``grad_Q is 1/scale × the expected value (scale = 0.2, 0.6 along dim 1)`` when it is a declared
  factor with one value per index (``factors={"scale": scale}``, ``scale`` of shape (H, 1, 1))
* ``✗ name: grad_b2 is 1 everywhere (the expected value is not constant)``
* ``✗ name: missing from the returned dict: b1, W2 (it has bias1 instead?) [also wrong: W1]``
* ``✗ name: error in your code: ZeroDivisionError: division by zero (in f, line 3)``; an error
  raised inside course code or torch is placed at the learner's call: ``… (in my_fn, line 7,
  in the call to linear_backward)``; one raised by this module's own code on what the
  learner's code returned is ``✗ name: the self-check could not use what your code returned: …``
* ``✗ name: changed its argument grad_P in place`` - the learner's function wrote into one of
  its inputs (the check hands it copies and compares them afterwards, bit for bit)

``counts=("nodes missing",)`` reports those outputs as counts (``✗ name: 9 nodes missing
(expected 0)``); ``exact=True`` compares with zero tolerance and wants the reference's Python
type (``✗ name: bytes: returned float, expected int``); a ``str`` is compared for equality
(``✗ name: layer is 'a', expected 'b'``). More than 4 outputs whose names take over 80
characters are summed up on a ✓ line (``13 layers match``, with ``noun="layers"``).

For lab authors: ``outputs`` are judged in the order declared (``outputs=``, else the expected
dict's), the first wrong one is named and the rest go to ``[also wrong: …]``: declare
root-cause outputs first (the scale sequence before the W and b it feeds). Give the exercise's
constants as ``factors={"B": 8, "√d": math.sqrt(d), "α/r": 2.0, "N/(N−1)": 8 / 7}`` (each is
tried as f, 1/f, −f, −1/f; −1, 2 and 1/2 always are) and its additive pieces as
``terms={"grad_x": {"the skip path": grad_y}}`` (a tensor, or a callable taking the answer's
args). A ratio 1e-3 off a factor is not named as it. Known wrong answers go in
``mistakes={"grad_a": {"W2ᵀ·dŷ times a (the gate applied a step early)": wrong}}`` and telling
regions in ``regions={"grad_h": {"h = 0: relu'(0) is 0": h == 0}}`` (tensors, or callables
taking the answer's args; a str output's mistakes are str values). Compute them from the
reference where you can (``ref * a``), so the check's code does not print the formula.

The reference is recorded from the contract's reference solution (``helpers.labcontract``); the
``max|Δ| <number>`` on a ✓ line is round-off and nbval's sanitizer replaces it.
Only torch and ``helpers`` are needed, so the checks run in Colab as they are.
"""

from __future__ import annotations

import inspect
import linecache
import math
import os
import re
import traceback
from dataclasses import dataclass

import torch

from helpers.checks import close, tolerance
from helpers.show import fmt_sig

__all__ = ["evaluate", "CheckResult", "Stub"]

TODO = "not implemented yet"
_MAX_MESSAGE = 160
_MAX_LINE = 200  # a ✗ line lists fewer "also wrong" names rather than run longer
_MAX_LISTED, _MAX_NAMES_CHARS = 4, 80  # a ✓ line lists at most this many names, or this long a list


@dataclass
class CheckResult:
    """Outcome of one self-check: status is 'pass', 'fail', 'todo' or 'error'; line is what is printed."""

    status: str
    line: str

    def __bool__(self) -> bool:
        return self.status == "pass"


class _Todo(Exception):
    """Raised internally when an answer is unfinished."""


def _first_line(text: str) -> str:
    line = next((ln.strip() for ln in str(text).splitlines() if ln.strip()), "")
    return line if len(line) <= _MAX_MESSAGE else line[: _MAX_MESSAGE - 1] + "…"


def _is_todo_value(v) -> bool:
    return v is None or v is Ellipsis


class Stub(NotImplementedError):
    """Raised by the course's checks when an answer is still the stub (it returned None or `...`)."""


def own_codes(fn) -> set:
    """The code objects of ``fn``: a function's and those nested in it, or an autograd.Function's methods'."""
    if isinstance(fn, type):
        methods = [getattr(v, "__func__", v) for v in vars(fn).values()]
        return set().union(*(own_codes(m) for m in methods if inspect.isfunction(inspect.unwrap(m))))
    code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
    out, todo = set(), [code] if code is not None else []
    while todo:
        c = todo.pop()
        out.add(c)
        todo += [k for k in c.co_consts if inspect.iscode(k)]
    return out


def _is_todo_error(e: BaseException, own: set | None = None) -> bool:
    """The answer is still a stub: a TypeError caused by a `...` still in the code, a ``Stub``, or a
    NotImplementedError the learner's own ``raise`` statement raised, in the answer itself where ``own``
    (its ``own_codes``) is given. One torch or a library raised (an operator with no kernel,
    ``nn.Module.forward`` left undefined) is an error in the answer, and so is one an earlier exercise's
    stub raised (learner A, s10: lab 10's FlashAttentionFn read "not implemented yet" for ex5's stub)."""
    if isinstance(e, TypeError):
        return "ellipsis" in str(e).lower()
    if isinstance(e, Stub) or not isinstance(e, NotImplementedError):
        return isinstance(e, Stub)
    frames = [f for f, _ in traceback.walk_tb(e.__traceback__)]
    if not frames or _frame_kind(frames[-1]) != "learner":
        return False  # raised inside torch, a package or the course's code
    if own is not None and frames[-1].f_code not in own:
        return False  # another of the learner's functions, an earlier exercise's stub
    code, line = frames[-1].f_code, frames[-1].f_lineno
    text = linecache.getline(code.co_filename, line, frames[-1].f_globals).strip()
    # no source to read (exec'd text): the learner's own; else the line must raise it itself
    return not text or text.startswith("raise") or "NotImplementedError" in text


_HELPERS_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _is_library_frame(filename: str) -> bool:
    """A frame of course code (``helpers/``), torch or an installed package: not the learner's."""
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    return (
        "site-packages" in filename
        or "dist-packages" in filename
        or path.startswith(_HELPERS_DIR)
        or "/torch/" in filename.replace(os.sep, "/")
    )


_WRAPPERS = {"wrapped", "wrapper", "inner", "decorate_context", "fn", "f", "apply"}  # not worth naming

_OWN_FILES = ("labcheck.py",)  # the check's own module: its frames are the checker's


def _frame_kind(frame) -> str:
    """'checker' (this module), 'library' (helpers/, torch, packages) or 'learner'."""
    code = frame.f_code
    if (
        os.path.dirname(os.path.abspath(code.co_filename)) + os.sep == _HELPERS_DIR
        and os.path.basename(code.co_filename) in _OWN_FILES
    ):
        return "checker"
    return "library" if _is_library_frame(code.co_filename) else "learner"


def _where(e: BaseException) -> str:
    """' (in fn, line n)' at the learner's innermost frame, plus the course/torch function it was calling.

    Frames in ``helpers/``, torch or site-packages are not the learner's: an error raised inside
    ``linear_backward`` is reported at the learner's call, ``(in my_fn, line 7, in the call to
    linear_backward)``. Nor are the self-check's own frames (``checker``): with no learner frame
    left, an error torch raised on what the check handed it is ``(raised in torch's grad, called
    by the self-check)``; '' when the learner's frames are all there is to say.
    """
    frames = [(f, f.f_code.co_name, n) for f, n in traceback.walk_tb(e.__traceback__)][1:]  # not evaluate
    kinds = [_frame_kind(f) for f, _, _ in frames]
    mine = [i for i, k in enumerate(kinds) if k == "learner"]
    if mine:
        i = mine[-1]
        _, fname, line = frames[i]
        callee = ""
        if i + 1 < len(frames) and kinds[i + 1] != "checker":
            nxt = frames[i + 1][1]
            if nxt.isidentifier() and not nxt.startswith("_") and nxt not in _WRAPPERS:
                callee = f", in the call to {nxt}"
        return f" (in {fname}, line {line}{callee})"
    ours = [i for i, k in enumerate(kinds) if k == "checker"]
    if ours and ours[-1] + 1 < len(frames):
        frame, callee, _ = frames[ours[-1] + 1]
        torch_s = "torch's " if "/torch/" in frame.f_code.co_filename.replace(os.sep, "/") else ""
        if callee.isidentifier() and not callee.startswith("_"):
            return f" (raised in {torch_s}{callee}, called by the self-check)"
        return " (raised in torch, called by the self-check)"
    return ""


# what Python's own wording of an error leaves a learner to guess
_GLOSSES = {  # a pattern of the message's first line: what it means in the learner's code
    # PEP 479: a next() that runs out inside a generator becomes this RuntimeError
    r"generator raised StopIteration": " (a next() inside a generator ran out: an iterator gave fewer items "
    "than the code asked for, e.g. fewer gradients than the flags it zips them with)",
    # autograd's check of what a custom Function's backward returned, by position
    r"returned an invalid gradient at index (\d+)": " (backward returns one gradient per input of forward, "
    "in forward's order, each shaped like its input, None where none is needed: the one at position {0}, "
    "counting from 0, is not; gradients out of order, one left out, or one not reshaped back to its "
    "input's shape?)",
}


def error_text(e: BaseException) -> str:
    """'Type: first line of the message', with a gloss where Python's or torch's wording hides the cause."""
    msg = _first_line(e)
    text = f"{type(e).__name__}: {msg}" if msg else type(e).__name__
    for pattern, gloss in _GLOSSES.items():
        m = re.search(pattern, msg)
        if m:
            return text + gloss.format(*m.groups())
    return text


def _failure(name: str, e: BaseException) -> CheckResult:
    """The ✗ line for an exception the learner's answer raised (or this module raised on it)."""
    text = error_text(e)
    frames = [f for f, _ in traceback.walk_tb(e.__traceback__)][1:]
    if frames and _frame_kind(frames[-1]) == "checker" and "learner" not in map(_frame_kind, frames):
        # raised by the check's own code, on what the learner's code returned: not the learner's line
        named = [  # the innermost of its functions with a name (not <listcomp>)
            f.f_code.co_name
            for f in frames
            if _frame_kind(f) == "checker" and f.f_code.co_name.isidentifier()
        ]
        where = f" (in the self-check's {named[-1]})" if named else ""
        return CheckResult(
            "error", f"✗ {name}: the self-check could not use what your code returned: {text}{where}"
        )
    return CheckResult("error", f"✗ {name}: error in your code: {text}{_where(e)}")


def _clone(x):
    """Copy tensors inside args so the learner's in-place edits cannot change the reference."""
    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    if isinstance(x, tuple):
        return tuple(_clone(v) for v in x)
    if isinstance(x, list):
        return [_clone(v) for v in x]
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    return x


def _call(fn, args, kwargs):
    return fn(*_clone(tuple(args)), **_clone(dict(kwargs)))


def _same(a, b) -> bool:
    """a and b hold the same tensors, bit for bit (NaN equal to NaN), in the same structure."""
    if isinstance(b, torch.Tensor):
        if not isinstance(a, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if torch.equal(a, b):
            return True
        return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all()) if a.is_floating_point() else False
    return True


def _changed(given, original, label: str) -> list[str]:
    """Labels of the tensors in ``given`` (what the learner got) that differ from ``original`` now."""
    if isinstance(original, torch.Tensor):
        return [] if _same(given, original) else [label]
    if (
        isinstance(original, (tuple, list))
        and isinstance(given, (tuple, list))
        and len(given) == len(original)
    ):
        return [c for i, (g, o) in enumerate(zip(given, original)) for c in _changed(g, o, f"{label}[{i}]")]
    if isinstance(original, dict) and isinstance(given, dict):
        return [
            c for k, o in original.items() if k in given for c in _changed(given[k], o, f"{label}[{k!r}]")
        ]
    return []


def _arg_labels(fn, n: int) -> list[str]:
    """The names of fn's first n positional parameters ('argument 3' where there is none)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [named[i] if i < len(named) else f"argument {i + 1}" for i in range(n)]


def _changed_args(fn, args, kwargs, given_args, given_kwargs) -> list[str]:
    """Which of the learner's arguments it modified in place (it got copies: compare them with ours)."""
    out = []
    for label, g, o in zip(_arg_labels(fn, len(args)), given_args, args):
        out += _changed(g, o, label)
    for k, o in kwargs.items():
        out += _changed(given_kwargs.get(k), o, k)
    return out


def _as_items(value, outputs, what: str):
    """Name the parts of a returned value: [(name, tensor-ish)]; raise ValueError if the structure is off."""
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, (tuple, list)) and outputs is not None and len(outputs) != 1:
        if len(value) != len(outputs):
            n = len(value)
            raise ValueError(
                f"{what} {n} value{'s' if n != 1 else ''}, expected {len(outputs)} ({', '.join(outputs)})"
            )
        return list(zip(outputs, value))
    name = outputs[0] if outputs else "output"
    return [(name, value)]


def on_device(name: str, g: torch.Tensor, e: torch.Tensor) -> str | None:
    """Where a case passes device="meta" (a device with no values), an output must be made there: the
    one device a reference recorded on a CPU is compared on (elsewhere values are compared on the CPU)."""
    if g.device.type == e.device.type:
        return None
    return f"{name} is on {g.device.type}, expected {e.device.type} (made where the `device` argument says?)"


def _compare_one(
    name: str,
    got,
    exp,
    atol,
    rtol,
    count: bool = False,
    exact: bool = False,
    factors=None,
    terms=(),
    mistakes=(),
    regions=(),
):
    """None if got ≈ exp, else a message; also returns the max |Δ| (float) when comparable (None for a str)."""
    if exp is None:  # an output that must stay None (an optimizer's buffer before momentum)
        return (None, None) if got is None else (f"{name} is a {type(got).__name__}, expected None", None)
    if isinstance(exp, str):
        if got == exp:
            return None, None
        known = next((label for label, m in mistakes if isinstance(m, str) and m == got), None)
        return f"{name} is {got!r}, expected {exp!r}" + (f" ({known})" if known else ""), None
    if exact and isinstance(exp, (int, float)) and not isinstance(exp, bool) and type(got) is not type(exp):
        return f"{name}: returned {type(got).__name__}, expected {type(exp).__name__}", None
    # a plain count (hooks left): said as one, when no diagnosis below explains it
    counted = (got, exp) if type(exp) is int and type(got) is int else None
    if count:
        try:
            g = float(got)
        except (TypeError, ValueError, RuntimeError):
            return f"{name}: expected a number, got {type(got).__name__}", None
        e = float(exp)
        if g == e:
            return None, 0.0
        g_text, e_text = _apart(g, e)
        return f"{g_text} {name} (expected {e_text})", None
    if isinstance(exp, (int, float)) and not isinstance(exp, bool):
        like = got.dtype if isinstance(got, torch.Tensor) and got.is_floating_point() else torch.float64
        exp = torch.tensor(float(exp), dtype=like)
    exp_t = torch.as_tensor(exp).detach()
    if isinstance(got, (int, float)) and not isinstance(got, bool) and exp_t.dim() == 0:
        got = torch.tensor(float(got), dtype=exp_t.dtype)
    if isinstance(got, str) and not isinstance(exp, str):  # a probe's words for what went wrong
        return f"{name}: {got}", None
    if not isinstance(got, torch.Tensor):
        return f"{name}: expected a torch.Tensor, got {type(got).__name__}", None
    got_t = got.detach()
    if tuple(got_t.shape) != tuple(exp_t.shape):
        # a hint only where the values say it: a learner's elementwise a·g for an outer product has the
        # outer product's entries count, and "a reshape or keepdim?" sent them the wrong way (s10)
        hint = ""
        if got_t.numel() == exp_t.numel() and (got_t.is_floating_point() or got_t.dtype == exp_t.dtype):
            tol = tolerance(exp_t.dtype if exp_t.is_floating_point() else torch.float64, atol, rtol)
            b = exp_t.to("cpu", torch.float64)

            def matches(x):
                return bool(close(x.to("cpu", torch.float64), b, *tol, equal_nan=True).all())

            if got_t.dim() == 2 and tuple(got_t.shape[::-1]) == tuple(exp_t.shape) and matches(got_t.T):
                hint = " (transposed?)"
            elif matches(got_t.reshape(exp_t.shape)):
                hint = " (the right values in another shape: a reshape or keepdim?)"
        return f"{name} has shape {tuple(got_t.shape)}, expected {tuple(exp_t.shape)}{hint}", None
    # A float 0/1 mask is not a bool mask (masked_fill(~mask) fails on it): bool must stay bool.
    if (exp_t.is_floating_point() or exp_t.dtype == torch.bool) and got_t.dtype != exp_t.dtype:
        return f"{name} has dtype {got_t.dtype}, expected {exp_t.dtype}", None
    if "meta" in (got_t.device.type, exp_t.device.type):
        return on_device(name, got_t, exp_t), None
    a = got_t.to("cpu", torch.float64)
    b = exp_t.to("cpu", torch.float64)
    if a.numel() == 0:
        return None, 0.0
    atol, rtol = tolerance(exp_t.dtype if exp_t.is_floating_point() else torch.float64, atol, rtol)
    bad_nan = torch.isnan(a) & ~torch.isnan(b)
    if bad_nan.any():
        idx = [int(i) for i in torch.nonzero(bad_nan)[0].tolist()]
        nan = f"NaN at {idx} (expected {fmt_sig(b[tuple(idx)].item())})"
        for label, m in mistakes:  # a known mistake may make NaNs (no max shift: e^1000 / e^1000)
            if (
                isinstance(m, torch.Tensor)
                and m.shape == a.shape
                and close(a, m, atol, rtol, equal_nan=True).all()
            ):
                return f"{name} matches {label} ({nan})", None
        # NaNs confined to a declared region (or one index range) say where, like other wrong entries
        where = _locate(name, a, b, ~close(a, b, atol, rtol, equal_nan=True), regions)
        return (f"{where}; {nan}" if where else f"{name} has {nan}"), None
    both_nan = torch.isnan(a) & torch.isnan(b)
    err = torch.where(both_nan, torch.zeros_like(a), (a - b).abs())
    err = torch.nan_to_num(err, nan=math.inf)
    bad = ~close(a, b, atol, rtol, equal_nan=True)
    diff = err.max().item()
    if not bad.any():
        return None, diff
    cause = _diagnose(
        name, a, b, atol, rtol, factors, terms, boolean=exp_t.dtype == torch.bool, mistakes=mistakes
    ) or _locate(name, a, b, bad, regions, atol, rtol)
    if cause:
        return cause, diff
    if counted is not None:
        return f"{name} is {counted[0]}, expected {counted[1]}", diff
    excess = torch.where(bad, err, torch.full_like(err, -1.0))
    flat = int(torch.argmax(excess).item())
    idx = list(torch.unravel_index(torch.tensor(flat), a.shape)) if a.dim() else []
    idx = [int(i) for i in idx]
    where = f" at {idx}" if idx else ""
    worst = err.reshape(-1)[flat].item()
    n_bad = int(bad.sum().item())
    count = f", {n_bad} of {a.numel()} entries off" if a.numel() > 1 else ""
    got_text, exp_text = _apart(a.reshape(-1)[flat].item(), b.reshape(-1)[flat].item())
    return (
        f"{name} is wrong: largest error {worst:.1e}{where} (got {got_text}, "
        f"expected {exp_text}{count}; atol {atol:g}, rtol {rtol:g})"
    ), diff


def _apart(got: float, expected: float) -> tuple[str, str]:
    """got and expected with 6 significant digits, or as many more as it takes to tell them apart."""
    for digits in (6, 9, 12, 17):
        # past 6 digits both keep their trailing zeros: "1.21015268" beside "1.21015270", never "1.2101527"
        g, e = fmt_sig(got, digits, zeros=digits > 6), fmt_sig(expected, digits, zeros=digits > 6)
        if g != e:
            break
    return g, e


_BUILTIN_FACTORS = ((-1.0, "−1"), (2.0, "2"), (0.5, "1/2"))


def _fmt_ratio(c: float, near: float | None) -> str:
    """c with 3 significant digits, more if it would otherwise print as the factor it is not (8.008 vs 8)."""
    for digits in range(3, 10):
        text = fmt_sig(c, digits)
        if near is None or text != fmt_sig(near, digits):
            return text
    return fmt_sig(c, 10)


def _as_factor(key, f):
    """A declared factor as a float, or as a float64 CPU tensor when its entries differ (one per head)."""
    if isinstance(f, torch.Tensor):
        t = f.detach().to("cpu", torch.float64)
        if t.numel() == 0 or not torch.isfinite(t).all() or (t == 0).any():
            raise ValueError(f"factors: {key} has entries that are not finite and nonzero")
        if not (t == t.reshape(-1)[0]).all():
            return t
        f = t.reshape(-1)[0].item()
    f = float(f)
    if not math.isfinite(f) or f == 0:
        raise ValueError(f"factors: {key} = {f!r} is not a finite nonzero number")
    return f


def _inverse_label(key) -> str:
    return f"1/({key})" if any(ch in str(key) for ch in "/+-−*·× ") else f"1/{key}"


def _factor_candidates(factors) -> list[tuple[float, str, str]]:
    """(value, label, note) to try as the ratio got/expected: each named f, 1/f, −f, −1/f, then −1, 2, 1/2."""
    out = []
    for key, f in (factors or {}).items():
        f = _as_factor(key, f)
        if isinstance(f, torch.Tensor):  # one value per index: _per_index_factor tries it
            continue
        inv = _inverse_label(key)
        note = f" ({key} = {fmt_sig(f, 4)})"
        for value, label in ((f, str(key)), (1 / f, inv), (-f, f"−{key}"), (-1 / f, f"−{inv}")):
            if value != 1:
                out.append((value, label, note))
    return out + [(v, label, "") for v, label in _BUILTIN_FACTORS]


def _listed(values, most: int = 4) -> str:
    """'0.2, 0.6' (3 significant digits), the first ``most`` of them and '…' after."""
    text = [fmt_sig(float(v), 3) for v in values[:most]]
    return ", ".join(text + (["…"] if len(values) > most else []))


def _per_index_factor(name: str, a, b, atol: float, rtol: float, factors) -> str | None:
    """A declared factor with one value per index (a temperature per head, shape (H, 1, 1)),
    applied where it should not be or left out: a = f·b, b/f, −f·b or −b/f."""
    for key, f in (factors or {}).items():
        f = _as_factor(key, f)
        if not isinstance(f, torch.Tensor):
            continue
        try:
            if torch.broadcast_shapes(f.shape, b.shape) != b.shape:
                continue
        except RuntimeError:  # a factor that cannot broadcast to this output is not in it
            continue
        offset = b.dim() - f.dim()
        along = [offset + i for i, n in enumerate(f.shape) if n > 1]
        if len(along) == 1:
            note = f" ({key} = {_listed(f.reshape(-1).tolist())} along dim {along[0]})"
        else:
            note = f" ({key} of shape {tuple(f.shape)})"
        inv = _inverse_label(key)
        for value, label in ((f, str(key)), (1 / f, inv), (-f, f"−{key}"), (-1 / f, f"−{inv}")):
            if close(a, b * value, atol * max(1.0, value.abs().max().item()), rtol).all():
                return f"{name} is {label} × the expected value{note}"
    return None


def _slice_ratio(name: str, a, b, atol: float, rtol: float) -> str | None:
    """One constant ratio to the expected value per index of one dim, not the same for all: a
    factor that differs per head (or row), e.g. a per-head scale left out. None if no dim fits.

    A slice with fewer than 2 entries where the expected value is not negligible must be right
    (any one number has a ratio); the ratios must not all be equal (that is one constant ratio).
    """
    if a.dim() < 2 or not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return None
    scale = b.abs().max().item()
    if scale == 0:
        return None
    sig = (b.abs() > max(atol, 1e-6 * scale)).to(b.dtype)
    match_tol = max(1e-6, min(rtol, 1e-4))
    for d in range(a.dim()):
        size = a.shape[d]
        if size < 2:
            continue
        other = [k for k in range(a.dim()) if k != d]
        den = (b * b * sig).sum(dim=other)
        num = (a * b * sig).sum(dim=other)
        enough = sig.sum(dim=other) >= 2
        c = torch.where(enough, num / torch.where(enough, den, torch.ones_like(den)), torch.ones_like(den))
        shape = [1] * a.dim()
        shape[d] = size
        if not close(a, c.reshape(shape) * b, atol * max(1.0, c.abs().max().item()), rtol).all():
            continue
        if ((c - c[0]).abs() <= match_tol * c.abs().clamp_min(1e-300)).all():
            continue  # one ratio for every index: not this
        off = [k for k in range(size) if abs(c[k].item() - 1) > match_tol]
        if all(c[k].item() == 0 for k in off):
            return None  # entries left out (zero), not scaled: where they are is what to say
        ratios = _listed([c[k].item() for k in off])
        if len(off) == size:
            return f"{name} is wrong by a factor that differs along dim {d} (of {size}): {ratios} × the expected value"
        at = f"index {off[0]}" if len(off) == 1 else f"indices {_listed(off)}"
        return f"{name} is {ratios} × the expected value at {at} of dim {d} (of {size}) and right elsewhere"
    return None


def _as_tensor(m):
    """A recorded mistake as the diagnosis compares it: a number output's (a scale, a count) as a 0-dim
    float64 tensor, like the got and expected numbers it is held against; anything else as it is."""
    return (
        torch.tensor(float(m), dtype=torch.float64)
        if isinstance(m, (int, float)) and not isinstance(m, bool)
        else m
    )


def _diagnose(
    name: str, a, b, atol: float, rtol: float, factors, terms, boolean: bool = False, mistakes=()
) -> str | None:
    """The cause a wrong value reveals (a = got, b = expected: float64, same shape, not close), or None.

    In order: a declared mistake, a declared term missing or counted twice, the transpose, all
    zeros (all False for a bool mask), a declared factor with one value per index, one constant
    ratio (not for a bool mask), one constant.
    """
    # every declared mistake these numbers match: where two give the same numbers on this case (lab 9: the
    # RNG state never put back, or taken after the forward's draw), naming one blamed the other's learner
    found = list(
        dict.fromkeys(
            label
            for label, m in ((label, _as_tensor(m)) for label, m in mistakes)
            if isinstance(m, torch.Tensor)
            and m.shape == a.shape
            and close(a, m.to(a.dtype), atol, rtol, equal_nan=True).all()
        )
    )
    if len(found) == 1:
        return f"{name} matches {found[0]}"
    if found:
        return f"{name} matches {', or '.join(found)}: the same numbers on this case"
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return None
    for label, t in terms:
        try:
            if torch.broadcast_shapes(t.shape, b.shape) != b.shape:
                continue
        except RuntimeError:  # a term of another shape cannot be what is missing
            continue
        if close(a, b - t, atol, rtol).all():
            return f"{name} matches the expected value minus {label} (that term is missing)"
        if close(a, b + t, atol, rtol).all():
            return f"{name} matches the expected value plus {label} (counted twice?)"
    if a.dim() >= 2 and a.shape[-1] == a.shape[-2] > 1:
        if close(a, b.transpose(-1, -2), atol, rtol).all():
            return f"{name} is the transpose of the expected value"
    scale = b.abs().max().item()
    if scale == 0:
        return None
    if (a == 0).all():
        return f"{name} is {'False' if boolean else 'zero'} everywhere"
    if boolean:
        return f"{name} is True everywhere" if (a != 0).all() else None
    if (a.abs() <= atol).all():
        return f"{name} is zero everywhere (up to round-off)"
    per_index = _per_index_factor(name, a, b, atol, rtol, factors)
    if per_index:
        return per_index
    sig = b.abs() > max(atol, 1e-6 * scale)  # entries where the expected value is not negligible
    n_sig = int(sig.sum().item())
    if n_sig == 0:
        return None
    c = ((a[sig] * b[sig]).sum() / (b[sig] * b[sig]).sum()).item()  # least squares: a ≈ c·b
    if not math.isfinite(c) or c == 0 or not close(a, c * b, atol * max(1.0, abs(c)), rtol).all():
        first = a.reshape(-1)[0]
        if a.numel() > 1 and (a == first).all() and not close(b, b.reshape(-1)[:1], atol, rtol).all():
            return f"{name} is {fmt_sig(first.item())} everywhere (the expected value is not constant)"
        return None
    match_tol = max(1e-6, min(rtol, 1e-4))  # a ratio 1e-3 off a factor is not that factor
    cands = _factor_candidates(factors)
    hit = next(((v, lab, note) for v, lab, note in cands if abs(c - v) <= match_tol * abs(v)), None)
    if hit is None:
        if n_sig < 2:  # one number off: any two numbers have a ratio
            return None
        if abs(c - 1) < 1e-4:  # "1 × the expected value" reads as equal: it is round-off, said so
            return (
                f"{name} is off by a relative {abs(c - 1):.1e} everywhere "
                "(a step in lower precision: float32, or a division of ints?)"
            )
        near = min((v for v, _, _ in cands), key=lambda v: abs(c - v))
        return f"{name} is {_fmt_ratio(c, near)} × the expected value everywhere"
    v, label, note = hit
    if v == -1:
        return f"{name} has the sign flipped (−1 × the expected value)"
    return f"{name} is {label} × the expected value{note or ' everywhere'}"


def _locate(name: str, a, b, bad, regions, atol: float = 0.0, rtol: float = 0.0) -> str | None:
    """How or where the entries are wrong: by a factor that differs per index of one dim (a
    per-head scale), checked first; else inside one declared region; else in one index range of
    one dim that covers at most half of it (a range over nearly everything locates nothing)."""
    per_slice = _slice_ratio(name, a, b, atol, rtol)  # every entry may be off by its slice's factor
    if per_slice:
        return per_slice
    n_bad, n = int(bad.sum().item()), bad.numel()
    if n_bad == n:
        return None
    of = f" ({n_bad} of {n} entries)"
    for label, mask in regions:
        if mask.dtype != torch.bool:
            mask = mask != 0
        try:
            mask = mask.expand(bad.shape)
        except RuntimeError:  # a region of another shape cannot be where this output is wrong
            continue
        if mask.any() and not mask.all() and not (bad & ~mask).any():
            return f"{name} is wrong only where {label}{of}"
    best = None
    for d in range(bad.dim()):
        other = [k for k in range(bad.dim()) if k != d]
        hit = bad.any(dim=other) if other else bad
        idx = torch.nonzero(hit).reshape(-1).tolist()
        lo, hi, size = idx[0], idx[-1], bad.shape[d]
        contiguous = hi - lo + 1 == len(idx)
        if contiguous and 2 * len(idx) <= size and (best is None or len(idx) / size < best[0]):
            best = (len(idx) / size, d, lo, hi, size)
    if best is None or bad.dim() < 1 or n_bad < 2:
        return None
    _, d, lo, hi, size = best
    at = f"index {lo}" if lo == hi else f"indices {lo}–{hi}"
    dim = f" of dim {d} (of {size})" if bad.dim() > 1 else f" (of {size})"
    return f"{name} is wrong only at {at}{dim}{of}"


def _resolve_terms(terms, keys, args, kwargs, what: str = "terms") -> dict:
    """{output: [(label, value)]} from ``terms``/``mistakes``/``regions``; a callable gets the answer's args.

    Values become float64 CPU tensors (a region: bool); a str stays a str.
    """
    out = {}
    for key, named in (terms or {}).items():
        if key not in keys:
            raise ValueError(f"{what}: {key!r} is not one of the outputs ({', '.join(map(str, keys))})")
        resolved = []
        for label, t in named.items():
            if callable(t) and not isinstance(t, torch.Tensor):
                t = _call(t, args, kwargs)
            if not isinstance(t, str):
                t = torch.as_tensor(t).detach().to("cpu")
                t = t.bool() if what == "regions" else t.to(torch.float64)
            resolved.append((label, t))
        out[key] = resolved
    return out


def _rule(items_exp, atol, rtol) -> str:
    dtypes = [v.dtype for _, v in items_exp if isinstance(v, torch.Tensor)]
    dt = next((d for d in dtypes if d.is_floating_point), torch.float64)
    atol, rtol = tolerance(dt, atol, rtol)
    return f"atol {atol:g}, rtol {rtol:g}"


def evaluate(
    answer,
    expected,
    *,
    args=(),
    kwargs=None,
    outputs=None,
    name: str = "check",
    atol: float | None = None,
    rtol: float | None = None,
    against: str = "",
    counts=(),
    exact: bool = False,
    noun: str = "outputs",
    factors: dict[str, float] | None = None,
    terms: dict[str, dict[str, object]] | None = None,
    mistakes: dict[str, dict[str, object]] | None = None,
    regions: dict[str, dict[str, object]] | None = None,
) -> CheckResult:
    """Run ``answer(*args, **kwargs)`` (or take it as a value), compare with ``expected``; no printing.

    ``expected`` is a value (tensor, number, str, tuple, dict) or a callable called with the same args.
    ``outputs`` names the elements of a returned tuple, e.g. ``("grad_X", "grad_W", "grad_b")``.
    ``counts`` names outputs that are counts (said "9 nodes missing (expected 0)"); ``exact``
    means zero tolerance and the reference's Python type (an int stays an int); ``noun`` is
    what a long ✓ line counts ("13 layers match"). The learner's function gets copies of the
    arguments; one that writes into them fails ("changed its argument grad_P in place").

    Outputs are judged in the order ``outputs`` declares them (else the expected dict's order):
    the first wrong one is named, the rest go to "[also wrong: …]", so declare root causes first.
    A wrong tensor is diagnosed where its numbers allow: the transpose, all zeros, one constant
    ratio to the reference (tried against each of ``factors`` = {"B": 8, "√d": 4.0} and its
    inverse, and −1, 2, 1/2), or the reference minus/plus one of ``terms`` = {"grad_x": {"the
    skip path": grad_y}} (a term is a tensor or a callable called with the same args), a known
    wrong answer of ``mistakes`` = {"grad_a": {"…times a (the gate applied early)": wrong}}, or
    the one region of ``regions`` = {"grad_h": {"h = 0": h == 0}} the wrong entries lie in.
    """
    kwargs = kwargs or {}
    if exact:
        atol, rtol = 0.0, 0.0
    changed = []
    # 1. the learner's answer
    if callable(answer) and not isinstance(answer, torch.Tensor):
        try:
            given_args, given_kwargs = _clone(tuple(args)), _clone(dict(kwargs))
            got = answer(*given_args, **given_kwargs)
            changed = _changed_args(answer, args, kwargs, given_args, given_kwargs)
        except Exception as e:  # noqa: BLE001 - any learner error becomes one line
            if _is_todo_error(e):
                return CheckResult("todo", f"· {name}: {TODO}")
            return _failure(name, e)
    else:
        got = answer
    # 2. the reference (course code: its errors are ours and propagate)
    exp = (
        _call(expected, args, kwargs)
        if callable(expected) and not isinstance(expected, torch.Tensor)
        else expected
    )

    if _is_todo_value(got):
        return CheckResult("todo", f"· {name}: {TODO}")
    if changed:
        which = f"argument {changed[0]}" if len(changed) == 1 else f"arguments {', '.join(changed)}"
        return CheckResult("fail", f"✗ {name}: changed its {which} in place")
    try:
        items_exp = _as_items(exp, outputs, "expected")
        items_got = _as_items(got, outputs, "returned")
    except ValueError as e:
        return CheckResult("fail", f"✗ {name}: {e}")
    got_map = dict(items_got)
    if isinstance(exp, dict) and not isinstance(got, dict):
        return CheckResult(
            "fail",
            f"✗ {name}: expected a dict with keys {', '.join(map(str, exp))}, got {type(got).__name__}",
        )
    if isinstance(exp, dict) and outputs is not None:  # the declared order wins over the dict's
        rank = {k: i for i, k in enumerate(outputs)}
        items_exp = sorted(items_exp, key=lambda kv: rank.get(kv[0], len(rank)))
    keys = [k for k, _ in items_exp]
    term_map = _resolve_terms(terms, keys, args, kwargs)
    mistake_map = _resolve_terms(mistakes, keys, args, kwargs, "mistakes")
    region_map = _resolve_terms(regions, keys, args, kwargs, "regions")
    missing = [str(k) for k, _ in items_exp if k not in got_map]
    todo, problems, wrong, diffs, exacts = [], [], [], [], []
    extra = [str(k) for k in got_map if k not in dict(items_exp)] if isinstance(got, dict) else []
    if missing:
        unexpected = f" (it has {', '.join(extra)} instead?)" if extra else ""
        problems.append(f"missing from the returned dict: {', '.join(missing)}{unexpected}")
    elif extra:
        problems.append(f"the returned dict has keys the prompt does not ask for: {', '.join(extra)}")
    for key, ev in items_exp:
        if key not in got_map:
            continue
        gv = got_map[key]
        if _is_todo_value(gv):
            todo.append(str(key))
            continue
        msg, diff = _compare_one(
            str(key),
            gv,
            ev,
            atol,
            rtol,
            count=key in counts,
            exact=exact,
            factors=factors,
            terms=term_map.get(key, ()),
            mistakes=mistake_map.get(key, ()),
            regions=region_map.get(key, ()),
        )
        if msg:
            problems.append(msg)
            wrong.append(str(key))
        elif diff is not None:
            diffs.append(diff)
        else:
            exacts.append(key)
    if problems:
        others = wrong[0 if missing else 1 :]
        head = f"✗ {name}: {problems[0]}"
        for n in range(min(3, len(others)), -1, -1):  # as many of the others as fit in one line
            listed = others[:n] + (["…"] if len(others) > n else [])
            more = f" [also wrong: {', '.join(listed)}]" if listed else ""
            if len(head) + len(more) <= _MAX_LINE:
                break
        return CheckResult("fail", head + more)
    if todo and not diffs and not exacts:
        return CheckResult("todo", f"· {name}: {TODO}")
    if todo:
        n_done = len(diffs) + len(exacts)
        done = " (1 other already matches)" if n_done == 1 else f" ({n_done} others already match)"
        return CheckResult("todo", f"· {name}: {TODO}: {', '.join(todo)} still ...{done}")
    keys = [str(k) for k, _ in items_exp]
    what = keys[0] if len(keys) == 1 else ", ".join(keys)
    if len(keys) > _MAX_LISTED and len(what) > _MAX_NAMES_CHARS:
        what = f"{len(keys)} {noun}"
    verb = "matches" if len(keys) == 1 else "match"
    against = f" {against}" if against else ""
    numeric = [(k, v) for k, v in items_exp if not isinstance(v, str) and k not in counts]
    tail = f" (max|Δ| {max(diffs, default=0.0):.1e}; {_rule(numeric, atol, rtol)})" if numeric else ""
    return CheckResult("pass", f"✓ {name}: {what} {verb}{against}{tail}")
