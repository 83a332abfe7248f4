# %% [markdown]
# # 6. Attention's backward pass, by hand
#
# Scaled dot-product attention is three lines of forward code:
# $S = QK^\top/\sqrt d$, $P = \mathrm{softmax}(S)$, $O = PV$.
# This chapter writes its backward pass by hand, checks it against PyTorch in every way we can
# think of, and then looks at what it costs in memory.
#
# **Learning goals.** After this chapter you can
#
# 1. write the [softmax](../pages/glossary.md#term-30) [Jacobian](../pages/glossary.md#term-Jacobian) $\operatorname{diag}(p) - pp^\top$, and its cheap
#    [vector–Jacobian product](../pages/glossary.md#term-vectorJacobian-product) $p \circ (g - \langle g, p\rangle)$, and explain why the
#    "diagonal only" form $p(1-p)$ is wrong;
# 2. derive $dV$, $dP$, $dS$, $dQ$, $dK$ for $O = \mathrm{softmax}(QK^\top/\sqrt d)\,V$ and
#    package them as a `torch.autograd.Function` with [causal](../pages/glossary.md#term-causal-mask) and
#    key-padding [masks](../pages/glossary.md#term-mask);
# 3. cross-check the result against `F.scaled_dot_product_attention` and
#    `nn.MultiheadAttention` (outputs and every gradient), and with `gradcheck`;
# 4. explain why a padded key gets exactly zero gradient, and trace one token's gradient
#    through the Q/K/V projections, attention and LayerNorm;
# 5. count the $N\times N$ [saved tensors](../pages/glossary.md#term-saved-tensors) attention keeps for backward and check a
#    memory claim against the formula $B\cdot H\cdot N^2\cdot\text{bytes}$.
#
# The starting point is seed 000, one of the source articles this course grew from (a Chinese
# blog post that hand-writes a `SimpleAttention` Function and quotes a memory figure). Both
# contain mistakes; we find them with tests, and the asides titled "What the source articles
# got wrong" say where.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import inspect
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

from helpers.checks import compare
from helpers.device import get_device, no_tf32, randn
from helpers.memory import SavedTensors, fmt_bytes
from helpers.show import show

dev = get_device()
no_tf32()  # TF32 would change the last digits of fp32 matmuls on Ampere+ GPUs
F64 = torch.float64

# %% [markdown]
# `no_tf32()` matters on Ampere and newer GPUs (not on a CPU, nor on Colab's T4), where
# PyTorch may run float32 matmuls in **TF32**: the inputs are rounded to 10 mantissa bits
# instead of float32's 23 before they are multiplied (the sums stay in float32). Nothing tells
# you it happened. We can emulate that rounding on any machine and see what it does to one
# $QK^\top$-sized product:


# %%
def round_to_tf32(t):
    """t with its float32 mantissa rounded to nearest at TF32's 10 bits."""
    bits = t.view(torch.int32)  # the same 4 bytes, read as an integer
    # drop the low 13 of 23 mantissa bits
    return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)


Q_tf = randn(64, 64, seed=90, device=dev)  # (N, d)
K_tf = randn(64, 64, seed=91, device=dev)  # (N, d)
S_fp32 = Q_tf @ K_tf.T  # (N, d) @ (d, N) -> (N, N), true fp32
# (N, d) @ (d, N) -> (N, N), as TF32 would
S_tf32 = round_to_tf32(Q_tf) @ round_to_tf32(K_tf).T
show("max |S_tf32 - S_fp32|", (S_tf32 - S_fp32).abs().max(), 3)
_ = compare("emulated TF32 vs fp32, float32 tolerance", S_tf32, S_fp32)

# %% [markdown]
# TF32 moves entries of this product by up to 0.010, about a thousand times the float32
# tolerance (`atol 1e-05`) that every comparison below relies on, so on an A100 or
# H100 they would fail for a reason that has nothing to do with our backward. `no_tf32()`
# (called in the first cell of every chapter that does fp32 matmuls) turns it off; on a CPU
# it changes nothing.
#
# ## 1. The softmax Jacobian and its cheap VJP
#
# For one row, $p_i = e^{s_i}/\sum_k e^{s_k}$. Differentiating,
#
# $$\frac{\partial p_i}{\partial s_j} = p_i(\delta_{ij} - p_j)
# \qquad\Longrightarrow\qquad J = \operatorname{diag}(p) - pp^\top .$$
#
# Backward never needs $J$ itself, only the vector–Jacobian product with the incoming
# gradient $g = \partial L/\partial p$. $J$ is symmetric, so
#
# $$J^\top g = p \circ g - p\,(p^\top g) = p \circ \big(g - \langle g, p\rangle\big),$$
#
# one elementwise product and one dot product per row: $O(N)$ work instead of the $O(N^2)$
# Jacobian. Let us build both on a row of four scores.

# %%
s = torch.tensor([1.0, 2.0, 0.5, -1.0], dtype=F64, device=dev)
g = torch.tensor([0.3, -1.0, 0.8, 0.1], dtype=F64, device=dev)  # some ∂L/∂p
p = torch.softmax(s, dim=-1)
J = torch.diag(p) - torch.outer(p, p)  # (4, 4)
show("p", p)
show("J = diag(p) - p pᵀ", J)


def softmax_vjp(P, grad_P):
    """grad_S = P ∘ (g − rowsum(g ∘ P)), row by row over the last dim."""
    return P * (grad_P - (grad_P * P).sum(dim=-1, keepdim=True))  # (..., N)


s_ = s.clone().requires_grad_()
(grad_s_autograd,) = torch.autograd.grad(torch.softmax(s_, -1), s_, g)
show("Jᵀ g", J.T @ g)
compare("softmax_vjp vs Jᵀg", softmax_vjp(p, g), J.T @ g)
_ = compare("softmax_vjp vs autograd", softmax_vjp(p, g), grad_s_autograd)

# %% [markdown]
# Both comparisons use float64's default tolerance (atol 1e-10, rtol 1e-8): the two sides
# do the same sums in a different order, so they agree to round-off and no more.
#
# **Why the diagonal alone is wrong.** A tempting shortcut writes the softmax derivative as
# $g \circ p(1-p)$. That is $\operatorname{diag}(J)\,g$: it keeps
# $\partial p_i/\partial s_i$ and drops every $-p_ip_j$ off the diagonal. A quick sanity
# test shows it cannot be right: if $g = \mathbf 1$ then $L = \sum_i p_i = 1$ whatever $s$
# is, so the true gradient is zero.
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 writes the softmax derivative exactly this way:
# `grad_attn * (attn_weights - attn_weights ** 2)`, i.e. $g \circ p(1-p)$.
#
# </details>

# %%
ones = torch.ones_like(p)
show("diagonal only, g = 1", p * (1 - p) * ones)
show("true VJP,      g = 1", softmax_vjp(p, ones))
show("diagonal only, g", p * (1 - p) * g)
_ = compare("diagonal only vs Jᵀg", p * (1 - p) * g, J.T @ g)

# %% [markdown]
# The diagonal-only form reports a non-zero gradient for a loss that is constant. It is not
# a harmless approximation: the off-diagonal terms are of the same size as the diagonal
# ones, and the difference is in the first digit.
#
# ## 2. Attention forward and backward, derived
#
# One head, $Q\in\mathbb R^{N_q\times d}$, $K\in\mathbb R^{N_k\times d}$,
# $V\in\mathbb R^{N_k\times d_v}$, scale $c = 1/\sqrt d$:
#
# $$S = c\,QK^\top,\qquad P = \mathrm{softmax}_{\text{rows}}(S),\qquad O = PV.$$
#
# Walk backward, one matrix product at a time (chapter 2's rule for $Y = AB$:
# $dA = dY\,B^\top$, $dB = A^\top dY$):
#
# | step | forward | backward |
# | --- | --- | --- |
# | 1 | $O = PV$ | $dV = P^\top dO$, $\quad dP = dO\,V^\top$ |
# | 2 | $P = \mathrm{softmax}(S)$ | $dS = P\circ\big(dP - \mathrm{rowsum}(dP\circ P)\big)$ |
# | 3 | $S = c\,QK^\top$ | $dQ = c\,dS\,K$, $\quad dK = c\,dS^\top Q$ |
#
# Step 2 is section 1's VJP applied to every row. The scale $c$ appears in step 3 on both
# $dQ$ and $dK$. The shapes check themselves: $dS$ is $N_q\times N_k$, so $dS\,K$ is
# $N_q\times d$ like $Q$ and $dS^\top Q$ is $N_k\times d$ like $K$.
#
# Written out for one head:


# %%
def attention_forward_1(Q, K, V):
    """O = softmax(Q Kᵀ/√d) V for one head; returns O and P."""
    S = (Q @ K.T) / math.sqrt(Q.shape[-1])  # (Nq, d) @ (d, Nk) -> (Nq, Nk)
    P = torch.softmax(S, dim=-1)  # (Nq, Nk)
    return P @ V, P  # (Nq, Nk) @ (Nk, dv) -> (Nq, dv)


def attention_backward_1(Q, K, V, P, grad_O):
    """dV = Pᵀ dO, dP = dO Vᵀ, dS = softmax_vjp(P, dP), dQ = dS K/√d, dK = dSᵀ Q/√d."""
    c = 1 / math.sqrt(Q.shape[-1])
    grad_V = P.T @ grad_O  # (Nk, Nq) @ (Nq, dv) -> (Nk, dv)
    grad_P = grad_O @ V.T  # (Nq, dv) @ (dv, Nk) -> (Nq, Nk)
    grad_S = softmax_vjp(P, grad_P)  # (Nq, Nk)
    grad_Q = c * grad_S @ K  # (Nq, Nk) @ (Nk, d) -> (Nq, d)
    grad_K = c * grad_S.T @ Q  # (Nk, Nq) @ (Nq, d) -> (Nk, d)
    return grad_Q, grad_K, grad_V


Q = randn(5, 4, seed=1, dtype=F64, device=dev, requires_grad=True)
K = randn(7, 4, seed=2, dtype=F64, device=dev, requires_grad=True)
V = randn(7, 3, seed=3, dtype=F64, device=dev, requires_grad=True)
grad_O = randn(5, 3, seed=4, dtype=F64, device=dev)

print("shapes: Q", tuple(Q.shape), " K", tuple(K.shape), " V", tuple(V.shape))
O, P = attention_forward_1(Q, K, V)
ours = attention_backward_1(Q, K, V, P.detach(), grad_O)
ref = torch.autograd.grad(O, (Q, K, V), grad_O)
for name, a, b in zip(("grad_Q", "grad_K", "grad_V"), ours, ref):
    compare(name, a, b)
show("grad_Q[0]", ours[0][0])

# %% [markdown]
# All three match autograd at float64's default tolerance, with $N_q = 5 \ne N_k = 7$ and
# $d_v = 3 \ne d = 4$, so no shape was right by accident.
#
# A by-product worth noticing for chapter 10: $\mathrm{rowsum}(dP\circ P)$ equals
# $\mathrm{rowsum}(dO\circ O)$, because
# $\sum_j dP_{ij}P_{ij} = \sum_j\sum_c dO_{ic}V_{jc}P_{ij} = \sum_c dO_{ic}O_{ic}$.
# It can be computed from $O$ without touching any $N\times N$ matrix.

# %%
D_from_P = ((grad_O @ V.T) * P).sum(-1)  # (Nq, Nk) -> (Nq,)
D_from_O = (grad_O * O).sum(-1)  # (Nq, dv) -> (Nq,)
_ = compare("rowsum(dP∘P) = rowsum(dO∘O)", D_from_P, D_from_O)

# %% [markdown]
# **A wrong backward that training would not notice.** The next cell is an attention
# Function whose backward uses the diagonal-only softmax derivative (seed 000's, see the
# aside), compared with autograd on *its own* forward, and with `gradcheck`.
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000's `SimpleAttention` makes two mistakes: its softmax backward is the diagonal-only
# form, and its forward has no $1/\sqrt d$ at all (`scores = q @ k.T`). The cell below is
# that Function moved to the house style (`forward` + `setup_context`), with its formulas
# untouched. Compared with autograd on its own forward, the missing scale does not matter;
# the softmax does.
#
# </details>


# %%
class SeedAttention(torch.autograd.Function):
    """Seed 000's softmax(q kᵀ) v: no 1/√d, diagonal-only softmax backward."""

    @staticmethod
    def forward(q, k, v):
        P = torch.softmax(q @ k.transpose(-2, -1), dim=-1)  # (B, N, N)
        return P @ v  # (B, N, d)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad_output):
        q, k, v = ctx.saved_tensors
        P = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        grad_v = P.transpose(-2, -1) @ grad_output
        grad_P = grad_output @ v.transpose(-2, -1)
        grad_S = grad_P * (P - P**2)  # the seed's softmax derivative
        return grad_S @ k, grad_S.transpose(-2, -1) @ q, grad_v


q, k, v = (
    randn(1, 4, 3, seed=s, dtype=F64, device=dev, requires_grad=True) for s in (5, 6, 7)
)
seed_grads = torch.autograd.grad(SeedAttention.apply(q, k, v).sum(), (q, k, v))
true_grads = torch.autograd.grad((torch.softmax(q @ k.mT, -1) @ v).sum(), (q, k, v))
for name, a, b in zip(("grad_q", "grad_k", "grad_v"), seed_grads, true_grads):
    compare(f"seed {name} vs autograd", a, b)
print(
    "gradcheck(SeedAttention):",
    gradcheck(SeedAttention.apply, (q, k, v), raise_exception=False),
)
for name, a, b in zip(("grad_q", "grad_k"), seed_grads, true_grads):
    show(
        f"cosine(seed {name}, true {name})",
        F.cosine_similarity(a.flatten(), b.flatten(), dim=0),
        3,
    )

# %% [markdown]
# `grad_v` is right (it never goes through the softmax); `grad_q` and `grad_k` are wrong,
# and `gradcheck`, which compares the backward with finite differences in float64, says
# `False`. A training loop would not have told you: the wrong gradients point almost the
# same way as the true ones (cosine 0.977 for `grad_q`, 0.969 for `grad_k`), and any
# direction at a positive cosine to the true gradient still lowers the loss for small
# enough steps. Only a test against a reference catches this.
#
# ## 3. The `Attention` Function
#
# The canonical version lives in `helpers/attention.py`, batched over any leading
# dimensions (we use $(B, H, N, d)$). It follows the house conventions: `forward` +
# `setup_context`, the math in two plain functions `attention_forward` and
# `attention_backward`, `backward` gated on `ctx.needs_input_grad`, `@once_differentiable`.

# %%
import helpers.attention as ha
from helpers.attention import (
    Attention,
    attention,
    attention_backward,
    attention_forward,
    causal_mask,
)
from helpers.functions import softmax_backward

# %% tags=["nbval-ignore-output"]
# A listing of the helper (nbval does not compare it: a comment edit must not
# break the page).
print(inspect.getsource(ha.attention_backward))
print(inspect.getsource(Attention))

# %% [markdown]
# Two design choices are worth a sentence each.
#
# * **It saves $P$.** Backward needs $P$ twice ($dV = P^\top dO$ and the softmax VJP).
#   The alternative is to save only a per-row statistic and recompute $P$ from $Q$ and $K$
#   during backward: less memory, more arithmetic. That trade is chapter 10.
# * **It does not save the mask.** Masked entries of $P$ are exactly $0$, so
#   $dS = P\circ(\dots)$ is exactly $0$ there too.
#
# Either keep $P$ or recompute it on purpose (chapter 10); the scores $S$ are never needed
# again once $P$ is kept, and $d$ comes from `Q.shape[-1]`.
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# The seeds' attention Functions get this bookkeeping wrong in opposite directions. Seed
# 000's `SimpleAttention` saves `q, k, v, attn_weights, scores`: the scores $S$ are never
# needed again once $P$ is kept. Seed 003's `ManualAttention` saves only `Q, K, V`, so its
# (unwritten) backward would have to rebuild $P$, and its forward divides by `sqrt(d_k)`
# with `d_k` defined nowhere.
#
# </details>
#
# The softmax VJP inside `attention_backward` is chapter 4's `helpers.functions.softmax_backward`
# (one function for one idea), and it is the one we derived, digit for digit:

# %%
compare(
    "chapter 4's softmax_backward = ours",
    softmax_backward(p, g),
    softmax_vjp(p, g),
    exact=True,
)
Qb, Kb, Vb = (t.detach()[None, None] for t in (Q, K, V))  # (1, 1, N, d)
Ob, Pb = attention_forward(Qb, Kb, Vb)
compare("helpers attention_forward", Ob[0, 0], O)
for name, a, b in zip(
    ("grad_Q", "grad_K", "grad_V"),
    attention_backward(Qb, Kb, Vb, Pb, grad_O[None, None], 1 / math.sqrt(4)),
    ours,
):
    compare(f"helpers {name}", a[0, 0], b)

# %% [markdown]
# Now `gradcheck` on the Function, in float64 (finite differences need the precision),
# with each kind of mask the next section introduces. The shapes are tiny because
# `gradcheck` perturbs every input element one at a time.


# %%
def qkv(B, H, Nq, Nk, d, dtype=F64, seed=0):
    """Random Q (B, H, Nq, d), K and V (B, H, Nk, d) that require grad."""
    return [
        randn(B, H, n, d, seed=seed + i, dtype=dtype, device=dev, requires_grad=True)
        for i, n in enumerate((Nq, Nk, Nk))
    ]


def pad_mask(B, Nk, pads):
    """(B, Nk) bool, True = padding: the last pads[b] keys of sequence b."""
    return (
        torch.arange(Nk, device=dev)[None, :]
        >= Nk - torch.tensor(pads, device=dev)[:, None]
    )


cases = {
    "no mask          ": dict(Nq=5, Nk=5, causal=False, pads=None),
    "causal, Nq = Nk  ": dict(Nq=5, Nk=5, causal=True, pads=None),
    "causal, Nq < Nk  ": dict(Nq=3, Nk=6, causal=True, pads=None),
    "causal, Nq > Nk  ": dict(Nq=6, Nk=4, causal=True, pads=None),
    "bottom-right 6×4 ": dict(Nq=6, Nk=4, causal=True, pads=None, align="bottom_right"),
    "key padding      ": dict(Nq=5, Nk=5, causal=False, pads=[0, 2]),
}
for label, c in cases.items():
    Q4, K4, V4 = qkv(2, 2, c["Nq"], c["Nk"], 3)
    kpm = None if c["pads"] is None else pad_mask(2, c["Nk"], c["pads"])
    align = c.get("align", "top_left")
    ok = gradcheck(
        lambda q, k, v: attention(
            q, k, v, causal=c["causal"], key_padding_mask=kpm, align=align
        ),
        (Q4, K4, V4),
    )
    print(f"gradcheck {label}: {ok}")

# %% [markdown]
# And the test that the tests can fail: the same Function with the scale forgotten in
# $dQ$ and $dK$ (a very common slip, since the forward's $1/\sqrt d$ is easy to forget
# when deriving) must fail.


# %%
def backward_without_scale(Q, K, V, P, grad_O, scale, needs=(True, True, True)):
    """grad_Q = dS K, grad_K = dSᵀ Q: attention_backward WRONG, without 1/√d."""
    return attention_backward(Q, K, V, P, grad_O, 1.0, needs)


# Attention.backward looks attention_backward up in the module's namespace at call time,
# so replacing the module attribute reaches it.
ha.attention_backward = backward_without_scale  # break it...
try:
    Q4, K4, V4 = qkv(1, 2, 4, 4, 3)
    ok = gradcheck(
        lambda q, k, v: attention(q, k, v), (Q4, K4, V4), raise_exception=False
    )
finally:
    ha.attention_backward = attention_backward  # ...and restore it
print("gradcheck with the scale missing:", ok)

# %% [markdown]
# ## 4. Masks: causal and key padding
#
# Both masks are boolean, and the helper uses PyTorch's conventions so that the references
# take them unchanged:
#
# * inside (`attention_forward`, `Attention.apply`): `mask` is **True where a query may
#   attend** (the convention of `F.scaled_dot_product_attention`'s bool `attn_mask`);
# * `key_padding_mask` (B, $N_k$) is **True at padding** (the convention of
#   `nn.MultiheadAttention`).
#
# Masked scores are set to $-\infty$ before the softmax, so $e^{-\infty} = 0$ gives them
# weight exactly $0$.
#
# **Which corner?** With $N_q = N_k$ "causal" is unambiguous: query $i$ sees keys
# $j \le i$. With $N_q \ne N_k$ there are two conventions:
#
# * **top-left**: query $i$ sees $j\le i$. This is `F.scaled_dot_product_attention(...,
#   is_causal=True)`, and it is what `causal=True` means in **every** attention function of
#   this course (`helpers.attention`, and chapter 10's `helpers.flash` and Triton kernels), so
#   swapping one for another never changes the answer.
# * **bottom-right**: query $i$ sees $j \le i + (N_k - N_q)$. This is FlashAttention ≥ 2.1 and
#   `torch.nn.attention.bias.causal_lower_right`, and it is what a KV cache means: the $N_q$
#   queries are the newest $N_q$ of $N_k$ tokens, so the last query sees every key. Ask for
#   it by name: `align="bottom_right"`.
#
# One function, `causal_mask(Nq, Nk, align=...)`, builds both.

# %% mystnb={"image": {"alt": "Three causal masks as grids of visible and hidden cells: 4 queries by 7 keys aligned top-left, the same aligned bottom-right, and 7 queries by 4 keys aligned bottom-right, whose first rows see no key."}}
M_top_left = causal_mask(4, 7)  # = is_causal=True
M_bottom_right = causal_mask(4, 7, align="bottom_right")  # KV cache
show("causal_mask(4, 7), top-left", M_top_left.int(), 0)
show("causal_mask(4, 7, align='bottom_right')", M_bottom_right.int(), 0)
show(
    "causal_mask(7, 4, align='bottom_right'): rows 0-2 see nothing",
    causal_mask(7, 4, align="bottom_right").int(),
    0,
)

# Two panels above one: each stays readable on a phone.
fig, axes = plt.subplot_mosaic([["tl", "br"], ["tall", "tall"]], figsize=(5.6, 5.6))
for key, M, title in zip(
    ("tl", "br", "tall"),
    (M_top_left, M_bottom_right, causal_mask(7, 4, align="bottom_right")),
    ("top-left (is_causal), 4×7", "bottom-right, 4×7", "bottom-right, 7×4"),
):
    axes[key].imshow(M.int().numpy(), cmap="Greys", vmin=0, vmax=1.4)
    axes[key].set(title=title, xlabel="key j", ylabel="query i")
fig.tight_layout()
plt.show()

# %% [markdown]
# Dark = may attend. When $N_q > N_k$ the bottom-right rule leaves the first $N_q - N_k$
# queries with no key at all; the same happens to every query of a sequence that is all
# padding. A naive softmax over a row of $-\infty$ is $0/0 = $ NaN. We decided that such a
# row gets $P = 0$, hence $O = 0$ and zero gradients, and `masked_softmax` implements it by
# guarding the row maximum and the denominator. (The PyTorch used here makes the same choice
# in SDPA's CPU kernel, as the last line checks; older releases returned NaN, so check yours.)

# %% tags=["nbval-ignore-output"]
print(inspect.getsource(ha.masked_softmax))

# %%
Q4, K4, V4 = qkv(1, 1, 7, 4, 3)
O4 = attention(Q4, K4, V4, causal=True, align="bottom_right")
show("O rows of a 7×4 bottom-right causal attention (first 3 see no key)", O4[0, 0])
(gQ4,) = torch.autograd.grad(O4.sum(), Q4)
print("any NaN in grad_Q:", bool(torch.isnan(gQ4).any()))
O4_sdpa = F.scaled_dot_product_attention(
    *(t.detach().cpu() for t in (Q4, K4, V4)),
    attn_mask=causal_mask(7, 4, align="bottom_right"),
)
_ = compare("ours vs CPU SDPA, rows with no key included", O4.detach().cpu(), O4_sdpa)

# %% [markdown]
# ## 5. Cross-checks against PyTorch
#
# **`F.scaled_dot_product_attention`**, in float32, on the device, for the masks of
# section 4. The tolerance is float32's default, atol 1e-5 and rtol 1e-4: at 1.0 the atol
# alone is about 84 float32 ulps and both together about 923 (printed first), room for
# rounding in a different order and nothing more. Bit equality is not expected, since SDPA's kernels sum in
# another order (on a CPU, in blocks with an online softmax).

# %%
from torch.nn.attention.bias import causal_lower_right


def check_vs_sdpa(label, Nq, Nk, causal, pads, align="top_left"):
    """Compare O, grad_Q, grad_K, grad_V of ours with SDPA's, in float32."""
    Q, K, V = qkv(2, 3, Nq, Nk, 8, dtype=torch.float32, seed=10)
    Q2, K2, V2 = (t.detach().clone().requires_grad_() for t in (Q, K, V))
    kpm = None if pads is None else pad_mask(2, Nk, pads)
    G = randn(2, 3, Nq, 8, seed=20, device=dev)
    O = attention(Q, K, V, causal=causal, key_padding_mask=kpm, align=align)
    O.backward(G)
    # PyTorch's own masks: is_causal (top-left) or the lower-right causal bias
    if kpm is None:
        mask = (
            causal_lower_right(Nq, Nk) if causal and align == "bottom_right" else None
        )
        is_causal = causal and align == "top_left"
    else:  # padding (+ causal, square here): built by hand, True = attend
        mask, is_causal = ~kpm[:, None, None, :], False
        if causal:
            mask = mask & torch.ones(Nq, Nk, dtype=torch.bool, device=dev).tril()
    O_ref = F.scaled_dot_product_attention(
        Q2, K2, V2, attn_mask=mask, is_causal=is_causal
    )
    O_ref.backward(G)
    for name, a, b in (
        ("O", O, O_ref),
        ("grad_Q", Q.grad, Q2.grad),
        ("grad_K", K.grad, K2.grad),
        ("grad_V", V.grad, V2.grad),
    ):
        compare(f"{label} {name}", a, b, atol=1e-5, rtol=1e-4)


show("atol 1e-5 in float32 ulps at 1.0", 1e-5 / torch.finfo(torch.float32).eps, 0)
eps32 = torch.finfo(torch.float32).eps
show("atol + rtol · 1.0 in float32 ulps at 1.0", (1e-5 + 1e-4) / eps32, 0)
check_vs_sdpa("no mask,          ", 6, 6, False, None)
check_vs_sdpa("causal 6×6,       ", 6, 6, True, None)
check_vs_sdpa("causal 3×7,       ", 3, 7, True, None)
check_vs_sdpa("bottom-right 3×7, ", 3, 7, True, None, align="bottom_right")
check_vs_sdpa("causal + padding, ", 6, 6, True, [0, 2])

# %% [markdown]
# The two alignments agree when $N_q = N_k$ and differ when $N_q\ne N_k$; the comparison says
# so (the ✗ is the point: the wrong alignment is an order-1 error, not round-off):

# %%
Q, K, V = qkv(2, 3, 3, 7, 8, dtype=torch.float32, seed=10)
with torch.no_grad():
    compare(
        "3×7 align='bottom_right' vs is_causal=True",
        attention(Q, K, V, causal=True, align="bottom_right"),
        F.scaled_dot_product_attention(Q, K, V, is_causal=True),
        atol=1e-5,
        rtol=1e-4,
    )
    Q, K, V = qkv(2, 3, 6, 6, 8, dtype=torch.float32, seed=10)
    compare(
        "6×6 align='bottom_right' vs is_causal=True",
        attention(Q, K, V, causal=True, align="bottom_right"),
        F.scaled_dot_product_attention(Q, K, V, is_causal=True),
        atol=1e-5,
        rtol=1e-4,
    )

# %% [markdown]
# **`nn.MultiheadAttention`.** A multi-head layer projects $X$ (B, N, E) to $Q, K, V$ with one
# packed weight `in_proj_weight` (3E, E) (rows: q, then k, then v) and `in_proj_bias`,
# splits $E$ into $H$ heads of $d = E/H$, attends per head, merges the heads and applies
# `out_proj`. With einops the split is one line:
# `rearrange(x, "b n (h d) -> b h n d", h=H)`. einops makes shapes explicit; it cannot fix
# a shape the math got wrong. The next cell checks that a `rearrange` one source article
# recommends for the $W_Q$ gradient changes nothing (see the aside).
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 003 recommends einops as "a practical trick for aligning dimensions" in the $W_Q$
# gradient: `dL_dW_Q = rearrange(X.T @ dL_dQ, 'd n -> d (n)')`. The product
# $X^\top\,\partial L/\partial Q$ is already $(d, d_k)$, the pattern calls its second axis
# `n` though it is $d_k$, and `(n)` groups a single axis, so the call does nothing (its
# other line, `rearrange(X @ W_Q, 'n d -> n 1 d')`, adds an axis nothing uses). Here there
# was nothing to fix.
#
# </details>

# %%
from einops import rearrange

X3 = randn(5, 8, seed=70, dtype=F64, device=dev)  # (n, d)
grad_Q3 = randn(5, 4, seed=71, dtype=F64, device=dev)  # (n, d_k)
grad_WQ3 = X3.T @ grad_Q3  # (d, n) @ (n, d_k) -> (d, d_k)
_ = compare(
    "seed 003's rearrange(Xᵀ dQ, 'd n -> d (n)') vs Xᵀ dQ",
    rearrange(grad_WQ3, "d n -> d (n)"),
    grad_WQ3,
    exact=True,
)

# %% [markdown]
# The backward runs the same steps in reverse: `out_proj`'s linear backward, split the
# gradient into heads, `attention_backward`, merge, and the `in_proj` linear backward.
# `grad_X` sums the three paths (through q, k and v) in one product, `grad_QKV @ W_in`.

# %% tags=["nbval-ignore-output"]
print(inspect.getsource(ha.mha_backward))

# %% [markdown]
# We copy the weights of an `nn.MultiheadAttention` (`batch_first=True`, dropout 0, random
# biases so their gradients are not trivially zero), run both, and compare every gradient:
# in float64 at float64's default tolerance and in float32 at float32's, with causal and
# padding masks.

# %%
from helpers.attention import MultiHeadSelfAttention


def check_vs_mha(dtype, causal, pads, show_all=False):
    """True if our MHA's Y and every gradient match nn.MultiheadAttention's."""
    B, N, E, H = 2, 6, 8, 2
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(
        E, H, dropout=0.0, batch_first=True, dtype=dtype, device=dev
    )
    with torch.no_grad():
        ref.in_proj_bias.copy_(randn(3 * E, seed=7, dtype=dtype, device=dev) * 0.1)
        ref.out_proj.bias.copy_(randn(E, seed=8, dtype=dtype, device=dev) * 0.1)
        ref.in_proj_weight.copy_(
            randn(3 * E, E, seed=9, dtype=dtype, device=dev) * E**-0.5
        )
        ref.out_proj.weight.copy_(
            randn(E, E, seed=10, dtype=dtype, device=dev) * E**-0.5
        )
    ours = MultiHeadSelfAttention.from_module(ref)
    X = randn(B, N, E, seed=3, dtype=dtype, device=dev, requires_grad=True)
    G = randn(B, N, E, seed=4, dtype=dtype, device=dev)
    kpm = None if pads is None else pad_mask(B, N, pads)
    # nn.MHA: True = blocked
    attn_mask = ~causal_mask(N, N, device=dev) if causal else None
    Y_ref, _ = ref(
        X, X, X, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=False
    )
    Y_ref.backward(G)
    Y = ours.forward(X.detach(), causal=causal, key_padding_mask=kpm)
    grads = ours.backward(G)  # no autograd inside
    results = [
        compare("Y", Y, Y_ref, quiet=not show_all),
        compare("grad X", grads["X"], X.grad, quiet=not show_all),
    ]
    for name, p in ref.named_parameters():
        results.append(compare(f"grad {name}", grads[name], p.grad, quiet=not show_all))
    return all(results)


check_vs_mha(F64, causal=True, pads=[0, 2], show_all=True)
for dtype in (F64, torch.float32):
    for causal, pads in ((False, None), (True, None), (False, [1, 3]), (True, [0, 2])):
        ok = check_vs_mha(dtype, causal, pads)
        print(f"{str(dtype):14s} causal={causal!s:5s} pads={pads}: all match {ok}")

# %% [markdown]
# ## 6. A padded key gets exactly zero gradient
#
# With a key-padding mask, the padded **column** (the key) gets weight $0$ from every
# query. The padded token's own **row**, its query, still attends to the real tokens.
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 (its section 4.2) says that the attention **row** of a padding token is all
# zero, and that this is why padding does not take part in the gradient. It is the other
# way round: the padded key's column is zero, and its row is an ordinary probability row.
#
# </details>
#
# The column being zero is what zeroes the gradient, exactly and not approximately:
# $dV_j = \sum_i P_{ij}\,dO_i = 0$ and $dS_{ij} = P_{ij}(\dots) = 0$ so
# $dK_j = c\sum_i dS_{ij} Q_i = 0$. Exact zeros are what we check for (`exact=True`).

# %%
Q, K, V = qkv(1, 1, 6, 6, 4, seed=30)
kpm = pad_mask(1, 6, [2])  # keys 4 and 5 are padding
O, P = Attention.apply(Q, K, V, ~kpm[:, None, None, :], None)
G = randn(*O.shape, seed=31, dtype=F64, device=dev)
gQ, gK, gV = torch.autograd.grad(O, (Q, K, V), G)
show("P (query rows × key columns), keys 4, 5 padded", P[0, 0], 3)
compare(
    "grad_K of padded keys = 0",
    gK[0, 0, 4:],
    torch.zeros_like(gK[0, 0, 4:]),
    exact=True,
)
compare(
    "grad_V of padded keys = 0",
    gV[0, 0, 4:],
    torch.zeros_like(gV[0, 0, 4:]),
    exact=True,
)
show("|grad_Q| of padded queries 4, 5 (not zero)", gQ[0, 0, 4:].norm(dim=-1))

# %% [markdown]
# Columns 4 and 5 of $P$ are zero; rows 4 and 5 are ordinary probability rows. Whether a
# padded *query* matters depends on the loss: a loss that ignores padded positions (as
# `ignore_index` does) sends $dO = 0$ into those rows, and then their $dQ$ is zero too.
#
# ## 7. Tracing one token's gradient (seed 000's experiment)
#
# Seed 000 proposes to "use `torch.autograd.grad` to follow a token embedding through the
# QKV projections, scaled dot-product attention and LayerNorm". Here is that experiment
# on a small post-norm sublayer, $Z = X + \mathrm{MHA}(X)$, $\;\mathrm{out} = \mathrm{LayerNorm}(Z)$,
# causal, with a loss that reads every output token:
# $L = \sum_{t} \langle \mathrm{out}_t, w_t\rangle$ for fixed random $w$.
#
# `mha_forward` is made of ordinary differentiable operations, so autograd can run through
# it, and the tensors in its cache ($Q$, $K$, $V$, $P$) are nodes of the graph:
# `torch.autograd.grad` can ask for the gradient at each of them.

# %%
from helpers.attention import (
    merge_heads,
    mha_backward,
    mha_forward,
    mha_params,
    split_heads,
)

N, E, H = 6, 8, 2
params = mha_params(E, seed=40, dtype=F64, device=dev)
X = randn(1, N, E, seed=41, dtype=F64, device=dev, requires_grad=True)
w = randn(1, N, E, seed=42, dtype=F64, device=dev)
norm = torch.nn.LayerNorm(E, dtype=F64, device=dev)

Y, cache = mha_forward(X, params, H, causal=True)  # (1, N, E), attention sublayer
Z = X + Y  # residual
out = norm(Z)  # LayerNorm
L = (out * w).sum()
grad_X, grad_Y, grad_Z, grad_Q, grad_K, grad_V, grad_P = torch.autograd.grad(
    L, (X, Y, Z, cache["Q"], cache["K"], cache["V"], cache["P"])
)
show("L", L)
show("|dL/dx_j| per token j", grad_X[0].norm(dim=-1))

# %% [markdown]
# Follow one token, $j = 2$. Its embedding $x_j$ reaches the loss along four paths:
# straight through the residual into LayerNorm, and as a query, a key and a value. Each
# path's contribution is the gradient at that node pulled back through its projection
# ($W_q, W_k, W_v$ are the three row blocks of `in_proj_weight`), and the four must add up
# to autograd's $dL/dx_j$.

# %%
j = 2
W_q, W_k, W_v = params["in_proj_weight"].chunk(3, dim=0)  # 3 × (E, E)
paths = {
    "residual": grad_Z[0, j],  # Z = X + Y copies dL/dZ to X
    "as query": merge_heads(grad_Q)[0, j] @ W_q,  # (E,) @ (E, E) -> (E,)
    "as key  ": merge_heads(grad_K)[0, j] @ W_k,  # (E,) @ (E, E) -> (E,)
    "as value": merge_heads(grad_V)[0, j] @ W_v,  # (E,) @ (E, E) -> (E,)
}
for name, contribution in paths.items():
    show(f"|dL/dx_{j}| {name}", contribution.norm())
_ = compare(f"sum of the four paths = dL/dx_{j}", sum(paths.values()), grad_X[0, j])

# %% [markdown]
# The same pieces, computed without autograd: feed autograd's $dL/dY$ (what LayerNorm and
# the residual send into the attention sublayer; chapter 4 derived LayerNorm's backward)
# into `mha_backward`, add the residual's copy, and we get $dL/dX$ for every token.
# We also check the one line of the attention backward that `autograd.grad` let us see
# directly, $dP = dO\,V^\top$.

# %%
manual = mha_backward(grad_Y, cache)
compare("mha_backward(dL/dY)['X'] + dL/dZ = dL/dX", manual["X"] + grad_Z, grad_X)
grad_O = split_heads(grad_Y @ params["out_proj.weight"], H)  # (1, H, N, d)
# (1, H, N, d) @ (1, H, d, N) -> (1, H, N, N)
compare("dP = dO Vᵀ", grad_O @ cache["V"].transpose(-2, -1), grad_P)
grad_S = softmax_backward(cache["P"], grad_P)  # (1, H, N, N)

# %% [markdown]
# Now the pictures, for head 0: the attention weights $P$, the gradient arriving at them
# $|dL/dP|$, and what survives the softmax backward, $|dL/dS|$.

# %% mystnb={"image": {"alt": "Three heat maps for head 0, query i down and key j across: the attention weights P, the gradient arriving at them |dL/dP|, and the gradient after the softmax backward |dL/dS|."}}
# Stacked, not side by side: each panel stays wide enough to read on a phone.
fig, axes = plt.subplots(3, 1, figsize=(4.2, 9.6))
panels = (cache["P"][0, 0], grad_P[0, 0].abs(), grad_S[0, 0].abs())
titles = ("P (head 0)", "|dL/dP|", "|dL/dS|")
for ax, M, title in zip(axes, panels, titles):
    im = ax.imshow(M.detach().cpu().numpy(), cmap="viridis")
    ax.set(title=title, xlabel="key j", ylabel="query i")
    fig.colorbar(im, ax=ax, fraction=0.046)
fig.tight_layout()
plt.show()
show("|dL/dP| above the diagonal, row 0", grad_P[0, 0, 0, 1:].abs())
show("|dL/dS| row 0, every key", grad_S[0, 0, 0].abs())

# %% [markdown]
# $P$ is lower-triangular (causal). $|dL/dP|$ is **not**: $dP_{ij} = dO_i\cdot V_j$
# exists for every pair, because $O = PV$ does not know that some $P_{ij}$ are forced to
# zero. The softmax backward removes it: $dS = P\circ(\dots)$ is zero wherever $P$ is,
# so future keys receive nothing. This is also why backward does not need the mask.
# Row 0 of $dS$ is zero on the diagonal too (printed: the whole row), for another reason:
# query 0 sees a single key, and a softmax over one entry is the constant 1, whatever its score.
# In the trace, tokens after the last one the loss reads would get no gradient through
# attention at all; here every token is read, so every token's gradient is non-zero, and
# the last token, which no other query can see, gets its key and value gradients only from
# its own query's row.
#
# ## 8. Memory: the $N\times N$ matrices backward keeps
#
# Our Function saves $Q, K, V$ (inputs, which exist anyway) and $P$, one $(B, H, N, N)$
# tensor: $B\cdot H\cdot N^2\cdot\text{bytes}$. Let us count with chapter 3's
# `SavedTensors`, leaving out the inputs, and compare with the formula. We also count the
# naive composition $\mathrm{softmax}(QK^\top/\sqrt d)\,V$ that autograd differentiates on its own.

# %%
from helpers.attention import attention_saved_bytes_formula

B, H, N, d = 2, 4, 64, 16
Q, K, V = qkv(B, H, N, N, d, dtype=torch.float32, seed=50)
formula = attention_saved_bytes_formula(B, H, N, 4)
show("B·H·N²·4 bytes", formula, 0)

with SavedTensors(exclude=[Q, K, V]) as saved_fn:
    attention(Q, K, V)
with SavedTensors(exclude=[Q, K, V]) as saved_naive:
    torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(d), dim=-1) @ V
with SavedTensors(exclude=[Q, K, V]) as saved_causal:
    S = (Q @ K.transpose(-2, -1) / math.sqrt(d)).masked_fill(
        ~causal_mask(N, N, device=dev), float("-inf")
    )
    torch.softmax(S, dim=-1) @ V

for label, saved in (
    ("Attention Function", saved_fn),
    ("naive autograd", saved_naive),
    ("naive, causal", saved_causal),
):
    show(f"{label}: tensors kept", saved.count, 0)
    show(f"{label}: bytes kept", saved.total_bytes, 0)
compare("Function's bytes = formula", saved_fn.total_bytes, formula, exact=True)
compare("naive bytes = formula", saved_naive.total_bytes, formula, exact=True)
show("causal extra bytes (the bool mask, N²·1)", saved_causal.total_bytes - formula, 0)

# %% [markdown]
# Both keep exactly one $(B, H, N, N)$ float32 tensor, $P$, which the softmax saves (its
# backward needs only its output) and the product $PV$ saves again as the same storage,
# counted once. The scores $S = QK^\top/\sqrt d$ are **not** kept: once the softmax has
# run, nothing in backward needs them. The causal version adds its boolean mask,
# $N\times N$ bytes shared by the whole batch.
#
# PyTorch's fused `F.scaled_dot_product_attention` keeps no $N\times N$ tensor at all
# (measured here on the CPU kernel, where the result does not depend on the machine):

# %%
Qc, Kc, Vc = (t.detach().cpu().requires_grad_() for t in (Q, K, V))
with SavedTensors(exclude=[Qc, Kc, Vc]) as saved_sdpa:
    F.scaled_dot_product_attention(Qc, Kc, Vc)
n_square = sum(
    1 for r in saved_sdpa.records if r["counted"] and r["shape"][-2:] == (N, N)
)
show("N×N tensors kept by SDPA (CPU)", n_square, 0)

# %% [markdown]
# It recomputes $P$ in backward from a per-row statistic; chapter 10 builds that.
#
# **A BERT-sized example.** At $B = 16$, $H = 12$, $N = 512$ in float32 (the shape of a
# memory claim in seed 000, see the aside below), the formula for one such tensor:

# %%
B, H, N = 16, 12, 512
one = attention_saved_bytes_formula(B, H, N, 4)
show("16·12·512²·4 bytes", one, 0)
print("=", fmt_bytes(one))
show("in GiB", one / 2**30, 4)
show("in GB (10⁹ bytes)", one / 1e9, 4)
show("seed's 1.2 GB / true size", 1.2e9 / one, 2)
n_kept = saved_naive.total_bytes // formula  # measured above: N×N tensors per layer
show("N×N float32 tensors autograd keeps per attention layer", n_kept, 0)
show("kept per layer at B=16, H=12, N=512, GiB", n_kept * one / 2**30, 4)
show("12 layers (BERT-base), GiB", 12 * n_kept * one / 2**30, 4)

# %% [markdown]
# One $16\times12\times512\times512$ float32 tensor is 201326592 bytes, 0.1875 GiB
# (0.2013 GB). Autograd keeps one such tensor per attention layer ($P$, measured above on
# a small shape and scaled by the formula), and $QK^\top$ is not among what it keeps.
# Across the 12 layers of BERT-base that is 2.2500 GiB of $P$'s.
# Two caveats: training with attention dropout keeps more
# (the dropout mask and the dropped-out $P$, how many bytes depends on the kernel), and
# backward briefly allocates $dP$ and $dS$, two more $N\times N$ tensors per layer, while it
# runs. The formula tells you what to measure; `SavedTensors` tells you what is kept.
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 states that at these shapes "$QK^\top$ alone" takes 1.2 GB: about 5.96 times
# the true size of one such tensor (0.2013 GB), and $QK^\top$ is not even kept.
#
# </details>
#
# ## Summary
#
# * Softmax's Jacobian is $\operatorname{diag}(p) - pp^\top$; backward needs only
#   $J^\top g = p\circ(g - \langle g,p\rangle)$, $O(N)$ per row.
# * $dV = P^\top dO$, $dP = dO\,V^\top$, $dS = P\circ(dP - \mathrm{rowsum}(dP\circ P))$,
#   $dQ = dS\,K/\sqrt d$, $dK = dS^\top Q/\sqrt d$.
# * `helpers.attention.Attention` saves $Q, K, V, P$; the mask is not needed in backward
#   because masked entries of $P$ are exactly zero.
# * `causal=True` is `is_causal=True` (top-left, $j\le i$) in every attention function of the
#   course; the KV-cache alignment ($j \le i + N_k - N_q$) is asked for by name,
#   `align="bottom_right"`; rows with no visible key give zeros, not NaN.
# * It matches `gradcheck`, `F.scaled_dot_product_attention` and `nn.MultiheadAttention`
#   (every parameter and the input), and a padded key gets exactly zero gradient.
# * Naive attention keeps one $B\cdot H\cdot N^2$ tensor per layer ($P$, not $QK^\top$):
#   0.1875 GiB at $B=16, H=12, N=512$ in float32.
#
# ## Common mistakes
#
# * **Diagonal-only softmax backward**, $g\circ p(1-p)$: drops the $-p_ip_j$ terms;
#   `gradcheck` fails. It even gives a non-zero gradient for the constant loss $\sum_i p_i$.
# * **Forgetting $1/\sqrt d$** in the forward (seed 000) or in $dQ$, $dK$ (the backward
#   must use the same scale as the forward).
# * **Transposes**: $dK = dS^\top Q$, not $dS\,Q$; with $N_q \ne N_k$ the shapes catch it,
#   with $N_q = N_k$ only a test does, so test with $N_q\ne N_k$.
# * **Mask conventions**: SDPA's bool mask is True = attend; `nn.MultiheadAttention`'s
#   `key_padding_mask` and `attn_mask` are True = blocked. And `is_causal=True` is top-left
#   when $N_q\ne N_k$, while a KV cache needs bottom-right: say which one you mean.
# * **Fully masked rows** give NaN in a naive softmax; decide what they should be.
# * **"The padding token's row is zero"**: it is the padded key's *column* that is zero,
#   and that is why its key and value get zero gradient.
# * **Quoting memory without the formula**: $B\cdot H\cdot N^2\cdot\text{bytes}$ per kept
#   tensor, and measure how many tensors are kept.
#
# **Lab.** [Lab 6: attention backward with a sliding window, a score bias and a learned temperature](../labs/lab06_attention_backward.ipynb).
