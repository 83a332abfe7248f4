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
# # Lab 10 · Flash attention: the tiled forward and its backward by recomputation
#
# The chapter walked through flash-style attention; here **you** write it. You start with
# one softmax row, build the tiled forward that never holds the `N × N` matrix, then write the
# backward that recomputes each tile of `P` from `Q, K` and one number per row, add the causal
# mask, and wrap it all in an `autograd.Function`. This lab goes with
# [Chapter 10](../chapters/10_flash_attention.ipynb). Everything runs on a CPU, in plain
# PyTorch (no Triton), on small shapes.
#
# **Learning goals.** After this lab you can
# * compute a softmax's max `m` and normaliser `ℓ` in one pass over blocks, rescaling `ℓ`
#   whenever the running max grows;
# * write a tiled attention forward that returns `O` and the row log-sum-exp `L = m + log ℓ`;
# * show that `D = rowsum(dO ∘ O)` equals `rowsum(dP ∘ P)`, and write attention's backward from
#   `Q, K, V, O, L` alone, with `P = exp(S − L)` recomputed;
# * tile that backward (FlashAttention-2 order), accumulating `dV`, `dK`, `dQ` block by block;
# * add causal masking when `N` is not a multiple of the block size;
# * wrap forward and backward in an `autograd.Function` that saves only `Q, K, V, O, L` and
#   passes `gradcheck`.
#
# **Notation and shapes.** `Q` is `(B, H, Nq, d)`, `K` and `V` are `(B, H, Nk, d)`;
# `S = Q Kᵀ · s` with the scale `s = 1/√d`, `P = softmax(S)` row-wise, `O = P V`,
# `L = logsumexp(S)` per row, `(B, H, Nq)`. Gradients are `grad_Q`, `grad_K`, `grad_V`; the
# upstream gradient is `grad_O` (written `dO` in the formulas). Index the last two dimensions
# (`Q[..., q0:q0 + block_q, :]`) so your code works for any leading dimensions. A slice past the
# end is simply shorter: the last block of a ragged `N` takes care of itself if you use the
# block's real size (`Qi.shape[-2]`), not `block_q`.
#
# **How a lab works.** Each exercise states its goal and its points (17 in all). Replace every
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
from torch.autograd.function import once_differentiable

from helpers.device import get_device, no_tf32, randn
from helpers.flash import naive_attention
from helpers.labcheck import autograd_grads, check, check_gradcheck, evaluate

dev = get_device()
no_tf32()
dtype = torch.float64  # float64: your tiles and the reference then agree to ~1e-12


def named(names, fn, *args, **kwargs):
    """{name: part} of what fn(*args, **kwargs) returns; every part None while fn is not written yet."""
    try:
        out = fn(*args, **kwargs)
    except NotImplementedError:
        out = None
    if out is None or out is Ellipsis:
        return dict.fromkeys(names)
    out = out if isinstance(out, (tuple, list)) else (out,)
    if len(out) != len(names):
        raise ValueError(
            f"{fn.__name__} returned {len(out)} values, expected {len(names)} ({', '.join(names)})"
        )
    return dict(zip(names, out))


# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2
# by_hand: [helpers.flash.online_softmax]

# %% [markdown]
# ## Exercise 1 · Online softmax: a running max and a running normaliser (2 points)
#
# **Goal:** the one-pass softmax that the whole of flash attention is built on, and the
# rescaling step that makes it right.
#
# Write `online_softmax_stats(x, block)` for `x` of shape `(..., n)`. Walk over the last
# dimension in blocks of `block` entries (the last block may be shorter), keeping per row a
# running max `m` and a running normaliser `ℓ = Σ exp(x − m)` *relative to the current `m`*.
# **Derive** the update first: when a block raises the max from $m$ to $m_\text{new}$, what
# must happen to the $\ell$ you had, which was a sum of $e^{x_j - m}$?
#
# <details><summary>Hint: the update</summary>
#
# $$m_\text{new} = \max(m, \max x_\text{block}),\qquad
#   \ell_\text{new} = \ell\, e^{\,m - m_\text{new}} + \sum_{j \in \text{block}} e^{\,x_j - m_\text{new}}.$$
#
# </details>
#
# Start from `m = −∞` and `ℓ = 0` (`exp(−∞) = 0`, so the first block needs no special case).
# Return `(m, ell)`, both of shape `(...)`: then `softmax(x) = exp(x − m[..., None]) / ell[..., None]`.
# Do not compute `x.amax(-1)` over the whole row: the point is to see each block once.

# %% [raw]
# # BEGIN SOLUTION


# %%
def online_softmax_stats(x, block):
    """m = max x and ℓ = Σ exp(x − m) over the last dim, built block by block with rescaling."""
    # BEGIN SOLUTION
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)  # (...,)
    ell = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)  # (...,)
    for start in range(0, x.shape[-1], block):
        xb = x[..., start : start + block]  # (..., ≤ block)
        m_new = torch.maximum(m, xb.amax(dim=-1))
        ell = ell * torch.exp(m - m_new) + torch.exp(xb - m_new[..., None]).sum(dim=-1)
        m = m_new
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

# scores near 1000: exp(x) overflows float64, exp(x − m) does not; block 1 and a block longer than the row
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
# **Self-check 1** (reference: the two-pass `m = max x`, `ℓ = Σ exp(x − m)`, on rows of 10
# in blocks of 3, with a late maximum so that `ℓ` has to be rescaled):

# %%
x_test = randn(2, 3, 10, seed=1, dtype=dtype, device=dev) * 2
x_test[1, 2, 9] = 7.0  # a late maximum, in the last (short) block
m_ref = x_test.amax(-1)
check(
    online_softmax_stats,
    (m_ref, torch.exp(x_test - m_ref[..., None]).sum(-1)),
    args=(x_test, 3),
    outputs=("m", "ell"),
    name="Exercise 1 · online_softmax_stats",
    against="the two-pass max and sum",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 3
# by_hand: [helpers.flash.naive_attention, helpers.flash.flash_forward, helpers.flash.flash_attention, torch.nn.functional.scaled_dot_product_attention]

# %% [markdown]
# ## Exercise 2 · The tiled forward: O and the row log-sum-exp L (3 points)
#
# **Goal:** attention that only ever holds one `(block_q × block_k)` tile of scores, and one
# number per row, `L`, that summarises the whole softmax for backward.
#
# Write `tiled_forward(Q, K, V, block_q, block_k, causal=False)` returning `(O, L)`, `O` of
# shape `(B, H, Nq, d)` and `L` of shape `(B, H, Nq)`. For each block of queries `Qi`
# (`(B, H, bq, d)`), keep a running max `m`, normaliser `ℓ` (both `(B, H, bq)`) and an
# un-normalised output `acc` (`(B, H, bq, d)`), and loop over the blocks of keys `Kj, Vj`:
#
# * `S = Qi Kjᵀ · s` with `s = 1/√d` — `(B, H, bq, bk)`, the only scores in memory;
# * `m_new = max(m, rowmax S)`, `P̃ = exp(S − m_new)`, `α = exp(m − m_new)`;
# * `ℓ = α ℓ + rowsum P̃` and `acc = α acc + P̃ Vj` — the accumulator is rescaled by the same `α`.
#
# After the last key block, `O = acc / ℓ` and `L = m + log ℓ` for those rows. Never build the full
# `(Nq, Nk)` score matrix. Leave `causal` alone for now (Exercise 5 comes back to it): start
# your function with `if causal: raise NotImplementedError` until then.

# %% [raw]
# # BEGIN SOLUTION


# %%
def tiled_forward(Q, K, V, block_q=16, block_k=16, causal=False):
    """O = softmax(Q Kᵀ/√d) V and L = logsumexp rows, one (block_q × block_k) tile of S at a time."""
    # BEGIN SOLUTION
    Nq, d = Q.shape[-2:]
    Nk = K.shape[-2]
    scale = 1 / math.sqrt(d)
    O = torch.empty_like(Q)  # (B, H, Nq, d)
    L = torch.empty(Q.shape[:-1], dtype=Q.dtype, device=Q.device)  # (B, H, Nq)
    for q0 in range(0, Nq, block_q):
        Qi = Q[..., q0 : q0 + block_q, :]  # (B, H, bq, d)
        bq = Qi.shape[-2]
        # (B, H, bq)
        m = torch.full(Qi.shape[:-1], -math.inf, dtype=Q.dtype, device=Q.device)
        ell = torch.zeros_like(m)  # (B, H, bq)
        acc = torch.zeros_like(Qi)  # (B, H, bq, d)
        # causal: later key blocks are all masked
        k_stop = min(Nk, q0 + bq) if causal else Nk
        for k0 in range(0, k_stop, block_k):
            # (B, H, bk, d)
            Kj, Vj = (
                K[..., k0 : k0 + block_k, :],
                V[..., k0 : k0 + block_k, :],
            )
            S = (Qi @ Kj.transpose(-2, -1)) * scale  # (B, H, bq, bk)
            if causal:
                allowed = causal_tile_mask(q0, k0, bq, Kj.shape[-2], Q.device)
                S = S.masked_fill(~allowed, -math.inf)
            # finite: every row sees key 0 in block 0
            m_new = torch.maximum(m, S.amax(dim=-1))
            P = torch.exp(S - m_new[..., None])  # (B, H, bq, bk)
            alpha = torch.exp(m - m_new)  # (B, H, bq)
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

from helpers.device import randn
from helpers.flash import naive_attention

# Nq ≠ Nk, neither a multiple of its block, d = 3 (so 1/√d is irrational)
_Q, _K, _V = (
    randn(2, 1, 9, 3, seed=2001, dtype=torch.float64),
    randn(2, 1, 14, 3, seed=2002, dtype=torch.float64),
    randn(2, 1, 14, 3, seed=2003, dtype=torch.float64),
)
_O, _L = tiled_forward(_Q, _K, _V, 4, 5)
_O_ref, _L_ref = naive_attention(_Q, _K, _V, return_lse=True)
assert _O.shape == (2, 1, 9, 3) and torch.allclose(_O, _O_ref, atol=1e-10, rtol=1e-8)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.flash import naive_attention

_Q, _K, _V = (
    randn(1, 2, 10, 4, seed=2004, dtype=torch.float64),
    randn(1, 2, 7, 4, seed=2005, dtype=torch.float64),
    randn(1, 2, 7, 4, seed=2006, dtype=torch.float64),
)
_O, _L = tiled_forward(_Q, _K, _V, 3, 2)
_O_ref, _L_ref = naive_attention(_Q, _K, _V, return_lse=True)
assert _L.shape == (1, 2, 10) and torch.allclose(_L, _L_ref, atol=1e-10, rtol=1e-8)
# one row at a time, one block holding every key
_O1, _L1 = tiled_forward(_Q, _K, _V, 1, 100)
assert torch.allclose(_O1, _O_ref, atol=1e-10, rtol=1e-8) and torch.allclose(
    _L1, _L_ref, atol=1e-10, rtol=1e-8
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.flash import naive_attention

# scores in the thousands: exp(S) overflows float64, exp(S − m) does not
_Q, _K, _V = (
    randn(1, 1, 8, 4, seed=2007, dtype=torch.float64) * 40,
    randn(1, 1, 11, 4, seed=2008, dtype=torch.float64) * 40,
    randn(1, 1, 11, 4, seed=2009, dtype=torch.float64),
)
_O, _L = tiled_forward(_Q, _K, _V, 3, 4)
_O_ref, _L_ref = naive_attention(_Q, _K, _V, return_lse=True)
assert torch.isfinite(_O).all() and torch.allclose(_O, _O_ref, atol=1e-9, rtol=1e-8)
assert torch.allclose(_L, _L_ref, atol=1e-9, rtol=1e-10)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: `helpers.flash.naive_attention`, which builds the full `P` and
# computes `L` with `torch.logsumexp`; `N = 11` in blocks of 4 queries and 3 keys, so both last
# blocks are short):

# %%
Q = randn(1, 2, 11, 4, seed=2, dtype=dtype, device=dev)
K = randn(1, 2, 11, 4, seed=3, dtype=dtype, device=dev)
V = randn(1, 2, 11, 4, seed=4, dtype=dtype, device=dev)
check(
    tiled_forward,
    naive_attention(Q, K, V, return_lse=True),
    args=(Q, K, V, 4, 3),
    outputs=("O", "L"),
    name="Exercise 2 · tiled_forward",
    against="naive attention",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 3
# by_hand: [autograd, helpers.flash.naive_attention, helpers.flash.flash_backward, helpers.flash.flash_attention]

# %% [markdown]
# ## Exercise 3 · D = rowsum(dO ∘ O), and the backward from O and L alone (3 points)
#
# **Goal:** the two facts that let the backward forget `P`: the softmax row sum is one number
# per row computable from `O`, and `P` itself is one `exp` away from `L`.
#
# Softmax's backward (chapter 6) is `dS = P ∘ (dP − D)` with `D_i = Σ_k P_ik dP_ik` and
# `dP = dO Vᵀ`. **First, on paper:** show that `D_i = dO_i · O_i`. (Hint: write `dP_ik` as a dot
# product of row `i` of `dO` with row `k` of `V`, swap the sums, and recognise `O_i = Σ_k P_ik V_k`.)
# Write your one-line derivation in the Markdown cell below the code.
#
# Then write two functions, with full `(Nq, Nk)` matrices this time (no tiles yet):
#
# * `row_D(O, grad_O)` → `D` of shape `(B, H, Nq)`, as `rowsum(dO ∘ O)`;
# * `attention_backward_from_L(Q, K, V, O, L, grad_O)` → `(grad_Q, grad_K, grad_V)`, using only
#   these inputs. First work out how to get `P` back from `S` and `L` alone (what is `L`?), then
#   reuse chapter 6's backward with `D` in place of the row sum. Do not call `torch.softmax`
#   or autograd.
#
# <details><summary>Hint: the recipe</summary>
#
# Recompute `S = Q Kᵀ · s`, then `P = exp(S − L)` (already normalised: `L` holds `m + log ℓ`),
# `grad_V = Pᵀ dO`, `dP = dO Vᵀ`, `dS = P ∘ (dP − D)`, `grad_Q = dS K · s`, `grad_K = dSᵀ Q · s`.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def row_D(O, grad_O):
    """D = rowsum(dO ∘ O) = rowsum(dP ∘ P), one number per query row."""
    # (B, H, Nq, d) -> (B, H, Nq)
    return (grad_O * O).sum(dim=-1)  # SOLUTION


def attention_backward_from_L(Q, K, V, O, L, grad_O):
    """grad_Q, grad_K, grad_V from Q, K, V, O, L only: P = exp(S − L), dS = P ∘ (dO Vᵀ − D)."""
    # BEGIN SOLUTION
    scale = 1 / math.sqrt(Q.shape[-1])
    D = (grad_O * O).sum(dim=-1)  # (B, H, Nq)
    S = (Q @ K.transpose(-2, -1)) * scale  # (B, H, Nq, Nk)
    P = torch.exp(S - L[..., None])  # (B, H, Nq, Nk), normalised
    grad_V = P.transpose(-2, -1) @ grad_O  # (B, H, Nk, d)
    dP = grad_O @ V.transpose(-2, -1)  # (B, H, Nq, Nk)
    dS = P * (dP - D[..., None])  # (B, H, Nq, Nk)
    grad_Q = (dS @ K) * scale  # (B, H, Nq, d)
    grad_K = (dS.transpose(-2, -1) @ Q) * scale  # (B, H, Nk, d)
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

from helpers.device import randn
from helpers.flash import naive_attention

_Q, _K, _V = (
    randn(1, 2, 6, 5, seed=3003, dtype=torch.float64),
    randn(1, 2, 6, 5, seed=3004, dtype=torch.float64),
    randn(1, 2, 6, 5, seed=3005, dtype=torch.float64),
)
_gO = randn(1, 2, 6, 5, seed=3006, dtype=torch.float64)
_O, _L = naive_attention(_Q, _K, _V, return_lse=True)
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
_ref = torch.autograd.grad(naive_attention(*_leaves), _leaves, _gO)
_out = attention_backward_from_L(_Q, _K, _V, _O, _L, _gO)
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

# Nq ≠ Nk and d = 3: the scale 1/√3 and every shape must be right
_Q, _K, _V = (
    randn(2, 1, 4, 3, seed=3007, dtype=torch.float64),
    randn(2, 1, 7, 3, seed=3008, dtype=torch.float64),
    randn(2, 1, 7, 3, seed=3009, dtype=torch.float64),
)
_gO = randn(2, 1, 4, 3, seed=3010, dtype=torch.float64)
_O, _L = naive_attention(_Q, _K, _V, return_lse=True)
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
_ref = torch.autograd.grad(naive_attention(*_leaves), _leaves, _gO)
_out = attention_backward_from_L(_Q, _K, _V, _O, _L, _gO)
assert all(
    o.shape == r.shape and torch.allclose(o, r, atol=1e-10, rtol=1e-8)
    for o, r in zip(_out, _ref)
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# *Your derivation of `D_i = dO_i · O_i` (one line):*
#
# ...

# %% [markdown]
# **Self-check 3**, one line for both functions (references: `rowsum(dP ∘ P)` with the full
# softmax `P` and `dP = dO Vᵀ`, which your `row_D` must equal; autograd through
# `naive_attention` for the gradients. `O` and `L` come from `naive_attention`, so this check
# does not depend on your Exercise 2):

# %%
grad_O = randn(1, 2, 11, 4, seed=5, dtype=dtype, device=dev)
O_ref, L_ref = naive_attention(Q, K, V, return_lse=True)
# (1, 2, 11, 11)
P_full = torch.softmax((Q @ K.transpose(-2, -1)) / math.sqrt(Q.shape[-1]), dim=-1)
dP_full = grad_O @ V.transpose(-2, -1)  # (1, 2, 11, 11)
expected = dict(
    zip(
        ("D", "grad_Q", "grad_K", "grad_V"),
        (
            (P_full * dP_full).sum(-1),
            *autograd_grads(naive_attention, (Q, K, V), grad_O),
        ),
    )
)


def exercise_3(Q, K, V, O, L, grad_O):
    """Your D and your three gradients, by name."""
    return {
        **named(("D",), row_D, O, grad_O),
        **named(
            ("grad_Q", "grad_K", "grad_V"),
            attention_backward_from_L,
            Q,
            K,
            V,
            O,
            L,
            grad_O,
        ),
    }


check(
    exercise_3,
    expected,
    args=(Q, K, V, O_ref, L_ref, grad_O),
    name="Exercise 3 · row_D and attention_backward_from_L",
    against="rowsum(dP ∘ P) and autograd",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 4
# by_hand: [autograd, helpers.flash.naive_attention, helpers.flash.flash_backward, helpers.flash.flash_attention]

# %% [markdown]
# ## Exercise 4 · The tiled backward, by recomputation (4 points)
#
# **Goal:** the FlashAttention-2 backward: the same gradients as Exercise 3 while only ever
# holding one `(block_q × block_k)` tile of `S`, `P`, `dP` and `dS`.
#
# Write `tiled_backward(Q, K, V, O, L, grad_O, block_q, block_k, causal=False)` returning
# `(grad_Q, grad_K, grad_V)` with the shapes of `Q, K, V`. Compute `D = rowsum(dO ∘ O)` once,
# start the three gradients at zero, then loop **outer over key blocks** `Kj, Vj` and **inner
# over query blocks** `Qi, dOi` (so `dKj`, `dVj` stay local to the outer loop); per tile, the
# lines of Exercise 3 restricted to that tile: which rows of `L` and `D` belong to it, and
# which slice of each gradient it adds to?
#
# <details><summary>Hint: one tile</summary>
#
# * `S = Qi Kjᵀ · s` and `P = exp(S − Li)` — recomputed, normalised;
# * `dVj += Pᵀ dOi`, `dP = dOi Vjᵀ`, `dS = P ∘ (dP − Di)`;
# * `dQi += dS Kj · s` and `dKj += dSᵀ Qi · s`, with `s = 1/√d`.
#
# </details>
#
# Every gradient is a **sum over tiles**: accumulate with `+=` into the right slice, never
# overwrite. Leave every input as it came (`Q, K, V, O, L, grad_O`: a backward never edits its
# inputs in place; the tests check). As in Exercise 2, leave `causal` for Exercise 5
# (`if causal: raise NotImplementedError`).

# %% [raw]
# # BEGIN SOLUTION


# %%
def tiled_backward(Q, K, V, O, L, grad_O, block_q=16, block_k=16, causal=False):
    """FlashAttention-2 backward: D = rowsum(dO∘O); per tile P = exp(S − L), dV += Pᵀ dO, dS = P∘(dO Vᵀ − D), dQ += dS K·s, dK += dSᵀ Q·s."""
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
    for k0 in range(0, Nk, block_k):
        # (B, H, bk, d)
        Kj, Vj = (
            K[..., k0 : k0 + block_k, :],
            V[..., k0 : k0 + block_k, :],
        )
        bk = Kj.shape[-2]
        grad_Kj, grad_Vj = torch.zeros_like(Kj), torch.zeros_like(Vj)  # (B, H, bk, d)
        for q0 in range(0, Nq, block_q):
            # (B, H, bq, d)
            Qi, dOi = (
                Q[..., q0 : q0 + block_q, :],
                grad_O[..., q0 : q0 + block_q, :],
            )
            bq = Qi.shape[-2]
            # every query of this block comes before every key
            if causal and q0 + bq - 1 < k0:
                continue
            S = (Qi @ Kj.transpose(-2, -1)) * scale  # (B, H, bq, bk)
            P = torch.exp(S - L[..., q0 : q0 + bq, None])  # (B, H, bq, bk)
            if causal:
                P = P.masked_fill(~causal_tile_mask(q0, k0, bq, bk, Q.device), 0.0)
            grad_Vj += P.transpose(-2, -1) @ dOi  # (B, H, bk, d)
            dP = dOi @ Vj.transpose(-2, -1)  # (B, H, bq, bk)
            dS = P * (dP - D[..., q0 : q0 + bq, None])  # (B, H, bq, bk)
            grad_Q[..., q0 : q0 + bq, :] += (dS @ Kj) * scale  # (B, H, bq, d)
            grad_Kj += (dS.transpose(-2, -1) @ Qi) * scale  # (B, H, bk, d)
        grad_K[..., k0 : k0 + bk, :] = grad_Kj
        grad_V[..., k0 : k0 + bk, :] = grad_Vj
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
import torch

from helpers.device import randn
from helpers.flash import naive_attention

# ragged blocks both ways, d = 3
_Q, _K, _V = (
    randn(2, 1, 10, 3, seed=4001, dtype=torch.float64),
    randn(2, 1, 10, 3, seed=4002, dtype=torch.float64),
    randn(2, 1, 10, 3, seed=4003, dtype=torch.float64),
)
_gO = randn(2, 1, 10, 3, seed=4004, dtype=torch.float64)
_O, _L = naive_attention(_Q, _K, _V, return_lse=True)
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
_ref = torch.autograd.grad(naive_attention(*_leaves), _leaves, _gO)
_out = tiled_backward(_Q, _K, _V, _O, _L, _gO, 4, 3)
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

# Nq ≠ Nk: grad_Q has Q's shape, grad_K and grad_V have K's
_Q, _K, _V = (
    randn(1, 2, 5, 4, seed=4005, dtype=torch.float64),
    randn(1, 2, 9, 4, seed=4006, dtype=torch.float64),
    randn(1, 2, 9, 4, seed=4007, dtype=torch.float64),
)
_gO = randn(1, 2, 5, 4, seed=4008, dtype=torch.float64)
_O, _L = naive_attention(_Q, _K, _V, return_lse=True)
_leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
_ref = torch.autograd.grad(naive_attention(*_leaves), _leaves, _gO)
_out = tiled_backward(_Q, _K, _V, _O, _L, _gO, 2, 4)
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

# the block size must not change the answer (1×1 tiles, and one tile larger than the matrix)
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
    _out = tiled_backward(_Q, _K, _V, _O, _L, _gO, _bq, _bk)
    assert all(torch.allclose(o, r, atol=1e-10, rtol=1e-8) for o, r in zip(_out, _ref))

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.flash import naive_attention

# three gradients of the right shapes, and the inputs left unchanged (no in-place edits)
_ins = [randn(1, 1, 5, 3, seed=s, dtype=torch.float64) for s in (4013, 4014, 4015)]
_gO = randn(1, 1, 5, 3, seed=4016, dtype=torch.float64)
_O, _L = naive_attention(*_ins, return_lse=True)
_all = _ins + [_O, _L, _gO]
_copies = [t.clone() for t in _all]
_out = tiled_backward(*_all, 2, 2)
assert _out is not None and [tuple(t.shape) for t in _out] == [(1, 1, 5, 3)] * 3
assert all(torch.equal(a, b) for a, b in zip(_all, _copies))

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: autograd through `naive_attention`; the same `Q, K, V, grad_O` as
# self-check 3, `N = 11` in tiles of 4 queries × 3 keys; `O` and `L` from `naive_attention`):

# %%
check(
    tiled_backward,
    autograd_grads(naive_attention, (Q, K, V), grad_O),
    args=(Q, K, V, O_ref, L_ref, grad_O, 4, 3),
    outputs=("grad_Q", "grad_K", "grad_V"),
    name="Exercise 4 · tiled_backward",
    against="autograd",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex5
# points: 3
# by_hand: [helpers.attention.causal_mask]

# %% [markdown]
# ## Exercise 5 · Causal masking, with N not a multiple of the block size (3 points)
#
# **Goal:** the causal mask tile by tile: which tiles to skip, which to mask, and why the
# backward masks `P` with zeros where the forward masked `S` with `−∞`.
#
# Query `i` may look at keys `j ≤ i` (*top-left aligned*: what `causal=True` means everywhere in
# the course, like SDPA's `is_causal=True`, also when `Nq ≠ Nk`; lab 6's `align="bottom_right"`,
# the KV-cache alignment, is not asked for here). In global indices a tile covers queries
# `q0 … q0 + bq − 1` and keys `k0 … k0 + bk − 1`.
#
# 1. Write `causal_tile_mask(q0, k0, bq, bk, device=None)`: a `bool` tensor of shape `(bq, bk)`,
#    `True` where key `k0 + j` is visible to query `q0 + i`.
# 2. Go back to `tiled_forward` (Exercise 2) and `tiled_backward` (Exercise 4), remove the
#    `raise NotImplementedError` and make `causal=True` work, then re-run those cells:
#    * forward: fill the masked scores with `−inf` before the running max, and skip key blocks
#      that start after the query block's last row (they are all masked). Row `i` always sees
#      key 0, so `m` is finite after the first block and `ℓ` is never 0;
#    * backward: `P = exp(S − L)` is *not* zero where `S` was masked (you recompute `S` without
#      the mask), so set those entries of `P` to `0` before using it; skip tiles that are all
#      masked.

# %% [raw]
# # BEGIN SOLUTION


# %%
def causal_tile_mask(q0, k0, bq, bk, device=None):
    """allowed[i, j] = (k0 + j <= q0 + i): the causal mask of one (bq, bk) tile."""
    # BEGIN SOLUTION
    rows = torch.arange(q0, q0 + bq, device=device)[:, None]  # (bq, 1)
    cols = torch.arange(k0, k0 + bk, device=device)[None, :]  # (1, bk)
    return cols <= rows  # (bq, bk) bool
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
_ref = torch.arange(2, 7)[None, :] <= torch.arange(3, 7)[:, None]
assert torch.equal(_M, _ref)
assert not causal_tile_mask(0, 4, 2, 3).any() and causal_tile_mask(6, 0, 2, 3).all()

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.flash import naive_attention

# causal forward, ragged N, and Nq ≠ Nk (top-left aligned)
for _Nq, _Nk, _bq, _bk in ((10, 10, 4, 3), (7, 12, 3, 5), (9, 4, 2, 3)):
    _Q, _K, _V = (
        randn(1, 2, _Nq, 3, seed=5001, dtype=torch.float64),
        randn(1, 2, _Nk, 3, seed=5002, dtype=torch.float64),
        randn(1, 2, _Nk, 3, seed=5003, dtype=torch.float64),
    )
    _O, _L = tiled_forward(_Q, _K, _V, _bq, _bk, causal=True)
    _O_ref, _L_ref = naive_attention(_Q, _K, _V, causal=True, return_lse=True)
    assert torch.allclose(_O, _O_ref, atol=1e-10, rtol=1e-8) and torch.allclose(
        _L, _L_ref, atol=1e-10, rtol=1e-8
    )

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.flash import naive_attention

# causal backward, ragged N, and Nq ≠ Nk (top-left aligned)
for _Nq, _Nk, _bq, _bk in ((10, 10, 3, 4), (6, 11, 4, 3), (9, 5, 2, 2)):
    _Q, _K, _V = (
        randn(2, 1, _Nq, 3, seed=5004, dtype=torch.float64),
        randn(2, 1, _Nk, 3, seed=5005, dtype=torch.float64),
        randn(2, 1, _Nk, 3, seed=5006, dtype=torch.float64),
    )
    _gO = randn(2, 1, _Nq, 3, seed=5007, dtype=torch.float64)
    _O, _L = naive_attention(_Q, _K, _V, causal=True, return_lse=True)
    _leaves = [t.clone().requires_grad_() for t in (_Q, _K, _V)]
    _ref = torch.autograd.grad(naive_attention(*_leaves, causal=True), _leaves, _gO)
    _out = tiled_backward(_Q, _K, _V, _O, _L, _gO, _bq, _bk, causal=True)
    assert all(torch.allclose(o, r, atol=1e-10, rtol=1e-8) for o, r in zip(_out, _ref))

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 5**, one line for the three parts (references: the mask of the tile at queries
# 4…7, keys 3…8; `naive_attention` with `causal=True` for `O` and `L`; autograd through it for the
# gradients. `N = 11` in tiles of 4 queries × 3 keys, so the diagonal crosses ragged tiles; and
# the first 7 queries against all 11 keys, where the two alignments of lab 6 differ):

# %%
O_causal, L_causal = naive_attention(Q, K, V, causal=True, return_lse=True)
Q7, grad_O7 = Q[:, :, :7], grad_O[:, :, :7]  # Nq = 7 < Nk = 11
O7, L7 = naive_attention(Q7, K, V, causal=True, return_lse=True)
expected = dict(
    zip(
        ("mask", "O", "L", "grad_Q", "grad_K", "grad_V"),
        (
            torch.arange(3, 9)[None, :] <= torch.arange(4, 8)[:, None],
            O_causal,
            L_causal,
            *autograd_grads(
                lambda q, k, v: naive_attention(q, k, v, causal=True), (Q, K, V), grad_O
            ),
        ),
    )
)
expected.update(
    zip(
        (
            "O (Nq 7, Nk 11)",
            "L (Nq 7, Nk 11)",
            "grad_Q (Nq 7, Nk 11)",
            "grad_K (Nq 7, Nk 11)",
            "grad_V (Nq 7, Nk 11)",
        ),
        (
            O7,
            L7,
            *autograd_grads(
                lambda q, k, v: naive_attention(q, k, v, causal=True),
                (Q7, K, V),
                grad_O7,
            ),
        ),
    )
)


def exercise_5(Q, K, V, O, L, grad_O):
    """Your tile mask, causal O and L, and causal gradients (from the reference O and L), by name."""
    return {
        **named(("mask",), causal_tile_mask, 4, 3, 4, 6),
        **named(("O", "L"), tiled_forward, Q, K, V, 4, 3, causal=True),
        **named(
            ("grad_Q", "grad_K", "grad_V"),
            tiled_backward,
            Q,
            K,
            V,
            O,
            L,
            grad_O,
            4,
            3,
            causal=True,
        ),
        **named(
            ("O (Nq 7, Nk 11)", "L (Nq 7, Nk 11)"),
            tiled_forward,
            Q7,
            K,
            V,
            4,
            3,
            causal=True,
        ),
        **named(
            ("grad_Q (Nq 7, Nk 11)", "grad_K (Nq 7, Nk 11)", "grad_V (Nq 7, Nk 11)"),
            tiled_backward,
            Q7,
            K,
            V,
            O7,
            L7,
            grad_O7,
            4,
            3,
            causal=True,
        ),
    }


check(
    exercise_5,
    expected,
    args=(Q, K, V, O_causal, L_causal, grad_O),
    name="Exercise 5 · causal",
    against="the tile's mask, naive attention and autograd",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex6
# points: 2
# by_hand: [autograd, helpers.flash.naive_attention, helpers.flash.flash_backward, helpers.flash.flash_attention]

# %% [markdown]
# ## Exercise 6 · An autograd.Function that saves only Q, K, V, O, L (2 points)
#
# **Goal:** plug your forward and backward into autograd, keeping for backward only what is
# linear in `N`, and prove the result with `gradcheck`.
#
# Fill in `FlashAttentionFn`, following the course's rules for custom Functions:
#
# * `forward(Q, K, V, causal, block_q, block_k)` (no `ctx`) returns `(O, L)` from your `tiled_forward`;
# * `setup_context(ctx, inputs, output)` saves exactly `Q, K, V, O, L` with
#   `ctx.save_for_backward`, keeps `causal`, `block_q`, `block_k` on `ctx`, and marks `L`
#   non-differentiable (`ctx.mark_non_differentiable(L)`: it is returned for inspection only);
# * `backward(ctx, grad_O, grad_L)` unpacks `ctx.saved_tensors`, calls your `tiled_backward`,
#   returns a gradient for each input gated on `ctx.needs_input_grad` (`None` when it is not
#   needed), and `None` for `causal`, `block_q`, `block_k`.
#
# Then complete the wrapper `flash_attn(Q, K, V, causal, block_q, block_k)`, which returns `O` only.
# This exercise builds on Exercises 2, 4 and 5: if one of those is wrong, so is this one. It is
# the last step, and your instructor may make it optional.

# %% [raw]
# # BEGIN SOLUTION


# %%
class FlashAttentionFn(torch.autograd.Function):
    """(O, L) = tiled_forward(Q, K, V); backward recomputes P tile by tile from the saved Q, K, V, O, L."""

    @staticmethod
    def forward(Q, K, V, causal, block_q, block_k):
        """(O, L) by the tiled forward; no ctx here."""
        # BEGIN SOLUTION
        return tiled_forward(Q, K, V, block_q, block_k, causal)
        # END SOLUTION

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save Q, K, V, O, L (nothing N × N) and the non-tensor arguments; L is not differentiable."""
        # BEGIN SOLUTION
        Q, K, V, causal, block_q, block_k = inputs
        O, L = output
        ctx.save_for_backward(Q, K, V, O, L)
        ctx.causal, ctx.block_q, ctx.block_k = causal, block_q, block_k
        ctx.mark_non_differentiable(L)
        # END SOLUTION

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_O, grad_L):
        """grad_Q, grad_K, grad_V by the tiled backward; None for causal, block_q, block_k."""
        # BEGIN SOLUTION
        Q, K, V, O, L = ctx.saved_tensors
        grad_Q, grad_K, grad_V = tiled_backward(
            Q, K, V, O, L, grad_O, ctx.block_q, ctx.block_k, ctx.causal
        )
        need_Q, need_K, need_V = ctx.needs_input_grad[:3]
        return (
            grad_Q if need_Q else None,
            grad_K if need_K else None,
            grad_V if need_V else None,
            None,
            None,
            None,
        )
        # END SOLUTION


def flash_attn(Q, K, V, causal=False, block_q=16, block_k=16):
    """O = softmax(Q Kᵀ/√d [+ causal mask]) V through FlashAttentionFn (L is dropped)."""
    O, L = FlashAttentionFn.apply(Q, K, V, causal, block_q, block_k)  # SOLUTION
    return O


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
    randn(1, 2, 5, 3, seed=s, dtype=torch.float64, requires_grad=True)
    for s in (6001, 6002, 6003)
]
assert torch.autograd.gradcheck(lambda q, k, v: flash_attn(q, k, v, False, 2, 3), _ins)
assert torch.autograd.gradcheck(lambda q, k, v: flash_attn(q, k, v, True, 3, 2), _ins)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.flash import naive_attention

# saved for backward: Q, K, V, O (B, H, N, d) and L (B, H, N), nothing (N, N)
_Q, _K, _V = (
    randn(2, 1, 7, 3, seed=s, dtype=torch.float64, requires_grad=True)
    for s in (6004, 6005, 6006)
)
_O = flash_attn(_Q, _K, _V, True, 2, 2)
_saved = _O.grad_fn.saved_tensors
assert sorted(tuple(t.shape) for t in _saved) == sorted(
    [(2, 1, 7, 3)] * 4 + [(2, 1, 7)]
)
assert torch.allclose(
    _O, naive_attention(_Q, _K, _V, causal=True), atol=1e-10, rtol=1e-8
)
# only V needs a gradient: backward must still work (and not compute what is gated off)
_Qn, _Kn = _Q.detach(), _K.detach()
(_gV,) = torch.autograd.grad(flash_attn(_Qn, _Kn, _V, False, 3, 3).sum(), (_V,))
_Vl = _V.detach().clone().requires_grad_()
(_gV_ref,) = torch.autograd.grad(naive_attention(_Qn, _Kn, _Vl).sum(), (_Vl,))
assert torch.allclose(_gV, _gV_ref, atol=1e-10, rtol=1e-8)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 6** (references: the sizes of the tensors your Function saves, which must be those
# of `Q, K, V, O, L`; then `torch.autograd.gradcheck` in float64, causal, `N = 7` in tiles of
# 3 × 2 — finite differences against your backward):

# %%
Q6, K6, V6 = (randn(1, 2, 7, 3, seed=s, dtype=dtype, device=dev) for s in (6, 7, 8))


def saved_for_backward(Q, K, V):
    """How many tensors flash_attn's node keeps for backward, and their sizes (numel, sorted)."""
    leaves = [t.detach().clone().requires_grad_() for t in (Q, K, V)]
    saved = flash_attn(*leaves, True, 3, 2).grad_fn.saved_tensors
    return {
        "number of saved tensors": torch.tensor(len(saved)),
        "their sizes": torch.tensor(sorted(t.numel() for t in saved)),
    }


sizes = [Q6.numel()] * 4 + [Q6.numel() // Q6.shape[-1]]  # Q, K, V, O: B·H·N·d; L: B·H·N
result = evaluate(
    saved_for_backward,
    {
        "number of saved tensors": torch.tensor(5),
        "their sizes": torch.tensor(sorted(sizes)),
    },
    args=(Q6, K6, V6),
    name="Exercise 6 · FlashAttentionFn",
)
if result:  # it saves Q, K, V, O, L: now finite differences against its backward
    result = check_gradcheck(
        lambda q, k, v: flash_attn(q, k, v, True, 3, 2),
        (Q6, K6, V6),
        name="Exercise 6 · FlashAttentionFn (saves Q, K, V, O, L)",
        quiet=True,
    )
print(result.line)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the function names: the grader calls `online_softmax_stats`,
# `tiled_forward`, `row_D`, `attention_backward_from_L`, `tiled_backward`, `causal_tile_mask`,
# `FlashAttentionFn` and `flash_attn`.
#
# **Going further.** The chapter's `helpers.flash` is the same algorithm with `(B, H, N, d)`
# checks and a scale argument, and `helpers/flash_triton.py` runs it as Triton kernels on a
# GPU: compare your loops with its `_attn_fwd` and `_bwd_dk_dv`.
