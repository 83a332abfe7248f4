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
# cell right below. It compares your function with reference outputs recorded from the course's
# own solution, on one case of each promise the prompt makes (each case with its own sizes and
# its own `s`), and answers in one line: `✓` matches, `✗` names the kinds of case that fail
# before any number (then what is wrong), or `·` not implemented yet. Your instructor grades the
# notebook you hand in with hidden tests that call the same functions on other cases of the same
# kinds.
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
from torch.autograd.function import once_differentiable

from helpers.device import rand
from helpers.labcontract import check_contract

# %% [raw]
# # BEGIN QUESTION
# name: ex1

# %% [markdown]
# ## Exercise 1 · $\partial L/\partial A$ and $\partial L/\partial B$ from $\partial L/\partial W'$ (2 points)
#
# **Goal:** the product rule on $W' = W + s\,BA$: for $Y = PQ$, $dP = dY\,Q^\top$ and
# $dQ = P^\top dY$.
#
# **You derive:** $\partial L/\partial A$ (r, in) and $\partial L/\partial B$ (out, r) from
# $\partial L/\partial W'$, with the scale $s$ in the right place.
#
# **You are given:** `grad_Wp` $= \partial L/\partial W'$, `A`, `B`, `s`, and the product rule
# above.
#
# Write `grads_from_W_prime(grad_Wp, A, B, s)`: given `grad_Wp` $= \partial L/\partial W'$
# (out, in), `A` (r, in), `B` (out, r) and the float `s` (use the one passed: each call has its
# own, 1 included), return `(grad_A, grad_B)`, of shapes (r, in) and (out, r), in that order
# and in the inputs' dtype (float32 or float64). Any sizes: out, in and r all different, a
# rank-1 adapter (r = 1), a square $W'$ (out = in, where a transposed answer has the right shape
# and the wrong values), by hand (no autograd). Derive them first: $W'$ depends on $A$ and $B$
# only through the product $BA$, scaled by $s$; check that each gradient has the shape of what
# it is the gradient of.
# (This is the route of chapter 8, section 1: correct, but it needs the out × in
# $\partial L/\partial W'$, exactly the size of the weight we froze.)
#
# <details><summary>Hint 1 of 3 · the idea: W is a constant, sBA a product</summary>
#
# $W$ is frozen and does not depend on $A$ or $B$: only $s\,BA$ matters, and
# $\partial L/\partial(s\,BA) = \partial L/\partial W'$. The product rule above has two factors:
# decide which of $B$, $A$ plays $P$ and which $Q$, and which factor the scalar $s$ can ride on.
# Write the shapes under each factor, (out, r) (r, in), and let them tell you which side a
# transpose goes on.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: one entry</summary>
#
# $W'_{ij} = W_{ij} + s \sum_k B_{ik} A_{kj}$, so $\partial W'_{ij}/\partial A_{kj} = s\,B_{ik}$, and
# $A_{kj}$ appears in every row $i$ of column $j$: $\partial L/\partial A_{kj}$ is a sum over $i$.
# Read that sum as a matrix product of shape (r, out) (out, in). Do the same for $B_{ik}$,
# which appears in every column $j$ of row $i$.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: autograd in a scratch cell</summary>
#
# In a scratch cell (delete it before handing in), make float64 `W` (3, 5), `A` (2, 5) and
# `B` (3, 2), the last two with `requires_grad=True`, `Wp = W + s * B @ A`, and compare
# `torch.autograd.grad(Wp, (A, B), grad_Wp)` with yours. Try r = 1, a square $W'$ (out = in,
# where a transposed answer still has the right shape), and both $s = 1$ and $s = 2$ (a scale
# applied twice, or not at all, shows only when $s \ne 1$). The formulas, to check yours against:
#
# $$\frac{\partial L}{\partial A} = s\,B^\top\,\frac{\partial L}{\partial W'}\ \ (r \times \text{in}),\qquad
# \frac{\partial L}{\partial B} = s\,\frac{\partial L}{\partial W'}\,A^\top\ \ (\text{out} \times r).$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def grads_from_W_prime(grad_Wp, A, B, s):
    """(grad_A, grad_B) for W' = W + s·BA, given grad_Wp = ∂L/∂W' (out, in)."""
    # BEGIN SOLUTION
    grad_A = s * (B.T @ grad_Wp)  # (r, out) @ (out, in) -> (r, in)
    grad_B = s * (grad_Wp @ A.T)  # (out, in) @ (in, r) -> (out, r)
    return grad_A, grad_B
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** compares your function with reference outputs recorded from autograd through
# $W + s\,BA$ with a random $\partial L/\partial W'$.

# %%
check_contract("lab08", "ex1", grads_from_W_prime)

# %% [raw]
# # BEGIN QUESTION
# name: ex2

# %% [markdown]
# ## Exercise 2 · The cheap route: never form $W'$ or $\partial L/\partial W'$ (2 points)
#
# **Goal:** regroup the products so that the only new activation is the r-dimensional
# $xA^\top$. With $g = \partial L/\partial y$ (R, out) and $x$ (R, in), derive
# $\partial L/\partial x$ (R, in), $\partial L/\partial A$ (r, in) and $\partial L/\partial B$
# (out, r) from $y = xW^\top + s\,(xA^\top)B^\top$, without ever multiplying two factors whose
# product is out × in.
#
# **You derive:** the three gradients, each regrouped so that every matrix product has r or
# R on one side, and which of them share the product $gB$.
#
# **You are given:** `g` $= \partial L/\partial y$, `x`, `W`, `A`, `B`, `s`, `needs`, exercise 1's
# route and chapter 8's $\partial L/\partial W' = g^\top x$.
#
# Write `lora_backward(g, x, W, A, B, s, needs=(True, True, True))` returning
# `(grad_x, grad_A, grad_B)` for 2-D `g` and `x` (R = 1 row included; r = 1 included; float32
# or float64; `s` the float passed). `needs` says which of the three to compute: left at its
# default, all three; given, any of its 8 combinations, `(False, False, False)` included. Return
# `None` for a gradient not asked for, **without computing it** (exercise 5 uses this): no
# matrix product whose result has the shape of a gradient nobody asked for. No product may
# produce an out × in matrix: no `B @ A`, no `g.T @ x`. The self-check watches the shapes of
# the matrix products your function forms (a hidden test also counts its multiply–adds).
# Compute `g @ B` once if two gradients need it.
#
# <details><summary>Hint 1 of 4 · the idea: same answer, other parentheses</summary>
#
# Chapter 8's $\partial L/\partial W' = g^\top x$ plugged into exercise 1 gives correct
# formulas with the out × in matrix in them; matrix products are associative, so move the
# parentheses until every product has $r$ (or R) on one side. $\partial L/\partial x$ has two
# paths: through $W$ and through the adapter.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: one gradient regrouped</summary>
#
# Exercise 1 with $g^\top x$ gives $\partial L/\partial B = s\,(g^\top x)\,A^\top$: the
# parentheses make (out, R)(R, in) = out × in first. Grouped the other way, the first product
# is $xA^\top$, (R, in)(in, r) = (R, r), the r-dimensional activation of the goal. Do the same
# for $\partial L/\partial A$; its first product comes out (R, r) too.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: needs, and the shared product</summary>
#
# The adapter path of $\partial L/\partial x$ and $\partial L/\partial A$ both start from the same
# (R, r) product of `g` and `B`: compute it once, and only if one of those two is asked for.
# Start all three results at `None` and fill in each only under its own flag; with
# `(False, False, False)` no product is formed at all.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: autograd in a scratch cell</summary>
#
# In a scratch cell (delete it before handing in), make small float64 `x` (4, 5), `W`
# (3, 5), `A` (2, 5), `B` (3, 2) with `requires_grad=True`, `y = x @ (W + s * B @ A).T` (a
# scratch cell may form out × in), and compare `torch.autograd.grad(y, (x, A, B), g)` with
# yours. Loop over the 8 `needs` with `itertools.product([False, True], repeat=3)` and check
# that `None` stands exactly where a flag is False. Try R = 1 and r = 1. The formulas, to
# check yours against:
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
    """(grad_x, grad_A, grad_B) for y = x Wᵀ + s·(x Aᵀ) Bᵀ, given g = ∂L/∂y; None where
    needs is False."""
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
# # END QUESTION

# %% [markdown]
# **Self-check 2** compares your function with reference outputs recorded from autograd through
# $y = x\,(W + s\,BA)^\top$.
#
# In the two cases with out = 2¹⁷ or in = 2¹⁷, an out × in matrix or a gradient nobody asked for
# would take 3 MiB or more, over the call's memory budget of 2 MiB. Besides the three gradients
# (`"None"` where not asked for) the check reports the matrix products your function formed,
# watched while it runs: whether one was out × in, and whether one had the shape of a gradient
# nobody asked for.

# %%
check_contract("lab08", "ex2", lora_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex3

# %% [markdown]
# ## Exercise 3 · Initialisation: start exactly at the base (2 points)
#
# **Goal:** with $B = 0$ the product $BA$ is $0$, so the adapted layer starts equal to the base,
# and at step 0 $\partial L/\partial A = 0$ while $\partial L/\partial B \ne 0$: $B$ moves first.
#
# **You derive:** why this initialisation gives the base layer's output exactly and a zero
# $\partial L/\partial A$, and the shapes, dtype and device of `A` and `B` from `W`.
#
# **You are given:** the recipe for `A` below (with `helpers.device.rand`, imported), and
# exercise 2's gradients.
#
# Write `init_adapter(W, r, seed)` returning `(A, B)` as the reference implementations do, for
# any `W` (out, in) (square or not) in float32 or float64, any rank `r` (1 included) and the
# `seed` passed (each call has its own):
# * `A` (r, in): Kaiming-uniform with $a=\sqrt5$, i.e. uniform on $[-1/\sqrt{\text{in}},
#   1/\sqrt{\text{in}})$. Draw it as
#   `(2 * rand(r, d_in, seed=seed, dtype=torch.float64) - 1) / math.sqrt(d_in)` (`rand` is
#   `helpers.device.rand`, imported above), then convert it to `W`'s dtype and device;
# * `B` (out, r): zeros, `W`'s dtype and device.
#
# With them, one forward of the adapted layer gives the base layer's output bit for bit, and one
# backward gives $\partial L/\partial A = 0$ exactly and $\partial L/\partial B \ne 0$.
#
# <details><summary>Hint 1 of 3 · the idea: which factor is zero</summary>
#
# The adapter adds $s\,(xA^\top)B^\top$. For it to be exactly 0 whatever $x$ and $A$, one factor
# must be exactly 0: the one whose zero also stops the gradient of the other (look at which
# factor every path to $A$ runs through, in exercise 2's gradients). The other one must be
# random, or both would stay at 0.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: sizes and dtype from W</summary>
#
# `W.shape` is (out, in): `A` takes `in` (its columns), `B` takes `out` (its rows). Draw `A`
# in float64 with the recipe, so the same `seed` gives the same numbers whatever `W`'s dtype,
# and only then convert it with `.to(dtype=..., device=...)` to `W`'s. Make `B` with
# `torch.zeros` directly in `W`'s dtype and on its device.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: the base layer, bit for bit</summary>
#
# In a scratch cell (delete it before handing in), with a float32 `W` (3, 5), `x` (4, 5) and
# `A, B = init_adapter(W, 2, seed=0)`: `torch.equal(x @ W.T, x @ W.T + s * (x @ A.T) @ B.T)`
# is True; `A.abs().max()` is at most $1/\sqrt 5$; shapes (2, 5) and (3, 2), dtype float32. Then
# with `A` and `B` made leaves that require grad and any loss of the adapted output,
# `A.grad` is exactly 0 and `B.grad` is not. Try r = 1 and a square `W`. Exercise 2's
# gradients say why, to check your reasoning against:
#
# $$\frac{\partial L}{\partial A} = s\,(g\,\underbrace{B}_{=\,0})^\top x = 0,\qquad
# \frac{\partial L}{\partial B} = s\,g^\top(xA^\top) \ne 0.$$
#
# </details>

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
# # END QUESTION

# %% [markdown]
# **Self-check 3** compares your function with reference outputs recorded from
# `helpers.lora.LoRALinear`'s initialisation, drawn with each case's seed.

# %%
check_contract("lab08", "ex3", init_adapter)

# %% [raw]
# # BEGIN QUESTION
# name: ex4

# %% [markdown]
# ## Exercise 4 · Merge and unmerge (2 points)
#
# **Goal:** for inference, fold the adapter into the weight once, $W \leftarrow W + s\,BA$: the
# layer is a plain `nn.Linear` again (no extra matmuls); unmerging subtracts it back, to
# round-off.
#
# **You derive:** how to change a layer's weight in place, with autograd recording nothing,
# for the update given here.
#
# **You are given:** the layer, `A`, `B`, `s`, and the update $W \leftarrow W \pm s\,BA$ itself.
#
# Write `merge_(layer, A, B, s)` and `unmerge_(layer, A, B, s)` for an `nn.Linear` `layer`
# (trainable or frozen, with or without a bias, float32 or float64; any rank, r = 1 included):
# change `layer.weight` **in place** (the same `Parameter`; inside `torch.no_grad()`, since
# autograd must not record this: no graph on the weight afterwards; not through `.data`, which
# hides the change from autograd's version counter, so a backward pending on the old weight
# would go on silently: the check sees it) by $+s\,BA$ or $-s\,BA$, and return `layer` itself.
# Leave the bias and `requires_grad` alone. The merged layer's output must equal the unmerged
# $xW^\top + b + s\,(xA^\top)B^\top$ to float tolerance (the additions happen in another order,
# so not bit for bit), and merge then unmerge must give $W$ back.
#
# <details><summary>Hint 1 of 3 · the idea: change the Parameter, not the name</summary>
#
# "In place" means the tensor object `layer.weight` keeps its identity and its storage;
# assigning `layer.weight = ...` would put a new tensor there. An in-place change of a leaf
# that requires grad is refused by autograd unless autograd is off: that is what
# `torch.no_grad()` is for, and it also keeps the weight free of a graph.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the one out × in product</summary>
#
# Merging is the one place where forming $BA$ is right: (out, r)(r, in) gives the (out, in)
# update, formed once, scaled by $s$. Add it in place with `+=` or `add_` inside the
# `no_grad` block, subtract it the same way for `unmerge_`, and return `layer`. The bias and
# `requires_grad` are never touched.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: identity, graph, round trip</summary>
#
# In a scratch cell (delete it before handing in): `layer = torch.nn.Linear(5, 3)`,
# `W0 = layer.weight.detach().clone()`, `w = layer.weight`; after `merge_(layer, A, B, s)`:
# `layer.weight is w`, `layer.weight.grad_fn is None`, `layer.weight.requires_grad` unchanged,
# and `torch.allclose(layer(x), x @ W0.T + layer.bias + s * (x @ A.T) @ B.T)`; after
# `unmerge_`, `torch.allclose(layer.weight, W0)`. Try a frozen layer
# (`requires_grad_(False)`), `bias=False`, float32 and r = 1. The update, to check yours
# against:
#
# $$W \leftarrow W + s\,BA \ \ (\texttt{merge\_}),\qquad W \leftarrow W - s\,BA \ \ (\texttt{unmerge\_}).$$
#
# </details>

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
# # END QUESTION

# %% [markdown]
# **Self-check 4** compares each function with reference outputs recorded from the course's own
# solution: the layer after $W + s\,BA$ and, for `unmerge_`, a merged layer after $-s\,BA$.
#
# Each line reports what your function returned, the weight and bias after it, whether `weight`
# is still the same `Parameter`, its `requires_grad`, and whether it carries a graph.

# %%
check_contract("lab08", "ex4", merge_)

# %%
check_contract("lab08", "ex4b", unmerge_)

# %% [raw]
# # BEGIN QUESTION
# name: ex5

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
# **You derive:** the bookkeeping around exercise 2: what `forward` computes and in which
# order, what is saved, how `ctx.needs_input_grad` maps to `lora_backward`'s flags, the
# reshapes between (..., ·) and 2-D, and $\partial L/\partial W$ only when asked.
#
# **You are given:** your `lora_backward` (exercise 2), the class skeleton with
# `@once_differentiable`, and $\partial L/\partial W = g^\top x$ from the goal.
#
# Fill in `LoRALinearFn` with inputs `(x, W, A, B, s)`, `x` of shape (..., in) (2-D (R, in),
# 3-D (batch, tokens, in), or more dims), float32 or float64, any rank r (1 included):
# * `forward(x, W, A, B, s)`: $y = xW^\top + s\,(xA^\top)B^\top$, shape (..., out), never
#   forming $BA$;
# * `setup_context(ctx, inputs, output)`: save `x`, `W`, `A`, `B` with `ctx.save_for_backward`
#   and keep the float `s` on `ctx`, nothing else (the checks count what is saved, tensors kept
#   as `ctx` attributes included);
# * `backward(ctx, grad_y)`: unpack `ctx.saved_tensors`; bring `grad_y` and `x` to the 2-D
#   shapes your `lora_backward` takes and pass it the right flags of `ctx.needs_input_grad`;
#   give `grad_x` its input's shape back; compute $\partial L/\partial W$ **only if**
#   `ctx.needs_input_grad[1]` (else `None`: a frozen `W` costs nothing); return one gradient
#   per input of `forward`, in order (`None` for the float `s`).
#
# Whatever needs a gradient, the gradients autograd gets must be right and nothing else may be
# computed: `W` frozen or trainable; `x` plain data (no $\partial L/\partial x$ computed, no
# product of its shape); `A` and `B` frozen too, only `x` asking. The public wrapper, as
# everywhere in the course, would be `lora_linear_fn(x, W, A, B, s) = LoRALinearFn.apply(x, W,
# A, B, s)`. `@once_differentiable` is already there: this backward is not differentiable again.
# Your `backward` calls your `lora_backward` of exercise 2. The self-check runs yours (a mistake
# there shows here too, and the ✗ says so); the hidden tests run the course's `lora_backward` in
# its place, so a mistake in exercise 2 costs points once, in exercise 2.
#
# <details><summary>Hint 1 of 4 · the idea: every leading dim is a row</summary>
#
# A linear layer treats each (in,) vector of `x` on its own, so `x` (..., in) is just R rows,
# R the product of the leading dims, and `grad_y` (..., out) the same R rows. Flatten both to
# 2-D, call `lora_backward`, and give `grad_x` back the shape of `x`. `forward` groups its
# products as exercise 2 does: $xA^\top$ first, the r-dimensional one, never $BA$.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the flags</summary>
#
# `ctx.needs_input_grad` has one bool per input of `forward`, in its order: `x`, `W`, `A`, `B`,
# `s`. `lora_backward` takes flags for `x`, `A` and `B` only, so pass it the entries 0, 2 and
# 3; entry 1 (`W`) decides whether you compute $\partial L/\partial W$ at all.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the weight's gradient, and the return</summary>
#
# With `W` trainable, $\partial L/\partial W$ (out, in) is the sum over all R rows of the outer
# products of a row of $g$ and the same row of $x$: one matmul of the 2-D `grad_y` and `x`.
# `backward` returns five values, one per input of `forward`, `None` for `s` and for every
# gradient not asked for.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: gradcheck and autograd</summary>
#
# In a scratch cell (delete it before handing in), with float64 `x` (2, 3, 5), `W` (4, 5),
# `A` (2, 5), `B` (4, 2) and `s = 0.5`: make `W` trainable and run
# `torch.autograd.gradcheck(LoRALinearFn.apply, (x, W, A, B, s))` (all four tensors with
# `requires_grad=True`); then compare the gradients with those of `x @ (W + s * B @ A).T`
# through autograd. Repeat with `W` frozen (its `.grad` stays `None`), with `x` plain data,
# with only `x` asking, with 2-D and 4-D `x`, and r = 1. To check yours against:
#
# $$\begin{gathered}
# \frac{\partial L}{\partial W} = g^\top x\ \text{(only if asked)}, \\
# (\partial_x, \partial_A, \partial_B) = \text{lora\_backward}(g, x, W, A, B, s, (n_0, n_2, n_3)),
# \end{gathered}$$
#
# with $g$, $x$ flattened to (R, ·), $n$ = `ctx.needs_input_grad`, and `backward` returning
# $(\partial_x, \partial_W, \partial_A, \partial_B, \text{None})$.
#
# </details>

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

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 5** compares with reference outputs recorded from a reference `Function`: the
# output and the gradients autograd gets through it for the inputs that need one (`"None"` for
# the others).
#
# Where in = 2¹⁷, an out × in matrix, ∂L/∂x or ∂L/∂A would take 8 MiB. The check also reports
# the matrix products formed forward and backward, watched while they run: whether one was out ×
# in while `W` was frozen, and whether one had the shape of $\partial L/\partial x$ while `x`
# asked for none.

# %%
check_contract("lab08", "ex5", LoRALinearFn)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `grads_from_W_prime`, `lora_backward`,
# `init_adapter`, `merge_`, `unmerge_` and `LoRALinearFn`.
