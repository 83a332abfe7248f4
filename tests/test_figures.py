"""Every figure on the site has text a reader can read: at least 9 CSS px at 1280 px.

Each figure is built the way its chapter builds it: the chapter's own plotting code, cut from
``chapters/src/NN_name.py`` (from the line that makes ``fig`` to the cell's end), runs on small
stand-in data of the same structure (font sizes, figure sizes and dpi come from the chapter and
the helpers, never from here). Every text artist the figure actually draws is recorded, and its
size on the page is

    fontsize_pt × dpi / 72 × min(1, COLUMN_PX / width_px)

where ``width_px`` is the width of the PNG the page shows: the inline backend saves a chapter's
figure with ``bbox_inches="tight"``; an animation (``to_jshtml``) saves whole frames. The page
shows the PNG at its own size (1 image px = 1 CSS px), or scaled down to the column's width
(``div.cell_output img { max-width: 100% }`` in ``_static/custom.css``).

On a 390 px phone the column is about 360 px and a figure is shown at 0.37-0.99 of its size
(chapter 1's graph at 0.37), too small to read; there a tap opens it at its own size
(``_static/reader.js``), where each text is ``fontsize_pt × dpi / 72`` px, at least the size
measured here. ``tests/test_site.py::test_every_figure_can_be_read_at_full_size_on_a_phone``
opens every figure of every page at 390 px and checks that it opens at 1 image px per CSS px,
so this test's 9 px rule holds on a phone too.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.text import Text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# The text column of a chapter page on a 1280 px wide screen (sphinx-book-theme with the
# course's .bd-article-container max-width of 52rem): images wider than this are scaled down.
COLUMN_PX = 688
MIN_PX = 9.0


# --------------------------------------------------------------------------- measuring


def text_sizes(fig, tight: bool = True) -> tuple[int, list[tuple[float, str]]]:
    """(PNG width in px, [(rendered size in CSS px, text)] for every text the figure draws).

    One Agg draw records the texts; the width is that of the tight bounding box padded by
    0.1 in, as ``savefig(bbox_inches="tight")`` crops (the same pixel count, ±1).
    """
    drawn: dict[int, Text] = {}
    original = Text.draw

    def record(self, renderer):
        if self.get_visible() and self.get_text().strip():
            drawn[id(self)] = self
        return original(self, renderer)

    canvas = FigureCanvasAgg(fig)  # an animation's figure was closed: give it a canvas again
    Text.draw = record
    try:
        canvas.draw()
    finally:
        Text.draw = original
    width_in = fig.get_tightbbox(canvas.get_renderer()).padded(0.1).width if tight else fig.get_figwidth()
    width = round(width_in * fig.dpi)
    scale = fig.dpi / 72 * min(1.0, COLUMN_PX / width)
    sizes = sorted((t.get_fontsize() * scale, t.get_text()) for t in drawn.values())
    return width, sizes


# --------------------------------------------------------------------- chapters' own code


def chapter_cell(chapter: str, marker: str) -> str:
    """The code cell of chapters/src/<chapter>*.py that contains ``marker``."""
    (src,) = (ROOT / "chapters" / "src").glob(f"{chapter}_*.py")
    cells = [c for c in re.split(r"\n(?=# %%)", src.read_text()) if marker in c]
    assert len(cells) == 1, f"{src.name}: {len(cells)} cells contain {marker!r}"
    return cells[0]


def figure_code(chapter: str, marker: str) -> str:
    """The chapter's figure code: from the line that makes ``fig`` (or ``anim``) to the cell's end.

    ``HTML(X.to_jshtml(...))`` becomes ``anim = X``: the test draws the animation's first
    frame (every animation helper draws frame 0 before it returns) without encoding them all.
    """
    lines = chapter_cell(chapter, marker).splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"(fig|anim)\b.*=|HTML\(", line))
    code = "\n".join(lines[start:])
    return re.sub(r"HTML\((.*)\.to_jshtml\(.*\)\)", r"anim = \1", code)


def run_figure(chapter: str, marker: str, **names):
    """Run the chapter's figure code with ``names`` standing in for its data; returns (fig, tight)."""
    plt.close("all")
    scope = {"plt": plt, "torch": torch, "show": lambda *a, **k: None, **names}
    exec(compile(figure_code(chapter, marker), f"chapter {chapter}", "exec"), scope)
    if "anim" in scope:
        anim = scope["anim"]
        anim._draw_was_started = True  # measured, never played: no "deleted without rendering"
        return anim._fig, False
    return scope["fig"], True


# ------------------------------------------------------------------ stand-in data per figure


def _cat():
    from helpers import cat_mlp

    p = cat_mlp.cat_params(dtype=torch.float64)
    cache = cat_mlp.forward(**p)
    return {"p": p, "cache": cache, "grads": cat_mlp.backward(cache, p["W2"], p["y_true"])}


def _ch1_graph():
    from helpers.plot_cat import draw_cat_graph

    return run_figure("01", "draw_cat_graph(cache", draw_cat_graph=draw_cat_graph, **_cat())


def _ch1_sweep():
    from helpers.widgets_cat import sweep_animation

    values = [-0.26 + 0.04 * k for k in range(11)]
    return run_figure("01", "sweep_animation(", sweep_animation=sweep_animation, values=values)


def _ch2_fd():
    from helpers.plot_cat import plot_fd_errors

    hs = [10 ** (-k / 4) for k in range(9)]
    errors = {dt: [h * h + 1e-4 / h for h in hs] for dt in ("float32", "float64")}
    return run_figure("02", "plot_fd_errors(hs", plot_fd_errors=plot_fd_errors, hs=hs, errors=errors)


def _ch3_graph():
    from helpers.autograd_graph import autograd_graph
    from helpers.cat_mlp import cat_params
    from helpers.plot_graph import plot_graph

    p = cat_params(dtype=torch.float64)
    x, W1, b1, W2, b2 = (p[k].clone().requires_grad_() for k in ("x", "W1", "b1", "W2", "b2"))
    h = W1 @ x + b1
    a = torch.relu(h)
    y_hat = W2 @ a + b2
    L = 0.5 * ((y_hat - p["y_true"]) ** 2).sum()
    names = {"x": x, "W1": W1, "b1": b1, "W2": W2, "b2": b2, "h": h, "a": a, "y_hat": y_hat, "L": L}
    graph = autograd_graph(L, names)
    return run_figure("03", "fig = plot_graph(", plot_graph=plot_graph, graph=graph)


def _ch4_gelu():
    import helpers.functions as hf

    xs = torch.linspace(-4, 4, 201, dtype=torch.float64)
    return run_figure("04", "d_erf = hf.gelu_backward", hf=hf, xs_cpu=xs, d_erf=torch.sigmoid(1.7 * xs))


def _ch5_ce_mse():
    from helpers.plot_flow import plot_ce_vs_mse

    scales = [0.5, 1, 2, 4, 8, 16, 32, 64]
    ce, mse = [1.0 + 0.01 * s for s in scales], [0.5 * s for s in scales]
    return run_figure(
        "05",
        "plot_ce_vs_mse(scales",
        plot_ce_vs_mse=plot_ce_vs_mse,
        scales=scales,
        ce_norms=ce,
        mse_norms=mse,
    )


ARCHS = ((False, False), (True, False), (False, True), (True, True))
ACTS = ("sigmoid", "relu", "gelu")
# Per-layer norms over two decades: log axes draw a tick per 1-9 × 10^k, so the stand-ins span
# few decades to keep the test fast (the chapters' tick labels share one size however many).
DECAY = [10.0 ** (-k / 10) for k in range(20)]


def _ch5_grid():
    from helpers.plot_flow import plot_flow_grid

    arch_name = {a: f"residual {a[0]}, LayerNorm {a[1]}" for a in ARCHS}
    inits = (1.0, 2.0)
    by_arch = {(arch_name[a], i, act): DECAY for a in ARCHS for i in inits for act in ACTS}
    scope = {"by_arch": by_arch, "archs": ARCHS, "arch_name": arch_name, "acts": ACTS, "inits": inits}
    return run_figure("05", "fig = plot_flow_grid(", plot_flow_grid=plot_flow_grid, **scope)


def _ch5_flow_animation():
    from helpers.widgets_flow import flow_animation

    done = {(act, res, ln, 1.0): DECAY for res, ln in ARCHS for act in ACTS}
    return run_figure("05", "flow_animation(depth", flow_animation=flow_animation, done=done)


def _ch6_masks():
    from helpers.attention import causal_mask

    masks = {"M_top_left": causal_mask(4, 7), "M_bottom_right": causal_mask(4, 7, align="bottom_right")}
    return run_figure("06", "subplot_mosaic", causal_mask=causal_mask, **masks)


def _ch6_heat():
    P = torch.softmax(torch.randn(2, 4, 8, 8), -1)
    return run_figure("06", '"|dL/dS|"', cache={"P": P}, grad_P=P - 0.1, grad_S=P - 0.2)


def _ch7_residual():
    from helpers.plot_flow import plot_layer_norms

    norms = [2.0**-k for k in range(13)]
    return run_figure(
        "07",
        '"with residual": with_res',
        plot_layer_norms=plot_layer_norms,
        with_res=norms,
        without_res=norms,
    )


def _ch7_gpt():
    from helpers.plot_flow import plot_layer_norms

    return run_figure(
        "07",
        '"block parameters": param_norms',
        plot_layer_norms=plot_layer_norms,
        param_norms=[2.0**-k for k in range(8)],
        stream_norms=[2.0**-k for k in range(9)],
    )


def _ch8_inits():
    names = ("A random, B = 0 (LoRA)", "A = 0, B random (seed 003's prose)", "A = 0, B = 0")
    curves = {name: [1.0 / (1 + k) for k in range(60)] for name in names}
    return run_figure("08", "curves = {}", curves=curves)  # the cell trains first: fig, ax = ... on


def _ch8_rslora():
    ranks = (1, 2, 4, 8, 16, 32, 64)
    dW = {(rs, steps): [0.1 * r for r in ranks] for rs in (False, True) for steps in (1, 20)}
    return run_figure("08", '"o-" if rs else "s--"', dW=dW, ranks=ranks)


def _loss_run(r=4, alpha=16.0):
    return {
        "r": r,
        "alpha": alpha,
        "losses": [3.0 - 0.01 * k for k in range(100)],
        "trainable": 1024,
        "total": 30000,
        "opt_bytes": 8192,
    }


def _ch8_finetune():
    runs = {
        name: {"losses": [3.0 - 0.01 * k for k in range(100)]} for name in ("full", "LoRA Q,V", "LoRA all")
    }
    return run_figure(
        "08",
        "pretrained, before fine-tuning",
        runs=runs,
        eval_lm=lambda *a, **k: 3.2,
        gpt=None,
        ft_held=None,
        cfg=SimpleNamespace(n_ctx=32),
    )


def _ch8_lora_animation():
    from helpers.widgets_lora import lora_animation

    precomputed = {(r, a): _loss_run(r, a) for a in (4.0, 16.0) for r in (1, 4, 16)}
    reference = {"full": _loss_run()["losses"], "LoRA all": _loss_run()["losses"]}
    return run_figure(
        "08",
        "lora_animation(precomputed",
        lora_animation=lora_animation,
        precomputed=precomputed,
        reference=reference,
    )


def _ch9_activations():
    Ns = [128 * 2**k for k in range(7)]
    gib = [n / 1000 for n in Ns]
    return run_figure("09", "fused_GiB, ", Ns=Ns, math_GiB=gib, P_GiB=gib, fused_GiB=gib)


def _ch10_online_softmax():
    from helpers.flash import online_softmax_trace

    x = torch.randn(16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return run_figure("10", "ax1.bar(", x=x, steps=online_softmax_trace(x, block=4))


def _ch10_saved_bytes():
    Ns = [256, 512, 1024, 2048, 4096]
    return run_figure(
        "10", "ax.loglog(Ns, naive_b", Ns=Ns, naive_b=[64 * n for n in Ns], tiled_b=[16 * n for n in Ns]
    )


def _ch11_schedule():
    from helpers.optim import lr_warmup_cosine

    W_up, T = 20, 300
    lrs = [lr_warmup_cosine(s, W_up, T, 1e-2, 1e-3) for s in range(T + 1)]
    return run_figure("11", "ax.plot(range(T + 1), lrs)", W_up=W_up, T=T, lrs=lrs)


def _ch11_losses():
    hist = {"loss": [3.0 - 0.005 * k for k in range(300)]}
    return run_figure("11", 'ax.plot(hist["loss"], lw=1', hist=hist, hist_ref=hist)


FIGURES = {
    "ch1 cat graph (plot_cat.draw_cat_graph)": _ch1_graph,
    "ch1 sweep animation (widgets_cat.sweep_animation)": _ch1_sweep,
    "ch2 finite-difference errors (plot_cat.plot_fd_errors)": _ch2_fd,
    "ch3 autograd graph (plot_graph.plot_graph)": _ch3_graph,
    "ch4 gelu vs relu": _ch4_gelu,
    "ch5 CE vs MSE (plot_flow.plot_ce_vs_mse)": _ch5_ce_mse,
    "ch5 gradient-flow grid (plot_flow.plot_flow_grid)": _ch5_grid,
    "ch5 flow animation (widgets_flow.flow_animation)": _ch5_flow_animation,
    "ch6 causal masks": _ch6_masks,
    "ch6 heat maps P, dL/dP, dL/dS": _ch6_heat,
    "ch7 residual vs none (plot_flow.plot_layer_norms)": _ch7_residual,
    "ch7 GPT gradient norms (plot_flow.plot_layer_norms)": _ch7_gpt,
    "ch8 LoRA inits": _ch8_inits,
    "ch8 rsLoRA ‖ΔW‖": _ch8_rslora,
    "ch8 fine-tuning curves": _ch8_finetune,
    "ch8 LoRA animation (widgets_lora.lora_animation)": _ch8_lora_animation,
    "ch9 activation memory": _ch9_activations,
    "ch10 online softmax": _ch10_online_softmax,
    "ch10 saved bytes": _ch10_saved_bytes,
    "ch11 learning-rate schedule": _ch11_schedule,
    "ch11 loss curves": _ch11_losses,
}


@pytest.mark.parametrize("name", list(FIGURES))
def test_figure_text_at_least_9_px(name):
    fig, tight = FIGURES[name]()
    try:
        width, sizes = text_sizes(fig, tight=tight)
    finally:
        plt.close("all")
    assert sizes, f"{name}: no text drawn"
    small = [f"{px:.1f} px {text!r}" for px, text in sizes if px < MIN_PX]
    where = f"{name} ({width} px wide): text under {MIN_PX:g} px on the page"
    assert not small, f"{where}: " + "; ".join(small[:8])
    print(f"{name}: {width} px wide, smallest text {sizes[0][0]:.1f} px ({sizes[0][1]!r})")


def test_every_chapter_figure_is_measured():
    """A new figure in a chapter needs an entry in FIGURES (counted by plt.show() and to_jshtml)."""
    measured = {}
    for key in FIGURES:
        chapter = int(re.match(r"ch(\d+)", key).group(1))
        measured[chapter] = measured.get(chapter, 0) + 1
    found = {}
    for src in sorted((ROOT / "chapters" / "src").glob("[0-9][0-9]_*.py")):
        text = src.read_text()
        n = text.count("plt.show()") + text.count(".to_jshtml(") + text.count("\nfig = plot_graph(")
        if n:
            found[int(src.name[:2])] = n
    assert found == measured, "a chapter gained or lost a figure: update FIGURES"


# ------------------------------------------------------------------- listings of helpers


def _listed():
    import helpers.attention as ha
    import helpers.checkpoint as hc
    import helpers.lora as hl
    import helpers.precision as hp

    return {
        "ha.attention_backward": ha.attention_backward,
        "Attention": ha.Attention,
        "ha.masked_softmax": ha.masked_softmax,
        "ha.mha_backward": ha.mha_backward,
        "LoRALinearFunction.setup_context": hl.LoRALinearFunction.setup_context,
        "block_activation_bytes": hc.block_activation_bytes,
        "recompute_backward": hc.recompute_backward,
        "Checkpoint": hc.Checkpoint,
        "loss_scale_step": hp.loss_scale_step,
    }


def test_helper_listings_fit_88_columns():
    """Chapters print helpers' source (inspect.getsource) into 88-column output boxes.

    Helpers are formatted at 110 columns, so the functions a chapter lists keep their own lines
    (docstrings, comments, error messages) within 88.
    """
    import inspect

    shown = set()
    for src in sorted((ROOT / "chapters" / "src").glob("[0-9][0-9]_*.py")):
        shown |= set(re.findall(r"inspect\.getsource\(([\w.]+)\)", src.read_text()))
    listed = _listed()
    assert shown == set(listed), "chapters list other helpers: update _listed()"
    long = [
        f"{name}: {len(line)} columns: {line.strip()[:60]}"
        for name, obj in listed.items()
        for line in inspect.getsource(obj).splitlines()
        if len(line) > 88
    ]
    assert not long, "helper source printed by a chapter is wider than 88 columns:\n" + "\n".join(long)
