# %% [markdown]
# # 1. The cat MLP by hand
#
# [Backpropagation](../pages/glossary.md#term-backpropagation) (反向传播) is the [chain rule](../pages/glossary.md#term-chain-rule) applied one layer at a time, from the loss
# back to every parameter. In this chapter we do it with a pencil — well, with plain tensor
# arithmetic and no autograd — on a network small enough that every number fits on one line:
# the "cat" embedding $x = [1, 2, -1, 0.5]$ through two linear layers with a ReLU between
# them, and a squared-error loss against the target $1.0$.
#
# **Learning goals.** After this chapter you can
#
# 1. compute the forward pass of a two-layer MLP by hand and keep every intermediate value;
# 2. walk the chain rule backwards: $\partial L/\partial \hat y$, then the second layer's
#    parameters, then through the ReLU, then the first layer's parameters;
# 3. explain why a ReLU unit with $h \le 0$ (a *dead* unit) passes back a zero gradient, so its
#    weights learn nothing on this input;
# 4. check a hand-written gradient against `loss.backward()` and say whether the match is
#    exact or within a tolerance, and why;
# 5. take one gradient-descent step and watch the loss fall.
#
# The numbers are those of the original article (seed 004), digit for digit.
#
# **The seed articles.** The course grew out of three Chinese articles, which the chapters
# call *the seeds* by their numbers: **seed 004** works this very cat MLP by hand,
# **seed 000** is a tour of backpropagation and Transformers in PyTorch, and **seed 003**
# derives a Transformer + LoRA backward by hand. The chapters reproduce their worked examples
# and measurements; where a seed gets something wrong, the mistake and its correction sit in a
# collapsible aside, *What the source articles got wrong*, so that they do not interrupt the
# derivation. The [landing page](../intro.md) (section "Where it starts from, and what it
# corrects") has a table of the main corrections.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import torch

from helpers.checks import compare
from helpers.device import get_device, no_tf32
from helpers.show import fmt, fmt_sci, show

# CUDA when there is one, else the CPU: the printed numbers are the same
dev = get_device()
no_tf32()  # TF32 would change float32 matmul digits on recent GPUs

# %% [markdown]
# ## The network
#
# $$\begin{aligned}
# x \in \mathbb{R}^4 &\xrightarrow{\;W_1,\,b_1\;} h \in \mathbb{R}^2
#   \xrightarrow{\;\mathrm{ReLU}\;} a \\
# &\xrightarrow{\;W_2,\,b_2\;} \hat y \in \mathbb{R} \longrightarrow L = (\hat y - y)^2
# \end{aligned}$$
#
# with $h = W_1 x + b_1$, $a = \max(h, 0)$, $\hat y = W_2 a + b_2$ and the target $y = 1$.
# The weight matrices use `nn.Linear`'s layout: $W$ has shape `(out, in)`, so $W_1$ is
# $2 \times 4$ and $W_2$ is $1 \times 2$. The hidden size is 2 only so that we can follow
# every number; nothing below depends on it.
#
# We store everything in **float64**. Decimal numbers like $0.1$ have no exact binary
# representation, so every operation rounds; in float64 that rounding sits around the 16th
# significant digit, far below the 8 decimals we print, and the printout shows exactly the
# seed's digits. (Later in the chapter we redo it in float32 and look at the difference.)

# %%
dtype = torch.float64
x = torch.tensor([1.0, 2.0, -1.0, 0.5], dtype=dtype, device=dev)  # (4,)
# (2, 4) = (out, in)
W1 = torch.tensor([[0.1,  0.2, -0.1, 0.05],
                   [0.3, -0.1,  0.2, 0.1 ]], dtype=dtype, device=dev)  # fmt: skip
b1 = torch.tensor([0.1, -0.1], dtype=dtype, device=dev)  # (2,)
W2 = torch.tensor([[0.5, -0.4]], dtype=dtype, device=dev)  # (1, 2)
b2 = torch.tensor([0.2], dtype=dtype, device=dev)  # (1,)
y_true = torch.tensor([1.0], dtype=dtype, device=dev)  # (1,)
show("x", x)
show("W1", W1)

# %% [markdown]
# ## Forward pass, one step at a time
#
# **First layer.** Each hidden unit is one row of $W_1$ dotted with $x$, plus its bias:
#
# $$\begin{aligned}
# h_1 &= 0.1\cdot 1 + 0.2\cdot 2 + (-0.1)\cdot(-1) + 0.05\cdot 0.5 + 0.1, \\
# h_2 &= 0.3\cdot 1 + (-0.1)\cdot 2 + 0.2\cdot(-1) + 0.1\cdot 0.5 - 0.1 .
# \end{aligned}$$

# %%
h1 = 0.1 * 1 + 0.2 * 2 + (-0.1) * (-1) + 0.05 * 0.5 + 0.1
h2 = 0.3 * 1 + (-0.1) * 2 + 0.2 * (-1) + 0.1 * 0.5 + (-0.1)
show("h1 (by hand)", h1, 8)
show("h2 (by hand)", h2, 8)
h = W1 @ x + b1  # (2, 4) @ (4,) -> (2,): the same two dot products at once
show("h = W1 @ x + b1", h, 8)

# %% [markdown]
# **ReLU.** $a_i = \max(h_i, 0)$. The second unit has $h_2 = -0.15 < 0$, so ReLU sets it to 0.
# Remember this: it will matter a lot on the way back.

# %%
a = torch.clamp(h, min=0)  # (2,): ReLU
show("a = ReLU(h)", a, 8)

# %% [markdown]
# **Second layer and loss.** $\hat y = 0.5\cdot 0.725 + (-0.4)\cdot 0 + 0.2$ and
# $L = (\hat y - 1)^2$.

# %%
y_hat = W2 @ a + b2  # (1, 2) @ (2,) -> (1,)
L = ((y_hat - y_true) ** 2).sum()  # (): one number
show("y_hat", y_hat, 8)
show("L", L, 8)

# %% [markdown]
# The [forward pass](../pages/glossary.md#term-forward-pass) gives $h = [0.725, -0.15]$, $a = [0.725, 0]$, $\hat y = 0.5625$ and
# $L = 0.19140625$. We kept every intermediate ($h$, $a$, $\hat y$): the backward pass needs
# them. That is why training uses more memory than inference.
#
# ## Backward pass: the chain rule, layer by layer
#
# The [backward pass](../pages/glossary.md#term-backward-pass) computes a [gradient](../pages/glossary.md#term-gradient) for every parameter: we want $\partial L/\partial\theta$ for every parameter $\theta \in \{W_1, b_1, W_2, b_2\}$.
# We never write $L$ as one big formula in $W_1$. Instead we walk back along the chain
# $x \to h \to a \to \hat y \to L$ and at each node multiply *the gradient that arrived from
# above* by *the local derivative of this node*. We call the arriving gradient `grad_<name>`
# $= \partial L/\partial\,\text{name}$; it always has the same shape as `name`.
#
# **Step 1 — the loss.** $L = (\hat y - y)^2$, so
# $\dfrac{\partial L}{\partial \hat y} = 2(\hat y - y)$. Mind the factor 2.

# %%
grad_y_hat = 2 * (y_hat - y_true)  # (1,)
show("grad_y_hat = dL/dŷ", grad_y_hat, 8)

# %% [markdown]
# **Step 2 — second layer's parameters.** $\hat y = W_2 a + b_2$ gives
# $\partial \hat y/\partial W_{2,j} = a_j$ and $\partial\hat y/\partial b_2 = 1$, so
#
# $$\frac{\partial L}{\partial W_2} = \frac{\partial L}{\partial \hat y}\, a^\top \;(1\times 2),
# \qquad \frac{\partial L}{\partial b_2} = \frac{\partial L}{\partial \hat y}.$$

# %%
grad_W2 = torch.outer(grad_y_hat, a)  # (1,) ⊗ (2,) -> (1, 2): same shape as W2
grad_b2 = grad_y_hat  # (1,)
show("grad_W2 = dL/dW2", grad_W2, 8)
show("grad_b2 = dL/db2", grad_b2, 8)

# %% [markdown]
# **Step 3 — back into the hidden layer.** $a$ is not a parameter, but the gradient must pass
# through it to reach $W_1$. Since $\partial\hat y/\partial a_j = W_{2,j}$:
#
# $$\frac{\partial L}{\partial a} = W_2^\top \frac{\partial L}{\partial \hat y}
#   = -0.875 \cdot [0.5, -0.4].$$

# %%
grad_a = W2.T @ grad_y_hat  # (2, 1) @ (1,) -> (2,): the transpose of the forward W2
show("grad_a = dL/da", grad_a, 8)

# %% [markdown]
# **Step 4 — through the ReLU.** $\mathrm{ReLU}'(h) = 1$ where $h > 0$ and $0$ where $h \le 0$,
# so the gradient is multiplied elementwise ($\odot$) by that 0/1 mask:
#
# $$\frac{\partial L}{\partial h} = \frac{\partial L}{\partial a} \odot \mathbb{1}[h > 0].$$

# %%
relu_mask = (h > 0).to(dtype)  # (2,): 1 where the unit was active in the forward pass
grad_h = grad_a * relu_mask  # (2,)
show("ReLU'(h)", relu_mask, 0)
show("grad_h = dL/dh", grad_h, 8)

# %% [markdown]
# **Step 5 — first layer's parameters.** Row $i$ of $W_1$ only feeds $h_i$, and
# $\partial h_i/\partial W_{1,ij} = x_j$. So row $i$ of the gradient is
# $\partial L/\partial h_i$ times $x$: an outer product.
#
# $$\frac{\partial L}{\partial W_1} = \frac{\partial L}{\partial h}\, x^\top \;(2\times 4),
# \qquad \frac{\partial L}{\partial b_1} = \frac{\partial L}{\partial h}.$$

# %%
grad_W1 = torch.outer(grad_h, x)  # (2,) ⊗ (4,) -> (2, 4): same shape as W1
grad_b1 = grad_h  # (2,)
show("grad_W1 = dL/dW1", grad_W1, 8)
show("grad_b1 = dL/db1", grad_b1, 8)

# %% [markdown]
# That is backpropagation: five small local steps, each "gradient from above × local
# derivative", and no step needed the whole formula for $L$.
#
# ## All the numbers against the seed
#
# The table lists every value we computed next to the number printed in the seed article.
# `compare(..., atol=1e-12, rtol=0)` asks for agreement to 12 decimals: float64 round-off
# on numbers of size 1 is about $10^{-16}$, so anything larger would be a real mistake.

# %%
seed_004 = {  # the article's numbers, as decimals
    "h": [0.725, -0.15],
    "a": [0.725, 0.0],
    "y_hat": [0.5625],
    "L": 0.19140625,
    "grad_y_hat": [-0.875],
    "grad_W2": [[-0.634375, 0.0]],
    "grad_b2": [-0.875],
    "grad_a": [-0.4375, 0.35],
    "grad_h": [-0.4375, 0.0],
    "grad_W1": [[-0.4375, -0.875, 0.4375, -0.21875], [0.0, 0.0, 0.0, 0.0]],
    "grad_b1": [-0.4375, 0.0],
}
ours = {
    "h": h,
    "a": a,
    "y_hat": y_hat,
    "L": L,
    "grad_y_hat": grad_y_hat,
    "grad_W2": grad_W2,
    "grad_b2": grad_b2,
    "grad_a": grad_a,
    "grad_h": grad_h,
    "grad_W1": grad_W1,
    "grad_b1": grad_b1,
}
for name in seed_004:
    print(f"{name:>10} = {fmt(ours[name], 8)}".replace("\n", "\n" + " " * 13))
print()
for name, ref in seed_004.items():
    compare(
        f"{name} vs seed",
        ours[name],
        torch.tensor(ref, dtype=dtype, device=dev),
        atol=1e-12,
        rtol=0,
    )

# %% [markdown]
# ### Why float64? The same computation in float32
#
# In float32, $0.1$ is stored as the nearest number with a 24-bit mantissa. Printing the
# stored values with 12 decimals shows what the computer really multiplies:

# %%
for v in (0.1, 0.2, 0.05, 0.725):
    print(
        f"{v}: float32 stores {fmt(torch.tensor(v, dtype=torch.float32), 12)},"
        f" float64 stores {fmt(torch.tensor(v, dtype=torch.float64), 12)}"
    )
print(
    "machine epsilon: float32",
    fmt_sci(torch.finfo(torch.float32).eps, 2),
    " float64",
    fmt_sci(torch.finfo(torch.float64).eps, 2),
)

# %% [markdown]
# float32 keeps about 7 significant digits: $0.725$ becomes $0.725000023842$, an error of
# $2.4\times 10^{-8}$, in line with float32's machine epsilon `1.19e-07` (the gap
# between 1 and the next float32). float64's epsilon is `2.22e-16`, which is why
# all its printed digits agree with the seed. The next cell reruns the whole forward and
# backward pass in float32 with the course helper `helpers.cat_mlp` (the same five steps you
# just did by hand, tested against autograd) and compares with float64: an exact comparison
# fails, and a tolerance of $10^{-6}$ — about ten times float32's epsilon on numbers of size
# about 1 — passes. At 6 decimals the float32 loss still reads like the seed's.

# %%
from helpers import cat_mlp

p32 = cat_mlp.cat_params(dtype=torch.float32, device=dev)
cache32 = cat_mlp.forward(**p32)
grads32 = cat_mlp.backward(cache32, p32["W2"], p32["y_true"])
show("L in float32 (6 decimals)", cache32["L"], 6)
compare("h float32 vs float64, exact", cache32["h"], h, exact=True)
compare("h float32 vs float64", cache32["h"], h, atol=1e-6, rtol=0)
compare("y_hat float32 vs float64", cache32["y_hat"], y_hat, atol=1e-6, rtol=0)
_ = compare("grad_a float32 vs float64", grads32["a"], grad_a, atol=1e-6, rtol=0)

# %% [markdown]
# ## The course helper gives the same numbers
#
# From now on we will not redo these steps by hand: `helpers.cat_mlp.forward` and
# `helpers.cat_mlp.backward` contain exactly the five steps above (read them — they are
# short). In float64 they perform the very same operations in the same order, so we demand
# bit-for-bit equality (`exact=True`).

# %%
p = cat_mlp.cat_params(dtype=dtype, device=dev)
cache = cat_mlp.forward(**p)
grads = cat_mlp.backward(cache, p["W2"], p["y_true"])
compare("forward h", cache["h"], h, exact=True)
compare("forward L", cache["L"], L, exact=True)
for name, mine in [
    ("y_hat", grad_y_hat),
    ("W2", grad_W2),
    ("b2", grad_b2),
    ("a", grad_a),
    ("h", grad_h),
    ("W1", grad_W1),
    ("b1", grad_b1),
]:
    compare(f"grad_{name}", grads[name], mine, exact=True)

# %% [markdown]
# ## Checking against `loss.backward()`
#
# Now the independent check. We rebuild the network with `requires_grad=True`, run the same
# forward pass, and let PyTorch's autograd do the backward pass. During the forward pass
# autograd records the computation graph; `backward()` walks it in reverse and stores
# $\partial L/\partial\theta$ in each parameter's `.grad`.
#
# Can we expect *exact* equality? Here, yes: in this network every gradient entry is a
# single product of two numbers (an outer product, or $W_2^\top$ times a one-element vector)
# with no sum whose order could differ, and autograd multiplies the same numbers. A network
# with wider layers would sum many products, and then the order of summation can change the
# last bits, so we would compare with a tolerance.

# %%
q = cat_mlp.cat_params(dtype=dtype, device=dev, requires_grad=True)
h_ag = q["W1"] @ q["x"] + q["b1"]  # (2, 4) @ (4,) -> (2,)
y_hat_ag = q["W2"] @ torch.relu(h_ag) + q["b2"]  # (1, 2) @ (2,) -> (1,)
loss = ((y_hat_ag - q["y_true"]) ** 2).sum()
loss.backward()
for name, mine in [("W1", grad_W1), ("b1", grad_b1), ("W2", grad_W2), ("b2", grad_b2)]:
    compare(f"dL/d{name}: by hand vs loss.backward()", mine, q[name].grad, exact=True)
show("W1.grad from autograd", q["W1"].grad, 8)

# %% [markdown]
# ## The dead ReLU unit
#
# Look again at $\partial L/\partial W_1$: its second row and $\partial L/\partial b_{1}[1]$
# are all zero. Nothing went wrong. In the forward pass $h_2 = -0.15 < 0$, so ReLU output
# $a_2 = 0$ *whatever small change we make to $h_2$*: the unit is switched off for this input
# (a [dead ReLU](../pages/glossary.md#term-dead-ReLU)).
# The chain rule multiplies by $\mathrm{ReLU}'(h_2) = 0$, and everything upstream of $h_2$
# — the whole second row of $W_1$ and $b_1[1]$ — receives a zero gradient.
#
# "Zero gradient" has a concrete meaning you can test: nudge $b_1[1]$ (or any entry of
# $W_1$'s second row) a little, and the loss does not move at all. Nudge $b_1[0]$ and it does.

# %%
eps = 0.01
for label, (name, idx) in {
    "b1[1] (dead unit)": ("b1", (1,)),
    "W1[1,2] (dead unit)": ("W1", (1, 2)),
    "b1[0] (live unit)": ("b1", (0,)),
}.items():
    nudged = {k: v.detach().clone() for k, v in p.items()}
    nudged[name][idx] += eps
    L_new = cat_mlp.forward(**nudged)["L"]
    predicted = eps * grads[name][idx]  # first-order change: ε · ∂L/∂θ
    print(f"nudge {label} by +{eps}: L {fmt(L, 8)} -> {fmt(L_new, 8)}")
    print(f"    change {fmt(L_new - L, 8)}, predicted ε·∂L/∂θ = {fmt(predicted, 8)}")

# %% [markdown]
# The dead unit's change is exactly 0, as its gradient says. The live unit's change,
# $-0.00435$, is close to the gradient's prediction $0.01 \times \partial L/\partial b_1[0] = -0.004375$;
# the small rest is the second-order term ($\varepsilon^2$ times a curvature),
# which the gradient does not see. (On another input the same unit may well be alive: "dead" is a
# statement about this example. What gets a zero gradient is the unit's *own* incoming
# weights and bias (and its outgoing weight $W_2[0,1]$, since $a_2 = 0$); the rest of the network
# still gets gradients. Here $h_2$ is computed straight from the data, so if it were $\le 0$ for
# every training example, plain gradient descent would never move that row again — the
# "dying ReLU" problem. A unit deeper in a network can still come back: its input is the
# previous layer's output, which keeps changing as the earlier layers learn. Chapter 5 counts
# such units.)
#
# ## The computation graph
#
# The figure puts all of it on one picture, the [computational graph](../pages/glossary.md#term-computational-graph): forward values travel left to right (blue),
# gradients travel right to left (red). The dead unit shows up as the zeros in $\partial L/\partial h$
# and in the second row of $\partial L/\partial W_1$.

# %% mystnb={"image": {"alt": "The cat MLP's computation graph: forward values flow left to right in blue, gradients right to left in red; the dead ReLU unit shows as zeros in \u2202L/\u2202h and in the second row of \u2202L/\u2202W1."}}
import matplotlib.pyplot as plt

from helpers.plot_cat import draw_cat_graph

fig = draw_cat_graph(cache, grads, p)
plt.show()

# %% [markdown]
# ## One step of gradient descent
#
# The gradient points in the direction in which $L$ grows fastest, so we step the other way:
#
# $$\theta \leftarrow \theta - \eta\,\frac{\partial L}{\partial \theta}$$
#
# with [learning rate](../pages/glossary.md#term-learning-rate) $\eta = 0.1$. `helpers.cat_mlp.sgd_step` does exactly this for
# $W_1, b_1, W_2, b_2$ and returns new tensors.

# %%
lr = 0.1
p_new = cat_mlp.sgd_step(p, grads, lr)
cache_new = cat_mlp.forward(**p_new)
show("L before the step", cache["L"], 8)
show("L after the step ", cache_new["L"], 8)
show("y_hat before", cache["y_hat"], 8)
show("y_hat after ", cache_new["y_hat"], 8)
show("W1 after the step", p_new["W1"], 8)
_ = compare("W1's dead row did not move", p_new["W1"][1], p["W1"][1], exact=True)

# %% [markdown]
# One step takes the loss from $0.19140625$ to $0.01569821$ and moves the prediction from
# $0.5625$ to $0.87470752$, towards the target $1$. The second row of $W_1$ did not move:
# its gradient was zero.
#
# ## Play with it
#
# The panel below has a slider for every input and weight. Each move reruns the forward pass
# and the hand-written backward pass (`helpers.cat_mlp`, float64) and reprints every value and
# gradient, with the graph. Try to bring the dead unit back to life: raise `b1[1]` above
# $0.05$ (then $h_2 > 0$), or make `x[0]` larger. Watch the second row of $\partial L/\partial W_1$
# switch on.
#
# *The live panel needs a running Python kernel, so it is only in the notebook: open this
# chapter in Colab (rocket icon at the top) or in Jupyter to use it. On the website the
# table and the animation below show the same experiment.*

# %% tags=["remove-cell"]
# The live panel (in Jupyter and Colab only; the website leaves this cell out).
from helpers.widgets_cat import cat_panel

panel = cat_panel(graph=True)
panel

# %% [markdown]
# The same experiment as a table: move $b_1[1]$ from $-0.26$ to $0.14$ and recompute.
# While $h_2 \le 0$ the loss is flat and the gradients reaching $b_1[1]$, $W_1[1,\cdot]$ and
# $W_2[0,1]$ are exactly 0; once $h_2 > 0$ they switch on.

# %%
from helpers.widgets_cat import sweep, sweep_animation

values = [-0.26 + 0.04 * k for k in range(11)]
rows = sweep("b1", (1,), values)
print(" b1[1]       h2   state         L   dL/db1[1]  dL/dW2[0,1]")
for r in rows:
    h2_ = r["cache"]["h"][1]
    state = "alive" if h2_ > 0 else "dead "
    L_, g_b1, g_W2 = r["cache"]["L"], r["grads"]["b1"][1], r["grads"]["W2"][0, 1]
    print(
        f"{fmt(r['value'], 2):>6} {fmt(h2_, 4):>8}   {state:5} "
        f"{fmt(L_, 6):>9} {fmt(g_b1, 6):>11} {fmt(g_W2, 6):>12}"
    )

# %% [markdown]
# And as an animation that works on this page without a kernel (use its slider and
# buttons): the red dot is the current value of $b_1[1]$, the dashed line marks $h_2 = 0$,
# where the unit comes alive.

# %% tags=["nbval-ignore-output"]
# Output not compared by nbval: the player's HTML carries random element ids and
# PNG bytes.
# The numbers it draws are the ones printed (and checked) in the table above.
from IPython.display import HTML

anim = sweep_animation("b1", (1,), values)
HTML(anim.to_jshtml(default_mode="once"))

# %% [markdown]
# Notice the sign: once the unit is alive, $\partial L/\partial b_1[1] > 0$, so gradient descent
# would *lower* $b_1[1]$ again. With $W_{2}[0,1] = -0.4$, an active second unit pulls $\hat y$
# away from the target, and the loss is smallest with the unit off.
#
# ## Summary
#
# * The forward pass keeps every intermediate: $h = [0.725, -0.15]$, $a = [0.725, 0]$,
#   $\hat y = 0.5625$, $L = 0.19140625$.
# * The backward pass walks the same chain in reverse, each step "gradient from above ×
#   local derivative": $\partial L/\partial\hat y = -0.875$; $\partial L/\partial W_2 = [-0.634375, 0]$,
#   $\partial L/\partial b_2 = -0.875$; $\partial L/\partial a = [-0.4375, 0.35]$;
#   $\partial L/\partial h = [-0.4375, 0]$; $\partial L/\partial W_1$ has rows $[-0.4375, -0.875, 0.4375, -0.21875]$ and $[0, 0, 0, 0]$,
#   $\partial L/\partial b_1 = [-0.4375, 0]$.
# * A linear layer $h = W x + b$ sends back $W^\top\,\partial L/\partial h$ to its input and
#   receives the outer product $\partial L/\partial h\; x^\top$ as its weight gradient — same shape as $W$.
# * ReLU's backward is a mask: units with $h \le 0$ pass back 0, so their incoming weights do
#   not learn on this input (the dead unit).
# * Our hand gradients equal `loss.backward()` bit for bit here (no sums whose order could
#   differ); float32 differs from float64 by round-off near float32's epsilon.
# * One gradient step with $\eta = 0.1$ lowers the loss from $0.19140625$ to $0.01569821$.
#
# ## Common mistakes
#
# Each of these gives a wrong gradient that *looks* plausible. The cell shows what each
# mistake produces and that the check catches it.

# %%
# 1. Forgetting the factor 2 of the squared error's derivative
wrong_grad_y_hat = y_hat - y_true
compare("dL/dŷ without the factor 2", wrong_grad_y_hat, grad_y_hat, atol=1e-12, rtol=0)
# 2. Forgetting ReLU's mask: the dead unit would "learn"
wrong_grad_W1 = torch.outer(grad_a, x)  # (2,) ⊗ (4,) -> (2, 4), mask missing
compare("dL/dW1 without ReLU's mask", wrong_grad_W1, grad_W1, atol=1e-12, rtol=0)
# 3. Forgetting the transpose: W2 @ grad_y_hat is not even defined
try:
    W2 @ grad_y_hat  # (1, 2) @ (1,): shapes do not match
except RuntimeError:
    print("✗ W2 @ grad_y_hat raises: (1, 2) @ (1,) does not fit")
    print("  it must be W2.T @ grad_y_hat")
# 4. Outer product the wrong way round: the shape of x ⊗ grad_h is W1's transpose
_ = compare(
    "x ⊗ grad_h in place of grad_h ⊗ x",
    torch.outer(x, grad_h),
    grad_W1,
    atol=1e-12,
    rtol=0,
)

# %% [markdown]
# * **The factor 2.** $\frac{d}{d\hat y}(\hat y - y)^2 = 2(\hat y - y)$: without it every gradient is
#   half as large (and if the loss is a *mean* over outputs, divide by their number too).
# * **ReLU's mask.** Multiply by $\mathbb{1}[h > 0]$ from the *forward* pass. $\mathbb{1}[a > 0]$ is
#   the same mask ($a = \max(h, 0)$ is positive exactly where $h$ is, which is why autograd's ReLU
#   keeps only its output, chapters 3 and 4); the gradient's sign is not a mask at all.
# * **Transposes and shapes.** The gradient of a tensor has that tensor's shape. Going back
#   through $W$ uses $W^\top$; a weight gradient is (gradient at the output) ⊗ (input), in that order.
#   Checking shapes catches most of these before any number does.
# * **Comparing without saying how.** Say whether you expect exact equality or a tolerance, and
#   why (float32 round-off, summation order).
#
# **Next:** [Lab 1](../labs/lab01_cat_mlp.ipynb) asks you to write these steps yourself, for a
# wider hidden layer and a batch. Chapter 2 turns the five steps into general rules: the chain
# rule with Jacobians, gradient checks, and the linear layer's matrix calculus.
