import matplotlib

matplotlib.use("Agg")  # headless

import pytest  # noqa: E402

from helpers.cat_mlp import cat_params  # noqa: E402
from helpers.widgets_cat import cat_panel, params_with, report, slider_specs, sweep, sweep_animation  # noqa: E402


def test_slider_specs_cover_every_input_and_weight():
    specs = slider_specs()
    assert len(specs) == 4 + 8 + 2 + 2 + 1
    assert specs[0] == ("x", (0,), 1.0, -2.5, 2.5)
    assert ("b1", (1,), -0.1, -1.0, 1.0) in specs


def test_params_with_replaces_one_entry_and_rejects_bad_labels():
    p = params_with({"W1[1,2]": 0.5})
    assert p["W1"][1, 2].item() == 0.5 and p["W1"][0, 2].item() == -0.1
    assert cat_params()["W1"][1, 2].item() == 0.2  # the original is untouched
    with pytest.raises(ValueError):
        params_with({"W9": 1.0})


def test_report_has_the_seed_numbers():
    text = report(cat_params(), decimals=8)
    assert "L       = 0.19140625" in text
    assert "∂L/∂W2  = [[-0.63437500,  0.00000000]]" in text
    assert "dead unit(s): [2]" in text


def test_panel_recomputes_when_a_slider_moves(capsys):
    panel = cat_panel()
    assert "L       = 0.191406" in panel.last_text
    assert "dead unit(s): [2]" in panel.last_text
    panel.sliders["b1[1]"].value = 0.3  # h2 = -0.05 + 0.3 = 0.25: the unit comes alive
    text = panel.last_text
    assert "h       = [0.725000, 0.250000]" in text
    assert "all units alive" in text
    assert "∂L/∂b1  = [-0.537500,  0.430000]" in text
    assert "L       = 0.288906" in text
    out = panel.children[1]
    assert [o["output_type"] for o in out.outputs] == ["stream"]
    assert out.outputs[0]["text"] == text + "\n"  # what the reader sees is the recomputed report
    panel.sliders["x[0]"].value = 0.0
    assert panel.last_text != text
    assert len(panel.sliders) == 17
    captured = capsys.readouterr()
    assert "∂L" not in captured.out  # the report does not leak to the cell's own output


def test_panel_with_graph_shows_a_png():
    panel = cat_panel(graph=True)
    out = panel.children[1]
    assert [o["output_type"] for o in out.outputs] == ["stream", "display_data"]
    assert "image/png" in out.outputs[1]["data"]


def test_sweep_and_animation_cross_the_dead_zone():
    values = [-0.2, 0.0, 0.1, 0.2]
    rows = sweep("b1", (1,), values)
    assert [r["cache"]["h"][1].item() > 0 for r in rows] == [False, False, True, True]
    assert rows[0]["grads"]["b1"][1].item() == 0.0 and rows[2]["grads"]["b1"][1].item() != 0.0
    anim = sweep_animation(values=values, dpi=30)
    html = anim.to_jshtml()
    assert "<img" in html or "img" in html
    xs = anim._fig.axes[0].lines[0].get_xdata().tolist()  # the L curve, on a fine grid
    assert len(xs) == 161 and xs[0] == values[0] and abs(xs[-1] - values[-1]) < 1e-12
    assert list(anim._fig.axes[0].lines[1].get_xdata()) == [values[-1]]  # the dot, at the last frame drawn
    vlines = [ln for ln in anim._fig.axes[0].lines if ln.get_linestyle() == "--"]
    assert len(vlines) == 1 and abs(vlines[0].get_xdata()[0] - 0.05) < 1e-12  # h2 = 0 at b1[1] = 0.05


def test_report_rejects_missing_tensor():
    p = cat_params()
    p["W2"] = [[0.5, -0.4]]
    with pytest.raises(ValueError):
        report(p)
