# %% [markdown]
# # Lab 11 · Training by hand: optimizer steps, a schedule and gradient accumulation
#
# Chapter 11 wrote SGD, Adam and AdamW as a few tensor operations each, checked them against
# `torch.optim` step for step, and put them in a training loop in the order zero_grad →
# forward → backward → clip → step. Here you write them yourself, with a few variants the
# chapter did not print (dampening, AMSGrad, warm restarts, uneven micro-batches): each
# optimizer step must give, from any state, the step `torch.optim` takes (float64, to
# 1e-12 for SGD, 1e-14 for Adam), and your loop with gradient accumulation must give exactly the parameters of one
# big batch.
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
# cell right below. It runs your function on one case of each promise the exercise makes
# (the first step and a later one, each option at each value, its default included) and
# compares with reference outputs recorded from the course's solution, which agrees with
# `torch.optim`. It answers in one line: `✓` matches in every kind of case, `✗` the kinds of
# case that fail, named in words first, then what is off in the first one (a known mistake
# it matches, a shape, a factor), or `·` not implemented yet. Your instructor grades the
# notebook you hand in with hidden tests: the same kinds of case, with other values.
#
# The optimizer steps are **functions**: they take a parameter `theta`, its gradient `g` and
# the optimizer's state for that parameter, and return the new `theta` and the new state (you
# may compute new tensors, or update `theta` and the given state in place and return them:
# what you return is judged). The gradient `g` stays as it was, as `p.grad` does in
# `torch.optim`: a step that writes into it is a ✗. Each check is one step from a given state, as `torch.optim` would take
# it with that state in `opt.state[p]`; ten of them in a row are ten steps. Use `torch.optim`
# in a scratch cell to experiment, never inside a graded step: a step that calls the `step`
# of a `torch.optim` optimizer (or the course's `helpers.optim`) scores 0 for its exercise,
# since the step is what the exercise asks you to write.

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
import torch.nn.functional as F

from helpers.labcontract import check_contract

# %% [raw]
# # BEGIN QUESTION
# name: ex1

# %% [markdown]
# ## Exercise 1 · SGD with momentum, Nesterov and dampening (2 points)
#
# **Goal:** the details of `torch.optim.SGD` that a textbook formula leaves open, each of
# which changes the numbers: where the weight decay goes, where the momentum buffer starts,
# what Nesterov steps along, and one chapter 11 only mentioned: **dampening** $\tau$, which
# scales the gradient's share of the buffer ($b \leftarrow \mu b + (1-\tau)\,g$) on every
# step but one.
#
# **You derive:** the order of one step of `torch.optim.SGD`: where the weight decay enters,
# where the buffer starts (the step dampening leaves alone), and what Nesterov steps along.
#
# **You are given:** the dampening rule above, chapter 11, section 11.2 (momentum, Nesterov,
# L2 weight decay), and `torch.optim.SGD` to experiment with.
#
# Write `sgd_step(theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False,
# weight_decay=0.0)` (`torch.optim.SGD`'s names; its own order puts `weight_decay` before
# `nesterov`, so pass them by name), for one parameter `theta`
# (a vector or a weight matrix, float64) and its gradient `g` (same shape), returning
# `(theta, buf)` after one step, exactly as `torch.optim.SGD` does with `buf` as its momentum
# buffer: `buf` is `None` before the first step and a tensor of `theta`'s shape after. With
# `momentum` $= 0$, left at its default or given, there is no buffer: `buf` stays `None` and
# is returned as `None`. Every option may be given or left at its default, on the first step
# or a later one, Nesterov and dampening included. Work out from chapter 11, section 11.2
# (and a few steps of `torch.optim.SGD` on a scalar, if in doubt) which step dampening leaves
# alone.
#
# <details><summary>Hint 1 of 4 · the idea: three stages, settled by experiment</summary>
#
# One step has three stages: adjust the gradient (weight decay), update the buffer (momentum,
# dampening), step along a direction (the buffer, or Nesterov's look-ahead). Settle each one
# on a scalar: take `p = torch.tensor([1.0], requires_grad=True)`,
# `opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, dampening=0.5)`, set `p.grad` by hand and
# call `opt.step()` twice, printing `opt.state[p]["momentum_buffer"]` after each. Do the same
# with `weight_decay` and `nesterov=True`.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the weight decay</summary>
#
# Weight decay is folded into the gradient first, $g \leftarrow g + \lambda\theta$ with the
# $\theta$ before the step (L2, chapter 11.2): the buffer, Nesterov's direction and the step
# all see this decayed $g$.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the first step of the buffer</summary>
#
# When `buf` is `None`, the buffer starts at the decayed gradient itself, $b = g$: that is the
# step dampening leaves alone. Only later steps use $\mu b + (1-\tau)\,g$. With $\mu = 0$ there
# is no buffer at all: step along $g$ and return `buf` as it came.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: one step of torch from your state</summary>
#
# In a scratch cell, in float64, with a `(2, 3)` `theta`, `g` and `buf`: make
# `p = theta.clone().requires_grad_()` and `torch.optim.SGD([p], lr=0.1, ...)` with the same
# options, put `opt.state[p]["momentum_buffer"] = buf.clone()` (skip it for a first step),
# set `p.grad = g.clone()` and call `opt.step()`. `p` and the state's buffer must equal your
# `(theta, buf)` to 1e-12: for the first step and a later one, with dampening 0.5,
# Nesterov, weight decay 0.01, and momentum 0 (given and left out). The update to check
# yours against, with $\lambda$ the weight decay, $\mu$ the momentum, $\tau$ the dampening:
#
# $$\begin{gathered}
# g \leftarrow g + \lambda\theta,\qquad b \leftarrow \begin{cases} g & \text{first step}\\
# \mu b + (1-\tau)\,g & \text{later} \end{cases}, \\
# \theta \leftarrow \theta - \eta \begin{cases} g + \mu b & \text{Nesterov}\\ b & \text{else}
# \end{cases}\quad (\theta \leftarrow \theta - \eta g \text{ if } \mu = 0).
# \end{gathered}$$
#
# Delete the scratch cell before handing in.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def sgd_step(
    theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0
):
    """(theta, buf) after one step of torch.optim.SGD for one parameter."""
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
# # END QUESTION

# %% [markdown]
# **Self-check 1** compares one step of your function from a given state with one of
# `torch.optim.SGD`, recorded (atol 1e-12).

# %%
check_contract("lab11", "ex1", sgd_step)

# %% [raw]
# # BEGIN QUESTION
# name: ex2

# %% [markdown]
# ## Exercise 2 · Adam with AMSGrad, and its bias correction (3 points)
#
# **Goal:** Adam divides each coordinate's step by $\sqrt{\hat v}$, and $\hat v$ forgets: when
# a coordinate's gradients shrink, $v$ shrinks with them and the step grows back. **AMSGrad**
# (`torch.optim.Adam(amsgrad=True)`) divides by the running **maximum** of the second moment
# instead, so the denominator does not shrink when the gradients do. Chapter 11 derived Adam's
# bias correction; here you combine it with that maximum, in the order `torch.optim` uses.
#
# **You derive:** the bias-correction factors (from a constant gradient), whether the maximum
# is taken of $v$ or of $\hat v$, and the order of one step with $\epsilon$ where torch puts it.
#
# **You are given:** Adam's two running averages and `torch.optim`'s form of the step
# (chapter 11, section 11.3), Adam's L2 weight decay, and `torch.optim.Adam` to experiment
# with.
#
# Write `adam_step(theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8,
# weight_decay=0.0)` returning `(theta, m, v, v_max)`, exactly as `torch.optim.Adam` with
# `amsgrad=True` does one step from the state `m`, `v`, `v_max` (what torch keeps as
# `exp_avg`, `exp_avg_sq`, `max_exp_avg_sq`). `t` counts steps from 1: the first step starts
# from zeros, a later one from any state an earlier step left (with `v_max` above or below
# the new $v$). `betas`, `eps` and `weight_decay` (Adam's L2 penalty) may be given or left at
# their defaults; `theta` is a vector or a weight matrix; `g` may be 0 where `v` and `v_max`
# are 0, so that $\epsilon$ alone is the denominator. Work out two things first:
# * the bias correction: with a constant gradient $g$, what is $m_t$ after $t$ steps from
#   $m_0 = 0$, and what must you divide it by to get $g$ back? (The same for $v$.)
# * the maximum: is it taken of $v$ or of the corrected $\hat v$, and can the two differ? A few
#   steps of `torch.optim.Adam(amsgrad=True)` on a scalar whose gradient shrinks settle it;
#   `opt.state[p]` shows what torch keeps.
#
# Return the **raw** $m$ and $v$ (the correction is recomputed at every step), and mind where
# $\epsilon$ goes: the self-check compares to 1e-14 (rtol 1e-12).
#
# <details><summary>Hint 1 of 4 · the idea: unroll the average; ask torch what it keeps</summary>
#
# For the correction, unroll $m_t$ from $m_0 = 0$ with the same $g$ at every step: it is $g$
# times a sum you know in closed form. For the maximum: $\hat v = v/(1-\beta_2^t)$ uses this
# step's $t$, while $v_{\max}$ holds a value from an earlier step, so a maximum of raw values
# and one of corrected values can pick different numbers. Run `torch.optim.Adam([p],
# amsgrad=True)` on a scalar whose gradient shrinks and look at `opt.state[p]`.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the geometric sum</summary>
#
# With a constant $g$, $m_t = (1-\beta_1)\,(1 + \beta_1 + \dots + \beta_1^{t-1})\, g$: a geometric
# sum of $t$ terms. The same for $v$ with $\beta_2$ and $g^2$. Dividing by the factor in front
# of $g$ gives $g$ back.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the order</summary>
#
# 1. weight decay as `torch.optim.Adam` does it (L2): $g \leftarrow g + \lambda\theta$;
# 2. Adam's two averages $m$ and $v$, raw, as in chapter 11;
# 3. $v_{\max}$ becomes the entrywise maximum of itself and the new **uncorrected** $v$ (that
#    is what torch keeps in `max_exp_avg_sq`);
# 4. the step of chapter 11 in `torch.optim`'s form, with $v_{\max}$ where Adam has $v$
#    ($\epsilon$ added after the division by $\sqrt{1-\beta_2^t}$).
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: one step of torch from your state</summary>
#
# In a scratch cell, in float64, with a `(2, 3)` `theta` and `g`: make
# `p = theta.clone().requires_grad_()`, `opt = torch.optim.Adam([p], lr=0.01, amsgrad=True, ...)`
# and, for a later step `t`, give it your state:
# `opt.state[p] = {"step": torch.tensor(float(t - 1)), "exp_avg": m.clone(), "exp_avg_sq": v.clone(), "max_exp_avg_sq": v_max.clone()}`
# (nothing for `t = 1`); set `p.grad = g.clone()`, call `opt.step()`, and compare `p` and the
# three state tensors with yours. Try `v_max` above and below the new $v$ in different
# entries, `g = 0` where `v = v_max = 0`, `weight_decay = 0.1`, other `betas` and `eps`. The
# step to check yours against ($g$ already holding $\lambda\theta$):
#
# $$\begin{gathered}
# m \leftarrow \beta_1 m + (1-\beta_1)\, g,\quad v \leftarrow \beta_2 v + (1-\beta_2)\, g^2,\quad
# v_{\max} \leftarrow \max(v_{\max}, v), \\
# \theta \leftarrow \theta - \frac{\eta}{1-\beta_1^t}\cdot\frac{m}{\sqrt{v_{\max}}/\sqrt{1-\beta_2^t} + \epsilon}.
# \end{gathered}$$
#
# Delete the scratch cell before handing in.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def adam_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
):
    """(theta, m, v, v_max) after one step of torch.optim.Adam(amsgrad=True), m and v
    raw."""
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
# # END QUESTION

# %% [markdown]
# **Self-check 2** compares one step of your function from a given state with one of
# `torch.optim.Adam(amsgrad=True)`, recorded (atol 1e-14, rtol 1e-12).

# %%
check_contract("lab11", "ex2", adam_step)

# %% [raw]
# # BEGIN QUESTION
# name: ex3

# %% [markdown]
# ## Exercise 3 · AdamW: decoupled weight decay is not L2 (2 points)
#
# **Goal:** with L2, the term $\lambda\theta$ joins the gradient before the division by
# $\sqrt{\hat v}$, so a weight with large gradients is barely decayed and a weight with no
# gradient is pushed by a full $\eta$ per step. AdamW shrinks the weights directly,
# $\theta \leftarrow (1 - \eta\lambda)\,\theta$, and then takes the Adam step on $g$ alone: the
# decay never enters $m$, $v$ and $v_{\max}$.
#
# **You derive:** where AdamW's decay acts in one step, relative to Adam's update, and why an
# idle weight decays by exactly $(1-\eta\lambda)$.
#
# **You are given:** the decoupled rule above, your `adam_step` from exercise 2 (with
# `weight_decay=0`), and `torch.optim.AdamW` to experiment with.
#
# Write `adamw_step(theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8,
# weight_decay=0.01)` returning `(theta, m, v, v_max)`, like `torch.optim.AdamW` with
# `amsgrad=True` (you may call your `adam_step` with `weight_decay=0`), from the same kinds
# of state as exercise 2: the first step and later ones, `weight_decay` given, 0, or left at
# its default 0.01, `betas` and `eps` given. A weight the loss ignores ($g = 0$, with
# $m = v = v_{\max} = 0$) must decay by exactly $(1-\eta\lambda)$ per step.
#
# <details><summary>Hint 1 of 4 · the idea: two separate updates of θ</summary>
#
# AdamW changes $\theta$ twice in one step: a shrink that depends only on $\theta$, $\eta$ and
# $\lambda$, and Adam's step, which depends only on $g$ and the state. $g$ never sees $\lambda$,
# so $m$, $v$ and $v_{\max}$ are exactly those of Adam without weight decay.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: which comes first</summary>
#
# `torch.optim.AdamW` shrinks first: $\theta$ is multiplied by $(1-\eta\lambda)$, and Adam's step
# (computed from $g$ alone) is then subtracted from the shrunk $\theta$. The other order would
# shrink the step too, and the numbers would differ.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the idle weight</summary>
#
# With $g = 0$ and $m = v = v_{\max} = 0$, the new $m$ is 0, so Adam's step is
# $0 / (0 + \epsilon) = 0$: only the shrink acts, exactly $(1-\eta\lambda)$. With L2 instead,
# $\lambda\theta$ would become $g$ and be normalised into a step of about $\eta$.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: one step of torch from your state</summary>
#
# In a scratch cell, do exercise 2's check with
# `torch.optim.AdamW([p], lr=0.01, amsgrad=True, ...)`: `weight_decay` given, 0 and left at
# its default, the first step and a later one, and the idle weight of the cell below. The
# step to check yours against:
#
# $$\theta \leftarrow (1-\eta\lambda)\,\theta - \frac{\eta}{1-\beta_1^t}\cdot\frac{m}{\sqrt{v_{\max}}/\sqrt{1-\beta_2^t} + \epsilon},$$
#
# with $m$, $v$, $v_{\max}$ updated from $g$ alone as in exercise 2. Delete the scratch cell
# before handing in.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def adamw_step(
    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
):
    """(theta, m, v, v_max) after one step of torch.optim.AdamW(amsgrad=True)."""
    # BEGIN SOLUTION
    beta1, beta2 = betas
    theta = theta * (1 - lr * weight_decay)  # decoupled: λ never enters m, v, v_max
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    v_max = torch.maximum(v_max, v)
    denom = v_max.sqrt() / math.sqrt(1 - beta2**t) + eps
    return theta - lr / (1 - beta1**t) * m / denom, m, v, v_max
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** compares one step of your function with one of
# `torch.optim.AdamW(amsgrad=True)`, recorded.
#
# Try the idle weight yourself: a weight at 1 with $g = 0$, ten steps of $\eta = \lambda = 0.1$.
# Your `adamw_step` leaves it at $(1-0.01)^{10}$; your `adam_step(..., weight_decay=0.1)` (L2)
# turns $\lambda\theta$ into a step of about $\eta$, and ten of them take it most of the way to
# 0.

# %%
check_contract("lab11", "ex3", adamw_step)

# %% [raw]
# # BEGIN QUESTION
# name: ex4

# %% [markdown]
# ## Exercise 4 · Warm-up, then cosine decay with warm restarts (2 points)
#
# **Goal:** chapter 11's schedule ends in one half cosine. **Warm restarts** (SGDR, Loshchilov &
# Hutter; `torch.optim.lr_scheduler.CosineAnnealingWarmRestarts`) repeat that half cosine in
# cycles, each `mult` times longer than the one before, and jump back to $\eta_{\max}$ at the
# start of each: the learning rate as a plain function of the step again, now with a loop
# or a logarithm in it.
#
# **You derive:** for a step after the warm-up, which cycle it falls in, how far into that
# cycle it is, and the cycle's length; from these, the learning rate.
#
# **You are given:** chapter 11's warm-up and half cosine (section 11.5), and the cycle
# lengths and restart rule below.
#
# Write `lr_at(step, warmup, period, lr_max, lr_min=0.0, mult=2)` returning a **Python
# float** (not a tensor), for steps counted from 0, with $W$ = `warmup` and $T_0$ = `period`:
# * steps $0, \dots, W-1$ climb linearly as in chapter 11, the first step already at
#   $\eta_{\max}/W$ (not 0), step $W-1$ at $\eta_{\max}$; with $W = 0$ there is no warm-up;
# * from step $W$ on, cycles of $T_0$, $T_0 \cdot$ `mult`, $T_0 \cdot$ `mult`$^2$, … steps
#   (`mult` a whole number $\ge 1$: 1, 2 or 3; 1 keeps every cycle at $T_0$); in each, chapter
#   11's half cosine from $\eta_{\max}$ at the cycle's first step down towards $\eta_{\min}$,
#   which the step after the cycle's last would reach: that step is instead the first of the
#   next cycle, back at $\eta_{\max}$.
#
# `lr_min` and `mult` may be given or left at their defaults (0 and 2), and the step may lie
# far into the schedule (a seventh cycle). Work out first, for a step $s \ge W$, in which
# cycle it falls and how far into it; then check a few steps against the list above (with
# $W = 3$, $T_0 = 4$, `mult` $= 2$: restarts at steps 3, 7, 15, 31).
#
# <details><summary>Hint 1 of 5 · the idea: which cycle, and where in it</summary>
#
# Split the steps into the warm-up and the rest. After the warm-up, a step lies in one cycle,
# at some position inside it, and the cycles grow: $T_0$, $T_0 \cdot$ `mult`, $T_0 \cdot$
# `mult`², …. Once you know the length of the step's cycle and its position there, the rate is
# chapter 11.5's schedule again.
#
# </details>
#
# <details><summary>Hint 2 of 5 · a step: the warm-up</summary>
#
# For $s < W$: chapter 11.5's linear climb, which counts $s + 1$ of $W$ steps, so step 0
# already has $\eta_{\max}/W$ and step $W - 1$ has $\eta_{\max}$. With $W = 0$ no step is in
# the warm-up. Return a Python float, not a tensor: use `math`, not `torch`.
#
# </details>
#
# <details><summary>Hint 3 of 5 · a step: finding the cycle</summary>
#
# Count from the first cycle's start ($s - W$) and peel off whole cycles while what is left is
# at least the current cycle's length, multiplying that length by `mult` after each one. What
# is left is the position inside the current cycle; the length you stopped at is that cycle's
# length.
#
# </details>
#
# <details><summary>Hint 4 of 5 · a step: inside one cycle</summary>
#
# At position $r$ of a cycle of $T$ steps ($0 \le r < T$), use chapter 11.5's half cosine with
# $s - W$ replaced by $r$ and $T - W$ by $T$: it gives $\eta_{\max}$ at $r = 0$, and would give
# $\eta_{\min}$ at $r = T$, which is instead $r = 0$ of the next cycle.
#
# </details>
#
# <details><summary>Hint 5 of 5 · check yourself: against torch's scheduler</summary>
#
# In a scratch cell: with $W = 3$, $T_0 = 4$, `mult = 2`, `lr_max = 1`, steps 0, 2, 3, 5, 7,
# 15 and 31 must give 1/3, 1, 1, 0.5, 1, 1, 1. With $W = 0$, step a
# `torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=4, T_mult=2, eta_min=0.05)`
# on `torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)` forty times
# (`opt.step()`, then `sched.step()`): `opt.param_groups[0]["lr"]` before each must equal
# your `lr_at(k, 0, 4, 0.5, 0.05, 2)`; then `T_mult=1` and 3. The rate to check yours
# against, at position $r$ of a cycle of length $T$:
#
# $$\eta = \eta_{\min} + \tfrac12(\eta_{\max} - \eta_{\min})\left(1 + \cos\frac{\pi r}{T}\right).$$
#
# Delete the scratch cell before handing in.
#
# </details>

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
# # END QUESTION

# %% [markdown]
# **Self-check 4** compares every step of the warm-up and three cycles of a schedule with
# recorded reference outputs; the reference agrees with torch's `LinearLR` warm-up followed by
# `CosineAnnealingWarmRestarts`.

# %%
check_contract("lab11", "ex4", lr_at)

# %% [raw]
# # BEGIN QUESTION
# name: ex5

# %% [markdown]
# ## Exercise 5 · Gradient accumulation with an uneven last micro-batch (3 points)
#
# **Goal:** the loop in the order the chapter gives, and micro-batches of a fixed size whose
# gradients add up to exactly the gradient of one big batch, even when the last micro-batch
# is smaller than the others.
#
# **You derive:** the weight of each micro-batch's loss, so that the accumulated gradients are
# the full-batch mean's, and the one order of zero_grad, backward passes, clip and step.
#
# **You are given:** the model, the optimizer, the loss `F.mse_loss`, `X.split`,
# `torch.nn.utils.clip_grad_norm_`, and chapter 11.6's training loop.
#
# Write `train(model, opt, X, Y, steps, micro, max_norm=1.0)` for a `model` (an `nn.Module`;
# the checks use a small MLP in float64), a `torch.optim` optimizer `opt` over its parameters
# (SGD with momentum, or AdamW), inputs `X` `(B, d_in)` and targets `Y` `(B, d_out)`, with the
# loss `F.mse_loss(model(x), y)` (a mean). Each of the `steps` steps (1 or more) cuts the
# batch into micro-batches of `micro` rows (`X.split(micro)`, `Y.split(micro)`: when `micro`
# does not divide `B`, the last one is smaller; `micro` may be 1, or larger than `B`, which
# makes one micro-batch), runs forward and backward on each, clips the global gradient norm
# to `max_norm` (`torch.nn.utils.clip_grad_norm_`; `max_norm` given, or left at its default
# 1.0) and takes one optimizer step; the parameters after every step must be those of one
# batch of `B` (to 1e-10).
#
# Work out two things first: what `backward()` does to a `.grad` that already holds a
# gradient, and by what each micro-batch loss must be scaled so that the summed gradients are
# the gradient of the full-batch mean when the micro-batches differ in size (with 12 rows in
# micro-batches of 5: 5, 5 and 2). Then put zero_grad, the backward passes, the clip and the
# step in the one order that works (the model may arrive with a gradient left on it by its
# caller: the checks try that too).
#
# Return the list of the `steps` losses as **Python floats**: the loss of a step is the
# full-batch loss before that step (`.item()`).
#
# <details><summary>Hint 1 of 4 · the idea: `.grad` is a sum</summary>
#
# `backward()` **adds** into `.grad`. So after all the micro-batches, `.grad` holds the sum of
# their weighted gradients, and by linearity that is the gradient of the sum of their
# weighted losses. Choose the weights so that this sum of losses *is* the full-batch mean.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the full mean, by micro-batch</summary>
#
# The full-batch mean is $1/B$ times the sum over all $B$ rows of each row's loss (the mean
# over its `d_out` entries). Group that sum by micro-batch: micro-batch $i$'s share is $b_i$
# times its own mean, with $b_i$ = `len(Xb)`, 5, 5 and 2 for 12 rows in micro-batches of 5.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the order</summary>
#
# 1. the optimizer's `zero_grad` at the start of every step (the caller may have left a
#    gradient);
# 2. for each micro-batch: forward, then `backward()` of its weighted loss; the step's loss is
#    the sum of the weighted losses, read with `.item()`;
# 3. clip, after the last backward: it must see the summed gradient;
# 4. the optimizer's `step`.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: against one big batch</summary>
#
# In a scratch cell, in float64: build a small MLP, `copy.deepcopy` it, and give each copy its
# own `torch.optim.SGD(..., momentum=0.9)`. Train one with your `train(..., micro=5)` on 12
# rows, and the other with a plain loop you write there: `zero_grad`, the full-batch
# `F.mse_loss` and its `backward()`, `clip_grad_norm_`, `step`. After 3 steps the parameters
# must agree to 1e-10, and the losses too. Try `micro` 1, 4 and 20, `max_norm=0.01` (an active
# clip), AdamW, and a `.grad` set to ones before the call. The weight to check yours against:
#
# $$\frac{1}{B}\sum_{\text{rows}} \ell_r \;=\; \sum_i \frac{b_i}{B}\;\mathrm{mean}_i,$$
#
# micro-batch $i$ has $b_i$ rows. Delete the scratch cell before handing in.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def train(model, opt, X, Y, steps, micro, max_norm=1.0):
    """[the full-batch loss before each step] after `steps` optimizer steps, each over
    micro-batches of `micro` rows."""
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
# # END QUESTION

# %% [markdown]
# **Self-check 5** compares the parameters and losses of one full batch, with the same model and
# optimizer, with recorded reference outputs. The model is rebuilt from recorded weights and the
# optimizer from its recorded settings, over the model's parameters.

# %%
check_contract("lab11", "ex5", train)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `sgd_step`, `adam_step`, `adamw_step`,
# `lr_at` and `train`.
