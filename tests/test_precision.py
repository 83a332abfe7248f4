import pytest
import torch

from helpers.precision import ScalerState, float_format_table, loss_scale_step, unscale_grads, update_scale


def test_float_format_table():
    rows = {r["dtype"]: r for r in float_format_table()}
    assert rows["float16"]["max"] == 65504.0
    assert rows["float16"]["subnormal"] == 2.0**-24
    assert rows["bfloat16"]["eps"] == 2.0**-7
    assert rows["bfloat16"]["max"] > 3e38
    assert torch.tensor(1e-12, dtype=torch.float16).item() == 0.0  # below the smallest fp16 subnormal


def test_unscale_and_update_scale_rules():
    g, inf = unscale_grads([torch.tensor([4.0, 8.0]), None], 4.0)
    assert not inf and torch.equal(g[0], torch.tensor([1.0, 2.0])) and g[1] is None
    _, inf = unscale_grads([torch.tensor([1.0, float("nan")])], 2.0)
    assert inf
    s = ScalerState(scale=8.0, growth_interval=2)
    s = update_scale(s, True)
    assert (s.scale, s.growth_tracker) == (4.0, 0)
    s = update_scale(update_scale(s, False), False)
    assert (s.scale, s.growth_tracker) == (8.0, 0)
    with pytest.raises(ValueError):
        update_scale({"scale": 1.0}, False)


def _fp16_model_loss(W, b, x, t):
    """Forward in float16 from float32 master weights (what autocast does per op); loss back in float32."""
    h = torch.tanh(x.half() @ W.half().T + b.half())  # (n, 4) @ (4, 3) -> (n, 3), float16
    return ((h.float() - t) ** 2).sum()


def test_loss_scale_step_matches_gradscaler():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=3)
    g = torch.Generator().manual_seed(0)
    W0, b0 = torch.randn(3, 4, generator=g), torch.randn(3, generator=g)
    xs = [torch.randn(16, 4, generator=g) * 3 for _ in range(8)]
    ts = [torch.randn(16, 3, generator=g) for _ in range(8)]
    W_ref, b_ref = W0.clone().requires_grad_(), b0.clone().requires_grad_()
    opt = torch.optim.SGD([W_ref, b_ref], lr=0.01)
    W, b = W0.clone().requires_grad_(), b0.clone().requires_grad_()
    state = ScalerState(scale=2.0**16, growth_interval=3)
    skipped = []
    for x, t in zip(xs, ts):
        opt.zero_grad()
        scaler.scale(_fp16_model_loss(W_ref, b_ref, x, t)).backward()
        scaler.step(opt)
        scaler.update()
        scaled = torch.autograd.grad(state.scale * _fp16_model_loss(W, b, x, t), [W, b])
        state, stepped = loss_scale_step([W, b], scaled, state, lr=0.01)
        skipped.append(not stepped)
        assert state.scale == scaler.get_scale()
        assert torch.equal(W, W_ref) and torch.equal(b, b_ref)
    assert skipped[0]  # 2¹⁶ · an O(1) gradient overflows float16: the first step is skipped
    assert not all(skipped)
    n_skip = sum(skipped)
    # every skip halves the scale; growth_interval=3 clean steps in a row double it
    assert state.scale == 2.0**16 * 0.5**n_skip * 2.0 ** ((len(skipped) - n_skip) // 3)


def test_loss_scale_step_rejects_mismatched_lengths():
    with pytest.raises(ValueError):
        loss_scale_step([torch.zeros(2)], [], ScalerState(), 0.1)
