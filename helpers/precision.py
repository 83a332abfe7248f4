"""Mixed precision by hand: float formats and loss scaling (chapter 9).

* ``float_format_table`` - fp16 / bf16 / fp32: largest value, smallest normal and subnormal, eps;
* loss scaling by hand (``ScalerState``, ``unscale_grads``, ``update_scale``, ``loss_scale_step``):
  what ``torch.amp.GradScaler`` does, with its defaults and its rounding of 1/scale.

A LayerNorm computed in float16 (eps rounded to float16, chapter 9's NaN) is chapter 4's
``helpers.functions.layernorm_forward``, which does every operation in its input's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from helpers.checks import expect_tensor

__all__ = ["float_format_table", "ScalerState", "unscale_grads", "update_scale", "loss_scale_step"]


# --------------------------------------------------------------------------- number formats


def float_format_table(dtypes=(torch.float16, torch.bfloat16, torch.float32)) -> list[dict]:
    """Per dtype: largest finite value, smallest normal (finfo.tiny), smallest subnormal (tiny·eps), eps (1 ulp at 1)."""
    rows = []
    for dt in dtypes:
        fi = torch.finfo(dt)
        rows.append(
            {
                "dtype": str(dt).replace("torch.", ""),
                "bits": fi.bits,
                "max": fi.max,
                "tiny": fi.tiny,
                "subnormal": fi.tiny * fi.eps,
                "eps": fi.eps,
            }
        )
    return rows


# --------------------------------------------------------------------------- loss scaling


@dataclass(frozen=True)
class ScalerState:
    """Loss-scale state with torch.amp.GradScaler's defaults: scale 2¹⁶, ×2 after 2000 clean steps, ×0.5 on inf."""

    scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    growth_tracker: int = 0


def unscale_grads(grads, scale: float):
    """g ← g · (1/scale) (1/scale rounded to float32, as GradScaler does); returns (grads, found_inf)."""
    inv_scale = float(torch.tensor(float(scale), dtype=torch.float64).reciprocal().float())
    out, found_inf = [], False
    for g in grads:
        if g is None:
            out.append(None)
            continue
        expect_tensor("grad", g)
        found_inf = found_inf or not bool(torch.isfinite(g).all())
        out.append(g * inv_scale)
    return out, found_inf


def update_scale(state: ScalerState, found_inf: bool) -> ScalerState:
    """inf/NaN: scale·backoff, tracker 0; else tracker + 1, and on reaching growth_interval: scale·growth, tracker 0."""
    if not isinstance(state, ScalerState):
        raise ValueError(f"update_scale: expected a ScalerState, got {type(state).__name__}")
    if found_inf:
        return replace(state, scale=state.scale * state.backoff_factor, growth_tracker=0)
    tracker = state.growth_tracker + 1
    if tracker == state.growth_interval:
        return replace(state, scale=state.scale * state.growth_factor, growth_tracker=0)
    return replace(state, growth_tracker=tracker)


@torch.no_grad()
def loss_scale_step(params, scaled_grads, state: ScalerState, lr: float):
    """One SGD step with loss scaling, then update the scale.

    g = scaled_g/scale; skip the step if any g is inf/NaN, else θ ← θ − lr·g.
    ``scaled_grads`` are the gradients of ``scale · L``.  Returns
    ``(new_state, stepped)``; the parameters are updated in place.
    """
    params, scaled_grads = list(params), list(scaled_grads)
    if len(params) != len(scaled_grads):
        n, k = len(params), len(scaled_grads)
        raise ValueError(f"scaled_grads: expected one per param ({n}), got {k}")
    grads, found_inf = unscale_grads(scaled_grads, state.scale)
    if not found_inf:
        for p, g in zip(params, grads):
            if g is not None:
                p.add_(g, alpha=-lr)  # torch.optim.SGD's update, same rounding
    return update_scale(state, found_inf), not found_inf
