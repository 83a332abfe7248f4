# %% [raw]
# # ASSIGNMENT CONFIG
# name: lab10_flash_attention
# init_cell: false
# check_all_cell: false
# export_cell: false
# run_tests: true
# generate:
#   pdf: false
#   show_stdout: false

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
# cell right below. It answers in one line: `✓` matches (the `max|Δ|` is round-off), `✗`
# what is wrong and where, or `·` not implemented yet. Your instructor grades the notebook
# you hand in with hidden tests that call the same functions on other inputs. Formulas you
# are asked to derive sit behind **Hint** blocks: try first, then open them.

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
from torch.autograd.function import once_differentiable

from helpers.device import get_device, no_tf32, randn
from helpers.flash import naive_attention
from helpers.labcheck import autograd_grads, check, check_gradcheck, checker, evaluate

dev = get_device()
no_tf32()
dtype = torch.float64  # float64: your tiles and the reference then agree to ~1e-12


def named(names, fn, *args, **kwargs):
    """{name: part} of fn(*args, **kwargs); all None while fn is not written yet."""
    try:
        out = fn(*args, **kwargs)
    except NotImplementedError:
        out = None
    if out is None or out is Ellipsis:
        return dict.fromkeys(names)
    out = out if isinstance(out, (tuple, list)) else (out,)
    if len(out) != len(names):
        raise ValueError(
            f"{fn.__name__} returned {len(out)} values, "
            f"expected {len(names)} ({', '.join(names)})"
        )
    return dict(zip(names, out))


def alibi_attention(Q, K, V, slopes, causal=False, window=None, shift=0):
    """The reference (O, L): the full (Nq, Nk) scores and bias, O through SDPA.

    shift: query i sees keys j ≤ i + shift (lab 6's bottom-right alignment: Nk − Nq).
    """
    Nq, Nk = Q.shape[-2], K.shape[-2]
    i = torch.arange(Nq, device=Q.device)[:, None]  # (Nq, 1)
    j = torch.arange(Nk, device=Q.device)[None, :]  # (1, Nk)
    bias = -slopes[:, None, None] * (j - i).abs()  # (H, Nq, Nk)
    if causal:
        visible = j <= i + shift
        if window is not None:
            visible = visible & (j > i + shift - window)
        bias = bias.masked_fill(~visible, -math.inf)
    # (B, H, Nq, Nk)
    S = (Q @ K.transpose(-2, -1)) / math.sqrt(Q.shape[-1]) + bias
    O = F.scaled_dot_product_attention(Q, K, V, attn_mask=bias)  # (B, H, Nq, d)
    return O, torch.logsumexp(S, dim=-1)


# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2
# by_hand: [helpers.flash.online_softmax, helpers.flash.online_softmax_trace]

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
# <details><summary>Hint: the merge</summary>
#
# Re-base each sum to the common max with $e^{x - m} = e^{x - m_a}\, e^{m_a - m}$:
#
# $$m = \max(m_a, m_b),\qquad \ell = \ell_a\, e^{\,m_a - m} + \ell_b\, e^{\,m_b - m}.$$
#
# </details>
#
# 1. Write `merge_stats(m_a, ell_a, m_b, ell_b)` → `(m, ell)`, elementwise over any shape.
#    A part with no entries has $m = -\infty$, $\ell = 0$: your merge must then return the other part
#    unchanged ($e^{-\infty} = 0$).
# 2. Write `online_softmax_stats(x, block)` for `x` of shape `(..., n)`: walk over the last
#    dimension in blocks of `block` entries (the last block may be shorter), compute each
#    block's own $(m_b, \ell_b)$ (a block is small: two passes over it are fine), and fold them
#    into the running $(m, \ell)$, started at $(-\infty, 0)$, with **your** `merge_stats`. Return
#    `(m, ell)`, both of shape `(...)`: then $\mathrm{softmax}(x)$ is
#    `torch.exp(x - m[..., None]) / ell[..., None]`.
#    Do not compute `x.amax(-1)` over the whole row: the point is to see each block once.

# %% [raw]
# # BEGIN SOLUTION


# %%
def merge_stats(m_a, ell_a, m_b, ell_b):
    """(m, ℓ) of two parts of a row together, from each part's m, ℓ = Σ exp(x − m)."""
    # BEGIN SOLUTION
    m = torch.maximum(m_a, m_b)
    ell = ell_a * torch.exp(m_a - m) + ell_b * torch.exp(m_b - m)
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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# two parts of 6 rows; the larger max lies in part a for some rows, in part b for others
_xa = randn(6, 5, seed=1003, dtype=torch.float64) * 3
_xb = randn(6, 4, seed=1004, dtype=torch.float64) * 3
_xa[0, 2], _xb[1, 3] = 12.0, 12.0
_stats = [
    (x.amax(-1), torch.exp(x - x.amax(-1, keepdim=True)).sum(-1)) for x in (_xa, _xb)
]
_m, _ell = merge_stats(*_stats[0], *_stats[1])
_x = torch.cat([_xa, _xb], -1)
assert torch.allclose(_m, _x.amax(-1), atol=1e-12)
assert torch.allclose(
    _ell, torch.exp(_x - _x.amax(-1, keepdim=True)).sum(-1), atol=1e-10, rtol=1e-10
)
# an empty part (m = −inf, ℓ = 0) leaves the other one as it is, on either side
_empty = (torch.full((6,), -torch.inf, dtype=torch.float64), torch.zeros(6).double())
for _args in ((*_empty, *_stats[0]), (*_stats[0], *_empty)):
    _m, _ell = merge_stats(*_args)
    assert torch.allclose(_m, _stats[0][0]) and torch.allclose(_ell, _stats[0][1])

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_x = randn(3, 2, 13, seed=1001, dtype=torch.float64) * 3
_x[0, 1, 12] = 9.0  # the max in the last, short block: ℓ must be rescaled
_m, _ell = online_softmax_stats(_x, 4)
assert _m.shape == (3, 2) and _ell.shape == (3, 2)
assert torch.allclose(_m, _x.amax(-1), atol=1e-12)
assert torch.allclose(
    _ell, torch.exp(_x - _x.amax(-1, keepdim=True)).sum(-1), atol=1e-10, rtol=1e-10
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# scores near 1000: exp(x) overflows float64, exp(x − m) does not;
# block 1 and a block longer than the row
_x = randn(4, 7, seed=1002, dtype=torch.float64) * 5 + 1000
for _block in (1, 3, 10):
    _m, _ell = online_softmax_stats(_x, _block)
    assert torch.isfinite(_ell).all()
    assert torch.allclose(
        torch.exp(_x - _m[:, None]) / _ell[:, None], torch.softmax(_x, -1), atol=1e-12
    )

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1**, one line for both functions (references: the two-pass $m = \max x$,
# $\ell = \sum e^{x - m}$ of the joined row for the merge, on parts of 5 and 4 entries where the
# larger max sits on one side in some rows and on the other side in the rest; then the same on
# rows of 10, first as one block of 10 (one merge into the starting $(-\infty, 0)$), then in
# blocks of 3, with a late maximum so that $\ell$ has to be rescaled). When your numbers are
# those of a typical mistake, the ✗ line names it:

# %%
x_a = randn(2, 3, 5, seed=11, dtype=dtype, device=dev) * 2
x_b = randn(2, 3, 4, seed=12, dtype=dtype, device=dev) * 2
x_a[0, 1, 3], x_b[1, 2, 0] = 6.0, 6.0  # the larger max in part a, then in part b
x_ab = torch.cat([x_a, x_b], dim=-1)
x_test = randn(2, 3, 10, seed=1, dtype=dtype, device=dev) * 2
x_test[1, 2, 9] = 7.0  # a late maximum, in the last (short) block


def two_pass(x):
    """(max x, Σ exp(x − max x)) over the last dim: the statistics of a whole part."""
    m = x.amax(-1)
    return m, torch.exp(x - m[..., None]).sum(-1)


@checker
def exercise_1(x_a, x_b, x_test):
    """Your merge of the two parts' statistics, then your one-pass ones, by name."""
    return {
        **named(
            ("m (merge)", "ell (merge)"), merge_stats, *two_pass(x_a), *two_pass(x_b)
        ),
        **named(("m (one block)", "ell (one block)"), online_softmax_stats, x_test, 10),
        **named(("m", "ell"), online_softmax_stats, x_test, 3),
    }


def about(x, m):
    """Σ exp(x − m) over the last dim: a part's sum about another max m."""
    return torch.exp(x - m[..., None]).sum(-1)


# known wrong answers, each computed from the parts' entries
(m_a, ell_a), (m_b, ell_b), (m_ab, _) = two_pass(x_a), two_pass(x_b), two_pass(x_ab)
only_b = ell_a + about(x_b, m_ab)  # part a's sum left about m_a
wrong_way = about(x_a, 2 * m_a - m_ab) + about(x_b, 2 * m_b - m_ab)
other_max = about(x_a, m_a - m_b + m_ab) + about(x_b, m_b - m_a + m_ab)
first_9 = x_test[..., :9].amax(-1)  # the max of entries 0–8
mistakes = {
    "m (merge)": {"m_a (part b's max ignored)": m_a},
    "ell (merge)": {
        "ℓ_a + ℓ_b: the sums added without rescaling": ell_a + ell_b,
        "only part b's sum rescaled (part a's left about m_a)": only_b,
        "each sum rescaled the wrong way round, by e^(m − m_a)": wrong_way,
        "each sum rescaled by the other part's max": other_max,
    },
    "m (one block)": {
        "0, the start's ℓ (merge_stats's arguments out of order?)": 0 * m_ab
    },
    "ell (one block)": {"Σ e^x (the block's max not subtracted)": x_test.exp().sum(-1)},
    "m": {"the max of entries 0–8 (the last, short block dropped)": first_9},
}
names = ("m (merge)", "ell (merge)", "m (one block)", "ell (one block)", "m", "ell")
check(
    exercise_1,
    dict(zip(names, (*two_pass(x_ab), *two_pass(x_test), *two_pass(x_test)))),
    args=(x_a, x_b, x_test),
    name="Exercise 1 · merge_stats and online_softmax_stats",
    against="the two-pass max and sum",
    mistakes=mistakes,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 3
# by_hand: [helpers.flash.naive_attention, helpers.flash.flash_forward, helpers.flash.flash_attention, torch.nn.functional.scaled_dot_product_attention]

# %% [markdown]
# ## Exercise 2 · The tiled forward with an ALiBi bias: $O$ and the row log-sum-exp $L$ (3 points)
#
# **Goal:** attention that only ever holds one `(block_q, block_k)` tile of scores *and of
# the bias*, and one number per row, $L$, that summarises the whole softmax for backward.
#
# 1. Write `alibi_tile(q0, k0, bq, bk, slopes)`: the bias of the tile whose first query is
#    `q0` and first key is `k0`, shape `(H, bq, bk)`, entry `[h, r, c]` equal to
#    $-m_h\,|i - j|$ ($m_h$ = `slopes[h]`) for the **global** indices `i = q0 + r`, `j = k0 + c`. Build it on
#    `slopes`' device and dtype, without building the `(Nq, Nk)` bias.
# 2. Write `tiled_forward(Q, K, V, slopes, block_q, block_k, causal=False, window=None)`
#    returning `(O, L)`, `O` of shape `(B, H, Nq, d)` and `L` of shape `(B, H, Nq)`. For each
#    block of queries `Qi`, keep a running max $m$, normaliser $\ell$ (both `(B, H, bq)`) and an
#    un-normalised output `acc` (`(B, H, bq, d)`), and loop over the blocks of keys `Kj, Vj`.
#    The chapter did this without a bias; **work out** where the bias enters, what the running
#    statistics must do when a tile raises the max (Exercise 1), and how `acc` follows them.
#
# <details><summary>Hint: one tile</summary>
#
# * $S = Q_i K_j^\top \cdot s$ + `alibi_tile(q0, k0, bq, bk, slopes)`, the only scores in
#   memory (the bias is added *after* the scale);
# * $m_\text{new} = \max(m, \mathrm{rowmax}\, S)$, $\tilde P = e^{S - m_\text{new}}$,
#   $\alpha = e^{m - m_\text{new}}$;
# * $\ell \leftarrow \alpha \ell + \mathrm{rowsum}\, \tilde P$ and
#   $\mathrm{acc} \leftarrow \alpha\, \mathrm{acc} + \tilde P V_j$: the accumulator is rescaled by
#   the same $\alpha$.
#
# After the last key block, $O = \mathrm{acc} / \ell$ and $L = m + \log \ell$ for those rows.
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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

_sl = torch.tensor([0.5, 0.25, 2.0], dtype=torch.float64)
_T = alibi_tile(3, 5, 4, 6, _sl)
_i, _j = torch.arange(3, 7)[:, None], torch.arange(5, 11)[None, :]
assert _T.shape == (3, 4, 6) and _T.dtype == torch.float64
assert torch.allclose(_T, -_sl[:, None, None] * (_j - _i).abs(), atol=1e-12)
# a tile below the diagonal (keys before the queries) and one above it
for _q0, _k0 in ((6, 0), (0, 6)):
    _i, _j = torch.arange(_q0, _q0 + 3)[:, None], torch.arange(_k0, _k0 + 2)[None, :]
    _ref = -_sl[:, None, None] * (_j - _i).abs()
    assert torch.allclose(alibi_tile(_q0, _k0, 3, 2, _sl), _ref, atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# Nq ≠ Nk, neither a multiple of its block, d = 3 (so 1/√d is irrational)
_Q, _K, _V = (
    randn(2, 2, 9, 3, seed=2001, dtype=torch.float64),
    randn(2, 2, 14, 3, seed=2002, dtype=torch.float64),
    randn(2, 2, 14, 3, seed=2003, dtype=torch.float64),
)
_sl = torch.tensor([0.7, 0.1], dtype=torch.float64)
_i, _j = torch.arange(9)[:, None], torch.arange(14)[None, :]
_S = _Q @ _K.transpose(-2, -1) / 3**0.5 - _sl[:, None, None] * (_j - _i).abs()
_O_ref, _L_ref = torch.softmax(_S, -1) @ _V, torch.logsumexp(_S, -1)
for _bq, _bk in ((4, 5), (1, 100)):
    _O, _L = tiled_forward(_Q, _K, _V, _sl, _bq, _bk)
    assert _O.shape == (2, 2, 9, 3) and torch.allclose(
        _O, _O_ref, atol=1e-10, rtol=1e-8
    )
    assert _L.shape == (2, 2, 9) and torch.allclose(_L, _L_ref, atol=1e-10, rtol=1e-8)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.flash import naive_attention

# scores in the thousands: exp(S) overflows float64, exp(S − m) does not;
# slopes of zero: plain attention
_Q, _K, _V = (
    randn(1, 2, 8, 4, seed=2007, dtype=torch.float64) * 40,
    randn(1, 2, 11, 4, seed=2008, dtype=torch.float64) * 40,
    randn(1, 2, 11, 4, seed=2009, dtype=torch.float64),
)
_O, _L = tiled_forward(_Q, _K, _V, torch.zeros(2, dtype=torch.float64), 3, 4)
_O_ref, _L_ref = naive_attention(_Q, _K, _V, return_lse=True)
assert torch.isfinite(_O).all() and torch.allclose(_O, _O_ref, atol=1e-9, rtol=1e-8)
assert torch.allclose(_L, _L_ref, atol=1e-9, rtol=1e-10)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2**, one line for both functions (references: the bias of the tile at queries
# 4…7, keys 3…8, from the global distances $|j - i|$; then `alibi_attention` above, which builds
# the full scores and bias, with $L$ by `torch.logsumexp`, first with slopes of zero (plain
# attention: if only the lines with the bias are wrong, the bias is), then with two different
# slopes. $N = 11$ in blocks of 4 queries and 3 keys, so both last blocks are short):

# %%
Q = randn(1, 2, 11, 4, seed=2, dtype=dtype, device=dev)
K = randn(1, 2, 11, 4, seed=3, dtype=dtype, device=dev)
V = randn(1, 2, 11, 4, seed=4, dtype=dtype, device=dev)
slopes = torch.tensor([0.5, 0.125], dtype=dtype, device=dev)
no_slopes = torch.zeros_like(slopes)
i = torch.arange(11, device=dev)  # the global indices of queries and keys
bias_tile = -slopes[:, None, None] * (i[None, 3:9] - i[4:8, None]).abs()  # (H, 4, 6)
expected = dict(
    zip(
        ("bias tile", "O (slopes 0)", "L (slopes 0)", "O", "L"),
        (
            bias_tile,
            *alibi_attention(Q, K, V, no_slopes),
            *alibi_attention(Q, K, V, slopes),
        ),
    )
)


@checker
def exercise_2(Q, K, V, slopes):
    """Your bias tile, then your O and L without and with the bias, by name."""
    return {
        **named(("bias tile",), alibi_tile, 4, 3, 4, 6, slopes),
        **named(
            ("O (slopes 0)", "L (slopes 0)"),
            tiled_forward,
            Q,
            K,
            V,
            torch.zeros_like(slopes),
            4,
            3,
        ),
        **named(("O", "L"), tiled_forward, Q, K, V, slopes, 4, 3),
    }


d = Q.shape[-1]
S0 = Q @ K.transpose(-2, -1) / math.sqrt(d)  # (1, 2, 11, 11), slopes 0
O0, L0 = expected["O (slopes 0)"], expected["L (slopes 0)"]
ell0 = torch.exp(L0 - S0.amax(-1))  # (1, 2, 11): Σ exp(S − max S) per row
unscaled = alibi_attention(Q * math.sqrt(d), K, V, no_slopes)[0]  # S = Q Kᵀ
bias_scaled = alibi_attention(Q, K, V, slopes / math.sqrt(d))[0]
tile_at_0 = -slopes[:, None, None] * (i[None, :6] - i[:4, None]).abs()
signed = -slopes[:, None, None] * (i[None, 3:9] - i[4:8, None])  # no |·|
mistakes = {  # known wrong answers, computed from the references
    "bias tile": {
        "the tile at (0, 0) (q0, k0 not added)": tile_at_0,
        "−m·(j − i), the signed distance (no |·|)": signed,
    },
    "O (slopes 0)": {
        "acc, not divided by ℓ at the end": O0 * ell0[..., None],
        "O without the 1/√d scale": unscaled,
    },
    "L (slopes 0)": {"the row max m (log ℓ not added)": S0.amax(-1)},
    "O": {
        "O with slopes 0 (the bias left out of S)": O0,
        "O with the bias scaled by 1/√d too": bias_scaled,
    },
}
last_block = (i >= 8)[:, None]  # (11, 1): queries 8…10, the last (short) block
late_max = (S0.argmax(-1) >= 3)[..., None]  # rows whose max score is past keys 0…2
regions = {
    "O (slopes 0)": {
        "i = 8…10, the last (short) query block": last_block,
        "the row's max is past the first key tile (acc not rescaled by α?)": late_max,
    },
    "L (slopes 0)": {"i = 8…10, the last (short) query block": last_block[:, 0]},
}
check(
    exercise_2,
    expected,
    args=(Q, K, V, slopes),
    name="Exercise 2 · alibi_tile and tiled_forward",
    against="the full bias and scores",
    mistakes=mistakes,
    regions=regions,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 3
# by_hand: [autograd, helpers.flash.naive_attention, helpers.flash.flash_backward, helpers.flash.flash_attention, torch.nn.functional.scaled_dot_product_attention]

# %% [markdown]
# ## Exercise 3 · $D = \mathrm{rowsum}(dO \circ O)$, and the backward from $O$ and $L$ alone, slopes included (3 points)
#
# **Goal:** the two facts that let the backward forget $P$ (the softmax row sum is one number
# per row computable from $O$, and $P$ itself is one $\exp$ away from $L$), and the gradient of
# a parameter that enters the scores *additively*.
#
# Softmax's backward (chapter 6) is $dS = P \circ (dP - D)$ with $D_i = \sum_k P_{ik}\, dP_{ik}$ and
# $dP = dO\, V^\top$, where $dS$ is the gradient of the loss with respect to the scores $S$ that go
# into the softmax. **First, on paper:**
#
# * show that $D_i = dO_i \cdot O_i$ (write $dP_{ik}$ as a dot product of row $i$ of $dO$ with row
#   $k$ of $V$, swap the sums, and recognise $O_i = \sum_k P_{ik} V_k$). Write your one-line
#   derivation in the Markdown cell below the code;
# * derive $\partial\,\text{Loss}/\partial\,\text{slopes}_h$. The bias $-m_h |i - j|$ is added to
#   $S$ after the scale:
#   what is the gradient of the bias entries, and how do the entries of one head add up to
#   one number?
#
# Then write two functions, with full `(Nq, Nk)` matrices this time (no tiles yet):
#
# * `row_D(O, grad_O)` → `D` of shape `(B, H, Nq)`, as $\mathrm{rowsum}(dO \circ O)$;
# * `attention_backward_from_L(Q, K, V, O, L, grad_O, slopes)` →
#   `(grad_Q, grad_K, grad_V, grad_slopes)`, using only these inputs (`grad_slopes` has the
#   shape of `slopes`, `(H,)`). Work out how to get $P$ back from $S$ and $L$ alone (what is
#   $L$?), then chapter 6's backward with $D$ in place of the row sum, then the slopes. Do not
#   call `torch.softmax` or autograd.
#
# <details><summary>Hint: the recipe</summary>
#
# Recompute $S = Q K^\top \cdot s - m_h |i - j|$, then $P = e^{S - L}$ (already normalised:
# $L = \mathrm{logsumexp}(S)$), and
#
# $$\begin{aligned} dV &= P^\top dO, & dP &= dO\, V^\top, & dS &= P \circ (dP - D),\\
# dQ &= dS\, K \cdot s, & dK &= dS^\top Q \cdot s, \end{aligned}$$
#
# with $dQ, dK, dV$ the `grad_Q`, `grad_K`, `grad_V` you return. The bias is added
# to $S$ unscaled, so its gradient is $dS$ itself, and
#
# $$\frac{\partial\,\text{Loss}}{\partial\,\text{slopes}_h} = -\sum_{b}\sum_{i,j} dS_{b h i j}\,|i - j|,$$
#
# summed over the batch and both sequence dimensions (no $s$).
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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_O, _gO = (
    randn(2, 3, 5, 4, seed=3001, dtype=torch.float64),
    randn(2, 3, 5, 4, seed=3002, dtype=torch.float64),
)
_D = row_D(_O, _gO)
assert _D.shape == (2, 3, 5) and torch.allclose(
    _D, torch.einsum("bhnd,bhnd->bhn", _O, _gO), atol=1e-12
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as F

from helpers.device import randn

# Nq ≠ Nk, batch 2 and d = 3: the scale 1/√3 and every shape must be right
_Q, _K, _V = (
    randn(2, 3, 4, 3, seed=3007, dtype=torch.float64),
    randn(2, 3, 7, 3, seed=3008, dtype=torch.float64),
    randn(2, 3, 7, 3, seed=3009, dtype=torch.float64),
)
_sl = torch.tensor([0.9, 0.3, 0.05], dtype=torch.float64)
_gO = randn(2, 3, 4, 3, seed=3010, dtype=torch.float64)
_dist = (torch.arange(7)[None, :] - torch.arange(4)[:, None]).abs()
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V, _sl)]
_bias = -_leaves[3][:, None, None] * _dist
_O = F.scaled_dot_product_attention(*_leaves[:3], attn_mask=_bias)
_L = torch.logsumexp(_leaves[0] @ _leaves[1].transpose(-2, -1) / 3**0.5 + _bias, -1)
_ref = torch.autograd.grad(_O, _leaves, _gO)
_out = attention_backward_from_L(_Q, _K, _V, _O.detach(), _L.detach(), _gO, _sl)
assert len(_out) == 4
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-10, rtol=1e-8)
    for o, r in zip(_out[:3], _ref[:3])
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as F

from helpers.device import randn

# grad_slopes: one number per head, summed over the batch and both sequence dims
_Q, _K, _V = (
    randn(3, 2, 6, 5, seed=3003, dtype=torch.float64),
    randn(3, 2, 5, 5, seed=3004, dtype=torch.float64),
    randn(3, 2, 5, 5, seed=3005, dtype=torch.float64),
)
_sl = torch.tensor([0.4, 0.0], dtype=torch.float64)
_gO = randn(3, 2, 6, 5, seed=3006, dtype=torch.float64)
_dist = (torch.arange(5)[None, :] - torch.arange(6)[:, None]).abs()
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V, _sl)]
_bias = -_leaves[3][:, None, None] * _dist
_O = F.scaled_dot_product_attention(*_leaves[:3], attn_mask=_bias)
_L = torch.logsumexp(_leaves[0] @ _leaves[1].transpose(-2, -1) / 5**0.5 + _bias, -1)
_ref = torch.autograd.grad(_O, _leaves, _gO)
_out = attention_backward_from_L(_Q, _K, _V, _O.detach(), _L.detach(), _gO, _sl)
assert _out[3].shape == (2,)
assert torch.allclose(_out[3], _ref[3], atol=1e-10, rtol=1e-8)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# *Your derivations of $D_i = dO_i \cdot O_i$ and of `grad_slopes` (one line each):*
#
# ...

# %% [markdown]
# **Self-check 3**, one line for both functions (references: $\mathrm{rowsum}(dP \circ P)$ with the
# full softmax $P$ and $dP = dO\, V^\top$, which your `row_D` must equal; autograd through
# `alibi_attention` for the four gradients, `grad_V` first: it depends on $P$ alone. `O` and
# `L` come from `alibi_attention`, so this check does not depend on your Exercise 2):

# %%
grad_O = randn(1, 2, 11, 4, seed=5, dtype=dtype, device=dev)
O_ref, L_ref = alibi_attention(Q, K, V, slopes)
dist_full = (
    torch.arange(11, device=dev)[None, :] - torch.arange(11, device=dev)[:, None]
).abs()  # (11, 11)
d = Q.shape[-1]
# (1, 2, 11, 11)
S_full = (Q @ K.transpose(-2, -1)) / math.sqrt(d) - slopes[:, None, None] * dist_full
P_full = torch.softmax(S_full, dim=-1)  # (1, 2, 11, 11)
dP_full = grad_O @ V.transpose(-2, -1)  # (1, 2, 11, 11)
factors = {"√d": math.sqrt(d), "d": d}  # the constants a ✗ may be off by
D_full = (P_full * dP_full).sum(-1)  # (1, 2, 11)
# what grad_Q loses when dS forgets its − D: −(P ∘ D) K · s, (1, 2, 11, 4)
minus_D_part = -((P_full * D_full[..., None]) @ K) / math.sqrt(d)
grad_Q_ref, grad_K_ref, grad_V_ref, grad_slopes_ref = autograd_grads(
    lambda q, k, v, s: alibi_attention(q, k, v, s)[0], (Q, K, V, slopes), grad_O
)
# grad_V is P's alone: it comes first, so that a wrong P is named there
expected = dict(
    zip(
        ("D", "grad_V", "grad_Q", "grad_K", "grad_slopes"),
        (D_full, grad_V_ref, grad_Q_ref, grad_K_ref, grad_slopes_ref),
    )
)
# dS = ∂Loss/∂S by autograd through the softmax, (1, 2, 11, 11)
dS_full = autograd_grads(lambda s: torch.softmax(s, -1) @ V, (S_full,), grad_O)[0]


def grad_V_from(P):
    """autograd's grad_V of O = P V, for another P (the one a mistake recomputes)."""
    return autograd_grads(lambda v: P @ v, (V,), grad_O)[0]


# the − D part of dS with rowsum(dO) in place of D
minus_dO = -((P_full * grad_O.sum(-1)[..., None]) @ K) / math.sqrt(d)
P_e_S = P_full * L_ref.exp()[..., None]  # e^S
P_no_bias = P_full * torch.exp(slopes[:, None, None] * dist_full)  # e^(S − bias − L)
mistakes = {  # known wrong answers, computed from the references
    "grad_V": {
        "that of P = e^S (L not subtracted)": grad_V_from(P_e_S),
        "that of P recomputed without the bias": grad_V_from(P_no_bias),
    },
    "grad_Q": {
        "dS with D = rowsum(dO) (O left out of D)": grad_Q_ref - minus_D_part + minus_dO
    },
    "grad_K": {"dS·Q·s (dS not transposed)": (dS_full @ Q) / math.sqrt(d)},
}


@checker
def exercise_3(Q, K, V, O, L, grad_O, slopes):
    """Your D and your four gradients, by name."""
    return {
        **named(("D",), row_D, O, grad_O),
        **named(
            ("grad_Q", "grad_K", "grad_V", "grad_slopes"),
            attention_backward_from_L,
            Q,
            K,
            V,
            O,
            L,
            grad_O,
            slopes,
        ),
    }


check(
    exercise_3,
    expected,
    args=(Q, K, V, O_ref, L_ref, grad_O, slopes),
    name="Exercise 3 · row_D and attention_backward_from_L",
    against="rowsum(dP ∘ P) and autograd",
    factors=factors,
    terms={"grad_Q": {"the − D part of dS": minus_D_part}},
    mistakes=mistakes,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 4
# by_hand: [autograd, helpers.flash.naive_attention, helpers.flash.flash_backward, helpers.flash.flash_attention, torch.nn.functional.scaled_dot_product_attention]

# %% [markdown]
# ## Exercise 4 · The tiled backward, query blocks outside (4 points)
#
# **Goal:** the same gradients as Exercise 3 while only ever holding one
# `(block_q, block_k)` tile of $S$, $P$, $dP$ and $dS$, in the loop order the chapter did
# *not* use.
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
# <details><summary>Hint: one tile</summary>
#
# * $S = Q_i K_j^\top \cdot s$ + `alibi_tile(q0, k0, bq, bk, slopes)` and $P = e^{S - L_i}$,
#   recomputed and normalised ($L_i$, $D_i$: the rows `q0` to `q0 + bq - 1` of $L$ and $D$);
# * $dV_j \mathrel{+}= P^\top dO_i$, $dP = dO_i\, V_j^\top$, $dS = P \circ (dP - D_i)$;
# * $dQ_i \mathrel{+}= dS\, K_j \cdot s$ (local to the outer pass) and
#   $dK_j \mathrel{+}= dS^\top Q_i \cdot s$, $dV_j$ (sums over the outer loop, into `grad_K`,
#   `grad_V`);
# * `grad_slopes` $\mathrel{+}= \sum dS \circ (-|i - j|)$ over the batch and the tile, per head:
#   $-|i - j|$ of the tile is `alibi_tile(q0, k0, bq, bk, torch.ones_like(slopes))`.
#
# </details>
#
# Compute $D = \mathrm{rowsum}(dO \circ O)$ once, before the loops. Leave every input as it came
# (`Q, K, V, O, L, grad_O, slopes`: a backward never edits its inputs in place; the tests
# check). As in Exercise 2, leave `causal` and `window` for Exercise 5
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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as F

from helpers.device import randn

# ragged blocks both ways, d = 3, batch 2
_Q, _K, _V = (
    randn(2, 2, 10, 3, seed=4001, dtype=torch.float64),
    randn(2, 2, 10, 3, seed=4002, dtype=torch.float64),
    randn(2, 2, 10, 3, seed=4003, dtype=torch.float64),
)
_sl = torch.tensor([0.6, 0.2], dtype=torch.float64)
_gO = randn(2, 2, 10, 3, seed=4004, dtype=torch.float64)
_dist = (torch.arange(10)[None, :] - torch.arange(10)[:, None]).abs()
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V, _sl)]
_bias = -_leaves[3][:, None, None] * _dist
_O = F.scaled_dot_product_attention(*_leaves[:3], attn_mask=_bias)
_L = torch.logsumexp(_leaves[0] @ _leaves[1].transpose(-2, -1) / 3**0.5 + _bias, -1)
_ref = torch.autograd.grad(_O, _leaves, _gO)
_out = tiled_backward(_Q, _K, _V, _O.detach(), _L.detach(), _gO, _sl, 4, 3)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-10, rtol=1e-8)
    for o, r in zip(_out, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as F

from helpers.device import randn

# Nq ≠ Nk: grad_Q has Q's shape, grad_K and grad_V have K's
_Q, _K, _V = (
    randn(1, 2, 5, 4, seed=4005, dtype=torch.float64),
    randn(1, 2, 9, 4, seed=4006, dtype=torch.float64),
    randn(1, 2, 9, 4, seed=4007, dtype=torch.float64),
)
_sl = torch.tensor([0.3, 1.1], dtype=torch.float64)
_gO = randn(1, 2, 5, 4, seed=4008, dtype=torch.float64)
_dist = (torch.arange(9)[None, :] - torch.arange(5)[:, None]).abs()
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V, _sl)]
_bias = -_leaves[3][:, None, None] * _dist
_O = F.scaled_dot_product_attention(*_leaves[:3], attn_mask=_bias)
_L = torch.logsumexp(_leaves[0] @ _leaves[1].transpose(-2, -1) / 2 + _bias, -1)
_ref = torch.autograd.grad(_O, _leaves, _gO)
_out = tiled_backward(_Q, _K, _V, _O.detach(), _L.detach(), _gO, _sl, 2, 4)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-10, rtol=1e-8)
    for o, r in zip(_out, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.flash import naive_attention

# slopes of zero (plain attention); the block size must not change the answer
# (1×1 tiles, and one tile larger than the matrix)
_Q, _K, _V = (
    randn(1, 1, 6, 2, seed=4009, dtype=torch.float64),
    randn(1, 1, 7, 2, seed=4010, dtype=torch.float64),
    randn(1, 1, 7, 2, seed=4011, dtype=torch.float64),
)
_gO = randn(1, 1, 6, 2, seed=4012, dtype=torch.float64)
_O, _L = naive_attention(_Q, _K, _V, return_lse=True)
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
_ref = torch.autograd.grad(naive_attention(*_leaves), _leaves, _gO)
for _bq, _bk in ((1, 1), (50, 50)):
    _out = tiled_backward(_Q, _K, _V, _O, _L, _gO, torch.zeros(1).double(), _bq, _bk)
    assert all(
        torch.allclose(o, r, atol=1e-10, rtol=1e-8) for o, r in zip(_out[:3], _ref)
    )

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.flash import naive_attention

# four gradients of the right shapes, and the inputs left unchanged (no in-place edits)
_ins = [randn(1, 1, 5, 3, seed=s, dtype=torch.float64) for s in (4013, 4014, 4015)]
_gO = randn(1, 1, 5, 3, seed=4016, dtype=torch.float64)
_O, _L = naive_attention(*_ins, return_lse=True)
_all = _ins + [_O, _L, _gO, torch.zeros(1, dtype=torch.float64)]
_copies = [t.clone() for t in _all]
_out = tiled_backward(*_all, 2, 2)
assert _out is not None
assert [tuple(t.shape) for t in _out] == [(1, 1, 5, 3)] * 3 + [(1,)]
assert all(torch.equal(a, b) for a, b in zip(_all, _copies))

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4**, one line (references: autograd through `alibi_attention`, first with slopes
# of zero, which is chapter 10's plain attention, then with the slopes of self-check 2; the
# same `Q, K, V, grad_O` as self-check 3, $N = 11$ in tiles of 4 queries × 3 keys; `O` and `L`
# from `alibi_attention`):

# %%
O0, L0 = alibi_attention(Q, K, V, no_slopes)
attention_O = lambda q, k, v, s: alibi_attention(q, k, v, s)[0]
expected = dict(
    zip(
        (
            "grad_Q (slopes 0)",
            "grad_K (slopes 0)",
            "grad_V (slopes 0)",
            "grad_slopes (slopes 0)",
        ),
        autograd_grads(attention_O, (Q, K, V, no_slopes), grad_O),
    )
)
expected.update(
    zip(
        ("grad_Q", "grad_K", "grad_V", "grad_slopes"),
        autograd_grads(attention_O, (Q, K, V, slopes), grad_O),
    )
)


@checker
def exercise_4(Q, K, V, grad_O, slopes):
    """Your four gradients without and with the bias, by name."""
    return {
        **named(
            (
                "grad_Q (slopes 0)",
                "grad_K (slopes 0)",
                "grad_V (slopes 0)",
                "grad_slopes (slopes 0)",
            ),
            tiled_backward,
            *(Q, K, V, O0, L0, grad_O, torch.zeros_like(slopes), 4, 3),
        ),
        **named(
            ("grad_Q", "grad_K", "grad_V", "grad_slopes"),
            tiled_backward,
            *(Q, K, V, O_ref, L_ref, grad_O, slopes, 4, 3),
        ),
    }


# Known wrong answers, by autograd. In tiles of 4 × 3 the last one is queries 8…10,
# keys 9…10.
last_q = (i >= 8)[:, None]  # (11, 1): the last query block
_, grad_K_last, grad_V_last, _ = autograd_grads(  # dO of the last query block only
    attention_O, (Q, K, V, no_slopes), grad_O * last_q
)
dS0 = autograd_grads(lambda s: torch.softmax(s, -1) @ V, (S0,), grad_O)[0]  # ∂Loss/∂S
grad_Q_last = autograd_grads(  # through the scores of the last key block only
    lambda q: q @ K[..., 9:, :].transpose(-2, -1) / math.sqrt(d), (Q,), dS0[..., 9:]
)[0]


def grad_slopes_with(dist):
    """autograd's grad_slopes at slopes 0 if the bias were −slopes · dist."""
    return autograd_grads(
        lambda s: F.scaled_dot_product_attention(
            Q, K, V, attn_mask=-s[:, None, None] * dist
        ),
        (no_slopes,),
        grad_O,
    )[0]


mistakes = {
    "grad_Q (slopes 0)": {"the last key tile's part only (overwritten)": grad_Q_last},
    "grad_K (slopes 0)": {
        "the last query block's part only (overwritten)": grad_K_last
    },
    "grad_V (slopes 0)": {
        "the last query block's part only (overwritten)": grad_V_last
    },
    "grad_slopes (slopes 0)": {
        "the distances within each tile (q0, k0 not added)": grad_slopes_with(
            (i[None, :] % 3 - i[:, None] % 4).abs()
        ),
        "the last tile's part only (overwritten per tile)": grad_slopes_with(
            dist_full * last_q * (i >= 9)
        ),
    },
}
i_4 = i[:, None] >= 4  # (11, 1)
regions = {
    "grad_Q (slopes 0)": {
        "i ≥ 4, past the first query block (rows of L, D not offset by q0?)": i_4
    }
}
check(
    exercise_4,
    expected,
    args=(Q, K, V, grad_O, slopes),
    name="Exercise 4 · tiled_backward",
    against="autograd",
    factors=factors,
    mistakes=mistakes,
    regions=regions,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex5
# points: 3
# by_hand: [helpers.attention.causal_mask, torch.nn.functional.scaled_dot_product_attention]

# %% [markdown]
# ## Exercise 5 · A sliding-window causal mask, with $N$ not a multiple of the block size (3 points)
#
# **Goal:** a *local* causal mask tile by tile: which tiles to skip at both ends, which to
# mask, what a row that sees no key in a tile does to the running max, and why the backward
# masks $P$ with zeros where the forward masked $S$ with $-\infty$.
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
#    shape `(bq, bk)`, `True` where key `k0 + c` is visible to query `q0 + r`.
# 2. Go back to `tiled_forward` (Exercise 2) and `tiled_backward` (Exercise 4), remove the
#    `raise NotImplementedError` and make `causal=True` (with and without a window) work, then
#    re-run those cells. **Work out**: which key blocks can a query block skip, before and
#    after? With a window, a row may see *no* key in the first tile it visits: what is its
#    running max then, and what does $e^{S - m_\text{new}}$ give? In the backward, $P = e^{S - L}$
#    is *not* zero where $S$ was masked (you recompute $S$ without the mask).
#
# <details><summary>Hint: the causal tile</summary>
#
# * skip key blocks that start after the query block's last row (`k0 > q0 + bq - 1`) and,
#   with a window, those that end before the window of its first row
#   (`k0 + bk - 1 <= q0 - window`): start at `max(0, q0 - window + 1) // block_k * block_k`;
# * forward: fill the masked scores with $-\infty$ before the running max. A row whose scores in
#   this tile are all $-\infty$, and that has seen no key before, has $m_\text{new} = -\infty$, and
#   $e^{-\infty - (-\infty)}$ is NaN: subtract 0 instead of $m_\text{new}$ in those rows
#   (`torch.where`), so $\tilde P = 0$ and $\alpha = 0$ there;
# * backward: visit the same tiles, and set $P$ to 0 where the mask is `False` before using it.
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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

_M = causal_tile_mask(3, 2, 4, 5)
assert _M.shape == (4, 5) and _M.dtype == torch.bool
_i, _j = torch.arange(3, 7)[:, None], torch.arange(2, 7)[None, :]
assert torch.equal(_M, _j <= _i)
assert not causal_tile_mask(0, 4, 2, 3).any() and causal_tile_mask(6, 0, 2, 3).all()
_i, _j = torch.arange(5, 9)[:, None], torch.arange(1, 8)[None, :]
assert torch.equal(causal_tile_mask(5, 1, 4, 7, window=3), (_j <= _i) & (_j > _i - 3))
assert torch.equal(causal_tile_mask(5, 1, 4, 7, window=1), _j == _i)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# causal forward with and without a window, ragged N, and Nq ≠ Nk (top-left aligned)
for _Nq, _Nk, _bq, _bk, _w in (
    (10, 10, 4, 3, None),
    (7, 12, 3, 5, None),
    (9, 4, 2, 3, None),
    (10, 10, 4, 3, 2),
    (9, 12, 4, 2, 3),
    (8, 8, 3, 3, 1),
):
    _Q, _K, _V = (
        randn(1, 2, _Nq, 3, seed=5001, dtype=torch.float64),
        randn(1, 2, _Nk, 3, seed=5002, dtype=torch.float64),
        randn(1, 2, _Nk, 3, seed=5003, dtype=torch.float64),
    )
    _sl = torch.tensor([0.25, 0.5], dtype=torch.float64)
    _i, _j = torch.arange(_Nq)[:, None], torch.arange(_Nk)[None, :]
    _seen = (_j <= _i) & (_j > _i - (_w or _Nk + _Nq))
    _S = _Q @ _K.transpose(-2, -1) / 3**0.5 - _sl[:, None, None] * (_j - _i).abs()
    _S = _S.masked_fill(~_seen, -torch.inf)
    _O, _L = tiled_forward(_Q, _K, _V, _sl, _bq, _bk, causal=True, window=_w)
    assert torch.allclose(_O, torch.softmax(_S, -1) @ _V, atol=1e-10, rtol=1e-8)
    assert torch.allclose(_L, torch.logsumexp(_S, -1), atol=1e-10, rtol=1e-8)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as F

from helpers.device import randn

# causal backward with and without a window, ragged N, and Nq ≠ Nk (top-left aligned)
for _Nq, _Nk, _bq, _bk, _w in (
    (10, 10, 3, 4, None),
    (6, 11, 4, 3, None),
    (9, 5, 2, 2, None),
    (10, 10, 4, 3, 2),
    (8, 11, 3, 2, 4),
):
    _Q, _K, _V = (
        randn(2, 1, _Nq, 3, seed=5004, dtype=torch.float64),
        randn(2, 1, _Nk, 3, seed=5005, dtype=torch.float64),
        randn(2, 1, _Nk, 3, seed=5006, dtype=torch.float64),
    )
    _gO = randn(2, 1, _Nq, 3, seed=5007, dtype=torch.float64)
    _sl = torch.tensor([0.3], dtype=torch.float64)
    _i, _j = torch.arange(_Nq)[:, None], torch.arange(_Nk)[None, :]
    _seen = (_j <= _i) & (_j > _i - (_w or _Nk + _Nq))
    _leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V, _sl)]
    _bias = (-_leaves[3][:, None, None] * (_j - _i).abs()).masked_fill(
        ~_seen, -torch.inf
    )
    _O = F.scaled_dot_product_attention(*_leaves[:3], attn_mask=_bias)
    _L = torch.logsumexp(_leaves[0] @ _leaves[1].transpose(-2, -1) / 3**0.5 + _bias, -1)
    _ref = torch.autograd.grad(_O, _leaves, _gO)
    _args = (_Q, _K, _V, _O.detach(), _L.detach(), _gO, _sl, _bq, _bk)
    _out = tiled_backward(*_args, causal=True, window=_w)
    assert all(torch.allclose(o, r, atol=1e-10, rtol=1e-8) for o, r in zip(_out, _ref))

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 5**, one line for the three parts (references: the masks of the tile at queries
# 4…7, keys 2…7, without and with a window of 2; `alibi_attention` with `causal=True` for `O`
# and `L`, and autograd through it for the gradients. $N = 11$ in tiles of 4 queries × 3 keys,
# so the diagonal crosses ragged tiles, plain causal and with a window of 2, where some rows see
# no key in the first tile they visit (which rows of that $O$ hold a NaN: none should); and the
# first 7 queries against all 11 keys, where the two alignments of lab 6 differ):

# %%
i11 = torch.arange(4, 8)[:, None]  # (4, 1): queries 4…7
j11 = torch.arange(2, 8)[None, :]  # (1, 6): keys 2…7
cases = {  # name suffix: (Nq, window)
    "": (11, None),
    " (window 2)": (11, 2),
    " (Nq 7, Nk 11)": (7, None),
}
expected = {"mask": j11 <= i11, "mask (window 2)": (j11 <= i11) & (j11 > i11 - 2)}
inputs = {}
for tag, (Nq, window) in cases.items():
    Qc, grad_Oc = Q[:, :, :Nq], grad_O[:, :, :Nq]
    Oc, Lc = alibi_attention(Qc, K, V, slopes, causal=True, window=window)
    inputs[tag] = (Qc, Oc, Lc, grad_Oc, window)
    if window is not None:  # which rows of O hold a NaN: none
        expected["NaN rows" + tag] = torch.zeros(Lc.shape, dtype=torch.bool)
    grads = autograd_grads(
        lambda q, k, v, s, w=window: alibi_attention(q, k, v, s, True, w)[0],
        (Qc, K, V, slopes),
        grad_Oc,
    )
    names = ("O", "L", "grad_Q", "grad_K", "grad_V", "grad_slopes")
    expected.update({n + tag: t for n, t in zip(names, (Oc, Lc, *grads))})


@checker
def exercise_5(K, V, slopes):
    """Your tile masks, causal O and L, and causal gradients (from reference O, L)."""
    out = {
        **named(("mask",), causal_tile_mask, 4, 2, 4, 6),
        **named(("mask (window 2)",), causal_tile_mask, 4, 2, 4, 6, 2),
    }
    for tag, (Qc, Oc, Lc, grad_Oc, window) in inputs.items():
        fwd = ("O" + tag, "L" + tag)
        out.update(named(fwd, tiled_forward, Qc, K, V, slopes, 4, 3, True, window))
        if window is not None:  # None while tiled_forward is not written
            O_w = out["O" + tag]
            out["NaN rows" + tag] = None if O_w is None else O_w.isnan().any(-1)
        bwd = tuple(n + tag for n in ("grad_Q", "grad_K", "grad_V", "grad_slopes"))
        args = (Qc, K, V, Oc, Lc, grad_Oc, slopes, 4, 3, True, window)
        out.update(named(bwd, tiled_backward, *args))
    return out


def rows(*picked):
    """(1, 2, 11) bool: True in the picked rows (queries) of both heads."""
    return torch.isin(i, torch.tensor(picked, device=dev)).expand(1, 2, 11)


nan_7, nan_4 = rows(7, 10), rows(4, 5, 8)
bottom_right = alibi_attention(Q[:, :, :7], K, V, slopes, True, shift=11 - 7)[0]
mistakes = {  # known wrong answers
    "mask": {
        "j < i (the diagonal masked too)": j11 < i11,
        "the mask of the tile at (0, 0) (q0, k0 not added)": j11 - 2 <= i11 - 4,
        "j ≥ i (rows and columns swapped)": j11 >= i11,
    },
    "mask (window 2)": {
        "i − 2 ≤ j ≤ i (the window one key too wide)": (j11 <= i11) & (j11 >= i11 - 2),
        "j ≤ i (the window left out)": j11 <= i11,
    },
    "NaN rows (window 2)": {  # with tiles of 4 × 3 and a window of 2
        "i = 7, 10, with no key in their first tile: e^(−inf − (−inf)) = NaN": nan_7,
        "i = 4, 5, 8, with no key at all (their window's first tile skipped?)": nan_4,
    },
    "O (Nq 7, Nk 11)": {
        "the bottom-right alignment of lab 6 (causal is top-left here)": bottom_right
    },
}
i_col = i[:, None]  # (11, 1): the query index of each row
# the rows whose own key j = i lies in a tile that starts after their block's q0
late_tile = i_col // 3 * 3 > i_col // 4 * 4
regions = {
    "O": {"key i's tile starts after q0 (key tiles stopped too early?)": late_tile},
    "grad_Q": {"i < 10, where keys j > i are masked (P not zeroed there?)": i_col < 10},
    "grad_Q (window 2)": {
        "i ≥ 2, where the window hides keys j ≤ i − 2 (P not zeroed there?)": i_col >= 2
    },
}
check(
    exercise_5,
    expected,
    args=(K, V, slopes),
    name="Exercise 5 · causal and sliding window",
    against="the tile's mask, the full masked scores and autograd",
    factors=factors,
    mistakes=mistakes,
    regions=regions,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex6
# points: 2
# by_hand: [autograd, helpers.flash.naive_attention, helpers.flash.flash_backward, helpers.flash.flash_attention, torch.nn.functional.scaled_dot_product_attention]

# %% [markdown]
# ## Exercise 6 · An `autograd.Function` that saves only what is linear in $N$ (2 points)
#
# **Goal:** plug your forward and backward into autograd, keeping for backward only tensors of
# size $O(N d)$ (and the slopes), and prove the result, slopes included, with `gradcheck`.
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
# which returns `O` only. This exercise builds on Exercises 2, 4 and 5: if one of those is
# wrong, so is this one. It is the last step, and your instructor may make it optional.

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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_ins = [
    randn(1, 2, 6, 3, seed=s, dtype=torch.float64, requires_grad=True)
    for s in (6001, 6002, 6003)
]
_ins.append(torch.tensor([0.4, 0.9], dtype=torch.float64, requires_grad=True))
assert torch.autograd.gradcheck(
    lambda q, k, v, s: flash_attn(q, k, v, s, False, None, 2, 3), _ins
)
assert torch.autograd.gradcheck(
    lambda q, k, v, s: flash_attn(q, k, v, s, True, None, 3, 2), _ins
)
assert torch.autograd.gradcheck(
    lambda q, k, v, s: flash_attn(q, k, v, s, True, 2, 2, 2), _ins
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.flash import naive_attention

# saved for backward: Q, K, V, O (B, H, N, d), slopes (H,), L (B, H, N); no (N, N)
_Q, _K, _V = (
    randn(2, 1, 7, 3, seed=s, dtype=torch.float64, requires_grad=True)
    for s in (6004, 6005, 6006)
)
_sl = torch.zeros(1, dtype=torch.float64, requires_grad=True)
_O = flash_attn(_Q, _K, _V, _sl, True, None, 2, 2)
_saved = _O.grad_fn.saved_tensors
assert sorted(tuple(t.shape) for t in _saved) == sorted(
    [(2, 1, 7, 3)] * 4 + [(2, 1, 7), (1,)]
)
assert torch.allclose(
    _O, naive_attention(_Q, _K, _V, causal=True), atol=1e-10, rtol=1e-8
)
# only V needs a gradient: backward must still work
_Qn, _Kn, _sn = _Q.detach(), _K.detach(), _sl.detach()
(_gV,) = torch.autograd.grad(
    flash_attn(_Qn, _Kn, _V, _sn, False, None, 3, 3).sum(), (_V,)
)
_Vl = _V.detach().clone().requires_grad_()
(_gV_ref,) = torch.autograd.grad(naive_attention(_Qn, _Kn, _Vl).sum(), (_Vl,))
assert torch.allclose(_gV, _gV_ref, atol=1e-10, rtol=1e-8)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 6** (references: what your `forward` returns and which tensors your Function
# saves, each told by its value: `Q, K, V, O`, `L` and `slopes`; then its four gradients
# against autograd through `alibi_attention`, and `torch.autograd.gradcheck` in float64, causal
# with a window of 3, $N = 7$ in tiles of 3 × 2, the slopes included: finite differences
# against your backward):

# %%
Q6, K6, V6 = (randn(1, 2, 7, 3, seed=s, dtype=dtype, device=dev) for s in (6, 7, 8))
slopes6 = torch.tensor([0.3, 0.8], dtype=dtype, device=dev)
grad_O6 = randn(1, 2, 7, 3, seed=9, dtype=dtype, device=dev)
O6, L6 = alibi_attention(Q6, K6, V6, slopes6, True, 3)  # causal, window 3
known = {"Q": Q6, "K": K6, "V": V6, "slopes": slopes6, "O": O6, "L": L6}


def order(name):
    """Q, K, V, slopes, O, L in that order, anything else after them."""
    return list(known).index(name) if name in known else len(known)


def in_words(t):
    """Which of Q, K, V, slopes, O, L t equals ('K'), else its shape or type."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    for n, r in known.items():
        if t.shape == r.shape and t.dtype == r.dtype and torch.allclose(t, r):
            return n
    return f"a {tuple(t.shape)} tensor"


@checker
def forward_and_saved(Q, K, V, slopes):
    """What forward returns and what setup_context saves, in words."""
    out = FlashAttentionFn.forward(Q, K, V, slopes, True, 3, 3, 2)
    if out is None:  # not written yet
        return None
    out = out if isinstance(out, (tuple, list)) else [out]
    returned = ", ".join(map(in_words, out))
    if len(out) != 2:  # setup_context could not unpack it
        return {"what forward returns": returned, "what setup_context saves": None}
    leaves = [t.detach().clone().requires_grad_() for t in (Q, K, V, slopes)]
    O = flash_attn(*leaves, True, 3, 3, 2)
    if O is None:  # flash_attn not written yet
        return None
    saved = sorted(map(in_words, O.grad_fn.saved_tensors), key=order)
    return {
        "what forward returns": returned,
        "what setup_context saves": ", ".join(saved),
    }


@checker
def its_gradients(Q, K, V, slopes):
    """The gradients flash_attn's backward gives (a None counts as zeros)."""
    leaves = [t.detach().clone().requires_grad_() for t in (Q, K, V, slopes)]
    O = flash_attn(*leaves, True, 3, 3, 2)
    grads = torch.autograd.grad(O, leaves, grad_O6, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(leaves, grads)]


@checker
def your_grad_Q(causal, window):
    """grad_Q by your tiled_backward here, with other flags (empty if that fails)."""
    try:
        args = (Q6, K6, V6, O6, L6, grad_O6, slopes6, 3, 2, causal, window)
        return tiled_backward(*args)[0].detach()
    except Exception:  # noqa: BLE001 - only a known wrong answer to compare with
        return torch.empty(0)


saves = "Q, K, V, slopes, O, L"
result = evaluate(
    forward_and_saved,
    {"what forward returns": "O, L", "what setup_context saves": saves},
    args=(Q6, K6, V6, slopes6),
    name="Exercise 6 · FlashAttentionFn",
    mistakes={
        "what forward returns": {"O alone: setup_context has no L to save": "O"},
        "what setup_context saves": {
            "slopes kept on ctx, not saved": "Q, K, V, O, L",
            "O saved in L's place": "Q, K, V, slopes, O, O",
        },
    },
)
if result:  # it returns (O, L) and saves Q, K, V, slopes, O, L: now its gradients
    grads = ("grad_Q", "grad_K", "grad_V", "grad_slopes")
    expected = autograd_grads(
        lambda q, k, v, s: alibi_attention(q, k, v, s, True, 3)[0],
        (Q6, K6, V6, slopes6),
        grad_O6,
    )
    q_no_flags, q_no_window = your_grad_Q(False, None), your_grad_Q(True, None)
    result = evaluate(
        its_gradients,
        expected,
        args=(Q6, K6, V6, slopes6),
        outputs=grads,
        name="Exercise 6 · FlashAttentionFn",
        against="autograd",
        mistakes={
            "grad_Q": {
                "autograd's grad_K (the gradients of Q and K swapped)": expected[1],
                "tiled_backward with causal=False (flags not passed)": q_no_flags,
                "tiled_backward without the window (not passed to it)": q_no_window,
            },
            "grad_slopes": {"zero: backward returned None for the slopes": 0 * slopes6},
        },
    )
if result:  # and finite differences against its backward
    result = check_gradcheck(
        lambda q, k, v, s: flash_attn(q, k, v, s, True, 3, 3, 2),
        (Q6, K6, V6, slopes6),
        name="Exercise 6 · FlashAttentionFn (saves Q, K, V, slopes, O, L)",
        quiet=True,
    )
print(result.line)

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
