# %% [markdown]
# # 4. Custom autograd Functions: writing backward by hand
#
# Chapter 3 opened autograd up and looked at the graph it records. This chapter writes the
# nodes of that graph ourselves: `torch.autograd.Function`s whose `backward` we derive on paper
# and then check against PyTorch, number by number.
#
# **Learning goals.** After this chapter you can
#
# * write a `torch.autograd.Function` in the modern form (`forward` + `setup_context` +
#   `backward`), decide what to save, honour `ctx.needs_input_grad`, and say why `backward`
#   must never write into `grad_output`;
# * derive the backward of a linear layer, of softmax (its [Jacobian](../pages/glossary.md#term-Jacobian)
#   $\operatorname{diag}(p) - p p^\top$ and the cheap product $p \odot (g - \langle g, p\rangle)$),
#   and of [LayerNorm](../pages/glossary.md#term-layer-normalization) (the mean path and the variance path);
# * use `torch.autograd.gradcheck` to catch a plausible wrong backward, such as the
#   diagonal-only softmax derivative in seed 000's attention code;
# * explain why cross-entropy is computed from logits with log-sum-exp, and why its gradient
#   is $\operatorname{softmax}(z) - \text{onehot}(t)$ divided by the batch size;
# * build an MLP from your own Functions whose gradients equal `nn.Sequential`'s.
#
# The finished, tested versions live in `helpers/functions.py`; later chapters import them from there.

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

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck

import helpers.functions as hf
from helpers.checks import compare
from helpers.device import get_device, no_tf32, randn
from helpers.memory import tensor_bytes
from helpers.show import fmt_sci, show

dev = get_device()
# fp32 matmuls in true fp32 on GPUs: the comparisons below mean the same everywhere
no_tf32()

# %% [markdown]
# ## 1. Anatomy of an `autograd.Function`
#
# A Function has three static methods:
#
# | method | receives | does |
# | --- | --- | --- |
# | `forward(*inputs)` | the inputs, like a plain function | computes the output; runs with autograd *off*, so nothing inside is recorded |
# | `setup_context(ctx, inputs, output)` | the inputs and the output | stores on `ctx` what backward will need |
# | `backward(ctx, *grad_outputs)` | one gradient per output | returns one gradient per input (or `None`) |
#
# There are two ways to keep something for backward:
#
# * **tensors** go through `ctx.save_for_backward(...)` and come back in `ctx.saved_tensors`.
#   Autograd then checks that nobody modified them in place in between (the "version counter"
#   error of chapter 3, section 3.4), frees them after backward, and lets the hooks of chapter 3 see and count them;
# * **everything else** (a `dim`, an `eps`, a string) is an attribute: `ctx.dim = dim`.
#
# `ctx.needs_input_grad` is a tuple of booleans, one per input: a frozen weight or the targets
# of a loss need no gradient, so backward need not compute it (return `None` there).
#
# We start with a linear layer in `nn.Linear`'s layout, $y = x W^\top + b$ with $W$ of shape
# `(out, in)`. For one row, $y_o = \sum_i x_i W_{oi} + b_o$, so with the gradient
# $\partial L/\partial y$ arriving from above (`grad_y` in code)
#
# $$\begin{aligned}
# \frac{\partial L}{\partial x_i} &= \sum_o \frac{\partial L}{\partial y_o}\, W_{oi},
#   &&\text{i.e. } \frac{\partial L}{\partial x} = \frac{\partial L}{\partial y}\, W; \\
# \frac{\partial L}{\partial W_{oi}} &= \sum_{\text{rows}} \frac{\partial L}{\partial y_o}\, x_i,
#   &&\text{i.e. } \frac{\partial L}{\partial W} = \Big(\frac{\partial L}{\partial y}\Big)^{\!\top} x; \\
# \frac{\partial L}{\partial b_o} &= \sum_{\text{rows}} \frac{\partial L}{\partial y_o} .
# \end{aligned}$$
#
# The sum over the batch in $\partial L/\partial W$ comes from the matmul. Every gradient has the shape of
# what it is the gradient of: `grad_W` is `(out, in)` like `W`.


# %%
class MyLinear(torch.autograd.Function):
    """y = x Wᵀ + b, written inline to show the parts."""

    @staticmethod
    def forward(x, W, b):
        return x @ W.T + b  # (B, in) @ (in, out) -> (B, out)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, W, b = inputs
        ctx.save_for_backward(x, W)  # b is not needed: grad_b = Σ grad_y

    @staticmethod
    def backward(ctx, grad_y):
        x, W = ctx.saved_tensors
        calls.append(ctx.needs_input_grad)
        grad_x = grad_W = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = grad_y @ W  # (B, out) @ (out, in) -> (B, in)
        if ctx.needs_input_grad[1]:
            grad_W = grad_y.T @ x  # (out, B) @ (B, in) -> (out, in)
        if ctx.needs_input_grad[2]:
            grad_b = grad_y.sum(0)  # (B, out) -> (out,)
        return grad_x, grad_W, grad_b


calls = []
x = randn(4, 3, seed=1, device=dev, requires_grad=True)
W = randn(2, 3, seed=2, device=dev, requires_grad=True)
b = randn(2, seed=3, device=dev, requires_grad=True)
g = randn(4, 2, seed=4, device=dev)  # an upstream gradient grad_y

ours = torch.autograd.grad(MyLinear.apply(x, W, b), (x, W, b), g)
ref = torch.autograd.grad(F.linear(x, W, b), (x, W, b), g)
for name, o, r in zip(("grad_x", "grad_W", "grad_b"), ours, ref):
    compare(name, o, r)
show("grad_W", ours[1])

# %% [markdown]
# The comparisons use the float32 default of `compare`, `atol 1e-05, rtol 0.0001`: our matmuls
# and PyTorch's round the same numbers but may add them in a different order, which moves the
# last few bits and nothing more.
#
# ### Broadcasting's backward is a sum
#
# `b` has shape `(out,)` but is added to every one of the `B` rows of $x W^\top$: [broadcasting](../pages/glossary.md#term-broadcasting)
# *uses* each `b_o` `B` times. A value used several times collects one gradient per use, added up
# (chapter 3's `+=`), so `grad_b` is a sum over the broadcast dimension. The general rule: sum
# the upstream gradient over every dimension that was broadcast, with `keepdim=True` where the
# tensor had size 1 there, so the gradient gets the tensor's own shape back. Here `c` (one scale
# per row, shape `(4, 1)`) and `r` (one shift per column, shape `(1, 3)`) are broadcast to `(4, 3)`:

# %%
x_bc = randn(4, 3, seed=80, device=dev)
# used in all 3 columns of its row
c = randn(4, 1, seed=81, device=dev, requires_grad=True)
# used in all 4 rows of its column
r = randn(1, 3, seed=82, device=dev, requires_grad=True)
g_bc = randn(4, 3, seed=83, device=dev)  # upstream gradient of y = x ∘ c + r, (4, 3)
grad_c, grad_r = torch.autograd.grad(x_bc * c + r, (c, r), g_bc)
print("grad_c", tuple(grad_c.shape), "| grad_r", tuple(grad_r.shape))
compare(
    "grad_c = (g ∘ x).sum(1, keepdim=True)", grad_c, (g_bc * x_bc).sum(1, keepdim=True)
)
compare("grad_r = g.sum(0, keepdim=True)", grad_r, g_bc.sum(0, keepdim=True))
print(
    "without keepdim, g.sum(0) has shape",
    tuple(g_bc.sum(0).shape),
    "instead of",
    tuple(r.shape),
)
(grad_b_sum,) = torch.autograd.grad(F.linear(x, W, b).sum(), b)
show("grad_b for L = sum of all 4 rows of y", grad_b_sum)

# %% [markdown]
# Both gradients have the shape of their tensor, `(4, 1)` and `(1, 3)`, and equal the sums within
# the float32 default (autograd runs the same reductions, possibly in another order on a GPU).
# `grad_b = grad_y.sum(0)` in `MyLinear` is the same rule for a `b` broadcast over a new leading
# dimension, which is why no `keepdim` is needed there.
#
# And it is a **sum**, not a mean: with $L = \sum y$ over 4 rows, `grad_b` is `4` per entry.
# The $1/B$ of a mean loss arrives already inside `grad_y` (chapter 3's micro-batches depend
# on exactly this).
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 says that `grad_W = x.t() @ grad_y` "is the average of the B samples' gradients
# (implicitly divided by B)". It is their sum; the $1/B$ of a mean loss arrives already
# inside `grad_y`.
#
# </details>
#
# Now freeze `W` and `b` (as in fine-tuning) and look at what backward was asked for:

# %%
calls.clear()
W_frozen, b_frozen = W.detach(), b.detach()
(grad_x,) = torch.autograd.grad(MyLinear.apply(x, W_frozen, b_frozen), (x,), g)
print("needs_input_grad:", calls[-1])
_ = compare("grad_x with W frozen", grad_x, ours[0], exact=True)

# %% [markdown]
# Only `grad_x` was computed; the `(out, in)` matmul for `grad_W` was skipped. The library
# version `hf.Linear` goes one step further: `grad_x` needs only `W` and `grad_W` needs only `x`,
# so its `setup_context` saves `x` only when `W` needs a gradient, and `W` only when `x` does.
#
# ### Never write into `grad_output`
#
# The tensor handed to backward is not yours: it may be the caller's own tensor (the `g` we pass
# to `torch.autograd.grad`) or a buffer that another branch of the graph still reads. Here is a
# backward that "saves memory" with an in-place multiply:


# %%
class TimesTwoInPlace(torch.autograd.Function):
    """y = 2x with a WRONG backward that writes into grad_y."""

    @staticmethod
    def forward(x):
        return 2 * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass  # d(2x)/dx = 2 needs nothing saved

    @staticmethod
    def backward(ctx, grad_y):
        return grad_y.mul_(2)  # WRONG: modifies the caller's tensor


x3 = randn(3, seed=5, device=dev, requires_grad=True)
g3 = torch.ones(3, device=dev)
(grad_x3,) = torch.autograd.grad(TimesTwoInPlace.apply(x3), x3, g3)
show("grad_x3", grad_x3)
show("g3 after backward (was all ones)", g3)

# %% [markdown]
# The gradient is right, but the caller's `g3` changed from ones to twos behind its back. Write
# `grad_y * 2` instead: a new tensor. Every Function in `helpers/functions.py` is tested for this.
#
# ### `once_differentiable` and double backward
#
# Backward is itself a computation. When it is built from differentiable torch ops on tensors
# autograd can see, `torch.autograd.grad(..., create_graph=True)` records it, and we can
# differentiate again (Hessian-vector products, gradient penalties). Our `Linear` and `ReLU` claim
# this and are checked with `gradgradcheck`, which compares second derivatives against finite
# differences. All the others are marked `@once_differentiable`: their backward runs with autograd
# off, so the gradient they return is attached to no graph, and asking for a second derivative
# fails loudly instead of silently giving a wrong number.

# %%
x64 = randn(5, 3, seed=6, device=dev, dtype=torch.float64, requires_grad=True)
W64 = randn(4, 3, seed=7, device=dev, dtype=torch.float64, requires_grad=True)
b64 = randn(4, seed=8, device=dev, dtype=torch.float64, requires_grad=True)
print("gradgradcheck(linear):", gradgradcheck(hf.linear, (x64, W64, b64)))
print("gradgradcheck(relu):  ", gradgradcheck(hf.relu, (x64,)))

(grad_gelu,) = torch.autograd.grad(hf.gelu(x64).sum(), x64, create_graph=True)
print("gelu's gradient is connected to a graph:", grad_gelu.requires_grad)
try:
    grad_gelu.sum().backward()
except RuntimeError:
    print("second backward through gelu: RuntimeError")

# %% [markdown]
# ## 2. Softmax: the Jacobian, and the product we actually compute
#
# $p = \operatorname{softmax}(z)$, $p_i = e^{z_i} / \sum_k e^{z_k}$. Differentiating the quotient:
#
# * $\partial p_i/\partial z_i = p_i - p_i^2$ (the numerator and the denominator both contain $e^{z_i}$);
# * $\partial p_i/\partial z_j = -p_i p_j$ for $j \ne i$ (only the denominator contains $e^{z_j}$).
#
# Together, **the Jacobian of softmax** is
#
# $$J = \operatorname{diag}(p) - p p^\top .$$
#
# For a small vector:

# %%
z = randn(4, seed=10, device=dev, dtype=torch.float64)
p = torch.softmax(z, 0)
J = torch.diag(p) - torch.outer(p, p)  # (4, 4)
show("p", p)
show("J = diag(p) - p pᵀ", J)
J_autograd = torch.autograd.functional.jacobian(lambda t: torch.softmax(t, 0), z)
compare("J vs autograd's Jacobian", J, J_autograd)
show("row sums of J", J.sum(1))
_ = compare(
    "row sums of J vs 0", J.sum(1), torch.zeros(4, dtype=torch.float64, device=dev)
)

# %% [markdown]
# The rows sum to zero: adding the same constant to every logit does not change `p`.
# Off the diagonal the entries are not small (`J[0, 2] = −0.1072` next to `J[0, 0] = 0.2025`):
# every logit moves every probability.
# (Float64 here, with `compare`'s float64 default `atol 1e-10, rtol 1e-08`.)
#
# Backward never builds $J$: it is $n \times n$ for every row, quadratic in the number of
# classes (or keys, in attention). It needs only the [vector–Jacobian product](../pages/glossary.md#term-vectorJacobian-product)
# $\partial L/\partial z = J^\top g$, with $g = \partial L/\partial p$ (and $J$ is symmetric):
#
# $$\begin{aligned}
# \frac{\partial L}{\partial z} &= (\operatorname{diag}(p) - p p^\top)\, g \\
#        &= p \odot g - p\,(p^\top g) = p \odot (g - \langle g, p\rangle),
# \end{aligned}$$
#
# one dot product per row and an elementwise product: $O(n)$ instead of $O(n^2)$.

# %%
v = randn(4, seed=11, device=dev, dtype=torch.float64)  # an upstream gradient grad_p
vjp_cheap = p * (v - (v * p).sum())  # (4,)
vjp_full = v @ J  # (4,) @ (4, 4) -> (4,)
show("p ∘ (v - <v, p>)", vjp_cheap)
compare("cheap VJP vs vᵀJ", vjp_cheap, vjp_full)
_ = compare("hf.softmax_backward vs vᵀJ", hf.softmax_backward(p, v), vjp_full)

# %% [markdown]
# ### How `gradcheck` catches a plausible wrong backward (seed 000)
#
# Seed 000 writes a `SimpleAttention` Function whose backward goes through softmax like this:
#
# ```python
# grad_scores = grad_attn * (attn_weights - attn_weights ** 2)   # p(1-p) ∘ g
# ```
#
# That is $p \odot (1 - p) \odot g$: **only the diagonal of the Jacobian**, as if each probability
# depended on its own logit alone. It is plausible (it is the sigmoid's derivative, and it is
# right for a single `p_i` against its own `z_i`), it has the right shape, it runs, and a loss
# still goes down for a while. `hf.softmax_backward_diagonal_only` keeps it as a named example.
#
# `gradcheck` does what we did above, for every input: it builds the Jacobian twice,
# numerically from central differences $(f(z + \varepsilon e_j) - f(z - \varepsilon e_j)) / 2\varepsilon$,
# and analytically by running backward once per output direction $e_i$ (row $i$ of $J$ is
# `backward(e_i)`), and compares:


# %%
def jacobian_from_backward(backward_fn, p):
    """Row i is backward(e_i) = e_iᵀ J."""
    eye = torch.eye(p.numel(), dtype=p.dtype, device=p.device)
    return torch.stack([backward_fn(p, e) for e in eye])  # (n, n)


eps = 1e-6
# column j: ∂p/∂z_j
J_numeric = torch.stack(
    [
        (torch.softmax(z + eps * e, 0) - torch.softmax(z - eps * e, 0)) / (2 * eps)
        for e in torch.eye(4, dtype=z.dtype, device=dev)
    ],
    dim=1,
)
J_diag_only = jacobian_from_backward(hf.softmax_backward_diagonal_only, p)
show("numerical J", J_numeric)
show("J implied by the diagonal-only backward", J_diag_only)
compare(
    "correct backward vs numerical J",
    jacobian_from_backward(hf.softmax_backward, p),
    J_numeric,
    atol=1e-8,
    rtol=1e-6,
)
_ = compare(
    "diagonal-only backward vs numerical J",
    J_diag_only,
    J_numeric,
    atol=1e-8,
    rtol=1e-6,
)

# %% [markdown]
# Central differences in float64 have an error of order $\varepsilon^2$ plus round-off divided by $\varepsilon$, far
# below the `atol 1e-08` used here, so that tolerance passes the correct backward and nothing that
# is wrong in a visible digit. The diagonal-only backward's Jacobian is the diagonal matrix above:
# every off-diagonal entry is missing. `gradcheck` runs exactly this test with its own
# tolerances (printed below):

# %%
Z = randn(3, 6, seed=12, device=dev, dtype=torch.float64, requires_grad=True)
defaults = inspect.signature(gradcheck).parameters
print(
    "gradcheck defaults:",
    ", ".join(
        f"{k}={fmt_sci(defaults[k].default, 0)}" for k in ("eps", "atol", "rtol")
    ),
)
print(
    "gradcheck(correct softmax):      ",
    gradcheck(lambda t: hf.Softmax.apply(t, 1), (Z,)),
)
print(
    "gradcheck(diagonal-only softmax):",
    gradcheck(
        lambda t: hf.SoftmaxDiagonalOnly.apply(t, 1), (Z,), raise_exception=False
    ),
)

# %% [markdown]
# Inside attention the mistake changes every gradient upstream of the softmax. Here is seed 000's
# Function in the modern form, next to the same Function with the correct softmax backward,
# both against autograd of the plain formula $\operatorname{softmax}(Q K^\top) V$. That formula
# is the seed's (see the aside below); the scale changes nothing about the softmax mistake.


# %%
def attention_backward(Q, K, V, P, grad_O, softmax_bwd):
    """O = softmax(Q Kᵀ) V, the seed's forward (no 1/√d); softmax_bwd is under test."""
    grad_V = P.transpose(-2, -1) @ grad_O  # (B, N, N) @ (B, N, d) -> (B, N, d)
    grad_P = grad_O @ V.transpose(-2, -1)  # (B, N, d) @ (B, d, N) -> (B, N, N)
    grad_S = softmax_bwd(P, grad_P)  # (B, N, N)
    grad_Q = grad_S @ K  # (B, N, N) @ (B, N, d) -> (B, N, d)
    grad_K = grad_S.transpose(-2, -1) @ Q  # (B, N, N) @ (B, N, d) -> (B, N, d)
    return grad_Q, grad_K, grad_V


B, N, d = 2, 5, 4
Q, K, V = (randn(B, N, d, seed=s, device=dev, requires_grad=True) for s in (20, 21, 22))
grad_O = randn(B, N, d, seed=23, device=dev)
S = Q @ K.transpose(-2, -1)  # (B, N, d) @ (B, d, N) -> (B, N, N)
O = torch.softmax(S, -1) @ V  # (B, N, N) @ (B, N, d) -> (B, N, d)
ref = torch.autograd.grad(O, (Q, K, V), grad_O)
P_att = torch.softmax(S, -1).detach()  # (B, N, N)
for label, bwd in (
    ("seed 000 (diagonal only)", hf.softmax_backward_diagonal_only),
    ("correct", hf.softmax_backward),
):
    ours = attention_backward(Q.detach(), K.detach(), V.detach(), P_att, grad_O, bwd)
    for name, o, r in zip(("grad_Q", "grad_K", "grad_V"), ours, ref):
        compare(f"{label}: {name}", o, r)

# %% [markdown]
# `grad_V` does not go through the softmax's backward, so it is right either way; `grad_Q` and
# `grad_K` are wrong with the diagonal-only version. (The seed's Function also saves `scores`,
# which its backward never reads: an `(N, N)` tensor per head kept alive for nothing.)
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000's softmax backward keeps only the Jacobian's diagonal (above), and its attention
# code computes $\operatorname{softmax}(Q K^\top) V$: attention is
# $\operatorname{softmax}(Q K^\top/\sqrt d)\, V$ (the seed's own text writes the $1/\sqrt d$,
# its code drops it). We keep it unscaled here only to test the seed's backward against its
# own forward. Chapter 6 derives the scaled version and checks it against
# `F.scaled_dot_product_attention`.
#
# </details>
#
# ## 3. LayerNorm: two hidden paths from x to the output
#
# Over the last dimension (size $D$) of each row, with the biased variance under the root:
#
# $$\begin{aligned}
# \mu &= \frac1D \sum_i x_i, &
# \sigma &= \sqrt{\frac1D \sum_i (x_i - \mu)^2 + \varepsilon}, \\
# \hat x &= \frac{x - \mu}{\sigma}, &
# y &= \gamma \odot \hat x + \beta .
# \end{aligned}$$
#
# The parameter gradients are immediate:
# $\partial L/\partial\gamma = \sum_{\text{rows}} \frac{\partial L}{\partial y} \odot \hat x$
# and $\partial L/\partial\beta = \sum_{\text{rows}} \frac{\partial L}{\partial y}$. For $x$,
# write $g = \frac{\partial L}{\partial y} \odot \gamma$ (the gradient arriving at $\hat x$).
# Each $x_j$ reaches $\hat x_i$ three ways:
#
# * **directly**, through the numerator $x_i - \mu$ when $i = j$: contributes $g_j / \sigma$;
# * **through the mean**: $\partial\mu/\partial x_j = 1/D$, and $\mu$ is subtracted from every
#   $x_i$: contributes $-\frac1\sigma \operatorname{mean}(g)$;
# * **through the variance**: $\partial\sigma/\partial x_j = \hat x_j / D$, and
#   $\hat x_i = (x_i - \mu)/\sigma$ falls as $\sigma$ grows,
#   $\partial\hat x_i/\partial\sigma = -\hat x_i/\sigma$; summed against $g_i$ this
#   contributes $-\frac1\sigma\, \hat x_j \operatorname{mean}(g \odot \hat x)$.
#
# So the Jacobian of $\hat x$ is
#
# $$\frac{\partial \hat x_i}{\partial x_j} = \frac1\sigma\Big(\delta_{ij} - \frac1D - \frac{\hat x_i \hat x_j}{D}\Big),$$
#
# and the vector–Jacobian product, with means over the last dimension, is
#
# $$\boxed{\;\frac{\partial L}{\partial x} = \frac1\sigma\Big(g - \operatorname{mean}(g)
#   - \hat x \odot \operatorname{mean}(g \odot \hat x)\Big)\;}$$
#
# We write the three paths as separate terms and check them against autograd of `F.layer_norm`:

# %%
D = 6
X = 2 * randn(3, D, seed=30, device=dev, dtype=torch.float64) + 1
gamma = 1 + randn(D, seed=31, device=dev, dtype=torch.float64)
beta = randn(D, seed=32, device=dev, dtype=torch.float64)
grad_Y = randn(3, D, seed=33, device=dev, dtype=torch.float64)
ln_eps = 1e-5

mu = X.mean(-1, keepdim=True)  # (3, 1)
sigma = torch.sqrt(((X - mu) ** 2).mean(-1, keepdim=True) + ln_eps)  # (3, 1)
X_hat = (X - mu) / sigma  # (3, D)
g_ln = grad_Y * gamma  # (3, D)
direct = g_ln / sigma
mean_path = -g_ln.mean(-1, keepdim=True) / sigma
var_path = -X_hat * (g_ln * X_hat).mean(-1, keepdim=True) / sigma

Xr, gr, br = (t.clone().requires_grad_() for t in (X, gamma, beta))
ref_x, ref_gamma, ref_beta = torch.autograd.grad(
    F.layer_norm(Xr, (D,), gr, br, ln_eps), (Xr, gr, br), grad_Y
)
compare("grad_x = direct + mean + variance paths", direct + mean_path + var_path, ref_x)
compare("grad_x without the mean path", direct + var_path, ref_x)
compare("grad_x without the variance path", direct + mean_path, ref_x)
compare("grad_gamma = Σ grad_y ∘ x̂", (grad_Y * X_hat).sum(0), ref_gamma)
_ = compare("grad_beta = Σ grad_y", grad_Y.sum(0), ref_beta)

# %% [markdown]
# Dropping either path gives a gradient of the right shape and the wrong values (the `✗` lines).
# The two paths also leave a fingerprint we can check: the output does not change if `x` is shifted
# by a constant, so each row of `grad_x` sums to zero; and, but for $\varepsilon$, it does not
# change if `x` is scaled, so $\langle \partial L/\partial x,\; x - \mu\rangle$ is nearly zero per row:

# %%
grad_X = direct + mean_path + var_path
show("row sums of grad_x", grad_X.sum(-1), 6)
compare(
    "row sums of grad_x vs 0",
    grad_X.sum(-1),
    torch.zeros(3, dtype=torch.float64, device=dev),
)
show("<grad_x, x - mu> per row", (grad_X * (X - mu)).sum(-1), 6)

# %% [markdown]
# The row sums are zero within the float64 default tolerance (atol 1e-10: six terms of size about
# 1 summed in float64 leave round-off near 1e-16); the second check is at most `0.000014` in size,
# not zero, because $\varepsilon$ makes $\sigma$ slightly larger than the standard deviation.
# The library's `LayerNorm` saves $x$, $\mu$ and $1/\sigma$ (two floats per row) rather than
# $\hat x$ (a full `(..., D)` tensor), and rebuilds $\hat x$ in backward. Its backward is the plain function
# `hf.layernorm_backward`, checked here against the inline terms and by `gradcheck`:

# %%
lib_x, lib_gamma, lib_beta = hf.layernorm_backward(X, mu, 1 / sigma, gamma, grad_Y)
compare("hf.layernorm_backward: grad_x", lib_x, ref_x)
compare("hf.layernorm_backward: grad_gamma", lib_gamma, ref_gamma)
print("gradcheck(layer_norm):", gradcheck(hf.layer_norm, (Xr, gr, br)))

# %% [markdown]
# ## 4. Cross-entropy from logits, stably
#
# For logits $z$ (one row, $C$ classes) and target class $t$, the [cross-entropy](../pages/glossary.md#term-cross-entropy) is
# $L = -\log \operatorname{softmax}(z)_t = -z_t + \log \sum_c e^{z_c}$. Computing `softmax`
# first and then its `log` overflows: $e^{z}$ is `inf` in float32 once $z$ exceeds the log of
# the largest float32 (printed below). The log-sum-exp trick subtracts the row maximum $m$
# first, $\log \sum_c e^{z_c} = m + \log \sum_c e^{z_c - m}$, so the largest exponent taken is
# of zero:

# %%
# large logits, as in an overconfident model
logits = 100 * randn(4, 5, seed=40, device=dev)
target = torch.tensor([0, 3, 1, 4], device=dev)
show("log(largest float32)", math.log(torch.finfo(torch.float32).max), 2)
naive = -torch.log(torch.exp(logits) / torch.exp(logits).sum(1, keepdim=True))[
    torch.arange(4), target
].mean()
show("max logit", logits.max(), 2)
show("naive -log(softmax) loss", naive)
show("hf.cross_entropy", hf.cross_entropy(logits, target))
_ = compare(
    "hf.cross_entropy vs F.cross_entropy",
    hf.cross_entropy(logits, target),
    F.cross_entropy(logits, target),
)

# %% [markdown]
# With logits up to `218.33`, far past `88.72`, the naive loss is `nan` (an `inf / inf`); the fused one is
# finite (`78.3152`) and matches PyTorch's within the float32 default `atol 1e-05, rtol 0.0001`; the
# relative part covers float32 round-off in a loss this large.
#
# Its gradient is short:
# $\frac{\partial}{\partial z_c}\big(-z_t + \log \sum_k e^{z_k}\big) = \operatorname{softmax}(z)_c - [c = t]$.
# For the mean over $N$ rows each row's gradient is divided by $N$:
#
# $$\frac{\partial L}{\partial z} = \frac{\operatorname{softmax}(z) - \text{onehot}(t)}{N}.$$
#
# The Function saves the logits and one float per row, $\text{lse} = \log \sum_k e^{z_k}$
# (`lse`), and rebuilds $\operatorname{softmax}(z) = \exp(z - \text{lse})$ in backward.

# %%
z_ce = randn(4, 5, seed=41, device=dev, requires_grad=True)
hf.cross_entropy(z_ce, target).backward()
expected = (torch.softmax(z_ce.detach(), 1) - F.one_hot(target, 5)) / 4  # (4, 5)
show("grad_z", z_ce.grad)
show("row sums of grad_z", z_ce.grad.sum(1))
compare("row sums of grad_z vs 0", z_ce.grad.sum(1), torch.zeros(4, device=dev))
_ = compare("grad_z vs (softmax - one_hot) / N", z_ce.grad, expected)

# %% [markdown]
# Each row of `grad_z` sums to zero (softmax sums to 1, the one-hot too), within the float32
# default tolerance: five float32 entries smaller than 0.25 summed leave round-off near 1e-8, far
# inside atol 1e-5. Only the target entry is negative (`−0.1012` in row 0, class 0).
# `hf.cross_entropy` also takes `ignore_index` (rows whose target is, by default, `-100`, such as padding,
# contribute nothing and are not counted in $N$) and `label_smoothing` $\varepsilon$ (the
# one-hot becomes $(1 - \varepsilon)\,\text{onehot}(t) + \varepsilon/C$). Unlike `F.cross_entropy` it takes the classes **last**, `(..., C)`,
# as a language model's logits come; chapter 5 looks at both options closely.

# %%
t_pad = torch.tensor([0, -100, 1, 4], device=dev)
_ = compare(
    "ignore_index, smoothing 0.1 vs F.cross_entropy",
    hf.cross_entropy(logits, t_pad, label_smoothing=0.1),
    F.cross_entropy(logits, t_pad, label_smoothing=0.1),
)

# %% [markdown]
# ## 5. GELU, exact and tanh
#
# $\operatorname{gelu}(x) = x\,\Phi(x)$ with $\Phi$ the standard normal CDF; its derivative is
# $\Phi(x) + x\,\varphi(x)$. The tanh form approximates it by
# $\tfrac12 x\,(1 + \tanh u)$ with $u = \sqrt{2/\pi}\,(x + 0.044715\, x^3)$, and has the derivative
#
# $$\tfrac12 (1 + \tanh u) + \tfrac12 x\,(1 - \tanh^2 u)\,\sqrt{2/\pi}\,(1 + 3 \cdot 0.044715\, x^2).$$
#
# Both need $x$ in backward, so GELU saves its input (ReLU can save its output instead:
# $y > 0$ exactly where $x > 0$).

# %%
xs = torch.linspace(-6, 6, 1201, device=dev, dtype=torch.float64)
for form in ("none", "tanh"):
    x_g = xs.clone().requires_grad_()
    y_g = hf.gelu(x_g, form)
    (d_ours,) = torch.autograd.grad(y_g.sum(), x_g)
    x_r = xs.clone().requires_grad_()
    (d_ref,) = torch.autograd.grad(F.gelu(x_r, approximate=form).sum(), x_r)
    compare(f"gelu ({form}) vs F.gelu", y_g, F.gelu(xs, approximate=form))
    compare(f"gelu' ({form}) vs autograd of F.gelu", d_ours, d_ref)
gap = (hf.gelu(xs, "none") - hf.gelu(xs, "tanh")).abs().max()
show("max |gelu_erf - gelu_tanh| on [-6, 6]", gap, 6)

# %% mystnb={"image": {"alt": "Two panels over x from \u22124 to 4: above, GELU and ReLU; below, their derivatives, GELU's smooth curve against ReLU's step from 0 to 1."}}
xs_cpu = xs.cpu()
d_erf = hf.gelu_backward(xs_cpu, torch.ones_like(xs_cpu), "none")
# one panel above the other: each stays readable on a phone
fig, ax = plt.subplots(2, 1, figsize=(6, 5.2), sharex=True)
ax[0].plot(xs_cpu, hf.gelu(xs_cpu), label="gelu")
ax[0].plot(xs_cpu, xs_cpu.clamp(min=0), "--", label="relu")
ax[1].plot(xs_cpu, d_erf, label="gelu'")
ax[1].plot(xs_cpu, (xs_cpu > 0).double(), "--", label="relu'")
for a, title in zip(ax, ("function", "derivative")):
    a.set_title(title)
    a.legend()
    a.set_xlim(-4, 4)
plt.tight_layout()
plt.show()

# %% [markdown]
# The two forms differ by at most `0.000473` on `[-6, 6]`, far below anything training notices.
# Unlike ReLU's, GELU's derivative is never exactly zero on an interval. It is negative, but only
# below some threshold, and never very negative. Where exactly? $\operatorname{gelu}'$ changes
# sign once on $[-2, -0.1]$, so bisection in float64 finds the threshold; a grid with step
# `1e-5` finds the minimum (calculus says where:
# $\operatorname{gelu}''(x) = \varphi(x)(2 - x^2)$ vanishes at $x = -\sqrt 2$):


# %%
def d_gelu(x):
    """gelu'(x) = Φ(x) + x φ(x) (erf form), elementwise."""
    return hf.gelu_backward(x, torch.ones_like(x), "none")


lo = torch.tensor(-2.0, dtype=torch.float64, device=dev)  # gelu'(-2) < 0
hi = torch.tensor(-0.1, dtype=torch.float64, device=dev)  # gelu'(-0.1) > 0
for _ in range(60):  # halves the bracket 60 times: below 1e-17
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if d_gelu(mid) < 0 else (lo, mid)
show("zero of gelu' (gelu' < 0 to its left)", lo, 4)
grid = torch.linspace(-6, 0, 600001, dtype=torch.float64, device=dev)  # step 1e-5
d_grid = d_gelu(grid)
i_min = int(d_grid.argmin())
show("argmin of gelu' on the grid", grid[i_min], 4)
show("min gelu'", d_grid[i_min], 4)
compare(
    "argmin vs -√2 (within one grid step)",
    grid[i_min],
    torch.tensor(-math.sqrt(2), dtype=torch.float64),
    atol=1e-5,
    rtol=0,
)
print(
    "gelu' < 0 on every grid point below the threshold:",
    bool((d_grid[grid < lo] < 0).all()),
    "| >= 0 above it:",
    bool((d_grid[grid > hi] >= 0).all()),
)
print("gelu'(-4) =", fmt_sci(d_gelu(torch.tensor(-4.0, dtype=torch.float64)).item()))

# %% [markdown]
# So $\operatorname{gelu}'(x) < 0$ only for $x < -0.7518$, its minimum is $-0.1289$ at
# $x = -1.4142$ ($-\sqrt 2$, within the grid step of `1e-5`), and far out it returns towards 0
# ($\operatorname{gelu}'(-4)$ is $-5.0 \times 10^{-4}$). A GELU unit whose
# input is negative still receives a gradient, of either sign, but a small one: a "dead" GELU unit is
# not dead, only very quiet.
#
# ## 6. Dropout with a saved mask
#
# In training, dropout keeps each element with probability $1 - p$ and scales the survivors by
# $1/(1 - p)$, so the expected output equals the input: $y = x \odot m / (1 - p)$. Backward is
# the same multiplication,
# $\frac{\partial L}{\partial x} = \frac{\partial L}{\partial y} \odot m / (1 - p)$, so the
# only thing to save is the mask $m$:
# a `bool` tensor, one byte per element. The mask is drawn from a seed (or a `torch.Generator`)
# so a run can be repeated exactly. In evaluation dropout is the identity.

# %%
x_d = randn(4, 6, seed=50, device=dev, requires_grad=True)
y_d = hf.dropout(x_d, p=0.5, training=True, generator=7)
(mask,) = y_d.grad_fn.saved_tensors
print(
    "saved:",
    mask.dtype,
    tuple(mask.shape),
    tensor_bytes(mask),
    "bytes, vs",
    tensor_bytes(x_d),
    "bytes for x",
)
show("mask as 0/1", mask.float(), 0)
g_d = randn(4, 6, seed=51, device=dev)
(grad_x_d,) = torch.autograd.grad(y_d, x_d, g_d)
compare("grad_x = grad_y ∘ m / (1 - p)", grad_x_d, g_d * mask / 0.5, exact=True)
compare("same seed, same output", hf.dropout(x_d, 0.5, True, 7), y_d, exact=True)
print("eval mode returns x itself:", hf.dropout(x_d, 0.5, training=False) is x_d)

# %% [markdown]
# The comparisons are exact: backward performs the very same multiplications as our reference.
#
# ## 7. What each Function saves
#
# A backward pass costs memory for whatever forward kept. The cell below runs each library Function
# on a batch of `8` rows of width `16` (a Linear to width `32`) and lists what its node holds, marking
# whether each saved tensor is an input, the output, or a **new** tensor made just to be saved:


# %%
def saved_report(name, out, inputs, ctx_attrs=()):
    """One row: what out.grad_fn saved, each tagged input / output / new."""
    node = out.grad_fn
    items = []
    for s in node.saved_tensors:
        if s is None:
            continue
        ptr = s.untyped_storage().data_ptr()
        tag = (
            "input"
            if any(
                isinstance(i, torch.Tensor) and i.untyped_storage().data_ptr() == ptr
                for i in inputs
            )
            else "output"
            if ptr == out.untyped_storage().data_ptr()
            else "new"
        )
        items.append(f"{tuple(s.shape)} {str(s.dtype).replace('torch.', '')} ({tag})")
    attrs = ", ".join(f"{a}={getattr(node, a)!r}" for a in ctx_attrs) or "-"
    print(f"{name:<13} on ctx: {attrs}")
    for item in items:
        print(f"{'':<13}   saves {item}")


xb = randn(8, 16, seed=60, device=dev, requires_grad=True)
Wb = randn(32, 16, seed=61, device=dev, requires_grad=True)
bb = randn(32, seed=62, device=dev, requires_grad=True)
wln, bln = (
    torch.ones(16, device=dev, requires_grad=True),
    torch.zeros(16, device=dev, requires_grad=True),
)
tb = torch.arange(8, device=dev) % 16
print(
    "Function: non-tensor ctx attributes, then each saved tensor (shape, dtype, kind)"
)
saved_report("Linear", hf.linear(xb, Wb, bb), [xb, Wb, bb])
saved_report("ReLU", hf.relu(xb), [xb])
saved_report("GELU", hf.gelu(xb), [xb], ["approximate"])
saved_report("Softmax", hf.softmax(xb, -1), [xb], ["dim"])
saved_report("LogSoftmax", hf.log_softmax(xb, -1), [xb], ["dim"])
saved_report(
    "CrossEntropy",
    hf.cross_entropy(xb, tb),
    [xb, tb],
    ["ignore_index", "label_smoothing"],
)
y_mse = torch.zeros(8, 16, device=dev)
saved_report("MSE", hf.mse_loss(xb, y_mse), [xb, y_mse])
saved_report("LayerNorm", hf.layer_norm(xb, wln, bln), [xb, wln, bln])
saved_report("Dropout", hf.dropout(xb, 0.1, True, 0), [xb], ["p"])

# %% [markdown]
# The same, as a table (for inputs `x (8, 16)`, `W (32, 16)`):
#
# | Function | saves | new memory | non-tensors on `ctx` |
# | --- | --- | --- | --- |
# | `Linear` | `x`, `W` (inputs; each only if the other's gradient is needed) | none | – |
# | `ReLU` | its output `y` | none (the output exists anyway) | – |
# | `GELU` | its input `x` | none | `approximate` |
# | `Softmax` | its output `P` | none | `dim` |
# | `LogSoftmax` | its output `log P` | none | `dim` |
# | `CrossEntropy` | logits, target, `lse` | `lse`: `(8,)`, one float per row | `ignore_index`, `label_smoothing` |
# | `MSE` | `ŷ`, `y` (inputs) | none | – |
# | `LayerNorm` | `x`, $\gamma$, $\mu$, $1/\sigma$ | $\mu$, $1/\sigma$: `(8, 1)` each | – (`eps` is used up in forward) |
# | `Dropout` | the mask `m` | `(8, 16)` `bool`, 1 byte per element | `p` |
#
# "None" means no extra memory only as long as someone else keeps that tensor alive; chapter 9
# measures what a whole network holds.
#
# `CrossEntropy` and `LayerNorm` compute their statistics in `forward` and return them as extra
# outputs marked `ctx.mark_non_differentiable` in `setup_context`, so they are saved without being
# computed twice; the lowercase wrappers return only the real output.
#
# ## 8. An MLP from our own Functions
#
# `helpers.mlp.MLP` is a module whose forward calls only `linear`, `layer_norm` and `gelu` (or `relu`) from this
# chapter; `to_sequential()` builds the same network from `nn.Linear`, `nn.LayerNorm` and `nn.GELU` with
# copied parameters. One batch, one cross-entropy loss each, and every parameter's gradient compared:

# %%
from helpers.mlp import MLP

mlp = MLP((8, 32, 32, 4), activation="gelu", layer_norm=True, seed=0, device=dev)
seq = mlp.to_sequential()
print(seq)
X_mlp = randn(16, 8, seed=70, device=dev)
t_mlp = torch.arange(16, device=dev) % 4
L_ours = hf.cross_entropy(mlp(X_mlp), t_mlp)
L_ref = F.cross_entropy(seq(X_mlp), t_mlp)
show("L (our Functions)", L_ours)
show("L (nn.Sequential)", L_ref)
L_ours.backward()
L_ref.backward()
pairs = mlp.param_pairs(seq)
print(len(pairs), "parameters compared")
for name, p_ours, p_ref in pairs:
    compare(name, p_ours.grad, p_ref.grad)
show("grad b3", pairs[-1][1].grad)

# %% [markdown]
# The two losses print the same, `1.3450`, and all ten gradients agree within the float32 tolerance `atol 1e-05, rtol 0.0001` (the same
# arithmetic, summed in a different order). The network is built entirely from Functions whose
# backward we derived in this chapter.
#
# ## Summary
#
# * A custom Function is `forward` (no `ctx`, runs without recording), `setup_context` (decides
#   what to keep: tensors with `save_for_backward`, everything else as `ctx` attributes) and
#   `backward` (one gradient per input, `None` where `ctx.needs_input_grad` says nobody asked).
# * The backward math is a plain function of tensors: `grad_x = grad_y @ W`,
#   `grad_W = grad_y.T @ x`; softmax's $p \odot (g - \langle g, p\rangle)$ instead of the
#   $n \times n$ Jacobian $\operatorname{diag}(p) - p p^\top$; LayerNorm's
#   $\frac1\sigma\big(g - \operatorname{mean}(g) - \hat x \odot \operatorname{mean}(g \odot \hat x)\big)$
#   with a mean path and a variance path; cross-entropy's
#   $(\operatorname{softmax}(z) - \text{onehot}(t))/N$.
# * `gradcheck` compares the Jacobian your backward implies with finite differences in float64; it
#   catches the diagonal-only softmax backward of seed 000 at once ([gradient check](../pages/glossary.md#term-gradient-check)). Matching the built-in in float32
#   within `atol 1e-05, rtol 0.0001` is the second, everyday check.
# * Save inputs or outputs where you can (they usually exist anyway); save small statistics (`lse`,
#   $\mu$, $1/\sigma$) instead of big intermediates; save a `bool` mask rather than a float one.
#
# ## Common mistakes
#
# * **Keeping only the Jacobian's diagonal** ($p(1 - p) \odot g$ for softmax): every output of softmax
#   depends on every input. `gradcheck` fails; `grad_Q` and `grad_K` of attention come out wrong.
# * **Writing into `grad_output`** (`grad_y.mul_(2)`): the gradient looks right, but the caller's tensor
#   changed.
# * **Forgetting a path**: LayerNorm without the mean term or without the variance term gives a gradient
#   of the right shape and the wrong value.
# * **Missing the transpose or the batch sum** in a linear layer: `grad_W` must have `W`'s shape `(out, in)`
#   and sum over every row of the batch. More generally, a broadcast tensor's gradient is the upstream
#   gradient summed over the broadcast dimensions, with `keepdim=True` where the tensor had size 1.
# * **`softmax` then `log`** for cross-entropy: `inf`/`nan` at large logits; use log-sum-exp.
# * **Saving what backward does not use** (seed 000 saves `scores`): memory held until backward for nothing.
# * **Claiming double backward without testing it**: mark the Function `@once_differentiable` unless
#   `gradgradcheck` passes.
#
# Next: practise in the lab, [lab 4: custom Functions](../labs/lab04_custom_functions.ipynb).
