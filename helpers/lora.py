"""LoRA from the gradient up (chapter 8): W' = W + (α/r)·B·A with W frozen.

Layout is ``nn.Linear``'s: ``W`` is ``(out, in)``, ``B`` is ``(out, r)``, ``A`` is ``(r, in)`` and
``y = x W'ᵀ + b``.  The Function never forms ``W'`` nor ``∂L/∂W'``: the LoRA path is
``x → x Aᵀ (r numbers per row) → (x Aᵀ) Bᵀ``, so backward needs ``x``, the r-dimensional
activation ``x Aᵀ`` and the three matrices, and costs O(r·(in + out)) per row on top of
the frozen layer's ``grad_y W``.

* ``lora_linear_forward`` / ``lora_linear_backward`` - the math, as plain functions;
* ``LoRALinearFunction`` - the ``autograd.Function`` (forward + setup_context);
* ``lora_linear(x, W, b, A, B, alpha, r)`` - the public, checked wrapper;
* ``LoRALinear`` - wraps an existing ``nn.Linear`` (frozen), with merge/unmerge and dropout
  on the LoRA input path only; ``lora_modules`` / ``merge_lora`` / ``unmerge_lora`` do it for
  every adapter of a model.

Attention adapters live in ``helpers.lora_attention``; putting adapters into a model, saving
them and counting what they cost in ``helpers.lora_model``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from helpers.checks import expect_int, expect_tensor
from helpers.device import rand

__all__ = [
    "lora_scale",
    "lora_linear_forward",
    "lora_linear_backward",
    "LoRALinearFunction",
    "lora_linear",
    "delta_weight",
    "LoRALinear",
    "lora_modules",
    "merge_lora",
    "unmerge_lora",
]


# --------------------------------------------------------------------------- the math


def lora_scale(alpha: float, r: int, rslora: bool = False) -> float:
    """s = α/r (LoRA) or α/√r (rsLoRA)."""
    return float(alpha) / (math.sqrt(r) if rslora else r)


def lora_linear_forward(x, W, b, A, B, scale, x_lora=None):
    """y = x Wᵀ + b + s·(x_l Aᵀ) Bᵀ with x_l = x (or the dropped-out x_lora); returns (y, x_l Aᵀ)."""
    xl = x if x_lora is None else x_lora
    xA = xl @ A.T  # (..., in) @ (in, r) -> (..., r)
    y = F.linear(x, W, b)  # x Wᵀ + b: (..., in) -> (..., out), as nn.Linear
    y2 = y.view(-1, y.shape[-1])  # (..., out) -> (R, out), a view of y
    # y2 += s·(xA Bᵀ) in one addmm: no (R, out) temporaries for the product and the scaling.
    y2.addmm_(xA.reshape(-1, xA.shape[-1]), B.T, alpha=scale)  # (R, r) @ (r, out) -> (R, out)
    return y, xA


def lora_linear_backward(
    grad_y, x, W, A, B, xA, scale, needs=(True, False, True, True, True, False, False), x_lora=None
):
    """grad_B = s·grad_yᵀ(x_l Aᵀ), grad_A = s·(grad_y B)ᵀ x_l, grad_x = grad_y W + s·(grad_y B) A.

    ``needs`` follows the Function's inputs ``(x, W, b, A, B, scale, x_lora)``.  With a separate
    ``x_lora`` (dropout on the LoRA path) the LoRA term of grad_x goes to ``x_lora`` instead.
    ``grad_W = grad_yᵀ x`` is only formed if asked for (a trainable base); LoRA never asks.
    Returns ``(grad_x, grad_W, grad_b, grad_A, grad_B, None, grad_x_lora)``.
    """
    need_x, need_W, need_b, need_A, need_B, _, need_xl = (tuple(needs) + (False,) * 7)[:7]
    xl = x if x_lora is None else x_lora
    grad_y2 = grad_y.reshape(-1, grad_y.shape[-1])  # (..., out) -> (R, out)
    grad_x = grad_W = grad_b = grad_A = grad_B = grad_xl = None
    gB = None
    if need_A or need_x or need_xl:
        gB = grad_y @ B  # (..., out) @ (out, r) -> (..., r)
    if need_x:
        grad_x = grad_y @ W  # (..., out) @ (out, in) -> (..., in)
        if x_lora is None:  # += s·(gB A), fused as in the forward
            grad_x.view(-1, grad_x.shape[-1]).addmm_(
                gB.reshape(-1, gB.shape[-1]), A, alpha=scale
            )  # (R, r) @ (r, in)
    if need_xl and x_lora is not None:
        grad_xl = scale * (gB @ A)  # (..., r) @ (r, in) -> (..., in)
    if need_W:
        grad_W = grad_y2.T @ x.reshape(-1, x.shape[-1])  # (out, R) @ (R, in) -> (out, in)
    if need_b:
        grad_b = grad_y2.sum(0)  # (R, out) -> (out,)
    if need_A:
        gB2 = gB.reshape(-1, gB.shape[-1])  # (..., r) -> (R, r)
        grad_A = scale * (gB2.T @ xl.reshape(-1, xl.shape[-1]))  # (r, R) @ (R, in) -> (r, in)
    if need_B:
        grad_B = scale * (grad_y2.T @ xA.reshape(-1, xA.shape[-1]))  # (out, R) @ (R, r) -> (out, r)
    return grad_x, grad_W, grad_b, grad_A, grad_B, None, grad_xl


class LoRALinearFunction(torch.autograd.Function):
    """y = x Wᵀ + b + s·(x Aᵀ) Bᵀ; saves x and the r-dim x Aᵀ, never W' = W + s·BA or ∂L/∂W'.

    Inputs ``(x, W, b, A, B, scale, x_lora)``; outputs ``(y, xA)`` where ``xA`` is returned only so
    that it can be saved (non-differentiable; the wrapper drops it).
    """

    @staticmethod
    def forward(x, W, b, A, B, scale, x_lora):
        return lora_linear_forward(x, W, b, A, B, scale, x_lora)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, W, b, A, B, scale, x_lora = inputs
        _, xA = output
        need_x, need_W, _, need_A, need_B, _, need_xl = ctx.needs_input_grad
        xl = x if x_lora is None else x_lora
        # grad_A needs x_l, grad_B needs xA, grad_x needs W (and A, B for the LoRA
        # term), grad_W (only for a trainable base) needs x: keep nothing nobody will
        # ask for.
        ctx.save_for_backward(
            x if need_W else None,
            W if need_x else None,
            A if (need_x or need_xl) else None,
            B if (need_x or need_xl or need_A) else None,
            xA if need_B else None,
            xl if need_A else None,  # x itself unless dropout made x_lora
        )
        ctx.scale = scale
        ctx.has_x_lora = x_lora is not None
        ctx.mark_non_differentiable(xA)
        ctx.set_materialize_grads(False)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y, _grad_xA):
        x, W, A, B, xA, xl = ctx.saved_tensors
        if grad_y is None:
            return (None,) * 7
        x_lora = xl if ctx.has_x_lora else None
        if x is None and not ctx.has_x_lora:
            x = xl  # the LoRA path reads x itself
        return lora_linear_backward(grad_y, x, W, A, B, xA, ctx.scale, ctx.needs_input_grad, x_lora=x_lora)


def lora_linear(x, W, b, A, B, alpha, r, *, rslora: bool = False, x_lora=None):
    """y = x Wᵀ + b + (α/r)·(x Aᵀ) Bᵀ for x (..., in), W (out, in), A (r, in), B (out, r), b (out,) or None."""
    expect_tensor("x", x, floating=True)
    expect_tensor("W", W, floating=True)
    if W.dim() != 2 or x.dim() < 1 or x.shape[-1] != W.shape[1]:
        raise ValueError(
            f"lora_linear: expected x (..., in) and W (out, in) with matching in, "
            f"got {tuple(x.shape)} and {tuple(W.shape)}"
        )
    d_out, d_in = W.shape
    r = expect_int("r", r, low=1, high=min(d_in, d_out))
    expect_tensor("A", A, shape=(r, d_in))
    expect_tensor("B", B, shape=(d_out, r))
    if b is not None:
        expect_tensor("b", b, shape=(d_out,))
    if x_lora is not None:
        expect_tensor("x_lora", x_lora, shape=tuple(x.shape))
    y, _ = LoRALinearFunction.apply(x, W, b, A, B, lora_scale(alpha, r, rslora), x_lora)
    return y


def delta_weight(A, B, scale: float):
    """ΔW = s·B A, the (out, in) update LoRA adds to W (formed only to merge or to explain)."""
    return scale * (B @ A)  # (out, r) @ (r, in) -> (out, in)


# --------------------------------------------------------------------------- the module


class LoRALinear(nn.Module):
    """Wraps an nn.Linear: y = base(x) + (α/r)·(drop(x) Aᵀ) Bᵀ; base frozen, A Kaiming-uniform, B = 0."""

    def __init__(
        self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0, rslora: bool = False, seed: int = 0
    ):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ValueError(f"LoRALinear: expected an nn.Linear to wrap, got {type(base).__name__}")
        d_out, d_in = base.weight.shape
        self.r = expect_int("r", r, low=1, high=min(d_in, d_out))
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"LoRALinear: expected dropout in [0, 1), got {dropout}")
        for p in base.parameters():
            p.requires_grad_(False)  # frozen: autograd computes no ∂L/∂W at all
        self.base = base
        self.alpha, self.rslora, self.dropout = float(alpha), bool(rslora), float(dropout)
        self.scale = lora_scale(alpha, r, rslora)
        W = base.weight
        # Kaiming-uniform with a = √5 (nn.Linear's own init, as loralib and PEFT use):
        # gain √(2/(1+a²)) = √(1/3), bound = gain·√(3/in) = 1/√in.
        bound = 1.0 / math.sqrt(d_in)
        A = (rand(r, d_in, seed=seed, dtype=torch.float64) * 2 - 1) * bound  # (r, in)
        self.lora_A = nn.Parameter(A.to(device=W.device, dtype=W.dtype))
        self.lora_B = nn.Parameter(torch.zeros(d_out, r, device=W.device, dtype=W.dtype))  # (out, r)
        self.merged = False

    @property
    def weight(self):
        """The frozen base weight W, (out, in)."""
        return self.base.weight

    @property
    def bias(self):
        """The frozen base bias b, (out,) or None."""
        return self.base.bias

    @property
    def in_features(self) -> int:
        """in, as nn.Linear."""
        return self.base.in_features

    @property
    def out_features(self) -> int:
        """out, as nn.Linear."""
        return self.base.out_features

    def extra_repr(self) -> str:
        rule = "α/√r" if self.rslora else "α/r"
        return f"r={self.r}, alpha={self.alpha:g}, scale={rule}={self.scale:g}, dropout={self.dropout:g}, merged={self.merged}"

    def forward(self, x):
        """y = x Wᵀ + b + s·(drop(x) Aᵀ) Bᵀ (merged: y = x W'ᵀ + b)."""
        if self.merged:
            return F.linear(x, self.base.weight, self.base.bias)
        x_lora = F.dropout(x, self.dropout, training=True) if self.training and self.dropout > 0 else None
        y, _ = LoRALinearFunction.apply(
            x, self.base.weight, self.base.bias, self.lora_A, self.lora_B, self.scale, x_lora
        )
        return y

    def delta_weight(self):
        """ΔW = s·B A, (out, in)."""
        return delta_weight(self.lora_A.detach(), self.lora_B.detach(), self.scale)

    @torch.no_grad()
    def merge(self):
        """W ← W + s·BA for inference (one matmul per layer then); no-op if already merged."""
        if not self.merged:
            self.base.weight += self.delta_weight()
            self.merged = True
        return self

    @torch.no_grad()
    def unmerge(self):
        """W ← W − s·BA (back to the frozen base, to float round-off); no-op if not merged."""
        if self.merged:
            self.base.weight -= self.delta_weight()
            self.merged = False
        return self


# --------------------------------------------------------------------------- every adapter of a model


def lora_modules(model: nn.Module) -> dict:
    """{name: LoRALinear} for every adapter in the model."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def merge_lora(model: nn.Module) -> nn.Module:
    """Merge every adapter into its base weight (W ← W + s·BA)."""
    for m in lora_modules(model).values():
        m.merge()
    return model


def unmerge_lora(model: nn.Module) -> nn.Module:
    """Undo merge_lora (W ← W − s·BA)."""
    for m in lora_modules(model).values():
        m.unmerge()
    return model
