"""Gradient checks of chapter 2: finite differences, Jacobians, VJPs, the linear layer.

``linear_backward`` is the one backward of ``y = x Wᵀ + b`` in the course: chapter 4's ``Linear``
Function, the block (chapter 7) and the GPT call it.

Everything here is plain math on tensors (no plotting).  Layouts follow ``nn.Linear``:
``Y = X @ W.T + b`` with ``X`` (B, in), ``W`` (out, in), ``b`` (out,), ``Y`` (B, out).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from helpers.checks import expect_tensor

__all__ = [
    "numerical_grad",
    "numerical_jacobian",
    "autograd_jacobian",
    "vjp",
    "linear_forward",
    "linear_backward",
    "unbroadcast",
    "fd_errors",
]


def numerical_grad(f: Callable[..., torch.Tensor], *inputs: torch.Tensor, h: float = 1e-6) -> tuple:
    """∂f/∂inputs[k][i] ≈ (f(.., x_i + h, ..) - f(.., x_i - h, ..)) / 2h for a scalar-valued f."""
    if not inputs:
        raise ValueError("numerical_grad: expected at least one input tensor")
    for k, x in enumerate(inputs):
        expect_tensor(f"inputs[{k}]", x)
    # contiguous copies: view(-1) below needs them (a transposed or sliced input is not),
    # and plain clone() keeps a dense input's strides.
    xs = [x.detach().clone(memory_format=torch.contiguous_format) for x in inputs]
    grads = []
    with torch.no_grad():
        for x in xs:
            g = torch.zeros_like(x)  # contiguous, like x
            flat, gflat = x.view(-1), g.view(-1)  # (*x.shape) -> (n,): views, writing flat[i] moves x itself
            for i in range(flat.numel()):
                old = flat[i].item()
                flat[i] = old + h
                f_plus = _scalar(f(*xs))
                flat[i] = old - h
                f_minus = _scalar(f(*xs))
                flat[i] = old
                gflat[i] = (f_plus - f_minus) / (2 * h)
            grads.append(g)
    return tuple(grads)


def _scalar(y) -> float:
    """The value of a one-element tensor (or number) as a Python float."""
    if isinstance(y, torch.Tensor):
        if y.numel() != 1:
            raise ValueError(f"numerical_grad: f must return one number, got shape {tuple(y.shape)}")
        return y.item()
    return float(y)


def numerical_jacobian(
    f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, h: float = 1e-6
) -> torch.Tensor:
    """J[i, j] ≈ (f(x + h e_j)_i - f(x - h e_j)_i) / 2h, flattened to (f(x).numel(), x.numel())."""
    expect_tensor("x", x)
    x = x.detach().clone(memory_format=torch.contiguous_format)  # contiguous, so view(-1) works
    flat = x.view(-1)  # (*x.shape) -> (n,): a view, writing flat[j] moves x
    cols = []
    with torch.no_grad():
        for j in range(flat.numel()):
            old = flat[j].item()
            flat[j] = old + h
            y_plus = f(x).reshape(-1).clone()  # (*y.shape) -> (m,)
            flat[j] = old - h
            y_minus = f(x).reshape(-1).clone()  # (*y.shape) -> (m,)
            flat[j] = old
            cols.append((y_plus - y_minus) / (2 * h))  # (m,)
    return torch.stack(cols, dim=1)  # (m, n)


def vjp(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """vᵀJ: what backward(gradient=v) computes, via torch.autograd.grad(f(x), x, grad_outputs=v)."""
    expect_tensor("x", x)
    x = x.detach().requires_grad_(True)
    y = f(x)
    expect_tensor("v", v, shape=y.shape)
    (g,) = torch.autograd.grad(y, x, grad_outputs=v)
    return g


def autograd_jacobian(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """J row by row: row i = e_iᵀJ, one VJP (one backward pass) per output, shape (m, n)."""
    expect_tensor("x", x)
    x = x.detach().requires_grad_(True)
    y = f(x)
    rows = []
    for i in range(y.numel()):
        e_i = torch.zeros(y.numel(), dtype=y.dtype, device=y.device)
        e_i[i] = 1.0
        (g,) = torch.autograd.grad(
            y, x, grad_outputs=e_i.view_as(y), retain_graph=True
        )  # e_i: (m,) -> y.shape
        rows.append(g.reshape(-1))  # x.shape -> (n,)
    return torch.stack(rows, dim=0)  # (m, n)


def linear_forward(X: torch.Tensor, W: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """Y = X Wᵀ + b in nn.Linear's layout: X (B, in), W (out, in), b (out,) -> Y (B, out)."""
    expect_tensor("X", X)
    expect_tensor("W", W)
    if X.dim() != 2 or W.dim() != 2 or X.shape[1] != W.shape[1]:
        raise ValueError(
            f"linear_forward: expected X (B, in) and W (out, in), got {tuple(X.shape)} and {tuple(W.shape)}"
        )
    Y = X @ W.T  # (B, in) @ (in, out) -> (B, out)
    return Y if b is None else Y + b


def linear_backward(
    X: torch.Tensor | None,
    W: torch.Tensor | None,
    grad_Y: torch.Tensor,
    needs: Sequence[bool] = (True, True, True),
) -> tuple:
    """Y = X Wᵀ + b  ⇒  grad_X = grad_Y W,  grad_W = grad_Yᵀ X,  grad_b = Σ_rows grad_Y.

    X (..., in), W (out, in), grad_Y (..., out); every leading dim of X counts as a row.
    ``needs`` (grad_X, grad_W, grad_b), like ``ctx.needs_input_grad``: a gradient not needed
    comes back as ``None``, and the input only it reads may be ``None`` (W for grad_X, X for grad_W).
    """
    needs = tuple(bool(n) for n in needs) + (False,) * (3 - len(needs))
    expect_tensor("grad_Y", grad_Y)
    if needs[0]:
        expect_tensor("W", W)
        if W.dim() != 2 or grad_Y.shape[-1:] != W.shape[:1]:
            raise ValueError(
                f"linear_backward(X, W, grad_Y): expected W (out, in) and grad_Y (..., out), "
                f"got {tuple(W.shape)} and {tuple(grad_Y.shape)}"
            )
    if needs[1]:
        expect_tensor("X", X)
        if X.shape[:-1] != grad_Y.shape[:-1]:
            raise ValueError(
                f"linear_backward(X, W, grad_Y): expected X (..., in) and grad_Y (..., out) with the same rows, "
                f"got {tuple(X.shape)} and {tuple(grad_Y.shape)}"
            )
        if W is not None and (W.dim() != 2 or X.shape[-1:] != W.shape[1:]):
            raise ValueError(
                f"linear_backward(X, W, grad_Y): expected X (..., in) and W (out, in), "
                f"got {tuple(X.shape)} and {tuple(W.shape)}"
            )
    grad_X = grad_W = grad_b = None
    if needs[0]:
        grad_X = grad_Y @ W  # (..., out) @ (out, in) -> (..., in)
    if needs[1] or needs[2]:
        grad_Y2 = grad_Y.reshape(-1, grad_Y.shape[-1])  # (..., out) -> (R, out)
    if needs[1]:
        X2 = X.reshape(-1, X.shape[-1])  # (..., in) -> (R, in)
        grad_W = grad_Y2.T @ X2  # (out, R) @ (R, in) -> (out, in)
    if needs[2]:
        grad_b = grad_Y2.sum(0)  # (R, out) -> (out,)
    return grad_X, grad_W, grad_b


def unbroadcast(grad: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """Sum grad over the dims that broadcasting created or stretched, back to ``shape``."""
    expect_tensor("grad", grad)
    shape = tuple(shape)
    if len(shape) > grad.dim():
        raise ValueError(f"unbroadcast: expected a shape with at most {grad.dim()} dims, got {shape}")
    extra = grad.dim() - len(shape)
    if extra:
        grad = grad.sum(dim=tuple(range(extra)))  # leading dims the operand never had
    stretched = tuple(d for d, n in enumerate(shape) if n == 1 and grad.shape[d] != 1)
    if stretched:
        grad = grad.sum(dim=stretched, keepdim=True)  # size-1 dims that were repeated
    if tuple(grad.shape) != shape:
        raise ValueError(f"unbroadcast: shape {shape} does not broadcast to {tuple(grad.shape)}")
    return grad


def fd_errors(
    f: Callable[[torch.Tensor], torch.Tensor],
    df: Callable[[torch.Tensor], torch.Tensor],
    x0: float,
    hs: Sequence[float],
    dtype: torch.dtype = torch.float64,
) -> list:
    """|(f(x0+h) - f(x0-h)) / 2h - f'(x0)| for each h, f evaluated in ``dtype``, f' in float64."""
    x = torch.tensor(x0, dtype=dtype)
    exact = df(torch.tensor(x0, dtype=torch.float64)).item()
    errs = []
    for h in hs:
        h_t = torch.tensor(h, dtype=dtype)
        d = (f(x + h_t) - f(x - h_t)) / (2 * h_t)  # all in dtype, as a gradient check would
        errs.append(abs(d.item() - exact))
    return errs
