"""Optimizers by hand vs torch.optim, step for step, in float64."""

import math

import pytest
import torch

import helpers.optim as optim_mod
from helpers.checks import max_abs_diff
from helpers.device import randn
from helpers.optim import SGD, Adam, AdamW, adam_update, lr_warmup_cosine
from helpers.train import get_lr, set_lr

STEPS = 10


def problem():
    """A tiny least-squares problem with two parameter tensors (W: (3, 4), b: (3,))."""
    X = randn(8, 4, seed=1, dtype=torch.float64)
    Y = randn(8, 3, seed=2, dtype=torch.float64)
    W = randn(3, 4, seed=3, dtype=torch.float64)
    b = randn(3, seed=4, dtype=torch.float64)
    return X, Y, W, b


def loss_of(X, Y, W, b):
    return ((X @ W.T + b - Y) ** 2).mean() + (W**4).sum() * 0.01  # non-quadratic: g changes shape


def run_torch(make_opt, steps=STEPS):
    X, Y, W, b = problem()
    W.requires_grad_(True), b.requires_grad_(True)
    opt = make_opt([W, b])
    for _ in range(steps):
        opt.zero_grad()
        loss_of(X, Y, W, b).backward()
        opt.step()
    return W.detach(), b.detach(), opt


def run_ours(make_opt, steps=STEPS, mode="manual"):
    X, Y, W, b = problem()
    if mode == "autograd":
        W.requires_grad_(True), b.requires_grad_(True)
    params = {"W": W, "b": b}
    opt = make_opt(params)
    for _ in range(steps):
        if mode == "autograd":
            opt.zero_grad()
            loss_of(X, Y, W, b).backward()
            opt.step()
        else:
            Wg, bg = W.detach().requires_grad_(True), b.detach().requires_grad_(True)
            grad_W, grad_b = torch.autograd.grad(loss_of(X, Y, Wg, bg), [Wg, bg])
            opt.step({"W": grad_W, "b": grad_b})
    return W.detach(), b.detach(), opt


CASES = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1), lambda p: SGD(p, lr=0.1)),
    "sgd_wd": (
        lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.1),
        lambda p: SGD(p, lr=0.1, weight_decay=0.1),
    ),
    "momentum": (
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        lambda p: SGD(p, lr=0.05, momentum=0.9),
    ),
    "nesterov": (
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
        lambda p: SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    ),
    "adam": (lambda p: torch.optim.Adam(p, lr=0.05), lambda p: Adam(p, lr=0.05)),
    "adam_l2": (
        lambda p: torch.optim.Adam(p, lr=0.05, betas=(0.8, 0.99), weight_decay=0.1),
        lambda p: Adam(p, lr=0.05, betas=(0.8, 0.99), weight_decay=0.1),
    ),
    "adamw": (
        lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1),
        lambda p: AdamW(p, lr=0.05, weight_decay=0.1),
    ),
}


@pytest.mark.parametrize("mode", ["manual", "autograd"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch_optim_after_ten_steps(name, mode):
    make_ref, make_ours = CASES[name]
    W_ref, b_ref, _ = run_torch(make_ref)
    W, b, _ = run_ours(make_ours, mode=mode)
    W0 = problem()[2]
    assert max_abs_diff(W, W_ref) < 1e-12 and max_abs_diff(b, b_ref) < 1e-12
    assert max_abs_diff(W, W0) > 1e-3  # and the parameters did move


def test_l2_and_decoupled_weight_decay_differ():
    W_l2, _, _ = run_ours(lambda p: Adam(p, lr=0.05, weight_decay=0.1))
    W_dec, _, _ = run_ours(lambda p: AdamW(p, lr=0.05, weight_decay=0.1))
    W_none, _, _ = run_ours(lambda p: Adam(p, lr=0.05))
    assert max_abs_diff(W_l2, W_dec) > 1e-4
    assert max_abs_diff(W_dec, W_none) > 1e-4


def test_adam_first_step_is_lr_times_sign():
    """With bias correction, step 1 moves each entry by ≈ η·sign(g) whatever |g| is."""
    theta = torch.zeros(4, dtype=torch.float64)
    g = torch.tensor([1e-3, -2.0, 50.0, -0.5], dtype=torch.float64)
    m, v = torch.zeros_like(theta), torch.zeros_like(theta)
    adam_update(theta, g, m, v, 1, lr=0.1)
    assert max_abs_diff(theta, -0.1 * g.sign()) < 1e-6


def test_broken_bias_correction_fails(monkeypatch):
    """Dropping the bias correction (t stuck at a large value) must break the match."""
    real = optim_mod.adam_update

    def no_bias_correction(theta, g, m, v, t, *args, **kwargs):
        return real(theta, g, m, v, 10**6, *args, **kwargs)

    monkeypatch.setattr(optim_mod, "adam_update", no_bias_correction)
    W_ref, _, _ = run_torch(CASES["adam"][0])
    W, _, _ = run_ours(CASES["adam"][1])
    assert max_abs_diff(W, W_ref) > 1e-3


def test_schedule_endpoints_and_shape():
    kw = dict(warmup=10, total=100, lr_max=1e-3, lr_min=1e-4)
    assert lr_warmup_cosine(0, **kw) == pytest.approx(1e-4)
    assert lr_warmup_cosine(9, **kw) == pytest.approx(1e-3)
    assert lr_warmup_cosine(10, **kw) == pytest.approx(1e-3)
    assert lr_warmup_cosine(55, **kw) == pytest.approx(0.5 * (1e-3 + 1e-4))
    assert lr_warmup_cosine(100, **kw) == pytest.approx(1e-4)
    assert lr_warmup_cosine(500, **kw) == pytest.approx(1e-4)
    lrs = [lr_warmup_cosine(s, **kw) for s in range(101)]
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:11]))  # rises during warm-up
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then only falls
    assert lr_warmup_cosine(3, 0, 10, 1.0, 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.3)))
    with pytest.raises(ValueError):
        lr_warmup_cosine(0, 20, 10, 1.0)


def test_schedule_drives_both_optimizers_alike():
    sched = dict(warmup=3, total=STEPS, lr_max=0.05, lr_min=0.005)
    X, Y, W_ref, b_ref = problem()
    W_ref.requires_grad_(True), b_ref.requires_grad_(True)
    ref = torch.optim.AdamW([W_ref, b_ref], lr=0.0, weight_decay=0.1)
    _, _, W, b = problem()
    W.requires_grad_(True), b.requires_grad_(True)
    ours = AdamW([W, b], lr=0.0, weight_decay=0.1)
    for s in range(STEPS):
        for opt, (Wi, bi) in ((ref, (W_ref, b_ref)), (ours, (W, b))):
            set_lr(opt, lr_warmup_cosine(s, **sched))
            opt.zero_grad()
            loss_of(X, Y, Wi, bi).backward()
            opt.step()
        assert get_lr(ours) == get_lr(ref)
    assert max_abs_diff(W, W_ref) < 1e-12


def test_bad_input():
    with pytest.raises(ValueError):
        SGD([], lr=0.1)
    with pytest.raises(ValueError):
        SGD([torch.zeros(2)], lr=0.1, nesterov=True)
    with pytest.raises(ValueError):
        Adam([torch.zeros(2)], betas=(1.0, 0.9))
    with pytest.raises(ValueError):
        SGD([torch.zeros(2)], lr=0.1).step([torch.zeros(2), torch.zeros(2)])
