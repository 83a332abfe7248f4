# %% [markdown]
# # 9. Where backward's memory goes: activations, checkpointing, mixed precision
#
# Training a Transformer runs out of memory long before its weights fill the GPU. What fills it
# is what the [forward pass](../pages/glossary.md#term-forward-pass) **keeps for backward** (its [saved tensors](../pages/glossary.md#term-saved-tensors)): the
# activations. This chapter counts them byte by byte for chapter 7's GPT, trades them for
# compute with [gradient checkpointing](../pages/glossary.md#term-gradient-checkpointing) written by hand, and then halves every byte with
# float16 ([mixed precision](../pages/glossary.md#term-mixed-precision)), which brings its own ways to go wrong.
#
# **Learning goals.** After this chapter you can
#
# 1. list what each operation of a pre-norm Transformer block saves for backward, and write the
#    total as a formula in $B, N, d, H, d_\text{ff}$ and the number of layers that matches the
#    measurement to the byte;
# 2. say when the $N^2$ attention term dominates, and why fused attention removes it;
# 3. write gradient checkpointing as a `torch.autograd.Function` that keeps only a block's input,
#    passes the weights as explicit inputs, and restores the RNG so dropout repeats its mask;
# 4. measure what checkpointing saves and what it costs, against `torch.utils.checkpoint`;
# 5. predict float16 overflow (above 65504) and underflow (below $2^{-24}$), explain why
#    [LayerNorm](../pages/glossary.md#term-layer-normalization)'s `eps=1e-12` is 0 in float16, and do loss scaling by hand the way
#    `torch.amp.GradScaler` does;
# 6. compare the ranges of float16, bfloat16 and float32.
#
# Seed 000 states that gradient checkpointing took a BERT-base from 1.2 GB to 0.7 GB "but 18%
# slower", elsewhere "40% less memory, 25% slower", and that `eps=1e-12` in LayerNorm broke
# mixed-precision training. None of it was measured. We measure.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import inspect
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.utils.checkpoint as tuc
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn.attention import SDPBackend, sdpa_kernel

from helpers.checkpoint import (
    Checkpoint,
    activation_bytes_formula,
    block_activation_bytes,
    checkpoint,
    checkpoint_sequential,
    recompute_backward,
)
from helpers.checks import compare
from helpers.device import get_device, no_tf32, randn
from helpers.functions import layernorm_forward
from helpers.gpt import GPTConfig, TinyGPT
from helpers.memory import SavedTensors, fmt_bytes
from helpers.precision import ScalerState, float_format_table, loss_scale_step
from helpers.show import fmt, show, varies

dev = get_device()
no_tf32()  # TF32 would change the last digits of fp32 matmuls on Ampere+ GPUs
cpu = torch.device("cpu")
F64 = torch.float64

# %% [markdown]
# ## 1. What one block keeps, operation by operation
#
# Chapter 7's `TinyGPT` is built from `nn.TransformerEncoderLayer(norm_first=True)` blocks
# (dropout 0, GELU). We run its forward inside chapter 3's `SavedTensors(by_op=True)`, leaving
# out the parameters (they exist anyway), and list what each operation keeps. The sizes are
# chosen all different, so every shape says which dimension it is:
# $B=2$, $N=12$, $d=24$, $H=3$, $d_\text{ff}=40$, vocabulary 17.
#
# Memory is counted on the CPU. The bytes depend on which kernels run, not on the machine, and
# the CPU kernels are the same everywhere; CUDA's attention kernels keep slightly different
# bookkeeping (see the end of this section).

# %%
B, N, d, H, d_ff, V = 2, 12, 24, 3, 40, 17
cfg = GPTConfig(vocab_size=V, n_ctx=64, d_model=d, n_heads=H, n_layers=1, d_ff=d_ff)
model = TinyGPT(cfg, seed=0)  # on the CPU
idx = torch.randint(0, V, (B, N), generator=torch.Generator().manual_seed(0))
with SavedTensors(exclude=list(model.parameters()), by_op=True) as saved:
    model(idx)
print(saved.table())
show("bytes kept", saved.total_bytes, 0)

# %% [markdown]
# Reading the table from the top (`=` marks a tensor already counted, or a parameter):
#
# | op | keeps | elements per token |
# | --- | --- | --- |
# | embedding | the token ids (int64) | 8 bytes |
# | LayerNorm 1 | its input $X$ (the block input), $\mu$, $1/\sigma$ | $d + 2$ |
# | attention (`multi_head_attention_forward`) | in_proj's input (LN1's output); $Q, K, V$, views of one packed $(B, N, 3d)$ tensor; the output $O$; the row log-sum-exp $(B, H, N)$ | $d + 3d + d + H$ |
# | LayerNorm 2 | its input $X_1 = X + \mathrm{SA}$, $\mu$, $1/\sigma$ | $d + 2$ |
# | linear1 | its input (LN2's output) | $d$ |
# | GELU | its input | $d_\text{ff}$ |
# | linear2 | its input, the GELU output | $d_\text{ff}$ |
# | ln_f, head | ln_f's input, $\mu$, $1/\sigma$; the head's input | $2d + 2$ |
#
# Per block that is $8d + H + 4 + 2d_\text{ff}$ elements per token. Three things are *not*
# there: the residual additions keep nothing (the gradient of $x + y$ needs neither), the
# attention matrix $P$ is not kept (PyTorch's CPU attention kernel, like chapter 7's manual
# block, rebuilds it from the log-sum-exp), and out_proj's input is $O$ itself. With ReLU instead
# of GELU the FFN keeps one $(B, N, d_\text{ff})$ tensor, not two: ReLU keeps its output,
# which is linear2's input too.
#
# `helpers.checkpoint.activation_bytes_formula` adds these up:

# %% tags=["nbval-ignore-output"]
# a listing: nbval skips its output, the next cell checks
print(inspect.getsource(block_activation_bytes))

# %%
formula = activation_bytes_formula(B, N, d, H, 1, d_ff, 4, head=True)
show("formula, 1 block + ends", formula, 0)
_ = compare("measured = formula", saved.total_bytes, formula, exact=True)

# %% [markdown]
# Now layer by layer: each block of a 4-block TinyGPT gets its own `SavedTensors`, so we see
# what each one adds, and the whole model is measured for 1 to 4 blocks.

# %%
cfg4 = GPTConfig(vocab_size=V, n_ctx=64, d_model=d, n_heads=H, n_layers=4, d_ff=d_ff)
gpt4 = TinyGPT(cfg4, seed=0)
# (B, N, d), as TinyGPT.forward
X = nn.functional.embedding(idx, gpt4.wte) + gpt4.wpe[:N]
mask = nn.Transformer.generate_square_subsequent_mask(N, dtype=X.dtype)  # (N, N)
per_block = block_activation_bytes(B, N, d, H, d_ff, 4)
for l, block in enumerate(gpt4.blocks):
    with SavedTensors(exclude=list(block.parameters())) as s:
        X = block(X, src_mask=mask, is_causal=True)
    print(
        f"block {l}: {fmt(s.total_bytes, 0)} bytes, formula {fmt(per_block, 0)}",
        "✓" if s.total_bytes == per_block else "✗",
    )

for n_layers in range(1, 5):
    c = GPTConfig(
        vocab_size=V, n_ctx=64, d_model=d, n_heads=H, n_layers=n_layers, d_ff=d_ff
    )
    m = TinyGPT(c, seed=0)
    with SavedTensors(exclude=list(m.parameters())) as s:
        m(idx)
    f = activation_bytes_formula(B, N, d, H, n_layers, d_ff, 4, head=True)
    print(
        f"{n_layers} blocks: measured {fmt(s.total_bytes, 0)}, formula {fmt(f, 0)}",
        "✓" if s.total_bytes == f else "✗",
    )

# %% [markdown]
# Every block adds the same 26784 bytes, $B N (8d + H + 4 + 2d_\text{ff}) \cdot 4$, and the
# formula is exact for every term, no approximation. Its scope: dropout 0 (dropout adds its
# masks), pre-norm blocks as `nn.TransformerEncoderLayer` builds them, and PyTorch's CPU
# attention kernel. CUDA's fused attention kernels keep their own bookkeeping (the log-sum-exp
# in their own layout, a random-number seed for dropout), so the $H$ term can differ a little
# there; we have not measured it (the pages are executed on a CPU).
#
# ## 2. The $N^2$ term
#
# The kernel above never materialises the $(B, H, N, N)$ attention matrix. The textbook
# composition $\mathrm{softmax}(QK^\top/\sqrt d)\,V$ (chapter 6, and PyTorch's own "math" attention backend) keeps
# $P$: $H \cdot N$ more elements per token, so $B H N^2$ per block. Forcing that backend, the
# same measurement gives:

# %%
for n_tok in (12, 24):
    ids = torch.randint(0, V, (B, n_tok), generator=torch.Generator().manual_seed(1))
    with (
        sdpa_kernel(SDPBackend.MATH),
        SavedTensors(exclude=list(gpt4.parameters())) as s,
    ):
        gpt4(ids)
    f = activation_bytes_formula(
        B, n_tok, d, H, 4, d_ff, 4, attention="math", head=True
    )
    print(
        f"math attention, N={n_tok}: measured {fmt(s.total_bytes, 0)},"
        f" formula {fmt(f, 0)}",
        "✓" if s.total_bytes == f else "✗",
    )

# %% [markdown]
# The math backend also keeps scaled copies of $Q$ and $K^\top$ ($2d$) and the merged output
# ($d$): $10d + H N$ per token for attention and the rest, against $8d + H$ for the fused kernel.
# The quadratic part takes over once $H N$ exceeds the rest of the per-token cost,
# $N^* = (10d + 4 + 2 d_\text{ff})/H$. For a GPT-2-small-sized stack
# ($d = 768$, $H = 12$, $d_\text{ff} = 3072$, 12 blocks, $B = 8$, float16):

# %% mystnb={"image": {"alt": "Activation memory in GiB against the sequence length N for a GPT-2-small-sized stack in float16: attention's math path, which stores the N \u00d7 N weights, against the fused kernel."}}
d_, H_, f_, L_, B_ = 768, 12, 3072, 12, 8
Ns = [128 * 2**k for k in range(7)]  # 128 .. 8192
math_GiB = [
    activation_bytes_formula(B_, n, d_, H_, L_, f_, 2, attention="math") / 2**30
    for n in Ns
]
fused_GiB = [activation_bytes_formula(B_, n, d_, H_, L_, f_, 2) / 2**30 for n in Ns]
P_GiB = [L_ * B_ * H_ * n * n * 2 / 2**30 for n in Ns]
show("N* = (10d + 4 + 2 d_ff)/H", (10 * d_ + 4 + 2 * f_) / H_, 1)
for n, a, b, p in zip(Ns, math_GiB, fused_GiB, P_GiB):
    print(
        f"N={n:5d}: math {fmt(a, 2):>8s} GiB (P's share {fmt(100 * p / a, 1):>5s}%),"
        f" fused {fmt(b, 2):>6s} GiB"
    )

fig, ax = plt.subplots(figsize=(6, 3.6))
ax.loglog(Ns, math_GiB, "o-", label="math attention (keeps P)")
ax.loglog(Ns, P_GiB, "--", label="of which P: L·B·H·N²·2")
ax.loglog(Ns, fused_GiB, "s-", label="fused attention (no P)")
ax.set_xlabel("sequence length N")
ax.set_ylabel("activations kept, GiB")
ax.set_title("12 blocks, d=768, H=12, B=8, float16")
ax.legend()
plt.show()

# %% [markdown]
# Beyond $N^* = 1152.3$ the attention matrices are more than half of everything kept: 78.0% at
# $N = 4096$, where the math stack keeps 46.13 GiB and the fused one 9.01 GiB. The fused line
# stays linear in $N$. That is why attention kernels that never store $P$ (chapter 10) matter
# more than any other memory trick for long sequences. Everything else is linear in $N$ and
# in the number of layers, and that is what checkpointing attacks.
#
# ## 3. Gradient checkpointing, by hand
#
# Idea: in the forward pass run each block under `torch.no_grad()`, so nothing inside it is
# kept, and keep only the block's input. In backward, run the block's forward again, this time
# with grad on, and backpropagate through that fresh little graph. One extra forward per block
# buys memory of $L$ block inputs plus one block's activations at a time.
#
# A first version, straight from that description:


# %%
class FirstCheckpoint(torch.autograd.Function):
    """y = fn(x, *params), keeping only x; backward recomputes fn, differentiates it."""

    @staticmethod
    def forward(fn, x, *params):
        with torch.no_grad():
            return fn(x, *params)

    @staticmethod
    def setup_context(ctx, inputs, output):
        fn, x, *params = inputs
        ctx.fn = fn
        ctx.save_for_backward(x, *params)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, *params = ctx.saved_tensors
        needs = ctx.needs_input_grad[1:]  # one flag for x, one per parameter
        # Fresh leaves sharing x's and θ's memory; only those that need a gradient
        # require one.
        leaves = [t.detach().requires_grad_(n) for t, n in zip((x, *params), needs)]
        with torch.enable_grad():
            y = ctx.fn(*leaves)  # the forward again, now with a graph
        got = iter(
            torch.autograd.grad(y, [t for t, n in zip(leaves, needs) if n], grad_y)
        )
        return (None, *(next(got) if n else None for n in needs))


def ffn(x, W1, b1, W2, b2):
    """y = x + GELU(x W1ᵀ + b1) W2ᵀ + b2."""
    # (B, N, d) @ (d, f) @ (f, d) -> (B, N, d)
    return x + nn.functional.gelu(x @ W1.T + b1) @ W2.T + b2


W1, b1 = (
    randn(d_ff, d, seed=1, dtype=F64, device=dev) / math.sqrt(d),
    randn(d_ff, seed=2, dtype=F64, device=dev),
)
W2, b2 = (
    randn(d, d_ff, seed=3, dtype=F64, device=dev) / math.sqrt(d_ff),
    randn(d, seed=4, dtype=F64, device=dev),
)
ffn_params = [p.requires_grad_() for p in (W1, b1, W2, b2)]
x = randn(B, N, d, seed=5, dtype=F64, device=dev, requires_grad=True)
g_ref = torch.autograd.grad((ffn(x, *ffn_params) ** 2).sum(), [x, *ffn_params])
g_ours = torch.autograd.grad(
    (FirstCheckpoint.apply(ffn, x, *ffn_params) ** 2).sum(), [x, *ffn_params]
)
for name, a, b in zip(["x", "W1", "b1", "W2", "b2"], g_ours, g_ref):
    compare(f"grad_{name}, checkpointed vs plain", a, b, atol=1e-12, rtol=0)

# %% [markdown]
# Same gradients. The tolerance is `atol 1e-12, rtol 0` in float64: backward recomputes the very
# same operations in the same order, so the results are bit-identical in practice; 1e-12 is the
# promise, round-off of a reordered sum would be about 1e-15. `ctx.needs_input_grad` (one flag
# per input of `forward`) keeps the re-run from differentiating what nobody asked for: a data
# input or a frozen weight becomes a leaf without `requires_grad`, and its gradient is `None`.
# `@once_differentiable` says this backward is not itself differentiated (no double backward),
# as in chapter 4.
#
# **Why the weights are inputs of the Function.** Autograd asks a Function for the gradients of
# its *inputs*, nothing else. Write the block as a closure over its weights and autograd sees a
# function of $x$ alone:


# %%
class ClosureCheckpoint(torch.autograd.Function):
    """Broken on purpose: fn captures the weights, so backward returns only grad_x."""

    @staticmethod
    def forward(fn, x):
        with torch.no_grad():
            return fn(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.fn = inputs[0]
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        x_ = x.detach().requires_grad_()
        with torch.enable_grad():
            y = ctx.fn(x_)
        return None, torch.autograd.grad(y, x_, grad_y)[0]


for p in ffn_params:
    p.grad = None
y = ClosureCheckpoint.apply(lambda x: ffn(x, *ffn_params), x)
(y**2).sum().backward()
show("weights that received a gradient", sum(p.grad is not None for p in ffn_params), 0)
show("weights in the block", len(ffn_params), 0)

# %% [markdown]
# No error, no warning, zero of four weights get a gradient: the optimizer would skip them and
# the block would never learn. (Inside backward the weights *are* differentiated, but
# `autograd.grad` was asked for $x$ only.) `torch.utils.checkpoint` solves the same problem
# differently: its non-reentrant version hooks into saved tensors instead of being a Function.
#
# ### The RNG: dropout must draw the same mask twice
#
# With dropout in the block, the recomputation draws a new random mask, unless the random
# generator is put back where it was before the forward. The course's version
# (`helpers.checkpoint`) saves the CPU and CUDA RNG states before the forward and restores them
# (inside `torch.random.fork_rng`, so training's random stream is not disturbed) for the re-run:

# %% tags=["nbval-ignore-output"]
print(inspect.getsource(recompute_backward))
print(inspect.getsource(Checkpoint))

# %% [markdown]
# `checkpoint_module(block, x)` turns an `nn.Module` into such a function of $(x, \theta)$
# with `torch.func.functional_call`, and `checkpoint_sequential(blocks, x)` checkpoints every
# block. Gradients of a 3-block stack with dropout 0.3, each run started from the same seed:


# %%
def stack(dropout, dtype, n_layers=3, seed=0, device=dev):
    """n_layers pre-norm TransformerEncoderLayers (GELU, batch_first), seeded."""
    torch.manual_seed(seed)
    return nn.ModuleList(
        nn.TransformerEncoderLayer(
            d,
            H,
            d_ff,
            dropout=dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
            dtype=dtype,
        )
        for _ in range(n_layers)
    ).to(device)


def run(blocks, x, mode, **kw):
    """The stack's output with no checkpointing, torch.utils.checkpoint, or ours."""
    if mode == "ours":
        return checkpoint_sequential(blocks, x, **kw)
    h = x
    for b in blocks:
        h = b(h) if mode == "none" else tuc.checkpoint(b, h, use_reentrant=False, **kw)
    return h


def grads(blocks, x, mode, seed=123, **kw):
    """[∂L/∂x, ∂L/∂θ...] for L = Σ y², the RNG seeded first."""
    torch.manual_seed(seed)
    y = run(blocks, x, mode, **kw)
    return torch.autograd.grad((y * y).sum(), [x, *blocks.parameters()])


def agree(name, ga, gb):
    """One compare line for a whole list of gradients (atol 1e-12 in float64)."""
    return compare(
        name,
        torch.cat([g.flatten() for g in ga]),
        torch.cat([g.flatten() for g in gb]),
        atol=1e-12,
        rtol=0,
    )


blocks = stack(dropout=0.3, dtype=F64)
x = randn(B, N, d, seed=6, dtype=F64, device=dev, requires_grad=True)
ref = grads(blocks, x, "none")
show("gradient tensors (x and every parameter)", len(ref), 0)
agree("ours, RNG restored vs no checkpointing", grads(blocks, x, "ours"), ref)
agree("torch.utils.checkpoint vs no checkpointing", grads(blocks, x, "torch"), ref)
_ = agree(
    "ours, RNG NOT restored vs no checkpointing",
    grads(blocks, x, "ours", preserve_rng_state=False),
    ref,
)

# %% [markdown]
# With the RNG restored, all 37 gradients (the input and 36 parameter tensors) agree with the
# un-checkpointed run; `torch.utils.checkpoint` agrees as well. Without the restore, backward
# differentiates a network with *different* dropout masks than the one that produced the loss:
# the gradients are simply wrong, and nothing crashes. `tests/test_checkpoint.py` checks both.
#
# **Autocast is state too.** Under `torch.autocast` the forward's matmuls run in bfloat16 (or
# float16), but backward runs outside the caller's autocast region: a re-run that does not
# re-enter it recomputes in float32 and differentiates a different function from the one that
# produced the output. `checkpoint` therefore records the autocast settings next to the RNG
# state (`get_autocast_state`) and re-enters them for the re-run (`autocast_from`), as
# `torch.utils.checkpoint` does. On the CPU in bfloat16:

# %%
# x, W1, b1, W2, b2
ffn32 = [t.detach().to(cpu, torch.float32).requires_grad_() for t in (x, *ffn_params)]


def grads_autocast(apply):
    """∂L/∂(x, W1, b1, W2, b2), flat, L = Σ y², y = apply(ffn, ...) in bf16 autocast."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = apply(ffn, *ffn32)
    return torch.cat(
        [g.flatten() for g in torch.autograd.grad((y.float() ** 2).sum(), ffn32)]
    )


ref_ac = grads_autocast(lambda f, *a: f(*a))
compare(
    "bf16 autocast: ours vs no checkpointing",
    grads_autocast(checkpoint),
    ref_ac,
    exact=True,
)
compare(
    "bf16 autocast: torch.utils.checkpoint vs none",
    grads_autocast(lambda f, *a: tuc.checkpoint(f, *a, use_reentrant=False)),
    ref_ac,
    exact=True,
)
# The bug: Checkpoint without the autocast state (None) re-runs ffn in float32.
_ = compare(
    "bf16 autocast: re-run outside autocast vs none",
    grads_autocast(lambda f, x, *p: Checkpoint.apply(f, None, None, x, *p)),
    ref_ac,
    atol=2e-2,
    rtol=2e-2,
)

# %% [markdown]
# Ours and PyTorch's agree with the un-checkpointed run bit for bit: the re-run repeats the
# forward's bfloat16 operations in the same order. Re-run in float32, the gradients miss even
# bfloat16's tolerance (`atol = rtol = 2e-2`, a few steps of its 7 stored mantissa bits): they
# are the gradients of another function. `tests/test_checkpoint.py` checks both on a block stack.
#
# ### What it saves, and what it costs
#
# Bytes kept for backward by a 4-block stack in float32 ($B=2$, $N=12$, $d=24$), parameters
# excluded, counted on the CPU:

# %%
blocks32 = stack(dropout=0.0, dtype=torch.float32, n_layers=4, device=cpu)
x32 = randn(B, N, d, seed=7, requires_grad=True)
kept = {}
for mode in ("none", "torch", "ours"):
    with SavedTensors(exclude=list(blocks32.parameters())) as s:
        run(blocks32, x32, mode)
    kept[mode] = s.total_bytes
    print(
        f"{mode:>5s}: {fmt(s.total_bytes, 0):>6s} bytes in {fmt(s.count, 0):>2s}"
        " tensors"
        f" ({fmt_bytes(s.total_bytes)})"
    )
show("one block input, B·N·d·4", B * N * d * 4, 0)
show("4 block inputs", 4 * B * N * d * 4, 0)
show("no checkpointing / checkpointing", kept["none"] / kept["ours"], 2)
show("formula (8d + H + 4 + 2 d_ff)/d", (8 * d + H + 4 + 2 * d_ff) / d, 2)

# %% [markdown]
# Both checkpointed versions keep exactly the four block inputs (2304 bytes each), 11.62 times
# less than the 107136 bytes without checkpointing; the ratio is the formula's per-token count
# over $d$, here $(8d + H + 4 + 2d_\text{ff})/d$. Backward still needs one block's activations at
# a time, while that block is recomputed: the peak is the kept inputs **plus one block**, not
# the kept inputs alone.
#
# The cost is one more forward per block. Time for forward + backward, interleaved in one run
# (it varies from machine to machine, so it is printed with `[this run]`):

# %%
blocks_t = stack(dropout=0.0, dtype=torch.float32, n_layers=4, device=dev)
x_t = randn(4, 64, d, seed=8, device=dev, requires_grad=True)
times = {m: [] for m in ("none", "torch", "ours")}
for rep in range(6):
    for mode in times:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = run(blocks_t, x_t, mode)
        torch.autograd.grad((y * y).sum(), [x_t, *blocks_t.parameters()])
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if rep > 0:  # the first round warms up
            times[mode].append(time.perf_counter() - t0)
med = {m: sorted(t)[len(t) // 2] for m, t in times.items()}
varies(
    f"fwd+bwd: none {1e3 * med['none']:.1f} ms,"
    f" torch.utils.checkpoint {med['torch'] / med['none']:.2f}x,"
    f" ours {med['ours'] / med['none']:.2f}x"
)

# %% [markdown]
# Expect about $1.3\times$ on a large model where matmuls dominate: backward costs about two
# forwards, so one extra forward is $(1 + 2 + 1)/(1 + 2)$. On tiny blocks on a CPU, Python
# overhead and small kernels blur that; `benchmarks/checkpoint_cpu.py` measures a larger stack.
#
# On a GPU the peak memory itself can be measured (`torch.cuda.max_memory_allocated`); it is
# printed with `[this run]` because it depends on the allocator and the kernels:

# %%
if torch.cuda.is_available():
    peaks = {}
    blocks_g = stack(dropout=0.0, dtype=torch.float32, n_layers=8, device=dev)
    x_g = randn(8, 256, d, seed=9, device=dev, requires_grad=True)
    for mode in ("none", "ours"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y = run(blocks_g, x_g, mode)
        torch.autograd.grad((y * y).sum(), [x_g, *blocks_g.parameters()])
        peaks[mode] = torch.cuda.max_memory_allocated() - base
        del y
    varies(
        f"CUDA peak above baseline: none {fmt_bytes(peaks['none'])},"
        f" ours {fmt_bytes(peaks['ours'])}"
    )
else:
    varies("no GPU here: CUDA peak memory not measured")

# %% [markdown]
# **Seed 000's numbers.** It reports gradient checkpointing on a BERT-base at batch 16 as
# "1.2 GB → 0.7 GB, 18% slower" and, elsewhere, "40% less memory, 25% slower". On memory the
# two agree:

# %%
show("seed: 1 − 0.7/1.2 (memory saved)", 1 - 0.7 / 1.2, 3)

# %% [markdown]
# 41.7% less, the "40%". On time they do not (18% against 25%), and neither says what was
# measured. What the formula says for a 12-block pre-norm stack of BERT-base's size
# ($d = 768$, $H = 12$, $d_\text{ff} = 3072$) at $B = 16$, $N = 512$ in float32, dropout 0,
# fused attention:

# %%
full = activation_bytes_formula(16, 512, 768, 12, 12, 3072, 4)
inputs = 12 * 16 * 512 * 768 * 4
one_block = block_activation_bytes(16, 512, 768, 12, 3072, 4)
show("kept, no checkpointing, GiB", full / 2**30, 3)
show("kept, checkpointing every block (12 inputs), GiB", inputs / 2**30, 3)
show("one block's activations, GiB", one_block / 2**30, 3)
show("checkpointed peak: inputs + one block, GiB", (inputs + one_block) / 2**30, 3)
show("checkpointed peak / full", (inputs + one_block) / full, 3)

# %% [markdown]
# Checkpointing every block keeps 0.281 GiB plus 0.375 GiB for the block being recomputed,
# 0.657 GiB against 4.506 GiB, a ratio of 0.146: about 85% less *activation* memory. Neither of
# the seed's figures fits these shapes: activations alone are already 4.506 GiB without
# checkpointing, so its 1.2 GB (and any total that includes those activations) cannot describe
# this model at this batch; they come from other shapes or were not measured. What the formula
# says is that checkpointing removes most of the activation memory, while a figure read off the
# GPU also counts weights, gradients, optimizer state and the allocator's cache, which
# checkpointing does not shrink. (With math attention or
# dropout the absolute numbers grow, and the saving with them.) The time cost is one extra
# forward per block, measured above and in the benchmark, not a fixed 18% or 25%.
#
# The seed also lists memory fixes by "level". Level 1 is `torch.cuda.empty_cache()`: it frees
# no live activation, it only hands blocks that PyTorch's caching allocator holds *unused*
# back to the driver (useful to other processes, not to the tensors of this training step).
# Level 2 is checkpointing, this section. Level 3 is `torch.compile` together with
# `torch.backends.cuda.enable_mem_efficient_sdp(True)`: the memory-efficient SDPA backend is a
# tiled attention that never stores $P$, which is chapter 10's subject, and it is already on
# unless someone turned it off:

# %%
show(
    "torch.backends.cuda.mem_efficient_sdp_enabled()",
    int(torch.backends.cuda.mem_efficient_sdp_enabled()),
    0,
)
show(
    "torch.backends.cuda.flash_sdp_enabled()",
    int(torch.backends.cuda.flash_sdp_enabled()),
    0,
)

# %% [markdown]
# (1 = on; on a CPU these flags only record the choice.) `torch.compile` (the seed adds that
# `mode="max-autotune"` wants `seq_len` to be a multiple of 128, which we have not checked)
# fuses kernels and is outside this course; none of the seed's numbers for these levels were
# measured here, so we do not repeat them.
#
# ## 4. Mixed precision: fewer bytes, fewer numbers
#
# Halving every activation is the other big lever: float16 and bfloat16 use 2 bytes. What
# they can represent (`torch.finfo`; "tiny" is the smallest *normal* number, below it the
# subnormals go down to tiny·eps):


# %%
def sci(v):
    """v as mantissa e exponent via fmt (whole numbers below 10⁶ as they are)."""
    if v >= 1 and v < 1e6 and v == int(v):
        return fmt(v, 0)
    e = math.floor(math.log10(abs(v)))
    return f"{fmt(v / 10**e, 3)}e{e}"


print(
    f"{'dtype':<9s} {'bits':>4s} {'max':>10s} {'tiny':>10s} {'subnormal':>10s}"
    f" {'eps':>10s}   {'log2: tiny, subnormal, eps':>26s}"
)
for r in float_format_table():
    logs = ", ".join(fmt(math.log2(r[k]), 0) for k in ("tiny", "subnormal", "eps"))
    print(
        f"{r['dtype']:<9s} {r['bits']:>4d} {sci(r['max']):>10s} {sci(r['tiny']):>10s} "
        f"{sci(r['subnormal']):>10s} {sci(r['eps']):>10s}   {logs:>26s}"
    )

# %% [markdown]
# float16 has 10 stored mantissa bits (+1 implicit) and 5 exponent bits: fine steps
# ($2^{-10}$) but a short range, nothing above 65504 and nothing below
# $2^{-24} \approx 5.96 \times 10^{-8}$. bfloat16 keeps float32's 8 exponent bits (same range,
# up to $3.4\times10^{38}$) and only 7 stored mantissa bits (+1 implicit; steps of $2^{-7}$).
# bfloat16 rarely overflows or underflows, so it needs no loss scaling; but bfloat16 tensor
# cores arrived with Ampere (sm_80). **Colab's free T4 is sm_75**: it has no bfloat16 tensor
# cores (how fast bfloat16 runs there we have not measured), so the course uses float16 with
# loss scaling on a T4.
#
# All cells of this section run on the CPU: they are about number formats, and CPU arithmetic
# gives the same digits everywhere.
#
# ### Overflow: logits above 65504

# %%
# two rows of logits, float32
z = torch.tensor([[120.0, 30.0, -5.0], [70000.0, 2.0, 1.0]])
target = torch.tensor([0, 0])
show("logits in float16", z.half(), 1)
show("exp(11) in float16", torch.exp(torch.tensor(11.0, dtype=torch.float16)), 1)
show("exp(12) in float16", torch.exp(torch.tensor(12.0, dtype=torch.float16)), 1)
show("ln 65504: largest x with exp(x) finite", math.log(65504), 4)


def ce_by_hand(z):
    """Per row −log softmax(z)[target] = logsumexp(z) − z[target], in z's dtype."""
    m = z.max(-1, keepdim=True).values
    lse = m.squeeze(-1) + torch.log(torch.exp(z - m).sum(-1))
    return lse - z.gather(-1, target[:, None]).squeeze(-1)


show("CE per row, float32", ce_by_hand(z), 4)
show("CE per row, float16", ce_by_hand(z.half()), 4)

# %% [markdown]
# The second row's logit 70000 is already `inf` when cast to float16, and `inf − inf` is NaN:
# the loss is NaN, and so will be every gradient. Subtracting the max does not help once the
# number itself is gone; in float16 even `exp(12)` overflows (162755 > 65504). That is why
# `torch.autocast` runs `softmax`, `log_softmax` and `cross_entropy` in float32 while it runs
# matmuls in float16, and why logits should be kept in float32 (or `cross_entropy` given
# float16 logits, which it upcasts).
#
# ### LayerNorm's eps in float16 (seed 000)
#
# The seed changed `eps=1e-12` to `1e-5` and says the float16 run stopped failing. First, what
# 1e-12 *is* in float16:

# %%
show("float16(1e-12)", torch.tensor(1e-12, dtype=torch.float16), 4)
show("float16(1e-5) × 1e6", torch.tensor(1e-5, dtype=torch.float16).float() * 1e6, 4)
show("smallest float16 subnormal × 1e8", 2.0**-24 * 1e8, 4)

# %% [markdown]
# 1e-12 is far below the smallest float16 subnormal ($5.96\times10^{-8}$) and rounds to exactly
# 0; 1e-5 survives as a subnormal (10.0136e-6). A LayerNorm computed *in float16* (every
# operation in the tensor's dtype, chapter 4's `helpers.functions.layernorm_forward`) then multiplies
# by $1/\sqrt{\sigma^2 + 0}$. A row with zero variance (a padding row, a saturated activation) gives
# $0 \cdot \infty$:

# %%
row = torch.full((1, 8), 3.0, dtype=torch.float16)  # constant: σ² = 0
show("by hand, fp16, eps=1e-12", layernorm_forward(row, None, None, eps=1e-12)[0], 4)
show("by hand, fp16, eps=1e-5 ", layernorm_forward(row, None, None, eps=1e-5)[0], 4)
show("F.layer_norm, fp16, eps=1e-12", nn.functional.layer_norm(row, (8,), eps=1e-12), 4)

# %% [markdown]
# NaN for the whole row with eps = 0; zeros with 1e-5. PyTorch's own `F.layer_norm` does not
# fail: its kernels compute $\mu$ and $\sigma^2$ in float32 even for float16 input, and `autocast` runs
# LayerNorm in float32 anyway. So the NaN needs a LayerNorm that does its arithmetic in float16
# (hand-written ones, some fused kernels), but the tiny eps hurts even in PyTorch's kernel when
# a row's variance is tiny, not zero. A row that differs from constant by one float16 step:

# %%
near = torch.tensor(
    [[1.0, 1.0, 1.0, 1.0 + 2**-10, 1.0, 1.0, 1.0, 1.0]], dtype=torch.float16
)
var = near.float().var(-1, unbiased=False)
show("σ² of the row × 1e8", var * 1e8, 4)
for eps in (1e-12, 1e-5):
    show(
        f"F.layer_norm fp16, eps={eps:g}",
        nn.functional.layer_norm(near, (8,), eps=eps),
        4,
    )
    show(f"1/√(σ² + eps), eps={eps:g}", 1 / torch.sqrt(var + eps), 1)
    # Under a loss scale S = 2¹⁶, an upstream gradient g becomes
    # S·g·(1/√(σ² + eps)) in this backward: it overflows float16 once
    # |g| > 65504 / (S / √(σ² + eps)).
    show(
        f"largest |g| that survives ×2¹⁶ and this factor, × 1e4, eps={eps:g}",
        65504 / (2.0**16 / torch.sqrt(var + eps)) * 1e4,
        3,
    )

# %% [markdown]
# With eps = 1e-12 a difference of one rounding step ($2^{-10}$) is blown up to a value of
# 2.6465: rounding noise becomes a unit-variance signal. LayerNorm's backward multiplies the
# incoming gradient by the same $1/\sqrt{\sigma^2+\epsilon}$, here 3096.3, against 314.6 with
# eps = 1e-5. Under a loss scale of $2^{16}$, an upstream gradient of about
# $3.228 \times 10^{-4}$ or more can overflow float16 in this backward (it is multiplied by that
# factor after LayerNorm subtracts its mean and its projection on $\hat x$, so not every such
# gradient does), against $31.772 \times 10^{-4}$ with eps = 1e-5: the scaler has to skip steps
# until it runs at a scale smaller by the ratio of those two limits. A larger eps bounds both. We cannot check the seed's "62% → 78% accuracy"; we can check the mechanism,
# and it is real.
#
# ### Underflow: small gradients vanish, loss scaling brings them back
#
# Gradients are often tiny: a loss averaged over many tokens, small weights downstream. A
# one-layer model run in float16 from float32 "master" weights (what autocast does: cast the
# weights per operation, keep the parameters in float32), with a loss whose gradients are
# around 1e-8:


# %%
def fp16_forward_loss(W, b, x, t, c):
    """L = c · Σ (tanh(x Wᵀ + b) − t)², layer in fp16 from fp32 weights; L in fp32."""
    # (n, 4) @ (4, 3) -> (n, 3), float16
    h = torch.tanh(x.half() @ W.half().T + b.half())
    return c * ((h.float() - t) ** 2).sum()


W = randn(3, 4, seed=10, requires_grad=True)
b = randn(3, seed=11, requires_grad=True)
xb, tb = randn(16, 4, seed=12), randn(16, 3, seed=13)
c = 1e-9  # makes ∂L/∂h ~ 1e-9..1e-8
h32 = torch.tanh(xb @ W.T + b)
g32 = torch.autograd.grad(c * ((h32 - tb) ** 2).sum(), [W, b])  # float32 reference
g16 = torch.autograd.grad(fp16_forward_loss(W, b, xb, tb, c), [W, b])
S = 2.0**16
g16s = torch.autograd.grad(S * fp16_forward_loss(W, b, xb, tb, c), [W, b])
g16u = [g / S for g in g16s]
show("grad_W, float32 × 1e8", g32[0] * 1e8, 4)
show("grad_W, float16, no scaling × 1e8", g16[0] * 1e8, 4)
show("grad_W, float16, scaled by 2^16 then unscaled × 1e8", g16u[0] * 1e8, 4)
show(
    "fraction of float16 gradient entries that are exactly 0, unscaled",
    sum(int((g == 0).sum()) for g in g16) / sum(g.numel() for g in g16),
    4,
)
compare("scaled float16 grad_W vs float32", g16u[0], g32[0], atol=0, rtol=2e-2)
_ = compare("unscaled float16 grad_W vs float32", g16[0], g32[0], atol=0, rtol=2e-2)

# %% [markdown]
# Without scaling, the gradient of $h$ (about 1e-9 per entry) is below float16's smallest
# subnormal and becomes 0: the float16 gradients are exactly zero, every entry, and the
# weights would never move. Multiplying the loss by $S = 2^{16}$ moves every gradient into
# float16's range; dividing by $S$ afterwards, in float32, gives back the float32 gradient to
# within float16's precision (the `rtol 2e-2` is about 20 float16 steps of $2^{-10}$: room for
# the rounding gathered over 16 rows).
#
# Too large a scale overflows instead: gradients become `inf`. The rule `torch.amp.GradScaler`
# follows, written out in `helpers.precision`:
#
# 1. compute the gradients of $S \cdot L$;
# 2. unscale: $g \leftarrow g / S$ (in float32), and check every $g$ for inf/NaN;
# 3. if any: **skip** the optimizer step and halve $S$; else step, and after 2000 clean steps
#    in a row double $S$.

# %% tags=["nbval-ignore-output"]
print(inspect.getsource(loss_scale_step))

# %% [markdown]
# Our loop against `GradScaler` (on the CPU, SGD, starting scale $2^{16}$, growth interval 3 so
# that growth shows up in a few steps), same data, same float16 forward, loss summed so that
# large scales overflow:

# %%
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16, growth_interval=3)
W_ref, b_ref = (
    randn(3, 4, seed=20, requires_grad=True),
    randn(3, seed=21, requires_grad=True),
)
opt = torch.optim.SGD([W_ref, b_ref], lr=0.01)
W_us, b_us = (
    W_ref.detach().clone().requires_grad_(),
    b_ref.detach().clone().requires_grad_(),
)
state = ScalerState(scale=2.0**16, growth_interval=3)
for step in range(10):
    xs, ts = 3 * randn(16, 4, seed=100 + step), randn(16, 3, seed=200 + step)
    opt.zero_grad()
    scaler.scale(fp16_forward_loss(W_ref, b_ref, xs, ts, 1.0)).backward()
    scaler.step(opt)
    scaler.update()
    scaled = torch.autograd.grad(
        state.scale * fp16_forward_loss(W_us, b_us, xs, ts, 1.0), [W_us, b_us]
    )
    state, stepped = loss_scale_step([W_us, b_us], scaled, state, lr=0.01)
    same = (
        torch.equal(W_us, W_ref)
        and torch.equal(b_us, b_ref)
        and state.scale == scaler.get_scale()
    )
    verdict = "step   " if stepped else "SKIPPED"
    print(
        f"step {step}: {verdict}  scale now {fmt(state.scale, 0):>6s}  "
        f"GradScaler's {fmt(scaler.get_scale(), 0):>6s}  weights identical: {same}"
    )

# %% [markdown]
# At $2^{16}$ the gradients of the summed loss overflow float16, so the first steps are skipped
# and the scale halves each time, until the gradients fit; after three clean steps it doubles
# again. Our weights and scale equal GradScaler's bit for bit at every step. What GradScaler adds
# is engineering: the check runs on the device without a CPU sync per tensor, it works with any
# optimizer (`scaler.step(opt)`), and `scaler.unscale_(opt)` lets you clip gradients by their
# true norm before stepping.
#
# bfloat16 does not need any of this: its range is float32's, so $10^{-9}$ is an ordinary
# number, and 70000 too. What it gives up is precision:

# %%
for v in (1e-12, 1e-9, 70000.0):
    show(
        f"bfloat16({v:g}) / {v:g}", torch.tensor(v, dtype=torch.bfloat16).float() / v, 4
    )
show(
    "bfloat16(1 + 2^-9) - 1",
    torch.tensor(1 + 2**-9, dtype=torch.bfloat16).float() - 1,
    4,
)
show(
    "float16(1 + 2^-9) - 1 × 1e3",
    (torch.tensor(1 + 2**-9, dtype=torch.float16).float() - 1) * 1e3,
    4,
)

# %% [markdown]
# Each lands within bfloat16's precision (7 stored mantissa bits + 1 implicit) of the true
# value, but $1 + 2^{-9}$ rounds to 1 in
# bfloat16, while float16 keeps it (1.9531e-3). That is why both formats keep a float32 copy of
# the weights: an update smaller than $2^{-8}$ of a weight would vanish in bfloat16.
#
# ## Summary
#
# * Autograd keeps, per pre-norm block and token, $8d + H + 4 + 2d_\text{ff}$ numbers with
#   PyTorch's fused CPU attention and GELU; measured and formula agree to the byte, layer by
#   layer. The residual adds keep nothing; the FFN's $d_\text{ff}$-wide tensors are the biggest
#   linear term.
# * Attention that stores $P$ adds $H N$ per token, $BHN^2$ per block, which dominates beyond
#   $N^* = (10d + 4 + 2d_\text{ff})/H$ (1152.3 for GPT-2-small sizes). Fused kernels drop it.
# * Gradient checkpointing keeps only each block's input and recomputes the block in backward:
#   memory falls to $L$ inputs plus one block, time rises by one forward per block.
# * A checkpoint Function must take the weights as inputs (or their gradients silently vanish),
#   restore the RNG (or dropout gradients are silently wrong) and re-enter the forward's
#   autocast (or the re-run is in float32 and the gradients belong to another function).
# * float16: max 65504, nothing below $2^{-24}$; keep softmax and the loss in float32, use an
#   eps float16 can represent, scale the loss and skip steps on inf. bfloat16 has float32's
#   range and 7 stored mantissa bits (+1 implicit); on a T4 (sm_75) use float16.
#
# ## Common mistakes
#
# * **Closing over the weights in a checkpoint Function.** Only inputs get gradients; the
#   weights' `.grad` stays `None` with no error.
# * **Not restoring the RNG state.** The recomputed dropout mask differs from the forward's, and
#   the gradients belong to a different network.
# * **Recomputing outside autocast.** Backward does not run inside the caller's
#   `torch.autocast`; a checkpoint that does not record and re-enter it recomputes in float32.
# * **Expecting checkpointing's memory to be "inputs only".** The block being recomputed needs
#   its full activations during backward; the peak is inputs plus one block.
# * **Quoting memory or speed without saying what was measured.** Batch, length, dtype,
#   attention kernel and dropout all change the answer; the formula makes them explicit.
# * **`eps=1e-12` (or any eps below $6\times10^{-8}$) in float16 arithmetic.** It is 0.
# * **Casting float32 logits to float16 before the loss.** Anything above 65504 becomes `inf`,
#   the loss NaN.
# * **Unscaling the gradients twice, or clipping them before unscaling.** Clip after
#   `scaler.unscale_(opt)`, against the true gradient norm.
#
# **Lab.** [Lab 9: memory, checkpointing and mixed precision](../labs/lab09_memory_checkpointing.ipynb).
