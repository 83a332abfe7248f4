import matplotlib

matplotlib.use("Agg")

import ipywidgets as W  # noqa: E402
import pytest  # noqa: E402

from helpers.widgets_flow import flow_animation, flow_norms, flow_panel, flow_settings  # noqa: E402


def _controls(box):
    found = {}
    stack = [box]
    while stack:
        w = stack.pop()
        if isinstance(w, W.Box):
            stack.extend(w.children)
        elif hasattr(w, "description") and w.description:
            found[w.description] = w
    return found


def test_panel_uses_only_portable_widgets_and_redraws_on_change():
    record = []
    box = flow_panel(width=8, batch=8, record=record)
    assert isinstance(box, W.VBox)
    c = _controls(box)
    assert {"depth", "activation", "residual", "LayerNorm", "init scale"} <= set(c)
    assert isinstance(c["depth"], W.IntSlider) and isinstance(c["activation"], W.Dropdown)
    assert isinstance(c["residual"], W.Checkbox) and isinstance(c["LayerNorm"], W.Checkbox)
    assert any(isinstance(w, W.Output) for w in box.children)
    n0 = len(record)
    c["depth"].value = 5
    c["activation"].value = "sigmoid"
    c["residual"].value = True
    last = record[-1]
    assert len(record) == n0 + 3
    assert (last["depth"], last["activation"], last["residual"]) == (5, "sigmoid", True)
    assert len(last["norms"]) == 5
    assert last["norms"] == flow_norms(5, "sigmoid", True, False, 1.0, width=8, batch=8)


def test_animation_has_one_frame_per_setting_and_a_slider():
    settings = flow_settings(activations=("relu",))
    assert len(settings) == 4
    anim = flow_animation(settings, depth=3, width=8, batch=8)
    assert len(anim.frame_data) == 4
    html = anim.to_jshtml()
    assert html.count("frames[") >= 4 and 'type="range"' in html
    with pytest.raises(ValueError, match="settings"):
        flow_animation([])
