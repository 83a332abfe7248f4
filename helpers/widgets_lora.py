"""Chapter 8's rank panel: rank r and α → trainable parameters, optimizer memory, loss curve.

``lora_run(...)`` fine-tunes a copy of a pretrained TinyGPT with adapters on Q and V for one
(r, α) and returns its numbers.  ``lora_panel(...)`` is the live widget (ipywidgets
``interactive_output`` with ``Dropdown``s, ``Output``, ``VBox``, ``HBox``: ipywidgets 7 and 8);
it reuses precomputed runs and caches new ones.  ``lora_animation(...)`` is the site's static
counterpart: one precomputed frame per (r, α), a matplotlib animation whose ``to_jshtml()``
carries its own slider.
"""

from __future__ import annotations

from functools import partial

import ipywidgets as W
import matplotlib.pyplot as plt
import torch
from matplotlib.animation import FuncAnimation

from helpers.gpt import TinyGPT, get_batch
from helpers.lora_model import add_lora_attention, optimizer_state_bytes, parameter_counts
from helpers.memory import fmt_bytes
from helpers.train import lm_loss, train

__all__ = ["lora_run", "draw_run", "lora_panel", "lora_animation"]


def lora_run(
    config,
    base_state: dict,
    data,
    r: int,
    alpha: float,
    steps: int = 100,
    lr: float = 1e-2,
    batch_size: int = 16,
    seed: int = 1000,
    device=None,
) -> dict:
    """Fine-tune TinyGPT(config) loaded with base_state, adapters on Q and V of rank r: losses, counts, bytes."""
    model = TinyGPT(config).to(device or "cpu")
    model.load_state_dict(base_state)
    add_lora_attention(model, r=r, alpha=alpha)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    device = next(model.parameters()).device
    hist = train(
        opt,
        lambda s: get_batch(data, batch_size, config.n_ctx, seed=seed + s, device=device),
        steps,
        loss_fn=partial(lm_loss, model),
        progress=False,
    )
    counts = parameter_counts(model)
    return {
        "r": r,
        "alpha": alpha,
        "losses": hist["loss"],
        "trainable": counts["trainable"],
        "total": counts["total"],
        "opt_bytes": optimizer_state_bytes(opt),
    }


def _smooth(v, k=10):
    """Running mean over the last k values (the per-batch loss is noisy)."""
    out, acc = [], 0.0
    for i, x in enumerate(v):
        acc += x
        if i >= k:
            acc -= v[i - k]
        out.append(acc / min(i + 1, k))
    return out


def draw_run(ax, run: dict, reference: dict | None = None, ylim=None):
    """Loss curve of one run (smoothed), optional reference curves {label: losses}, numbers in the title."""
    ax.clear()
    for label, losses in (reference or {}).items():
        ax.plot(_smooth(losses), color="0.6", lw=1.2, ls="--", label=label)
    ax.plot(_smooth(run["losses"]), color="C0", lw=2, label=f"LoRA r={run['r']}, α={run['alpha']:g}")
    ax.set_xlabel("fine-tuning step")
    ax.set_ylabel("loss (running mean of 10)")
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_title(
        f"r={run['r']}, α={run['alpha']:g}, α/r={run['alpha'] / run['r']:g}: "
        f"{run['trainable']} trainable of {run['total']}, Adam state {fmt_bytes(run['opt_bytes'])}",
        fontsize=10,
    )
    ax.legend(fontsize=10, loc="upper right")
    return ax


def lora_panel(
    config,
    base_state: dict,
    data,
    ranks=(1, 2, 4, 8, 16),
    alphas=(4.0, 16.0),
    steps: int = 100,
    lr: float = 1e-2,
    precomputed: dict | None = None,
    reference: dict | None = None,
    record: list | None = None,
    device=None,
):
    """Live panel: choose r and α; the run is looked up in ``precomputed`` {(r, α): run} or trained (then cached)."""
    cache = dict(precomputed or {})
    controls = {
        "r": W.Dropdown(options=list(ranks), value=ranks[len(ranks) // 2], description="rank r"),
        "alpha": W.Dropdown(options=list(alphas), value=alphas[-1], description="α"),
    }

    def redraw(r, alpha):
        key = (r, float(alpha))
        if key not in cache:
            cache[key] = lora_run(config, base_state, data, r, alpha, steps=steps, lr=lr, device=device)
        if record is not None:
            record.append(cache[key])
        fig, ax = plt.subplots(figsize=(6.5, 3.4), dpi=80)
        draw_run(ax, cache[key], reference)
        fig.tight_layout()
        plt.show()
        plt.close(fig)

    out = W.interactive_output(redraw, controls)
    return W.VBox([W.HBox([controls["r"], controls["alpha"]]), out])


def lora_animation(runs: dict, reference: dict | None = None, interval: int = 1500):
    """A FuncAnimation with one frame per precomputed (r, α) run; ``.to_jshtml()`` gives the site a slider."""
    keys = sorted(runs)
    if not keys:
        raise ValueError("runs: expected at least one precomputed {(r, alpha): run}")
    curves = [runs[k]["losses"] for k in keys] + list((reference or {}).values())
    lo = min(min(_smooth(c)) for c in curves)
    hi = max(max(_smooth(c)) for c in curves)
    ylim = (lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))  # one range for every frame, so curves compare
    # 90 dpi: 585 px wide, shown unscaled in the page column, so 10 pt text is 12.5 px
    fig, ax = plt.subplots(figsize=(6.5, 3.4), dpi=90)

    def update(i):
        draw_run(ax, runs[keys[i]], reference, ylim=ylim)
        return ax.lines

    update(0)
    fig.tight_layout()
    anim = FuncAnimation(fig, update, frames=len(keys), interval=interval, blit=False)
    plt.close(fig)
    anim.frame_keys = keys
    return anim
