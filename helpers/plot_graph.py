"""Draw an autograd graph (``helpers.autograd_graph.Graph``) with matplotlib (chapter 3).

The layout is computed here, no graphviz: one row per depth (the output on top,
leaves at the bottom), nodes in a row ordered by the mean x of the nodes that send
them a gradient (one barycentre pass, enough for the small graphs of the course).
Arrows point the way gradients flow; leaves (``AccumulateGrad``) are green, the
tensors an op saved for backward are written in orange next to it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import FancyBboxPatch

from helpers.autograd_graph import Graph

__all__ = ["layout", "plot_graph", "OP_COLOR", "LEAF_COLOR", "SAVED_COLOR"]

OP_COLOR = "#dbe9f6"
LEAF_COLOR = "#cdebc5"
SAVED_COLOR = "#c0601a"


def _shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def layout(graph: Graph, dx: float = 1.0, dy: float = 1.0) -> dict:
    """Node id -> (x, y): row y = -depth·dy, x spread by dx and centred, ordered by parents' mean x."""
    rows: dict = {}
    for n in graph.nodes:
        rows.setdefault(n["depth"], []).append(n["id"])
    parents: dict = {}
    for a, b, _k in graph.edges:
        parents.setdefault(b, []).append(a)
    pos: dict = {}
    for depth in sorted(rows):
        ids = rows[depth]

        def bary(i):
            ps = [pos[p][0] for p in parents.get(i, []) if p in pos]
            return (sum(ps) / len(ps) if ps else 0.0, graph.node(i)["kind"] == "leaf", i)

        ids = sorted(ids, key=bary)
        width = (len(ids) - 1) * dx
        for j, i in enumerate(ids):
            pos[i] = (j * dx - width / 2, -depth * dy)
    return pos


def _node_text(n: dict) -> str:
    if n["kind"] == "leaf":
        return f"{n['label'] or 'leaf'} {_shape(n['shape'])}\nAccumulateGrad"
    return n["name"] + (f"\n→ {n['label']}" if n["label"] else "")


def _saved_text(n: dict) -> str:
    parts = []
    for s in n["saved"]:
        if s["freed"]:
            parts.append(f"{s['name']}: freed")
        else:
            parts.append(
                f"{s['name']}" + (f"={s['tensor']}" if s["tensor"] else "") + f" {_shape(s['shape'])}"
            )
    return "saved: " + ", ".join(parts) if parts else ""


def plot_graph(graph: Graph, title: str | None = None, ax=None, figsize=(6.4, 6.0), dpi: int = 90):
    """A figure of the graph: boxes per backward node, arrows along gradient flow, saved tensors in orange."""
    if not graph.nodes:
        raise ValueError("graph: expected at least one node")
    pos = layout(graph, dx=2.6, dy=1.0)
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize, dpi=dpi)
    else:
        fig = ax.figure
    w, h = 2.0, 0.56
    for a, b, _k in graph.edges:
        (x0, y0), (x1, y1) = pos[a], pos[b]
        ax.annotate(
            "",
            xy=(x1, y1 + h / 2),
            xytext=(x0, y0 - h / 2),
            arrowprops=dict(arrowstyle="-|>", color="0.35", lw=1.0, shrinkA=0, shrinkB=0),
        )
    for n in graph.nodes:
        x, y = pos[n["id"]]
        leaf = n["kind"] == "leaf"
        box = FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            fc=LEAF_COLOR if leaf else OP_COLOR,
            ec="0.3",
            lw=0.8,
            zorder=2,
            gid=f"node-{n['id']}",
        )
        ax.add_patch(box)
        ax.text(
            x,
            y,
            _node_text(n),
            ha="center",
            va="center",
            fontsize=7.5,
            zorder=3,
            fontweight="bold" if leaf else "normal",
        )
        saved = _saved_text(n)
        if saved:
            row = [p[0] for p in pos.values() if p[1] == y]
            if x >= max(row):  # free space on the right
                ax.text(
                    x + w / 2 + 0.08,
                    y,
                    saved,
                    ha="left",
                    va="center",
                    fontsize=7,
                    color=SAVED_COLOR,
                    zorder=3,
                )
            elif x <= min(row):  # free space on the left
                ax.text(
                    x - w / 2 - 0.08,
                    y,
                    saved,
                    ha="right",
                    va="center",
                    fontsize=7,
                    color=SAVED_COLOR,
                    zorder=3,
                )
            else:  # neighbours on both sides: under the box
                ax.text(
                    x,
                    y - h / 2 - 0.05,
                    saved,
                    ha="center",
                    va="top",
                    fontsize=6.5,
                    color=SAVED_COLOR,
                    zorder=3,
                )
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - w / 2 - 2.6, max(xs) + w / 2 + 2.6)
    ax.set_ylim(min(ys) - h, max(ys) + h)
    ax.axis("off")
    legend = [
        FancyBboxPatch((0, 0), 1, 1, fc=OP_COLOR, ec="0.3", label="backward op (grad_fn)"),
        FancyBboxPatch((0, 0), 1, 1, fc=LEAF_COLOR, ec="0.3", label="leaf: AccumulateGrad → .grad"),
    ]
    handles = legend + [plt.Line2D([], [], color=SAVED_COLOR, lw=0, marker="$s$", label="saved for backward")]
    ax.legend(handles=handles, loc="lower right", fontsize=7, frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig
