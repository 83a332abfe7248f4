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
# cell right below. It compares your function with reference outputs recorded from the course's
# own solution, on one case of each promise the prompt makes, and answers in one line: `✓`
# matches, `✗` names the kinds of case that fail before any number (then what is wrong: for a
# block, which parameter's gradient first), or `·` not implemented yet. Your instructor grades
# the notebook you hand in with hidden tests that call the same functions on other cases of the
# same kinds.
#
# **By hand** means derived: a graded backward may not call autograd, and an estimate by finite
# differences (the forward run again for each input entry) does not count either. One kind of
# case of each backward is large, and there the self-check and the hidden tests count the tensor
# entries your code writes, forward and backward: at most 10 × what the course's backward
# writes, room enough for any derived backward on rows and matrices (loops over rows or samples and float64 copies included; a loop over every single entry may not fit).
# Values read out of tensors into Python or NumPy there (`.item()`, `float()`, `.tolist()`,
# `.numpy()`, printing) count too, at most 8 (a count or a norm, not a tensor), and comparisons
# read out (`if h[i] > 0`) at most two per entry: work done outside tensors cannot be measured. A
# backward over any of these limits scores 0 for its exercise, as one that calls autograd does;
# so does one that calls a backward pass of the course's `helpers`, unless the lab's own code uses it for you and the exercise does not name it.

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

from helpers.attention import attention_backward, merge_heads, split_heads
from helpers.functions import gelu_backward
from helpers.labcontract import check_contract
from helpers.numgrad import linear_backward

# %% [raw]
# # BEGIN QUESTION
# name: ex1

# %% [markdown]
# ## Exercise 1 · LayerNorm backward from the saved $\mu$ and $1/\sigma$ (2 points)
#
# **Goal:** the backward of $y = \gamma \odot \hat x + \beta$, $\hat x = (x - \mu)/\sigma$, with
# $\mu$ and $1/\sigma$ taken from the forward's cache (two floats per row) instead of recomputed.
# $x$ reaches the output directly, through the mean and through the variance: three terms.
#
# **You derive:** $\partial L/\partial x$ (..., D) as the sum of its three paths, and
# $\partial L/\partial\gamma$, $\partial L/\partial\beta$ (D,) summed over every row.
#
# **You are given:** the saved `mu` and `rstd` $= 1/\sigma$ (..., 1), `weight` $\gamma$ and
# `grad_y`; chapter 7, section 1 did one row.
#
# Write `layernorm_backward(x, mu, rstd, weight, grad_y)` for `x` of shape `(..., D)` with any
# number of leading dims (none: one row `(D,)`; `(R, D)`; `(B, N, D)`; 4 dims), in float32 or
# float64; `mu` and `rstd` $= 1/\sigma$ of shape `(..., 1)` (what
# `helpers.functions.layernorm_forward` returns), computed with whatever `eps` the forward used:
# `nn.LayerNorm`'s 1e-5 or a large one (0.1 to 1), so use the saved `rstd` (one recomputed
# without that `eps` gives other numbers; recomputing `mu` is only work done twice);
# `weight` $\gamma$ of shape `(D,)` (not all ones) and `grad_y` $= \partial L/\partial y$ like `x`.
# Return `(grad_x, grad_weight, grad_bias)` in the dtype of `x`, `grad_x` of the shape of `x`,
# the parameter gradients `(D,)`: they sum over every row ("rows" = every leading dim).
# Derive $\partial L/\partial x$ yourself, one path at a time: the direct path ($\mu$ and $\sigma$
# held fixed), the path through $\mu$, the path through $\sigma$ (chapter 7 did it for one row).
# $\sum_i \hat x_i = 0$ holds for any `eps` and simplifies it; $\sum_i \hat x_i^2 = D$ holds only
# at `eps` = 0 (it is $D \cdot \mathrm{var}/(\mathrm{var} + \varepsilon)$ per row, far from $D$ where a
# row's variance is not large beside `eps`), so do not use it. When `grad_x` is wrong, the
# self-check says which path is missing.
#
# <details><summary>Hint 1 of 4 · the idea: three paths, one row at a time</summary>
#
# Rows are independent: work on one row $x$ (D,). Write $y$ as a function of $x$, $\mu(x)$
# and $\sigma(x)$. The chain rule gives three terms: the partial derivative with $\mu$ and
# $\sigma$ fixed, plus $\partial L/\partial\mu \cdot \partial\mu/\partial x_i$, plus
# $\partial L/\partial\sigma \cdot \partial\sigma/\partial x_i$. Everything before $\hat x$ sees
# only $g = \partial L/\partial y \odot \gamma$, the gradient of $\hat x$: name it first. The
# parameter gradients are simpler: $y$ is elementwise in $\gamma$ and $\beta$, summed over rows.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: how μ and σ move with x_i</summary>
#
# $\partial\mu/\partial x_i = 1/D$. For $\sigma$, differentiate
# $\sigma^2 = \mathrm{mean}((x-\mu)^2) + \varepsilon$: the term through $\mu$ drops out because
# $\sum_j (x_j - \mu) = 0$, and $\partial\sigma/\partial x_i = (x_i - \mu)/(D\sigma) = \hat x_i / D$,
# for any $\varepsilon$ (the $\varepsilon$ sits inside $\sigma$).
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: ∂L/∂μ and ∂L/∂σ</summary>
#
# $\hat x_j = (x_j - \mu)/\sigma$ gives $\partial\hat x_j/\partial\mu = -1/\sigma$ and
# $\partial\hat x_j/\partial\sigma = -\hat x_j/\sigma$, for every $j$. So $\partial L/\partial\mu$
# and $\partial L/\partial\sigma$ are each a sum over the row of $g_j$ times one of these.
# Multiply by Hint 2's factors and collect the three terms over $1/\sigma$ (`rstd`); write the
# sums as means along the last dim with `keepdim=True`.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: autograd in a scratch cell</summary>
#
# In a scratch cell (delete it before handing in), make float64 `x` (2, 3, 6), `weight` and
# `bias` (6,), all with `requires_grad=True`, and `y = F.layer_norm(x, (6,), weight, bias,
# eps)`; get the three gradients with `torch.autograd.grad(y, (x, weight, bias), grad_y)`.
# Give your function `mu = x.mean(-1, keepdim=True)` and
# `rstd = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps)` (detached). Try
# `eps` = 1e-5 and 0.5 (a formula that used $\sum_i \hat x_i^2 = D$ fails there), a 1-D `x`
# and a 4-D one. Every row of your `grad_x` sums to 0, to round-off. The formulas, to check
# yours against, with means along the last dim:
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
# # END QUESTION

# %% [markdown]
# **Self-check 1** compares your function with reference outputs recorded from the course's own
# solution.
#
# A wrong `grad_x` is compared with autograd's share along each path, from a LayerNorm with
# $\mu$ or $\sigma$ detached, so a ✗ can say which path is missing.

# %%
check_contract("lab07", "ex1", layernorm_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex2

# %% [markdown]
# ## Exercise 2 · The FFN backward: Linear → activation → Linear (2 points)
#
# **Goal:** chapter 4's pieces in reverse order. With $U = h W_1^\top + b_1$, $a = \mathrm{act}(U)$
# and $F = a W_2^\top + b_2$ ($W_1$ is `(d_ff, d)`, $W_2$ is `(d, d_ff)`, `nn.Linear`'s layout),
# derive the gradient of each of the three steps, last step first; check every product's
# shape against the layout (with `d_ff` = d a transposed product has the right shape and the
# wrong values).
#
# **You derive:** the backward of each of the three steps, last step first: $dF \to da \to
# dU \to dh$, with $dW_2$, $db_2$, $dW_1$, $db_1$ on the way, summed over every row.
#
# **You are given:** the forward (above, recomputed from `h`), `gelu_backward(U, grad_a)` for
# the GELU step (chapter 4), and chapter 2's linear-layer gradients as a method.
#
# Write `ffn_backward(h, W1, b1, W2, b2, grad_F, activation="relu")` returning
# `(grad_h, grad_W1, grad_b1, grad_W2, grad_b2)` in the shapes and dtype of `h`, `W1`, `b1`,
# `W2`, `b2`. `h` is `(..., d)` with any number of leading dims (`(R, d)`, `(B, N, d)`, 4 dims),
# in float32 or float64; `grad_F` is like `h`. `activation` is `"relu"` (also when it is left
# at its default) or `"gelu"` (PyTorch's exact GELU): honour it. It gets no cache: recompute
# $U$ and $a$ from `h` first. Write the two linear steps with matmuls yourself (not
# `linear_backward`), and the ReLU's derivative too; for `"gelu"` use `gelu_backward(U, grad_a)`
# from chapter 4. The weight and bias gradients sum over **every row**: flatten all leading
# dims to `(R, ·)` first (a mean there shows as a factor R).
#
# <details><summary>Hint 1 of 4 · the idea: three steps, each its own backward</summary>
#
# Each step's backward takes the gradient of its output and returns those of its inputs. A
# linear step is chapter 2's (the gradient of its input, of its weight, of its bias); an
# elementwise step multiplies by the derivative at its **input**. Go $F \to a \to U \to h$.
# Write each product, then check its shape: $dW_2$ must be (d, d_ff), $dW_1$ (d_ff, d).
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the first one</summary>
#
# $F = aW_2^\top + b_2$ with $a$ (R, d_ff) and $W_2$ (d, d_ff): entry by entry
# $F_{rk} = \sum_m a_{rm} W_{2,km} + b_{2,k}$, so $\partial F_{rk}/\partial W_{2,km} = a_{rm}$ for
# every row $r$: $dW_2$ is a sum over the rows, a product of two (R, ·) matrices with R
# contracted. Flatten the leading dims to R first so one matmul does that sum.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the activation</summary>
#
# The derivative is taken at $U$, the activation's input, not at $a$. ReLU's is 1 where
# $U > 0$ and 0 elsewhere, so $dU$ is $da$ with the other entries set to 0. For `"gelu"`,
# `gelu_backward(U, grad_a)` already returns $dU$ (the product, not the derivative alone).
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: autograd in a scratch cell</summary>
#
# In a scratch cell (delete it before handing in), make float64 `h` (2, 3, 4), `W1` (5, 4),
# `b1` (5,), `W2` (4, 5), `b2` (4,), all with `requires_grad=True`, compute
# `F.linear(F.relu(F.linear(h, W1, b1)), W2, b2)` (or `F.gelu`), and compare with
# `torch.autograd.grad(out, (h, W1, b1, W2, b2), grad_F)`. Try `d_ff` = d (a transposed
# product only shows there by its values), `h` 2-D and 4-D, the activation left at its
# default. The three steps, to check yours against (sums over every row):
#
# $$\begin{aligned}
# &F = aW_2^\top + b_2: & da &= dF\,W_2, & dW_2 &= dF^\top a, & db_2 &= \textstyle\sum dF, \\
# &a = \mathrm{act}(U): & dU &= da \odot \mathrm{act}'(U), & & & & \\
# &U = hW_1^\top + b_1: & dh &= dU\,W_1, & dW_1 &= dU^\top h, & db_1 &= \textstyle\sum dU.
# \end{aligned}$$
#
# </details>

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
# # END QUESTION

# %% [markdown]
# **Self-check 2** compares your function with reference outputs recorded from the course's own
# solution; the five gradients are compared in the order you return them.

# %%
check_contract("lab07", "ex2", ffn_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex3

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
# **You derive:** the order of the backward through $\mathrm{FF}$ and $\mathrm{LN}_2$, what each
# piece takes as its input, and where the skip path and the branch meet.
#
# **You are given:** your `ffn_backward` and `layernorm_backward` (exercises 1 and 2), $\mathrm{LN}_2$'s
# saved `mu2` and `rstd2`, and the parameters by name.
#
# Write `ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation="relu")`: `X1` is
# `(B, N, d)` in float64, `mu2` and `rstd2` $= 1/\sigma_2$ are $\mathrm{LN}_2$'s saved `(B, N, 1)`
# statistics (computed with whatever `eps` the forward used, 1e-5 or a large one), `params` is
# a dict with `nn.TransformerEncoderLayer`'s names (`"norm2.weight"`, `"norm2.bias"`,
# `"linear1.weight"`, `"linear1.bias"`, `"linear2.weight"`, `"linear2.bias"`; any values,
# `linear2.weight` = 0 included), and `activation` is `"relu"` (given or left at its default)
# or `"gelu"`. Recompute $h_2$ from the saved statistics, send `grad_Y` through
# `ffn_backward` and `layernorm_backward` (the activation passed on), add the skip path,
# and return a dict with exactly the keys `"X1"` ($\partial L/\partial X_1$) and the six
# parameter names above. Do it without autograd. Calling your own two functions is the short
# way, not a rule: the checks look at the values only, and the hidden tests run your block with
# the course's `ffn_backward` and `layernorm_backward` in place of yours, so a mistake in
# exercises 1 or 2 costs points there, once.
#
# <details><summary>Hint 1 of 3 · the idea: walk Y back to X1 on two paths</summary>
#
# $Y = X_1 + \mathrm{FF}(h_2)$: `grad_Y` is the gradient of the skip path's end and of FF's
# output at once. Walk the branch backward: FF from its output to its input $h_2$ (and its
# four parameters), then $\mathrm{LN}_2$ from $h_2$ to $X_1$ (and $\gamma_2$, $\beta_2$). Two
# gradients of $X_1$ arrive, one per path: they add.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: what each piece takes</summary>
#
# `ffn_backward` wants FF's own input, $h_2$, not $X_1$: rebuild $h_2$ from `X1`, `mu2`,
# `rstd2` and the norm2 parameters, as in the forward above. `layernorm_backward` wants
# $\mathrm{LN}_2$'s input `X1`, its saved statistics, $\gamma_2$ and the gradient of $h_2$ that
# `ffn_backward` returned first. Then map the returned tuples to the names: linear1 is
# $W_1, b_1$, linear2 is $W_2, b_2$, norm2 is $\gamma_2, \beta_2$.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: autograd in a scratch cell</summary>
#
# In a scratch cell (delete it before handing in), make a float64 `X1` (2, 3, 4) and the six
# parameters (d = 4, d_ff = 5) with `requires_grad=True`, compute
# `Y = X1 + F.linear(F.relu(F.linear(F.layer_norm(X1, (4,), g2, b2, eps), W1, c1)), W2, c2)`
# and compare `torch.autograd.grad(Y, (X1, ...), grad_Y)` with your dict; give your function
# `mu2` and `rstd2` computed from `X1` with the same `eps` (detached). Try `"gelu"`,
# `eps` = 0.5, and `linear2.weight` = 0: then the branch sends nothing back and your `"X1"`
# must equal `grad_Y` exactly. To check yours against:
#
# $$\frac{\partial L}{\partial X_1} = \underbrace{\frac{\partial L}{\partial Y}}_{\text{skip}} +
# \underbrace{\mathrm{LN}_2^{\,\text{backward}}\big(\mathrm{FF}^{\,\text{backward}}(\partial L/\partial Y)\big)}_{\text{branch}}.$$
#
# </details>

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
# # END QUESTION

# %% [markdown]
# **Self-check 3** compares your function with reference outputs recorded from the course's own
# solution.
#
# The dict is compared key by key in the order backward computes them, from `linear2.weight` to
# `X1`, so the first gradient named wrong is where your backward first goes off; forgetting the
# skip path shows up as `X1 matches the expected value minus the skip path`.

# %%
check_contract("lab07", "ex3", ffn_sublayer_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex4

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
# **You derive:** $\partial L/\partial W_{te}$ as the sum of the head's share and the input's
# share, each of shape (vocab_size, d), and $\partial L/\partial W_{pe}$ (n_ctx, d).
#
# **You are given:** `grad_X0` and `grad_logits` from the rest of the backward, `Hf`, and
# `linear_backward` (chapter 2).
#
# Write `tied_embedding_backward(idx, grad_X0, Hf, grad_logits, n_ctx, start=0)` for `idx`
# (B, N) int64 token ids, `grad_X0` $= \partial L/\partial X_0$ (B, N, d) (what the blocks'
# backward hands down), `Hf` (B, N, d) and `grad_logits` $= \partial L/\partial\,\mathrm{logits}$
# (B, N, vocab_size), all float32 or all float64, B ≥ 1. Return `(grad_wte, grad_wpe)` of shapes
# `(vocab_size, d)` and `(n_ctx, d)` in that dtype: $\partial L/\partial W_{te}$ through **both**
# uses, and $\partial L/\partial W_{pe}$, zero on the positions the chunk does not use. `start`
# may be left at its default 0, be > 0, or put the chunk at the very end of the context
# (`start + N = n_ctx`). A token that occurs several times in `idx` (even everywhere) must
# receive the **sum** of its positions' gradients; a token id that does not occur in `idx` gets
# the head's share only. When `grad_wte` is wrong, the self-check says which of the two uses is
# missing.
#
# <details><summary>Hint 1 of 4 · the idea: a matrix used twice</summary>
#
# A tensor read in two places gets the sum of the gradients each place sends back (chapter 7's
# residual: the copy's backward is a sum). Compute the head's share and the input's share of
# $\partial L/\partial W_{te}$, each with the shape of $W_{te}$, and add them. $W_{pe}$ is read
# in one place only.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the head's share</summary>
#
# The head is a Linear layer with no bias whose weight is $W_{te}$ and whose input is $H_f$:
# its weight gradient is chapter 2's, every row of every sequence counted, so flatten
# (B, N, ·) to (B·N, ·) first (`linear_backward(Hf, None, grad_logits, needs=(False, True,
# False))` returns it too).
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the input's share, and W_pe</summary>
#
# Row $\mathrm{idx}_{b,n}$ of $W_{te}$ receives row $(b, n)$ of `grad_X0`.
# `grad_wte[idx.flatten()] += rows` looks like an accumulation but is not one: with a repeated
# index, one of the rows is kept. `index_add_` along dim 0 adds them all. $W_{pe}$ is read once
# per sequence at each position $s + n$: sum over the batch, put the (N, d) result at rows
# $s$ to $s + N - 1$ of a zero (n_ctx, d).
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: autograd in a scratch cell</summary>
#
# In a scratch cell (delete it before handing in), make float64 `wte` (7, 4) and `wpe`
# (6, 4) with `requires_grad=True`, compute `X0 = F.embedding(idx, wte) + wpe[start:start + N]`
# and `logits = Hf @ wte.T`, then `torch.autograd.grad((X0 * grad_X0).sum() + (logits *
# grad_logits).sum(), (wte, wpe))` and compare. Try `idx` with a repeated token, one token
# everywhere, `start` = 0 and `start + N = n_ctx`, B = 1. A token absent from `idx` gets the
# head's share alone. To check yours against, with $G$ = `grad_logits` and $H_f$ flattened
# to (B·N, ·):
#
# $$\begin{gathered}
# \frac{\partial L}{\partial W_{te}} = G^\top H_f + \sum_{b,n} e_{\mathrm{idx}_{b,n}}
# \Big(\frac{\partial L}{\partial X_0}\Big)_{b,n}^{\!\top}, \qquad
# \frac{\partial L}{\partial W_{pe}}[s + n] = \sum_b \Big(\frac{\partial L}{\partial X_0}\Big)_{b,n}
# \end{gathered}$$
#
# ($e_v$ the one-hot column of token $v$; rows of $W_{pe}$ outside $s, \dots, s + N - 1$ get 0).
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
# # END QUESTION

# %% [markdown]
# **Self-check 4** compares your function with reference outputs recorded from autograd through
# both uses of `wte`, `X0 = F.embedding(idx, wte) + wpe[start:start + N]` and `logits = Hf @
# wte.T`; a missing use is named.

# %%
check_contract("lab07", "ex4", tied_embedding_backward)

# %% [markdown]
# ## The block's forward, and its cache
#
# Exercise 5 walks this forward backward. It is `nn.TransformerEncoderLayer(norm_first=True,
# batch_first=True, dropout=0)` written out (the course checks that the two agree to 1e-10 in
# float64), with the parameters in a dict keyed by that module's names (`BLOCK_PARAM_NAMES` of
# `helpers.block`: `from helpers.block import BLOCK_PARAM_NAMES` to use them);
# `SA` is multi-head self-attention with the packed `in_proj` of `nn.MultiheadAttention` (rows
# $0$ to $d-1$ make $Q$, $d$ to $2d-1$ $K$, $2d$ to $3d-1$ $V$):
#
# $$\begin{aligned}
# h_1 &= \mathrm{LN}_1(X), & [Q\,K\,V] &= h_1 W_{in}^\top + b_{in}, \\
# A &= \mathrm{merge}\big(\mathrm{softmax}(QK^\top/\sqrt{d_h})\,V\big), & X_1 &= X + A W_{o}^\top + b_{o}, \\
# Y &= X_1 + \mathrm{FF}(\mathrm{LN}_2(X_1)). & &
# \end{aligned}$$
#
# The cache keeps what backward needs: the input, each LayerNorm's $\mu$ and $1/\sigma$, the
# $\mathrm{LN}_1$ output `h1`, the heads `Q`, `K`, `V` (B, H, N, d_h), the attention weights `P`
# (B, H, N, N), the merged head outputs `A` (B, N, d), `X1`, and the settings. In code (the
# self-check and the grader hand your `block_backward` caches made by exactly this function,
# from the `helpers` imports above plus `attention_forward` and `causal_mask` of
# `helpers.attention`):
#
# ```python
# def block_forward(X, params, H, causal=False, activation="relu", eps=1e-5):
#     """Pre-norm block: X1 = X + SA(LN1(X)), Y = X1 + FF(LN2(X1)); returns (Y, cache)."""
#     p = params
#     # (B, N, d)
#     h1, mu1, rstd1 = layernorm_forward(X, p["norm1.weight"], p["norm1.bias"], eps)
#     # (B, N, d) @ (d, 3d) -> (B, N, 3d)
#     QKV = h1 @ p["self_attn.in_proj_weight"].T + p["self_attn.in_proj_bias"]
#     Q, K, V = (split_heads(t, H) for t in QKV.chunk(3, dim=-1))  # 3 × (B, H, N, d_h)
#     mask = causal_mask(X.shape[1], X.shape[1], device=X.device) if causal else None
#     O, P = attention_forward(Q, K, V, mask)  # (B, H, N, d_h), (B, H, N, N)
#     A = merge_heads(O)  # (B, H, N, d_h) -> (B, N, d)
#     # (B, N, d) @ (d, d) -> (B, N, d)
#     X1 = X + A @ p["self_attn.out_proj.weight"].T + p["self_attn.out_proj.bias"]
#     # (B, N, d)
#     h2, mu2, rstd2 = layernorm_forward(X1, p["norm2.weight"], p["norm2.bias"], eps)
#     # (B, N, d) @ (d, d_ff) -> (B, N, d_ff)
#     U = h2 @ p["linear1.weight"].T + p["linear1.bias"]
#     a = F.relu(U) if activation == "relu" else F.gelu(U)
#     # (B, N, d_ff) @ (d_ff, d) -> (B, N, d)
#     Y = X1 + a @ p["linear2.weight"].T + p["linear2.bias"]
#     cache = {
#         "X": X, "mu1": mu1, "rstd1": rstd1, "h1": h1,
#         "Q": Q, "K": K, "V": V, "P": P, "A": A,
#         "X1": X1, "mu2": mu2, "rstd2": rstd2,
#         "params": p, "H": H, "activation": activation, "causal": causal, "eps": eps,
#     }
#     return Y, cache
# ```

# %% [raw]
# # BEGIN QUESTION
# name: ex5

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
# **You derive:** the order of the backward from `Y` to `X`, which cache entries each step
# takes, how the heads are split and packed back, and where the two residuals add.
#
# **You are given:** the pieces above, the cache of `block_forward` (with `H`, `activation`
# and `causal` in it), and the forward itself, printed above.
#
# Two residuals: each copies its incoming gradient to the skip and to the branch, and adds
# what comes back.
#
# Write `block_backward(grad_Y, cache)` for a cache of `block_forward` above (float64, B ≥ 1,
# one head or several, ReLU or GELU, causal or not, any LayerNorm `eps`: all of it is in the
# cache), returning a dict with exactly the key `"X"` and every name of `BLOCK_PARAM_NAMES`
# (`"self_attn.in_proj_weight"`, `"self_attn.in_proj_bias"`, `"self_attn.out_proj.weight"`,
# `"self_attn.out_proj.bias"`, `"linear1.weight"`, …, `"norm2.bias"`), without autograd.
#
# <details><summary>Hint 1 of 4 · the idea: the forward's lines, bottom up</summary>
#
# Read the forward from its last line to its first; each line has one piece that undoes it:
# the FFN sub-layer (exercise 3), the out_proj Linear, the attention, the in_proj Linear,
# $\mathrm{LN}_1$. At each residual the incoming gradient goes both to the skip and into the
# branch, and what comes back out of the branch is added. Note the shapes at each boundary:
# (B, N, d) between the Linears, (B, H, N, d_h) inside the attention, (B, N, 3d) for the packed
# $[Q\,K\,V]$.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the order of the five steps</summary>
#
# 1. **FFN sub-layer**: `ffn_sublayer_backward` gives the gradient of `X1` (skip and branch
#    already added) and six parameter gradients.
# 2. **out_proj**: $X_1 = X + A W_o^\top + b_o$, so its Linear receives a copy of the gradient
#    of $X_1$; `linear_backward` with the cached `A` gives the gradient of `A` and two
#    parameter gradients.
# 3. **attention**: from the gradient of `A` to those of `Q`, `K`, `V` (Hint 3).
# 4. **in_proj**: one Linear from `h1` to the packed $[Q\,K\,V]$; `linear_backward` gives the
#    gradient of `h1` and two parameter gradients.
# 5. **$\mathrm{LN}_1$ and the first residual**: `layernorm_backward` with the cached `X`,
#    `mu1`, `rstd1` and `params["norm1.weight"]` gives the branch's share of the gradient of
#    `X` and the norm1 gradients; add the skip's share.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: through the heads and back</summary>
#
# `A` is `merge_heads(O)`, so `split_heads(·, H)` turns the gradient of `A` (B, N, d) into that
# of `O` (B, H, N, d_h). The attention's scale is $1/\sqrt{d_h}$ with $d_h$ = `Q.shape[-1]`, not
# $1/\sqrt d$; no mask is needed even when `causal` is True, since a masked entry of `P` is
# already 0. Going back, merge each of the three gradients to (B, N, d) and concatenate them
# along the last dim in the packed order Q, K, V (rows $0$ to $d-1$ of `in_proj` make Q).
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: autograd on the same forward</summary>
#
# In a scratch cell (delete it before handing in), copy `block_forward` above after
# `from helpers.functions import layernorm_forward` and
# `from helpers.attention import attention_forward, causal_mask`. Make a float64 `X`
# (2, 5, 8) and the twelve parameters with `params = block_params(8, 16, dtype=torch.float64)`
# (`from helpers.block import block_params`), all with `requires_grad_()`, run
# `Y, cache = block_forward(X, params, 2)`, and compare your dict with
# `torch.autograd.grad(Y, [X, *params.values()], grad_Y)`, name by name. Try
# `causal=True`, `activation="gelu"`, one head, `eps=0.5`, B = 1. Compare in backward order,
# `linear2.weight` first and `X` last: the first one that differs is where your backward first
# goes off. To check yours against:
#
# $$\begin{gathered}
# \frac{\partial L}{\partial X} = \frac{\partial L}{\partial X_1} + \mathrm{LN}_1^{\,\text{backward}}\Big(
# \mathrm{in\_proj}^{\text{backward}}\big(\mathrm{attn}^{\text{backward}} \\
# (\mathrm{out\_proj}^{\text{backward}}(\partial L/\partial X_1))\big)\Big), \\
# \frac{\partial L}{\partial X_1} = \frac{\partial L}{\partial Y} + \text{its FFN branch}.
# \end{gathered}$$
#
# </details>

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
# # END QUESTION

# %% [markdown]
# **Self-check 5** compares your function with reference outputs recorded from autograd on the
# block, the same as `nn.TransformerEncoderLayer(norm_first=True, batch_first=True, dropout=0)`
# in float64.
#
# The 13 gradients are compared by name in the order backward computes them, from
# `linear2.weight` to `X`, so the first one named wrong, e.g. `self_attn.in_proj_weight matches
# its Q and K rows swapped …`, is where your backward first goes off.

# %%
check_contract("lab07", "ex5", block_backward)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `layernorm_backward`, `ffn_backward`,
# `ffn_sublayer_backward`, `tied_embedding_backward` and `block_backward`.
