# %% [raw]
# # ASSIGNMENT CONFIG
# name: lab08_lora
# init_cell: false
# check_all_cell: false
# export_cell: false
# run_tests: true
# generate:
#   pdf: false
#   show_stdout: false

# %% [markdown]
# # Lab 8 · LoRA's Function and merge
#
# Chapter 8 derived LoRA's gradients, rewrote them so that the big matrices $W'$ and
# $\partial L/\partial W'$ are never formed, and packaged that as an `autograd.Function`. Here
# you write each piece yourself. The layout is `nn.Linear`'s throughout:
#
# $$\begin{gathered}
# y = x\,W'^\top,\qquad W' = W + s\,BA,\qquad s = \alpha/r, \\
# W\ (\text{out}\times\text{in})\ \text{frozen},\quad B\ (\text{out}\times r),\quad A\ (r\times\text{in}).
# \end{gathered}$$
#
# This lab goes with [Chapter 8](../chapters/08_lora.ipynb).
#
# **Learning goals.** After this lab you can
# * get $\partial L/\partial A$ and $\partial L/\partial B$ from $\partial L/\partial W'$ with the
#   product rule, in the right shapes;
# * compute the same gradients (and $\partial L/\partial x$) the cheap way, through the
#   r-dimensional activation $xA^\top$, without any out × in matrix;
# * initialise an adapter so that the adapted layer starts *exactly* at the base, and say why
#   $\partial L/\partial A = 0$ at step 0;
# * merge an adapter into $W$ for inference and take it back out;
# * write LoRA as a modern `autograd.Function` whose frozen $W$ gets no gradient, that computes
#   only the gradients asked for, and that passes `gradcheck` in float64.
#
# **How a lab works.** Each exercise states its goal and its points (11 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It answers in one line: `✓` matches (the `max|Δ|` is round-off), `✗`
# what is wrong and where, or `·` not implemented yet. Your instructor grades the notebook
# you hand in with hidden tests that call the same functions on other inputs.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import copy
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from helpers.device import get_device, no_tf32, rand, randn
from helpers.labcheck import Mistake, autograd_grads, check, checker, evaluate
from helpers.lora import LoRALinear, delta_weight, lora_linear

dev = get_device()
no_tf32()
dtype = torch.float64  # exact checks and gradcheck: float64

# one small layer for the self-checks: in = 6, out = 4, r = 3 (all different, so a
# transposed
# matrix shows up as a wrong shape), α = 6, so s = α/r = 2
d_in, d_out, r, alpha = 6, 4, 3, 6.0
s = alpha / r
W = randn(d_out, d_in, seed=1, dtype=dtype, device=dev)  # (out, in), frozen
A = randn(r, d_in, seed=2, dtype=dtype, device=dev)  # (r, in)
# (out, r): non-zero, as after training
B = randn(d_out, r, seed=3, dtype=dtype, device=dev)
x = randn(5, d_in, seed=4, dtype=dtype, device=dev)  # (R, in): 5 rows
g = randn(5, d_out, seed=5, dtype=dtype, device=dev)  # ∂L/∂y, (R, out)

# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2
# by_hand: [autograd]

# %% [markdown]
# ## Exercise 1 · $\partial L/\partial A$ and $\partial L/\partial B$ from $\partial L/\partial W'$ (2 points)
#
# **Goal:** the product rule on $W' = W + s\,BA$: for $Y = PQ$, $dP = dY\,Q^\top$ and
# $dQ = P^\top dY$.
#
# Write `grads_from_W_prime(grad_Wp, A, B, s)`: given `grad_Wp` $= \partial L/\partial W'$
# (out, in), return `(grad_A, grad_B)`, of shapes (r, in) and (out, r). Derive them first:
# $W'$ depends on $A$ and $B$ only through the product $BA$, scaled by $s$; check that each
# gradient has the shape of what it is the gradient of. (This is the route of chapter 8,
# section 1: correct, but it needs the out × in $\partial L/\partial W'$, exactly the size of
# the weight we froze.)
#
# <details><summary>Hint: the formulas (check yours against them)</summary>
#
# $\partial L/\partial A = s\,B^\top\,\partial L/\partial W'$ (r, in) and
# $\partial L/\partial B = s\,\partial L/\partial W'\,A^\top$ (out, r): the scale appears once
# in each.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def grads_from_W_prime(grad_Wp, A, B, s):
    """grad_A = s·Bᵀ grad_Wp (r, in), grad_B = s·grad_Wp Aᵀ (out, r), W' = W + s·BA."""
    # BEGIN SOLUTION
    grad_A = s * (B.T @ grad_Wp)  # (r, out) @ (out, in) -> (r, in)
    grad_B = s * (grad_Wp @ A.T)  # (out, in) @ (in, r) -> (out, r)
    return grad_A, grad_B
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import get_device, no_tf32, rand, randn

_W = randn(7, 3, seed=801, dtype=torch.float64)
_A = randn(2, 3, seed=802, dtype=torch.float64, requires_grad=True)
_B = randn(7, 2, seed=803, dtype=torch.float64, requires_grad=True)
_G = randn(7, 3, seed=804, dtype=torch.float64)
_ref = torch.autograd.grad(_W + 0.75 * _B @ _A, (_A, _B), _G)
_gA, _gB = grads_from_W_prime(_G, _A.detach(), _B.detach(), 0.75)
assert _gA.shape == (2, 3) and _gB.shape == (7, 2)
assert torch.allclose(_gA, _ref[0], atol=1e-12) and torch.allclose(
    _gB, _ref[1], atol=1e-12
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import get_device, no_tf32, rand, randn

# the scale is applied once, and rank 1 works (no squeezing of a size-1 dim)
_A = randn(1, 5, seed=805, dtype=torch.float64)
_B = randn(2, 1, seed=806, dtype=torch.float64)
_G = randn(2, 5, seed=807, dtype=torch.float64)
_gA1, _gB1 = grads_from_W_prime(_G, _A, _B, 1.0)
_gA3, _gB3 = grads_from_W_prime(_G, _A, _B, 3.0)
assert _gA1.shape == (1, 5) and _gB1.shape == (2, 1)
assert torch.allclose(_gA3, 3 * _gA1, atol=1e-14) and torch.allclose(
    _gB1, _G @ _A.T, atol=1e-14
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: autograd through $W + s\,BA$, with a random $\partial L/\partial W'$;
# first, whether the two gradients come back in the order asked for, told by their shapes):


# %%
@checker  # the check's own code: an error in it is not placed in yours
def in_order(fn):
    """fn, returning first which gradient came first, told by the shapes (A, B, Aᵀ and
    Bᵀ all differ): a swapped pair is named with what each one is, transposed or not."""

    def run(grad_Wp, A, B, s):
        grads = fn(grad_Wp, A, B, s)
        if grads is None or grads is ...:
            return grads
        if not isinstance(grads, (tuple, list)) or len(grads) != 2:
            return (f"a {type(grads).__name__}, not a pair", None, None)
        names = {A.shape: "grad_A", A.T.shape: "grad_Aᵀ"}
        names |= {B.shape: "grad_B", B.T.shape: "grad_Bᵀ"}
        seen = [names.get(getattr(t, "shape", None), "?") for t in grads]
        swapped = seen[0].startswith("grad_B") and seen[1].startswith("grad_A")
        return (f"({seen[0]}, {seen[1]})" if swapped else "(grad_A, grad_B)", *grads)

    return run


grad_Wp1 = g.T @ x  # (out, R) @ (R, in) -> (out, in)
expected = autograd_grads(lambda A_, B_: W + s * B_ @ A_, (A, B), grad_Wp1)
check(
    in_order(grads_from_W_prime),
    ("(grad_A, grad_B)", *expected),
    args=(grad_Wp1, A, B, s),
    outputs=("order returned", "grad_A", "grad_B"),
    name="Exercise 1 · grads_from_W_prime",
    against="autograd",
    factors={"s": s, "s²": s * s},
    mistakes={
        "order returned": {
            "the pair swapped": "(grad_B, grad_A)",
            "the pair swapped, each one transposed": "(grad_Bᵀ, grad_Aᵀ)",
        }
    },
)

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 2
# by_hand: [autograd, helpers.lora.lora_linear_backward]

# %% [markdown]
# ## Exercise 2 · The cheap route: never form $W'$ or $\partial L/\partial W'$ (2 points)
#
# **Goal:** regroup the products so that the only new activation is the r-dimensional
# $xA^\top$. With $g = \partial L/\partial y$ (R, out) and $x$ (R, in), derive
# $\partial L/\partial x$ (R, in), $\partial L/\partial A$ (r, in) and $\partial L/\partial B$
# (out, r) from $y = xW^\top + s\,(xA^\top)B^\top$, without ever multiplying two factors whose
# product is out × in.
#
# Write `lora_backward(g, x, W, A, B, s, needs=(True, True, True))` returning
# `(grad_x, grad_A, grad_B)` for 2-D `g` and `x`. `needs` says which of the three to compute:
# return `None` for the others, **without computing them** (exercise 5 uses this; the
# self-check watches which products you form). No product may produce an out × in matrix:
# no `B @ A`, no `g.T @ x` (the self-check lists the shapes of your products; a hidden test
# counts the multiply–adds). Compute `g @ B` once if two gradients need it.
#
# <details><summary>Hint 1: where to start</summary>
#
# Chapter 8's $\partial L/\partial W' = g^\top x$ plugged into exercise 1 gives correct
# formulas with the out × in matrix in them; matrix products are associative, so move the
# parentheses until every product has $r$ (or R) on one side. $\partial L/\partial x$ has two
# paths: through $W$ and through the adapter.
#
# </details>
#
# <details><summary>Hint 2: the formulas (check yours against them)</summary>
#
# $$\begin{aligned}
# \frac{\partial L}{\partial B} &= s\,g^\top(xA^\top), &
# \frac{\partial L}{\partial A} &= s\,(gB)^\top x, \\
# \frac{\partial L}{\partial x} &= gW + s\,(gB)\,A. & &
# \end{aligned}$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def lora_backward(g, x, W, A, B, s, needs=(True, True, True)):
    """grad_x = gW + s(gB)A, grad_A = s(gB)ᵀx, grad_B = s·gᵀ(xAᵀ); None where needs is
    False."""
    # BEGIN SOLUTION
    need_x, need_A, need_B = needs
    grad_x = grad_A = grad_B = None
    if need_x or need_A:
        g_r = g @ B  # (R, out) @ (out, r) -> (R, r): g in the rank-r space
    if need_x:
        # (R, out) @ (out, in) + (R, r) @ (r, in) -> (R, in)
        grad_x = g @ W + s * g_r @ A
    if need_A:
        grad_A = s * g_r.T @ x  # (r, R) @ (R, in) -> (r, in)
    if need_B:
        grad_B = s * g.T @ (x @ A.T)  # (out, R) @ ((R, in) @ (in, r)) -> (out, r)
    return (grad_x, grad_A, grad_B)
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import get_device, no_tf32, rand, randn

_W = randn(3, 8, seed=811, dtype=torch.float64)
_x = randn(9, 8, seed=812, dtype=torch.float64, requires_grad=True)
_A = randn(2, 8, seed=813, dtype=torch.float64, requires_grad=True)
_B = randn(3, 2, seed=814, dtype=torch.float64, requires_grad=True)
_g = randn(9, 3, seed=815, dtype=torch.float64)
_ref = torch.autograd.grad(_x @ (_W + 0.5 * _B @ _A).T, (_x, _A, _B), _g)
_ours = lora_backward(_g, _x.detach(), _W, _A.detach(), _B.detach(), 0.5)
assert [tuple(t.shape) for t in _ours] == [(9, 8), (2, 8), (3, 2)]
assert all(torch.allclose(o, e, atol=1e-12) for o, e in zip(_ours, _ref))
_only_A = lora_backward(
    _g, _x.detach(), _W, _A.detach(), _B.detach(), 0.5, needs=(False, True, False)
)
assert (
    _only_A[0] is None
    and _only_A[2] is None
    and torch.allclose(_only_A[1], _ref[1], atol=1e-12)
)
_only_xB = lora_backward(
    _g, _x.detach(), _W, _A.detach(), _B.detach(), 0.5, needs=(True, False, True)
)
assert _only_xB[1] is None and torch.allclose(_only_xB[0], _ref[0], atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers.device import get_device, no_tf32, rand, randn

# one row, r = 2, in = out = 64: g @ W costs 64·64 multiply-adds; forming B @ A (or gᵀx)
# would add
# at least as many again, everything else of the cheap route is a few hundred
_W = randn(64, 64, seed=816, dtype=torch.float64)
_x = randn(1, 64, seed=817, dtype=torch.float64, requires_grad=True)
_A = randn(2, 64, seed=818, dtype=torch.float64, requires_grad=True)
_B = randn(64, 2, seed=819, dtype=torch.float64, requires_grad=True)
_g = randn(1, 64, seed=820, dtype=torch.float64)
_ref = torch.autograd.grad(_x @ (_W + 2.0 * _B @ _A).T, (_x, _A, _B), _g)
with FlopCounterMode(display=False) as _fc:
    _ours = lora_backward(_g, _x.detach(), _W, _A.detach(), _B.detach(), 2.0)
assert all(torch.allclose(o, e, atol=1e-12) for o, e in zip(_ours, _ref))
assert _fc.get_total_flops() <= 2 * 64 * 64 * 1.5

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers.device import randn

# needs honoured: one row, in = out = 64, r = 16, so every product is counted apart:
# g @ W costs 2·64·64 flops, each rank-r product 2·64·16 = 2048
_W = randn(64, 64, seed=860, dtype=torch.float64)
_x = randn(1, 64, seed=861, dtype=torch.float64, requires_grad=True)
_A = randn(16, 64, seed=862, dtype=torch.float64, requires_grad=True)
_B = randn(64, 16, seed=863, dtype=torch.float64, requires_grad=True)
_g = randn(1, 64, seed=864, dtype=torch.float64)
_ref = torch.autograd.grad(_x @ (_W + 0.5 * _B @ _A).T, (_x, _A, _B), _g)
# needs -> (index of the one gradient asked for, flops of the cheap route for it)
_cases = {
    (True, False, False): (0, 2 * 64 * 64 + 2 * 2048),
    (False, True, False): (1, 2 * 2048),
    (False, False, True): (2, 2 * 2048),
}
for _needs, (_i, _flops) in _cases.items():
    with FlopCounterMode(display=False) as _fc:
        _out = lora_backward(
            _g, _x.detach(), _W, _A.detach(), _B.detach(), 0.5, needs=_needs
        )
    assert all((o is None) == (j != _i) for j, o in enumerate(_out))
    assert torch.allclose(_out[_i], _ref[_i], atol=1e-12)
    assert _fc.get_total_flops() <= _flops + 1000  # nothing that was not asked for

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: autograd through $y = x\,(W + s\,BA)^\top$; then the shapes
# of the matrix products your function forms, watched by `Products` below: none may be
# out × in, and a call with one flag of `needs` off must neither return nor compute that
# gradient):

# %%
import threading

from torch.utils._python_dispatch import TorchDispatchMode

# what every matrix product becomes inside torch (x @ W.T, torch.matmul, einsum,
# F.linear), on any device
aten = torch.ops.aten
PRODUCT_OPS = {aten.mm, aten.bmm, aten.addmm, aten.baddbmm, aten.addbmm}
PRODUCT_OPS |= {aten.mv, aten.addmv, aten.dot, aten.vdot, aten._addmm_activation}


@checker  # the check's own code: its frames are not yours
class Products(TorchDispatchMode):
    """Records the shape of every matrix product computed inside the with-block
    (backward too).

    On a GPU autograd runs backward on a worker thread of its own; inside the block it
    runs on this thread instead (set_multithreading_enabled(False)), where this mode is
    sure to see it, and a lock guards the list all the same."""

    def __init__(self):
        super().__init__()
        self.shapes = []
        self.lock = threading.Lock()

    def __enter__(self):
        self.one_thread = torch.autograd.set_multithreading_enabled(False)
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self.one_thread.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket in PRODUCT_OPS:
            with self.lock:
                self.shapes.append(tuple(out.shape))
        return out


@checker
def formed(shapes, shape):
    """How many of the recorded products have this shape or its transpose."""
    return sum(sh in (tuple(shape), tuple(shape)[::-1]) for sh in shapes)


GRAD_NAMES = ("grad_x", "grad_A", "grad_B")


@checker
def lora_backward_watched(g, x, W, A, B, s):
    """(grad_x, grad_A, grad_B, out × in products formed, then one report per needs)."""
    with Products() as products:
        grads = lora_backward(g, x, W, A, B, s)
    if grads is None or any(t is None for t in grads):
        raise NotImplementedError
    reports = []
    for off in range(3):
        needs = tuple(i != off for i in range(3))
        try:
            with Products() as seen:
                out = lora_backward(g, x, W, A, B, s, needs=needs)
        except Exception as e:  # which call failed: the one with this needs
            e.args = (f"with needs={needs}: {e}",)
            raise
        faults = [
            f"{n} is None, though asked for"
            for n, need, t in zip(GRAD_NAMES, needs, out)
            if need and t is None
        ]
        if out[off] is not None:
            faults.append(f"{GRAD_NAMES[off]} returned, though not asked for")
        elif formed(seen.shapes, grads[off].shape):
            faults.append(f"{GRAD_NAMES[off]} computed, though not asked for")
        reports.append("; ".join(faults) or "as asked")
    return (*grads, formed(products.shapes, W.shape), *reports)


needs_names = [f"needs={tuple(i != off for i in range(3))}" for off in range(3)]
expected = autograd_grads(lambda x_, A_, B_: x_ @ (W + s * B_ @ A_).T, (x, A, B), g)
check(
    lora_backward_watched,
    (*expected, 0, *["as asked"] * 3),
    args=(g, x, W, A, B, s),
    outputs=(*GRAD_NAMES, "out × in products formed", *needs_names),
    counts=("out × in products formed",),
    factors={"s": s},
    mistakes={
        "grad_B": {"s·gᵀ(gB) (B's factor gB where A's belongs)": s * g.T @ (g @ B)}
    },
    terms={
        "grad_x": {
            "the path through W, gW": g @ W,
            "the adapter's path, s(gB)A": s * (g @ B) @ A,
        }
    },
    name="Exercise 2 · lora_backward",
    against="autograd; no out × in product, needs honoured",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 2

# %% [markdown]
# ## Exercise 3 · Initialisation: start exactly at the base (2 points)
#
# **Goal:** with $B = 0$ the product $BA$ is $0$, so the adapted layer starts equal to the base,
# and at step 0 $\partial L/\partial A = s\,(gB)^\top x = 0$ while
# $\partial L/\partial B = s\,g^\top(xA^\top) \ne 0$: $B$ moves first.
#
# Write `init_adapter(W, r, seed)` returning `(A, B)` as the reference implementations do:
# * `A` (r, in): Kaiming-uniform with $a=\sqrt5$, i.e. uniform on $[-1/\sqrt{\text{in}},
#   1/\sqrt{\text{in}})$. Draw it as
#   `(2 * rand(r, d_in, seed=seed, dtype=torch.float64) - 1) / math.sqrt(d_in)` (`rand` is
#   `helpers.device.rand`, imported above), then convert it to `W`'s dtype and device;
# * `B` (out, r): zeros, `W`'s dtype and device.
#
# The self-check then runs one step-0 forward and backward with your `A` and `B`.

# %% [raw]
# # BEGIN SOLUTION


# %%
def init_adapter(W, r, seed):
    """A (r, in) uniform on ±1/√in (Kaiming-uniform, a = √5), B (out, r) zeros; W's
    dtype and device."""
    # BEGIN SOLUTION
    d_out_, d_in_ = W.shape
    # (r, in)
    A0 = (2 * rand(r, d_in_, seed=seed, dtype=torch.float64) - 1) / math.sqrt(d_in_)
    B0 = torch.zeros(d_out_, r, dtype=W.dtype, device=W.device)  # (out, r)
    return A0.to(dtype=W.dtype, device=W.device), B0
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

import torch
from torch import nn

from helpers.lora import LoRALinear

_W = torch.randn(
    5, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(821)
)
_A, _B = init_adapter(_W, 2, 7)
assert (
    _A.shape == (2, 9) and _B.shape == (5, 2) and _A.dtype == _B.dtype == torch.float64
)
assert torch.equal(_B, torch.zeros(5, 2, dtype=torch.float64))
assert _A.abs().max() <= 1 / math.sqrt(9) and _A.abs().max() > 0.5 / math.sqrt(9)
_base = nn.Linear(9, 5, bias=False).double()
_ref = LoRALinear(_base, r=2, alpha=4.0, seed=7)
assert torch.allclose(_A, _ref.lora_A.detach(), atol=1e-15)
_W32 = _W.float()
_A32, _B32 = init_adapter(_W32, 3, 8)
assert (
    _A32.dtype == _B32.dtype == torch.float32
    and _A32.shape == (3, 9)
    and _B32.shape == (5, 3)
)
assert not torch.equal(_A32[:2], _A.float())  # another seed, other numbers

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as F

from helpers.device import get_device, no_tf32, rand, randn
from helpers.lora import lora_linear

# step 0: the adapted layer equals the base bit for bit, ∂L/∂A = 0 exactly, ∂L/∂B ≠ 0
_W = randn(6, 10, seed=822, dtype=torch.float64)
_b = randn(6, seed=823, dtype=torch.float64)
_x = randn(4, 10, seed=824, dtype=torch.float64)
_A, _B = init_adapter(_W, 3, 11)
_A, _B = _A.clone().requires_grad_(), _B.clone().requires_grad_()
_y = lora_linear(_x, _W, _b, _A, _B, 6.0, 3)
assert torch.equal(_y, F.linear(_x, _W, _b))
_gA, _gB = torch.autograd.grad(_y, (_A, _B), randn(4, 6, seed=825, dtype=torch.float64))
assert torch.equal(_gA, torch.zeros_like(_gA)) and _gB.abs().max() > 1e-3

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (reference: `helpers.lora.LoRALinear`'s initialisation with the same seed, 5, on a float32
# `W`, after which of your `A` and `B` is all zeros; then, with your `A` and `B`, one forward
# and backward of the adapted layer):


# %%
@checker
def check_init(fn, W, r, seed, x, g, name="Exercise 3 · init_adapter"):
    """Your (A, B) vs LoRALinear's init; if they match, what step 0 looks like with
    them."""

    def init(seed):
        base = nn.Linear(W.shape[1], W.shape[0], bias=False).to(W)
        return LoRALinear(base, r=r, alpha=alpha, seed=seed).lora_A.detach()

    def zero_factor(W, r, seed):
        """fn's (A, B), after which is all zeros: 'A', 'B', 'both' or 'neither'."""
        out = fn(W, r, seed)
        if out is None or out is ... or not isinstance(out, (tuple, list)):
            return out
        zero = [isinstance(t, torch.Tensor) and not t.any() for t in out]
        names = [n for n, z in zip("AB", zero) if z]
        which = "both" if len(names) == 2 else (names[0] if names else "neither")
        return (which, *out)

    ref_A, sq = init(seed), math.sqrt(W.shape[1])
    result = evaluate(
        zero_factor,
        ("B", ref_A, torch.zeros(W.shape[0], r, dtype=W.dtype, device=W.device)),
        args=(W, r, seed),
        outputs=("zero factor", "A", "B"),
        name=name,
        against="LoRALinear's init",
        factors={"√in": sq},
        mistakes={
            "zero factor": {
                "the roles of A and B swapped": "A",
                "both zero: the adapter can never move": "both",
                "neither: B·A ≠ 0, the layer does not start at the base": "neither",
            },
            "A": {
                "a draw on [0, 1/√in): the 2u − 1 left out": (ref_A + 1 / sq) / 2,
                "A drawn as (in, r), then transposed": ref_A.reshape(-1, r).T,
                "seed 0's draw: the seed argument ignored": init(0),
            },
        },
    )
    print(result.line)
    if result:
        A0, B0 = (t.detach().clone().requires_grad_() for t in fn(W, r, seed))
        y = lora_linear(x, W, None, A0, B0, alpha, r)
        grad_A0, grad_B0 = torch.autograd.grad(y, (A0, B0), g)
        same = torch.equal(y, F.linear(x, W))
        zero_A, zero_B = bool((grad_A0 == 0).all()), bool((grad_B0 == 0).all())
        print(
            f"  step 0 with your A, B: adapted output == base output: {same}; "
            f"∂L/∂A == 0: {zero_A}; ∂L/∂B == 0: {zero_B}"
        )


# float32 (a learner's A must take W's dtype), seed 5 (the seed must be used)
check_init(init_adapter, W.float(), r, 5, x.float(), g.float())

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 2
# by_hand: [helpers.lora.merge_lora, helpers.lora.unmerge_lora]

# %% [markdown]
# ## Exercise 4 · Merge and unmerge (2 points)
#
# **Goal:** for inference, fold the adapter into the weight once, $W \leftarrow W + s\,BA$: the
# layer is a plain `nn.Linear` again (no extra matmuls); unmerging subtracts it back, to
# round-off.
#
# Write `merge_(layer, A, B, s)` and `unmerge_(layer, A, B, s)` for an `nn.Linear` `layer`:
# change `layer.weight` **in place** (the same `Parameter`; inside `torch.no_grad()`, since
# autograd must not record this) by $+s\,BA$ or $-s\,BA$, and return `layer`. Leave the bias
# and `requires_grad` alone. The merged layer's output must equal the unmerged
# $xW^\top + b + s\,(xA^\top)B^\top$ to float tolerance (the additions happen in another order,
# so not bit for bit), and merge then unmerge must give $W$ back.

# %% [raw]
# # BEGIN SOLUTION


# %%
def merge_(layer, A, B, s):
    """layer.weight ← W + s·BA, in place; returns layer."""
    # BEGIN SOLUTION
    with torch.no_grad():
        layer.weight += s * (B @ A)  # (out, r) @ (r, in) -> (out, in)
    return layer
    # END SOLUTION


def unmerge_(layer, A, B, s):
    """layer.weight ← W − s·BA, in place; returns layer."""
    # BEGIN SOLUTION
    with torch.no_grad():
        layer.weight -= s * (B @ A)  # (out, r) @ (r, in) -> (out, in)
    return layer
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
from torch import nn

from helpers.device import get_device, no_tf32, rand, randn
from helpers.lora import lora_linear

_layer = nn.Linear(7, 3).double().requires_grad_(False)
_W0, _b0, _p = (
    _layer.weight.detach().clone(),
    _layer.bias.detach().clone(),
    _layer.weight,
)
_A = randn(2, 7, seed=831, dtype=torch.float64)
_B = randn(3, 2, seed=832, dtype=torch.float64)
_x = randn(5, 7, seed=833, dtype=torch.float64)
_y = lora_linear(_x, _W0, _b0, _A, _B, 3.0, 2)  # α = 3, r = 2: s = 1.5
_out = merge_(_layer, _A, _B, 1.5)
assert _out is _layer and _layer.weight is _p and not _p.requires_grad
assert torch.allclose(_layer.weight, _W0 + 1.5 * _B @ _A, atol=1e-12)
assert torch.allclose(_layer(_x), _y, atol=1e-12) and torch.equal(_layer.bias, _b0)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
from torch import nn

from helpers.device import get_device, no_tf32, rand, randn

# round trip, on a trainable layer too (in place, so no autograd error and no graph)
_layer = nn.Linear(4, 6).double()
_W0 = _layer.weight.detach().clone()
_A = randn(3, 4, seed=834, dtype=torch.float64)
_B = randn(6, 3, seed=835, dtype=torch.float64)
_merged = merge_(_layer, _A, _B, 0.25)
# merge itself, not just the round trip
assert torch.allclose(_layer.weight, _W0 + 0.25 * _B @ _A, atol=1e-12)
_back = unmerge_(_merged, _A, _B, 0.25)
assert _back is _layer and _layer.weight.requires_grad and _layer.weight.grad_fn is None
assert torch.allclose(_layer.weight, _W0, atol=1e-12)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: the unmerged layer $xW^\top + b + s\,(xA^\top)B^\top$ and the
# original $W$, in float32 on your device: float32's default tolerance, atol 1e-5 and rtol
# 1e-4, as merging reorders the additions; on a trainable layer, and `weight` must stay the same
# `Parameter` object):


# %%
@checker
def merge_round_trip(layer, A, B, s, x):
    """(merged output, weight after unmerge_, how many times weight stopped being the
    same Parameter), on a copy."""
    layer = copy.deepcopy(layer)
    original = layer.weight
    merged = merge_(layer, A, B, s)
    if merged is None:
        raise NotImplementedError
    y = merged(x)
    replaced = int(merged.weight is not original)
    back = unmerge_(merged, A, B, s)
    if back is None:
        raise NotImplementedError
    return (
        y.detach(),
        back.weight.detach().clone(),
        replaced + int(back.weight is not original),
    )


# trainable: merging must still work (no_grad, in place)
layer4 = nn.Linear(d_in, d_out).to(dev)
with torch.no_grad():
    layer4.weight.copy_(W.float())
    layer4.bias.copy_(randn(d_out, seed=6, device=dev))
A4, B4, x4 = A.float(), 0.1 * B.float(), x.float()
W4, b4, dW4 = layer4.weight.detach(), layer4.bias.detach(), delta_weight(A4, B4, s)
expected = (lora_linear(x4, W4, b4, A4, B4, alpha, r).detach(), W4.clone(), 0)
check(
    merge_round_trip,
    expected,
    args=(layer4, A4, B4, s, x4),
    outputs=("merged output", "W after unmerge", "weight replaced by a new Parameter"),
    counts=("weight replaced by a new Parameter",),
    name="Exercise 4 · merge_ / unmerge_",
    against="the unmerged layer",
    mistakes={
        "merged output": {
            "the layer with s = 1 (the scale left out)": lora_linear(
                x4, W4, b4, A4, B4, r, r
            ).detach(),
            "the base layer's output (merge_ left layer.weight as it was)": F.linear(
                x4, W4, b4
            ),
        },
        "W after unmerge": {
            "W + 2s·BA (unmerge_ added s·BA again)": W4 + 2 * dW4,
            "W − s·BA (merge_ had no effect, unmerge_ subtracted)": W4 - dW4,
        },
    },
)

# %% [raw]
# # BEGIN QUESTION
# name: ex5
# points: 3
# by_hand: [autograd, helpers.lora.lora_linear_backward]

# %% [markdown]
# ## Exercise 5 · LoRA as an `autograd.Function` (3 points)
#
# **Goal:** the whole layer as one `Function` in the course's form: `forward` without `ctx`,
# `setup_context` saves what backward needs, `backward` computes only the gradients asked for.
# A frozen $W$ (`requires_grad=False`) is never asked for, so LoRA never forms the out × in
# $\partial L/\partial W$; but if someone does pass a trainable `W`, the honest answer is its
# gradient $g^\top x$, not a silent `None` (that would make `gradcheck` over `W` fail and an
# optimizer skip `W` without a word).
#
# Fill in `LoRALinearFn` with inputs `(x, W, A, B, s)`, `x` of shape (..., in) (e.g. a
# (batch, tokens, in) tensor):
# * `forward(x, W, A, B, s)`: $y = xW^\top + s\,(xA^\top)B^\top$, shape (..., out), never
#   forming $BA$;
# * `setup_context(ctx, inputs, output)`: save `x`, `W`, `A`, `B` with `ctx.save_for_backward`
#   and keep the float `s` on `ctx`;
# * `backward(ctx, grad_y)`: unpack `ctx.saved_tensors`; bring `grad_y` and `x` to the 2-D
#   shapes your `lora_backward` takes and pass it the right flags of `ctx.needs_input_grad`;
#   give `grad_x` its input's shape back; compute $\partial L/\partial W$ **only if**
#   `ctx.needs_input_grad[1]` (else `None`: a frozen `W` costs nothing); return one gradient
#   per input of `forward`, in order (`None` for the float `s`).
#
# <details><summary>Hint: the bookkeeping</summary>
#
# `g2 = grad_y.reshape(-1, grad_y.shape[-1])` and `x2 = x.reshape(-1, x.shape[-1])`;
# `needs = (needs_input_grad[0], needs_input_grad[2], needs_input_grad[3])` (x, A, B);
# `grad_x.reshape(x.shape)` when it is not `None`; `grad_W = g2.T @ x2`; return
# `(grad_x, grad_W, grad_A, grad_B, None)`.
#
# </details>
#
# The wrapper `lora_linear_fn(x, W, A, B, s)` below is the public name, as everywhere in the
# course; it is given.
#
# `@once_differentiable` is already there: this backward is not differentiable again.
# If your `lora_backward` is wrong, the self-check below shows it here too; the hidden tests
# grade this exercise with a correct `lora_backward`, so exercise 2 is not counted twice.

# %% [raw]
# # BEGIN SOLUTION


# %%
class LoRALinearFn(torch.autograd.Function):
    """y = x Wᵀ + s·(x Aᵀ) Bᵀ with W frozen; backward through the r-dim x Aᵀ only."""

    @staticmethod
    def forward(x, W, A, B, s):
        # BEGIN SOLUTION
        # (..., in) @ (in, out); (..., r) @ (r, out) -> (..., out)
        return x @ W.T + s * ((x @ A.T) @ B.T)
        # END SOLUTION

    @staticmethod
    def setup_context(ctx, inputs, output):
        # BEGIN SOLUTION
        x, W, A, B, s = inputs
        ctx.save_for_backward(x, W, A, B)
        ctx.s = s
        # END SOLUTION

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        # BEGIN SOLUTION
        x, W, A, B = ctx.saved_tensors
        need_x, need_W, need_A, need_B, _ = ctx.needs_input_grad
        g2 = grad_y.reshape(-1, grad_y.shape[-1])  # (..., out) -> (R, out)
        x2 = x.reshape(-1, x.shape[-1])  # (..., in) -> (R, in)
        grad_x, grad_A, grad_B = lora_backward(
            g2, x2, W, A, B, ctx.s, (need_x, need_A, need_B)
        )
        if grad_x is not None:
            grad_x = grad_x.reshape(x.shape)  # (R, in) -> (..., in)
        # (out, R) @ (R, in) -> (out, in): only if asked
        grad_W = g2.T @ x2 if need_W else None
        return grad_x, grad_W, grad_A, grad_B, None
        # END SOLUTION


# %% [raw]
# # END SOLUTION


# %%
def lora_linear_fn(x, W, A, B, s):
    """y = x Wᵀ + s·(x Aᵀ) Bᵀ through LoRALinearFn (the public, lowercase name)."""
    return LoRALinearFn.apply(x, W, A, B, s)


# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
runs_in: student
"""  # END TEST CONFIG
import torch

# exercise 5 is graded on its own: its backward calls a correct lora_backward here
# (exercise 2 is graded apart)
import helpers.lora as _hl

_ns = LoRALinearFn.forward.__globals__
_theirs = _ns.get("lora_backward")
_ns["lora_backward"] = lambda g, x, W, A, B, s, needs=(True, True, True): (
    lambda o: (o[0], o[3], o[4])
)(
    _hl.lora_linear_backward(
        g, x, W, A, B, x @ A.T, s, (needs[0], False, False, needs[1], needs[2])
    )
)
from helpers.device import get_device, no_tf32, rand, randn

_W = randn(5, 4, seed=841, dtype=torch.float64)
_x = randn(2, 3, 4, seed=842, dtype=torch.float64, requires_grad=True)
_A = randn(2, 4, seed=843, dtype=torch.float64, requires_grad=True)
_B = randn(5, 2, seed=844, dtype=torch.float64, requires_grad=True)
assert torch.autograd.gradcheck(
    lambda x, A, B: LoRALinearFn.apply(x, _W, A, B, 1.5),
    (_x, _A, _B),
    eps=1e-6,
    atol=1e-6,
)
_y = LoRALinearFn.apply(_x, _W, _A, _B, 1.5)
assert _y.shape == (2, 3, 5) and torch.allclose(
    _y, _x @ (_W + 1.5 * _B @ _A).T, atol=1e-12
)
_ns["lora_backward"] = _theirs

# %%
""" # BEGIN TEST CONFIG
hidden: true
runs_in: student
"""  # END TEST CONFIG
import torch

# exercise 5 is graded on its own: its backward calls a correct lora_backward here
# (exercise 2 is graded apart)
import helpers.lora as _hl

_ns = LoRALinearFn.forward.__globals__
_theirs = _ns.get("lora_backward")
_ns["lora_backward"] = lambda g, x, W, A, B, s, needs=(True, True, True): (
    lambda o: (o[0], o[3], o[4])
)(
    _hl.lora_linear_backward(
        g, x, W, A, B, x @ A.T, s, (needs[0], False, False, needs[1], needs[2])
    )
)
from helpers.device import get_device, no_tf32, rand, randn

# a frozen W gets no gradient while ∂L/∂x flows through it; a trainable W gets gᵀx;
# once_differentiable refuses a second backward
_W = randn(3, 6, seed=845, dtype=torch.float64)  # frozen
_x = randn(4, 6, seed=846, dtype=torch.float64, requires_grad=True)
_A = randn(2, 6, seed=847, dtype=torch.float64, requires_grad=True)
_B = randn(3, 2, seed=848, dtype=torch.float64, requires_grad=True)
_g = randn(4, 3, seed=849, dtype=torch.float64)
LoRALinearFn.apply(_x, _W, _A, _B, 0.5).backward(_g)
assert _W.grad is None and torch.allclose(
    _x.grad, _g @ (_W + 0.5 * _B @ _A).detach(), atol=1e-12
)
_Wt = _W.clone().requires_grad_(True)  # trainable: its gradient, not None
LoRALinearFn.apply(_x, _Wt, _A, _B, 0.5).backward(_g)
assert _Wt.grad is not None and torch.allclose(_Wt.grad, _g.T @ _x.detach(), atol=1e-12)
_W = _Wt
(_gx,) = torch.autograd.grad(
    LoRALinearFn.apply(_x, _W, _A, _B, 0.5), _x, _g, create_graph=True
)
_raised = False
try:
    _ = torch.autograd.grad(_gx.sum(), _x)
except RuntimeError as _err:  # once_differentiable: no double backward
    _raised = True
assert _raised
_ns["lora_backward"] = _theirs

# %%
""" # BEGIN TEST CONFIG
hidden: true
runs_in: student
"""  # END TEST CONFIG
import torch

# exercise 5 is graded on its own: its backward calls a correct lora_backward here
# (exercise 2 is graded apart)
import helpers.lora as _hl

_ns = LoRALinearFn.forward.__globals__
_theirs = _ns.get("lora_backward")
_ns["lora_backward"] = lambda g, x, W, A, B, s, needs=(True, True, True): (
    lambda o: (o[0], o[3], o[4])
)(
    _hl.lora_linear_backward(
        g, x, W, A, B, x @ A.T, s, (needs[0], False, False, needs[1], needs[2])
    )
)
from torch.utils.flop_counter import FlopCounterMode

from helpers.device import get_device, no_tf32, rand, randn

# one row, in = out = 64, r = 2: no B @ A in forward or backward, and no ∂L/∂x when x
# needs none
_W = randn(64, 64, seed=850, dtype=torch.float64)
_A = randn(2, 64, seed=851, dtype=torch.float64, requires_grad=True)
_B = randn(64, 2, seed=852, dtype=torch.float64, requires_grad=True)
_g = randn(1, 64, seed=853, dtype=torch.float64)
_x = randn(1, 64, seed=854, dtype=torch.float64, requires_grad=True)
with FlopCounterMode(display=False) as _fc_all:
    _ = torch.autograd.grad(LoRALinearFn.apply(_x, _W, _A, _B, 2.0), (_x, _A, _B), _g)
with FlopCounterMode(display=False) as _fc_AB:
    _gA, _gB = torch.autograd.grad(
        LoRALinearFn.apply(_x.detach(), _W, _A, _B, 2.0), (_A, _B), _g
    )
# x Wᵀ and g W, plus small change
assert _fc_all.get_total_flops() <= 2 * 2 * 64 * 64 * 1.5
# x Wᵀ only: ∂L/∂x was not computed
assert _fc_AB.get_total_flops() <= 2 * 64 * 64 * 1.5
assert torch.allclose(_gB, 2.0 * _g.T @ (_x.detach() @ _A.detach().T), atol=1e-12)
_ns["lora_backward"] = _theirs


# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 5** (reference: autograd through $x\,(W + s\,BA)^\top$ with $W$ frozen, on
# `x` of shape (2, 5, in); then `gradcheck` on your backward in float64; then: does a frozen
# $W$ stay without a gradient, and does a trainable one get $g^\top x$? Last, with $W$ frozen and
# `x` plain data, the products forward and backward form: no out × in matrix, and no
# $\partial L/\partial x$ nobody asked for):

# %%
# chapter 4's scaffolding for a learner's Function
from helpers.labkit import (
    applied,
    check_function,
)


@checker
def check_frozen_W(name, W, inputs):
    """One line: a frozen W gets no gradient (W.grad stays None); a trainable W gets
    gᵀx."""
    W_frozen = W.detach().clone()
    W_train = W.detach().clone().requires_grad_()
    x_, A_, B_ = (t.detach().clone().requires_grad_() for t in inputs)

    def grad_W_of_trainable():
        applied(LoRALinearFn.apply)(x_, W_frozen, A_, B_, s).sum().backward()
        if W_frozen.grad is not None:
            raise Mistake("a frozen W (requires_grad=False) got a gradient")
        applied(LoRALinearFn.apply)(x_, W_train, A_, B_, s).sum().backward()
        if W_train.grad is None:
            raise Mistake(
                "a trainable W got None: compute g2ᵀ x2 when ctx.needs_input_grad[1]"
            )
        return W_train.grad

    x2 = x_.detach().reshape(-1, x_.shape[-1])  # (..., in) -> (R, in)
    # ∂(sum y)/∂y: (R, out)
    ones = torch.ones(x2.shape[0], W.shape[0], dtype=W.dtype, device=W.device)
    # (out, R) @ (R, in)
    check(
        grad_W_of_trainable,
        lambda: ones.T @ x2,
        outputs=("trainable W's gradient",),
        name=name,
        against="gᵀx (and a frozen W got none)",
    )


x5 = randn(2, 5, d_in, seed=7, dtype=dtype, device=dev)  # (batch, tokens, in)
g5 = randn(2, 5, d_out, seed=8, dtype=dtype, device=dev)  # (batch, tokens, out)


def reference5(x_, A_, B_):
    return x_ @ (W + s * B_ @ A_).T


def no_grad_for(i):
    """What input i of (x, A, B) gets from autograd when backward returns None for
    it."""
    return lambda *xs: torch.zeros_like(xs[i])


none_label = "what {} gets when backward returns None for it (needs mixed up?)"
check_function(
    "Exercise 5 · LoRALinearFn",
    checker(lambda x_, A_, B_: LoRALinearFn.apply(x_, W, A_, B_, s)),
    reference5,
    (x5, A, B),
    g5,
    outputs=("y", "grad_x", "grad_A", "grad_B"),
    mistakes={
        "y": {
            "xWᵀ plus the adapter's term without s": lambda x_, A_, B_: (
                x_ @ W.T + (reference5(x_, A_, B_) - x_ @ W.T) / s
            )
        },
        **{
            f"grad_{n}": {none_label.format(n): no_grad_for(i)}
            for i, n in enumerate("xAB")
        },
    },
)
check_frozen_W("Exercise 5 · W frozen / trainable", W, (x5, A, B))


@checker
def products_of_fn(x, A, B):
    """(out × in products, ∂L/∂x-shaped products) in forward + backward, W frozen, x
    data."""
    A_, B_ = (t.detach().clone().requires_grad_() for t in (A, B))
    with Products() as products:
        y = applied(LoRALinearFn.apply)(x.detach(), W, A_, B_, s)
        torch.autograd.grad(y, (A_, B_), g5)
    R = x[..., 0].numel()
    return formed(products.shapes, W.shape), formed(products.shapes, (R, x.shape[-1]))


check(
    products_of_fn,
    (0, 0),
    args=(x5, A, B),
    outputs=("out × in products formed", "∂L/∂x-shaped products for a data x"),
    counts=("out × in products formed", "∂L/∂x-shaped products for a data x"),
    name="Exercise 5 · what LoRALinearFn computes",
    against="the cheap route",
)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `grads_from_W_prime`, `lora_backward`,
# `init_adapter`, `merge_`, `unmerge_` and `LoRALinearFn`.
