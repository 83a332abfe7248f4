"""A training loop in the order the seeds teach: zero_grad → forward → backward → clip → step (chapter 11).

``train`` runs one loop for two kinds of gradient:

* autograd mode, ``loss_fn(*batch) -> L`` (a tensor with a graph): ``L.backward()`` accumulates
  into ``θ.grad``; so the loop must clear them first (``zero_grad``), or each step adds the
  previous gradients again (seed 000's snowball);
* manual mode, ``grads_fn(*batch) -> (L, grads)``: gradients come back as a dict (or list)
  shaped like the parameters, computed by the course's own backward passes, and go straight
  to ``opt.step(grads)``; there is nothing to zero.

Gradient accumulation: ``get_batch(step)`` returns the whole batch (tensors, batch dimension
first); with ``accum = k`` it is cut into k micro-batches, each forward/backward sees only one
(a k-th of the activation memory), and the micro-gradients are summed with weights
``b_i / B`` so the step uses exactly the full-batch mean gradient.

Clipping (global norm, ``helpers.gradflow``'s formula) happens after the last backward and
before ``step``: clipping after the step would change nothing that step did.
The progress bar is ``tqdm.auto`` (a widget in Jupyter, text on stderr elsewhere); set the
environment variable ``BPBH_NO_PROGRESS=1`` (or ``progress=False``) to switch it off.
"""
from __future__ import annotations

import os

import torch

from helpers.gradflow import clip_grad_norm
from helpers.optim import get_lr, set_lr

__all__ = ["train", "split_batch", "clip_grads", "global_norm"]


def split_batch(batch, accum: int) -> list[tuple]:
    """Cut every tensor of ``batch`` into ``accum`` micro-batches along dim 0; returns [(tensors…, b_i/B)]."""
    batch = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    B = batch[0].shape[0]
    if not isinstance(accum, int) or accum < 1 or accum > B:
        raise ValueError(f"accum: expected an int in [1, batch size {B}], got {accum!r}")
    if any(t.shape[0] != B for t in batch):
        raise ValueError("batch: expected tensors sharing the batch size in dim 0")
    parts = [torch.tensor_split(t, accum, dim=0) for t in batch]
    return [(*(p[i] for p in parts), parts[0][i].shape[0] / B) for i in range(accum)]


def global_norm(grads) -> torch.Tensor:
    """‖g‖ = sqrt(Σ_p ‖g_p‖²) over a dict or list of gradient tensors (a 0-dim tensor)."""
    gs = list(grads.values()) if isinstance(grads, dict) else list(grads)
    per_tensor = torch.stack([torch.linalg.vector_norm(g, 2) for g in gs])   # (P,)
    return torch.linalg.vector_norm(per_tensor, 2)


@torch.no_grad()
def clip_grads(grads, max_norm: float) -> torch.Tensor:
    """g ← g · min(1, max_norm / (‖g‖ + 1e-6)) in place for a dict or list of gradients; returns ‖g‖ before."""
    total = global_norm(grads)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g in (grads.values() if isinstance(grads, dict) else grads):
        g.mul_(coef.to(g.device))
    return total


def _zero_grad(opt) -> None:
    if isinstance(opt, torch.optim.Optimizer):
        opt.zero_grad(set_to_none=True)
    else:
        opt.zero_grad()


def _params_of(opt, params):
    if params is not None:
        return list(params.values()) if isinstance(params, dict) else list(params)
    if isinstance(opt, torch.optim.Optimizer):
        return [p for group in opt.param_groups for p in group["params"]]
    return [theta for _, theta in opt.items]


def train(opt, get_batch, steps: int, loss_fn=None, grads_fn=None, params=None, accum: int = 1,
          clip: float | None = None, lr_schedule=None, progress: bool = True, desc: str = "train",
          log_every: int = 10) -> dict:
    """Run ``steps`` optimizer steps; returns {'loss': [L per step], 'lr': [...], 'grad_norm': [‖g‖ before clip]}.

    Exactly one of ``loss_fn`` (autograd) and ``grads_fn`` (manual) must be given.  ``opt`` is a
    ``torch.optim`` optimizer or one of ``helpers.optim``'s; ``lr_schedule(step) -> lr`` is
    applied before each step.  ``params`` (default: the optimizer's) is what gets clipped.
    """
    if (loss_fn is None) == (grads_fn is None):
        raise ValueError("train: expected exactly one of loss_fn (autograd) or grads_fn (manual)")
    if grads_fn is not None and isinstance(opt, torch.optim.Optimizer):
        raise ValueError("train: manual mode needs an optimizer whose step takes grads (helpers.optim)")
    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps: expected an int >= 0, got {steps!r}")
    from tqdm.auto import tqdm

    theta = _params_of(opt, params)
    history = {"loss": [], "lr": [], "grad_norm": []}
    disable = (not progress) or os.environ.get("BPBH_NO_PROGRESS", "") not in ("", "0")
    bar = tqdm(range(steps), desc=desc, disable=disable, leave=True)
    for step in bar:
        if lr_schedule is not None:
            set_lr(opt, lr_schedule(step))
        micro_batches = split_batch(get_batch(step), accum)
        L_step = 0.0
        if loss_fn is not None:
            _zero_grad(opt)                                   # 1. clear last step's .grad
            for *mb, w in micro_batches:
                L = loss_fn(*mb)                              # 2. forward (graph recorded)
                (L * w).backward()                            # 3. backward: .grad += w ∂L_i/∂θ
                L_step += w * L.item()
            total = (clip_grad_norm(theta, clip) if clip is not None      # 4. clip, after backward
                     else clip_grad_norm(theta, float("inf")))
            opt.step()                                        # 5. step
        else:
            grads = None
            for *mb, w in micro_batches:
                L, g = grads_fn(*mb)                          # 2-3. forward and backward by hand
                L_step += w * float(L)
                if grads is None:
                    grads = {k: w * v for k, v in g.items()} if isinstance(g, dict) else [w * v for v in g]
                else:
                    for k in (g.keys() if isinstance(g, dict) else range(len(g))):
                        grads[k].add_(g[k], alpha=w)
            total = clip_grads(grads, clip if clip is not None else float("inf"))   # 4. clip
            opt.step(grads)                                   # 5. step with the given gradients
        history["loss"].append(L_step)
        history["lr"].append(get_lr(opt))
        history["grad_norm"].append(float(total))
        if not disable and (step % log_every == 0 or step == steps - 1):
            bar.set_postfix(loss=f"{L_step:.4f}", refresh=False)
    bar.close()
    return history
