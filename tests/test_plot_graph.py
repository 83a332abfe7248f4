import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from helpers.autograd_graph import autograd_graph  # noqa: E402
from helpers.cat_mlp import cat_params, forward  # noqa: E402
from helpers.plot_graph import SAVED_COLOR, layout, plot_graph  # noqa: E402


def _graph():
    p = cat_params(requires_grad=True)
    c = forward(**p)
    return autograd_graph(c["L"], {**p, "a": c["a"], "h": c["h"], "L": c["L"]})


def test_layout_one_row_per_depth_no_overlap():
    g = _graph()
    pos = layout(g)
    assert set(pos) == {n["id"] for n in g.nodes}
    for n in g.nodes:
        assert pos[n["id"]][1] == -n["depth"]
    assert len(set(pos.values())) == len(pos)  # no two nodes on the same spot


def test_plot_marks_leaves_and_saved_tensors():
    g = _graph()
    fig = plot_graph(g, title="cat")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert sum("AccumulateGrad" in t for t in texts) == 4
    assert any(t.startswith("W1 (2, 4)") for t in texts)
    saved = [t for t in ax.texts if t.get_color() == SAVED_COLOR]
    assert any("result=a (2,)" in t.get_text() for t in saved)
    assert len(ax.patches) == len(g.nodes)
    assert fig.dpi == 90
    plt.close(fig)


def test_plot_after_backward_says_freed():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = (x.exp() * x).sum()
    y.backward()
    fig = plot_graph(autograd_graph(y, {"x": x}))
    assert any("freed" in t.get_text() for t in fig.axes[0].texts)
    plt.close(fig)
