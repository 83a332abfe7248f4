# %% [markdown]
# # 3. Inside autograd
#
# Chapter 1 computed the cat MLP's gradients by hand and chapter 2 showed the chain rule
# behind them. This chapter opens the box that does it for us: what `L.backward()` walks,
# what it keeps in memory, why it sometimes refuses to run, and how to watch it work.
#
# **Learning goals.** After this chapter you can
#
# * walk and draw the graph autograd records (`grad_fn.next_functions`) and say which
#   tensors each node saved for backward;
# * tell leaf from non-leaf tensors and use `requires_grad`, `retain_grad` and `detach`;
# * explain why `.grad` *accumulates*, reproduce the "snowball" bug it causes, and use the
#   same accumulation on purpose for micro-batches (weighting each by its share of the batch);
# * explain "Trying to backward through the graph a second time", and what
#   `retain_graph=True` and `torch.autograd.grad` cost, in bytes;
# * choose between `torch.no_grad` and `torch.inference_mode`;
# * use tensor hooks, module hooks and `saved_tensors_hooks` (to count the bytes each
#   operation saves);
# * write a reverse-mode autograd engine from scratch and match PyTorch digit for digit.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import re
import textwrap
import warnings

import torch

from helpers.cat_mlp import PARAM_NAMES, cat_params
from helpers.checks import compare
from helpers.device import describe, get_device, no_tf32, randn
from helpers.show import fmt, show, varies

dev = get_device()
no_tf32()  # the micro-batch and memory sections do fp32 matmuls
# the only line that differs between CPU and CUDA runs
varies(f"device: {describe(dev)}")

# %% [markdown]
# ## 3.1 The graph autograd records
#
# We rebuild the cat MLP of chapter 1 (float64, the seed's numbers).
# [Autograd](../pages/glossary.md#term-autograd) records a [computational graph](../pages/glossary.md#term-computational-graph): every operation on a
# tensor that requires grad does two things: it computes its result, and it attaches to
# that result a *backward node* (`grad_fn`) that knows how to turn the gradient of the
# result into gradients of its inputs.

# %%
p = cat_params(device=dev, requires_grad=True)  # float64
x, W1, b1, W2, b2, y_true = (p[k] for k in ("x", "W1", "b1", "W2", "b2", "y_true"))
h = W1 @ x + b1  # (2, 4) @ (4,) -> (2,)
a = torch.relu(h)  # (2,)
y_hat = W2 @ a + b2  # (1, 2) @ (2,) -> (1,)
L = ((y_hat - y_true) ** 2).sum()  # ()
show("L", L, 8)
print("L.grad_fn:", L.grad_fn.name())

# %% [markdown]
# `grad_fn.next_functions` lists, for each input of the operation, the backward node that
# produced that input (or `None` if the input needs no gradient). Following it recursively
# from `L` is exactly the walk `L.backward()` makes:


# %%
def walk(fn, depth=0):
    """Print fn and, indented, every backward node it sends a gradient to."""
    print("  " * depth + fn.name())
    for nxt, _ in fn.next_functions:
        if nxt is not None:  # None: that input needs no gradient (x, y_true)
            walk(nxt, depth + 1)


walk(L.grad_fn)

# %% [markdown]
# Read it bottom-up and you get the forward pass: `MvBackward0` is `W1 @ x`, `AddBackward0`
# adds `b1`, `ReluBackward0`, another `Mv` and `Add`, then `Sub`, `Pow`, `Sum`. The
# `AccumulateGrad` nodes are the **leaves**: the end of the road, where an incoming gradient
# is added into a parameter's `.grad`.
#
# `helpers.autograd_graph` does the same walk and returns the graph as plain data: nodes
# (named after the tensors we pass in), the tensors each node *saved* for its backward, and
# edges. `helpers.plot_graph` draws it.

# %%
from helpers.autograd_graph import autograd_graph, format_graph
from helpers.plot_graph import plot_graph

names = {
    "x": x,
    "W1": W1,
    "b1": b1,
    "W2": W2,
    "b2": b2,
    "h": h,
    "a": a,
    "y_hat": y_hat,
    "L": L,
}
graph = autograd_graph(L, names)
print(format_graph(graph))
print("saved for backward:", graph.saved_bytes, "bytes")

# %% mystnb={"image": {"alt": "The autograd graph behind the cat MLP's loss L: a node per operation, from the leaves x, W1, b1, W2, b2 to L, arrows in the direction gradients flow."}}
fig = plot_graph(
    graph,
    title="the graph behind the cat MLP's L (arrows: gradient flow)",
    # 6.4 in at 110 dpi fills the page column: the 6.5-7 pt labels render at >= 9 px
    figsize=(6.4, 5.2),
    dpi=110,
)

# %% [markdown]
# In the listing, `#k` numbers the nodes and `dN` is a node's **depth**: the number of backward
# steps on the longest path from `L` down to it (`L`'s `SumBackward0` is d0, the
# `AccumulateGrad` of `W1` is d8). Every node that sends a gradient to another has a smaller
# depth, so the listing, sorted by depth, is an order in which backward can run the nodes.
#
# The orange labels are the memory cost of backward. Each node keeps exactly what its
# local derivative needs:
#
# * `ReluBackward0` keeps its output `a` (the derivative is 1 where $a > 0$, which is
#   exactly where $h > 0$);
# * the upper `MvBackward0` (`W2 @ a`) keeps `W2` (for
#   $\partial L/\partial a = W_2^\top\, \partial L/\partial \hat y$) and `a` (for
#   $\partial L/\partial W_2 = \partial L/\partial \hat y \otimes a$);
# * the lower `MvBackward0` (`W1 @ x`) keeps only `x`: it needs `x` for
#   $\partial L/\partial W_1$, and it would need `W1` only for $\partial L/\partial x$, which
#   nobody asked for;
# * `Add`, `Sub` and `Sum` keep no tensor at all (their derivatives are constants);
#   `PowBackward0` keeps its input `ŷ - y`.
#
# Nine float64 numbers, the 72 bytes printed above. In a real network these saved tensors
# are the *[activations](../pages/glossary.md#term-activation)*, and they are what fills a GPU during training (chapter 9).

# %% [markdown]
# ## 3.2 Leaves, `requires_grad`, `retain_grad`, `detach`
#
# A tensor is a **[leaf](../pages/glossary.md#term-leaf)** if no recorded operation made it: it has no `grad_fn`. Parameters
# and inputs are leaves; `h`, `a`, `y_hat`, `L` are not.

# %%
for name in ("x", "W1", "h", "a", "L"):
    t = names[name]
    fn = t.grad_fn.name() if t.grad_fn is not None else "None"
    print(
        f"{name:>2s}: is_leaf={t.is_leaf!s:5s}"
        f" requires_grad={t.requires_grad!s:5s} grad_fn={fn}"
    )

# %% [markdown]
# After `backward()` only leaves that require grad get a `.grad`. The intermediate
# gradients ($\partial L/\partial h$, ...) were computed, handed on and dropped; reading `h.grad` gives
# `None` (and a warning, which we silence here).

# %%
L.backward()
show("W1.grad", W1.grad)
show("W2.grad", W2.grad)
show("b2.grad", b2.grad)
grad_W2_full = W2.grad.clone()  # kept for the detach() comparison below
with warnings.catch_warnings():
    # "The .grad attribute of a Tensor that is not a leaf..."
    warnings.simplefilter("ignore")
    print("h.grad is None:", h.grad is None, "| x.grad is None:", x.grad is None)

# %% [markdown]
# `retain_grad()` asks autograd to keep a non-leaf's gradient. It equals chapter 1's
# hand-derived `grad_h` (both are the same few float64 operations, so we allow only
# float64 round-off: atol 1e-10, rtol 1e-8).

# %%
from helpers.cat_mlp import backward as hand_backward
from helpers.cat_mlp import forward as cat_forward

p = cat_params(device=dev, requires_grad=True)
cache = cat_forward(**p)
cache["h"].retain_grad()
cache["L"].backward()
show("h.grad", cache["h"].grad)
assert compare(
    "h.grad vs chapter 1's grad_h",
    cache["h"].grad,
    hand_backward(cache, p["W2"], p["y_true"])["h"],
)

# %% [markdown]
# **`requires_grad` decides what gets recorded.** `x` does not require grad, so there is no
# leaf for it and `W1 @ x` did not save `W1`. Ask for $\partial L/\partial x$ and the graph grows:

# %%
p = cat_params(device=dev, requires_grad=True)
p["x"].requires_grad_(True)
cache = cat_forward(**p)
g_x = autograd_graph(cache["L"], {k: p[k] for k in ("x", "W1", "b1", "W2", "b2")})
print("\n".join(line for line in format_graph(g_x).splitlines() if "Mv" in line))
print(
    "leaves:",
    sorted(n["label"] for n in g_x.leaves),
    "| saved:",
    g_x.saved_bytes,
    "bytes",
)

# %% [markdown]
# Now `W1 @ x` keeps `W1` too: a fifth leaf and 64 more bytes (8 float64), 136 in all.
#
# **`detach()`** returns a tensor that shares the same memory but is cut out of the graph:
# no `grad_fn`, `requires_grad=False`. Gradients stop there. Here the loss is computed from
# `a.detach()`, so `W2` and `b2` still get their gradients but nothing reaches `W1`, `b1`:

# %%
p = cat_params(device=dev, requires_grad=True)
cache = cat_forward(**p)
a_d = cache["a"].detach()
print(
    "same memory:",
    a_d.data_ptr() == cache["a"].data_ptr(),
    "| requires_grad:",
    a_d.requires_grad,
    "| grad_fn:",
    a_d.grad_fn,
)
L_stop = ((p["W2"] @ a_d + p["b2"] - p["y_true"]) ** 2).sum()  # (1, 2) @ (2,) -> (1,)
L_stop.backward()
show("W2.grad", p["W2"].grad)
compare(
    "W2.grad with a.detach() vs the full graph's",
    p["W2"].grad,
    grad_W2_full,
    exact=True,
)
print("W1.grad is None:", p["W1"].grad is None)

# %% [markdown]
# `W2.grad` is the same `[[-0.6344, 0.0000]]` as in the full graph (the exact comparison: the
# very same operations run on the very same numbers): detaching changes which gradients
# flow, not the values that do flow.

# %% [markdown]
# ## 3.3 `.grad` accumulates: the snowball
#
# Seed 000 tells of a student who called `loss.backward()` in a loop without
# `optimizer.zero_grad()`: "the gradients rolled up like a snowball". Here it is, on the
# same cat, same input, three times:

# %%
p = cat_params(device=dev, requires_grad=True)
for step in range(3):
    L = cat_forward(**p)["L"]
    L.backward()
    print(
        f"after backward #{step + 1}: b2.grad = {fmt(p['b2'].grad)}"
        f"   W2.grad = {fmt(p['W2'].grad)}"
    )

# %% [markdown]
# The loss is the same each time, so the true gradient of `b2` is `-0.8750` each time;
# `.grad` reads `-0.8750`, `-1.7500`, `-2.6250`. The reason is the `AccumulateGrad` node at the bottom of the
# graph: it does `W.grad += incoming` (and creates `.grad` the first time). Nothing in
# `backward()` ever resets it; `optimizer.zero_grad()` (or `W.grad = None`) is the reset.
#
# In training the sum of all past gradients acts like momentum that never decays. The same
# 30 SGD steps (lr 0.1) with and without `zero_grad`:


# %%
def train(zero_grad, steps=30, lr=0.1):
    """SGD on the cat MLP; returns the loss before each step."""
    p = cat_params(device=dev, requires_grad=True)
    opt = torch.optim.SGD([p[k] for k in PARAM_NAMES], lr=lr)
    losses = []
    for _ in range(steps):
        if zero_grad:
            opt.zero_grad()
        L = cat_forward(**p)["L"]
        L.backward()
        opt.step()
        losses.append(L.item())
    return losses


with_zero, without_zero = train(True), train(False)
print("step            " + " ".join(f"{i:>7d}" for i in range(0, 30, 5)))
print("with zero_grad  " + " ".join(f"{fmt(v):>7s}" for v in with_zero[::5]))
print("without         " + " ".join(f"{fmt(v):>7s}" for v in without_zero[::5]))

# %% [markdown]
# With `zero_grad` the loss is 0.0000 (to four decimals) after 5 steps; without it the
# parameters overshoot and swing back: 0.1103 after 5 steps, 0.1453 after 10, 0.0000 after
# 15, then back up to 0.0027 at step 20 and 0.0019 at step 25. With a
# larger learning rate or a deeper network the snowball ends in `inf`/`nan`.
#
# ### When accumulation is what you want: micro-batches
#
# If a batch of 8 does not fit in memory, run 4 micro-batches of 2 and let `.grad` add up
# their gradients, then take one optimizer step. With a **mean** loss there is a catch:
# the big batch's loss is the mean over 8 examples, each micro-batch's the mean over 2, so
# the sum of 4 micro-batch gradients is 4 times too large. The rule is to weight each
# micro-batch's mean loss by **its size ÷ the whole batch's size** ($2/8$ here); only because the
# 4 micro-batches are equal does that come down to dividing by their number, 4.
#
# A batched cat MLP in float32 (rows of `X` are examples; `nn.Linear` layout `X @ W1.T`):

# %%
X = randn(8, 4, seed=1, device=dev)  # (B, 4)
Y = randn(8, 1, seed=2, device=dev)  # (B, 1)


def batch_loss(p, X, Y):
    """L = mean over the batch of (ŷ - y)², ŷ = relu(X W1ᵀ + b1) W2ᵀ + b2."""
    A = torch.relu(X @ p["W1"].T + p["b1"])  # (B, 4) @ (4, 2) -> (B, 2)
    Y_hat = A @ p["W2"].T + p["b2"]  # (B, 2) @ (2, 1) -> (B, 1)
    return ((Y_hat - Y) ** 2).mean()


big = cat_params(dtype=torch.float32, device=dev, requires_grad=True)
batch_loss(big, X, Y).backward()

n_micro = 4
acc = cat_params(dtype=torch.float32, device=dev, requires_grad=True)
raw = cat_params(dtype=torch.float32, device=dev, requires_grad=True)
for Xm, Ym in zip(X.chunk(n_micro), Y.chunk(n_micro)):  # 4 × (2, 4), (2, 1)
    (batch_loss(acc, Xm, Ym) / n_micro).backward()  # divided: the right way
    batch_loss(raw, Xm, Ym).backward()  # not divided
for name in PARAM_NAMES:
    compare(
        f"grad {name}: 4 micro-batches vs one batch of 8",
        acc[name].grad,
        big[name].grad,
    )
compare("grad W1: 4 micro-batches, loss not divided", raw["W1"].grad, big["W1"].grad)
for name in PARAM_NAMES:
    compare(
        f"grad {name}: not divided vs 4 × batch of 8",
        raw[name].grad,
        4 * big[name].grad,
    )

# %% [markdown]
# The divided version matches the big batch to float32 round-off (the default fp32
# tolerance, atol 1e-5 and rtol 1e-4: the sums over 8 examples happen in a different order,
# so the last bits may differ, nothing more). Forgetting the division gives gradients
# 4 times too large, a learning rate silently multiplied by 4: every undivided gradient equals
# 4 × the big batch's within the same tolerance. (Not bit for bit: scaling by a power of two is
# exact, but the sums still run in another order.)
#
# With micro-batches of **unequal** size, dividing by their number is wrong. Split the same 8
# examples 5 + 3 (the last micro-batch of an epoch is often the short one):

# %%
sizes = (5, 3)
by_count = cat_params(dtype=torch.float32, device=dev, requires_grad=True)
by_size = cat_params(dtype=torch.float32, device=dev, requires_grad=True)
for Xm, Ym in zip(X.split(sizes), Y.split(sizes)):  # (5, 4) and (3, 4)
    (batch_loss(by_count, Xm, Ym) / len(sizes)).backward()  # ÷ 2: wrong for 5 + 3
    (batch_loss(by_size, Xm, Ym) * len(Xm) / len(X)).backward()  # × 5/8, × 3/8: right
compare("grad W1: 5 + 3, each loss / 2", by_count["W1"].grad, big["W1"].grad)
for name in PARAM_NAMES:
    compare(
        f"grad {name}: 5 + 3, each loss × size / 8", by_size[name].grad, big[name].grad
    )

# %% [markdown]
# Weighted by size ($5/8$, $3/8$) the micro-batches reproduce the batch of 8 (same float32
# tolerance); divided by their number they do not (the ✗ line). The same rule covers a
# token-level loss with `ignore_index` (padding, chapter 5): each micro-batch's mean runs over
# its own non-ignored tokens, so weight it by *its token count ÷ the token count of the whole
# batch*. (With a **sum** loss no weighting is needed; and layers that look at the whole
# batch, like BatchNorm, break the equality whatever the weights.)

# %% [markdown]
# ## 3.4 "Trying to backward through the graph a second time"

# %%
p = cat_params(device=dev, requires_grad=True)
cache = cat_forward(**p)
L = cache["L"]
L.backward()
try:
    L.backward()
except RuntimeError as err:
    first_line = str(err).splitlines()[0]
    print(textwrap.fill(f"RuntimeError: {first_line}", 88, subsequent_indent="  "))

# %% [markdown]
# What was freed are the **[saved tensors](../pages/glossary.md#term-saved-tensors)**. The graph's nodes are still there (so the
# second call finds them), but the first backward released what they kept, because a
# normal training step never needs it again. Walk the graph after backward:

# %%
after = autograd_graph(L, {k: cache[k] for k in ("a", "h", "y_hat", "L")} | p)
print(format_graph(after))

# %% [markdown]
# Every `saves` entry now reads `(freed)`. To see what keeping them costs we need a network
# where the bytes mean something: 3 layers of width 512, batch 256, float32.
# `helpers.memory.SavedTensors` counts what forward saves (parameters and the input are
# excluded: they exist anyway), and `saved_by_node` counts what the graph still holds.

# %%
from helpers.memory import SavedTensors, fmt_bytes, saved_by_node, tensor_bytes

torch.manual_seed(0)  # parameter values do not matter here, only sizes
model = torch.nn.Sequential(
    torch.nn.Linear(512, 512),
    torch.nn.ReLU(),
    torch.nn.Linear(512, 512),
    torch.nn.ReLU(),
    torch.nn.Linear(512, 10),
).to(dev)
params = list(model.parameters())
Xb = randn(256, 512, seed=3, device=dev)  # (B, 512)


def held(L):
    """Bytes of saved tensors held by the graph behind L (params and input excluded)."""
    return sum(
        r["bytes"] for r in saved_by_node(L, exclude=[*params, Xb]) if r["counted"]
    )


with SavedTensors(exclude=[*params, Xb]) as saved:
    L = model(Xb).pow(2).mean()
print(
    "forward saved:           ",
    fmt_bytes(saved.total_bytes),
    f"({saved.total_bytes} B)",
)
print("held before backward:    ", fmt_bytes(held(L)))
L.backward()
print("held after backward:     ", fmt_bytes(held(L)))

for q in params:
    q.grad = None
L = model(Xb).pow(2).mean()
L.backward(retain_graph=True)
print("held after retain_graph: ", fmt_bytes(held(L)))
grad_once = model[0].weight.grad.clone()
L.backward()  # allowed now; frees the graph (no retain_graph this time)
print("held after the 2nd call: ", fmt_bytes(held(L)))
assert compare(
    "W.grad, two backward calls vs 2 × one call",
    model[0].weight.grad,
    2 * grad_once,
)

# %% [markdown]
# Forward saved 1.0 MiB of activations (the two ReLU outputs, 256 × 512 float32 each,
# which the next `Linear` reuses, plus the small final output for `pow`). Backward frees all
# of it (0 B held); with `retain_graph=True` all 1.0 MiB stays until the graph is gone (here:
# until a backward without the flag, or until `L` is dropped). And the second backward adds
# the same gradient into `.grad` once more: twice the gradient of one call, up to float32
# round-off (fp32 default tolerance, atol 1e-5 and rtol 1e-4: the two calls may sum in a
# different order on a GPU).
#
# **`torch.autograd.grad`** computes gradients and *returns* them instead of adding them to
# `.grad`; like `backward()` it frees the graph unless `retain_graph=True`:

# %%
for q in params:
    q.grad = None
L = model(Xb).pow(2).mean()
grads = torch.autograd.grad(L, params)
print(
    "returned",
    len(grads),
    "tensors,",
    fmt_bytes(sum(tensor_bytes(g) for g in grads)),
    "| model[0].weight.grad is None:",
    model[0].weight.grad is None,
    "| held:",
    fmt_bytes(held(L)),
)
try:
    torch.autograd.grad(L, params)
except RuntimeError as err:
    print("second call -> RuntimeError:", str(err).splitlines()[0][:55] + "...")

# %% [markdown]
# So the costs are:
#
# * `retain_graph=True` keeps the saved activations (1.0 MiB here) alive as long as the graph
#   is reachable: that is the price of being able to run backward again;
# * `torch.autograd.grad` costs what `backward()` costs: it frees the graph (0 B held) and
#   its 6 returned gradients (2.0 MiB, the size of the parameters) take the place of the
#   `.grad` buffers, which stay `None`; it does not let you go through the graph twice either.
#
# Retaining one graph costs one forward pass's activations, which you had in memory anyway
# until backward. It becomes a leak only when retained graphs pile up, for instance when a
# training loop keeps the loss tensor itself:
#
# <details class="bbh-errata">
# <summary>What the source articles got wrong</summary>
#
# Seed 000 advises against `retain_graph=True` because "it will OOM", and suggests
# `torch.autograd.grad(loss, model.parameters(), retain_graph=False)` instead. The
# suggestion is fine code, but it is not an alternative: it frees the graph exactly like
# `backward()`. And the warning is exaggerated: retaining one graph costs one forward pass's
# activations; the OOM comes from retained graphs piling up (the cell below).
#
# </details>

# %%
history = []
for _ in range(3):
    L = model(Xb).pow(2).mean()
    L.backward(retain_graph=True)
    history.append(L)  # bug: keeps each retained graph alive
print("3 retained graphs kept:", fmt_bytes(sum(held(Lk) for Lk in history)))
history = [Lk.item() for Lk in history]  # keep numbers, not graphs
del L
print("after keeping only .item():", len(history), "floats")

# %% [markdown]
# Three times 1.0 MiB, and it grows with every step: that is how a training loop runs out
# of memory. Keep
# `L.item()` (or `L.detach()`) in your logs and drop `retain_graph` unless you really run
# backward twice (e.g. two losses sharing a trunk: better sum them and call backward once).
#
# ### Changed after it was saved: the version counter
#
# Autograd's other refusal. A node saves tensors by reference, not as copies (that is why
# saving an output costs nothing extra). If such a tensor is then modified **in place**,
# backward would compute with the wrong numbers. So every tensor carries a *version counter*
# that each in-place operation bumps; a node remembers the version it saved, and backward
# checks it. `sigmoid` saves its output $y$, since $\sigma' = y(1 - y)$:

# %%
x_v = torch.tensor(
    [0.5, -1.0, 2.0], dtype=torch.float64, device=dev, requires_grad=True
)
y_v = x_v.sigmoid()  # SigmoidBackward0 saves y itself
print("y._version after sigmoid:", y_v._version)
y_v.mul_(2)  # in place: the saved y now holds 2σ(x)
print("y._version after y.mul_(2):", y_v._version)
try:
    y_v.sum().backward()
except RuntimeError as err:
    # the rest names the tensor type, which differs on a GPU
    first_part = str(err).split(":")[0]
    print(textwrap.fill(f"RuntimeError: {first_part}", 88, subsequent_indent="  "))
    print(
        "the node whose saved tensor changed:",
        re.search(r"output \d+ of (\w+)", str(err)).group(1),
    )
y_v = x_v.sigmoid() * 2  # out of place: a new tensor, the saved y stays intact
y_v.sum().backward()
sig = torch.sigmoid(x_v.detach())
_ = compare("x.grad = 2 σ(x)(1 − σ(x))", x_v.grad, 2 * sig * (1 - sig))

# %% [markdown]
# The in-place `mul_` moved `y` from version 0 to 1, and backward refused rather than return a
# wrong gradient; the out-of-place `* 2` gives the right one (bit-equal here; the float64
# tolerance is there in case another device orders the products differently). In-place operations are fine on tensors no
# node saved; the error names the operation whose saved output changed (`Sigmoid` here, the
# forward op of the `SigmoidBackward0` node).

# %% [markdown]
# ## 3.5 `torch.no_grad` vs `torch.inference_mode`
#
# Both stop recording: no `grad_fn`, no saved tensors. Measured with `SavedTensors`:

# %%
for mode_name, ctx in [
    ("grad mode", torch.enable_grad),
    ("no_grad", torch.no_grad),
    ("inference_mode", torch.inference_mode),
]:
    with ctx(), SavedTensors(exclude=[*params, Xb]) as saved:
        out = model(Xb)
    print(
        f"{mode_name:15s} saved {fmt_bytes(saved.total_bytes):>9s}"
        f"  requires_grad={out.requires_grad!s:5s}"
        f"  is_inference={out.is_inference()}"
    )

# %% [markdown]
# In grad mode the forward saves 1.0 MiB (the two ReLU outputs; there is no `pow` in this
# forward); under `no_grad` and `inference_mode` it saves 0 B, and the output has no graph.
# `inference_mode` goes one step further: its tensors carry no version counter (3.4) and no view
# tracking, a small per-tensor saving that matters for many small operations (it is not
# visible in bytes saved). The price: an inference tensor can never enter autograd later.

# %%
with torch.inference_mode():
    feats = model[0](Xb)
try:
    model[2](feats).sum().backward()
except RuntimeError as err:
    first_line = str(err).splitlines()[0]
    print(textwrap.fill(f"RuntimeError: {first_line}", 88, subsequent_indent="  "))
# a clone made outside inference mode is a normal tensor
L = model[2](feats.clone()).sum()
print("with a clone: L.requires_grad =", L.requires_grad)

# %% [markdown]
# Does skipping the bookkeeping make the forward faster? Seed 000 opens by asking why
# "adding `torch.no_grad()` makes it twice as fast". Timings vary from machine to machine and
# run to run, so they are printed with `varies` (the `[this run]` lines are not checked), and we keep
# the *fastest* of 10 runs, the three modes taking turns: on a shared machine the slow runs
# measure the neighbours.

# %%
import time


def time_forwards(ctxs, reps=10):
    """Fastest of reps forwards under each ctx, in seconds; the modes take turns."""
    times = [[] for _ in ctxs]
    for _ in range(reps + 1):  # the first round is a warm-up
        for k, ctx in enumerate(ctxs):
            with ctx():
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                model(Xb)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                times[k].append(time.perf_counter() - t0)
    return [min(t[1:]) for t in times]


t_grad, t_no, t_inf = time_forwards(
    (torch.enable_grad, torch.no_grad, torch.inference_mode)
)
varies(
    f"forward: grad mode {t_grad * 1e3:.2f} ms, no_grad {t_no * 1e3:.2f} ms,"
    f" inference_mode {t_inf * 1e3:.2f} ms"
)
varies(f"grad mode / no_grad = {t_grad / t_no:.2f}")

# %% [markdown]
# For a network of large matmuls expect the three to be close, a ratio near 1, not 2: the
# arithmetic is the same, and what `no_grad` saves is memory (the 1.0 MiB of activations
# above, kept alive until backward), not FLOPs. A real speed-up appears when memory is the
# bottleneck (larger batches fit) or when many tiny operations make the bookkeeping itself
# count. Use `no_grad` for evaluation
# inside a training script, `inference_mode` for pure serving code.

# %% [markdown]
# ## 3.6 Hooks: watching gradients go by
#
# **Tensor hooks.** `t.register_hook(fn)` calls `fn(grad)` when the gradient of `t` is
# computed; if `fn` returns a tensor, that replaces the gradient from there on.

# %%
p = cat_params(device=dev, requires_grad=True)
cache = cat_forward(**p)
cache["h"].register_hook(lambda grad: show("hook sees ∂L/∂h", grad))
cache["L"].backward()

p = cat_params(device=dev, requires_grad=True)
cache = cat_forward(**p)
cache["h"].register_hook(lambda grad: grad.clamp(-0.1, 0.1))  # clip the gradient at h
cache["L"].backward()
show("W1.grad with ∂L/∂h clipped to ±0.1", p["W1"].grad)
assert compare(
    "W1.grad = clipped ∂L/∂h ⊗ x",
    p["W1"].grad,
    torch.outer(torch.tensor([-0.1, 0.0], dtype=torch.float64, device=dev), p["x"]),
)

# %% [markdown]
# The hook saw $\partial L/\partial h = [-0.4375, 0]$ (chapter 1's value); returning the
# clipped $-0.1$ changed everything below $h$: `W1.grad`'s first row is now $-0.1\, x$.
#
# **Module hooks.** The same cat as an `nn.Sequential`. A forward hook sees each module's
# output; `register_full_backward_hook` sees each module's `grad_output` (the gradient
# arriving at its output) in backward order.

# %%
cat = torch.nn.Sequential(
    torch.nn.Linear(4, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1)
).to(dev, torch.float64)
p = cat_params(device=dev)
with torch.no_grad():
    cat[0].weight.copy_(p["W1"]), cat[0].bias.copy_(p["b1"])
    cat[2].weight.copy_(p["W2"]), cat[2].bias.copy_(p["b2"])

handles = []
for name, module in cat.named_children():
    handles.append(
        module.register_forward_hook(
            lambda m, inp, out, name=name: show(
                f"forward  [{name}] {type(m).__name__} output", out
            )
        )
    )
    handles.append(
        module.register_full_backward_hook(
            lambda m, grad_in, grad_out, name=name: show(
                f"backward [{name}] {type(m).__name__} grad_output", grad_out[0]
            )
        )
    )
# so every module has an input gradient to report
x_in = p["x"].clone().requires_grad_(True)
L = ((cat(x_in) - p["y_true"]) ** 2).sum()
L.backward()
for hd in handles:
    hd.remove()  # hooks stay until removed
assert compare(
    "Sequential's W1.grad vs chapter 1's",
    cat[0].weight.grad,
    hand_backward(cat_forward(**p), p["W2"], p["y_true"])["W1"],
)

# %% [markdown]
# Forward hooks fire in order 0, 1, 2 (outputs `h`, `a`, `ŷ`), backward hooks in order
# 2, 1, 0 with $\partial L/\partial\hat y = -0.875$, $\partial L/\partial a = [-0.4375, 0.35]$,
# $\partial L/\partial h = [-0.4375, 0]$: the
# numbers of chapter 1, now read off a model without touching its code. (Chapter 5 builds
# a gradient-flow monitor out of exactly these hooks.)
#
# **Saved-tensor hooks.** `torch.autograd.graph.saved_tensors_hooks(pack, unpack)` calls
# `pack(t)` for every tensor an operation saves for backward and `unpack` when backward needs
# it back. Print what the cat's forward saves:


# %%
def pack(t):
    """Called at save time: report and keep the tensor as is."""
    print(
        f"saved {tuple(t.shape)} {str(t.dtype).replace('torch.', '')},"
        f" {tensor_bytes(t)} B"
    )
    return t


p = cat_params(device=dev, requires_grad=True)
with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
    L = cat_forward(**p)["L"]

# %% [markdown]
# The same five saved tensors as in the figure of 3.1: `x`, `a`, `W2`, `a` again (saved by
# `Mv` and `Relu`: one memory, two references) and `ŷ - y`. `helpers.memory.SavedTensors`
# is this hook plus bookkeeping: each storage is counted once, parameters and inputs can be
# excluded, and with `by_op=True` every saved tensor is labelled with the PyTorch function
# that saved it. Later chapters use it to measure activation memory:

# %%
with SavedTensors(exclude=[*params, Xb], by_op=True) as saved:
    L = model(Xb).pow(2).mean()
print(saved.table())

# %% [markdown]
# Each `linear` saves its input (for
# $\partial L/\partial W = (\partial L/\partial y)^\top\, \text{input}$) and, when its input
# needs a gradient, its weight (for $\partial L/\partial\,\text{input} = (\partial L/\partial y)\, W$;
# it keeps the transposed view $W^\top$, which is why the last one lists `(512, 10)` for a
# weight of shape `(10, 512)`: same memory, no copy). The first one's input is `Xb`
# (excluded, and needing no gradient, so no weight either); the others' inputs are the ReLU
# outputs, already counted, and their weights are parameters. So the whole 1.0 MiB is the two
# ReLU outputs (512.0 KiB each) plus 10.0 KiB for `pow`'s input (256 × 10 float32).

# %% [markdown]
# ## 3.7 An autograd engine from scratch
#
# Everything above fits in a few dozen lines of Python. A value remembers its parents and a
# closure that applies the local chain rule; `backward()` visits the values in reverse
# topological order. The core, with `+` and `*` only:


# %%
class Tiny:
    """A scalar with a gradient and the rule that sends it to its parents."""

    def __init__(self, data, parents=()):
        self.data, self.grad, self.parents, self._backward = (
            data,
            0.0,
            parents,
            lambda: None,
        )

    def __add__(self, other):
        out = Tiny(self.data + other.data, (self, other))

        def _backward():  # ∂(a+b)/∂a = ∂(a+b)/∂b = 1
            self.grad += out.grad  # += : a value used twice gets both contributions
            other.grad += out.grad

        out._backward = _backward
        return out

    def __mul__(self, other):
        out = Tiny(self.data * other.data, (self, other))

        def _backward():  # ∂(ab)/∂a = b, ∂(ab)/∂b = a
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad

        out._backward = _backward
        return out

    def backward(self):
        order, seen = [], set()

        def visit(v):  # parents before children
            if id(v) not in seen:
                seen.add(id(v))
                for q in v.parents:
                    visit(q)
                order.append(v)

        visit(self)
        self.grad = 1.0
        for v in reversed(order):  # output first
            v._backward()


u, w = Tiny(3.0), Tiny(-2.0)
f = u * w + u * u  # u is used three times
f.backward()
print("f =", fmt(f.data), "| ∂f/∂u =", fmt(u.grad), "| ∂f/∂w =", fmt(w.grad))
f64 = torch.float64
compare(
    "∂f/∂u vs w + 2u",
    torch.tensor(u.grad, dtype=f64),
    torch.tensor(w.data + 2 * u.data, dtype=f64),
    exact=True,
)
_ = compare(
    "∂f/∂w vs u",
    torch.tensor(w.grad, dtype=f64),
    torch.tensor(u.data, dtype=f64),
    exact=True,
)

# %% [markdown]
# $\partial f/\partial u = w + 2u$ and $\partial f/\partial w = u$, bit for bit (`exact=True`: the
# values are small integers, exact in float64, and so is every product and sum the engine forms).
#
# `helpers.micrograd.Value` is the full version (`+ - * / pow relu tanh exp`, negation,
# numbers on either side, an iterative topological sort, and leaves that accumulate across
# calls like PyTorch's). Its tests check every operation against torch, a value used twice
# (`a + a`, `a * a`), and that an engine with `=` instead of `+=` fails. Run chapter 1's cat
# through it, one scalar at a time, and ask for $\partial L/\partial x$ too:

# %%
from helpers.micrograd import Value, cat_mlp_grads

ours = cat_mlp_grads(cat_params())
print("scalar nodes in the graph:", ours["nodes"], "| L =", fmt(ours["L"], 10))
for name in ("W1", "b1", "W2", "b2", "x"):
    show(f"∂L/∂{name} (ours)", torch.tensor(ours[name], dtype=torch.float64), 10)

# %%
p = cat_params(device=dev, requires_grad=True)
p["x"].requires_grad_(True)
L = cat_forward(**p)["L"]
L.backward()
compare("L", torch.tensor(ours["L"], dtype=torch.float64), L)
for name in ("W1", "b1", "W2", "b2", "x"):
    compare(
        f"∂L/∂{name}: ours vs torch",
        torch.tensor(ours[name], dtype=torch.float64),
        p[name].grad,
    )
print("torch's ∂L/∂W1 to 10 decimals:")
print(fmt(p["W1"].grad, 10))

# %% [markdown]
# 44 scalar nodes, and every gradient equal to torch's to all 10 printed decimals (on a CPU
# the float64 differences are exactly 0: both do the same multiplications and additions in
# the same order; we still compare with the float64 tolerance, atol 1e-10, because a GPU
# may fuse a multiply-add and round once less).
#
# `x` is the interesting one: each `x_j` feeds both hidden units, so its gradient is a sum
# of two contributions, and only `+=` gets it right. Break that one rule and the check fails:


# %%
class AssignMul(Value):
    """The product rule with = instead of +=: the last contribution wins."""

    # _wrap and _new are helpers.micrograd.Value internals: _wrap turns a plain number
    # into a Value, _new builds the result with type(self), so every node of the graph
    # is an AssignMul.
    def __mul__(self, other):
        other = self._wrap(other)
        out = self._new(self.data * other.data, (self, other), "*")

        def _backward():
            self.grad = other.data * out.grad
            other.grad = self.data * out.grad

        out._backward = _backward
        return out


broken = cat_mlp_grads(cat_params(), value_cls=AssignMul)
show("∂L/∂x (broken)", torch.tensor(broken["x"], dtype=torch.float64), 10)
compare(
    "∂L/∂x: broken engine vs torch",
    torch.tensor(broken["x"], dtype=torch.float64),
    p["x"].grad,
)
assert compare(
    "∂L/∂W1: broken engine vs torch",
    torch.tensor(broken["W1"], dtype=torch.float64),
    p["W1"].grad,
)

# %% [markdown]
# The second hidden unit is dead ($h_2 < 0$), so its contribution to $\partial L/\partial x$
# is 0, and with `=` that 0 overwrote the real gradient: $\partial L/\partial x$ is all zeros.
# $\partial L/\partial W_1$ is still right,
# since every weight is used once. A bug that only shows where a value is reused is exactly
# the kind that survives a test on a too-simple example.

# %% [markdown]
# ## Summary
#
# * Every operation on tensors that require grad records a backward node; `L.grad_fn` and
#   `next_functions` are the graph `backward()` walks, ending in `AccumulateGrad` leaves.
# * Nodes save what their local derivative needs (for the cat: 72 bytes; for the 512-wide
#   MLP at batch 256: 1.0 MiB of activations). Backward frees them; that is why a second
#   backward fails, and what `retain_graph=True` keeps (and costs).
# * `.grad` accumulates (`+=`). Reset it every step; use it on purpose for micro-batches,
#   weighting each micro-batch's mean loss by its size ÷ the batch's size (its token count ÷
#   the total with `ignore_index`); for equal micro-batches that is ÷ their number.
# * An in-place change to a tensor a node saved bumps its version counter, and backward
#   refuses to run.
# * `no_grad` and `inference_mode` both save nothing for backward; inference tensors cannot
#   enter autograd later.
# * Hooks let you read or change gradients (tensor hooks), watch modules (forward/backward
#   hooks) and count saved memory (`saved_tensors_hooks`, `helpers.memory.SavedTensors`).
# * A reverse-mode engine is a topological sort plus one `+=` rule per operation; ours
#   matches torch's gradients on the cat MLP digit for digit.
#
# ## Common mistakes
#
# * **No `zero_grad()` in the loop**: gradients snowball (3.3).
# * **Micro-batches with a mean loss, not divided**: gradients `n_micro` times too large; and
#   dividing by `n_micro` when the micro-batches differ in size (or in non-padding tokens).
# * **`retain_graph=True` "to make the error go away"** when the real bug is calling
#   backward twice on one graph; or keeping loss tensors (not `.item()`) in a list.
# * **Reading `.grad` of an intermediate tensor**: it is `None` unless you `retain_grad()`
#   or use a hook.
# * **Using an inference-mode tensor in training**: clone it outside `inference_mode` first.
# * **Writing `=` instead of `+=`** in a hand-written backward: right on simple examples,
#   wrong whenever a value is used twice.
# * **Expecting `no_grad` to make the forward twice as fast** (seed 000): the arithmetic is the
#   same; what it saves is the memory of the activations (3.5).
# * **Forgetting to `remove()` a hook**: it keeps firing (and keeping memory) forever.
#
# **Lab:** [Lab 3: inside autograd](../labs/lab03_inside_autograd.ipynb), draw graphs, find
# the snowball, count saved bytes and extend the engine.
