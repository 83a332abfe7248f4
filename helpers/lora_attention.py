"""LoRA on attention (chapter 8): nn.MultiheadAttention with Q, K, V split so each can carry an adapter.

``LoRASelfAttention`` equals a ``batch_first`` (or not) ``nn.MultiheadAttention`` in its
forward, masks included (``attn_mask``, ``key_padding_mask``, ``is_causal``, in
MultiheadAttention's conventions: a bool mask is True = blocked, a float mask is added), with
its packed in_proj split into frozen ``q_proj``, ``k_proj``, ``v_proj`` (+ ``out_proj``)
``nn.Linear`` layers.  Heads are split and merged by chapter 6's ``split_heads`` /
``merge_heads``, the causal triangle is chapter 6's ``causal_mask`` (SDPA's top-left).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from helpers.attention import causal_mask, merge_heads, split_heads
from helpers.lora import LoRALinear

__all__ = ["LoRASelfAttention"]


class LoRASelfAttention(nn.Module):
    """Self-attention equal to a batch_first nn.MultiheadAttention, its packed in_proj split into
    frozen q_proj, k_proj, v_proj (+ out_proj) nn.Linear layers so that chosen ones carry adapters.

    The packed ``in_proj_weight`` (3E, E) stacks W_Q, W_K, W_V by rows; one adapter on the packed
    matrix would couple the three (its B has rows for K too).  Splitting gives each projection its
    own A and B, as for separate q_proj/v_proj layers.  Drop-in for ``TransformerEncoderLayer.self_attn``.
    """

    # TransformerEncoderLayer's inference fast path reads the packed weights directly and would
    # skip the adapters; with the projections split there is no packed weight, which also turns the
    # fast path off (it requires _qkv_same_embed_dim).
    _qkv_same_embed_dim = False

    def __init__(
        self,
        mha: nn.MultiheadAttention,
        r: int,
        alpha: float,
        targets=("q", "v"),
        dropout: float = 0.0,
        rslora: bool = False,
        seed: int = 0,
    ):
        super().__init__()
        if not isinstance(mha, nn.MultiheadAttention):
            raise ValueError(
                f"LoRASelfAttention: expected an nn.MultiheadAttention, got {type(mha).__name__}"
            )
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError(
                "LoRASelfAttention: expected a plain packed nn.MultiheadAttention "
                "(same q/k/v dims, no bias_k/bias_v, no add_zero_attn)"
            )
        bad = [t for t in targets if t not in ("q", "k", "v", "o")]
        if bad or not targets:
            raise ValueError(
                f"LoRASelfAttention: expected targets among 'q', 'k', 'v', 'o', got {tuple(targets)}"
            )
        E = mha.embed_dim
        self.embed_dim, self.num_heads, self.batch_first = E, mha.num_heads, mha.batch_first
        self.attn_dropout = mha.dropout
        W, b = mha.in_proj_weight.detach(), mha.in_proj_bias
        for i, name in enumerate(("q", "k", "v")):
            lin = nn.Linear(E, E, bias=b is not None, device=W.device, dtype=W.dtype)
            with torch.no_grad():
                lin.weight.copy_(W[i * E : (i + 1) * E])  # row block i of the packed (3E, E)
                if b is not None:
                    lin.bias.copy_(b.detach()[i * E : (i + 1) * E])
            lin.requires_grad_(False)
            setattr(self, f"{name}_proj", lin)
        o = mha.out_proj
        out = nn.Linear(E, E, bias=o.bias is not None, device=W.device, dtype=W.dtype)
        with torch.no_grad():
            out.weight.copy_(o.weight)
            if o.bias is not None:
                out.bias.copy_(o.bias)
        out.requires_grad_(False)
        self.out_proj = out
        for j, t in enumerate(targets):
            name = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}[t]
            setattr(self, name, LoRALinear(getattr(self, name), r, alpha, dropout, rslora, seed=seed + j))

    @property
    def in_proj_bias(self):
        """The three biases stacked as in the packed module (read by TransformerEncoderLayer)."""
        bs = [getattr(self, f"{n}_proj").bias for n in ("q", "k", "v")]
        return None if bs[0] is None else torch.cat(bs)

    def forward(
        self,
        query,
        key=None,
        value=None,
        key_padding_mask=None,
        need_weights=False,
        attn_mask=None,
        average_attn_weights=True,
        is_causal=False,
    ):
        """O = softmax(Q Kᵀ/√d + mask) V per head, then out_proj; self-attention only (key, value = query)."""
        x = query
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise ValueError(
                "LoRASelfAttention: expected self-attention (key and value the same tensor as query)"
            )
        if need_weights:
            raise ValueError("LoRASelfAttention: need_weights=True is not supported")
        if not self.batch_first:
            x = x.transpose(0, 1)  # (N, B, E) -> (B, N, E)
        Bsz, N, _ = x.shape
        H = self.num_heads
        Q, K, V = (
            split_heads(proj(x), H) for proj in (self.q_proj, self.k_proj, self.v_proj)
        )  # (B, H, N, d)
        if is_causal and attn_mask is None and key_padding_mask is not None:
            # SDPA takes is_causal or a mask, not both: fold the triangle into the padding mask.
            attn_mask = ~causal_mask(N, N, device=x.device)  # (N, N), MHA's bool: True = future key, blocked
        mask = _additive_mask(attn_mask, key_padding_mask, Bsz, N, x.dtype)
        causal = is_causal and mask is None
        O = F.scaled_dot_product_attention(
            Q, K, V, attn_mask=mask, is_causal=causal, dropout_p=self.attn_dropout if self.training else 0.0
        )  # (B, H, N, d)
        O = merge_heads(O)  # (B, H, N, d) -> (B, N, E)
        Y = self.out_proj(O)
        if not self.batch_first:
            Y = Y.transpose(0, 1)  # (B, N, E) -> (N, B, E)
        return Y, None


def _additive_mask(attn_mask, key_padding_mask, Bsz, N, dtype):
    """MultiheadAttention's masks (bool True = blocked, or additive floats) as one additive mask for SDPA.

    MultiheadAttention accepts both kinds and a (B·H, N, N) attn_mask; chapter 6's masks are
    bool "may attend" only, so this conversion has no other home.
    """

    def additive(m):
        if m is None:
            return None
        if m.dtype == torch.bool:
            return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, float("-inf"))
        return m.to(dtype)

    mask = additive(attn_mask)  # (N, N) or (B·H, N, N)
    if mask is not None and mask.dim() == 3:
        mask = mask.reshape(Bsz, -1, N, N)  # (B·H, N, N) -> (B, H, N, N)
    kpm = additive(key_padding_mask)  # (B, N)
    if kpm is not None:
        kpm = kpm.reshape(Bsz, 1, 1, N)  # (B, N) -> (B, 1, 1, N)
        mask = kpm if mask is None else mask + kpm
    return mask
