"""The "cat" MLP of chapter 1 (seed 004): x (4,) -> Linear -> ReLU -> Linear -> MSE.

Shapes follow the seed: W1 (2, 4), b1 (2,), W2 (1, 2), b2 (1,), so h = W1 @ x + b1.
Every gradient here is written by hand; tests check them against autograd.
"""

from __future__ import annotations

import torch

__all__ = ["cat_params", "forward", "backward", "sgd_step", "PARAM_NAMES"]

PARAM_NAMES = ("W1", "b1", "W2", "b2")

_CAT = {
    "x": [1.0, 2.0, -1.0, 0.5],
    "W1": [[0.1, 0.2, -0.1, 0.05], [0.3, -0.1, 0.2, 0.1]],
    "b1": [0.1, -0.1],
    "W2": [[0.5, -0.4]],
    "b2": [0.2],
    "y_true": [1.0],
}


def cat_params(dtype=torch.float64, device=None, requires_grad: bool = False) -> dict:
    """The seed's numbers as tensors: x, W1, b1, W2, b2, y_true (parameters may require grad)."""
    out = {}
    for name, value in _CAT.items():
        t = torch.tensor(value, dtype=dtype, device=device)
        out[name] = t.requires_grad_(requires_grad and name in PARAM_NAMES)
    return out


def forward(x, W1, b1, W2, b2, y_true) -> dict:
    """h = W1 x + b1, a = relu(h), ŷ = W2 a + b2, L = Σ(ŷ - y)²; returns every intermediate."""
    h = W1 @ x + b1  # (2, 4) @ (4,) -> (2,)
    a = torch.relu(h)  # (2,)
    y_hat = W2 @ a + b2  # (1, 2) @ (2,) -> (1,)
    L = ((y_hat - y_true) ** 2).sum()  # ()
    return {"x": x, "h": h, "a": a, "y_hat": y_hat, "L": L}


def backward(cache: dict, W2, y_true) -> dict:
    """Chain rule from L back to W1: every grad_<name> = ∂L/∂<name>, no autograd."""
    x, h, a, y_hat = cache["x"], cache["h"], cache["a"], cache["y_hat"]
    grad_y_hat = 2 * (y_hat - y_true)  # (1,)     dL/dŷ = 2(ŷ - y)
    grad_W2 = torch.outer(grad_y_hat, a)  # (1,) ⊗ (2,) -> (1, 2)
    grad_b2 = grad_y_hat  # (1,)
    grad_a = W2.T @ grad_y_hat  # (2, 1) @ (1,) -> (2,)
    grad_h = grad_a * (h > 0).to(h.dtype)  # (2,)     ReLU' is 1 where h > 0, else 0
    grad_W1 = torch.outer(grad_h, x)  # (2,) ⊗ (4,) -> (2, 4)
    grad_b1 = grad_h  # (2,)
    return {
        "y_hat": grad_y_hat,
        "W2": grad_W2,
        "b2": grad_b2,
        "a": grad_a,
        "h": grad_h,
        "W1": grad_W1,
        "b1": grad_b1,
    }


def sgd_step(params: dict, grads: dict, lr: float) -> dict:
    """θ ← θ - lr · ∂L/∂θ for W1, b1, W2, b2; returns new tensors, leaves inputs untouched."""
    new = dict(params)
    for name in PARAM_NAMES:
        new[name] = (params[name] - lr * grads[name]).detach()
    return new
