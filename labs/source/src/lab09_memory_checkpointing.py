# %% [raw]
# # ASSIGNMENT CONFIG
# name: lab09_memory_checkpointing
# init_cell: false
# check_all_cell: false
# export_cell: false
# run_tests: true
# generate:
#   pdf: false
#   show_stdout: false

# %% [markdown]
# # Lab 9 · Memory, checkpointing and loss scaling by hand
#
# Chapter 9 counted what the forward pass keeps for backward, traded it for compute with
# gradient checkpointing, and scaled a float16 loss so its gradients survive. Here you do each of
# them yourself: predict the bytes, write checkpoint `Function`s (weights as inputs, a whole
# stack recomputed in segments from its input, dropout repeated exactly), checkpoint a stack
# in segments, and write the loss-scaling step that
# `torch.amp.GradScaler` automates. This lab goes with
# [Chapter 9](../chapters/09_memory_checkpointing.ipynb).
#
# **Learning goals.** After this lab you can
# * predict, operation by operation, the bytes a LayerNorm + MLP block keeps for backward;
# * write gradient checkpointing as a `torch.autograd.Function` that keeps only a stack's
#   input, recomputes it segment by segment in backward, and gives the weights their gradients;
# * make the recomputation draw the same dropout mask, without disturbing the random stream
#   the rest of training uses;
# * checkpoint a stack in segments and say what stays in memory;
# * do loss scaling by hand: scale, unscale, skip the step on `inf`, update the scale.
#
# **How a lab works.** Each exercise states its goal and its points (12 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It answers in one line: `✓` matches (the `max|Δ|` is round-off), `✗`
# what is wrong and where, or `·` not implemented yet. Your instructor grades the notebook
# you hand in with hidden tests that call the same functions on other inputs.

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
from torch.autograd.function import once_differentiable

from helpers.checkpoint import get_rng_state, set_rng_state
from helpers.device import get_device, no_tf32, randn
from helpers.labcheck import Mistake, check, checker
from helpers.labkit import applied
from helpers.memory import SavedTensors, fmt_bytes
from helpers.precision import ScalerState, loss_scale_step

dev = get_device()
no_tf32()
cpu = torch.device("cpu")
# recomputation repeats the same operations: float64 lets us ask for 1e-12
F64 = torch.float64


@checker  # the self-checks' own code: an error in it is not placed in yours
def grads_of(y, inputs, names, grad_y):
    """torch.autograd.grad(y, inputs, grad_y); a Mistake (the ✗ line's cause, as it
    stands) when backward returned too few gradients or an input got none."""
    try:
        grads = torch.autograd.grad(y, inputs, grad_y, allow_unused=True)
    except RuntimeError as e:
        if "incorrect number of gradients" not in str(e):
            raise
        raise Mistake(
            "backward must return one gradient per input of forward "
            "(None for non-tensors): " + str(e).split("returned ")[-1]
        ) from None
    missing = [n for n, g in zip(names, grads) if g is None]
    if missing:
        raise Mistake(
            f"no gradient reached {', '.join(missing)}: "
            "is it an input of the Function, and does backward return its gradient?"
        )
    return grads


def mlp_block(x, ln_w, ln_b, W1, b1, W2, b2, activation="relu"):
    """y = x + act(LN(x) W1ᵀ + b1) W2ᵀ + b2, x (B, d), W1 (d_ff, d), W2 (d, d_ff)."""
    h = F.layer_norm(x, x.shape[-1:], ln_w, ln_b)  # (B, d)
    z = h @ W1.T + b1  # (B, d) @ (d, d_ff) -> (B, d_ff)
    a = F.relu(z) if activation == "relu" else F.gelu(z)  # (B, d_ff)
    return x + a @ W2.T + b2  # (B, d_ff) @ (d_ff, d) -> (B, d)


def ffn(x, W1, b1, W2, b2):
    """y = x + GELU(x W1ᵀ + b1) W2ᵀ + b2: a residual MLP block, weights passed in."""
    return x + F.gelu(x @ W1.T + b1) @ W2.T + b2  # (B, d) @ (d, f) @ (f, d) -> (B, d)


def ffn_dropout(x, W1, b1, W2, b2):
    """y = x + dropout₀.₃(GELU(x W1ᵀ + b1)) W2ᵀ + b2: every call draws a fresh mask."""
    # (B, d) @ (d, f) -> (B, f)
    a = F.dropout(F.gelu(x @ W1.T + b1), p=0.3, training=True)
    return x + a @ W2.T + b2  # (B, f) @ (f, d) -> (B, d)


def ffn_params(d, d_ff, seed, dtype=F64, device=dev):
    """[W1 (d_ff, d), b1 (d_ff,), W2 (d, d_ff), b2 (d,)], leaves that require grad."""
    return [
        randn(d_ff, d, seed=seed, dtype=dtype, device=device, requires_grad=True),
        randn(d_ff, seed=seed + 1, dtype=dtype, device=device, requires_grad=True),
        randn(d, d_ff, seed=seed + 2, dtype=dtype, device=device, requires_grad=True),
        randn(d, seed=seed + 3, dtype=dtype, device=device, requires_grad=True),
    ]


# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2

# %% [markdown]
# ## Exercise 1 · Predict the bytes a block keeps for backward (2 points)
#
# **Goal:** read a block as a list of operations and say, without running it, what each one
# keeps for backward and how many bytes that is.
#
# The block is `mlp_block` above: $y = x + \mathrm{act}(\mathrm{LN}(x) W_1^\top + b_1) W_2^\top +
# b_2$ with `x` of shape (B, d), hidden width `d_ff`, `act` ReLU or GELU. What PyTorch's CPU
# kernels keep (chapter 9, section 1):
# * `layer_norm` keeps its input, and the row mean $\mu$ and $1/\sigma$, one number per row each;
# * a matmul `h @ W.T` keeps its input `h` (and the weight, which exists anyway);
# * ReLU keeps its **output**; GELU keeps its **input**;
# * additions (`+ b`, the residual `x + ...`) keep nothing;
# * a tensor kept by two operations costs its bytes once.
#
# Write `predict_saved_bytes(B, d, d_ff, activation, bytes_per_element)`: the bytes kept, as
# an `int`, parameters (`ln_w`, `ln_b`, `W1`, `b1`, `W2`, `b2`) **not** counted. The input `x`
# itself **does** count here (unlike lab 3's exercise 4, which excluded inputs): the block keeps it.
# Walk the block operation by operation and ask, for each tensor kept, whether another
# operation already keeps the very same tensor.
#
# <details><summary>Hint: the one shared tensor</summary>
#
# With ReLU one tensor is kept by two operations (ReLU's output is also W2's matmul input);
# with GELU it is not (GELU keeps its input, the matmul keeps GELU's output).
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def predict_saved_bytes(B, d, d_ff, activation, bytes_per_element):
    """Bytes the block keeps for backward (an int), its parameters not counted."""
    # BEGIN SOLUTION
    ln = d + 2  # LN: x, μ, 1/σ
    mm1 = d  # W1's matmul: LN's output
    # ReLU's output is W2's input (one tensor); GELU keeps z, W2 keeps GELU(z) (two)
    act = d_ff if activation == "relu" else 2 * d_ff
    return B * (ln + mm1 + act) * bytes_per_element
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
import torch.nn.functional as _F

from helpers.device import randn
from helpers.memory import SavedTensors


def _measure(B, d, f, act, dt):
    _x = randn(B, d, seed=1, dtype=dt, requires_grad=True)
    _ps = [
        randn(*s, seed=2 + i, dtype=dt, requires_grad=True)
        for i, s in enumerate([(d,), (d,), (f, d), (f,), (d, f), (d,)])
    ]
    with SavedTensors(exclude=_ps) as _s:
        _h = _F.layer_norm(_x, (d,), _ps[0], _ps[1]) @ _ps[2].T + _ps[3]
        _a = _F.relu(_h) if act == "relu" else _F.gelu(_h)
        _ = _x + _a @ _ps[4].T + _ps[5]
    return _s.total_bytes


for _B, _d, _f in [(2, 3, 11), (7, 16, 4), (1, 9, 9)]:
    assert int(predict_saved_bytes(_B, _d, _f, "relu", 4)) == _measure(
        _B, _d, _f, "relu", torch.float32
    )

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as _F

from helpers.device import randn
from helpers.memory import SavedTensors


def _measure(B, d, f, act, dt):
    _x = randn(B, d, seed=1, dtype=dt, requires_grad=True)
    _ps = [
        randn(*s, seed=2 + i, dtype=dt, requires_grad=True)
        for i, s in enumerate([(d,), (d,), (f, d), (f,), (d, f), (d,)])
    ]
    with SavedTensors(exclude=_ps) as _s:
        _h = _F.layer_norm(_x, (d,), _ps[0], _ps[1]) @ _ps[2].T + _ps[3]
        _a = _F.relu(_h) if act == "relu" else _F.gelu(_h)
        _ = _x + _a @ _ps[4].T + _ps[5]
    return _s.total_bytes


for _B, _d, _f in [(2, 3, 11), (5, 8, 32)]:
    assert int(predict_saved_bytes(_B, _d, _f, "gelu", 8)) == _measure(
        _B, _d, _f, "gelu", torch.float64
    )
    assert int(predict_saved_bytes(_B, _d, _f, "gelu", 4)) == _measure(
        _B, _d, _f, "gelu", torch.float32
    )

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: the bytes `SavedTensors` measures while `mlp_block` runs, on the
# CPU, parameters excluded):


# %%
def measured_saved_bytes(B, d, d_ff, activation, dtype):
    """Bytes SavedTensors records for one mlp_block forward, parameters excluded."""
    x = randn(B, d, seed=1, dtype=dtype, requires_grad=True)
    params = [
        randn(*shape, seed=2 + i, dtype=dtype, requires_grad=True)
        for i, shape in enumerate([(d,), (d,), (d_ff, d), (d_ff,), (d, d_ff), (d,)])
    ]
    with SavedTensors(exclude=params) as saved:
        mlp_block(x, *params, activation=activation)
    return saved.total_bytes


cases = {
    "ReLU/float32": (4, 6, 10, "relu", torch.float32),
    "GELU/float64": (3, 5, 12, "gelu", torch.float64),
}


def pieces(B, d, d_ff, activation, dtype):
    """Bytes of tensors a prediction may leave out or count twice, by what they are."""
    n = torch.finfo(dtype).bits // 8  # bytes per element
    act = "ReLU's output" if activation == "relu" else "GELU's input or output"
    return {
        "one (B, d) tensor: x, or LayerNorm's output": B * d * n,
        "LayerNorm's μ and 1/σ": 2 * B * n,
        f"one (B, d_ff) tensor: {act}": B * d_ff * n,
    }


check(
    lambda: {
        k: predict_saved_bytes(*c[:4], torch.finfo(c[4]).bits // 8)
        for k, c in cases.items()
    },
    {k: measured_saved_bytes(*c) for k, c in cases.items()},
    name="Exercise 1 · predict_saved_bytes",
    against="SavedTensors",
    factors={"bytes per element": 4},
    terms={k: pieces(*c) for k, c in cases.items()},
)

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 3
# by_hand: [torch.utils.checkpoint.checkpoint, helpers.checkpoint.checkpoint, helpers.checkpoint.recompute_backward, helpers.checkpoint.checkpoint_sequential]

# %% [markdown]
# ## Exercise 2 · Keep only the stack's input, recompute it in segments (3 points)
#
# **Goal:** chapter 9's `FirstCheckpoint` keeps one block's input and re-runs that block in
# backward. Push the trade further: a whole stack of $L$ blocks keeps **only its input** $x_0$
# between forward and backward, and backward re-runs the stack in segments so that no more
# than `every` blocks hold their activations at any moment.
#
# The stack is $x_l = \mathrm{fn}(x_{l-1}, \theta_l)$ with `fn` a block such as `ffn` above and
# $\theta_l = (W_1, b_1, W_2, b_2)$ its 4 parameters; they are passed flattened, 4 per block,
# in order. Fill in `StackCheckpoint`:
# * `forward(fn, every, x, *params)`: the stack's output, computed under `torch.no_grad()`;
# * `setup_context(ctx, inputs, output)`: keep `fn` and `every` on `ctx`, save `x` and the
#   parameters (they exist anyway) with `ctx.save_for_backward`, and nothing else;
# * `backward(ctx, grad_y)`: first run the stack again **without** a graph to get back the
#   input of every segment of `every` consecutive blocks (blocks $0, k, 2k, \dots$ with
#   $k$ = `every`; the last segment may be shorter); then, from the last segment to the first,
#   re-run that segment **with** a graph from its input and differentiate it, so that the
#   gradient with respect to the segment's input becomes the upstream gradient of the segment
#   before. Return one gradient per input of `forward`: `None` for `fn` and `every`, and for
#   every input that needs none (gate on `ctx.needs_input_grad[2:]` as chapter 9 does).
#
# Work out on paper first what each segment's re-run must differentiate, and with respect to
# what: which of its leaves need a gradient, and where each result goes.
#
# <details><summary>Hint 1: the order of the work</summary>
#
# Keep a list `grads` with one slot per parameter (`None` to start) and a tensor `g`, the
# gradient arriving at the current segment's output (`grad_y` for the last one). For each
# segment, backwards: leaves for its input (requiring a gradient unless it is the first
# segment and `x` needs none) and for its parameters (as their flags say); one
# `torch.autograd.grad(y_segment, wanted_leaves, g)`; the input's gradient becomes `g`, the
# parameters' go into their slots.
#
# </details>
#
# <details><summary>Hint 2: why only `every` blocks at once</summary>
#
# The graph of a segment lives from its re-run until `torch.autograd.grad` returns; then it is
# freed. Re-running the next (earlier) segment only after that keeps one segment's activations
# alive at a time, plus the $\lceil L/k\rceil$ segment inputs of the no-grad pass.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
class StackCheckpoint(torch.autograd.Function):
    """x_L of the stack x_l = fn(x_{l-1}, θ_l), keeping only x_0; backward recomputes it
    in segments."""

    @staticmethod
    def forward(fn, every, x, *params):
        # BEGIN SOLUTION
        with torch.no_grad():
            for i in range(0, len(params), 4):
                x = fn(x, *params[i : i + 4])
            return x
        # END SOLUTION

    @staticmethod
    def setup_context(ctx, inputs, output):
        # BEGIN SOLUTION
        fn, every, x, *params = inputs
        ctx.fn, ctx.every = fn, every
        ctx.save_for_backward(x, *params)
        # END SOLUTION

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        # BEGIN SOLUTION
        x, *params = ctx.saved_tensors
        need_x, *need_p = ctx.needs_input_grad[2:]
        step = 4 * ctx.every  # parameters per segment
        starts = list(range(0, len(params), step))
        inputs = [x]  # the input of every segment, from a pass without a graph
        with torch.no_grad():
            h = x
            for start in starts[:-1]:
                for i in range(start, start + step, 4):
                    h = ctx.fn(h, *params[i : i + 4])
                inputs.append(h)
        grads, g = [None] * len(params), grad_y
        for start, h0 in reversed(list(zip(starts, inputs))):
            idx = range(start, min(start + step, len(params)))
            want_h = start > 0 or need_x
            h = h0.detach().requires_grad_(want_h)
            leaves = [params[i].detach().requires_grad_(need_p[i]) for i in idx]
            with torch.enable_grad():
                y = h
                for j in range(0, len(leaves), 4):
                    y = ctx.fn(y, *leaves[j : j + 4])
            wanted = [h] * want_h + [t for t in leaves if t.requires_grad]
            got = iter(torch.autograd.grad(y, wanted, g)) if wanted else iter(())
            g = next(got) if want_h else None
            for i in idx:
                if need_p[i]:
                    grads[i] = next(got)
        return (None, None, g if need_x else None, *grads)
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


def _blk(x, W, c, V, e):
    return x + torch.tanh(x @ W.T + c) @ V.T + e


def _mk(s):
    return [
        randn(*sh, seed=s + i, dtype=torch.float64, requires_grad=True)
        for i, sh in enumerate([(4, 3), (4,), (3, 4), (3,)])
    ]


# 5 blocks in segments of 2 (2 + 2 + 1): every gradient, through .backward()
_x = randn(5, 3, seed=501, dtype=torch.float64, requires_grad=True)
_ps = [p for l in range(5) for p in _mk(502 + 10 * l)]
_h = _x
for _i in range(0, 20, 4):
    _h = _blk(_h, *_ps[_i : _i + 4])
_ref = torch.autograd.grad((_h**3).sum(), [_x, *_ps])
(StackCheckpoint.apply(_blk, 2, _x, *_ps) ** 3).sum().backward()
for _t, _r in zip([_x, *_ps], _ref):
    assert _t.grad is not None and torch.allclose(_t.grad, _r, atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as _F

from helpers.device import randn
from helpers.memory import SavedTensors


def _blk(x, W1, b1, W2, b2):
    return x + _F.gelu(x @ W1.T + b1) @ W2.T + b2


_x = randn(2, 6, 3, seed=511, dtype=torch.float64, requires_grad=True)
_ps = [
    randn(*sh, seed=512 + 4 * l + i, dtype=torch.float64, requires_grad=True)
    for l in range(3)
    for i, sh in enumerate([(8, 3), (8,), (3, 8), (3,)])
]
for _every in (1, 2, 3):
    with SavedTensors(exclude=_ps) as _s:
        _y = StackCheckpoint.apply(_blk, _every, _x, *_ps)
    assert _s.count == 1 and _s.total_bytes == _x.numel() * 8  # x only
_h = _x
for _i in range(0, 12, 4):
    _h = _blk(_h, *_ps[_i : _i + 4])
assert torch.allclose(_y, _h, atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# at most `every` blocks hold a graph at once: each grad-enabled block run adds one, the
# backward through its output removes it
_log = []


def _blk(x, W, c, V, e):
    y = x + torch.sin(x @ W.T + c) @ V.T + e
    if torch.is_grad_enabled() and y.requires_grad:
        _log.append(1)
        y.register_hook(lambda g: _log.append(-1))
    return y


_x = randn(3, 2, seed=531, dtype=torch.float64, requires_grad=True)
_ps = [
    randn(*sh, seed=532 + 4 * l + i, dtype=torch.float64, requires_grad=True)
    for l in range(7)
    for i, sh in enumerate([(3, 2), (3,), (2, 3), (2,)])
]
for _every in (3, 7):
    _log.clear()
    _ = torch.autograd.grad(StackCheckpoint.apply(_blk, _every, _x, *_ps).sum(), _ps)
    _live = [sum(_log[: _k + 1]) for _k in range(len(_log))]
    assert _log.count(1) == 7 and max(_live) == _every and _live[-1] == 0

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# needs_input_grad gating: a data x stays without requires_grad in every re-run, a
# frozen
# weight gets None, and grad_output is not modified
_seen = []


def _blk(x, W, c, V, e):
    _seen.append(x.requires_grad)
    return torch.cos(x @ W.T + c) @ V.T + e


_x = randn(3, 4, seed=541, dtype=torch.float64)
_ps = [
    randn(*sh, seed=542 + i, dtype=torch.float64, requires_grad=True)
    for i, sh in enumerate([(2, 4), (2,), (4, 2), (4,)])
]
_ = _ps[1].requires_grad_(False)
_g = randn(3, 4, seed=546, dtype=torch.float64)
_g0 = _g.clone()
_gs = torch.autograd.grad(
    StackCheckpoint.apply(_blk, 1, _x, *_ps), [_ps[0], _ps[2], _ps[3]], _g
)
assert _seen == [False, False] and torch.equal(_g, _g0)
_pl = [p.detach().clone().requires_grad_() for p in _ps]
_ref = torch.autograd.grad(_blk(_x, *_pl), [_pl[0], _pl[2], _pl[3]], _g0)
assert all(torch.allclose(_a, _b, atol=1e-12) for _a, _b in zip(_gs, _ref))
# a data x in a 3-block stack, segments of 1: the later segments' inputs still need a
# gradient
_ps3 = [p.detach().clone().requires_grad_() for _ in range(3) for p in _ps]
_gs3 = torch.autograd.grad(StackCheckpoint.apply(_blk, 1, _x, *_ps3), _ps3, _g0)
_pl3 = [p.detach().clone().requires_grad_() for p in _ps3]
_h = _x
for _i in range(0, 12, 4):
    _h = _blk(_h, *_pl3[_i : _i + 4])
_ref3 = torch.autograd.grad(_h, _pl3, _g0)
assert all(torch.allclose(_a, _b, atol=1e-12) for _a, _b in zip(_gs3, _ref3))

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: autograd through the same 5-block `ffn` stack without
# checkpointing, `every=2`; "bytes kept" is what `SavedTensors` records during your forward,
# parameters excluded, against the bytes of `x`; "blocks holding a graph at once" is the
# largest number of block re-runs whose graph backward has not gone through yet, which must be
# `every`; the segments' re-runs are watched too: their order, what each starts from and the
# gradient that reaches each segment's output. Last, the same stack on a data `x`, which no
# re-run may make require a gradient, while the later segments' inputs still need one):


# %%
@checker  # the check's own code: its frames are not yours
class StackWatch:
    """The blocks of a stack, watched: each run with a graph (which block, from what
    input) and the gradient that reaches each block's output, in the order they
    happen."""

    def __init__(self, flat):
        self.W1s = flat[::4]
        self.events, self.live, self.peak = [], 0, 0

    def block(self, h, *theta):
        # which block these weights are (a copy of them too)
        i = next((k for k, W1 in enumerate(self.W1s) if torch.equal(theta[0], W1)), -1)
        y = ffn(h, *theta)
        if torch.is_grad_enabled() and y.requires_grad:
            self.events.append(("run", i, h.detach(), h.requires_grad))
            self.live += 1  # blocks holding a graph now
            self.peak = max(self.peak, self.live)
            y.register_hook(lambda g, i=i: self.reached(i, g))
        return y

    def reached(self, i, g):
        self.live -= 1
        self.events.append(("grad", i, g.detach(), None))

    def reset(self):
        self.events, self.live, self.peak = [], 0, 0

    def segments(self):
        """The runs with a graph, grouped into segments: a backward between two runs
        ends one."""
        groups, new = [], True
        for kind, i, h, needs in self.events:
            if kind == "grad":
                new = True
            elif new:
                groups, new = [*groups, [(i, h, needs)]], False
            else:
                groups[-1].append((i, h, needs))
        return groups

    def gradient_into(self, i, like):
        """The last gradient that reached block i's output (zeros if none did)."""
        got = [g for kind, j, g, _ in self.events if kind == "grad" and j == i]
        return got[-1] if got else torch.zeros_like(like)


@checker
def stack_run2(run, every, ends=(1, 3, 4)):
    """(y, the order the segments are re-run in, what each re-run starts from, the
    gradient into each segment's last block, grad_x, all parameter gradients in one
    vector, bytes kept, peak blocks with a graph)."""

    def go(x, *flat):
        watch = StackWatch(flat)
        with SavedTensors(exclude=flat) as saved:
            y = run(watch.block, every, x, *flat)
        names = ["x"] + [
            f"{n} of block {i // 4}"
            for i, n in enumerate(["W1", "b1", "W2", "b2"] * (len(flat) // 4))
        ]
        watch.reset()
        grads = grads_of(y, [x, *flat], names, grad_y2)
        firsts = [seg[0] for seg in watch.segments()]  # (block, input, needs grad)
        order = [i for i, _, _ in firsts]
        if order == sorted(order, reverse=True):
            order = "last to first"
        else:
            order = "first to last" if order == sorted(order) else "in another order"
        if all(
            i >= 0 and torch.allclose(h, block_inputs2[i], atol=1e-12, rtol=0)
            for i, h, _ in firsts
        ):
            start = "the segment's own input"
        elif all(torch.equal(h, x.detach()) for _, h, _ in firsts):
            start = "x, the stack's input"
        else:
            start = "other values"
        into = torch.stack([watch.gradient_into(i, grad_y2) for i in ends])
        flat_grads = torch.cat([g.flatten() for g in grads[1:]])
        return (
            y,
            order,
            start,
            into,
            grads[0],
            flat_grads,
            saved.total_bytes,
            watch.peak,
        )

    return go


@checker
def stack_run2_data_x(run, every):
    """On a data x: (later segments re-run from an input without requires_grad,
    re-runs of block 0 whose input required grad, all parameter gradients)."""

    def go(x, *flat):
        watch = StackWatch(flat)
        y = run(watch.block, every, x.detach(), *flat)
        names = [
            f"{n} of block {i // 4}" for i, n in enumerate(["W1", "b1", "W2", "b2"] * 5)
        ]
        try:
            grads, error = grads_of(y, list(flat), names, grad_y2), None
        except RuntimeError as e:
            grads, error = None, e
        firsts = [seg[0] for seg in watch.segments()]
        cut_off = sum(i > 0 and not needs for i, _, needs in firsts)
        if error is not None and not cut_off:  # an error the counts do not explain
            raise error
        data_x = sum(needs for i, _, needs in firsts if i == 0)
        return (
            cut_off,
            data_x,
            None if grads is None else torch.cat([g.flatten() for g in grads]),
        )

    return go


def plain_stack_run(block, every, x, *flat):
    """The stack with a full graph: what a correct StackCheckpoint must agree with."""
    for i in range(0, len(flat), 4):
        x = block(x, *flat[i : i + 4])
    return x


x2 = randn(6, 5, seed=1, dtype=F64, device=dev, requires_grad=True)
params2 = [p for l in range(5) for p in ffn_params(5, 9, seed=2 + 4 * l)]
grad_y2 = randn(6, 5, seed=6, dtype=F64, device=dev)
with torch.no_grad():  # the input of every block
    block_inputs2 = [x2.detach()]
    for i in range(0, 16, 4):
        block_inputs2.append(ffn(block_inputs2[-1], *params2[i : i + 4]))
y_ref2, _, _, into_ref2, gx_ref2, gp_ref2, _, _ = stack_run2(plain_stack_run, 2)(
    x2, *params2
)
check(
    stack_run2(applied(StackCheckpoint.apply), 2),
    (y_ref2, "last to first", "the segment's own input", into_ref2, gx_ref2, gp_ref2)
    + (x2.numel() * x2.element_size(), 2),
    args=(x2, *params2),
    outputs=(
        "y",
        "segments re-run",
        "input of each re-run",
        "gradient into each segment",
        "grad_x",
        "grad_params",
        "bytes kept",
        "blocks holding a graph at once",
    ),
    counts=("blocks holding a graph at once",),
    mistakes={
        "gradient into each segment": {
            "grad_y at every segment (the gradients not chained)": grad_y2.expand(
                3, -1, -1
            )
        }
    },
    name="Exercise 2 · StackCheckpoint",
    against="autograd",
    atol=1e-12,
    rtol=0,
)
x_data = x2.detach()
check(
    stack_run2_data_x(applied(StackCheckpoint.apply), 2),
    (0, 0, stack_run2_data_x(plain_stack_run, 2)(x_data, *params2)[2]),
    args=(x_data, *params2),
    outputs=(
        "later segments re-run from an input without requires_grad",
        "re-runs where a data x required grad",
        "grad_params",
    ),
    counts=(
        "later segments re-run from an input without requires_grad",
        "re-runs where a data x required grad",
    ),
    name="Exercise 2 · StackCheckpoint on a data x",
    against="autograd",
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# The tolerance is `atol 1e-12, rtol 0` in float64: backward repeats the very same operations
# in the same order, so the gradients are equal up to (at most) round-off far below 1e-12.
# The price: every block but those of the last segment runs three times (forward, the pass
# without a graph, the segment's re-run), for a memory of one input between forward and
# backward.

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 2
# by_hand: [torch.utils.checkpoint.checkpoint, helpers.checkpoint.checkpoint, helpers.checkpoint.recompute_backward, helpers.checkpoint.checkpoint_sequential]

# %% [markdown]
# ## Exercise 3 · Dropout must draw the same mask twice (2 points)
#
# **Goal:** a recomputation is only correct if it recomputes *the same* function; with
# dropout that means the same random mask, so the RNG state must be taken before the forward
# and put back for the re-run.
#
# A checkpoint that simply re-runs `ffn_dropout` in backward gives wrong gradients: the
# re-run draws a new mask. Write a checkpoint of **one** block that repeats the mask:
# * `CheckpointRNG`: `forward(fn, rng_state, x, *params)` returns `fn(x, *params)` without a
#   graph; `setup_context` keeps `fn` and `rng_state` on `ctx` and saves `x` and the
#   parameters; `backward` re-runs `fn` with a graph on fresh leaves, with the random
#   generators put back to `rng_state` (`set_rng_state` from `helpers.checkpoint`), and
#   differentiates it. Gate on `ctx.needs_input_grad[2:]` as in exercise 2 and return one
#   gradient per input (`None` for `fn`, `rng_state` and every input that needs none);
# * `checkpoint_rng(fn, x, *params)`: take `rng_state = get_rng_state([x, *params])` (from
#   `helpers.checkpoint`: the CPU generator's state, and the CUDA one's if a tensor is on a
#   GPU), then return `CheckpointRNG.apply(fn, rng_state, x, *params)`.
#
# Two things to work out: **when** the state must be taken (why not in `setup_context`?), and
# how to rewind the generator for the re-run without changing the random numbers the rest of
# training draws after backward (the self-check draws one after backward and compares).
#
# <details><summary>Hint: when, and how to rewind without a trace</summary>
#
# `setup_context` runs *after* `forward`, when the mask is already drawn: take the state in
# `checkpoint_rng`, before `apply`. In `backward`, re-run inside
# `torch.random.fork_rng(devices=[i for i, _ in ctx.rng_state.cuda])`, calling
# `set_rng_state(ctx.rng_state)` first: `fork_rng` undoes the rewind when the block ends.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
class CheckpointRNG(torch.autograd.Function):
    """y = fn(x, *params) keeping x; backward recomputes fn with the RNG put back to
    rng_state."""

    @staticmethod
    def forward(fn, rng_state, x, *params):
        # BEGIN SOLUTION
        with torch.no_grad():
            return fn(x, *params)
        # END SOLUTION

    @staticmethod
    def setup_context(ctx, inputs, output):
        # BEGIN SOLUTION
        fn, rng_state, x, *params = inputs
        ctx.fn, ctx.rng_state = fn, rng_state
        ctx.save_for_backward(x, *params)
        # END SOLUTION

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        # BEGIN SOLUTION
        x, *params = ctx.saved_tensors
        needs = ctx.needs_input_grad[2:]  # x, then each parameter
        leaves = [t.detach().requires_grad_(n) for t, n in zip((x, *params), needs)]
        # fork_rng: the rewind below must not leak into the random stream after backward
        with torch.random.fork_rng(devices=[i for i, _ in ctx.rng_state.cuda]):
            set_rng_state(ctx.rng_state)
            with torch.enable_grad():
                y = ctx.fn(*leaves)  # same mask as the forward's
        got = iter(
            torch.autograd.grad(y, [t for t, n in zip(leaves, needs) if n], grad_y)
        )
        return (None, None, *(next(got) if n else None for n in needs))
        # END SOLUTION


def checkpoint_rng(fn, x, *params):
    """fn(x, *params) checkpointed, the RNG state taken before the forward so dropout
    repeats its mask."""
    # BEGIN SOLUTION
    rng_state = get_rng_state([x, *params])
    return CheckpointRNG.apply(fn, rng_state, x, *params)
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
import torch.nn.functional as _F

from helpers.device import randn


def _blk(x, W1, W2):
    return x + _F.dropout(torch.tanh(x @ W1.T), p=0.5, training=True) @ W2.T


_x = randn(7, 4, seed=601, dtype=torch.float64, requires_grad=True)
_ps = [
    randn(6, 4, seed=602, dtype=torch.float64, requires_grad=True),
    randn(4, 6, seed=603, dtype=torch.float64, requires_grad=True),
]
_ = torch.manual_seed(11)
_ref = torch.autograd.grad((_blk(_x, *_ps) ** 2).sum(), [_x, *_ps])
_ = torch.manual_seed(11)
_y = checkpoint_rng(_blk, _x, *_ps)
_ours = torch.autograd.grad((_y**2).sum(), [_x, *_ps])
assert all(torch.allclose(_a, _b, atol=1e-12) for _a, _b in zip(_ours, _ref))

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as _F

from helpers.device import randn


def _blk(x, W):
    return _F.dropout(x @ W.T, p=0.5, training=True)


_x = randn(3, 4, seed=611, dtype=torch.float64, requires_grad=True)
_W = randn(5, 4, seed=612, dtype=torch.float64, requires_grad=True)
_ = torch.manual_seed(12)
_y = _blk(_x, _W)
_ = torch.rand(2)  # training draws something between forward and backward
_ = torch.autograd.grad(_y.sum(), [_x, _W])
_after_ref = torch.rand(5)
_ = torch.manual_seed(12)
_y = checkpoint_rng(_blk, _x, _W)
_ = torch.rand(2)
_ = torch.autograd.grad(_y.sum(), [_x, _W])
assert torch.equal(torch.rand(5), _after_ref)  # backward left the random stream alone

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch
import torch.nn.functional as _F

from helpers.device import randn

# needs_input_grad gating: a data input x stays without requires_grad in the re-run
_seen = []


def _blk(x, W):
    _seen.append(x.requires_grad)
    return _F.dropout(x @ W.T, p=0.5, training=True)


_x = randn(3, 4, seed=621, dtype=torch.float64)
_W = randn(5, 4, seed=622, dtype=torch.float64, requires_grad=True)
_ = torch.autograd.grad(checkpoint_rng(_blk, _x, _W).sum(), [_W])
assert _seen == [False, False]

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (reference: autograd through `ffn_dropout` without checkpointing, the RNG
# seeded the same way; "the re-run" says whether backward re-runs the block with a graph and
# from which state of the random generator; "random stream after backward" is one draw made
# after backward, when something else was drawn between forward and backward):


# %%
@checker
def same_state(a, b):
    """Two RNGStates (helpers.checkpoint) hold the same generator states."""
    same_cuda = all(torch.equal(s, u) for (_, s), (_, u) in zip(a.cuda, b.cuda))
    return torch.equal(a.cpu, b.cpu) and same_cuda


@checker
def dropout_run(run, seed=5):
    """(how fn is re-run in backward, y, grads..., next draw) for y = run(fn, x,
    *params) with fn = ffn_dropout, seeded; a draw in between."""

    def go(x, *params):
        calls = []  # (grad enabled, RNG state at the start, RNG state at the end)

        def fn(*args):
            start = get_rng_state([x])
            y = ffn_dropout(*args)
            calls.append((torch.is_grad_enabled(), start, get_rng_state([x])))
            return y

        torch.manual_seed(seed)
        before = get_rng_state([x])
        y = run(fn, x, *params)
        n_forward = len(calls)
        torch.rand(3, device=x.device)  # e.g. the next batch's dropout
        at_backward = get_rng_state([x])
        names = ["x", "W1", "b1", "W2", "b2"]
        try:
            grads, error = grads_of(y, [x, *params], names, grad_y3), None
        except RuntimeError as e:
            grads, error = [None] * 5, e
        rerun = "none: fn not called in backward"
        if (
            len(calls) > n_forward
        ):  # the first call in backward: its state and grad mode
            grad_on, state, _ = calls[n_forward]
            known = {
                "the state before the forward": before,
                "the state after the forward's draw": calls[0][2],
                "the state at backward (not put back)": at_backward,
            }
            where = next(
                (w for w, s in known.items() if same_state(state, s)),
                "another state (reseeded?)",
            )
            rerun = f"{'with' if grad_on else 'without'} a graph, from {where}"
        if (
            error is not None and rerun == rerun_ok
        ):  # an error the re-run does not explain
            raise error
        return (rerun, y, *grads, torch.rand(4, device=x.device))

    return go


rerun_ok = "with a graph, from the state before the forward"
x3 = randn(8, 5, seed=7, dtype=F64, device=dev, requires_grad=True)
params3 = ffn_params(5, 9, seed=8)
grad_y3 = randn(8, 5, seed=12, dtype=F64, device=dev)
_, *expected = dropout_run(lambda fn, x, *p: fn(x, *p))(x3, *params3)
torch.manual_seed(5)
with torch.no_grad():  # what is drawn after the forward
    ffn_dropout(x3, *params3)
    after_forward = torch.rand(4, device=dev)
check(
    dropout_run(applied(checkpoint_rng)),
    (rerun_ok, *expected),
    args=(x3, *params3),
    outputs=(
        "the re-run",
        "y",
        "grad_x",
        "grad_W1",
        "grad_b1",
        "grad_W2",
        "grad_b2",
        "random stream after backward",
    ),
    mistakes={
        "random stream after backward": {
            "the draws after the forward again (the rewind leaked out of backward)": (
                after_forward
            )
        }
    },
    name="Exercise 3 · checkpoint_rng",
    against="autograd",
    atol=1e-12,
    rtol=0,
)

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 2
# by_hand: [torch.utils.checkpoint.checkpoint, helpers.checkpoint.checkpoint, helpers.checkpoint.recompute_backward, helpers.checkpoint.checkpoint_sequential]

# %% [markdown]
# ## Exercise 4 · Checkpoint a stack in segments (2 points)
#
# **Goal:** what checkpointing leaves in memory is one tensor per checkpointed segment; the
# segment length trades that against the activations of one segment during backward.
#
# `layers` is a list of parameter tuples `(W1, b1, W2, b2)`, one per `ffn_dropout` block; the
# stack computes $x_l = \mathrm{ffn\_dropout}(x_{l-1}, \theta_l)$. Write
# `checkpoint_stack(x, layers, segment)`: cut the list into consecutive segments of `segment`
# blocks (the last one may be shorter: 5 blocks, `segment=2` → 2 + 2 + 1), and run each segment
# through your `checkpoint_rng` **as one function**. That function must take the segment's
# parameters as explicit arguments: pass them flattened (`*W1, b1, W2, b2` of every block in
# the segment, 4 per block) and regroup them by 4 inside. Return the stack's output.
#
# With $L$ blocks, what is kept for backward is then $\lceil L/\text{segment} \rceil$ segment
# inputs, each of the shape of `x`.

# %% [raw]
# # BEGIN SOLUTION


# %%
def checkpoint_stack(x, layers, segment):
    """x_L of the ffn_dropout stack, each run of `segment` consecutive blocks
    checkpointed as one function."""

    # BEGIN SOLUTION
    def run_segment(h, *flat):
        for i in range(0, len(flat), 4):  # regroup (W1, b1, W2, b2) per block
            h = ffn_dropout(h, *flat[i : i + 4])
        return h

    for start in range(0, len(layers), segment):
        flat = [p for block in layers[start : start + segment] for p in block]
        x = checkpoint_rng(run_segment, x, *flat)
    return x
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
import torch.nn.functional as _F

from helpers.device import randn


def _mk(d, f, s):
    return tuple(
        randn(*sh, seed=s + i, dtype=torch.float64, requires_grad=True)
        for i, sh in enumerate([(f, d), (f,), (d, f), (d,)])
    )


def _plain(x, layers):
    for _W1, _b1, _W2, _b2 in layers:
        x = x + _F.dropout(_F.gelu(x @ _W1.T + _b1), p=0.3, training=True) @ _W2.T + _b2
    return x


_layers = [_mk(3, 5, 700 + 10 * l) for l in range(3)]
_x = randn(4, 3, seed=790, dtype=torch.float64, requires_grad=True)
_all = [_x, *[p for _b in _layers for p in _b]]
_ = torch.manual_seed(21)
_ref = torch.autograd.grad((_plain(_x, _layers) ** 2).sum(), _all)
_ = torch.manual_seed(21)
_ours = torch.autograd.grad((checkpoint_stack(_x, _layers, 2) ** 2).sum(), _all)
assert len(_ours) == 13 and all(
    torch.allclose(_a, _b, atol=1e-12) for _a, _b in zip(_ours, _ref)
)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

import torch

from helpers.device import randn
from helpers.memory import SavedTensors


def _mk(d, f, s):
    return tuple(
        randn(*sh, seed=s + i, dtype=torch.float32, requires_grad=True)
        for i, sh in enumerate([(f, d), (f,), (d, f), (d,)])
    )


_layers = [_mk(4, 6, 800 + 10 * l) for l in range(6)]
_x = randn(3, 4, seed=890, requires_grad=True)
for _seg in (1, 4, 6):
    with SavedTensors(exclude=[p for _b in _layers for p in _b]) as _s:
        _y = checkpoint_stack(_x, _layers, _seg)
    assert _y.shape == (3, 4) and _s.total_bytes == math.ceil(6 / _seg) * 3 * 4 * 4

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: autograd through the same 5-block stack without checkpointing,
# seeded the same way; `segment=2`, so "bytes kept" must be 3 inputs of the shape of `x`;
# first, which blocks each `checkpoint_rng` call runs, what it starts from and how many
# weights it is passed, watched by standing in for `checkpoint_rng` and `ffn_dropout`):


# %%
@checker  # the check's own code: its frames are not yours
class SegmentWatch:
    """Stands in for checkpoint_rng and ffn_dropout while checkpoint_stack runs: which
    blocks each checkpoint_rng call runs, what it starts from, which weights it gets."""

    def __init__(self, x, flat):
        self.x, self.last, self.inside = x, None, False
        self.originals = checkpoint_rng, ffn_dropout  # before they are stood in for
        self.index = {p.data_ptr(): i // 4 for i, p in enumerate(flat) if i % 4 == 0}
        self.ptrs = {p.data_ptr() for p in flat}
        self.segments, self.starts, self.passed = [], [], 0

    def checkpoint_rng(self, fn, h, *params):
        if h is self.x or h is self.last:
            self.starts.append("x" if h is self.x else "the previous segment's output")
        else:
            self.starts.append("other")
        self.passed += sum(p.data_ptr() in self.ptrs for p in params)
        self.segments.append([])
        self.inside = True
        try:
            self.last = self.originals[0](fn, h, *params)
        finally:
            self.inside = False
        return self.last

    def ffn_dropout(self, h, *theta):
        if self.inside:  # a block of the current segment's forward
            self.segments[-1].append(self.index.get(theta[0].data_ptr(), -1))
        return self.originals[1](h, *theta)

    def blocks(self, n):
        """The blocks of each segment ('0–1, 2–3, 4'), and what is off about them."""
        parts = []
        for seg in self.segments:
            if seg and seg == list(range(seg[0], seg[0] + len(seg))):
                parts.append(f"{seg[0]}–{seg[-1]}" if len(seg) > 1 else str(seg[0]))
            else:
                parts.append("+".join(map(str, seg)) or "none")
        run = [i for seg in self.segments for i in seg]
        notes = []
        if any(len(set(seg)) < len(seg) for seg in self.segments):
            notes.append("a block run twice in one segment")
        elif len(run) > len(set(run)):
            notes.append("segments overlap")
        missing = [str(i) for i in range(n) if i not in run]
        if missing:
            notes.append(
                f"block{'s' * (len(missing) > 1)} {', '.join(missing)} in none"
            )
        return ", ".join(parts) + (f" ({'; '.join(notes)})" if notes else "")

    def started(self):
        """What each segment starts from."""
        if self.starts and set(self.starts[1:]) <= {"the previous segment's output"}:
            return f"{self.starts[0]}, then the previous segment's output"
        if set(self.starts) == {"x"}:
            return "x every time (outputs not carried on)"
        return ", ".join(self.starts)


@checker
def stack_run(run, seed=9):
    """(blocks per segment, what each starts from, weights passed to checkpoint_rng, y,
    grad_x, all parameter gradients in one vector, bytes kept), seeded."""

    def go(x, *flat):
        layers = [flat[i : i + 4] for i in range(0, len(flat), 4)]
        watch = SegmentWatch(x, flat)
        ns, saved_names = globals(), ("checkpoint_rng", "ffn_dropout")
        originals = {n: ns[n] for n in saved_names}
        ns.update({n: getattr(watch, n) for n in saved_names})
        try:
            torch.manual_seed(seed)
            with SavedTensors(exclude=flat) as saved:
                y = run(x, layers)
            names = ["x"] + [
                f"{n} of block {i // 4}"
                for i, n in enumerate(["W1", "b1", "W2", "b2"] * len(layers))
            ]
            how = (watch.blocks(len(layers)), watch.started(), watch.passed)
            try:
                grads = grads_of(y, [x, *flat], names, grad_y4)
            except RuntimeError:
                if how == how_ok:  # an error the segments do not explain
                    raise
                return (*how, None, None, None, None)
        finally:
            ns.update(originals)
        flat_grads = torch.cat([g.flatten() for g in grads[1:]])
        return (*how, y, grads[0], flat_grads, saved.total_bytes)

    return go


def plain_stack(x, layers):
    """The stack without checkpointing."""
    for block in layers:
        x = ffn_dropout(x, *block)
    return x


how_ok = ("0–1, 2–3, 4", "x, then the previous segment's output", 20)
x4 = randn(6, 5, seed=13, dtype=F64, device=dev, requires_grad=True)
flat4 = [p for l in range(5) for p in ffn_params(5, 7, seed=20 + 4 * l)]
grad_y4 = randn(6, 5, seed=50, dtype=F64, device=dev)
_, _, _, y_ref, gx_ref, gp_ref, _ = stack_run(plain_stack)(x4, *flat4)
expected = (*how_ok, y_ref, gx_ref, gp_ref, 3 * x4.numel() * x4.element_size())
check(
    stack_run(checker(lambda x, layers: applied(checkpoint_stack)(x, layers, 2))),
    expected,
    args=(x4, *flat4),
    outputs=(
        "blocks per segment",
        "what each segment starts from",
        "weights passed to checkpoint_rng",
        "y",
        "grad_x",
        "grad_params",
        "bytes kept",
    ),
    counts=("weights passed to checkpoint_rng",),
    name="Exercise 4 · checkpoint_stack",
    against="autograd",
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# What the segment length buys, on the same 5-block stack (this cell runs once your
# `checkpoint_stack` returns something):

# %%
with SavedTensors(exclude=flat4) as saved:
    plain_stack(x4, [flat4[i : i + 4] for i in range(0, 20, 4)])
print(f"no checkpointing: {fmt_bytes(saved.total_bytes)} kept")
for seg in (1, 2, 5):
    with SavedTensors(exclude=flat4) as saved:
        out = checkpoint_stack(x4, [flat4[i : i + 4] for i in range(0, 20, 4)], seg)
    if out is None:
        print("checkpoint_stack: not implemented yet")
        break
    n_in = math.ceil(5 / seg)
    inputs = f"{n_in} input{'s' if n_in > 1 else ''} of {fmt_bytes(x4.numel() * 8)}"
    print(f"segment={seg}: {fmt_bytes(saved.total_bytes)} kept ({inputs})")

# %% [markdown]
# The kept bytes are only part of the story: during backward, one segment is recomputed with
# its full activations, so the peak is the kept inputs **plus one segment's activations**.
# With $L$ blocks, segments of about $\sqrt{L}$ blocks balance the two.

# %% [markdown]
# Exercise 5 is about where float16 ends. Its smallest positive number is $2^{-24}$ and its
# largest 65504, but a value is **rounded** to the nearest float16, so neither end is a sharp
# cut. The cell converts a few float32 values around them:


# %%
def in_float16(v):
    """v (a float) rounded to float16: 0, inf, k · 2⁻²⁴ (below 2⁻¹⁴) or a whole
    number."""
    h = torch.tensor(v, dtype=torch.float32).half().item()
    if h == 0 or math.isinf(h):
        return "0" if h == 0 else "inf"
    if h < 2.0**-14:  # float16's subnormals are the multiples of 2⁻²⁴
        k = round(h / 2.0**-24)
        return "2⁻²⁴" if k == 1 else f"{k} · 2⁻²⁴"
    return f"{h:.0f}"


near_edges = {
    "2⁻²⁶": 2.0**-26,
    "2⁻²⁵": 2.0**-25,
    "1.01 · 2⁻²⁵": 1.01 * 2.0**-25,
    "0.75 · 2⁻²⁴": 0.75 * 2.0**-24,
    "2⁻²⁴": 2.0**-24,
    "65519": 65519.0,
    "65520": 65520.0,
}
for label, v in near_edges.items():
    print(f"{label:>11} → {in_float16(v)} in float16")

# %% [markdown]
# So a float16 gradient is 0 only when its magnitude is at most $2^{-25}$ ($2^{-25}$ itself lies
# halfway between 0 and $2^{-24}$ and rounds to the even one, 0); anything between $2^{-25}$ and
# $2^{-24}$ rounds **up** to $2^{-24}$. At the top, 65519 still rounds to 65504 and 65520
# becomes `inf`.

# %% [raw]
# # BEGIN QUESTION
# name: ex5
# points: 3
# by_hand: [helpers.precision.loss_scale_step]
# in_place: true

# %% [markdown]
# ## Exercise 5 · Loss scaling by hand (3 points)
#
# **Goal:** float16 gradients of magnitude up to $2^{-25}$ become 0 and from 65520 up `inf`
# (the cell above); scaling the loss moves them into range, and a scale that adapts handles
# both, which is what `torch.amp.GradScaler` does.
#
# `loss_fn(*params)` computes a loss whose forward runs in float16 from float32 parameters
# (like chapter 9's `fp16_forward_loss`). Write `scaled_step(params, loss_fn, scale, tracker,
# lr, growth_interval=2000)`, one SGD step with dynamic loss scaling:
# 1. the scaled gradients: `torch.autograd.grad(scale * loss_fn(*params), params)`;
# 2. unscale: multiply each by `1 / scale` (float32, like the parameters);
# 3. if any unscaled gradient has an `inf` or `NaN` (`torch.isfinite`): **skip** the step
#    (parameters untouched), halve the scale, reset `tracker` to 0;
# 4. else update every parameter in place, $\theta \leftarrow \theta - \text{lr}\cdot g$
#    (under `torch.no_grad()`, e.g. `p.sub_(lr * g)`), and count the clean step,
#    `tracker + 1`; when it reaches `growth_interval`, double the scale and reset `tracker` to 0.
#
# Return `(scale, tracker, stepped)` with `stepped` a bool.

# %% [raw]
# # BEGIN SOLUTION


# %%
def scaled_step(params, loss_fn, scale, tracker, lr, growth_interval=2000):
    """g = ∇(scale·L)/scale; inf/NaN → skip, scale/2; else θ -= lr·g, and ×2 after
    growth_interval clean steps."""
    # BEGIN SOLUTION
    scaled = torch.autograd.grad(scale * loss_fn(*params), params)
    grads = [g * (1.0 / scale) for g in scaled]
    if not all(bool(torch.isfinite(g).all()) for g in grads):
        return scale * 0.5, 0, False
    with torch.no_grad():
        for p, g in zip(params, grads):
            p.sub_(lr * g)
    tracker += 1
    if tracker == growth_interval:
        return scale * 2.0, 0, True
    return scale, tracker, True
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

# underflow: with c = 1e-9 the float16 gradients are 0 unscaled; scaled by 2^16 the step
# is the float32 one
_W = randn(3, 4, seed=901, requires_grad=True)
_x, _t = randn(16, 4, seed=902), randn(16, 3, seed=903)


def _loss(W):
    return 1e-9 * ((torch.tanh(_x.half() @ W.half().T).float() - _t) ** 2).sum()


_W32 = _W.detach().clone().requires_grad_()
(_g32,) = torch.autograd.grad(
    1e-9 * ((torch.tanh(_x @ _W32.T) - _t) ** 2).sum(), [_W32]
)
_W0 = _W.detach().clone()
_scale, _tr, _st = scaled_step([_W], _loss, 2.0**16, 0, 1e6)
assert _st and _scale == 2.0**16 and _tr == 1
assert torch.allclose((_W0 - _W.detach()) / 1e6, _g32, atol=0, rtol=2e-2)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# a clean step moves every parameter, each by lr times its own unscaled gradient
_W = randn(2, 3, seed=951, requires_grad=True)
_b = randn(2, seed=952, requires_grad=True)
_x = randn(8, 3, seed=953)


def _loss(W, b):
    return (torch.tanh(_x.half() @ W.half().T + b.half()).float() ** 2).sum()


_gW, _gb = torch.autograd.grad(1024.0 * _loss(_W, _b), [_W, _b])
_W0, _b0 = _W.detach().clone(), _b.detach().clone()
_scale, _tr, _st = scaled_step([_W, _b], _loss, 1024.0, 0, 0.5)
assert _st and _scale == 1024.0 and _tr == 1
assert torch.allclose(_W.detach(), _W0 - 0.5 * _gW / 1024.0, atol=1e-6)
assert torch.allclose(_b.detach(), _b0 - 0.5 * _gb / 1024.0, atol=1e-6)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# overflow: a huge scale gives inf gradients; nothing moves, the scale halves, the
# tracker resets
_W = randn(2, 3, seed=911, requires_grad=True)
_b = randn(2, seed=912, requires_grad=True)
_x = 4 * randn(32, 3, seed=913)


def _loss(W, b):
    return ((_x.half() @ W.half().T + b.half()).float() ** 2).sum()


_W0, _b0 = _W.detach().clone(), _b.detach().clone()
_scale, _tr, _st = scaled_step([_W, _b], _loss, 2.0**20, 7, 0.1)
assert not _st and _scale == 2.0**19 and _tr == 0
assert torch.equal(_W.detach(), _W0) and torch.equal(_b.detach(), _b0)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.precision import ScalerState, loss_scale_step

# a run of steps: skips, then growth after growth_interval clean steps, against the
# course's helper
_W = randn(3, 4, seed=921, requires_grad=True)
_Wr = _W.detach().clone().requires_grad_()
_state, _scale, _tr = ScalerState(scale=2.0**17, growth_interval=2), 2.0**17, 0
for _k in range(9):
    _x, _t = 3 * randn(16, 4, seed=930 + _k), randn(16, 3, seed=940 + _k)

    def _loss(W):
        return ((torch.tanh(_x.half() @ W.half().T).float() - _t) ** 2).sum()

    _scale, _tr, _st = scaled_step([_W], _loss, _scale, _tr, 0.01, growth_interval=2)
    _sg = torch.autograd.grad(_state.scale * _loss(_Wr), [_Wr])
    _state, _str = loss_scale_step([_Wr], _sg, _state, lr=0.01)
    assert (float(_scale), int(_tr), bool(_st)) == (
        _state.scale,
        _state.growth_tracker,
        _str,
    )
    assert torch.allclose(_W.detach(), _Wr.detach(), atol=1e-6, rtol=1e-5)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 5** (reference: `helpers.precision.loss_scale_step`, chapter 9's version of what
# `GradScaler` does, checked there against `GradScaler` bit for bit; one step whose gradients
# overflow in some entries, one clean step that completes `growth_interval=3`, then 8 SGD steps
# from scale $2^{16}$, a summed float16 loss whose gradients overflow at first):


# %%
def fp16_loss(W, b, x, t):
    """L = Σ (tanh(x Wᵀ + b) − t)², the layer in float16 from float32 weights; L in
    float32."""
    # (n, 4) @ (4, 3) -> (n, 3), float16
    h = torch.tanh(x.half() @ W.half().T + b.half())
    return ((h.float() - t) ** 2).sum()


def batches(n_steps=8):
    """The same (x, t) batches for both runs."""
    return [
        (
            3 * randn(16, 4, seed=100 + k, device=dev),
            randn(16, 3, seed=200 + k, device=dev),
        )
        for k in range(n_steps)
    ]


@checker
def run_ours(W, b):
    """(scales, trackers, stepped, W, b) after 8 steps of your scaled_step."""
    W, b = W.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    # mid-interval: a skip must reset it
    scale, tracker, scales, trackers, stepped = 2.0**16, 2, [], [], []
    for x, t in batches():
        out = scaled_step(
            [W, b],
            lambda W, b: fp16_loss(W, b, x, t),
            scale,
            tracker,
            0.01,
            growth_interval=3,
        )
        if out is None:
            raise NotImplementedError
        scale, tracker, did = out
        scales.append(float(scale))
        trackers.append(int(tracker))
        stepped.append(bool(did))
    return (
        torch.tensor(scales, dtype=F64),
        torch.tensor(trackers),
        torch.tensor(stepped),
        W,
        b,
    )


def run_reference(W, b):
    """The same 8 steps with helpers.precision.loss_scale_step: (scales, trackers,
    stepped, W, b)."""
    W, b = W.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    state = ScalerState(scale=2.0**16, growth_interval=3, growth_tracker=2)
    scales, trackers, stepped = [], [], []
    for x, t in batches():
        scaled = torch.autograd.grad(state.scale * fp16_loss(W, b, x, t), [W, b])
        state, did = loss_scale_step([W, b], scaled, state, lr=0.01)
        scales.append(state.scale)
        trackers.append(state.growth_tracker)
        stepped.append(did)
    return (
        torch.tensor(scales, dtype=F64),
        torch.tensor(trackers),
        torch.tensor(stepped),
        W,
        b,
    )


@checker
def one_step(ours, scale, tracker, k, W, b):
    """(stepped, scale, tracker, step on W, step on b) after one step from (scale,
    tracker) on batch k, growth_interval=3: yours (ours=True) or loss_scale_step's."""
    x, t = batches()[k]
    W0, b0 = W.detach().clone(), b.detach().clone()
    W, b = W0.clone().requires_grad_(), b0.clone().requires_grad_()
    if ours:
        out = scaled_step(
            [W, b], lambda W, b: fp16_loss(W, b, x, t), scale, tracker, 0.01, 3
        )
        if out is None:
            raise NotImplementedError
        scale, tracker, did = out
    else:
        state = ScalerState(scale=scale, growth_interval=3, growth_tracker=tracker)
        scaled = torch.autograd.grad(state.scale * fp16_loss(W, b, x, t), [W, b])
        state, did = loss_scale_step([W, b], scaled, state, lr=0.01)
        scale, tracker = state.scale, state.growth_tracker
    steps = (W0 - W.detach(), b0 - b.detach())
    return (
        torch.tensor(bool(did)),
        torch.tensor(float(scale), dtype=F64),
        tracker,
        *steps,
    )


W5, b5 = randn(3, 4, seed=30, device=dev), randn(3, seed=31, device=dev)
step_outputs = ("stepped", "scale", "tracker", "step on W", "step on b")
# batch 4 at scale 2¹⁴: some gradient entries overflow, not all; tracker 2 before
check(
    checker(lambda: one_step(True, 2.0**14, 2, 4, W5, b5)),
    one_step(False, 2.0**14, 2, 4, W5, b5),
    outputs=step_outputs,
    name="Exercise 5 · scaled_step on an overflow",
    against="loss_scale_step",
    mistakes={
        "stepped": {
            "True: it stepped though a gradient has inf (all/any mixed up?)": True
        },
        "scale": {"2 × the scale passed in (doubled, not halved, on inf)": 2.0**15},
        "tracker": {"the tracker passed in (kept through the skip)": 2},
    },
)
# batch 0 at scale 2⁴: no overflow; the third clean step in a row, so the scale grows
check(
    checker(lambda: one_step(True, 2.0**4, 2, 0, W5, b5)),
    one_step(False, 2.0**4, 2, 0, W5, b5),
    outputs=step_outputs,
    name="Exercise 5 · scaled_step on a clean step",
    against="loss_scale_step",
    factors={"scale": 2.0**4},
    mistakes={
        "scale": {"the scale passed in (not grown at growth_interval)": 2.0**4},
        "tracker": {"growth_interval (not reset when the scale grew)": 3},
        "step on b": {"no step at all (b not updated)": torch.zeros(3, device=dev)},
    },
)
check(
    run_ours,
    run_reference,
    args=(W5, b5),
    # the root cause first: a wrong scale sequence is why W and b end up wrong
    outputs=("scale after each step", "tracker after each step", "stepped", "W", "b"),
    name="Exercise 5 · scaled_step",
    against="loss_scale_step",
)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the function names: the grader calls `predict_saved_bytes`,
# `StackCheckpoint`, `CheckpointRNG`, `checkpoint_rng`, `checkpoint_stack` and `scaled_step`.
