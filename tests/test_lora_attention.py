"""Tests for helpers.lora_attention: LoRASelfAttention equals nn.MultiheadAttention, masks and layouts."""

import pytest
import torch
from torch import nn

from helpers.device import get_device, randn
from helpers.lora import LoRALinear
from helpers.lora_attention import LoRASelfAttention
from helpers.lora_model import add_lora_attention

DEV = get_device()
F64 = torch.float64
TOL64 = dict(atol=1e-12, rtol=1e-12)


def _mha(E=8, H=2, seed=0):
    torch.manual_seed(seed)
    return nn.MultiheadAttention(E, H, batch_first=True).to(device=DEV, dtype=F64)


@pytest.mark.parametrize("masks", ["causal", "padding", "none"])
def test_split_attention_equals_multihead_attention(masks):
    mha = _mha()
    att = LoRASelfAttention(mha, r=2, alpha=2.0)
    x = randn(3, 5, 8, seed=1, dtype=F64, device=DEV)
    kw = {}
    if masks == "causal":
        kw = dict(
            attn_mask=nn.Transformer.generate_square_subsequent_mask(5, device=DEV, dtype=F64), is_causal=True
        )
    elif masks == "padding":
        kpm = torch.zeros(3, 5, dtype=torch.bool, device=DEV)
        kpm[0, 3:] = True
        kw = dict(key_padding_mask=kpm)
    y_ref, _ = mha(x, x, x, need_weights=False, **kw)
    y, _ = att(x, x, x, need_weights=False, **kw)
    torch.testing.assert_close(y, y_ref, **TOL64)


def _mha_mask(kind, B=3, H=2, N=5):
    """Masks for MultiheadAttention: a (B, N) padding mask and/or an (N, N) or (B·H, N, N) attn_mask."""
    kpm = torch.zeros(B, N, dtype=torch.bool, device=DEV)
    kpm[0, 3:] = True
    kpm[2, 4:] = True
    if kind == "causal+padding":
        future = torch.ones(N, N, dtype=torch.bool, device=DEV).triu(1)  # (N, N), True = blocked
        return dict(attn_mask=future, key_padding_mask=kpm)
    if kind == "3d":
        m = torch.rand(B * H, N, N, generator=torch.Generator().manual_seed(4)) < 0.3
        m[..., 0] = False  # every query keeps one key
        return dict(attn_mask=m.to(DEV))
    raise ValueError(kind)


@pytest.mark.parametrize("kind", ["causal+padding", "3d"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_split_attention_equals_multihead_attention_masks_and_layouts(kind, batch_first):
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(8, 2, batch_first=batch_first).to(device=DEV, dtype=F64)
    att = LoRASelfAttention(mha, r=2, alpha=2.0)
    x = randn(3, 5, 8, seed=1, dtype=F64, device=DEV)
    if not batch_first:
        x = x.transpose(0, 1)  # (B, N, E) -> (N, B, E)
    kw = _mha_mask(kind)
    y_ref, _ = mha(x, x, x, need_weights=False, **kw)
    y, _ = att(x, x, x, need_weights=False, **kw)
    torch.testing.assert_close(y, y_ref, **TOL64)


def test_is_causal_with_only_a_padding_mask_stays_causal():
    """is_causal=True with a key_padding_mask but no attn_mask must still hide future keys."""
    att = LoRASelfAttention(_mha(), r=2, alpha=2.0)
    x = randn(3, 5, 8, seed=1, dtype=F64, device=DEV)
    kw = _mha_mask("causal+padding")
    y_causal, _ = att(x, x, x, key_padding_mask=kw["key_padding_mask"], is_causal=True)
    y_ref, _ = att(x, x, x, **kw)
    torch.testing.assert_close(y_causal, y_ref, **TOL64)
    y_open, _ = att(x, x, x, key_padding_mask=kw["key_padding_mask"])
    assert not torch.allclose(y_open, y_causal)


def test_attention_adapters_on_q_and_v_only_train_and_survive_eval_fast_path():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
    layer = layer.to(device=DEV, dtype=F64)
    wrapper = nn.Sequential(layer)
    x = randn(2, 4, 8, seed=1, dtype=F64, device=DEV)
    mask = nn.Transformer.generate_square_subsequent_mask(4, device=DEV, dtype=F64)
    y0 = layer(x, src_mask=mask, is_causal=True)
    add_lora_attention(wrapper, r=2, alpha=4.0)
    att = layer.self_attn
    assert isinstance(att, LoRASelfAttention)
    assert isinstance(att.q_proj, LoRALinear) and isinstance(att.v_proj, LoRALinear)
    assert not isinstance(att.k_proj, LoRALinear) and not isinstance(att.out_proj, LoRALinear)
    torch.testing.assert_close(layer(x, src_mask=mask, is_causal=True), y0, **TOL64)
    assert [n for n, p in wrapper.named_parameters() if p.requires_grad] == [
        "0.self_attn.q_proj.lora_A",
        "0.self_attn.q_proj.lora_B",
        "0.self_attn.v_proj.lora_A",
        "0.self_attn.v_proj.lora_B",
    ]
    layer(x, src_mask=mask, is_causal=True).pow(2).sum().backward()
    assert att.q_proj.lora_A.grad.abs().max() == 0 and att.v_proj.lora_B.grad.abs().max() > 0
    with torch.no_grad():
        att.v_proj.lora_B.copy_(randn(8, 2, seed=3, dtype=F64, device=DEV))
    y_train = layer(x, src_mask=mask, is_causal=True)
    layer.eval()
    with torch.no_grad():  # eval + no_grad is where the packed fast path would skip adapters
        y_eval = layer(x, src_mask=mask, is_causal=True)
    torch.testing.assert_close(y_eval, y_train.detach(), **TOL64)
    assert not torch.allclose(y_eval, y0)


def test_attention_bad_inputs():
    with pytest.raises(ValueError, match="MultiheadAttention"):
        LoRASelfAttention(nn.Linear(4, 4), 1, 1.0)
    with pytest.raises(ValueError, match="targets"):
        LoRASelfAttention(_mha(), 1, 1.0, targets=("x",))
    with pytest.raises(ValueError, match="found none"):
        add_lora_attention(nn.Sequential(nn.Linear(8, 4)), 1, 1.0)
