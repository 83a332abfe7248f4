# %% [markdown]
# # Lab 4 · Custom autograd Functions: softmax, RMSNorm, cross-entropy
#
# Chapter 4 wrote `torch.autograd.Function`s with a hand-written backward and checked them
# with `gradcheck`. Here you write three of the most used ones yourself, in the modern form
# (`forward` without `ctx`, plus `setup_context`).
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
# `...` with your code, keep the names and signatures, then run the **self-check** cell right
# below. It runs your answer on one recorded case of each promise the exercise makes (a shape,
# a dtype, a flag's value, an edge value) and answers in one line: `✓` matches the course's
# reference on all of them, `✗` names the kinds of case that fail before any number, then what
# is off in the first one, or `·` not implemented yet. A `Function` is judged by what autograd
# gets from it: its output, the gradients of its inputs, the number of tensors it saves for
# backward where the exercise says what to save, and, in the self-check, whether its backward
# left the incoming gradient unchanged (the hidden tests hand your backward a copy of it, so
# they cannot see a write into it: the self-check's ✗ is the one warning). Your instructor grades
# the notebook you hand in with hidden tests that run the same kinds of case on other values.
#
# **By hand** means derived: a graded backward may not call autograd, and an estimate by finite
# differences (the forward run again for each input entry) does not count either. One kind of
# case of each backward is large, and there the self-check and the hidden tests count the tensor
# entries your code writes, forward and backward: at most 10 × what the course's backward
# writes, room enough for any derived backward on rows and matrices (loops over rows or samples and float64 copies included; a loop over every single entry may not fit).
# Values read out of tensors into Python or NumPy there (`.item()`, `float()`, `.tolist()`,
# `.numpy()`, printing) count too, at most 8 (a count or a norm, not a tensor), and comparisons
# read out (`if h[i] > 0`) at most two per entry: work done outside tensors cannot be measured. In
# exercises 1 and 2 that case also counts the entries `exp`, `log`, `sqrt`, softmax and such compute:
# none at all in exercise 1 (a backward from `P` needs none), in exercise 2 at most 2 × what the
# course's code computes. A difference of the forward along one direction is not a backward either. A backward over any of these limits scores 0 for its exercise, as one that calls autograd does;
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
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from helpers.labcontract import check_contract

# %% [raw]
# # BEGIN QUESTION
# name: ex1

# %% [markdown]
# ## Exercise 1 · Softmax's backward, without the Jacobian (2 points)
#
# **Goal:** the Jacobian of $p = \mathrm{softmax}(z)$ is an $n \times n$ matrix per row;
# backward needs only its product with the upstream gradient, $J^\top g$, which costs $O(n)$.
#
# **You derive:** $\partial p_i/\partial z_j$, and from it $J^\top g$ for one row, simplified
# until no $n \times n$ matrix is left, then applied to every row of `(..., n)`.
#
# **You are given:** the forward's output `P` and `grad_P` $= \partial L/\partial P$; `Z` is
# not needed.
#
# Write `softmax_backward(P, grad_P)` for `P = softmax(Z, dim=-1)` and
# `grad_P` $= \partial L/\partial P$ of the same shape: return `grad_Z` $= \partial L/\partial Z$,
# row by row along the last dim, in the shape and dtype of `P`. `P` may have any shape
# `(..., n)`: 1-D `(n,)`, 2-D `(R, n)`, or 3 or more dims, where every leading index is one more
# row; float32 or float64. Derive it first: write $\partial p_i/\partial z_j$ (two cases,
# $i = j$ and $i \ne j$), put it into $J$, and simplify $J^\top g$ until no $n \times n$ matrix
# is left. Then ask yourself what a `grad_P` that is the same number along a row should give
# (softmax does not change when a constant is added to a row of `Z`). Do not build $J$, and
# leave `P` and `grad_P` unchanged.
#
# <details><summary>Hint 1 of 3 · the idea: one row, two cases</summary>
#
# Rows do not mix: each row of `P` has its own $n \times n$ Jacobian, and every leading index
# is one more row. For one row, differentiate $p_i = e^{z_i} / \sum_k e^{z_k}$ with the quotient
# rule, once for $j = i$ (the numerator and the sum move) and once for $j \ne i$ (only the sum
# moves). Write both with $p$ alone.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the Jacobian, then one term at a time</summary>
#
# $\partial p_i/\partial z_j = p_i(\delta_{ij} - p_j)$, so $J = \mathrm{diag}(p) - p\,p^\top$,
# which is symmetric. Multiply it by $g$ one term at a time: $\mathrm{diag}(p)\,g$ is an
# entry-by-entry product, and in $p\,p^\top g$ the part $p^\top g$ is one number per row.
# Keep that number in a `(..., 1)` shape so that it broadcasts back along its row.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: against autograd, and a constant row</summary>
#
# In a scratch cell (delete it before handing in): float64 `Z` (2, 3) with
# `requires_grad=True`, `P = torch.softmax(Z, -1)`, a random `G`, then
# `torch.autograd.grad(P, Z, G)[0]` must equal `softmax_backward(P.detach(), G)`. Repeat for
# a 1-D and a 3-D `Z`. A `grad_P` that is the same number along a row must give a zero row,
# up to round-off (softmax ignores a constant added to a row of `Z`), and so must n = 1.
# Check that `P` and `grad_P` did not change. To check yours against, per row:
#
# $$J^\top g = p \odot \big(g - \langle g, p\rangle\big),$$
#
# the inner product taken along the last dim (`keepdim=True`).
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def softmax_backward(P, grad_P):
    """∂L/∂Z (P's shape and dtype) for P = softmax(Z, dim=-1), given grad_P = ∂L/∂P."""
    # BEGIN SOLUTION
    inner = (grad_P * P).sum(-1, keepdim=True)  # (..., 1): one ⟨g, p⟩ per row
    return P * (grad_P - inner)  # (..., n)
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** compares your function with reference outputs recorded from the course's own
# solution.
#
# Where n = 1024, $J$ would take 8 MiB: the check watches the tensors your function makes, and
# the grader gives the call 2 MiB.

# %%
check_contract("lab04", "ex1", softmax_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex2

# %% [markdown]
# ## Exercise 2 · A `Softmax` Function that saves only its output (2 points)
#
# **Goal:** the anatomy of a modern `autograd.Function`: `forward` computes (no `ctx`),
# `setup_context` saves what backward needs, `backward` turns $\partial L/\partial\,\text{output}$ into $\partial L/\partial\,\text{input}$.
#
# **You derive:** why subtracting each row's largest logit leaves softmax unchanged and what
# it avoids, and what the three methods each do with `Z`, `P` and `grad_P`.
#
# **You are given:** exercise 1's product (your `softmax_backward`, or the course's in the
# hidden tests), `ctx.save_for_backward` / `ctx.saved_tensors`, and `once_differentiable`.
#
# Fill in `Softmax` (softmax over the last dim, one input `Z` of any shape `(..., n)`, 1-D to
# 4-D, float32 or float64), used as `P = Softmax.apply(Z)`:
# * `forward(Z)`: the **stable** softmax along the last dim, which stays finite on a row of
#   logits like ±1000 (work out why subtracting each row's largest logit first changes
#   nothing mathematically, and what it avoids);
# * `setup_context(ctx, inputs, output)`: save **only** the output `P` (with
#   `ctx.save_for_backward`): exercise 1 showed that backward needs nothing else, and `Z` would
#   cost a second tensor of the same size. The self-check counts the tensors you save: one;
# * `backward(ctx, grad_P)`: unpack `ctx.saved_tensors` and return $\partial L/\partial Z$, the product you derived
#   in exercise 1: call your `softmax_backward`, or write its lines again. Either way this
#   exercise is graded on its own: its hidden tests put the course's `softmax_backward` in place
#   of yours, so a mistake in exercise 1 costs points there only. Never write into `grad_P`:
#   autograd may hand the same tensor to other nodes.
#
# <details><summary>Hint 1 of 3 · the idea: a constant per row cancels</summary>
#
# Add a number $c$ to every logit of a row: each $e^{z_i}$ gets the factor $e^c$, in the
# numerator and in every term of the sum, so it cancels. Choose $c$ per row so that no
# exponent is positive: nothing overflows, and the largest term is exactly 1, so the sum is
# never 0.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: who sees what</summary>
#
# `forward(Z)` sees only `Z`: the row maximum along the last dim, kept as `(..., 1)` so that
# it broadcasts (`amax` gives only the values; `max` with a `dim` also gives indices), then
# exponentials over their row sum. `setup_context(ctx, inputs, output)` receives `P` as
# `output`: that is the one tensor to save. `backward` unpacks it and returns one gradient, for
# the one input, as a new tensor: no in-place operation on `grad_P`.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: ±1000, gradcheck, one saved tensor</summary>
#
# In a scratch cell (delete it before handing in): a float64 `Z` with a row
# `[1000., -1000., 0.]` must give a finite `P` whose rows sum to 1, equal to
# `torch.softmax(Z, -1)`. `torch.autograd.gradcheck(Softmax.apply, (Z,))` on a small float64
# `Z` (2, 3) with `requires_grad=True` must return `True`. `len(P.grad_fn.saved_tensors)` must
# be 1; keep `G.clone()` and check with `torch.equal` that `P.backward(G)` left `G` unchanged.
# To check your forward against, with $m$ the row's largest logit:
#
# $$p_i = \frac{e^{z_i - m}}{\sum_c e^{z_c - m}}.$$
#
# </details>

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
        inner = (grad_P * P).sum(-1, keepdim=True)  # (..., 1)
        return P * (grad_P - inner)  # (..., n)
        # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** runs `Softmax.apply` and autograd and compares with recorded reference
# outputs.
#
# For each case it compares `P`, `grad_Z` (for a random `grad_P`) and whether `grad_P` was left
# unchanged; one case of its own counts the tensors saved for backward (1).

# %%
check_contract("lab04", "ex2", Softmax)

# %% [raw]
# # BEGIN QUESTION
# name: ex3

# %% [markdown]
# ## Exercise 3 · RMSNorm (3 points)
#
# **Goal:** $x$ reaches the output two ways, directly and through its root mean square; the
# gradient is the sum over both. RMSNorm is LayerNorm without the mean and without $\beta$
# (Llama and most recent language models use it); chapter 4's method, one path at a time,
# derives it.
#
# **You derive:** $\partial L/\partial x$ `(..., D)`, the sum of the direct path and the path
# through $r$, and $\partial L/\partial \gamma$ `(D,)`, both written with $\hat x$ and $r$.
#
# **You are given:** the forward below, `grad_y` `(..., D)`, the saved `x` and `weight`, and
# `eps` on `ctx`.
#
# Over the last dim (size $D$): $r = \sqrt{\mathrm{mean}(x^2) + \varepsilon}$, $\hat x = x / r$,
# $y = \gamma \odot \hat x$, with `weight` $\gamma$ of shape `(D,)`. Derive
# $\partial L/\partial x$ and $\partial L/\partial \gamma$ on paper first: follow $x$ along its
# two paths (directly into $\hat x$, and through $r$), add them, and write the result with
# $\hat x$ and $r$.
#
# Fill in `RMSNorm`, used as `y = RMSNorm.apply(x, weight, eps)`:
# * `x` has any shape `(..., D)`: 1-D `(D,)`, 2-D, 3-D `(B, N, D)`, 4-D; every leading index is
#   one more row. float32 or float64 (`weight` in the same dtype);
# * `eps` is a float the caller chooses (1e-5 is usual, but any value, 0.05 or 2.0 as well):
#   use the one given, in forward and in backward. A row of zeros is allowed ($r = \sqrt{\varepsilon}$);
#   its gradients must stay finite;
# * `setup_context`: save exactly `x` and `weight` (two tensors; the self-check counts them),
#   and keep `eps` on `ctx` (a float, not a tensor);
# * `backward(ctx, grad_y)` recomputes $r$ from `x` (one cheap reduction) and returns
#   `(grad_x, grad_weight, None)`, each gated on `ctx.needs_input_grad`: a caller may freeze
#   `weight` (only `x` needs a gradient) or hold `x` constant (only `weight` does), and the
#   other gradient must still be right. Never write into `grad_y`.
#
# <details><summary>Hint 1 of 4 · the idea: two paths from x, one row at a time</summary>
#
# Rows are independent; within a row, $x_i$ reaches $\hat x_i$ directly and reaches *every*
# $\hat x_j$ through $r$. First the gradient reaching $\hat x$: $y = \gamma \odot \hat x$ is
# entry by entry, so call it $g = \partial L/\partial y \odot \gamma$. Then the chain rule
# through $\hat x_j = x_j / r$, with $r$ depending on all of the row's $x$. $\gamma$ is shared
# by every row: its gradient adds up over all of them.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the hidden path's slope</summary>
#
# $\partial r/\partial x_i = x_i/(D r)$. The direct path gives $g_i / r$. The path through
# $r$ adds, for each $j$, $g_j$ times $\partial (x_j / r)/\partial r = -x_j / r^2$, times
# $\partial r / \partial x_i$: a sum over $j$, one number per row. Write each $x / r$ you meet
# as $\hat x$ and see the sum become a mean.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the weight, the flags and eps</summary>
#
# $y_j = \gamma_j \hat x_j$, so each row sends $\gamma_j$ the slope $\hat x_j$ times its
# $\partial L/\partial y_j$; sum that over every leading index (flatten them into one row
# dimension, as in lab 2). Compute each gradient only when `ctx.needs_input_grad` asks for it
# and return `None` for the other; recompute $r$ with `ctx.eps`, the value the caller gave.
# A row of zeros has $r = \sqrt{\varepsilon} > 0$, so dividing by $r$ stays finite.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: gradcheck, the flags, a zero row</summary>
#
# In a scratch cell (delete it before handing in): float64 `x` (2, 3) and `weight` (3,) with
# `requires_grad=True`, `eps = 0.05`, then
# `torch.autograd.gradcheck(lambda x, w: RMSNorm.apply(x, w, 0.05), (x, weight))` must be
# `True`. Compare with autograd through `F.rms_norm(x, (3,), weight, 0.05)` (here, in the
# scratch cell: your `RMSNorm` may not call it, forward included) for a 3-D `x`,
# with a row of zeros, and with `weight.requires_grad_(False)` (then `weight.grad` stays
# `None`). Call `y.backward(G)` with a random `G`, keep `G.clone()` and check with
# `torch.equal` that `G` did not change. To check yours against:
#
# $$\frac{\partial L}{\partial x} = \frac{1}{r}\Big(g - \hat x\,\mathrm{mean}(g \odot \hat x)
# \Big), \qquad \frac{\partial L}{\partial \gamma} = \sum_{\text{rows}}
# \frac{\partial L}{\partial y} \odot \hat x$$
#
# (the mean along the last dim, `keepdim=True`; "rows" = every leading dim.)
#
# </details>

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
# # END QUESTION

# %% [markdown]
# **Self-check 3** runs `RMSNorm.apply` and autograd and compares with recorded reference
# outputs.
#
# For each case it compares `y`, `grad_x`, `grad_weight` (a gradient not asked for must be
# `None`) and whether `grad_y` was left unchanged, and one case of its own counts the tensors
# saved for backward (2); a ✗ names a factor such as $1/\text{rows}$ or $\sqrt D$, or a missing
# path through $r$, when your numbers show one.

# %%
check_contract("lab04", "ex3", RMSNorm)

# %% [raw]
# # BEGIN QUESTION
# name: ex4

# %% [markdown]
# ## Exercise 4 · Cross-entropy from logits, with `ignore_index` (3 points)
#
# **Goal:** fuse log-softmax and the negative log-likelihood: the forward never overflows and
# the backward, once derived, is one short line per row.
#
# **You derive:** $\partial L/\partial z$ (R, C) for every row, kept and ignored, with the
# $1/N$ and `grad_L`, and a forward that leaves ignored rows out safely.
#
# **You are given:** the loss $L$ below, `torch.logsumexp`, `gather` / `F.one_hot`, and
# `grad_L` (0-dim) in backward.
#
# Fill in `CrossEntropy`, used as `L = CrossEntropy.apply(logits, target, ignore_index)`, for
# `logits` (R, C) with any R ≥ 1 (float32 or float64), an int64 `target` (R,) and an int
# `ignore_index`: row $r$ is **kept** unless `target[r] == ignore_index`. The caller chooses
# `ignore_index`: PyTorch's default −100, or −1, or even a class index such as 2 (then no
# kept row has that target); $N$ = number of kept rows (at least one);
# $L = \frac{1}{N}\sum_{\text{kept } r} \big(\mathrm{lse}(z_r) - z_{r, t_r}\big)$ with
# $\mathrm{lse}(z) = m + \log\sum_c e^{z_c - m}$, $m = \max_c z_c$ (or `torch.logsumexp`).
# Return $L$ as a 0-dim tensor in the dtype of `logits`; rows of logits like ±1000 must stay
# finite. Backward: derive $\partial L/\partial z_r$ (differentiate $\mathrm{lse}$, then the
# picked logit, and do not forget the $1/N$ and the upstream $\partial L/\partial L$ =
# `grad_L`, which need not be 1: a caller may scale the loss); it must be exactly **0** on
# ignored rows; `target` and `ignore_index` get `None`. Never write into `grad_L`.
#
# <details><summary>Hint 1 of 4 · the idea: each row's term, scaled</summary>
#
# $L$ is $1/N$ times a sum of per-row terms, and row $r$'s term depends on $z_r$ only. So
# $\partial L/\partial z_r$ is `grad_L` $/N$ times the gradient of that one term, and exactly 0
# on an ignored row, which is not in $L$ at all. Each term has two pieces: $\mathrm{lse}(z_r)$
# and the picked logit $z_{r, t_r}$.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the two pieces of one row</summary>
#
# Differentiate $\log \sum_c e^{z_c}$ with respect to $z_c$: the chain rule through the log,
# then through the sum (the shift by $m$ changes nothing, as in exercise 2's forward). You met
# the resulting vector in exercises 1 and 2. The picked logit $z_{r, t_r}$ has slope 1 in
# column $t_r$ and 0 in every other column.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the ignored rows</summary>
#
# An ignored row's target (e.g. −100) is no valid index; replace it by 0 before
# `gather`/`one_hot`, compute as if every row were kept, then multiply by a 0/1 mask of the
# kept rows (in forward and in backward). Build the mask by comparing `target` with the
# `ignore_index` you were given, never with a fixed number. $N$ is the mask's sum.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: against F.cross_entropy</summary>
#
# In a scratch cell (delete it before handing in): float64 logits (3, 4) with
# `requires_grad=True` and `target = torch.tensor([1, -100, 3])`; your `L` must equal
# `F.cross_entropy(logits, target, ignore_index=-100)`, and after
# `L.backward(torch.tensor(2.5, dtype=torch.float64))` your gradient must equal autograd's
# through `F.cross_entropy` with the same `2.5`. The ignored row must be exactly 0
# (`torch.equal` with zeros), and each kept row's gradient sums to 0 up to round-off. Try a
# row of ±1000 logits, `ignore_index = 2` with no kept target 2, and a single row. To check
# yours against, on kept rows, with $g_L$ = `grad_L`:
#
# $$\frac{\partial L}{\partial z_r} = \frac{g_L}{N}\big(\mathrm{softmax}(z_r) -
# \text{one-hot}(t_r)\big).$$
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
# # END QUESTION

# %% [markdown]
# **Self-check 4** runs `CrossEntropy.apply` and autograd and compares with recorded reference
# outputs.
#
# For each case it compares `L`, `grad_logits` and whether `grad_L` was left unchanged; a ✗
# names a factor such as $N$ or $N/R$ when your numbers show one.

# %%
check_contract("lab04", "ex4", CrossEntropy)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `softmax_backward`, `Softmax`, `RMSNorm`
# and `CrossEntropy`.
