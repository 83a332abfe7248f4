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
# `...` with your code, keep the names and signatures, then run the **self-check** cell right
# below. It runs your answer on one recorded case of each promise the exercise makes (a shape,
# a dtype, a flag's value, an edge value) and answers in one line: `✓` matches the course's
# reference on all of them, `✗` names the kinds of case that fail before any number, then what
# is off in the first one, or `·` not implemented yet. Your instructor grades the notebook you
# hand in with hidden tests that run the same kinds of case on other values.
#
# The blocks the checkpoint exercises run are the course's, in `helpers.labcontract`:
# `ffn_block(x, W1, b1, W2, b2)` is $y = x + \mathrm{GELU}(x W_1^\top + b_1) W_2^\top + b_2$
# and `ffn_dropout(x, W1, b1, W2, b2)` the same with dropout ($p = 0.3$) after the GELU, a
# fresh mask at every call. Both note each run that builds a graph, which is how the
# self-check sees how many blocks hold a graph at once and in which order your backward
# re-runs them.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import torch
from torch.autograd.function import once_differentiable

from helpers.checkpoint import get_rng_state, set_rng_state
from helpers.labcontract import check_contract, ffn_dropout

# %% [raw]
# # BEGIN QUESTION
# name: ex1

# %% [markdown]
# ## Exercise 1 · Predict the bytes a block keeps for backward (2 points)
#
# **Goal:** read a block as a list of operations and say, without running it, what each one
# keeps for backward and how many bytes that is.
#
# **You derive:** how many numbers each operation keeps per row of `x`, which of them are one
# and the same tensor, and from that the bytes kept as a formula in `B`, `d`, `d_ff` and the
# bytes per element.
#
# **You are given:** the block's code and the list below of what each CPU kernel keeps
# (chapter 9, section 1).
#
# The block, with `x` of shape (B, d), hidden width `d_ff` and `act` ReLU or GELU:
#
# ```python
# def mlp_block(x, ln_w, ln_b, W1, b1, W2, b2, activation="relu"):
#     h = F.layer_norm(x, x.shape[-1:], ln_w, ln_b)  # (B, d)
#     z = h @ W1.T + b1  # (B, d) @ (d, d_ff) -> (B, d_ff)
#     a = F.relu(z) if activation == "relu" else F.gelu(z)  # (B, d_ff)
#     return x + a @ W2.T + b2  # (B, d_ff) @ (d_ff, d) -> (B, d)
# ```
#
# What PyTorch's CPU kernels keep (chapter 9, section 1):
# * `layer_norm` keeps its input, and the row mean $\mu$ and $1/\sigma$, one number per row each;
# * a matmul `h @ W.T` keeps its input `h` (and the weight, which exists anyway);
# * ReLU keeps its **output**; GELU keeps its **input**;
# * additions (`+ b`, the residual `x + ...`) keep nothing;
# * a tensor kept by two operations costs its bytes once.
#
# Write `predict_saved_bytes(B, d, d_ff, activation, bytes_per_element)`: the bytes kept, as
# an `int` (not a float, not a tensor), parameters (`ln_w`, `ln_b`, `W1`, `b1`, `W2`, `b2`)
# **not** counted, for `activation` `"relu"` or `"gelu"`, `bytes_per_element` 2, 4 or 8
# (float16, float32, float64), any `B` ≥ 1 and any `d`, `d_ff` (equal or not). The input `x`
# itself **does** count here (unlike lab 3's exercise 4, which excluded inputs): the block
# keeps it. Walk the block operation by operation and ask, for each tensor kept, whether
# another operation already keeps the very same tensor.
#
# <details><summary>Hint 1 of 3 · the idea: count per row, then look for repeats</summary>
#
# Every tensor kept here has `B` rows (the shapes are in the comments of the block), so count
# numbers per row and multiply by `B` and by the bytes per element at the end. Go down the
# four lines of the block and, for each kept tensor, ask which operation produced it: a tensor
# two operations keep is counted once.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the activation</summary>
#
# The first two lines keep `x`, $\mu$, $1/\sigma$ and the LayerNorm output `h`, whatever the
# activation. The activation decides the rest. With ReLU one tensor is kept by two operations
# (ReLU's output is also W2's matmul input); with GELU it is not (GELU keeps its input `z`,
# the matmul keeps GELU's output `a`: two tensors of shape (B, d_ff)).
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: measure it</summary>
#
# In a scratch cell, copy the block (with `import torch.nn.functional as F`), make parameters
# that require a gradient, and run it inside `SavedTensors(exclude=[ln_w, ln_b, W1, b1, W2, b2])`
# from `helpers.memory` (as chapter 9 does); `.total_bytes` is what it kept. Use sizes that
# are all different, e.g. `B, d, d_ff = 3, 4, 5`, so each term tells which size it is, then
# try `B = 1`, `d_ff = d`, both activations and float64, float32, float16. Your function must
# give the same `int` every time. The formula to check yours against:
#
# $$\begin{aligned}
# \text{bytes} &= B\,(2d + 2 + d_\text{ff})\cdot\text{bytes\_per\_element} \;\text{(ReLU)}, \\
# \text{bytes} &= B\,(2d + 2 + 2d_\text{ff})\cdot\text{bytes\_per\_element} \;\text{(GELU)}.
# \end{aligned}$$
#
# Delete the scratch cell before handing in.
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
# # END QUESTION

# %% [markdown]
# **Self-check 1** compares your function with the bytes `SavedTensors` measured while the block
# ran on the CPU (parameters excluded), recorded. The numbers must be equal, and an `int`.

# %%
check_contract("lab09", "ex1", predict_saved_bytes)

# %% [raw]
# # BEGIN QUESTION
# name: ex2

# %% [markdown]
# ## Exercise 2 · Keep only the stack's input, recompute it in segments (3 points)
#
# **Goal:** chapter 9's `FirstCheckpoint` keeps one block's input and re-runs that block in
# backward. Push the trade further: a whole stack of $L$ blocks keeps **only its input** $x_0$
# between forward and backward, and backward re-runs the stack in segments so that no more
# than `every` blocks hold their activations at any moment.
#
# **You derive:** the order of the work in `backward`: which segment inputs to recompute first,
# what each segment's re-run differentiates and with respect to which leaves, and how the
# gradient passes from one segment to the one before.
#
# **You are given:** the block `fn` (`ffn_block` in the self-check), chapter 9's
# `FirstCheckpoint` (one block, one re-run, leaves gated on `ctx.needs_input_grad`), and
# `torch.autograd.grad`.
#
# The stack is $x_l = \mathrm{fn}(x_{l-1}, \theta_l)$ with `fn` a block such as `ffn_block`
# and $\theta_l = (W_1, b_1, W_2, b_2)$ its 4 parameters; they are passed flattened, 4 per
# block, in order. `x` has any shape `(..., d)` (2-D or 3-D), in float32 or float64. Fill in
# `StackCheckpoint`, used as `StackCheckpoint.apply(fn, every, x, *params)`:
# * `forward(fn, every, x, *params)`: the stack's output, computed under `torch.no_grad()`;
# * `setup_context(ctx, inputs, output)`: keep `fn` and `every` on `ctx`, save `x` and the
#   parameters (they exist anyway) with `ctx.save_for_backward`, and nothing else (the
#   self-check measures the bytes saved besides the parameters: those of `x`; and it counts the
#   tensors kept as `ctx` attributes, which must be none: `save_for_backward` is what checks
#   that a saved tensor was not changed in place before backward);
# * `backward(ctx, grad_y)`: first run the stack again **without** a graph to get back the
#   input of every segment of `every` consecutive blocks (blocks $0, k, 2k, \dots$ with
#   $k$ = `every`; the last segment may be shorter, and `every` may be 1, or as large as $L$ or
#   larger: one segment); then, **from the last segment to the first**, re-run that segment
#   **with** a graph from its input and differentiate it, so that the gradient with respect to
#   the segment's input becomes the upstream gradient of the segment before. At most `every`
#   blocks may hold a graph at any moment. Return one gradient per input of `forward`: `None`
#   for `fn` and `every`, and for every input that needs none (gate on
#   `ctx.needs_input_grad[2:]` as chapter 9 does): a data `x` (no `requires_grad`) is never
#   re-run with `requires_grad`, though the later segments' inputs still need a gradient, and
#   a frozen weight gets `None` while the others' gradients stay right. A frozen weight's gradient
#   is never computed: the checks count the multiply–adds of the call (no more than the course's
#   checkpoint needs) and look at what `backward` returns for each input.
#
# Work out on paper first what each segment's re-run must differentiate, and with respect to
# what: which of its leaves need a gradient, and where each result goes.
#
# <details><summary>Hint 1 of 4 · the idea: the chain rule across segment boundaries</summary>
#
# The stack is a chain of segments, each a function of its input and its own parameters. The
# gradient with respect to a segment's input is the upstream gradient of the segment before,
# so backward must go from the last segment to the first, and it needs every segment's input
# (each of the shape of `x`) before it can start. Only $x_0$ was kept: the other inputs must
# be computed again.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the segment inputs, without a graph</summary>
#
# With $k$ = `every`, segment $s$ starts at block $s k$ and its parameters are the 4 per block
# from index $4 s k$ on. One pass under `torch.no_grad()` from $x_0$ through every segment but
# the last gives the $\lceil L/k\rceil$ segment inputs ($x_0$ first); nothing of it is kept
# but those inputs.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: one segment, backwards</summary>
#
# Keep a list `grads` with one slot per parameter (`None` to start) and a tensor `g`, the
# gradient arriving at the current segment's output (`grad_y` for the last one). For each
# segment, backwards: leaves for its input (requiring a gradient unless it is the first
# segment and `x` needs none) and for its parameters (as their flags say); the segment re-run
# under `torch.enable_grad()`; one `torch.autograd.grad` of its output, with `g` as the
# upstream gradient, with respect to the leaves that require one; the input's gradient
# becomes `g`, the parameters' go into their slots. The graph of a segment lives from its
# re-run until `torch.autograd.grad` returns, then it is freed: re-running the next (earlier)
# segment only after that keeps one segment's activations alive at a time.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: against the plain stack</summary>
#
# In a scratch cell, in float64: import `ffn_block` from `helpers.labcontract`, make $L = 5$
# blocks with `d = 4`, `d_ff = 6` and an `x` of shape (2, 3, 4), all requiring a gradient.
# Compare `torch.autograd.grad((y ** 2).sum(), [x, *params])` for
# `y = StackCheckpoint.apply(ffn_block, every, x, *params)` with the same for the plain loop
# over the blocks, to `atol 1e-12`, for `every` = 1, 2 (a shorter last segment), 5 and 7.
# Then an `x` without `requires_grad` (ask for the parameters' gradients only) and one frozen
# `W1` and `b1`. Delete the scratch cell before handing in.
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
# # END QUESTION

# %% [markdown]
# **Self-check 2** runs `StackCheckpoint.apply(ffn_block, every, x, *params)` and autograd and
# compares with recorded reference outputs.
#
# For each case it compares the output, the gradients, the most blocks holding a graph at once,
# the order the segments are re-run in, how many re-runs of block 0 made a data `x` require a
# gradient (it must be none), and the bytes saved besides the parameters (one `x`). The
# tolerance is `atol 1e-12` in float64: backward repeats the very same operations in the same
# order.

# %%
check_contract("lab09", "ex2", StackCheckpoint)

# %% [markdown]
# The price: every block but those of the last segment runs three times (forward, the pass
# without a graph, the segment's re-run), for a memory of one input between forward and
# backward.

# %% [raw]
# # BEGIN QUESTION
# name: ex3

# %% [markdown]
# ## Exercise 3 · Dropout must draw the same mask twice (2 points)
#
# **Goal:** a recomputation is only correct if it recomputes *the same* function; with
# dropout that means the same random mask, so the RNG state must be taken before the forward
# and put back for the re-run.
#
# **You derive:** the moment the RNG state must be taken, and how `backward` rewinds the
# generators for the re-run without changing what is drawn after it.
#
# **You are given:** `get_rng_state` and `set_rng_state` from `helpers.checkpoint`, the block
# `fn`, and the checkpoint pattern of chapter 9's `FirstCheckpoint` (fresh leaves gated on
# `ctx.needs_input_grad`, one `torch.autograd.grad`).
#
# A checkpoint that simply re-runs `ffn_dropout` in backward gives wrong gradients: the
# re-run draws a new mask. Write a checkpoint of **one** block that repeats the mask:
# * `CheckpointRNG`: `forward(fn, rng_state, x, *params)` returns `fn(x, *params)` without a
#   graph; `setup_context` keeps `fn` and `rng_state` on `ctx` and saves `x` and the
#   parameters with `ctx.save_for_backward` (no tensor as a `ctx` attribute: the self-check
#   counts them); `backward` re-runs `fn` with a graph on fresh leaves, with the random
#   generators put back to `rng_state` (`set_rng_state` from `helpers.checkpoint`), and
#   differentiates it. Gate on `ctx.needs_input_grad[2:]` as in exercise 2 and return one
#   gradient per input (`None` for `fn`, `rng_state` and every input that needs none: a data
#   `x` stays without `requires_grad` in the re-run, a frozen weight gets `None`: the checks
#   look at what `backward` returns for each input, not only at what autograd keeps);
# * `checkpoint_rng(fn, x, *params)`: take `rng_state = get_rng_state([x, *params])` (from
#   `helpers.checkpoint`: an `RNGState` whose `.cpu` is the CPU generator's state and whose
#   `.cuda` is a tuple of `(device index, state)` pairs, one per GPU a tensor is on, empty on a
#   CPU), then return `CheckpointRNG.apply(fn, rng_state, x, *params)`.
#
# `fn` is any block, with dropout (`ffn_dropout`) or without (`ffn_block`); `x` has any shape
# `(..., d)`, in float32 or float64. The output and every gradient must be those of `fn`
# without checkpointing, and the random numbers drawn after backward those drawn without
# checkpointing, even when training draws something between forward and backward. Two things
# to work out: **when** the state must be taken (why not in `setup_context`?), and how to
# rewind the generator for the re-run without changing the random numbers the rest of
# training draws after backward.
#
# <details><summary>Hint 1 of 4 · the idea: the mask is a function of the generator's state</summary>
#
# Dropout draws its mask from the generator's state at the moment it runs. The re-run draws
# the same mask only if it starts from that same state. So look at two moments: the last one
# before the forward's dropout runs (that is the state to keep), and the one after backward
# (the generator must be where it would be had backward never rewound it).
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: when to take the state</summary>
#
# `setup_context` runs *after* `forward`, when the mask is already drawn: take the state in
# `checkpoint_rng`, before `apply`, and pass it to `apply` as an input. It is not a tensor, so
# its gradient is `None`.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: rewind without a trace</summary>
#
# `torch.random.fork_rng` saves the generators' states when its `with` block starts and puts
# them back when it ends. Give it, as `devices`, the CUDA device indices listed in the saved
# state's `.cuda` pairs; inside it, first put the generators back with `set_rng_state` and the
# saved state, then re-run `fn` with a graph. After the block, the stream goes on as if nothing
# had happened.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: the same numbers, before and after</summary>
#
# In a scratch cell, in float64: `torch.manual_seed(0)`, run `ffn_dropout` plainly, draw
# `torch.rand(3)` (training drawing something between forward and backward), take the
# gradients of `(y ** 2).sum()` with `torch.autograd.grad`, then draw `torch.rand(4)`. Do it
# again from the same seed with `checkpoint_rng(ffn_dropout, x, *params)`: the output, every
# gradient and both draws must be equal. Try `ffn_block` too, an `x` without `requires_grad`,
# and a frozen `W1`. To see the bug, leave out the rewind: the gradients change. Delete the
# scratch cell before handing in.
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
# # END QUESTION

# %% [markdown]
# **Self-check 3** seeds the generator, runs `checkpoint_rng(fn, x, *params)` and autograd, then
# draws 4 random numbers, and compares with recorded reference outputs.
#
# It compares the output, the gradients, how many re-runs made a data `x` require a gradient (it
# must be none) and the numbers drawn after backward with those of the same block without
# checkpointing.

# %%
check_contract("lab09", "ex3", checkpoint_rng)

# %% [raw]
# # BEGIN QUESTION
# name: ex4

# %% [markdown]
# ## Exercise 4 · Checkpoint a stack in segments (2 points)
#
# **Goal:** what checkpointing leaves in memory is one tensor per checkpointed segment; the
# segment length trades that against the activations of one segment during backward.
#
# **You derive:** how to turn a run of blocks into one function of its input and its
# parameters, and the cut of the list into segments.
#
# **You are given:** your `checkpoint_rng` from exercise 3 (it keeps the RNG state, so the
# masks repeat) and `ffn_dropout`. Unlike the other labs' later exercises, this one is graded
# with **your** `checkpoint_rng`, not the course's (the checks need your graph, with your
# `autograd.Function` in it): a mistake in exercise 3 that changes what this exercise is checked
# on (its output, its gradients, the bytes it saves) costs points here too, and this
# exercise's self-check names it first; one that shows only in what exercise 3 alone checks
# (the random numbers drawn after backward) costs points in exercise 3.
#
# `layers` is a list of parameter tuples `(W1, b1, W2, b2)`, one per `ffn_dropout` block; the
# stack computes $x_l = \mathrm{ffn\_dropout}(x_{l-1}, \theta_l)$, `x` of any shape `(..., d)`
# in float32 or float64. Write `checkpoint_stack(x, layers, segment)`: cut the list into
# consecutive segments of `segment` blocks (the last one may be shorter: 5 blocks,
# `segment=2` → 2 + 2 + 1; `segment` may be 1, or $L$ or more: one segment), and run each
# segment through your `checkpoint_rng` **as one function**. That function must take the
# segment's parameters as explicit arguments: pass them flattened (the four tensors
# `W1, b1, W2, b2` of every block in the segment, one after another: 4 per block) and regroup
# them by 4 inside. Return the stack's output;
# its gradients must be those of the stack without checkpointing (the same masks).
#
# With $L$ blocks, what is kept for backward is then $\lceil L/\text{segment} \rceil$ segment
# inputs, each of the shape of `x`: 5 inputs for 5 blocks with `segment=1`, 3 with
# `segment=2`, 1 with `segment=5`. The kept bytes are only part of the story: during backward,
# one segment is recomputed with its full activations, so the peak is the kept inputs **plus
# one segment's activations**. With $L$ blocks, segments of about $\sqrt{L}$ blocks balance the
# two.
#
# <details><summary>Hint 1 of 4 · the idea: a segment is one function of its input and its weights</summary>
#
# A segment maps its input $h$ to its output through its blocks; to `checkpoint_rng` it must
# look like any block, `fn(h, *params)`. Autograd gives gradients only to a Function's inputs
# (chapter 9's closure pitfall), so the segment's weights must be arguments, not captured.
# One RNG state taken before the segment covers all its masks: the re-run draws them in the
# same order.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the segment's function</summary>
#
# Define, inside `checkpoint_stack`, a function of `(h, *flat)` that walks `flat` 4 at a time
# and sends `h` through `ffn_dropout` with each group `(W1, b1, W2, b2)`, in order. Capturing
# nothing but the block function is fine.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the loop over segments</summary>
#
# The segments start at blocks 0, `segment`, 2·`segment`, …; a slice of `layers` past its end
# is simply shorter, which gives the short last segment. Flatten each slice's tuples into one
# list, and feed the output of one `checkpoint_rng` call to the next as its input.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: the same gradients, fewer bytes</summary>
#
# In a scratch cell, in float64, with 5 blocks (`d = 4`, `d_ff = 6`) and `x` of shape
# (2, 3, 4): `torch.manual_seed(1)`, run the plain stack of `ffn_dropout` and take the
# gradients of `(y ** 2).sum()`; seed again and do the same with `checkpoint_stack`. They must
# agree to `atol 1e-12` for `segment` = 1, 2, 5 and 7. Run `checkpoint_stack` inside
# `SavedTensors(exclude=params)` (from `helpers.memory`): `.total_bytes` divided by `x`'s bytes
# must be 5, 3, 1 and 1. Delete the scratch cell before handing in.
#
# </details>

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
# # END QUESTION

# %% [markdown]
# **Self-check 4** seeds the generator, runs `checkpoint_stack` and autograd, and compares with
# recorded reference outputs.
#
# It compares the output and the gradients with the stack without checkpointing (the same
# masks), and the bytes your forward saved besides the parameters, in units of `x`'s bytes
# ($\lceil L/\text{segment}\rceil$).

# %%
check_contract("lab09", "ex4", checkpoint_stack)

# %% [markdown]
# Exercise 5 is about where float16 ends. Its smallest positive number is $2^{-24}$ and its
# largest 65504, but a value is **rounded** to the nearest float16, so neither end is a sharp
# cut. Converted from float32:
#
# | value | in float16 |
# | --- | --- |
# | $2^{-26}$ | 0 |
# | $2^{-25}$ | 0 |
# | $1.01 \cdot 2^{-25}$ | $2^{-24}$ |
# | $0.75 \cdot 2^{-24}$ | $2^{-24}$ |
# | $2^{-24}$ | $2^{-24}$ |
# | 65519 | 65504 |
# | 65520 | `inf` |
#
# So a float16 gradient is 0 only when its magnitude is at most $2^{-25}$ ($2^{-25}$ itself lies
# halfway between 0 and $2^{-24}$ and rounds to the even one, 0); anything between $2^{-25}$ and
# $2^{-24}$ rounds **up** to $2^{-24}$. At the top, 65519 still rounds to 65504 and 65520
# becomes `inf`.

# %% [raw]
# # BEGIN QUESTION
# name: ex5

# %% [markdown]
# ## Exercise 5 · Loss scaling by hand (3 points)
#
# **Goal:** float16 gradients of magnitude up to $2^{-25}$ become 0 and from 65520 up `inf`
# (the table above); scaling the loss moves them into range, and a scale that adapts handles
# both, which is what `torch.amp.GradScaler` does.
#
# **You derive:** one step of dynamic loss scaling as code: in which order to compute, check,
# update and count, and what `(scale, tracker, stepped)` is on each of its three paths.
#
# **You are given:** `loss_fn`, the four rules below (those of `GradScaler`, chapter 9,
# section 4) and `torch.isfinite`.
#
# `loss_fn(*params)` computes a loss whose forward runs in float16 from float32 parameters
# (like chapter 9's `fp16_forward_loss`; the self-check uses `fp16_tanh_loss`,
# `fp16_linear_loss`, `fp16_uneven_loss`, `fp16_tiny_loss` and `fp16_bias_overflow_loss` from
# `helpers.labcontract`). Write
# `scaled_step(params, loss_fn, scale, tracker, lr, growth_interval=2000)`, one SGD step with
# dynamic loss scaling, for a list of one or more parameters:
# 1. the scaled gradients: `torch.autograd.grad(scale * loss_fn(*params), params)`;
# 2. unscale: multiply each by `1 / scale` (float32, like the parameters);
# 3. if any entry of any unscaled gradient is `inf` or `NaN` (`torch.isfinite`), even one:
#    **skip** the step (parameters untouched), halve the scale, reset `tracker` to 0 (whatever
#    it was);
# 4. else update every parameter in place, $\theta \leftarrow \theta - \text{lr}\cdot g$
#    (under `torch.no_grad()`, e.g. `p.sub_(lr * g)`), and count the clean step,
#    `tracker + 1`; when it reaches `growth_interval` (given, or its default 2000), double the
#    scale and reset `tracker` to 0.
#
# Return `(scale, tracker, stepped)`: a float, an int and a bool.
#
# <details><summary>Hint 1 of 4 · the idea: decide first, then touch</summary>
#
# There are three outcomes: skipped, stepped below `growth_interval`, stepped and reaching it.
# Which one it is depends only on the unscaled gradients of *all* parameters together, so
# compute and check them all before any parameter changes.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: one verdict for all gradients</summary>
#
# `torch.isfinite(g)` is a bool tensor of `g`'s shape; `.all()` reduces it to one bool per
# tensor, and Python's `all` over the list gives one verdict. A single `inf` in the second
# parameter's gradient must skip the step for the first parameter too.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the tracker</summary>
#
# `tracker` counts clean steps in a row. A skip sets it to 0 whatever it was. A clean step
# adds 1 first and compares with `growth_interval` after: with `tracker = growth_interval - 1`
# on entry, this step doubles the scale and returns a tracker of 0.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: against GradScaler</summary>
#
# In a scratch cell, start two copies of `W` (3, 4) and `b` (3,) in float32 and run, step by
# step, your `scaled_step` with `fp16_tanh_loss` (from `helpers.labcontract`) on one and
# `torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=3)` with
# `torch.optim.SGD(lr=0.01)` on the other, as chapter 9 does. The scale and skips must match
# `scaler.get_scale()` at every step, and the weights `torch.allclose` (SGD rounds its update
# slightly differently). Also try `fp16_tiny_loss` at scale 1 (every gradient 0) and
# $2^{16}$ (not 0). Delete the scratch cell before handing in.
#
# </details>

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
# # END QUESTION

# %% [markdown]
# **Self-check 5** runs one step of your `scaled_step` on fresh parameters and compares with
# recorded reference outputs.
#
# It compares the returned scale, tracker and stepped (`"stepped"` or `"skipped"` for a bool)
# and the parameters after the step.

# %%
check_contract("lab09", "ex5", scaled_step)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the function names: the grader calls `predict_saved_bytes`,
# `StackCheckpoint`, `CheckpointRNG`, `checkpoint_rng`, `checkpoint_stack` and `scaled_step`.
