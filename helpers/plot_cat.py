"""Figures of chapters 1-2: the cat MLP's computation graph, finite-difference error vs step.

Only plotting lives here; the numbers come from ``helpers.cat_mlp`` and ``helpers.numgrad``.
Every function returns the ``Figure`` (the notebook shows it) and draws small (dpi 90).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import FancyArrowPatch

from helpers.show import fmt_scalar

__all__ = ["short", "draw_cat_graph", "plot_fd_errors"]

FWD = "#1f3b73"  # forward values: dark blue
BWD = "#c0392b"  # backward gradients: red
DEAD = "#7f8c8d"  # what the dead ReLU unit touches


def short(x, decimals: int = 6) -> str:
    """Compact text of a number/tensor: up to ``decimals`` decimals, trailing zeros dropped."""
    t = torch.as_tensor(x).detach().to("cpu", torch.float64)

    def one(v: float) -> str:
        s = fmt_scalar(v, decimals)
        return s.rstrip("0").rstrip(".") if "." in s else s

    if t.numel() == 1:
        return one(t.item())
    if t.dim() == 1 or (t.dim() == 2 and t.shape[0] == 1):
        return "[" + ", ".join(one(v) for v in t.reshape(-1).tolist()) + "]"
    return "[" + ",\n ".join(short(row, decimals) for row in t) + "]"


def _node(ax, xy, text, color="white"):
    ax.text(
        *xy,
        text,
        ha="center",
        va="center",
        fontsize=14,
        zorder=3,
        bbox=dict(boxstyle="round,pad=0.35", fc=color, ec="#333333"),
    )


def _edge(ax, start, end, fwd=None, bwd=None, bwd_color=BWD, label_side="h"):
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle="-|>",
            mutation_scale=14,
            lw=1.4,
            color="#555555",
            shrinkA=18,
            shrinkB=18,
            zorder=1,
        )
    )
    mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
    if label_side == "h":  # horizontal edge: forward above, backward below
        if fwd:
            ax.text(mx, my + 0.14, fwd, ha="center", va="bottom", fontsize=10.5, color=FWD)
        if bwd:
            ax.text(mx, my - 0.14, bwd, ha="center", va="top", fontsize=10.5, color=bwd_color)
    else:  # vertical edge: forward left, backward right
        if fwd:
            ax.text(mx - 0.08, my, fwd, ha="right", va="center", fontsize=10.5, color=FWD)
        if bwd:
            ax.text(mx + 0.08, my, bwd, ha="left", va="center", fontsize=10.5, color=bwd_color)


def draw_cat_graph(
    cache: Mapping,
    grads: Mapping,
    params: Mapping | None = None,
    ax=None,
    title: str | None = None,
    decimals: int = 8,
):
    """x →(W1,b1)→ h →ReLU→ a →(W2,b2)→ ŷ → L; forward values in blue, ∂L/∂· in red."""
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(11, 4.6), dpi=90)
    fig = ax.figure
    ax.set_xlim(-0.6, 9.6)
    ax.set_ylim(-1.55, 2.1)
    ax.axis("off")
    s = lambda t: short(t, decimals)  # noqa: E731
    dead = bool((torch.as_tensor(cache["h"]) <= 0).any())

    pos = {
        "x": (0, 0),
        "h": (2.6, 0),
        "a": (5.0, 0),
        "y_hat": (7.2, 0),
        "L": (9.0, 0),
        "W1b1": (2.6, 1.55),
        "W2b2": (7.2, 1.55),
    }
    _node(ax, pos["x"], "x")
    _node(ax, pos["h"], "h = W1 x + b1", "#eef3fb")
    _node(ax, pos["a"], "a = ReLU(h)", "#eef3fb")
    _node(ax, pos["y_hat"], "ŷ = W2 a + b2", "#eef3fb")
    _node(ax, pos["L"], "L", "#fdf2e9")
    _node(ax, pos["W1b1"], "W1, b1", "#fbfbea")
    _node(ax, pos["W2b2"], "W2, b2", "#fbfbea")

    _edge(
        ax, pos["x"], pos["h"], fwd=f"x = {s(cache['x'])}", bwd="(input: no gradient needed)", bwd_color=DEAD
    )
    _edge(ax, pos["h"], pos["a"], fwd=f"h = {s(cache['h'])}", bwd=f"∂L/∂h = {s(grads['h'])}")
    _edge(ax, pos["a"], pos["y_hat"], fwd=f"a = {s(cache['a'])}", bwd=f"∂L/∂a = {s(grads['a'])}")
    _edge(ax, pos["y_hat"], pos["L"], fwd=f"ŷ = {s(cache['y_hat'])}", bwd=f"∂L/∂ŷ = {s(grads['y_hat'])}")
    _edge(
        ax,
        pos["W1b1"],
        pos["h"],
        label_side="v",
        fwd=(f"W1 = {s(params['W1'])}\nb1 = {s(params['b1'])}" if params else None),
        bwd=f"∂L/∂W1 = {s(grads['W1'])}\n∂L/∂b1 = {s(grads['b1'])}",
    )
    _edge(
        ax,
        pos["W2b2"],
        pos["y_hat"],
        label_side="v",
        fwd=(f"W2 = {s(params['W2'])}\nb2 = {s(params['b2'])}" if params else None),
        bwd=f"∂L/∂W2 = {s(grads['W2'])}\n∂L/∂b2 = {s(grads['b2'])}",
    )
    ax.text(
        pos["L"][0],
        pos["L"][1] - 0.45,
        f"L = {s(cache['L'])}",
        ha="center",
        va="top",
        fontsize=12,
        color=FWD,
    )
    note = (
        "a unit with h ≤ 0 is dead: ReLU passes 0 gradient back,\n"
        "so its row of W1 and its entry of b1 get ∂L = 0"
        if dead
        else "every ReLU unit is active"
    )
    ax.text(3.8, -1.15, note, ha="center", va="center", fontsize=11, color=DEAD, style="italic")
    ax.text(
        -0.5,
        2.0,
        "blue: forward values    red: backward gradients ∂L/∂·",
        fontsize=11,
        ha="left",
        va="top",
        color="#333333",
    )
    if title:
        ax.set_title(title, fontsize=14)
    if own:
        fig.tight_layout()
    return fig


def plot_fd_errors(
    hs: Sequence[float],
    errors: Mapping[str, Sequence[float]],
    ax=None,
    title: str = "central difference: error vs step size h",
):
    """log-log |FD(h) - f'| against h, one line per dtype, the best h of each marked."""
    own = ax is None
    if own:
        fig, ax = plt.subplots(figsize=(6.4, 4), dpi=90)
    fig = ax.figure
    for label, errs in errors.items():
        pts = [(h, e) for h, e in zip(hs, errs) if e > 0]  # an exact 0 cannot go on a log axis
        (line,) = ax.loglog([h for h, _ in pts], [e for _, e in pts], "o-", ms=3, label=label)
        h_best, e_best = min(pts, key=lambda p: p[1])
        ax.plot([h_best], [e_best], "*", ms=14, color=line.get_color(), zorder=3)
        ax.annotate(
            f"best h ≈ {h_best:.0e}",
            (h_best, e_best),
            xytext=(-10, -4),
            textcoords="offset points",
            ha="right",
            va="top",
            fontsize=9,
            color=line.get_color(),
        )
    ax.set_xlabel("step h")
    ax.set_ylabel("|finite difference − exact derivative|")
    ax.set_title(title, fontsize=11)
    ax.text(
        0.97,
        0.05,
        "right: truncation ∝ h²\nleft: round-off ∝ ε/h",
        transform=ax.transAxes,
        ha="right",
        va="bottom",
        fontsize=9,
        color="#333333",
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="lower left")
    if own:
        fig.tight_layout()
    return fig
