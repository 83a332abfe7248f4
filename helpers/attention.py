"""Scaled dot-product attention and multi-head self-attention, backward by hand (chapter 6).

Forward, per batch and head (``Q`` (Nq, d), ``K`` (Nk, d), ``V`` (Nk, d_v))::

    S = Q Kᵀ · scale        scale = 1/√d unless given
    P = softmax(S)          row by row, masked entries get weight 0
    O = P V

Backward (``grad_X`` = ∂L/∂X)::

    grad_V = Pᵀ grad_O
    grad_P = grad_O Vᵀ
    grad_S = P ∘ (grad_P − rowsum(grad_P ∘ P))      the softmax VJP, never the N×N Jacobian
    grad_Q = grad_S K · scale
    grad_K = grad_Sᵀ Q · scale

Mask conventions (the same as PyTorch's, so tests compare against it directly):

* ``mask`` in ``attention_forward`` / ``Attention``: boolean, broadcastable to
  (..., Nq, Nk), **True = may attend** (``F.scaled_dot_product_attention``'s bool mask).
* ``key_padding_mask`` in ``attention`` / ``mha_forward``: boolean (B, Nk),
  **True = padding, ignore this key** (``nn.MultiheadAttention``'s convention).
* ``causal=True`` is ``F.scaled_dot_product_attention(is_causal=True)``'s mask, in every
  attention function of the course (here, ``helpers.flash``, ``helpers.flash_triton``): query i
  sees keys j ≤ i, the triangle aligned to the **top-left** corner.  The other alignment is a
  named choice, ``align="bottom_right"``: query i sees j ≤ i + (Nk − Nq), so the last query sees
  every key (a KV cache: the queries are the newest Nq of Nk tokens; FlashAttention ≥ 2.1 and
  ``torch.nn.attention.bias.causal_lower_right``).  Both agree when Nq == Nk; ``causal_mask`` is
  the one function that builds either.
* A query row with no visible key (all keys padded, or Nq > Nk under the bottom-right mask)
  gets P = 0, O = 0 and zero gradients, never NaN (SDPA with a bool mask also returns 0 there).
* No keys at all (Nk = 0) is a one-line ValueError rather than SDPA's silent zeros: an empty
  key set almost always means an empty sequence upstream, and no softmax over nothing exists.
"""

from __future__ import annotations

import math

import torch
from einops import rearrange
from torch.autograd.function import once_differentiable

from helpers.checks import expect_bool, expect_int, expect_tensor
from helpers.device import randn
from helpers.functions import softmax_backward

__all__ = [
    "masked_softmax",
    "ALIGNS",
    "causal_mask",
    "check_causal",
    "check_qkv",
    "attention_forward",
    "attention_backward",
    "Attention",
    "attention",
    "split_heads",
    "merge_heads",
    "MHA_PARAM_NAMES",
    "mha_params",
    "mha_params_from",
    "mha_forward",
    "mha_backward",
    "MultiHeadSelfAttention",
    "attention_saved_bytes_formula",
]


# ---------------------------------------------------------------- softmax and masks

# The softmax VJP, grad_S = P ∘ (grad_P − rowsum(grad_P ∘ P)), is chapter 4's softmax_backward.


def masked_softmax(S: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """P = softmax(S) over the last dim where mask is True; a fully masked row is 0."""
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))  # (..., Nq, Nk)
    m = S.amax(dim=-1, keepdim=True)  # (..., Nq, 1)
    # Subtract the row max for overflow safety; a fully masked row has max -inf: use 0.
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    E = torch.exp(S - m)  # exp(-inf) = 0 exactly
    Z = E.sum(dim=-1, keepdim=True)  # (..., Nq, 1)
    return E / torch.where(Z > 0, Z, torch.ones_like(Z))  # 0/1 = 0, not 0/0 = NaN


ALIGNS = ("top_left", "bottom_right")


def causal_mask(Nq: int, Nk: int, align: str = "top_left", device=None, tile=None) -> torch.Tensor:
    """(Nq, Nk) bool, True = may attend: j ≤ i (top_left, SDPA's is_causal) or j ≤ i + Nk − Nq (bottom_right).

    ``tile=(q0, k0, bq, bk)`` returns only rows q0 … q0+bq−1 and columns k0 … k0+bk−1 of that
    mask, so a tiled kernel never builds the whole (Nq, Nk) matrix.
    """
    expect_int("Nq", Nq)
    expect_int("Nk", Nk)
    if align not in ALIGNS:
        raise ValueError(f"align: expected one of {ALIGNS}, got {align!r}")
    q0, k0, bq, bk = (0, 0, Nq, Nk) if tile is None else tile
    shift = Nk - Nq if align == "bottom_right" else 0  # the diagonal moves right by Nk − Nq
    i = torch.arange(q0, q0 + bq, device=device)[:, None]  # (bq, 1) query index
    j = torch.arange(k0, k0 + bk, device=device)[None, :]  # (1, bk) key index
    return j <= i + shift  # (bq, bk)


def check_causal(causal, align) -> None:
    """One-line ValueErrors for a non-bool ``causal`` (``'yes'`` is not True) or an unknown ``align``."""
    expect_bool("causal", causal)
    if align not in ALIGNS:
        raise ValueError(f"align: expected one of {ALIGNS}, got {align!r}")


# ---------------------------------------------------------------- plain forward / backward


def check_qkv(Q, K, V, dims: int | None = None) -> None:
    """One-line ValueErrors unless Q (..., Nq, d), K (..., Nk, d), V (..., Nk, d_v) are one float dtype on one device.

    ``dims=4`` also demands the (B, H, N, d) layout.  Nk = 0 is refused (see the module docstring).
    """
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        expect_tensor(name, t, floating=True)
        if t.dim() < 2 or (dims is not None and t.dim() != dims):
            want = "(B, H, N, d)" if dims == 4 else "(..., N, d)"
            raise ValueError(f"{name}: expected a {want} tensor, got shape {tuple(t.shape)}")
    for name, t in (("K", K), ("V", V)):
        if t.dtype != Q.dtype or t.device != Q.device:
            raise ValueError(f"{name}: expected {Q.dtype} on {Q.device} like Q, got {t.dtype} on {t.device}")
    if Q.shape[:-2] != K.shape[:-2] or K.shape[:-1] != V.shape[:-1] or Q.shape[-1] != K.shape[-1]:
        raise ValueError(
            f"Q, K, V: expected (..., Nq, d), (..., Nk, d), (..., Nk, d_v), "
            f"got {tuple(Q.shape)}, {tuple(K.shape)}, {tuple(V.shape)}"
        )
    if K.shape[-2] == 0:
        raise ValueError("K, V: expected at least one key, got Nk = 0 (SDPA would return zeros silently)")


def _check_mask(mask, Q, K) -> None:
    if mask is None:
        return
    expect_tensor("mask", mask, dtype=torch.bool)
    target = (*Q.shape[:-1], K.shape[-2])
    try:
        torch.broadcast_shapes(mask.shape, target)
    except RuntimeError:
        raise ValueError(
            f"mask: expected a bool shape broadcastable to {target}, got {tuple(mask.shape)}"
        ) from None


def attention_forward(Q, K, V, mask=None, scale=None):
    """O = softmax(Q Kᵀ · scale, masked) V; returns (O, P). scale defaults to 1/√d."""
    check_qkv(Q, K, V)
    _check_mask(mask, Q, K)
    scale = 1.0 / math.sqrt(Q.shape[-1]) if scale is None else float(scale)
    S = (Q @ K.transpose(-2, -1)) * scale  # (B, H, Nq, d) @ (B, H, d, Nk) -> (B, H, Nq, Nk)
    P = masked_softmax(S, mask)  # (B, H, Nq, Nk)
    O = P @ V  # (B, H, Nq, Nk) @ (B, H, Nk, d_v) -> (B, H, Nq, d_v)
    return O, P


def attention_backward(Q, K, V, P, grad_O, scale, needs=(True, True, True)):
    """Backward of S = Q Kᵀ·scale, P = softmax(S), O = P V, given P and grad_O.

    grad_V = Pᵀ dO, dS = softmax_backward(P, dO Vᵀ), grad_Q = dS K·scale,
    grad_K = dSᵀ Q·scale.
    """
    grad_Q = grad_K = grad_V = None
    if needs[2]:
        # (B, H, Nk, Nq) @ (B, H, Nq, d_v) -> (B, H, Nk, d_v)
        grad_V = P.transpose(-2, -1) @ grad_O
    if needs[0] or needs[1]:
        # (B, H, Nq, d_v) @ (B, H, d_v, Nk) -> (B, H, Nq, Nk)
        grad_P = grad_O @ V.transpose(-2, -1)
        # (B, H, Nq, Nk); masked entries: P = 0 so 0
        grad_S = softmax_backward(P, grad_P)
        if needs[0]:
            # (B, H, Nq, Nk) @ (B, H, Nk, d) -> (B, H, Nq, d)
            grad_Q = (grad_S @ K) * scale
        if needs[1]:
            # (B, H, Nk, Nq) @ (B, H, Nq, d) -> (B, H, Nk, d)
            grad_K = (grad_S.transpose(-2, -1) @ Q) * scale
    return grad_Q, grad_K, grad_V


# ---------------------------------------------------------------- the autograd.Function


class Attention(torch.autograd.Function):
    """O = softmax(Q Kᵀ·scale) V with the hand-written backward.

    apply(Q, K, V, mask, scale) -> (O, P).
    """

    @staticmethod
    def forward(Q, K, V, mask, scale):
        return attention_forward(Q, K, V, mask, scale)

    @staticmethod
    def setup_context(ctx, inputs, output):
        Q, K, V, mask, scale = inputs
        O, P = output
        # P (N×N per head) is kept rather than recomputed from Q, K: backward needs it
        # twice (grad_V and the softmax VJP).  Recomputing it to save that memory is
        # chapter 10's trade.  The mask is not needed: masked entries of P are exactly
        # 0, so they stay 0 in grad_S.
        ctx.save_for_backward(Q, K, V, P)
        ctx.scale = 1.0 / math.sqrt(Q.shape[-1]) if scale is None else float(scale)
        ctx.mark_non_differentiable(P)  # P is returned for inspection only

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_O, grad_P_unused):
        Q, K, V, P = ctx.saved_tensors
        needs, scale = ctx.needs_input_grad[:3], ctx.scale
        grad_Q, grad_K, grad_V = attention_backward(Q, K, V, P, grad_O, scale, needs)
        return grad_Q, grad_K, grad_V, None, None


def attention(Q, K, V, causal: bool = False, key_padding_mask=None, scale=None, align: str = "top_left"):
    """O = softmax(Q Kᵀ/√d + masks) V for (B, H, N, d) tensors; causal as SDPA's is_causal unless align says."""
    check_qkv(Q, K, V, dims=4)
    check_causal(causal, align)
    B, _, Nq, _ = Q.shape
    Nk = K.shape[-2]
    mask = None
    if causal:
        mask = causal_mask(Nq, Nk, align, device=Q.device)  # (Nq, Nk)
    if key_padding_mask is not None:
        expect_tensor("key_padding_mask", key_padding_mask, shape=(B, Nk), dtype=torch.bool)
        keep = ~key_padding_mask.to(Q.device)[:, None, None, :]  # (B, 1, 1, Nk), True = attend
        mask = keep if mask is None else mask & keep  # (B, 1, Nq, Nk)
    O, _ = Attention.apply(Q, K, V, mask, scale)
    return O


# ---------------------------------------------------------------- heads


def split_heads(x: torch.Tensor, H: int) -> torch.Tensor:
    """(B, N, H·d) -> (B, H, N, d): head h owns columns h·d … (h+1)·d − 1."""
    expect_tensor("x", x)
    expect_int("H", H)
    if x.dim() != 3 or x.shape[-1] % H:
        raise ValueError(
            f"split_heads: expected (B, N, H·d) with H | last dim, got {tuple(x.shape)}, H={H!r}"
        )
    return rearrange(x, "b n (h d) -> b h n d", h=H)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, d) -> (B, N, H·d), the inverse of split_heads."""
    expect_tensor("x", x)
    if x.dim() != 4:
        raise ValueError(f"merge_heads: expected (B, H, N, d), got {tuple(x.shape)}")
    return rearrange(x, "b h n d -> b n (h d)")


# ---------------------------------------------------------------- multi-head self-attention

# The names nn.MultiheadAttention.named_parameters() uses, so grads line up with p.grad.
MHA_PARAM_NAMES = ("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias")


def mha_params(E: int, seed: int = 0, dtype=torch.float32, device=None) -> dict:
    """Random weights in nn.MultiheadAttention's layout: in_proj (3E, E) + (3E,), out_proj (E, E) + (E,)."""
    expect_int("E", E)
    shapes = {
        "in_proj_weight": (3 * E, E),
        "in_proj_bias": (3 * E,),
        "out_proj.weight": (E, E),
        "out_proj.bias": (E,),
    }
    scales = {
        "in_proj_weight": E**-0.5,
        "in_proj_bias": 0.1,
        "out_proj.weight": E**-0.5,
        "out_proj.bias": 0.1,
    }
    return {
        name: randn(*shape, seed=seed + i, dtype=dtype, device=device) * scales[name]
        for i, (name, shape) in enumerate(shapes.items())
    }


def mha_params_from(module: torch.nn.MultiheadAttention) -> dict:
    """Detached copies of an nn.MultiheadAttention's weights (packed in_proj, with biases)."""
    if (
        not isinstance(module, torch.nn.MultiheadAttention)
        or module.in_proj_weight is None
        or module.in_proj_bias is None
    ):
        raise ValueError(
            "mha_params_from: expected an nn.MultiheadAttention with packed in_proj and bias=True"
        )
    named = dict(module.named_parameters())
    return {name: named[name].detach().clone() for name in MHA_PARAM_NAMES}


def mha_forward(X, params: dict, H: int, causal: bool = False, key_padding_mask=None):
    """Y = merge(attn(split(X W_qᵀ+b_q), split(X W_kᵀ+b_k), split(X W_vᵀ+b_v))) W_oᵀ + b_o; returns (Y, cache)."""
    expect_tensor("X", X)
    if X.dim() != 3:
        raise ValueError(f"X: expected (B, N, E), got {tuple(X.shape)}")
    B, N, E = X.shape
    missing = [n for n in MHA_PARAM_NAMES if n not in params]
    if missing:
        raise ValueError(f"params: expected keys {MHA_PARAM_NAMES}, missing {missing}")
    W_in, b_in = params["in_proj_weight"], params["in_proj_bias"]
    W_out, b_out = params["out_proj.weight"], params["out_proj.bias"]
    expect_tensor("in_proj_weight", W_in, shape=(3 * E, E))
    expect_tensor("out_proj.weight", W_out, shape=(E, E))
    QKV = X @ W_in.T + b_in  # (B, N, E) @ (E, 3E) -> (B, N, 3E)
    Q_, K_, V_ = QKV.chunk(3, dim=-1)  # 3 × (B, N, E), rows q | k | v of W_in
    Q, K, V = (split_heads(t, H) for t in (Q_, K_, V_))  # (B, H, N, d)
    mask = None
    if expect_bool("causal", causal):
        mask = causal_mask(N, N, device=X.device)  # (N, N): both alignments agree
    if key_padding_mask is not None:
        expect_tensor("key_padding_mask", key_padding_mask, shape=(B, N), dtype=torch.bool)
        keep = ~key_padding_mask.to(X.device)[:, None, None, :]  # (B, 1, 1, N)
        mask = keep if mask is None else mask & keep
    scale = 1.0 / math.sqrt(E // H)
    O, P = attention_forward(Q, K, V, mask, scale)  # (B, H, N, d), (B, H, N, N)
    A = merge_heads(O)  # (B, N, E)
    Y = A @ W_out.T + b_out  # (B, N, E) @ (E, E) -> (B, N, E)
    cache = {
        "X": X,
        "Q": Q,
        "K": K,
        "V": V,
        "P": P,
        "A": A,
        "scale": scale,
        "H": H,
        "in_proj_weight": W_in,
        "out_proj.weight": W_out,
    }
    return Y, cache


def mha_backward(grad_Y, cache: dict) -> dict:
    """Every gradient of mha_forward by hand (no autograd): 'X' and MHA_PARAM_NAMES."""
    X, A = cache["X"], cache["A"]
    W_in, W_out = cache["in_proj_weight"], cache["out_proj.weight"]
    expect_tensor("grad_Y", grad_Y, shape=A.shape)
    grad_W_out = torch.einsum("bni,bnj->ij", grad_Y, A)  # Σ_b,n grad_Y ⊗ A -> (E, E)
    grad_b_out = grad_Y.sum(dim=(0, 1))  # (E,)
    grad_A = grad_Y @ W_out  # (B, N, E) @ (E, E) -> (B, N, E)
    grad_O = split_heads(grad_A, cache["H"])  # (B, H, N, d)
    grad_Q, grad_K, grad_V = attention_backward(
        cache["Q"], cache["K"], cache["V"], cache["P"], grad_O, cache["scale"]
    )  # 3 × (B, H, N, d)
    # (B, N, 3E)
    grad_QKV = torch.cat([merge_heads(g) for g in (grad_Q, grad_K, grad_V)], dim=-1)
    grad_W_in = torch.einsum("bni,bnj->ij", grad_QKV, X)  # (3E, E)
    grad_b_in = grad_QKV.sum(dim=(0, 1))  # (3E,)
    grad_X = grad_QKV @ W_in  # (B, N, 3E) @ (3E, E) -> (B, N, E)
    return {
        "X": grad_X,
        "in_proj_weight": grad_W_in,
        "in_proj_bias": grad_b_in,
        "out_proj.weight": grad_W_out,
        "out_proj.bias": grad_b_out,
    }


class MultiHeadSelfAttention:
    """Self-attention with nn.MultiheadAttention's weight layout; forward(X) then backward(grad_Y), no autograd."""

    def __init__(self, E: int, H: int, seed: int = 0, dtype=torch.float32, device=None, params=None):
        if expect_int("H", H) and expect_int("E", E) % H:
            raise ValueError(f"H: expected a divisor of E={E}, got {H}")
        self.E, self.H = E, H
        self.params = params if params is not None else mha_params(E, seed, dtype, device)
        self.cache = None

    @classmethod
    def from_module(cls, module: torch.nn.MultiheadAttention) -> "MultiHeadSelfAttention":
        """Share (copy) the weights of an nn.MultiheadAttention."""
        params = mha_params_from(module)
        return cls(module.embed_dim, module.num_heads, params=params)

    def forward(self, X, causal: bool = False, key_padding_mask=None):
        """Y (B, N, E); keeps what backward needs in self.cache."""
        Y, self.cache = mha_forward(X, self.params, self.H, causal, key_padding_mask)
        return Y

    __call__ = forward

    def backward(self, grad_Y) -> dict:
        """Gradients of X and of every weight, keyed like nn.MultiheadAttention.named_parameters()."""
        if self.cache is None:
            raise ValueError("MultiHeadSelfAttention.backward: expected forward to run first")
        return mha_backward(grad_Y, self.cache)


# ---------------------------------------------------------------- memory


def attention_saved_bytes_formula(B: int, H: int, N: int, bytes: int) -> int:
    """B·H·N²·bytes: one (B, H, N, N) tensor, e.g. P kept for backward (bytes per element)."""
    for name, v in (("B", B), ("H", H), ("N", N), ("bytes", bytes)):
        expect_int(name, v)
    return B * H * N * N * bytes
