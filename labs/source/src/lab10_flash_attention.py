# %% [markdown]
# # Lab 10 · Flash attention with ALiBi: the tiled forward and its backward by recomputation
#
# The chapter walked through flash-style attention for plain (and causal) softmax attention;
# here **you** write a variant it did not print: attention with an **ALiBi bias** (Press et al.,
# 2022), $S = Q K^\top \cdot s - m_h |i - j|$, with one *learned* slope $m_h$ per head, and a
# **sliding-window** causal mask. You start with the merge of two partial softmax
# normalisers, build the tiled forward that never holds the $N \times N$ matrix (nor the $N \times N$
# bias), derive the backward, including the gradient of the slopes, then tile it in the
# *other* loop order than the chapter's, add the local causal mask, and wrap it all in an
# `autograd.Function`. This lab goes with [Chapter 10](../chapters/10_flash_attention.ipynb).
# Everything runs on a CPU, in plain PyTorch (no Triton), on small shapes.
#
# **Learning goals.** After this lab you can
# * merge the $(m, \ell)$ statistics of two parts of a softmax row, and build the one-pass
#   softmax from that merge;
# * write a tiled attention forward with a bias computed tile by tile from global indices, that
#   returns $O$ and the row log-sum-exp $L$;
# * derive attention's backward from $Q, K, V, O, L$ alone, and the gradient of a bias
#   parameter (the ALiBi slopes) from $dS$;
# * tile that backward with the query blocks outside, saying which gradients stay local to a
#   pass and which are sums over the outer loop;
# * add a sliding-window causal mask, including rows that see no key in a tile;
# * wrap forward and backward in an `autograd.Function` that saves only what is linear in $N$
#   and passes `gradcheck`, the slopes included.
#
# **Notation and shapes.** `Q` is `(B, H, Nq, d)`, `K` and `V` are `(B, H, Nk, d)`, the slopes
# `slopes` are `(H,)`. With the scale $s = 1/\sqrt d$ and *global* indices $i$ (query) and $j$
# (key), the scores are $S_{ij} = s\, Q_i \cdot K_j - m_h |i - j|$ (the ALiBi bias: far-away keys
# are penalised in proportion to their distance; $m_h$ is `slopes[h]`),
# $P = \mathrm{softmax}(S)$ row-wise, $O = P V$, $L = \mathrm{logsumexp}(S)$ per row,
# `(B, H, Nq)`. Slopes of zero give plain attention. Gradients are
# `grad_Q`, `grad_K`, `grad_V`, `grad_slopes`; the upstream gradient is `grad_O` (written $dO$
# in the formulas). Index the last two dimensions (`Q[..., q0:q0 + block_q, :]`). A slice
# past the end is simply shorter: the last block of a ragged `N` takes care of itself if you
# use the block's real size (`Qi.shape[-2]`), not `block_q`.
#
# **How a lab works.** Each exercise states its goal and its points (17 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It answers in one line per function: `✓` your function matches outputs
# recorded from the course's solution on one case of every promise the prompt makes, `✗`
# which kinds of case fail (in words) and what is wrong in the first, or `·` not implemented
# yet. Your instructor grades the notebook you hand in with hidden tests that check the same
# promises on other inputs. Formulas you are asked to derive sit behind **Hint** blocks: try
# first, then open them.
#
# **By hand** means derived: a graded backward may not call autograd, and an estimate by finite
# differences (the forward run again for each input entry) does not count either. One kind of
# case of each backward (exercises 3–6) is large, and there the self-check and the hidden
# tests count the tensor entries your code writes, forward and backward: at most 10 × what the
# course's backward writes, room enough for any derived backward (a tiled one writes about 2 ×).
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

from helpers.labcontract import check_contract

# %% [raw]
# # BEGIN QUESTION
# name: ex1

# %% [markdown]
# ## Exercise 1 · Merging two softmax normalisers, and the one-pass softmax (2 points)
#
# **Goal:** the rescaling step of the online softmax, in the form that split-K kernels (and
# flash-decoding) use: two parts of a row are summarised independently, then merged.
#
# For a part $a$ of a row $x$ (any subset of its entries), call its statistics
# $m_a = \max_{j \in a} x_j$ and $\ell_a = \sum_{j \in a} e^{x_j - m_a}$. The chapter rescaled a running
# sum when *one new block* raised the max; here **both** sides may hold the larger max.
# **Derive** $(m, \ell)$ of the union of two disjoint parts $a$ and $b$ from $(m_a, \ell_a)$ and
# $(m_b, \ell_b)$ alone, without seeing the entries again.
#
# **You derive:** the merged $(m, \ell)$ of two parts from their statistics alone (empty parts
# included), and the one-pass fold of a row's blocks into a running $(m, \ell)$.
#
# **You are given:** the definitions of $m_a$ and $\ell_a$ above, and chapter 10's online
# softmax (a running sum rescaled when one new block raises the max).
#
# 1. Write `merge_stats(m_a, ell_a, m_b, ell_b)` → `(m, ell)`, elementwise over any shape.
#    A part with no entries has $m = -\infty$, $\ell = 0$: your merge must then return the other part
#    unchanged ($e^{-\infty} = 0$), on either side, and two empty parts must merge into an
#    empty part, $(-\infty, 0)$, not NaN (work out what $e^{m_a - m}$ is then). The larger max
#    may be in either part, or both maxima equal; the statistics may have any shape (1-D, 3-D).
# 2. Write `online_softmax_stats(x, block)` for `x` of shape `(..., n)`: walk over the last
#    dimension in blocks of `block` entries (the last block may be shorter), compute each
#    block's own $(m_b, \ell_b)$ (a block is small: two passes over it are fine), and fold them
#    into the running $(m, \ell)$, started at $(-\infty, 0)$, with `merge_stats` (yours is the
#    short way; the checks look at values, not at which function merged). Return
#    `(m, ell)`, both of shape `(...)`: then $\mathrm{softmax}(x)$ is
#    `torch.exp(x - m[..., None]) / ell[..., None]`.
#    Do not compute `x.amax(-1)` over the whole row: the point is to see each block once (the
#    checks measure the largest tensor any one step of your call reads: one block's worth).
#    `x` may be 1-D; `block` may divide `n` or not, be 1, or be `n` or more (one block); the
#    max may sit in the last, short block; the entries may be near 1000 ($e^x$ overflows).
#
# <details><summary>Hint 1 of 4 · the idea: one common reference for both sums</summary>
#
# $\ell_a$ and $\ell_b$ are sums of exponentials measured against two different maxima. To add
# them, measure both against one reference: the max of the union, which you know from $m_a$
# and $m_b$. Everything is elementwise: the statistics have any shape, one pair per row.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: one term, re-based</summary>
#
# One term of part $a$ against the new max $m$: $e^{x_j - m} = e^{x_j - m_a}\, e^{m_a - m}$.
# The second factor does not depend on $j$, so it comes out of the sum over part $a$; it is at
# most 1, so nothing overflows. Do the same for part $b$.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: empty parts, then the fold</summary>
#
# An empty part has $m = -\infty$, $\ell = 0$; its factor $e^{-\infty - m}$ is 0 when the other
# part is not empty. When both are empty, $m = -\infty$ and $m_a - m$ is $-\infty + \infty$,
# NaN: re-base about a finite number (0) in those entries (`torch.where` on `torch.isinf`).
# For `online_softmax_stats`: start at $(-\infty, 0)$ of shape `x.shape[:-1]`, take each
# block's own max and sum of exponentials (against that max), and merge it in.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: against logsumexp</summary>
#
# In a scratch cell, in float64: for `x = torch.randn(2, 3, 7)`, your `(m, ell)` with `block`
# 3, 1, 7 and 10 must give `m == x.amax(-1)` and `m + ell.log()` equal to
# `torch.logsumexp(x, -1)` (to about 1e-15); add 1000 to `x` and check again (no `inf`).
# Merge a part with `(-inf, 0)` on either side (the other part comes back unchanged) and two
# such parts (`(-inf, 0)`, no NaN). The formula to check yours against:
#
# $$m = \max(m_a, m_b),\qquad \ell = \ell_a\, e^{\,m_a - m} + \ell_b\, e^{\,m_b - m}.$$
#
# Delete the scratch cell before handing in.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def merge_stats(m_a, ell_a, m_b, ell_b):
    """(m, ℓ) of two parts of a row together, from each part's m, ℓ = Σ exp(x − m)."""
    # BEGIN SOLUTION
    m = torch.maximum(m_a, m_b)
    # two empty parts: m = −∞, and e^(−∞ − (−∞)) would be NaN; rescale about 0 there
    base = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    ell = ell_a * torch.exp(m_a - base) + ell_b * torch.exp(m_b - base)
    return m, ell
    # END SOLUTION


def online_softmax_stats(x, block):
    """m = max x and ℓ = Σ exp(x − m) over the last dim, merged block by block."""
    # BEGIN SOLUTION
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)  # (...,)
    ell = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)  # (...,)
    for start in range(0, x.shape[-1], block):
        xb = x[..., start : start + block]  # (..., ≤ block)
        m_b = xb.amax(dim=-1)  # (...,)
        ell_b = torch.exp(xb - m_b[..., None]).sum(dim=-1)  # (...,)
        m, ell = merge_stats(m, ell, m_b, ell_b)
    return m, ell
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1**, one line per function, compares with outputs recorded from the course's own
# solution.

# %%
check_contract("lab10", "ex1", merge_stats)
check_contract("lab10", "ex1b", online_softmax_stats)

# %% [raw]
# # BEGIN QUESTION
# name: ex2

# %% [markdown]
# ## Exercise 2 · The tiled forward with an ALiBi bias: $O$ and the row log-sum-exp $L$ (3 points)
#
# **Goal:** attention that only ever holds one `(block_q, block_k)` tile of scores *and of
# the bias*, and one number per row, $L$, that summarises the whole softmax for backward.
#
# **You derive:** one tile of the ALiBi bias from global indices, where the bias enters a tile
# of scores, how $m$, $\ell$ and `acc` follow when a tile raises the max, and $O$ and $L$ of a
# query block at the end.
#
# **You are given:** the scores $S$ (in the notation above), your merge from Exercise 1, and
# chapter 10's tiled forward without a bias.
#
# 1. Write `alibi_tile(q0, k0, bq, bk, slopes)`: the bias of the tile whose first query is
#    `q0` and first key is `k0`, shape `(H, bq, bk)`, entry `[h, r, c]` equal to
#    $-m_h\,|i - j|$ ($m_h$ = `slopes[h]`) for the **global** indices `i = q0 + r`, `j = k0 + c`. Build it on
#    `slopes`' device and dtype (float32 or float64), without building the `(Nq, Nk)` bias
#    (nor a square from index 0: the checks measure the largest tensor, at most twice the tile),
#    for a tile on, below or above the diagonal, any number of heads (one included), slopes
#    of 0 included.
# 2. Write `tiled_forward(Q, K, V, slopes, block_q, block_k, causal=False, window=None)`
#    returning `(O, L)`, `O` of shape `(B, H, Nq, d)` and `L` of shape `(B, H, Nq)`. For each
#    block of queries `Qi`, keep a running max $m$, normaliser $\ell$ (both `(B, H, bq)`) and an
#    un-normalised output `acc` (`(B, H, bq, d)`), and loop over the blocks of keys `Kj, Vj`.
#    The chapter did this without a bias; **work out** where the bias enters, what the running
#    statistics must do when a tile raises the max (Exercise 1), and how `acc` follows them.
#    It must work for any `B` and `H`, `Nq` and `Nk` in either order, block sizes that do not
#    divide `N` (a short last block), blocks of 1, a block longer than `N`, the default
#    blocks (16), slopes of 0, scores in the thousands, and with `causal=False, window=None`
#    passed explicitly. No tensor of your call may be larger than twice an input or a
#    `(B, H, bq, bk)` tile (the checks measure it, on sequences of 40–48 too): no whole
#    `(Nq, Nk)` bias or score matrix.
#
# <details><summary>Hint 1 of 4 · the idea: a tile is a part of each row</summary>
#
# Within one query block, a key block's scores are, for every row, one *part* of that row in
# the sense of Exercise 1: the running $(m, \ell)$ absorbs it by the merge. `acc` is a sum of
# the same exponentials, each times a row of $V$, so it must be re-based by the same factor as
# $\ell$. The bias depends only on the global indices and the head: a column of query indices
# `(bq, 1)` and a row of key indices `(1, bk)` broadcast to the tile, times the slopes as
# `(H, 1, 1)`.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the tile's scores</summary>
#
# `Qi` `(B, H, bq, d)` times `Kj` transposed `(B, H, d, bk)`, times $s$, then plus
# `alibi_tile(q0, k0, bq, bk, slopes)` `(H, bq, bk)`, which broadcasts over `B`. The bias is
# added *after* the scale. Use the block's real sizes `bq`, `bk` (a short last block).
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the order of the update</summary>
#
# First the new running max (old max against the tile's row max); then the tile's
# exponentials against the new max, $\tilde P$, and the factor $\alpha$ that moves the old max to
# the new one; then $\ell$ and `acc` both multiply by $\alpha$ before adding the tile's part
# (its row sums, and $\tilde P V_j$). Only after the last key block divide, once.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: against the full scores</summary>
#
# In a scratch cell, in float64, build the full scores for small shapes (`B, H = 2, 3`,
# `Nq, Nk = 5, 7` and `7, 5`, `d = 4`), with the bias from two `arange`s, and take
# `O = torch.softmax(S, -1) @ V`, `L = torch.logsumexp(S, -1)`. Yours must agree (to
# `torch.allclose`) for blocks `(2, 3)`, `(1, 1)` and `(16, 16)`, slopes `[0, 0.5, 2]`, and with `Q`
# times 100 (scores in the thousands). Compare `alibi_tile` with a slice of that full bias for
# a tile on, below and above the diagonal. The per-tile update to check yours against:
#
# $$\begin{gathered}
# m_\text{new} = \max(m, \mathrm{rowmax}\, S),\quad \tilde P = e^{S - m_\text{new}},\quad
# \alpha = e^{m - m_\text{new}}, \\
# \ell \leftarrow \alpha \ell + \mathrm{rowsum}\, \tilde P,\quad
# \mathrm{acc} \leftarrow \alpha\, \mathrm{acc} + \tilde P V_j,
# \end{gathered}$$
#
# and after the last key block $O = \mathrm{acc} / \ell$, $L = m + \log \ell$. Delete the
# scratch cell before handing in.
#
# </details>
#
# Never build the full `(Nq, Nk)` score matrix. Leave `causal` and `window` alone for now
# (Exercise 5 comes back to them): start your function with
# `if causal: raise NotImplementedError` until then.

# %% [raw]
# # BEGIN SOLUTION


# %%
def alibi_tile(q0, k0, bq, bk, slopes):
    """bias[h, r, c] = −slopes[h] · |(k0 + c) − (q0 + r)|: one tile of ALiBi bias."""
    # BEGIN SOLUTION
    rows = torch.arange(q0, q0 + bq, device=slopes.device)[:, None]  # (bq, 1)
    cols = torch.arange(k0, k0 + bk, device=slopes.device)[None, :]  # (1, bk)
    return -slopes[:, None, None] * (cols - rows).abs()  # (H, bq, bk)
    # END SOLUTION


def tiled_forward(Q, K, V, slopes, block_q=16, block_k=16, causal=False, window=None):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V and L = logsumexp, tile by tile."""
    # BEGIN SOLUTION
    Nq, d = Q.shape[-2:]
    Nk = K.shape[-2]
    scale = 1 / math.sqrt(d)
    O = torch.zeros_like(Q)  # (B, H, Nq, d)
    L = torch.zeros(Q.shape[:-1], dtype=Q.dtype, device=Q.device)  # (B, H, Nq)
    for q0 in range(0, Nq, block_q):
        Qi = Q[..., q0 : q0 + block_q, :]  # (B, H, bq, d)
        bq = Qi.shape[-2]
        # (B, H, bq)
        m = torch.full(Qi.shape[:-1], -math.inf, dtype=Q.dtype, device=Q.device)
        ell = torch.zeros_like(m)  # (B, H, bq)
        acc = torch.zeros_like(Qi)  # (B, H, bq, d)
        k_start, k_stop = 0, Nk
        if causal:  # key blocks wholly after the block's last row, or before its window
            k_stop = min(Nk, q0 + bq)
            if window is not None:
                k_start = max(0, q0 - window + 1) // block_k * block_k
        for k0 in range(k_start, k_stop, block_k):
            # (B, H, bk, d)
            Kj, Vj = (
                K[..., k0 : k0 + block_k, :],
                V[..., k0 : k0 + block_k, :],
            )
            bk = Kj.shape[-2]
            # (B, H, bq, bk)
            S = (Qi @ Kj.transpose(-2, -1)) * scale + alibi_tile(q0, k0, bq, bk, slopes)
            if causal:
                allowed = causal_tile_mask(q0, k0, bq, bk, window, Q.device)
                S = S.masked_fill(~allowed, -math.inf)
            m_new = torch.maximum(m, S.amax(dim=-1))  # (B, H, bq)
            # a row that has seen no key yet: subtract 0, not −inf (−inf + inf = NaN)
            m_safe = torch.where(torch.isinf(m_new), 0.0, m_new)
            P = torch.exp(S - m_safe[..., None])  # (B, H, bq, bk)
            alpha = torch.exp(m - m_safe)  # (B, H, bq)
            ell = alpha * ell + P.sum(dim=-1)
            acc = alpha[..., None] * acc + P @ Vj  # (B, H, bq, d)
            m = m_new
        O[..., q0 : q0 + bq, :] = acc / ell[..., None]
        L[..., q0 : q0 + bq] = m + torch.log(ell)
    return O, L
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2**, one line per function, compares with outputs recorded from the course's own
# solution (which builds the full scores and bias).

# %%
check_contract("lab10", "ex2", alibi_tile)
check_contract("lab10", "ex2b", tiled_forward)

# %% [raw]
# # BEGIN QUESTION
# name: ex3

# %% [markdown]
# ## Exercise 3 · $D = \mathrm{rowsum}(dO \circ O)$, and the backward from $O$ and $L$ alone, slopes included (3 points)
#
# **Goal:** the two facts that let the backward forget $P$ (the softmax row sum is one number
# per row computable from $O$, and $P$ itself is one $\exp$ away from $L$), and the gradient of
# a parameter that enters the scores *additively*.
#
# **You derive:** $D_i = dO_i \cdot O_i$, how $P$ comes back from $S$ and $L$, and
# `grad_slopes` from $dS$; then the four gradients on full matrices.
#
# **You are given:** softmax's backward from chapter 6 (below), the scores $S$ (in the
# notation above), and $O$, $L$ from the forward.
#
# Softmax's backward (chapter 6) is $dS = P \circ (dP - D)$ with $D_i = \sum_k P_{ik}\, dP_{ik}$ and
# $dP = dO\, V^\top$, where $dS$ is the gradient of the loss with respect to the scores $S$ that go
# into the softmax. **First, on paper:**
#
# * show that $D_i = dO_i \cdot O_i$ (write $dP_{ik}$ as a dot product of row $i$ of $dO$ with row
#   $k$ of $V$, swap the sums, and recognise $O_i = \sum_k P_{ik} V_k$). Write your one-line
#   derivation in the Markdown cell below the code (it is for you and your instructor to read:
#   no test grades it);
# * derive $\partial\,\text{Loss}/\partial\,\text{slopes}_h$. The bias $-m_h |i - j|$ is added to
#   $S$ after the scale:
#   what is the gradient of the bias entries, and how do the entries of one head add up to
#   one number?
#
# Then write two functions, with full `(Nq, Nk)` matrices this time (no tiles yet):
#
# * `row_D(O, grad_O)` → `D` of shape `(B, H, Nq)`, as $\mathrm{rowsum}(dO \circ O)$, for any
#   `B`, `H`, `d` (`d = 1` too) and `Nq` (one row too);
# * `attention_backward_from_L(Q, K, V, O, L, grad_O, slopes)` →
#   `(grad_Q, grad_K, grad_V, grad_slopes)`, using only these inputs (`grad_slopes` has the
#   shape of `slopes`, `(H,)`). Work out how to get $P$ back from $S$ and $L$ alone (what is
#   $L$?), then chapter 6's backward with $D$ in place of the row sum, then the slopes. Do not
#   call `torch.softmax` or autograd. `Nq` and `Nk` come in either order, `B` may be more
#   than 1 (each head's slope gets one number from every batch entry), and the slopes may be
#   0 or steep.
#
# <details><summary>Hint 1 of 5 · the idea: swap two sums, and the chain rule through S</summary>
#
# $D_i$ is a sum over keys $k$ of $P_{ik}\, dP_{ik}$, and $dP_{ik}$ is itself a sum over the $d$
# feature columns: swap the two sums so the sum over $k$ acts first, on $P_{ik}$ times a row of
# $V$. For the slopes: every score $S_{bhij}$ depends on one slope, $m_h$; the chain rule
# through $S$ sums, over every score that slope touches, $dS$ times the score's derivative
# with respect to the slope.
#
# </details>
#
# <details><summary>Hint 2 of 5 · a step: dP as a dot product</summary>
#
# $dP_{ik} = \sum_c dO_{ic} V_{kc}$: row $i$ of $dO$ with row $k$ of $V$. Put it into $D_i$ and
# move $\sum_k P_{ik}$ inside the sum over $c$; what is left next to $dO_{ic}$ is a
# definition from the forward.
#
# </details>
#
# <details><summary>Hint 3 of 5 · a step: P from L</summary>
#
# $L_i$ is the log of row $i$'s normaliser, $\sum_k e^{S_{ik}}$. So the softmax is $e^{S - L}$
# with $L$ broadcast along the keys: already normalised, no max, no sum. Recompute $S$ first,
# bias included.
#
# </details>
#
# <details><summary>Hint 4 of 5 · a step: one entry's derivative for the slopes</summary>
#
# $\partial S_{bhij} / \partial m_h = -|i - j|$, and 0 for every other head. The bias is added
# after the scale, so $s$ does not appear. The slope is shared by every batch entry `b`.
#
# </details>
#
# <details><summary>Hint 5 of 5 · check yourself: against autograd on the full scores</summary>
#
# In a scratch cell, in float64 (`B, H = 2, 3`, `Nq, Nk = 4, 6`, then `6, 4`, `d = 3` and
# `d = 1`), compute `O` and `L` from the full scores with `torch.softmax` and
# `torch.logsumexp`, take `Loss = (O * G).sum()` for a random `G`, and get its gradients with
# `torch.autograd.grad` with respect to `Q, K, V, slopes`. Your function, given `grad_O = G`,
# must agree to about 1e-13, with slopes 0 and steep (5). Keep autograd in the scratch cell,
# never in the graded function, and delete the cell before handing in. The formulas to check
# yours against, with $dQ, dK, dV$ the `grad_Q`, `grad_K`, `grad_V` you return:
#
# $$\begin{gathered} P = e^{S - L},\quad dV = P^\top dO,\quad dP = dO\, V^\top,\quad dS = P \circ (dP - D),\\
# dQ = dS\, K \cdot s,\quad dK = dS^\top Q \cdot s, \\
# \frac{\partial\,\text{Loss}}{\partial\,\text{slopes}_h} = -\sum_{b}\sum_{i,j} dS_{b h i j}\,|i - j|. \end{gathered}$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def row_D(O, grad_O):
    """D_i = Σ_k P_ik dP_ik, computed from O and dO alone (one number per row)."""
    return (grad_O * O).sum(dim=-1)  # SOLUTION


def attention_backward_from_L(Q, K, V, O, L, grad_O, slopes):
    """(grad_Q, grad_K, grad_V, grad_slopes) of ALiBi attention from Q, K, V, O, L."""
    # BEGIN SOLUTION
    Nq, d = Q.shape[-2:]
    Nk = K.shape[-2]
    scale = 1 / math.sqrt(d)
    D = (grad_O * O).sum(dim=-1)  # (B, H, Nq)
    rows = torch.arange(Nq, device=Q.device)[:, None]  # (Nq, 1)
    dist = (torch.arange(Nk, device=Q.device)[None, :] - rows).abs()  # (Nq, Nk)
    # (B, H, Nq, Nk)
    S = (Q @ K.transpose(-2, -1)) * scale - slopes[:, None, None] * dist
    P = torch.exp(S - L[..., None])  # (B, H, Nq, Nk), normalised
    grad_V = P.transpose(-2, -1) @ grad_O  # (B, H, Nk, d)
    dP = grad_O @ V.transpose(-2, -1)  # (B, H, Nq, Nk)
    dS = P * (dP - D[..., None])  # (B, H, Nq, Nk)
    grad_Q = (dS @ K) * scale  # (B, H, Nq, d)
    grad_K = (dS.transpose(-2, -1) @ Q) * scale  # (B, H, Nk, d)
    grad_slopes = -(dS * dist).sum(dim=(0, 2, 3))  # (H,)
    return grad_Q, grad_K, grad_V, grad_slopes
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# *Your derivations of $D_i = dO_i \cdot O_i$ and of `grad_slopes` (one line each):*
#
# ...

# %% [markdown]
# **Self-check 3**, one line per function, compares with outputs recorded from the course's own
# solution (autograd through the full scores for the gradients; `O` and `L` are the exact ones,
# so this check does not depend on your Exercise 2).

# %%
check_contract("lab10", "ex3", row_D)
check_contract("lab10", "ex3b", attention_backward_from_L)

# %% [raw]
# # BEGIN QUESTION
# name: ex4

# %% [markdown]
# ## Exercise 4 · The tiled backward, query blocks outside (4 points)
#
# **Goal:** the same gradients as Exercise 3 while only ever holding one
# `(block_q, block_k)` tile of $S$, $P$, $dP$ and $dS$ (the checks measure the largest tensor
# your function makes, on sequences of 40–48 in blocks of 8, as in Exercise 2), in the loop
# order the chapter did *not* use.
#
# **You derive:** the tiled form of Exercise 3's backward with query blocks outside: what is
# sliced once per outer pass, which gradient is local to it, which accumulate across it, and
# one tile's share of `grad_slopes`.
#
# **You are given:** the formulas of Exercise 3 (with your `row_D`), `alibi_tile`, and `O`,
# `L` from the forward.
#
# Write `tiled_backward(Q, K, V, O, L, grad_O, slopes, block_q, block_k, causal=False, window=None)`
# returning `(grad_Q, grad_K, grad_V, grad_slopes)` with the shapes of `Q, K, V, slopes`.
# The chapter's FlashAttention-2 backward loops outer over key blocks, so that `dKj`, `dVj`
# stay local to one outer pass. Here loop **outer over query blocks** `Qi, dOi` and **inner
# over key blocks** `Kj, Vj` (the order of the forward pass). **Work out** before you write:
#
# * which per-row quantities belong to a query block, and can be sliced once per outer pass;
# * which gradient is now complete after one outer pass (keep it in a local accumulator and
#   write it once), and which ones are sums over the *outer* loop (accumulate into the right
#   slice on every tile, never overwrite);
# * what one tile contributes to `grad_slopes`.
#
# <details><summary>Hint 1 of 4 · the idea: which index each gradient sums over</summary>
#
# Exercise 3's formulas hold entry by entry, so a tile (query block $i$, key block $j$) needs
# only the rows of $Q$, $dO$, $L$, $D$ in the query block and the rows of $K$, $V$ in the key
# block. Then ask, for each gradient, what it sums over: $dQ_i$ sums over keys (the inner
# loop), $dK_j$ and $dV_j$ sum over queries (the outer loop), `grad_slopes` over everything.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: one outer pass</summary>
#
# Slice `Qi`, `dOi` `(B, H, bq, d)` and the rows `q0` to `q0 + bq - 1` of $L$ and $D$, as
# `(B, H, bq, 1)` so they broadcast along the keys. Start a local `grad_Qi` of zeros; after
# the inner loop it is complete: write it into its rows of `grad_Q` once.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: one tile</summary>
#
# Recompute the tile's $S$, bias included, and $P = e^{S - L_i}$ (normalised). Then, in
# Exercise 3's order: $dV_j$'s share, $dP$, $dS$, then $dQ_i$'s and $dK_j$'s shares; add the
# shares of $dK_j$, $dV_j$ into the rows `k0` to `k0 + bk - 1` of `grad_K`, `grad_V` with
# `+=`. For `grad_slopes`, the tile's $-|i - j|$ is
# `alibi_tile(q0, k0, bq, bk, torch.ones_like(slopes))`: sum $dS$ times it over the batch and
# both tile dimensions, one number per head.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: against Exercise 3</summary>
#
# In a scratch cell, in float64 (`B, H = 2, 3`, `Nq, Nk = 7, 5` and `5, 7`, `d = 4`): your
# `tiled_backward` must agree with your `attention_backward_from_L` (or Exercise 3's
# scratch autograd reference) to about 1e-13 for blocks `(2, 3)`, `(1, 1)` and `(16, 16)`,
# slopes `[0, 0.5, 2]`. Clone the inputs first and check with `torch.equal` that none changed.
# The tile's shares to check yours against ($L_i$, $D_i$ the block's rows):
#
# $$\begin{gathered} P = e^{S - L_i},\quad dV_j \mathrel{+}= P^\top dO_i,\quad dS = P \circ (dO_i V_j^\top - D_i),\\
# dQ_i \mathrel{+}= dS\, K_j \cdot s,\quad dK_j \mathrel{+}= dS^\top Q_i \cdot s, \\
# \text{grad\_slopes}_h \mathrel{+}= -\sum_{b}\sum_{r,c} dS_{bhrc}\, |(q_0 + r) - (k_0 + c)|. \end{gathered}$$
#
# Delete the scratch cell before handing in.
#
# </details>
#
# Compute $D = \mathrm{rowsum}(dO \circ O)$ once, before the loops (your `row_D` does it; per tile
# it would be the same numbers, computed again for every key block). The checks see values and
# the largest tensor, not the loop order or where $D$ is computed: those are the exercise, and
# your instructor may read them. Leave every
# input as it came
# (`Q, K, V, O, L, grad_O, slopes`: a backward never edits its inputs in place; the checks
# compare each input's values before and after the call). The shapes and blocks are as in Exercise 2 (`N` not a multiple of the blocks,
# either order of `Nq` and `Nk`, blocks of 1 or longer than `N`, the defaults, B > 1,
# slopes of 0, `causal=False, window=None` passed). As in Exercise 2, leave `causal` and `window` for Exercise 5
# (`if causal: raise NotImplementedError`).

# %% [raw]
# # BEGIN SOLUTION


# %%
def tiled_backward(
    Q, K, V, O, L, grad_O, slopes, block_q=16, block_k=16, causal=False, window=None
):
    """(grad_Q, grad_K, grad_V, grad_slopes) from Q, K, V, O, L; query blocks outer."""
    # BEGIN SOLUTION
    Nq, d = Q.shape[-2:]
    Nk = K.shape[-2]
    scale = 1 / math.sqrt(d)
    D = (grad_O * O).sum(dim=-1)  # (B, H, Nq)
    grad_Q, grad_K, grad_V = (
        torch.zeros_like(Q),
        torch.zeros_like(K),
        torch.zeros_like(V),
    )
    grad_slopes = torch.zeros_like(slopes)  # (H,)
    ones = torch.ones_like(slopes)  # alibi_tile(..., ones) = −|i − j|
    for q0 in range(0, Nq, block_q):
        # (B, H, bq, d)
        Qi, dOi = (
            Q[..., q0 : q0 + block_q, :],
            grad_O[..., q0 : q0 + block_q, :],
        )
        bq = Qi.shape[-2]
        # (B, H, bq, 1)
        Li, Di = L[..., q0 : q0 + bq, None], D[..., q0 : q0 + bq, None]
        grad_Qi = torch.zeros_like(Qi)  # (B, H, bq, d): complete after this pass
        k_start, k_stop = 0, Nk
        if causal:  # the key blocks the forward visited
            k_stop = min(Nk, q0 + bq)
            if window is not None:
                k_start = max(0, q0 - window + 1) // block_k * block_k
        for k0 in range(k_start, k_stop, block_k):
            # (B, H, bk, d)
            Kj, Vj = (
                K[..., k0 : k0 + block_k, :],
                V[..., k0 : k0 + block_k, :],
            )
            bk = Kj.shape[-2]
            minus_dist = alibi_tile(q0, k0, bq, bk, ones)  # (H, bq, bk)
            # (B, H, bq, bk), recomputed
            S = (Qi @ Kj.transpose(-2, -1)) * scale + slopes[:, None, None] * minus_dist
            P = torch.exp(S - Li)  # (B, H, bq, bk), normalised
            if causal:
                P = P.masked_fill(
                    ~causal_tile_mask(q0, k0, bq, bk, window, Q.device), 0.0
                )
            grad_V[..., k0 : k0 + bk, :] += P.transpose(-2, -1) @ dOi  # (B, H, bk, d)
            dP = dOi @ Vj.transpose(-2, -1)  # (B, H, bq, bk)
            dS = P * (dP - Di)  # (B, H, bq, bk)
            grad_Qi += (dS @ Kj) * scale  # (B, H, bq, d)
            # (B, H, bk, d)
            grad_K[..., k0 : k0 + bk, :] += (dS.transpose(-2, -1) @ Qi) * scale
            grad_slopes += (dS * minus_dist).sum(dim=(0, 2, 3))  # (H,)
        grad_Q[..., q0 : q0 + bq, :] = grad_Qi
    return grad_Q, grad_K, grad_V, grad_slopes
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** compares with outputs recorded from the course's own solution (autograd
# through the full scores; `O` and `L` exact).

# %%
check_contract("lab10", "ex4", tiled_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex5

# %% [markdown]
# ## Exercise 5 · A sliding-window causal mask, with $N$ not a multiple of the block size (3 points)
#
# **Goal:** a *local* causal mask tile by tile: which tiles to skip at both ends, which to
# mask, what a row that sees no key in a tile does to the running max, and why the backward
# masks $P$ with zeros where the forward masked $S$ with $-\infty$.
#
# **You derive:** the visible set of one tile, which key blocks a query block can skip, what a
# row with no visible key does to the running statistics, and how the backward masks $P$.
#
# **You are given:** the causal and window rule below, and your `tiled_forward`,
# `tiled_backward`, `alibi_tile` and `row_D`.
#
# With `causal=True`, query $i$ may look at keys $j \le i$ (*top-left aligned*: what
# `causal=True` means everywhere in the course, like SDPA's `is_causal=True`, also when
# $N_q \ne N_k$; lab 6's `align="bottom_right"` is not asked for here). A **window** $w$ (an
# `int` $\ge 1$, or `None` for no window) further restricts query $i$ to the $w$ most recent keys,
# $i - w < j \le i$ (Mistral-style local attention). `window` is only used with `causal=True`.
# In global indices a tile covers queries `q0` to `q0 + bq - 1` and keys `k0` to `k0 + bk - 1`.
# The tests only use shapes where every query sees at least one key.
#
# 1. Write `causal_tile_mask(q0, k0, bq, bk, window=None, device=None)`: a `bool` tensor of
#    shape `(bq, bk)`, `True` where key `k0 + c` is visible to query `q0 + r`, for a tile
#    across the diagonal, wholly above it (all False) or wholly below it, without a window,
#    with one, and with `window=1`; made on `device` when one is given (a check passes
#    `device="meta"` and looks at where the tile was made).
# 2. Go back to `tiled_forward` (Exercise 2) and `tiled_backward` (Exercise 4), remove the
#    `raise NotImplementedError` and make `causal=True` (with and without a window) work, then
#    re-run those cells. **Work out**: which key blocks can a query block skip, before and
#    after? With a window, a row may see *no* key in the first tile it visits: what is its
#    running max then, and what does $e^{S - m_\text{new}}$ give? In the backward, $P = e^{S - L}$
#    is *not* zero where $S$ was masked (you recompute $S$ without the mask). Both must work
#    for `Nq = Nk`, `Nq < Nk`, `Nq > Nk`, with a window, `window=1`, rows that see no key in
#    the first tile they visit (no NaN), a key a row may not see that scores thousands above
#    the keys it sees (no NaN either), and B > 1. They keep calling `alibi_tile` and `row_D`
#    as before: the hidden tests run the course's there, so a mistake in `alibi_tile` or
#    `row_D` costs points once. But `tiled_forward` and `tiled_backward` themselves are graded
#    again here, with `causal=True`: a mistake in them, or a broken rule (values read out,
#    entries written), costs points in Exercise 2 or 4 and here too.
#
# <details><summary>Hint 1 of 4 · the idea: two comparisons in global indices</summary>
#
# Key $j$ is visible to query $i$ when $j \le i$ and, with a window, $j > i - w$: two
# comparisons between a column of query indices `(bq, 1)` and a row of key indices `(1, bk)`.
# A whole tile is invisible when even its most favourable corner is: compare the key block's
# first key with the query block's last row, and its last key with the window of the query
# block's first row.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: which key blocks to visit</summary>
#
# Key blocks that start after the query block's last row (`k0 > q0 + bq - 1`) are skipped:
# stop the inner loop there (or at `Nk`). With a window, those that end before the window of
# the first row (`k0 + bk - 1 <= q0 - window`) are skipped too: start at the first key that
# row sees (0 at least), rounded down to a multiple of `block_k` so the key blocks keep their
# usual boundaries. The backward visits the same tiles.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: an empty row, and the backward's P</summary>
#
# Forward: fill the masked scores with $-\infty$ before the running max. A row whose scores in
# this tile are all $-\infty$, and that has seen no key before, has $m_\text{new} = -\infty$,
# and $e^{-\infty - (-\infty)}$ is NaN: subtract 0 instead of $m_\text{new}$ in those rows
# (`torch.where`), so $\tilde P = 0$ and $\alpha = 0$ there. Backward: $e^{S - L}$ of the
# unmasked $S$ is not 0 where the forward masked it; set $P$ to 0 where the mask is `False`
# before it enters $dV$ and $dS$.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: against the full masked scores</summary>
#
# In a scratch cell, in float64: `causal_tile_mask(q0, k0, bq, bk, w)` must equal the slice
# `[q0:q0 + bq, k0:k0 + bk]` of the full mask built from two `arange`s, for tiles across,
# above and below the diagonal. Then fill the full scores with $-\infty$ where that mask is
# `False`, take `torch.softmax`, `torch.logsumexp` and autograd as in Exercise 3's check, and
# compare your `O`, `L` and gradients for `Nq = Nk = 7` with `window = 3` and blocks
# `(3, 2)` (row 5 sees no key in its first tile), `Nq, Nk = 5, 8` with `window = 1`, and
# `Nq, Nk = 8, 5` without a window (with a window there, the last rows would see no key at
# all). No NaN anywhere. The first key block to visit, to check yours against:
#
# $$k_\text{start} = \left\lfloor \max(0,\; q_0 - w + 1) / \text{block\_k} \right\rfloor \cdot \text{block\_k}.$$
#
# Delete the scratch cell before handing in.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def causal_tile_mask(q0, k0, bq, bk, window=None, device=None):
    """allowed[r, c]: key k0 + c visible to query q0 + r (j ≤ i, and i − window < j)."""
    # BEGIN SOLUTION
    rows = torch.arange(q0, q0 + bq, device=device)[:, None]  # (bq, 1)
    cols = torch.arange(k0, k0 + bk, device=device)[None, :]  # (1, bk)
    allowed = cols <= rows  # (bq, bk) bool
    if window is not None:
        allowed = allowed & (cols > rows - window)
    return allowed
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 5**, one line per function, compares with outputs recorded from the course's own
# solution. Causal means top-left here (lab 6's bottom-right is not asked for); a NaN in a row
# that sees no key in its first tile fails.

# %%
check_contract("lab10", "ex5", causal_tile_mask)
check_contract("lab10", "ex5b", tiled_forward)
check_contract("lab10", "ex5c", tiled_backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex6

# %% [markdown]
# ## Exercise 6 · An `autograd.Function` that saves only what is linear in $N$ (2 points)
#
# **Goal:** plug your forward and backward into autograd, keeping for backward only tensors of
# size $O(N d)$ (and the slopes), and prove the result, slopes included, with `gradcheck`.
#
# **You derive:** which tensors the backward needs saved (none $N \times N$), and how
# `backward`'s return values line up with `forward`'s eight inputs.
#
# **You are given:** your `tiled_forward` and `tiled_backward`, and the course's rules for
# custom Functions (chapter 4: `forward` without `ctx`, `setup_context`,
# `@once_differentiable`).
#
# Fill in `FlashAttentionFn`, following the course's rules for custom Functions:
#
# * `forward(Q, K, V, slopes, causal, window, block_q, block_k)` (no `ctx`) returns `(O, L)`
#   from your `tiled_forward`;
# * `setup_context(ctx, inputs, output)` saves, with `ctx.save_for_backward`, exactly what your
#   `tiled_backward` needs (which tensors are they?), keeps the non-tensor arguments on `ctx`,
#   and marks `L` non-differentiable (`ctx.mark_non_differentiable(L)`: it is returned for
#   inspection only);
# * `backward(ctx, grad_O, grad_L)` unpacks `ctx.saved_tensors`, calls your `tiled_backward`,
#   returns a gradient for each tensor input gated on `ctx.needs_input_grad` (`None` when it is
#   not needed), and `None` for each non-tensor input.
#
# Then complete the wrapper `flash_attn(Q, K, V, slopes, causal, window, block_q, block_k)`,
# which returns `O` only. Both are checked through autograd (what `apply` returns, the four
# gradients autograd gets, and the shapes of what the Function saved) with `causal=False`,
# `causal=True`, a window, `Nq > Nk`, B > 1, only `V` needing a gradient, and the
# wrapper's defaults; the Function's backward returns `None` for every input that needs no
# gradient (the checks look at what it returns, not only at what autograd keeps). This
# exercise builds on Exercises 2, 4 and 5: the self-check runs your own functions (a mistake
# there shows here too, and the ✗ says so), while the hidden tests run the course's
# `tiled_forward` and `tiled_backward` in their place, so a mistake costs points once, where
# it is. It is the last step, and your instructor may make it optional.
#
# <details><summary>Hint 1 of 4 · the idea: read `tiled_backward`'s signature</summary>
#
# Every tensor `tiled_backward` takes, except `grad_O`, must come from `ctx.saved_tensors`;
# `grad_O` arrives as `backward`'s argument. List them: each is an input or an output of
# `forward`, so write each one's shape and check that none is $N \times N$. The arguments that
# are not tensors cannot be saved that way: where else can `backward` find them?
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: two outputs</summary>
#
# `forward` returns the pair `(O, L)`: `setup_context` receives it as `output`, and
# `backward` gets one gradient per output, `grad_O` and `grad_L`. `L` is marked
# non-differentiable, so `grad_L` carries nothing: leave it unused. `flash_attn` unpacks the
# pair from `apply` and returns `O`.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: what `backward` returns</summary>
#
# One value per input of `forward`, in its order: eight. The first four are
# `tiled_backward`'s gradients, each kept only if its flag in `ctx.needs_input_grad` is
# `True` (else `None`); the last four, for `causal`, `window`, `block_q`, `block_k`, are
# `None`.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: gradcheck and the saved shapes</summary>
#
# In a scratch cell, in float64, with `B, H = 1, 2`, `Nq, Nk = 5, 4`, `d = 3`, slopes
# `[0.3, 1.0]`, all four requiring a gradient:
# `torch.autograd.gradcheck(lambda q, k, v, sl: flash_attn(q, k, v, sl, c, w, 2, 3), (Q, K, V, slopes))`
# must be `True` for `(c, w)` = `(False, None)`, `(True, None)` and `(True, 2)`.
# `[t.shape for t in O.grad_fn.saved_tensors]` shows what you saved: nothing `(Nq, Nk)`.
# With only `V` requiring a gradient, `O.grad_fn.apply(torch.ones_like(O), None)` calls your
# `backward` directly: it must return eight values, all `None` but the third (`grad_V`).
# Delete the scratch cell before handing in.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
class FlashAttentionFn(torch.autograd.Function):
    """(O, L) = tiled_forward(Q, K, V, slopes); backward recomputes P tile by tile."""

    @staticmethod
    def forward(Q, K, V, slopes, causal, window, block_q, block_k):
        """(O, L) by the tiled forward; no ctx here."""
        # BEGIN SOLUTION
        return tiled_forward(Q, K, V, slopes, block_q, block_k, causal, window)
        # END SOLUTION

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save what backward needs (nothing N × N) and the non-tensor arguments."""
        # BEGIN SOLUTION
        Q, K, V, slopes, causal, window, block_q, block_k = inputs
        O, L = output
        ctx.save_for_backward(Q, K, V, slopes, O, L)
        ctx.causal, ctx.window = causal, window
        ctx.block_q, ctx.block_k = block_q, block_k
        ctx.mark_non_differentiable(L)
        # END SOLUTION

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_O, grad_L):
        """Gradients of Q, K, V, slopes by the tiled backward; None for the rest."""
        # BEGIN SOLUTION
        Q, K, V, slopes, O, L = ctx.saved_tensors
        grads = tiled_backward(
            *(Q, K, V, O, L, grad_O, slopes),
            *(ctx.block_q, ctx.block_k, ctx.causal, ctx.window),
        )
        needs = ctx.needs_input_grad[:4]
        gated = tuple(g if need else None for g, need in zip(grads, needs))
        return (*gated, None, None, None, None)
        # END SOLUTION


def flash_attn(Q, K, V, slopes, causal=False, window=None, block_q=16, block_k=16):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V by FlashAttentionFn (L dropped)."""
    # BEGIN SOLUTION
    O, L = FlashAttentionFn.apply(Q, K, V, slopes, causal, window, block_q, block_k)
    return O
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 6**, one line per graded name, compares with outputs recorded from the course's
# own solution.
#
# It compares what `FlashAttentionFn.apply` returns and which of its outputs autograd tracks
# (`O` only: `L` marked non-differentiable), the gradients autograd gets from it (the slopes
# included), and the shapes of the tensors it keeps for backward (`Q, K, V, O`, `L` and
# `slopes`, saved, none held on `ctx` as an attribute: nothing $N \times N$); then the same
# through `flash_attn`.

# %%
check_contract("lab10", "ex6", FlashAttentionFn)
check_contract("lab10", "ex6b", flash_attn)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the function names: the grader calls `merge_stats`,
# `online_softmax_stats`, `alibi_tile`, `tiled_forward`, `row_D`, `attention_backward_from_L`,
# `tiled_backward`, `causal_tile_mask`, `FlashAttentionFn` and `flash_attn`.
#
# **Going further.** The chapter's `helpers.flash` is the plain (bias-free) algorithm with the
# other backward loop order, `(B, H, N, d)` checks and a scale argument, and
# `helpers/flash_triton.py` runs it as Triton kernels on a GPU: compare your loops with its
# `_attn_fwd`, `_bwd_dk_dv` and `_bwd_dq`. Why do GPU kernels prefer the key-outer order for
# `dK`, `dV` (think of which writes would collide between thread blocks in your query-outer
# loop)?
