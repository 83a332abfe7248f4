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
# # Lab 6 · Attention backward with a causal mask
#
# Chapter 6 derived the backward pass of scaled dot-product attention and showed what the
# masks do to it. Here you write it: the causal mask, the masked forward, the backward with
# the softmax VJP and the $1/\sqrt d$, and the whole thing checked against PyTorch's
# `F.scaled_dot_product_attention` (SDPA). This lab goes with
# [Chapter 6](../chapters/06_attention_backward.ipynb).
#
# **Learning goals.** After this lab you can
# * build both causal masks from one function: top-left (SDPA's `is_causal`, what `causal=True`
#   means in the course) and bottom-right (a KV cache's queries are the newest), by name;
# * write masked attention that gives a query with no visible key zeros, never NaN;
# * derive $\partial L/\partial Q$, $\partial L/\partial K$, $\partial L/\partial V$ from $P$ and
#   $\partial L/\partial O$, with the scale in the right places and no mask in backward;
# * say why a padded key gets exactly zero gradient, and check it.
#
# Shapes: `Q` (..., Nq, d), `K` (..., Nk, d), `V` (..., Nk, d_v), usually (B, H, N, d);
# $S = Q K^\top \cdot \text{scale}$ with scale $= 1/\sqrt d$, $P = \mathrm{softmax}(S)$ over keys,
# $O = P V$. Masks are boolean with **True = may attend** (SDPA's convention).
#
# **How a lab works.** Each exercise states its goal and its points (10 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It answers in one line: `✓` matches (the `max|Δ|` is round-off), `✗`
# what is wrong and where, or `·` not implemented yet. Your instructor grades the notebook
# you hand in with hidden tests that call the same functions on other inputs.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): in Colab, install the course helpers; elsewhere do nothing.
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
from helpers.labcheck import autograd_grads, check

dev = get_device()
no_tf32()
dtype = torch.float64  # tight comparisons; float32 attention differs from SDPA by ~1e-7

# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2
# by_hand: [helpers.attention.causal_mask]

# %% [markdown]
# ## Exercise 1 · The causal mask, both alignments (2 points)
#
# **Goal:** with `Nq` queries and `Nk` keys there are two ways to align the causal triangle.
# * `align="top_left"` (the default, and what `causal=True` means everywhere in the course, as
#   in SDPA's `is_causal=True`): query $i$ may see key $j$ iff $j \le i$.
# * `align="bottom_right"` (a KV cache: the queries are the newest `Nq` of `Nk` tokens):
#   query $i$ may see key $j$ iff $j \le i + (N_k - N_q)$, so the last query sees every key.
#
# Write `causal_mask(Nq, Nk, align="top_left", device=None)`: a `(Nq, Nk)` **bool** tensor,
# True = may attend. When `Nq == Nk` both are the usual lower triangle. Hint: compare an
# `arange` column with an `arange` row; the two alignments differ by one number.

# %% [raw]
# # BEGIN SOLUTION


# %%
def causal_mask(Nq, Nk, align="top_left", device=None):
    """(Nq, Nk) bool, True = may attend: j ≤ i (top_left) or j ≤ i + (Nk − Nq) (bottom_right)."""
    # BEGIN SOLUTION
    shift = Nk - Nq if align == "bottom_right" else 0
    i = torch.arange(Nq, device=device)[:, None]  # (Nq, 1)
    j = torch.arange(Nk, device=device)[None, :]  # (1, Nk)
    return j <= i + shift  # (Nq, Nk)
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

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: `helpers.attention.causal_mask`, for a square shape, fewer
# queries than keys and more, in both alignments):


# %%
def masks(fn):
    """fn's masks for (4, 4), (3, 6) and (6, 3), both alignments, by shape; and whether they are bool."""
    out = {}
    for align in ("top_left", "bottom_right"):
        for Nq, Nk in ((4, 4), (3, 6), (6, 3)):
            out[f"{align} mask ({Nq}, {Nk})"] = fn(Nq, Nk, align=align, device=dev)
    return out


check(
    lambda: masks(causal_mask),
    masks(ref.causal_mask),
    name="Exercise 1 · causal_mask",
    against="the chapter's mask",
    atol=0,
    rtol=0,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 2
# by_hand: [helpers.attention.attention_forward, helpers.attention.attention, torch.nn.functional.scaled_dot_product_attention]

# %% [markdown]
# ## Exercise 2 · Masked attention forward, no NaN (2 points)
#
# **Goal:** a masked score becomes $-\infty$, so its weight $e^{-\infty} = 0$; but a query that
# sees **no** key would get $0/0$ = NaN, and must get $P = 0$, $O = 0$ instead.
#
# Write `attention_forward(Q, K, V, mask=None)` returning `(O, P)`: scale $= 1/\sqrt d$
# ($d$ = `Q.shape[-1]`); $S = Q K^\top \cdot$ scale; where `mask` (broadcastable to
# (..., Nq, Nk)) is False, $S = -\infty$; $P$ = the row softmax, computed stably; $O = P V$.
# Work out first what a stable softmax does with a row whose every entry is $-\infty$, and
# where that turns into NaN.
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
def attention_forward(Q, K, V, mask=None):
    """O = softmax(Q Kᵀ/√d, masked) V and P; a row with no visible key gets P = 0, O = 0."""
    # BEGIN SOLUTION
    scale = 1.0 / math.sqrt(Q.shape[-1])
    # (..., Nq, d) @ (..., d, Nk) -> (..., Nq, Nk)
    S = (Q @ K.transpose(-2, -1)) * scale
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
# **Self-check 2** (reference: `helpers.attention.attention_forward`, chapter 6's, with a
# causal mask and one batch whose first key is padded, so its first query sees nothing):

# %%
Q2, K2, V2 = (randn(2, 2, 5, 4, seed=s, dtype=dtype, device=dev) for s in (21, 22, 23))
# (B, Nk), True = padding
pad2 = torch.tensor([[False] * 5, [True] + [False] * 4], device=dev)
mask2 = ref.causal_mask(5, 5, device=dev) & ~pad2[:, None, None, :]  # (B, 1, Nq, Nk)
check(
    attention_forward,
    lambda Q, K, V, mask: ref.attention_forward(Q, K, V, mask),
    args=(Q2, K2, V2, mask2),
    outputs=("O", "P"),
    name="Exercise 2 · attention_forward",
    against="the chapter's attention",
)


def masked_P_nonzero(Q, K, V, mask):
    """How many entries of P are not exactly 0 where the mask says 'may not attend' (−inf, not −100)."""
    out = attention_forward(Q, K, V, mask)
    if out is None:
        return None
    P = out[1]
    return int((P.masked_select(~mask.expand_as(P)) != 0).sum())


check(
    masked_P_nonzero,
    0,
    args=(Q2, K2, V2, mask2),
    outputs=("masked entries of P not exactly 0",),
    counts=("masked entries of P not exactly 0",),
    name="Exercise 2 · masked P",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 3
# by_hand: [autograd, helpers.attention.attention_backward, helpers.functions.softmax_backward]

# %% [markdown]
# ## Exercise 3 · Attention's backward (3 points)
#
# **Goal:** from $P$ and $dO = \partial L/\partial O$, **derive** the three gradients of
# $S = QK^\top\cdot\text{scale}$, $P = \mathrm{softmax}(S)$ (over keys), $O = PV$, with batch
# dimensions in front, and write them in about five lines: the softmax's vector–Jacobian
# product, never its $N\times N$ Jacobian, and **no mask** (say to yourself why none is needed).
#
# Write `attention_backward(Q, K, V, P, grad_O, scale)` returning `(grad_Q, grad_K, grad_V)`.
# Derive on paper first: walk the forward backwards, one step per line, and check each
# gradient has the shape of what it is the gradient of. Open a hint only when stuck.
#
# <details><summary>Hint 1: the order of the steps</summary>
#
# $O = PV$ is a matrix product: it gives $dV$ and $dP$. The softmax turns $dP$ into $dS$ (chapter
# 4's VJP, row by row). $S = QK^\top\cdot\text{scale}$ is a matrix product again: it gives
# $dQ$ and $dK$, each with the scale. A masked entry has $P = 0$, and the softmax VJP multiplies
# by $P$.
#
# </details>
#
# <details><summary>Hint 2: the formulas (check yours against them)</summary>
#
# $dV = P^\top dO$, $\;dP = dO\,V^\top$, $\;dS = P \odot \big(dP - \textstyle\sum_{\text{keys}}
# dP \odot P\big)$, $\;dQ = dS\,K \cdot \text{scale}$, $\;dK = dS^\top Q \cdot \text{scale}$:
# transposes of the last two dims (`.transpose(-2, -1)`), the sum over the last dim with
# `keepdim=True`.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def attention_backward(Q, K, V, P, grad_O, scale):
    """dV = Pᵀ dO, dS = P ⊙ (dO Vᵀ − rowsum(dO Vᵀ ⊙ P)), dQ = dS K·scale, dK = dSᵀ Q·scale."""
    # BEGIN SOLUTION
    # (..., Nk, Nq) @ (..., Nq, d_v) -> (..., Nk, d_v)
    grad_V = P.transpose(-2, -1) @ grad_O
    # (..., Nq, d_v) @ (..., d_v, Nk) -> (..., Nq, Nk)
    grad_P = grad_O @ V.transpose(-2, -1)
    grad_S = P * (grad_P - (grad_P * P).sum(-1, keepdim=True))  # (..., Nq, Nk)
    grad_Q = (grad_S @ K) * scale  # (..., Nq, Nk) @ (..., Nk, d) -> (..., Nq, d)
    # (..., Nk, Nq) @ (..., Nq, d) -> (..., Nk, d)
    grad_K = (grad_S.transpose(-2, -1) @ Q) * scale
    return grad_Q, grad_K, grad_V
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

import torch

from helpers.device import randn

_Q, _K = (
    randn(3, 6, 8, seed=301, dtype=torch.float64),
    randn(3, 9, 8, seed=302, dtype=torch.float64),
)
_V, _gO = (
    randn(3, 9, 5, seed=303, dtype=torch.float64),
    randn(3, 6, 5, seed=304, dtype=torch.float64),
)
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
_O = torch.nn.functional.scaled_dot_product_attention(*_leaves)
_ref = torch.autograd.grad(_O, _leaves, _gO)
_P = torch.softmax(_Q @ _K.transpose(-2, -1) / math.sqrt(8), -1)
_ours = attention_backward(_Q, _K, _V, _P, _gO, 1 / math.sqrt(8))
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-12) for o, r in zip(_ours, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# the scale is an argument, not 1/√d: with scale 1 the scores are unscaled
_Q, _K, _V = (randn(4, 3, seed=s, dtype=torch.float64) for s in (305, 306, 307))
_gO = randn(4, 3, seed=308, dtype=torch.float64)
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
_O = torch.softmax(_leaves[0] @ _leaves[1].T, -1) @ _leaves[2]
_ref = torch.autograd.grad(_O, _leaves, _gO)
_P = torch.softmax(_Q @ _K.T, -1)
assert all(
    torch.allclose(o, r, atol=1e-12)
    for o, r in zip(attention_backward(_Q, _K, _V, _P, _gO, 1.0), _ref)
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (reference: autograd through chapter 6's masked forward, causal, with the
# keys outnumbering the queries, `Nq = 4`, `Nk = 6`; `P` comes from that forward):

# %%
Q3 = randn(2, 2, 4, 8, seed=31, dtype=dtype, device=dev)
K3, V3 = (
    randn(2, 2, 6, 8, seed=32, dtype=dtype, device=dev),
    randn(2, 2, 6, 3, seed=33, dtype=dtype, device=dev),
)
grad_O3 = randn(2, 2, 4, 3, seed=34, dtype=dtype, device=dev)
mask3 = ref.causal_mask(4, 6, device=dev)
_, P3 = ref.attention_forward(Q3, K3, V3, mask3)
expected = autograd_grads(
    lambda Q, K, V: ref.attention_forward(Q, K, V, mask3)[0], (Q3, K3, V3), grad_O3
)
check(
    attention_backward,
    expected,
    args=(Q3, K3, V3, P3, grad_O3, 1 / math.sqrt(8)),
    outputs=("grad_Q", "grad_K", "grad_V"),
    name="Exercise 3 · attention_backward",
    against="autograd",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 3
# by_hand: [autograd, helpers.attention.attention_backward, helpers.attention.mha_backward]

# %% [markdown]
# ## Exercise 4 · Causal attention with padding, end to end, against SDPA (3 points)
#
# **Goal:** put the pieces together and see the masks' effect on the gradients: a padded key
# is never attended to, so nothing flows back into it: its `grad_K` and `grad_V` rows are
# **exactly** zero.
#
# Write `attention_grads(Q, K, V, grad_O, causal=False, key_padding_mask=None, align="top_left")`
# for (B, H, N, d) tensors, returning `(grad_Q, grad_K, grad_V)`:
# * build the mask: your `causal_mask(Nq, Nk, align)` if `causal`; `key_padding_mask` is bool (B, Nk)
#   with **True = padding** (`nn.MultiheadAttention`'s convention, the opposite of the attention
#   mask), so it contributes `~key_padding_mask[:, None, None, :]` (B, 1, 1, Nk); combine with `&`;
# * run your `attention_forward`, then your `attention_backward` with scale $1/\sqrt d$.

# %% [raw]
# # BEGIN SOLUTION


# %%
def attention_grads(
    Q, K, V, grad_O, causal=False, key_padding_mask=None, align="top_left"
):
    """(∂L/∂Q, ∂L/∂K, ∂L/∂V) of masked attention for upstream grad_O, by hand."""
    # BEGIN SOLUTION
    Nq, Nk = Q.shape[-2], K.shape[-2]
    mask = causal_mask(Nq, Nk, align, device=Q.device) if causal else None  # (Nq, Nk)
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, Nk)
        mask = keep if mask is None else mask & keep  # (B, 1, Nq, Nk)
    _, P = attention_forward(Q, K, V, mask)
    return attention_backward(Q, K, V, P, grad_O, 1.0 / math.sqrt(Q.shape[-1]))
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
_pad = torch.tensor([[False] * 6, [False, False, False, False, True, True]])
_mask = torch.ones(6, 6, dtype=torch.bool).tril() & ~_pad[:, None, None, :]
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
_ref = torch.autograd.grad(
    torch.nn.functional.scaled_dot_product_attention(*_leaves, attn_mask=_mask),
    _leaves,
    _gO,
)
_ours = attention_grads(_Q, _K, _V, _gO, causal=True, key_padding_mask=_pad)
assert all(torch.allclose(o, r, atol=1e-12) for o, r in zip(_ours, _ref))
assert torch.equal(_ours[1][1, :, 4:], torch.zeros(3, 2, 4, dtype=torch.float64))
assert torch.equal(_ours[2][1, :, 4:], torch.zeros(3, 2, 4, dtype=torch.float64))

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers import attention as _ref
from helpers.device import randn

# a KV cache: 2 new queries, 5 keys, bottom-right causal; and no mask at all
_Q = randn(1, 2, 2, 4, seed=405, dtype=torch.float64)
_K, _V = (
    randn(1, 2, 5, 4, seed=406, dtype=torch.float64),
    randn(1, 2, 5, 4, seed=407, dtype=torch.float64),
)
_gO = randn(1, 2, 2, 4, seed=408, dtype=torch.float64)
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
_O, _ = _ref.attention_forward(*_leaves, _ref.causal_mask(2, 5, align="bottom_right"))
_g = torch.autograd.grad(_O, _leaves, _gO)
_ours = attention_grads(_Q, _K, _V, _gO, causal=True, align="bottom_right")
assert all(torch.allclose(o, r, atol=1e-12) for o, r in zip(_ours, _g))
# causal=True alone: SDPA's is_causal
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
_g = torch.autograd.grad(
    torch.nn.functional.scaled_dot_product_attention(*_leaves, is_causal=True),
    _leaves,
    _gO,
)
assert all(
    torch.allclose(o, r, atol=1e-12)
    for o, r in zip(attention_grads(_Q, _K, _V, _gO, causal=True), _g)
)
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
_g = torch.autograd.grad(
    torch.nn.functional.scaled_dot_product_attention(*_leaves), _leaves, _gO
)
assert all(
    torch.allclose(o, r, atol=1e-12)
    for o, r in zip(attention_grads(_Q, _K, _V, _gO), _g)
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: autograd through `F.scaled_dot_product_attention` with the same
# boolean mask, in each alignment, on `Nq = 4` queries and `Nk = 6` keys, so the corner matters;
# batch 1's last two keys are padding, and the last output counts their gradient entries that
# are not exactly zero):

# %%
Q4 = randn(2, 2, 4, 4, seed=41, dtype=dtype, device=dev)  # (B, H, Nq, d)
# (B, H, Nk, d)
K4, V4 = (randn(2, 2, 6, 4, seed=s, dtype=dtype, device=dev) for s in (42, 43))
grad_O4 = randn(2, 2, 4, 4, seed=44, dtype=dtype, device=dev)
# (B, Nk), True = padding
pad4 = torch.tensor([[False] * 6, [False] * 4 + [True] * 2], device=dev)


def with_padded_check(grads):
    """The three gradients, plus how many entries of the padded keys' grad_K, grad_V rows are not exactly 0."""
    if grads is None:
        return None
    grad_Q, grad_K, grad_V = grads
    nonzero = int((grad_K[1, :, 4:] != 0).sum() + (grad_V[1, :, 4:] != 0).sum())
    return grad_Q, grad_K, grad_V, nonzero


def sdpa_grads(Q, K, V, grad_O, causal, key_padding_mask, align="top_left"):
    """Autograd through PyTorch's SDPA with the equivalent bool mask (True = may attend)."""
    Nq, Nk = Q.shape[-2], K.shape[-2]
    allowed = torch.ones(Nq, Nk, dtype=torch.bool, device=Q.device)  # (Nq, Nk)
    if causal:  # query i sees keys j ≤ i (top-left) or j ≤ i + (Nk − Nq) (bottom-right)
        allowed = allowed.tril(Nk - Nq if align == "bottom_right" else 0)
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]  # (B, 1, Nq, Nk)
    return autograd_grads(
        lambda Q, K, V: F.scaled_dot_product_attention(Q, K, V, attn_mask=allowed),
        (Q, K, V),
        grad_O,
    )


for align in ("top_left", "bottom_right"):
    check(
        lambda *a: with_padded_check(attention_grads(*a)),
        lambda *a: with_padded_check(sdpa_grads(*a)),
        args=(Q4, K4, V4, grad_O4, True, pad4, align),
        outputs=(
            "grad_Q",
            "grad_K",
            "grad_V",
            "padded keys' gradient entries not exactly 0",
        ),
        counts=("padded keys' gradient entries not exactly 0",),
        name=f"Exercise 4 · attention_grads, {align}",
        against="autograd through SDPA",
    )

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `causal_mask`, `attention_forward`,
# `attention_backward` and `attention_grads`.
