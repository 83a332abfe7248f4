import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers.gradflow import (
    GradFlowRecorder,
    clip_grad_norm,
    dead_relu_units,
    deep_mlp,
    fixed_batch,
    global_grad_norm,
    layer_grad_norms,
    record_grad_flow,
)


def _dead_layer_model():
    """0: Linear, 1: ReLU, 2: Linear with W = b = 0 (dead), 3: ReLU, 4: Linear -> logits."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    with torch.no_grad():
        model[2].weight.zero_()
        model[2].bias.zero_()
    return model


def _batch():
    torch.manual_seed(1)
    return torch.randn(32, 8), torch.arange(32) % 4


def test_recorder_finds_the_dead_layer_by_name():
    model, (X, y) = _dead_layer_model(), _batch()
    with GradFlowRecorder(model) as rec:
        F.cross_entropy(model(X), y).backward()
    out, par = rec.output_grad_norms, rec.param_grad_norms
    assert set(out) == {"0", "1", "2", "3", "4"}
    # The gradient reaches the ReLU after the dead layer (3) and the head (4) ...
    assert out["4"] > 1e-3
    # ... but ReLU'(0) = 0 blocks it: nothing reaches layer 2's output, nor anything before it.
    assert out["3"] > 1e-3 and out["2"] == 0.0 and out["1"] == 0.0 and out["0"] == 0.0
    assert par["2.weight"] == 0.0 and par["2.bias"] == 0.0
    assert par["0.weight"] == 0.0 and par["0.bias"] == 0.0
    # The head's input is all zeros, so ∂L/∂W4 = grad_out.T @ 0 = 0; only its bias learns.
    assert par["4.weight"] == 0.0 and par["4.bias"] > 1e-3
    # The recorded norms are exactly the norms of .grad.
    for name, p in model.named_parameters():
        assert par[name] == p.grad.norm().item()


def test_recorder_output_norm_matches_autograd_grad():
    torch.manual_seed(0)
    model, (X, y) = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)), _batch()
    h = model[1](model[0](X))
    ref = torch.autograd.grad(F.cross_entropy(model[2](h), y), h)[0].norm().item()
    rec = record_grad_flow(model, X, y)
    assert math.isclose(rec.output_grad_norms["1"], ref, rel_tol=1e-6)


def test_recorder_multiplied_by_zero_and_remove():
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 2)

        def forward(self, x):
            return self.b(self.a(x) * 0)  # everything after `a` is multiplied by 0

    model = Scaled()
    X, y = torch.randn(5, 4), torch.tensor([0, 1, 0, 1, 0])
    rec = GradFlowRecorder(model, modules=["a", "b"])
    F.cross_entropy(model(X), y).backward()
    assert rec.output_grad_norms["b"] > 0 and rec.output_grad_norms["a"] == 0.0
    assert rec.param_grad_norms["a.weight"] == 0.0 and rec.param_grad_norms["b.bias"] > 0
    rec.remove()
    rec.output_grad_norms.clear()
    F.cross_entropy(model(X), y).backward()
    assert rec.output_grad_norms == {}


def test_recorder_rejects_bad_input():
    with pytest.raises(ValueError, match="nn.Module"):
        GradFlowRecorder("model")
    with pytest.raises(ValueError, match="named_modules"):
        GradFlowRecorder(nn.Linear(2, 2), modules=["nope"])


@pytest.mark.parametrize("max_norm", [0.1, 1.0, 1e6])
def test_clip_equals_clip_grad_norm_(max_norm):
    def grads():
        model = deep_mlp(depth=4, width=8, activation="gelu", init_scale=2.0, seed=3)
        X, y = fixed_batch(batch=16, width=8)
        F.cross_entropy(model(X), y).backward()
        return model

    ours, ref = grads(), grads()
    total = clip_grad_norm(ours.parameters(), max_norm)
    total_ref = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm)
    assert torch.equal(total, total_ref)
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-9)
    after = global_grad_norm(ours.parameters()).item()
    assert after <= max_norm * (1 + 1e-5) or after == pytest.approx(total.item(), rel=1e-6)


def test_norm_and_clip_skip_missing_grads_and_reject_bad_input():
    a, b = torch.ones(3, requires_grad=True), torch.ones(2, requires_grad=True)
    a.grad = torch.full((3,), 4.0)  # b has no gradient: it counts as nothing
    assert global_grad_norm([a, b]).item() == pytest.approx(48**0.5)
    assert global_grad_norm([b]).item() == 0.0
    clip_grad_norm({"a": a, "b": b}, 1.0)
    assert a.grad.norm().item() == pytest.approx(1.0, rel=1e-5) and b.grad is None
    for bad in (0.0, -1.0, True, "1"):
        with pytest.raises(ValueError, match="max_norm"):
            clip_grad_norm([a], bad)
    with pytest.raises(ValueError, match="are_grads"):
        global_grad_norm([a.grad], are_grads="yes")
    with pytest.raises(ValueError, match=r"grads\[0\]: expected a torch.Tensor"):
        global_grad_norm([None], are_grads=True)


def test_deep_mlp_layer_norms_vanish_with_sigmoid_and_not_with_layernorm():
    X, y = fixed_batch()
    plain = layer_grad_norms(deep_mlp(20, 32, "sigmoid"), X, y)
    normed = layer_grad_norms(deep_mlp(20, 32, "sigmoid", residual=True, layernorm=True), X, y)
    assert len(plain) == 20
    assert plain[0] < 1e-8 * plain[-1]
    assert 0.1 < normed[0] / normed[-1] < 10
    out = layer_grad_norms(deep_mlp(5, 8, "relu"), *fixed_batch(width=8), which="output")
    assert len(out) == 5 and all(v > 0 for v in out)


def test_deep_mlp_is_deterministic_and_validates():
    a, b = deep_mlp(3, 8, seed=5), deep_mlp(3, 8, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match="activation"):
        deep_mlp(activation="swish")


def test_dead_relu_units_counts_all_zero_columns():
    model, (X, _) = _dead_layer_model(), _batch()
    counts = dead_relu_units(model, X)
    assert counts["3"] == (16, 16)  # W = b = 0: every unit is 0 for every row
    assert counts["1"][1] == 16 and counts["1"][0] < 16
