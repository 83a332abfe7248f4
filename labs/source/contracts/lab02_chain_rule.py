"""Lab 2's contract: each exercise's reference and its case classes, one per promise of its prompt.

The prompts promise (labs/source/src/lab02_chain_rule.py):

* ex1 ``directional_derivatives(f, x, U, eps=1e-6)``: any tensor ``x``; ``U`` stacks k ≥ 1
  directions of x's shape (any length, not unit); a central difference of step ``eps`` (given,
  or its default); a ``(k,)`` result in x's dtype; ``x`` left unchanged.
* ex2 ``dense_backward(X, W, grad_Y)``: ``Y = X W + b`` with ``W`` (in, out), ``X`` of any
  ``(..., in)`` (1-D, 2-D, 3-D, 4 or more dims, leading dims of size 1), in float32 or float64,
  possibly a non-contiguous view; the gradients in the shapes and dtype of X, W, b.
* ex3 ``residual_backward(grad_Y, X, W)``: ``Y = tanh(X Wᵀ) + X``, ``X`` (B, D) for any B ≥ 1,
  square ``W`` (D, D), any values (W = 0 included).
* ex4 ``unrepeat(grad, shape, reps)``: for ``y = x.repeat(*reps)``: reps as long as x.dim() or
  longer, entries ≥ 1, dims of size 1 repeated, a 0-dim x; ``shape`` a tuple or a torch.Size.
"""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import torch
from contract import Case, CaseClass, Contract, Exercise, large_class

from helpers.device import randn
from helpers.labcontract import FUNCTIONS

F64, F32 = torch.float64, torch.float32

# --------------------------------------------------------------------------- ex1


def directional_derivatives(f, x, U, eps=1e-6):
    """U[j]ᵀ∇f(x) for every direction U[j], by a central difference along it."""
    x = x.detach()
    out = torch.empty(U.shape[0], dtype=x.dtype)
    for j in range(U.shape[0]):
        out[j] = (f(x + eps * U[j]) - f(x - eps * U[j])) / (2 * eps)
    return out


def _directions(fname: str, shape, k: int, seed: int, eps=None, dtype=F64, long=False) -> Case:
    x = randn(*shape, seed=seed, dtype=dtype)
    U = randn(k, *shape, seed=seed + 1, dtype=dtype)  # random lengths: not unit directions
    if long:  # entries 10 and more: ε² Σ u³ ≥ 2000 ε², so another default eps shows
        U = 10 * (U.abs() + 1)
    args = (FUNCTIONS[fname], x, U) + (() if eps is None else (eps,))
    return Case(args)


sides = st.integers(2, 5)
ex1 = Exercise(
    "ex1",
    "directional_derivatives",
    "(f, x, U, eps=1e-6)",
    "Exercise 1 · directional_derivatives",
    directional_derivatives,
    ("slopes",),
    [
        CaseClass(
            "there is one direction (k = 1)",
            sides,
            lambda n, s: _directions("x_sin_x_plus_prod", (n,), 1, s, eps=1e-2),
            atol=1e-9,
            rtol=1e-9,
        ),
        CaseClass(
            "there are several directions (k = 2–5)",
            st.tuples(sides, st.integers(2, 5)),
            lambda p, s: _directions("x_sin_x_plus_prod", (p[0],), p[1], s, eps=1e-2),
            atol=1e-9,
            rtol=1e-9,
        ),
        CaseClass(
            "x has 2 or more dims (U is (k, *x.shape))",
            st.tuples(hnp.array_shapes(min_dims=2, max_dims=3, min_side=2, max_side=3), st.integers(2, 4)),
            lambda p, s: _directions("log_sum_exp", p[0], p[1], s, eps=1e-2),
            atol=1e-9,
            rtol=1e-9,
        ),
        CaseClass(
            "eps is left at its default (1e-6)",
            st.tuples(sides, st.integers(2, 4)),
            # Σ x³ along long directions: another eps shows as ε² Σ u³ (≥ 2e-7 at eps = 1e-5, a
            # newcomer's default), round-off stays near 1e-9
            lambda p, s: _directions("sum_of_cubes", (p[0],), p[1], s, long=True),
            atol=1e-8,
            rtol=1e-10,
        ),
        CaseClass(
            "eps is large (0.05–0.5)",
            st.tuples(sides, st.integers(2, 3), st.sampled_from([0.05, 0.1, 0.25, 0.5])),
            lambda p, s: _directions("sum_of_cubes", (p[0],), p[1], s, eps=p[2]),
            atol=1e-9,
            rtol=1e-9,
        ),
        CaseClass(
            "x is float32 (eps = 0.01–0.1)",
            st.tuples(sides, st.integers(2, 3), st.sampled_from([0.01, 0.05, 0.1])),
            lambda p, s: _directions("sum_of_cubes", (p[0],), p[1], s, eps=p[2], dtype=F32),
            atol=1e-3,
            rtol=1e-3,
        ),
    ],
    points=2,
    by_hand=("autograd", "helpers.numgrad.numerical_grad", "helpers.numgrad.numerical_jacobian"),
)

# --------------------------------------------------------------------------- ex2


def dense_backward(X, W, grad_Y):
    """(grad_X, grad_W, grad_b) for Y = X W + b, W (in, out), given grad_Y = ∂L/∂Y."""
    X_rows = X.reshape(-1, X.shape[-1])  # (R, in)
    grad_Y_rows = grad_Y.reshape(-1, grad_Y.shape[-1])  # (R, out)
    return grad_Y @ W.T, X_rows.T @ grad_Y_rows, grad_Y_rows.sum(0)


def _dense(lead, n_in: int, n_out: int, seed: int, dtype=F64, transposed=False) -> Case:
    lead = tuple(lead)
    if transposed:  # X (..., T, in) stored as (..., in, T): a non-contiguous view
        X = randn(*lead[:-1], n_in, lead[-1], seed=seed, dtype=dtype).transpose(-1, -2)
    else:
        X = randn(*lead, n_in, seed=seed, dtype=dtype)
    W = randn(n_in, n_out, seed=seed + 1, dtype=dtype)
    grad_Y = randn(*lead, n_out, seed=seed + 2, dtype=dtype)
    rows = math.prod(lead)
    factors = {"R": rows} if rows > 1 else {}
    if len(lead) >= 2 and lead[0] > 1:
        factors["B"] = lead[0]
    return Case((X, W, grad_Y), factors=factors)


in_out = st.tuples(st.integers(2, 6), st.integers(2, 6)).filter(lambda p: p[0] != p[1])
F64_TOL = {"atol": 1e-10, "rtol": 1e-8}
ex2 = Exercise(
    "ex2",
    "dense_backward",
    "(X, W, grad_Y)",
    "Exercise 2 · dense_backward",
    dense_backward,
    ("grad_X", "grad_W", "grad_b"),
    [
        CaseClass(
            "X is 3-D (B, T, in)",
            st.tuples(hnp.array_shapes(min_dims=2, max_dims=2, min_side=2, max_side=4), in_out).filter(
                lambda p: p[0][0] != p[0][1]
            ),
            lambda p, s: _dense(p[0], *p[1], s),
            **F64_TOL,
        ),
        CaseClass("X is 1-D (in,)", in_out, lambda p, s: _dense((), *p, s), **F64_TOL),
        CaseClass(
            "X is 2-D (R, in)",
            st.tuples(st.integers(2, 6), in_out),
            lambda p, s: _dense((p[0],), *p[1], s),
            **F64_TOL,
        ),
        CaseClass(
            "X has 4 or more dims (…, in)",
            st.tuples(hnp.array_shapes(min_dims=3, max_dims=4, min_side=2, max_side=3), in_out),
            lambda p, s: _dense(p[0], *p[1], s),
            **F64_TOL,
        ),
        CaseClass(
            "a leading dim of X has size 1",
            st.tuples(
                # the first of two or three leading dims is 1 (a squeeze drops it), others may be too
                hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=3).map(lambda d: (1, *d[1:])),
                in_out,
            ),
            lambda p, s: _dense(p[0], *p[1], s),
            **F64_TOL,
        ),
        CaseClass(
            "W is square (out = in)",
            st.tuples(hnp.array_shapes(min_dims=1, max_dims=2, min_side=2, max_side=4), st.integers(2, 5)),
            lambda p, s: _dense(p[0], p[1], p[1], s),
            **F64_TOL,
        ),
        CaseClass(
            "X is float32",
            st.tuples(hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=4), in_out),
            lambda p, s: _dense(p[0], *p[1], s, dtype=F32),
            atol=1e-5,
            rtol=1e-5,
        ),
        CaseClass(
            "X is a non-contiguous view (a transpose)",
            st.tuples(hnp.array_shapes(min_dims=2, max_dims=3, min_side=2, max_side=4), in_out),
            lambda p, s: _dense(p[0], *p[1], s, transposed=True),
            **F64_TOL,
        ),
        # few rows, wide W: differences cost a forward per entry of W (512 × 2 × 128 entries), while a loop
        # over rows forming each row's outer product and summing them (R × in × out, twice) stays within
        # 10 × the reference's; at R = 8 an honest row loop wrote 8,976 entries against 7,840 (a newcomer)
        large_class("X (4, 32), W (32, 16)", lambda s: _dense((4,), 32, 16, s), **F64_TOL),
    ],
    points=3,
    by_hand=("autograd", "helpers.numgrad.linear_backward"),
)

# --------------------------------------------------------------------------- ex3


def residual_backward(grad_Y, X, W):
    """(grad_X, grad_W) for Y = tanh(X Wᵀ) + X, given grad_Y = ∂L/∂Y."""
    T = torch.tanh(X @ W.T)  # (B, D)
    grad_H = grad_Y * (1 - T * T)  # (B, D)
    return grad_H @ W + grad_Y, grad_H.T @ X


def _residual(B: int, D: int, seed: int, zero_W=False, scale=1.0) -> Case:
    X = scale * randn(B, D, seed=seed, dtype=F64)
    W = torch.zeros(D, D, dtype=F64) if zero_W else randn(D, D, seed=seed + 1, dtype=F64)
    if scale > 1:  # only X Wᵀ's first column saturates; X W saturates everywhere, so the layout shows (s10:
        W[1:] /= (
            scale  # a learner's tanh(X @ W) passed the public case, saturated either way, not the hidden)
        )
    grad_Y = randn(B, D, seed=seed + 2, dtype=F64)
    factors = {"B": B} if B > 1 else {}
    return Case((grad_Y, X, W), factors=factors, terms={"grad_X": {"the skip path": grad_Y}})


ex3 = Exercise(
    "ex3",
    "residual_backward",
    "(grad_Y, X, W)",
    "Exercise 3 · residual_backward",
    residual_backward,
    ("grad_X", "grad_W"),
    [
        CaseClass("there is one row (B = 1)", st.integers(2, 5), lambda D, s: _residual(1, D, s), **F64_TOL),
        CaseClass(
            "there are more rows than features (B > D)",
            st.tuples(st.integers(2, 4), st.integers(1, 3)),
            lambda p, s: _residual(p[0] + p[1], p[0], s),
            **F64_TOL,
        ),
        CaseClass(
            "there are fewer rows than features (2 ≤ B < D)",
            st.tuples(st.integers(2, 3), st.integers(1, 3)),
            lambda p, s: _residual(p[0], p[0] + p[1], s),
            **F64_TOL,
        ),
        CaseClass(
            "W is 0 (only the skip path sends X a gradient)",
            st.tuples(st.integers(2, 4), st.integers(2, 4)),
            lambda p, s: _residual(p[0], p[1], s, zero_W=True),
            **F64_TOL,
        ),
        # the prompt's "any values": tanh' from exp(2z) is inf/inf = NaN past |z| ≈ 355 (a newcomer's ✓)
        CaseClass(
            "X Wᵀ has entries far past ±355 (tanh saturated: exp(2z) overflows float64)",
            st.tuples(st.integers(2, 4), st.integers(2, 4)),
            lambda p, s: _residual(p[0], p[1], s, scale=2000.0),
            **F64_TOL,
        ),
        large_class("X (8, 32), W (32, 32)", lambda s: _residual(8, 32, s), **F64_TOL),
    ],
    points=2,
    by_hand=("autograd", "helpers.numgrad.linear_backward"),
    calls=("ex2",),
)

# --------------------------------------------------------------------------- ex4


def unrepeat(grad, shape, reps):
    """∂L/∂x of shape `shape`, given grad = ∂L/∂y for y = x.repeat(*reps)."""
    shape, reps = tuple(shape), tuple(reps)
    padded = (1,) * (len(reps) - len(shape)) + shape
    split = [s for r, n in zip(reps, padded) for s in (r, n)]  # (r0, n0, r1, n1, ...)
    return grad.reshape(split).sum(tuple(range(0, len(split), 2))).reshape(shape)


def _tiled(shape, reps, seed: int, as_size: bool) -> Case:
    shape, reps = tuple(shape), tuple(reps)
    padded = (1,) * (len(reps) - len(shape)) + shape
    grad = randn(*[r * n for r, n in zip(reps, padded)], seed=seed, dtype=F64)
    return Case((grad, torch.Size(shape) if as_size else shape, reps), factors={"tiles": math.prod(reps)})


def _reps(n: int, low: int, high: int, unique: bool = False):
    """n reps in [low, high]; ``unique``: all different, so that no two ways of lining reps up with x's
    dims (from the left, from the right) agree by chance."""
    return st.lists(st.integers(low, high), min_size=n, max_size=n, unique=unique).map(tuple)


ex4 = Exercise(
    "ex4",
    "unrepeat",
    "(grad, shape, reps)",
    "Exercise 4 · unrepeat",
    unrepeat,
    ("grad_x",),
    [
        CaseClass(
            "reps is as long as x.dim() and every rep > 1",
            # at least 2-D: on a 1-D x the tiles' order (r, n) and (n, r) cannot be told apart
            hnp.array_shapes(min_dims=2, max_dims=3, min_side=2, max_side=3).flatmap(
                lambda d: st.tuples(st.just(d), _reps(len(d), 2, 3), st.just(True))
            ),
            lambda p, s: _tiled(*p[:2], s, p[2]),
            **F64_TOL,
        ),
        CaseClass(
            "some reps are 1",
            hnp.array_shapes(min_dims=2, max_dims=3, min_side=2, max_side=3)
            .flatmap(lambda d: st.tuples(st.just(d), _reps(len(d), 1, 3), st.just(False)))
            .filter(lambda p: 1 in p[1] and max(p[1]) > 1),
            lambda p, s: _tiled(*p[:2], s, p[2]),
            **F64_TOL,
        ),
        *[
            CaseClass(
                name,
                hnp.array_shapes(min_dims=2, max_dims=2, min_side=2, max_side=3).flatmap(
                    lambda d, extra=extra: st.tuples(
                        st.just(d),
                        extra.flatmap(lambda e: _reps(len(d) + e, 2, 2 + len(d) + e, unique=True)),
                        st.just(False),
                    )
                ),
                lambda p, s: _tiled(*p[:2], s, p[2]),
                **F64_TOL,
            )
            # len(reps) − x.dim(), at its least and above it: a fix for one extra dim must not pass for two
            for name, extra in (
                ("reps is one longer than x.dim() (x gets a leading dim of size 1)", st.just(1)),
                (
                    "reps is two or three longer than x.dim() (several leading dims of size 1)",
                    st.integers(2, 3),
                ),
            )
        ],
        CaseClass(
            "x has a dim of size 1 that is repeated",
            hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=3)
            .flatmap(lambda d: st.tuples(st.just(d), _reps(len(d), 1, 3), st.just(True)))
            .filter(lambda p: any(n == 1 and r > 1 for n, r in zip(p[0], p[1]))),
            lambda p, s: _tiled(*p[:2], s, p[2]),
            **F64_TOL,
        ),
        CaseClass(
            "x is 0-dim (shape ())",
            st.tuples(st.just(()), st.integers(1, 2).flatmap(lambda e: _reps(e, 2, 4)), st.just(False)),
            lambda p, s: _tiled(*p[:2], s, p[2]),
            **F64_TOL,
        ),
        large_class("x (16, 16) repeated (2, 2)", lambda s: _tiled((16, 16), (2, 2), s, False), **F64_TOL),
    ],
    points=3,
    by_hand=("autograd", "helpers.numgrad.unbroadcast"),
)

CONTRACT = Contract("lab02_chain_rule", [ex1, ex2, ex3, ex4], base_seed=20_000)
