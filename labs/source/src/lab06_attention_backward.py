# %% [markdown]
# # Lab 6 · Attention backward: a sliding window, a score bias, a learned temperature
#
# Chapter 6 derived the backward pass of scaled dot-product attention, printed it, and showed
# what the masks do to it. Here you use its method on a variant the chapter did not print, the
# attention of models such as Mistral (a sliding-window causal mask), T5 and ALiBi (an additive
# bias on the scores) and of learned-temperature attention (a trainable scale per head):
# the windowed mask, the forward with bias and scale, the backward that also returns
# $\partial L/\partial \text{Bias}$ and $\partial L/\partial \text{scale}$, and the whole thing
# put together, as PyTorch's `F.scaled_dot_product_attention` (SDPA) would compute it. This
# lab goes with [Chapter 6](../chapters/06_attention_backward.ipynb) (and chapter 2's
# broadcasting).
#
# **Learning goals.** After this lab you can
# * build causal masks in both alignments, top-left (SDPA's `is_causal`, what `causal=True`
#   means in the course) and bottom-right (a KV cache's queries are the newest), with an
#   optional sliding window;
# * write masked attention with a score bias that gives a query with no visible key zeros,
#   never NaN;
# * derive the gradients of $Q$, $K$, $V$, a broadcast score bias and a broadcast scale from
#   $P$ and $\partial L/\partial O$, with no mask in backward;
# * say why a padded key gets exactly zero gradient, and check it.
#
# Shapes: `Q` (..., Nq, d), `K` (..., Nk, d), `V` (..., Nk, d_v), usually (B, H, N, d);
# $S = Q K^\top \cdot \text{scale} + \text{Bias}$, $P = \mathrm{softmax}(S)$ over keys,
# $O = P V$. `scale` and `Bias` broadcast against $S$ (..., Nq, Nk): e.g. one temperature per
# head, shape (H, 1, 1), and a bias shared by the batch, shape (H, Nq, Nk). Masks are boolean
# with **True = may attend** (SDPA's convention).
#
# **How a lab works.** Each exercise states its goal and its points (10 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It answers in one line: `✓` your function matches outputs recorded from
# the course's solution on one case of every promise the prompt makes, `✗` which kinds of
# case fail (in words) and what is wrong in the first, or `·` not implemented yet. Your
# instructor grades the notebook you hand in with hidden tests that check the same promises
# on other inputs. `ref` is chapter 6's `helpers.attention`: compare with it in a cell of your
# own if you like (the graded functions may not call what their exercise asks you to write).
# `unbroadcast` is chapter 2's (a gradient summed back to a broadcast input's shape).
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

from helpers import attention as ref  # noqa: F401 (chapter 6's, to compare with)
from helpers.labcontract import check_contract
from helpers.numgrad import unbroadcast

# %% [raw]
# # BEGIN QUESTION
# name: ex1

# %% [markdown]
# ## Exercise 1 · The causal mask, both alignments, with a sliding window (2 points)
#
# **Goal:** with `Nq` queries and `Nk` keys there are two ways to align the causal triangle.
# * `align="top_left"` (the default, and what `causal=True` means everywhere in the course, as
#   in SDPA's `is_causal=True`): query $i$ may see key $j$ iff $j \le i$.
# * `align="bottom_right"` (a KV cache: the queries are the newest `Nq` of `Nk` tokens):
#   query $i$ may see key $j$ iff $j \le i + (N_k - N_q)$, so the last query sees every key.
#
# A **sliding window** of `window` keys (Mistral's local attention) keeps, of the keys a
# query may see, only the `window` most recent ones, its own diagonal key included; so
# `window=1` keeps the diagonal alone, and `window=None` (the default) keeps every key the
# triangle allows.
#
# Write `causal_mask(Nq, Nk, align="top_left", device=None, window=None)`: a `(Nq, Nk)`
# **bool** tensor (not 0/1 floats), True = may attend, for any sizes: `Nq == Nk` (both
# alignments are then the usual lower triangle), fewer queries than keys and more (with
# `bottom_right` and `Nq > Nk` the first queries see no key at all: their rows are all
# False); `align` and `window` left out or passed as their defaults; any `window` ≥ 1, from
# 1 (the diagonal key alone) to `Nk` or more (with `Nq` < `Nk`: nothing is cut), in either
# alignment; made on `device` when one is given (a check passes `device="meta"`, PyTorch's
# device of shapes without values, and looks at where the mask was made). Work out,
# for query $i$, the last key it may see and the first one the window keeps, in each
# alignment.
#
# <details><summary>Hint: building it</summary>
#
# Compare an `arange` column (queries) with an `arange` row (keys): the two alignments differ
# by one number added to $i$. The window is a second comparison, combined with `&`; count on
# a small case (`window=1` must keep exactly the diagonal) to get the strict or non-strict
# inequality right.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def causal_mask(Nq, Nk, align="top_left", device=None, window=None):
    """(Nq, Nk) bool, True = may attend: causal, either corner, optionally windowed."""
    # BEGIN SOLUTION
    shift = Nk - Nq if align == "bottom_right" else 0
    i = torch.arange(Nq, device=device)[:, None]  # (Nq, 1)
    j = torch.arange(Nk, device=device)[None, :]  # (1, Nk)
    mask = j <= i + shift  # (Nq, Nk)
    if window is not None:
        mask = mask & (j > i + shift - window)  # only the last `window` keys
    return mask
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** compares your masks with masks recorded from the course's own solution, on
# one case of each promise above: a square mask with the defaults, fewer queries than keys and
# more, `align` and `window` passed as their defaults, both alignments in both shapes, a
# window in each alignment (bottom-right also with Nq < window < Nk), `window=1` and a window
# as wide as the keys. A bool mask must
# match exactly. A `✗` names the kind of case that fails before anything else.

# %%
check_contract("lab06", "ex1", causal_mask)

# %% [raw]
# # BEGIN QUESTION
# name: ex2

# %% [markdown]
# ## Exercise 2 · Masked attention forward with a score bias, no NaN (2 points)
#
# **Goal:** the scores are $S = QK^\top\cdot\text{scale} + \text{Bias}$; a masked score becomes
# $-\infty$, so its weight $e^{-\infty} = 0$; but a query that sees **no** key would get
# $0/0$ = NaN, and must get $P = 0$, $O = 0$ instead.
#
# Write `attention_forward(Q, K, V, mask=None, Bias=None, scale=None)` returning `(O, P)`:
# * `Q` (..., Nq, d), `K` (..., Nk, d), `V` (..., Nk, d_v) with any leading dims (none, or
#   (B, H)), `Nq` and `Nk` in either order, `d_v` ≠ `d` allowed, float32 or float64 (`O` and
#   `P` in that dtype);
# * `scale` is a Python number or a tensor broadcastable to (..., Nq, Nk) (one temperature
#   per head, (H, 1, 1)), $1/\sqrt d$ ($d$ = `Q.shape[-1]`) when None;
# * `Bias` (None = no bias) is broadcastable to (..., Nq, Nk), e.g. (H, Nq, Nk) or
#   (H, 1, Nk);
# * where `mask` (None = no mask; bool, broadcastable to (..., Nq, Nk): (Nq, Nk) causal, or
#   (B, 1, 1, Nk) for padded keys) is False, $S = -\infty$ exactly, whatever the other scores
#   are: a masked entry of $P$ is 0 even when every visible score is $-200$, and a masked
#   score of $+1000$ changes nothing;
# * $P$ = the row softmax over the keys, computed stably (scores near $+10^3$ must not
#   overflow); a query that sees no key gets a row of zeros in $P$ and $O$, never NaN;
#   $O = P V$.
#
# Work out first what a stable softmax does with a row whose every entry is $-\infty$, and
# where that turns into NaN; then where the row max must be taken, before or after masking.
#
# <details><summary>Hint: the two places a fully masked row breaks</summary>
#
# Subtracting the row max: the max is $-\infty$ and $-\infty - (-\infty)$ is NaN, so subtract 0
# for such a row. Dividing by the row sum: it is 0, so divide by 1 there ($0/1 = 0$).
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def attention_forward(Q, K, V, mask=None, Bias=None, scale=None):
    """(O, P) of softmax(Q Kᵀ·scale + Bias, masked) V; no key visible: P = O = 0."""
    # BEGIN SOLUTION
    if scale is None:
        scale = 1.0 / math.sqrt(Q.shape[-1])
    # (..., Nq, d) @ (..., d, Nk) -> (..., Nq, Nk)
    S = (Q @ K.transpose(-2, -1)) * scale
    if Bias is not None:
        S = S + Bias  # broadcast to (..., Nq, Nk)
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    m = S.amax(-1, keepdim=True)  # (..., Nq, 1)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    E = torch.exp(S - m)  # masked: exp(-inf) = 0
    Z = E.sum(-1, keepdim=True)  # (..., Nq, 1)
    P = E / torch.where(Z > 0, Z, torch.ones_like(Z))
    O = P @ V  # (..., Nq, Nk) @ (..., Nk, d_v) -> (..., Nq, d_v)
    return O, P
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** compares `(O, P)` with outputs recorded from the course's own solution, on
# one case of each promise: the defaults, Nq < Nk and Nq > Nk, 2-D inputs, a float and a
# per-head `scale`, a bias of shape (H, Nq, Nk) and (H, 1, Nk), a causal mask and a padding
# mask, a query that sees no key, scores near $+10^3$, heads whose scores lie far apart, a masked
# score far above the visible ones, visible scores far below 0, and float32 inputs (there within
# $10^{-5}$, else $10^{-10}$).

# %%
check_contract("lab06", "ex2", attention_forward)

# %% [raw]
# # BEGIN QUESTION
# name: ex3

# %% [markdown]
# ## Exercise 3 · The backward of biased, temperature-scaled attention (3 points)
#
# **Goal:** from $P$ and $dO = \partial L/\partial O$, **derive** the five gradients of
# $S = QK^\top\cdot\text{scale} + \text{Bias}$, $P = \mathrm{softmax}(S)$ (over keys),
# $O = PV$, with batch dimensions in front, where `scale` and `Bias` are tensors that were
# **broadcast** to $S$'s shape (..., Nq, Nk): e.g. `scale` (H, 1, 1), one learned temperature
# per head, and `Bias` (H, Nq, Nk) or (H, 1, Nk), shared by the batch. Use the softmax's
# vector–Jacobian product, never its $N\times N$ Jacobian (the checks measure the largest tensor
# your call makes: no more than 1.5 × what the course's backward needs), and **no mask** (say
# to yourself why none is needed).
#
# Write `attention_backward(Q, K, V, P, grad_O, scale, Bias)` returning
# `(grad_Q, grad_K, grad_V, grad_scale, grad_Bias)`, each with the shape of what it is the
# gradient of (`grad_scale` has `scale.shape`, `grad_Bias` has `Bias.shape`). `scale` is a
# tensor: 0-dim or one per head (H, 1, 1); `Bias` is a tensor of the full shape
# (..., Nq, Nk), or (H, Nq, Nk), (H, 1, Nk) or (Nq, Nk); the inputs are 4-D (B, H, N, d) or
# 3-D (B, N, d), with `Nq` and `Nk` in either order and `d_v` ≠ `d`; `P` may come from a
# masked forward (zeros in it, even a row of zeros). Derive on paper
# first: walk the forward backwards, one step per line. Chapter 6 did it for a plain number
# `scale` and no bias; what changes when `scale` is a tensor with its own gradient, and what
# does chapter 2 say a broadcast does to a gradient? Open a hint only when stuck.
#
# <details><summary>Hint 1: the order of the steps</summary>
#
# $O = PV$ is a matrix product: it gives $dV$ and $dP$. The softmax turns $dP$ into $dS$ (chapter
# 4's VJP, row by row). $S = A\cdot\text{scale} + \text{Bias}$ with $A = QK^\top$ is a sum and an
# elementwise product: $d\text{Bias}$ and $d\,\text{scale}$ come from $dS$ (and $A$), summed back
# to their own shapes over the dims they were broadcast along (`helpers.numgrad.unbroadcast`,
# chapter 2), and $dA$ from $dS$ and scale. $A = QK^\top$ is a matrix product again: it gives
# $dQ$ and $dK$. A masked entry has $P = 0$, and the softmax VJP multiplies by $P$.
#
# </details>
#
# <details><summary>Hint 2: check your formulas</summary>
#
# Your $dS$ should be $P \odot \big(dP - \textstyle\sum_{\text{keys}} dP \odot P\big)$ (the sum
# over the last dim with `keepdim=True`). Your $dA$ is elementwise, $dS \odot \text{scale}$, and
# $d\,\text{scale}$ is $dS \odot A$ summed to `scale.shape`. $dQ$ and $dK$ need $dA$ and a
# transpose of the last two dims (`.transpose(-2, -1)`) for one of them.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def attention_backward(Q, K, V, P, grad_O, scale, Bias):
    """grad_Q, grad_K, grad_V, grad_scale, grad_Bias of softmax(Q Kᵀ·scale + Bias) V"""
    # BEGIN SOLUTION
    # (..., Nk, Nq) @ (..., Nq, d_v) -> (..., Nk, d_v)
    grad_V = P.transpose(-2, -1) @ grad_O
    # (..., Nq, d_v) @ (..., d_v, Nk) -> (..., Nq, Nk)
    grad_P = grad_O @ V.transpose(-2, -1)
    grad_S = P * (grad_P - (grad_P * P).sum(-1, keepdim=True))  # (..., Nq, Nk)
    grad_Bias = unbroadcast(grad_S, Bias.shape)  # summed over the broadcast dims
    A = Q @ K.transpose(-2, -1)  # (..., Nq, d) @ (..., d, Nk) -> (..., Nq, Nk)
    grad_scale = unbroadcast(grad_S * A, scale.shape)
    grad_A = grad_S * scale  # (..., Nq, Nk)
    grad_Q = grad_A @ K  # (..., Nq, Nk) @ (..., Nk, d) -> (..., Nq, d)
    # (..., Nk, Nq) @ (..., Nq, d) -> (..., Nk, d)
    grad_K = grad_A.transpose(-2, -1) @ Q
    return grad_Q, grad_K, grad_V, grad_scale, grad_Bias
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** compares your five gradients with the reference's, recorded from the
# course's own solution, on one case of each promise: a full-size `Bias` (then `grad_Bias`
# **is** $dS$, the softmax VJP's output: if it is off there, your softmax step is), a scale per
# head, biases broadcast over the batch, over the queries and over batch and heads, Nq < Nk
# and Nq > Nk, a `P` with masked zeros and a row of zeros, and 3-D inputs.

# %%
check_contract("lab06", "ex3", attention_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex4

# %% [markdown]
# ## Exercise 4 · Windowed causal attention with bias and padding, end to end (3 points)
#
# **Goal:** put the pieces together and see the masks' effect on the gradients: a padded key
# is never attended to, so nothing flows back into it: its `grad_K` and `grad_V` rows are
# **exactly** zero.
#
# Write `attention_grads(Q, K, V, Bias, scale, grad_O, causal=False, key_padding_mask=None,
# align="top_left", window=None)` for (B, H, N, d) tensors, returning
# `(grad_Q, grad_K, grad_V, grad_scale, grad_Bias)`:
# * build the mask: your `causal_mask` with this `align` and `window` if `causal` (the window
#   only applies to a causal mask); `key_padding_mask` is bool (B, Nk) with **True = padding**
#   (`nn.MultiheadAttention`'s convention, the opposite of the attention mask): turn it into a
#   may-attend mask that broadcasts against (B, H, Nq, Nk) yourself, and combine the two;
# * run your `attention_forward` with the bias and the scale, then your `attention_backward`.
#
# Your self-check 4 runs your own Exercises 1-3 (a mistake there shows here too, and the ✗
# says so); the hidden tests run the course's `causal_mask`, `attention_forward` and
# `attention_backward` in their place, so a mistake there costs points once, where it is.
#
# Every flag is tried at each of its values, its default included: no mask at all
# (`causal=False`, `key_padding_mask=None`); `causal=True` with `Nq` = `Nk`, `Nq` < `Nk` and
# `Nq` > `Nk`, in each alignment, with and without a window; padding alone and with a causal
# mask; a batch row whose keys are all padding (its gradients are zeros, not NaN); `align`
# and `window` given with `causal=False` (then there is no mask). `scale` is one per head
# (H, 1, 1) or 0-dim, `Bias` (H, Nq, Nk) or (Nq, Nk).

# %% [raw]
# # BEGIN SOLUTION


# %%
def attention_grads(
    Q,
    K,
    V,
    Bias,
    scale,
    grad_O,
    causal=False,
    key_padding_mask=None,
    align="top_left",
    window=None,
):
    """The five gradients of masked, biased, scaled attention for grad_O, by hand."""
    # BEGIN SOLUTION
    Nq, Nk = Q.shape[-2], K.shape[-2]
    mask = None
    if causal:
        mask = causal_mask(Nq, Nk, align, device=Q.device, window=window)  # (Nq, Nk)
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, Nk)
        mask = keep if mask is None else mask & keep  # (B, 1, Nq, Nk)
    _, P = attention_forward(Q, K, V, mask, Bias, scale)
    return attention_backward(Q, K, V, P, grad_O, scale, Bias)
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** compares your five gradients with the reference's (the course's solution,
# recorded), on one case of each flag at each value: no mask (every flag at its default),
# `causal=True` with Nq = Nk, Nq < Nk and Nq > Nk, bottom-right, a window in each alignment,
# padding alone and with a causal mask, a batch row with every key padded, `align` and
# `window` given with `causal=False`, and a 0-dim scale with a (Nq, Nk) bias. It calls your
# functions of exercises 1 to 3 through yours: fix their `✗` first.

# %%
check_contract("lab06", "ex4", attention_grads)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `causal_mask`, `attention_forward`,
# `attention_backward` and `attention_grads`.
