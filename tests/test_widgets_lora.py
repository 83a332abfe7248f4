import matplotlib

matplotlib.use("Agg")

import ipywidgets as W  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from helpers.gpt import GPTConfig, TinyGPT  # noqa: E402
from helpers.widgets_lora import lora_animation, lora_panel, lora_run  # noqa: E402

CFG = GPTConfig(vocab_size=7, n_ctx=8, d_model=8, n_heads=2, n_layers=1, d_ff=16)


def _setup():
    state = TinyGPT(CFG, seed=0).state_dict()
    data = torch.arange(60) % 7
    return state, data


def test_run_counts_and_losses():
    state, data = _setup()
    run = lora_run(CFG, state, data, r=2, alpha=4.0, steps=3, batch_size=2)
    assert len(run["losses"]) == 3
    assert run["trainable"] == 1 * 2 * 2 * (8 + 8)  # layers × (Q, V) × r × (in + out)
    assert run["opt_bytes"] >= 2 * 4 * run["trainable"]


def test_panel_uses_portable_widgets_and_caches_runs():
    state, data = _setup()
    record = []
    box = lora_panel(CFG, state, data, ranks=(1, 2), alphas=(2.0, 4.0), steps=2, record=record)
    assert isinstance(box, W.VBox)
    drops = [w for w in box.children[0].children if isinstance(w, W.Dropdown)]
    assert [d.description for d in drops] == ["rank r", "α"]
    assert any(isinstance(w, W.Output) for w in box.children)
    n0 = len(record)
    drops[0].value = 1
    assert len(record) == n0 + 1 and record[-1]["r"] == 1 and len(record[-1]["losses"]) == 2


def test_animation_one_frame_per_run_with_slider():
    state, data = _setup()
    runs = {(r, 4.0): lora_run(CFG, state, data, r=r, alpha=4.0, steps=2, batch_size=2) for r in (1, 2)}
    anim = lora_animation(runs, reference={"full": [2.0, 1.5]})
    assert anim.frame_keys == [(1, 4.0), (2, 4.0)]
    html = anim.to_jshtml()
    assert html.count("frames[") >= 2 and 'type="range"' in html
    with pytest.raises(ValueError, match="runs"):
        lora_animation({})
