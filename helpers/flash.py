"""Flash-style attention in plain PyTorch (chapter 10): online softmax, tiled forward, recomputing backward.

Shapes follow the book: ``Q`` is ``(B, H, Nq, d)``, ``K`` and ``V`` are ``(B, H, Nk, d)``;
``S = scale · Q Kᵀ``, ``P = softmax(S)``, ``O = P V`` and ``L = logsumexp(S)`` per row.
Everything here loops over blocks of keys (and of queries) so that no ``N × N`` tensor
is ever allocated: memory for backward is ``Q, K, V, O, L``, i.e. linear in ``N``.

``causal=True`` means what it means everywhere in the course (``helpers.attention``):
``F.scaled_dot_product_attention``'s ``is_causal=True``, query ``i`` sees keys ``j <= i``
(top-left aligned).  ``align="bottom_right"`` is the named alternative (the flash-attn library
>= 2.1, a KV cache: query ``i`` sees ``j <= i + Nk - Nq``); both come from
``helpers.attention.causal_mask``, built one tile at a time here.  A query row that sees no key
(bottom-right with ``Nq > Nk``) gets ``O = 0``, ``L = -inf`` and zero gradients, like SDPA.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from helpers.attention import causal_mask, check_causal, check_qkv
from helpers.checks import expect_int

__all__ = [
    "online_softmax",
    "online_softmax_trace",
    "naive_attention",
    "flash_forward",
    "flash_backward",
    "FlashAttention",
    "flash_attention",
    "attention_flops",
    "saved_bytes",
]


# ----------------------------------------------------------------------------- online softmax


def online_softmax(x: torch.Tensor, block: int = 4) -> torch.Tensor:
    """softmax(x)ᵢ = exp(xᵢ − m) / ℓ over the last dim, with m, ℓ = Σ exp(x − m) built block by block."""
    n = x.shape[-1]
    m = torch.full(x.shape[:-1], -math.inf, dtype=x.dtype, device=x.device)  # (...,) running max
    ell = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)  # (...,) running normaliser
    for start in range(0, n, block):
        xb = x[..., start : start + block]  # (..., block)
        m_new = torch.maximum(m, xb.amax(dim=-1))
        # The rescaling step: the old ℓ was a sum of exp(x − m_old); re-base it to m_new.
        ell = ell * torch.exp(m - m_new) + torch.exp(xb - m_new[..., None]).sum(dim=-1)
        m = m_new
    return torch.exp(x - m[..., None]) / ell[..., None]


def online_softmax_trace(x: torch.Tensor, block: int = 4) -> list[dict]:
    """Per block of a 1-D x: m_new = max(m, max xb), ℓ_new = ℓ·exp(m − m_new) + Σ exp(xb − m_new) (for drawing)."""
    if x.dim() != 1:
        raise ValueError(f"x: expected a 1-D tensor, got shape {tuple(x.shape)}")
    x = x.detach().to("cpu", torch.float64)
    m, ell, steps = -math.inf, 0.0, []
    for i, start in enumerate(range(0, x.numel(), block)):
        xb = x[start : start + block]
        m_new = max(m, xb.max().item())
        rescale = math.exp(m - m_new)  # exp(−inf) = 0 on the first block
        block_sum = torch.exp(xb - m_new).sum().item()
        steps.append(
            {
                "block": i,
                "start": start,
                "stop": start + xb.numel(),
                "block_max": xb.max().item(),
                "m_old": m,
                "m": m_new,
                "ell_old": ell,
                "rescale": rescale,
                "block_sum": block_sum,
                "ell": ell * rescale + block_sum,
            }
        )
        m, ell = m_new, ell * rescale + block_sum
    return steps


# ----------------------------------------------------------------------------- reference


def _shift(Nq: int, Nk: int, align: str) -> int:
    """How far right the causal diagonal sits: key j is visible to query i iff j <= i + shift."""
    return Nk - Nq if align == "bottom_right" else 0


def _check(Q, K, V, causal, align, block_q=1, block_k=1) -> None:
    """The one-line ValueErrors every entry point here gives for bad input, before any work."""
    check_qkv(Q, K, V, dims=4)
    check_causal(causal, align)
    expect_int("block_q", block_q)
    expect_int("block_k", block_k)


def naive_attention(
    Q,
    K,
    V,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    align: str = "top_left",
):
    """O = softmax(scale·Q Kᵀ [+ causal −inf]) V with the full (B, H, Nq, Nk) matrix P (autograd backward)."""
    _check(Q, K, V, causal, align)
    Nq, Nk = Q.shape[2], K.shape[2]
    scale = Q.shape[-1] ** -0.5 if scale is None else scale
    S = (Q @ K.transpose(-2, -1)) * scale  # (B, H, Nq, Nk)
    if causal:
        S = S.masked_fill(~causal_mask(Nq, Nk, align, Q.device), -math.inf)
    P = torch.softmax(S, dim=-1)  # (B, H, Nq, Nk)
    if causal and _shift(Nq, Nk, align) < 0:
        P = P.nan_to_num(0.0)  # rows that see no key: softmax of all −inf is NaN; SDPA gives 0
    O = P @ V  # (B, H, Nq, d_v)
    return (O, torch.logsumexp(S, dim=-1)) if return_lse else O


# ----------------------------------------------------------------------------- tiled forward / backward


def flash_forward(
    Q,
    K,
    V,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
    align: str = "top_left",
):
    """O = softmax(scale·Q Kᵀ) V and L = logsumexp rows, one (block_q × block_k) tile of S at a time."""
    _check(Q, K, V, causal, align, block_q, block_k)
    B, H, Nq, d = Q.shape
    Nk, d_v = K.shape[2], V.shape[3]
    shift = _shift(Nq, Nk, align)
    scale = d**-0.5 if scale is None else scale
    O = Q.new_empty(B, H, Nq, d_v)  # (B, H, Nq, d_v)
    L = torch.empty(B, H, Nq, dtype=Q.dtype, device=Q.device)  # (B, H, Nq)
    for q0 in range(0, Nq, block_q):
        Qi = Q[:, :, q0 : q0 + block_q]  # (B, H, bq, d)
        bq = Qi.shape[2]
        m = torch.full((B, H, bq), -math.inf, dtype=Q.dtype, device=Q.device)  # running max
        ell = torch.zeros(B, H, bq, dtype=Q.dtype, device=Q.device)  # running normaliser
        acc = torch.zeros(B, H, bq, d_v, dtype=Q.dtype, device=Q.device)  # un-normalised O
        # Causal: key blocks that start after this query block's last visible key are all masked.
        k_stop = max(0, min(Nk, q0 + bq + shift)) if causal else Nk
        for k0 in range(0, k_stop, block_k):
            Kj, Vj = K[:, :, k0 : k0 + block_k], V[:, :, k0 : k0 + block_k]  # (B, H, bk, d)
            bk = Kj.shape[2]
            S = (Qi @ Kj.transpose(-2, -1)) * scale  # (B, H, bq, bk)
            if causal and k0 + bk - 1 > q0 + shift:  # tile crosses the diagonal
                S = S.masked_fill(~causal_mask(Nq, Nk, align, Q.device, tile=(q0, k0, bq, bk)), -math.inf)
            m_new = torch.maximum(m, S.amax(dim=-1))  # (B, H, bq)
            # A row that has seen no key yet has m_new = −inf: subtract 0 there, not −inf (NaN).
            m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            P = torch.exp(S - m_safe[..., None])  # (B, H, bq, bk)
            alpha = torch.exp(m - m_safe)  # rescales what was summed against m
            ell = alpha * ell + P.sum(dim=-1)
            acc = alpha[..., None] * acc + P @ Vj  # (B, H, bq, bk) @ (B, H, bk, d_v)
            m = m_new
        # ℓ = 0 only for a row with no visible key: O = 0 there (as SDPA), L = log 0 = −inf.
        O[:, :, q0 : q0 + bq] = acc / torch.where(ell > 0, ell, torch.ones_like(ell))[..., None]
        L[:, :, q0 : q0 + bq] = m + torch.log(ell)
    return O, L


def flash_backward(
    Q,
    K,
    V,
    O,
    L,
    grad_O,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
    needs=(True, True, True),
    align: str = "top_left",
):
    """FlashAttention-2 backward: D = rowsum(dO∘O); per tile P = exp(S − L), dV += Pᵀ dO, dS = P∘(dO Vᵀ − D), dQ += dS K·s, dK += dSᵀ Q·s.

    ``needs`` (for Q, K, V, like ``ctx.needs_input_grad``) skips the matmuls of gradients nobody
    wants (they come back as ``None``); dV alone needs neither dP nor dS.
    """
    _check(Q, K, V, causal, align, block_q, block_k)
    need_Q, need_K, need_V = (bool(n) for n in needs)
    B, H, Nq, d = Q.shape
    Nk = K.shape[2]
    shift = _shift(Nq, Nk, align)
    scale = d**-0.5 if scale is None else scale
    need_dS = need_Q or need_K
    D = (grad_O * O).sum(dim=-1)  # (B, H, Nq) = rowsum(P ∘ dP)
    grad_Q = torch.zeros_like(Q) if need_Q else None  # (B, H, Nq, d)
    grad_K = torch.zeros_like(K) if need_K else None  # (B, H, Nk, d)
    grad_V = torch.zeros_like(V) if need_V else None  # (B, H, Nk, d)
    if not (need_dS or need_V):
        return grad_Q, grad_K, grad_V
    for k0 in range(0, Nk, block_k):  # outer loop over keys: only this pass writes dK_j, dV_j
        Kj, Vj = K[:, :, k0 : k0 + block_k], V[:, :, k0 : k0 + block_k]  # (B, H, bk, d)
        bk = Kj.shape[2]
        # Earlier query blocks see none of these keys (query i sees key j iff j <= i + shift).
        q_start = max(0, (k0 - shift) // block_q * block_q) if causal else 0
        for q0 in range(q_start, Nq, block_q):
            Qi, dOi = Q[:, :, q0 : q0 + block_q], grad_O[:, :, q0 : q0 + block_q]  # (B, H, bq, d)
            bq = Qi.shape[2]
            S = (Qi @ Kj.transpose(-2, -1)) * scale  # (B, H, bq, bk), recomputed
            P = torch.exp(S - L[:, :, q0 : q0 + bq, None])  # normalised: L already holds log ℓ
            if causal and k0 + bk - 1 > q0 + shift:  # (rows with L = −inf: all masked)
                P = P.masked_fill(~causal_mask(Nq, Nk, align, Q.device, tile=(q0, k0, bq, bk)), 0.0)
            if need_V:
                grad_V[:, :, k0 : k0 + bk] += P.transpose(-2, -1) @ dOi  # (B, H, bk, d_v)
            if not need_dS:
                continue
            dP = dOi @ Vj.transpose(-2, -1)  # (B, H, bq, bk)
            dS = P * (dP - D[:, :, q0 : q0 + bq, None])  # softmax backward, row-wise
            if need_Q:
                grad_Q[:, :, q0 : q0 + bq] += (dS @ Kj) * scale  # (B, H, bq, d)
            if need_K:
                grad_K[:, :, k0 : k0 + bk] += (dS.transpose(-2, -1) @ Qi) * scale  # (B, H, bk, d)
    return grad_Q, grad_K, grad_V


class FlashAttention(torch.autograd.Function):
    """(O, L) = flash_forward(Q, K, V); backward recomputes P tile by tile from Q, K, V, O, L."""

    @staticmethod
    def forward(Q, K, V, causal, block_q, block_k, scale, align):
        return flash_forward(Q, K, V, causal, block_q, block_k, scale, align)

    @staticmethod
    def setup_context(ctx, inputs, output):
        Q, K, V, causal, block_q, block_k, scale, align = inputs
        O, L = output
        ctx.save_for_backward(Q, K, V, O, L)  # O(N·d) memory: no P, no S
        ctx.causal, ctx.block_q, ctx.block_k, ctx.scale, ctx.align = causal, block_q, block_k, scale, align
        ctx.mark_non_differentiable(L)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_O, grad_L):
        Q, K, V, O, L = ctx.saved_tensors
        # grad_L is zero: L is returned for inspection only (marked non-differentiable).
        grad_Q, grad_K, grad_V = flash_backward(
            Q,
            K,
            V,
            O,
            L,
            grad_O,
            ctx.causal,
            ctx.block_q,
            ctx.block_k,
            ctx.scale,
            needs=ctx.needs_input_grad[:3],
            align=ctx.align,
        )
        return grad_Q, grad_K, grad_V, None, None, None, None, None


def flash_attention(
    Q,
    K,
    V,
    causal: bool = False,
    block_q: int = 64,
    block_k: int = 64,
    scale: float | None = None,
    return_lse: bool = False,
    align: str = "top_left",
):
    """O = softmax(scale·Q Kᵀ) V for (B, H, N, d) tensors, tiled; (O, L) if return_lse."""
    _check(Q, K, V, causal, align, block_q, block_k)
    O, L = FlashAttention.apply(Q, K, V, causal, block_q, block_k, scale, align)
    return (O, L) if return_lse else O


# ----------------------------------------------------------------------------- measuring


def attention_flops(B: int, H: int, N: int, d: int, causal: bool = False, backward: bool = False) -> float:
    """FLOPs = 4·B·H·N²·d forward (two matmuls), ×(1 + 2.5) with backward, ×½ when causal."""
    f = 4.0 * B * H * N * N * d
    if backward:
        f *= 3.5
    return f / 2 if causal else f


def saved_bytes(
    attn, B: int, H: int, N: int, d: int, causal: bool = False, dtype=torch.float32, device="cpu"
) -> int:
    """Bytes autograd keeps for backward of attn(Q, K, V, causal), Q, K, V themselves excluded."""
    from helpers.device import randn
    from helpers.memory import SavedTensors

    Q, K, V = (randn(B, H, N, d, seed=s, device=device, dtype=dtype, requires_grad=True) for s in (1, 2, 3))
    with SavedTensors(exclude=[Q, K, V]) as saved:
        attn(Q, K, V, causal=causal)
    return saved.total_bytes
