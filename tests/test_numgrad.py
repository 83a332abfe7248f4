import pytest
import torch

from helpers.device import randn
from helpers.numgrad import (
    autograd_jacobian,
    fd_errors,
    linear_backward,
    linear_forward,
    numerical_grad,
    numerical_jacobian,
    unbroadcast,
    vjp,
)

F64 = torch.float64


def test_numerical_grad_matches_autograd_for_several_inputs():
    a = randn(3, 2, seed=1, dtype=F64, requires_grad=True)
    b = randn(2, seed=2, dtype=F64, requires_grad=True)

    def f(a, b):
        return (torch.tanh(a @ b) ** 2).sum()

    ga, gb = numerical_grad(f, a, b)
    ra, rb = torch.autograd.grad(f(a, b), [a, b])
    assert torch.allclose(ga, ra, atol=1e-8) and torch.allclose(gb, rb, atol=1e-8)
    assert a.grad is None and torch.equal(a, a.detach())  # inputs untouched


def test_numerical_grad_rejects_non_scalar_and_non_tensor():
    with pytest.raises(ValueError):
        numerical_grad(lambda x: x * 2, torch.ones(3, dtype=F64))
    with pytest.raises(ValueError):
        numerical_grad(lambda x: x, [1.0])


def test_jacobians_agree_and_vjp_is_v_times_J():
    W = randn(3, 4, seed=3, dtype=F64)

    def f(x):
        return torch.sin(W @ x)  # (3, 4) @ (4,) -> (3,)

    x = randn(4, seed=4, dtype=F64)
    J_num = numerical_jacobian(f, x)
    J_auto = autograd_jacobian(f, x)
    J_exact = torch.cos(W @ x)[:, None] * W  # diag(cos(Wx)) W
    assert J_num.shape == (3, 4)
    assert torch.allclose(J_auto, J_exact, atol=1e-12)
    assert torch.allclose(J_num, J_exact, atol=1e-8)
    v = randn(3, seed=5, dtype=F64)
    assert torch.allclose(vjp(f, x, v), v @ J_exact, atol=1e-12)
    with pytest.raises(ValueError):
        vjp(f, x, torch.ones(4, dtype=F64))


def test_linear_backward_matches_autograd_in_nn_linear_layout():
    X = randn(5, 3, seed=6, dtype=F64, requires_grad=True)
    W = randn(4, 3, seed=7, dtype=F64, requires_grad=True)
    b = randn(4, seed=8, dtype=F64, requires_grad=True)
    Y = linear_forward(X, W, b)
    assert torch.allclose(Y, torch.nn.functional.linear(X, W, b), atol=1e-14)
    grad_Y = randn(5, 4, seed=9, dtype=F64)
    ref = torch.autograd.grad(Y, [X, W, b], grad_outputs=grad_Y)
    ours = linear_backward(X.detach(), W.detach(), grad_Y)
    for name, o, r in zip(("X", "W", "b"), ours, ref):
        assert o.shape == r.shape, name
        assert torch.allclose(o, r, atol=1e-12), name


def test_linear_backward_leading_dims_and_needs():
    """(..., in) inputs count every leading index as a row; a gradient not needed is None, its input may be."""
    X = randn(2, 3, 4, seed=20, dtype=F64, requires_grad=True)
    W = randn(5, 4, seed=21, dtype=F64, requires_grad=True)
    b = randn(5, seed=22, dtype=F64, requires_grad=True)
    grad_Y = randn(2, 3, 5, seed=23, dtype=F64)
    ref = torch.autograd.grad(torch.nn.functional.linear(X, W, b), [X, W, b], grad_outputs=grad_Y)
    ours = linear_backward(X.detach(), W.detach(), grad_Y)
    for o, r in zip(ours, ref):
        assert torch.allclose(o, r, atol=1e-12)
    gX, gW, gb = linear_backward(None, W.detach(), grad_Y, needs=(True, False, False))
    assert torch.allclose(gX, ref[0], atol=1e-12) and gW is None and gb is None
    gX, gW, gb = linear_backward(X.detach(), None, grad_Y, needs=(False, True))  # no bias: two flags
    assert gX is None and torch.allclose(gW, ref[1], atol=1e-12) and gb is None


def test_linear_backward_rejects_transposed_weight():
    X, W = torch.ones(5, 3), torch.ones(3, 4)  # (in, out): the seed-000 layout mistake
    with pytest.raises(ValueError, match="W \\(out, in\\)"):
        linear_backward(X, W, torch.ones(5, 4))
    with pytest.raises(ValueError, match="same rows"):
        linear_backward(torch.ones(5, 3), torch.ones(4, 3), torch.ones(6, 4))
    with pytest.raises(ValueError):
        linear_forward(X, W)


@pytest.mark.parametrize("shape", [(4,), (1, 4), (3, 1), (1, 1), (2, 3, 4), (3, 4), ()])
def test_unbroadcast_matches_autograd(shape):
    # helpers.device.randn() takes no empty shape, so draw one number and reshape
    b = randn(1, seed=10, dtype=F64).reshape(shape) if shape == () else randn(*shape, seed=10, dtype=F64)
    b.requires_grad_(True)
    X = randn(2, 3, 4, seed=11, dtype=F64)
    Y = X * b  # b broadcast to (2, 3, 4)
    G = randn(2, 3, 4, seed=12, dtype=F64)
    (ref,) = torch.autograd.grad(Y, b, grad_outputs=G)
    ours = unbroadcast(G * X, shape)
    assert ours.shape == ref.shape
    assert torch.allclose(ours, ref, atol=1e-12)


def test_unbroadcast_rejects_incompatible_shape():
    with pytest.raises(ValueError):
        unbroadcast(torch.ones(3, 4), (2, 4))
    with pytest.raises(ValueError):
        unbroadcast(torch.ones(4), (1, 1, 4))


def test_fd_errors_show_truncation_then_round_off():
    def f(x):
        return x * x * x  # f'(x) = 3x², truncation error of the central difference is h²

    def df(x):
        return 3 * x * x

    hs = [10.0**-k for k in range(1, 13)]
    e64 = fd_errors(f, df, 1.0, hs, torch.float64)
    e32 = fd_errors(f, df, 1.0, hs, torch.float32)
    assert abs(e64[0] - 1e-2) < 1e-12 and abs(e64[2] - 1e-6) < 1e-12  # pure h² at large h
    assert min(e64) < 1e-9 and e64[-1] > 100 * min(e64)  # round-off wins for tiny h
    assert min(e32) > 1e3 * min(e64)  # float32 cannot get close
    assert hs[e32.index(min(e32))] > hs[e64.index(min(e64))]  # and wants a larger h


def test_numerical_grad_and_jacobian_accept_non_contiguous_inputs():
    base = randn(3, 4, seed=13, dtype=F64)
    xt = base.t()  # (4, 3), strides (1, 4): not contiguous
    assert not xt.is_contiguous() and not xt.clone().is_contiguous()  # plain clone() keeps the strides
    xs = base[:, ::2]  # (3, 2), a strided slice
    W = randn(3, 2, seed=14, dtype=F64)

    def f(a, b):
        return (torch.sin(a) @ W).sum() + (b**3).sum()  # (4, 3) @ (3, 2) -> (4, 2)

    ga, gb = numerical_grad(f, xt, xs)
    ra, rb = torch.cos(xt) * W.sum(1), 3 * xs**2  # ∂f/∂a_ik = cos(a_ik) Σ_j W_kj, ∂f/∂b = 3b²
    assert ga.shape == xt.shape and gb.shape == xs.shape
    assert torch.allclose(ga, ra, atol=1e-8) and torch.allclose(gb, rb, atol=1e-8)
    assert torch.equal(xt, base.t())  # the caller's tensor is untouched

    J = numerical_jacobian(torch.sin, xt)
    assert J.shape == (12, 12)
    assert torch.allclose(J, torch.diag(torch.cos(xt).reshape(-1)), atol=1e-8)  # (4, 3) -> (12,)


def test_linear_backward_called_in_another_order_names_the_right_one():
    """(grad_Y, X, W), lab 2's old order, is one line that says which order the course uses."""
    X, W, grad_Y = torch.ones(2, 5, 8), torch.ones(4, 8), torch.ones(2, 5, 4)
    with pytest.raises(ValueError) as e:
        linear_backward(grad_Y, X, W)
    assert str(e.value).startswith("linear_backward(X, W, grad_Y): expected W (out, in)")
    assert "\n" not in str(e.value)
