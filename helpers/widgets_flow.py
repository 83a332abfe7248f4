"""Chapter 5's gradient-flow panel: live in Jupyter/Colab, precomputed on the website.

``flow_panel()`` - ipywidgets controls (depth, activation, residual, LayerNorm, init
scale) that rebuild ``helpers.gradflow.deep_mlp`` and redraw its per-layer gradient
norms. Only ``interactive_output``, ``IntSlider``, ``Dropdown``, ``Checkbox``,
``Output``, ``VBox`` and ``HBox`` are used, so it runs on ipywidgets 7 (Colab) and 8.

``flow_animation()`` - the static counterpart for the site, where no kernel runs:
one precomputed frame per setting, as a matplotlib animation whose
``to_jshtml()`` carries its own slider.
"""

from __future__ import annotations

import itertools

import ipywidgets as W
import matplotlib.pyplot as plt
from matplotlib.animation import FuncAnimation

from helpers.gradflow import deep_mlp, fixed_batch, layer_grad_norms
from helpers.plot_flow import DPI, plot_layer_norms

__all__ = ["flow_norms", "draw_flow", "flow_panel", "flow_settings", "flow_animation"]


def flow_norms(depth, activation, residual, layernorm, init_scale=1.0, width=32, batch=64):
    """Per-layer ‖∂L/∂W‖ of deep_mlp(...) on the fixed batch (same numbers as the chapter)."""
    X, y = fixed_batch(batch=batch, width=width)
    model = deep_mlp(depth, width, activation, residual, layernorm, init_scale)
    return layer_grad_norms(model, X, y)


def _label(activation, residual, layernorm, init_scale):
    parts = [activation, "residual" if residual else "plain"]
    if layernorm:
        parts.append("LayerNorm")
    return " · ".join(parts) + f" · init {init_scale:g}"


def draw_flow(ax, norms, activation, residual, layernorm, init_scale, ylim=None):
    """Draw one setting's per-layer norms on ``ax`` (a fixed ``ylim`` lets frames compare)."""
    ax.clear()
    plot_layer_norms(
        {activation: norms}, ax=ax, ylim=ylim, title=_label(activation, residual, layernorm, init_scale)
    )
    ax.legend(fontsize=9)  # 9 pt: 9 px in the animation's 72 dpi frames
    return ax


def flow_panel(width: int = 32, batch: int = 64, max_depth: int = 40, record: list | None = None):
    """Live panel: change depth/activation/residual/LayerNorm/init and the plot is redrawn."""
    controls = {
        "depth": W.IntSlider(value=20, min=2, max=max_depth, step=1, description="depth"),
        "activation": W.Dropdown(options=["sigmoid", "relu", "gelu"], value="relu", description="activation"),
        "residual": W.Checkbox(value=False, description="residual"),
        "layernorm": W.Checkbox(value=False, description="LayerNorm"),
        "init_scale": W.Dropdown(
            options=[("1 (LeCun)", 1.0), ("√2 (He)", 2**0.5), ("2", 2.0)], value=1.0, description="init scale"
        ),
    }

    def redraw(depth, activation, residual, layernorm, init_scale):
        norms = flow_norms(depth, activation, residual, layernorm, init_scale, width, batch)
        if record is not None:
            record.append(
                {
                    "depth": depth,
                    "activation": activation,
                    "residual": residual,
                    "layernorm": layernorm,
                    "init_scale": init_scale,
                    "norms": norms,
                }
            )
        fig, ax = plt.subplots(figsize=(5.5, 3.2), dpi=DPI)
        draw_flow(ax, norms, activation, residual, layernorm, init_scale)
        fig.tight_layout()
        plt.show()
        plt.close(fig)

    out = W.interactive_output(redraw, controls)
    c = controls
    return W.VBox(
        [W.HBox([c["depth"], c["activation"], c["init_scale"]]), W.HBox([c["residual"], c["layernorm"]]), out]
    )


def flow_settings(activations=("sigmoid", "relu", "gelu"), init_scales=(1.0,)):
    """Every (activation, residual, layernorm, init_scale) combination, in a fixed order."""
    return list(itertools.product(activations, (False, True), (False, True), init_scales))


def flow_animation(
    settings=None,
    depth: int = 20,
    width: int = 32,
    batch: int = 64,
    interval: int = 1200,
    precomputed: dict | None = None,
):
    """A FuncAnimation, one frame per setting; ``.to_jshtml()`` gives the site a slider over them.

    ``precomputed`` maps a setting (activation, residual, layernorm, init_scale) to norms
    already computed for this depth/width/batch, so they are not computed twice.
    """
    settings = flow_settings() if settings is None else list(settings)
    if not settings:
        raise ValueError("settings: expected at least one (activation, residual, layernorm, init) tuple")
    precomputed = precomputed or {}
    frames = [
        (s, precomputed[s] if s in precomputed else flow_norms(depth, *s, width=width, batch=batch))
        for s in settings
    ]
    positive = [v for _, norms in frames for v in norms if v > 0]
    ylim = (min(positive) / 3, max(positive) * 3)  # one range for every frame, so heights compare
    fig, ax = plt.subplots(figsize=(5, 3), dpi=72)

    def update(i):
        (activation, residual, layernorm, init_scale), norms = frames[i]
        draw_flow(ax, norms, activation, residual, layernorm, init_scale, ylim=ylim)
        return ax.lines

    update(0)
    fig.tight_layout()
    anim = FuncAnimation(fig, update, frames=len(frames), interval=interval, blit=False)
    plt.close(fig)  # the animation owns the figure; do not show it a second time as a still
    anim.frame_data = frames
    return anim
