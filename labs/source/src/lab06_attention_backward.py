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
# query may see, only those less than `window` positions before the query's own diagonal
# position (the last key its alignment lets it see), that position included; so `window=1`
# keeps the diagonal alone, and `window=None` (the default) keeps every key the triangle
# allows. Where the diagonal position lies past the last key (top-left, a query $i \ge N_k$),
# the window still counts back from it: `window=1` keeps no key in that row.
#
# **You derive:** for query $i$, in each alignment, the last key it may see and the first key
# the window keeps, as two inequalities on the indices $i$ and $j$, turned into a (Nq, Nk)
# bool tensor.
#
# **You are given:** the two alignments' rules above, `torch.arange` and broadcasting
# (chapter 2).
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
# <details><summary>Hint 1 of 3 · the idea: a column against a row</summary>
#
# A mask entry depends only on $i$ and $j$. An index column of shape (Nq, 1) compared with an
# index row of shape (1, Nk) broadcasts to a (Nq, Nk) bool tensor in one operation, no loop;
# make both indices on `device`. The two alignments differ by one number added to $i$; the
# window is a second comparison, combined with the first by `&`.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: count on a small case</summary>
#
# Take `Nq = Nk = 4`, top-left, `window=2`. Query 3 may see keys 0 to 3; the window keeps
# the 2 most recent of them, keys 2 and 3; query 0 sees key 0 only. Write, for query $i$,
# "the last visible key" and "the first kept key" so that these counts come out, then decide
# strict or non-strict inequality from them; `window=1` must keep exactly the diagonal key,
# the last one the triangle allows. For bottom-right, redo the count with `Nq = 2`,
# `Nk = 4`: query 1 is the newest token.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: print small masks</summary>
#
# In a scratch cell (delete it before handing in), print `causal_mask(3, 5, ...).int()` and
# `causal_mask(5, 3, ...).int()` in both alignments and read them against the rules above.
# Without a window, `ref.causal_mask(Nq, Nk, align)` (chapter 6's) must give the same mask;
# top-left is also `torch.ones(Nq, Nk, dtype=torch.bool).tril()` and bottom-right
# `.tril(diagonal=Nk - Nq)`. Then: `window=1` leaves at most one True per row, on the
# diagonal; with Nq ≤ Nk, `window=Nk` gives the unwindowed mask; bottom-right with Nq > Nk
# has its first Nq − Nk rows all False; `.dtype` is `torch.bool`; with `device="meta"`,
# `.device.type` is `"meta"`. To check yours against, with $\delta = 0$ (top-left) or
# $N_k - N_q$ (bottom-right) and window $w$:
#
# $$\text{mask}_{ij} = \big(j \le i + \delta\big)\ \wedge\ \big(j > i + \delta - w\big).$$
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
# **Self-check 1** compares your masks with masks recorded from the course's own solution. A
# bool mask must match exactly. A `✗` names the kind of case that fails before anything else.

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
# **You derive:** where a fully masked row turns into NaN in a stable softmax, and the two
# guards that give it zeros instead, in a forward that broadcasts `scale`, `Bias` and `mask`.
#
# **You are given:** the forward's definition below, `masked_fill`, `torch.where`, and
# chapter 6's `ref.attention_forward` (no bias, a number `scale`) to compare with.
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
# <details><summary>Hint 1 of 3 · the idea: build S, then a guarded softmax</summary>
#
# Go in the forward's order: scores (..., Nq, Nk), times `scale`, plus `Bias` (both
# broadcast), then the mask, then the softmax over the last dim (keys), then $PV$. The mask
# must come before the row max: a masked $+1000$ taken into the max would push every visible
# $e^{S - \max}$ to 0. A stable softmax subtracts the row max and divides by the row sum;
# look at what each of those two does to a row that is all $-\infty$.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the two places a fully masked row breaks</summary>
#
# Subtracting the row max: the max is $-\infty$ and $-\infty - (-\infty)$ is NaN, so subtract 0
# for such a row (replace a max that is not finite by 0, with `torch.where`). Dividing by the
# row sum: it is 0, so divide by 1 there ($0/1 = 0$). Keep both with `keepdim=True`, shape
# (..., Nq, 1).
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: against torch.softmax, and NaN hunting</summary>
#
# In a scratch cell (delete it before handing in), with float64 `Q` (2, 2, 3, 4), `K`
# (2, 2, 5, 4), `V` (2, 2, 5, 3), a `scale` (2, 1, 1) and a `Bias` (2, 1, 5): compute
# `S = Q @ K.transpose(-2, -1) * scale + Bias`, mask it with `S.masked_fill(~mask, float("-inf"))`
# and compare your `P` with `torch.softmax` of that on every row that sees at least one key.
# Then a row that sees no key: `P` and `O` rows exactly 0 and `torch.isnan(P).any()` False;
# `Q` times 100 (scores near $10^3$); a masked score of $+1000$ beside visible scores of
# $-200$. Without `Bias`, `ref.attention_forward(Q, K, V, mask, scale)` with a number `scale`
# must agree. To check yours against, for row $i$:
#
# $$\begin{gathered}
# m_i = \max_j S_{ij}\ (0 \text{ if that is } -\infty),\quad Z_i = \sum_j e^{S_{ij} - m_i}, \\
# P_{ij} = \frac{e^{S_{ij} - m_i}}{Z_i\ (1 \text{ if } Z_i = 0)},\quad O = PV.
# \end{gathered}$$
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
# **Self-check 2** compares `(O, P)` with outputs recorded from the course's own solution
# (float32 cases within $10^{-5}$, the others within $10^{-10}$).

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
# **You derive:** the five gradients, step by step backward: $dV$ and $dP$ from $O = PV$, $dS$
# from the softmax, $d\text{Bias}$, $d\,\text{scale}$ and $dA$ from $S = A\cdot\text{scale} +
# \text{Bias}$, then $dQ$ and $dK$ from $A = QK^\top$, each in its own shape.
#
# **You are given:** `P` and `grad_O` $= dO$ from the forward, `Q`, `K`, `V`, `scale`, `Bias`,
# `unbroadcast` (chapter 2), and chapter 6's derivation for a number `scale` and no bias.
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
# <details><summary>Hint 1 of 4 · the idea: four steps, backward</summary>
#
# $O = PV$ is a matrix product: it gives $dV$ and $dP$. The softmax turns $dP$ into $dS$
# (chapter 4's VJP, row by row over the keys). $S = A\cdot\text{scale} + \text{Bias}$ with
# $A = QK^\top$ is a sum and an elementwise product: $d\text{Bias}$ and $d\,\text{scale}$ come
# from $dS$ (and $A$), summed back to their own shapes over the dims they were broadcast
# along (`unbroadcast`, chapter 2), and $dA$ from $dS$ and scale. $A = QK^\top$ is a matrix
# product again: it gives $dQ$ and $dK$. Why no mask: a masked entry has $P = 0$, and look
# at what the softmax VJP multiplies by.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the softmax, one entry</summary>
#
# Within one row, $\partial P_j/\partial S_k = P_j\,([j = k] - P_k)$. Then
# $dS_k = \sum_j dP_j\, \partial P_j/\partial S_k$: split the sum into the $j = k$ term and
# the rest, and you get $dS$ with one sum over the keys per row, of shape (..., Nq, 1), never
# the Nk × Nk Jacobian.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the scale and the bias</summary>
#
# After broadcasting, $S_{\dots ij} = A_{\dots ij}\,\text{scale}_{\dots ij} + \text{Bias}_{\dots ij}$
# entry by entry, so $\partial S/\partial\,\text{scale}$ at each entry is that entry of $A$, and
# $\partial S/\partial\,\text{Bias}$ is 1. A `scale` of shape (H, 1, 1) was copied to every
# (b, i, j) of its head: its gradient is the sum over those copies. $A$ is not saved:
# recompute it from `Q` and `K`.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: autograd in a scratch cell</summary>
#
# In a scratch cell (delete it before handing in), make float64 `Q` (2, 2, 3, 4), `K`
# (2, 2, 5, 4), `V` (2, 2, 5, 3), `scale` (2, 1, 1), `Bias` (2, 1, 5), all with
# `requires_grad=True`, run the forward with `torch.softmax`, and get the five gradients from
# `torch.autograd.grad(O, (Q, K, V, scale, Bias), grad_O)`; compare with yours. Try Nq > Nk,
# a full-size `Bias` (then `grad_Bias` is $dS$), a `P` with masked zeros and a row of zeros
# (that row's $dQ$ is 0), and 3-D inputs with a 0-dim `scale`. The formulas, to check yours
# against:
#
# $$\begin{gathered}
# dV = P^\top dO,\quad dP = dO\,V^\top, \\
# dS = P \odot \big(dP - \textstyle\sum_{\text{keys}} dP \odot P\big), \\
# d\text{Bias} = \text{unbroadcast}(dS),\quad d\,\text{scale} = \text{unbroadcast}(dS \odot A), \\
# dA = dS \odot \text{scale}, \\
# dQ = dA\,K,\quad dK = dA^\top Q .
# \end{gathered}$$
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
# **Self-check 3** compares your five gradients with the reference's, recorded from the course's
# own solution.
#
# Where `Bias` is full size, `grad_Bias` **is** $dS$, the softmax VJP's output: if it is off
# there, your softmax step is.

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
# **You derive:** one may-attend mask from the two flags (or none), of a shape that broadcasts
# against (B, H, Nq, Nk), and the order of the calls.
#
# **You are given:** your `causal_mask`, `attention_forward` and `attention_backward` of
# exercises 1 to 3.
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
# `Nq` > `Nk` top-left aligned, and `Nq` < `Nk` bottom-right aligned (a KV cache), each with and
# without a window; padding alone and with a causal
# mask; a batch row whose keys are all padding (its gradients are zeros, not NaN); `align`
# and `window` given with `causal=False` (then there is no mask). `scale` is one per head
# (H, 1, 1) or 0-dim, `Bias` (H, Nq, Nk) or (Nq, Nk).
#
# <details><summary>Hint 1 of 3 · the idea: one may-attend mask, or none</summary>
#
# Two masks with opposite conventions and different shapes: the causal one (Nq, Nk), True =
# may attend; the padding one (B, Nk), True = padding. Bring both to "True = may attend" and
# to shapes that broadcast against (B, H, Nq, Nk), then a key is visible only if both allow
# it. With no flag set the mask is `None`. The forward gives $P$; the backward needs no mask.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the padding mask's shape</summary>
#
# Invert it with `~` (not `1 -` on a bool), then give it singleton dims for the heads and the
# queries, so that (B, Nk) becomes (B, 1, 1, Nk): batch row $b$'s padded key $j$ is then
# hidden from every head and every query. A (Nq, Nk) causal mask broadcasts against it to
# (B, 1, Nq, Nk). Pass `align` and `window` to `causal_mask` only when `causal` is True.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: zero rows, and autograd</summary>
#
# In a scratch cell (delete it before handing in), on float64 (2, 2, 4, 3) inputs with
# `key_padding_mask = torch.tensor([[False, False, True, True], [False] * 4])`: the rows 2
# and 3 of `grad_K[0]` and `grad_V[0]` must be exactly 0 (`torch.equal` with zeros). Compare
# your five gradients with `torch.autograd.grad` through your own `attention_forward` (inputs
# with `requires_grad=True`, the same mask), with `causal=True` in both alignments, with a
# window, and Nq ≠ Nk. A batch row whose keys are all padding gives zeros, not NaN. The
# combined mask, to check yours against:
#
# $$\text{mask}_{b,\cdot,i,j} = \text{causal}_{ij}\ \wedge\ \lnot\,\text{padding}_{b,j}.$$
#
# </details>

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
# recorded), one case of each flag at each value. It calls your functions of exercises 1 to 3
# through yours: fix their `✗` first.

# %%
check_contract("lab06", "ex4", attention_grads)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `causal_mask`, `attention_forward`,
# `attention_backward` and `attention_grads`.
