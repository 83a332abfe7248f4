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
# You build the two tools every later chapter leans on, each in a form the chapter derived
# but did not print: a gradient checker that needs no calculus, and the linear layer's
# backward pass. Then two rules that trip everyone up: a value used twice, and a copied
# (tiled) tensor. This lab goes with [Chapter 2](../chapters/02_chain_rule.ipynb).
#
# **Learning goals.** After this lab you can
# * check any gradient with central differences along random directions, two evaluations
#   per direction, and say why they beat one-sided ones;
# * derive the three gradients of a linear layer in either weight layout, for inputs with
#   any number of leading dimensions, and get every shape right;
# * add up the gradients of a value that feeds two branches;
# * undo a tiling (`repeat`) in backward by summing over the copies.
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
# by_hand: [autograd, helpers.numgrad.numerical_grad, helpers.numgrad.numerical_jacobian]

# %% [markdown]
# ## Exercise 1 · A gradient check along random directions (2 points)
#
# **Goal:** a check you can trust without any calculus, at two evaluations of $f$ per
# direction instead of two per entry of $x$.
#
# Chapter 2's `numerical_grad` moves every entry $x_i$ by $\pm h$ in turn: $2n$ evaluations for
# $n$ entries, too many for a layer's weights. A cheaper check moves **all** entries at once,
# along a direction $u$ (a tensor of the shape of $x$): the central difference of
# $g(t) = f(x + t\,u)$ at $t = 0$ estimates $g'(0) = u^\top \nabla f(x) = \sum_i u_i\,
# \partial f/\partial x_i$, the **directional derivative**. A gradient to test, say
# autograd's or your backward's, must give the same number for every $u$; one that is wrong
# fails a random direction with probability 1. `torch.autograd.gradcheck(..., fast_mode=True)`
# checks this way.
#
# Write `directional_derivatives(f, x, U, eps)` for a function `f` that maps a tensor to a
# scalar tensor: `U` stacks $k$ directions, `U[j]` of the shape of `x`. Return a tensor of
# shape `(k,)` and the dtype of `x` whose entry $j$ estimates $U_j^\top \nabla f(x)$ with a
# **central** difference of step $\varepsilon$ along $U_j$. Work out from the Taylor expansion
# of $g(\pm\varepsilon)$ what to divide by, and why the error is $O(\varepsilon^2)$ where a
# one-sided difference's is $O(\varepsilon)$. Leave `x` unchanged. A loop over the directions
# is fine.
#
# <details><summary>Hint: the formula (check yours against it)</summary>
#
# $\dfrac{f(x + \varepsilon U_j) - f(x - \varepsilon U_j)}{2\varepsilon}$: the even terms of
# the two expansions cancel, so the first error term is $\varepsilon^2 g'''(0)/6$. A step of
# $\varepsilon$ in every entry, `x + eps`, would be the direction of all ones, not $U_j$.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def directional_derivatives(f, x, U, eps=1e-6):
    """U[j]ᵀ∇f(x) for every direction U[j], by a central difference along it."""
    # BEGIN SOLUTION
    x = x.detach()
    slopes = torch.zeros(len(U), dtype=x.dtype, device=x.device)  # (k,)
    for j in range(len(U)):
        f_plus = float(f(x + eps * U[j]))
        f_minus = float(f(x - eps * U[j]))
        slopes[j] = (f_plus - f_minus) / (2 * eps)
    return slopes
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
_U = randn(4, 3, 2, seed=102, dtype=torch.float64)
_x0, _U0 = _x.clone(), _U.clone()
_d = directional_derivatives(lambda t: (t.exp() * t[:, :1]).sum(), _x, _U)
_leaf = _x.clone().requires_grad_()
(_g,) = torch.autograd.grad((_leaf.exp() * _leaf[:, :1]).sum(), _leaf)
assert _d.shape == (4,) and _d.dtype == torch.float64
assert torch.equal(_x, _x0) and torch.equal(_U, _U0)
assert torch.allclose(_d, _U.reshape(4, -1) @ _g.reshape(-1), atol=1e-6, rtol=1e-6)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

# Σ t³ at (1, 2) with ε = 1e-2: central gives uᵀ∇f + ε² Σ uᵢ³ exactly,
# 11.4 + 0.0000728 along (0.6, 0.8) and 12 + 0.0001 along (0, 1)
_d = directional_derivatives(
    lambda t: (t**3).sum(),
    torch.tensor([1.0, 2.0], dtype=torch.float64),
    torch.tensor([[0.6, 0.8], [0.0, 1.0]], dtype=torch.float64),
    eps=1e-2,
)
assert abs(float(_d[0]) - 11.4000728) < 1e-9 and abs(float(_d[1]) - 12.0001) < 1e-9

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: autograd's gradient, dotted with each of 5 random unit
# directions, on $f(x) = \sum x \sin x + \prod x$, with $\varepsilon = 10^{-3}$; it also checks
# that `x` and `U` are unchanged):


# %%
def f_test(x):
    """Σ x·sin(x) + Π x: every entry of the gradient depends on the others."""
    return (x * x.sin()).sum() + x.prod()


x_test = randn(2, 3, seed=20, dtype=dtype, device=dev)
U_test = randn(5, 2, 3, seed=21, dtype=dtype, device=dev)
U_test = U_test / U_test.reshape(5, -1).norm(dim=1).reshape(5, 1, 1)  # unit directions
(grad_test,) = autograd_grads(f_test, (x_test,))
expected = U_test.reshape(5, -1) @ grad_test.reshape(-1)  # (5, 6) @ (6,) -> (5,)
# known wrong answers, built from autograd's first and second derivatives
eps = 1e-3
hess = torch.autograd.functional.hessian(f_test, x_test).reshape(6, 6)
# a one-sided difference's error, ε/2 · uᵀ H u for each direction u
bias = eps / 2 * ((U_test.reshape(5, -1) @ hess) * U_test.reshape(5, -1)).sum(1)
first = torch.arange(5, device=dev) == 0
check(
    directional_derivatives,
    expected,
    args=(f_test, x_test, U_test, eps),
    outputs=("slopes",),
    mistakes={
        "slopes": {
            "a one-sided difference at x + εu (error +ε/2·uᵀHu)": expected + bias,
            "a one-sided difference at x − εu (error −ε/2·uᵀHu)": expected - bias,
            "0 everywhere (both evaluations of f at the same point?)": 0 * expected,
            "the slope along all ones for every u (stepped x + ε, not x + εu)": (
                grad_test.sum() * torch.ones_like(expected)
            ),
            "the first direction's slope, 0 for the others (one direction done)": (
                expected * first
            ),
        }
    },
    name="Exercise 1 · directional_derivatives",
    against="autograd",
    atol=1e-5,
    rtol=1e-5,
)

# %% [markdown]
# The tolerance is $10^{-5}$, not $10^{-10}$: with $\varepsilon = 10^{-3}$ the central
# difference's truncation error is of order $\varepsilon^2 = 10^{-6}$ (times $g'''/6$), and
# the round-off in $f(x \pm \varepsilon u)$ divided by $2\varepsilon$ is about $10^{-13}$. A
# one-sided difference's error is of order $\varepsilon = 10^{-3}$: it fails this check.
# Five directions cost 10 evaluations of $f$ here, `numerical_grad` 12; for a (768, 768)
# weight it would be 1,179,648.

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 3
# by_hand: [autograd, helpers.numgrad.linear_backward]

# %% [markdown]
# ## Exercise 2 · The linear layer's three gradients, in the other layout (3 points)
#
# **Goal:** the linear layer's backward in the layout chapter 2 did not print, for inputs
# with any number of leading dimensions.
#
# Chapter 2 derived the gradients of `nn.Linear`'s $Y = X W^\top + b$, with `W` stored as
# (out, in). JAX's Flax (`nn.Dense`) and many hand-written layers store the weight the other
# way round: $Y = X W + b$ with `W` (in, out), `b` (out,). And a layer inside a transformer
# sees `X` of shape (B, T, in), or any `(..., in)`: every leading index is one more row, and
# `Y` is `(..., out)`. Given `grad_Y` $= \partial L/\partial Y$ `(..., out)`, return
# `(grad_X, grad_W, grad_b)` with the shapes of `X`, `W`, `b`. The arguments come in the
# course's order, `(X, W, grad_Y)`, as in `helpers.numgrad.linear_backward` (which you may
# not call here).
# Derive each from one entry, $Y_{ro} = \sum_i X_{ri} W_{io} + b_o$ for a row $r$, then write
# it as a matrix product or a sum; the shapes leave one answer. A weight or a bias is shared
# by every row, so its gradient adds up over all of them.
#
# <details><summary>Hint: the rows (check yours against it)</summary>
#
# Flatten the leading dimensions into one, `X.reshape(-1, X.shape[-1])` (R, in) and
# `grad_Y.reshape(-1, grad_Y.shape[-1])` (R, out), and the layer is a 2-D one with R rows;
# `grad_X` keeps `X`'s shape, and a matmul with a 2-D right operand works on `(..., k)`
# tensors as they are.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def dense_backward(X, W, grad_Y):
    """(grad_X, grad_W, grad_b) for Y = X W + b, W (in, out), given grad_Y = ∂L/∂Y."""
    # every leading index is a row: (..., in) -> (R, in), (..., out) -> (R, out)
    X_rows = X.reshape(-1, X.shape[-1])  # SOLUTION
    grad_Y_rows = grad_Y.reshape(-1, grad_Y.shape[-1])  # SOLUTION
    # -> (..., in), the shape of X
    grad_X = grad_Y @ W.T  # SOLUTION
    # -> (in, out), the shape of W
    grad_W = X_rows.T @ grad_Y_rows  # SOLUTION
    # -> (out,), the shape of b
    grad_b = grad_Y_rows.sum(0)  # SOLUTION
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
    randn(5, 3, seed=202, dtype=torch.float64),
    randn(3, seed=203, dtype=torch.float64),
)
_gY = randn(6, 3, seed=204, dtype=torch.float64)
_leaves = [t.clone().requires_grad_() for t in (_X, _W, _b)]
_ref = torch.autograd.grad(_leaves[0] @ _leaves[1] + _leaves[2], _leaves, _gY)
_out = dense_backward(_X, _W, _gY)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-12) for o, r in zip(_out, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# four leading dims: 2·3·1·4 = 24 rows share W and b
_X, _W, _b = (
    randn(2, 3, 1, 4, 5, seed=205, dtype=torch.float64),
    randn(5, 7, seed=206, dtype=torch.float64),
    randn(7, seed=207, dtype=torch.float64),
)
_gY = randn(2, 3, 1, 4, 7, seed=208, dtype=torch.float64)
_leaves = [t.clone().requires_grad_() for t in (_X, _W, _b)]
_ref = torch.autograd.grad(_leaves[0] @ _leaves[1] + _leaves[2], _leaves, _gY)
_out = dense_backward(_X, _W, _gY)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-12) for o, r in zip(_out, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# one row, and no leading dim at all: grad_W is the outer product x ⊗ grad_y (in, out)
_x, _W = (
    randn(4, seed=209, dtype=torch.float64),
    randn(4, 6, seed=210, dtype=torch.float64),
)
_gy = randn(6, seed=211, dtype=torch.float64)
for _lead in ((1,), ()):
    _gX, _gW, _gb = dense_backward(_x.reshape(*_lead, 4), _W, _gy.reshape(*_lead, 6))
    assert _gX.shape == (*_lead, 4) and _gW.shape == (4, 6) and _gb.shape == (6,)
    assert torch.allclose(_gW, torch.outer(_x, _gy), atol=1e-12)
    assert torch.allclose(_gb, _gy, atol=1e-12)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: autograd through `X @ W + b` with `X` (B, T, in) = (3, 5, 6),
# `W` (6, 4) and upstream gradient `grad_Y` (3, 5, 4)):

# %%
X = randn(3, 5, 6, seed=2, dtype=dtype, device=dev)
W = randn(6, 4, seed=3, dtype=dtype, device=dev)
b = randn(4, seed=4, dtype=dtype, device=dev)
grad_Y = randn(3, 5, 4, seed=5, dtype=dtype, device=dev)
# (3, 5, 6) @ (6, 4) -> (3, 5, 4)
expected = autograd_grads(lambda X, W, b: X @ W + b, (X, W, b), grad_Y)
check(
    dense_backward,
    expected,
    args=(X, W, grad_Y),
    outputs=("grad_X", "grad_W", "grad_b"),
    # a mean over the batch, or over all B·T rows, instead of the sum
    factors={"B": 3, "B·T": 15},
    name="Exercise 2 · dense_backward",
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
# ## Exercise 4 · A tiled tensor's backward (3 points)
#
# **Goal:** a tensor tiled in forward was *copied*, and a copy's backward is a sum: add up
# what every copy receives, and return it in the input's own shape.
#
# `x.repeat(*reps)` tiles `x`: when `reps` is longer than `x.dim()`, `x` first gets leading
# dimensions of size 1 (the shapes line up on the right, as in broadcasting); then a
# dimension of size $n$ repeated $r$ times becomes one of size $r \cdot n$ that holds the
# **whole block** $r$ times, entry $t \cdot n + i$ being a copy of entry $i$
# (`repeat_interleave` would instead put each entry's $r$ copies side by side). Example:
# `x` (3, 2) and `reps` (4, 2, 3) give `y` (4, 6, 6), $4 \cdot 2 \cdot 3 = 24$ copies of `x`.
#
# Write `unrepeat(grad, shape, reps)`: given `grad` $= \partial L/\partial y$ for
# `y = x.repeat(*reps)`, return $\partial L/\partial x$, with exactly the shape `shape` of
# `x`. Chapter 2 showed the rule for broadcasting (a value used many times: sum what each use
# sends back); work out which entries of `grad` are copies of the same entry of `x`.
#
# <details><summary>Hint: the recipe</summary>
#
# Pad `shape` on the left with 1s to the length of `reps`. Reshape `grad` so that each
# dimension of size $r \cdot n$ becomes two, $(r, n)$: which tile, then where in the tile.
# Sum over the tile dimensions, then reshape to `shape` (dropping the padded 1s).
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def unrepeat(grad, shape, reps):
    """∂L/∂x of shape `shape`, given grad = ∂L/∂y for y = x.repeat(*reps)."""
    # BEGIN SOLUTION
    padded = (1,) * (len(reps) - len(shape)) + tuple(shape)  # x as repeat sees it
    split = []
    for r, n in zip(reps, padded):
        split += [r, n]  # a dim of size r·n -> (r, n): which tile, where in it
    grad = grad.reshape(split)  # (r0·n0, r1·n1, ...) -> (r0, n0, r1, n1, ...)
    grad = grad.sum(dim=tuple(range(0, len(split), 2)))  # over the tiles
    return grad.reshape(shape)  # (1, ..., 1, *shape) -> shape
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

_x = randn(2, 3, seed=401, dtype=torch.float64)
_gy = randn(4, 6, seed=402, dtype=torch.float64)
_leaf = _x.clone().requires_grad_()
(_ref,) = torch.autograd.grad(_leaf.repeat(2, 2), _leaf, _gy)
_gx = unrepeat(_gy, _x.shape, (2, 2))
assert _gx.shape == (2, 3) and torch.allclose(_gx, _ref, atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# reps longer than x.dim(), some reps of 1, and a dim of size 1 repeated
for _shape, _reps, _seed in (((3,), (2, 1, 4), 403), ((2, 1, 3), (1, 4, 1), 405)):
    _x = randn(*_shape, seed=_seed, dtype=torch.float64)
    _leaf = _x.clone().requires_grad_()
    _y = _leaf.repeat(*_reps)
    _gy = randn(*_y.shape, seed=_seed + 1, dtype=torch.float64)
    (_ref,) = torch.autograd.grad(_y, _leaf, _gy)
    _gx = unrepeat(_gy, _shape, _reps)
    assert _gx.shape == _shape and torch.allclose(_gx, _ref, atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

# a 0-dim x repeated 3 times: its gradient is the sum of the three
_gx = unrepeat(torch.tensor([1.0, 2.0, 4.0], dtype=torch.float64), (), (3,))
assert _gx.shape == () and float(_gx) == 7.0

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: autograd through `y = x.repeat(2, 3, 2, 2)` with `x` (3, 2),
# so `y` is (2, 3, 6, 4), 24 copies of `x`, and upstream gradient `grad_y` (2, 3, 6, 4)):

# %%
x_tile = randn(3, 2, seed=9, dtype=dtype, device=dev)
grad_y = randn(2, 3, 6, 4, seed=10, dtype=dtype, device=dev)
reps = (2, 3, 2, 2)
(expected,) = autograd_grads(lambda x: x.repeat(*reps), (x_tile,), grad_y)

first = torch.zeros_like(grad_y)
first[:1, :1, :3, :2] = 1  # 1 on the first tile of y, 0 on the other 23
# known wrong answers: autograd of the forwards that the mistakes undo
wrong_forward = {
    # each entry's copies side by side: (1, 1, 3, 2) -> (2, 3, 6, 4)
    "repeat_interleave's backward (each entry copied in place, not whole tiles)": (
        lambda x: (
            x.reshape(1, 1, 3, 2)
            .repeat_interleave(2, 0)
            .repeat_interleave(3, 1)
            .repeat_interleave(2, 2)
            .repeat_interleave(2, 3)
        )
    ),
    # x's dims lined up with reps on the left: (3, 2, 1, 1) -> (6, 6, 2, 2)
    "a tiling with x's dims lined up with reps on the left, not the right": (
        lambda x: x.reshape(3, 2, 1, 1).repeat(*reps).reshape(2, 3, 6, 4)
    ),
    # only the first tile depends on x
    "the first tile's gradient alone (the other 23 copies dropped)": (
        lambda x: x.repeat(*reps) * first
    ),
}
mistakes = {
    label: autograd_grads(fwd, (x_tile,), grad_y)[0]
    for label, fwd in wrong_forward.items()
}
mistakes["the mean over the 2·3·2·2 = 24 tiles, not the sum"] = expected / 24
check(
    unrepeat,
    expected,
    args=(grad_y, x_tile.shape, reps),
    outputs=("grad_x",),
    mistakes={"grad_x": mistakes},
    name="Exercise 4 · unrepeat",
    against="autograd",
)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the function names: the grader calls `directional_derivatives`,
# `dense_backward`, `residual_backward` and `unrepeat`.
