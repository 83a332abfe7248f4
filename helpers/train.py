"""The course's one training loop, in the order the seeds teach: zero_grad → forward → backward → clip → step (chapter 8).

Chapter 8 fine-tunes with it (autograd mode, ``torch.optim.Adam``); chapter 11 takes it apart
(manual mode, accumulation, schedules).  ``train`` runs one loop for two kinds of gradient:

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

Clipping (``helpers.gradflow.clip_grad_norm``, chapter 5) happens after the last backward and
before ``step``: clipping after the step would change nothing that step did.  ``lm_loss`` and
``eval_lm`` are the next-token loss of a language model and its held-out value.
The progress bar is ``tqdm.auto`` (a widget in Jupyter, text on stderr elsewhere); set the
environment variable ``BPBH_NO_PROGRESS=1`` (or ``progress=False``) to switch it off.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from helpers.checks import expect_int
from helpers.gpt import get_batch
from helpers.gradflow import clip_grad_norm, global_grad_norm

__all__ = ["train", "split_batch", "set_lr", "get_lr", "lm_loss", "eval_lm"]


def split_batch(batch, accum: int) -> list[tuple]:
    """Cut every tensor of ``batch`` into ``accum`` micro-batches along dim 0; returns [(tensors…, b_i/B)]."""
    batch = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    B = batch[0].shape[0]
    expect_int("accum", accum, low=1, high=B)  # at most one micro-batch per example
    if any(t.shape[0] != B for t in batch):
        raise ValueError("batch: expected tensors sharing the batch size in dim 0")
    parts = [torch.tensor_split(t, accum, dim=0) for t in batch]
    return [(*(p[i] for p in parts), parts[0][i].shape[0] / B) for i in range(accum)]


def set_lr(opt, lr: float) -> None:
    """Set the learning rate of ``helpers.optim``'s optimizers (``opt.lr``) or of a torch.optim one (every group)."""
    if isinstance(opt, torch.optim.Optimizer):
        for group in opt.param_groups:
            group["lr"] = lr
    else:
        opt.lr = float(lr)


def get_lr(opt) -> float:
    """The learning rate of ``helpers.optim``'s optimizers or of a torch.optim one (its first param group)."""
    if isinstance(opt, torch.optim.Optimizer):
        return float(opt.param_groups[0]["lr"])
    return opt.lr


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


def train(
    opt,
    get_batch,
    steps: int,
    loss_fn=None,
    grads_fn=None,
    params=None,
    accum: int = 1,
    clip: float | None = None,
    lr_schedule=None,
    progress: bool = True,
    desc: str = "train",
    log_every: int = 10,
) -> dict:
    """Run ``steps`` optimizer steps; returns {'loss': [L per step], 'lr': [...], 'grad_norm': [‖g‖ before clip]}.

    Exactly one of ``loss_fn`` (autograd) and ``grads_fn`` (manual) must be given.  ``opt`` is a
    ``torch.optim`` optimizer or one of ``helpers.optim``'s; ``lr_schedule(step) -> lr`` is
    applied before each step.  ``params`` (default: the optimizer's) is what gets clipped.
    """
    if (loss_fn is None) == (grads_fn is None):
        raise ValueError("train: expected exactly one of loss_fn (autograd) or grads_fn (manual)")
    if grads_fn is not None and isinstance(opt, torch.optim.Optimizer):
        raise ValueError("train: manual mode needs an optimizer whose step takes grads (helpers.optim)")
    expect_int("steps", steps, low=0)
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
            _zero_grad(opt)  # 1. clear last step's .grad
            for *mb, w in micro_batches:
                L = loss_fn(*mb)  # 2. forward (graph recorded)
                (L * w).backward()  # 3. backward: .grad += w ∂L_i/∂θ
                L_step += w * L.item()
            total = (
                clip_grad_norm(theta, clip)
                if clip is not None  # 4. clip, after backward
                else global_grad_norm(theta)
            )
            opt.step()  # 5. step
        else:
            grads = None
            for *mb, w in micro_batches:
                L, g = grads_fn(*mb)  # 2-3. forward and backward by hand
                L_step += w * float(L)
                if grads is None:
                    grads = {k: w * v for k, v in g.items()} if isinstance(g, dict) else [w * v for v in g]
                else:
                    for k in g.keys() if isinstance(g, dict) else range(len(g)):
                        grads[k].add_(g[k], alpha=w)
            total = (
                clip_grad_norm(grads, clip, are_grads=True)
                if clip is not None  # 4. clip
                else global_grad_norm(grads, are_grads=True)
            )
            opt.step(grads)  # 5. step with the given gradients
        history["loss"].append(L_step)
        history["lr"].append(get_lr(opt))
        history["grad_norm"].append(float(total))
        if not disable and (step % log_every == 0 or step == steps - 1):
            bar.set_postfix(loss=f"{L_step:.4f}", refresh=False)
    bar.close()
    return history


def lm_loss(model, idx, targets) -> torch.Tensor:
    """L = mean over (b, n) of −log softmax(model(idx))[b, n, targets[b, n]]: next-token cross-entropy."""
    logits = model(idx)  # (B, N, V)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # (B·N, V) vs (B·N,)


@torch.no_grad()
def eval_lm(
    model, data: torch.Tensor, batches: int = 8, batch_size: int = 16, n_ctx: int = 32, seed: int = 10_000
) -> float:
    """Mean of lm_loss over ``batches`` fixed random windows of ``data`` (batch s uses seed + s; no training)."""
    device = next(model.parameters()).device
    total = 0.0
    for s in range(batches):
        idx, targets = get_batch(data, batch_size, n_ctx, seed=seed + s, device=device)  # (B, N), (B, N)
        total += lm_loss(model, idx, targets).item()
    return total / batches
