import pytest
import torch
import torch.utils.checkpoint as tuc
from torch import nn

import helpers.checkpoint as hc
from helpers.checkpoint import (
    AutocastState,
    activation_bytes_formula,
    autocast_from,
    block_activation_bytes,
    checkpoint,
    checkpoint_module,
    checkpoint_sequential,
    get_autocast_state,
    get_rng_state,
    recompute_backward,
    set_rng_state,
)
from helpers.memory import SavedTensors

F64 = torch.float64
B, N, d, H, d_ff, L = 2, 12, 24, 3, 40, 3  # all different, so every shape in a record is unambiguous


def _stack(dropout=0.0, dtype=F64, activation="gelu", n_layers=L, seed=0):
    torch.manual_seed(seed)
    return nn.ModuleList(
        nn.TransformerEncoderLayer(
            d, H, d_ff, dropout=dropout, activation=activation, batch_first=True, norm_first=True, dtype=dtype
        )
        for _ in range(n_layers)
    )


def _x(dtype=F64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, N, d, generator=g, dtype=F64).to(dtype).requires_grad_()


def _run(blocks, x, mode, preserve_rng_state=True):
    h = x
    for b in blocks:
        if mode == "none":
            h = b(h)
        elif mode == "ours":
            h = checkpoint_module(b, h, preserve_rng_state=preserve_rng_state)
        elif mode == "torch":
            h = tuc.checkpoint(b, h, use_reentrant=False, preserve_rng_state=preserve_rng_state)
    return h


def _grads(blocks, x, mode, seed=None, **kw):
    if seed is not None:
        torch.manual_seed(seed)
    y = _run(blocks, x, mode, **kw)
    L_ = (y * y).sum()
    return torch.autograd.grad(L_, [x, *blocks.parameters()])


def _max_diff(ga, gb):
    return max((a - b).abs().max().item() for a, b in zip(ga, gb))


# --------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("mode", ["ours", "torch"])
def test_same_gradients_with_and_without_checkpointing(mode):
    blocks, x = _stack(), _x()
    ref = _grads(blocks, x, "none")
    got = _grads(blocks, x, mode)
    assert len(got) == 1 + len(list(blocks.parameters()))
    assert all(g is not None for g in got)
    # float64, the same ops recomputed in the same order: exact in practice; 1e-12 is the bound we promise.
    assert _max_diff(got, ref) <= 1e-12


def test_ours_equals_torch_utils_checkpoint():
    blocks, x = _stack(), _x()
    assert _max_diff(_grads(blocks, x, "ours"), _grads(blocks, x, "torch")) <= 1e-12


def test_checkpoint_sequential_and_backward_accumulates_into_param_grad():
    blocks, x = _stack(), _x()
    ref = _grads(blocks, x, "none")
    y = checkpoint_sequential(blocks, x)
    (y * y).sum().backward()
    got = [x.grad, *(p.grad for p in blocks.parameters())]
    assert _max_diff(got, ref) <= 1e-12


def test_checkpoint_function_gradcheck():
    W = torch.randn(5, 4, dtype=F64, requires_grad=True)
    b = torch.randn(5, dtype=F64, requires_grad=True)
    x = torch.randn(3, 4, dtype=F64, requires_grad=True)

    def fn(x, W, b):
        return torch.tanh(x @ W.T + b)  # (3, 4) @ (4, 5) -> (3, 5)

    assert torch.autograd.gradcheck(lambda x, W, b: checkpoint(fn, x, W, b), (x, W, b))


def test_recompute_backward_plain_and_needs():
    W = torch.randn(5, 4, dtype=F64)
    x = torch.randn(3, 4, dtype=F64)
    g = torch.randn(3, 5, dtype=F64)
    grad_x, (grad_W,) = recompute_backward(lambda x, W: x @ W.T, x, [W], g)
    torch.testing.assert_close(grad_x, g @ W)
    torch.testing.assert_close(grad_W, g.T @ x)
    grad_x, (grad_W,) = recompute_backward(lambda x, W: x @ W.T, x, [W], g, needs=(False, True))
    assert grad_x is None and grad_W is not None


def test_needs_input_grad_gating_frozen_params():
    blocks, x = _stack(n_layers=1), _x()
    for name, p in blocks.named_parameters():
        p.requires_grad_("linear" in name)
    y = checkpoint_module(blocks[0], x)
    (y * y).sum().backward()
    for name, p in blocks.named_parameters():
        assert (p.grad is not None) == ("linear" in name)
    assert x.grad is not None


def test_needs_input_grad_gating_skips_data_input():
    W = torch.randn(2, 5, dtype=F64, requires_grad=True)
    x = torch.randn(4, 5, dtype=F64)  # data: no gradient wanted
    seen = []

    def fn(x, W):
        seen.append(x.requires_grad)
        return torch.sin(x @ W.T)  # (4, 5) @ (5, 2) -> (4, 2)

    (grad_W,) = torch.autograd.grad(checkpoint(fn, x, W).sum(), [W])
    assert seen == [False, False]  # forward and re-run: x never made a leaf
    torch.testing.assert_close(grad_W, (torch.cos(x @ W.T)).T @ x)


# --------------------------------------------------------------------------- autocast


def _autocast_grads(mode, dtype=torch.bfloat16):
    blocks, x = _stack(n_layers=2, dtype=torch.float32), _x(torch.float32)
    with torch.autocast("cpu", dtype=dtype):
        y = _run(blocks, x, mode)  # float32 out (the residual), bf16 matmuls inside
        L_ = (y.float() ** 2).sum()
    return torch.autograd.grad(L_, [x, *blocks.parameters()])


@pytest.mark.parametrize("mode", ["ours", "torch"])
def test_autocast_bf16_same_gradients_as_no_checkpointing(mode):
    ref = _autocast_grads("none")
    got = _autocast_grads(mode)
    # The re-run repeats the forward's bf16 ops in the same order: identical, not just close.
    assert _max_diff(got, ref) == 0.0


def test_recompute_outside_autocast_is_caught(monkeypatch):
    ref = _autocast_grads("none")
    # The bug being guarded against: the re-run in backward forgets the caller's autocast and
    # recomputes in float32, so its graph is not the one that produced the output.
    monkeypatch.setattr(hc, "get_autocast_state", lambda: AutocastState())
    broken = _autocast_grads("ours")
    assert _max_diff(broken, ref) > 1e-3


def test_autocast_state_roundtrip_and_bad_input():
    assert get_autocast_state().devices[0][:2] == ("cpu", False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        s = get_autocast_state()
    assert s.devices[0] == ("cpu", True, torch.bfloat16)
    with autocast_from(s):
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")
    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        autocast_from(AutocastState((("cpu", False, torch.bfloat16),))),
    ):
        assert not torch.is_autocast_enabled("cpu")  # a disabled forward stays disabled in the re-run
    with pytest.raises(ValueError):
        with autocast_from("bf16"):
            pass


# --------------------------------------------------------------------------- saved bytes


def test_checkpoint_saves_only_block_inputs():
    blocks, x = _stack(dtype=torch.float32), _x(torch.float32)
    params = list(blocks.parameters())
    with SavedTensors(exclude=params, by_op=True) as saved:
        _run(blocks, x, "ours")
    assert saved.count == L  # one input per block, x included
    assert saved.total_bytes == L * B * N * d * 4
    assert all(r["shape"] == (B, N, d) for r in saved.records if r["counted"])


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_formula_matches_measured_stack(activation):
    blocks, x = _stack(dtype=torch.float32, activation=activation), _x(torch.float32)
    with SavedTensors(exclude=list(blocks.parameters())) as saved:
        _run(blocks, x, "none")
    # x is each block's LN1 input; counted here because only the parameters are excluded.
    assert saved.total_bytes == activation_bytes_formula(B, N, d, H, L, d_ff, 4, activation=activation)


def test_formula_math_attention_has_the_n2_term():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    blocks, x = _stack(dtype=torch.float32), _x(torch.float32)
    with sdpa_kernel(SDPBackend.MATH), SavedTensors(exclude=list(blocks.parameters())) as saved:
        _run(blocks, x, "none")
    assert saved.total_bytes == activation_bytes_formula(B, N, d, H, L, d_ff, 4, attention="math")
    extra = block_activation_bytes(B, 2 * N, d, H, d_ff, 4, "math") - 2 * block_activation_bytes(
        B, N, d, H, d_ff, 4, "math"
    )
    assert extra == B * H * N * N * 4 * 2  # the H·N-per-token term is quadratic in N


def test_formula_with_tinygpt_head():
    gpt = pytest.importorskip("helpers.gpt")
    cfg = gpt.GPTConfig(vocab_size=17, n_ctx=16, d_model=d, n_heads=H, n_layers=2, d_ff=d_ff)
    model = gpt.TinyGPT(cfg)
    idx = torch.randint(0, 17, (B, N), generator=torch.Generator().manual_seed(0))
    with SavedTensors(exclude=list(model.parameters())) as saved:
        model(idx)
    assert saved.total_bytes == activation_bytes_formula(B, N, d, H, 2, d_ff, 4, head=True)


def test_formula_rejects_bad_input():
    with pytest.raises(ValueError):
        activation_bytes_formula(B, N, d, H, 0, d_ff, 4)
    with pytest.raises(ValueError):
        block_activation_bytes(B, N, d, H, d_ff, 4, attention="flash")


# --------------------------------------------------------------------------- RNG


def test_dropout_same_grads_with_rng_restore():
    blocks, x = _stack(dropout=0.3), _x()
    ref = _grads(blocks, x, "none", seed=123)
    got = _grads(blocks, x, "ours", seed=123)
    assert _max_diff(got, ref) <= 1e-12
    assert _max_diff(_grads(blocks, x, "torch", seed=123), ref) <= 1e-12


def test_dropout_without_rng_restore_differs():
    blocks, x = _stack(dropout=0.3), _x()
    ref = _grads(blocks, x, "none", seed=123)
    broken = _grads(blocks, x, "ours", seed=123, preserve_rng_state=False)
    assert _max_diff(broken, ref) > 1e-3  # another mask in backward: wrong gradients


def test_checkpoint_leaves_the_outer_rng_stream_alone():
    blocks, x = _stack(dropout=0.3), _x()
    torch.manual_seed(7)
    _grads(blocks, x, "none")
    after_ref = torch.rand(3)
    torch.manual_seed(7)
    _grads(blocks, x, "ours")
    torch.testing.assert_close(torch.rand(3), after_ref, rtol=0, atol=0)


def test_rng_state_roundtrip_and_bad_input():
    s = get_rng_state()
    a = torch.rand(4)
    set_rng_state(s)
    assert torch.equal(torch.rand(4), a)
    with pytest.raises(ValueError):
        set_rng_state("not a state")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_dropout_rng_restored():
    blocks, x = _stack(dropout=0.3, dtype=torch.float32), _x(torch.float32)
    blocks, x = blocks.cuda(), x.detach().cuda().requires_grad_()
    state = get_rng_state([x])
    assert [i for i, _ in state.cuda] == [x.device.index or 0]
    ref = _grads(blocks, x, "none", seed=123)
    got = _grads(blocks, x, "ours", seed=123)
    assert _max_diff(got, ref) == 0.0  # same CUDA mask drawn twice
    assert _max_diff(_grads(blocks, x, "ours", seed=123, preserve_rng_state=False), ref) > 1e-3
    torch.manual_seed(7)
    _grads(blocks, x, "none")
    after_ref = torch.rand(3, device="cuda")
    torch.manual_seed(7)
    _grads(blocks, x, "ours")
    assert torch.equal(torch.rand(3, device="cuda"), after_ref)  # the CUDA stream is left alone


# --------------------------------------------------------------------------- broken checkpoints fail


class _ClosureCheckpoint(torch.autograd.Function):
    """Deliberately broken: the block's weights are captured in fn, not inputs, so they get no gradients."""

    @staticmethod
    def forward(fn, x):
        with torch.no_grad():
            return fn(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.fn = inputs[0]
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        x_ = x.detach().requires_grad_()
        with torch.enable_grad():
            y = ctx.fn(x_)
        return None, torch.autograd.grad(y, x_, grad_y)[0]


def test_broken_checkpoint_without_param_inputs_loses_param_grads():
    blocks, x = _stack(n_layers=1), _x()
    y = _ClosureCheckpoint.apply(blocks[0], x)
    (y * y).sum().backward()
    assert x.grad is not None
    assert all(p.grad is None for p in blocks.parameters())  # silently missing: what our design prevents


def test_broken_checkpoint_without_rng_restore_is_caught_by_grad_check():
    blocks, x = _stack(dropout=0.3), _x()
    ref = _grads(blocks, x, "none", seed=5)
    with pytest.raises(AssertionError):
        assert _max_diff(_grads(blocks, x, "ours", seed=5, preserve_rng_state=False), ref) <= 1e-12


def test_checkpoint_rejects_bad_input():
    with pytest.raises(ValueError):
        checkpoint(lambda x: x, [1.0, 2.0])
    with pytest.raises(ValueError):
        checkpoint("not callable", torch.ones(2))
    with pytest.raises(ValueError):
        checkpoint_module(lambda x: x, torch.ones(2))
    with pytest.raises(ValueError):
        checkpoint_sequential([nn.Linear(2, 2), "x"], torch.ones(2))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the old per-device functions, on purpose
def test_autocast_state_on_torch_before_2_4(monkeypatch):
    """torch < 2.4 has no device-type argument: the per-device functions are used instead."""
    import helpers.checkpoint as hc

    real = torch.is_autocast_enabled

    def old_is_enabled(*args):
        if args:
            raise TypeError("is_autocast_enabled() takes 0 positional arguments")
        return real("cuda") if torch.cuda.is_available() else False

    with torch.autocast("cpu", dtype=torch.bfloat16):  # entered first: autocast itself uses the new API
        with monkeypatch.context() as m:
            m.setattr(torch, "is_autocast_enabled", old_is_enabled)
            state = hc.get_autocast_state()
    assert ("cpu", True, torch.bfloat16) in state.devices
