"""Figures for chapter 5: per-layer gradient norms (log scale) and CE vs MSE gradient sizes.

Every function takes numbers already computed (see ``helpers.gradflow``) and returns
the matplotlib Figure; nothing here runs a model.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

__all__ = ["plot_layer_norms", "plot_flow_grid", "plot_ce_vs_mse", "DPI"]

DPI = 90
_COLORS = {"sigmoid": "tab:blue", "relu": "tab:orange", "gelu": "tab:green", "tanh": "tab:purple"}


def _floor(values, floor=1e-30):
    """Exact zeros cannot sit on a log axis: show them at ``floor``."""
    return [max(float(v), floor) for v in values]


def plot_layer_norms(curves: dict, ax=None, title: str | None = None, ylabel: str = "‖∂L/∂W‖", ylim=None):
    """One line per label: x = layer (1 = next to the input), y = gradient norm on a log axis."""
    if not curves:
        raise ValueError("curves: expected a non-empty dict label -> list of norms")
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(5, 3), dpi=DPI)
    for label, values in curves.items():
        layers = range(1, len(values) + 1)
        ax.plot(layers, _floor(values), marker="o", ms=3, label=str(label), color=_COLORS.get(str(label)))
    ax.set_yscale("log")
    ax.set_xlabel("layer (1 = input side)")
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    if fig is not None:
        fig.tight_layout()
    return fig if fig is not None else ax.figure


def plot_flow_grid(norms: dict, rows, cols, labels, row_title=None, col_title=None):
    """A grid of ``plot_layer_norms``: norms[(row, col, label)] = list of per-layer norms.

    Its text is set at 9-10.5 pt, so that it renders at 9 px or more when the grid is scaled
    down to a 680 px page column.
    """
    fig, axes = plt.subplots(
        len(rows),
        len(cols),
        figsize=(2.6 * len(cols), 2.3 * len(rows)),
        dpi=DPI,
        sharex=True,
        sharey=True,
        squeeze=False,
    )
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            ax = axes[i][j]
            plot_layer_norms({lab: norms[(r, c, lab)] for lab in labels}, ax=ax)
            ax.set_title(
                f"{row_title(r) if row_title else r} · {col_title(c) if col_title else c}",
                fontsize=10.5,
            )
            ax.tick_params(labelsize=9)
            ax.set_xlabel("layer" if i == len(rows) - 1 else "", fontsize=10.5)
            ax.set_ylabel("‖∂L/∂W‖" if j == 0 else "", fontsize=10.5)
            if (i, j) == (0, 0):
                ax.legend(fontsize=10)
            else:
                ax.get_legend().remove()
    fig.tight_layout()
    return fig


def plot_ce_vs_mse(scales, ce_norms, mse_norms, ax=None):
    """‖∂L/∂z‖ against the logit scale for cross-entropy and MSE-on-logits (log-log)."""
    if not (len(scales) == len(ce_norms) == len(mse_norms)):
        raise ValueError("scales, ce_norms, mse_norms: expected equal lengths")
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(4.5, 3), dpi=DPI)
    ax.plot(scales, _floor(ce_norms), marker="o", label="cross-entropy: softmax − one-hot")
    ax.plot(scales, _floor(mse_norms), marker="s", label="MSE on logits: 2(z − one-hot)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("logit scale s (z = s · z₀)")
    ax.set_ylabel("‖∂L/∂z‖ per example")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8)
    if fig is not None:
        fig.tight_layout()
    return fig if fig is not None else ax.figure
