# %% [raw]
# # ASSIGNMENT CONFIG
# name: lab05_losses_and_flow
# init_cell: false
# check_all_cell: false
# export_cell: false
# run_tests: true
# generate:
#   pdf: false
#   show_stdout: false

# %% [markdown]
# # Lab 5 · Losses and the flow of gradients: diagnose a broken model
#
# A colleague's model stopped learning. Its loss is stuck near $\log 10$ and its early layers
# barely move. You write the tools chapter 5 used (the cross-entropy gradient, a gradient-flow
# recorder keyed by name, clipping by global norm) and use them to find the layer that is
# broken. This lab goes with [Chapter 5](../chapters/05_losses_and_flow.ipynb).
#
# **Learning goals.** After this lab you can
# * write the gradient of cross-entropy with label smoothing and `ignore_index` from its formula;
# * record $\lVert \partial L/\partial\,\text{output} \rVert$ of every layer during backward with hooks, keyed by the layer's
#   **name**, and leave no hook behind;
# * read a gradient-flow profile and point at the layer where the gradient collapses;
# * clip gradients by their global norm, in place, as `torch.nn.utils.clip_grad_norm_` does.
#
# **How a lab works.** Each exercise states its goal and its points (10 in all). Replace every
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
import base64

import torch
import torch.nn.functional as F

from helpers.device import get_device, no_tf32, randn
from helpers.gradflow import deep_mlp, fixed_batch, record_grad_flow
from helpers.labcheck import CheckResult, autograd_grads, check, evaluate
from helpers.show import fmt

dev = get_device()
no_tf32()
dtype = torch.float64

# %% [markdown]
# ## The model that stopped learning
#
# Six blocks `Linear(32, 32) → ReLU`, then a `Linear(32, 10)` head (chapter 5's `deep_mlp`),
# each block's weight scaled by a gain that the colleague's calibration run produced and
# stored (six float32 numbers, base64-encoded, as they came to you). One thing went wrong
# when the model was built. Do not decode the gains to find it: in real life the bug hides in
# somebody else's code or data, and your tools must find it.


# %%
GAINS = "CteDP4/CdT9mZoY/bxKDOkjhej9cj4I/"  # the colleague's stored per-block gains


def colleagues_model(device=None):
    """The model that stopped learning (6 ReLU blocks of width 32, a 10-class head)."""
    model = deep_mlp(depth=6, width=32, activation="relu", seed=11, device=device)
    gains = torch.frombuffer(bytearray(base64.b64decode(GAINS)), dtype=torch.float32)
    with torch.no_grad():
        for block, gain in zip(model.blocks, gains.tolist()):
            block.linear.weight.mul_(gain)
    return model


def layer_names(model):
    """The names of the model's leaf modules (without children), in forward order."""
    return [
        name for name, m in model.named_modules() if name and not list(m.children())
    ]


model = colleagues_model(device=dev)
X, y = fixed_batch(batch=64, width=32, seed=12, device=dev)
print(layer_names(model))

# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2
# by_hand: [autograd, helpers.functions.cross_entropy_backward]

# %% [markdown]
# ## Exercise 1 · The cross-entropy gradient, smoothed and masked (2 points)
#
# **Goal:** derive the gradient of mean cross-entropy w.r.t. the logits, then see what label
# smoothing (a softer target) and `ignore_index` (rows left out) change in it.
#
# Write `ce_grad(logits, target, ignore_index=-100, label_smoothing=0.0)` for `logits` (R, C),
# int64 `target` (R,): return $\partial L/\partial\,\text{logits}$ (R, C) for
# `L = F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=eps)`, with
# $\varepsilon$ = `eps` the `label_smoothing` argument, where
# * row $r$ is kept unless `target[r] == ignore_index`; $L$ is the mean over the $N$ kept rows
#   of $-\sum_c q_c \log \mathrm{softmax}(z_r)_c$;
# * a kept row's target distribution is $q = (1 - \varepsilon)\,\text{one-hot}(t_r) +
#   \varepsilon / C$; ignored rows contribute nothing, so their gradient is exactly 0.
#
# Derive $\partial L/\partial z_r$ for a kept row first (write $\log\mathrm{softmax}$ out and
# use $\sum_c q_c = 1$). The self-check tests the plain loss, then label smoothing, then
# ignored rows, so the first ✗ tells you which part of your derivation is off.
#
# <details><summary>Hint: the gradient</summary>
#
# For a kept row, $\partial L/\partial z_r = (\mathrm{softmax}(z_r) - q)/N$; for an ignored row, 0.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def ce_grad(logits, target, ignore_index=-100, label_smoothing=0.0):
    """∂L/∂logits of mean cross-entropy, label smoothing ε, ignored rows left out."""
    # BEGIN SOLUTION
    R, C = logits.shape
    keep = target != ignore_index  # (R,)
    # (R,) a valid class everywhere
    safe = torch.where(keep, target, torch.zeros_like(target))
    # (R, C)
    q = (1 - label_smoothing) * F.one_hot(safe, C).to(
        logits.dtype
    ) + label_smoothing / C
    P = torch.softmax(logits, dim=-1)  # (R, C)
    return (P - q) * keep[:, None] / keep.sum()
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

_z = randn(9, 4, seed=101, dtype=torch.float64)
_t = torch.tensor([0, 3, 1, 1, 2, 0, 3, 2, 1])
_leaf = _z.clone().requires_grad_()
(_ref,) = torch.autograd.grad(torch.nn.functional.cross_entropy(_leaf, _t), _leaf)
_g = ce_grad(_z, _t)
assert _g.shape == (9, 4) and torch.allclose(_g, _ref, atol=1e-12)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_z = randn(5, 6, seed=102, dtype=torch.float64) * 3
_t = torch.tensor([5, -1, 2, -1, 0])
_leaf = _z.clone().requires_grad_()
(_ref,) = torch.autograd.grad(
    torch.nn.functional.cross_entropy(_leaf, _t, ignore_index=-1, label_smoothing=0.2),
    _leaf,
)
_g = ce_grad(_z, _t, ignore_index=-1, label_smoothing=0.2)
assert torch.allclose(_g, _ref, atol=1e-12) and torch.equal(
    _g[[1, 3]], torch.zeros(2, 6, dtype=torch.float64)
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: autograd through `F.cross_entropy` on 8 rows of 5 classes,
# three times: plain, with `label_smoothing=0.1`, then with two rows ignored too; a ✗ names a
# known mistake in $q$, the mean or the softmax when your answer is one):

# %%
z1 = randn(8, 5, seed=1, dtype=dtype, device=dev) * 2
t1_all = torch.tensor([4, 0, 1, 2, 2, 3, 1, 3], device=dev)
t1 = torch.tensor([4, 0, -100, 2, 2, -100, 1, 3], device=dev)


def ce_factors(target):
    """Constants a mean can get wrong: N kept rows, and N/R when rows are ignored."""
    N, R = int((target != -100).sum()), target.numel()
    return {"N": N} if N == R else {"N": N, "N/R": N / R}


def ce_mistakes(z, target, eps, expected):
    """Known wrong answers: the expected value with one piece of q changed (or the
    softmax taken over the rows), on the kept rows."""
    C = z.shape[-1]
    keep = (target != -100)[:, None].to(z.dtype)  # (R, 1)
    share = keep / keep.sum()  # (R, 1): each kept row's share of the mean
    onehot = F.one_hot(target.clamp(min=0), C).to(z.dtype)  # (R, C)
    by_rows = torch.softmax(z, dim=0) - torch.softmax(z, dim=-1)  # (R, C)
    gap = 1 / (C - 1) - 1 / C
    known = {"the gradient with the softmax over the rows (dim 0)": by_rows * share}
    if eps:
        known["the gradient for a q without its ε/C"] = eps / C * share
        known["the gradient for a q without (1 − ε) on the one-hot"] = (
            -eps * onehot * share
        )
        known["the gradient for a q spreading ε/(C − 1), not ε/C"] = -eps * gap * share
    return {label: expected + delta for label, delta in known.items()}


for what, target, eps in (
    ("plain", t1_all, 0.0),
    ("label_smoothing 0.1", t1_all, 0.1),
    ("label_smoothing 0.1, 2 rows ignored", t1, 0.1),
):
    (expected,) = autograd_grads(
        lambda z: F.cross_entropy(z, target, label_smoothing=eps), (z1,)
    )
    ignored = {"target = -100 (the ignored rows)": (target == -100)[:, None]}
    check(
        ce_grad,
        expected,
        args=(z1, target),
        kwargs={"label_smoothing": eps},
        outputs=("grad_logits",),
        name=f"Exercise 1 · ce_grad ({what})",
        against="autograd",
        factors=ce_factors(target),
        mistakes={"grad_logits": ce_mistakes(z1, target, eps, expected)},
        regions={"grad_logits": ignored},
    )

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 3
# by_hand: [helpers.gradflow.record_grad_flow]

# %% [markdown]
# ## Exercise 2 · A gradient-flow recorder keyed by name (3 points)
#
# **Goal:** see the gradient *as it flows past* each layer, with hooks, and label each
# measurement with the layer's name (seed 000's recorder stored by module and looked up by
# name, so it recorded nothing).
#
# Write `record_output_grad_norms(model, X, y)`: for every leaf module (see `layer_names`),
# register a **forward hook** that, when the module runs, registers a **tensor hook** on its
# output; the tensor hook stores `grad.norm().item()` under the module's **name**. Then run
# `L = F.cross_entropy(model(X), y)` and `L.backward()`, remove every hook you registered (even if
# something raised: `try`/`finally`), and return the dict `{name: norm}`, each
# norm being $\lVert \partial L/\partial\,\text{output} \rVert$.
#
# <details><summary>Hint: every entry lands under the last name</summary>
#
# A closure made in a loop reads the loop variable when it runs, not when it was made: capture
# the name as a default argument, `def hook(m, i, o, name=name)`.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def record_output_grad_norms(model, X, y):
    """{leaf module name: ‖∂L/∂(its output)‖}, L = cross_entropy(model(X), y)."""
    # BEGIN SOLUTION
    norms, handles = {}, []
    modules = dict(model.named_modules())

    def forward_hook(module, inputs, output, name):
        if output.requires_grad:
            output.register_hook(lambda g: norms.__setitem__(name, g.norm().item()))

    try:
        for name in layer_names(model):
            handles.append(
                modules[name].register_forward_hook(
                    lambda m, i, o, name=name: forward_hook(m, i, o, name)
                )
            )
        F.cross_entropy(model(X), y).backward()
    finally:
        for h in handles:
            h.remove()
    return norms
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

from helpers.gradflow import deep_mlp, fixed_batch, record_grad_flow

_m = deep_mlp(
    depth=3,
    width=16,
    activation="tanh",
    residual=True,
    layernorm=True,
    n_classes=4,
    seed=201,
)
_X, _y = fixed_batch(batch=12, width=16, n_classes=4, seed=202)
_ref = record_grad_flow(_m, _X, _y).output_grad_norms
_m.zero_grad(set_to_none=True)
_got = record_output_grad_norms(_m, _X, _y)
assert set(_got) == set(_ref) and all(isinstance(k, str) for k in _got)
assert all(math.isclose(_got[k], _ref[k], rel_tol=1e-5, abs_tol=1e-9) for k in _ref)

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

from helpers.gradflow import deep_mlp, fixed_batch

_m = deep_mlp(depth=2, width=8, n_classes=3, seed=203)
_X, _y = fixed_batch(batch=6, width=8, n_classes=3, seed=204)
_a = record_output_grad_norms(_m, _X, _y)
assert all(not m._forward_hooks for m in _m.modules())  # every hook removed
_b = record_output_grad_norms(_m, _X, _y)  # no stale hook adds a second entry
assert _a.keys() == _b.keys() and all(
    math.isclose(_a[k], _b[k], rel_tol=1e-6) for k in _a
)
assert len(_a) == 5  # 2 × (linear, act) + head

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: chapter 5's `GradFlowRecorder`, on the colleague's model; then
# it counts the hooks left on the model, which must be none; a wrong profile that shows a
# known mistake, such as a wrong key or norm, is named):


# %%
def reference_norms(model, X, y):
    """Chapter 5's recorder: one forward + backward, output-gradient norms by name."""
    return record_grad_flow(model, X, y).output_grad_norms


def fresh_norms(fn):
    """fn on the model with its .grad reset (so earlier runs do not matter)."""

    def run(model, X, y):
        model.zero_grad(set_to_none=True)
        return fn(model, X, y)

    return run


def known_norms_mistake(got, ref, names, result):
    """A line naming the known mistake got ({name: norm}) shows, else result."""
    name = "Exercise 2 · record_output_grad_norms"
    keys = list(got) if isinstance(got, dict) else []
    if keys and not any(isinstance(k, str) for k in keys):
        kind = type(keys[0]).__name__
        return CheckResult("fail", f"✗ {name}: keys are modules ({kind}, …), not names")
    if keys == [names[-1]]:
        last = f"every norm stored under the last name, {names[-1]!r}"
        why = "the hook read the loop's name when it ran"
        return CheckResult("fail", f"✗ {name}: {last}: {why}")
    if set(keys) not in (set(names), set(names[1:])):
        return result
    shown = [n for n in names if n in got]  # in forward order
    before = [ref[a] for a, b in zip(names, names[1:]) if b in got]
    known = {"its square, ‖g‖²": torch.tensor([ref[n] ** 2 for n in shown])}
    if len(shown) < len(names):  # the first layer's input needs no gradient
        label = "the norm of the layer before it, ‖∂L/∂input‖ (input hooked)"
        known[label] = torch.tensor(before)
    ratio = evaluate(
        torch.tensor([float(got[n]) for n in shown], dtype=dtype),
        torch.tensor([ref[n] for n in shown], dtype=dtype),
        outputs=("every layer's norm",),
        name=name,
        atol=1e-9,
        rtol=1e-5,
        factors={"B": X.shape[0]},
        mistakes={"every layer's norm": known},
    )
    named = "matches" in ratio.line or "× the expected" in ratio.line
    return ratio if ratio.status == "fail" and named else result


def hooks_left(model):
    """Forward and backward hooks still registered on the model's modules."""
    return sum(len(m._forward_hooks) + len(m._backward_hooks) for m in model.modules())


result = evaluate(
    fresh_norms(record_output_grad_norms),
    reference_norms,
    args=(model, X, y),
    name="Exercise 2 · record_output_grad_norms",
    against="GradFlowRecorder",
    atol=1e-9,
    rtol=1e-5,
    noun="layers",
)
if result.status in ("pass", "fail") and hooks_left(model):
    result = evaluate(
        hooks_left(model),
        0,
        outputs=("hooks left on the model",),
        counts=("hooks left on the model",),
        name="Exercise 2 · record_output_grad_norms",
    )
elif result.status == "fail":  # a known mistake, seen in the whole profile, says why
    result = known_norms_mistake(
        fresh_norms(record_output_grad_norms)(model, X, y),
        reference_norms(model, X, y),
        layer_names(model),
        result,
    )
for m in model.modules():  # so that the cells below run on a clean model
    m._forward_hooks.clear()
    m._backward_hooks.clear()
print(result.line)

# %% [markdown]
# ## What a healthy ReLU does to the gradient
#
# Before you look for the broken layer, measure what a healthy layer does. A ReLU passes the
# gradient only where its input was positive and zeroes it elsewhere. For each ReLU of the
# colleague's model, the cell below counts the fraction of entries it passes and compares the
# norm of the gradient that leaves it (backward) with the norm that enters it (chapter 5's
# recorder, so it does not depend on your exercise 2):

# %%
relu_names = [name for name in layer_names(model) if name.endswith(".act")]
passed = {}  # ReLU name -> the fraction of its outputs that are positive


def count_passed(name):
    """A forward hook storing the fraction of the module's outputs that are > 0."""

    def hook(module, inputs, output):
        passed[name] = (output > 0).double().mean().item()

    return hook


handles = [
    model.get_submodule(n).register_forward_hook(count_passed(n)) for n in relu_names
]
try:
    relu_norms = reference_norms(model, X, y)
finally:
    for h in handles:
        h.remove()
for name in relu_names:
    before = layer_names(model)[layer_names(model).index(name) - 1]
    ratio = relu_norms[before] / relu_norms[name]
    print(
        f"{name}: passes {fmt(passed[name], 2)} of the entries; ‖g‖ leaves/enters "
        f"{fmt(ratio, 2)}, squared {fmt(ratio**2, 2)}"
    )

# %% [markdown]
# Across each ReLU the norm falls to 0.65–0.80 of what entered, not to a half. A ReLU passes
# the gradient of 0.46–0.61 of the entries here and zeroes the rest, so what it cuts in about
# that proportion is the **squared** norm, a sum over the entries (0.42–0.64 of it is left);
# the norm keeps about the square root of that. A well-initialised linear layer keeps the norm
# about the same.

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 2

# %% [markdown]
# ## Exercise 3 · Find the broken layer (2 points)
#
# **Goal:** in a healthy network the output-gradient norm changes by a factor of order 1 from
# one layer to the previous one (across each ReLU above it fell to 0.65–0.80 of what entered;
# a well-initialised linear layer keeps it); a broken layer that kills the signal shows up as
# a collapse **across it**: the gradient leaves it far smaller than it entered. (A layer that
# blows the gradient up would show the opposite, a ratio far above 1; here you look for the
# collapse.)
#
# Write `steepest_drop(norms, names)`: `names` lists the layers in forward order and `norms`
# maps each to its $\lVert \partial L/\partial\,\text{output} \rVert$, in any order (a
# recorder fills it during backward, head first): the order to follow is that of `names`. For
# every layer `names[i]` with $i \ge 1$, the gradient enters it (backward) with norm
# `norms[names[i]]` and leaves it with norm `norms[names[i - 1]]` (the previous layer's output
# is this layer's input). Return the name with the smallest ratio leaves / enters. Then run it
# on the colleague's model (the cell below the self-check does).

# %% [raw]
# # BEGIN SOLUTION


# %%
def steepest_drop(norms, names):
    """names[i] (i ≥ 1) with the smallest norms[names[i-1]] / norms[names[i]]."""
    # BEGIN SOLUTION
    ratios = {
        names[i]: norms[names[i - 1]] / norms[names[i]] for i in range(1, len(names))
    }
    return min(ratios, key=ratios.get)
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
_n = {"a": 1e-3, "b": 2e-3, "c": 1.0, "d": 1.4, "e": 0.9}
assert steepest_drop(_n, ["a", "b", "c", "d", "e"]) == "c"
# ratios: y 5.0, z 2.0
assert steepest_drop({"x": 5.0, "y": 1.0, "z": 0.5}, ["x", "y", "z"]) == "z"
# ratios: q 0.25, r 0.02, s 0.4 (the largest difference is at s)
_n = {"p": 1.0, "q": 4.0, "r": 200.0, "s": 500.0}
assert steepest_drop(_n, ["p", "q", "r", "s"]) == "r"

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
from helpers.gradflow import fixed_batch as _fb
from helpers.gradflow import record_grad_flow as _rgf

_m = colleagues_model()
_X, _y = _fb(batch=64, width=32, seed=12)
assert (
    steepest_drop(_rgf(_m, _X, _y).output_grad_norms, layer_names(_m))
    == "blocks.3.linear"
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (on four made-up profiles; reference: the layer each was built to
# collapse at, or, in the third, the layer with the smallest ratio of a profile with no
# collapse at all; the fourth comes in the order a recorder fills it, backward, with `names`
# in forward order; a wrong name that a known mistake gives is named):

# %%
profiles = {
    "a collapse": {
        "in": 0.02,
        "in.act": 0.03,
        "mid": 0.05,
        "mid.act": 40.0,
        "out": 55.0,
        "out.act": 60.0,
    },
    # the largest drop in absolute terms is at d, the largest ratio at c
    "large norms": {"a": 1.0, "b": 3.0, "c": 100.0, "d": 300.0},
    # the gradient shrinks towards the output: still, only i ≥ 1 has a ratio
    "no collapse": {"a": 8.0, "b": 2.0, "c": 1.5, "d": 0.1},
}
names3 = {k: list(p) for k, p in profiles.items()}  # each in forward order
# as a recorder fills it: during backward, the last layer first; names in forward order
profiles["recorded in backward order"] = {
    "act3": 20.0,
    "fc3": 25.0,
    "act2": 30.0,
    "fc2": 0.3,
    "act1": 0.4,
    "fc1": 0.5,
}
names3["recorded in backward order"] = ["fc1", "act1", "fc2", "act2", "fc3", "act3"]
known3 = {  # what known mistakes return on each profile
    "a collapse": {
        "the steepest rise: the largest leaves/enters, or enters/leaves": "out.act",
        "the layer before the collapse: off by one": "mid",
        "the smallest norm, not the steepest drop": "in",
    },
    "large norms": {"the largest difference, not the smallest ratio": "d"},
    "no collapse": {
        "names[0] given a ratio: i from 0, names[-1] taken as before it": "a"
    },
    "recorded in backward order": {
        "the order of norms followed, not that of names": "act1",
        "the names sorted, not in the forward order given": "fc3",
    },
}
check(
    lambda: {k: steepest_drop(p, names3[k]) for k, p in profiles.items()},
    {
        "a collapse": "mid.act",
        "large norms": "c",
        "no collapse": "c",
        "recorded in backward order": "act2",
    },
    mistakes=known3,
    name="Exercise 3 · steepest_drop",
    against="the profiles' collapse",
)

# %% [markdown]
# Now the colleague's model: the broken layer is the one your function names here (compare
# it with the norms of exercise 2, then explain to yourself what must be wrong with it).

# %%
recorded = reference_norms(model, X, y)  # filled during backward: the head first
broken = steepest_drop(recorded, layer_names(model))
in_forward_order = {name: recorded[name] for name in layer_names(model)}
if broken != steepest_drop(in_forward_order, layer_names(model)):
    print(
        "✗ Exercise 3 · steepest_drop: names another layer when the same norms come in "
        "forward order: follow names, not the order of norms"
    )
else:
    print("broken layer:", broken)

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 3
# by_hand: [torch.nn.utils.clip_grad_norm_, helpers.gradflow.clip_grad_norm]
# in_place: true

# %% [markdown]
# ## Exercise 4 · Clipping by global norm, by hand (3 points)
#
# **Goal:** clipping rescales **all** gradients by one factor, so the update keeps its
# direction and only its length shrinks.
#
# Write `clip_by_global_norm(params, max_norm)`: over the parameters whose `.grad` is not
# `None`, the global norm is $\lVert g\rVert = \sqrt{\sum_p \lVert g_p\rVert^2}$; if it exceeds
# `max_norm`, multiply every gradient **in place** by $\mathrm{max\_norm} / (\lVert g\rVert + 10^{-6})$ (as
# `torch.nn.utils.clip_grad_norm_`); else leave them alone. Return $\lVert g\rVert$ before
# clipping, as a 0-dim tensor.

# %% [raw]
# # BEGIN SOLUTION


# %%
def clip_by_global_norm(params, max_norm):
    """‖g‖ = √Σ‖g_p‖²; above max_norm, g_p *= max_norm / (‖g‖ + 1e-6); return ‖g‖."""
    # BEGIN SOLUTION
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for g in grads:
            g.mul_(coef.to(g.dtype))
    return total.to(grads[0].dtype)
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

_ps = [
    torch.zeros(3, 4, dtype=torch.float64, requires_grad=True),
    torch.zeros(5, dtype=torch.float64, requires_grad=True),
]
_ps[0].grad, _ps[1].grad = (
    randn(3, 4, seed=401, dtype=torch.float64) * 3,
    randn(5, seed=402, dtype=torch.float64) * 3,
)
_qs = [p.detach().clone().requires_grad_() for p in _ps]
for _q, _p in zip(_qs, _ps):
    _q.grad = _p.grad.clone()
_tot = clip_by_global_norm(_ps, 1.0)
_ref = torch.nn.utils.clip_grad_norm_(_qs, 1.0)
assert abs(float(_tot) - float(_ref)) < 1e-10 and float(_tot) > 1.0
assert all(torch.allclose(p.grad, q.grad, atol=1e-12) for p, q in zip(_ps, _qs))

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# below the threshold: untouched; a parameter without a gradient is skipped
_a = torch.zeros(4, dtype=torch.float64, requires_grad=True)
_b = torch.zeros(2, dtype=torch.float64, requires_grad=True)
_a.grad = torch.tensor([0.3, -0.4, 0.0, 0.0], dtype=torch.float64)
_g0 = _a.grad.clone()
_tot = clip_by_global_norm([_a, _b], 10.0)
assert abs(float(_tot) - 0.5) < 1e-12 and torch.equal(_a.grad, _g0) and _b.grad is None
_grad_obj = _a.grad
_ = clip_by_global_norm([_a, _b], 0.25)
# in place, and the 1e-6 in the denominator (a relative 2e-6 here: rtol 0)
assert _a.grad is _grad_obj and torch.allclose(
    _a.grad, _g0 * 0.25 / (0.5 + 1e-6), atol=1e-12, rtol=0
)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: `torch.nn.utils.clip_grad_norm_` on copies of the colleague's
# model's gradients, with `max_norm = 0.05`, below their norm so clipping happens, with
# `max_norm = 100`, above it, and on the gradients × 1e-4 with `max_norm = 1e-6`, where the
# 1e-6 in the denominator matters; then it checks that every `.grad` is still the same
# tensor, scaled in place; a ✗ names a known mistake when your numbers are one):


# %%
def copies(scale=1.0):
    """Copies of the model's parameters, each with a copy of its gradient × scale."""
    params = [p.detach().clone().requires_grad_() for p in model.parameters()]
    for q, p in zip(params, model.parameters()):
        q.grad = p.grad.detach().clone() * scale
    return params


SETTINGS4 = {  # name: (gradients ×, max_norm)
    "max_norm 0.05": (1.0, 0.05),
    "max_norm 100": (1.0, 100.0),
    "grads × 1e-4, max_norm 1e-6": (1e-4, 1e-6),
}


def clip_copies(clip_fn):
    """Clip copies of the model's gradients with clip_fn: ‖g‖ and every grad after."""
    out = {}
    for what, (scale, max_norm) in SETTINGS4.items():
        params = copies(scale)
        total = clip_fn(params, max_norm)
        if total is None:
            return None
        out[f"total norm ({what})"] = torch.as_tensor(float(total), dtype=dtype)
        out[f"grads ({what})"] = torch.cat([q.grad.reshape(-1) for q in params])
    return out


def grads_replaced(clip_fn, max_norm):
    """How many .grad tensors clip_fn replaced instead of scaling them in place."""
    params = copies()
    before = [q.grad for q in params]
    clip_fn(params, max_norm)
    return sum(q.grad is not g for q, g in zip(params, before))


def clip_each(params, max_norm):
    """clip_grad_norm_ on each parameter alone (a known mistake)."""
    return [torch.nn.utils.clip_grad_norm_([p], max_norm) for p in params][-1]


def clip_mistakes():
    """Known wrong answers, from clip_grad_norm_'s results, for each setting."""
    ref, each = clip_copies(torch.nn.utils.clip_grad_norm_), clip_copies(clip_each)
    known = {}
    for what, (scale, max_norm) in SETTINGS4.items():
        total, grads = ref[f"total norm ({what})"], ref[f"grads ({what})"]
        norms = torch.stack([q.grad.double().norm() for q in copies(scale)])
        known[f"total norm ({what})"] = {
            "Σ‖g_p‖, the sum of the parameters' norms": norms.sum(),
            "the norm after clipping, not before": grads.double().norm(),
        }
        wrong = {"each gradient clipped by its own norm": each[f"grads ({what})"]}
        if total < max_norm:
            label = (
                "the gradients × max_norm/(‖g‖ + 1e-6): clipped though ‖g‖ < max_norm"
            )
            wrong[label] = grads * max_norm / (total + 1e-6)
        else:
            label = "the gradients scaled without the + 1e-6 in max_norm/(‖g‖ + 1e-6)"
            wrong[label] = grads * (total + 1e-6) / total
        known[f"grads ({what})"] = wrong
    return known


model.zero_grad(set_to_none=True)
F.cross_entropy(model(X), y).backward()
result = evaluate(
    clip_copies,
    lambda fn: clip_copies(torch.nn.utils.clip_grad_norm_),
    args=(clip_by_global_norm,),
    name="Exercise 4 · clip_by_global_norm",
    against="clip_grad_norm_",
    atol=1e-12,
    rtol=1e-5,
    noun="results",
    mistakes=clip_mistakes(),
)
if result:
    what = "gradients replaced by new tensors instead of scaled in place"
    in_place = evaluate(
        grads_replaced(clip_by_global_norm, 0.05),
        0,
        outputs=(what,),
        counts=(what,),
        name="Exercise 4 · clip_by_global_norm",
    )
    if in_place:
        result.line += "; scales in place"
    else:
        result = in_place
print(result.line)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `ce_grad`, `record_output_grad_norms`,
# `steepest_drop` and `clip_by_global_norm`.
