import torch

from helpers.cat_mlp import backward, cat_params, forward, sgd_step

SEED_004 = {  # the numbers printed in seed 004, digit for digit
    "h": [0.725, -0.15],
    "a": [0.725, 0.0],
    "y_hat": [0.5625],
    "L": 0.19140625,
    "grad_y_hat": [-0.875],
    "W2": [[-0.634375, 0.0]],
    "b2": [-0.875],
    "a_grad": [-0.4375, 0.35],
    "h_grad": [-0.4375, 0.0],
    "W1": [[-0.4375, -0.875, 0.4375, -0.21875], [0, 0, 0, 0]],
    "b1": [-0.4375, 0.0],
}


def _close(t, ref):
    return torch.allclose(t, torch.tensor(ref, dtype=t.dtype), atol=1e-12, rtol=0)


def test_forward_matches_seed():
    p = cat_params()
    c = forward(**p)
    assert _close(c["h"], SEED_004["h"]) and _close(c["a"], SEED_004["a"])
    assert _close(c["y_hat"], SEED_004["y_hat"]) and _close(c["L"], SEED_004["L"])


def test_backward_matches_seed_and_autograd():
    p = cat_params(requires_grad=True)
    c = forward(**p)
    g = backward(c, p["W2"], p["y_true"])
    assert _close(g["y_hat"], SEED_004["grad_y_hat"]) and _close(g["W2"], SEED_004["W2"])
    assert _close(g["a"], SEED_004["a_grad"]) and _close(g["h"], SEED_004["h_grad"])
    assert _close(g["W1"], SEED_004["W1"]) and _close(g["b1"], SEED_004["b1"])
    c["L"].backward()
    for name in ("W1", "b1", "W2", "b2"):
        assert torch.allclose(g[name], p[name].grad, atol=1e-14), name


def test_backward_on_random_weights_float32_matches_autograd():
    torch.manual_seed(0)
    p = cat_params(dtype=torch.float32)
    for k in ("W1", "b1", "W2", "b2"):
        p[k] = torch.randn_like(p[k]).requires_grad_()
    c = forward(**p)
    g = backward(c, p["W2"], p["y_true"])
    c["L"].backward()
    for k in ("W1", "b1", "W2", "b2"):
        assert torch.allclose(g[k], p[k].grad, atol=1e-6), k


def test_dead_relu_row_gets_no_gradient_and_sgd_lowers_loss():
    p = cat_params()
    c = forward(**p)
    g = backward(c, p["W2"], p["y_true"])
    assert torch.count_nonzero(g["W1"][1]) == 0
    p2 = sgd_step(p, g, lr=0.1)
    assert forward(**p2)["L"] < c["L"]
    assert torch.equal(p2["W1"][1], p["W1"][1])  # the dead row did not move
