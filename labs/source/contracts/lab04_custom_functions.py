"""Lab 4's contract: each exercise's reference and its case classes, one per promise of its prompt.

The prompts promise (labs/source/src/lab04_custom_functions.py):

* ex1 ``softmax_backward(P, grad_P)``: ``P = softmax(Z, dim=-1)`` of any shape ``(..., n)`` (1-D,
  2-D, 3 or more dims), in float32 or float64; ``grad_Z`` of P's shape and dtype, row by row along
  the last dim; a ``grad_P`` constant along each row gives 0; ``grad_P`` and ``P`` left unchanged;
  J not built (n = 1024: an 8 MiB Jacobian does not fit the call's 2 MiB, ``within_budget``).
* ex2 ``Softmax`` (an autograd.Function, one input ``Z`` of any ``(..., n)``): the stable softmax
  over the last dim (rows with logits of ±1000 stay finite), float32 or float64; autograd gets
  ∂L/∂Z from its backward; it saves exactly one tensor (P); backward leaves grad_P unchanged.
* ex3 ``RMSNorm`` (x of any ``(..., D)``: 1-D, 2-D, 3-D, 4-D; weight (D,); eps a float, any value,
  not only 1e-5): y, ∂L/∂x and ∂L/∂weight; each gradient gated on ``ctx.needs_input_grad`` (only
  x, or only weight, needs one); a row of zeros stays finite; saves exactly x and weight (2
  tensors); float32 or float64; backward leaves grad_y unchanged.
* ex4 ``CrossEntropy`` (logits (R, C), int64 target (R,), an int ignore_index): the mean over kept
  rows, a 0-dim loss; ∂L/∂logits exactly 0 on ignored rows; any ignore_index (−100, −1, or a
  class index 0 ≤ ignore_index < C), not only −100; logits of ±1000 stay finite; an upstream grad_L ≠ 1; R = 1;
  float32 or float64; backward leaves grad_L unchanged.

Every exercise from ex2 on is judged through the ``backward_and_saved`` probe
(helpers.labcontract): the outputs, the gradients autograd gets (None for an input that needs
none), the number of tensors the Function saved (ex2, ex3: "1 tensor", "2 tensors", in one class of
its own: "no tensor held on ctx" in the others, so that a Function that saves too much loses that class's
points, not all), and what its backward did to grad_output ("left unchanged" or "changed in
place"; across the grader's boundary grad_output reaches the learner's backward as a copy, so
only the self-check and the in-process mutant runs can see it written into).
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import torch
import torch.nn.functional as F
from contract import (
    Case,
    CaseClass,
    Contract,
    Exercise,
    large_class,
    no_directional_difference,
    no_nonlinearity,
)

from helpers.device import randn
from helpers.labcontract import two_per_entry

F64, F32 = torch.float64, torch.float32
F64_TOL = {"atol": 1e-10, "rtol": 1e-8}
F32_TOL = {"atol": 1e-5, "rtol": 1e-4}

# --------------------------------------------------------------------------- ex1


def softmax_backward(P, grad_P):
    """∂L/∂Z for P = softmax(Z) along the last dim: autograd through torch.softmax at Z = log P."""
    Z = P.log().detach().requires_grad_()
    with torch.enable_grad():
        (grad_Z,) = torch.autograd.grad(torch.softmax(Z, -1), Z, grad_P)
    return grad_Z


def _probs(shape, seed: int, dtype=F64, constant_grad=False, scale=2.0, budget=False) -> Case:
    """P = softmax(scale·z) and grad_P; with budget, a 2 MiB memory budget for the call (probe
    within_budget): an n × n Jacobian of 8 MiB or more does not fit."""
    P = torch.softmax(scale * randn(*shape, seed=seed, dtype=dtype), -1)
    if constant_grad:  # one value per row, repeated along it
        grad_P = randn(*shape[:-1], 1, seed=seed + 1, dtype=dtype).expand(*shape).contiguous()
    else:
        grad_P = randn(*shape, seed=seed + 1, dtype=dtype)
    return Case((P, grad_P), options={"cap": 2 << 20} if budget else {})


def _shape(min_dims: int, max_dims: int):
    """(..., n) with n ≥ 3 and the last two sides different (a sum over the wrong dim shows)."""
    if max_dims == 1:
        return st.integers(3, 8).map(lambda n: (n,))
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=2, max_side=5).filter(
        lambda d: d[-1] >= 3 and (len(d) < 2 or d[-1] != d[-2])
    )


ex1 = Exercise(
    "ex1",
    "softmax_backward",
    "(P, grad_P)",
    "Exercise 1 · softmax_backward",
    softmax_backward,
    ("grad_Z",),
    [
        CaseClass("P is 2-D (R, n)", _shape(2, 2), lambda d, s: _probs(d, s), **F64_TOL),
        CaseClass("P is 1-D (n,)", _shape(1, 1), lambda d, s: _probs(d, s), **F64_TOL),
        CaseClass("P has 3 or 4 dims (…, n)", _shape(3, 4), lambda d, s: _probs(d, s), **F64_TOL),
        CaseClass(
            "grad_P is constant along each row (grad_Z is 0)",
            _shape(2, 2),
            lambda d, s: _probs(d, s, constant_grad=True),
            **F64_TOL,
        ),
        CaseClass("P is float32", _shape(2, 2), lambda d, s: _probs(d, s, dtype=F32), **F32_TOL),
        CaseClass(
            "n = 1024, where the n × n Jacobian (8 MiB) does not fit the call's 2 MiB",
            st.sampled_from([1.0, 2.0, 3.0]),  # one row (the data is recorded), softmax's temperature drawn
            lambda t, s: _probs((1, 1024), s, scale=t, budget=True),
            # and no finite differences: 1024 forward passes, or softmax again along grad_P
            rules=no_directional_difference(no_nonlinearity),
            **F64_TOL,
        ),
    ],
    probe="within_budget",
    points=2,
    by_hand=("autograd", "helpers.functions.softmax_backward", "helpers.functions.softmax_jacobian"),
)

# --------------------------------------------------------------------------- ex2


class Softmax(torch.autograd.Function):
    """P = softmax(Z) over the last dim; saves P only; backward by autograd through torch.softmax."""

    @staticmethod
    def forward(Z):
        return torch.softmax(Z, -1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad_P):
        (P,) = ctx.saved_tensors
        return softmax_backward(P, grad_P)


def _logits(shape, seed: int, dtype=F64, large=False, count=False) -> Case:
    Z = 3 * randn(*shape, seed=seed, dtype=dtype)
    if large:  # one row of ±1000s: e^1000 overflows without the max shift
        row = torch.tensor([1000.0, 0.0, -1000.0, 500.0, -500.0, 990.0, 10.0], dtype=dtype)
        Z.reshape(-1, shape[-1])[0] = row[: shape[-1]]
    grad_P = randn(*shape, seed=seed + 1, dtype=dtype)
    return Case((Z,), options={"grad_output": grad_P, "wrt": (0,), "count": count, "which": count})


SOFTMAX_OUT = ("P", "grad_Z", "saved for backward", "grad_P")
ex2 = Exercise(
    "ex2",
    "Softmax",
    "(torch.autograd.Function)",
    "Exercise 2 · Softmax",
    Softmax,
    SOFTMAX_OUT,
    [
        CaseClass("Z is 2-D (R, n)", _shape(2, 2), lambda d, s: _logits(d, s), **F64_TOL),
        CaseClass("Z is 1-D (n,)", _shape(1, 1), lambda d, s: _logits(d, s), **F64_TOL),
        CaseClass("Z has 3 or 4 dims (…, n)", _shape(3, 4), lambda d, s: _logits(d, s), **F64_TOL),
        CaseClass(
            "a row has logits of ±1000",
            _shape(2, 2).filter(lambda d: d[-1] >= 5),
            lambda d, s: _logits(d, s, large=True),
            **F64_TOL,
        ),
        CaseClass("Z is float32", _shape(2, 2), lambda d, s: _logits(d, s, dtype=F32), **F32_TOL),
        CaseClass(
            "the tensors saved for backward are counted (P only: 1 tensor, the output)",
            _shape(2, 2),
            lambda d, s: _logits(d, s, count=True),
            **F64_TOL,
        ),
        large_class(
            "Z (4, 256)",
            lambda s: _logits((4, 256), s),
            # a forward's softmax, even one that takes exp twice: two per entry of Z; a difference takes three
            rules=no_directional_difference(two_per_entry),
            **F64_TOL,
        ),
    ],
    probe="backward_and_saved",
    points=2,
    by_hand=("autograd", "helpers.functions.softmax_backward"),
    calls=("ex1",),  # backward may call the learner's softmax_backward: a mistake there costs points once
)

# --------------------------------------------------------------------------- ex3


def _rms_norm(x, weight, eps):
    return F.rms_norm(x, x.shape[-1:], weight, eps)


class RMSNorm(torch.autograd.Function):
    """y = F.rms_norm(x, (D,), weight, eps); saves x and weight; backward by autograd through F.rms_norm."""

    @staticmethod
    def forward(x, weight, eps):
        return _rms_norm(x, weight, eps)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
        with torch.enable_grad():
            grad_x, grad_w = torch.autograd.grad(_rms_norm(x, weight, ctx.eps), (x, weight), grad_y)
        need_x, need_w = ctx.needs_input_grad[:2]
        return grad_x if need_x else None, grad_w if need_w else None, None


def _path_through_r(x, weight, eps, grad_y):
    """The share of ∂L/∂x that flows through r: the full gradient minus the one with r held constant."""
    leaf = x.detach().requires_grad_()
    with torch.enable_grad():
        r = (leaf.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        (held,) = torch.autograd.grad(leaf / r.detach() * weight, leaf, grad_y)
        (full,) = torch.autograd.grad(_rms_norm(leaf, weight, eps), leaf, grad_y)
    return full - held


def _rms(shape, seed: int, eps=1e-5, dtype=F64, wrt=(0, 1), zero_row=False, count=False) -> Case:
    shape = tuple(shape)
    x = 2 * randn(*shape, seed=seed, dtype=dtype) + 1
    if zero_row:
        x.reshape(-1, shape[-1])[0] = 0
    weight = 1 + 0.5 * randn(shape[-1], seed=seed + 1, dtype=dtype)
    grad_y = randn(*shape, seed=seed + 2, dtype=dtype)
    rows = x.numel() // shape[-1]
    factors = {"rows": rows, "√D": shape[-1] ** 0.5} if rows > 1 else {"√D": shape[-1] ** 0.5}
    terms = {"grad_x": {"the path through r": _path_through_r(x, weight, eps, grad_y)}} if 0 in wrt else {}
    return Case(
        (x, weight, eps),
        factors=factors,
        terms=terms,
        options={"grad_output": grad_y, "wrt": tuple(wrt), "report": (0, 1), "count": count},
    )


def _rms_shape(min_dims: int, max_dims: int):
    if max_dims == 1:
        return st.integers(3, 8).map(lambda n: (n,))
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=2, max_side=4).filter(
        lambda d: d[-1] >= 3 and (len(d) < 2 or d[-1] != d[-2])
    )


RMS_OUT = ("y", "grad_x", "grad_weight", "saved for backward", "grad_y")
# "each gradient gated on ctx.needs_input_grad": measured where an input needs none
GATED = {"gated": True}

ex3 = Exercise(
    "ex3",
    "RMSNorm",
    "(torch.autograd.Function)",
    "Exercise 3 · RMSNorm",
    RMSNorm,
    RMS_OUT,
    [
        CaseClass("x is 3-D (B, N, D)", _rms_shape(3, 3), lambda d, s: _rms(d, s), **F64_TOL),
        CaseClass("x is 2-D (R, D)", _rms_shape(2, 2), lambda d, s: _rms(d, s), **F64_TOL),
        CaseClass("x is 1-D (D,)", _rms_shape(1, 1), lambda d, s: _rms(d, s), **F64_TOL),
        CaseClass("x has 4 dims (…, D)", _rms_shape(4, 4), lambda d, s: _rms(d, s), **F64_TOL),
        CaseClass(
            "eps is not 1e-5 (0.05–2)",
            st.tuples(_rms_shape(3, 3), st.sampled_from([0.05, 0.3, 1.0, 2.0])),
            lambda p, s: _rms(p[0], s, eps=p[1]),
            **F64_TOL,
        ),
        CaseClass(
            "only x needs a gradient (weight frozen)",
            _rms_shape(3, 3),
            lambda d, s: _rms(d, s, wrt=(0,)),
            rules=GATED,
            **F64_TOL,
        ),
        CaseClass(
            "only weight needs a gradient (x a constant)",
            _rms_shape(3, 3),
            lambda d, s: _rms(d, s, wrt=(1,)),
            rules=GATED,
            **F64_TOL,
        ),
        CaseClass(
            "a row of x is all zeros (r = √eps)",
            _rms_shape(3, 3),
            lambda d, s: _rms(d, s, zero_row=True),
            atol=1e-8,
            rtol=1e-8,
        ),
        CaseClass("x is float32", _rms_shape(3, 3), lambda d, s: _rms(d, s, dtype=F32), **F32_TOL),
        CaseClass(
            "the tensors saved for backward are counted (x and weight only: 2 tensors)",
            _rms_shape(3, 3),
            lambda d, s: _rms(d, s, count=True),
            **F64_TOL,
        ),
        large_class("x (4, 128)", lambda s: _rms((4, 128), s), **F64_TOL),
    ],
    probe="backward_and_saved",
    points=3,
    by_hand=("autograd", "torch.nn.functional.rms_norm"),
)

# --------------------------------------------------------------------------- ex4


class CrossEntropy(torch.autograd.Function):
    """L = F.cross_entropy(logits, target, ignore_index=...); backward by autograd through it."""

    @staticmethod
    def forward(logits, target, ignore_index):
        return F.cross_entropy(logits, target, ignore_index=ignore_index)

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, target, ignore_index = inputs
        ctx.save_for_backward(logits, target)
        ctx.ignore_index = ignore_index

    @staticmethod
    def backward(ctx, grad_L):
        logits, target = ctx.saved_tensors
        leaf = logits.detach().requires_grad_()
        with torch.enable_grad():
            (grad,) = torch.autograd.grad(
                F.cross_entropy(leaf, target, ignore_index=ctx.ignore_index), leaf, grad_L
            )
        return grad, None, None


def _ce(R: int, C: int, seed: int, ignore_index=-100, ignored=0, dtype=F64, grad_L=1.0, large=False) -> Case:
    logits = 3 * randn(R, C, seed=seed, dtype=dtype)
    if large:
        logits[0, : min(C, 3)] = torch.tensor([1000.0, -1000.0, 0.0], dtype=dtype)[: min(C, 3)]
        logits[-1, : min(C, 3)] = torch.tensor([-500.0, 800.0, 790.0], dtype=dtype)[: min(C, 3)]
    g = torch.Generator().manual_seed(seed)
    target = torch.randint(0, C, (R,), generator=g)
    if ignore_index in range(C):  # a class index that is ignored: no kept row has it as its target
        target = torch.where(target == ignore_index, (target + 1) % C, target)
    for r in range(ignored):  # the ignored rows: 1, 3, 5, … (never all of them)
        target[(2 * r + 1) % R] = ignore_index
    kept = int((target != ignore_index).sum())
    factors = {"N": kept, "R": R, "N/R": kept / R} if kept != R else {"R": R}
    return Case(
        (logits, target, ignore_index),
        factors=factors,
        options={"grad_output": torch.tensor(grad_L, dtype=dtype), "wrt": (0,), "saves": False},
    )


rc = st.tuples(st.integers(3, 7), st.integers(3, 6))
CE_OUT = ("L", "grad_logits", "grad_L")
ex4 = Exercise(
    "ex4",
    "CrossEntropy",
    "(torch.autograd.Function)",
    "Exercise 4 · CrossEntropy",
    CrossEntropy,
    CE_OUT,
    [
        CaseClass("no row is ignored", rc, lambda p, s: _ce(*p, s), **F64_TOL),
        CaseClass(
            "some rows are ignored (ignore_index = -100)",
            st.tuples(rc.filter(lambda p: p[0] >= 4), st.integers(1, 2)),
            lambda p, s: _ce(*p[0], s, ignored=p[1]),
            **F64_TOL,
        ),
        CaseClass(
            "ignore_index is -1",
            rc.filter(lambda p: p[0] >= 4),
            lambda p, s: _ce(*p, s, ignore_index=-1, ignored=2),
            **F64_TOL,
        ),
        CaseClass(
            "ignore_index is a class index (0 ≤ ignore_index < C)",
            st.tuples(rc.filter(lambda p: p[0] >= 4), st.sampled_from([0, 1, 2])),
            lambda p, s: _ce(*p[0], s, ignore_index=p[1], ignored=2),
            **F64_TOL,
        ),
        CaseClass(
            "logits are ±1000 in some rows",
            rc,
            lambda p, s: _ce(*p, s, ignored=1, large=True),
            **F64_TOL,
        ),
        CaseClass(
            "grad_L is not 1 (the loss is scaled downstream)",
            st.tuples(rc.filter(lambda p: p[0] >= 4), st.sampled_from([0.5, 3.0, -2.0])),
            lambda p, s: _ce(*p[0], s, ignored=1, grad_L=p[1]),
            **F64_TOL,
        ),
        CaseClass("there is one row (R = 1)", st.integers(3, 6), lambda C, s: _ce(1, C, s), **F64_TOL),
        CaseClass(
            "logits are float32",
            rc.filter(lambda p: p[0] >= 4),
            lambda p, s: _ce(*p, s, ignored=1, dtype=F32),
            **F32_TOL,
        ),
        large_class("logits (16, 64)", lambda s: _ce(16, 64, s, ignored=1), **F64_TOL),
    ],
    probe="backward_and_saved",
    points=3,
    by_hand=("autograd", "helpers.functions.cross_entropy_backward"),
)

CONTRACT = Contract("lab04_custom_functions", [ex1, ex2, ex3, ex4], base_seed=40_000)
