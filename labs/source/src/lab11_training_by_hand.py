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
# forward → backward → clip → step. Here you write them yourself: each optimizer step must
# give the parameters `torch.optim` gives after ten steps (float64, to 1e-12), and your loop
# with gradient accumulation must give exactly the parameters of one big batch.
# This lab goes with [Chapter 11](../chapters/11_training_by_hand.ipynb).
#
# **Learning goals.** After this lab you can
# * write SGD with momentum, Nesterov and dampening in the order `torch.optim.SGD` uses (where
#   the buffer starts, where the weight decay goes, which step is not dampened);
# * write Adam with its bias correction, and say why the first step is $\eta$ per coordinate;
# * write AdamW's decoupled weight decay and show that it is not Adam's L2 penalty;
# * write a learning-rate warm-up followed by a cosine decay as a plain function;
# * write a training loop in the right order, with gradient accumulation over micro-batches
#   that gives the same step as one big batch.
#
# **How a lab works.** Each exercise states its goal and its points (12 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It answers in one line: `✓` matches (the `max|Δ|` is round-off), `✗`
# what is wrong and where, or `·` not implemented yet. Your instructor grades the notebook
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
from helpers.optim import lr_warmup_cosine
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


def run_torch(make_opt, steps=10):
    """(W, b) after `steps` steps of a torch.optim optimizer fed the same hand
    gradients."""
    theta = init()
    opt = make_opt(list(theta.values()))
    for _ in range(steps):
        grads = grads_at(theta)
        for k in theta:
            theta[k].grad = grads[k]
        opt.step()
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
# `lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01`, then with `lr=0.1, momentum=0.9,
# dampening=0.5, weight_decay=0.01`; atol 1e-12, float64 round-off carried along ten steps):

# %%
sgd_nesterov = dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
sgd_dampened = dict(lr=0.1, momentum=0.9, dampening=0.5, weight_decay=0.01)


def sgd_runs(step):
    """(W, b) after 10 Nesterov steps, then (W, b) after 10 dampened steps of `step`."""
    return tuple(
        t
        for hp in (sgd_nesterov, sgd_dampened)
        for t in run_ours(
            lambda th, g, s, t, hp=hp: step(th, g, s[0], **hp),
            lambda th: (None,),
            what="sgd_step",
        )
    )


check(
    lambda: sgd_runs(sgd_step),
    lambda: tuple(
        t
        for hp in (sgd_nesterov, sgd_dampened)
        for t in run_torch(lambda p, hp=hp: torch.optim.SGD(p, **hp))
    ),
    outputs=("W (Nesterov)", "b (Nesterov)", "W (dampening)", "b (dampening)"),
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
# ## Exercise 2 · Adam, with its bias correction (3 points)
#
# **Goal:** Adam's two running averages start at 0, so early on they are too small by a
# factor $1 - \beta^t$; the bias correction divides it out, and the first step is $\eta$ times
# the sign of $g$ for every coordinate, whatever its scale.
#
# Write `adam_step(theta, g, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)`
# returning `(theta, m, v)`, exactly as `torch.optim.Adam` does one step. `t` counts steps
# from 1; `m` and `v` start as zeros; `weight_decay` is Adam's L2 penalty. Derive the bias
# correction first: with a constant gradient $g$, what is $m_t$ after $t$ steps from
# $m_0 = 0$, and what must you divide it by to get $g$ back? Return the **raw** $m$ and $v$
# (the correction is recomputed at every step), and mind where $\epsilon$ goes: the self-check
# compares to 1e-12.
#
# <details><summary>Hint: the update, in torch's order</summary>
#
# 1. weight decay as `torch.optim.Adam` does it (L2): $g \leftarrow g + \lambda\theta$;
# 2. $m \leftarrow \beta_1 m + (1-\beta_1) g$, $v \leftarrow \beta_2 v + (1-\beta_2) g^2$;
# 3. $\theta \leftarrow \theta - \dfrac{\eta}{1-\beta_1^t}\cdot\dfrac{m}{\sqrt{v}/\sqrt{1-\beta_2^t} + \epsilon}$
#    ($\epsilon$ is added after the division by $\sqrt{1-\beta_2^t}$, as in `torch.optim`).
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def adam_step(theta, g, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """θ ← θ − η/(1−β₁ᵗ) · m/(√v/√(1−β₂ᵗ) + ε), m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², g
    ← g + λθ."""
    # BEGIN SOLUTION
    beta1, beta2 = betas
    g = g + weight_decay * theta
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    denom = v.sqrt() / math.sqrt(1 - beta2**t) + eps
    return theta - lr / (1 - beta1**t) * m / denom, m, v
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

# 10 steps vs torch.optim.Adam (other betas, L2 weight decay), same gradients
_A = randn(4, 4, seed=1201, dtype=torch.float64)
_A = _A @ _A.T / 4 + torch.eye(4, dtype=torch.float64)
_th = randn(3, 4, seed=1202, dtype=torch.float64)
_m, _v = torch.zeros_like(_th), torch.zeros_like(_th)
_ref = _th.clone()
_opt = torch.optim.Adam([_ref], lr=0.03, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)
for _t in range(1, 11):
    _th, _m, _v = adam_step(
        _th, _th @ _A, _m, _v, _t, 0.03, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05
    )
    _ref.grad = _ref.detach() @ _A
    _opt.step()
assert _th.shape == (3, 4) and torch.allclose(_th, _ref.detach(), atol=1e-12, rtol=0)
assert torch.allclose(_v, _opt.state[_ref]["exp_avg_sq"], atol=1e-14, rtol=0)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

# bias correction: the first step is η·sign(g) for every scale of g, and m, v are
# returned raw
_g = torch.tensor([1e-3, -2.0, 50.0, -7e2], dtype=torch.float64)
_th = torch.zeros(4, dtype=torch.float64)
_new, _m, _v = adam_step(
    _th,
    _g,
    torch.zeros(4, dtype=torch.float64),
    torch.zeros(4, dtype=torch.float64),
    1,
    0.01,
    eps=1e-12,
)
assert torch.allclose(_new, -0.01 * torch.sign(_g), atol=1e-9, rtol=0)
assert torch.allclose(_m, 0.1 * _g, rtol=1e-14, atol=0) and torch.allclose(
    _v, 0.001 * _g * _g, rtol=1e-14, atol=0
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

import torch

# a later step uses t: with a constant gradient, m_t = (1 − β₁ᵗ)g, and the step is still
# η·sign(g)
_g = torch.tensor([[3.0, -0.25]], dtype=torch.float64)
_th, _m, _v = (
    torch.zeros(1, 2, dtype=torch.float64),
    torch.zeros(1, 2, dtype=torch.float64),
    torch.zeros(1, 2, dtype=torch.float64),
)
for _t in range(1, 6):
    _prev = _th.clone()
    _th, _m, _v = adam_step(_th, _g, _m, _v, _t, 0.1, eps=0.0)
assert torch.allclose(_th - _prev, -0.1 * torch.sign(_g), atol=1e-12, rtol=0)
assert torch.allclose(_m, (1 - 0.9**5) * _g, atol=1e-14, rtol=0)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: `torch.optim.Adam(lr=0.05, weight_decay=0.1)`, ten steps on the
# tanh layer):


# %%
def adam_driver(step, **hp):
    """Adapt a (θ, g, m, v, t) -> (θ, m, v) step to run_ours; m and v start at zeros."""
    return dict(
        step=lambda th, g, s, t: step(th, g, s[0], s[1], t, **hp),
        fresh_state=lambda th: (torch.zeros_like(th), torch.zeros_like(th)),
    )


check(
    lambda: run_ours(
        **adam_driver(adam_step, lr=0.05, weight_decay=0.1), what="adam_step"
    ),
    lambda: run_torch(lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.1)),
    outputs=("W", "b"),
    name="Exercise 2 · adam_step",
    against="torch.optim.Adam after 10 steps",
    atol=1e-12,
    rtol=0,
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
# decay never enters $m$ and $v$.
#
# Write `adamw_step(theta, g, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)`
# returning `(theta, m, v)`, like `torch.optim.AdamW` (you may call your `adam_step` with
# `weight_decay=0`). The self-check also runs both on a weight the loss ignores ($g = 0$):
# with AdamW it must decay by exactly $(1-\eta\lambda)$ per step.

# %% [raw]
# # BEGIN SOLUTION


# %%
def adamw_step(theta, g, m, v, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    """θ ← θ(1 − ηλ), then the Adam step on g alone (m and v never see λθ); returns (θ,
    m, v)."""
    # BEGIN SOLUTION
    theta = theta * (1 - lr * weight_decay)
    return adam_step(theta, g, m, v, t, lr, betas, eps, weight_decay=0.0)
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

# 10 steps vs torch.optim.AdamW, same gradients
_A = randn(4, 4, seed=1301, dtype=torch.float64)
_A = _A @ _A.T / 4 + torch.eye(4, dtype=torch.float64)
_th = randn(2, 4, seed=1302, dtype=torch.float64)
_m, _v = torch.zeros_like(_th), torch.zeros_like(_th)
_ref = _th.clone()
_opt = torch.optim.AdamW(
    [_ref], lr=0.02, betas=(0.85, 0.995), eps=1e-7, weight_decay=0.3
)
for _t in range(1, 11):
    _th, _m, _v = adamw_step(
        _th, _th @ _A, _m, _v, _t, 0.02, betas=(0.85, 0.995), eps=1e-7, weight_decay=0.3
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
_m, _v = torch.zeros(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
_th, _m, _v = adamw_step(_th, _g, _m, _v, 1, 0.01, weight_decay=0.5)
assert torch.allclose(_m, 0.1 * _g, atol=1e-15, rtol=0) and torch.allclose(
    _v, 0.001 * _g * _g, atol=1e-15, rtol=0
)
for _t in range(2, 8):
    _th, _m, _v = adamw_step(_th, _g, _m, _v, _t, 0.01, weight_decay=0.5)
assert abs(_th[0].item() - 2.0 * (1 - 0.01 * 0.5) ** 7) < 1e-13

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (reference: `torch.optim.AdamW(lr=0.05, weight_decay=0.1)`, ten steps on the
# tanh layer; then a weight at 1 with $g = 0$, ten steps of $\eta = \lambda = 0.1$: AdamW must give
# $(1 - 0.01)^{10}$):


# %%
def idle_weight(step):
    """A weight at 1.0 whose loss gradient is 0, after 10 steps with η = λ = 0.1 (a (1,)
    tensor)."""
    th, m, v = (
        torch.ones(1, dtype=dtype),
        torch.zeros(1, dtype=dtype),
        torch.zeros(1, dtype=dtype),
    )
    for t in range(1, 11):
        out = step(th, torch.zeros(1, dtype=dtype), m, v, t, 0.1, weight_decay=0.1)
        if out is None or out is Ellipsis:
            raise NotImplementedError
        th, m, v = out
    return th


def adamw_answers():
    W, b = run_ours(
        **adam_driver(adamw_step, lr=0.05, weight_decay=0.1), what="adamw_step"
    )
    return W, b, idle_weight(adamw_step)


check(
    adamw_answers,
    lambda: (
        *run_torch(lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1)),
        torch.full((1,), (1 - 0.1 * 0.1) ** 10, dtype=dtype),
    ),
    outputs=("W", "b", "idle weight"),
    name="Exercise 3 · adamw_step",
    against="torch.optim.AdamW and (1 − ηλ)¹⁰",
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# The same idle weight under `torch.optim.Adam` with the same $\lambda$ as an L2 penalty: its only
# gradient is $\lambda\theta$, which Adam normalises into a step of about $\eta$, so ten steps
# take it most of the way to 0 (run your own `adam_step(..., weight_decay=0.1)` on it to see the
# same thing), while decoupled decay leaves it at $(1-\eta\lambda)^{10}$:


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
    "idle weight, torch.optim.Adam  (L2 0.1)  ",
    idle_weight_torch(lambda p: torch.optim.Adam(p, lr=0.1, weight_decay=0.1)),
    6,
)
show(
    "idle weight, torch.optim.AdamW (decay 0.1)",
    idle_weight_torch(lambda p: torch.optim.AdamW(p, lr=0.1, weight_decay=0.1)),
    6,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 2
# by_hand: [helpers.optim.lr_warmup_cosine]

# %% [markdown]
# ## Exercise 4 · Warm-up, then cosine decay (2 points)
#
# **Goal:** the learning rate as a plain function of the step: a short linear warm-up while
# Adam's second moments settle, then a cosine down to a floor.
#
# Write `lr_at(step, warmup, total, lr_max, lr_min=0.0)` returning a Python float, for
# steps counted from 0, with $W$ = `warmup` and $T$ = `total` ($0 \le W < T$):
# * steps $0, \dots, W-1$ climb linearly, the first step already at $\eta_{\max}/W$ (not 0),
#   step $W-1$ at $\eta_{\max}$; with $W = 0$ there is no warm-up;
# * from step $W$ (at $\eta_{\max}$ again) half a cosine period takes it down to
#   $\eta_{\min}$, which step $T$ would reach;
# * from step $T$ on, $\eta_{\min}$.
#
# Write the formula of each piece yourself, then check its ends against the list above.
#
# <details><summary>Hint: the formula</summary>
#
# $$\eta(s) = \begin{cases}
# \eta_{\max}\,\dfrac{s+1}{W} & s < W, \\[4pt]
# \eta_{\min} + \tfrac12(\eta_{\max}-\eta_{\min})\Big(1 + \cos\dfrac{\pi (s - W)}{T - W}\Big) & W \le s < T, \\[4pt]
# \eta_{\min} & s \ge T.
# \end{cases}$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def lr_at(step, warmup, total, lr_max, lr_min=0.0):
    """η_max(s+1)/W for s < W, then η_min + ½(η_max − η_min)(1 + cos π(s−W)/(T−W)),
    η_min for s ≥ T."""
    # BEGIN SOLUTION
    if step < warmup:
        return lr_max * (step + 1) / warmup
    if step >= total:
        return lr_min
    progress = (step - warmup) / (total - warmup)
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * progress))
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

# the landmarks: first step, peak, midpoint, end, after the end
assert abs(lr_at(0, 10, 110, 3e-3, 3e-4) - 3e-4) < 1e-15
assert (
    abs(lr_at(9, 10, 110, 3e-3, 3e-4) - 3e-3) < 1e-15
    and abs(lr_at(10, 10, 110, 3e-3, 3e-4) - 3e-3) < 1e-15
)
assert abs(lr_at(60, 10, 110, 3e-3, 3e-4) - 0.5 * (3e-3 + 3e-4)) < 1e-15
assert (
    abs(lr_at(110, 10, 110, 3e-3, 3e-4) - 3e-4) < 1e-15
    and abs(lr_at(500, 10, 110, 3e-3, 3e-4) - 3e-4) < 1e-15
)
assert isinstance(lr_at(35, 10, 110, 3e-3, 3e-4), float)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

# every step of two schedules, one without warm-up and with the default floor of 0
for _s in range(0, 60):
    _want = 0.5 * 0.1 * (1 + math.cos(math.pi * _s / 50)) if _s < 50 else 0.0
    assert abs(lr_at(_s, 0, 50, 0.1) - _want) < 1e-14, _s
for _s in range(0, 40):
    _want = (
        1.0 * (_s + 1) / 7
        if _s < 7
        else (0.2 + 0.4 * (1 + math.cos(math.pi * (_s - 7) / 26)) if _s < 33 else 0.2)
    )
    assert abs(lr_at(_s, 7, 33, 1.0, 0.2) - _want) < 1e-14, _s

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: `helpers.optim.lr_warmup_cosine`, steps 0 to 39 of a schedule with
# $W = 5$, $T = 30$, $\eta_{\max} = 10^{-2}$, $\eta_{\min} = 10^{-3}$):


# %%
def schedule_of(fn):
    """The 40 learning rates of fn(s, 5, 30, 1e-2, 1e-3), as a float64 tensor."""
    values = [fn(s, 5, 30, 1e-2, 1e-3) for s in range(40)]
    if any(v is None or v is Ellipsis for v in values):
        raise NotImplementedError
    return torch.tensor([float(v) for v in values], dtype=dtype)


check(
    lambda: schedule_of(lr_at),
    lambda: schedule_of(lr_warmup_cosine),
    outputs=("lr per step",),
    name="Exercise 4 · lr_at",
    against="helpers.optim.lr_warmup_cosine",
    atol=1e-15,
    rtol=0,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex5
# points: 3
# by_hand: [helpers.train.train]

# %% [markdown]
# ## Exercise 5 · A training loop with gradient accumulation (3 points)
#
# **Goal:** the loop in the order the chapter gives, and micro-batches whose summed gradients
# are exactly the gradient of one big batch.
#
# Write `train(model, opt, X, Y, steps, accum=1, max_norm=1.0)` for a `model` (an `nn.Module`),
# a `torch.optim` optimizer `opt` over its parameters, inputs `X` `(B, d_in)` and targets `Y`
# `(B, d_out)`, with the loss `F.mse_loss(model(x), y)` (a mean). Each of the `steps` steps
# splits the batch into `accum` equal micro-batches (`X.chunk(accum)`, `Y.chunk(accum)`;
# assume `accum` divides `B`), runs forward and backward on each, clips the global gradient
# norm to `max_norm` (`torch.nn.utils.clip_grad_norm_`) and takes one optimizer step; the
# parameters after every step must be those of one batch of `B` (to 1e-12).
#
# Work out two things first: what `backward()` does to a `.grad` that already holds a
# gradient, and by what each micro-batch loss must be scaled so that the summed gradients are
# the gradient of the full-batch mean. Then put zero_grad, the backward passes, the clip and
# the step in the one order that works.
#
# Return the list of the `steps` losses as Python floats: the loss of a step is the full-batch
# loss before that step (`.item()`).
#
# <details><summary>Hint: the order, and the factor</summary>
#
# 1. `opt.zero_grad()`: `backward()` **adds** into `.grad`;
# 2. for each micro-batch: forward, then `backward()` of the micro-batch loss **divided by
#    `accum`** (the mean of `accum` equal-size means is the full-batch mean); the step's loss
#    is the sum of the divided losses;
# 3. clip, after the last backward;
# 4. `opt.step()`.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def train(model, opt, X, Y, steps, accum=1, max_norm=1.0):
    """zero_grad → (forward → backward of L_i/accum) per micro-batch → clip → step;
    returns [L per step]."""
    # BEGIN SOLUTION
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        L_step = 0.0
        for Xb, Yb in zip(X.chunk(accum), Y.chunk(accum)):
            L = F.mse_loss(model(Xb), Yb) / accum
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


# no clipping, plain SGD (scale-sensitive): 3 micro-batches of 4 = 1 batch of 12, by
# hand
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
    _a, torch.optim.SGD(_a.parameters(), lr=0.2), _X, _Y, 6, accum=3, max_norm=1e9
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


# clipping active, SGD with momentum: clip after the last backward, before the step
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
    accum=2,
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


# accum = B (micro-batches of one) with AdamW gives the losses and parameters of accum =
# 1
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
_a, _b = _model(), _model()
_la = train(
    _a, torch.optim.AdamW(_a.parameters(), lr=0.05), _X, _Y, 5, accum=6, max_norm=0.5
)
_lb = train(
    _b, torch.optim.AdamW(_b.parameters(), lr=0.05), _X, _Y, 5, accum=1, max_norm=0.5
)
assert len(_la) == 5 and all(isinstance(_u, float) for _u in _la)
assert max(abs(_u - _w) for _u, _w in zip(_la, _lb)) < 1e-12 and _la[-1] < _la[0]
assert torch.allclose(
    torch.nn.utils.parameters_to_vector(_a.parameters()),
    torch.nn.utils.parameters_to_vector(_b.parameters()),
    atol=1e-12,
    rtol=0,
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 5** (reference: `helpers.train.train` with one batch of 12; yours runs 4
# micro-batches of 3. Twenty steps of SGD with momentum on a small MLP, once with a clip that is
# active (`max_norm=0.2`) and once with none (`max_norm=inf`), so that a missing `zero_grad`, a
# missing division or a clip in the wrong place each shows):

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


def run_loop(loop, accum, max_norm):
    """(losses, parameters) after 20 steps of SGD(lr=0.1, momentum=0.9) driven by
    `loop`."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = loop(model, opt, X5, Y5, 20, accum, max_norm)
    if losses is None or losses is Ellipsis:
        raise NotImplementedError
    if len(losses) != 20:
        raise ValueError(f"train returned {len(losses)} losses for 20 steps")
    return torch.tensor(
        [float(L) for L in losses], dtype=dtype
    ), nn.utils.parameters_to_vector(model.parameters())


def reference_loop(model, opt, X, Y, steps, accum, max_norm):
    """helpers.train.train, one batch: zero_grad → forward → backward → clip → step."""
    return reference_train(
        opt,
        lambda s: (X, Y),
        steps,
        loss_fn=lambda x, y: F.mse_loss(model(x), y),
        clip=max_norm,
        progress=False,
    )["loss"]


def loop_answers(loop, accum):
    (_, unclipped), (L, clipped) = (
        run_loop(loop, accum, math.inf),
        run_loop(loop, accum, 0.2),
    )
    return unclipped, L, clipped


check(
    lambda: loop_answers(train, 4),
    lambda: loop_answers(reference_loop, 1),
    outputs=("parameters (no clip)", "losses (clip 0.2)", "parameters (clip 0.2)"),
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
