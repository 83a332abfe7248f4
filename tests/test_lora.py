"""Tests for helpers.lora: the LoRA math, its autograd.Function, LoRALinear, merge and unmerge."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import gradcheck

import helpers.lora as hl
from helpers.device import get_device, randn
from helpers.lora import LoRALinear, lora_linear, lora_linear_backward, lora_scale, merge_lora, unmerge_lora

DEV = get_device()
F64 = torch.float64
TOL64 = dict(atol=1e-12, rtol=1e-12)  # the bar: same math, different summation order


def _linear(d_in, d_out, seed=0, bias=True, dtype=F64):
    lin = nn.Linear(d_in, d_out, bias=bias, device=DEV, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(randn(d_out, d_in, seed=seed, dtype=dtype, device=DEV) / math.sqrt(d_in))
        if bias:
            lin.bias.copy_(randn(d_out, seed=seed + 1, dtype=dtype, device=DEV))
    return lin


def _lora(d_in=7, d_out=6, r=3, alpha=5.0, seed=0, bias=True, rslora=False, dropout=0.0, nonzero_B=True):
    m = LoRALinear(_linear(d_in, d_out, seed, bias), r, alpha, dropout=dropout, rslora=rslora, seed=seed + 2)
    if nonzero_B:  # a trained-looking adapter, so every term of the gradient is exercised
        with torch.no_grad():
            m.lora_B.copy_(randn(d_out, r, seed=seed + 3, dtype=m.lora_B.dtype, device=DEV))
    return m


def _reference(m: LoRALinear, x):
    """Plain autograd on W' = W + s·BA (formed explicitly): output and grads of x, A, B."""
    A = m.lora_A.detach().clone().requires_grad_()
    B = m.lora_B.detach().clone().requires_grad_()
    xr = x.detach().clone().requires_grad_()
    W_prime = m.base.weight.detach() + m.scale * (B @ A)  # (out, r) @ (r, in) -> (out, in)
    y = xr @ W_prime.T + (m.base.bias.detach() if m.base.bias is not None else 0.0)
    return y, xr, A, B


CONFIGS = [dict(), dict(bias=False), dict(rslora=True), dict(r=1), dict(d_in=5, d_out=9, r=5, alpha=1.0)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=[str(c) or "default" for c in CONFIGS])
@pytest.mark.parametrize("batch_shape", [(4,), (2, 3)])
def test_forward_and_every_gradient_match_plain_autograd_on_W_prime_float64(cfg, batch_shape):
    m = _lora(**cfg)
    x = randn(*batch_shape, m.in_features, seed=10, dtype=F64, device=DEV, requires_grad=True)
    g = randn(*batch_shape, m.out_features, seed=11, dtype=F64, device=DEV)
    y = m(x)
    y.backward(g)
    y_ref, xr, A, B = _reference(m, x)
    y_ref.backward(g)
    torch.testing.assert_close(y, y_ref, **TOL64)
    torch.testing.assert_close(x.grad, xr.grad, **TOL64)
    torch.testing.assert_close(m.lora_A.grad, A.grad, **TOL64)
    torch.testing.assert_close(m.lora_B.grad, B.grad, **TOL64)


def test_gradcheck_function_float64_every_input():
    x = randn(2, 3, 5, seed=1, dtype=F64, device=DEV, requires_grad=True)
    W = randn(4, 5, seed=2, dtype=F64, device=DEV, requires_grad=True)
    b = randn(4, seed=3, dtype=F64, device=DEV, requires_grad=True)
    A = randn(2, 5, seed=4, dtype=F64, device=DEV, requires_grad=True)
    B = randn(4, 2, seed=5, dtype=F64, device=DEV, requires_grad=True)
    xl = randn(2, 3, 5, seed=6, dtype=F64, device=DEV, requires_grad=True)
    assert gradcheck(lambda *t: lora_linear(*t, 3.0, 2), (x, W, b, A, B))
    assert gradcheck(
        lambda x, W, b, A, B, xl: lora_linear(x, W, b, A, B, 3.0, 2, x_lora=xl), (x, W, b, A, B, xl)
    )
    W0 = W.detach()  # the LoRA case: frozen W, no bias grad asked
    assert gradcheck(lambda x, A, B: lora_linear(x, W0, None, A, B, 3.0, 2, rslora=True), (x, A, B))


def test_plain_backward_function_without_autograd():
    x = randn(6, 5, seed=1, dtype=F64, device=DEV)
    W = randn(4, 5, seed=2, dtype=F64, device=DEV)
    A = randn(2, 5, seed=4, dtype=F64, device=DEV)
    B = randn(4, 2, seed=5, dtype=F64, device=DEV)
    g = randn(6, 4, seed=7, dtype=F64, device=DEV)
    s = 0.75
    xA = x @ A.T
    grad_x, grad_W, grad_b, grad_A, grad_B, _, _ = lora_linear_backward(g, x, W, A, B, xA, s)
    # ∂L/∂W' = gᵀx; seed 003's chain rule: ∂L/∂B = s·∂L/∂W' Aᵀ, ∂L/∂A = s·Bᵀ ∂L/∂W'
    grad_Wp = g.T @ x
    torch.testing.assert_close(grad_B, s * grad_Wp @ A.T, **TOL64)
    torch.testing.assert_close(grad_A, s * B.T @ grad_Wp, **TOL64)
    torch.testing.assert_close(grad_x, g @ (W + s * B @ A), **TOL64)
    torch.testing.assert_close(grad_b, g.sum(0), **TOL64)
    assert grad_W is None  # not asked for: LoRA never forms ∂L/∂W'


def test_zero_init_equals_base_model_bit_for_bit():
    base = nn.Sequential(
        _linear(8, 16, seed=1, dtype=torch.float32), nn.GELU(), _linear(16, 4, seed=2, dtype=torch.float32)
    )
    x = randn(5, 8, seed=3, device=DEV)
    y0 = base(x)
    base[0], base[2] = LoRALinear(base[0], 4, 8.0), LoRALinear(base[2], 4, 8.0, seed=1000)
    assert isinstance(base[0], LoRALinear) and isinstance(base[2], LoRALinear)
    assert torch.equal(base(x), y0)
    assert torch.all(base[0].lora_A != 0) and torch.all(base[0].lora_B == 0)
    bound = 1 / math.sqrt(8)  # Kaiming-uniform a=√5 = nn.Linear's U(−1/√in, 1/√in)
    assert base[0].lora_A.abs().max() <= bound


def test_step0_grad_A_is_zero_and_grad_B_is_not():
    m = _lora(nonzero_B=False)
    x = randn(4, 7, seed=1, dtype=F64, device=DEV)
    (m(x) ** 2).sum().backward()
    assert torch.count_nonzero(m.lora_A.grad) == 0
    assert m.lora_B.grad.abs().max() > 1e-3


def test_frozen_base_gets_no_grad_but_input_grad_flows():
    m = _lora(nonzero_B=False)
    x = randn(4, 7, seed=1, dtype=F64, device=DEV, requires_grad=True)
    g = randn(4, 6, seed=2, dtype=F64, device=DEV)
    m(x).backward(g)
    assert not m.base.weight.requires_grad and m.base.weight.grad is None and m.base.bias.grad is None
    torch.testing.assert_close(x.grad, g @ m.base.weight, **TOL64)  # B = 0: only the base path


def test_frozen_base_saves_fewer_bytes_than_trainable():
    from helpers.memory import SavedTensors

    lin = _linear(32, 32, seed=1, dtype=torch.float32)
    x = randn(64, 32, seed=2, device=DEV, requires_grad=True)
    with SavedTensors(exclude=[lin.weight, lin.bias, x]) as trainable:
        h = torch.relu(x) * 1.0
        lin(h).sum()
    lin.requires_grad_(False)
    with SavedTensors(exclude=[lin.weight, lin.bias, x]) as frozen:
        h = torch.relu(x) * 1.0
        lin(h).sum()
    assert frozen.total_bytes < trainable.total_bytes


def test_frozen_lora_layer_saves_x_and_xA():
    """A frozen base + LoRA keeps x (for ∂L/∂A) and x Aᵀ (for ∂L/∂B): R·(in + r) elements."""
    from helpers.memory import SavedTensors

    m = _lora(d_in=32, d_out=16, r=4).to(torch.float32)
    x = randn(64, 32, seed=2, device=DEV, requires_grad=True)
    h = x * 1.0  # a non-leaf input, as inside a model
    with SavedTensors(exclude=[*m.parameters(), x]) as saved:
        m(h)
    assert saved.total_bytes == 4 * 64 * (32 + 4)  # parameters (W, A, B) excluded


def test_merge_unmerge_round_trip():
    m = _lora()
    x = randn(4, 7, seed=1, dtype=F64, device=DEV)
    W0 = m.base.weight.detach().clone()
    y = m(x)
    m.merge()
    assert m.merged and not torch.equal(m.base.weight, W0)
    torch.testing.assert_close(m(x), y, **TOL64)
    torch.testing.assert_close(m.base.weight, W0 + m.scale * m.lora_B @ m.lora_A, **TOL64)
    m.merge()  # no-op when already merged
    m.unmerge()
    assert not m.merged
    torch.testing.assert_close(m.base.weight, W0, **TOL64)
    torch.testing.assert_close(m(x), y, **TOL64)
    model = nn.Sequential(m)
    merge_lora(model)
    assert m.merged
    unmerge_lora(model)
    assert not m.merged


def test_dropout_on_lora_path_only():
    m = _lora(dropout=0.5)
    m.train()
    x = randn(8, 7, seed=1, dtype=F64, device=DEV, requires_grad=True)
    torch.manual_seed(123)
    y = m(x)
    torch.manual_seed(123)
    x_d = F.dropout(x.detach(), 0.5, training=True)
    base = m.base(x.detach())
    ref = base + m.scale * (x_d @ m.lora_A.detach().T) @ m.lora_B.detach().T
    torch.testing.assert_close(y, ref, **TOL64)
    assert not torch.allclose(y, m.base(x) + m.scale * (x @ m.lora_A.T) @ m.lora_B.T)  # dropout did act
    # the base path never sees dropout: with B = 0 the output is the base output exactly
    with torch.no_grad():
        m.lora_B.zero_()
    assert torch.equal(m(x), m.base(x))
    # input gradient: W from the base path, plus the masked LoRA term
    with torch.no_grad():
        m.lora_B.copy_(randn(6, 3, seed=9, dtype=F64, device=DEV))
    torch.manual_seed(7)
    g = randn(8, 6, seed=2, dtype=F64, device=DEV)
    m(x).backward(g)
    torch.manual_seed(7)
    keep = (F.dropout(torch.ones_like(x), 0.5, training=True) != 0).to(F64)
    grad_ref = g @ m.base.weight + m.scale * ((g @ m.lora_B.detach()) @ m.lora_A.detach()) * keep / 0.5
    torch.testing.assert_close(x.grad, grad_ref, **TOL64)
    m.eval()  # no dropout in eval
    torch.testing.assert_close(m(x), m.base(x) + m.scale * (x @ m.lora_A.T) @ m.lora_B.T, **TOL64)


def test_bad_inputs_raise_one_line_value_errors():
    lin = _linear(7, 6)
    for r in (0, -1, 7, 2.0, True):
        with pytest.raises(ValueError, match=r"^r: expected an int in \[1, "):
            LoRALinear(lin, r, 1.0)
    with pytest.raises(ValueError, match="nn.Linear"):
        LoRALinear(nn.Conv1d(3, 3, 1), 1, 1.0)
    with pytest.raises(ValueError, match="dropout"):
        LoRALinear(lin, 2, 1.0, dropout=1.0)
    x = randn(2, 7, dtype=F64, device=DEV)
    W = randn(6, 7, dtype=F64, device=DEV)
    with pytest.raises(ValueError, match=r"A: expected shape \(2, 7\)"):
        lora_linear(
            x, W, None, randn(3, 7, dtype=F64, device=DEV), randn(6, 2, dtype=F64, device=DEV), 1.0, 2
        )
    with pytest.raises(ValueError, match=r"^r: expected an int in \[1, "):
        lora_linear(
            x, W, None, randn(9, 7, dtype=F64, device=DEV), randn(6, 9, dtype=F64, device=DEV), 1.0, 9
        )


def test_error_messages_are_one_line():
    with pytest.raises(ValueError) as e:
        LoRALinear(_linear(7, 6), 99, 1.0)
    assert "\n" not in str(e.value)


def _broken_backward_missing_scale(grad_y, x, W, A, B, xA, scale, needs=(True,) * 7, x_lora=None):
    """The plausible mistake: forget α/r in grad_A and grad_B (the forward has it)."""
    return lora_linear_backward(grad_y, x, W, A, B, xA, 1.0, needs, x_lora)


def test_broken_backward_is_caught(monkeypatch):
    monkeypatch.setattr(hl, "lora_linear_backward", _broken_backward_missing_scale)
    x = randn(3, 5, seed=1, dtype=F64, device=DEV, requires_grad=True)
    A = randn(2, 5, seed=4, dtype=F64, device=DEV, requires_grad=True)
    B = randn(4, 2, seed=5, dtype=F64, device=DEV, requires_grad=True)
    W = randn(4, 5, seed=2, dtype=F64, device=DEV)
    assert not gradcheck(
        lambda x, A, B: lora_linear(x, W, None, A, B, 3.0, 2), (x, A, B), raise_exception=False
    )
    with pytest.raises(AssertionError):
        test_forward_and_every_gradient_match_plain_autograd_on_W_prime_float64(CONFIGS[0], (4,))


def test_scales():
    assert lora_scale(16, 4) == 4.0 and lora_scale(16, 4, rslora=True) == 8.0
    assert _lora(r=3, alpha=6.0).scale == 2.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.gpu
def test_cuda_float32_matches_cpu():
    """float32 on the GPU with TF32 off equals the CPU to float32 round-off, output and grads."""
    from helpers.device import no_tf32

    no_tf32()
    m_cpu = _lora(d_in=64, d_out=48, r=4).to(device="cpu", dtype=torch.float32)
    m_gpu = _lora(d_in=64, d_out=48, r=4).to(device="cuda", dtype=torch.float32)
    m_gpu.load_state_dict(m_cpu.state_dict())
    x = randn(32, 64, seed=1)
    outs = []
    for m, xd in ((m_cpu, x.clone()), (m_gpu, x.cuda())):
        xd.requires_grad_(True)
        y = m(xd)
        y.pow(2).sum().backward()
        outs.append([t.detach().cpu() for t in (y, xd.grad, m.lora_A.grad, m.lora_B.grad)])
    for a, b in zip(*outs):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
