# %% [raw]
# # ASSIGNMENT CONFIG
# name: lab02_chain_rule
# init_cell: false
# check_all_cell: false
# export_cell: false
# run_tests: true
# generate:
#   pdf: false
#   show_stdout: false

# %% [markdown]
# # Lab 2 · Chain rule, gradient checks and the linear layer
#
# You build the two tools every later chapter leans on: a gradient checker that needs no
# calculus, and the linear layer's backward pass. Then two rules that trip everyone up: a
# value used twice, and broadcasting. This lab goes with
# [Chapter 2](../chapters/02_chain_rule.ipynb).
#
# **Learning goals.** After this lab you can
# * check any gradient with central finite differences, and say why they beat one-sided ones;
# * derive the three gradients of `nn.Linear` and get every shape right;
# * add up the gradients of a value that feeds two branches;
# * undo broadcasting in backward by summing over the broadcast dimensions.
#
# **How a lab works.** Each exercise states its goal and its points (10 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It answers in one line: `✓` matches (the `max|Δ|` is round-off), `✗`
# what is wrong and, where it can tell, which mistake explains it, or `·` not implemented
# yet. Your instructor grades the notebook you hand in with hidden tests that call the same
# functions on other inputs.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import torch

from helpers.device import get_device, no_tf32, randn
from helpers.labcheck import autograd_grads, check

dev = get_device()
no_tf32()
# finite differences need float64: in float32 round-off swamps them
dtype = torch.float64

# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2
# by_hand: [autograd, helpers.numgrad.numerical_grad]

# %% [markdown]
# ## Exercise 1 · A finite-difference gradient checker (2 points)
#
# **Goal:** a gradient you can trust without any calculus, to test every backward you write.
#
# Write `numerical_grad(f, x, eps)` for a function `f` that maps a tensor to a scalar tensor.
# For every entry $x_i$ estimate $\partial f/\partial x_i$ with a **central** difference, one
# that moves $x_i$ by $\varepsilon$ both ways: work out from the Taylor expansions of
# $f(x \pm \varepsilon e_i)$ what to divide by, and why its error is $O(\varepsilon^2)$ where a
# one-sided difference's is $O(\varepsilon)$. Return a tensor with the shape and dtype of `x`,
# and leave `x` itself unchanged, bit for bit: perturb a copy, `x.clone()`, not `x` (adding
# and then subtracting $\varepsilon$ does not always give back the same float). A loop over
# the entries is fine.
#
# <details><summary>Hint: the formula (check yours against it)</summary>
#
# $\dfrac{f(x + \varepsilon e_i) - f(x - \varepsilon e_i)}{2\varepsilon}$: the two Taylor
# expansions' even terms cancel, so the first error term is $\varepsilon^2 f'''/6$.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def numerical_grad(f, x, eps=1e-6):
    """∂f/∂x_i for every entry i by a central difference of step eps; x unchanged."""
    # BEGIN SOLUTION
    x = x.detach().clone()
    grad = torch.zeros_like(x)
    flat, grad_flat = x.view(-1), grad.view(-1)  # views: writing flat[i] perturbs x
    for i in range(flat.numel()):
        old = flat[i].item()
        flat[i] = old + eps
        f_plus = float(f(x))
        flat[i] = old - eps
        f_minus = float(f(x))
        flat[i] = old
        grad_flat[i] = (f_plus - f_minus) / (2 * eps)
    return grad
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

_x = randn(3, 2, seed=101, dtype=torch.float64)
_x0 = _x.clone()
_g = numerical_grad(lambda t: (t.exp() * t[:, :1]).sum(), _x)
_leaf = _x.clone().requires_grad_()
(_ref,) = torch.autograd.grad((_leaf.exp() * _leaf[:, :1]).sum(), _leaf)
assert _g.shape == _x.shape and _g.dtype == torch.float64 and torch.equal(_x, _x0)
assert torch.allclose(_g, _ref, atol=1e-6, rtol=1e-6)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

# x³ at 1 with ε = 1e-2: central gives 3 + ε² = 3.0001, one-sided 3 + 3ε + ε² = 3.0301
_g = numerical_grad(
    lambda t: (t**3).sum(), torch.tensor([1.0], dtype=torch.float64), eps=1e-2
)
assert abs(float(_g[0]) - 3.0001) < 1e-9

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: autograd, on $f(x) = \sum x \sin x + \prod x$, with
# $\varepsilon = 10^{-3}$; it also checks that `x` is unchanged):


# %%
def f_test(x):
    """Σ x·sin(x) + Π x: every entry of the gradient depends on the others."""
    return (x * x.sin()).sum() + x.prod()


x_test = randn(2, 3, seed=20, dtype=dtype, device=dev)
(expected,) = autograd_grads(f_test, (x_test,))
# known wrong answers, built from autograd's first and second derivatives
n, eps = x_test.numel(), 1e-3
hess = torch.autograd.functional.hessian(f_test, x_test).reshape(n, n)
# a one-sided difference's error, ε/2 · ∂²f/∂xᵢ²
bias = eps / 2 * hess.diagonal().reshape(x_test.shape)
# entry i's slope moved by the entries before it, left at xⱼ - ε
stale = expected - eps * hess.tril(-1).sum(1).reshape(x_test.shape)
# the first entry's slope alone
lone = expected * (torch.arange(n, device=x_test.device) == 0).reshape(x_test.shape)
check(
    numerical_grad,
    expected,
    args=(f_test, x_test, eps),
    outputs=("grad",),
    mistakes={
        "grad": {
            "a one-sided difference at x + ε (error +ε/2·f″)": expected + bias,
            "a one-sided difference at x − ε (error −ε/2·f″)": expected - bias,
            "slopes with the earlier entries left at xⱼ − ε (not restored)": stale,
            "0 everywhere (both evaluations of f at the same point?)": 0 * expected,
            "the first entry's slope, 0 elsewhere (one entry perturbed)": lone,
        }
    },
    name="Exercise 1 · numerical_grad",
    against="autograd",
    atol=1e-5,
    rtol=1e-5,
)

# %% [markdown]
# The tolerance is $10^{-5}$, not $10^{-10}$: with $\varepsilon = 10^{-3}$ the central
# difference's truncation error is of order $\varepsilon^2 = 10^{-6}$ (times $f'''/6$), and the
# round-off in $f(x \pm \varepsilon e_i)$ divided by $2\varepsilon$ is about $10^{-13}$. A
# one-sided difference's error is of order $\varepsilon = 10^{-3}$: it fails this check.

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 3
# by_hand: [autograd, helpers.numgrad.linear_backward]

# %% [markdown]
# ## Exercise 2 · The linear layer's three gradients (3 points)
#
# **Goal:** the backward of `nn.Linear`, the most common layer there is, in its own layout.
#
# $Y = X W^\top + b$ with `X` (B, in), `W` (out, in), `b` (out,), `Y` (B, out). Given
# `grad_Y` $= \partial L/\partial Y$ (B, out), return `(grad_X, grad_W, grad_b)` with the shapes of `X`, `W`, `b`.
# The arguments come in the course's order, `(X, W, grad_Y)`: the one `helpers.numgrad.linear_backward`
# (chapter 2) and every later lab use.
# Derive each from one entry, $Y_{bo} = \sum_i X_{bi} W_{oi} + b_o$, then write it as a matrix
# product or a sum; the shapes leave one answer.
#
# <details><summary>Hint: the formulas (check yours against them)</summary>
#
# $\partial L/\partial X = \partial L/\partial Y\, W$, $\;\partial L/\partial W =
# (\partial L/\partial Y)^\top X$, $\;\partial L/\partial b = \sum_{\text{rows}} \partial
# L/\partial Y$ (a sum over the batch, not a mean).
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def linear_backward(X, W, grad_Y):
    """(grad_X, grad_W, grad_b) for Y = X Wᵀ + b, given grad_Y = ∂L/∂Y."""
    # -> (B, in), the shape of X
    grad_X = grad_Y @ W  # SOLUTION
    # -> (out, in), the shape of W
    grad_W = grad_Y.T @ X  # SOLUTION
    # -> (out,), the shape of b
    grad_b = grad_Y.sum(0)  # SOLUTION
    return grad_X, grad_W, grad_b


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

_X, _W, _b = (
    randn(6, 5, seed=201, dtype=torch.float64),
    randn(3, 5, seed=202, dtype=torch.float64),
    randn(3, seed=203, dtype=torch.float64),
)
_gY = randn(6, 3, seed=204, dtype=torch.float64)
_leaves = [t.clone().requires_grad_() for t in (_X, _W, _b)]
_ref = torch.autograd.grad(torch.nn.functional.linear(*_leaves), _leaves, _gY)
_out = linear_backward(_X, _W, _gY)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-12) for o, r in zip(_out, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_X, _W = (
    randn(1, 4, seed=205, dtype=torch.float64),
    randn(7, 4, seed=206, dtype=torch.float64),
)
_gY = randn(1, 7, seed=207, dtype=torch.float64)
_gX, _gW, _gb = linear_backward(_X, _W, _gY)
assert _gX.shape == (1, 4) and _gW.shape == (7, 4) and _gb.shape == (7,)
assert torch.allclose(_gW, torch.outer(_gY[0], _X[0]), atol=1e-12) and torch.allclose(
    _gb, _gY[0], atol=1e-12
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: autograd through `X @ W.T + b` with upstream gradient `grad_Y`):

# %%
X = randn(5, 3, seed=2, dtype=dtype, device=dev)
W = randn(4, 3, seed=3, dtype=dtype, device=dev)
b = randn(4, seed=4, dtype=dtype, device=dev)
grad_Y = randn(5, 4, seed=5, dtype=dtype, device=dev)
# (5, 3) @ (3, 4) -> (5, 4)
expected = autograd_grads(lambda X, W, b: X @ W.T + b, (X, W, b), grad_Y)
check(
    linear_backward,
    expected,
    args=(X, W, grad_Y),
    outputs=("grad_X", "grad_W", "grad_b"),
    factors={"B": 5},  # a batch mean instead of the sum is off by B
    name="Exercise 2 · linear_backward",
    against="autograd",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 2
# by_hand: [autograd, helpers.numgrad.linear_backward]

# %% [markdown]
# ## Exercise 3 · A value used twice (2 points)
#
# **Goal:** when a value feeds two branches, its gradient is the **sum** of what each branch
# sends back: accumulate with `+=`, never overwrite.
#
# A residual block: $Y = \tanh(X W^\top) + X$ with `X` (B, D) and a square `W` (D, D). `X` is
# used twice, inside the layer and on the skip connection. Given `grad_Y` (B, D), return
# `(grad_X, grad_W)`. You may write the linear part inline (do not call your Exercise 2).

# %% [raw]
# # BEGIN SOLUTION


# %%
def residual_backward(grad_Y, X, W):
    """(grad_X, grad_W) for Y = tanh(X Wᵀ) + X, given grad_Y = ∂L/∂Y."""
    # BEGIN SOLUTION
    T = torch.tanh(X @ W.T)  # (B, D) @ (D, D) -> (B, D)
    grad_H = grad_Y * (1 - T**2)  # (B, D)   tanh' = 1 - tanh²
    grad_X = grad_H @ W  # (B, D) @ (D, D) -> (B, D)   branch 1: the layer
    grad_X += grad_Y  # (B, D)                      branch 2: the skip
    grad_W = grad_H.T @ X  # (D, B) @ (B, D) -> (D, D)
    return grad_X, grad_W
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

_X, _W, _gY = (
    randn(4, 3, seed=301, dtype=torch.float64),
    randn(3, 3, seed=302, dtype=torch.float64),
    randn(4, 3, seed=303, dtype=torch.float64),
)
_leaves = [t.clone().requires_grad_() for t in (_X, _W)]
_ref = torch.autograd.grad(
    torch.tanh(_leaves[0] @ _leaves[1].T) + _leaves[0], _leaves, _gY
)
_out = residual_backward(_gY, _X, _W)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-12) for o, r in zip(_out, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

# W = 0: the layer's branch sends back grad_Y ⊙ 1 @ 0 = 0,
# so grad_X is the skip's grad_Y alone
_gY = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)
_gX, _gW = residual_backward(
    _gY, torch.ones(2, 3, dtype=torch.float64), torch.zeros(3, 3, dtype=torch.float64)
)
assert torch.allclose(_gX, _gY, atol=1e-12) and torch.allclose(
    _gW, _gY.T @ torch.ones(2, 3, dtype=torch.float64), atol=1e-12
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (reference: autograd through the residual block):

# %%
X_res = randn(5, 4, seed=6, dtype=dtype, device=dev)
W_res = randn(4, 4, seed=7, dtype=dtype, device=dev)
grad_Y_res = randn(5, 4, seed=8, dtype=dtype, device=dev)
expected = autograd_grads(
    lambda X, W: torch.tanh(X @ W.T) + X, (X_res, W_res), grad_Y_res
)
# known wrong answers: autograd through an activation whose slope is a wrong tanh'
wrong_slope = {
    "tanh' taken as 1 − tanh": lambda H: H - H.cosh().log(),  # slope 1 - tanh(H)
    "tanh' left out (the layer treated as linear)": lambda H: H,  # slope 1
    "tanh' from X Wᵀ, not from tanh's output": lambda H: H - H**3 / 3,  # slope 1 - H²
}
wrong = {
    f"the gradient with {label}": autograd_grads(
        lambda X, W, act=act: act(X @ W.T) + X, (X_res, W_res), grad_Y_res
    )
    for label, act in wrong_slope.items()
}
check(
    residual_backward,
    expected,
    args=(grad_Y_res, X_res, W_res),
    terms={"grad_X": {"the skip path": grad_Y_res}},
    outputs=("grad_X", "grad_W"),
    mistakes={
        "grad_X": {label: g[0] for label, g in wrong.items()},
        "grad_W": {label: g[1] for label, g in wrong.items()},
    },
    name="Exercise 3 · residual_backward",
    against="autograd",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 3
# by_hand: [autograd, helpers.numgrad.unbroadcast]

# %% [markdown]
# ## Exercise 4 · Broadcasting's backward (3 points)
#
# **Goal:** a tensor broadcast in forward was *copied* along some dimensions, and a copy's
# backward is a sum; the gradient must come back in the input's own shape.
#
# Write `unbroadcast(grad, shape)`: given the gradient `grad` of a broadcast result, return
# the gradient of the operand of shape `shape`, with exactly that shape. Work out first which
# dimensions broadcasting created or stretched (recall its rules: align the shapes on the
# right; a missing or size-1 dimension is repeated), and what a copy does in backward.
# Example: `grad` (4, 5, 3) and `shape` (5, 1) → (5, 1).
#
# <details><summary>Hint: the recipe</summary>
#
# Sum `grad` over the leading dimensions that `shape` lacks, then over every dimension where
# `shape` has size 1 and `grad` does not (keeping it, `keepdim=True`). In the example: sum over
# dim 0, then over the last dim with `keepdim=True`.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def unbroadcast(grad, shape):
    """The gradient of the operand of shape `shape` that was broadcast to grad's."""
    # BEGIN SOLUTION
    shape = tuple(shape)
    extra = grad.dim() - len(shape)
    if extra > 0:
        grad = grad.sum(dim=tuple(range(extra)))  # (extra dims..., *shape') -> shape'
    for d, n in enumerate(shape):
        if n == 1 and grad.shape[d] != 1:
            grad = grad.sum(dim=d, keepdim=True)  # (..., m, ...) -> (..., 1, ...)
    return grad
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

_g = randn(2, 4, 3, seed=401, dtype=torch.float64)
assert unbroadcast(_g, (3,)).shape == (3,) and torch.allclose(
    unbroadcast(_g, (3,)), _g.sum((0, 1)), atol=1e-12
)
assert torch.allclose(
    unbroadcast(_g, (4, 1)), _g.sum(0).sum(1, keepdim=True), atol=1e-12
)
assert torch.allclose(unbroadcast(_g, (2, 4, 3)), _g)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_g = randn(5, 3, seed=402, dtype=torch.float64)
assert (
    unbroadcast(_g, ()).shape == ()
    and abs(float(unbroadcast(_g, ())) - float(_g.sum())) < 1e-12
)
_r = unbroadcast(_g, (1, 3))
assert _r.shape == (1, 3) and torch.allclose(_r, _g.sum(0, keepdim=True), atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_A, _B = (
    randn(3, 1, 4, seed=403, dtype=torch.float64),
    randn(2, 1, seed=404, dtype=torch.float64),
)
_gZ = randn(3, 2, 4, seed=405, dtype=torch.float64)
_leaves = [t.clone().requires_grad_() for t in (_A, _B)]
_ref = torch.autograd.grad(_leaves[0] * _leaves[1], _leaves, _gZ)
assert torch.allclose(unbroadcast(_gZ * _B, _A.shape), _ref[0], atol=1e-12)
assert torch.allclose(unbroadcast(_gZ * _A, _B.shape), _ref[1], atol=1e-12)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: autograd through $Z = A \odot B$ with `A` (4, 1, 3) and `B`
# (5, 1), so `Z` is (4, 5, 3); your `unbroadcast` turns $\frac{\partial L}{\partial Z} \odot B$ and $\frac{\partial L}{\partial Z} \odot A$ back into
# the gradients of `A` and `B`):

# %%
A = randn(4, 1, 3, seed=9, dtype=dtype, device=dev)
B = randn(5, 1, seed=10, dtype=dtype, device=dev)
grad_Z = randn(4, 5, 3, seed=11, dtype=dtype, device=dev)


def mul_backward(grad_Z, A, B):
    """Z = A ⊙ B (broadcast): the gradients, each unbroadcast to its shape."""
    return {
        "grad_A": unbroadcast(grad_Z * B, A.shape),
        "grad_B": unbroadcast(grad_Z * A, B.shape),
    }


grad_A, grad_B = autograd_grads(lambda A, B: A * B, (A, B), grad_Z)
check(
    mul_backward,
    {"grad_A": grad_A, "grad_B": grad_B},
    args=(grad_Z, A, B),
    outputs=("grad_B", "grad_A"),  # B first: (5, 1) has a dim added and a dim stretched
    mistakes={  # known wrong answers, built from the reference's values
        "grad_B": {
            "the mean over the added leading dim (size 4), not the sum": grad_B / 4,
            "the mean over the stretched dim (size 3), not the sum": grad_B / 3,
            "the mean over both broadcast dims, not the sum": grad_B / 12,
        },
        "grad_A": {"the mean over the stretched dim (size 5), not the sum": grad_A / 5},
    },
    name="Exercise 4 · unbroadcast",
    against="autograd",
)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the function names: the grader calls `numerical_grad`,
# `linear_backward`, `residual_backward` and `unbroadcast`.
