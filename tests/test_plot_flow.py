import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from helpers.plot_flow import plot_ce_vs_mse, plot_flow_grid, plot_layer_norms  # noqa: E402


def test_layer_norms_log_axis_and_zero_floor():
    fig = plot_layer_norms({"relu": [1e-3, 1e-2, 0.0], "sigmoid": [1e-9, 1e-5, 1e-1]}, title="t")
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert len(ax.lines) == 2
    assert min(ax.lines[0].get_ydata()) > 0  # the exact zero is drawn at the floor
    assert list(ax.lines[1].get_xdata()) == [1, 2, 3]
    plt.close(fig)


def test_layer_norms_rejects_empty():
    with pytest.raises(ValueError, match="curves"):
        plot_layer_norms({})


def test_flow_grid_shape_and_single_legend():
    labels = ["sigmoid", "relu"]
    norms = {(r, c, lab): [1.0, 0.5] for r in (1, 2) for c in ("a", "b", "c") for lab in labels}
    fig = plot_flow_grid(
        norms, rows=(1, 2), cols=("a", "b", "c"), labels=labels, row_title=lambda r: f"init {r}"
    )
    assert len(fig.axes) == 6
    assert sum(ax.get_legend() is not None for ax in fig.axes) == 1
    assert fig.axes[0].get_title() == "init 1 · a"
    plt.close(fig)


def test_ce_vs_mse():
    fig = plot_ce_vs_mse([1, 10], [0.5, 1.3], [2.0, 20.0])
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and len(ax.lines) == 2
    plt.close(fig)
    with pytest.raises(ValueError):
        plot_ce_vs_mse([1], [1, 2], [1])
