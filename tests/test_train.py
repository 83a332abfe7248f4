"""The training loop: order, manual vs autograd mode, accumulation, clipping, schedule, progress bar."""

import math

import pytest
import torch

from helpers.checks import max_abs_diff
from helpers.device import randn
from helpers.gradflow import clip_grad_norm, global_grad_norm
from helpers.optim import SGD, AdamW, lr_warmup_cosine
from helpers.train import split_batch, train

B = 12


def data():
    X = randn(B, 5, seed=1, dtype=torch.float64)
    Y = randn(B, 2, seed=2, dtype=torch.float64)
    return X, Y


def init():
    return {"W": 0.3 * randn(2, 5, seed=3, dtype=torch.float64), "b": torch.zeros(2, dtype=torch.float64)}


def loss_of(W, b, X, Y):
    """Mean squared error of a tanh layer (non-linear, so the gradient changes along the way)."""
    return ((torch.tanh(X @ W.T + b) - Y) ** 2).mean()


def batch_of(step):
    X, Y = data()
    return X, Y


def run_autograd(make_opt, steps=8, **kw):
    p = {k: v.requires_grad_(True) for k, v in init().items()}
    opt = make_opt(list(p.values()))
    hist = train(
        opt, batch_of, steps, loss_fn=lambda X, Y: loss_of(p["W"], p["b"], X, Y), progress=False, **kw
    )
    return {k: v.detach() for k, v in p.items()}, hist


def grads_fn_for(p):
    def grads_fn(X, Y):
        W, b = p["W"].detach().requires_grad_(True), p["b"].detach().requires_grad_(True)
        L = loss_of(W, b, X, Y)
        grad_W, grad_b = torch.autograd.grad(L, [W, b])
        return L.detach(), {"W": grad_W, "b": grad_b}

    return grads_fn


def run_manual(make_opt, steps=8, **kw):
    p = init()
    opt = make_opt(p)
    hist = train(opt, batch_of, steps, grads_fn=grads_fn_for(p), progress=False, **kw)
    return p, hist


def test_autograd_loop_lowers_the_loss_and_records_history():
    _, hist = run_autograd(lambda ps: torch.optim.SGD(ps, lr=0.5), steps=20)
    assert len(hist["loss"]) == len(hist["lr"]) == len(hist["grad_norm"]) == 20
    assert hist["loss"][-1] < 0.9 * hist["loss"][0]
    assert all(lr == 0.5 for lr in hist["lr"])


def test_manual_mode_equals_autograd_mode():
    p_ref, h_ref = run_autograd(lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1))
    p, h = run_manual(lambda ps: AdamW(ps, lr=0.05, weight_decay=0.1))
    assert max_abs_diff(p["W"], p_ref["W"]) < 1e-12
    assert max(abs(a - b) for a, b in zip(h["loss"], h_ref["loss"])) < 1e-12


def test_matches_a_loop_written_out():
    """zero_grad → forward → backward → step, by hand: the same parameters."""
    p = {k: v.requires_grad_(True) for k, v in init().items()}
    opt = torch.optim.SGD(list(p.values()), lr=0.3, momentum=0.9)
    X, Y = data()
    for _ in range(8):
        opt.zero_grad()
        loss_of(p["W"], p["b"], X, Y).backward()
        opt.step()
    p_loop, _ = run_autograd(lambda ps: torch.optim.SGD(ps, lr=0.3, momentum=0.9))
    assert max_abs_diff(p_loop["W"], p["W"].detach()) < 1e-15
    # ... and forgetting zero_grad (the snowball) gives something else.
    q = {k: v.requires_grad_(True) for k, v in init().items()}
    opt = torch.optim.SGD(list(q.values()), lr=0.3, momentum=0.9)
    for _ in range(8):
        loss_of(q["W"], q["b"], X, Y).backward()
        opt.step()
    assert max_abs_diff(q["W"].detach(), p["W"].detach()) > 1e-2


@pytest.mark.parametrize("accum", [2, 3, 5])
@pytest.mark.parametrize("mode", ["autograd", "manual"])
def test_accumulation_equals_full_batch(accum, mode):
    run = run_autograd if mode == "autograd" else run_manual
    make = (
        (lambda ps: torch.optim.SGD(ps, lr=0.5, momentum=0.9))
        if mode == "autograd"
        else (lambda ps: SGD(ps, lr=0.5, momentum=0.9))
    )
    p1, h1 = run(make, accum=1)
    pk, hk = run(make, accum=accum)  # 12 rows in 5 micro-batches: sizes 3, 3, 2, 2, 2
    assert max_abs_diff(pk["W"], p1["W"]) < 1e-14
    assert max(abs(a - b) for a, b in zip(h1["loss"], hk["loss"])) < 1e-14


def test_split_batch_weights():
    X, Y = data()
    parts = split_batch((X, Y), 5)
    assert [p[0].shape[0] for p in parts] == [3, 3, 2, 2, 2]
    assert math.isclose(sum(p[2] for p in parts), 1.0)
    with pytest.raises(ValueError):
        split_batch((X, Y), 13)
    with pytest.raises(ValueError):
        split_batch((X, Y[:5]), 2)


def test_clipping_limits_the_step_and_records_norm_before():
    p0 = init()
    p, h = run_manual(lambda ps: SGD(ps, lr=1.0), steps=1, clip=1e-3)
    step = torch.cat([(p[k] - p0[k]).flatten() for k in p]).norm().item()
    assert h["grad_norm"][0] > 1e-2  # the norm before clipping
    assert step == pytest.approx(1e-3, rel=1e-5)  # ‖Δθ‖ = η · max_norm
    pa, ha = run_autograd(lambda ps: torch.optim.SGD(ps, lr=1.0), steps=3, clip=1e-3)
    pm, hm = run_manual(lambda ps: SGD(ps, lr=1.0), steps=3, clip=1e-3)
    assert max_abs_diff(pa["W"], pm["W"]) < 1e-15


def test_clipping_given_gradients_matches_torch():
    """The manual mode clips gradient tensors themselves (are_grads=True), a dict or a list."""
    gs = [randn(3, 4, seed=7, dtype=torch.float64), randn(5, seed=8, dtype=torch.float64)]
    ps = [g.clone().requires_grad_(True) for g in gs]
    for p, g in zip(ps, gs):
        p.grad = g.clone()
    ref = torch.nn.utils.clip_grad_norm_(ps, 0.5)
    ours = clip_grad_norm({"W": gs[0], "b": gs[1]}, 0.5, are_grads=True)
    assert abs(ours.item() - ref.item()) < 1e-14
    assert max_abs_diff(gs[0], ps[0].grad) < 1e-15
    assert global_grad_norm(gs, are_grads=True).item() == pytest.approx(0.5, rel=1e-5)


def test_schedule_is_applied_before_each_step():
    sched = lambda s: lr_warmup_cosine(s, 2, 8, 0.1, 0.01)
    _, h = run_manual(lambda ps: SGD(ps, lr=0.0), steps=8, lr_schedule=sched)
    _, ha = run_autograd(lambda ps: torch.optim.SGD(ps, lr=0.0), steps=8, lr_schedule=sched)
    assert h["lr"] == ha["lr"] == [sched(s) for s in range(8)]


def test_progress_bar_goes_to_stderr_and_env_var_silences_it(capfd, monkeypatch):
    monkeypatch.delenv("BPBH_NO_PROGRESS", raising=False)
    p = init()
    train(SGD(p, lr=0.1), batch_of, 3, grads_fn=grads_fn_for(p), desc="demo")
    out, err = capfd.readouterr()
    assert out == "" and "demo" in err and "3/3" in err
    monkeypatch.setenv("BPBH_NO_PROGRESS", "1")
    train(SGD(p, lr=0.1), batch_of, 3, grads_fn=grads_fn_for(p), desc="demo")
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_bad_input():
    p = init()
    with pytest.raises(ValueError):
        train(SGD(p, lr=0.1), batch_of, 3)
    with pytest.raises(ValueError):
        train(SGD(p, lr=0.1), batch_of, 3, loss_fn=lambda *a: 0, grads_fn=lambda *a: 0)
    with pytest.raises(ValueError):
        train(
            torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1),
            batch_of,
            3,
            grads_fn=grads_fn_for(p),
        )


def test_lm_loss_eval_lm_and_the_loop_on_a_tiny_gpt():
    """Chapter 8's use: lm_loss is next-token cross-entropy, eval_lm its mean over fixed windows, train lowers it."""
    import torch.nn.functional as F

    from helpers.gpt import GPTConfig, TinyGPT, get_batch
    from helpers.train import eval_lm, lm_loss

    cfg = GPTConfig(vocab_size=7, n_ctx=8, d_model=8, n_heads=2, n_layers=1, d_ff=16)
    model, data = TinyGPT(cfg, seed=0), torch.arange(60) % 7
    idx, targets = get_batch(data, 4, 8, seed=3)  # (4, 8), (4, 8)
    assert torch.equal(
        lm_loss(model, idx, targets), F.cross_entropy(model(idx).reshape(-1, 7), targets.reshape(-1))
    )
    by_hand = sum(lm_loss(model, *get_batch(data, 4, 8, seed=s)).item() for s in (3, 4)) / 2
    assert eval_lm(model, data, batches=2, batch_size=4, n_ctx=8, seed=3) == pytest.approx(by_hand, rel=1e-6)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    hist = train(
        opt,
        lambda s: get_batch(data, 4, 8, seed=s),
        30,
        loss_fn=lambda i, t: lm_loss(model, i, t),
        progress=False,
    )
    assert hist["loss"][-1] < hist["loss"][0]
