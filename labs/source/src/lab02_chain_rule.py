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
#
# **By hand** means derived: no exercise may call autograd (exercise 1 writes its own differences,
# without chapter 2's `numerical_grad`), and in exercises 2–4 an estimate by finite differences
# (exercise 1's tool: the forward run again for each input entry) does not count either. One kind of case of each of them is large, and there the self-check and the
# hidden tests count the tensor entries your code writes: at most 10 × what the course's backward
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
import torch

from helpers.labcontract import check_contract

# %% [raw]
# # BEGIN QUESTION
# name: ex1

# %% [markdown]
# ## Exercise 1 · A gradient check along random directions (2 points)
#
# **Goal:** a check you can trust without any calculus, at two evaluations of $f$ per
# direction instead of two per entry of $x$.
#
# **You derive:** the central difference along a direction, from the Taylor expansion of
# $g(\pm\varepsilon)$: what to subtract, what to divide by, and why its error is
# $O(\varepsilon^2)$.
#
# **You are given:** `f` (a tensor to a 0-dim tensor), the point `x`, the directions `U`
# (k, *x.shape) and the step `eps`.
#
# Chapter 2's `numerical_grad` moves every entry $x_i$ by $\pm h$ in turn (its step `h` is the
# $\varepsilon$ of this lab): $2n$ evaluations for $n$ entries, too many for a layer's weights. A cheaper check moves **all** entries at once,
# along a direction $u$ (a tensor of the shape of $x$): the central difference of
# $g(t) = f(x + t\,u)$ at $t = 0$ estimates $g'(0) = u^\top \nabla f(x) = \sum_i u_i\,
# \partial f/\partial x_i$, the **directional derivative**. A gradient to test, say
# autograd's or your backward's, must give the same number for every $u$; one that is wrong
# fails a random direction with probability 1. `torch.autograd.gradcheck(..., fast_mode=True)`
# checks this way.
#
# Write `directional_derivatives(f, x, U, eps)` for a function `f` that maps a tensor to a
# scalar tensor: `x` of any shape, in float32 or float64; `U` stacks $k \ge 1$ directions,
# `U[j]` of the shape of `x` and of any length (not only unit vectors). Return a tensor of
# shape `(k,)` and the dtype of `x` whose entry $j$ estimates $U_j^\top \nabla f(x)$ with a
# **central** difference of step $\varepsilon$ along $U_j$: the `eps` given, or its default
# $10^{-6}$ when none is. Work out from the Taylor expansion of $g(\pm\varepsilon)$ what to
# divide by, and why the error is $O(\varepsilon^2)$ where a one-sided difference's is
# $O(\varepsilon)$. Leave `x` unchanged. A loop over the directions is fine.
#
# <details><summary>Hint 1 of 3 · the idea: one direction is a function of one number</summary>
#
# Along direction $j$ the whole problem is one-dimensional: $g(t) = f(x + t\,U_j)$, with
# $x + t\,U_j$ a tensor of the shape of `x` and $g'(0)$ the number you want. Expand
# $g(\varepsilon)$ and $g(-\varepsilon)$ around $t = 0$ and look for the combination of the two
# in which $g(0)$ and the $\varepsilon^2$ term drop out. One loop over the k directions, one
# entry of the (k,) result per direction.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the two expansions</summary>
#
# $g(\pm\varepsilon) = g(0) \pm \varepsilon\, g'(0) + \tfrac{\varepsilon^2}{2} g''(0) \pm
# \tfrac{\varepsilon^3}{6} g'''(0) + O(\varepsilon^4)$. Subtract one from the other and see
# which terms are left, then what you divide by to leave $g'(0)$ alone. The step moves `x`
# along $U_j$ as it is: do not normalise $U_j$ (a longer $U_j$ has a larger slope, and that is
# the slope asked for), and a step of $\varepsilon$ in every entry, `x + eps`, is the
# direction of all ones, not $U_j$.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: a cubic, where you know the answer</summary>
#
# Take $f(x) = \sum_i x_i^3$ on a float64 `x` of shape (2, 3) and k = 4 random directions: the
# exact slope along $u$ is $\sum_i 3x_i^2 u_i$, and your central difference must match it to
# about $10^{-8}$ at the default step. With `eps = 1e-2` it is off by exactly
# $\varepsilon^2 \sum_i u_i^3$ (here $g''' = 6\sum_i u_i^3$), a one-sided difference by about
# $3\varepsilon \sum_i x_i u_i^2$. Try k = 1 (the result is still shape (1,)) and check that
# `x` did not change. To check yours against:
#
# $$\frac{f(x + \varepsilon U_j) - f(x - \varepsilon U_j)}{2\varepsilon},$$
#
# whose first error term is $\varepsilon^2 g'''(0)/6$: the even terms of the two expansions
# cancel.
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
# # END QUESTION

# %% [markdown]
# **Self-check 1** compares your function with reference outputs recorded from the course's own
# solution. A `✗` names the kind of case that fails before any number.
#
# With $\varepsilon = 10^{-2}$ a central difference is off the true slope by about
# $\varepsilon^2 = 10^{-4}$ (times $g'''(0)/6$) and a one-sided one by about $\varepsilon =
# 10^{-2}$: both far outside the check's tolerance, $10^{-9}$ against the same central
# difference, so the check tells them apart. With `eps` left at its default $10^{-6}$ the case
# is $\sum_i x_i^3$, whose central difference is exact but for $\varepsilon^2$ terms and
# round-off, checked to $10^{-8}$: a one-sided difference, off by about $3\varepsilon\,\sum_i
# x_i u_i^2$, fails there too: this case's directions are long (every $u_i \ge 10$), so that
# term lies far above $10^{-8}$.

# %%
check_contract("lab02", "ex1", directional_derivatives)

# %% [raw]
# # BEGIN QUESTION
# name: ex2

# %% [markdown]
# ## Exercise 2 · The linear layer's three gradients, in the other layout (3 points)
#
# **Goal:** the linear layer's backward in the layout chapter 2 did not print, for inputs
# with any number of leading dimensions.
#
# **You derive:** `grad_X` (..., in), `grad_W` (in, out) and `grad_b` (out,) for
# $Y = X W + b$, each from one entry of $Y$.
#
# **You are given:** `grad_Y` (..., out), the forward's `X` and `W`, and chapter 2's
# derivation for `nn.Linear`'s layout.
#
# Chapter 2 derived the gradients of `nn.Linear`'s $Y = X W^\top + b$, with `W` stored as
# (out, in). JAX's Flax (`nn.Dense`) and many hand-written layers store the weight the other
# way round: $Y = X W + b$ with `W` (in, out), `b` (out,). And a layer inside a transformer
# sees `X` of shape (B, T, in), or any `(..., in)`: every leading index is one more row, and
# `Y` is `(..., out)`. Given `grad_Y` $= \partial L/\partial Y$ `(..., out)`, return
# `(grad_X, grad_W, grad_b)` with the shapes of `X`, `W`, `b` and the dtype of `X` (float32 or
# float64). `X` may be a non-contiguous view (a transpose of another tensor, as the layer
# after an attention head often gets). The arguments come in the
# course's order, `(X, W, grad_Y)`, as in `helpers.numgrad.linear_backward` (which you may
# not call here).
# Derive each from one entry, $Y_{ro} = \sum_i X_{ri} W_{io} + b_o$ for a row $r$, then write
# it as a matrix product or a sum; the shapes leave one answer. A weight or a bias is shared
# by every row, so its gradient adds up over all of them.
#
# <details><summary>Hint 1 of 3 · the idea: which entries each input touches</summary>
#
# In $Y_{ro} = \sum_i X_{ri} W_{io} + b_o$, the entry $X_{ri}$ touches row $r$ of $Y$ only
# (every output $o$), while $W_{io}$ and $b_o$ touch every row. The chain rule sums over what
# each touches. Leading dimensions change nothing: every leading index is one more row $r$.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the rows</summary>
#
# Flatten the leading dimensions into one: `X` as (R, in) and `grad_Y` as (R, out), with R
# the product of the leading sizes (use `reshape`, not `view`: `X` may be non-contiguous).
# Then the layer is a 2-D one with R rows, and the weight's sum over rows is a product that
# sums over R. `grad_X` keeps `X`'s shape, and a matmul with a 2-D right operand works on
# `(..., k)` tensors as they are.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: against autograd, then the odd shapes</summary>
#
# In a scratch cell (delete it before handing in): float64 `X` (2, 3), `W` (3, 4), `b` (4,)
# with `requires_grad=True`, `(grad_Y * (X @ W + b)).sum().backward()`, then compare `.grad`
# with yours. Repeat with a square `W` (a missing transpose shows there), `X` of shape
# (2, 3, 4), a transposed view such as `torch.randn(4, 2, 3).transpose(0, 1)`, and a 1-D `X`
# (in,), where `grad_b` equals `grad_Y`. To check yours against, with the rows flattened:
#
# $$\frac{\partial L}{\partial X} = \frac{\partial L}{\partial Y} W^\top, \qquad
# \frac{\partial L}{\partial W} = X_{\text{rows}}^\top \Big(\frac{\partial L}{\partial
# Y}\Big)_{\text{rows}}, \qquad \frac{\partial L}{\partial b} = \sum_{r}
# \Big(\frac{\partial L}{\partial Y}\Big)_{r,:}.$$
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
# # END QUESTION

# %% [markdown]
# **Self-check 2** compares your function with reference outputs recorded from the course's own
# solution.

# %%
check_contract("lab02", "ex2", dense_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex3

# %% [markdown]
# ## Exercise 3 · A value used twice (2 points)
#
# **Goal:** when a value feeds two branches, its gradient is the **sum** of what each branch
# sends back: accumulate with `+=`, never overwrite.
#
# **You derive:** `grad_X` (B, D), the sum of the two branches' shares, and `grad_W` (D, D),
# through the tanh.
#
# **You are given:** `grad_Y` (B, D), `X`, `W` (nothing saved: recompute the tanh from them),
# and your `dense_backward` of exercise 2 (chapter 2's `linear_backward` is the same idea in
# `nn.Linear`'s layout, and not allowed here: the branch through $W$ is yours to derive).
#
# A residual block: $Y = \tanh(X W^\top) + X$ with `X` (B, D) for any $B \ge 1$ and a square
# `W` (D, D), any values (0 included). `X` is
# used twice, inside the layer and on the skip connection. Given `grad_Y` (B, D), return
# `(grad_X, grad_W)`, by hand (no autograd). Write the linear part inline or call your
# `dense_backward` of Exercise 2 (the hidden tests put the course's there, so a mistake in
# Exercise 2 costs points once).
# Leave the arguments unchanged: `grad_X = grad_Y` then `grad_X += …` would write into
# `grad_Y` (the two names are one tensor); start from a new tensor.
#
# <details><summary>Hint 1 of 3 · the idea: name the intermediates, then two branches</summary>
#
# Name $H = X W^\top$ (B, D) and $T = \tanh(H)$, so $Y = T + X$. Walk back
# $Y \to T \to H \to (X, W)$ for the layer, and $Y \to X$ straight along the skip. `X` gets one
# share from each branch, and its gradient is their sum.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: through the tanh</summary>
#
# $\frac{d}{dh}\tanh h = 1 - \tanh^2 h$, entry by entry: multiply `grad_Y` by it, with $T$
# recomputed from `X` and `W`, to get $\partial L/\partial H$. From $H$ on it is a linear layer
# in `nn.Linear`'s layout (weight (out, in), used transposed). To reuse `dense_backward`,
# whose weight is (in, out), pass it `W.T` and transpose the weight gradient it returns;
# there is no bias, so ignore its `grad_b`.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: W = 0, then autograd</summary>
#
# With `W = 0`: $T = 0$ and $\tanh' = 1$, so `grad_X` is exactly `grad_Y` (the layer's share
# is $\partial L/\partial H \cdot 0$) and `grad_W` is $G_Y^\top X$ (with $G_Y$ = `grad_Y`).
# Then, in a scratch cell (delete it before handing in), take float64 `X` (2, 3) and `W`
# (3, 3) with `requires_grad=True`, compute `(grad_Y * (torch.tanh(X @ W.T) + X)).sum()`,
# call `.backward()` and compare; also B = 1 and B > D. Keep `grad_Y.clone()` and check
# with `torch.equal` that `grad_Y` did not change. To check yours against, with
# $G_H = G_Y \odot (1 - T^2)$:
#
# $$\frac{\partial L}{\partial X} = G_H W + G_Y, \qquad \frac{\partial L}{\partial W} =
# G_H^\top X.$$
#
# </details>

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
# # END QUESTION

# %% [markdown]
# **Self-check 3** compares your function with reference outputs recorded from the course's own
# solution.

# %%
check_contract("lab02", "ex3", residual_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex4

# %% [markdown]
# ## Exercise 4 · A tiled tensor's backward (3 points)
#
# **Goal:** a tensor tiled in forward was *copied*, and a copy's backward is a sum: add up
# what every copy receives, and return it in the input's own shape.
#
# **You derive:** which entries of `grad` are copies of the same entry of `x`, and the
# reshapes and sums that add them up into the shape `shape`.
#
# **You are given:** `grad` (the shape of `y`), `shape`, `reps`, the layout of `repeat`
# described below, and chapter 2's rule for a value used many times.
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
# `x` (`shape` is a tuple or a `torch.Size`, `()` for a 0-dim `x`; `reps` a tuple of ints
# ≥ 1), **by hand**: reshapes and sums, no autograd (the checks refuse `backward` and
# `torch.autograd.grad` here). Chapter 2 showed the rule for broadcasting (a value used many
# times: sum what each use sends back); work out which entries of `grad` are copies of the
# same entry of `x`.
#
# <details><summary>Hint 1 of 3 · the idea: a copy's backward is a sum</summary>
#
# Each entry of `x` was copied many times, and $\partial L/\partial x$ at that entry is the sum
# of `grad` over all its copies. Work one dimension at a time, and first line the shapes up
# the way `repeat` does: pad `shape` on the left with 1s to the length of `reps`.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: one dimension, split in two</summary>
#
# A dimension of size $r \cdot n$ holds entry $i$ of tile $t$ at $t \cdot n + i$. Reshape it
# into two dimensions $(r, n)$, tile first: the first says which tile, the second where in the
# tile, so all copies of one entry share the second index. (The order $(n, r)$ would be
# `repeat_interleave`'s layout.) What is left is to sum over the tile dimensions and reshape
# to `shape`, dropping the padded 1s.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: against autograd in a scratch cell</summary>
#
# In a scratch cell (delete it before handing in; the graded function may not call autograd):
# `x = torch.randn(shape, dtype=torch.float64, requires_grad=True)`,
# `x.repeat(*reps).backward(g)` for a random `g`, and compare `x.grad` with
# `unrepeat(g, shape, reps)`. Try `shape` (3, 2) with `reps` (4, 2, 3), reps of 1, a dim of
# size 1 repeated, `shape` `()` with `reps` (2, 3). A `grad` of all ones must give a tensor of
# `shape` filled with the number of copies, the product of `reps`. To check yours against, in
# the padded shape:
#
# $$\frac{\partial L}{\partial x_{i_1 \dots i_d}} = \sum_{t_1, \dots, t_d}
# G_{t_1 n_1 + i_1,\; \dots,\; t_d n_d + i_d}.$$
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
# # END QUESTION

# %% [markdown]
# **Self-check 4** compares your function with reference outputs recorded from the course's own
# solution.

# %%
check_contract("lab02", "ex4", unrepeat)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the function names: the grader calls `directional_derivatives`,
# `dense_backward`, `residual_backward` and `unrepeat`.
