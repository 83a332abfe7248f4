# %% [raw]
# # ASSIGNMENT CONFIG
# name: lab06_attention_backward
# init_cell: false
# check_all_cell: false
# export_cell: false
# run_tests: true
# generate:
#   pdf: false
#   show_stdout: false

# %% [markdown]
# # Lab 6 · Attention backward: a sliding window, a score bias, a learned temperature
#
# Chapter 6 derived the backward pass of scaled dot-product attention, printed it, and showed
# what the masks do to it. Here you use its method on a variant the chapter did not print, the
# attention of models such as Mistral (a sliding-window causal mask), T5 and ALiBi (an additive
# bias on the scores) and of learned-temperature attention (a trainable scale per head):
# the windowed mask, the forward with bias and scale, the backward that also returns
# $\partial L/\partial \text{Bias}$ and $\partial L/\partial \text{scale}$, and the whole thing
# checked against PyTorch's `F.scaled_dot_product_attention` (SDPA). This lab goes with
# [Chapter 6](../chapters/06_attention_backward.ipynb) (and chapter 2's broadcasting).
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
# cell right below. It answers in one line: `✓` matches (the `max|Δ|` is round-off), `✗`
# what is wrong and where, or `·` not implemented yet. Your instructor grades the notebook
# you hand in with hidden tests that call the same functions on other inputs.

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

from helpers import attention as ref
from helpers.device import get_device, no_tf32, randn
from helpers.labcheck import autograd_grads, check, checker
from helpers.numgrad import unbroadcast

dev = get_device()
no_tf32()
dtype = torch.float64  # tight comparisons; float32 attention differs from SDPA by ~1e-7

# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2
# by_hand: [helpers.attention.causal_mask]

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
# **bool** tensor, True = may attend. When `Nq == Nk` both alignments are the usual lower
# triangle. Work out, for query $i$, the last key it may see and the first one the window
# keeps, in each alignment.
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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

_m = causal_mask(5, 5)
assert _m.dtype == torch.bool and _m.shape == (5, 5)
assert torch.equal(_m, torch.ones(5, 5, dtype=torch.bool).tril())
_m = causal_mask(5, 5, window=2)
assert torch.equal(
    _m, torch.ones(5, 5, dtype=torch.bool).tril() & ~_m.new_ones(5, 5).tril(-2)
)
assert torch.equal(causal_mask(4, 4, window=1), torch.eye(4, dtype=torch.bool))

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

_m = causal_mask(2, 5, align="bottom_right")
assert _m.dtype == torch.bool
assert torch.equal(
    _m, torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
)
_m = causal_mask(1, 7, align="bottom_right")
assert _m.all() and _m.shape == (1, 7)  # one new token sees the whole cache
_m = causal_mask(2, 5, align="bottom_right", window=3)
assert torch.equal(
    _m, torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], dtype=torch.bool)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

_m = causal_mask(2, 5)  # top-left is the default: SDPA's is_causal
assert _m.dtype == torch.bool
assert torch.equal(
    _m, torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.bool)
)
assert torch.equal(
    causal_mask(5, 2),
    torch.tensor([[1, 0], [1, 1], [1, 1], [1, 1], [1, 1]], dtype=torch.bool),
)
assert not causal_mask(5, 2, align="bottom_right")[:3].any()  # rows that see no key
assert torch.equal(
    causal_mask(4, 3, window=2),
    torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 1], [0, 0, 1]], dtype=torch.bool),
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: chapter 6's `helpers.attention.causal_mask` for the triangle,
# cut to a band for the window, for a square shape, fewer queries than keys and more, in both
# alignments, without a window and with `window=2`):


# %%
def banded_mask(Nq, Nk, align="top_left", device=None, window=None):
    """Chapter 6's causal mask minus the keys `window` or more behind the last seen."""
    mask = ref.causal_mask(Nq, Nk, align=align, device=device)  # (Nq, Nk)
    if window is not None:
        shift = Nk - Nq if align == "bottom_right" else 0
        full = torch.ones(Nq, Nk, dtype=torch.bool, device=device)
        mask = mask & ~full.tril(shift - window)
    return mask


@checker  # the check's own code: an error in it is not placed in yours
def masks(fn):
    """fn's masks for (4, 4), (3, 6) and (6, 3), both alignments, windows None and 2."""
    out = {}
    for align in ("top_left", "bottom_right"):
        for window in (None, 2):
            for Nq, Nk in ((4, 4), (3, 6), (6, 3)):
                key = f"{align} mask ({Nq}, {Nk}) window {window}"
                out[key] = fn(Nq, Nk, align=align, device=dev, window=window)
    return out


def slipped_masks(Nq, Nk, align="top_left", device=None, window=None):
    """The masks typical slips give, from the reference's pieces: {slip: its mask}."""
    right = banded_mask(Nq, Nk, align, device, window)
    other = "top_left" if align == "bottom_right" else "bottom_right"
    shift = Nk - Nq if align == "bottom_right" else 0
    full = torch.ones(Nq, Nk, dtype=torch.bool, device=device)
    flipped = full.tril(-shift)  # the triangle with the shift's sign flipped
    slips = {
        f"the {other} mask (align not followed)": banded_mask(
            Nq, Nk, other, device, window
        ),
        "the mask inverted (True = masked?)": ~right,
        # each row without its last visible key: the key after it is not visible
        "the diagonal masked too (< for ≤?)": right & F.pad(right, (0, 1))[:, 1:],
    }
    if window is None:
        slips["the shift Nq − Nk (its sign flipped)"] = flipped
        return slips
    slips["the shift Nq − Nk (its sign flipped)"] = flipped & ~full.tril(
        -shift - window
    )
    tri = banded_mask(Nq, Nk, align, device)  # no window
    wider = banded_mask(Nq, Nk, align, device, window + 1)
    narrower = banded_mask(Nq, Nk, align, device, window - 1)
    slips["the mask without the window"] = tri
    slips[f"a window of {window + 1} keys (one too many)"] = wider
    slips[f"a window of {window - 1} key(s) (one too few)"] = narrower
    slips["the window without the bottom-right shift"] = tri & ~full.tril(-window)
    slips["the triangle or the window band (| for &)"] = tri | ~full.tril(
        shift - window
    )
    return slips


check(
    checker(lambda: masks(causal_mask)),
    masks(banded_mask),
    name="Exercise 1 · causal_mask",
    against="the reference masks",
    noun="masks",
    atol=0,
    rtol=0,
    mistakes=masks(slipped_masks),  # {mask: {slip: the mask it gives}}
)

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 2
# by_hand: [helpers.attention.masked_softmax, helpers.attention.attention_forward, torch.nn.functional.scaled_dot_product_attention]

# %% [markdown]
# ## Exercise 2 · Masked attention forward with a score bias, no NaN (2 points)
#
# **Goal:** the scores are $S = QK^\top\cdot\text{scale} + \text{Bias}$; a masked score becomes
# $-\infty$, so its weight $e^{-\infty} = 0$; but a query that sees **no** key would get
# $0/0$ = NaN, and must get $P = 0$, $O = 0$ instead.
#
# Write `attention_forward(Q, K, V, mask=None, Bias=None, scale=None)` returning `(O, P)`:
# `scale` is a number or a tensor broadcastable to (..., Nq, Nk) (one temperature per head),
# $1/\sqrt d$ ($d$ = `Q.shape[-1]`) when None; `Bias` (None = no bias) is broadcastable to
# (..., Nq, Nk); where `mask` (broadcastable to (..., Nq, Nk)) is False, $S = -\infty$; $P$ =
# the row softmax, computed stably; $O = P V$. Work out first what a stable softmax does with
# a row whose every entry is $-\infty$, and where that turns into NaN.
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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers import attention as _ref
from helpers.device import randn

_Q, _K, _V = (randn(2, 3, 4, 8, seed=s, dtype=torch.float64) for s in (201, 202, 203))
_O, _P = attention_forward(_Q, _K, _V)
_O2 = torch.nn.functional.scaled_dot_product_attention(_Q, _K, _V)
assert (
    _O.shape == (2, 3, 4, 8)
    and _P.shape == (2, 3, 4, 4)
    and torch.allclose(_O, _O2, atol=1e-12)
)
# huge scores: no overflow
_O, _P = attention_forward(_Q * 100, _K * 100, _V, _ref.causal_mask(4, 4))
_Or, _Pr = _ref.attention_forward(_Q * 100, _K * 100, _V, _ref.causal_mask(4, 4))
assert (
    torch.isfinite(_O).all()
    and torch.allclose(_O, _Or, atol=1e-10)
    and torch.allclose(_P, _Pr, atol=1e-12)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# a per-head scale and a bias shared by the batch: SDPA with a float mask on Q·scale
_Q, _K, _V = (randn(2, 3, 4, 8, seed=s, dtype=torch.float64) for s in (207, 208, 209))
_scale = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64)[:, None, None]  # (H, 1, 1)
_Bias = randn(3, 4, 4, seed=210, dtype=torch.float64)  # (H, Nq, Nk)
_O, _P = attention_forward(_Q, _K, _V, None, _Bias, _scale)
_O2 = torch.nn.functional.scaled_dot_product_attention(
    _Q * _scale, _K, _V, attn_mask=_Bias, scale=1.0
)
assert torch.allclose(_O, _O2, atol=1e-12)
_O, _P = attention_forward(_Q, _K, _V, scale=2.0)  # a plain number as the scale
_O2 = torch.nn.functional.scaled_dot_product_attention(_Q, _K, _V, scale=2.0)
assert torch.allclose(_O, _O2, atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# query 0 sees nothing: zeros, no NaN; the others match SDPA with the same mask
_Q, _K, _V = (randn(1, 1, 3, 4, seed=s, dtype=torch.float64) for s in (204, 205, 206))
_mask = torch.tensor([[False, False, False], [True, False, True], [True, True, True]])
_O, _P = attention_forward(_Q, _K, _V, _mask)
assert not torch.isnan(_O).any() and not torch.isnan(_P).any()
assert torch.equal(
    _O[..., 0, :], torch.zeros(1, 1, 4, dtype=torch.float64)
) and torch.equal(_P[..., 0, :], torch.zeros(1, 1, 3, dtype=torch.float64))
_ref = torch.nn.functional.scaled_dot_product_attention(_Q, _K, _V, attn_mask=_mask)
assert torch.allclose(_O[..., 1:, :], _ref[..., 1:, :], atol=1e-12)
assert float(_P[0, 0, 1, 1]) == 0.0

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: chapter 6's masked softmax, `helpers.attention.masked_softmax`,
# on $QK^\top\cdot\text{scale} + \text{Bias}$, with a causal mask and one batch whose first key
# is padded, so its first query sees nothing; first with the default scale and no bias, then
# with a temperature per head and a bias shared by the batch; last, it counts the NaN entries
# of $P$ and its masked entries that are not exactly 0):

# %%
Q2, K2, V2 = (randn(2, 2, 5, 4, seed=s, dtype=dtype, device=dev) for s in (21, 22, 23))
# (B, Nk), True = padding
pad2 = torch.tensor([[False] * 5, [True] + [False] * 4], device=dev)
mask2 = ref.causal_mask(5, 5, device=dev) & ~pad2[:, None, None, :]  # (B, 1, Nq, Nk)
scale2 = torch.tensor([0.5, 2.0], dtype=dtype, device=dev)[:, None, None]  # (H, 1, 1)
Bias2 = randn(2, 5, 5, seed=24, dtype=dtype, device=dev)  # (H, Nq, Nk)


def biased_attention(Q, K, V, mask=None, Bias=None, scale=None):
    """(O, P) from chapter 6's masked softmax of Q Kᵀ·scale + Bias."""
    if scale is None:
        scale = 1.0 / math.sqrt(Q.shape[-1])
    # (..., Nq, d) @ (..., d, Nk) -> (..., Nq, Nk)
    S = (Q @ K.transpose(-2, -1)) * scale + (0.0 if Bias is None else Bias)
    P = ref.masked_softmax(S, mask)  # (..., Nq, Nk)
    return P @ V, P  # (..., Nq, Nk) @ (..., Nk, d_v) -> (..., Nq, d_v)


def slipped_outputs(Q, K, V, mask, Bias=None, scale=None):
    """O after typical slips, from the reference's pieces: {the slip: its O}."""
    d = Q.shape[-1]
    s = 1.0 / math.sqrt(d) if scale is None else scale
    S = (Q @ K.transpose(-2, -1)) * s + (0.0 if Bias is None else Bias)  # (..., Nq, Nk)

    def P_with(Bias=None, scale=None):
        return biased_attention(Q, K, V, mask, Bias, scale)[1]

    P = {
        "a softmax over the queries (dim −2)": ref.masked_softmax(S.mT, mask.mT).mT,
        "the mask's polarity flipped (True = blocked)": ref.masked_softmax(S, ~mask),
        "masked scores set to −100 (their weight leaks)": ref.masked_softmax(
            S.masked_fill(~mask, -100.0)
        ),
    }
    if scale is None:
        P["no scale (the 1/√d forgotten)"] = P_with(scale=1.0)
        P["a scale of 1/d, not 1/√d"] = P_with(scale=1 / d)
    else:
        P["the given scale ignored (1/√d used)"] = P_with(Bias)
        P["the Bias ignored"] = P_with(None, scale)
        P["the Bias scaled too, (QKᵀ + Bias)·scale"] = P_with(Bias * scale, scale)
    return {slip: P_slip @ V for slip, P_slip in P.items()}


for label, extra in (("default scale", ()), ("scale, Bias", (Bias2, scale2))):
    check(
        attention_forward,
        biased_attention,
        args=(Q2, K2, V2, mask2, *extra),
        outputs=("O", "P"),
        name=f"Exercise 2 · attention_forward, {label}",
        against="the chapter's masked softmax",
        mistakes={"O": slipped_outputs(Q2, K2, V2, mask2, *extra)},
    )


NAN2 = "NaN entries in P (0/0 where a query sees no key?)"
MASKED2 = "masked entries of P not exactly 0"


@checker
def masked_P_counts(Q, K, V, mask, Bias, scale):
    """How many entries of P are NaN, and how many are not exactly 0 where the mask
    says 'may not attend'."""
    out = attention_forward(Q, K, V, mask, Bias, scale)
    if out is None:
        return None
    P = out[1]
    return int(P.isnan().sum()), int((P.masked_select(~mask.expand_as(P)) != 0).sum())


check(
    masked_P_counts,
    (0, 0),
    args=(Q2, K2, V2, mask2, Bias2, scale2),
    outputs=(NAN2, MASKED2),
    counts=(NAN2, MASKED2),
    name="Exercise 2 · masked P",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 3
# by_hand: [autograd, helpers.attention.attention_backward, helpers.functions.softmax_backward]

# %% [markdown]
# ## Exercise 3 · The backward of biased, temperature-scaled attention (3 points)
#
# **Goal:** from $P$ and $dO = \partial L/\partial O$, **derive** the five gradients of
# $S = QK^\top\cdot\text{scale} + \text{Bias}$, $P = \mathrm{softmax}(S)$ (over keys),
# $O = PV$, with batch dimensions in front, where `scale` and `Bias` are tensors that were
# **broadcast** to $S$'s shape (..., Nq, Nk): e.g. `scale` (H, 1, 1), one learned temperature
# per head, and `Bias` (H, Nq, Nk) or (H, 1, Nk), shared by the batch. Use the softmax's
# vector–Jacobian product, never its $N\times N$ Jacobian, and **no mask** (say to yourself
# why none is needed).
#
# Write `attention_backward(Q, K, V, P, grad_O, scale, Bias)` returning
# `(grad_Q, grad_K, grad_V, grad_scale, grad_Bias)`, each with the shape of what it is the
# gradient of (`grad_scale` has `scale.shape`, `grad_Bias` has `Bias.shape`). Derive on paper
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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# one scalar temperature, a bias (Nq, Nk) shared by the batch of 3
_Q, _K = (
    randn(3, 6, 8, seed=301, dtype=torch.float64),
    randn(3, 9, 8, seed=302, dtype=torch.float64),
)
_V, _gO = (
    randn(3, 9, 5, seed=303, dtype=torch.float64),
    randn(3, 6, 5, seed=304, dtype=torch.float64),
)
_s, _B = (
    torch.tensor(0.35, dtype=torch.float64),
    randn(6, 9, seed=309, dtype=torch.float64),
)
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V, _s, _B)]
_S = _leaves[0] @ _leaves[1].transpose(-2, -1) * _leaves[3] + _leaves[4]
_O = torch.softmax(_S, -1) @ _leaves[2]
_ref = torch.autograd.grad(_O, _leaves, _gO)
_P = torch.softmax(_Q @ _K.transpose(-2, -1) * _s + _B, -1)
_ours = attention_backward(_Q, _K, _V, _P, _gO, _s, _B)
assert len(_ours) == 5
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-12) for o, r in zip(_ours, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# a temperature per head (H, 1, 1) and a per-key bias per head (H, 1, Nk)
_Q, _K, _V = (randn(2, 3, 4, 5, seed=s, dtype=torch.float64) for s in (305, 306, 307))
_gO = randn(2, 3, 4, 5, seed=308, dtype=torch.float64)
_s = torch.tensor([0.3, 1.0, 1.7], dtype=torch.float64)[:, None, None]
_B = randn(3, 1, 4, seed=310, dtype=torch.float64)
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V, _s, _B)]
_S = _leaves[0] @ _leaves[1].transpose(-2, -1) * _leaves[3] + _leaves[4]
_O = torch.softmax(_S, -1) @ _leaves[2]
_ref = torch.autograd.grad(_O, _leaves, _gO)
_P = torch.softmax(_Q @ _K.transpose(-2, -1) * _s + _B, -1)
_ours = attention_backward(_Q, _K, _V, _P, _gO, _s, _B)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-12) for o, r in zip(_ours, _ref)
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (reference: autograd through chapter 6's masked softmax of
# $QK^\top\cdot\text{scale} + \text{Bias}$, causal with a window of 3, keys outnumbering the
# queries, `Nq = 4`, `Nk = 6`; `P` comes from that forward). First with a full-size `Bias`
# (B, H, Nq, Nk), so that `grad_Bias` **is** $dS$, the softmax VJP's output, and a scalar
# `scale`: if `grad_Bias` is off there, your softmax step is; then with `scale` (H, 1, 1) and
# `Bias` (H, Nq, Nk) broadcast over the batch:

# %%
Q3 = randn(2, 2, 4, 8, seed=31, dtype=dtype, device=dev)
K3, V3 = (
    randn(2, 2, 6, 8, seed=32, dtype=dtype, device=dev),
    randn(2, 2, 6, 3, seed=33, dtype=dtype, device=dev),
)
grad_O3 = randn(2, 2, 4, 3, seed=34, dtype=dtype, device=dev)
mask3 = banded_mask(4, 6, device=dev, window=3)
cases3 = {
    "full-size Bias": (
        torch.tensor(1 / math.sqrt(8), dtype=dtype, device=dev),  # scale ()
        randn(2, 2, 4, 6, seed=35, dtype=dtype, device=dev),  # Bias (B, H, Nq, Nk)
    ),
    "broadcast scale, Bias": (
        torch.tensor([0.2, 0.6], dtype=dtype, device=dev)[:, None, None],  # (H, 1, 1)
        randn(2, 4, 6, seed=36, dtype=dtype, device=dev),  # Bias (H, Nq, Nk)
    ),
}


@checker
def grad_S_of(*args):
    """Your grad_Bias for a full-size Bias: dS itself, the softmax VJP's output."""
    out = attention_backward(*args)
    return None if out is None else out[4]


for label, (scale3, Bias3) in cases3.items():
    _, P3 = biased_attention(Q3, K3, V3, mask3, Bias3, scale3)
    expected = autograd_grads(
        lambda Q, K, V, scale, Bias: biased_attention(Q, K, V, mask3, Bias, scale)[0],
        (Q3, K3, V3, scale3, Bias3),
        grad_O3,
    )
    if label == "full-size Bias":
        # dP by autograd through O = P V, then two softmax VJPs that are not right
        (grad_P3,) = autograd_grads(lambda P: P @ V3, (P3,), grad_O3)
        diagonal_only = grad_P3 * P3 * (1 - P3)
        over_queries = torch._softmax_backward_data(grad_P3, P3, -2, dtype)
        check(
            grad_S_of,
            expected[4],
            args=(Q3, K3, V3, P3, grad_O3, scale3, Bias3),
            outputs=("dS (grad_Bias for a full-size Bias)",),
            factors={"scale": 1 / math.sqrt(8)},
            name="Exercise 3 · the softmax step",
            against="autograd",
            mistakes={
                "dS (grad_Bias for a full-size Bias)": {
                    "dP ∘ P(1 − P): the Jacobian's diagonal only": diagonal_only,
                    "the softmax VJP summed over the queries (dim −2)": over_queries,
                }
            },
        )
    # grad_scale from the scores: dS ∘ (A·scale + Bias) summed, from the right gradients
    from_S = expected[3] * scale3 + unbroadcast(expected[4] * Bias3, scale3.shape)
    check(
        attention_backward,
        expected,
        args=(Q3, K3, V3, P3, grad_O3, scale3, Bias3),
        outputs=("grad_Q", "grad_K", "grad_V", "grad_scale", "grad_Bias"),
        # scale3 is one number, then one per head (H, 1, 1): a ✗ names either
        factors={"scale": scale3, "scale²": scale3**2, "B": 2},
        name=f"Exercise 3 · attention_backward, {label}",
        against="autograd",
        mistakes={
            "grad_scale": {"dS ∘ S summed (the scores S in place of A = QKᵀ)": from_S}
        },
    )

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 3
# by_hand: [autograd, helpers.attention.attention, helpers.attention.mha_backward, helpers.attention.attention_backward, helpers.functions.softmax_backward]

# %% [markdown]
# ## Exercise 4 · Windowed causal attention with bias and padding, end to end, against SDPA (3 points)
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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_Q, _K, _V, _gO = (
    randn(2, 3, 6, 4, seed=s, dtype=torch.float64) for s in (401, 402, 403, 404)
)
_s = torch.tensor([0.4, 0.5, 0.9], dtype=torch.float64)[:, None, None]  # (H, 1, 1)
_B = randn(3, 6, 6, seed=409, dtype=torch.float64)  # (H, Nq, Nk)
_pad = torch.tensor([[False] * 6, [False, False, False, False, True, True]])
_mask = torch.ones(6, 6, dtype=torch.bool).tril() & ~_pad[:, None, None, :]
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V, _s, _B)]
_am = _leaves[4].masked_fill(~_mask, float("-inf"))  # (B, H, Nq, Nk)
_O = torch.nn.functional.scaled_dot_product_attention(
    _leaves[0] * _leaves[3], _leaves[1], _leaves[2], attn_mask=_am, scale=1.0
)
_ref = torch.autograd.grad(_O, _leaves, _gO)
_ours = attention_grads(_Q, _K, _V, _B, _s, _gO, causal=True, key_padding_mask=_pad)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-12) for o, r in zip(_ours, _ref)
)
assert torch.equal(_ours[1][1, :, 4:], torch.zeros(3, 2, 4, dtype=torch.float64))
assert torch.equal(_ours[2][1, :, 4:], torch.zeros(3, 2, 4, dtype=torch.float64))

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# a KV cache: 2 new queries, 5 keys, bottom-right causal, window 2; and no mask
_Q = randn(1, 2, 2, 4, seed=405, dtype=torch.float64)
_K, _V = (
    randn(1, 2, 5, 4, seed=406, dtype=torch.float64),
    randn(1, 2, 5, 4, seed=407, dtype=torch.float64),
)
_gO = randn(1, 2, 2, 4, seed=408, dtype=torch.float64)
_s = torch.tensor(0.5, dtype=torch.float64)
_B = randn(2, 5, seed=410, dtype=torch.float64)  # (Nq, Nk)
_allowed = torch.tensor([[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]], dtype=torch.bool)


def _sdpa_grads(allowed):
    _leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V, _s, _B)]
    _am = (
        _leaves[4] if allowed is None else _leaves[4].masked_fill(~allowed, -torch.inf)
    )
    _O = torch.nn.functional.scaled_dot_product_attention(
        _leaves[0] * _leaves[3], _leaves[1], _leaves[2], attn_mask=_am, scale=1.0
    )
    return torch.autograd.grad(_O, _leaves, _gO)


_g = _sdpa_grads(_allowed)
_ours = attention_grads(
    _Q, _K, _V, _B, _s, _gO, causal=True, align="bottom_right", window=2
)
assert all(torch.allclose(o, r, atol=1e-12) for o, r in zip(_ours, _g))
# causal=True alone: SDPA's is_causal (top-left)
_g = _sdpa_grads(torch.ones(2, 5, dtype=torch.bool).tril())
_ours = attention_grads(_Q, _K, _V, _B, _s, _gO, causal=True)
assert all(torch.allclose(o, r, atol=1e-12) for o, r in zip(_ours, _g))
_g = _sdpa_grads(None)
_ours = attention_grads(_Q, _K, _V, _B, _s, _gO)
assert all(torch.allclose(o, r, atol=1e-12) for o, r in zip(_ours, _g))

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: autograd through `F.scaled_dot_product_attention` with the bias
# as a float mask, $-\infty$ where the boolean mask forbids, and `Q * scale` with SDPA's own
# scale 1, in each alignment, with a window of 3, on `Nq = 4` queries and `Nk = 6` keys, so
# the corner matters; batch 1's last two keys are padding, and the last output counts their
# gradient entries that are not exactly zero):

# %%
Q4 = randn(2, 2, 4, 4, seed=41, dtype=dtype, device=dev)  # (B, H, Nq, d)
# (B, H, Nk, d)
K4, V4 = (randn(2, 2, 6, 4, seed=s, dtype=dtype, device=dev) for s in (42, 43))
grad_O4 = randn(2, 2, 4, 4, seed=44, dtype=dtype, device=dev)
scale4 = torch.tensor([0.3, 0.7], dtype=dtype, device=dev)[:, None, None]  # (H, 1, 1)
Bias4 = randn(2, 4, 6, seed=45, dtype=dtype, device=dev)  # (H, Nq, Nk)
# (B, Nk), True = padding
pad4 = torch.tensor([[False] * 6, [False] * 4 + [True] * 2], device=dev)


@checker
def with_padded_check(grads):
    """The five gradients, and the padded keys' grad_K, grad_V entries not 0."""
    if grads is None:
        return None
    grad_K, grad_V = grads[1], grads[2]
    nonzero = int((grad_K[1, :, 4:] != 0).sum() + (grad_V[1, :, 4:] != 0).sum())
    return (*grads, nonzero)


def sdpa_grads(Q, K, V, Bias, scale, grad_O, causal, key_padding_mask, align, window):
    """Autograd through SDPA: the bias as a float mask, −∞ where not allowed."""
    allowed = banded_mask(Q.shape[-2], K.shape[-2], align, Q.device, window)  # (Nq, Nk)
    allowed = allowed & ~key_padding_mask[:, None, None, :]  # (B, 1, Nq, Nk)

    def forward(Q, K, V, scale, Bias):
        float_mask = Bias.masked_fill(~allowed, float("-inf"))  # (B, H, Nq, Nk)
        return F.scaled_dot_product_attention(
            Q * scale, K, V, attn_mask=float_mask, scale=1.0
        )

    grads = autograd_grads(forward, (Q, K, V, scale, Bias), grad_O)
    return grads


def slipped_grads(
    Q, K, V, Bias, scale, grad_O, causal, key_padding_mask, align, window
):
    """The five gradients after typical slips in the mask or the forward's arguments, by
    autograd through the chapter's masked softmax: {output: {the slip: its value}}."""
    Nq, Nk, d = Q.shape[-2], K.shape[-2], Q.shape[-1]
    pad = key_padding_mask[:, None, None, :]  # (B, 1, 1, Nk), True = padding
    band = banded_mask(Nq, Nk, align, Q.device, window)
    top_left = banded_mask(Nq, Nk, "top_left", Q.device, window)
    no_window = banded_mask(Nq, Nk, align, Q.device)
    A = Q @ K.transpose(-2, -1)  # (..., Nq, Nk), held constant
    slips = {  # the slip: (its mask, what its scores are off by, held constant)
        "the padding mask used as may-attend": (band & pad, 0.0),
        "the causal mask dropped": (~pad, 0.0),
        "the padding mask dropped": (band, 0.0),
        "the top_left mask (align not passed on)": (top_left & ~pad, 0.0),
        "the mask without its window": (no_window & ~pad, 0.0),
        "P computed without the Bias": (band & ~pad, -Bias),
        "P computed with 1/√d, not the given scale": (
            band & ~pad,
            A * (d**-0.5 - scale),
        ),
    }
    out = {n: {} for n in ("grad_Q", "grad_K", "grad_V", "grad_scale", "grad_Bias")}
    for slip, (mask, off) in slips.items():
        grads = autograd_grads(
            lambda Q, K, V, s, Bias: biased_attention(Q, K, V, mask, Bias + off, s)[0],
            (Q, K, V, scale, Bias),
            grad_O,
        )
        for name, g in zip(out, grads):
            out[name][slip] = g
    return out


for align in ("top_left", "bottom_right"):
    args4 = (Q4, K4, V4, Bias4, scale4, grad_O4, True, pad4, align, 3)
    check(
        checker(lambda *a: with_padded_check(attention_grads(*a))),
        lambda *a: with_padded_check(sdpa_grads(*a)),
        args=args4,
        outputs=(
            "grad_Q",
            "grad_K",
            "grad_V",
            "grad_scale",
            "grad_Bias",
            "padded keys' gradient entries not exactly 0",
        ),
        counts=("padded keys' gradient entries not exactly 0",),
        name=f"Exercise 4 · attention_grads, {align}",
        against="autograd through SDPA",
        mistakes=slipped_grads(*args4),
    )

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `causal_mask`, `attention_forward`,
# `attention_backward` and `attention_grads`.
