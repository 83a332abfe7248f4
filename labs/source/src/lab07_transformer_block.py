# %% [raw]
# # ASSIGNMENT CONFIG
# name: lab07_transformer_block
# init_cell: false
# check_all_cell: false
# export_cell: false
# run_tests: true
# generate:
#   pdf: false
#   show_stdout: false

# %% [markdown]
# # Lab 7 · One Transformer block's manual backward
#
# Chapter 7 walked a whole Transformer block backward with no autograd at all and matched
# `nn.TransformerEncoderLayer` on every parameter. Here you write that backward yourself, piece
# by piece: LayerNorm from what the forward saved, the feed-forward network, a residual
# sub-layer, the tied embedding's two uses, and finally the whole pre-norm block, checked against
# autograd on `nn.TransformerEncoderLayer(norm_first=True, batch_first=True, dropout=0)` in
# float64. This lab goes with [Chapter 7](../chapters/07_transformer_block.ipynb).
#
# **Learning goals.** After this lab you can
# * write LayerNorm's backward from the saved $x$, $\mu$ and $1/\sigma$, with its paths through
#   the mean and the variance;
# * write the FFN backward (Linear → ReLU/GELU → Linear), weight gradients summed over every row;
# * say what a residual connection does to the gradient (it copies it to both branches and adds
#   what comes back) and write it;
# * write the gradient of a tied embedding (also the output head) as the sum of its two uses,
#   the input's share a scatter-**add**, right for a token that occurs twice;
# * chain all of it, with chapter 6's attention backward, into the backward of a whole pre-norm
#   block that returns the gradient of the input and of every parameter under
#   `nn.TransformerEncoderLayer`'s names.
#
# You may use the tested helpers of earlier chapters for the pieces they already taught:
# `linear_backward(X, W, grad_Y, needs)` (chapter 2, `helpers.numgrad`; `needs` is optional),
# `gelu_backward` (chapter 4), `attention_backward`, `split_heads`, `merge_heads` (chapter 6),
# and every forward function. The backward of this chapter's new pieces is yours.
#
# **How a lab works.** Each exercise states its goal and its points (10 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It answers in one line: `✓` matches (the `max|Δ|` is round-off), `✗`
# what is wrong and where (for a block: which parameter's gradient), or `·` not implemented
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
import math

import torch
import torch.nn.functional as F
from torch import nn

from helpers.attention import (
    attention_backward,
    attention_forward,
    causal_mask,
    merge_heads,
    split_heads,
)
from helpers.block import BLOCK_PARAM_NAMES, block_params, load_params_into_layer
from helpers.checks import compare
from helpers.device import get_device, no_tf32, randn
from helpers.functions import gelu_backward, layernorm_forward
from helpers.labcheck import autograd_grads, check
from helpers.numgrad import linear_backward
from helpers.show import fmt_scalar

dev = get_device()
no_tf32()
dtype = torch.float64  # tight comparisons: the two sides only round differently

# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2
# by_hand: [autograd, helpers.block.block_manual_backward, helpers.functions.layernorm_backward]

# %% [markdown]
# ## Exercise 1 · LayerNorm backward from the saved $\mu$ and $1/\sigma$ (2 points)
#
# **Goal:** the backward of $y = \gamma \odot \hat x + \beta$, $\hat x = (x - \mu)/\sigma$, with
# $\mu$ and $1/\sigma$ taken from the forward's cache (two floats per row) instead of recomputed.
# $x$ reaches the output directly, through the mean and through the variance: three terms.
#
# Write `layernorm_backward(x, mu, rstd, weight, grad_y)` for `x` of shape `(..., D)`, `mu` and
# `rstd` $= 1/\sigma$ of shape `(..., 1)` (what `helpers.functions.layernorm_forward` returns),
# `weight` $\gamma$ of shape `(D,)` and `grad_y` $= \partial L/\partial y$ like `x`. Return
# `(grad_x, grad_weight, grad_bias)`. Derive $\partial L/\partial x$ yourself, one path at a
# time: the direct path ($\mu$ and $\sigma$ held fixed), the path through $\mu$, the path through $\sigma$
# (chapter 7 did it for one row; $\sum_i \hat x_i = 0$, true for any `eps`, simplifies it; do not
# use $\sum_i \hat x_i^2 = D$, which holds only at `eps` = 0: the self-check also runs `eps` = 0.5,
# and the cell after it measures both sums).
# The parameter gradients sum over every row ("rows" = every leading dim, so `x` may be
# `(B, N, D)` and the parameter gradients are `(D,)`). When `grad_x` is wrong, the
# self-check says which path is missing.
#
# <details><summary>Hint: the formulas (check your derivation against them)</summary>
#
# With $g = \partial L/\partial y \odot \gamma$ and means along the last dim:
#
# $$\begin{gathered}
# \frac{\partial L}{\partial x} = \frac{1}{\sigma}\Big(g - \underbrace{\mathrm{mean}(g)}_{\text{through }\mu}
# - \underbrace{\hat x\,\mathrm{mean}(g \odot \hat x)}_{\text{through }\sigma}\Big), \\
# \frac{\partial L}{\partial \gamma} = \sum_{\text{rows}} \frac{\partial L}{\partial y} \odot \hat x,\quad
# \frac{\partial L}{\partial \beta} = \sum_{\text{rows}} \frac{\partial L}{\partial y}
# \end{gathered}$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def layernorm_backward(x, mu, rstd, weight, grad_y):
    """y = γ·(x − μ)·rstd + β  ⇒  (grad_x, grad_weight, grad_bias), μ, rstd saved."""
    # BEGIN SOLUTION
    x_hat = (x - mu) * rstd  # (..., D)
    g = grad_y * weight  # (..., D)
    grad_x = rstd * (
        g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True)
    )
    D = x.shape[-1]
    grad_weight = (grad_y * x_hat).reshape(-1, D).sum(0)  # (..., D) -> (R, D) -> (D,)
    grad_bias = grad_y.reshape(-1, D).sum(0)  # (..., D) -> (R, D) -> (D,)
    return grad_x, grad_weight, grad_bias
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
from helpers.functions import layernorm_forward as _lnf

_x = randn(2, 3, 7, seed=101, dtype=torch.float64) * 3 + 1
_w = 1 + 0.3 * randn(7, seed=102, dtype=torch.float64)
_b = randn(7, seed=103, dtype=torch.float64)
_g = randn(2, 3, 7, seed=104, dtype=torch.float64)
_, _mu, _rstd = _lnf(_x, _w, _b)
_ours = layernorm_backward(_x, _mu, _rstd, _w, _g)
_leaves = [t.clone().requires_grad_() for t in (_x, _w, _b)]
_ref = torch.autograd.grad(
    torch.nn.functional.layer_norm(_leaves[0], (7,), _leaves[1], _leaves[2], 1e-5),
    _leaves,
    _g,
)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-10) for o, r in zip(_ours, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.functions import layernorm_forward as _lnf

# 2-D input, a large eps (so σ ≠ std): μ and 1/σ must come from the arguments,
# not be recomputed
_x = randn(5, 4, seed=105, dtype=torch.float64)
_w, _b = (
    randn(4, seed=106, dtype=torch.float64),
    randn(4, seed=107, dtype=torch.float64),
)
_g = randn(5, 4, seed=108, dtype=torch.float64)
_, _mu, _rstd = _lnf(_x, _w, _b, eps=0.5)
_gx, _gw, _gb = layernorm_backward(_x, _mu, _rstd, _w, _g)
_leaves = [t.clone().requires_grad_() for t in (_x, _w, _b)]
_ref = torch.autograd.grad(
    torch.nn.functional.layer_norm(_leaves[0], (4,), _leaves[1], _leaves[2], 0.5),
    _leaves,
    _g,
)
assert torch.allclose(_gx, _ref[0], atol=1e-10) and torch.allclose(
    _gw, _ref[1], atol=1e-10
)
assert torch.allclose(_gb, _ref[2], atol=1e-10)
# the mean path
assert torch.allclose(_gx.sum(-1), torch.zeros(5, dtype=torch.float64), atol=1e-12)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: autograd through `F.layer_norm` on `x` (2, 4, 6), $\gamma \ne 1$,
# $\beta \ne 0$, `eps` 1e-5 as in `nn.LayerNorm`, then a large `eps` 0.5; $\mu$ and $1/\sigma$ from
# `layernorm_forward`). It also gets autograd's share of `grad_x` along each path, from a
# LayerNorm written with $\mu$ or $\sigma$ detached (held constant), so a ✗ can say which path your
# `grad_x` is missing:

# %%
x1 = randn(2, 4, 6, seed=1, dtype=dtype, device=dev) * 2 + 1
w1 = 1 + 0.3 * randn(6, seed=2, dtype=dtype, device=dev)
b1 = 0.5 * randn(6, seed=3, dtype=dtype, device=dev)
grad_y1 = randn(2, 4, 6, seed=4, dtype=dtype, device=dev)
_, mu1, rstd1 = layernorm_forward(x1, w1, b1)


def layernorm_held(x, w, b, eps, hold_mu, hold_sigma):
    """LayerNorm with μ and/or σ detached: autograd skips the paths through them."""
    mu = x.mean(-1, keepdim=True)
    rstd = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)
    mu = mu.detach() if hold_mu else mu
    rstd = rstd.detach() if hold_sigma else rstd
    return (x - mu) * rstd * w + b


def grad_x_paths(eps):
    """Autograd's grad_x1 along the path through μ and the path through σ."""
    g = {
        held: autograd_grads(
            lambda x: layernorm_held(x, w1, b1, eps, *held), (x1,), grad_y1
        )[0]
        for held in ((True, True), (False, True), (False, False))
    }
    return {
        "the path through μ": g[False, True] - g[True, True],
        "the path through σ": g[False, False] - g[False, True],
    }


def slipped_grads1(eps, rstd):
    """grad_x, grad_weight after typical slips, by autograd: {output: {slip: value}}."""
    grad_x, grad_w = autograd_grads(
        lambda x, w: F.layer_norm(x, (6,), w, b1, eps), (x1, w1), grad_y1
    )
    (no_gamma,) = autograd_grads(  # LayerNorm without γ and β
        lambda x: F.layer_norm(x, (6,), None, None, eps), (x1,), grad_y1
    )
    no_eps = autograd_grads(
        lambda x, w, b: F.layer_norm(x, (6,), w, b, 0.0), (x1, w1, b1), grad_y1
    )
    (from_x,) = autograd_grads(lambda w: x1 * w, (w1,), grad_y1)  # y = γ ∘ x
    return {
        "grad_x": {
            "the gradient without γ (g = grad_y)": no_gamma,
            "σ × the expected value (the leading 1/σ left out)": grad_x / rstd,
            "eps = 0 (1/σ recomputed from x, not the saved one)": no_eps[0],
        },
        "grad_weight": {
            "Σ grad_y ∘ x (x in place of x̂)": from_x,
            "Σ g ∘ x̂ with g = grad_y ∘ γ (γ counted in)": grad_w * w1,
            "eps = 0 (1/σ recomputed from x, not the saved one)": no_eps[1],
        },
    }


rows1 = x1.numel() // x1.shape[-1]  # parameter gradients sum over B·N rows
expected = autograd_grads(
    lambda x, w, b: F.layer_norm(x, (6,), w, b, 1e-5), (x1, w1, b1), grad_y1
)
check(
    layernorm_backward,
    expected,
    args=(x1, mu1, rstd1, w1, grad_y1),
    outputs=("grad_x", "grad_weight", "grad_bias"),
    name="Exercise 1 · layernorm_backward",
    against="autograd",
    factors={"rows": rows1},
    terms={"grad_x": grad_x_paths(1e-5)},
    mistakes=slipped_grads1(1e-5, rstd1),
)
# the same with eps = 0.5: your backward must use the saved μ and 1/σ,
# not recompute them
_, mu1b, rstd1b = layernorm_forward(x1, w1, b1, eps=0.5)
expected_b = autograd_grads(
    lambda x, w, b: F.layer_norm(x, (6,), w, b, 0.5), (x1, w1, b1), grad_y1
)
check(
    layernorm_backward,
    expected_b,
    args=(x1, mu1b, rstd1b, w1, grad_y1),
    outputs=("grad_x", "grad_weight", "grad_bias"),
    name="Exercise 1 · layernorm_backward, eps 0.5",
    against="autograd",
    factors={"rows": rows1},
    terms={"grad_x": grad_x_paths(0.5)},
    mistakes=slipped_grads1(0.5, rstd1b),
)

# %% [markdown]
# The two sums the prompt mentions, on each row of the self-check's `x1` ($D = 6$ entries a row),
# with the saved $\mu$ and $1/\sigma$ of each `eps`:

# %%
for eps, mu, rstd in ((1e-5, mu1, rstd1), (0.5, mu1b, rstd1b)):
    xh = (x1 - mu) * rstd  # (2, 4, 6): x̂ of each row
    sums, squares = xh.sum(-1), (xh**2).sum(-1)  # (2, 4) each
    print(
        f"eps {eps:g}: |Σ x̂| < 1e-12 in every row: "
        f"{bool((sums.abs() < 1e-12).all())}; "
        f"Σ x̂² from {fmt_scalar(squares.min().item())} "
        f"to {fmt_scalar(squares.max().item())}"
    )

# %% [markdown]
# $\sum_i \hat x_i = 0$ whatever `eps` is, but $\sum_i \hat x_i^2$ equals $D$ only in the limit
# `eps` → 0, since $1/\sigma$ includes `eps`: here it is 5.9996 to 6.0000 with `eps` 1e-5, and
# only 1.4350 to 5.7914 with `eps` 0.5. The backward needs the first identity, not the second.

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 2
# by_hand: [autograd, helpers.block.block_manual_backward]

# %% [markdown]
# ## Exercise 2 · The FFN backward: Linear → activation → Linear (2 points)
#
# **Goal:** chapter 4's pieces in reverse order. With $U = h W_1^\top + b_1$, $a = \mathrm{act}(U)$
# and $F = a W_2^\top + b_2$ ($W_1$ is `(d_ff, d)`, $W_2$ is `(d, d_ff)`, `nn.Linear`'s layout),
# derive the gradient of each of the three steps, last step first; check every product's
# shape against the layout.
#
# <details><summary>Hint: the three steps backward</summary>
#
# | step | forward | backward |
# | --- | --- | --- |
# | 1 | $F = aW_2^\top + b_2$ | $da = dF\,W_2$, $\;dW_2 = dF^\top a$, $\;db_2 = \sum dF$ |
# | 2 | $a = \mathrm{act}(U)$ | $dU = da \odot \mathrm{act}'(U)$ |
# | 3 | $U = hW_1^\top + b_1$ | $dh = dU\,W_1$, $\;dW_1 = dU^\top h$, $\;db_1 = \sum dU$ |
#
# </details>
#
# The weight and bias gradients sum over **every row**: flatten all leading dims to
# `(R, ·)` first (`h` may be `(B, N, d)` or `(R, d)`): a mean there shows as a factor R.
#
# Write `ffn_backward(h, W1, b1, W2, b2, grad_F, activation="relu")` returning
# `(grad_h, grad_W1, grad_b1, grad_W2, grad_b2)`. It gets no cache: recompute $U$ and $a$ from
# `h` first. Write the two linear steps with matmuls yourself (not `linear_backward`), and the
# ReLU's derivative $[U > 0]$ too; for `activation="gelu"` (PyTorch's exact GELU) use
# `gelu_backward(U, grad_a)` from chapter 4.

# %% [raw]
# # BEGIN SOLUTION


# %%
def ffn_backward(h, W1, b1, W2, b2, grad_F, activation="relu"):
    """F = act(h W1ᵀ + b1) W2ᵀ + b2  ⇒  (grad_h, grad_W1, grad_b1, grad_W2, grad_b2)."""
    # BEGIN SOLUTION
    U = h @ W1.T + b1  # (..., d) @ (d, d_ff) -> (..., d_ff)
    a = U.clamp(min=0) if activation == "relu" else F.gelu(U)
    d_ff, d = W1.shape
    a2, h2 = a.reshape(-1, d_ff), h.reshape(-1, d)  # (R, d_ff), (R, d)
    gF2 = grad_F.reshape(-1, d)  # (..., d) -> (R, d)
    grad_a = grad_F @ W2  # (..., d) @ (d, d_ff) -> (..., d_ff)
    grad_W2 = gF2.T @ a2  # (d, R) @ (R, d_ff) -> (d, d_ff)
    grad_b2 = gF2.sum(0)  # (d,)
    grad_U = grad_a * (U > 0) if activation == "relu" else gelu_backward(U, grad_a)
    gU2 = grad_U.reshape(-1, d_ff)  # (..., d_ff) -> (R, d_ff)
    grad_h = grad_U @ W1  # (..., d_ff) @ (d_ff, d) -> (..., d)
    grad_W1 = gU2.T @ h2  # (d_ff, R) @ (R, d) -> (d_ff, d)
    grad_b1 = gU2.sum(0)  # (d_ff,)
    return grad_h, grad_W1, grad_b1, grad_W2, grad_b2
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

_h = randn(2, 3, 4, seed=201, dtype=torch.float64)
_W1, _b1 = (
    randn(10, 4, seed=202, dtype=torch.float64) / 2,
    0.3 * randn(10, seed=203, dtype=torch.float64),
)
_W2, _b2 = (
    randn(4, 10, seed=204, dtype=torch.float64) / 3,
    randn(4, seed=205, dtype=torch.float64),
)
_gF = randn(2, 3, 4, seed=206, dtype=torch.float64)
_leaves = [t.clone().requires_grad_() for t in (_h, _W1, _b1, _W2, _b2)]
_F = torch.nn.functional.linear(
    torch.relu(torch.nn.functional.linear(_leaves[0], _leaves[1], _leaves[2])),
    _leaves[3],
    _leaves[4],
)
_ref = torch.autograd.grad(_F, _leaves, _gF)
_ours = ffn_backward(_h, _W1, _b1, _W2, _b2, _gF, "relu")
assert len(_ours) == 5 and all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-10) for o, r in zip(_ours, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# GELU, and 2-D rows (R, d) instead of (B, N, d)
_h = randn(7, 3, seed=207, dtype=torch.float64)
_W1, _b1 = (
    randn(5, 3, seed=208, dtype=torch.float64),
    randn(5, seed=209, dtype=torch.float64),
)
_W2, _b2 = (
    randn(3, 5, seed=210, dtype=torch.float64),
    randn(3, seed=211, dtype=torch.float64),
)
_gF = randn(7, 3, seed=212, dtype=torch.float64)
_leaves = [t.clone().requires_grad_() for t in (_h, _W1, _b1, _W2, _b2)]
_F = torch.nn.functional.linear(
    torch.nn.functional.gelu(
        torch.nn.functional.linear(_leaves[0], _leaves[1], _leaves[2])
    ),
    _leaves[3],
    _leaves[4],
)
_ref = torch.autograd.grad(_F, _leaves, _gF)
_ours = ffn_backward(_h, _W1, _b1, _W2, _b2, _gF, activation="gelu")
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-10) for o, r in zip(_ours, _ref)
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: autograd through `F.linear` → `F.relu` / `F.gelu` → `F.linear`
# on `h` (2, 5, 8) with `d_ff` 16, one line per activation; the five gradients are compared in
# the order backward computes them, `grad_W2`, `grad_b2`, `grad_W1`, `grad_b1`, `grad_h`, so
# the first one named wrong is where your backward first goes off):

# %%
h2 = randn(2, 5, 8, seed=11, dtype=dtype, device=dev)
W1_2, b1_2 = (
    randn(16, 8, seed=12, dtype=dtype, device=dev) / 8**0.5,
    0.3 * randn(16, seed=13, dtype=dtype, device=dev),
)
W2_2, b2_2 = (
    randn(8, 16, seed=14, dtype=dtype, device=dev) / 4,
    0.3 * randn(8, seed=15, dtype=dtype, device=dev),
)
grad_F2 = randn(2, 5, 8, seed=16, dtype=dtype, device=dev)
BACKWARD_ORDER2 = ("grad_W2", "grad_b2", "grad_W1", "grad_b1", "grad_h")


def in_backward_order(grads):
    """ffn_backward's five gradients in the order backward computes them."""
    if not isinstance(grads, tuple) or len(grads) != 5:
        return grads  # the check says what is off
    grad_h, grad_W1, grad_b1, grad_W2, grad_b2 = grads
    return grad_W2, grad_b2, grad_W1, grad_b1, grad_h


class SlippedActivation(torch.autograd.Function):
    """act(U) forward, a given wrong backward: autograd's gradients after that slip."""

    @staticmethod
    def forward(ctx, U, act, act_backward):
        ctx.save_for_backward(U)
        ctx.act_backward = act_backward
        return act(U)

    @staticmethod
    def backward(ctx, grad_a):
        (U,) = ctx.saved_tensors
        return ctx.act_backward(U, grad_a), None, None


slips2 = {
    "relu": {"the ReLU's gate left out (dU = da)": lambda U, grad_a: grad_a},
    "gelu": {
        "GELU's derivative taken at a = GELU(U), not at U": lambda U, grad_a: (
            gelu_backward(F.gelu(U), grad_a)
        )
    },
}
for act, act_fn in (("relu", F.relu), ("gelu", F.gelu)):
    expected = autograd_grads(
        lambda h, W1, b1, W2, b2: F.linear(act_fn(F.linear(h, W1, b1)), W2, b2),
        (h2, W1_2, b1_2, W2_2, b2_2),
        grad_F2,
    )
    mistakes2 = {name: {} for name in BACKWARD_ORDER2}
    for slip, act_backward in slips2[act].items():
        slipped = autograd_grads(
            lambda h, W1, b1, W2, b2: F.linear(
                SlippedActivation.apply(F.linear(h, W1, b1), act_fn, act_backward),
                W2,
                b2,
            ),
            (h2, W1_2, b1_2, W2_2, b2_2),
            grad_F2,
        )
        for name, g in zip(BACKWARD_ORDER2, in_backward_order(slipped)):
            mistakes2[name][slip] = g
    check(
        lambda *args: in_backward_order(ffn_backward(*args)),
        in_backward_order(expected),
        args=(h2, W1_2, b1_2, W2_2, b2_2, grad_F2, act),
        outputs=BACKWARD_ORDER2,
        name=f"Exercise 2 · ffn_backward ({act})",
        against="autograd",
        factors={"rows": 2 * 5},  # weight and bias gradients sum over B·N rows
        mistakes=mistakes2,
    )

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 2
# by_hand: [autograd, helpers.block.block_manual_backward]

# %% [markdown]
# ## Exercise 3 · A residual sub-layer: the gradient goes both ways (2 points)
#
# **Goal:** a residual connection $Y = X_1 + f(X_1)$ has Jacobian $I + J_f$, so
# $\partial L/\partial X_1 = \partial L/\partial Y + J_f^\top\,\partial L/\partial Y$: the incoming
# gradient goes **unchanged** down the skip path, a **copy** goes into the branch, and what comes
# back out of the branch is **added** to it.
#
# The second half of a pre-norm block is such a sub-layer, with $f = \mathrm{FF} \circ \mathrm{LN}_2$:
#
# $$\begin{gathered}
# Y = X_1 + \mathrm{FF}(h_2), \\ h_2 = \mathrm{LN}_2(X_1) = \gamma_2 \odot (X_1 - \mu_2)\cdot\tfrac{1}{\sigma_2} + \beta_2 .
# \end{gathered}$$
#
# Write `ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation="relu")`: `X1` is
# `(B, N, d)`, `mu2` and `rstd2` $= 1/\sigma_2$ are $\mathrm{LN}_2$'s saved `(B, N, 1)` statistics, `params` is
# a dict with `nn.TransformerEncoderLayer`'s names (`"norm2.weight"`, `"norm2.bias"`,
# `"linear1.weight"`, `"linear1.bias"`, `"linear2.weight"`, `"linear2.bias"`). Recompute $h_2$
# from the saved statistics, send `grad_Y` through your `ffn_backward` and your
# `layernorm_backward`, add the skip path, and return a dict with the key `"X1"` ($\partial L/\partial X_1$) and the
# six parameter names above. It must not use autograd: the grader runs it under `torch.no_grad()`.

# %% [raw]
# # BEGIN SOLUTION


# %%
def ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation="relu"):
    """Y = X1 + FF(LN2(X1))  ⇒  {"X1": ∂L/∂X1, name: ∂L/∂θ for the six parameters}."""
    # BEGIN SOLUTION
    p = params
    # (B, N, d), recomputed
    h2 = (X1 - mu2) * rstd2 * p["norm2.weight"] + p["norm2.bias"]
    grad_h2, gW1, gb1, gW2, gb2 = ffn_backward(
        h2,
        p["linear1.weight"],
        p["linear1.bias"],
        p["linear2.weight"],
        p["linear2.bias"],
        grad_Y,
        activation,
    )
    grad_X1_branch, g_gamma, g_beta = layernorm_backward(
        X1, mu2, rstd2, p["norm2.weight"], grad_h2
    )
    return {
        "X1": grad_Y + grad_X1_branch,  # skip + branch
        "norm2.weight": g_gamma,
        "norm2.bias": g_beta,
        "linear1.weight": gW1,
        "linear1.bias": gb1,
        "linear2.weight": gW2,
        "linear2.bias": gb2,
    }
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
import torch.nn.functional as _F

from helpers.block import block_params as _bp
from helpers.device import randn
from helpers.functions import layernorm_forward as _lnf

_names = (
    "norm2.weight",
    "norm2.bias",
    "linear1.weight",
    "linear1.bias",
    "linear2.weight",
    "linear2.bias",
)
_p = _bp(6, 12, seed=300, dtype=torch.float64)
_X1 = randn(2, 3, 6, seed=301, dtype=torch.float64)
_gY = randn(2, 3, 6, seed=302, dtype=torch.float64)
_, _mu, _rstd = _lnf(_X1, _p["norm2.weight"], _p["norm2.bias"])
_leaves = [_X1.clone().requires_grad_()] + [
    _p[n].clone().requires_grad_() for n in _names
]
_Y = _leaves[0] + _F.linear(
    _F.relu(
        _F.linear(
            _F.layer_norm(_leaves[0], (6,), _leaves[1], _leaves[2], 1e-5),
            _leaves[3],
            _leaves[4],
        )
    ),
    _leaves[5],
    _leaves[6],
)
_ref = dict(zip(("X1",) + _names, torch.autograd.grad(_Y, _leaves, _gY)))
_ours = ffn_sublayer_backward(_X1, _mu, _rstd, _p, _gY)
assert all(torch.allclose(_ours[k], _ref[k], atol=1e-10) for k in _ref)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as _F

from helpers.block import block_params as _bp
from helpers.device import randn
from helpers.functions import layernorm_forward as _lnf

# GELU, under no_grad (no autograd inside); the skip path alone carries grad_Y unchanged
_names = (
    "norm2.weight",
    "norm2.bias",
    "linear1.weight",
    "linear1.bias",
    "linear2.weight",
    "linear2.bias",
)
_p = _bp(4, 8, seed=310, dtype=torch.float64)
_X1 = randn(1, 5, 4, seed=311, dtype=torch.float64)
_gY = randn(1, 5, 4, seed=312, dtype=torch.float64)
_, _mu, _rstd = _lnf(_X1, _p["norm2.weight"], _p["norm2.bias"])
_leaves = [_X1.clone().requires_grad_()] + [
    _p[n].clone().requires_grad_() for n in _names
]
_Y = _leaves[0] + _F.linear(
    _F.gelu(
        _F.linear(
            _F.layer_norm(_leaves[0], (4,), _leaves[1], _leaves[2], 1e-5),
            _leaves[3],
            _leaves[4],
        )
    ),
    _leaves[5],
    _leaves[6],
)
_ref = dict(zip(("X1",) + _names, torch.autograd.grad(_Y, _leaves, _gY)))
with torch.no_grad():
    _ours = ffn_sublayer_backward(_X1, _mu, _rstd, _p, _gY, activation="gelu")
assert all(torch.allclose(_ours[k], _ref[k], atol=1e-10) for k in _ref)
_z = {
    k: (torch.zeros_like(v) if k.startswith("linear2.weight") else v)
    for k, v in _p.items()
}
with torch.no_grad():
    _ours = ffn_sublayer_backward(_X1, _mu, _rstd, _z, _gY, activation="gelu")
# W2 = 0: no branch gradient, only the skip's copy
assert torch.allclose(_ours["X1"], _gY, atol=1e-14)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (reference: autograd through `X1 + FF(F.layer_norm(X1))`, ReLU then GELU,
# on `X1` (2, 5, 8) with `d_ff` 16; the dict is compared key by key in the order backward computes them,
# so the first gradient named wrong is where your backward first goes off; forgetting the skip
# path shows up as `X1 matches the expected value minus the skip path` while the six parameter
# gradients already match):

# %%
NAMES3 = (
    "norm2.weight",
    "norm2.bias",
    "linear1.weight",
    "linear1.bias",
    "linear2.weight",
    "linear2.bias",
)
params3 = block_params(8, 16, seed=30, dtype=dtype, device=dev)
X1_3 = randn(2, 5, 8, seed=31, dtype=dtype, device=dev)
grad_Y3 = randn(2, 5, 8, seed=32, dtype=dtype, device=dev)
_, mu2_3, rstd2_3 = layernorm_forward(
    X1_3, params3["norm2.weight"], params3["norm2.bias"]
)


def ffn_sublayer_reference(X1, g2, be2, W1, b1, W2, b2, act=F.relu):
    """Y = X1 + FF(LN2(X1)) with torch's own functions (autograd's reference)."""
    d = X1.shape[-1]
    return X1 + F.linear(
        act(F.linear(F.layer_norm(X1, (d,), g2, be2, 1e-5), W1, b1)), W2, b2
    )


# in the order backward computes them: the first one named wrong is where your
# backward first goes off
BACKWARD_ORDER3 = (
    "linear2.weight",
    "linear2.bias",
    "linear1.weight",
    "linear1.bias",
    "norm2.weight",
    "norm2.bias",
    "X1",
)


def sublayer_grads(f):
    """Autograd's {name: gradient} of Y = f(X1, *θ) for grad_Y3, in backward's order."""
    theta = (params3[n] for n in NAMES3)
    grads = dict(zip(("X1", *NAMES3), autograd_grads(f, (X1_3, *theta), grad_Y3)))
    return {k: grads[k] for k in BACKWARD_ORDER3}


acts3 = {"ReLU": F.relu, "GELU": F.gelu}
grads3 = {
    act: sublayer_grads(lambda X1, *theta: ffn_sublayer_reference(X1, *theta, act=fn))
    for act, fn in acts3.items()
}
for act, act_fn in acts3.items():
    other = "GELU" if act == "ReLU" else "ReLU"
    slips = {  # the slip: autograd's gradients of the sub-layer it computes
        "the FFN run on x̂ (h2 without γ and β)": sublayer_grads(
            lambda X1, g2, be2, *W: ffn_sublayer_reference(
                X1, None, None, *W, act=act_fn
            )
        ),
        "the FFN run on X1 (LN2 left out)": sublayer_grads(
            lambda X1, g2, be2, W1, b1, W2, b2: (
                X1 + F.linear(act_fn(F.linear(X1, W1, b1)), W2, b2)
            )
        ),
        "LN2's backward fed grad_Y, not grad_h2": sublayer_grads(
            lambda X1, g2, be2, *W: X1 + F.layer_norm(X1, (8,), g2, be2, 1e-5)
        ),
        f"the {other} sub-layer's gradient (activation not passed on?)": grads3[other],
    }
    expected = grads3[act]
    swapped = expected["norm2.bias"]  # β's gradient, where γ's belongs
    mistakes3 = {k: {slip: g[k] for slip, g in slips.items()} for k in expected}
    mistakes3["norm2.weight"]["norm2.bias's gradient (γ's and β's swapped)"] = swapped
    check(
        ffn_sublayer_backward,
        expected,
        args=(X1_3, mu2_3, rstd2_3, params3, grad_Y3, act.lower()),
        name=f"Exercise 3 · ffn_sublayer_backward ({act.lower()})",
        against="autograd",
        terms={"X1": {"the skip path (grad_Y)": grad_Y3}},
        mistakes=mistakes3,
    )

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 1
# by_hand: [autograd, helpers.block.block_manual_backward, helpers.gpt.embedding_backward]

# %% [markdown]
# ## Exercise 4 · Tied embeddings: one matrix, two uses (1 point)
#
# **Goal:** the gradient of GPT-2's token embedding, which is **tied** to the output head:
# the same matrix $W_{te}$ (vocab_size, d) is read at both ends of the model,
#
# $$X_0[b, n] = W_{te}[\mathrm{idx}_{b,n}] + W_{pe}[s + n], \qquad
# \mathrm{logits} = H_f\, W_{te}^\top,$$
#
# where $H_f$ (B, N, d) is the final LayerNorm's output. Chapter 7's model has an untied head
# (`head.weight`) and starts every sequence at position 0. Here the $N$ tokens continue a
# sequence whose first $s$ = `start` tokens were processed earlier (their keys and values in a
# KV cache), so token $n$ sits at position $s + n$; `start + N <= n_ctx`.
#
# Write `tied_embedding_backward(idx, grad_X0, Hf, grad_logits, n_ctx, start=0)` for `idx`
# (B, N) int64 token ids, `grad_X0` $= \partial L/\partial X_0$ (B, N, d) (what the blocks'
# backward hands down), `Hf` (B, N, d) and `grad_logits` $= \partial L/\partial\,\mathrm{logits}$
# (B, N, vocab_size). Return `(grad_wte, grad_wpe)` of shapes `(vocab_size, d)` and
# `(n_ctx, d)`: $\partial L/\partial W_{te}$ through **both** uses, and $\partial L/\partial
# W_{pe}$, zero on the positions the chunk does not use. A token that occurs several times in
# `idx` must receive the **sum** of its positions' gradients. When `grad_wte` is wrong, the
# self-check says which of the two uses is missing.
#
# <details><summary>Hint 1: a matrix used twice</summary>
#
# A tensor read in two places gets the sum of the gradients each place sends back (chapter 7's
# residual: the copy's backward is a sum). Compute the head's share and the input's share of
# $\partial L/\partial W_{te}$, each with the shape of $W_{te}$, and add them.
#
# </details>
#
# <details><summary>Hint 2: the head's share</summary>
#
# The head is a Linear layer with no bias whose weight is $W_{te}$ and whose input is $H_f$:
# its weight gradient is chapter 2's, every row of every sequence counted
# (`linear_backward(Hf, None, grad_logits, needs=(False, True, False))` returns it too).
#
# </details>
#
# <details><summary>Hint 3: the input's share</summary>
#
# `grad_wte[idx.flatten()] += rows` looks like an accumulation but is not one: with a repeated
# index, one of the rows is kept. `grad_wte.index_add_(0, ids, rows)` adds them all.
# $W_{pe}$ is read once per sequence at each position $s + n$: sum over the batch.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def tied_embedding_backward(idx, grad_X0, Hf, grad_logits, n_ctx, start=0):
    """X0 = wte[idx] + wpe[start:start + N], logits = Hf wteᵀ ⇒ (grad_wte, grad_wpe)."""
    # BEGIN SOLUTION
    B, N, d = grad_X0.shape
    V = grad_logits.shape[-1]
    # the head: (B·N, V)ᵀ @ (B·N, d) -> (V, d)
    grad_wte = grad_logits.reshape(B * N, V).T @ Hf.reshape(B * N, d)
    # the input: (B·N,) ids, (B·N, d) rows, added into the head's share
    grad_wte.index_add_(0, idx.flatten(), grad_X0.reshape(B * N, d))
    grad_wpe = torch.zeros(n_ctx, d, dtype=grad_X0.dtype, device=grad_X0.device)
    grad_wpe[start : start + N] = grad_X0.sum(0)  # (B, N, d) -> (N, d)
    return grad_wte, grad_wpe
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

# every token the same, positions 2..5 of 7: its row = the head's + all 2·4 gradients
_idx = torch.full((2, 4), 3, dtype=torch.long)
_g = randn(2, 4, 5, seed=401, dtype=torch.float64)
_Hf = randn(2, 4, 5, seed=405, dtype=torch.float64)
_gl = randn(2, 4, 6, seed=406, dtype=torch.float64)
_head = torch.einsum("bnv,bnd->vd", _gl, _Hf)
_gwte, _gwpe = tied_embedding_backward(_idx, _g, _Hf, _gl, 7, start=2)
assert _gwte.shape == (6, 5) and _gwpe.shape == (7, 5)
assert torch.allclose(_gwte[3], _head[3] + _g.sum((0, 1)), atol=1e-12)
assert torch.allclose(_gwte[[0, 1, 2, 4, 5]], _head[[0, 1, 2, 4, 5]], atol=1e-12)
assert torch.allclose(_gwpe[2:6], _g.sum(0), atol=1e-12)
assert torch.equal(_gwpe[[0, 1, 6]], torch.zeros(3, 5, dtype=torch.float64))

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# repeated tokens, a chunk at positions 3..7 of 9, vs autograd through both uses of wte
_idx = torch.tensor([[5, 0, 5, 2, 0], [1, 5, 5, 2, 7]])
_g = randn(2, 5, 3, seed=402, dtype=torch.float64)
_Hf = randn(2, 5, 3, seed=407, dtype=torch.float64)
_gl = randn(2, 5, 8, seed=408, dtype=torch.float64)
_wte, _wpe = (
    randn(8, 3, seed=403, dtype=torch.float64).requires_grad_(),
    randn(9, 3, seed=404, dtype=torch.float64).requires_grad_(),
)
_X0 = torch.nn.functional.embedding(_idx, _wte) + _wpe[3:8]
_L = (_X0 * _g).sum() + ((_Hf @ _wte.T) * _gl).sum()
_ref = torch.autograd.grad(_L, (_wte, _wpe))
_ours = tied_embedding_backward(_idx, _g, _Hf, _gl, 9, start=3)
assert _ours[1].shape == (9, 3) and all(
    torch.allclose(o, r, atol=1e-12) for o, r in zip(_ours, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# start left at its default 0, the chunk fills the context, float32, vs autograd
_idx = torch.tensor([[4, 4, 1, 0, 4, 2]])
_g = randn(1, 6, 4, seed=411, dtype=torch.float32)
_Hf = randn(1, 6, 4, seed=412, dtype=torch.float32)
_gl = randn(1, 6, 5, seed=413, dtype=torch.float32)
_wte, _wpe = (
    randn(5, 4, seed=414, dtype=torch.float32).requires_grad_(),
    randn(6, 4, seed=415, dtype=torch.float32).requires_grad_(),
)
_L = ((torch.nn.functional.embedding(_idx, _wte) + _wpe) * _g).sum()
_L = _L + ((_Hf @ _wte.T) * _gl).sum()
_ref = torch.autograd.grad(_L, (_wte, _wpe))
_ours = tied_embedding_backward(_idx, _g, _Hf, _gl, 6)
assert all(o.dtype == torch.float32 for o in _ours)
assert all(torch.allclose(o, r, atol=1e-5) for o, r in zip(_ours, _ref))

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: autograd through both uses of `wte`,
# `X0 = F.embedding(idx, wte) + wpe[start:start + N]` and `logits = Hf @ wte.T`; vocabulary 10,
# width 4, context 10, two sequences of 6 tokens at positions 3 to 8, in which token 5 occurs
# three times and tokens 1 and 3 twice; a missing use is named, and so is a wrong row or
# position):

# %%
# (B, N) = (2, 6)
idx4 = torch.tensor([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]], device=dev)
grad_X0_4 = randn(2, 6, 4, seed=41, dtype=dtype, device=dev)
Hf4 = randn(2, 6, 4, seed=44, dtype=dtype, device=dev)
grad_logits4 = randn(2, 6, 10, seed=45, dtype=dtype, device=dev)
wte4, wpe4 = (
    randn(10, 4, seed=42, dtype=dtype, device=dev),
    randn(10, 4, seed=43, dtype=dtype, device=dev),
)


def tied_grads(grad_X0, grad_logits, start=3):
    """Autograd's (grad_wte, grad_wpe) for L = <X0, grad_X0> + <logits, grad_logits>."""

    def L(wte, wpe):
        X0 = F.embedding(idx4, wte) + wpe[start : start + 6]
        return (X0 * grad_X0).sum() + ((Hf4 @ wte.T) * grad_logits).sum()

    return autograd_grads(L, (wte4, wpe4))


expected = tied_grads(grad_X0_4, grad_logits4)
counts4 = torch.bincount(idx4.flatten(), minlength=10)[:, None]  # (vocab, 1)
# grad_X0's rows paired with the ids in another order: (N, B, d) flattened
position_major, _ = tied_grads(grad_X0_4.transpose(0, 1).reshape(2, 6, 4), grad_logits4)
summed_over_positions = torch.zeros_like(expected[1])
summed_over_positions[3:9] = expected[1][3:9].sum(0)
check(
    tied_embedding_backward,
    expected,
    args=(idx4, grad_X0_4, Hf4, grad_logits4, 10, 3),
    outputs=("grad_wte", "grad_wpe"),
    name="Exercise 4 · tied_embedding_backward",
    against="autograd",
    factors={"B": 2},  # grad_wpe sums over the batch
    terms={  # each use of wte alone
        "grad_wte": {
            "the head's gradient": tied_grads(0 * grad_X0_4, grad_logits4)[0],
            "the input scatter": tied_grads(grad_X0_4, 0 * grad_logits4)[0],
        }
    },
    regions={
        "grad_wte": {
            "a token occurs more than once (one occurrence kept?)": counts4 > 1,
            "a token of idx sits (the head's gradient overwritten there?)": counts4 > 0,
        }
    },
    mistakes={
        "grad_wte": {
            "grad_X0's rows flattened position-major, ids batch-major": position_major
        },
        "grad_wpe": {
            "positions 0 to N−1 (the start offset left out)": tied_grads(
                grad_X0_4, grad_logits4, start=0
            )[1],
            "the sum over every position in each row": summed_over_positions,
        },
    },
)

# %% [markdown]
# ## The block's forward, and its cache (given)
#
# Exercise 5 walks this forward backward. It is `nn.TransformerEncoderLayer(norm_first=True,
# batch_first=True, dropout=0)` written out, with the parameters in a dict keyed by that
# module's names (`BLOCK_PARAM_NAMES`); `SA` is multi-head self-attention with the packed
# `in_proj` of `nn.MultiheadAttention` (rows $0$ to $d-1$ make $Q$, $d$ to $2d-1$ $K$, $2d$ to $3d-1$ $V$):
#
# $$\begin{aligned}
# h_1 &= \mathrm{LN}_1(X), & [Q\,K\,V] &= h_1 W_{in}^\top + b_{in}, \\
# A &= \mathrm{merge}\big(\mathrm{softmax}(QK^\top/\sqrt{d_h})\,V\big), & X_1 &= X + A W_{o}^\top + b_{o}, \\
# Y &= X_1 + \mathrm{FF}(\mathrm{LN}_2(X_1)). & &
# \end{aligned}$$
#
# The cache keeps what backward needs: the input, each LayerNorm's $\mu$ and $1/\sigma$, the $\mathrm{LN}_1$ output
# `h1`, the heads `Q`, `K`, `V` (B, H, N, d_h), the attention weights `P` (B, H, N, N), the
# merged head outputs `A` (B, N, d), `X1`, and the settings. The cell below checks that it is
# the same block as PyTorch's.


# %%
def block_forward(X, params, H, causal=False, activation="relu", eps=1e-5):
    """Pre-norm block: X1 = X + SA(LN1(X)), Y = X1 + FF(LN2(X1)); returns (Y, cache)."""
    p = params
    # (B, N, d)
    h1, mu1, rstd1 = layernorm_forward(X, p["norm1.weight"], p["norm1.bias"], eps)
    # (B, N, d) @ (d, 3d) -> (B, N, 3d)
    QKV = h1 @ p["self_attn.in_proj_weight"].T + p["self_attn.in_proj_bias"]
    Q, K, V = (split_heads(t, H) for t in QKV.chunk(3, dim=-1))  # 3 × (B, H, N, d_h)
    mask = causal_mask(X.shape[1], X.shape[1], device=X.device) if causal else None
    O, P = attention_forward(Q, K, V, mask)  # (B, H, N, d_h), (B, H, N, N)
    A = merge_heads(O)  # (B, H, N, d_h) -> (B, N, d)
    # (B, N, d) @ (d, d) -> (B, N, d)
    X1 = X + A @ p["self_attn.out_proj.weight"].T + p["self_attn.out_proj.bias"]
    # (B, N, d)
    h2, mu2, rstd2 = layernorm_forward(X1, p["norm2.weight"], p["norm2.bias"], eps)
    # (B, N, d) @ (d, d_ff) -> (B, N, d_ff)
    U = h2 @ p["linear1.weight"].T + p["linear1.bias"]
    a = F.relu(U) if activation == "relu" else F.gelu(U)
    # (B, N, d_ff) @ (d_ff, d) -> (B, N, d)
    Y = X1 + a @ p["linear2.weight"].T + p["linear2.bias"]
    cache = {
        "X": X,
        "mu1": mu1,
        "rstd1": rstd1,
        "h1": h1,
        "Q": Q,
        "K": K,
        "V": V,
        "P": P,
        "A": A,
        "X1": X1,
        "mu2": mu2,
        "rstd2": rstd2,
        "params": p,
        "H": H,
        "activation": activation,
    }
    return Y, cache


B5, N5, d5, H5, d_ff5 = 2, 5, 8, 2, 16
layer5 = nn.TransformerEncoderLayer(
    d5,
    H5,
    d_ff5,
    dropout=0.0,
    activation="relu",
    batch_first=True,
    norm_first=True,
    device=dev,
    dtype=dtype,
)
# γ ≠ 1, β ≠ 0: every term shows
params5 = block_params(d5, d_ff5, seed=50, dtype=dtype, device=dev)
load_params_into_layer(layer5, params5)
X5 = randn(B5, N5, d5, seed=51, dtype=dtype, device=dev)
grad_Y5 = randn(B5, N5, d5, seed=52, dtype=dtype, device=dev)
Y5, cache5 = block_forward(X5, params5, H5)
_ = compare(
    "block_forward vs nn.TransformerEncoderLayer", Y5, layer5(X5), atol=1e-10, rtol=0
)

# %% [raw]
# # BEGIN QUESTION
# name: ex5
# points: 3
# by_hand: [autograd, helpers.block.block_manual_backward]

# %% [markdown]
# ## Exercise 5 · The whole pre-norm block, backward by hand (3 points)
#
# **Goal:** chain everything into the block's backward, with no autograd: every one of the 12
# parameters of `nn.TransformerEncoderLayer` and the input, from a cache. Walk the forward
# above from `Y` back to `X`, one line at a time, with the pieces you have:
#
# * your `ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation)` and
#   `layernorm_backward(x, mu, rstd, weight, grad_y)`;
# * `linear_backward(X, W, grad_Y, needs)` from `helpers.numgrad` (chapter 2; lab 2's answer
#   has the same order): for $Y = XW^\top + b$ with `X` (..., in), `W` (out, in) and `grad_Y`
#   (..., out), it returns `(grad_X, grad_W, grad_b)`; `needs` (optional) says which of the
#   three to compute;
# * chapter 6's `attention_backward(Q, K, V, P, grad_O, scale)` (Q, K, V, grad_O
#   (B, H, N, d_h), P (B, H, N, N); returns `(grad_Q, grad_K, grad_V)`), `split_heads` and
#   `merge_heads`.
#
# Two residuals: each copies its incoming gradient to the skip and to the branch, and adds
# what comes back.
#
# <details><summary>Hint: the five steps</summary>
#
# 1. **FFN sub-layer**: your `ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation)`
#    gives `grad_X1` (skip + branch) and six parameter gradients.
# 2. **out_proj**: $X_1 = X + A W_o^\top + b_o$, so the attention branch receives a copy of
#    `grad_X1`: `linear_backward(A, W_o, grad_X1)` gives `grad_A` and the out_proj gradients.
# 3. **attention**: split `grad_A` (B, N, d) into heads, `grad_O` (B, H, N, d_h), then chapter 6's
#    `attention_backward(Q, K, V, P, grad_O, scale)` with scale $1/\sqrt{d_h}$. No mask is needed
#    in backward: a masked entry already has $P = 0$.
# 4. **in_proj**: merge the three gradients back to (B, N, d) each and concatenate them in the
#    packed order Q, K, V along the last dim, (B, N, 3d); `linear_backward(h1, W_in, grad_QKV)`
#    gives `grad_h1` and the in_proj gradients.
# 5. **$\mathrm{LN}_1$ and the first residual**: your
#    `layernorm_backward(X, mu1, rstd1, gamma1, grad_h1)`, with `gamma1` $= \gamma_1$ =
#    `params["norm1.weight"]`, gives the branch's gradient of `X` and the norm1 gradients; $\partial L/\partial X$ = `grad_X1` (the skip) + that.
#
# </details>
#
# Write `block_backward(grad_Y, cache)` for the cache of `block_forward` above, returning a dict
# with the key `"X"` and every name of `BLOCK_PARAM_NAMES` (`"self_attn.in_proj_weight"`,
# `"self_attn.in_proj_bias"`, `"self_attn.out_proj.weight"`, `"self_attn.out_proj.bias"`,
# `"linear1.weight"`, …, `"norm2.bias"`). The grader runs it under `torch.no_grad()`, with a
# causal mask and GELU too.

# %% [raw]
# # BEGIN SOLUTION


# %%
def block_backward(grad_Y, cache):
    """X1 = X + SA(LN1(X)), Y = X1 + FF(LN2(X1))  ⇒  {"X": ∂L/∂X, name: ∂L/∂θ}."""
    # BEGIN SOLUTION
    p, H = cache["params"], cache["H"]
    grads = ffn_sublayer_backward(
        cache["X1"], cache["mu2"], cache["rstd2"], p, grad_Y, cache["activation"]
    )
    grad_X1 = grads.pop("X1")  # (B, N, d)
    # (B, N, d)
    grad_A, grads["self_attn.out_proj.weight"], grads["self_attn.out_proj.bias"] = (
        linear_backward(cache["A"], p["self_attn.out_proj.weight"], grad_X1)
    )
    grad_O = split_heads(grad_A, H)  # (B, N, d) -> (B, H, N, d_h)
    Q, K, V = cache["Q"], cache["K"], cache["V"]
    grad_Q, grad_K, grad_V = attention_backward(
        Q, K, V, cache["P"], grad_O, 1.0 / math.sqrt(Q.shape[-1])
    )
    # 3 × (B, N, d) -> (B, N, 3d)
    grad_QKV = torch.cat([merge_heads(g) for g in (grad_Q, grad_K, grad_V)], dim=-1)
    # (B, N, 3d) -> (B, N, d)
    grad_h1, grads["self_attn.in_proj_weight"], grads["self_attn.in_proj_bias"] = (
        linear_backward(cache["h1"], p["self_attn.in_proj_weight"], grad_QKV)
    )
    grad_X_branch, grads["norm1.weight"], grads["norm1.bias"] = layernorm_backward(
        cache["X"], cache["mu1"], cache["rstd1"], p["norm1.weight"], grad_h1
    )
    grads["X"] = grad_X1 + grad_X_branch  # skip + branch
    return grads
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

from helpers.block import BLOCK_PARAM_NAMES as _NAMES
from helpers.block import block_params as _bp
from helpers.block import layer_from_params as _layer
from helpers.device import randn

# ReLU, no mask, other sizes (3 heads of width 4)
_p = _bp(12, 20, seed=500, dtype=torch.float64)
# B = 2: weight gradients are sums over the batch
_X = randn(2, 4, 12, seed=501, dtype=torch.float64)
_gY = randn(2, 4, 12, seed=502, dtype=torch.float64)
_L = _layer(_p, 3, norm_first=True, activation="relu")
_Xr = _X.clone().requires_grad_()
_ref = dict(
    zip(
        ("X",) + tuple(_NAMES),
        torch.autograd.grad(
            _L(_Xr), [_Xr] + [_L.get_parameter(n) for n in _NAMES], _gY
        ),
    )
)
_, _c = block_forward(_X, _p, 3)
with torch.no_grad():
    _ours = block_backward(_gY, _c)
assert all(
    _ours[k].shape == _ref[k].shape and torch.allclose(_ours[k], _ref[k], atol=1e-10)
    for k in _ref
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.block import BLOCK_PARAM_NAMES as _NAMES
from helpers.block import block_params as _bp
from helpers.block import layer_from_params as _layer
from helpers.device import randn

# GELU with a causal mask
_p = _bp(8, 12, seed=510, dtype=torch.float64)
_X = randn(2, 6, 8, seed=511, dtype=torch.float64)
_gY = randn(2, 6, 8, seed=512, dtype=torch.float64)
_L = _layer(_p, 4, norm_first=True, activation="gelu")
_Xr = _X.clone().requires_grad_()
_mask = torch.nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)
_Y = _L(_Xr, src_mask=_mask, is_causal=True)
_ref = dict(
    zip(
        ("X",) + tuple(_NAMES),
        torch.autograd.grad(_Y, [_Xr] + [_L.get_parameter(n) for n in _NAMES], _gY),
    )
)
_, _c = block_forward(_X, _p, 4, causal=True, activation="gelu")
with torch.no_grad():
    _ours = block_backward(_gY, _c)
assert all(torch.allclose(_ours[k], _ref[k], atol=1e-10) for k in _ref)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 5** (reference: autograd on `layer5`, the `nn.TransformerEncoderLayer(norm_first=True,
# batch_first=True, dropout=0)` above, float64, 2 heads; the 13 gradients are compared by name in
# the order backward computes them, from `linear2.weight` to `X`, so the first one named wrong,
# e.g. `self_attn.in_proj_weight matches its Q and K rows swapped …`, is where your backward
# first goes off):

# %%
X5r = X5.clone().requires_grad_()
weights5 = [layer5.get_parameter(n) for n in BLOCK_PARAM_NAMES]
grads5 = dict(
    zip(
        ("X", *BLOCK_PARAM_NAMES),
        torch.autograd.grad(layer5(X5r), [X5r, *weights5], grad_Y5),
    )
)
BACKWARD_ORDER = (
    "linear2.weight",
    "linear2.bias",
    "linear1.weight",
    "linear1.bias",
    "norm2.weight",
    "norm2.bias",
    "self_attn.out_proj.weight",
    "self_attn.out_proj.bias",
    "self_attn.in_proj_weight",
    "self_attn.in_proj_bias",
    "norm1.weight",
    "norm1.bias",
    "X",
)
# the first one named wrong is where backward first goes off
expected = {k: grads5[k] for k in BACKWARD_ORDER}
# ∂L/∂X1: what the first residual's skip path carries to X
(grad_X1_5,) = autograd_grads(
    lambda X1: ffn_sublayer_reference(X1, *(params5[n] for n in NAMES3), act=F.relu),
    (cache5["X1"],),
    grad_Y5,
)
d_h5 = d5 // H5


def QKV_blocks(g, QK_factor=1.0, swap_QK=False):
    """A packed in_proj gradient with its Q, K blocks × QK_factor (or swapped)."""
    Q, K, V = g.chunk(3, dim=0)  # rows 0 to d-1, d to 2d-1, 2d to 3d-1
    Q, K = (K, Q) if swap_QK else (Q, K)
    return torch.cat([Q * QK_factor, K * QK_factor, V])


def attention_branch(h1, W_in, b_in, merge):
    """[Q K V] = h1 W_inᵀ + b_in, attention per head, the heads merged by `merge`."""
    QKV = F.linear(h1, W_in, b_in).chunk(3, dim=-1)
    return merge(attention_forward(*(split_heads(t, H5) for t in QKV))[0])


# grad_A by autograd through out_proj, then the in_proj gradients if grad_A is split
# into heads by a plain reshape (the inverse of merging them by one)
(grad_A5,) = autograd_grads(
    lambda A: F.linear(A, params5["self_attn.out_proj.weight"]),
    (cache5["A"],),
    grad_X1_5,
)
plain_reshape = autograd_grads(
    lambda W, b: attention_branch(cache5["h1"], W, b, lambda O: O.reshape(B5, N5, d5)),
    (params5["self_attn.in_proj_weight"], params5["self_attn.in_proj_bias"]),
    grad_A5,
)
LN1_fed_grad_X1 = autograd_grads(
    lambda g, b: F.layer_norm(X5, (d5,), g, b, 1e-5),
    (params5["norm1.weight"], params5["norm1.bias"]),
    grad_X1_5,
)
mistakes5 = {}
for i, name in enumerate(("self_attn.in_proj_weight", "self_attn.in_proj_bias")):
    g = expected[name]
    mistakes5[name] = {
        "its Q, K rows × √d_h (the attention scale left out)": QKV_blocks(g, d_h5**0.5),
        "its Q, K rows × √(d_h/d) (scale 1/√d, not 1/√d_h)": QKV_blocks(
            g, (d_h5 / d5) ** 0.5
        ),
        "its Q and K rows swapped (packed K, Q, V)": QKV_blocks(g, swap_QK=True),
        "grad_A split into heads by a plain reshape": plain_reshape[i],
    }
for i, name in enumerate(("norm1.weight", "norm1.bias")):
    mistakes5[name] = {"LN1's backward fed grad_X1, not grad_h1": LN1_fed_grad_X1[i]}
check(
    block_backward,
    expected,
    args=(grad_Y5, cache5),
    name="Exercise 5 · block_backward",
    against="autograd on nn.TransformerEncoderLayer",
    terms={"X": {"the first skip path (∂L/∂X1)": grad_X1_5}},
    mistakes=mistakes5,
)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `layernorm_backward`, `ffn_backward`,
# `ffn_sublayer_backward`, `tied_embedding_backward`, `block_forward` and `block_backward`.
