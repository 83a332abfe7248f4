"""Lab 8's contract: each exercise's reference and its case classes, one per promise of its prompt.

The layout is nn.Linear's: y = x W'ᵀ, W' = W + s·BA, W (out, in) frozen, B (out, r), A (r, in). Every
case draws its own s (never the 2 of the old notebook's global), so an `s` ignored shows. The prompts
promise (labs/source/src/lab08_lora.py):

* ex1 ``grads_from_W_prime(grad_Wp, A, B, s)``: any out, in, r (r = 1, out = in), float32 or float64.
* ex2 ``lora_backward(g, x, W, A, B, s, needs=(True, True, True))``: 2-D g (R, out) and x (R, in);
  ``needs`` left at its default or given as any of its 8 combinations (all False included): None for a
  gradient not asked for, and no product that computes it; never an out × in product; R = 1, r = 1,
  float32.
* ex3 ``init_adapter(W, r, seed)``: ``A`` from ``helpers.device.rand`` with that seed, ±1/√in, ``B``
  zeros, both in W's dtype; r = 1, float32, square W.
* ex4 ``merge_(layer, A, B, s)`` / ex4b ``unmerge_``: an ``nn.Linear`` changed in place (the same
  Parameter, no graph, ``requires_grad`` and the bias left alone), returned; trainable or frozen, no
  bias, float32, r = 1.
* ex5 ``LoRALinearFn``: x of any (..., in) (2-D, 3-D, 4-D); the gradients autograd gets for the inputs
  that need one: W frozen (no gradient, no out × in product) or trainable (gᵀx), x plain data (no
  ∂L/∂x computed), A and B frozen; r = 1; float32.

Products are watched by ``helpers.labcontract.products_formed`` (a TorchDispatchMode) in the learner's
process for the self-check and in the tests' own process. Across the grader's boundary what must not be
formed is measured by the kernel: the classes "out = 2¹⁷ …" and "in = 2¹⁷ …" are at sizes where an out × in
matrix or an unasked gradient (3 MiB or more) does not fit the call's budget (``cap``, 2 MiB), and the
worker runs the call in a child whose address space may grow by that much only (tools/grader/worker.py).
ex5's answer calls the learner's ``lora_backward`` (ex2): its hidden tests put ex2's reference there
(``calls``), and the source's solution of ex5 runs with ex2's beside it (``_solution_function``, since
``contract.py`` runs one question's cells alone).
"""

from __future__ import annotations

import math

import contract as machinery
import hypothesis.strategies as st
import torch
from contract import Case, CaseClass, Contract, Exercise, large_class

from helpers.device import rand, randn
from helpers.labcontract import Made

F64, F32 = torch.float64, torch.float32
F64_TOL = {"atol": 1e-10, "rtol": 1e-8}
F32_TOL = {"atol": 1e-4, "rtol": 1e-4}
LAB = "lab08_lora"
# s = α/r, never the old global 2, nor r, 1/r or their squares (r ≤ 4): a ✗ naming "s ×" is never a 1/r slip
SCALES = [0.3, 0.7, 1.3, 2.5]


def _tol(dtype):
    return F32_TOL if dtype == F32 else F64_TOL


def _distinct(*n) -> bool:
    return len(set(n)) == len(n)


# --------------------------------------------------------------------------- ex1


def grads_from_W_prime(grad_Wp, A, B, s):
    """(grad_A, grad_B) of W' = W + s·BA given ∂L/∂W', by autograd."""
    A_, B_ = A.detach().clone().requires_grad_(), B.detach().clone().requires_grad_()
    with torch.enable_grad():
        return torch.autograd.grad(s * B_ @ A_, (A_, B_), grad_Wp)


def _wp_case(out, n_in, r, s, seed, dtype=F64) -> Case:
    A = randn(r, n_in, seed=seed, dtype=dtype)
    B = randn(out, r, seed=seed + 1, dtype=dtype)
    grad_Wp = randn(out, n_in, seed=seed + 2, dtype=dtype)
    return Case((grad_Wp, A, B, s), factors={"s": s, "s²": s * s})


sizes = st.tuples(st.integers(2, 6), st.integers(2, 6), st.integers(2, 4)).filter(lambda p: _distinct(*p))
scale = st.sampled_from(SCALES)
ex1 = Exercise(
    "ex1",
    "grads_from_W_prime",
    "(grad_Wp, A, B, s)",
    "Exercise 1 · grads_from_W_prime",
    grads_from_W_prime,
    ("grad_A", "grad_B"),
    [
        CaseClass(
            "out, in and r all differ",
            st.tuples(sizes, scale),
            lambda p, s: _wp_case(*p[0], p[1], s),
            **F64_TOL,
        ),
        CaseClass(
            "r = 1 (a rank-1 adapter)",
            st.tuples(st.integers(2, 6), st.integers(2, 6), scale).filter(lambda p: p[0] != p[1]),
            lambda p, s: _wp_case(p[0], p[1], 1, p[2], s),
            **F64_TOL,
        ),
        CaseClass(
            "out = in (a square W')",
            st.tuples(st.integers(3, 6), st.integers(2, 2), scale),
            lambda p, s: _wp_case(p[0], p[0], p[1], p[2], s),
            **F64_TOL,
        ),
        CaseClass(
            "s = 1",
            sizes,
            lambda p, s: _wp_case(*p, 1.0, s),
            **F64_TOL,
        ),
        CaseClass(
            "the tensors are float32",
            st.tuples(sizes, scale),
            lambda p, s: _wp_case(*p[0], p[1], s, dtype=F32),
            **F32_TOL,
        ),
        large_class(
            "W (32, 32), r 4",
            lambda s: _wp_case(32, 32, 4, 0.7, s),
            claim="the work grows with the sizes, not one product B·A per entry of A and B",
            **F64_TOL,
        ),
    ],
    points=2,
    by_hand=("autograd",),
)

# --------------------------------------------------------------------------- ex2

ALL = (True, True, True)
NAMES = ("grad_x", "grad_A", "grad_B")


def lora_backward(g, x, W, A, B, s, needs=ALL):
    """(grad_x, grad_A, grad_B) of y = xWᵀ + s(xAᵀ)Bᵀ, the cheap route, None where needs is False."""
    out = [None, None, None]
    if needs[0] or needs[1]:
        gB = g @ B  # (R, r)
        if needs[0]:
            out[0] = g @ W + s * (gB @ A)  # (R, in)
        if needs[1]:
            out[1] = s * (gB.T @ x)  # (r, in)
    if needs[2]:
        out[2] = s * (g.T @ (x @ A.T))  # (out, r)
    return tuple(out)


def _backward_case(R, n_in, out, r, s, seed, needs=None, dtype=F64) -> Case:
    g = randn(R, out, seed=seed, dtype=dtype)
    x = randn(R, n_in, seed=seed + 1, dtype=dtype)
    W = randn(out, n_in, seed=seed + 2, dtype=dtype)
    A = randn(r, n_in, seed=seed + 3, dtype=dtype)
    B = randn(out, r, seed=seed + 4, dtype=dtype)
    asked = ALL if needs is None else needs
    unasked = [sh for sh, n in zip(((R, n_in), (r, n_in), (out, r)), asked) if not n]
    terms = {"grad_x": {"the path through W, gW": g @ W, "the adapter's path, s(gB)A": s * (g @ B) @ A}}
    return Case(
        (g, x, W, A, B, s) + (() if needs is None else (needs,)),
        factors={"s": s},
        terms=terms if asked[0] else {},
        options={"returned": NAMES, "forbid": [[(out, n_in)], unasked]},
    )


# Sizes at which what the cheap route never forms does not fit. A call may allocate CAP bytes; every tensor
# it must not form (an out × in matrix, a gradient nobody asked for) is 8 MiB or more (float64), four times
# CAP: across the grader's boundary, the limit on the call's address space counts it (tools/grader/worker.py,
# capped). The large inputs are recorded as their draw (Made("helpers.device.randn", …)), not their values.
HUGE = 1 << 17
CAP = 2 << 20


def _drawn(*shape, seed):
    return Made("helpers.device.randn", *shape, seed=seed, dtype=F64)


HUGE_TOL = {"atol": 1e-8, "rtol": 1e-8}  # float64 sums of 2¹⁷ products, added up in another order


def _huge_case(R, n_in, out, r, s, seed, needs) -> Case:
    g, x = _drawn(R, out, seed=seed), _drawn(R, n_in, seed=seed + 1)
    W, A, B = _drawn(out, n_in, seed=seed + 2), _drawn(r, n_in, seed=seed + 3), _drawn(out, r, seed=seed + 4)
    unasked = [sh for sh, n in zip(((R, n_in), (r, n_in), (out, r)), needs) if not n]
    return Case(
        (g, x, W, A, B, s, needs),
        factors={"s": s},
        options={"returned": NAMES, "forbid": [[(out, n_in)], unasked], "cap": CAP},
    )


shapes2 = st.tuples(st.integers(2, 7), st.integers(2, 7), st.integers(2, 7), st.integers(1, 3), scale).filter(
    lambda p: _distinct(*p[:4])
)


def _needs_class(needs):
    asked = [n for n, a in zip(NAMES, needs) if a]
    what = ", ".join(asked) if asked else "none"
    return CaseClass(
        f"needs={needs} ({what})",
        shapes2,
        lambda p, s: _backward_case(*p, s, needs=needs),
        **F64_TOL,
    )


OUTPUTS2 = (
    "gradients returned",
    "grad_x",
    "grad_A",
    "grad_B",
    "an out × in product",
    "a product for a gradient not asked for",
)
ex2 = Exercise(
    "ex2",
    "lora_backward",
    "(g, x, W, A, B, s, needs=(True, True, True))",
    "Exercise 2 · lora_backward",
    lora_backward,
    OUTPUTS2,
    [
        CaseClass("needs is left at its default", shapes2, lambda p, s: _backward_case(*p, s), **F64_TOL),
        *[
            _needs_class(n)
            for n in (
                (True, True, True),
                (True, False, False),
                (False, True, False),
                (False, False, True),
                (False, True, True),
                (True, False, True),
                (True, True, False),
                (False, False, False),
            )
        ],
        CaseClass(
            "r = 1 (a rank-1 adapter)",
            shapes2.filter(lambda p: 1 not in p[:3]),
            lambda p, s: _backward_case(*p[:3], 1, p[4], s),
            **F64_TOL,
        ),
        CaseClass(
            "there is one row (R = 1)",
            shapes2.filter(lambda p: 1 not in (p[1], p[2], p[3])),
            lambda p, s: _backward_case(1, *p[1:], s),
            **F64_TOL,
        ),
        CaseClass(
            "the tensors are float32",
            shapes2,
            lambda p, s: _backward_case(*p, s, dtype=F32),
            **F32_TOL,
        ),
        CaseClass(
            "out = 2¹⁷ (no room for an out × in matrix or grad_B) and grad_B is not asked for",
            st.tuples(st.integers(1, 2), scale),
            lambda p, s: _huge_case(p[0], 8, HUGE, 8, p[1], s, (True, True, False)),
            **HUGE_TOL,
        ),
        CaseClass(
            "in = 2¹⁷ (no room for grad_x or grad_A) and only grad_B is asked for",
            st.tuples(st.integers(3, 5), scale),
            lambda p, s: _huge_case(8, HUGE, p[0], 8, p[1], s, (False, False, True)),
            **HUGE_TOL,
        ),
        large_class("x (8, 32), W (32, 32), r 4", lambda s: _backward_case(8, 32, 32, 4, 1.3, s), **F64_TOL),
    ],
    probe="products_formed",
    points=2,
    by_hand=("autograd", "helpers.lora.lora_linear_backward"),
    rules={"multiply_adds": 1},  # "compute g @ B once"; none for a gradient not asked for
)

# --------------------------------------------------------------------------- ex3


def init_adapter(W, r, seed):
    """(A, B): A (r, in) = (2u − 1)/√in with u = rand(seed) in float64, B (out, r) zeros; W's dtype and device."""
    out, n_in = W.shape
    u = rand(r, n_in, seed=seed, dtype=torch.float64)
    A = ((2 * u - 1) / math.sqrt(n_in)).to(dtype=W.dtype, device=W.device)
    return A, torch.zeros(out, r, dtype=W.dtype, device=W.device)


def _init_case(out, n_in, r, seed_arg, seed, dtype=F64, device="cpu") -> Case:
    W = randn(out, n_in, seed=seed, dtype=dtype).to(device)
    return Case((W, r, seed_arg), factors={"√in": math.sqrt(n_in)})


seeds = st.integers(1, 999).filter(lambda k: k != 5)  # not the old notebook's seed 5
sizes3 = sizes.filter(lambda p: p[2] != 3)  # nor its rank 3
ex3 = Exercise(
    "ex3",
    "init_adapter",
    "(W, r, seed)",
    "Exercise 3 · init_adapter",
    init_adapter,
    ("A", "B"),
    [
        CaseClass(
            "W is float64",
            st.tuples(sizes3, seeds),
            lambda p, s: _init_case(*p[0], p[1], s),
            atol=0,
            rtol=1e-12,
        ),
        CaseClass(
            "W is float32 (A and B in float32)",
            st.tuples(sizes3, seeds),
            lambda p, s: _init_case(*p[0], p[1], s, dtype=F32),
            atol=0,
            # below float32's half ulp (6e-8): A is the float64 recipe rounded once; a draw made in float32
            # (24 random bits, not 53) is off by an ulp or more in some entry
            rtol=3e-8,
        ),
        CaseClass(
            "r = 1 (a rank-1 adapter)",
            st.tuples(st.integers(2, 6), st.integers(2, 6), seeds),
            lambda p, s: _init_case(p[0], p[1], 1, p[2], s),
            atol=0,
            rtol=1e-12,
        ),
        CaseClass(
            "W is square (out = in)",
            st.tuples(st.integers(3, 6), st.integers(2, 2), seeds),
            lambda p, s: _init_case(p[0], p[0], p[1], p[2], s),
            atol=0,
            rtol=1e-12,
        ),
        # the prompt's "W's device": a newcomer's A and B made on the CPU whatever W's (s10, ✓ before); the
        # meta device holds no values, so this class sees where they are made, their shapes and dtypes
        CaseClass(
            "W is on the meta device (A and B made there)",
            st.tuples(sizes3, seeds),
            lambda p, s: _init_case(*p[0], p[1], s, device="meta"),
            atol=0,
            rtol=0,
        ),
    ],
    points=2,
)

# --------------------------------------------------------------------------- ex4


def merge_(layer, A, B, s):
    """layer.weight += s·BA in place (no graph); returns layer."""
    with torch.no_grad():
        layer.weight.add_(torch.einsum("or,ri->oi", B, A), alpha=s)
    return layer


def unmerge_(layer, A, B, s):
    """layer.weight −= s·BA in place (no graph); returns layer."""
    with torch.no_grad():
        layer.weight.sub_(torch.einsum("or,ri->oi", B, A), alpha=s)
    return layer


def _layer_case(
    out, n_in, r, s, seed, merged=False, frozen=False, bias=True, dtype=F64, train_ab=False
) -> Case:
    W = randn(out, n_in, seed=seed, dtype=dtype)
    A = randn(r, n_in, seed=seed + 1, dtype=dtype)
    B = randn(out, r, seed=seed + 2, dtype=dtype)
    state = {"weight": W + s * B @ A if merged else W}
    if bias:
        state["bias"] = randn(out, seed=seed + 3, dtype=dtype)
    maker = "helpers.labcontract.frozen_linear" if frozen else "torch.nn.Linear"
    layer = Made(maker, n_in, out, bias=bias, dtype=dtype, state=state)
    if train_ab:  # the adapter in training: a merge outside no_grad leaves the weight a graph
        A, B = Made("torch.nn.Parameter", A), Made("torch.nn.Parameter", B)
    return Case((layer, A, B, s))


OUTPUTS4 = ("returned", "weight", "bias", "weight after", "weight.requires_grad", "weight's graph")


def _layer_classes(merged: bool) -> list:
    def make(**kw):
        return lambda p, s: _layer_case(*p[0], p[1], s, merged=merged, **kw)

    return [
        CaseClass("the layer is trainable (requires_grad)", st.tuples(sizes, scale), make(), **F64_TOL),
        CaseClass(
            "the layer is frozen (requires_grad False)", st.tuples(sizes, scale), make(frozen=True), **F64_TOL
        ),
        CaseClass(
            "the layer is frozen and A, B are trainable (they require grad, as in training)",
            st.tuples(sizes, scale),
            make(frozen=True, train_ab=True),
            **F64_TOL,
        ),
        CaseClass("the layer has no bias", st.tuples(sizes, scale), make(bias=False), **F64_TOL),
        CaseClass("the layer is float32", st.tuples(sizes, scale), make(dtype=F32), **F32_TOL),
        CaseClass(
            "r = 1 (a rank-1 adapter)",
            st.tuples(st.tuples(st.integers(2, 6), st.integers(2, 6), st.just(1)), scale),
            make(),
            **F64_TOL,
        ),
    ]


ex4 = Exercise(
    "ex4",
    "merge_",
    "(layer, A, B, s)",
    "Exercise 4 · merge_",
    merge_,
    OUTPUTS4,
    _layer_classes(merged=False),
    probe="layer_after",
    in_place=True,
    points=2,
    by_hand=("helpers.lora.merge_lora", "helpers.lora.unmerge_lora"),
)
ex4b = Exercise(
    "ex4b",
    "unmerge_",
    "(layer, A, B, s)",
    "Exercise 4 · unmerge_",
    unmerge_,
    OUTPUTS4,
    _layer_classes(merged=True),
    question="ex4",
    probe="layer_after",
    in_place=True,
)

# --------------------------------------------------------------------------- ex5


class LoRALinearFn(torch.autograd.Function):
    """y = xWᵀ + s(xAᵀ)Bᵀ; backward by the cheap route, each gradient only when asked for."""

    @staticmethod
    def forward(x, W, A, B, s):
        return x @ W.T + s * ((x @ A.T) @ B.T)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, W, A, B, s = inputs
        ctx.save_for_backward(x, W, A, B)
        ctx.s = s

    @staticmethod
    def backward(ctx, grad_y):
        x, W, A, B = ctx.saved_tensors
        nx, nW, nA, nB, _ = ctx.needs_input_grad
        g2, x2 = grad_y.reshape(-1, grad_y.shape[-1]), x.reshape(-1, x.shape[-1])
        gx, gA, gB = lora_backward(g2, x2, W, A, B, ctx.s, (nx, nA, nB))
        return None if gx is None else gx.reshape(x.shape), g2.T @ x2 if nW else None, gA, gB, None


def _fn_case(lead, n_in, out, r, s, seed, wrt=(0, 2, 3), dtype=F64, huge=False) -> Case:
    draw = _drawn if huge else (lambda *shape, seed: randn(*shape, seed=seed, dtype=dtype))
    x = draw(*lead, n_in, seed=seed)
    W = draw(out, n_in, seed=seed + 1)
    A = draw(r, n_in, seed=seed + 2)
    B = draw(out, r, seed=seed + 3)
    g = draw(*lead, out, seed=seed + 4)
    R = math.prod(lead)
    forbid = [[] if 1 in wrt else [(out, n_in)], [] if 0 in wrt else [(R, n_in)]]
    options = {
        "returned": ("y", "grad_x", "grad_W", "grad_A", "grad_B"),
        # what autograd gets, and what the Function saved for backward ("save x, W, A, B")
        "inner": "backward_and_saved",
        "which": True,
        "wrt": wrt,
        "report": (0, 1, 2, 3),
        "grad_output": g,
        "forbid": forbid,
    }
    if huge:
        options["cap"] = CAP
    return Case((x, W, A, B, s), options=options)


dims5 = st.tuples(st.integers(3, 7), st.integers(2, 6), st.integers(1, 2), scale).filter(
    lambda p: _distinct(*p[:3])
)  # (in, out, r, s)
lead3 = st.tuples(st.integers(2, 3), st.integers(2, 4))
OUTPUTS5 = (
    "outputs and gradients autograd got",
    "y",
    "grad_x",
    "grad_W",
    "grad_A",
    "grad_B",
    "tensors saved for backward",
    "grad_y after backward",
    "an out × in product",
    "a product shaped like ∂L/∂x",
)


def _fn_shapes(lead):
    """(lead, (in, out, r, s)) with R = the rows, in, out and r all different (no product's shape is ambiguous)."""
    return st.tuples(lead, dims5).filter(lambda p: _distinct(math.prod(p[0]), *p[1][:3]))


def _fn_class(name, lead=lead3, tol=F64_TOL, **kw):
    return CaseClass(name, _fn_shapes(lead), lambda p, s: _fn_case(p[0], *p[1], s, **kw), **tol)


ex5 = Exercise(
    "ex5",
    "LoRALinearFn",
    "(torch.autograd.Function)",
    "Exercise 5 · LoRALinearFn",
    LoRALinearFn,
    OUTPUTS5,
    [
        _fn_class("x is 3-D (batch, tokens, in) and W is frozen"),
        _fn_class("x is 2-D (R, in)", lead=st.tuples(st.integers(2, 5))),
        _fn_class(
            "x has 4 dims (…, in)", lead=st.tuples(st.integers(2, 2), st.integers(2, 3), st.integers(2, 3))
        ),
        _fn_class("W is trainable (it gets gᵀx)", wrt=(0, 1, 2, 3)),
        _fn_class("x is plain data (only A and B need gradients)", wrt=(2, 3)),
        _fn_class("only x needs a gradient (A and B frozen too)", wrt=(0,)),
        CaseClass(
            "r = 1 (a rank-1 adapter)",
            _fn_shapes(lead3).filter(lambda p: 1 not in p[1][:2]),
            lambda p, s: _fn_case(p[0], p[1][0], p[1][1], 1, p[1][3], s),
            **F64_TOL,
        ),
        _fn_class("the tensors are float32", tol=F32_TOL, dtype=F32),
        CaseClass(
            "in = 2¹⁷ and only B trains (no room for an out × in matrix, ∂L/∂x or ∂L/∂A)",
            st.tuples(st.sampled_from([2, 4]), scale),
            lambda p, s: _fn_case((p[0], 8 // p[0]), HUGE, 8, 8, p[1], s, wrt=(3,), huge=True),
            **HUGE_TOL,
        ),
        large_class(
            "x (2, 4, 32), W (32, 32), r 4", lambda s: _fn_case((2, 4), 32, 32, 4, 0.7, s), **F64_TOL
        ),
    ],
    probe="products_formed",
    calls=("ex2",),
    points=3,
    by_hand=("autograd", "helpers.lora.lora_linear_backward"),
)

# ------------------------------------------------------------ the machinery's gap, worked around here

_plain_solution_function = machinery.solution_function


def _solution_function(lab, exercise, edits=()):
    """The machinery's solution_function; for ex5 of this lab, ex2's solution (lora_backward) beside it."""
    fn = _plain_solution_function(lab, exercise, edits)
    if lab == LAB and exercise.question == "ex5":
        import mutants  # tools/, on the path once the machinery's solution_function ran

        setup, sols = machinery._solutions(lab)
        ns: dict = {"__name__": "__contract__"}
        for code in [*setup, *sols["ex2"]]:
            mutants._run(code, ns)
        where = fn.forward.__globals__
        for name, value in ns.items():
            where.setdefault(name, value)
    return fn


machinery.solution_function = _solution_function  # chained: another lab's wrapper stays underneath

CONTRACT = Contract(LAB, [ex1, ex2, ex3, ex4, ex4b, ex5], base_seed=80_000)
