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
# so does one that calls a backward pass of the course's `helpers` that this lab does not import for you.

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
# <details><summary>Hint 1: the method</summary>
#
# Treat $s\,B$ as $P$ and $A$ as $Q$ in the product rule above, then $B$ as $P$ and $s\,A$ as
# $Q$. Write the shapes under each factor: (out, r) (r, in).
#
# </details>
#
# <details><summary>Hint 2: the formulas (check yours against them)</summary>
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
# **Self-check 1** (recorded reference outputs, autograd through $W + s\,BA$ with a random
# $\partial L/\partial W'$; one case of each promise: out, in, r all different, r = 1, a square
# $W'$, s = 1, float32):

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
# **Self-check 2** (recorded reference outputs, autograd's through $y = x\,(W + s\,BA)^\top$;
# one case of each promise: `needs` left at its default and given as each of its 8
# combinations, r = 1, one row, float32, and two cases too large to cheat: out = 2¹⁷ and
# in = 2¹⁷, where an out × in matrix or a gradient nobody asked for would take 8 MiB, four times
# the call's memory budget. Besides the three gradients (`"None"` where not asked for) it reports
# the matrix products your function formed, watched while it runs: whether one was out × in,
# and whether one had the shape of a gradient nobody asked for):

# %%
check_contract("lab08", "ex2", lora_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex3

# %% [markdown]
# ## Exercise 3 · Initialisation: start exactly at the base (2 points)
#
# **Goal:** with $B = 0$ the product $BA$ is $0$, so the adapted layer starts equal to the base,
# and at step 0 $\partial L/\partial A = s\,(gB)^\top x = 0$ while
# $\partial L/\partial B = s\,g^\top(xA^\top) \ne 0$: $B$ moves first.
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
# **Self-check 3** (recorded reference outputs, `helpers.lora.LoRALinear`'s initialisation
# drawn with each case's seed; one case of each promise: `W` in float64 and in float32, r = 1,
# a square `W`):

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
# Write `merge_(layer, A, B, s)` and `unmerge_(layer, A, B, s)` for an `nn.Linear` `layer`
# (trainable or frozen, with or without a bias, float32 or float64; any rank, r = 1 included):
# change `layer.weight` **in place** (the same `Parameter`; inside `torch.no_grad()`, since
# autograd must not record this: no graph on the weight afterwards) by $+s\,BA$ or $-s\,BA$, and
# return `layer` itself. Leave the bias and `requires_grad` alone. The merged layer's output
# must equal the unmerged $xW^\top + b + s\,(xA^\top)B^\top$ to float tolerance (the additions
# happen in another order, so not bit for bit), and merge then unmerge must give $W$ back.

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
# **Self-check 4** (recorded reference outputs: the layer after $W + s\,BA$ and, for
# `unmerge_`, a merged layer after $-s\,BA$; one case of each promise for each function: a
# trainable layer, a frozen one, one without a bias, float32, r = 1. Each line reports what
# your function returned, the weight and bias after it, whether `weight` is still the same
# `Parameter`, its `requires_grad`, and whether it carries a graph):

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
# <details><summary>Hint: the bookkeeping</summary>
#
# `g2 = grad_y.reshape(-1, grad_y.shape[-1])` and `x2 = x.reshape(-1, x.shape[-1])`;
# `needs = (needs_input_grad[0], needs_input_grad[2], needs_input_grad[3])` (x, A, B);
# `grad_x.reshape(x.shape)` when it is not `None`; `grad_W = g2.T @ x2`; return
# `(grad_x, grad_W, grad_A, grad_B, None)`.
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
# **Self-check 5** (recorded reference outputs: the output and the gradients autograd gets
# through a reference `Function` for the inputs that need one (`"None"` for the others); one case
# of each promise: `x` 3-D, 2-D and 4-D, `W` frozen and trainable, `x` plain data, only `x`
# asking, r = 1, float32, and in = 2¹⁷ with only `B` training, where an out × in matrix, ∂L/∂x
# or ∂L/∂A would take 8 MiB. It also reports the matrix products formed forward and backward,
# watched while they run: whether one was out × in while `W` was frozen, and whether one had
# the shape of $\partial L/\partial x$ while `x` asked for none):

# %%
check_contract("lab08", "ex5", LoRALinearFn)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `grads_from_W_prime`, `lora_backward`,
# `init_adapter`, `merge_`, `unmerge_` and `LoRALinearFn`.
