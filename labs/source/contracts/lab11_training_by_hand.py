"""Lab 11's contract: each exercise's reference and its case classes, one per promise of its prompt.

The prompts promise (labs/source/src/lab11_training_by_hand.py):

* ex1 ``sgd_step(theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0)``:
  one step of torch.optim.SGD, ``(theta, buf)``: momentum left at its default 0 and given as 0 (buf
  stays None), the first step (buf None: the buffer starts at g, not dampened) and a later one,
  dampening on the first and on a later step, Nesterov on the first and on a later step, weight
  decay with momentum, a 2-D theta. The step may update its arguments in place (``in_place``).
* ex2 ``adam_step(theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)``:
  one step of torch.optim.Adam(amsgrad=True), ``(theta, m, v, v_max)`` with the raw m and v: the
  first step from zeros, a later step, v_max above the new v everywhere and below it everywhere,
  betas given, eps given (where it matters), eps at its default alone in the denominator
  (g = 0, v = v_max = 0), L2 weight decay, a 2-D theta.
* ex3 ``adamw_step(..., weight_decay=0.01)``: one step of torch.optim.AdamW(amsgrad=True):
  weight_decay given and left at its default 0.01, 0, the first step, v_max in charge, a weight
  the loss ignores (g = m = v = v_max = 0: it decays by exactly 1 − ηλ), betas and eps given,
  a 2-D theta.
* ex4 ``lr_at(step, warmup, period, lr_max, lr_min=0.0, mult=2)``: a Python float for every step
  (judged over the first cycles through the ``at_each`` probe): mult left at its default 2,
  mult = 1 and 3, warmup = 0, lr_min left at its default 0, steps deep in later cycles.
* ex5 ``train(model, opt, X, Y, steps, micro, max_norm=1.0)``: a model (a ``Made``
  nn.Sequential) and a torch.optim optimizer built over its parameters by the ``trained_with``
  probe from a recorded spec; the parameters after and the returned losses (Python floats)
  equal one full batch's: micro divides B, the last micro-batch smaller, micro = 1, micro > B,
  an active clip, max_norm left at its default 1.0 (active), one step, AdamW.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import torch
import torch.nn.functional as F
from contract import Case, CaseClass, Contract, Exercise

from helpers.device import randn
from helpers.labcontract import Made

F64 = torch.float64
TOL = {"atol": 1e-12, "rtol": 1e-10}
ADAM_TOL = {"atol": 1e-14, "rtol": 1e-12}  # θ of order 1, steps of order η
index = st.integers(0, 20)  # a class with no free size: the draw only moves the seed
lrs = st.sampled_from([0.01, 0.05, 0.1, 0.2])
mus = st.sampled_from([0.5, 0.8, 0.9])
taus = st.sampled_from([0.1, 0.3, 0.5])
lams = st.sampled_from([0.01, 0.05, 0.1])
# torch.optim's own optimizers take the step the exercises ask for (red team 11: 7 of 12 points on
# ex1-ex3 by loading the state into opt.state and calling opt.step()): every optimizer's step is refused
# in every step exercise, found, not listed (ASGD with no decay is plain SGD). Their step, not the class:
# a guarded class is no longer itself, and the grader's wire sends classes by identity (ex5's optimizer)
TORCH_OPTIMIZERS = tuple(
    f"torch.optim.{n}.step"
    for n in sorted(dir(torch.optim))
    if isinstance(getattr(torch.optim, n), type)
    and issubclass(getattr(torch.optim, n), torch.optim.Optimizer)
    and n != "Optimizer"
)

# --------------------------------------------------------------------------- ex1


def sgd_step(theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
    """One step of torch.optim.SGD for one parameter: (θ, momentum buffer)."""
    d = g + weight_decay * theta
    if momentum != 0:
        buf = d.clone() if buf is None else buf * momentum + d * (1 - dampening)
        d = d + momentum * buf if nesterov else buf
    return theta - lr * d, buf


def _sgd(p: dict, seed: int, shape=(5,), first=False, **kw) -> Case:
    theta = randn(*shape, seed=seed, dtype=F64)
    g = randn(*shape, seed=seed + 1, dtype=F64)
    buf = None if first else randn(*shape, seed=seed + 2, dtype=F64)
    return Case((theta, g, buf, p["lr"]), kwargs={k: v for k, v in kw.items() if v is not None})


def _hp(**strategies):
    return st.fixed_dictionaries({"lr": lrs, **strategies})


ex1 = Exercise(
    "ex1",
    "sgd_step",
    "(\n    theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0\n)",
    "Exercise 1 · sgd_step",
    sgd_step,
    ("theta", "buf"),
    [
        CaseClass(
            "momentum is left at its default (0: buf stays None)",
            _hp(i=index),
            lambda p, s: _sgd(p, s + p["i"], first=True),
            **TOL,
        ),
        CaseClass(
            "momentum is 0 with weight decay (buf stays None)",
            _hp(wd=lams),
            lambda p, s: _sgd(p, s, first=True, momentum=0.0, weight_decay=p["wd"]),
            **TOL,
        ),
        CaseClass(
            "it is a later step (buf given, momentum > 0)",
            _hp(mu=mus),
            lambda p, s: _sgd(p, s, momentum=p["mu"]),
            **TOL,
        ),
        CaseClass(
            "it is the first step (buf None: the buffer starts at g)",
            _hp(mu=mus),
            lambda p, s: _sgd(p, s, first=True, momentum=p["mu"]),
            **TOL,
        ),
        CaseClass(
            "dampening > 0 on the first step (not dampened)",
            _hp(mu=mus, tau=taus),
            lambda p, s: _sgd(p, s, first=True, momentum=p["mu"], dampening=p["tau"]),
            **TOL,
        ),
        CaseClass(
            "dampening > 0 on a later step",
            _hp(mu=mus, tau=taus),
            lambda p, s: _sgd(p, s, momentum=p["mu"], dampening=p["tau"]),
            **TOL,
        ),
        CaseClass(
            "nesterov=True on a later step",
            _hp(mu=mus),
            lambda p, s: _sgd(p, s, momentum=p["mu"], nesterov=True),
            **TOL,
        ),
        CaseClass(
            "nesterov=True on the first step (buf None)",
            _hp(mu=mus),
            lambda p, s: _sgd(p, s, first=True, momentum=p["mu"], nesterov=True),
            **TOL,
        ),
        CaseClass(
            "weight_decay > 0 with momentum",
            _hp(mu=mus, wd=lams),
            lambda p, s: _sgd(p, s, momentum=p["mu"], weight_decay=p["wd"]),
            **TOL,
        ),
        CaseClass(
            "weight_decay > 0 with momentum on the first step (the buffer starts at g + λθ)",
            _hp(mu=mus, wd=lams),
            lambda p, s: _sgd(p, s, first=True, momentum=p["mu"], weight_decay=p["wd"]),
            **TOL,
        ),
        CaseClass(
            "nesterov=True with weight_decay > 0 (the look-ahead takes g + λθ too)",
            _hp(mu=mus, wd=lams),
            lambda p, s: _sgd(p, s, momentum=p["mu"], nesterov=True, weight_decay=p["wd"]),
            **TOL,
        ),
        CaseClass(
            "theta is 2-D (a weight matrix)",
            _hp(mu=mus, shape=st.tuples(st.integers(2, 4), st.integers(2, 4))),
            lambda p, s: _sgd(p, s, shape=p["shape"], momentum=p["mu"]),
            **TOL,
        ),
    ],
    probe="none_as_text",  # buf None is judged as 'None' (helpers.labcheck's diagnosis cannot take None)
    in_place=("theta", "buf"),  # never g: torch.optim leaves p.grad as it was
    points=2,
    by_hand=("helpers.optim.sgd_update", *TORCH_OPTIMIZERS),
)

# --------------------------------------------------------------------------- ex2


def adam_step(theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """One step of torch.optim.Adam(amsgrad=True) for one parameter: (θ, m, v, v_max), m and v raw."""
    b1, b2 = betas
    g = g + weight_decay * theta
    m = torch.lerp(m, g, 1 - b1)
    v = v * b2 + (1 - b2) * g.square()
    v_max = torch.maximum(v_max, v)
    denom = v_max.sqrt() / math.sqrt(1 - b2**t) + eps
    return theta - (lr / (1 - b1**t)) * m / denom, m, v, v_max


def _adam(p: dict, seed: int, shape=(5,), state="mixed", scale=1e-3, idle=False, **kw) -> Case:
    """One step from a state: 'zeros' (t = 1), 'mixed' (t > 1, v_max above the new v in some
    coordinates), 'max' (v_max above the new v everywhere), 'grown' (the new v above v_max everywhere),
    'eps' (g = 0, v = v_max = 0: ε alone is the denominator). Gradients of 1e-3 by default: where ε
    goes then moves θ by about 1e-10, far above the tolerance (at gradients of 1 it would sit on it)."""
    theta = randn(*shape, seed=seed, dtype=F64)
    g = scale * randn(*shape, seed=seed + 1, dtype=F64)
    m = 0.3 * scale * randn(*shape, seed=seed + 2, dtype=F64)
    v = scale**2 * (0.5 + randn(*shape, seed=seed + 3, dtype=F64).abs())
    t = 2 + p["i"] % 9
    if state == "zeros":
        m, v, v_max, t = 0 * m, 0 * v, 0 * v, 1
    elif state == "mixed":
        v_max = v * (1 + 2 * randn(*shape, seed=seed + 4, dtype=F64).abs())
    elif state == "max":
        v_max = v + 10 * scale**2 * (g.square() + 1)
    elif state == "grown":
        v_max = v.clone()
        g = g.sign() * (g.abs() + 3 * v.sqrt())  # g² > v: the new v rises above v_max = v
    else:  # "eps"
        g, v, v_max, t = 0 * g, 0 * v, 0 * v, 3
    if idle:  # the first coordinates: a weight the loss ignores, no history
        for x in (g, m, v, v_max):
            x.reshape(-1)[:2] = 0.0
    kwargs = {k: v for k, v in kw.items() if v is not None}
    return Case((theta, g, m, v, v_max, t, p["lr"]), kwargs=kwargs)


betas_s = st.sampled_from([(0.8, 0.9), (0.5, 0.6), (0.7, 0.95), (0.85, 0.995)])
eps_s = st.sampled_from([1e-6, 1e-4, 1e-3])
adam_hp = _hp(i=index)
ex2 = Exercise(
    "ex2",
    "adam_step",
    "(\n    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0\n)",
    "Exercise 2 · adam_step",
    adam_step,
    ("theta", "m", "v", "v_max"),
    [
        CaseClass(
            "it is the first step (t = 1, m = v = v_max = 0)",
            adam_hp,
            lambda p, s: _adam(p, s + p["i"], state="zeros"),
            **ADAM_TOL,
        ),
        CaseClass(
            "it is a later step (t > 1)",
            adam_hp,
            lambda p, s: _adam(p, s + p["i"]),
            **ADAM_TOL,
        ),
        CaseClass(
            "v_max is above the new v everywhere (the running max in charge)",
            adam_hp,
            lambda p, s: _adam(p, s + p["i"], state="max"),
            **ADAM_TOL,
        ),
        CaseClass(
            "the new v rises above v_max everywhere",
            adam_hp,
            lambda p, s: _adam(p, s + p["i"], state="grown"),
            **ADAM_TOL,
        ),
        CaseClass(
            "betas are given (not (0.9, 0.999))",
            _hp(i=index, b=betas_s),
            lambda p, s: _adam(p, s + p["i"], betas=p["b"]),
            **ADAM_TOL,
        ),
        CaseClass(
            "eps is given (1e-6–1e-3, gradients of its size)",
            _hp(i=index, e=eps_s),
            lambda p, s: _adam(p, s + p["i"], scale=p["e"], eps=p["e"]),
            **ADAM_TOL,
        ),
        CaseClass(
            "g = 0 and v = v_max = 0 (eps at its default alone in the denominator)",
            adam_hp,
            lambda p, s: _adam(p, s + p["i"], state="eps"),
            **ADAM_TOL,
        ),
        CaseClass(
            "weight_decay > 0 (Adam's L2 penalty)",
            _hp(i=index, wd=lams),
            lambda p, s: _adam(p, s + p["i"], weight_decay=p["wd"]),
            **ADAM_TOL,
        ),
        CaseClass(
            "theta is 2-D (a weight matrix)",
            _hp(shape=st.tuples(st.integers(2, 4), st.integers(2, 4)), i=index),
            lambda p, s: _adam(p, s + p["i"], shape=p["shape"]),
            **ADAM_TOL,
        ),
    ],
    in_place=("theta", "m", "v", "v_max"),  # never g
    points=3,
    by_hand=("helpers.optim.adam_update", *TORCH_OPTIMIZERS),
)

# --------------------------------------------------------------------------- ex3


def adamw_step(theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    """One step of torch.optim.AdamW(amsgrad=True): θ shrunk by 1 − ηλ, then AMSGrad on g alone."""
    return adam_step(theta * (1 - lr * weight_decay), g, m, v, v_max, t, lr, betas, eps, 0.0)


ex3 = Exercise(
    "ex3",
    "adamw_step",
    "(\n    theta, g, m, v, v_max, t, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01\n)",
    "Exercise 3 · adamw_step",
    adamw_step,
    ("theta", "m", "v", "v_max"),
    [
        CaseClass(
            "it is a later step (t > 1, weight_decay given)",
            _hp(i=index, wd=st.sampled_from([0.1, 0.3, 0.5])),
            lambda p, s: _adam(p, s + p["i"], weight_decay=p["wd"]),
            **ADAM_TOL,
        ),
        CaseClass(
            "weight_decay is left at its default (0.01)",
            adam_hp,
            lambda p, s: _adam(p, s + p["i"]),
            **ADAM_TOL,
        ),
        CaseClass(
            "weight_decay is 0 (plain AMSGrad)",
            adam_hp,
            lambda p, s: _adam(p, s + p["i"], weight_decay=0.0),
            **ADAM_TOL,
        ),
        CaseClass(
            "it is the first step (t = 1, m = v = v_max = 0)",
            _hp(i=index, wd=st.sampled_from([0.1, 0.3, 0.5])),
            lambda p, s: _adam(p, s + p["i"], state="zeros", weight_decay=p["wd"]),
            **ADAM_TOL,
        ),
        CaseClass(
            "v_max is above the new v everywhere (the running max in charge)",
            _hp(i=index, wd=st.sampled_from([0.1, 0.3, 0.5])),
            lambda p, s: _adam(p, s + p["i"], state="max", weight_decay=p["wd"]),
            **ADAM_TOL,
        ),
        CaseClass(
            "a weight the loss ignores (g = m = v = v_max = 0 there)",
            _hp(i=index, wd=st.sampled_from([0.1, 0.3, 0.5])),
            lambda p, s: _adam(p, s + p["i"], idle=True, weight_decay=p["wd"]),
            **ADAM_TOL,
        ),
        CaseClass(
            "betas and eps are given",
            _hp(i=index, b=betas_s, e=eps_s),
            lambda p, s: _adam(p, s + p["i"], scale=p["e"], betas=p["b"], eps=p["e"], weight_decay=0.1),
            **ADAM_TOL,
        ),
        CaseClass(
            "theta is 2-D (a weight matrix)",
            _hp(shape=st.tuples(st.integers(2, 4), st.integers(2, 4)), i=index),
            lambda p, s: _adam(p, s + p["i"], shape=p["shape"], weight_decay=0.2),
            **ADAM_TOL,
        ),
    ],
    in_place=("theta", "m", "v", "v_max"),  # never g
    points=2,
    by_hand=("helpers.optim.adam_update", *TORCH_OPTIMIZERS),
    calls=(
        "ex2",
    ),  # the prompt lets adamw_step call the learner's adam_step: its mistake costs ex2's points only
)

# --------------------------------------------------------------------------- ex4


def lr_at(step, warmup, period, lr_max, lr_min=0.0, mult=2):
    """A linear warm-up over `warmup` steps, then SGDR's half cosines in cycles period·multᵏ."""
    if step < warmup:
        return lr_max * (step + 1) / warmup
    s, start, T = step - warmup, 0, period
    while s >= start + T:
        start, T = start + T, T * mult
    return lr_min + (lr_max - lr_min) * (1 + math.cos(math.pi * (s - start) / T)) / 2


def _schedule(p: dict, seed: int, warmup=None, mult=None, lr_min=True) -> Case:
    W = p["W"] if warmup is None else warmup
    m = 2 if mult is None else mult
    count = W + p["T"] * (1 + m + m * m) + 3  # the warm-up, three cycles, the next one's start
    args = (W, p["T"], p["hi"]) + ((p["hi"] * p["lo"],) if lr_min else ())
    kwargs = {} if mult is None else {"mult": mult}
    return Case(args, kwargs=kwargs, options={"steps": list(range(count))})


def _deep(p: dict, mult: int = 2, last: int = 7) -> Case:
    """Steps of cycles 4 to `last` (of T, mult·T, mult²·T, …): every third step, and each cycle's first
    step with its neighbours (where a cycle index from logarithms rounds the wrong way: log 3⁵ / log 3 < 5)."""
    W, T = p["W"], p["T"]

    def start(k):  # the first step of cycle k + 1 (k cycles done)
        return W + T * (mult**k - 1) // (mult - 1)

    edges = {s + d for k in range(3, last + 1) for s in [start(k)] for d in (-1, 0, 1)}
    steps = sorted(set(range(start(3) - 2, start(last) + 2, 3)) | edges)
    return Case((W, T, p["hi"], p["hi"] * p["lo"], mult), options={"steps": steps})


sched = st.fixed_dictionaries(
    {
        "W": st.integers(2, 5),
        "T": st.integers(3, 5),
        "hi": st.sampled_from([1e-2, 0.1, 1.0, 3e-3]),
        "lo": st.sampled_from([0.1, 0.01, 0.05]),
    }
)
SCHED_TOL = {"atol": 1e-14, "rtol": 1e-12}
ex4 = Exercise(
    "ex4",
    "lr_at",
    "(step, warmup, period, lr_max, lr_min=0.0, mult=2)",
    "Exercise 4 · lr_at",
    lr_at,
    ("type of the values", "lr per step"),
    [
        CaseClass(
            "mult is left at its default (2)",
            sched,
            lambda p, s: _schedule(p, s),
            **SCHED_TOL,
        ),
        CaseClass("mult = 3", sched, lambda p, s: _schedule(p, s, mult=3), **SCHED_TOL),
        CaseClass(
            "mult = 1 (cycles that never grow)",
            sched,
            lambda p, s: _schedule(p, s, mult=1),
            **SCHED_TOL,
        ),
        CaseClass(
            "warmup = 0 (no warm-up)",
            sched.map(lambda p: {**p, "W": 0}),
            lambda p, s: _schedule(p, s, warmup=0, mult=2),  # p["W"] is 0 here
            **SCHED_TOL,
        ),
        CaseClass(
            "lr_min is left at its default (0)",
            sched,
            lambda p, s: _schedule(p, s, lr_min=False, mult=2),
            **SCHED_TOL,
        ),
        CaseClass(
            "the steps are deep in later cycles (cycles 4–7)",
            sched,
            lambda p, s: _deep(p),
            **SCHED_TOL,
        ),
        CaseClass(
            "mult = 3 deep in later cycles (cycles 4–6, their first steps included)",
            sched,
            lambda p, s: _deep(p, mult=3, last=6),
            **SCHED_TOL,
        ),
    ],
    probe="at_each",
    points=2,
    by_hand=("helpers.optim.lr_warmup_cosine",),
)


# --------------------------------------------------------------------------- ex5


def train(model, opt, X, Y, steps, micro, max_norm=1.0):
    """`steps` steps of one full batch (micro-batches add up to it): zero_grad, backward, clip, step."""
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        L = F.mse_loss(model(X), Y)
        L.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
        losses.append(L.item())
    return losses


def _mlp(d_in: int, hidden: int, d_out: int, seed: int, scale: float) -> Made:
    state = {
        "0.weight": scale * randn(hidden, d_in, seed=seed, dtype=F64),
        "0.bias": scale * randn(hidden, seed=seed + 1, dtype=F64),
        "2.weight": scale * randn(d_out, hidden, seed=seed + 2, dtype=F64),
        "2.bias": scale * randn(d_out, seed=seed + 3, dtype=F64),
    }
    layers = (
        Made("torch.nn.Linear", d_in, hidden, dtype=F64),
        Made("torch.nn.Tanh"),
        Made("torch.nn.Linear", hidden, d_out, dtype=F64),
    )
    return Made("torch.nn.Sequential", *layers, state=state)


SGD = {"optimizer": "torch.optim.SGD", "hp": {"lr": 0.1, "momentum": 0.9}}
ADAMW = {"optimizer": "torch.optim.AdamW", "hp": {"lr": 0.05}}


def _train(B: int, micro: int, seed: int, steps=4, max_norm=1e9, opt=SGD, y_scale=1.0) -> Case:
    model = _mlp(3, 5, 2, seed, 0.7)
    X = randn(B, 3, seed=seed + 10, dtype=F64)
    Y = y_scale * randn(B, 2, seed=seed + 11, dtype=F64)
    args = (model, X, Y, steps, micro) + (() if max_norm is None else (max_norm,))
    return Case(args, options=opt)


uneven = st.sampled_from([(12, 5), (8, 3), (10, 4), (11, 3), (7, 2)])
TRAIN_TOL = {"atol": 1e-10, "rtol": 1e-9}
ex5 = Exercise(
    "ex5",
    "train",
    "(model, opt, X, Y, steps, micro, max_norm=1.0)",
    "Exercise 5 · train",
    train,
    ("parameters", "losses", "type of the losses"),
    [
        CaseClass(
            "micro divides B (equal micro-batches)",
            st.sampled_from([(12, 4), (12, 3), (12, 6), (8, 4), (10, 5)]),
            lambda p, s: _train(*p, s),
            **TRAIN_TOL,
        ),
        CaseClass(
            "the last micro-batch is smaller (micro does not divide B)",
            uneven,
            lambda p, s: _train(*p, s),
            **TRAIN_TOL,
        ),
        CaseClass(
            "micro = 1 (one row per micro-batch)",
            st.integers(4, 9),
            lambda B, s: _train(B, 1, s),
            **TRAIN_TOL,
        ),
        CaseClass(
            "micro > B (one micro-batch of all B rows)",
            st.tuples(st.integers(4, 9), st.integers(1, 5)),
            lambda p, s: _train(p[0], p[0] + p[1], s),
            **TRAIN_TOL,
        ),
        CaseClass(
            "the clip is active (max_norm 0.05–0.2)",
            st.tuples(uneven, st.sampled_from([0.05, 0.1, 0.2])),
            lambda p, s: _train(*p[0], s, max_norm=p[1], y_scale=3.0),
            **TRAIN_TOL,
        ),
        CaseClass(
            "max_norm is left at its default (1.0, active)",
            uneven,
            lambda p, s: _train(*p, s, max_norm=None, y_scale=8.0),
            **TRAIN_TOL,
        ),
        CaseClass(
            "there is one step (steps = 1)",
            uneven,
            lambda p, s: _train(*p, s, steps=1),
            **TRAIN_TOL,
        ),
        CaseClass(
            "the optimizer is AdamW",
            uneven,
            lambda p, s: _train(*p, s, opt=ADAMW),
            **TRAIN_TOL,
        ),
        CaseClass(
            "the model arrives with a leftover .grad (zero_grad comes first)",
            uneven,
            lambda p, s: _train(*p, s, opt={**SGD, "stale": 0.5}),
            **TRAIN_TOL,
        ),
    ],
    probe="trained_with",
    points=3,
    by_hand=("helpers.train.train",),
)

CONTRACT = Contract("lab11_training_by_hand", [ex1, ex2, ex3, ex4, ex5], base_seed=110_000)
