# %% [markdown]
# # 2. The chain rule and gradient checks
#
# Chapter 1 pushed one example through five backward steps by hand. This chapter turns those
# steps into rules that work for any network, and gives you the tools to *check* a gradient
# you wrote yourself.
#
# **Learning goals.** After this chapter you can
#
# 1. apply the [chain rule](../pages/glossary.md#term-chain-rule) (链式法则) to scalars and explain why a value used twice
#    *accumulates* its gradient (a sum over paths);
# 2. say what `backward()` really computes: a vector–Jacobian product $v^\top J$, not the Jacobian;
# 3. check a gradient with central [finite differences](../pages/glossary.md#term-finite-differences), choose the step $h$, and explain the
#    V-shaped error curve (truncation vs round-off) and why checks run in float64;
# 4. use `torch.autograd.gradcheck`;
# 5. derive and verify the three gradients of a linear layer in `nn.Linear`'s layout,
#    $\nabla_W = \nabla_Y^\top X$, $\nabla_X = \nabla_Y W$, $\nabla_b = \sum_{\text{batch}} \nabla_Y$;
# 6. tell a sum-loss from a mean-loss batch gradient, and undo broadcasting with a sum.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import textwrap
import warnings

import torch

from helpers.checks import compare
from helpers.device import get_device, no_tf32, randn
from helpers.show import fmt, fmt_sci, show

# CUDA when there is one, else the CPU: the printed numbers are the same
dev = get_device()
no_tf32()  # true fp32 matmuls on GPUs, so float32 comparisons mean the same everywhere
f64 = torch.float64

# %% [markdown]
# ## The scalar chain rule
#
# If $L$ depends on $u$ and $u$ depends on $x$, a small change $\delta x$ changes $u$ by
# $\frac{du}{dx}\delta x$, which changes $L$ by $\frac{dL}{du}\frac{du}{dx}\delta x$:
#
# $$\frac{dL}{dx} = \frac{dL}{du}\,\frac{du}{dx}.$$
#
# Take $u = 3x + 1$ and $L = u^2$ at $x = 2$: $u = 7$, $\frac{dL}{du} = 2u = 14$,
# $\frac{du}{dx} = 3$, so $\frac{dL}{dx} = 42$. Backpropagation evaluates this product from the
# left: first $\frac{dL}{du}$ (the gradient arriving from above), then times the local
# derivative $\frac{du}{dx}$.

# %%
x = torch.tensor(2.0, dtype=f64, device=dev, requires_grad=True)
u = 3 * x + 1
L = u**2
grad_u = 2 * u.detach()  # dL/du, arriving from above
grad_x = grad_u * 3  # times the local derivative du/dx
(grad_x_autograd,) = torch.autograd.grad(L, x)
show("u", u)
show("dL/du (by hand)", grad_u)
show("dL/dx (by hand)", grad_x)
show("dL/dx (autograd)", grad_x_autograd)
compare("dL/dx: by hand vs autograd", grad_x, grad_x_autograd, exact=True)
_ = compare(
    "dL/dx vs 42", grad_x, torch.tensor(42.0, dtype=f64, device=dev), exact=True
)

# %% [markdown]
# Both comparisons demand bit equality (`exact=True`): autograd multiplies the same float64
# numbers in the same order ($2u$, then $\times 3$), and every value here is a small integer,
# which float64 stores exactly.
#
# ### A first check: $y = w\,x + b$
#
# Seed 000's first exercise: $x = 2$, $w = 3$, $b = 1$, $y = wx + b$, and
# `torch.autograd.grad` asked for all three derivatives at once. The answers are the
# "other factor" each time: $\partial y/\partial x = w$, $\partial y/\partial w = x$,
# $\partial y/\partial b = 1$. Remember $\partial y/\partial w = x$: *the gradient of a weight is
# the input it multiplies* — chapter 1's $\partial L/\partial W_1 = \partial L/\partial h\, x^\top$
# was exactly this.

# %%
x = torch.tensor(2.0, dtype=f64, device=dev, requires_grad=True)
w = torch.tensor(3.0, dtype=f64, device=dev, requires_grad=True)
b = torch.tensor(1.0, dtype=f64, device=dev, requires_grad=True)
y = w * x + b
grad_x, grad_w, grad_b = torch.autograd.grad(y, [x, w, b])
show("dy/dx", grad_x, 1)
show("dy/dw", grad_w, 1)
show("dy/db", grad_b, 1)

# %% [markdown]
# ## A value used twice: gradients add up
#
# What is $\frac{dy}{da}$ for $y = a + a$? Or $y = a \cdot a$? Or $y = a\cdot a + a$? In each, $a$
# reaches $y$ along more than one path. The **multivariate chain rule** says: add the
# contributions of all paths. If $y = g(p(a), q(a))$ then
#
# $$\frac{dy}{da} = \frac{\partial y}{\partial p}\frac{dp}{da} + \frac{\partial y}{\partial q}\frac{dq}{da}.$$
#
# So $y = a + a$ gives $1 + 1 = 2$; $y = a\cdot a$ gives $a + a = 2a$; $y = a\cdot a + a$ gives
# $2a + 1$. At $a = 3$: $2$, $6$ and $7$.
#
# A backward pass must therefore **accumulate** (`+=`) into a node's gradient, never overwrite
# it. Here is a tiny reverse-mode engine: a *tape* records, for each operation, its output and
# (input, local derivative) pairs; backward walks the tape in reverse. One version
# accumulates, one overwrites.


# %%
def backprop(tape, out, accumulate=True):
    """Reverse mode over a tape of (output, [(input, ∂output/∂input), ...]).

    Returns d out/d node for every node.
    """
    grad = {out: 1.0}
    for node, inputs in reversed(tape):
        for name, local in inputs:
            contribution = grad.get(node, 0.0) * local  # chain rule along this edge
            grad[name] = (
                grad.get(name, 0.0) + contribution if accumulate else contribution
            )
    return grad


a_val = 3.0
tapes = {  # each op lists one (input, local derivative) pair per use of an input
    "y = a + a": [("y", [("a", 1.0), ("a", 1.0)])],
    "y = a * a": [("y", [("a", a_val), ("a", a_val)])],  # ∂(p·q)/∂p = q, ∂(p·q)/∂q = p
    "y = a * a + a": [
        ("t", [("a", a_val), ("a", a_val)]),
        ("y", [("t", 1.0), ("a", 1.0)]),
    ],
}
fns = {
    "y = a + a": lambda a: a + a,
    "y = a * a": lambda a: a * a,
    "y = a * a + a": lambda a: a * a + a,
}
for expr, tape in tapes.items():
    a = torch.tensor(a_val, dtype=f64, device=dev, requires_grad=True)
    (ref,) = torch.autograd.grad(fns[expr](a), a)
    good = backprop(tape, "y", accumulate=True)["a"]
    bad = backprop(tape, "y", accumulate=False)["a"]
    print(
        f"{expr:<14} autograd {fmt(ref, 1)}"
        f"   accumulate {fmt(good, 1)}   overwrite {fmt(bad, 1)}"
    )
    compare(
        f"{expr}: accumulate vs autograd",
        torch.tensor(good, dtype=f64),
        ref.cpu(),
        exact=True,
    )
    compare(
        f"{expr}: overwrite vs autograd",
        torch.tensor(bad, dtype=f64),
        ref.cpu(),
        exact=True,
    )

# %% [markdown]
# Accumulating gives $2$, $6$, $7$, equal to autograd bit for bit (the `exact` comparisons: sums
# and products of small integers are exact in float64); overwriting keeps only the last path
# ($1$, $3$, $3$) — wrong in every case (the ✗ lines). The same `+=` is why PyTorch's `.grad` **accumulates
# across `backward()` calls**: call it twice without zeroing and the gradient doubles. That is
# what `optimizer.zero_grad()` is for.

# %%
w = torch.tensor(3.0, dtype=f64, device=dev, requires_grad=True)
for call in (1, 2):
    (w * 2.0).backward()
    show(f"w.grad after backward() call {call}", w.grad, 1)
w.grad = None  # what zero_grad() does (set_to_none=True is its default)

# %% [markdown]
# ## Jacobians and what `backward()` really computes
#
# For a function $f: \mathbb{R}^n \to \mathbb{R}^m$, the **[Jacobian](../pages/glossary.md#term-Jacobian)** $J$ is the $m\times n$
# matrix $J_{ij} = \partial f_i/\partial x_j$: row $i$ is the gradient of output $i$. The chain rule
# for vectors is a product of Jacobians: if $L = \ell(f(x))$ with scalar $L$, then
#
# $$\frac{\partial L}{\partial x} = \underbrace{\frac{\partial L}{\partial f}}_{v^\top\ (1\times m)}\;
#   \underbrace{J}_{m\times n} \qquad (1\times n).$$
#
# Backpropagation never builds $J$. Each operation receives $v = \partial L/\partial f$ and returns
# $v^\top J$ directly — a **[vector–Jacobian product](../pages/glossary.md#term-vectorJacobian-product)** (VJP). `y.backward(gradient=v)` and
# `torch.autograd.grad(y, x, grad_outputs=v)` compute exactly this; `loss.backward()` is the
# special case of a scalar output with $v = 1$.
#
# Let us check it on $f(x) = \tanh(Wx)$ with $W$ of shape $(2, 3)$. Its Jacobian is
# $J = \mathrm{diag}(1 - \tanh^2(Wx))\,W$. `helpers.numgrad.autograd_jacobian` builds $J$ one
# row at a time — one VJP with $v = e_i$ per output — and `numerical_jacobian` by central
# differences (below).

# %%
from helpers.numgrad import autograd_jacobian, numerical_jacobian, vjp

W = randn(2, 3, seed=1, dtype=f64, device=dev)
x = randn(3, seed=2, dtype=f64, device=dev)


def f(x):
    """tanh(W x): R³ -> R²."""
    return torch.tanh(W @ x)  # (2, 3) @ (3,) -> (2,)


J_formula = (1 - f(x) ** 2)[:, None] * W  # diag(1 - tanh²) W: (2, 1) * (2, 3) -> (2, 3)
J_autograd = autograd_jacobian(f, x)  # 2 backward passes, one per output
show("J (formula)", J_formula, 6)
compare("J autograd vs formula", J_autograd, J_formula)
compare(
    "J finite differences vs formula",
    numerical_jacobian(f, x),
    J_formula,
    atol=1e-8,
    rtol=0,
)

v = torch.tensor([1.0, -2.0], dtype=f64, device=dev)
x_ = x.clone().requires_grad_(True)
f(x_).backward(gradient=v)  # one backward pass, never forms J
show("v", v, 1)
show("x.grad after f(x).backward(gradient=v)", x_.grad, 6)
show("v @ J", v @ J_formula, 6)  # (2,) @ (2, 3) -> (3,)
compare("backward(gradient=v) vs vᵀJ", x_.grad, v @ J_formula)
_ = compare("helpers.numgrad.vjp vs vᵀJ", vjp(f, x, v), v @ J_formula)

# %% [markdown]
# The tolerance is float64's default in `helpers.checks` (atol $10^{-10}$, rtol $10^{-8}$):
# `backward` and our formula add the same products in a different order, so the last bits
# may differ, but nothing more. Finite differences get atol $10^{-8}$: with $h = 10^{-6}$ their
# round-off is about $\varepsilon/h \approx 10^{-10}$ and their truncation error $h^2 \approx 10^{-12}$.
#
# Why VJPs? A loss is one number ($m = 1$), so one VJP gives its gradient with respect to
# *all* $n$ inputs, at a small constant multiple of the forward pass's cost, whatever $n$ is.
# How small? Count the floating-point operations of a linear layer $Y = XW^\top + b$ with
# PyTorch's `FlopCounterMode` (it counts matmul FLOPs; the bias is a negligible $B\cdot\text{out}$
# additions):

# %%
from torch.utils.flop_counter import FlopCounterMode

X_f = randn(64, 256, seed=5, dtype=f64, device=dev, requires_grad=True)  # (B, in)
W_f = randn(128, 256, seed=6, dtype=f64, device=dev, requires_grad=True)  # (out, in)
b_f = randn(128, seed=7, dtype=f64, device=dev, requires_grad=True)  # (out,)
with FlopCounterMode(display=False) as count_fwd:
    Y_f = torch.nn.functional.linear(X_f, W_f, b_f)  # (B, in) @ (in, out) -> (B, out)
with FlopCounterMode(display=False) as count_bwd:
    Y_f.backward(torch.ones_like(Y_f))  # grad_X = grad_Y W, grad_W = grad_Yᵀ X
flops_fwd, flops_bwd = count_fwd.get_total_flops(), count_bwd.get_total_flops()
print("forward  FLOPs:", flops_fwd, " = 2·B·in·out =", 2 * 64 * 256 * 128)
print("backward FLOPs:", flops_bwd)
show("backward / forward", flops_bwd / flops_fwd, 2)

# %% [markdown]
# The forward is one matmul (4194304 FLOPs); the backward is two of the same size,
# $\nabla_X = \nabla_Y W$ and $\nabla_W = \nabla_Y^\top X$ (8388608 FLOPs): backward costs
# **about twice the forward** (2.00 here), so a training step costs about three forwards.
# (When $X$ needs no gradient, as for the first layer's input, $\nabla_X$ is skipped and
# backward costs one forward.) Building the full Jacobian instead would take $m$ backward
# passes — for a layer with millions of outputs, hopeless. This is why reverse mode is the
# mode of deep learning.
#
# ## Finite differences: checking a gradient without calculus
#
# The definition of a derivative gives a check that needs no derivation at all. The
# **central difference**
#
# $$\frac{\partial f}{\partial x_i} \approx \frac{f(x + h e_i) - f(x - h e_i)}{2h}$$
#
# has error $\frac{h^2}{6} f'''$ (Taylor: the even terms cancel). `helpers.numgrad.numerical_grad`
# applies it to every entry of every input of any scalar function. It needs two forward passes per
# entry, so it is only for checking small cases. First, chapter 1's cat MLP: the finite-difference
# gradients agree with our hand-written ones.

# %%
from helpers import cat_mlp
from helpers.numgrad import numerical_grad

p = cat_mlp.cat_params(dtype=f64, device=dev)
grads = cat_mlp.backward(cat_mlp.forward(**p), p["W2"], p["y_true"])


def cat_loss(W1, b1, W2, b2):
    """L of chapter 1 as a function of the parameters."""
    return cat_mlp.forward(p["x"], W1, b1, W2, b2, p["y_true"])["L"]


num = numerical_grad(cat_loss, p["W1"], p["b1"], p["W2"], p["b2"], h=1e-6)
show("dL/dW1 by finite differences", num[0], 8)
for name, g in zip(("W1", "b1", "W2", "b2"), num):
    compare(
        f"dL/d{name}: finite differences vs hand-written",
        g,
        grads[name],
        atol=1e-8,
        rtol=0,
    )

# %% [markdown]
# Here the tolerance is $10^{-8}$, not float64's $10^{-10}$: a finite difference is an
# *approximation*. How good can it be? There are two errors pulling in opposite directions:
#
# * **truncation** — the Taylor terms we dropped — shrinks like $h^2$;
# * **round-off** — $f(x\pm h)$ are each stored with relative error up to $\varepsilon$ (machine
#   epsilon), and dividing their difference by $2h$ blows that up like $\varepsilon/h$.
#
# Their sum $\approx h^2 + \varepsilon/h$ is smallest near $h^\ast \approx \varepsilon^{1/3}$, with error
# about $\varepsilon^{2/3}$. We measure it on $f(x) = x^3$ at $x = 1$ (exact derivative 3;
# its truncation error is exactly $h^2$), in float32 and float64, for $h$ from $1$ down to
# $10^{-12}$.

# %%
from helpers.numgrad import fd_errors


def cube(x):
    """f(x) = x³ (plain multiplications: IEEE rounding, the same on every machine)."""
    return x * x * x


def cube_prime(x):
    """f'(x) = 3x²."""
    return 3 * x * x


hs = [10 ** (-k / 4) for k in range(49)]  # 1, 10^-0.25, ..., 1e-12
errors = {
    str(dt).replace("torch.", ""): fd_errors(cube, cube_prime, 1.0, hs, dt)
    for dt in (torch.float32, torch.float64)
}
print("      h    error float32   error float64")
for k in range(0, 49, 8):
    print(
        f"{fmt_sci(hs[k], 0):>7}"
        f"    {fmt_sci(errors['float32'][k]):>11}"
        f"    {fmt_sci(errors['float64'][k]):>11}"
    )
for dt in (torch.float32, torch.float64):
    name = str(dt).replace("torch.", "")
    eps = torch.finfo(dt).eps
    e = errors[name]
    best = min(range(len(hs)), key=lambda i: e[i])
    print(
        f"{name}: eps {fmt_sci(eps)};"
        f" theory h* ≈ eps^(1/3) = {fmt_sci(eps ** (1 / 3), 0)},"
        f" error ≈ eps^(2/3) = {fmt_sci(eps ** (2 / 3), 0)};"
    )
    print(f"    measured best h {fmt_sci(hs[best], 0)}, error {fmt_sci(e[best], 0)}")

# %% mystnb={"image": {"alt": "Log-log plot of the central difference's error for x\u00b3 at x = 1 against the step h: the error falls as h shrinks until rounding error takes over and it rises again."}}
import matplotlib.pyplot as plt

from helpers.plot_cat import plot_fd_errors

fig = plot_fd_errors(hs, errors, title="central difference of x³ at x = 1: error vs h")
plt.show()

# %% [markdown]
# The V shape: on the right the error falls along the line $h^2$ (truncation); on the left it
# rises like $\varepsilon/h$ (round-off). float64 reaches an error of $5\times 10^{-12}$ at
# $h = 3\times 10^{-6}$; float32 bottoms out at $3\times 10^{-6}$ at $h = 3\times 10^{-3}$ and, for
# $h$ below about $10^{-8}$, $1 \pm h$ rounds to exactly $1$ in float32: the difference is 0 and
# the error is the whole derivative, 3. The measured optima match the theory's order of
# magnitude (this $x^3$ is kinder than the worst case $\varepsilon^{2/3}$).
#
# Lesson: **run [gradient checks](../pages/glossary.md#term-gradient-check) in float64**. In float32 even the best step leaves an error
# around $\varepsilon^{2/3} \approx 2\times 10^{-5}$ relative to the function's size, and a
# step that is off by a factor 100 costs several more digits: too coarse to tell a subtle bug from round-off.
#
# ## `torch.autograd.gradcheck`
#
# PyTorch packages this check: `gradcheck(fn, inputs)` compares autograd's Jacobian with a
# finite-difference one (its defaults are printed below: step $10^{-6}$, atol $10^{-5}$, rtol $10^{-3}$)
# and returns `True` or raises. It wants float64 inputs and warns otherwise — for the reason we just measured.
# Below it passes on the cat MLP in float64, fails in float32 (round-off alone), and catches a
# deliberately wrong backward formula.

# %%
import inspect

from torch.autograd import gradcheck

defaults = inspect.signature(gradcheck).parameters
print(
    "gradcheck defaults: eps",
    fmt_sci(defaults["eps"].default, 0),
    " atol",
    fmt_sci(defaults["atol"].default, 0),
    " rtol",
    fmt_sci(defaults["rtol"].default, 0),
)

p64 = cat_mlp.cat_params(dtype=f64, device=dev, requires_grad=True)
ok = gradcheck(cat_loss, (p64["W1"], p64["b1"], p64["W2"], p64["b2"]))
print("gradcheck, cat MLP, float64:", ok)

t32 = randn(5, seed=3, device=dev, requires_grad=True)
# keep the warning's file path out of the page
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ok32 = gradcheck(lambda t: (t**3).sum(), (t32,), raise_exception=False)
print("gradcheck, t³ in float32:", ok32)
first_sentence = str(caught[0].message).split(".")[0] + "."
print(textwrap.fill(f"warning: {first_sentence}", 88, subsequent_indent="  "))


# A custom autograd.Function: forward computes, setup_context saves what backward needs,
# backward returns the input's gradient. Chapter 4 explains this form; here we only
# break it.
class CubeWrongBackward(torch.autograd.Function):
    """y = t³ with a deliberately wrong backward (3t instead of 3t²)."""

    @staticmethod
    def forward(t):
        return t**3

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, grad_output):
        (t,) = ctx.saved_tensors
        return grad_output * 3 * t  # the bug: should be 3 * t ** 2


t64 = randn(5, seed=3, dtype=f64, device=dev, requires_grad=True)
print(
    "gradcheck, wrong backward, float64:",
    gradcheck(
        lambda t: CubeWrongBackward.apply(t).sum(), (t64,), raise_exception=False
    ),
)

# %% [markdown]
# ## The linear layer: matrix calculus in `nn.Linear`'s layout
#
# A batch of $B$ inputs goes through $Y = XW^\top + b$ with
# $X$ of shape $(B, \text{in})$, $W$ of shape $(\text{out}, \text{in})$, $b$ of shape $(\text{out},)$
# and $Y$ of shape $(B, \text{out})$. Given $\nabla_Y = \partial L/\partial Y$ (shape of $Y$),
# write one entry, $Y_{bo} = \sum_i X_{bi} W_{oi} + b_o$, and apply the chain rule, summing over
# every entry of $Y$ that the variable touches:
#
# $$\frac{\partial L}{\partial W_{oi}} = \sum_b \nabla_{Y,bo}\, X_{bi}
#   \;\Rightarrow\; \nabla_W = \nabla_Y^\top X \quad (\text{out},B)(B,\text{in}) = (\text{out},\text{in}),$$
# $$\frac{\partial L}{\partial X_{bi}} = \sum_o \nabla_{Y,bo}\, W_{oi}
#   \;\Rightarrow\; \nabla_X = \nabla_Y W \quad (B,\text{out})(\text{out},\text{in}) = (B,\text{in}),$$
# $$\frac{\partial L}{\partial b_o} = \sum_b \nabla_{Y,bo}
#   \;\Rightarrow\; \nabla_b = \text{column sums of } \nabla_Y \quad (\text{out},).$$
#
# A useful way to remember them: **each gradient has the shape of its variable**, and there is
# only one way to multiply $\nabla_Y$ with $X$ or $W$ to get that shape. The sum over $b$ in
# $\nabla_W$ and $\nabla_b$ is where the batch's samples add up (next section).
#
# `helpers.numgrad.linear_backward` implements the three formulas. We check them against
# autograd in float32 (the tolerance is float32's default, atol $10^{-5}$, rtol $10^{-4}$: the
# matmuls sum $B$ or out products in whatever order the backend chooses) and in float64.

# %%
from helpers.numgrad import linear_backward, linear_forward

B, n_in, n_out = 4, 3, 5
for dtype in (torch.float32, f64):
    X = randn(B, n_in, seed=10, dtype=dtype, device=dev, requires_grad=True)  # (B, in)
    # (out, in)
    W = randn(n_out, n_in, seed=11, dtype=dtype, device=dev, requires_grad=True)
    b = randn(n_out, seed=12, dtype=dtype, device=dev, requires_grad=True)  # (out,)
    # (B, out): some upstream gradient
    grad_Y = randn(B, n_out, seed=13, dtype=dtype, device=dev)
    Y = torch.nn.functional.linear(X, W, b)  # (B, out)
    compare(f"Y = X Wᵀ + b ({dtype})", linear_forward(X, W, b), Y)
    ref = torch.autograd.grad(Y, [X, W, b], grad_outputs=grad_Y)
    ours = linear_backward(X.detach(), W.detach(), grad_Y)
    for name, o, r in zip(("grad_X", "grad_W", "grad_b"), ours, ref):
        compare(f"{name} {tuple(o.shape)} vs autograd ({dtype})", o, r)

# %% [markdown]
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 writes that `nn.Linear`'s weight gradient is `input.t() @ grad_output` and
# "verifies" `grad_w` against `x.t() @ torch.ones_like(y)` for `loss = y.sum()`. Look at the
# shapes: `x.t()` is $(\text{in}, B)$ and `ones_like(y)` is $(B, \text{out})$, so the product
# is $(\text{in}, \text{out}) = (3, 5)$, while `grad_w` has $W$'s shape
# $(\text{out}, \text{in}) = (5, 3)$. The comparison cannot even run (the hidden cell after
# this aside shows it; click to show). That formula is right for the *other* layout,
# $Y = XW$ with $W$ of shape $(\text{in}, \text{out})$ — not `nn.Linear`'s.
#
# </details>

# %% tags=["hide-cell"]
x = randn(4, 3, seed=20, device=dev)  # (B, in)
# (out, in), as nn.Linear stores it
w = randn(5, 3, seed=21, device=dev, requires_grad=True)
b = randn(5, seed=22, device=dev, requires_grad=True)
y = torch.nn.functional.linear(x, w, b)  # (B, out)
grad_w, grad_b = torch.autograd.grad(y.sum(), [w, b])
seed_formula = x.t() @ torch.ones_like(y)  # (in, B) @ (B, out) -> (in, out)
print(
    "grad_w shape:",
    tuple(grad_w.shape),
    "  x.t() @ ones_like(y) shape:",
    tuple(seed_formula.shape),
)
try:
    torch.allclose(grad_w, seed_formula)
except RuntimeError:
    print("torch.allclose(grad_w, x.t() @ ones_like(y)) raises RuntimeError:")
    print("  (5, 3) vs (3, 5)")
# (out, B) @ (B, in) -> (out, in)
compare("grad_output.t() @ input", torch.ones_like(y).t() @ x, grad_w)
_ = compare("grad_b = column sums of ones", torch.ones_like(y).sum(0), grad_b)

# %% [markdown]
# ## A batch gradient is a sum — unless the loss takes a mean
#
# In $\nabla_W = \nabla_Y^\top X = \sum_b \nabla_{Y,b}^\top X_b$ each term is one sample's own
# weight gradient. So with a **sum** loss $L = \sum_b \ell_b$, the batch gradient is the **sum** of
# the per-sample gradients — nothing divides by $B$ "implicitly". Only
# a **mean** loss $L = \frac1B\sum_b \ell_b$ (PyTorch's default `reduction="mean"`) makes it an
# average, because the $\frac1B$ is in the loss and the chain rule carries it into
# $\nabla_Y$. Numerically, with a squared-error loss and $B = 4$ (in float64 so that the printed
# digits are the same on every device):

# %%
B = 4
X = randn(B, 3, seed=30, dtype=f64, device=dev)  # (B, in)
T = randn(B, 2, seed=31, dtype=f64, device=dev)  # (B, out) targets
W = randn(2, 3, seed=32, dtype=f64, device=dev, requires_grad=True)  # (out, in)


def sample_loss(W, xb, tb):
    """ℓ_b = ‖W x_b − t_b‖² for one sample."""
    return ((W @ xb - tb) ** 2).sum()  # (2, 3) @ (3,) -> (2,)


per_sample = [torch.autograd.grad(sample_loss(W, X[i], T[i]), W)[0] for i in range(B)]
sum_of_per_sample = torch.stack(per_sample).sum(0)  # (B, 2, 3) -> (2, 3)
# (B, 3) @ (3, 2) -> (B, 2)
(grad_sum_loss,) = torch.autograd.grad(((X @ W.T - T) ** 2).sum(), W)
(grad_mean_loss,) = torch.autograd.grad(
    torch.nn.functional.mse_loss(X @ W.T, T, reduction="sum") / B, W
)
show("Σ_b per-sample grad", sum_of_per_sample, 6)
show("grad of the sum loss", grad_sum_loss, 6)
show("grad of the mean loss", grad_mean_loss, 6)
compare("sum-loss grad = Σ per-sample grads", grad_sum_loss, sum_of_per_sample)
compare(
    "mean-loss grad = Σ per-sample grads / B", grad_mean_loss, sum_of_per_sample / B
)
# reduction="mean"
(grad_mse_mean,) = torch.autograd.grad(torch.nn.functional.mse_loss(X @ W.T, T), W)
print(f"B = {B}; mse_loss(reduction='mean') divides by T.numel() = {T.numel()}")
_ = compare(
    "mse 'mean' grad = Σ per-sample / T.numel()",
    grad_mse_mean,
    sum_of_per_sample / T.numel(),
)

# %% [markdown]
# The sum-loss gradient equals the sum of the four per-sample gradients; the mean-loss
# gradient is that sum divided by $B = 4$. (Careful: `mse_loss(..., reduction="mean")` divides by
# *every element* — here $B\cdot\text{out} = 8$ — not by $B$; that is why the cell divides the sum
# by $B$ explicitly for the per-sample mean.) Which one you use changes the gradient's size by a factor $B$, and so
# the learning rate that works.
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 says that the batch gradient is "implicitly divided by B", and (3.1) that a larger
# `batch_size` makes `grad_w`'s variance smaller "because it is the average of the B
# samples' gradients". Both hold for a mean loss only; with a sum loss the gradient is the
# sum of the per-sample gradients, and its variance grows with $B$ (measured below).
#
# </details>
#
# The same factor decides what a larger batch does to the gradient's *noise*. A larger batch
# makes the gradient's variance smaller for a mean loss only: the variance of a mean of $B$
# independent per-sample gradients is $\sigma^2/B$, that of their sum $B\sigma^2$. Measured on
# 2000 random batches of each size, for $\ell_b = (w \cdot x_b - t_b)^2$ with $x_b, t_b \sim N(0, 1)$
# (total variance: the sum over the 3 entries of `grad_w`):

# %%
w_v = torch.tensor([0.5, -1.0, 2.0], dtype=f64, device=dev)  # (in,)
print(
    "   B   Var[grad_w], sum loss   Var[grad_w], mean loss   σ² of one sample's grad_w"
)
for B_v, seed in ((4, 60), (16, 61), (64, 62)):
    # (R, B, in): R = 2000 batches
    X_v = randn(2000, B_v, 3, seed=seed, dtype=f64, device=dev)
    t_v = randn(2000, B_v, seed=seed + 100, dtype=f64, device=dev)  # (R, B)
    r_v = X_v @ w_v - t_v  # (R, B, in) @ (in,) -> (R, B)
    g_per_sample = 2 * r_v[..., None] * X_v  # (R, B, in): ∂ℓ_b/∂w = 2(w·x_b − t_b) x_b
    var_sum = g_per_sample.sum(1).var(0).sum().item()  # (R, in) -> (in,) -> ()
    var_mean = g_per_sample.mean(1).var(0).sum().item()  # (R, in) -> (in,) -> ()
    # (R·B, in) -> (in,) -> ()
    var_one = g_per_sample.reshape(-1, 3).var(0).sum().item()
    print(
        f"{B_v:>4}   {fmt(var_sum, 1):>21}"
        f"   {fmt(var_mean, 3):>22}   {fmt(var_one, 1):>26}"
    )

# %% [markdown]
# One sample's gradient has a total variance $\sigma^2$ between 96.2 and 98.7. With a mean loss the
# batch gradient's variance falls as $\sigma^2/B$: 24.500, 5.971, 1.538 for $B$ = 4, 16, 64. With a
# sum loss it *grows* as $B\sigma^2$: 392.0, 1528.5, 6299.4. But the sum gradient itself grows
# as $B$ too (it is exactly $B$ times the mean), so its *relative* noise falls as $1/\sqrt B$
# either way. The difference is scale: a sum loss is a mean loss with the learning rate
# silently multiplied by $B$, so "averages, hence smaller variance" is true of the mean, and
# of the sum only after dividing by $B$.
#
# ## Broadcasting's backward is a sum
#
# In $Y = XW^\top + b$ the bias $b$ of shape $(\text{out},)$ is **broadcast** ([broadcasting](../pages/glossary.md#term-broadcasting)): the same $b$ is added
# to all $B$ rows. A value used $B$ times collects $B$ gradient contributions — the
# accumulation rule again — so its gradient is the sum over the broadcast dimension. In general:
# sum over the dimensions that broadcasting added (leading ones) and over the size-1 dimensions it
# stretched, keeping those with `keepdim=True` so the shape comes back.
# `helpers.numgrad.unbroadcast(grad, shape)` does this.

# %%
from helpers.numgrad import unbroadcast

X = randn(4, 3, seed=40, dtype=f64, device=dev)  # (B, n)
G = randn(4, 3, seed=41, dtype=f64, device=dev)  # upstream grad, (B, n)
for shape in [(3,), (1, 3), (4, 1), (1, 1)]:
    c = randn(*shape, seed=42, dtype=f64, device=dev, requires_grad=True)
    (ref,) = torch.autograd.grad(X + c, c, grad_outputs=G)  # c broadcast to (4, 3)
    ours = unbroadcast(G, shape)
    compare(f"c {shape}: unbroadcast vs autograd, grad {tuple(ours.shape)}", ours, ref)
show(
    "G.sum(0, keepdim=True)  (gradient of c of shape (1, 3))", G.sum(0, keepdim=True), 6
)
show(
    "G.sum(1, keepdim=True)  (gradient of c of shape (4, 1))", G.sum(1, keepdim=True), 6
)

# %% [markdown]
# ## "Exact" or "allclose"?
#
# Every check in this chapter printed its tolerance. Why not always demand equality?
# Floating-point addition is not associative: the same numbers added in a different order can
# give a different result. Autograd, cuBLAS or a different CPU may order the sums of a matmul
# differently from your formula. A tiny float32 example:

# %%
big, one = torch.tensor(1e8), torch.tensor(1.0)  # float32
left = (big + one) - big  # 1e8 + 1 rounds back to 1e8 in float32
right = (big - big) + one
show("(1e8 + 1) - 1e8", left, 1)
show("(1e8 - 1e8) + 1", right, 1)
vals = randn(1000, seed=50)  # float32, on the CPU
s_fwd, s_bwd = torch.tensor(0.0), torch.tensor(0.0)
for i in range(1000):  # the same 1000 numbers, summed in two orders
    s_fwd = s_fwd + vals[i]
    s_bwd = s_bwd + vals[999 - i]
compare("sum forwards vs backwards, exact", s_fwd, s_bwd, exact=True)
_ = compare("sum forwards vs backwards, allclose", s_fwd, s_bwd, atol=1e-5, rtol=1e-4)

# %% [markdown]
# So the rule of this course (`helpers.checks.compare`):
#
# * **exact** (`exact=True`) only when both sides do the same float operations in the same order
#   — as in chapter 1, where every gradient entry was a single product;
# * otherwise **allclose** with a tolerance you can justify: in float32 atol $10^{-5}$, rtol
#   $10^{-4}$, some hundreds of units of round-off at 1.0 (chapter 6 prints the count); in float64
#   atol $10^{-10}$, rtol $10^{-8}$, far more units of its much smaller round-off, yet far below any
#   real mistake; and wider for approximations like finite differences ($10^{-8}$ with
#   $h = 10^{-6}$ in float64);
# * always print the largest difference, so that "passes" has a number behind it.
#
# ## Summary
#
# * Chain rule: multiply local derivatives along a path; **add** over paths. A node used
#   twice accumulates (`+=`); overwriting gave $1, 3, 3$ instead of $2, 6, 7$. `.grad` accumulates
#   across `backward()` calls too.
# * `backward()` computes a vector–Jacobian product $v^\top J$, never the Jacobian; for a scalar
#   loss $v = 1$ and one backward pass gives the whole gradient.
# * Central differences check any gradient; the error is $\approx h^2 + \varepsilon/h$, best near
#   $h \approx \varepsilon^{1/3}$; on $x^3$ the best errors were $5\times 10^{-12}$ in float64 and $3\times 10^{-6}$ in float32. Check in float64;
#   `gradcheck` does it for you.
# * Linear layer, `nn.Linear` layout: $\nabla_W = \nabla_Y^\top X$, $\nabla_X = \nabla_Y W$,
#   $\nabla_b = $ column sums of $\nabla_Y$. Seed 000's `x.t() @ grad_y` has shape (in, out), the transpose.
# * A batch gradient is the **sum** of per-sample gradients; a mean loss divides it by $B$. Its
#   variance is then $\sigma^2/B$; with a sum it grows as $B\sigma^2$ together with the gradient
#   itself, so the relative noise falls as $1/\sqrt B$ in both cases and the sum only rescales the
#   step by $B$.
# * Broadcasting's backward sums over the broadcast dimensions (`sum(dim, keepdim=True)`).
#
# ## Common mistakes
#
# * **Overwriting instead of accumulating** a gradient of a value used twice (a shared weight,
#   a residual connection, a broadcast bias).
# * **Forgetting `zero_grad()`** between steps: `.grad` keeps adding up.
# * **Transposes from the wrong layout**: in `nn.Linear`'s layout $W$ is (out, in), so
#   $\nabla_W = \nabla_Y^\top X$, not $X^\top\nabla_Y$. Check every gradient's shape against its variable.
# * **Sum vs mean**: assuming a batch gradient is averaged when the loss is a sum (or forgetting
#   that `reduction="mean"` divides by all elements, not just $B$).
# * **Gradient checks in float32**, or with a step $h$ that is far too small or too large.
# * **Demanding exact equality** where the summation order differs — or accepting a loose
#   `allclose` without saying why that tolerance.
#
# **Next:** [Lab 2](../labs/lab02_chain_rule.ipynb) has you apply these rules where this
# chapter did not: a directional-derivative gradient check (what `gradcheck`'s fast mode does),
# the linear layer's backward in Flax's $(\text{in}, \text{out})$ weight layout, a residual
# block's backward, and the backward of a tiled tensor (`repeat`). Chapter 3 opens up autograd
# itself: the graph that `backward()` walks.
