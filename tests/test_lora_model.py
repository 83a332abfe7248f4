"""Tests for helpers.lora_model: adapters into a model, adapter-only state dicts, counting."""

import pytest
import torch
from torch import nn

from helpers.device import get_device, randn
from helpers.lora import lora_modules
from helpers.lora_model import (
    adam_state_bytes_formula,
    add_lora,
    add_lora_attention,
    load_lora_state_dict,
    lora_state_dict,
    optimizer_state_bytes,
    parameter_counts,
)
from helpers.optim import SGD, AdamW

DEV = get_device()
F64 = torch.float64


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device=DEV, dtype=F64)


def test_save_and_load_adapter_weights_alone_onto_fresh_base():
    model = add_lora(_mlp(), ["0", "2"], r=2, alpha=4.0, seed=1)
    with torch.no_grad():
        for m in lora_modules(model).values():
            m.lora_B.copy_(randn(*m.lora_B.shape, seed=5, dtype=F64, device=DEV))
    x = randn(3, 8, seed=2, dtype=F64, device=DEV)
    y = model(x)
    sd = lora_state_dict(model)
    assert set(sd) == {"0.lora_A", "0.lora_B", "2.lora_A", "2.lora_B"}
    fresh = add_lora(_mlp(), ["0", "2"], r=2, alpha=4.0, seed=99)  # same base, other adapter init
    assert not torch.allclose(fresh(x), y)
    load_lora_state_dict(fresh, sd)
    assert torch.equal(fresh(x), y)


def test_bad_model_inputs_raise_one_line_value_errors():
    model = add_lora(_mlp(), ["0"], r=2, alpha=1.0)
    sd = lora_state_dict(add_lora(_mlp(), ["0"], r=3, alpha=1.0))
    with pytest.raises(ValueError, match=r"0.lora_A: expected shape \(2, 8\), got \(3, 8\)"):
        load_lora_state_dict(model, sd)
    with pytest.raises(ValueError, match="missing"):
        load_lora_state_dict(model, {"0.lora_A": sd["0.lora_A"]})
    with pytest.raises(ValueError, match="found none"):
        add_lora(_mlp(), ["nope"], r=1, alpha=1.0)
    with pytest.raises(ValueError, match="nn.Linear"):
        add_lora(_mlp(), ["1"], r=1, alpha=1.0)  # the ReLU
    mha = nn.Sequential(nn.MultiheadAttention(8, 2, batch_first=True))
    with pytest.raises(ValueError, match="add_lora_attention"):
        add_lora(mha, ["out_proj"], r=1, alpha=1.0)


def test_counts_and_optimizer_state_bytes():
    model = add_lora(_mlp(), ["0", "2"], r=2, alpha=1.0)
    c = parameter_counts(model)
    assert c["total"] == 8 * 16 + 16 + 16 * 4 + 4 + 2 * (8 + 16) + 2 * (16 + 4)
    assert c["trainable"] == 2 * (8 + 16) + 2 * (16 + 4)
    assert c["trainable_bytes"] == 8 * c["trainable"]
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    model(randn(3, 8, dtype=F64, device=DEV)).sum().backward()
    opt.step()
    steps = sum(s["step"].numel() * s["step"].element_size() for s in opt.state.values())
    assert optimizer_state_bytes(opt) == adam_state_bytes_formula(model) + steps
    assert optimizer_state_bytes(opt, step_counters=False) == adam_state_bytes_formula(model)


def test_optimizer_state_bytes_counts_helpers_optim_and_torch_alike():
    """helpers.optim keeps its step count as an int: its AdamW's state is torch's without the step tensors."""
    shapes = [(3, 4), (4,), ()]  # a 0-dim parameter has 0-dim m and v
    ours = [torch.ones(s, dtype=F64) for s in shapes]
    ref = [torch.ones(s, dtype=F64, requires_grad=True) for s in shapes]
    opt, opt_ref = AdamW(ours, lr=0.1), torch.optim.AdamW(ref, lr=0.1)
    opt.step([torch.ones(s, dtype=F64) for s in shapes])
    sum(p.sum() for p in ref).backward()
    opt_ref.step()
    n_bytes = (12 + 4 + 1) * 8
    assert optimizer_state_bytes(opt) == 2 * n_bytes == optimizer_state_bytes(opt_ref, step_counters=False)
    assert optimizer_state_bytes(opt_ref) > 2 * n_bytes  # + one step tensor per parameter
    sgd, momentum = SGD(ours, lr=0.1), SGD(ours, lr=0.1, momentum=0.9)
    for o in (sgd, momentum):
        o.step([torch.ones(s, dtype=F64) for s in shapes])
    assert optimizer_state_bytes(sgd) == 0 and optimizer_state_bytes(momentum) == n_bytes
    with pytest.raises(ValueError, match="step_counters"):
        optimizer_state_bytes(opt, step_counters="no")


def test_add_lora_after_add_lora_attention_keeps_attention_adapters_trainable():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).to(device=DEV, dtype=F64)
    model = nn.Sequential(layer)
    add_lora_attention(model, r=2, alpha=2.0, targets=("q", "k", "v", "o"))
    add_lora(model, ["linear1", "linear2"], r=2, alpha=2.0)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert len(names) == 12 and all(n.endswith(("lora_A", "lora_B")) for n in names)
    assert parameter_counts(model)["trainable"] == 4 * 2 * 16 + 2 * 2 * (8 + 16)
