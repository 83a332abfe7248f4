"""Chapter 1's live panel (ipywidgets 7 and 8) and its static counterpart for the website.

``cat_panel()`` has one slider per input/weight and recomputes every forward value and
gradient of the cat MLP with ``helpers.cat_mlp`` (hand-written backward, float64).
``sweep_animation()`` moves one number through a range and returns a matplotlib
animation; ``anim.to_jshtml()`` keeps its own slider and buttons on a page with no kernel.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from helpers.cat_mlp import backward, cat_params, forward
from helpers.checks import expect_tensor
from helpers.show import fmt

__all__ = ["slider_specs", "params_with", "report", "cat_panel", "sweep", "sweep_animation"]

# (name, index, lowest, highest) for every slider; x gets a wider range than the weights
_RANGES = {"x": (-2.5, 2.5), "W1": (-1.0, 1.0), "b1": (-1.0, 1.0), "W2": (-1.0, 1.0), "b2": (-1.0, 1.0)}


def _label(name: str, index: tuple) -> str:
    """'W1[1,2]' for ('W1', (1, 2))."""
    return f"{name}[{','.join(str(i) for i in index)}]"


def _key(name: str, index: tuple) -> str:
    """A Python identifier for interactive_output: 'W1_1_2'."""
    return "_".join([name] + [str(i) for i in index])


def slider_specs(params: Mapping | None = None) -> list:
    """[(name, index, value, lowest, highest)] for x, W1, b1, W2, b2 in that order."""
    params = params or cat_params()
    specs = []
    for name in ("x", "W1", "b1", "W2", "b2"):
        t = params[name].detach().to("cpu", torch.float64)
        lo, hi = _RANGES[name]
        for index in (
            torch.cartesian_prod(*[torch.arange(n) for n in t.shape]).reshape(t.numel(), -1).tolist()
        ):
            index = tuple(index)
            specs.append((name, index, t[index].item(), lo, hi))
    return specs


def params_with(values: Mapping[str, float], params: Mapping | None = None) -> dict:
    """A copy of the cat parameters (float64) with entries replaced: {'W1[1,2]': 0.3, ...}."""
    base = params or cat_params()
    new = {k: v.detach().clone().to(torch.float64) for k, v in base.items()}
    for label, value in values.items():
        name, _, rest = label.partition("[")
        if name not in new or not rest.endswith("]"):
            raise ValueError(f"params_with: expected a label like 'W1[1,2]', got {label!r}")
        index = tuple(int(i) for i in rest[:-1].split(","))
        new[name][index] = float(value)
    return new


def report(params: Mapping, decimals: int = 6) -> str:
    """Every forward value and every ∂L/∂· of the cat MLP for ``params``, one per line."""
    for name in ("x", "W1", "b1", "W2", "b2", "y_true"):
        expect_tensor(name, params[name])
    p = {k: params[k].detach() for k in ("x", "W1", "b1", "W2", "b2", "y_true")}
    cache = forward(**p)
    grads = backward(cache, p["W2"], p["y_true"])
    dead = [i + 1 for i, v in enumerate(cache["h"].tolist()) if v <= 0]
    f = lambda t: fmt(t, decimals).replace("\n", "\n" + " " * 10)  # noqa: E731
    lines = [
        f"h       = {f(cache['h'])}",
        f"a       = {f(cache['a'])}" + (f"   dead unit(s): {dead} (h ≤ 0)" if dead else "   all units alive"),
        f"ŷ       = {f(cache['y_hat'])}",
        f"L       = {f(cache['L'])}",
        f"∂L/∂ŷ   = {f(grads['y_hat'])}",
        f"∂L/∂W2  = {f(grads['W2'])}",
        f"∂L/∂b2  = {f(grads['b2'])}",
        f"∂L/∂a   = {f(grads['a'])}",
        f"∂L/∂h   = {f(grads['h'])}",
        f"∂L/∂W1  = {f(grads['W1'])}",
        f"∂L/∂b1  = {f(grads['b1'])}",
    ]
    return "\n".join(lines)


def cat_panel(params: Mapping | None = None, decimals: int = 6, graph: bool = False, step: float = 0.05):
    """VBox of sliders (x, W1, b1, W2, b2) + an Output that shows ``report`` (and the graph) live.

    The returned box carries ``.sliders`` ({'W1[1,2]': FloatSlider}) and ``.last_text``
    (the latest report), so code and tests can drive it without a browser.
    """
    import ipywidgets as widgets  # only here: the animation below must not need ipywidgets

    base = {k: v.detach().clone().to(torch.float64) for k, v in (params or cat_params()).items()}
    sliders, keys = {}, {}
    for name, index, value, lo, hi in slider_specs(base):
        label = _label(name, index)
        sliders[label] = widgets.FloatSlider(
            value=value,
            min=lo,
            max=hi,
            step=step,
            description=label,
            readout_format=".2f",
            continuous_update=False,
            style={"description_width": "56px"},
            layout={"width": "250px"},
        )
        keys[_key(name, index)] = label

    out = widgets.Output()
    box = None

    def update(**kw):
        # Write into ``out.outputs`` directly (append_*), not via print inside ``with out:``:
        # the result is the same in Jupyter and Colab, and a notebook test (nbval), which does
        # not route output into widgets, sees no stray cell output.
        p = params_with({keys[k]: v for k, v in kw.items()}, base)
        text = report(p, decimals)
        box.last_text = text
        out.outputs = ()
        out.append_stdout(text + "\n")
        if graph:
            out.append_display_data(_graph_png(p))

    def column(prefixes):
        return widgets.VBox([s for lab, s in sliders.items() if lab.startswith(prefixes)])

    columns = widgets.HBox(
        [column(("x[",)), column(("W1[0,", "b1[0]")), column(("W1[1,", "b1[1]")), column(("W2[", "b2["))]
    )
    box = widgets.VBox([columns, out])
    box.sliders = sliders
    box.last_text = ""
    errors = widgets.interactive_output(update, {k: sliders[lab] for k, lab in keys.items()})
    box.children = (columns, out, errors)  # ``errors`` stays empty unless update() raises
    if not box.last_text:  # interactive_output calls update once; be sure anyway
        update(**{k: sliders[lab].value for k, lab in keys.items()})
    return box


def _graph_png(p: Mapping):
    """The computation graph for ``p`` as an IPython PNG image (drawn off-screen)."""
    import io

    import matplotlib.pyplot as plt
    from IPython.display import Image

    from helpers.plot_cat import draw_cat_graph

    cache = forward(**{k: p[k] for k in ("x", "W1", "b1", "W2", "b2", "y_true")})
    fig = draw_cat_graph(cache, backward(cache, p["W2"], p["y_true"]), p)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=72)
    plt.close(fig)
    return Image(data=buf.getvalue(), format="png")


def sweep(name: str, index: Sequence[int], values: Sequence[float], params: Mapping | None = None) -> list:
    """Forward + backward for each value of one entry: [{'value', 'cache', 'grads'}]."""
    label = _label(name, tuple(index))
    rows = []
    for v in values:
        p = params_with({label: v}, params)
        cache = forward(**{k: p[k] for k in ("x", "W1", "b1", "W2", "b2", "y_true")})
        rows.append({"value": float(v), "cache": cache, "grads": backward(cache, p["W2"], p["y_true"])})
    return rows


def sweep_animation(
    name: str = "b1",
    index: Sequence[int] = (1,),
    values: Sequence[float] | None = None,
    params: Mapping | None = None,
    dpi: int = 72,
    interval: int = 600,
):
    """FuncAnimation: L and the gradients the 2nd hidden unit controls as one entry sweeps a range."""
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation

    if values is None:
        values = [-0.26 + 0.04 * k for k in range(11)]  # steps over h2 = 0, never onto it
    label = _label(name, tuple(index))

    def series(rows):
        return (
            [r["value"] for r in rows],
            [r["cache"]["L"].item() for r in rows],
            {
                "∂L/∂b1[1]": [r["grads"]["b1"][1].item() for r in rows],
                "∂L/∂W1[1,1]": [r["grads"]["W1"][1, 1].item() for r in rows],
                "∂L/∂W2[0,1]": [r["grads"]["W2"][0, 1].item() for r in rows],
                "∂L/∂ŷ": [r["grads"]["y_hat"][0].item() for r in rows],
            },
        )

    rows = sweep(name, index, values, params)  # one frame per value
    vs, L, curves = series(rows)
    lo, hi = min(vs), max(vs)
    fine_vs, fine_L, fine_curves = series(
        sweep(name, index, [lo + (hi - lo) * k / 160 for k in range(161)], params)
    )
    h2 = [r["cache"]["h"][1].item() for r in rows]
    alive = [v > 0 for v in h2]
    # where h2 crosses 0 between two frames (h2 is linear in any single input or weight)
    switches = [
        vs[i] - h2[i] * (vs[i + 1] - vs[i]) / (h2[i + 1] - h2[i])
        for i in range(len(vs) - 1)
        if alive[i] != alive[i + 1]
    ]

    # 8.5 in at 72 dpi: 612 px, shown unscaled in the page column, so 10 pt text is 10 px
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8.5, 3.3), dpi=dpi)
    ax1.plot(fine_vs, fine_L, "-", color="#444444")
    (dot1,) = ax1.plot([vs[0]], [L[0]], "o", ms=9, color="#c0392b")
    ax1.set_xlabel(label)
    ax1.set_ylabel("L")
    dots = []
    for lab, ys in curves.items():
        (line,) = ax2.plot(fine_vs, fine_curves[lab], "-", label=lab)
        (d,) = ax2.plot([vs[0]], [ys[0]], "o", ms=7, color=line.get_color())
        dots.append((d, ys))
    ax2.axhline(0, color="#999999", lw=0.8)
    ax2.set_xlabel(label)
    ax2.set_ylabel("gradient")
    ax2.legend(fontsize=9, loc="upper left")
    for s in switches:
        for ax in (ax1, ax2):
            ax.axvline(s, ls="--", color="#7f8c8d", lw=1)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    title = fig.suptitle("", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.92))

    def draw(i):
        state = (
            "alive: gradient flows into W1[1,:], b1[1], W2[0,1]"
            if alive[i]
            else "dead: ReLU blocks it, those gradients are 0"
        )
        title.set_text(f"{label} = {vs[i]:.3f}   h2 = {h2[i]:.3f}   L = {L[i]:.4f}   unit 2 {state}")
        dot1.set_data([vs[i]], [L[i]])
        for d, ys in dots:
            d.set_data([vs[i]], [ys[i]])
        return [dot1, title] + [d for d, _ in dots]

    draw(0)
    anim = FuncAnimation(fig, draw, frames=len(rows), interval=interval, blit=False)
    plt.close(fig)  # the notebook shows anim.to_jshtml(), not a stray static figure
    return anim
