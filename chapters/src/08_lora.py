# %% [markdown]
# # 8. LoRA from the gradient up
#
# [LoRA](../pages/glossary.md#term-LoRA) (low-rank adaptation) fine-tunes a big frozen [weight](../pages/glossary.md#term-weight) matrix $W$ by learning a small
# correction next to it:
#
# $$\begin{gathered}
# W' = W + \frac{\alpha}{r}\,BA,\qquad W\in\mathbb R^{\text{out}\times\text{in}}\ \text{frozen}, \\
# B\in\mathbb R^{\text{out}\times r},\quad A\in\mathbb R^{r\times\text{in}},\quad r\ll\min(\text{in},\text{out}).
# \end{gathered}$$
#
# This chapter builds it from the gradient up: first the gradients of $A$ and $B$, then a
# backward pass that never forms $W'$, then a module, its initialisation and scaling, and
# finally a fine-tuning run of chapter 7's small GPT, LoRA against full fine-tuning.
#
# **Learning goals.** After this chapter you can
#
# 1. derive $\partial L/\partial B$ and $\partial L/\partial A$ from $\partial L/\partial W'$, and
#    rewrite them so that neither $W'$ nor $\partial L/\partial W'$ is ever formed;
# 2. write LoRA as a `torch.autograd.Function` and a `LoRALinear` module around an existing
#    `nn.Linear`, and test every gradient against plain autograd;
# 3. explain what a frozen base (`requires_grad=False`) does and does not save, and measure it;
# 4. explain why $B = 0$ makes the adapted model start equal to the base, why then
#    $\partial L/\partial A = 0$ at step 0, and what the other initialisations do;
# 5. say how $\alpha/r$ (and rsLoRA's $\alpha/\sqrt r$) interacts with the [learning rate](../pages/glossary.md#term-learning-rate) when $r$
#    changes, and merge an adapter into $W$ for inference;
# 6. put adapters on the Q and V projections of a Transformer and compare LoRA with full
#    fine-tuning in loss, parameters, [optimizer](../pages/glossary.md#term-optimizer) memory and time.
#
# The starting point is seed 003, a Chinese blog post that derives LoRA's gradients inside a
# hand-written Transformer backward. Its formulas are right; several of its statements and code
# sketches are not, and we point each out where it comes up: here the swapped initialisation,
# the frozen weight that gets a gradient (and is not even frozen) and a gradient check that
# passes even when the backward does nothing; in chapters 6 and 7 its einops "trick", its attention sketch and its claim about
# where the parameters are. It writes layers as $XW$ with $W$ of shape (in, out); the course uses
# `nn.Linear`'s layout, $y = xW^\top + b$ with $W$ of shape (out, in). The product $BA$ has the
# shape of $W$ in both layouts, so the gradient formulas for $A$ and $B$ read the same.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import copy
import inspect
import math
import re
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import gradcheck

from helpers.checks import compare
from helpers.device import get_device, no_tf32, randn
from helpers.memory import SavedTensors, fmt_bytes
from helpers.show import fmt, show, varies

dev = get_device()
no_tf32()  # TF32 would change the last digits of fp32 matmuls on Ampere+ GPUs
F64 = torch.float64
if dev.type == "cpu":
    # tiny tensors: one thread beats the cost of sharing work between threads
    torch.set_num_threads(1)

# %% [markdown]
# ## 1. The gradients of $A$ and $B$, from $\partial L/\partial W'$
#
# Write $s = \alpha/r$. For a batch of rows $x$ (R × in), the layer computes
# $y = xW'^\top + b$. Chapter 4 gave the weight gradient of a linear layer:
# $\partial L/\partial W' = g^\top x$ (out × in), with $g = \partial L/\partial y$ (R × out).
# $W'$ depends on $B$ and $A$ through the product $s\,BA$, and chapter 2's rule for a product
# $Y = PQ$ ($dP = dY\,Q^\top$, $dQ = P^\top dY$) gives seed 003's formulas, with our scale:
#
# $$\begin{aligned}
# \frac{\partial L}{\partial B} &= s\,\frac{\partial L}{\partial W'}A^\top && (\text{out}\times r), \\
# \frac{\partial L}{\partial A} &= s\,B^\top\frac{\partial L}{\partial W'} && (r\times\text{in}).
# \end{aligned}$$
#
# (Seed 003 writes $W_Q' = W_Q + BA$ with no scale, i.e. $s = 1$.) Let us check them on a
# small layer, with a non-zero $B$ as after some training, so that every term shows.

# %%
d_in, d_out, r, alpha = 5, 4, 2, 4.0
s = alpha / r
W = randn(d_out, d_in, seed=1, dtype=F64, device=dev)  # (out, in), frozen
A = randn(r, d_in, seed=2, dtype=F64, device=dev)  # (r, in)
B = randn(d_out, r, seed=3, dtype=F64, device=dev)  # (out, r)
x = randn(6, d_in, seed=4, dtype=F64, device=dev)  # (R, in): 6 rows
g = randn(6, d_out, seed=5, dtype=F64, device=dev)  # some ∂L/∂y, (R, out)

grad_Wp = g.T @ x  # ∂L/∂W': (out, R) @ (R, in) -> (out, in)
grad_B_seed = s * grad_Wp @ A.T  # (out, in) @ (in, r) -> (out, r)
grad_A_seed = s * B.T @ grad_Wp  # (r, out) @ (out, in) -> (r, in)

A_, B_ = A.clone().requires_grad_(), B.clone().requires_grad_()
y = x @ (W + s * B_ @ A_).T  # plain autograd on W' = W + s·BA
y.backward(g)
show("∂L/∂B", grad_B_seed)
compare("∂L/∂B = s·(∂L/∂W') Aᵀ vs autograd", grad_B_seed, B_.grad)
_ = compare("∂L/∂A = s·Bᵀ(∂L/∂W') vs autograd", grad_A_seed, A_.grad)

# %% [markdown]
# Both agree bit for bit here (max|Δ| 0.0e+00); another device may sum in another order and
# differ by round-off, about 1e-15. The tolerance is `compare`'s float64 default (atol 1e-10,
# rtol 1e-8), loose on purpose: far above round-off and far below any real mistake, which
# changes a gradient in its first digits.
#
# ## 2. The cheaper route: never form $W'$ or $\partial L/\partial W'$
#
# The formulas above go through $\partial L/\partial W'$, an out × in matrix: exactly the size
# of the weight we froze to save memory. Substitute $\partial L/\partial W' = g^\top x$ and
# regroup the products:
#
# $$\begin{aligned}
# \frac{\partial L}{\partial B} &= s\,g^\top x A^\top = s\,g^\top\,(xA^\top), \\
# \frac{\partial L}{\partial A} &= s\,B^\top g^\top x = s\,(gB)^\top x, \\
# \frac{\partial L}{\partial x} &= gW + s\,(gB)\,A.
# \end{aligned}$$
#
# The forward pass reads the same way: $y = xW^\top + b + s\,(xA^\top)B^\top$. The LoRA path is
# $x \to xA^\top \to (xA^\top)B^\top$, and its backward only needs $x$ (which the layer has
# anyway), the **r-dimensional** activation $xA^\top$ (R × r) and the small matrices.


# %%
def lora_backward_1(x, W, A, B, xA, g, s):
    """∂L/∂B = s·gᵀ(xAᵀ), ∂L/∂A = s·(gB)ᵀx, ∂L/∂x = gW + s·(gB)A, for 2-D x and g."""
    gB = g @ B  # (R, out) @ (out, r) -> (R, r)
    grad_B = s * (g.T @ xA)  # (out, R) @ (R, r) -> (out, r)
    grad_A = s * (gB.T @ x)  # (r, R) @ (R, in) -> (r, in)
    grad_x = g @ W + s * (gB @ A)  # (R, out) @ (out, in) + (R, r) @ (r, in) -> (R, in)
    return grad_x, grad_A, grad_B


xA = x @ A.T  # (R, in) @ (in, r) -> (R, r)
grad_x_1, grad_A_1, grad_B_1 = lora_backward_1(x, W, A, B, xA, g, s)
compare("cheap ∂L/∂B vs the route through ∂L/∂W'", grad_B_1, grad_B_seed)
compare("cheap ∂L/∂A vs the route through ∂L/∂W'", grad_A_1, grad_A_seed)
_ = compare("cheap ∂L/∂x vs g·W'", grad_x_1, g @ (W + s * B @ A))

# %% [markdown]
# What does it buy? Count multiply–adds and the memory of the biggest temporary for one
# layer of a 7B-class model (in = out = 4096), R = 4096 tokens in the batch, r = 8.

# %%
n_in = n_out = 4096
R_tok, r_big = 4096, 8
# gᵀx, then (∂L/∂W')Aᵀ and Bᵀ(∂L/∂W')
via_Wp = n_out * R_tok * n_in + 2 * n_out * n_in * r_big
# gB, gᵀ(xAᵀ), (gB)ᵀx
cheap = R_tok * n_out * r_big + n_out * R_tok * r_big + r_big * R_tok * n_in
show("multiply-adds via ∂L/∂W' (×1e9)", via_Wp / 1e9, 1)
show("multiply-adds, cheap route (×1e9)", cheap / 1e9, 2)
show("ratio", via_Wp / cheap, 0)
print("biggest temporary via ∂L/∂W':", fmt_bytes(n_out * n_in * 4), "(fp32)")
print(
    "biggest temporary, cheap route:", fmt_bytes(R_tok * r_big * 4), "(xAᵀ or gB, fp32)"
)

# %% [markdown]
# The route through $\partial L/\partial W'$ costs 69.0 billion multiply–adds per layer, the
# cheap route 0.40 billion: 171 times fewer. And the biggest temporary shrinks from
# 64.0 MiB to 128.0 KiB. (The frozen layer's own $gW$ for $\partial L/\partial x$ is needed
# by both routes and left out of the count.)
#
# ## 3. The Function and the module
#
# `helpers.lora` packages the cheap route as `LoRALinearFunction` in the course's form:
# `forward` + `setup_context`, the backward math in a plain function
# (`lora_linear_backward`), every gradient gated on `ctx.needs_input_grad`, and
# `@once_differentiable`. `forward` also returns $xA^\top$, marked non-differentiable, so that
# `setup_context` can save it without recomputing it; the wrapper `lora_linear` drops it.
# One input needs a word first: `x_lora` is the adapter's own input when LoRA's dropout is on
# (the `dropout` argument of `LoRALinear`, as in the LoRA paper; it acts on the adapter path
# only, never on the frozen base).
# Then $\partial L/\partial A$ needs the dropped-out $x_l$ and the LoRA term of $\partial L/\partial x$
# goes to `x_lora`; with dropout 0 it is `None` and $x_l = x$. Here is what it saves:

# %% tags=["nbval-ignore-output"]
from helpers.lora import (
    LoRALinear,
    LoRALinearFunction,
    lora_linear,
    lora_linear_backward,
)

print(inspect.getsource(LoRALinearFunction.setup_context))

# %% [markdown]
# (This listing is read from `helpers/lora.py` as it is now, so the notebook tests do not compare
# it: a comment edited there must not fail this page.)
# When $W$ is frozen, `needs_input_grad` for $W$ is `False`: $x$ is not kept for a weight
# gradient, and $\partial L/\partial W$ is never computed (it is only formed if someone asks,
# i.e. for a trainable base). The plain function agrees with our derivation, and `gradcheck`
# compares the whole Function with finite differences in float64:

# %%
grad_x_h, _, _, grad_A_h, grad_B_h, _, _ = lora_linear_backward(
    g, x, W, A, B, xA, s, needs=(True, False, False, True, True, False, False)
)
compare("helpers' ∂L/∂A vs lora_backward_1", grad_A_h, grad_A_1)
compare("helpers' ∂L/∂B vs lora_backward_1", grad_B_h, grad_B_1)
compare("helpers' ∂L/∂x vs lora_backward_1", grad_x_h, grad_x_1)

args = [t.clone().requires_grad_() for t in (x, A, B)]
print(
    "gradcheck (x, A, B; W frozen):",
    gradcheck(lambda x_, A_, B_: lora_linear(x_, W, None, A_, B_, alpha, r), args),
)
args = [t.clone().requires_grad_() for t in (x, W, A, B)]
print(
    "gradcheck (x, W, A, B; W trainable):",
    gradcheck(lambda x_, W_, A_, B_: lora_linear(x_, W_, None, A_, B_, alpha, r), args),
)

# %% [markdown]
# `LoRALinear` wraps an existing `nn.Linear`: it sets `requires_grad=False` on the base's
# weight and bias, creates `lora_A` (r × in) and `lora_B` (out × r), and calls the Function.
# Our correctness bar: its output and every gradient equal plain autograd on the
# explicitly formed $W + (\alpha/r)BA$ in float64 to 1e-12. That is a thousand times above the
# round-off of sums of a few dozen O(1) float64 products (about 1e-15) and far below any real
# mistake (a missing $\alpha/r$ changes the gradients in the first digit).

# %%
base = nn.Linear(16, 8).to(device=dev, dtype=F64)
lora = LoRALinear(base, r=4, alpha=8.0, seed=0)
print(lora)
with torch.no_grad():  # a trained-looking B, so every term counts
    lora.lora_B.copy_(randn(8, 4, seed=6, dtype=F64, device=dev))
# (batch, tokens, in)
X = randn(3, 5, 16, seed=7, dtype=F64, device=dev, requires_grad=True)
G = randn(3, 5, 8, seed=8, dtype=F64, device=dev)
lora(X).backward(G)

A_ref = lora.lora_A.detach().clone().requires_grad_()
B_ref = lora.lora_B.detach().clone().requires_grad_()
X_ref = X.detach().clone().requires_grad_()
W_prime = base.weight + lora.scale * B_ref @ A_ref  # (out, r) @ (r, in) -> (out, in)
y_ref = X_ref @ W_prime.T + base.bias  # (3, 5, 16) @ (16, 8) -> (3, 5, 8)
y_ref.backward(G)
compare("LoRALinear output", lora(X), y_ref, atol=1e-12, rtol=0)
compare("∂L/∂x", X.grad, X_ref.grad, atol=1e-12, rtol=0)
compare("∂L/∂A", lora.lora_A.grad, A_ref.grad, atol=1e-12, rtol=0)
_ = compare("∂L/∂B", lora.lora_B.grad, B_ref.grad, atol=1e-12, rtol=0)

# %% [markdown]
# ## 4. The frozen base: no weight gradient at all
#
# `requires_grad=False` on $W$ does not mean "compute the gradient and throw it away":
# autograd never computes it. After `backward()` the base weight has no `.grad`, yet the
# input gradient still flows *through* $W$ (it is $gW + s\,(gB)A$), so layers below keep
# learning.

# %%
print("base.weight.requires_grad:", base.weight.requires_grad)
print("base.weight.grad is None:", base.weight.grad is None)
print("base.bias.grad is None:", base.bias.grad is None)
_ = compare(
    "∂L/∂x = G·W' (flows through the frozen W)",
    X.grad,
    G @ W_prime.detach(),
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# What does freezing save? Take two 256 × 256 layers with a GELU between them, on a batch of
# R = 1024 rows whose input requires a gradient (as anywhere but the first layer), and
# measure three versions: everything trainable, everything frozen, and frozen with LoRA
# (r = 8) on both layers. `SavedTensors` (chapter 3) counts the bytes kept for backward,
# parameters and the input excluded.


# %%
def two_layers(mode):
    """Linear → GELU → Linear, 256 wide; mode 'trainable', 'frozen' or 'lora' (r=8)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256)).to(dev)
    if mode != "trainable":
        net.requires_grad_(False)
    if mode == "lora":
        net[0] = LoRALinear(net[0], r=8, alpha=16.0, seed=1)
        net[2] = LoRALinear(net[2], r=8, alpha=16.0, seed=2)
    return net


X2 = randn(1024, 256, seed=9, device=dev, requires_grad=True)  # (R, in)
stats = {}
for mode in ("trainable", "frozen", "lora"):
    net = two_layers(mode)
    with SavedTensors(exclude=list(net.parameters()) + [X2], by_op=True) as saved:
        L = net(X2).sum()  # sum saves nothing: only the layers' tensors count
    L.backward()
    grad_bytes = sum(
        p.grad.numel() * p.grad.element_size()
        for p in net.parameters()
        if p.grad is not None
    )
    stats[mode] = (saved.total_bytes, grad_bytes)
    print(
        f"{mode:9s}  saved for backward {fmt_bytes(saved.total_bytes):>9s}   "
        f"parameter gradients {fmt_bytes(grad_bytes):>9s}"
    )
    X2.grad = None

# %% [markdown]
# Frozen layers keep 1.0 MiB instead of 2.0 MiB: a linear layer saves its input only to
# compute $\partial L/\partial W = g^\top x$, and nobody asks for that any more (what is left is
# the GELU's input). They also allocate no parameter gradients (0 B instead of 514.0 KiB).
# With LoRA the input is saved again, now for $\partial L/\partial A = s\,(gB)^\top x$, plus the
# small $xA^\top$: activation memory is back to 2.1 MiB. **LoRA does not save activation memory**;
# what it saves is every $\partial L/\partial W$ (here 514.0 KiB become 32.0 KiB of adapter
# gradients), and, below, the optimizer state. Time per forward + backward:


# %%
def time_fwd_bwd(net, reps=10):
    """Seconds per forward + backward of net on X2 (after 2 warm-up steps)."""
    for _ in range(2):
        net(X2).sum().backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        net(X2).sum().backward()
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


nets = {mode: two_layers(mode) for mode in ("trainable", "frozen", "lora")}
samples = {mode: [] for mode in nets}
for _ in range(7):  # interleaved, so all three see the same machine load
    for mode, net in nets.items():
        samples[mode].append(time_fwd_bwd(net, reps=3))
times = {mode: sorted(v)[len(v) // 2] for mode, v in samples.items()}  # median
for mode, t in times.items():
    varies(f"{mode:9s} {t * 1e3:.2f} ms per forward + backward")
varies(
    f"frozen / trainable = {times['frozen'] / times['trainable']:.2f}, "
    f"lora / trainable = {times['lora'] / times['trainable']:.2f}"
)

# %% [markdown]
# The frozen version skips the $g^\top x$ matmul of each layer, about a third of a linear
# layer's forward + backward work. LoRA adds six thin matmuls per layer back ($xA^\top$, its
# product with $B^\top$, $gB$, $(gB)A$ and the two adapter gradients), each with one dimension
# equal to $r = 8$. Their FLOPs are small (about $r/\text{out} = 3\%$ of a full
# one each), but each still reads or writes a whole $R\times 256$ activation, and on a CPU such
# memory-bound products run far below the machine's matmul speed: in the run printed above (on
# the machine that built this page), the LoRA version gives back everything freezing saved and
# costs about as much as full training (`lora / trainable`), not less.
# LoRA's savings are memory (weight gradients and optimizer state, below), not time per step at
# this size; the `[this run]` lines vary from machine to machine and run to run.
#
# **Seed 003's `manual_backward`** ends with `self.W_Q.grad = dL_dW_Q_prime  # 原始参数梯度`
# ("the original parameter's gradient"). In LoRA the base is frozen: it has no gradient, and
# giving it one is a bug, not bookkeeping. If $W_Q$ is in an optimizer (or weight decay
# touches it), the "frozen" weight moves; if it is not, a full out × in gradient was computed
# and stored for nothing, which is the memory LoRA exists to avoid. The correct backward
# returns `None` for a frozen $W$, as `LoRALinearFunction` does (it forms $g^\top x$ only when
# $W$ requires a gradient, i.e. for a trainable base).
#
# Two more things in the same seed code. Its `LoRATransformerLayer` does not freeze $W_Q$ at all:
# `self.W_Q = nn.Parameter(torch.randn(d_model, d_model))` has `requires_grad=True`, so plain
# autograd gives it a full gradient too; freezing takes `requires_grad_(False)` (what
# `LoRALinear` does to the base). And its gradient check (section 4.2) runs `loss1.backward()`,
# keeps `auto_grad = W_Q.grad.clone()`, then runs `manual_backward()` and compares
# `W_Q.grad.clone()` with it. If `manual_backward` wrote nothing, `W_Q.grad` would still hold
# autograd's gradient and the assert would pass: a check that passes even when the backward does
# nothing, on the one weight
# that should have no gradient. Compare tensors your backward *returns* (as every `compare`
# here does) with `torch.autograd.grad`'s, never `.grad` buffers a previous backward filled.
#
# ## 5. Initialisation: A random, B = 0
#
# `LoRALinear` initialises $A$ Kaiming-uniform with $a=\sqrt5$ (nn.Linear's own init, as the
# reference implementations loralib and PEFT do: uniform on $\pm 1/\sqrt{\text{in}}$) and
# $B = 0$. Then $BA = 0$: the adapted model starts *exactly* equal to the base.

# %%
base = nn.Linear(16, 8).to(device=dev, dtype=F64)
lora = LoRALinear(base, r=4, alpha=8.0, seed=0)
x5 = randn(32, 16, seed=10, dtype=F64, device=dev)
show("max |A|", lora.lora_A.abs().max())
show("1/√in", 1 / math.sqrt(16))
show("max |B|", lora.lora_B.abs().max())
_ = compare("adapted vs base output at init", lora(x5), base(x5), exact=True)

# %% [markdown]
# Bit for bit: the LoRA term adds exactly $0$ to `F.linear`'s result. At step 0 the two
# gradients are very different. With $B = 0$:
# $\partial L/\partial A = s\,(gB)^\top x = 0$, while $\partial L/\partial B = s\,g^\top(xA^\top) \ne 0$.

# %%
teacher = randn(8, 16, seed=11, dtype=F64, device=dev) / 4  # the layer we want to reach
y5 = x5 @ teacher.T


def step0_grads(A0, B0):
    """‖∂L/∂A‖, ‖∂L/∂B‖ at A = A0, B = B0 for the MSE to the teacher's outputs."""
    with torch.no_grad():
        lora.lora_A.copy_(A0)
        lora.lora_B.copy_(B0)
    lora.zero_grad()
    F.mse_loss(lora(x5), y5).backward()
    return lora.lora_A.grad.norm(), lora.lora_B.grad.norm()


A_kaiming = lora.lora_A.detach().clone()
B_gauss = randn(8, 4, seed=12, dtype=F64, device=dev) * 0.02
zero_A, zero_B = torch.zeros_like(A_kaiming), torch.zeros_like(B_gauss)
inits = {
    "A random, B = 0 (LoRA)": (A_kaiming, zero_B),
    "A = 0, B random (seed 003's prose)": (zero_A, B_gauss),
    "A = 0, B = 0": (zero_A, zero_B),
}
for name, (A0, B0) in inits.items():
    gA, gB_ = step0_grads(A0, B0)
    print(f"{name:36s} ‖∂L/∂A‖ = {fmt(gA, 6)}   ‖∂L/∂B‖ = {fmt(gB_, 6)}")

# %% [markdown]
# With LoRA's choice, $\lVert\partial L/\partial A\rVert = 0.000000$ and
# $\lVert\partial L/\partial B\rVert = 0.444021$ at step 0: only $B$ moves
# first, and once $B \ne 0$ the gradient of $A$ switches on.
#
# **Seed 003's prose has it backwards.** Its tips say "矩阵A通常初始化为0，B用高斯初始化"
# (A is usually initialised to 0 and B Gaussian), while its own code does
# `self.B = zeros(d_model, r)`, `self.A = randn(r, d_model)`: the LoRA paper's choice
# (A Gaussian there, Kaiming-uniform in the reference code; B zero). The prose's choice is not
# fatal, though. It is the mirror image: $BA = 0$ still, so the model still starts at the base,
# and now $\partial L/\partial B = s\,g^\top(xA^\top) = 0$ while
# $\partial L/\partial A = s\,(gB)^\top x \ne 0$ (0.074264 above): $A$ moves first, then $B$.
# Zero for both is the real failure: *both* gradients contain the other matrix as a factor,
# so both are 0 at step 0, nothing moves, and they are 0 at every later step too. $A = B = 0$
# is a saddle point that gradient descent never leaves. Sixty Adam steps of each:

# %% mystnb={"image": {"alt": "Training loss over sixty Adam steps for each initialisation of LoRA's A and B; with both at zero the loss never moves."}}
curves = {}
for name, (A0, B0) in inits.items():
    with torch.no_grad():
        lora.lora_A.copy_(A0)
        lora.lora_B.copy_(B0)
    opt = torch.optim.Adam([lora.lora_A, lora.lora_B], lr=1e-2)
    curves[name] = []
    for _ in range(60):
        L = F.mse_loss(lora(x5), y5)
        opt.zero_grad()
        L.backward()
        opt.step()
        curves[name].append(L.item())
    both_zero = bool(lora.lora_A.abs().max() == 0 and lora.lora_B.abs().max() == 0)
    print(
        f"{name:36s} loss {fmt(curves[name][0], 4)} -> {fmt(curves[name][-1], 4)};"
        f" still A = B = 0: {both_zero}"
    )

fig, ax = plt.subplots(figsize=(6, 3))
for name, c in curves.items():
    ax.plot(c, label=name, lw=2, ls="--" if "= 0, B = 0" in name else "-")
ax.set_xlabel("Adam step")
ax.set_ylabel("MSE to the teacher")
ax.legend(fontsize=9)
fig.tight_layout()
plt.show()

# %% [markdown]
# Both one-sided initialisations train (the loss falls from 1.3738 to 0.2657 and 0.2608 in
# 60 steps); zero-for-both stays at 1.3738 with $A$ and $B$ still exactly zero.
#
# ## 6. The scale $\alpha/r$, rsLoRA's $\alpha/\sqrt r$, and the learning rate
#
# Why a scale at all? With Adam, each step moves every entry of $A$ and $B$ by about the
# learning rate, whatever the size of its gradient. So the update of $W' $ is
# $\Delta W = s\,BA$ with $B$ and $A$ moving at a fixed pace, and $s$ decides how big that is.
# The LoRA paper uses $s = \alpha/r$ so that, at fixed $\alpha$, changing $r$ "roughly" needs
# no new learning rate. Let us measure: one 64 × 64 layer, a regression target, Adam at
# lr 1e-3, $\alpha = 8$, and the size $\|\Delta W\|_F = \|s\,BA\|_F$ after 1 and 20 steps, for
# each rank, with $s = \alpha/r$ and with rsLoRA's $s = \alpha/\sqrt r$.

# %%

X6 = randn(256, 64, seed=13, device=dev)
Y6 = X6 @ (randn(64, 64, seed=14, device=dev) / 8).T
ranks = (1, 2, 4, 8, 16, 32, 64)
dW = {}
for rs in (False, True):
    for steps in (1, 20):
        row = []
        for rk in ranks:
            lin = nn.Linear(64, 64, bias=False).to(dev)
            with torch.no_grad():
                lin.weight.copy_(randn(64, 64, seed=15, device=dev) / 8)
            m = LoRALinear(lin, rk, alpha=8.0, rslora=rs, seed=16)
            opt = torch.optim.Adam([m.lora_A, m.lora_B], lr=1e-3)
            for _ in range(steps):
                L = F.mse_loss(m(X6), Y6)
                opt.zero_grad()
                L.backward()
                opt.step()
            row.append(m.delta_weight().norm().item())
        dW[(rs, steps)] = row
print("r:                 " + " ".join(f"{rk:>7d}" for rk in ranks))
for (rs, steps), row in dW.items():
    print(
        f"{'α/√r' if rs else 'α/r '}, {steps:2d} step{'s' if steps > 1 else ' '}:  "
        + " ".join(f"{fmt(v, 4):>7s}" for v in row)
    )

# %% mystnb={"image": {"alt": "Log-log plot of \u2016\u0394W\u2016 after Adam steps against the rank r, with the \u03b1/r and the \u03b1/\u221ar scaling, after one step and after more."}}
fig, ax = plt.subplots(figsize=(6, 3))
for (rs, steps), row in dW.items():
    ax.loglog(
        ranks,
        row,
        "o-" if rs else "s--",
        label=f"{'α/√r' if rs else 'α/r'}, {steps} step(s)",
    )
ax.set_xlabel("rank r")
ax.set_ylabel("‖ΔW‖ after Adam steps")
ax.legend(fontsize=9)
fig.tight_layout()
plt.show()

# %% [markdown]
# With $\alpha/r$, the first update shrinks as the rank grows: 0.0373 at r = 1, 0.0060 at
# r = 64, about $1/\sqrt r$ (B's $r$ new columns add up like random vectors, $\sqrt r$, while $s$
# falls like $1/r$). So at fixed $\alpha$ and learning rate, a larger rank *learns more
# slowly* at the start, and raising $r$ calls for a larger $\alpha$ or learning rate. rsLoRA's
# $\alpha/\sqrt r$ cancels the $\sqrt r$: the first update stays between 0.0372 and 0.0477 across
# ranks 1 to 64, so a learning rate tuned at one rank carries over. Neither is "right"; the
# point is that $\alpha$, $r$ and the learning rate are not independent knobs: keep two fixed
# when you tune the third. (Seed 003's tip that LoRA parameters usually want a larger learning
# rate than full fine-tuning is right, and section 9 uses 1e-2 against 1e-3.)
#
# ## 7. Merge and unmerge
#
# For inference, fold the adapter into the weight once, $W \leftarrow W + s\,BA$, and the layer
# is a plain linear layer again: no extra matmuls and no extra latency. `unmerge()` subtracts
# it back, for example to switch to another adapter.

# %%
base = nn.Linear(64, 32).to(dev)
m = LoRALinear(base, r=4, alpha=8.0, seed=0)
with torch.no_grad():
    m.lora_B.copy_(randn(32, 4, seed=17, device=dev) * 0.1)
x7 = randn(16, 64, seed=18, device=dev)
W_before = base.weight.detach().clone()
y_unmerged = m(x7)
m.merge()
y_merged = m(x7)
compare("merged vs unmerged output (fp32)", y_merged, y_unmerged)
m.unmerge()
_ = compare("W after merge + unmerge vs original W (fp32)", base.weight, W_before)

# %% [markdown]
# Both agree within float32's default tolerance (atol 1e-5, rtol 1e-4): merging changes the
# order of the additions ($x(W + s\,BA)^\top$ against $xW^\top + s\,(xA^\top)B^\top$), and
# $(W + \Delta W) - \Delta W$ is not bit-exactly $W$ in floating point. That is why a careful
# implementation keeps the adapter separate until it really wants a merged copy.
#
# ## 8. Adapters on Q and V of chapter 7's attention
#
# The LoRA paper puts adapters on the query and value projections. Chapter 7's `TinyGPT` is
# built from `nn.TransformerEncoderLayer`, whose `nn.MultiheadAttention` keeps Q, K and V in
# **one packed** `in_proj_weight` of shape (3E, E): rows 0..E−1 are $W_Q$, then $W_K$, then
# $W_V$. One adapter on the packed matrix would have a $B$ with rows for K too and would couple
# the three. `LoRASelfAttention` (`helpers.lora_attention`) splits the packed matrix into three
# frozen `nn.Linear`s (`q_proj`, `k_proj`, `v_proj`, copies of the row blocks) plus `out_proj`,
# and wraps the chosen ones in `LoRALinear`; heads are split and merged, and the causal
# triangle built, by chapter 6's `split_heads`, `merge_heads` and `causal_mask`. It is a
# drop-in replacement for the layer's `self_attn`. (A side effect we want:
# `TransformerEncoderLayer`'s inference fast path reads the packed weights directly and would
# silently skip any adapter; it requires a packed projection, so it is off.) Putting adapters
# into a whole model, saving them and counting their cost is `helpers.lora_model`'s job.

# %%
from helpers.gpt import CharTokenizer, GPTConfig, TinyGPT, get_batch, load_corpus
from helpers.lora import merge_lora, unmerge_lora
from helpers.lora_model import (
    add_lora,
    add_lora_attention,
    load_lora_state_dict,
    lora_state_dict,
    optimizer_state_bytes,
    parameter_counts,
)
from helpers.train import eval_lm, lm_loss, train

text = load_corpus()
tok = CharTokenizer(text)
cfg = GPTConfig(
    vocab_size=tok.vocab_size, n_ctx=32, d_model=32, n_heads=4, n_layers=2, d_ff=128
)
gpt = TinyGPT(cfg, seed=0).to(dev)
print("packed in_proj_weight:", tuple(gpt.blocks[0].self_attn.in_proj_weight.shape))

probe = tok.encode(text[:64]).reshape(2, 32).to(dev)  # (B, N) token ids
logits_base = gpt(probe)
gpt_qv = copy.deepcopy(gpt)
add_lora_attention(gpt_qv, r=4, alpha=16.0, targets=("q", "v"))
print(gpt_qv.blocks[0].self_attn)
_ = compare("TinyGPT, Q/V adapters vs none, at init", gpt_qv(probe), logits_base)
print("trainable:")
for pname, param in gpt_qv.named_parameters():
    if param.requires_grad:
        print("  ", pname)

# %% [markdown]
# The split attention calls `F.scaled_dot_product_attention` where `nn.MultiheadAttention`
# runs its own code, so we ask for float32's default tolerance (atol 1e-5, rtol 1e-4), not bit
# equality, although on this CPU they happen to agree exactly. Only the eight adapter matrices
# train.
#
# ## 9. Fine-tuning chapter 7's GPT: LoRA against full fine-tuning
#
# **Pretraining.** 300 Adam steps on the course's corpus (batches of 16 windows of 32
# characters), with the course's one training loop, `helpers.train.train` (zero_grad →
# forward → backward → step; chapter 11 takes it apart). `lm_loss` is the next-token
# cross-entropy over every position; `fine_tune` gives Adam only the parameters that train.


# %%
def fine_tune(model, data, steps, lr, seed, desc):
    """Adam on the trainable parameters, lm_loss on 16 windows per step (seed + s)."""
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    # idx, targets (16, n_ctx)
    batch_at = lambda s: get_batch(data, 16, cfg.n_ctx, seed=seed + s, device=dev)
    t0 = time.perf_counter()
    hist = train(
        opt,
        batch_at,
        steps,
        loss_fn=lambda idx, targets: lm_loss(model, idx, targets),
        progress=False,
    )
    L = hist["loss"]
    print(
        f"{desc}: {steps} steps, loss {fmt(L[0], 2)} at the first,"
        f" {fmt(sum(L[-10:]) / 10, 2)} over the last 10"
    )
    return {
        "losses": hist["loss"],
        "optimizer": opt,
        "seconds": time.perf_counter() - t0,
    }


data = tok.encode(text)
torch.manual_seed(0)
gpt = TinyGPT(cfg, seed=0).to(dev)
pre = fine_tune(gpt, data, steps=300, lr=3e-3, seed=0, desc="pretrain")

# %% [markdown]
# **The shifted task.** The same text with every word spelled backwards ("The cat sat" →
# "ehT tac tas"): the same characters, but new spelling. We fine-tune on the first 85 % and
# measure on the last 15 %, which fine-tuning never sees.

# %%
rev = re.sub(r"[A-Za-z]+", lambda w: w.group(0)[::-1], text)
print(rev[:80])
cut = int(0.85 * len(rev))
ft_train, ft_held = tok.encode(rev[:cut]), tok.encode(rev[cut:])
show("pretraining loss, last 20 steps", sum(pre["losses"][-20:]) / 20, 2)
show("pretrained model on the original text", eval_lm(gpt, data, n_ctx=cfg.n_ctx), 2)
show(
    "pretrained model on held-out reversed text",
    eval_lm(gpt, ft_held, n_ctx=cfg.n_ctx),
    2,
)
base_state = copy.deepcopy(gpt.state_dict())

# %% [markdown]
# Three fine-tunings of 100 steps from the same pretrained weights, on the same batches:
#
# * **full**: every parameter trains, Adam lr 1e-3;
# * **LoRA Q,V**: adapters of rank 4 ($\alpha = 16$) on Q and V of both blocks, lr 1e-2;
# * **LoRA all**: adapters of rank 4 on Q, K, V, the output projection and both FFN layers.


# %%
def fresh_gpt():
    """The pretrained TinyGPT, a new copy."""
    model = TinyGPT(cfg).to(dev)
    model.load_state_dict(base_state)
    return model


STEPS, R_MAIN, ALPHA_MAIN = 100, 4, 16.0
models = {"full": fresh_gpt(), "LoRA Q,V": fresh_gpt(), "LoRA all": fresh_gpt()}
add_lora_attention(models["LoRA Q,V"], r=R_MAIN, alpha=ALPHA_MAIN, targets=("q", "v"))
add_lora_attention(
    models["LoRA all"], r=R_MAIN, alpha=ALPHA_MAIN, targets=("q", "k", "v", "o")
)
add_lora(models["LoRA all"], ["linear1", "linear2"], r=R_MAIN, alpha=ALPHA_MAIN)
lrs = {"full": 1e-3, "LoRA Q,V": 1e-2, "LoRA all": 1e-2}

# %%
runs = {}
for name, model in models.items():
    runs[name] = fine_tune(model, ft_train, STEPS, lrs[name], seed=1000, desc=name)

# %% [markdown]
# (Losses after training are printed with two decimals: a GPU sums in another order, and a
# hundred Adam steps carry that round-off along.)

# %%
print(
    f"{'':10s} {'trainable':>10s} {'of total':>9s} {'grad bytes':>11s}"
    f" {'Adam state':>11s}  held-out loss"
)
table = {}
for name, model in models.items():
    c = parameter_counts(model)
    held = eval_lm(model, ft_held, n_ctx=cfg.n_ctx)
    table[name] = (c, held)
    share = fmt(100 * c["trainable"] / c["total"], 1)
    adam_bytes = fmt_bytes(optimizer_state_bytes(runs[name]["optimizer"]))
    print(
        f"{name:10s} {c['trainable']:>10d} {share:>8s}%"
        f" {fmt_bytes(c['trainable_bytes']):>11s} {adam_bytes:>11s}"
        f"  {fmt(held, 2)}"
    )
show(
    "Adam state, full / LoRA Q,V",
    optimizer_state_bytes(runs["full"]["optimizer"])
    / optimizer_state_bytes(runs["LoRA Q,V"]["optimizer"]),
    1,
)
for name, run in runs.items():
    varies(f"{name:9s} {1e3 * run['seconds'] / STEPS:.1f} ms per training step")

# %% mystnb={"image": {"alt": "Fine-tuning loss (running mean of 10 steps) for each way of fine-tuning, with the pretrained model's loss before fine-tuning as a dotted line."}}
fig, ax = plt.subplots(figsize=(6.5, 3.4))
smooth = lambda v, k=10: [
    sum(v[max(0, i - k + 1) : i + 1]) / len(v[max(0, i - k + 1) : i + 1])
    for i in range(len(v))
]
for name, run in runs.items():
    ax.plot(smooth(run["losses"]), lw=2, label=name)
ax.axhline(
    eval_lm(gpt, ft_held, n_ctx=cfg.n_ctx),
    color="0.5",
    ls=":",
    label="pretrained, before fine-tuning",
)
ax.set_xlabel("fine-tuning step")
ax.set_ylabel("training loss (running mean of 10)")
ax.legend(fontsize=9)
fig.tight_layout()
plt.show()

# %% [markdown]
# Read the table with the numbers it printed. Full fine-tuning trains all 29248 parameters
# and keeps 228.6 KiB of Adam state; LoRA on Q and V trains 1024 (3.4 % of its parameters,
# the frozen base and the adapters together: the table's "of total") with 8.0 KiB of Adam
# state, 28.5 times less. The pretrained model scores 3.79 on held-out reversed text. On this
# tiny model and a task this far from pretraining, full fine-tuning reaches the lowest
# held-out loss (2.31 against 2.59 for LoRA Q,V); adapters on every linear layer
# (LoRA all, 4608 parameters, 13.6 %) close most of the gap (2.39). At this size the time per
# step barely differs: the model is so small that a step is dominated by fixed overheads, not
# by the $g^\top x$ matmuls that freezing removes. In a 7B model, the parameter, gradient and
# Adam-state ratios above are what decides whether fine-tuning fits on a GPU at all.
#
# **Shipping the adapter.** `lora_state_dict` keeps only $A$ and $B$; loading it onto a fresh
# copy of the pretrained model reproduces the fine-tuned model exactly. Merging then folds
# $s\,BA$ into each adapted base weight, so every adapted layer runs as one matmul again; the
# modules keep $A$ and $B$ (so `unmerge_lora` can take them back out), and the output agrees
# with the unmerged model to float32 round-off.

# %%
sd = lora_state_dict(models["LoRA Q,V"])
print("adapter state dict:", *list(sd)[:4], "...", sep="\n  ")
print(
    "adapter bytes:",
    fmt_bytes(sum(t.numel() * t.element_size() for t in sd.values())),
    " full model bytes:",
    fmt_bytes(sum(t.numel() * t.element_size() for t in base_state.values())),
)
restored = fresh_gpt()
# other init
add_lora_attention(restored, r=R_MAIN, alpha=ALPHA_MAIN, targets=("q", "v"), seed=123)
load_lora_state_dict(restored, sd)
logits_ft = models["LoRA Q,V"](probe)
compare(
    "fresh base + loaded adapters vs fine-tuned", restored(probe), logits_ft, exact=True
)
merge_lora(restored)
compare("merged vs unmerged logits (fp32)", restored(probe), logits_ft)
_ = unmerge_lora(restored)

# %% [markdown]
# ## 10. Try it: rank and $\alpha$
#
# The panel fine-tunes the pretrained model with adapters on Q and V for the rank $r$ and
# $\alpha$ you choose (100 steps, lr 1e-2) and draws the loss curve, with full fine-tuning
# and LoRA all as dashed references; the title gives the trainable parameters and Adam's
# state. It needs a running kernel: open this chapter in Colab (or Jupyter) to use it. Runs
# not precomputed below take a few seconds each. On the website, the animation after it
# stands in: its slider steps through the six precomputed $(r, \alpha)$ pairs.

# %% tags=["nbval-ignore-output"]
from helpers.widgets_lora import lora_animation, lora_panel, lora_run

grid = [(rk, a) for a in (4.0, 16.0) for rk in (1, 4, 16)]
precomputed = {
    (R_MAIN, ALPHA_MAIN): {
        "r": R_MAIN,
        "alpha": ALPHA_MAIN,
        "losses": runs["LoRA Q,V"]["losses"],
        "trainable": table["LoRA Q,V"][0]["trainable"],
        "total": table["LoRA Q,V"][0]["total"],
        "opt_bytes": optimizer_state_bytes(runs["LoRA Q,V"]["optimizer"]),
    }
}
for rk, a in [k for k in grid if k not in precomputed]:
    precomputed[(rk, a)] = lora_run(
        cfg, base_state, ft_train, rk, a, steps=STEPS, lr=1e-2, seed=1000, device=dev
    )
reference = {"full": runs["full"]["losses"], "LoRA all": runs["LoRA all"]["losses"]}

# %%
print(
    f"{'r':>3s} {'α':>5s} {'α/r':>6s} {'trainable':>10s} {'Adam state':>11s}"
    "  loss, last 10 steps"
)
for rk, a in sorted(precomputed, key=lambda k: (k[1], k[0])):
    run = precomputed[(rk, a)]
    print(
        f"{rk:>3d} {fmt(a, 0):>5s} {fmt(a / rk, 2):>6s} {run['trainable']:>10d} "
        f"{fmt_bytes(run['opt_bytes']):>11s}  {fmt(sum(run['losses'][-10:]) / 10, 2)}"
    )

# %% tags=["nbval-ignore-output", "remove-cell"]
lora_panel(
    cfg,
    base_state,
    ft_train,
    ranks=(1, 2, 4, 8, 16),
    alphas=(4.0, 16.0),
    steps=STEPS,
    precomputed=precomputed,
    reference=reference,
    device=dev,
)

# %% tags=["nbval-ignore-output"]
from IPython.display import HTML

HTML(lora_animation(precomputed, reference).to_jshtml(default_mode="once"))

# %% [markdown]
# Trainable parameters and Adam's state grow linearly with $r$ (256 parameters per unit of
# rank here: 2 blocks × 2 adapters × (32 + 32)). In this run more rank helps at both values of
# $\alpha$ (last-10 loss 2.74 at $r = 1$ and 2.51 at $r = 16$ for $\alpha = 4$), and the 4× larger
# scale of $\alpha = 16$ helps at every rank (2.66, 2.52, 2.41), as a larger learning rate would:
# $\alpha$ and the learning rate play the same role, which is section 6's point.
#
# ## Summary
#
# * $W' = W + (\alpha/r)BA$ with $W$ frozen; $\partial L/\partial B = s\,(\partial L/\partial W')A^\top$
#   and $\partial L/\partial A = s\,B^\top(\partial L/\partial W')$, which regroup into
#   $s\,g^\top(xA^\top)$ and $s\,(gB)^\top x$: no out × in matrix is ever formed, only the
#   r-dimensional $xA^\top$ is saved, and $\partial L/\partial x = gW + s\,(gB)A$.
# * `LoRALinearFunction` / `LoRALinear` implement that route; output and every gradient match
#   plain autograd on $W'$ to 1e-12 in float64, and `gradcheck` passes.
# * A frozen base gets no gradient at all (`.grad` stays `None`) while the input gradient flows
#   through it. Freezing drops the saved input of plain linear layers, but a LoRA layer saves it
#   again for $\partial L/\partial A$: LoRA saves weight gradients and optimizer state, not
#   activations.
# * $A$ random and $B = 0$: the model starts equal to the base, $\partial L/\partial A = 0$ and
#   $\partial L/\partial B \ne 0$ at step 0. The mirror choice also trains; zero for both never
#   does.
# * With $s = \alpha/r$ and Adam, the first updates shrink like $1/\sqrt r$ as $r$ grows;
#   rsLoRA's $\alpha/\sqrt r$ keeps them about constant. Tune $r$, $\alpha$ and the learning
#   rate together.
# * Merge $W \leftarrow W + s\,BA$ for inference; unmerge gives $W$ back to round-off.
# * Adapters on Q and V of a packed `nn.MultiheadAttention` need the packed projection split.
#
# ## Common mistakes
#
# * Initialising both $A$ and $B$ to zero: both gradients are zero forever (a saddle point).
# * Swapping the roles in the prose but not the code, as seed 003 does ("A zero, B Gaussian"
#   against its `B = zeros`, `A = randn`): it still trains, but say what you do.
# * Giving the frozen base a gradient (seed 003's `self.W_Q.grad = dL_dW_Q_prime`), or leaving
#   it in the optimizer: weight decay or a stray gradient then moves the "frozen" weights.
# * Declaring the base as `nn.Parameter(...)` and calling it frozen: without `requires_grad_(False)`
#   autograd trains it (seed 003's `LoRATransformerLayer`).
# * Checking a backward by comparing `.grad` before and after it: if it writes nothing, the old
#   gradient is still there and the check passes. Compare returned tensors.
# * Computing the adapter gradients through $\partial L/\partial W'$: correct, but it costs the
#   full weight gradient LoRA is meant to avoid.
# * Forgetting $\alpha/r$ in the backward while the forward has it: every adapter gradient is off
#   by that factor (a test with `gradcheck` catches it at once).
# * Changing $r$ and keeping $\alpha$ and the learning rate: with $\alpha/r$ the effective step
#   size changes too.
# * Wrapping `nn.MultiheadAttention.out_proj` in a module: `MultiheadAttention` reads
#   `out_proj.weight` directly and never calls it, so the adapter is silently ignored
#   (`add_lora` refuses; `add_lora_attention` splits the attention instead).
# * Applying dropout to the base path: LoRA's dropout acts on the adapter's input only.
# * Expecting merge/unmerge to be bit-exact: $(W + \Delta W) - \Delta W \ne W$ in floating point.
#
# **Lab:** [Lab 8 — LoRA's Function, merge and unmerge](../labs/lab08_lora.ipynb).
