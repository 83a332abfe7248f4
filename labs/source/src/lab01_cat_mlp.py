# %% [raw]
# # ASSIGNMENT CONFIG
# name: lab01_cat_mlp
# init_cell: false
# check_all_cell: false
# export_cell: false
# run_tests: true
# generate:
#   pdf: false
#   show_stdout: false

# %% [markdown]
# # Lab 1 · The cat MLP, backward by hand
#
# The chapter showed every gradient of the cat MLP; here **you** write them. This lab goes
# with [Chapter 1](../chapters/01_cat_mlp.ipynb).
#
# **Learning goals.** After this lab you can
# * compute a small network's forward pass and keep what backward needs;
# * write the gradient of the MSE loss, of a linear layer and of ReLU by hand, with the shapes right;
# * say why a dead ReLU unit's weights get a zero gradient;
# * vectorise the whole backward pass over a batch.
#
# **How a lab works.** Each exercise states its goal and its points (11 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below: it compares your function with a reference (autograd, or the course's
# tested helpers) and answers in one line:
#
# * `✓` your answer matches (the `max|Δ|` number is round-off);
# * `✗` something is off: which output or which gradient, and what it reveals: a known
#   mistake it matches, the shape or dtype expected, the entries that are wrong, or the
#   largest error and where it is;
# * `·` not implemented yet.
#
# Your instructor grades the notebook you hand in with *hidden* tests: the same functions,
# called on other inputs. A self-check that passes is a good sign, not a guarantee.
# To hand it in: run all cells, then *File → Download → .ipynb*.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import torch

from helpers import cat_mlp
from helpers.device import get_device, no_tf32, randn
from helpers.labcheck import autograd_grads, check
from helpers.show import show

dev = get_device()
no_tf32()
dtype = torch.float64  # float64: the self-checks can then demand agreement to ~1e-10
p = cat_mlp.cat_params(dtype=dtype, device=dev)
x, W1, b1, W2, b2, y_true = (p[k] for k in ("x", "W1", "b1", "W2", "b2", "y_true"))
show("x", x)
show("W1", W1)
show("b1", b1)
show("W2", W2)
show("b2", b2)
show("y_true", y_true)

# %% [markdown]
# This is what a self-check says about a wrong answer and about an unfinished one:

# %%
check(torch.tensor([0.5, 0.0]), torch.tensor([0.5, 0.25]), name="demo: a wrong answer")
check(lambda: ..., torch.tensor([0.5, 0.25]), name="demo: an unfinished answer")

# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 1
# by_hand: [helpers.cat_mlp.forward]

# %% [markdown]
# ## Exercise 1 · The forward pass (1 point)
#
# **Goal:** compute and keep every value that backward will need.
#
# Write `forward_pass` for the seed's network, with `W1` of shape (2, 4), `W2` of shape (1, 2):
# $h = W_1 x + b_1$, $a = \mathrm{relu}(h)$, $\hat y = W_2 a + b_2$, $L = \sum (\hat y - y)^2$.
# Return the dict `{"h", "a", "y_hat", "L"}` (with `L` a 0-dimensional tensor).

# %% [raw]
# # BEGIN SOLUTION


# %%
def forward_pass(x, W1, b1, W2, b2, y_true):
    """h = W1 x + b1, a = relu(h), ŷ = W2 a + b2, L = Σ(ŷ - y)², in a dict."""
    # (2, 4) @ (4,) -> (2,)
    h = W1 @ x + b1  # SOLUTION
    # (2,)
    a = torch.relu(h)  # SOLUTION
    # (1, 2) @ (2,) -> (1,)
    y_hat = W2 @ a + b2  # SOLUTION
    # ()
    L = ((y_hat - y_true) ** 2).sum()  # SOLUTION
    return {"h": h, "a": a, "y_hat": y_hat, "L": L}


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers import cat_mlp

_p = cat_mlp.cat_params(dtype=torch.float64)
_out = forward_pass(_p["x"], _p["W1"], _p["b1"], _p["W2"], _p["b2"], _p["y_true"])
assert (
    abs(float(_out["L"]) - 0.19140625) < 1e-12
    and abs(float(_out["y_hat"][0]) - 0.5625) < 1e-12
)
assert torch.allclose(
    _out["a"], torch.tensor([0.725, 0.0], dtype=torch.float64), atol=1e-12
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers import cat_mlp
from helpers.device import randn

_q = [
    randn(2, 4, seed=11, dtype=torch.float64),
    randn(2, seed=12, dtype=torch.float64),
    randn(1, 2, seed=13, dtype=torch.float64),
    randn(1, seed=14, dtype=torch.float64),
]
_x, _y = randn(4, seed=15, dtype=torch.float64), randn(1, seed=16, dtype=torch.float64)
_out, _ref = forward_pass(_x, *_q, _y), cat_mlp.forward(_x, *_q, _y)
assert all(
    torch.allclose(_out[k], _ref[k], atol=1e-12) for k in ("h", "a", "y_hat", "L")
)
assert _out["L"].dim() == 0

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: `helpers.cat_mlp.forward`, the course's tested forward):

# %%
expected = cat_mlp.forward(x, W1, b1, W2, b2, y_true)
check(
    forward_pass,
    {k: expected[k] for k in ("h", "a", "y_hat", "L")},
    args=(x, W1, b1, W2, b2, y_true),
    terms={"h": {"the bias b1": b1}},
    mistakes={  # known wrong answers, built from the reference's values
        "a": {"h itself (the ReLU not applied)": expected["h"]},
        "y_hat": {"W2 h + b2 (the second layer fed h, not a)": W2 @ expected["h"] + b2},
        "L": {"Σ(ŷ − y), not squared": (expected["y_hat"] - y_true).sum()},
    },
    name="Exercise 1 · forward_pass",
    against="helpers.cat_mlp",
)
# the right values, for the next exercises
h, a, y_hat = (
    expected["h"],
    expected["a"],
    expected["y_hat"],
)

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 1
# by_hand: [autograd, helpers.cat_mlp.backward]

# %% [markdown]
# ## Exercise 2 · Where backward starts: $\partial L/\partial \hat y$ (1 point)
#
# **Goal:** differentiate the loss itself, the first link of the chain.
#
# Write `grad_loss(y_hat, y_true)`, the gradient of $L = \sum(\hat y - y)^2$ with respect to
# $\hat y$, with the shape of `y_hat`. Derive it on paper first: one entry, one power rule.
#
# <details><summary>Hint: a number to check yours against</summary>
#
# For the cat ($\hat y$ and $y$ from exercise 1) it is −0.875. A missing factor, or
# $y - \hat y$ instead of $\hat y - y$, each give another number. A mean instead of the sum
# does not show here: with one output the mean *is* the sum. It shows as soon as $\hat y$ has
# several entries, which is why the self-check also tries three.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def grad_loss(y_hat, y_true):
    """∂L/∂ŷ for L = Σ(ŷ - y)², with the shape of ŷ."""
    # (1,)
    grad_y_hat = 2 * (y_hat - y_true)  # SOLUTION
    return grad_y_hat


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

_g = grad_loss(
    torch.tensor([0.5625], dtype=torch.float64),
    torch.tensor([1.0], dtype=torch.float64),
)
assert _g.shape == (1,) and abs(float(_g[0]) + 0.875) < 1e-12

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

_yh = torch.tensor([0.3, -1.2, 2.0], dtype=torch.float64)
_yt = torch.tensor([1.0, 0.5, -0.5], dtype=torch.float64)
assert torch.allclose(grad_loss(_yh, _yt), 2 * (_yh - _yt), atol=1e-12)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: autograd differentiates the same loss), for the cat, then
# for three outputs (where a mean and a sum differ):

# %%
(expected,) = autograd_grads(lambda y_hat: ((y_hat - y_true) ** 2).sum(), (y_hat,))
check(
    grad_loss,
    expected,
    args=(y_hat, y_true),
    outputs=("grad_y_hat",),
    mistakes={
        "grad_y_hat": {
            "the loss's terms (ŷ − y)², not their derivative": (y_hat - y_true) ** 2,
            "2(ŷ − y)²: the square kept in the derivative": expected**2 / 2,
        }
    },
    name="Exercise 2 · grad_loss",
    against="autograd",
)
grad_y_hat = expected
y_hat3 = randn(3, seed=21, dtype=dtype, device=dev)
y_true3 = randn(3, seed=22, dtype=dtype, device=dev)
(expected3,) = autograd_grads(lambda t: ((t - y_true3) ** 2).sum(), (y_hat3,))
check(
    grad_loss,
    expected3,
    args=(y_hat3, y_true3),
    outputs=("grad_y_hat",),
    mistakes={"grad_y_hat": {"the gradient of the mean, not the sum": expected3 / 3}},
    name="Exercise 2 · grad_loss, three outputs",
    against="autograd",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 2
# by_hand: [autograd, helpers.cat_mlp.backward]

# %% [markdown]
# ## Exercise 3 · The second layer's gradients (2 points)
#
# **Goal:** one linear layer, three gradients: the weights, the bias, and the input that
# passes the signal further back.
#
# $\hat y = W_2 a + b_2$ with `W2` (1, 2), `a` (2,). Given `grad_y_hat` $= \partial L/\partial \hat y$ (shape (1,)),
# return `(grad_W2, grad_b2, grad_a)` with the shapes of `W2`, `b2` and `a`. Derive each from
# one entry, $\hat y_i = \sum_j (W_2)_{ij} a_j + (b_2)_i$: which entries does $(W_2)_{ij}$ touch,
# and which does $a_j$? Then write the result as one product of vectors and matrices, with the
# shapes above.
#
# <details><summary>Hint: the formulas (check yours against them)</summary>
#
# $\partial L/\partial W_2 = \frac{\partial L}{\partial \hat y}\, a^\top$ (an outer product,
# `torch.outer`), $\;\partial L/\partial b_2 = \partial L/\partial \hat y$, $\;\partial
# L/\partial a = W_2^\top \frac{\partial L}{\partial \hat y}$.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def layer2_backward(grad_y_hat, a, W2):
    """(grad_W2, grad_b2, grad_a) for ŷ = W2 a + b2, given grad_y_hat = ∂L/∂ŷ."""
    # -> (1, 2), the shape of W2
    grad_W2 = torch.outer(grad_y_hat, a)  # SOLUTION
    # (1,)
    grad_b2 = grad_y_hat.clone()  # SOLUTION
    # -> (2,), the shape of a
    grad_a = W2.T @ grad_y_hat  # SOLUTION
    return grad_W2, grad_b2, grad_a


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

_f = lambda *t: torch.tensor(t, dtype=torch.float64)
_gW2, _gb2, _ga = layer2_backward(
    _f(-0.875), _f(0.725, 0.0), _f(0.5, -0.4).reshape(1, 2)
)
assert _gW2.shape == (1, 2) and torch.allclose(
    _gW2, _f(-0.634375, 0.0).reshape(1, 2), atol=1e-12
)
assert _gb2.shape == (1,) and abs(float(_gb2[0]) + 0.875) < 1e-12

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_W, _b, _a, _g = (
    randn(1, 3, seed=21, dtype=torch.float64),
    randn(1, seed=22, dtype=torch.float64),
    randn(3, seed=23, dtype=torch.float64),
    randn(1, seed=24, dtype=torch.float64),
)
_leaves = [t.clone().requires_grad_() for t in (_W, _b, _a)]
_ref = torch.autograd.grad(_leaves[0] @ _leaves[2] + _leaves[1], _leaves, _g)
_out = layer2_backward(_g, _a, _W)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-12) for o, r in zip(_out, _ref)
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (reference: autograd through $W_2 a + b_2$ with upstream gradient $\partial L/\partial \hat y$):

# %%
expected = autograd_grads(lambda W2, b2, a: W2 @ a + b2, (W2, b2, a), grad_y_hat)
gated_early = expected[2] * a  # the ReLU's gate applied one step too early
check(
    layer2_backward,
    expected,
    args=(grad_y_hat, a, W2),
    outputs=("grad_W2", "grad_b2", "grad_a"),
    mistakes={  # known wrong answers, built from the reference's values
        "grad_W2": {
            "W2 times ∂L/∂ŷ (the weight in place of the input a)": W2 * grad_y_hat
        },
        "grad_b2": {"1, ∂ŷ/∂b₂ alone (the chain stopped there)": torch.ones_like(b2)},
        "grad_a": {
            "the expected value times a (the ReLU's gate applied early)": gated_early,
            "a times ∂L/∂ŷ (the activations in place of the weights)": a * grad_y_hat,
        },
    },
    name="Exercise 3 · layer2_backward",
    against="autograd",
)
grad_a = expected[2]

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 2
# by_hand: [autograd, helpers.cat_mlp.backward]

# %% [markdown]
# ## Exercise 4 · Through the ReLU (2 points)
#
# **Goal:** a nonlinearity's backward is a gate: the gradient passes where the unit was
# active and is cut where it was not.
#
# Write `relu_backward(grad_a, h)` $= \partial L/\partial h$ for $a = \mathrm{relu}(h)$, same shape as `h`.
# Use PyTorch's convention at $h = 0$: the derivative there is 0. Return a new tensor and leave
# `grad_a` as it is: a backward never writes into the gradient it receives (the caller may
# still need it).

# %% [raw]
# # BEGIN SOLUTION


# %%
def relu_backward(grad_a, h):
    """∂L/∂h for a = relu(h), given grad_a = ∂L/∂a (relu'(0) = 0, as in PyTorch)."""
    # -> (n,), the shape of h
    grad_h = grad_a * (h > 0).to(grad_a.dtype)  # SOLUTION
    return grad_h


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

_h, _g = (
    randn(3, 5, seed=31, dtype=torch.float64),
    randn(3, 5, seed=32, dtype=torch.float64),
)
_g0 = _g.clone()
_out = relu_backward(_g, _h)
# grad_a untouched
assert _out.shape == _h.shape and _out.dtype == torch.float64 and torch.equal(_g, _g0)
assert torch.allclose(_out, torch.where(_h > 0, _g, torch.zeros_like(_g)), atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

_h = torch.tensor([0.0, -0.0, 1e-3, -1e-3], dtype=torch.float64)
_out = relu_backward(torch.ones(4, dtype=torch.float64), _h)
assert torch.equal(_out, torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=torch.float64))

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: autograd through `torch.relu`, on the cat's `h` and on a vector
# with an exact zero):

# %%
h_test = torch.tensor([0.725, -0.15, 0.0, 2.0], dtype=dtype, device=dev)
g_test = torch.tensor([-0.4375, 0.35, 1.0, -2.0], dtype=dtype, device=dev)
(expected,) = autograd_grads(torch.relu, (h_test,), g_test)
a_test = torch.relu(h_test)
check(
    relu_backward,
    expected,
    args=(g_test, h_test),
    outputs=("grad_h",),
    mistakes={
        "grad_h": {
            "grad_a unchanged (no gate)": g_test,
            "grad_a with the gate inverted (kept where h ≤ 0)": g_test - expected,
            "grad_a times relu(h) (the activation, not its slope)": g_test * a_test,
        }
    },
    regions={"grad_h": {"h = 0 (relu'(0) is 0, as in PyTorch)": h_test == 0}},
    name="Exercise 4 · relu_backward",
    against="autograd",
)
(grad_h,) = autograd_grads(torch.relu, (h,), grad_a)  # the right ∂L/∂h, for Exercise 5

# %% [raw]
# # BEGIN QUESTION
# name: ex5
# points: 2
# by_hand: [autograd, helpers.cat_mlp.backward]

# %% [markdown]
# ## Exercise 5 · The first layer's gradients (2 points)
#
# **Goal:** the same layer as in exercise 3, now with the input `x` fixed; then see why a unit
# whose $\partial L/\partial h$ is 0 gives its whole row of `W1` a zero gradient.
#
# $h = W_1 x + b_1$ with `W1` (2, 4), `x` (4,). Given `grad_h` (2,), return `(grad_W1, grad_b1)`
# with the shapes of `W1` and `b1`, derived as in exercise 3 from one entry of $h$.
#
# <details><summary>Hint: the formula (check yours against it)</summary>
#
# $\partial L/\partial W_1 = \frac{\partial L}{\partial h}\, x^\top$, the outer product
# `torch.outer(grad_h, x)`: row $i$ is $\frac{\partial L}{\partial h_i}\, x^\top$, zero when
# $\partial L/\partial h_i = 0$.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def layer1_backward(grad_h, x):
    """(grad_W1, grad_b1) for h = W1 x + b1, given grad_h = ∂L/∂h."""
    # -> (2, 4), the shape of W1
    grad_W1 = torch.outer(grad_h, x)  # SOLUTION
    # (2,)
    grad_b1 = grad_h.clone()  # SOLUTION
    return grad_W1, grad_b1


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

_f = lambda *t: torch.tensor(t, dtype=torch.float64)
_gW1, _gb1 = layer1_backward(_f(-0.4375, 0.0), _f(1.0, 2.0, -1.0, 0.5))
assert _gW1.shape == (2, 4) and _gb1.shape == (2,)
assert torch.allclose(
    _gW1, _f(-0.4375, -0.875, 0.4375, -0.21875, 0, 0, 0, 0).reshape(2, 4), atol=1e-12
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_W, _b, _x, _g = (
    randn(3, 5, seed=41, dtype=torch.float64),
    randn(3, seed=42, dtype=torch.float64),
    randn(5, seed=43, dtype=torch.float64),
    randn(3, seed=44, dtype=torch.float64),
)
_leaves = [t.clone().requires_grad_() for t in (_W, _b)]
_ref = torch.autograd.grad(_leaves[0] @ _x + _leaves[1], _leaves, _g)
_out = layer1_backward(_g, _x)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-12) for o, r in zip(_out, _ref)
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 5** (reference: autograd through $W_1 x + b_1$ with upstream gradient $\partial L/\partial h$):

# %%
expected = autograd_grads(lambda W1, b1: W1 @ x + b1, (W1, b1), grad_h)
x_tiled = expected[0][:, [0, 1, 0, 1]]  # each row's first two entries, twice
check(
    layer1_backward,
    expected,
    args=(grad_h, x),
    outputs=("grad_W1", "grad_b1"),
    mistakes={  # known wrong answers, built from the reference's values
        "grad_W1": {
            "x in every row (the upstream ∂L/∂h left out)": x.expand_as(W1),
            "x[:2] tiled in place of x (columns 2, 3 reuse x₀, x₁)": x_tiled,
        },
        "grad_b1": {
            "1, ∂h/∂b₁ alone (the chain stopped there)": torch.ones_like(b1),
            "∂L/∂h summed to one number, in every entry": grad_h.sum().expand_as(b1),
        },
    },
    name="Exercise 5 · layer1_backward",
    against="autograd",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex6
# points: 3
# by_hand: [autograd, helpers.cat_mlp.backward]

# %% [markdown]
# ## Exercise 6 · The whole backward pass, for a batch (3 points)
#
# **Goal:** vectorise: one matrix product per gradient instead of a loop over samples, and
# see that a batch's weight gradient is the **sum** of the per-sample ones.
#
# Now the rows of `X` (B, 4) are B samples and the layers use `nn.Linear`'s layout:
# $H = X W_1^\top + b_1$ (B, 2), $A = \mathrm{relu}(H)$, $\hat Y = A W_2^\top + b_2$ (B, 1),
# $L = \sum_{b}(\hat Y_b - Y_b)^2$ (a sum, not a mean). Write `cat_backward_batch` returning the
# dict `{"W1", "b1", "W2", "b2"}` of $\partial L/\partial(\text{parameter})$, each with its parameter's shape.
# Write the forward pass inside it too (no autograd).

# %% [raw]
# # BEGIN SOLUTION


# %%
def cat_backward_batch(X, W1, b1, W2, b2, Y):
    """Forward, then {"W1", "b1", "W2", "b2"}: ∂L/∂θ for L = Σ_b (ŷ_b - y_b)²."""
    # BEGIN SOLUTION
    H = X @ W1.T + b1  # (B, 4) @ (4, 2) -> (B, 2)
    A = torch.relu(H)  # (B, 2)
    Y_hat = A @ W2.T + b2  # (B, 2) @ (2, 1) -> (B, 1)
    grad_Y_hat = 2 * (Y_hat - Y)  # (B, 1)
    grad_W2 = grad_Y_hat.T @ A  # (1, B) @ (B, 2) -> (1, 2)
    grad_b2 = grad_Y_hat.sum(0)  # (1,)
    grad_A = grad_Y_hat @ W2  # (B, 1) @ (1, 2) -> (B, 2)
    grad_H = grad_A * (H > 0).to(H.dtype)  # (B, 2)
    grad_W1 = grad_H.T @ X  # (2, B) @ (B, 4) -> (2, 4)
    grad_b1 = grad_H.sum(0)  # (2,)
    return {"W1": grad_W1, "b1": grad_b1, "W2": grad_W2, "b2": grad_b2}
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

from helpers import cat_mlp

_p = cat_mlp.cat_params(dtype=torch.float64)
_g = cat_backward_batch(
    _p["x"].reshape(1, 4),
    _p["W1"],
    _p["b1"],
    _p["W2"],
    _p["b2"],
    _p["y_true"].reshape(1, 1),
)
_ref = cat_mlp.backward(cat_mlp.forward(**_p), _p["W2"], _p["y_true"])
assert all(
    _g[k].shape == _ref[k].shape and torch.allclose(_g[k], _ref[k], atol=1e-12)
    for k in ("W1", "b1", "W2", "b2")
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_X, _Y = (
    randn(16, 4, seed=51, dtype=torch.float64),
    randn(16, 1, seed=52, dtype=torch.float64),
)
_P = [
    randn(2, 4, seed=53, dtype=torch.float64),
    randn(2, seed=54, dtype=torch.float64),
    randn(1, 2, seed=55, dtype=torch.float64),
    randn(1, seed=56, dtype=torch.float64),
]
_X[0], _P[1][0] = 0.0, 0.0  # H[0, 0] = 0 exactly: relu'(0) = 0 in the batch too
_leaves = [t.clone().requires_grad_() for t in _P]
_L = (
    (torch.relu(_X @ _leaves[0].T + _leaves[1]) @ _leaves[2].T + _leaves[3] - _Y) ** 2
).sum()
_ref = dict(zip(("W1", "b1", "W2", "b2"), torch.autograd.grad(_L, _leaves)))
_g = cat_backward_batch(_X, *_P, _Y)
assert all(
    _g[k].shape == _ref[k].shape and torch.allclose(_g[k], _ref[k], atol=1e-10)
    for k in _ref
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_X, _Y = (
    randn(7, 4, seed=57, dtype=torch.float64),
    randn(7, 1, seed=58, dtype=torch.float64),
)
_P = [
    randn(2, 4, seed=59, dtype=torch.float64),
    randn(2, seed=60, dtype=torch.float64),
    randn(1, 2, seed=61, dtype=torch.float64),
    randn(1, seed=62, dtype=torch.float64),
]
_whole = cat_backward_batch(_X, *_P, _Y)
_parts = [cat_backward_batch(_X[i : i + 1], *_P, _Y[i : i + 1]) for i in range(7)]
assert set(_whole) == {"W1", "b1", "W2", "b2"}
assert all(
    torch.allclose(_whole[k], sum(p[k] for p in _parts), atol=1e-10) for k in _whole
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 6** (reference: `loss.backward()` on a batch of 8 random samples; the first one,
# $x = (-1, 0, 0, 0)$, puts the first hidden unit exactly at $h = 0$):

# %%
from helpers.device import randn

X_batch = randn(8, 4, seed=1, dtype=dtype, device=dev)
# h = -1·0.1 + 0.1 = 0 for unit 1
X_batch[0] = torch.tensor([-1.0, 0.0, 0.0, 0.0], dtype=dtype)
Y_batch = randn(8, 1, seed=2, dtype=dtype, device=dev)


def batch_loss(W1, b1, W2, b2, rows=slice(None), relu=torch.relu, on_grad_A=None):
    """L = Σ_b (relu(X W1ᵀ + b1) W2ᵀ + b2 - Y)² over the rows, through autograd."""
    H = X_batch[rows] @ W1.T + b1  # (8, 4) @ (4, 2) -> (8, 2)
    A = relu(H)  # (8, 2)
    if on_grad_A is not None:
        A.register_hook(on_grad_A)  # rewrites ∂L/∂A on its way back
    Y_hat = A @ W2.T + b2  # (8, 2) @ (2, 1) -> (8, 1)
    return ((Y_hat - Y_batch[rows]) ** 2).sum()


def batch_grads(**change):
    """{"W1", "b1", "W2", "b2"}: autograd's ∂L/∂θ, with one thing changed if asked."""
    grads = autograd_grads(lambda *p: batch_loss(*p, **change), (W1, b1, W2, b2))
    return dict(zip(("W1", "b1", "W2", "b2"), grads))


expected = batch_grads()
# known mistakes, each autograd's answer with one thing changed
first_only = batch_grads(rows=slice(0, 1))  # the first sample alone
no_gate = batch_grads(relu=lambda H: H + (torch.relu(H) - H).detach())  # relu' = 1
one_grad_A = batch_grads(on_grad_A=lambda g: g.sum(1, keepdim=True).expand_as(g))
wrong_first_layer = {
    "the gradient without the ReLU's gate (relu' taken as 1)": no_gate,
    "the gradient with one ∂L/∂A for both units (W2's entries summed)": one_grad_A,
}
check(
    cat_backward_batch,
    expected,
    args=(X_batch, W1, b1, W2, b2, Y_batch),
    factors={"B": 8},  # a mean over the batch instead of the sum is off by B
    mistakes={
        "W1": {label: g["W1"] for label, g in wrong_first_layer.items()},
        "b1": {label: g["b1"] for label, g in wrong_first_layer.items()},
        "b2": {
            "the first sample's gradient alone (no sum over the batch)": first_only[
                "b2"
            ]
        },
    },
    name="Exercise 6 · cat_backward_batch",
    against="autograd",
)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the function names: the grader calls `forward_pass`, `grad_loss`,
# `layer2_backward`, `relu_backward`, `layer1_backward` and `cat_backward_batch`.
