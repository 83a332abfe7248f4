import matplotlib

matplotlib.use("Agg")  # headless: no display needed

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from helpers.cat_mlp import backward, cat_params, forward  # noqa: E402
from helpers.numgrad import fd_errors  # noqa: E402
from helpers.plot_cat import draw_cat_graph, plot_fd_errors, short  # noqa: E402


def _texts(fig):
    return "\n".join(t.get_text() for ax in fig.axes for t in ax.texts + [ax.title]) + "\n".join(
        t.get_text() for t in fig.texts
    )


def test_short_drops_trailing_zeros_and_signed_zero():
    assert short(torch.tensor([0.725, -0.0, 2.0])) == "[0.725, 0, 2]"
    assert short(torch.tensor([[0.5, -0.4]])) == "[0.5, -0.4]"
    assert short(0.19140625, 8) == "0.19140625"
    assert short(torch.tensor([[1.0, 0.5], [0.0, -0.25]])) == "[[1, 0.5],\n [0, -0.25]]"


def test_cat_graph_shows_the_seed_values_and_gradients():
    p = cat_params()
    c = forward(**p)
    g = backward(c, p["W2"], p["y_true"])
    fig = draw_cat_graph(c, g, p)
    text = _texts(fig)
    for expected in (
        "h = [0.725, -0.15]",
        "a = [0.725, 0]",
        "ŷ = 0.5625",
        "L = 0.19140625",
        "∂L/∂ŷ = -0.875",
        "∂L/∂W2 = [-0.634375, 0]",
        "∂L/∂b2 = -0.875",
        "∂L/∂a = [-0.4375, 0.35]",
        "∂L/∂h = [-0.4375, 0]",
        "∂L/∂W1 = [[-0.4375, -0.875, 0.4375, -0.21875],\n [0, 0, 0, 0]]",
        "∂L/∂b1 = [-0.4375, 0]",
        "dead",
    ):
        assert expected in text, expected
    assert len(fig.axes[0].patches) == 6  # six arrows: x→h, h→a, a→ŷ, ŷ→L, params→h, params→ŷ
    plt.close(fig)


def test_cat_graph_with_all_units_alive_says_so():
    p = cat_params()
    p["b1"] = torch.tensor([0.1, 0.5], dtype=torch.float64)
    c = forward(**p)
    fig = draw_cat_graph(c, backward(c, p["W2"], p["y_true"]))
    assert "every ReLU unit is active" in _texts(fig)
    plt.close(fig)


def test_fd_error_plot_has_one_line_and_one_star_per_dtype():
    hs = [10.0**-k for k in range(0, 13)]
    errs = {
        str(dt): fd_errors(lambda x: x * x * x, lambda x: 3 * x * x, 1.0, hs, dt)
        for dt in (torch.float32, torch.float64)
    }
    fig = plot_fd_errors(hs, errs)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert len(ax.lines) == 4
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["torch.float32", "torch.float64"]
    best = [t.get_text() for t in ax.texts if t.get_text().startswith("best h")]
    assert best == ["best h ≈ 1e-03", "best h ≈ 1e-06"]
    plt.close(fig)


@pytest.fixture(autouse=True)
def _close_all():
    yield
    plt.close("all")
