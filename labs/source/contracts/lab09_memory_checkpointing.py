"""Lab 9's contract: each exercise's reference and its case classes, one per promise of its prompt.

The prompts promise (labs/source/src/lab09_memory_checkpointing.py):

* ex1 ``predict_saved_bytes(B, d, d_ff, activation, bytes_per_element)``: the bytes the LayerNorm +
  MLP block keeps for backward on the CPU, parameters not counted, as an ``int``; ReLU and GELU;
  2, 4 or 8 bytes per element; any B ≥ 1 (B = 1 included); d_ff larger than, equal to or
  smaller than d. The classes other than "activation is 'gelu'" use ReLU (one axis at a time).
* ex2 ``StackCheckpoint`` (an autograd.Function, ``apply(fn, every, x, *params)``): the stack's
  output and every gradient autograd gets, for L blocks in segments of ``every`` (L a multiple of
  every, a shorter last segment, every = 1, every ≥ L); at most ``every`` blocks hold a graph at
  once, the segments re-run last to first; only x is saved (the parameters exist anyway); a data
  x (needs no gradient) is never re-run with requires_grad while the later segments' inputs are;
  a frozen weight gets None and the others stay right; x of any (..., d), float32 or float64.
* ex3 ``checkpoint_rng(fn, x, *params)`` (with its ``CheckpointRNG``): fn's output and gradients as
  without checkpointing, dropout's mask drawn the same in the re-run; the random stream after
  backward as without checkpointing when something is drawn between forward and backward; a
  block without dropout; a data x stays without requires_grad in the re-run; a frozen weight;
  x of any (..., d); float32.
* ex4 ``checkpoint_stack(x, layers, segment)``: the ffn_dropout stack's output and gradients (the
  masks as without checkpointing), ⌈L/segment⌉ inputs of x's size kept, for L a multiple of
  segment, a shorter last segment, segment = 1, segment ≥ L; x of any (..., d); float32.
* ex5 ``scaled_step(params, loss_fn, scale, tracker, lr, growth_interval=2000)``: the returned
  (scale, tracker, stepped) with a float, an int and a bool, and the parameters after (updated in
  place): a clean step, an overflow (skipped, scale halved, tracker reset from any value), the
  clean step that reaches growth_interval (scale doubled, tracker 0), growth_interval left at its
  default 2000, a loss whose float16 gradients underflow unless scaled, one parameter or two.

ex2–ex4 run through the ``checkpoint_run`` probe (helpers.labcontract): seeded, forward then
backward, the blocks (``ffn_block``, ``ffn_dropout``, in FUNCTIONS and portable across the grader's
boundary) logging each run with a graph; ex5 through ``scaler_step``.
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
import torch.nn.functional as F
from contract import Case, CaseClass, Contract, Exercise

from helpers.checkpoint import get_rng_state, set_rng_state
from helpers.device import randn
from helpers.labcontract import FUNCTIONS, ffn_dropout
from helpers.memory import SavedTensors

F64, F32 = torch.float64, torch.float32
EXACT = {"atol": 0.0, "rtol": 0.0}
F64_TOL = {"atol": 1e-12, "rtol": 1e-10}
F32_TOL = {"atol": 1e-5, "rtol": 1e-5}

# --------------------------------------------------------------------------- ex1


def mlp_block(x, ln_w, ln_b, W1, b1, W2, b2, activation="relu"):
    """y = x + act(LN(x) W1ᵀ + b1) W2ᵀ + b2, x (B, d), W1 (d_ff, d), W2 (d, d_ff)."""
    h = F.layer_norm(x, x.shape[-1:], ln_w, ln_b)  # (B, d)
    z = h @ W1.T + b1  # (B, d_ff)
    a = F.relu(z) if activation == "relu" else F.gelu(z)
    return x + a @ W2.T + b2  # (B, d)


def predict_saved_bytes(B, d, d_ff, activation, bytes_per_element):
    """What SavedTensors measures while mlp_block runs in float32 on the CPU, rescaled to the element size."""
    x = torch.randn(B, d, requires_grad=True)
    shapes = [(d,), (d,), (d_ff, d), (d_ff,), (d, d_ff), (d,)]
    params = [torch.randn(*s, requires_grad=True) for s in shapes]
    with SavedTensors(exclude=params) as saved:
        mlp_block(x, *params, activation=activation)
    return saved.total_bytes // 4 * bytes_per_element


def _bytes(B: int, d: int, d_ff: int, activation: str, n: int) -> Case:
    act = "ReLU's output" if activation == "relu" else "GELU's input or output"
    pieces = {
        "one (B, d) tensor: x, or LayerNorm's output": B * d * n,
        "LayerNorm's μ and 1/σ": 2 * B * n,
        f"one (B, d_ff) tensor: {act}": B * d_ff * n,
    }
    return Case((B, d, d_ff, activation, n), factors={"bytes per element": n}, terms={"bytes": pieces})


sizes = st.tuples(st.integers(2, 9), st.integers(2, 12), st.integers(2, 16))
# what every by-hand exercise of this lab that checkpoints may not call
CHECKPOINT_BY_HAND = (
    "torch.utils.checkpoint.checkpoint",
    "helpers.checkpoint.checkpoint",
    "helpers.checkpoint.recompute_backward",
    "helpers.checkpoint.checkpoint_sequential",
)

ex1 = Exercise(
    "ex1",
    "predict_saved_bytes",
    "(B, d, d_ff, activation, bytes_per_element)",
    "Exercise 1 · predict_saved_bytes",
    predict_saved_bytes,
    ("bytes",),
    [
        CaseClass(
            "activation is 'relu'",
            sizes.filter(lambda p: p[1] != p[2]),
            lambda p, s: _bytes(*p, "relu", 4),
            **EXACT,
        ),
        CaseClass(
            "activation is 'gelu'",
            sizes.filter(lambda p: p[1] != p[2]),
            lambda p, s: _bytes(*p, "gelu", 4),
            **EXACT,
        ),
        CaseClass(
            "bytes_per_element is 8 (float64)",
            sizes.filter(lambda p: p[1] != p[2]),
            lambda p, s: _bytes(*p, "relu", 8),
            **EXACT,
        ),
        CaseClass(
            "bytes_per_element is 2 (float16)",
            sizes.filter(lambda p: p[1] != p[2]),
            lambda p, s: _bytes(*p, "relu", 2),
            **EXACT,
        ),
        CaseClass(
            "there is one row (B = 1)",
            st.tuples(st.integers(2, 12), st.integers(2, 16)).filter(lambda p: p[0] != p[1]),
            lambda p, s: _bytes(1, p[0], p[1], "relu", 4),
            **EXACT,
        ),
        CaseClass(
            "d_ff equals d",
            st.tuples(st.integers(2, 9), st.integers(2, 12)),
            lambda p, s: _bytes(p[0], p[1], p[1], "relu", 4),
            **EXACT,
        ),
    ],
    points=2,
)

# --------------------------------------------------------------------------- ex2


def _blocks(params):
    return [params[i : i + 4] for i in range(0, len(params), 4)]


class StackCheckpoint(torch.autograd.Function):
    """The stack x_l = fn(x_{l-1}, θ_l) keeping x only; backward re-runs it in segments of `every`, last first."""

    @staticmethod
    def forward(fn, every, x, *params):
        with torch.no_grad():
            for theta in _blocks(params):
                x = fn(x, *theta)
        return x

    @staticmethod
    def setup_context(ctx, inputs, output):
        fn, every, x, *params = inputs
        ctx.fn, ctx.every = fn, every
        ctx.save_for_backward(x, *params)

    @staticmethod
    def backward(ctx, grad_y):
        x, *params = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]  # x, then every parameter
        L = len(params) // 4
        segments = [list(range(s, min(s + ctx.every, L))) for s in range(0, L, ctx.every)]
        starts = [x]
        with torch.no_grad():
            for seg in segments[:-1]:
                h = starts[-1]
                for b in seg:
                    h = ctx.fn(h, *params[4 * b : 4 * b + 4])
                starts.append(h)
        grads, g = [None] * len(params), grad_y
        for seg, h0 in reversed(list(zip(segments, starts))):
            need_h = seg[0] > 0 or needs[0]
            h = h0.detach().requires_grad_(need_h)
            idx = range(4 * seg[0], 4 * seg[-1] + 4)
            leaves = {i: params[i].detach().requires_grad_(needs[1 + i]) for i in idx}
            with torch.enable_grad():
                y = h
                for b in seg:
                    y = ctx.fn(y, *[leaves[i] for i in range(4 * b, 4 * b + 4)])
            want = [i for i in idx if needs[1 + i]]
            got = torch.autograd.grad(y, ([h] if need_h else []) + [leaves[i] for i in want], g)
            g = got[0] if need_h else None
            for i, gi in zip(want, got[1:] if need_h else got):
                grads[i] = gi
        return (None, None, g if needs[0] else None, *grads)


def _stack(L: int, lead, d: int, f: int, seed: int, dtype=F64) -> tuple:
    x = randn(*lead, d, seed=seed, dtype=dtype)
    params = []
    for b in range(L):
        for i, shape in enumerate([(f, d), (f,), (d, f), (d,)]):
            scale = 0.5 if i % 2 == 0 else 0.1
            params.append(scale * randn(*shape, seed=seed + 10 + 4 * b + i, dtype=dtype))
    return x, params


def _ex2(L, every, lead, d, f, seed, dtype=F64, data_x=False, frozen=()) -> Case:
    x, params = _stack(L, lead, d, f, seed, dtype)
    options = {
        "method": "apply",
        "x_at": 2,
        "data_x": data_x,
        "frozen": tuple(frozen),
        "grad_output": randn(*x.shape, seed=seed + 1, dtype=dtype),
        "report": ("peak", "order", "data_x", "saved", "held"),
    }
    return Case((FUNCTIONS["ffn_block"], every, x, *params), options=options)


dims = st.tuples(st.integers(2, 4), st.integers(3, 5), st.integers(3, 6)).filter(
    lambda p: len(set(p)) == 3
)  # (B, d, f)
# the prompt's "no more multiply–adds than the course's checkpoint needs", measured on every class (a wasted
# pass without a graph costs work in every case: measured only where an input needs none, a newcomer's was
# blamed on data x and frozen weights); where an input needs no gradient, None is returned for it too
WORK = {"multiply_adds": 1}
FROZEN_RULES = {**WORK, "gated": True}

ex2 = Exercise(
    "ex2",
    "StackCheckpoint",
    "(torch.autograd.Function)",
    "Exercise 2 · StackCheckpoint",
    StackCheckpoint,
    (
        "blocks holding a graph at once",
        "segments re-run",
        "data-x re-runs",
        "saved",
        "tensors held as ctx attributes",
        "y",
        "grad_x",
        "grad_params",
    ),
    [
        CaseClass(
            "L is a multiple of every (2 ≤ every < L)",
            st.tuples(st.sampled_from([(4, 2), (6, 2), (6, 3)]), dims),
            lambda p, s: _ex2(*p[0], (p[1][0],), *p[1][1:], s),
            rules=WORK,
            **F64_TOL,
        ),
        CaseClass(
            "the last segment is shorter (L % every ≠ 0)",
            st.tuples(st.sampled_from([(5, 2), (5, 3), (7, 3)]), dims),
            lambda p, s: _ex2(*p[0], (p[1][0],), *p[1][1:], s),
            rules=WORK,
            **F64_TOL,
        ),
        CaseClass(
            "every = 1 (one block per segment)",
            st.tuples(st.integers(2, 4), dims),
            lambda p, s: _ex2(p[0], 1, (p[1][0],), *p[1][1:], s),
            rules=WORK,
            **F64_TOL,
        ),
        CaseClass(
            "every ≥ L (one segment)",
            st.tuples(st.sampled_from([(2, 2), (3, 3), (2, 4), (3, 5)]), dims),
            lambda p, s: _ex2(*p[0], (p[1][0],), *p[1][1:], s),
            rules=WORK,
            **F64_TOL,
        ),
        CaseClass(
            "x is data (needs no gradient)",
            st.tuples(st.sampled_from([(4, 2), (5, 2), (3, 1)]), dims),
            lambda p, s: _ex2(*p[0], (p[1][0],), *p[1][1:], s, data_x=True),
            rules=FROZEN_RULES,
            **F64_TOL,
        ),
        CaseClass(
            # a matrix and a bias: a bias's gradient costs no multiply–add, a matrix's does
            "a weight matrix and a bias are frozen (need no gradient)",
            st.tuples(
                st.sampled_from([(4, 2), (5, 2), (3, 1)]), dims, st.sampled_from([(0, 5), (2, 1), (6, 3)])
            ),
            lambda p, s: _ex2(*p[0], (p[1][0],), *p[1][1:], s, frozen=p[2]),
            rules=FROZEN_RULES,
            **F64_TOL,
        ),
        CaseClass(
            "x is 3-D (B, T, d)",
            st.tuples(st.sampled_from([(4, 2), (5, 2)]), dims, st.integers(2, 3)),
            lambda p, s: _ex2(*p[0], (p[1][0], p[2]), *p[1][1:], s),
            rules=WORK,
            **F64_TOL,
        ),
        CaseClass(
            "x is float32",
            st.tuples(st.sampled_from([(4, 2), (5, 2)]), dims),
            lambda p, s: _ex2(*p[0], (p[1][0],), *p[1][1:], s, dtype=F32),
            rules=WORK,
            **F32_TOL,
        ),
    ],
    points=3,
    by_hand=CHECKPOINT_BY_HAND,
)

# --------------------------------------------------------------------------- ex3


def checkpoint_rng(fn, x, *params):
    """fn(x, *params) without checkpointing: what a checkpoint that repeats the mask must agree with."""
    return fn(x, *params)


def _ex3(lead, d, f, seed, fn="ffn_dropout", dtype=F64, data_x=False, frozen=(), between=0) -> Case:
    x, params = _stack(1, lead, d, f, seed, dtype)
    options = {
        "x_at": 1,
        "data_x": data_x,
        "frozen": tuple(frozen),
        "grad_output": randn(*x.shape, seed=seed + 1, dtype=dtype),
        "seed": seed % 1000,
        "between": between,
        "report": ("data_x", "after", "held"),
    }
    return Case((FUNCTIONS[fn], x, *params), options=options)


ex3 = Exercise(
    "ex3",
    "checkpoint_rng",
    "(fn, x, *params)",
    "Exercise 3 · checkpoint_rng",
    checkpoint_rng,
    (
        "data-x re-runs",
        "random stream after backward",
        "tensors held as ctx attributes",
        "y",
        "grad_x",
        "grad_params",
    ),
    [
        CaseClass("the block draws a dropout mask", dims, lambda p, s: _ex3((p[0],), *p[1:], s), **F64_TOL),
        CaseClass(
            "something is drawn between forward and backward",
            st.tuples(dims, st.integers(1, 3)),
            lambda p, s: _ex3((p[0][0],), *p[0][1:], s, between=p[1]),
            **F64_TOL,
        ),
        CaseClass(
            "the block has no dropout",
            dims,
            lambda p, s: _ex3((p[0],), *p[1:], s, fn="ffn_block"),
            **F64_TOL,
        ),
        CaseClass(
            "x is data (needs no gradient)",
            dims,
            lambda p, s: _ex3((p[0],), *p[1:], s, data_x=True),
            rules={"gated": True},
            **F64_TOL,
        ),
        CaseClass(
            "a weight matrix and a bias are frozen (need no gradient)",
            st.tuples(dims, st.sampled_from([(0, 3), (2, 1), (0, 1), (2, 3)])),
            lambda p, s: _ex3((p[0][0],), *p[0][1:], s, frozen=p[1]),
            rules={"gated": True},
            **F64_TOL,
        ),
        CaseClass(
            "x is 3-D (B, T, d)",
            st.tuples(dims, st.integers(2, 3)),
            lambda p, s: _ex3((p[0][0], p[1]), *p[0][1:], s),
            **F64_TOL,
        ),
        CaseClass(
            "x is float32",
            dims,
            lambda p, s: _ex3((p[0],), *p[1:], s, dtype=F32),
            **F32_TOL,
        ),
    ],
    points=2,
    by_hand=CHECKPOINT_BY_HAND,
)

# --------------------------------------------------------------------------- ex4


class _Checkpoint(torch.autograd.Function):
    """fn(x, *params) keeping x and the RNG state taken before; backward re-runs fn from that state."""

    @staticmethod
    def forward(fn, state, x, *params):
        with torch.no_grad():
            return fn(x, *params)

    @staticmethod
    def setup_context(ctx, inputs, output):
        fn, state, x, *params = inputs
        ctx.fn, ctx.state = fn, state
        ctx.save_for_backward(x, *params)

    @staticmethod
    def backward(ctx, grad_y):
        saved = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]
        leaves = [t.detach().requires_grad_(n) for t, n in zip(saved, needs)]
        with torch.random.fork_rng(devices=[]):
            set_rng_state(ctx.state)
            with torch.enable_grad():
                y = ctx.fn(*leaves)
        want = [t for t in leaves if t.requires_grad]
        got = iter(torch.autograd.grad(y, want, grad_y))
        return (None, None, *(next(got) if n else None for n in needs))


def _run_blocks(h, *flat):
    for theta in _blocks(flat):
        h = ffn_dropout(h, *theta)
    return h


def checkpoint_stack(x, layers, segment):
    """The ffn_dropout stack, each run of `segment` blocks checkpointed as one function."""
    for s in range(0, len(layers), segment):
        flat = [p for theta in layers[s : s + segment] for p in theta]
        x = _Checkpoint.apply(_run_blocks, get_rng_state([x, *flat]), x, *flat)
    return x


def _ex4(L, segment, lead, d, f, seed, dtype=F64) -> Case:
    x, params = _stack(L, lead, d, f, seed, dtype)
    layers = [tuple(theta) for theta in _blocks(params)]
    options = {
        "x_at": 0,
        "grad_output": randn(*x.shape, seed=seed + 1, dtype=dtype),
        "seed": seed % 1000,
        "report": ("saved",),
    }
    return Case((x, layers, segment), options=options)


ex4 = Exercise(
    "ex4",
    "checkpoint_stack",
    "(x, layers, segment)",
    "Exercise 4 · checkpoint_stack",
    checkpoint_stack,
    ("saved", "y", "grad_x", "grad_params"),
    [
        CaseClass(
            "L is a multiple of segment (2 ≤ segment < L)",
            st.tuples(st.sampled_from([(4, 2), (6, 2), (6, 3)]), dims),
            lambda p, s: _ex4(*p[0], (p[1][0],), *p[1][1:], s),
            **F64_TOL,
        ),
        CaseClass(
            "the last segment is shorter (L % segment ≠ 0)",
            st.tuples(st.sampled_from([(5, 2), (5, 3), (7, 3)]), dims),
            lambda p, s: _ex4(*p[0], (p[1][0],), *p[1][1:], s),
            **F64_TOL,
        ),
        CaseClass(
            "segment = 1 (every block on its own)",
            st.tuples(st.integers(2, 4), dims),
            lambda p, s: _ex4(p[0], 1, (p[1][0],), *p[1][1:], s),
            **F64_TOL,
        ),
        CaseClass(
            "segment ≥ L (one segment)",
            st.tuples(st.sampled_from([(2, 2), (3, 3), (2, 4), (3, 5)]), dims),
            lambda p, s: _ex4(*p[0], (p[1][0],), *p[1][1:], s),
            **F64_TOL,
        ),
        CaseClass(
            "x is 3-D (B, T, d)",
            st.tuples(st.sampled_from([(4, 2), (5, 2)]), dims, st.integers(2, 3)),
            lambda p, s: _ex4(*p[0], (p[1][0], p[2]), *p[1][1:], s),
            **F64_TOL,
        ),
        CaseClass(
            "x is float32",
            st.tuples(st.sampled_from([(4, 2), (5, 2)]), dims),
            lambda p, s: _ex4(*p[0], (p[1][0],), *p[1][1:], s, dtype=F32),
            **F32_TOL,
        ),
    ],
    probe="checkpoint_run",
    points=2,
    by_hand=CHECKPOINT_BY_HAND,
)

# --------------------------------------------------------------------------- ex5


def scaled_step(params, loss_fn, scale, tracker, lr, growth_interval=2000):
    """One SGD step with dynamic loss scaling, as torch.amp.GradScaler does it."""
    grads = [g / scale for g in torch.autograd.grad(loss_fn(*params) * scale, params)]
    if not all(bool(torch.isfinite(g).all()) for g in grads):
        return scale / 2, 0, False
    with torch.no_grad():
        for p, g in zip(params, grads):
            p -= lr * g
    tracker += 1
    return (scale * 2, 0, True) if tracker >= growth_interval else (scale, tracker, True)


def _ex5(loss: str, scale: float, tracker: int, lr: float, seed: int, gi=None, stale=None) -> Case:
    W = randn(3, 4, seed=seed, dtype=F32)
    params = [W] if loss == "fp16_tiny_loss" else [W, 0.5 * randn(3, seed=seed + 1, dtype=F32)]
    args = (params, FUNCTIONS[loss], scale, tracker, lr) + (() if gi is None else (gi,))
    return Case(args, factors={"scale": scale, "lr": lr}, options={} if stale is None else {"stale": stale})


STEP_TOL = {"atol": 1e-6, "rtol": 1e-5}
lrs = st.sampled_from([0.01, 0.05, 0.1])
ex5 = Exercise(
    "ex5",
    "scaled_step",
    "(params, loss_fn, scale, tracker, lr, growth_interval=2000)",
    "Exercise 5 · scaled_step",
    scaled_step,
    ("scale", "tracker", "stepped", "params after"),
    [
        CaseClass(
            "a clean step below growth_interval",
            st.tuples(st.sampled_from([2.0**2, 2.0**4, 2.0**6]), st.integers(0, 2), lrs, st.integers(4, 6)),
            lambda p, s: _ex5("fp16_tanh_loss", p[0], p[1], p[2], s, gi=p[3]),
            **STEP_TOL,
        ),
        CaseClass(
            "the gradients overflow to inf and NaN (the step is skipped)",
            st.tuples(st.sampled_from([2.0**20, 2.0**22, 2.0**24]), st.integers(1, 5), lrs),
            lambda p, s: _ex5("fp16_linear_loss", p[0], p[1], p[2], s, gi=8),
            **STEP_TOL,
        ),
        CaseClass(
            "only some gradient entries overflow (skipped too)",
            st.tuples(st.sampled_from([2.0**4, 2.0**5, 2.0**6, 2.0**7]), st.integers(1, 3), lrs),
            lambda p, s: _ex5("fp16_uneven_loss", p[0], p[1], p[2], s, gi=8),
            **STEP_TOL,
        ),
        CaseClass(
            "only the second parameter's gradient overflows (skipped too)",
            st.tuples(st.sampled_from([2.0**5, 2.0**6, 2.0**7]), st.integers(1, 3), lrs),
            lambda p, s: _ex5("fp16_bias_overflow_loss", p[0], p[1], p[2], s, gi=8),
            **STEP_TOL,
        ),
        CaseClass(
            "the step reaches growth_interval (scale grows)",
            st.tuples(st.sampled_from([2.0**2, 2.0**4, 2.0**6]), st.integers(2, 6), lrs),
            lambda p, s: _ex5("fp16_tanh_loss", p[0], p[1] - 1, p[2], s, gi=p[1]),
            **STEP_TOL,
        ),
        CaseClass(
            "growth_interval is left at its default (2000)",
            st.tuples(st.sampled_from([2.0**2, 2.0**4, 2.0**6]), lrs),
            lambda p, s: _ex5("fp16_tanh_loss", p[0], 1999, p[1], s),
            **STEP_TOL,
        ),
        CaseClass(
            # a newcomer's .backward() then p.grad got ✓: each check began with .grad None
            "the parameters arrive with a leftover .grad (step 1 does not read .grad)",
            st.tuples(st.sampled_from([2.0**2, 2.0**4, 2.0**6]), lrs, st.sampled_from([0.5, -1.0, 3.0])),
            lambda p, s: _ex5("fp16_tanh_loss", p[0], 0, p[1], s, gi=8, stale=p[2]),
            **STEP_TOL,
        ),
        CaseClass(
            "the loss underflows in float16 unless scaled",
            st.tuples(st.sampled_from([2.0**14, 2.0**16, 2.0**18]), st.sampled_from([1e5, 1e6])),
            lambda p, s: _ex5("fp16_tiny_loss", p[0], 0, p[1], s, gi=10),
            **STEP_TOL,
        ),
    ],
    probe="scaler_step",
    in_place=True,
    points=3,
    # the step and the two parts it is made of: each is what the exercise asks for (red team s8 answered
    # with unscale_grads and update_scale, 3/3 with nothing read)
    by_hand=(
        "helpers.precision.loss_scale_step",
        "helpers.precision.unscale_grads",
        "helpers.precision.update_scale",
    ),
)

for _ex in (ex2, ex3):
    _ex.probe = "checkpoint_run"

CONTRACT = Contract("lab09_memory_checkpointing", [ex1, ex2, ex3, ex4, ex5], base_seed=90_000)
