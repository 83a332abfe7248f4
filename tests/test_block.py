"""helpers.block: one encoder block's manual backward against autograd on nn.TransformerEncoderLayer."""

import pytest
import torch
from torch import nn

import helpers.block as block_mod
from helpers.block import (
    BLOCK_PARAM_NAMES,
    block_cache_bytes,
    block_forward,
    block_manual_backward,
    block_params,
    block_saved_bytes_formula,
    block_saved_table,
    layer_from_params,
    params_from_layer,
    residual_backward,
)
from helpers.checks import compare
from helpers.device import randn
from helpers.memory import SavedTensors

F64, F32 = torch.float64, torch.float32
# float64: both sides do the same sums in a different order -> agreement to ~1e-14; 1e-10 is the bar.
TOL64 = dict(atol=1e-10, rtol=0.0)
# float32: eps = 1.2e-7; a weight gradient sums B·N products and LayerNorm divides by σ, so a few
# hundred ulps of values up to ~10 -> atol 5e-5 with rtol 1e-4.
TOL32 = dict(atol=5e-5, rtol=1e-4)
NAMES = ("X", *BLOCK_PARAM_NAMES)


def autograd_reference(params, H, norm_first, activation, causal, X, grad_Y):
    """Y and every gradient from nn.TransformerEncoderLayer with the same weights."""
    layer = layer_from_params(params, H, norm_first, activation)
    X = X.detach().clone().requires_grad_(True)
    N = X.shape[1]
    mask = nn.Transformer.generate_square_subsequent_mask(N, dtype=X.dtype) if causal else None
    Y = layer(X, src_mask=mask, is_causal=causal)
    grads = torch.autograd.grad(Y, [X, *(layer.get_parameter(n) for n in BLOCK_PARAM_NAMES)], grad_Y)
    return Y.detach(), dict(zip(NAMES, grads))


def setup(dtype, B=2, N=6, d=8, H=2, d_ff=12, seed=0):
    params = block_params(d, d_ff, seed=seed, dtype=dtype)
    X = randn(B, N, d, seed=seed + 50, dtype=dtype)
    grad_Y = randn(B, N, d, seed=seed + 51, dtype=dtype)
    return params, X, grad_Y


def all_match(ours: dict, ref: dict, tol) -> bool:
    return all(compare(n, ours[n], ref[n], quiet=True, **tol) for n in NAMES)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_block_backward_float64_every_parameter(norm_first, activation, causal):
    params, X, grad_Y = setup(F64)
    Y_ref, ref = autograd_reference(params, 2, norm_first, activation, causal, X, grad_Y)
    Y, cache = block_forward(X, params, 2, norm_first, causal, activation)
    ours = block_manual_backward(grad_Y, cache)
    assert set(ours) == set(NAMES)
    assert compare("Y", Y, Y_ref, quiet=True, **TOL64)
    for n in NAMES:
        assert compare(n, ours[n], ref[n], quiet=True, **TOL64), n


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_block_backward_float32_causal(norm_first, activation):
    params, X, grad_Y = setup(F32, B=2, N=16, d=32, H=4, d_ff=64, seed=3)
    Y_ref, ref = autograd_reference(params, 4, norm_first, activation, True, X, grad_Y)
    Y, cache = block_forward(X, params, 4, norm_first, True, activation)
    ours = block_manual_backward(grad_Y, cache)
    assert compare("Y", Y, Y_ref, quiet=True, **TOL32)
    for n in NAMES:
        assert compare(n, ours[n], ref[n], quiet=True, **TOL32), n


def test_params_from_layer_round_trip():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=True)
    params = params_from_layer(layer)
    assert tuple(params) == BLOCK_PARAM_NAMES
    assert tuple(n for n, _ in layer.named_parameters()) == BLOCK_PARAM_NAMES
    assert all(not t.requires_grad for t in params.values())
    again = params_from_layer(layer_from_params(params, 2, False))
    assert all(torch.equal(params[n], again[n]) for n in BLOCK_PARAM_NAMES)


def test_runs_without_autograd_under_no_grad():
    params, X, grad_Y = setup(F64)
    params = {n: t.requires_grad_(True) for n, t in params.items()}  # even if the weights require grad
    _, ref = autograd_reference({n: t.detach() for n, t in params.items()}, 2, True, "gelu", True, X, grad_Y)
    with torch.no_grad():
        Y, cache = block_forward(X, params, 2, True, True, "gelu")
        ours = block_manual_backward(grad_Y, cache)
    assert Y.grad_fn is None and all(g.grad_fn is None and not g.requires_grad for g in ours.values())
    assert all_match(ours, ref, TOL64)
    # and outside no_grad it still builds no graph
    Y, cache = block_forward(X, params, 2, True, True, "gelu")
    assert Y.grad_fn is None and block_manual_backward(grad_Y, cache)["X"].grad_fn is None


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
def test_without_residual_matches_autograd(norm_first):
    params, X, grad_Y = setup(F64)
    layer = layer_from_params(params, 2, norm_first, "relu")
    Xr = X.clone().requires_grad_(True)
    if norm_first:  # the same sub-blocks as nn.TransformerEncoderLayer.forward, without "x +"
        X1 = layer._sa_block(layer.norm1(Xr), None, None)
        Y_ref = layer._ff_block(layer.norm2(X1))
    else:
        X1 = layer.norm1(layer._sa_block(Xr, None, None))
        Y_ref = layer.norm2(layer._ff_block(X1))
    ref = dict(
        zip(
            NAMES,
            torch.autograd.grad(Y_ref, [Xr, *(layer.get_parameter(n) for n in BLOCK_PARAM_NAMES)], grad_Y),
        )
    )
    Y, cache = block_forward(X, params, 2, norm_first, residual=False)
    assert compare("Y", Y, Y_ref, quiet=True, **TOL64)
    assert all_match(block_manual_backward(grad_Y, cache), ref, TOL64)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
def test_broken_residual_backward_fails(norm_first, monkeypatch):
    """Forgetting the skip path's copy of the gradient must be caught."""
    params, X, grad_Y = setup(F64)
    _, ref = autograd_reference(params, 2, norm_first, "relu", False, X, grad_Y)
    Y, cache = block_forward(X, params, 2, norm_first)
    assert all_match(block_manual_backward(grad_Y, cache), ref, TOL64)
    monkeypatch.setattr(block_mod, "residual_backward", lambda grad_y, grad_branch: grad_branch)
    broken = block_manual_backward(grad_Y, cache)
    assert not compare("X", broken["X"], ref["X"], quiet=True, **TOL64)


def test_broken_layernorm_backward_fails(monkeypatch, broken_layernorm_backward):
    """A LayerNorm backward without the mean path (a classic slip) must be caught."""
    params, X, grad_Y = setup(F64)
    _, ref = autograd_reference(params, 2, True, "relu", True, X, grad_Y)
    monkeypatch.setattr(block_mod, "layernorm_backward", broken_layernorm_backward)
    Y, cache = block_forward(X, params, 2, True, True)
    assert not all_match(block_manual_backward(grad_Y, cache), ref, TOL64)


def test_residual_backward_adds_both_paths():
    g, b = torch.tensor([1.0, 2.0]), torch.tensor([0.5, -1.0])
    assert torch.equal(residual_backward(g, b), torch.tensor([1.5, 1.0]))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post", "pre"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_cache_bytes_equal_formula_and_not_above_autograd(norm_first, activation):
    B, N, d, H, d_ff = 2, 16, 32, 4, 64
    params, X, _ = setup(F32, B, N, d, H, d_ff)
    _, cache = block_forward(X, params, H, norm_first, True, activation)
    ours = block_cache_bytes(cache)
    assert ours == block_saved_bytes_formula(B, N, d, H, d_ff, 4, norm_first)
    layer = layer_from_params(params, H, norm_first, activation)
    Xr = X.clone().requires_grad_(True)
    with SavedTensors(exclude=[Xr, *layer.parameters()]) as saved:
        layer(Xr, src_mask=nn.Transformer.generate_square_subsequent_mask(N), is_causal=True)
    assert ours <= saved.total_bytes


def test_saved_table_covers_every_sub_layer():
    for norm_first in (False, True):
        rows = block_saved_table(norm_first, "gelu")
        assert [r[0] for r in rows].count("norm1") == 1 and len(rows) == 8
        assert all(len(r) == 4 for r in rows)


def test_bad_input_raises_one_line_value_error():
    params, X, grad_Y = setup(F64)
    with pytest.raises(ValueError, match="H: expected a divisor of d=8"):
        block_forward(X, params, 3, True)
    with pytest.raises(ValueError, match="H: expected an int"):
        block_forward(X, params, 2.0, True)
    with pytest.raises(ValueError, match="floating-point"):
        block_forward(X.long(), params, 2, True)
    with pytest.raises(ValueError, match="activation"):
        block_forward(X, params, 2, True, activation="tanh")
    with pytest.raises(ValueError, match="missing"):
        block_forward(X, {k: v for k, v in params.items() if k != "linear1.bias"}, 2, True)
    with pytest.raises(ValueError, match=r"\(B, N, d\)"):
        block_forward(X[0], params, 2, True)
    _, cache = block_forward(X, params, 2, True)
    with pytest.raises(ValueError, match="shape"):
        block_manual_backward(grad_Y[:, :3], cache)
    with pytest.raises(ValueError, match="bytes: expected an int ≥ 1"):
        block_saved_bytes_formula(1, 2, 3, 4, 5, 0, True)
    with pytest.raises(ValueError, match="d_ff: expected an int ≥ 1"):
        block_params(8, 0)


def test_param_shapes_are_the_layers_and_gpt_uses_them():
    """One owner for the block's parameter shapes: nn.TransformerEncoderLayer agrees, and so does the GPT."""
    from helpers.gpt import GPTConfig, gpt_param_shapes

    layer = nn.TransformerEncoderLayer(8, 2, 12, batch_first=True)
    shapes = block_mod.block_param_shapes(8, 12)
    assert list(shapes) == list(BLOCK_PARAM_NAMES)
    assert shapes == {n: tuple(p.shape) for n, p in layer.named_parameters()}
    gpt = gpt_param_shapes(GPTConfig(vocab_size=5, d_model=8, n_heads=2, n_layers=1, d_ff=12))
    assert {n: gpt[f"blocks.0.{n}"] for n in BLOCK_PARAM_NAMES} == shapes
