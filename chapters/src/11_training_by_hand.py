# %% [markdown]
# # 11. Training by hand: optimizers, a tiny GPT trained on our own backward passes, and gradients across processes
#
# Ten chapters computed [gradients](../pages/glossary.md#term-gradient). Seed 004 ends where this chapter starts: once the gradient is
# computed, how should the parameters be updated with it, and how large a step should they
# take? Its next episodes are gradient descent, then Adam. Here the loop closes: we write the optimizers
# ourselves, put them in a training loop with the order seed 000 insists on, and train the small
# GPT of chapter 7 twice, once with autograd and `torch.optim.AdamW`, once with nothing but the
# course's hand-written backward passes and a hand-written AdamW. Then we split a batch across
# two processes and check that the gradients they exchange add up to the full-batch gradient.
#
# **Learning goals.** After this chapter you can
#
# * write the [optimizers](../pages/glossary.md#term-optimizer) SGD, momentum, Nesterov, Adam and AdamW as a few
#   tensor operations each, in the order
#   `torch.optim` uses, and check them against it step for step (float64, to 1e-12);
# * explain what Adam's bias correction fixes, and why L2 regularisation and decoupled weight
#   decay are different things for Adam (and the same for plain SGD);
# * write a [learning rate](../pages/glossary.md#term-learning-rate) warm-up followed by a cosine decay;
# * write a training loop in the order zero_grad → forward → backward → clip
#   ([gradient clipping](../pages/glossary.md#term-gradient-clipping)) → step, with gradient accumulation that gives exactly the
#   full-[batch](../pages/glossary.md#term-batch) step;
# * train a transformer with your own backward pass and show that it follows autograd's
#   loss curve to round-off;
# * compute a gradient with data parallelism: shard the batch, `all_reduce`, divide by the
#   world size — and say what `DistributedDataParallel` and many GPUs add to that.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import math
import time

import matplotlib.pyplot as plt
import torch

from helpers.checks import compare
from helpers.device import describe, get_device, no_tf32, randn
from helpers.show import fmt, show, varies

dev = get_device()
no_tf32()
# The matrices in this chapter are tiny: on a busy 2-core CPU, handing them to a second
# thread costs more than it saves.
torch.set_num_threads(1)
varies(f"device: {describe(dev)}")

# %% [markdown]
# ## 11.1 Gradient descent
#
# A small problem to optimise, with its gradient by hand: a tanh layer fitted to targets by
# mean squared error, in float64 (so that two implementations that do the same arithmetic agree
# to the last few bits, and anything larger is a real difference):
#
# $$\begin{aligned}
# a &= \tanh(XW^\top + b), & L &= \tfrac{1}{n}\textstyle\sum (a - Y)^2, \\
# \delta &= \tfrac{2}{n}(a - Y)\odot(1 - a^2), & \nabla_W L &= \delta^\top X, \\
# & & \nabla_b L &= \textstyle\sum_i \delta_i .
# \end{aligned}$$

# %%
X = randn(8, 4, seed=1, device=dev, dtype=torch.float64)
Y = randn(8, 3, seed=2, device=dev, dtype=torch.float64)


def init():
    """The same starting point every time: W (3, 4), b (3,)."""
    return {
        "W": 0.5 * randn(3, 4, seed=3, device=dev, dtype=torch.float64),
        "b": 0.1 * randn(3, seed=4, device=dev, dtype=torch.float64),
    }


def loss_of(W, b):
    """L = mean (tanh(X Wᵀ + b) − Y)²."""
    return ((torch.tanh(X @ W.T + b) - Y) ** 2).mean()  # (8, 4) @ (4, 3) -> (8, 3)


def loss_and_grads(p):
    """L and {grad_W = δᵀX, grad_b = Σδ} with δ = 2/n (a − Y)(1 − a²), by hand."""
    a = torch.tanh(X @ p["W"].T + p["b"])  # (8, 4) @ (4, 3) -> (8, 3)
    delta = 2 / a.numel() * (a - Y) * (1 - a**2)  # (8, 3)
    # (3, 8) @ (8, 4) -> (3, 4)
    return ((a - Y) ** 2).mean(), {
        "W": delta.T @ X,
        "b": delta.sum(0),
    }


p = {k: v.requires_grad_(True) for k, v in init().items()}
loss_of(p["W"], p["b"]).backward()
L, grads = loss_and_grads(init())
compare("grad_W by hand vs autograd", grads["W"], p["W"].grad)
_ = compare("grad_b by hand vs autograd", grads["b"], p["b"].grad)

# %% [markdown]
# The gradient agrees with autograd to the float64 defaults (atol 1e-10, rtol 1e-8): the same
# products, summed in a different order. Gradient descent is one line,
# $\theta \leftarrow \theta - \eta\, \nabla_\theta L$. Ten steps of it, next to ten steps of
# `torch.optim.SGD`:

# %%
eta = 0.5
theta = init()
for _ in range(10):
    L, grads = loss_and_grads(theta)
    for k in theta:
        theta[k] -= eta * grads[k]  # θ ← θ − η g

ref = {k: v.requires_grad_(True) for k, v in init().items()}
opt = torch.optim.SGD(ref.values(), lr=eta)
for _ in range(10):
    opt.zero_grad()
    loss_of(ref["W"], ref["b"]).backward()
    opt.step()
show("L after 10 steps", loss_of(theta["W"], theta["b"]).item())
_ = compare(
    "W after 10 SGD steps, ours vs torch.optim",
    theta["W"],
    ref["W"],
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# The tolerance is 1e-12 absolute: after ten steps the only difference allowed is the
# round-off of a float64 gradient computed in another order, carried along ten updates.
#
# ## 11.2 Momentum and Nesterov
#
# Momentum keeps a running sum of past gradients, $b \leftarrow \mu b + g$, and steps along it,
# $\theta \leftarrow \theta - \eta b$. `torch.optim.SGD` has three details that a textbook
# formula does not fix, and each changes the numbers:
#
# * weight decay $\lambda$ is folded into the gradient first, $g \leftarrow g + \lambda\theta$ (L2),
#   so the buffer and the step below see the decayed $g$;
# * the buffer then starts at that decayed gradient, $b_1 = g_1 + \lambda\theta_1$ with $\theta_1$
#   the parameter before the first step ($b_1 = g_1$ without weight decay), not at
#   $\mu \cdot 0 + (1 - \text{dampening})\,(g_1 + \lambda\theta_1)$ — with `dampening=0` the two
#   coincide, with dampening they would not;
# * Nesterov steps along $g + \mu b$, a look-ahead, instead of $b$.
#
# Momentum first, inline:

# %%
mu, eta = 0.9, 0.1
theta = init()
b = {k: None for k in theta}
for _ in range(10):
    L, grads = loss_and_grads(theta)
    for k in theta:
        # b₁ = g₁, then b ← μb + g
        b[k] = grads[k].clone() if b[k] is None else mu * b[k] + grads[k]
        theta[k] -= eta * b[k]  # θ ← θ − η b

ref = {k: v.requires_grad_(True) for k, v in init().items()}
opt = torch.optim.SGD(ref.values(), lr=eta, momentum=mu)
for _ in range(10):
    opt.zero_grad()
    loss_of(ref["W"], ref["b"]).backward()
    opt.step()
_ = compare(
    "W after 10 momentum steps, inline vs torch.optim",
    theta["W"],
    ref["W"],
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# `helpers.optim.sgd_update(theta, g, buf, lr, momentum, nesterov, weight_decay)` is the same
# update for one tensor, with weight decay and Nesterov added. The class `SGD` keeps one
# buffer per parameter (a dict or a list of tensors) and takes the gradients as an argument
# (`opt.step(grads)`), or reads each parameter's `.grad` when called without one. A small driver runs ten steps
# of ours with hand-computed gradients and ten steps of `torch.optim` with autograd's:

# %%
from helpers.optim import SGD


def ten_steps(make_ours, make_ref, steps=10):
    """Parameters after `steps` updates: ours (hand gradients), torch.optim's."""
    ours = init()
    opt = make_ours(ours)
    for _ in range(steps):
        opt.step(loss_and_grads(ours)[1])
    ref = {k: t.requires_grad_(True) for k, t in init().items()}
    opt_ref = make_ref(list(ref.values()))
    for _ in range(steps):
        opt_ref.zero_grad()
        loss_of(ref["W"], ref["b"]).backward()
        opt_ref.step()
    return ours, {k: t.detach() for k, t in ref.items()}


for name, make_ours, make_ref in [
    (
        "momentum 0.9",
        lambda p: SGD(p, lr=0.1, momentum=0.9),
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    ),
    (
        "Nesterov 0.9 + L2 0.01",
        lambda p: SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
        lambda p: torch.optim.SGD(
            p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01
        ),
    ),
]:
    ours, ref = ten_steps(make_ours, make_ref)
    compare(f"{name}: W after 10 steps", ours["W"], ref["W"], atol=1e-12, rtol=0)
    compare(f"{name}: b after 10 steps", ours["b"], ref["b"], atol=1e-12, rtol=0)

# %% [markdown]
# ## 11.3 Adam and its bias correction
#
# Adam keeps two running averages per parameter, of the gradient and of its square,
#
# $$\begin{aligned}
# m &\leftarrow \beta_1 m + (1-\beta_1)\, g, \\
# v &\leftarrow \beta_2 v + (1-\beta_2)\, g^2,
# \end{aligned}$$
#
# and steps by $\eta\,\hat m / (\sqrt{\hat v} + \epsilon)$: each coordinate is divided by its own
# recent gradient size, so every parameter moves about $\eta$ per step whatever the scale of its
# gradient. Both averages start at 0, so early on they are too small: after $t$ steps of a
# constant gradient, $m_t = (1-\beta_1^t)\,g$. The bias correction divides that factor out,
# $\hat m = m/(1-\beta_1^t)$, $\hat v = v/(1-\beta_2^t)$. Derived inline for the first step,
# with and without it:

# %%
beta1, beta2, eps, eta = 0.9, 0.999, 1e-8, 0.01
g = torch.tensor([1e-3, -2.0, 50.0], dtype=torch.float64)
m1 = (1 - beta1) * g  # m₁ (m₀ = 0)
v1 = (1 - beta2) * g * g  # v₁ (v₀ = 0)
step_corrected = eta * (m1 / (1 - beta1)) / ((v1 / (1 - beta2)).sqrt() + eps)
step_raw = eta * m1 / (v1.sqrt() + eps)
show("g", g)
show("first step with bias correction", step_corrected, 6)
show("first step without", step_raw, 6)
show("ratio (1-β1)/sqrt(1-β2)", (1 - beta1) / math.sqrt(1 - beta2))

# %% [markdown]
# That ratio is the first step's. For a constant gradient, after $t$ steps $m_t = (1-\beta_1^t)g$
# and $v_t = (1-\beta_2^t)g^2$, so the uncorrected step is $(1-\beta_1^t)/\sqrt{1-\beta_2^t}$
# times the corrected one. The two factors fade at very different speeds:


# %%
def raw_over_corrected(t):
    """(1 − β1ᵗ)/√(1 − β2ᵗ): uncorrected over corrected Adam step, constant gradient."""
    return (1 - beta1**t) / math.sqrt(1 - beta2**t)


for t in (1, 12, 100, 1000):
    show(f"t = {t:4d}: (1 − β1ᵗ)/√(1 − β2ᵗ)", raw_over_corrected(t), 4)
t_peak = max(range(1, 5001), key=raw_over_corrected)
show("largest over t = 1..5000, at t", t_peak, 0)

# %% [markdown]
# With the correction the first step is $\eta$ times the sign of $g$ for every coordinate,
# whether $|g|$ is 0.001 or 50. Without it, with the default betas, the first step is 3.1623
# times too large; the factor then *grows*, because $1-\beta_1^t$ reaches 1 within a few dozen
# steps while $\sqrt{1-\beta_2^t}$ is still small: 6.5685 at its peak ($t = 12$), still 3.2408 at
# $t = 100$ and 1.2576 at $t = 1000$. It fades only over about $1/(1-\beta_2) = 1000$ steps.
# Ten steps of Adam, inline:

# %%
eta = 0.05
theta = init()
m = {k: torch.zeros_like(t) for k, t in theta.items()}
v = {k: torch.zeros_like(t) for k, t in theta.items()}
for t in range(1, 11):
    L, grads = loss_and_grads(theta)
    for k in theta:
        g = grads[k]
        m[k] = beta1 * m[k] + (1 - beta1) * g
        v[k] = beta2 * v[k] + (1 - beta2) * g * g
        m_hat, v_hat = m[k] / (1 - beta1**t), v[k] / (1 - beta2**t)
        theta[k] -= eta * m_hat / (v_hat.sqrt() + eps)

ref = {k: t.requires_grad_(True) for k, t in init().items()}
opt = torch.optim.Adam(ref.values(), lr=eta)
for _ in range(10):
    opt.zero_grad()
    loss_of(ref["W"], ref["b"]).backward()
    opt.step()
_ = compare(
    "W after 10 Adam steps, inline vs torch.optim",
    theta["W"],
    ref["W"],
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# `torch.optim` writes the same step as
#
# $$\theta \leftarrow \theta - \frac{\eta}{1-\beta_1^t}\cdot
#   \frac{m}{\sqrt{v}/\sqrt{1-\beta_2^t} + \epsilon}$$
#
# (one `theta.addcdiv_` call): algebraically the line above, with ε added after dividing by $\sqrt{1-\beta_2^t}$ as in the
# paper. `helpers.optim.adam_update(theta, g, m, v, t, lr, betas, eps, weight_decay, decoupled)`
# follows its order operation by operation; the classes `Adam` and `AdamW` keep $m$, $v$ and
# $t$ per parameter.

# %%
from helpers.optim import Adam, AdamW, adam_update

for name, make_ours, make_ref in [
    ("Adam", lambda p: Adam(p, lr=0.05), lambda p: torch.optim.Adam(p, lr=0.05)),
    (
        "Adam + L2 0.1",
        lambda p: Adam(p, lr=0.05, weight_decay=0.1),
        lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.1),
    ),
    (
        "AdamW 0.1",
        lambda p: AdamW(p, lr=0.05, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1),
    ),
]:
    ours, ref = ten_steps(make_ours, make_ref)
    compare(f"{name}: W after 10 steps", ours["W"], ref["W"], atol=1e-12, rtol=0)
    compare(f"{name}: b after 10 steps", ours["b"], ref["b"], atol=1e-12, rtol=0)

# %% [markdown]
# A bias correction that is wrong — say $t$ stuck at its final value, so the correction is
# never applied — is not a small effect:


# %%
class AdamNoBiasCorrection(Adam):
    """Adam with t stuck at 10⁶: m and v are used uncorrected (a deliberate bug)."""

    def _update(self, key, theta, g):
        s = self.state[key]
        if not s:
            s["t"], s["m"], s["v"] = 0, torch.zeros_like(theta), torch.zeros_like(theta)
        adam_update(theta, g, s["m"], s["v"], 10**6, self.lr, self.betas, self.eps)


ours, ref = ten_steps(
    lambda p: AdamNoBiasCorrection(p, lr=0.05), lambda p: torch.optim.Adam(p, lr=0.05)
)
ok = compare(
    "Adam without bias correction: W after 10 steps",
    ours["W"],
    ref["W"],
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# (`tests/test_optim.py` checks that this broken version fails, along with every optimizer
# against `torch.optim` for ten steps.)
#
# ## 11.4 L2 regularisation is not weight decay (for Adam)
#
# For plain SGD, adding $\tfrac{\lambda}{2}\lVert\theta\rVert^2$ to the loss and shrinking the
# weights are the same thing: $\theta - \eta(g + \lambda\theta) = (1-\eta\lambda)\theta - \eta g$.
# For Adam they are not. With L2 (`torch.optim.Adam`'s `weight_decay` $=\lambda$) the term $\lambda\theta$
# joins the gradient *before* the division by $\sqrt{\hat v}$: a weight with large gradients
# is barely decayed, and a weight with no gradient at all is pushed towards 0 by about $\eta$
# per step, however small $\lambda$ is. AdamW (Loshchilov & Hutter) decouples it:
# $\theta \leftarrow (1 - \eta\lambda)\theta$, then the Adam step on $g$ alone.
#
# Two weights, both at 1; the loss pulls hard on the first ($g = 10$) and ignores the second
# ($g = 0$). Ten steps with $\eta = 0.01$, $\lambda = 0.01$:


# %%
def decay_demo(make_opt, steps=10):
    """Two weights at 1.0; the loss gradient is 10 for the first, 0 for the second."""
    theta = torch.ones(2, dtype=torch.float64)
    opt = make_opt([theta])
    for _ in range(steps):
        opt.step([torch.tensor([10.0, 0.0], dtype=torch.float64)])
    return theta


show("no decay        ", decay_demo(lambda p: Adam(p, lr=0.01)), 6)
show("Adam + L2 (0.01)", decay_demo(lambda p: Adam(p, lr=0.01, weight_decay=0.01)), 6)
show("AdamW (0.01)    ", decay_demo(lambda p: AdamW(p, lr=0.01, weight_decay=0.01)), 6)
show("(1 − ηλ)¹⁰      ", (1 - 0.01 * 0.01) ** 10, 6)

# %% [markdown]
# With L2, the idle weight went from 1 to 0.900350 in ten steps: its only gradient is
# $\lambda\theta = 0.01$, which Adam normalises into a full step of $\eta$. With AdamW it decays
# by $(1 - \eta\lambda)$ per step, to 0.999000, and the weight the loss cares about gets the same
# decay on top of its normal step. On the small problem above, the same $\lambda$ through
# the two routes ends in different parameters:

# %%
W_l2, _ = ten_steps(
    lambda p: Adam(p, lr=0.05, weight_decay=0.1),
    lambda p: torch.optim.Adam(p, lr=0.05, weight_decay=0.1),
)
W_dec, _ = ten_steps(
    lambda p: AdamW(p, lr=0.05, weight_decay=0.1),
    lambda p: torch.optim.AdamW(p, lr=0.05, weight_decay=0.1),
)
show(
    "max |W_L2 − W_decoupled| after 10 steps",
    (W_l2["W"] - W_dec["W"]).abs().max().item(),
    6,
)

# %% [markdown]
# What the optimizer keeps costs memory: SGD keeps nothing, momentum one buffer the size of
# the parameters, Adam two ($m$ and $v$). `optimizer_state_bytes` (chapter 8's, in
# `helpers.lora_model`) adds them up; we use it on the GPT below.
#
# ## 11.5 Warm-up, then cosine decay
#
# Adam's first steps are already full-size (that is what the bias correction does), and they
# are taken with a random network's gradients; a short linear warm-up lets the second-moment
# estimates settle before the learning rate reaches its peak. After the peak, a cosine brings
# it smoothly down to a floor:
#
# $$\eta(s) = \begin{cases}
# \eta_{\max}\,\dfrac{s+1}{W}, & s < W, \\[4pt]
# \eta_{\min} + \tfrac12(\eta_{\max}-\eta_{\min})\, c(s), & W \le s \le T,
# \end{cases}$$
#
# with $c(s) = 1 + \cos\frac{\pi (s - W)}{T - W}$, which falls from 2 at $s = W$ to 0 at
# $s = T$.

# %% mystnb={"image": {"alt": "The learning rate over 300 steps: a linear warm-up for the first 20 steps, then a cosine decay to the floor."}}
from helpers.optim import lr_warmup_cosine

W_up, T, lr_max, lr_min = 20, 300, 1e-2, 1e-3  # the schedule of the capstone below
lrs = [lr_warmup_cosine(s, W_up, T, lr_max, lr_min) for s in range(T + 1)]
for s in (0, W_up - 1, W_up, (W_up + T) // 2, T):
    print(f"step {s:3d}: lr = {lr_warmup_cosine(s, W_up, T, lr_max, lr_min):.6f}")

fig, ax = plt.subplots(figsize=(6, 2.6))
ax.plot(range(T + 1), lrs)
ax.axvline(W_up, color="gray", lw=0.8, ls="--")
ax.set_xlabel("step")
ax.set_ylabel("learning rate")
ax.set_title("linear warm-up, then cosine decay")
plt.tight_layout()
plt.show()

# %% [markdown]
# The first step already has $\eta_{\max}/W$ rather than 0 (a step with learning rate 0 is a
# wasted forward and backward), the peak is reached at step $W - 1$, the midpoint of the decay
# sits halfway between the two rates, and from step $T$ on the rate stays at $\eta_{\min}$.
#
# ## 11.6 The training loop, in the right order
#
# Seed 000 (section 3.3) gives the order and the bug that comes from breaking it:
# `backward()` **adds** into `.grad`, so each step must start by clearing it, or the gradients
# snowball; clipping rewrites `.grad` and so belongs after `backward()` and before `step()`.
# First the snowball, with autograd and no `zero_grad`:

# %%
p = {k: v.requires_grad_(True) for k, v in init().items()}
g_true = []
for step in range(3):
    loss_of(p["W"], p["b"]).backward()  # no zero_grad: .grad += new gradient
    g_true.append(torch.autograd.grad(loss_of(p["W"], p["b"]), p["W"])[0].norm().item())
    norm_W_grad = fmt(p["W"].grad.norm().item())
    print(
        f"step {step}: ‖W.grad‖ = {norm_W_grad}   ‖true gradient‖ = {fmt(g_true[-1])}"
    )

# %% [markdown]
# (No step was taken, so the true gradient stays the same; `.grad` is one, two, three times it.)
# `helpers.train.train`, the loop chapter 8 fine-tuned with, runs in the order
#
# ```
# for step in range(steps):
#     opt.zero_grad()              # 1. clear .grad           (autograd mode)
#     for micro-batch i:
#         L_i = loss_fn(micro_i)   # 2. forward
#         (w_i L_i).backward()     # 3. backward: .grad += w_i ∂L_i/∂θ,  w_i = b_i / B
#     clip_grad_norm(θ, c)         # 4. clip, after the last backward (chapter 5's helper)
#     opt.step()                   # 5. step
# ```
#
# and in a **manual mode** the gradients come from a function, `grads_fn(batch) -> (L, grads)`,
# are clipped as they are (`clip_grad_norm(grads, c, are_grads=True)`, the same function) and
# go to `opt.step(grads)` (there is no `.grad` to clear). Gradient accumulation cuts the
# batch into micro-batches and sums their gradients weighted by their share of the batch, so
# the step uses exactly the full-batch mean gradient while each forward holds only a fraction
# of the activations. `train` can show a `tqdm.auto` progress bar; a bar is a widget in
# Jupyter, so this chapter passes `progress=False` and prints the losses instead.

# %%
from helpers.train import lm_loss, train

X_big = randn(12, 4, seed=5, device=dev, dtype=torch.float64)
Y_big = randn(12, 3, seed=6, device=dev, dtype=torch.float64)


def grads_fn(Xb, Yb):
    """(L, grads) of the tanh layer on one (micro-)batch, by hand."""
    a = torch.tanh(Xb @ theta["W"].T + theta["b"])  # (b, 4) @ (4, 3) -> (b, 3)
    delta = 2 / a.numel() * (a - Yb) * (1 - a**2)  # (b, 3)
    return ((a - Yb) ** 2).mean(), {"W": delta.T @ Xb, "b": delta.sum(0)}


results = {}
for accum in (1, 4):
    theta = init()
    hist = train(
        SGD(theta, lr=0.5, momentum=0.9),
        lambda step: (X_big, Y_big),
        30,
        grads_fn=grads_fn,
        accum=accum,
        clip=1.0,
        progress=False,
    )
    results[accum] = (theta, hist)
show("loss, first and last step", [results[1][1]["loss"][0], results[1][1]["loss"][-1]])
_ = compare(
    "W, 4 micro-batches of 3 vs 1 batch of 12",
    results[4][0]["W"],
    results[1][0]["W"],
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# Four micro-batches of three give the parameters of one batch of twelve, to 1e-12: the
# weights $b_i/B$ turn the sum of micro-batch means into the full-batch mean. (Without them,
# summing four means would make every step four times too large.)
#
# ## 11.7 The capstone: a tiny GPT, trained on our own backward pass
#
# The GPT of chapter 7 (`helpers.gpt`): token and position embeddings, pre-norm causal
# blocks, a final LayerNorm and an untied head, on the course's character corpus. Two runs
# from the same float64 initial weights, on the same batches, with the same schedule and
# clipping:
#
# * **autograd**: `TinyGPT` (`nn.TransformerEncoderLayer` blocks), chapter 8's `lm_loss`
#   (`F.cross_entropy` over every position),
#   `loss.backward()`, `torch.optim.AdamW`;
# * **by hand**: `gpt_loss_and_grads` (every gradient written out in chapters 4–7, no
#   autograd) and `helpers.optim.AdamW`.
#
# We train in float64 so that the only difference between the two runs is the order of
# additions inside the kernels, about $10^{-16}$ relative per operation. Any mistake in a
# backward pass or in the optimizer would show up many orders of magnitude above that.

# %%
from helpers.gpt import (
    CharTokenizer,
    GPTConfig,
    TinyGPT,
    get_batch,
    gpt_init,
    gpt_loss_and_grads,
    load_corpus,
    load_params_into_module,
    sample,
)
from helpers.lora_model import optimizer_state_bytes

text = load_corpus()
tok = CharTokenizer(text)
data = tok.encode(text)
config = GPTConfig(
    vocab_size=tok.vocab_size, n_ctx=32, d_model=32, n_heads=4, n_layers=2, d_ff=128
)
STEPS, BATCH, dtype = 300, 16, torch.float64
schedule = lambda s: lr_warmup_cosine(s, W_up, STEPS, lr_max, lr_min)
# idx, targets (B, n_ctx)
batch_at = lambda s: get_batch(data, BATCH, config.n_ctx, seed=s, device=dev)

params0 = gpt_init(config, seed=0, dtype=dtype, device=dev)
n_params = sum(t.numel() for t in params0.values())
print(f"corpus: {len(text)} characters, vocabulary {tok.vocab_size}")
print(
    f"parameters: {n_params}, tokens per step: {BATCH * config.n_ctx}, steps: {STEPS}"
)
print(f"uniform guess: loss ln {tok.vocab_size} = {fmt(math.log(tok.vocab_size))}")

# %%
model = load_params_into_module(TinyGPT(config).to(device=dev, dtype=dtype), params0)
opt_ref = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.1)


t0 = time.perf_counter()
hist_ref = train(
    opt_ref,
    batch_at,
    STEPS,
    # chapter 8's next-token cross-entropy, the mean over all B·N positions
    loss_fn=lambda idx, targets: lm_loss(model, idx, targets),
    clip=1.0,
    lr_schedule=schedule,
    progress=False,
)
t_ref = time.perf_counter() - t0

# %%
params = {k: v.clone() for k, v in params0.items()}
opt = AdamW(params, lr=0.0, weight_decay=0.1)
t0 = time.perf_counter()
hist = train(
    opt,
    batch_at,
    STEPS,
    grads_fn=lambda idx, targets: gpt_loss_and_grads(idx, targets, params, config),
    clip=1.0,
    lr_schedule=schedule,
    progress=False,
)
t_hand = time.perf_counter() - t0
varies(
    f"training time: autograd {t_ref:.1f} s, by hand {t_hand:.1f} s"
    f" ({STEPS} steps each)"
)

# %% mystnb={"image": {"alt": "The training loss over every step of the capstone, autograd with torch.optim.AdamW and our backward with our AdamW: the two curves lie on each other."}}
for s in (0, 1, 10, 100, 200, STEPS - 1):
    loss_auto, loss_hand = fmt(hist_ref["loss"][s]), fmt(hist["loss"][s])
    print(f"step {s:3d}: loss autograd {loss_auto}   by hand {loss_hand}")
compare(
    f"loss curve over {STEPS} steps, by hand vs autograd",
    torch.tensor(hist["loss"]),
    torch.tensor(hist_ref["loss"]),
    atol=1e-13,
    rtol=0,
)


def key_bias_and_rest(p):
    """(the K part of every in_proj_bias, every other parameter entry), flattened."""
    d = config.d_model
    k_bias = [
        p[f"blocks.{l}.self_attn.in_proj_bias"][d : 2 * d]
        for l in range(config.n_layers)
    ]
    rest = [
        torch.cat([t[:d], t[2 * d :]]) if n.endswith("in_proj_bias") else t.flatten()
        for n, t in p.items()
    ]
    return torch.cat(k_bias), torch.cat(rest)


sd = {k: v.detach() for k, v in model.state_dict().items()}
(k_ours, rest_ours), (k_ref, rest_ref) = (
    key_bias_and_rest(params),
    key_bias_and_rest(sd),
)
compare(
    "parameters but key biases, after training",
    rest_ours,
    rest_ref,
    atol=1e-11,
    rtol=0,
)
compare("key biases after training", k_ours, k_ref, atol=1e-9, rtol=0)
param_bytes = sum(t.numel() * t.element_size() for t in params.values())
print(
    f"AdamW state: {optimizer_state_bytes(opt)} bytes = "
    f"{optimizer_state_bytes(opt) / param_bytes:.0f} × the parameters' bytes"
)

fig, ax = plt.subplots(figsize=(6.5, 3))
ax.plot(hist_ref["loss"], lw=3, alpha=0.4, label="autograd + torch.optim.AdamW")
ax.plot(hist["loss"], lw=1, color="black", label="by hand + our AdamW")
ax.set_xlabel("step")
ax.set_ylabel("training loss (cross-entropy)")
ax.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The two curves are one: the largest difference over all steps is at the round-off of
# float64 (within `atol 1e-13`; `compare` shows the measured value). After training the
# weights agree to 1e-11 absolute: round-off enters every step and training carries it along,
# so the tolerance is looser than for a single gradient. One group of weights needs a looser
# one still, 1e-9: the bias of the **keys**. Adding a constant vector $c$ to every key adds
# $q_i \cdot c$ to the whole row $i$ of the scores, and softmax ignores a constant added to a
# row, so the loss does not depend on that bias at all: its true gradient is exactly 0, and
# what both runs compute for it is pure round-off, different in each. Adam divides a gradient by
# its own running size, which would turn noise into full-size steps; it is the $\epsilon$ in
# $\sqrt{\hat v} + \epsilon$ that keeps those steps tiny. At the end of training:

# %%
_, g_end = gpt_loss_and_grads(*batch_at(STEPS), params, config)
d = config.d_model
g_bias = g_end["blocks.0.self_attn.in_proj_bias"]  # (3d,): the Q, K, V parts
print(f"block 0, max |grad| of the query bias: {fmt(g_bias[:d].abs().max().item(), 6)}")
_ = compare(
    "block 0, gradient of the key bias vs 0",
    g_bias[d : 2 * d],
    torch.zeros_like(g_bias[d : 2 * d]),
    atol=1e-15,
    rtol=0,
)

# %% [markdown]
# The loss fell
# from 3.7899 (close to $\ln 43 = 3.7612$, a uniform guess over the 43 characters) to the value
# printed for the last step. AdamW's state is twice the parameters, as counted in 11.4.
#
# What did it learn? Sampling draws each next character from the softmax of the last
# logits, with a fixed seed (the draw is made on the CPU in float64, so the text is the same on
# any device):

# %%
prompts = ["The cat", "The river", "In spring"]
for i, prompt in enumerate(prompts):
    out = sample(
        params, config, tok.encode(prompt)[None].to(dev), 70, temperature=0.8, seed=i
    )
    print(repr(tok.decode(out[0])))

# %% [markdown]
# Words and word-like pieces, spaces and capitals after full stops, out of the few hundred steps above, on a few
# kilobytes of text. The model is tiny and the corpus tinier; the point is that every gradient
# that trained it was written by hand in this course.
#
# ### A bigger setting for a GPU
#
# On a GPU (Colab's included), set `BIG = True` to train a wider, deeper model for longer with
# the hand-written backward and our AdamW, in float32: 2000 steps of a 4-block model with
# $d = 128$. It trains the by-hand run only, so there is no autograd curve to compare it with,
# and we have not timed it on any GPU. It is off by default, so what this page prints does not
# depend on the machine; when it runs, it prints its final loss, time and a sample only through
# `varies`.

# %%
BIG = False
if BIG and torch.cuda.is_available():
    big = GPTConfig(
        vocab_size=tok.vocab_size,
        n_ctx=64,
        d_model=128,
        n_heads=4,
        n_layers=4,
        d_ff=512,
    )
    big_steps = 2000
    big_sched = lambda s: lr_warmup_cosine(s, 100, big_steps, 1e-3, 1e-4)
    big_batch = lambda s: get_batch(data, 64, big.n_ctx, seed=s, device=dev)
    p_big = gpt_init(big, seed=0, dtype=torch.float32, device=dev)
    t0 = time.perf_counter()
    h_big = train(
        AdamW(p_big, lr=0.0, weight_decay=0.1),
        big_batch,
        big_steps,
        grads_fn=lambda i, t: gpt_loss_and_grads(i, t, p_big, big),
        clip=1.0,
        lr_schedule=big_sched,
        progress=False,
    )
    seconds = time.perf_counter() - t0
    varies(f"big model: final loss {h_big['loss'][-1]:.4f} in {seconds:.0f} s")
    out = sample(
        p_big, big, tok.encode("The cat")[None].to(dev), 200, temperature=0.8, seed=0
    )
    varies(repr(tok.decode(out[0])))
else:
    print("BIG is off: the small run above is the one this page shows.")

# %% [markdown]
# ## 11.8 Gradients across processes
#
# Data parallelism gives each process (each GPU, usually) a copy of the model and a shard of
# the batch. With $R$ equal shards of $b$ examples and a mean loss,
#
# $$\begin{aligned}
# \nabla \frac{1}{Rb}\sum_{i=1}^{Rb}\ell_i
# &= \frac{1}{R}\sum_{r=1}^{R}\Big(\nabla\frac1b\sum_{i\in\text{shard }r}\ell_i\Big) \\
# &= \frac1R\sum_r g_r .
# \end{aligned}$$
#
# So every process computes $g_r$ on its shard, an **all-reduce** sums the $g_r$ and hands the
# sum to every process, and each divides by $R$. All hold the same gradient afterwards, take the
# same optimizer step, and their copies of the model stay identical.
#
# `helpers.distributed.data_parallel_grads` does this for real: it starts two processes on
# this CPU with `torch.multiprocessing`, joined by `torch.distributed` with the **gloo** backend
# (`MASTER_ADDR=127.0.0.1`, a free port), on a small MLP in float64 and a batch of 16. Each rank
# computes its shard's gradient and calls `dist.all_reduce(g, op=SUM)`; then the same with
# `DistributedDataParallel`; then three SGD steps through DDP. The ranks write their results
# to a temporary file that this notebook reads back. (This part always runs on the CPU, on a GPU
# machine too: gloo is the CPU backend.)

# %%
from helpers.distributed import data_parallel_grads

t0 = time.perf_counter()
res = data_parallel_grads(world_size=2, B=16, steps=3)
varies(f"two gloo processes: {time.perf_counter() - t0:.1f} s")
full = res["full"]["grads"]
r0, r1 = res["ranks"]
name = "0.weight"  # the first layer's W, (16, 6)
print(f"rows per shard: {r0['shard_rows']} and {r1['shard_rows']}")
compare(
    "rank 0's shard gradient vs full batch",
    r0["shard_grads"][name],
    full[name],
    atol=1e-12,
    rtol=0,
)
compare(
    "all_reduce SUM vs full batch (mean-vs-sum slip)",
    r0["allreduce_sum"][name],
    full[name],
    atol=1e-12,
    rtol=0,
)
compare(
    "all_reduce SUM vs 2 × full batch",
    r0["allreduce_sum"][name],
    2 * full[name],
    atol=1e-12,
    rtol=0,
)
for r, rank in enumerate(res["ranks"]):
    for n in full:
        compare(
            f"rank {r}: SUM / 2 vs full batch, {n}",
            rank["allreduce_mean"][n],
            full[n],
            atol=1e-12,
            rtol=0,
        )

# %% [markdown]
# One shard's gradient is not the full-batch gradient; the sum over ranks is twice it; the sum
# divided by the world size is it, to round-off (1e-12 absolute in float64: the two sides add the
# same per-example gradients in a different grouping). `DistributedDataParallel` does the
# division itself, and after three SGD steps both ranks hold bit-identical weights equal to
# single-process training on the whole batch:

# %%
for r, rank in enumerate(res["ranks"]):
    for n in full:
        compare(
            f"rank {r}: DDP gradient vs full batch, {n}",
            rank["ddp_grads"][n],
            full[n],
            atol=1e-12,
            rtol=0,
        )
for n in full:
    compare(
        f"after 3 DDP steps, rank 0 vs rank 1, {n}",
        r0["ddp_params"][n],
        r1["ddp_params"][n],
        exact=True,
    )
    compare(
        f"after 3 DDP steps vs one process, {n}",
        r0["ddp_params"][n],
        res["full"]["params"][n],
        atol=1e-12,
        rtol=0,
    )

# %% [markdown]
# ### What changes on many GPUs
#
# Nothing in the algebra; a lot in the engineering. We have not measured any of this here —
# two CPU processes exchanging a few kilobytes say nothing about a cluster — so this is a
# description, not a result:
#
# * **NCCL instead of gloo.** On GPUs the all-reduce runs in NVIDIA's NCCL library, directly
#   between GPU memories over NVLink or InfiniBand, typically as a ring or tree all-reduce in
#   which each GPU sends and receives about $2\frac{R-1}{R}$ times the gradient size, almost
#   independent of $R$.
# * **Bucketing.** DDP does not all-reduce each parameter separately (thousands of small
#   messages, each paying a latency); it packs gradients into buckets of a few megabytes
#   (`bucket_cap_mb`) and reduces a bucket as one message.
# * **Overlap with backward.** Gradients become final in reverse layer order during
#   `backward()`. DDP registers a hook on each parameter; when every gradient in a bucket is
#   ready, that bucket's all-reduce starts asynchronously while backward continues on earlier
#   layers. Ideally the communication hides behind the computation, and only the last bucket's
#   reduce is waited for.
# * **Mean, not sum.** DDP divides by the world size (the loss is a mean per rank); with
#   unequal shards, or a loss summed over tokens whose count differs between ranks, the plain
#   average of per-rank means is no longer the global mean, and the loss has to be normalised
#   by the global count instead.
# * **Beyond data parallelism.** When the model or the optimizer state no longer fit on one GPU
#   (AdamW alone keeps two copies of the parameters, as counted above), ZeRO/FSDP shard the
#   optimizer state, gradients and parameters across ranks (a reduce-scatter instead of an
#   all-reduce), and tensor or pipeline parallelism split the layers themselves.
#
# ## Summary
#
# * An optimizer is a few tensor operations per parameter. Written in `torch.optim`'s order,
#   SGD, momentum, Nesterov, Adam and AdamW match it to 1e-12 after ten float64 steps.
# * Adam's bias correction divides out the $(1-\beta^t)$ factors of averages that start at 0;
#   without it, with the default betas, steps are $(1-\beta_1^t)/\sqrt{1-\beta_2^t}$ times too
#   large: 3.1623 at the first step, 6.5685 at the peak ($t = 12$), 1.2576 still at $t = 1000$.
# * L2 in the gradient and decoupled weight decay coincide for SGD, not for Adam: L2 gets
#   normalised by $\sqrt{\hat v}$ (an idle weight fell from 1 to 0.900350 in ten steps); AdamW
#   shrinks every weight by $(1-\eta\lambda)$ per step.
# * Warm-up then cosine decay is a plain function of the step.
# * The loop: zero_grad → forward → backward → clip → step. Gradient accumulation with weights
#   $b_i/B$ reproduces the full-batch step.
# * A GPT trained with the course's hand-written backward passes and AdamW follows the
#   autograd + `torch.optim.AdamW` loss curve to float64 round-off, step for step.
# * Data parallelism: shard gradients, all-reduce (sum), divide by the world size = the
#   full-batch gradient; DDP does the same with bucketed, overlapped all-reduces.
#
# ## Common mistakes
#
# * Forgetting `zero_grad()`: `backward()` adds into `.grad`, and the gradients snowball
#   (one, two, three times the true gradient above).
# * Clipping after `step()` (the step has already used the unclipped gradient) or before
#   `backward()` (there is nothing to clip yet).
# * Using `Adam`'s `weight_decay` and believing it is AdamW: for Adam, L2 in the gradient is not
#   weight decay. Use `AdamW`, and usually exempt biases and LayerNorm weights from decay.
# * Dropping or misplacing Adam's bias correction, or adding ε before dividing by
#   $\sqrt{1-\beta_2^t}$: small differences in early steps that a step-for-step test catches.
# * Summing shard gradients across ranks without dividing by the world size (a gradient $R$
#   times too large), or averaging per-rank means of unequal shards.
# * Accumulating micro-batch gradients without weighting them by their share of the batch.
# * Comparing two training runs without fixing what differs legitimately (initial weights
#   rounded to float32 in one run and not the other, different batches, a different clipping
#   formula), then blaming the backward pass; or accepting a gap far above the dtype's
#   round-off as "numerics".
#
# **Lab:** [Lab 11 — training by hand](../labs/lab11_training_by_hand.ipynb): write an optimizer
# step and a gradient-accumulation loop.
