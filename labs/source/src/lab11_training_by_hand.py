# %% [raw]
# # ASSIGNMENT CONFIG
# name: lab11_training_by_hand
# init_cell: false
# check_all_cell: false
# export_cell: false
# run_tests: true
# generate:
#   pdf: false
#   show_stdout: false

# %% [markdown]
# # Lab 11 · Training by hand: optimizer steps, a schedule and gradient accumulation
#
# Chapter 11 wrote SGD, Adam and AdamW as a few tensor operations each, checked them against
# `torch.optim` step for step, and put them in a training loop in the order zero_grad →
# forward → backward → clip → step. Here you write them yourself, with a few variants the
# chapter did not print (dampening, AMSGrad, warm restarts, uneven micro-batches): each
# optimizer step must
# give the parameters `torch.optim` gives after ten steps (float64, to 1e-12), and your loop
# with gradient accumulation must give exactly the parameters of one big batch.
# This lab goes with [Chapter 11](../chapters/11_training_by_hand.ipynb).
#
# **Learning goals.** After this lab you can
# * write SGD with momentum, Nesterov and dampening in the order `torch.optim.SGD` uses (where
#   the buffer starts, where the weight decay goes, which step is not dampened);
# * write Adam with its bias correction and AMSGrad's running maximum of $v$, and say why the
#   first step is $\eta$ per coordinate;
# * write AdamW's decoupled weight decay and show that it is not Adam's L2 penalty;
# * write a learning-rate warm-up followed by cosine decay with warm restarts as a plain
#   function;
# * write a training loop in the right order, with gradient accumulation over micro-batches
#   of a fixed size (the last one smaller) that gives the same step as one big batch.
#
# **How a lab works.** Each exercise states its goal and its points (12 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It answers in one line per check: `✓` matches (the `max|Δ|` is
# round-off), `✗` what is wrong and where, or `·` not implemented yet. Your instructor grades the notebook
# you hand in with hidden tests that call the same functions on other inputs.
#
# The optimizer steps are **functions**: they take a parameter `theta`, its gradient `g` and
# the optimizer's state for that parameter, and return the new `theta` and the new state (you
# may compute new tensors or update the given ones in place and return them). The
# self-checks drive them for ten steps on a small problem (a tanh layer fitted by mean squared
# error, gradients by hand) and compare with `torch.optim` fed the same gradients.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers.device import get_device, no_tf32, randn
from helpers.labcheck import check
from helpers.show import show
from helpers.train import train as reference_train

dev = get_device()
no_tf32()
dtype = torch.float64  # ten steps compared to 1e-12: float64 only
torch.set_num_threads(1)  # tiny tensors: a second thread costs more than it saves

X = randn(8, 4, seed=1, dtype=dtype, device=dev)
Y = randn(8, 3, seed=2, dtype=dtype, device=dev)


def init():
    """The same starting point every time: {'W': (3, 4), 'b': (3,)}."""
    return {
        "W": 0.5 * randn(3, 4, seed=3, dtype=dtype, device=dev),
        "b": 0.1 * randn(3, seed=4, dtype=dtype, device=dev),
    }


def grads_at(p):
    """{grad_W = δᵀX, grad_b = Σδ} of L = mean (tanh(X Wᵀ + b) − Y)², δ = 2/n (a − Y)(1
    − a²)."""
    a = torch.tanh(X @ p["W"].T + p["b"])  # (8, 4) @ (4, 3) -> (8, 3)
    delta = 2 / a.numel() * (a - Y) * (1 - a**2)  # (8, 3)
    return {"W": delta.T @ X, "b": delta.sum(0)}  # (3, 8) @ (8, 4) -> (3, 4)


def run_ours(step, fresh_state, steps=10, what="step"):
    """(W, b) after `steps` calls θ, state = step(θ, g, state, t) per parameter, t = 1,
    2, …"""
    theta = init()
    state = {k: fresh_state(v) for k, v in theta.items()}
    for t in range(1, steps + 1):
        grads = grads_at(theta)
        for k in theta:
            out = step(theta[k], grads[k], state[k], t)
            if out is None or out is Ellipsis:
                raise NotImplementedError
            if not isinstance(out, tuple) or not isinstance(out[0], torch.Tensor):
                raise ValueError(
                    f"{what} should return a tuple (theta, ...), "
                    f"got {type(out).__name__}"
                )
            if out[0].shape != theta[k].shape:
                raise ValueError(
                    f"{what} returned theta of shape {tuple(out[0].shape)} for a "
                    f"parameter of shape {tuple(theta[k].shape)}"
                )
            theta[k], state[k] = out[0], out[1:]
    return theta["W"], theta["b"]


def run_torch(make_opt, steps=10, before=None, after=None):
    """(W, b) after `steps` steps of a torch.optim optimizer fed the same hand
    gradients; before(opt, p, t) / after(opt, p, t) twist each parameter p around step t
    (a known mistake)."""
    theta = init()
    opt = make_opt(list(theta.values()))
    for t in range(1, steps + 1):
        grads = grads_at(theta)
        for k in theta:
            theta[k].grad = grads[k]
            if before:
                before(opt, theta[k], t)
        opt.step()
        for k in theta:
            if after:
                after(opt, theta[k], t)
    return theta["W"], theta["b"]


# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2
# by_hand: [helpers.optim.sgd_update]
# in_place: true

# %% [markdown]
# ## Exercise 1 · SGD with momentum, Nesterov and dampening (2 points)
#
# **Goal:** the details of `torch.optim.SGD` that a textbook formula leaves open, each of
# which changes the numbers: where the weight decay goes, where the momentum buffer starts,
# what Nesterov steps along, and one chapter 11 only mentioned: **dampening** $\tau$, which
# scales the gradient's share of the buffer ($b \leftarrow \mu b + (1-\tau)\,g$) on every
# step but one.
#
# Write `sgd_step(theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False,
# weight_decay=0.0)` (the order of `torch.optim.SGD`'s arguments), for one parameter `theta`
# and its gradient `g` (same shape), returning `(theta, buf)` after one step, exactly as
# `torch.optim.SGD` does. With `momentum` $= 0$ there is no buffer: `buf` stays `None`.
# Work out from chapter 11, section 11.2 (and a few steps of `torch.optim.SGD` on a scalar, if
# in doubt) which step dampening leaves alone.
#
# <details><summary>Hint: the update, in torch's order</summary>
#
# 1. weight decay (L2) first: $g \leftarrow g + \lambda\theta$;
# 2. if $\mu > 0$: the buffer starts at the first gradient, $b \leftarrow g$ when `buf is None`
#    (no dampening on that step), and afterwards $b \leftarrow \mu b + (1-\tau)\,g$; the
#    direction is $d = g + \mu b$ with Nesterov, $d = b$ without. If $\mu = 0$: $d = g$;
# 3. $\theta \leftarrow \theta - \eta\, d$.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def sgd_step(
    theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0
):
    """θ ← θ − η·d, g ← g + λθ, b ← μb + (1−τ)g (b₁ = g), d = g + μb (Nesterov) or b;
    (θ, b)."""
    # BEGIN SOLUTION
    g = g + weight_decay * theta
    if momentum == 0:
        return theta - lr * g, buf
    buf = g.clone() if buf is None else momentum * buf + (1 - dampening) * g
    d = g + momentum * buf if nesterov else buf
    return theta - lr * d, buf
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# momentum without Nesterov, 10 steps of a quadratic, vs torch.optim.SGD fed the same
# gradients
_A = randn(5, 5, seed=1101, dtype=torch.float64)
_A = _A @ _A.T / 5 + torch.eye(5, dtype=torch.float64)
_c = randn(5, seed=1102, dtype=torch.float64)
_th, _buf = randn(5, seed=1103, dtype=torch.float64), None
_ref = _th.clone()
_opt = torch.optim.SGD([_ref], lr=0.05, momentum=0.8)
for _ in range(10):
    _th, _buf = sgd_step(_th, _A @ _th - _c, _buf, 0.05, momentum=0.8)
    _ref.grad = _A @ _ref.detach() - _c
    _opt.step()
assert _th.shape == (5,) and torch.allclose(_th, _ref.detach(), atol=1e-12, rtol=0)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# Nesterov + weight decay on a (2, 3) parameter, vs torch.optim.SGD
_A = randn(3, 3, seed=1111, dtype=torch.float64)
_A = _A @ _A.T / 3 + 0.5 * torch.eye(3, dtype=torch.float64)
_th, _buf = randn(2, 3, seed=1112, dtype=torch.float64), None
_ref = _th.clone()
_opt = torch.optim.SGD([_ref], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05)
for _ in range(10):
    _th, _buf = sgd_step(
        _th, _th @ _A, _buf, 0.1, momentum=0.9, nesterov=True, weight_decay=0.05
    )
    _ref.grad = _ref.detach() @ _A
    _opt.step()
assert _th.shape == (2, 3) and torch.allclose(_th, _ref.detach(), atol=1e-12, rtol=0)
assert torch.allclose(_buf, _opt.state[_ref]["momentum_buffer"], atol=1e-12, rtol=0)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

# the first step: buf = g + λθ (not (1−μ)g, not 0); momentum 0 is plain gradient descent
_th = torch.tensor([1.0, -2.0], dtype=torch.float64)
_g = torch.tensor([0.5, 4.0], dtype=torch.float64)
# clones: in-place updates are allowed
_new, _buf = sgd_step(
    _th.clone(), _g.clone(), None, 0.1, momentum=0.9, weight_decay=0.1
)
assert torch.allclose(_buf, _g + 0.1 * _th, atol=1e-15) and torch.allclose(
    _new, _th - 0.1 * (_g + 0.1 * _th), atol=1e-15
)
_new, _buf = sgd_step(_th.clone(), _g.clone(), None, 0.5)
assert _buf is None and torch.allclose(_new, _th - 0.5 * _g, atol=1e-15)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# dampening with weight decay, 10 steps vs torch.optim.SGD: the first step is not
# dampened
_A = randn(4, 4, seed=1121, dtype=torch.float64)
_A = _A @ _A.T / 4 + torch.eye(4, dtype=torch.float64)
_th, _buf = randn(3, 4, seed=1122, dtype=torch.float64), None
_ref = _th.clone()
_opt = torch.optim.SGD([_ref], lr=0.07, momentum=0.8, dampening=0.4, weight_decay=0.02)
for _ in range(10):
    _th, _buf = sgd_step(
        _th, _th @ _A, _buf, 0.07, momentum=0.8, dampening=0.4, weight_decay=0.02
    )
    _ref.grad = _ref.detach() @ _A
    _opt.step()
assert torch.allclose(_th, _ref.detach(), atol=1e-12, rtol=0)
assert torch.allclose(_buf, _opt.state[_ref]["momentum_buffer"], atol=1e-12, rtol=0)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: `torch.optim.SGD`, ten steps on the tanh layer, twice: with
# `lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01`, then with `lr=0.1, momentum=0.9,
# nesterov=True, weight_decay=0.01`; atol 1e-12, float64 round-off carried along ten steps.
# A known mistake is named by the `torch.optim.SGD` run it matches):

# %%
sgd_dampened = dict(lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01)
sgd_nesterov = dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)


def sgd_runs(step):
    """(W, b) after 10 dampened steps, then (W, b) after 10 Nesterov steps of `step`."""
    return tuple(
        t
        for hp in (sgd_dampened, sgd_nesterov)
        for t in run_ours(
            lambda th, g, s, t, hp=hp: step(th, g, s[0], **hp),
            lambda th: (None,),
            what="sgd_step",
        )
    )


def sgd_torch(hp, before=None, after=None, **changes):
    """W after 10 steps of torch.optim.SGD with the settings hp, changed by
    `changes`."""
    make = lambda p: torch.optim.SGD(p, **{**hp, **changes})  # noqa: E731
    return run_torch(make, before=before, after=after)[0]


def buffer_from_zero(opt, p, t):
    """The momentum buffer starts at 0 (torch's starts at the first gradient)."""
    if t == 1:
        opt.state[p]["momentum_buffer"] = torch.zeros_like(p)


def decay_on_the_step(opt, p, t):
    """Without torch's decay, θ shrunk by ηλ before the step: λθ added to the step."""
    p.mul_(1 - 0.1 * 0.01)


def decay_subtracted(opt, p, t):
    """Without torch's decay, the gradient given is g − λθ."""
    p.grad = p.grad - 0.01 * p


def old_buffer_first_step(opt, p, t):
    """After step 1, a further −ημ·b₁: the look-ahead with the buffer before its
    update."""
    if t == 1:
        p.sub_(0.1 * 0.9 * opt.state[p]["momentum_buffer"])


check(
    lambda: sgd_runs(sgd_step),
    lambda: tuple(
        t
        for hp in (sgd_dampened, sgd_nesterov)
        for t in run_torch(lambda p, hp=hp: torch.optim.SGD(p, **hp))
    ),
    outputs=("W (dampening)", "b (dampening)", "W (Nesterov)", "b (Nesterov)"),
    mistakes={
        "W (dampening)": {
            "SGD with the buffer started at 0": lambda: sgd_torch(
                sgd_dampened, buffer_from_zero
            ),
            "SGD without dampening (τ ignored)": lambda: sgd_torch(
                sgd_dampened, dampening=0.0
            ),
            "SGD with dampening 1 − τ (g scaled by τ)": lambda: sgd_torch(
                sgd_dampened, dampening=0.7
            ),
            "SGD with λθ added to the step, not to g": lambda: sgd_torch(
                sgd_dampened, decay_on_the_step, weight_decay=0.0
            ),
            "SGD on g − λθ (the weight decay subtracted)": lambda: sgd_torch(
                sgd_dampened, decay_subtracted, weight_decay=0.0
            ),
        },
        "W (Nesterov)": {
            "SGD without Nesterov (the look-ahead forgotten)": lambda: sgd_torch(
                sgd_nesterov, nesterov=False
            ),
            "a look-ahead with the buffer before its update": lambda: sgd_torch(
                sgd_nesterov, after=old_buffer_first_step, nesterov=False
            ),
        },
    },
    name="Exercise 1 · sgd_step",
    against="torch.optim.SGD after 10 steps",
    atol=1e-12,
    rtol=0,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 3
# by_hand: [helpers.optim.adam_update]
# in_place: true

# %% [markdown]
# ## Exercise 2 · Adam with AMSGrad, and its bias correction (3 points)
#
# **Goal:** Adam divides each coordinate's step by $\sqrt{\hat v}$, and $\hat v$ forgets: when
# a coordinate's gradients shrink, $v$ shrinks with them and the step grows back. **AMSGrad**
# (`torch.optim.Adam(amsgrad=True)`) divides by the running **maximum** of the second moment
# instead, so the denominator does not shrink when the gradients do. Chapter 11 derived Adam's
# bias correction; here you combine it with that maximum, in the order `torch.optim` uses.
#
# Write `adam_step(theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8,
# weight_decay=0.0)` returning `(theta, m, v, v_max)`, exactly as `torch.optim.Adam` with
# `amsgrad=True` does one step. `t` counts steps from 1; `m`, `v` and `v_max` start as zeros;
# `weight_decay` is Adam's L2 penalty. Work out two things first:
# * the bias correction: with a constant gradient $g$, what is $m_t$ after $t$ steps from
#   $m_0 = 0$, and what must you divide it by to get $g$ back? (The same for $v$.)
# * the maximum: is it taken of $v$ or of the corrected $\hat v$, and can the two differ? A few
#   steps of `torch.optim.Adam(amsgrad=True)` on a scalar whose gradient shrinks settle it;
#   `opt.state[p]` shows what torch keeps.
#
# Return the **raw** $m$ and $v$ (the correction is recomputed at every step), and mind where
# $\epsilon$ goes: the self-check compares to 1e-12.
#
# <details><summary>Hint: the order</summary>
#
# 1. weight decay as `torch.optim.Adam` does it (L2): $g \leftarrow g + \lambda\theta$;
# 2. Adam's two averages $m$ and $v$, as in chapter 11;
# 3. $v_{\max} \leftarrow \max(v_{\max}, v)$, of the **uncorrected** $v$ (that is what torch
#    keeps in `max_exp_avg_sq`);
# 4. the step of chapter 11 in `torch.optim`'s form, with $v_{\max}$ where Adam has $v$
#    ($\epsilon$ added after the division by $\sqrt{1-\beta_2^t}$).
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def adam_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
):
    """AMSGrad: Adam's m and v, v_max ← max(v_max, v), the step divided by √v_max;
    returns (θ, m, v, v_max)."""
    # BEGIN SOLUTION
    beta1, beta2 = betas
    g = g + weight_decay * theta
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    v_max = torch.maximum(v_max, v)
    denom = v_max.sqrt() / math.sqrt(1 - beta2**t) + eps
    return theta - lr / (1 - beta1**t) * m / denom, m, v, v_max
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# 10 steps vs torch.optim.Adam(amsgrad=True) (other betas, L2 weight decay), same
# gradients; the state too
_A = randn(4, 4, seed=1201, dtype=torch.float64)
_A = _A @ _A.T / 4 + torch.eye(4, dtype=torch.float64)
_th = randn(3, 4, seed=1202, dtype=torch.float64)
_m, _v, _vm = (torch.zeros_like(_th) for _ in range(3))
_ref = _th.clone()
_opt = torch.optim.Adam(
    [_ref], lr=0.1, betas=(0.7, 0.8), eps=1e-6, weight_decay=0.05, amsgrad=True
)
for _t in range(1, 11):
    _th, _m, _v, _vm = adam_step(
        _th, _th @ _A, _m, _v, _vm, _t, 0.1, (0.7, 0.8), 1e-6, weight_decay=0.05
    )
    _ref.grad = _ref.detach() @ _A
    _opt.step()
assert _th.shape == (3, 4) and torch.allclose(_th, _ref.detach(), atol=1e-12, rtol=0)
_s = _opt.state[_ref]
assert torch.allclose(_v, _s["exp_avg_sq"], atol=1e-14, rtol=0)
assert torch.allclose(_vm, _s["max_exp_avg_sq"], atol=1e-14, rtol=0)
assert not torch.allclose(_vm, _v, atol=1e-14, rtol=0)  # the maximum was active

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

# bias correction: the first step is η·sign(g) for every scale of g, and m, v are
# returned raw, v_max = v
_g = torch.tensor([1e-3, -2.0, 50.0, -7e2], dtype=torch.float64)
_th = torch.zeros(4, dtype=torch.float64)
_z = torch.zeros(4, dtype=torch.float64)
_new, _m, _v, _vm = adam_step(_th, _g, _z, _z.clone(), _z.clone(), 1, 0.01, eps=1e-12)
assert torch.allclose(_new, -0.01 * torch.sign(_g), atol=1e-9, rtol=0)
assert torch.allclose(_m, 0.1 * _g, rtol=1e-14, atol=0) and torch.allclose(
    _v, 0.001 * _g * _g, rtol=1e-14, atol=0
)
assert torch.allclose(_vm, _v, rtol=1e-14, atol=0)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

import torch

# a gradient that falls from 10 to 0.1: v_max keeps the largest raw v, and each step
# is divided by √v_max / √(1 − β₂ᵗ), as in torch.optim.Adam(amsgrad=True)
_th = torch.tensor([1.0, -1.0], dtype=torch.float64)
_m, _v, _vm = (torch.zeros(2, dtype=torch.float64) for _ in range(3))
_ref = _th.clone()
_opt = torch.optim.Adam([_ref], lr=0.01, betas=(0.5, 0.6), eps=1e-8, amsgrad=True)
_vs = []
for _t, _c in enumerate([10.0, 10.0, 0.1, 0.1, 0.1, 0.1], start=1):
    _g = torch.tensor([_c, -2 * _c], dtype=torch.float64)
    _th, _m, _v, _vm = adam_step(_th, _g, _m, _v, _vm, _t, 0.01, betas=(0.5, 0.6))
    _vs.append(_v.clone())
    _ref.grad = _g.clone()
    _opt.step()
assert torch.allclose(_vm, torch.stack(_vs).amax(0), atol=1e-14, rtol=0)
assert torch.allclose(_th, _ref.detach(), atol=1e-13, rtol=0)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: `torch.optim.Adam(lr=0.05, betas=(0.8, 0.9), weight_decay=0.1,
# amsgrad=True)`, ten steps on the tanh layer; a known mistake is named by the `torch.optim`
# run it matches. Then two single steps from a given state, against the same optimizer: the
# first step from zeros, and a step where $v = v_{\max} = 0$, where $\epsilon$ alone is
# the denominator):


# %%
adam_hp = dict(lr=0.05, betas=(0.8, 0.9), weight_decay=0.1)


def adam_driver(step, **hp):
    """Adapt a (θ, g, m, v, v_max, t) -> (θ, m, v, v_max) step to run_ours; the state
    starts at zeros."""
    return dict(
        step=lambda th, g, s, t: step(th, g, *s, t, **hp),
        fresh_state=lambda th: tuple(torch.zeros_like(th) for _ in range(3)),
    )


def amsgrad_torch(before=None, after=None, opt=torch.optim.Adam, **changes):
    """W after 10 steps of torch's AMSGrad with adam_hp, changed by `changes`."""
    hp = {**adam_hp, "amsgrad": True, **changes}
    return run_torch(lambda p: opt(p, **hp), before=before, after=after)[0]


def bias_factors(t):
    """1 − β₁ᵗ and 1 − β₂ᵗ, as chapter 11 derived them."""
    return 1 - 0.8**t, 1 - 0.9**t


def eps_before_division(opt, p, t):
    """ε/√(1 − β₂ᵗ) given to torch: ε added before the division by √(1 − β₂ᵗ)."""
    opt.param_groups[0]["eps"] = 1e-8 / math.sqrt(bias_factors(t)[1])


def no_bias_correction(opt, p, t):
    """η and ε given to torch such that its correction cancels out."""
    c1, c2 = bias_factors(t)
    opt.param_groups[0].update(lr=0.05 * c1 / math.sqrt(c2), eps=1e-8 / math.sqrt(c2))


def max_corrected_before(opt, p, t):
    """Keep torch's running max in corrected units: undo that before its max …"""
    if t > 1:
        opt.state[p]["max_exp_avg_sq"].mul_(bias_factors(t)[1])


def max_corrected_after(opt, p, t):
    """… and redo it after: the max taken of the corrected v̂."""
    opt.state[p]["max_exp_avg_sq"].div_(bias_factors(t)[1])


def v_is_its_max(opt, p, t):
    """v replaced by the running max after every step (v_max returned as v)."""
    opt.state[p]["exp_avg_sq"] = opt.state[p]["max_exp_avg_sq"].clone()


check(
    lambda: run_ours(**adam_driver(adam_step, **adam_hp), what="adam_step"),
    lambda: run_torch(lambda p: torch.optim.Adam(p, amsgrad=True, **adam_hp)),
    outputs=("W", "b"),
    mistakes={
        "W": {
            "Adam without AMSGrad (v, not its running max)": lambda: amsgrad_torch(
                amsgrad=False
            ),
            "AMSGrad with the max taken of the corrected v̂": lambda: amsgrad_torch(
                max_corrected_before, max_corrected_after
            ),
            "AMSGrad with v replaced by its max (v_max returned as v)": lambda: (
                amsgrad_torch(after=v_is_its_max)
            ),
            "AMSGrad with β₁ and β₂ swapped": lambda: amsgrad_torch(betas=(0.9, 0.8)),
            "AMSGrad with no bias correction": lambda: amsgrad_torch(
                no_bias_correction
            ),
            "AMSGrad with ε added before dividing by √(1 − β₂ᵗ)": lambda: amsgrad_torch(
                eps_before_division
            ),
            "AdamW (λθ left out of g, decoupled)": lambda: amsgrad_torch(
                opt=torch.optim.AdamW
            ),
        }
    },
    name="Exercise 2 · adam_step",
    against="torch.optim.Adam(amsgrad=True) after 10 steps",
    atol=1e-12,
    rtol=0,
)


def torch_adam_step(theta, g, m, v, v_max, t):
    """(θ, m, v, v_max) after one step of torch.optim.Adam(lr=0.05, betas=(0.8, 0.9),
    amsgrad=True) from that state."""
    p, m, v, v_max = theta.clone(), m.clone(), v.clone(), v_max.clone()
    opt = torch.optim.Adam([p], lr=0.05, betas=(0.8, 0.9), amsgrad=True)
    opt.state[p] = dict(
        step=torch.tensor(t - 1.0), exp_avg=m, exp_avg_sq=v, max_exp_avg_sq=v_max
    )
    p.grad = g.clone()
    opt.step()
    s = opt.state[p]
    return p, s["exp_avg"], s["exp_avg_sq"], s["max_exp_avg_sq"]


g1 = torch.tensor([0.3, -2.0, 5e-3, 40.0], dtype=dtype)  # the first gradient
m3 = torch.tensor([0.2, -1.0, 3e-2, 5.0], dtype=dtype)  # m at step 3, v = v_max = 0
zeros = torch.zeros(4, dtype=dtype)


def single_steps(step):
    """m and v after a first step on g1, and the step from (m3, v = 0) with g = 0."""
    z = lambda: zeros.clone()  # noqa: E731 - fresh tensors: in-place updates allowed
    out = step(z() + 1, g1.clone(), z(), z(), z(), 1, 0.05, betas=(0.8, 0.9))
    if out is None or out is Ellipsis:
        raise NotImplementedError
    later = step(z() + 1, z(), m3.clone(), z(), z(), 3, 0.05, betas=(0.8, 0.9))
    return out[1], out[2], later[0] - 1


def single_steps_torch():
    """The same two steps of torch."""
    _, m, v, _ = torch_adam_step(zeros + 1, g1, zeros, zeros, zeros, 1)
    return m, v, torch_adam_step(zeros + 1, zeros, m3, zeros, zeros, 3)[0] - 1


first_m, first_v, step3 = single_steps_torch()
check(
    lambda: single_steps(adam_step),
    single_steps_torch,
    outputs=("m after step 1", "v after step 1", "the step where v = 0"),
    mistakes={
        "m after step 1": {
            "m̂ = m/(1 − β₁): the corrected m returned": first_m / 0.2,
            "(1 − β₂)g, not (1 − β₁)g: β₁ and β₂ swapped": first_m / 0.2 * 0.1,
        },
        "v after step 1": {"an average of |g|, not of g²": first_v / g1.abs()},
        "the step where v = 0": {
            "√ε in place of ε: ε inside the square root": step3 * 1e-4,
            "ε divided by √(1 − β₂ᵗ): ε added before that division": step3
            * math.sqrt(bias_factors(3)[1]),
            "(1 − β₁ᵗ) × the expected step: no bias correction": step3
            * bias_factors(3)[0],
        },
    },
    name="Exercise 2 · adam_step, single steps",
    against="torch.optim.Adam(amsgrad=True)",
    atol=1e-12,
    rtol=1e-12,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 2
# by_hand: [helpers.optim.adam_update]
# in_place: true

# %% [markdown]
# ## Exercise 3 · AdamW: decoupled weight decay is not L2 (2 points)
#
# **Goal:** with L2, the term $\lambda\theta$ joins the gradient before the division by
# $\sqrt{\hat v}$, so a weight with large gradients is barely decayed and a weight with no
# gradient is pushed by a full $\eta$ per step. AdamW shrinks the weights directly,
# $\theta \leftarrow (1 - \eta\lambda)\,\theta$, and then takes the Adam step on $g$ alone: the
# decay never enters $m$, $v$ and $v_{\max}$.
#
# Write `adamw_step(theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8,
# weight_decay=0.01)` returning `(theta, m, v, v_max)`, like `torch.optim.AdamW` with
# `amsgrad=True` (you may call your `adam_step` with `weight_decay=0`). The self-check also
# runs it on a weight the loss ignores ($g = 0$): with AdamW it must decay by exactly
# $(1-\eta\lambda)$ per step.

# %% [raw]
# # BEGIN SOLUTION


# %%
def adamw_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
):
    """θ ← θ(1 − ηλ), then the AMSGrad step on g alone (m, v, v_max never see λθ);
    returns (θ, m, v, v_max)."""
    # BEGIN SOLUTION
    theta = theta * (1 - lr * weight_decay)
    return adam_step(theta, g, m, v, v_max, t, lr, betas, eps, weight_decay=0.0)
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# 10 steps vs torch.optim.AdamW(amsgrad=True), same gradients
_A = randn(4, 4, seed=1301, dtype=torch.float64)
_A = _A @ _A.T / 4 + torch.eye(4, dtype=torch.float64)
_th = randn(2, 4, seed=1302, dtype=torch.float64)
_m, _v, _vm = (torch.zeros_like(_th) for _ in range(3))
_ref = _th.clone()
_opt = torch.optim.AdamW(
    [_ref], lr=0.02, betas=(0.85, 0.995), eps=1e-7, weight_decay=0.3, amsgrad=True
)
for _t in range(1, 11):
    _th, _m, _v, _vm = adamw_step(
        _th, _th @ _A, _m, _v, _vm, _t, 0.02, (0.85, 0.995), 1e-7, weight_decay=0.3
    )
    _ref.grad = _ref.detach() @ _A
    _opt.step()
assert _th.shape == (2, 4) and torch.allclose(_th, _ref.detach(), atol=1e-12, rtol=0)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

# decoupled: an idle weight decays by (1 − ηλ)ᵗ exactly, and m, v never see λθ
_th = torch.tensor([2.0, -3.0], dtype=torch.float64)
_g = torch.tensor([0.0, 5.0], dtype=torch.float64)
_m, _v, _vm = (torch.zeros(2, dtype=torch.float64) for _ in range(3))
_th, _m, _v, _vm = adamw_step(_th, _g, _m, _v, _vm, 1, 0.01, weight_decay=0.5)
assert torch.allclose(_m, 0.1 * _g, atol=1e-15, rtol=0) and torch.allclose(
    _v, 0.001 * _g * _g, atol=1e-15, rtol=0
)
for _t in range(2, 8):
    _th, _m, _v, _vm = adamw_step(_th, _g, _m, _v, _vm, _t, 0.01, weight_decay=0.5)
assert abs(_th[0].item() - 2.0 * (1 - 0.01 * 0.5) ** 7) < 1e-13

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (reference: `torch.optim.AdamW(lr=0.05, weight_decay=0.1, amsgrad=True)`,
# ten steps on the tanh layer, a known mistake named by the `torch.optim` run it matches; then
# a weight at 1 with $g = 0$, ten steps of $\eta = \lambda = 0.1$: AdamW must give
# $(1 - 0.01)^{10}$):


# %%
def idle_weight(step):
    """A weight at 1.0 whose loss gradient is 0, after 10 steps with η = λ = 0.1 (a (1,)
    tensor)."""
    th, m, v, v_max = torch.ones(1, dtype=dtype), *torch.zeros(3, 1, dtype=dtype)
    for t in range(1, 11):
        out = step(
            th, torch.zeros(1, dtype=dtype), m, v, v_max, t, 0.1, weight_decay=0.1
        )
        if out is None or out is Ellipsis:
            raise NotImplementedError
        th, m, v, v_max = out
    return th


def adamw_answers():
    W, b = run_ours(
        **adam_driver(adamw_step, lr=0.05, weight_decay=0.1), what="adamw_step"
    )
    return W, b, idle_weight(adamw_step)


def adamw_torch(opt=torch.optim.AdamW, before=None, after=None, weight_decay=0.1):
    """W after 10 steps of torch's opt(lr=0.05, weight_decay, amsgrad=True)."""
    hp = dict(lr=0.05, weight_decay=weight_decay, amsgrad=True)
    return run_torch(lambda p: opt(p, **hp), before=before, after=after)[0]


def l2_on_the_decayed(opt, p, t):
    """Adam's L2 term on top, λθ of the decayed θ added to g."""
    p.grad = p.grad + 0.1 * (1 - 0.05 * 0.1) * p


def decay_after(opt, p, t):
    """The decay applied after torch's (undecayed) step, to the new θ."""
    p.mul_(1 - 0.05 * 0.1)


check(
    adamw_answers,
    lambda: (
        *run_torch(
            lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1, amsgrad=True)
        ),
        torch.full((1,), (1 - 0.1 * 0.1) ** 10, dtype=dtype),
    ),
    outputs=("W", "b", "idle weight"),
    mistakes={
        "W": {
            "Adam's L2 penalty (λθ added to g), not decoupled decay": lambda: (
                adamw_torch(torch.optim.Adam)
            ),
            "both the decoupled decay and Adam's L2 term": lambda: adamw_torch(
                before=l2_on_the_decayed
            ),
            "the decay without η, θ(1 − λ)": lambda: adamw_torch(
                weight_decay=0.1 / 0.05
            ),
            "the decay applied after the step, to the new θ": lambda: adamw_torch(
                torch.optim.Adam, after=decay_after, weight_decay=0.0
            ),
            "the decay with η twice, θ(1 − η²λ)": lambda: adamw_torch(
                weight_decay=0.1 * 0.05
            ),
        }
    },
    name="Exercise 3 · adamw_step",
    against="torch.optim.AdamW(amsgrad=True) and (1 − ηλ)¹⁰",
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# The same idle weight under `torch.optim.Adam` (AMSGrad too) with the same $\lambda$ as an L2
# penalty: its only gradient is $\lambda\theta$, which Adam normalises into a step of about
# $\eta$, so ten steps take it most of the way to 0 (run your own
# `adam_step(..., weight_decay=0.1)` on it to see the same thing), while decoupled decay leaves
# it at $(1-\eta\lambda)^{10}$:


# %%
def idle_weight_torch(make_opt):
    """The idle weight after 10 steps of a torch.optim optimizer with η = λ = 0.1."""
    th = torch.ones(1, dtype=dtype)
    opt = make_opt([th])
    for _ in range(10):
        th.grad = torch.zeros(1, dtype=dtype)
        opt.step()
    return th.item()


show(
    "idle weight, AMSGrad, torch.optim.Adam  (L2 0.1)  ",
    idle_weight_torch(
        lambda p: torch.optim.Adam(p, lr=0.1, weight_decay=0.1, amsgrad=True)
    ),
    6,
)
show(
    "idle weight, AMSGrad, torch.optim.AdamW (decay 0.1)",
    idle_weight_torch(
        lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.1, amsgrad=True)
    ),
    6,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 2
# by_hand: [helpers.optim.lr_warmup_cosine]

# %% [markdown]
# ## Exercise 4 · Warm-up, then cosine decay with warm restarts (2 points)
#
# **Goal:** chapter 11's schedule ends in one half cosine. **Warm restarts** (SGDR, Loshchilov &
# Hutter; `torch.optim.lr_scheduler.CosineAnnealingWarmRestarts`) repeat that half cosine in
# cycles, each `mult` times longer than the one before, and jump back to $\eta_{\max}$ at the
# start of each: the learning rate as a plain function of the step again, now with a loop
# or a logarithm in it.
#
# Write `lr_at(step, warmup, period, lr_max, lr_min=0.0, mult=2)` returning a Python float, for
# steps counted from 0, with $W$ = `warmup` and $T_0$ = `period`:
# * steps $0, \dots, W-1$ climb linearly as in chapter 11, the first step already at
#   $\eta_{\max}/W$ (not 0), step $W-1$ at $\eta_{\max}$; with $W = 0$ there is no warm-up;
# * from step $W$ on, cycles of $T_0$, $T_0 \cdot$ `mult`, $T_0 \cdot$ `mult`$^2$, … steps
#   (`mult` a whole number $\ge 1$); in each, chapter 11's half cosine from $\eta_{\max}$ at the
#   cycle's first step down towards $\eta_{\min}$, which the step after the cycle's last would
#   reach: that step is instead the first of the next cycle, back at $\eta_{\max}$.
#
# Work out first, for a step $s \ge W$, in which cycle it falls and how far into it; then
# check a few steps against the list above (with $W = 3$, $T_0 = 4$, `mult` $= 2$: restarts at
# steps 3, 7, 15, 31).

# %% [raw]
# # BEGIN SOLUTION


# %%
def lr_at(step, warmup, period, lr_max, lr_min=0.0, mult=2):
    """The warm-up of chapter 11, then half cosines from η_max towards η_min in cycles
    of T₀, T₀·mult, T₀·mult², … steps."""
    # BEGIN SOLUTION
    if step < warmup:
        return lr_max * (step + 1) / warmup
    s, T = step - warmup, period
    while s >= T:
        s, T = s - T, T * mult
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * s / T))
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

# the landmarks: first step, peak, each restart, the midpoint of the second cycle
assert abs(lr_at(0, 10, 20, 3e-3, 3e-4) - 3e-4) < 1e-15
assert abs(lr_at(9, 10, 20, 3e-3, 3e-4) - 3e-3) < 1e-15
for _s in (10, 30, 70, 150):
    assert abs(lr_at(_s, 10, 20, 3e-3, 3e-4) - 3e-3) < 1e-15, _s
assert abs(lr_at(50, 10, 20, 3e-3, 3e-4) - 0.5 * (3e-3 + 3e-4)) < 1e-15
assert isinstance(lr_at(35, 10, 20, 3e-3, 3e-4), float)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math


def _want(s, W, T0, hi, lo, mult):
    if s < W:
        return hi * (s + 1) / W
    s, start, T = s - W, 0, T0
    while s >= start + T:
        start, T = start + T, T * mult
    return lo + 0.5 * (hi - lo) * (1 + math.cos(math.pi * (s - start) / T))


# every step of three schedules: no warm-up and a floor of 0; mult 1; mult 3
for _s in range(0, 80):
    assert abs(lr_at(_s, 0, 5, 0.1) - _want(_s, 0, 5, 0.1, 0.0, 2)) < 1e-14, _s
    assert abs(lr_at(_s, 7, 6, 1.0, 0.2, 1) - _want(_s, 7, 6, 1.0, 0.2, 1)) < 1e-14, _s
    assert abs(lr_at(_s, 2, 3, 1.0, 0.1, 3) - _want(_s, 2, 3, 1.0, 0.1, 3)) < 1e-14, _s

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: `torch.optim.lr_scheduler.LinearLR` for the warm-up, then
# `CosineAnnealingWarmRestarts`; steps 0 to 39 of a schedule with $W = 3$, $T_0 = 4$,
# `mult` $= 2$, $\eta_{\max} = 10^{-2}$, $\eta_{\min} = 10^{-3}$; a known mistake is named by
# the schedule it matches):


# %%
def schedule_of(fn):
    """The 40 learning rates of fn(s, 3, 4, 1e-2, 1e-3, 2), as a float64 tensor."""
    values = [fn(s, 3, 4, 1e-2, 1e-3, 2) for s in range(40)]
    if any(v is None or v is Ellipsis for v in values):
        raise NotImplementedError
    return torch.tensor([float(v) for v in values], dtype=dtype)


def torch_schedule(warmup=3, period=4, lr_min=1e-3, mult=2, n=40):
    """(the first n learning rates, is each a restart?) of torch's LinearLR warm-up and
    CosineAnnealingWarmRestarts, η_max = 1e-2."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-2)
    lrs, restart = [], []
    if warmup:
        warm = torch.optim.lr_scheduler.LinearLR(
            opt, 1 / warmup, 1.0, max(warmup - 1, 1)
        )
        for _ in range(warmup):
            lrs.append(opt.param_groups[0]["lr"])
            restart.append(False)
            opt.step()
            warm.step()
    opt.param_groups[0]["lr"] = 1e-2
    sgdr = torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(
        opt, period, mult, lr_min
    )
    while len(lrs) < n:
        lrs.append(opt.param_groups[0]["lr"])
        restart.append(len(lrs) > warmup + 1 and sgdr.T_cur == 0)
        opt.step()
        sgdr.step()
    return torch.tensor(lrs, dtype=dtype), torch.tensor(restart)


ref, restarts = torch_schedule()
cosine = torch.arange(40) >= 3  # the steps after the warm-up
u = (ref - 1e-3) / (1e-2 - 1e-3)  # where each step sits between η_min (0) and η_max (1)
check(
    lambda: schedule_of(lr_at),
    lambda: ref,
    outputs=("lr per step",),
    mistakes={
        "lr per step": {
            "a warm-up that starts at 0 (one step late)": torch.where(
                cosine, ref, torch.cat([torch.zeros(1, dtype=dtype), ref[:-1]])
            ),
            "cycles that never grow (mult ignored)": lambda: torch_schedule(mult=1)[0],
            "cycles counted from step 0, not from the end of the warm-up": torch.where(
                cosine, torch_schedule(warmup=0)[0], ref
            ),
            "a cosine down to 0, not to η_min": lambda: torch_schedule(lr_min=0.0)[0],
            "a full cosine period (2π) per cycle, not half": torch.where(
                cosine, 1e-3 + (1e-2 - 1e-3) * (2 * u - 1) ** 2, ref
            ),
            "the cosine without its ½ (twice as far above η_min)": torch.where(
                cosine, 2 * ref - 1e-3, ref
            ),
            "η_min at each restart (a cycle one step too long)": torch.where(
                restarts, 1e-3, ref
            ),
        }
    },
    name="Exercise 4 · lr_at",
    against="torch's LinearLR, then CosineAnnealingWarmRestarts",
    atol=1e-15,
    rtol=0,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex5
# points: 3
# by_hand: [helpers.train.train]

# %% [markdown]
# ## Exercise 5 · Gradient accumulation with an uneven last micro-batch (3 points)
#
# **Goal:** the loop in the order the chapter gives, and micro-batches of a fixed size whose
# gradients add up to exactly the gradient of one big batch, even when the last micro-batch
# is smaller than the others.
#
# Write `train(model, opt, X, Y, steps, micro, max_norm=1.0)` for a `model` (an `nn.Module`), a
# `torch.optim` optimizer `opt` over its parameters, inputs `X` `(B, d_in)` and targets `Y`
# `(B, d_out)`, with the loss `F.mse_loss(model(x), y)` (a mean). Each of the `steps` steps
# cuts the batch into micro-batches of `micro` rows (`X.split(micro)`, `Y.split(micro)`: when
# `micro` does not divide `B`, the last one is smaller), runs forward and backward on each,
# clips the global gradient norm to `max_norm` (`torch.nn.utils.clip_grad_norm_`) and takes one
# optimizer step; the parameters after every step must be those of one batch of `B` (to
# 1e-12).
#
# Work out two things first: what `backward()` does to a `.grad` that already holds a
# gradient, and by what each micro-batch loss must be scaled so that the summed gradients are
# the gradient of the full-batch mean when the micro-batches differ in size (with 12 rows in
# micro-batches of 5: 5, 5 and 2). Then put zero_grad, the backward passes, the clip and the
# step in the one order that works.
#
# Return the list of the `steps` losses as Python floats: the loss of a step is the full-batch
# loss before that step (`.item()`).
#
# <details><summary>Hint: the order</summary>
#
# 1. `opt.zero_grad()`: `backward()` **adds** into `.grad`;
# 2. for each micro-batch: forward, then `backward()` of the micro-batch loss times its weight
#    (a mean over $b_i$ rows must count as $b_i$ of the $B$ rows of the full-batch mean); the
#    step's loss is the sum of the weighted losses;
# 3. clip, after the last backward;
# 4. `opt.step()`.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def train(model, opt, X, Y, steps, micro, max_norm=1.0):
    """zero_grad → (forward → backward of L_i weighted by its share of the batch) per
    micro-batch of `micro` rows → clip → step; returns [L per step]."""
    # BEGIN SOLUTION
    B = len(X)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        L_step = 0.0
        for Xb, Yb in zip(X.split(micro), Y.split(micro)):
            L = F.mse_loss(model(Xb), Yb) * len(Xb) / B
            L.backward()
            L_step += L.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        losses.append(L_step)
    return losses
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as F

from helpers.device import randn


# no clipping, plain SGD (scale-sensitive): micro-batches of 5, 5 and 2 = 1 batch of 12,
# by hand
def _model():
    _m = torch.nn.Sequential(
        torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)
    ).double()
    torch.nn.utils.vector_to_parameters(
        0.5 * randn(32, seed=1501, dtype=torch.float64), _m.parameters()
    )
    return _m


_X, _Y = (
    randn(12, 3, seed=1502, dtype=torch.float64),
    randn(12, 2, seed=1503, dtype=torch.float64),
)
_a = _model()
_losses = train(
    _a, torch.optim.SGD(_a.parameters(), lr=0.2), _X, _Y, 6, micro=5, max_norm=1e9
)
_b = _model()
_opt = torch.optim.SGD(_b.parameters(), lr=0.2)
_ref = []
for _ in range(6):
    _opt.zero_grad()
    _L = F.mse_loss(_b(_X), _Y)
    _L.backward()
    _opt.step()
    _ref.append(_L.item())
assert (
    len(_losses) == 6
    and max(abs(float(_u) - _w) for _u, _w in zip(_losses, _ref)) < 1e-12
)
assert torch.allclose(
    torch.nn.utils.parameters_to_vector(_a.parameters()),
    torch.nn.utils.parameters_to_vector(_b.parameters()),
    atol=1e-12,
    rtol=0,
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as F

from helpers.device import randn


# clipping active, SGD with momentum, micro-batches of 3, 3 and 2: clip after the last
# backward, before the step
def _model():
    _m = torch.nn.Sequential(
        torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2)
    ).double()
    torch.nn.utils.vector_to_parameters(
        randn(32, seed=1511, dtype=torch.float64), _m.parameters()
    )
    return _m


_X, _Y = (
    randn(8, 3, seed=1512, dtype=torch.float64),
    3 * randn(8, 2, seed=1513, dtype=torch.float64),
)
_a = _model()
_losses = train(
    _a,
    torch.optim.SGD(_a.parameters(), lr=0.1, momentum=0.9),
    _X,
    _Y,
    8,
    micro=3,
    max_norm=0.1,
)
_b = _model()
_opt = torch.optim.SGD(_b.parameters(), lr=0.1, momentum=0.9)
_norms = []
for _ in range(8):
    _opt.zero_grad()
    F.mse_loss(_b(_X), _Y).backward()
    _norms.append(torch.nn.utils.clip_grad_norm_(_b.parameters(), 0.1).item())
    _opt.step()
assert min(_norms) > 0.1  # clipping was active at every step
assert torch.allclose(
    torch.nn.utils.parameters_to_vector(_a.parameters()),
    torch.nn.utils.parameters_to_vector(_b.parameters()),
    atol=1e-12,
    rtol=0,
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn


# micro-batches of one, and of 4 and 2, with AdamW give the losses and parameters of one
# batch of 6
def _model():
    _m = torch.nn.Sequential(
        torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)
    ).double()
    torch.nn.utils.vector_to_parameters(
        randn(17, seed=1521, dtype=torch.float64), _m.parameters()
    )
    return _m


_X, _Y = (
    randn(6, 2, seed=1522, dtype=torch.float64),
    randn(6, 1, seed=1523, dtype=torch.float64),
)
_runs = []
for _micro in (1, 4, 6):
    _m = _model()
    _L = train(
        _m, torch.optim.AdamW(_m.parameters(), lr=0.05), _X, _Y, 5, _micro, max_norm=0.5
    )
    _runs.append((_L, torch.nn.utils.parameters_to_vector(_m.parameters())))
assert len(_runs[0][0]) == 5 and all(isinstance(_u, float) for _u in _runs[0][0])
for _L, _p in _runs[:2]:
    assert max(abs(_u - _w) for _u, _w in zip(_L, _runs[2][0])) < 1e-12
    assert torch.allclose(_p, _runs[2][1], atol=1e-12, rtol=0)
assert _runs[2][0][-1] < _runs[2][0][0]

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 5** (reference: `helpers.train.train` with one batch of 12; yours runs
# micro-batches of 5, 5 and 2. Twenty steps of SGD with momentum on a small MLP, once with no
# clip (`max_norm=inf`) and once with a clip that is active (`max_norm=0.2`). The optimizer
# keeps a copy of the gradient each `step()` is given, so the check can say which gradient
# your loop stepped with: a known mistake is named by the gradient it gives, computed from
# the micro-batches' own gradients):

# %%
X5 = randn(12, 4, seed=5, dtype=dtype, device=dev)
Y5 = 2 * randn(12, 3, seed=6, dtype=dtype, device=dev)


def mlp():
    """Linear(4, 8) → tanh → Linear(8, 3), float64, the same weights every time."""
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)).to(dev, dtype)
    nn.utils.vector_to_parameters(
        0.7 * randn(67, seed=7, dtype=dtype, device=dev), model.parameters()
    )
    return model


class RecordingSGD(torch.optim.SGD):
    """SGD(lr=0.1, momentum=0.9) that keeps the parameters and the gradient each step()
    is given."""

    def __init__(self, params):
        super().__init__(params, lr=0.1, momentum=0.9)
        self.seen = []  # (parameters, gradient) as flat vectors, one pair per step()

    def step(self, closure=None):
        ps = self.param_groups[0]["params"]
        g = [torch.zeros_like(p) if p.grad is None else p.grad for p in ps]
        flat = nn.utils.parameters_to_vector
        self.seen.append((flat(ps).detach().clone(), flat(g).detach().clone()))
        return super().step(closure)


def run_loop(loop, max_norm):
    """(what the optimizer saw, losses, parameters) after 20 steps of `loop`, with
    micro-batches of 5."""
    model = mlp()
    opt = RecordingSGD(model.parameters())
    losses = loop(model, opt, X5, Y5, 20, 5, max_norm)
    if losses is None or losses is Ellipsis:
        raise NotImplementedError
    if len(losses) != 20:
        raise ValueError(f"train returned {len(losses)} losses for 20 steps")
    L = torch.tensor([float(v) for v in losses], dtype=dtype)
    return opt.seen, L, nn.utils.parameters_to_vector(model.parameters()).detach()


def reference_loop(model, opt, X, Y, steps, micro, max_norm):
    """helpers.train.train, one batch: zero_grad → forward → backward → clip → step."""
    return reference_train(
        opt,
        lambda s: (X, Y),
        steps,
        loss_fn=lambda x, y: F.mse_loss(model(x), y),
        clip=max_norm,
        progress=False,
    )["loss"]


def loop_answers(loop):
    (seen, _, free), (seen_c, L, clipped) = (
        run_loop(loop, math.inf),
        run_loop(loop, 0.2),
    )
    return seen[0][1], seen[1][1], seen_c[0][1], L, free, clipped


def grad_at_start(loss_of):
    """The gradient of loss_of(model) at the starting weights, as one vector."""
    model = mlp()
    grads = torch.autograd.grad(loss_of(model), list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads])


def only_rows(r):
    """The full-batch loss in which only rows r count: every other row's target is the
    model's own output (a zero error)."""

    def loss_of(m):
        out = m(X5)
        keep = torch.zeros(12, 1, dtype=torch.bool, device=dev)
        keep[r] = True
        return F.mse_loss(out, torch.where(keep, Y5, out.detach()))

    return loss_of


rows = torch.arange(12, device=dev).split(5)  # the micro-batches' rows: 5, 5 and 2
# g_i: the gradient of micro-batch i's own mean loss; c_i: the part of the full-batch
# gradient that comes from micro-batch i's rows (they add up to the full-batch gradient)
g_i = [grad_at_start(lambda m, r=r: F.mse_loss(m(X5[r]), Y5[r])) for r in rows]
c_i = [grad_at_start(only_rows(r)) for r in rows]
seen, _, _ = run_loop(reference_loop, math.inf)
seen_c, _, _ = run_loop(reference_loop, 0.2)
clipped_each = torch.zeros_like(
    c_i[0]
)  # clip_grad_norm_ after each micro-batch's backward
for c in c_i:
    clipped_each = clipped_each + c
    clipped_each *= min(1.0, 0.2 / (clipped_each.norm().item() + 1e-6))
last_losses = []  # the last micro-batch's mean loss before each step
for theta, _ in seen_c:
    model = mlp()
    nn.utils.vector_to_parameters(theta, model.parameters())
    last_losses.append(F.mse_loss(model(X5[rows[-1]]), Y5[rows[-1]]).item())

check(
    lambda: loop_answers(train),
    lambda: loop_answers(reference_loop),
    outputs=(
        "gradient at step 1",
        "gradient at step 2",
        "gradient at step 1 (clip 0.2)",
        "losses (clip 0.2)",
        "parameters (no clip)",
        "parameters (clip 0.2)",
    ),
    mistakes={
        "gradient at step 1": {
            "the sum of the micro-batch means' gradients (losses not scaled)": sum(g_i),
            "their mean (each loss divided by the number of micro-batches)": sum(g_i)
            / len(g_i),
            "the last micro-batch's part only (zero_grad inside its loop)": c_i[-1],
            "the first micro-batch's part only (a step per micro-batch)": c_i[0],
            "the last micro-batch's part counted 5/2 times (as if of 5 rows)": sum(c_i)
            + 1.5 * c_i[-1],
        },
        "gradient at step 2": {
            "steps 1 and 2's gradients added (zero_grad forgotten)": seen[0][1]
            + seen[1][1]
        },
        "gradient at step 1 (clip 0.2)": {
            "the unclipped gradient (clipped after opt.step(), or not at all)": seen[0][
                1
            ],
            "the running sum clipped after each micro-batch's backward": clipped_each,
        },
        "losses (clip 0.2)": {
            "the last micro-batch's mean loss at each step": torch.tensor(
                last_losses, dtype=dtype
            )
        },
    },
    name="Exercise 5 · train",
    against="one batch of 12 (helpers.train.train)",
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `sgd_step`, `adam_step`, `adamw_step`,
# `lr_at` and `train`.
