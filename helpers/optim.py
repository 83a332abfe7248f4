"""Optimizers by hand (chapter 11): SGD, momentum, Nesterov, Adam, AdamW, warm-up + cosine.

Each update is a plain function on one parameter tensor ``theta`` and its gradient ``g``
(``sgd_update``, ``adam_update``), written in the order ``torch.optim`` performs it
(single-tensor path), so ten steps in float64 give the same parameters to ~1e-15:

* SGD:       g ← g + λθ;  b ← μb + g (b₁ = g);  d = g + μb (Nesterov) or b;  θ ← θ − η d
* Adam:      g ← g + λθ (L2: the decay goes through m and v)
* AdamW:     θ ← θ(1 − ηλ) (decoupled: the decay never touches m and v)
* both:      m ← β₁m + (1−β₁)g;  v ← β₂v + (1−β₂)g²;
             θ ← θ − η/(1−β₁ᵗ) · m / (√v / √(1−β₂ᵗ) + ε)

The classes ``SGD``, ``Adam`` and ``AdamW`` hold the per-parameter state (momentum buffer,
m, v, t) for a list or a dict of tensors.  ``step(grads)`` takes the gradients explicitly
(the manual-backward mode: a dict or list shaped like the parameters) or, without an
argument, reads ``theta.grad`` (the autograd mode).  Parameters are updated in place.
Setting the learning rate a schedule gives (``set_lr``, ``get_lr``) belongs to the loop,
``helpers.train``; the bytes of an optimizer's state are counted by
``helpers.lora_model.optimizer_state_bytes`` (chapter 8), for these optimizers and torch's.
"""

from __future__ import annotations

import math

import torch

__all__ = ["sgd_update", "adam_update", "SGD", "Adam", "AdamW", "lr_warmup_cosine"]


# --------------------------------------------------------------------------- one tensor


@torch.no_grad()
def sgd_update(
    theta, g, buf, lr: float, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0
):
    """θ ← θ − η·d with g ← g + λθ, b ← μb + g (b₁ = g), d = g + μb (Nesterov) or b; returns b."""
    if weight_decay != 0:
        g = g + weight_decay * theta  # L2 penalty λ/2‖θ‖² folded into the gradient
    if momentum != 0:
        if buf is None:
            buf = g.clone()  # torch.optim starts the buffer at g, not 0
        else:
            buf.mul_(momentum).add_(g)  # dampening 0
        d = g.add(buf, alpha=momentum) if nesterov else buf
    else:
        d = g
    theta.add_(d, alpha=-lr)
    return buf


@torch.no_grad()
def adam_update(
    theta,
    g,
    m,
    v,
    t: int,
    lr: float,
    betas=(0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    decoupled: bool = False,
) -> None:
    """θ ← θ − η/(1−β₁ᵗ) · m/(√v/√(1−β₂ᵗ) + ε) after m ← β₁m+(1−β₁)g, v ← β₂v+(1−β₂)g² (t counts from 1)."""
    beta1, beta2 = betas
    if weight_decay != 0:
        if decoupled:
            theta.mul_(1 - lr * weight_decay)  # AdamW: shrink θ directly, outside m and v
        else:
            g = g + weight_decay * theta  # Adam + L2: the decay is divided by √v later
    m.lerp_(g, 1 - beta1)  # m + (1−β₁)(g − m), torch's exact op
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bias_correction1 = 1 - beta1**t  # m and v start at 0: early averages are too small
    bias_correction2 = 1 - beta2**t
    step_size = lr / bias_correction1
    denom = (v.sqrt() / math.sqrt(bias_correction2)).add_(eps)
    theta.addcdiv_(m, denom, value=-step_size)


# --------------------------------------------------------------------------- state holders


def _as_items(params):
    if isinstance(params, dict):
        return list(params.items())
    params = list(params)
    if not params:
        raise ValueError("params: expected a non-empty list or dict of tensors, got an empty one")
    return list(enumerate(params))


class _Optimizer:
    """Shared plumbing: named parameters, per-key state, gradients given or read from .grad."""

    def __init__(self, params, lr: float):
        self.items = _as_items(params)
        for key, theta in self.items:
            if not isinstance(theta, torch.Tensor):
                raise ValueError(f"params[{key!r}]: expected a torch.Tensor, got {type(theta).__name__}")
        if not lr >= 0:
            raise ValueError(f"lr: expected a number >= 0, got {lr!r}")
        self.lr = float(lr)
        self.state: dict = {key: {} for key, _ in self.items}

    def _grads(self, grads):
        if grads is None:
            return [theta.grad for _, theta in self.items]
        if isinstance(grads, dict):
            return [grads.get(key) for key, _ in self.items]
        grads = list(grads)
        if len(grads) != len(self.items):
            raise ValueError(f"grads: expected {len(self.items)} tensors, got {len(grads)}")
        return grads

    def zero_grad(self) -> None:
        """Set every theta.grad to None (autograd mode; set_to_none like torch.optim)."""
        for _, theta in self.items:
            theta.grad = None

    def step(self, grads=None) -> None:
        """One update of every parameter that has a gradient (``grads`` given, or ``theta.grad``)."""
        for (key, theta), g in zip(self.items, self._grads(grads)):
            if g is not None:
                self._update(key, theta, g.detach())


class SGD(_Optimizer):
    """SGD, optionally with momentum μ (dampening 0), Nesterov, and L2 weight decay λ, like torch.optim.SGD."""

    def __init__(
        self, params, lr: float, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0
    ):
        super().__init__(params, lr)
        if nesterov and momentum <= 0:
            raise ValueError("nesterov: expected momentum > 0 with nesterov=True")
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay

    def _update(self, key, theta, g):
        s = self.state[key]
        s["momentum_buffer"] = sgd_update(
            theta, g, s.get("momentum_buffer"), self.lr, self.momentum, self.nesterov, self.weight_decay
        )
        if s["momentum_buffer"] is None:
            del s["momentum_buffer"]


class Adam(_Optimizer):
    """Adam with bias correction; weight decay λ is L2 (added to g, so it passes through m and v)."""

    decoupled = False

    def __init__(
        self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.0
    ):
        super().__init__(params, lr)
        if not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"betas: expected two numbers in [0, 1), got {betas!r}")
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay

    def _update(self, key, theta, g):
        s = self.state[key]
        if not s:
            s["t"] = 0
            s["m"] = torch.zeros_like(theta)  # (same shape as θ): first moment
            s["v"] = torch.zeros_like(theta)  # (same shape as θ): second moment
        s["t"] += 1
        adam_update(
            theta, g, s["m"], s["v"], s["t"], self.lr, self.betas, self.eps, self.weight_decay, self.decoupled
        )


class AdamW(Adam):
    """AdamW: Adam with decoupled weight decay θ ← θ(1 − ηλ) (default λ = 0.01, as torch.optim.AdamW)."""

    decoupled = True

    def __init__(
        self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01
    ):
        super().__init__(params, lr, betas, eps, weight_decay)


# --------------------------------------------------------------------------- schedule


def lr_warmup_cosine(step: int, warmup: int, total: int, lr_max: float, lr_min: float = 0.0) -> float:
    """η(s) = η_max(s+1)/W for s < W, then η_min + ½(η_max − η_min)(1 + cos π(s−W)/(T−W)), η_min for s ≥ T."""
    if not (0 <= warmup <= total and total > 0):
        raise ValueError(f"lr_warmup_cosine: expected 0 <= warmup <= total, total > 0, got {warmup}, {total}")
    if step < warmup:
        return lr_max * (step + 1) / warmup  # never 0, so the first step already moves
    if step >= total:
        return lr_min
    progress = (step - warmup) / max(1, total - warmup)
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * progress))
