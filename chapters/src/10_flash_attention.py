# %% [markdown]
# # 10. Flash-style attention: tiles, online softmax and a backward that recomputes
#
# Attention as chapter 6 wrote it builds the whole $N \times N$ matrix $P = \mathrm{softmax}(S)$ and keeps it
# for backward. This chapter removes that matrix: the forward walks over blocks of keys with a
# *running* softmax, the backward *recomputes* each block of $P$ from one number per row. We write
# it in plain PyTorch first, check it against `F.scaled_dot_product_attention` (SDPA), then write
# the same thing as Triton kernels, and finally **measure** the memory instead of quoting it.
#
# **Learning goals.** After this chapter you can
#
# * compute a [softmax](../pages/glossary.md#term-30) in one pass with a running max $m$ and normaliser $\ell$ (an
#   [online softmax](../pages/glossary.md#term-online-softmax)), and say why the
#   accumulated sum must be *rescaled* whenever $m$ grows;
# * write a tiled ([tiling](../pages/glossary.md#term-tiling)) attention forward that never materialises $N \times N$ and
#   returns $O$ and the
#   row log-sum-exp $L$;
# * derive the FlashAttention-2 backward: $D = \mathrm{rowsum}(dO \circ O)$, $P = e^{S - L}$
#   recomputed per tile;
# * wrap it in an `autograd.Function` that saves only $Q, K, V, O, L$, and check it (SDPA,
#   [gradient check](../pages/glossary.md#term-gradient-check));
# * read a Triton kernel that does the same, and run it on a CPU under `TRITON_INTERPRET=1`;
# * measure the [saved tensors](../pages/glossary.md#term-saved-tensors)' bytes: quadratic in $N$ for naive attention, linear
#   for the tiled one.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand[triton] @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import os

import torch

# Triton decides when it is imported whether kernels are compiled (GPU) or
# interpreted (CPU).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import math
import time

import matplotlib.pyplot as plt
import torch.nn.functional as F

from helpers.checks import compare, max_abs_diff
from helpers.device import get_device, no_tf32, randn
from helpers.memory import fmt_bytes
from helpers.show import fmt, show, varies

dev = get_device()
no_tf32()  # fp32 matmuls in true fp32 on GPUs, so CPU and GPU agree to fp32 round-off

# %% [markdown]
# ## 1. Online softmax
#
# Softmax of a row $x$ is $e^{x_i - m} / \ell$ with $m = \max x$ (for safety: no $\exp$
# overflows) and $\ell = \sum_j e^{x_j - m}$. Written like that it needs two passes: one for
# $m$, one for $\ell$. Milakov & Gimelshein (2018) build both in **one** pass over blocks of
# $x$. Keep a running max $m$ and a running sum $\ell$ *of $e^{x - m}$ for the current $m$*.
# When a new block raises the max to $m_\text{new}$, every term already in $\ell$ was computed
# against the old $m$; since $e^{x - m_\text{new}} = e^{x - m}\, e^{m - m_\text{new}}$, one
# multiplication re-bases them all:
#
# $$\begin{aligned}
# m_\text{new} &= \max(m, \max x_\text{block}), \\
# \ell_\text{new} &= \ell\, e^{\,m - m_\text{new}}
#   + \sum_{j \in \text{block}} e^{\,x_j - m_\text{new}}.
# \end{aligned}$$
#
# That factor $e^{m - m_\text{new}} \le 1$ is **the rescaling step**. Forgetting it gives a wrong
# $\ell$ as soon as a later block holds a bigger value.


# %%
def online_softmax_1d(x, block):
    """softmax(x) from a running max m and normaliser ℓ built block by block."""
    m, ell = -math.inf, 0.0
    for start in range(0, len(x), block):
        xb = x[start : start + block]
        m_new = max(m, xb.max().item())
        # rescale, then add
        ell = ell * math.exp(m - m_new) + torch.exp(xb - m_new).sum().item()
        m = m_new
    return torch.exp(x - m) / ell


x = randn(16, seed=1, dtype=torch.float64) * 2
x[9] = 5.0  # a late maximum: block 2 raises m, so the sum so far must be rescaled
ok = compare(
    "online softmax (block 4) vs torch.softmax",
    online_softmax_1d(x, 4),
    torch.softmax(x, 0),
    atol=1e-15,
    rtol=1e-14,
)

# %% [markdown]
# Both sides do float64 arithmetic in a different order, so they agree to round-off (a few
# `1e-16`), hence the tight tolerance. The trace of the running statistics, block by block
# (`helpers.flash.online_softmax_trace`, which the plot below uses):

# %%
from helpers.flash import online_softmax, online_softmax_trace

steps = online_softmax_trace(x, block=4)
print("block   block max   m before   m after   rescale   ℓ after")
for s in steps:
    cols = (s["block_max"], s["m_old"], s["m"], s["rescale"], s["ell"])
    widths = (11, 10, 9, 9, 9)
    print(f"{s['block']:>5}", *(f"{fmt(v, 4):>{w}}" for v, w in zip(cols, widths)))
show("two-pass m", x.max())
show("two-pass ℓ", torch.exp(x - x.max()).sum())

# %% mystnb={"image": {"alt": "Two panels: above, the scores as bars in blocks of 4 with the running max m after each block; below, the running normaliser \u2113 per block: the old \u2113 rescaled by exp(m_old \u2212 m_new), then the block's sum added."}}
# Two rows at the column's width (6.8 in), so the text stays >= 9 px on the page.
fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(6.8, 6.4))
ax1.bar(range(len(x)), x.numpy(), color="lightgray", label="scores x")
for s in steps:
    ax1.hlines(s["m"], s["start"] - 0.4, s["stop"] - 0.6, color="C3", lw=2.5)
    ax1.axvline(s["stop"] - 0.5, color="k", lw=0.5, ls=":")
ax1.plot([], [], color="C3", lw=2.5, label="running max m after each block")
ax1.set_xlabel("position j")
ax1.legend(fontsize=10, loc="upper left")
ax1.set_title("scores, in blocks of 4")
blocks = [s["block"] for s in steps]
ax2.bar(
    [b - 0.2 for b in blocks],
    [s["ell_old"] * s["rescale"] for s in steps],
    width=0.4,
    color="C0",
    label="old ℓ × exp(m_old − m_new)",
)
ax2.bar(
    [b - 0.2 for b in blocks],
    [s["block_sum"] for s in steps],
    width=0.4,
    color="C1",
    bottom=[s["ell_old"] * s["rescale"] for s in steps],
    label="Σ exp(x_block − m_new)",
)
ax2.bar(
    [b + 0.2 for b in blocks],
    [s["ell_old"] for s in steps],
    width=0.4,
    color="C0",
    alpha=0.35,
    label="old ℓ before rescaling",
)
ax2.set_xticks(blocks)
ax2.set_xlabel("block")
ax2.set_ylabel("ℓ")
ax2.set_title("running normaliser ℓ: rescale, then add")
ax2.legend(fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# Blocks 1 and 2 both raise the max (to 2.3228, then to 5.0000); each time the rescale factor
# (0.0539, then 0.0688) shrinks the old $\ell$ (pale bar) to the dark blue one before the new
# block's terms are added. Block 3 does not raise the max, so its factor is 1.0000. The last row
# of the table equals the two-pass $m$ and $\ell$ (5.0000 and 1.2529).
# `helpers.flash.online_softmax` is the same loop, vectorised over leading dimensions:

# %%
X = randn(3, 5, 23, seed=2) * 10  # float32 rows of 23: a ragged last block
ok = compare(
    "helpers.flash.online_softmax (block 4)",
    online_softmax(X, 4),
    torch.softmax(X, -1),
    atol=1e-7,
    rtol=1e-6,
)

# %% [markdown]
# ## 2. The tiled forward
#
# Attention per row is a softmax-weighted average, $O_i = \sum_j e^{S_{ij} - m} V_j / \ell$. The
# numerator is a sum over keys too, so the same trick applies to a whole output row: keep an
# **accumulator** $\mathrm{acc} = \sum_j e^{S_{ij} - m} V_j$ and rescale it with the same
# $e^{m - m_\text{new}}$ as $\ell$. After the last block, $O = \mathrm{acc} / \ell$, and the row's
# log-sum-exp is $L = m + \log \ell$: one number per row that summarises the whole softmax. For a
# block of queries $Q_i$ ($b_q \times d$) and a block of keys $K_j, V_j$ ($b_k \times d$), only
# the tile $S_{ij} = s\, Q_i K_j^\top$ ($b_q \times b_k$, $s$ the scale) ever exists.
# One head, written inline:


# %%
def tiled_forward_1head(Q, K, V, block):
    """O = softmax(Q Kᵀ/√d) V, L = row logsumexp, one tile at a time; Q (N, d)."""
    N, d = Q.shape
    O, L = torch.empty_like(Q), torch.empty(N, dtype=Q.dtype, device=Q.device)
    for q0 in range(0, N, block):
        Qi = Q[q0 : q0 + block]  # (bq, d)
        m = torch.full((Qi.shape[0],), -math.inf, dtype=Q.dtype, device=Q.device)
        ell = torch.zeros_like(m)
        acc = torch.zeros_like(Qi)  # (bq, d)
        for k0 in range(0, N, block):
            # (bq, bk): the only scores in memory
            S = Qi @ K[k0 : k0 + block].T / math.sqrt(d)
            m_new = torch.maximum(m, S.amax(dim=1))
            P = torch.exp(S - m_new[:, None])  # (bq, bk), relative to m_new
            alpha = torch.exp(m - m_new)  # the rescaling step
            ell = alpha * ell + P.sum(dim=1)
            acc = alpha[:, None] * acc + P @ V[k0 : k0 + block]  # (bq, d)
            m = m_new
        O[q0 : q0 + block] = acc / ell[:, None]
        L[q0 : q0 + block] = m + torch.log(ell)
    return O, L


# N = 50: not a multiple of 16
Q1, K1, V1 = (randn(50, 16, seed=s, device=dev) for s in (3, 4, 5))
O1, L1 = tiled_forward_1head(Q1, K1, V1, block=16)
compare(
    "O (one head, tiles of 16)",
    O1,
    F.scaled_dot_product_attention(Q1, K1, V1),
    atol=1e-5,
    rtol=1e-4,
)
ok = compare(
    "L vs logsumexp(Q Kᵀ/√d)",
    L1,
    torch.logsumexp(Q1 @ K1.T / 4.0, dim=1),
    atol=1e-5,
    rtol=1e-4,
)

# %% [markdown]
# The tolerance is float32's: the tiled sums run in a different order than SDPA's, which costs a
# few hundred ulps of $O(1)$ numbers at most (`atol 1e-5, rtol 1e-4`, `helpers.checks`' default).
#
# `helpers.flash.flash_forward(Q, K, V, causal, block_q, block_k, scale)` is the same for
# `(B, H, N, d)` tensors, plus **causal masking**. `causal=True` means what it means in chapter 6
# and in SDPA's `is_causal=True` (a [causal mask](../pages/glossary.md#term-causal-mask)): query $i$ may look at keys $j \le i$
# (*top-left aligned*). Two
# consequences: key blocks that start after a query block's last row are skipped entirely (about
# half the work), and a tile that crosses the diagonal gets $-\infty$ above it. Row $i$ always
# sees key 0, so $m$ is finite after the first block and no row divides by $\ell = 0$.
#
# The other alignment is chapter 6's named choice, `align="bottom_right"` (query $i$ sees keys
# $j \le i + N_k - N_q$, the flash-attn library ≥ 2.1). The two agree when $N_q = N_k$, the
# training case. They differ most in decoding with a KV cache: one new query ($N_q = 1$) against
# all $N_k$ cached keys. Top-left, that query sees key 0 only; bottom-right, it sees them all,
# which is what decoding with a KV cache needs. The tiled code builds each tile's mask with the
# same `causal_mask`, asking for one tile (`tile=(q0, k0, bq, bk)`) instead of the whole matrix:

# %%
from helpers.attention import causal_mask


def draw(mask):
    """One line per query row: ■ = the key is visible, · = masked."""
    return "\n".join(
        "  " + "".join("■" if v else "·" for v in row) for row in mask.tolist()
    )


for Nq, Nk in [(1, 8), (3, 8)]:
    print(f"Nq={Nq}, Nk={Nk}, causal_mask(Nq, Nk): top-left, is_causal, causal=True")
    print(draw(causal_mask(Nq, Nk)))
    print(f"Nq={Nq}, Nk={Nk}, align='bottom_right': flash-attn >= 2.1, KV cache")
    print(draw(causal_mask(Nq, Nk, align="bottom_right")))
print("the (rows 1-2, keys 4-7) tile of the 3×8 bottom-right mask:")
print(draw(causal_mask(3, 8, align="bottom_right", tile=(1, 4, 2, 4))))

# %% [markdown]
# Every check below compares against `F.scaled_dot_product_attention(..., is_causal=True)` with
# `causal=True`; for a KV cache pass `align="bottom_right"` to any of `helpers.flash`'s functions
# and compare with `torch.nn.attention.bias.causal_lower_right` (the tests do both). The Triton
# kernels of section 4 compute only the top-left alignment and refuse the other in one line.

# %%
from helpers.flash import flash_attention, flash_forward, naive_attention

for Nq, Nk, d in [(50, 50, 16), (37, 37, 64), (20, 45, 32)]:
    Q, K, V = (
        randn(2, 3, n, d, seed=s, device=dev) for s, n in ((6, Nq), (7, Nk), (8, Nk))
    )
    for causal in (False, True):
        O, L = flash_forward(Q, K, V, causal, block_q=16, block_k=16)
        _, L_ref = naive_attention(Q, K, V, causal, return_lse=True)
        tag = f"Nq={Nq} Nk={Nk} d={d} causal={causal}"
        compare(
            f"O {tag}",
            O,
            F.scaled_dot_product_attention(Q, K, V, is_causal=causal),
            atol=1e-5,
            rtol=1e-4,
        )
        compare(f"L {tag}", L, L_ref, atol=1e-5, rtol=1e-4)

# %% [markdown]
# ## 3. The backward, by recomputation
#
# Chapter 6 derived attention's backward with $P$ in hand:
#
# $$\begin{aligned}
# dV &= P^\top dO, & dP &= dO\, V^\top, \\
# dS_{ij} &= P_{ij}\Big(dP_{ij} - \sum_k P_{ik}\, dP_{ik}\Big), & & \\
# dQ &= dS\, K \cdot s, & dK &= dS^\top Q \cdot s,
# \end{aligned}$$
#
# with $s$ the scale $1/\sqrt d$. Two observations remove the need to store $P$:
#
# 1. **The row sum is cheap.**
#
#    $$\begin{aligned}
#    \sum_k P_{ik}\, dP_{ik} &= \sum_k P_{ik}\,(dO_i \cdot V_k) \\
#    &= dO_i \cdot \Big(\sum_k P_{ik} V_k\Big) = dO_i \cdot O_i.
#    \end{aligned}$$
#
#    So $D = \mathrm{rowsum}(dO \circ O)$ is one number per row, computed from $O$ and $dO$
#    ($N \times d$), before any tile.
# 2. **$P$ is one $\exp$ away.** $L = m + \log \ell$ gives $P_{ij} = e^{S_{ij} - L_i}$: the
#    *normalised* probabilities, recomputed for each tile from $S_{ij} = s\, Q_i K_j^\top$ (one
#    extra matmul).
#
# Per tile (FlashAttention-2 order: outer loop over key blocks, so $dK_j, dV_j$ stay local):
#
# $$\begin{aligned}
# S &= s\, Q_i K_j^\top, & P &= e^{S - L_i}, \\
# dV_j &\mathrel{+}= P^\top dO_i, & dP &= dO_i\, V_j^\top, \\
# dS &= P \circ (dP - D_i), & dQ_i &\mathrel{+}= dS\, K_j \cdot s, \\
# dK_j &\mathrel{+}= dS^\top Q_i \cdot s. & &
# \end{aligned}$$
#
# One head, inline, against autograd on the naive version:


# %%
def tiled_backward_1head(Q, K, V, O, L, grad_O, block):
    """dQ, dK, dV from Q, K, V, O, L: D = rowsum(dO∘O), P = exp(S − L) per tile."""
    N, d = Q.shape
    D = (grad_O * O).sum(dim=1)  # (N,) = rowsum(P ∘ dP)
    grad_Q, grad_K, grad_V = (
        torch.zeros_like(Q),
        torch.zeros_like(K),
        torch.zeros_like(V),
    )
    for k0 in range(0, N, block):
        Kj, Vj = K[k0 : k0 + block], V[k0 : k0 + block]  # (bk, d)
        for q0 in range(0, N, block):
            Qi, dOi = Q[q0 : q0 + block], grad_O[q0 : q0 + block]  # (bq, d)
            # (bq, bk), recomputed
            P = torch.exp(Qi @ Kj.T / math.sqrt(d) - L[q0 : q0 + block, None])
            grad_V[k0 : k0 + block] += P.T @ dOi  # (bk, d)
            dS = P * (dOi @ Vj.T - D[q0 : q0 + block, None])  # (bq, bk)
            grad_Q[q0 : q0 + block] += dS @ Kj / math.sqrt(d)  # (bq, d)
            grad_K[k0 : k0 + block] += dS.T @ Qi / math.sqrt(d)  # (bk, d)
    return grad_Q, grad_K, grad_V


grad_O1 = randn(50, 16, seed=9, device=dev)
Qr, Kr, Vr = (t.clone().requires_grad_() for t in (Q1, K1, V1))
ref = torch.autograd.grad(
    naive_attention(Qr[None, None], Kr[None, None], Vr[None, None])[0, 0],
    (Qr, Kr, Vr),
    grad_O1,
)
ours = tiled_backward_1head(Q1, K1, V1, O1, L1, grad_O1, block=16)
for name, g, r in zip(("grad_Q", "grad_K", "grad_V"), ours, ref):
    compare(name, g, r, atol=1e-5, rtol=1e-4)

# %% [markdown]
# `helpers.flash.FlashAttention` is this backward (`flash_backward`, with causal masking and
# ragged blocks) behind an `autograd.Function` that follows the house rules: `forward` +
# `setup_context`, `save_for_backward(Q, K, V, O, L)` and nothing else, `@once_differentiable`,
# gradients gated on `ctx.needs_input_grad`. `flash_attention(Q, K, V, causal)` is the public
# wrapper. What it keeps for backward, listed from the graph:

# %%
Q, K, V = (
    randn(2, 3, 50, 16, seed=s, device=dev, requires_grad=True) for s in (10, 11, 12)
)
O = flash_attention(Q, K, V, causal=True, block_q=16, block_k=16)
for i, t in enumerate(O.grad_fn.saved_tensors):
    print(f"saved_tensors[{i}]: {tuple(t.shape)}")

# %% [markdown]
# Four `(B, H, N, d)` tensors and one `(B, H, N)`: $Q, K, V, O, L$. Now the gradients against
# SDPA's, causal and not, for ragged $N$, $N_q \ne N_k$ and three head dims (same float32
# tolerance):

# %%
for Nq, Nk, d in [(50, 50, 16), (37, 37, 64), (20, 45, 32)]:
    for causal in (False, True):
        Q, K, V = (
            randn(2, 3, n, d, seed=s, device=dev, requires_grad=True)
            for s, n in ((13, Nq), (14, Nk), (15, Nk))
        )
        grad_O = randn(2, 3, Nq, d, seed=16, device=dev)
        ours = torch.autograd.grad(
            flash_attention(Q, K, V, causal, block_q=16, block_k=16), (Q, K, V), grad_O
        )
        ref = torch.autograd.grad(
            F.scaled_dot_product_attention(Q, K, V, is_causal=causal), (Q, K, V), grad_O
        )
        for n, g, r in zip(("grad_Q", "grad_K", "grad_V"), ours, ref):
            compare(
                f"{n} Nq={Nq} Nk={Nk} d={d} causal={causal}", g, r, atol=1e-5, rtol=1e-4
            )

# %% [markdown]
# And `torch.autograd.gradcheck` in float64 on tiny shapes (finite differences against our
# backward; float64 so that the differences are not round-off):

# %%
Q, K, V = (
    randn(1, 2, 7, 4, seed=s, device=dev, dtype=torch.float64, requires_grad=True)
    for s in (17, 18, 19)
)
for causal in (False, True):
    ok = torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, causal, block_q=3, block_k=2),
        (Q, K, V),
    )
    print(f"gradcheck float64, causal={causal}: {ok}")

# %% [markdown]
# ## 4. The same in Triton
#
# `helpers/flash_triton.py` has the kernels. Each **program** (one instance of a kernel, run in
# parallel with the others) owns one tile of rows, and the loop over the other dimension runs
# inside it, with $m$, $\ell$ and the accumulator in registers:
#
# * `_attn_fwd` — program per (query block, batch·head): the loop of section 2. It works in
#   base 2 (`exp2`, with $s \log_2 e$ folded into $S$) because that is what the GPU's `ex2`
#   computes, and writes $L$ back in natural log.
# * `_bwd_preprocess` — $D = \mathrm{rowsum}(dO \circ O)$.
# * `_bwd_dk_dv` — program per *key* block, looping over query blocks: $dK$, $dV$ accumulate
#   in registers and are written once.
# * `_bwd_dq` — program per *query* block, looping over key blocks, for $dQ$.
#
# $S$, $P$ and $dP$ (hence $dS$) are recomputed in *both* backward kernels, so the backward
# does more matmuls of $N^2 d$ size than the tiled PyTorch loop of section 3 (counted from the
# kernels' source in the next cell). The alternative, one pass that adds each tile's
# $dS\,K_j$ into a shared fp32 $dQ$ with `tl.atomic_add`, saves the second $S$ and $dP$, but
# makes $dQ$ depend on the order in which programs finish — not bit-reproducible, which a book
# that prints gradients avoids.
# Pointers are plain arithmetic ($\text{base} + \text{row} \cdot d + \text{col}$) with masks
# for ragged $N$; causal
# programs stop their key loop at the diagonal. On a CPU the kernels run under
# `TRITON_INTERPRET=1` (set in the first cell, before Triton is imported), which executes them
# with numpy; there every tile is cast to float32 before `tl.dot` (the interpreter gets bf16 dots
# wrong). On a GPU, fp32 dots pass `input_precision="ieee"` so they are not silently TF32.
#
# **On Colab's T4** (sm_75) the kernels run in fp16 and fp32, but without tensor cores: Triton's
# official support starts at sm_80, and since Triton 3.3 it compiles `tl.dot` on sm_75 to plain
# FMA instructions instead of `mma`. Correct, but expect them to be slow (we have not timed them
# on a T4). There the tiles are cast to fp32 before each dot too, as under the interpreter.
# `tools/compile_triton.py` compiles every kernel for sm_75, sm_80 and sm_90 without a GPU and
# reports, per kernel, registers, spilled bytes and which instruction the dots became.
#
# The forward kernel's loop (the lines between two marker comments in `helpers/flash_triton.py`;
# `kernel_source` reads the file, so this works without Triton installed), and the matmuls
# (`tl.dot`) each kernel does per tile:

# %%
import helpers.flash_triton as ft

if not ft.HAS_TRITON:
    print(
        "skipped: Triton is not installed, so section 4 shows the kernels but does"
        " not run them (pip install triton)"
    )

# %% tags=["nbval-ignore-output"]
# A listing (nbval does not compare it: editing a comment in the kernel must not
# break this page).
print(ft.kernel_source("_attn_fwd", listing="forward loop"))

# %%
dots = {
    name: ft.kernel_source(name).count("tl.dot(")
    for name in ("_attn_fwd", "_bwd_dk_dv", "_bwd_dq")
}
print("tl.dot per tile:", ", ".join(f"{name} {n}" for name, n in dots.items()))
n_bwd = dots["_bwd_dk_dv"] + dots["_bwd_dq"]
print(f"backward: {n_bwd} matmuls of N²d size")
print("the PyTorch loop of section 3 (and the 2.5× convention): 5")
show("Triton backward work / counted", n_bwd / 5, 2)

# %% [markdown]
# The backward does 7 such matmuls (`_bwd_dk_dv`: $S$, $dV$, $dP$, $dK$; `_bwd_dq`: $S$, $dP$,
# $dQ$) where one pass with atomics, like the PyTorch loop, does 5. FLOP counts that use the
# usual "backward = 2.5 × forward" (5 matmuls, `helpers.flash.attention_flops`) therefore count
# 5 of the 7 matmuls it does: the true work is 1.40 × the counted one, and TFLOP/s computed that
# way come out 1.40 times too low for these kernels.

# %% [markdown]
# The checks, on small shapes so that the interpreter stays fast (16 × 16 tiles there; on a GPU,
# the same cell runs compiled kernels with the GPU's tile sizes, which `tests/test_flash_triton.py`
# also runs under the interpreter). Inputs are float32 and so is every dot, so the tolerance
# is the float32 one again:

# %%
tdev = "cpu" if ft.INTERPRET else "cuda"  # the interpreter takes CPU tensors
runs_triton = ft.HAS_TRITON and (ft.INTERPRET or torch.cuda.is_available())
cases = (
    [(40, 40, 16, False), (40, 40, 16, True), (20, 45, 32, True)] if runs_triton else []
)
if not runs_triton:
    print("skipped: the Triton checks (Triton is not installed here)")
for Nq, Nk, d, causal in cases:
    Q, K, V = (
        randn(1, 2, n, d, seed=s, device=tdev, requires_grad=True)
        for s, n in ((20, Nq), (21, Nk), (22, Nk))
    )
    grad_O = randn(1, 2, Nq, d, seed=23, device=tdev)
    O, L = ft.triton_flash_attention(Q, K, V, causal, return_lse=True)
    ours = torch.autograd.grad(O, (Q, K, V), grad_O)
    O_ref, L_ref = naive_attention(Q, K, V, causal, return_lse=True)
    ref = torch.autograd.grad(O_ref, (Q, K, V), grad_O)
    tag = f"Nq={Nq} Nk={Nk} d={d} causal={causal}"
    compare(f"Triton O {tag}", O, O_ref, atol=1e-5, rtol=1e-4)
    compare(f"Triton L {tag}", L, L_ref, atol=1e-5, rtol=1e-4)
    for n, g, r in zip(("grad_Q", "grad_K", "grad_V"), ours, ref):
        compare(f"Triton {n} {tag}", g, r, atol=1e-5, rtol=1e-4)

# %% [markdown]
# On a GPU the kernels also run in fp16 and bf16: tiles are loaded in 16 bits, dots accumulate in
# fp32, and (from sm_80 on) $P$, $dS$ are rounded to 16 bits before their matmuls, so the tolerance is the
# half-precision one (`1e-2`; bf16, with 7 stored mantissa bits + 1 implicit, `3e-2`). Colab's
# T4 (sm_75): these kernels offer no bf16 there (`supported_dtypes`), so the cell checks fp16
# only. The result depends on the
# machine, so each tensor's largest difference is printed in a `[this run]` line (which nbval does not
# compare):

# %%
if torch.cuda.is_available() and not ft.INTERPRET and ft.HAS_TRITON:
    for dtype in [t for t in ft.supported_dtypes("cuda") if t != torch.float32]:
        Q, K, V = (
            randn(
                2, 4, 1000, 64, seed=s, device="cuda", dtype=dtype, requires_grad=True
            )
            for s in (24, 25, 26)
        )
        grad_O = randn(2, 4, 1000, 64, seed=27, device="cuda", dtype=dtype)
        O, L = ft.triton_flash_attention(Q, K, V, True, return_lse=True)
        ours = (O, L, *torch.autograd.grad(O, (Q, K, V), grad_O))
        Qf, Kf, Vf = (t.detach().float().requires_grad_() for t in (Q, K, V))
        O_ref, L_ref = naive_attention(Qf, Kf, Vf, True, return_lse=True)
        ref = (O_ref, L_ref, *torch.autograd.grad(O_ref, (Qf, Kf, Vf), grad_O.float()))
        tol = 3e-2 if dtype == torch.bfloat16 else 1e-2
        for n, got, r in zip(("O", "L", "grad_Q", "grad_K", "grad_V"), ours, ref):
            ok = compare(n, got, r.to(got.dtype), atol=tol, rtol=tol, quiet=True)
            err = max_abs_diff(got, r.to(got.dtype))
            varies(
                f"{'✓' if ok else '✗'} {dtype} Triton {n} vs fp32, N=1000 d=64 causal:"
                f" max|Δ| {err:.1e} (atol=rtol={tol})"
            )
else:
    varies("no GPU here: fp16/bf16 Triton checks skipped")

# %% [markdown]
# ## 5. Memory, measured
#
# `helpers.flash.saved_bytes(attn, B, H, N, d)` runs one forward inside
# `helpers.memory.SavedTensors` (chapter 3's saved-tensor hooks) and adds up the bytes autograd
# keeps for backward, leaving out $Q, K, V$ themselves (they exist anyway). Naive attention keeps
# $P$ ($B \cdot H \cdot N^2$ floats; causal also keeps a boolean mask); the tiled version keeps
# $O$ and $L$. On the CPU with $B = H = 1$, $d = 16$:

# %%
from helpers.flash import saved_bytes

Ns = [256, 512, 1024, 2048, 4096]
naive_b = [saved_bytes(naive_attention, 1, 1, N, 16) for N in Ns]
tiled_b = [
    saved_bytes(
        lambda q, k, v, causal: flash_attention(q, k, v, causal, 256, 256), 1, 1, N, 16
    )
    for N in Ns
]
print(f"{'N':>5} {'naive':>10} {'tiled':>10} {'naive/tiled':>12}")
for N, a, b in zip(Ns, naive_b, tiled_b):
    print(f"{N:>5} {fmt_bytes(a):>10} {fmt_bytes(b):>10} {fmt(a / b, 1):>12}")
print(
    "growth per doubling of N, naive:",
    [fmt(b / a, 2) for a, b in zip(naive_b, naive_b[1:])],
)
print(
    "growth per doubling of N, tiled:",
    [fmt(b / a, 2) for a, b in zip(tiled_b, tiled_b[1:])],
)

# %% mystnb={"image": {"alt": "Log-log plot of the bytes saved for backward against N (B = H = 1, d = 16, float32): naive attention saves P and grows as N\u00b2, the tiled pass saves O and L and grows as N."}}
fig, ax = plt.subplots(figsize=(5, 3.4))
ax.loglog(Ns, naive_b, "o-", base=2, label="naive: P saved (∝ N²)")
ax.loglog(Ns, tiled_b, "s-", base=2, label="tiled: O, L saved (∝ N)")
ax.set_xlabel("N")
ax.set_ylabel("bytes saved for backward")
ax.set_title("B = H = 1, d = 16, float32")
ax.legend(fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# Each doubling of $N$ multiplies the naive bytes by 4.00 and the tiled bytes by 2.00: quadratic
# against linear, measured. At $N = 4096$ the naive version keeps 64.0 MiB for one head, the tiled
# one 272.0 KiB ($N (d + 1)$ floats).
#
# **The seed's claims, checked.** The notes this course grew from say that for BERT-base
# ($B = 16$, $H = 12$, $N = 512$, float32) "the $QK^\top$ term alone takes 1.2 GB", and quote an
# A100 table (16.2 GB → 9.8 GB, 124 ms → 78 ms) for flash attention at $N = 1024$. The first is simple
# arithmetic, so we do it; the second was not measured here and we do not repeat it (section 6
# has what we did measure, and how to measure it on your GPU).

# %%
B, H, N, d = 16, 12, 512, 64
show("(batch, head) pairs B·H", B * H, 0)
show("B·H·N² float32 bytes (one N × N matrix per pair)", B * H * N * N * 4, 0)
print("as binary units:", fmt_bytes(B * H * N * N * 4))
show("the seed's product 16·12·512·512·4, GiB", 16 * 12 * 512 * 512 * 4 / 2**30, 4)
show("... in GB (10⁹ bytes)", 16 * 12 * 512 * 512 * 4 / 1e9, 4)
print("tiled O and L for the same shapes:", fmt_bytes(B * H * N * (d + 1) * 4))
print("seed's 1.2 GB / B·H·N² float32 bytes:", fmt(1.2e9 / (B * H * N * N * 4), 1))

# %% [markdown]
# One $N \times N$ float32 matrix for each of the 192 (batch, head) pairs is 192.0 MiB in total
# at those shapes. The seed writes that same product, `16*12*512*512*4 bytes`, and then
# "≈ 1.2GB": the product is 0.1875 GiB (0.2013 GB), so its 1.2 GB, 6.0 times more, is an
# arithmetic slip rather than a measurement of "$QK^\top$ alone".
#
# The seed also says that flash attention's backward keeps "行和列统计量（如 row_max,
# row_sum）", *row and column statistics* such as the row max and row sum. There are no column
# statistics: softmax normalises rows, so only per-row statistics are needed, and
# FlashAttention-2 folds the row max $m$ and row sum $\ell$ into a single number per row,
# $L = m + \log \ell$, exactly what our `saved_tensors` listing showed.
#
# ## 6. Time
#
# On a CPU the tiled PyTorch version mostly measures Python loop overhead; the point of tiling is
# memory, and — on a GPU — keeping tiles in on-chip SRAM instead of writing $S$ and $P$ to HBM.
# A small live comparison (one thread, forward + backward, median of 3; numbers vary by machine):


# %%
def fwd_bwd_ms(attn, Q, K, V, grad_O, repeats=3):
    """Median milliseconds of forward + backward."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.autograd.grad(attn(Q, K, V), (Q, K, V), grad_O)
        times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)[len(times) // 2]


threads = torch.get_num_threads()
torch.set_num_threads(1)
for N in (256, 512):
    Q, K, V = (randn(1, 2, N, 32, seed=s, requires_grad=True) for s in (28, 29, 30))
    grad_O = randn(1, 2, N, 32, seed=31)
    t_naive = fwd_bwd_ms(naive_attention, Q, K, V, grad_O)
    t_tiled = fwd_bwd_ms(
        lambda q, k, v: flash_attention(q, k, v, False, 128, 128), Q, K, V, grad_O
    )
    varies(
        f"N={N}: naive {t_naive:.1f} ms, tiled {t_tiled:.1f} ms,"
        f" tiled/naive {t_tiled / t_naive:.2f}x"
    )
torch.set_num_threads(threads)

# %% [markdown]
# `benchmarks/flash_cpu.py` runs the same comparison over more $N$ (see `benchmarks/README.md`).
# On a GPU, `benchmarks/flash_gpu.py` measures naive, tiled PyTorch, Triton and each SDPA backend
# (forward and forward + backward, bf16/fp16, causal or not, $d \in \{64, 128\}$, $N$ up to 16k) and
# writes its results to `benchmarks/results/`. The cell below shows the committed results, if any;
# the target for our Triton kernels is forward + backward at ≥ 0.8× the throughput of SDPA's flash
# backend at $N \ge 4096$, $d = 64$, bf16, on an H100/H200-class GPU, throughput counted with the
# 2.5× convention above (which credits our backward with 5 of the 7 matmuls it does).

# %%
import json
from pathlib import Path

import helpers

results = sorted(
    (Path(helpers.__file__).resolve().parents[1] / "benchmarks" / "results").glob(
        "flash_gpu_*.json"
    )
)
if not results:
    print(
        "No GPU results committed yet: the TFLOP/s table will appear here, read\n"
        "from benchmarks/results/flash_gpu_<gpu>.json, which bash tools/gpu_check.sh\n"
        "writes when run on a machine with a CUDA GPU."
    )
for path in results:
    data = json.loads(path.read_text())
    rows = [
        r
        for r in data["rows"]
        if r["tflops"]
        and r["d"] == 64
        and r["mode"] == "fwd+bwd"
        and not r["causal"]
        and r["impl"] in ("triton", "sdpa-flash", "tiled", "naive")
        and r["dtype"] == "bf16"
    ]
    meta = data["meta"]
    print(f"{meta['gpu']} (torch {meta['torch']}): fwd+bwd, bf16, d=64, not causal")
    print(f"  {'impl':<11} {'N':>8}  {'TFLOP/s':>7}  peak memory")
    for r in rows:
        tflops, peak = fmt(r["tflops"], 1), fmt(r["peak_mib"], 0)
        print(f"  {r['impl']:<11} N={r['N']:>6}  {tflops:>7}  {peak} MiB")

# %% [markdown]
# ## Summary
#
# * **Online softmax**: a running max $m$ and normaliser $\ell$; whenever $m$ grows, rescale what
#   was summed by $e^{m_\text{old} - m_\text{new}}$. Attention's output accumulator is rescaled by
#   the same factor.
# * **Tiled forward**: only $b_q \times b_k$ tiles of $S$ exist; it returns $O$ and
#   $L = m + \log \ell$.
# * **Backward by recomputation**: $D = \mathrm{rowsum}(dO \circ O)$ replaces
#   $\mathrm{rowsum}(P \circ dP)$; each tile's $P = e^{S - L}$ is recomputed;
#   $dV \mathrel{+}= P^\top dO$, $dS = P \circ (dO\,V^\top - D)$, $dQ \mathrel{+}= dS\,K \cdot s$,
#   $dK \mathrel{+}= dS^\top Q \cdot s$. Saved: $Q, K, V, O, L$, linear in $N$, measured above.
# * The same algorithm as Triton kernels: one program per tile, statistics in registers, three
#   backward launches without atomics (7 matmuls of $N^2 d$ size instead of 5); checked under the
#   interpreter on a CPU. On a T4 they run without tensor cores.
#
# ## Common mistakes
#
# * **Forgetting to rescale the accumulator** (or $\ell$) when the running max grows: correct only
#   while the max happens to sit in the first block — test with a late maximum, as in section 1.
# * **Using the un-normalised $P$** in backward: $e^{S - m}$ instead of $e^{S - L}$ is off by the
#   factor $\ell$ per row; the tests in `tests/test_flash.py` catch it with gradcheck.
# * **Dropping $D$** ($dS = P \circ dP$): forgets that the softmax rows sum to one; also caught.
# * **The causal corner**: skipping key blocks is only right for blocks entirely above the
#   diagonal; the diagonal tile still needs its $-\infty$ mask. And $N_q \ne N_k$ has two
#   conventions: top-left (SDPA's `is_causal=True`, and `causal=True` in `helpers.attention` and
#   `helpers.flash`) and bottom-right (flash-attn ≥ 2.1, `align="bottom_right"` in the course's
#   functions), which a KV-cache decoder needs.
# * **Comparing in fp32 on a GPU with TF32 on** (`no_tf32()`, `input_precision="ieee"`), or
#   expecting bf16 (or tensor-core speed from Triton) on a T4.
#
# **Lab:** write the tiled backward yourself in
# [lab 10](../labs/lab10_flash_attention.ipynb).
