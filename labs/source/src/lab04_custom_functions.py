# %% [raw]
# # ASSIGNMENT CONFIG
# name: lab04_custom_functions
# init_cell: false
# check_all_cell: false
# export_cell: false
# run_tests: true
# generate:
#   pdf: false
#   show_stdout: false

# %% [markdown]
# # Lab 4 · Custom autograd Functions: softmax, RMSNorm, cross-entropy
#
# Chapter 4 wrote `torch.autograd.Function`s with a hand-written backward and checked them
# with `gradcheck`. Here you write three of the most used ones yourself, in the modern form
# (`forward` without `ctx`, plus `setup_context`), and they must pass `gradcheck` in float64.
# This lab goes with [Chapter 4](../chapters/04_custom_functions.ipynb).
#
# **Learning goals.** After this lab you can
# * compute softmax's vector–Jacobian product without building the Jacobian;
# * write a `Function` in the modern form: what `forward`, `setup_context` and `backward` each
#   do, what to save, and why `backward` never writes into `grad_output`;
# * derive RMSNorm's input gradient, with its hidden path through the root mean square, and
#   its weight's gradient;
# * write cross-entropy from logits that never overflows, and whose ignored rows get exactly
#   zero gradient.
#
# **How a lab works.** Each exercise states its goal and its points (10 in all). Replace every
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
import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from helpers.device import get_device, no_tf32, randn
from helpers.labcheck import autograd_grads, check, evaluate
from helpers.labkit import applied, check_function

dev = get_device()
no_tf32()
dtype = torch.float64  # gradcheck compares with finite differences: float64 only

# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2
# by_hand: [autograd, helpers.functions.softmax_backward, helpers.functions.softmax_jacobian]

# %% [markdown]
# ## Exercise 1 · Softmax's backward, without the Jacobian (2 points)
#
# **Goal:** the Jacobian of $p = \mathrm{softmax}(z)$ is an $n \times n$ matrix per row;
# backward needs only its product with the upstream gradient, $J^\top g$, which costs $O(n)$.
#
# Write `softmax_backward(P, grad_P)` for `P = softmax(Z, dim=-1)` of any shape `(..., n)` and
# `grad_P` $= \partial L/\partial P$ of the same shape: return $\partial L/\partial Z$, row by row along the last dim. Derive it
# first: write $\partial p_i/\partial z_j$ (two cases, $i = j$ and $i \ne j$), put it into
# $J$, and simplify $J^\top g$ until no $n \times n$ matrix is left. Do not build $J$, and do
# not modify `grad_P`.
#
# <details><summary>Hint 1: the Jacobian</summary>
#
# $\partial p_i/\partial z_j = p_i(\delta_{ij} - p_j)$, so $J = \mathrm{diag}(p) - p\,p^\top$,
# which is symmetric.
#
# </details>
#
# <details><summary>Hint 2: the formula (check yours against it)</summary>
#
# $J^\top g = p \odot (g - \langle g, p\rangle)$, the inner product taken along the last dim
# per row (`keepdim=True`, so that it broadcasts back along the row).
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def softmax_backward(P, grad_P):
    """grad_Z = Jᵀ grad_P per row along the last dim, without building the Jacobian."""
    # BEGIN SOLUTION
    inner = (grad_P * P).sum(-1, keepdim=True)  # (..., 1): one ⟨g, p⟩ per row
    return P * (grad_P - inner)  # (..., n)
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

from helpers.device import randn

_Z = randn(2, 3, 7, seed=101, dtype=torch.float64)
_g = randn(2, 3, 7, seed=102, dtype=torch.float64)
_leaf = _Z.clone().requires_grad_()
(_ref,) = torch.autograd.grad(torch.softmax(_leaf, -1), _leaf, _g)
_g0 = _g.clone()
_out = softmax_backward(torch.softmax(_Z, -1), _g)
assert _out.shape == _Z.shape and torch.allclose(_out, _ref, atol=1e-12)
assert torch.equal(_g, _g0)  # grad_P untouched

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

# a constant upstream gradient moves nothing: softmax is invariant to adding a constant
_P = torch.softmax(torch.tensor([[1.0, 2.0, 3.0, -1.0]], dtype=torch.float64), -1)
assert torch.allclose(
    softmax_backward(_P, torch.full_like(_P, 2.5)), torch.zeros_like(_P), atol=1e-15
)
_n = 4096  # a long row: no n × n Jacobian needed
_P = torch.softmax(torch.linspace(-3, 3, _n, dtype=torch.float64), -1)[None]
_g = torch.zeros_like(_P)
_g[0, 0] = 1.0
_out = softmax_backward(_P, _g)
assert torch.allclose(
    _out[0], _P[0, 0] * ((torch.arange(_n) == 0).double() - _P[0]), atol=1e-15
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: autograd through `torch.softmax`, on a (4, 3, 6) batch; a ✗
# names a known mistake when your answer is one, each computed from the course's
# `helpers.functions`):

# %%
from helpers import functions  # the course's reference code (the checks use it)

Z1 = randn(4, 3, 6, seed=1, dtype=dtype, device=dev)
grad_P1 = randn(4, 3, 6, seed=2, dtype=dtype, device=dev)
P1 = torch.softmax(Z1, -1)
(expected,) = autograd_grads(lambda Z: torch.softmax(Z, -1), (Z1,), grad_P1)
known1 = {  # known wrong answers
    "the diagonal-only VJP, g ∘ p(1 − p) (the i ≠ j terms of J left out)": (
        functions.softmax_backward_diagonal_only(P1, grad_P1)
    ),
    "the VJP with ⟨g, p⟩ summed over dim 0, not the last dim": (
        functions.softmax_backward(P1, grad_P1, dim=0)
    ),
    "the expected value ÷ p: the outer p ∘ (…) forgotten": expected / P1,
    "the sign of the inner term flipped": 2 * P1 * grad_P1 - expected,
}
check(
    softmax_backward,
    expected,
    args=(P1, grad_P1),
    outputs=("grad_Z",),
    mistakes={"grad_Z": known1},
    name="Exercise 1 · softmax_backward",
    against="autograd",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 2
# by_hand: [autograd, helpers.functions.softmax_backward]

# %% [markdown]
# ## Exercise 2 · A `Softmax` Function that saves only its output (2 points)
#
# **Goal:** the anatomy of a modern `autograd.Function`: `forward` computes (no `ctx`),
# `setup_context` saves what backward needs, `backward` turns $\partial L/\partial\,\text{output}$ into $\partial L/\partial\,\text{input}$.
#
# Fill in `Softmax` (softmax over the last dim, one input `Z`):
# * `forward(Z)`: the **stable** softmax, $e^{z - \max z} / \sum e^{z - \max z}$ along the last
#   dim (without the shift, $e^{1000}$ overflows to `inf`);
# * `setup_context(ctx, inputs, output)`: save **only** the output `P` (with
#   `ctx.save_for_backward`): your exercise 1 needs nothing else, and `Z` would cost a
#   second tensor of the same size;
# * `backward(ctx, grad_P)`: unpack `ctx.saved_tensors`, return `None` if
#   `ctx.needs_input_grad[0]` is false, else your `softmax_backward`.

# %% [raw]
# # BEGIN SOLUTION


# %%
class Softmax(torch.autograd.Function):
    """P = softmax(Z) over the last dim; saves only P."""

    @staticmethod
    def forward(Z):
        # BEGIN SOLUTION
        E = torch.exp(Z - Z.amax(-1, keepdim=True))  # (..., n), every exponent ≤ 0
        return E / E.sum(-1, keepdim=True)
        # END SOLUTION

    @staticmethod
    def setup_context(ctx, inputs, output):
        # BEGIN SOLUTION
        ctx.save_for_backward(output)
        # END SOLUTION

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_P):
        # BEGIN SOLUTION
        (P,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None
        return softmax_backward(P, grad_P)
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

from helpers.device import randn

_Z = randn(5, 9, seed=201, dtype=torch.float64).requires_grad_()
assert torch.autograd.gradcheck(Softmax.apply, (_Z,), eps=1e-6, atol=1e-6)
_big = torch.tensor([[1000.0, 0.0, -1000.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
_P = Softmax.apply(_big)
assert torch.isfinite(_P).all() and torch.allclose(
    _P, torch.softmax(_big, -1), atol=1e-15
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.memory import SavedTensors

_Z = randn(6, 4, seed=202, dtype=torch.float64).requires_grad_()
with SavedTensors() as _s:
    _P = Softmax.apply(_Z)
assert _s.count == 1 and _s.records[0]["shape"] == (6, 4)  # P only
_g = randn(6, 4, seed=203, dtype=torch.float64)
_g0 = _g.clone()
(_gZ,) = torch.autograd.grad(_P, _Z, _g)
assert torch.equal(_g, _g0) and torch.allclose(
    _gZ, softmax_backward(torch.softmax(_Z.detach(), -1), _g0), atol=1e-12
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: `torch.softmax` and autograd, on rows that include logits of
# ±1000; then the number of tensors your `Softmax` saves, which must be 1; then `gradcheck` on
# your backward). Your backward calls your exercise 1: when `grad_Z` is exactly what that
# function returns and exercise 1 is wrong, the ✗ says so, since that is what to fix.

# %%
Z2 = randn(3, 5, seed=3, dtype=dtype, device=dev) * 4
# e^1000 overflows without the max shift
Z2[1] = torch.tensor([1000.0, 0.0, -1000.0, 500.0, -500.0], dtype=dtype)
grad_P2 = randn(3, 5, seed=4, dtype=dtype, device=dev)
P2 = torch.softmax(Z2, -1)
# what your backward gets as grad_P: it must leave it unchanged
given_grad_P2 = grad_P2.clone()
result = check_function(
    "Exercise 2 · Softmax",
    Softmax.apply,
    lambda Z: torch.softmax(Z, -1),
    (Z2,),
    given_grad_P2,
    outputs=("P", "grad_Z"),
    saves=(1, "P"),
    mistakes={  # known wrong answers, from the course's functions
        "P": {
            "e^(z − max z) normalised over dim 0, not the last dim": (
                torch.softmax(Z2 - Z2.amax(-1, keepdim=True), 0)
            )
        },
        "grad_Z": {
            "the VJP computed with Z as P (Z saved, not the output P)": (
                functions.softmax_backward(Z2, grad_P2)
            ),
            "the diagonal-only VJP, g ∘ p(1 − p)": (
                functions.softmax_backward_diagonal_only(P2, grad_P2)
            ),
            "zero, softmax's VJP of a vector of ones: backward ignores grad_P": (
                torch.zeros_like(Z2)
            ),
        },
    },
    quiet=True,
)


def agrees_with_exercise_1():
    """Whether your Softmax's grad_Z for grad_P2 is what your softmax_backward
    returns."""
    Z = Z2.detach().clone().requires_grad_()
    try:
        (grad_Z,) = torch.autograd.grad(
            Softmax.apply(Z), Z, grad_P2.clone(), allow_unused=True
        )
        mine = softmax_backward(P2.clone(), grad_P2.clone())
    except Exception:  # noqa: BLE001 - the ✗ line already says what went wrong
        return False
    if mine is None or mine is ...:  # exercise 1 not done: backward returned None
        return grad_Z is None or not grad_Z.any()
    return grad_Z is not None and torch.allclose(grad_Z, mine, rtol=1e-8, atol=1e-10)


ex1 = evaluate(  # your exercise 1, on the same P and grad_P
    softmax_backward,
    autograd_grads(lambda Z: torch.softmax(Z, -1), (Z2,), grad_P2)[0],
    args=(P2, grad_P2),
    outputs=("grad_Z",),
    name="Exercise 1 · softmax_backward",
)
if not torch.equal(given_grad_P2, grad_P2):
    where = " (your softmax_backward does)" if "in place" in ex1.line else ""
    result.line = f"✗ Exercise 2 · Softmax: backward changed grad_P in place{where}"
elif not result and ex1.status == "error" and "softmax_backward" in result.line:
    result.line += "; exercise 1 raises it: fix it first (self-check 1 says where)"
elif (
    result.status == "fail"
    and not ex1
    and not result.line.startswith("✗ Exercise 2 · Softmax: P ")  # the forward is yours
    and agrees_with_exercise_1()
):
    todo = ex1.status == "todo"
    state = "not implemented yet: write it" if todo else "wrong: fix it"
    result.line = (
        "✗ Exercise 2 · Softmax: grad_Z is what your softmax_backward returns, and "
        f"exercise 1 is {state} first (self-check 1 says what is off)"
    )
print(result.line)

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 3
# by_hand: [autograd, torch.nn.functional.rms_norm]

# %% [markdown]
# ## Exercise 3 · RMSNorm (3 points)
#
# **Goal:** $x$ reaches the output two ways, directly and through its root mean square; the
# gradient is the sum over both. RMSNorm is LayerNorm without the mean and without $\beta$
# (Llama and most recent language models use it); chapter 4's method, one path at a time,
# derives it.
#
# Over the last dim (size $D$): $r = \sqrt{\mathrm{mean}(x^2) + \varepsilon}$, $\hat x = x / r$,
# $y = \gamma \odot \hat x$, with `weight` $\gamma$ of shape `(D,)`. Derive
# $\partial L/\partial x$ and $\partial L/\partial \gamma$ on paper first: follow $x$ along its
# two paths (directly into $\hat x$, and through $r$), add them, and write the result with
# $\hat x$ and $r$.
#
# <details><summary>Hint 1: the hidden path</summary>
#
# With $g = \partial L/\partial y \odot \gamma$ (the gradient reaching $\hat x$): the direct
# path gives $g / r$; $\partial r/\partial x_i = x_i/(D r)$, so the path through $r$ adds
# $-\sum_j g_j x_j / r^2 \cdot x_i / (D r)$. Write $x_j / r$ as $\hat x_j$.
#
# </details>
#
# <details><summary>Hint 2: the formulas (check yours against them)</summary>
#
# $$\frac{\partial L}{\partial x} = \frac{1}{r}\Big(g - \hat x\,\mathrm{mean}(g \odot \hat x)
# \Big), \qquad \frac{\partial L}{\partial \gamma} = \sum_{\text{rows}}
# \frac{\partial L}{\partial y} \odot \hat x$$
#
# (the mean along the last dim, `keepdim=True`; "rows" = every leading dim.)
#
# </details>
#
# `x` may be `(B, N, D)`: "rows" are all its leading dims. Fill in
# `RMSNorm.forward(x, weight, eps)`, `setup_context` (save `x` and `weight`; keep `eps` on
# `ctx`: it is a float, not a tensor) and `backward`, which recomputes $r$ from `x` (one cheap
# reduction) and returns `(grad_x, grad_weight, None)`, each gated on `ctx.needs_input_grad`.

# %% [raw]
# # BEGIN SOLUTION


# %%
class RMSNorm(torch.autograd.Function):
    """y = γ x / √(mean(x²) + eps) over the last dim; saves x and γ."""

    @staticmethod
    def forward(x, weight, eps):
        # BEGIN SOLUTION
        inv_r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # (..., 1): 1/r
        return x * inv_r * weight  # (..., D)
        # END SOLUTION

    @staticmethod
    def setup_context(ctx, inputs, output):
        # BEGIN SOLUTION
        x, weight, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        # END SOLUTION

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        # BEGIN SOLUTION
        x, weight = ctx.saved_tensors
        need_x, need_w = ctx.needs_input_grad[:2]
        inv_r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps)  # (..., 1)
        x_hat = x * inv_r  # (..., D)
        grad_x = grad_w = None
        if need_x:
            g = grad_y * weight  # (..., D): the gradient reaching x̂
            grad_x = inv_r * (g - x_hat * (g * x_hat).mean(-1, keepdim=True))
        if need_w:
            # (..., D) -> (R, D) -> (D,)
            grad_w = (grad_y * x_hat).reshape(-1, x.shape[-1]).sum(0)
        return grad_x, grad_w, None
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

from helpers.device import randn


def _rms_norm(x, w, eps):
    """The reference: torch's own RMSNorm over the last dim."""
    return torch.nn.functional.rms_norm(x, x.shape[-1:], w, eps)


_x = randn(2, 3, 8, seed=301, dtype=torch.float64).requires_grad_()
_w = (1 + 0.3 * randn(8, seed=302, dtype=torch.float64)).requires_grad_()
assert torch.autograd.gradcheck(
    lambda x, w: RMSNorm.apply(x, w, 1e-5), (_x, _w), eps=1e-6, atol=1e-6
)
assert torch.allclose(RMSNorm.apply(_x, _w, 1e-5), _rms_norm(_x, _w, 1e-5), atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# only x needs a gradient: weight gets None, and x's is still right; a large eps
_x = randn(5, 6, seed=304, dtype=torch.float64).requires_grad_()
_w = randn(6, seed=305, dtype=torch.float64)
_g = randn(5, 6, seed=307, dtype=torch.float64)
(_gx,) = torch.autograd.grad(RMSNorm.apply(_x, _w, 0.1), _x, _g)
_leaf = _x.detach().clone().requires_grad_()
(_ref,) = torch.autograd.grad(
    torch.nn.functional.rms_norm(_leaf, (6,), _w, 0.1), _leaf, _g
)
assert torch.allclose(_gx, _ref, atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# a row of zeros: r = √eps; the gradient must stay finite and match
_x = torch.cat(
    [torch.zeros(1, 4, dtype=torch.float64), randn(1, 4, seed=308, dtype=torch.float64)]
).requires_grad_()
_w = (1 + 0.5 * randn(4, seed=310, dtype=torch.float64)).requires_grad_()
_g = randn(2, 4, seed=309, dtype=torch.float64)
_ours = torch.autograd.grad(RMSNorm.apply(_x, _w, 1e-5), (_x, _w), _g)
_leaves = [t.detach().clone().requires_grad_() for t in (_x, _w)]
_ref = torch.autograd.grad(
    torch.nn.functional.rms_norm(_leaves[0], (4,), _leaves[1], 1e-5), _leaves, _g
)
assert all(
    torch.isfinite(o).all() and torch.allclose(o, r, atol=1e-8)
    for o, r in zip(_ours, _ref)
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (reference: `F.rms_norm` and autograd on `x` (2, 4, 5), then `gradcheck`;
# `eps` is 1e-5). It first looks at the parts: $\hat x$ (your forward with $\gamma = 1$ and
# `eps` 0, so a wrong mean of squares shows as one constant ratio), and `grad_x`, against
# RMSNorm with $r$ held constant (so the path you left out is named); a ✗ names a known
# mistake when your numbers are one:

# %%
x3 = randn(2, 4, 5, seed=5, dtype=dtype, device=dev) * 2 + 1
w3 = 1 + 0.5 * randn(5, seed=6, dtype=dtype, device=dev)
grad_y3 = randn(2, 4, 5, seed=8, dtype=dtype, device=dev)


def rms_norm_parts(fn, x, w):
    """fn's x̂ (γ = 1, eps = 0), and its grad_x for grad_y3 (eps = 1e-5)."""
    x_hat = applied(fn)(x, torch.ones_like(w), 0.0)
    (grad_x,) = autograd_grads(lambda x: applied(fn)(x, w, 1e-5), (x,), grad_y3)
    return x_hat, grad_x


def torch_rms_norm(x, w, eps):
    """The reference: F.rms_norm over the last dim."""
    return F.rms_norm(x, x.shape[-1:], w, eps)


def rms_norm_r_held(x, w, eps):
    """RMSNorm with r held constant (detached): its grad_x lacks the path through r."""
    r = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()  # (..., 1)
    return x / r.detach() * w


ref_parts = rms_norm_parts(torch_rms_norm, x3, w3)
(grad_x_r_held,) = autograd_grads(
    lambda x: rms_norm_r_held(x, w3, 1e-5), (x3,), grad_y3
)
path_r = ref_parts[1] - grad_x_r_held  # the path through r's share of grad_x
(grad_x_no_gamma,) = autograd_grads(  # RMSNorm's grad_x with γ = 1
    lambda x: torch_rms_norm(x, torch.ones_like(w3), 1e-5), (x3,), grad_y3
)
ones3, zeros3 = torch.ones_like(w3), torch.zeros_like(w3)
check(
    lambda x, w: rms_norm_parts(RMSNorm.apply, x, w),
    ref_parts,
    args=(x3, w3),
    outputs=("x_hat", "grad_x"),
    factors={"√D": 5**0.5},
    terms={"grad_x": {"the path through r": path_r}},
    mistakes={
        "x_hat": {
            "LayerNorm's x̂: the mean subtracted": F.layer_norm(
                x3, (5,), ones3, zeros3, 0.0
            )
        },
        "grad_x": {
            "RMSNorm's grad_x for γ = 1 (γ left out)": grad_x_no_gamma,
            "the expected value with the path through r sign-flipped": ref_parts[1]
            - 2 * path_r,
        },
    },
    name="Exercise 3 · RMSNorm's x̂ and grad_x",
    against="autograd",
)
(grad_w_from_x,) = autograd_grads(lambda w: x3 * w, (w3,), grad_y3)  # γ of x ∘ γ
check_function(
    "Exercise 3 · RMSNorm",
    lambda x, w: RMSNorm.apply(x, w, 1e-5),
    lambda x, w: F.rms_norm(x, (5,), w, 1e-5),
    (x3, w3),
    grad_y3,
    outputs=("y", "grad_x", "grad_weight"),
    factors={"rows": 8},
    mistakes={"grad_weight": {"Σ grad_y ∘ x over rows (x, not x̂)": grad_w_from_x}},
)

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 3
# by_hand: [autograd, helpers.functions.cross_entropy_backward]

# %% [markdown]
# ## Exercise 4 · Cross-entropy from logits, with `ignore_index` (3 points)
#
# **Goal:** fuse log-softmax and the negative log-likelihood: the forward never overflows and
# the backward, once derived, is one short line per row.
#
# For `logits` (R, C) and an int64 `target` (R,): row $r$ is **kept** unless
# `target[r] == ignore_index`; $N$ = number of kept rows;
# $L = \frac{1}{N}\sum_{\text{kept } r} \big(\mathrm{lse}(z_r) - z_{r, t_r}\big)$ with
# $\mathrm{lse}(z) = m + \log\sum_c e^{z_c - m}$, $m = \max_c z_c$ (or `torch.logsumexp`).
# Backward: derive $\partial L/\partial z_r$ (differentiate $\mathrm{lse}$, then the picked logit,
# and do not forget the $1/N$ and the upstream $\partial L/\partial L$ = `grad_L`); it must be
# exactly **0** on ignored rows; `target` and `ignore_index` get `None`.
#
# <details><summary>Hint 1: the formula (check yours against it)</summary>
#
# $\partial\,\mathrm{lse}(z)/\partial z_c = \mathrm{softmax}(z)_c$, so on kept rows
# $\partial L/\partial z_r = g_L\,(\mathrm{softmax}(z_r) - \text{one-hot}(t_r))/N$, with
# $g_L$ = `grad_L`.
#
# </details>
#
# <details><summary>Hint 2: the ignored rows</summary>
#
# An ignored row's target (e.g. -100) is no valid index; replace it by 0 before
# `scatter`/`one_hot`, then zero the row.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
class CrossEntropy(torch.autograd.Function):
    """L = mean over kept rows of lse(z) − z[target]; ignore_index rows left out."""

    @staticmethod
    def forward(logits, target, ignore_index):
        # BEGIN SOLUTION
        keep = target != ignore_index  # (R,)
        # (R,) a valid class everywhere
        safe = torch.where(keep, target, torch.zeros_like(target))
        lse = torch.logsumexp(logits, dim=-1)  # (R,)
        picked = logits.gather(1, safe[:, None])[:, 0]  # (R, C) -> (R,)
        return ((lse - picked) * keep).sum() / keep.sum()
        # END SOLUTION

    @staticmethod
    def setup_context(ctx, inputs, output):
        # BEGIN SOLUTION
        logits, target, ignore_index = inputs
        ctx.save_for_backward(logits, target)
        ctx.ignore_index = ignore_index
        # END SOLUTION

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_L):
        # BEGIN SOLUTION
        logits, target = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        keep = target != ctx.ignore_index  # (R,)
        safe = torch.where(keep, target, torch.zeros_like(target))
        P = torch.softmax(logits, dim=-1)  # (R, C)
        onehot = F.one_hot(safe, logits.shape[-1]).to(logits.dtype)  # (R, C)
        grad = (P - onehot) * keep[:, None] * (grad_L / keep.sum())
        return grad, None, None
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

from helpers.device import randn

_z = randn(7, 5, seed=401, dtype=torch.float64).requires_grad_()
_t = torch.tensor([0, 4, 2, 2, 1, 3, 0])
assert torch.autograd.gradcheck(
    lambda z: CrossEntropy.apply(z, _t, -100), (_z,), eps=1e-6, atol=1e-6
)
assert torch.allclose(
    CrossEntropy.apply(_z, _t, -100),
    torch.nn.functional.cross_entropy(_z, _t),
    atol=1e-12,
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

# huge logits: no inf/nan in the loss or the gradient
_z = torch.tensor(
    [[1000.0, -1000.0, 0.0], [-500.0, 800.0, 790.0]],
    dtype=torch.float64,
    requires_grad=True,
)
_t = torch.tensor([1, 2])
_L = CrossEntropy.apply(_z, _t, -100)
(_g,) = torch.autograd.grad(3.0 * _L, _z)
_leaf = _z.detach().clone().requires_grad_()
(_ref,) = torch.autograd.grad(3.0 * torch.nn.functional.cross_entropy(_leaf, _t), _leaf)
assert (
    torch.isfinite(_L)
    and abs(_L.item() - torch.nn.functional.cross_entropy(_z, _t).item()) < 1e-9
)
assert torch.isfinite(_g).all() and torch.allclose(_g, _ref, atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# ignored rows: not in the mean, exactly zero gradient; a custom ignore_index
_z = randn(6, 4, seed=402, dtype=torch.float64).requires_grad_()
_t = torch.tensor([3, 7, 0, 7, 7, 1])
_L = CrossEntropy.apply(_z, _t, 7)
(_g,) = torch.autograd.grad(_L, _z)
assert (
    abs(_L.item() - torch.nn.functional.cross_entropy(_z, _t, ignore_index=7).item())
    < 1e-12
)
assert torch.equal(_g[[1, 3, 4]], torch.zeros(3, 4, dtype=torch.float64))
assert torch.allclose(_g.sum(1), torch.zeros(6, dtype=torch.float64), atol=1e-15)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: `F.cross_entropy` and autograd on 6 rows of 5 classes, two of
# them ignored, then `gradcheck`):

# %%
z4 = randn(6, 5, seed=9, dtype=dtype, device=dev) * 3
t4 = torch.tensor([1, -100, 4, 0, -100, 2], device=dev)
ignored4 = (t4 == -100)[:, None]  # (6, 1)
check_function(
    "Exercise 4 · CrossEntropy",
    lambda z: CrossEntropy.apply(z, t4, -100),
    lambda z: F.cross_entropy(z, t4, ignore_index=-100),
    (z4,),
    torch.tensor(1.0, dtype=dtype, device=dev),
    outputs=("L", "grad_logits"),
    factors={"N": 4, "N/R": 4 / 6},  # N = 4 kept rows of R = 6
    regions={"grad_logits": {"target = -100 (the ignored rows)": ignored4}},
)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `softmax_backward`, `Softmax`, `RMSNorm`
# and `CrossEntropy`.
