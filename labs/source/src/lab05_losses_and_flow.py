# %% [markdown]
# # Lab 5 · Losses and the flow of gradients: diagnose a broken model
#
# When a model stops learning (its loss stuck near $\log C$, its early layers barely moving),
# these are the tools that find out why. You write them (the cross-entropy gradient, a gradient-flow
# recorder keyed by name, a detector for the layer where the gradient collapses, clipping by
# global norm), each for every kind of input its prompt names. This lab goes with
# [Chapter 5](../chapters/05_losses_and_flow.ipynb): its sections 5.1–5.4 derive the loss
# gradients, 5.7 clips, and 5.9 builds the recorder these exercises rebuild.
#
# **Learning goals.** After this lab you can
# * derive the gradient of cross-entropy with label smoothing and `ignore_index`;
# * record $\lVert \partial L/\partial\,\text{output} \rVert$ of every layer during backward with hooks, keyed by the layer's
#   **name**, and leave no hook behind;
# * read a gradient-flow profile and point at the layer where the gradient collapses;
# * clip gradients by their global norm, in place, as `torch.nn.utils.clip_grad_norm_` does.
#
# **How a lab works.** Each exercise states its goal and its points (10 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It runs your function on one case of each promise the prompt makes and
# compares with reference outputs recorded from the course's solution. It answers in one line:
# `✓` matches in every kind of case, `✗` names the kinds of case that fail (and, where it can
# tell, which mistake explains it), or `·` not implemented yet. Your instructor grades the
# notebook you hand in with hidden tests that call the same functions on other cases of the
# same kinds.
#
# **By hand** means derived: a graded backward may not call autograd, and an estimate by finite
# differences (the forward run again for each input entry) does not count either. One kind of
# case of each backward is large, and there the self-check and the hidden tests count the tensor
# entries your code writes, forward and backward: at most 10 × what the course's backward
# writes, room enough for any derived backward on rows and matrices (loops over rows or samples and float64 copies included; a loop over every single entry may not fit).
# Values read out of tensors into Python or NumPy there (`.item()`, `float()`, `.tolist()`,
# `.numpy()`, printing) count too, at most 8 (a count or a norm, not a tensor), and comparisons
# read out (`if h[i] > 0`) at most two per entry: work done outside tensors cannot be measured. A
# backward over any of these limits scores 0 for its exercise, as one that calls autograd does;
# so does one that calls a backward pass of the course's `helpers`, unless the lab's own code uses it for you and the exercise does not name it.

# %% tags=["remove-cell"]
# Colab setup (hidden on the site): installs the course helpers in Colab only.
import subprocess
import sys

if "google.colab" in sys.modules:
    spec = "backprop-by-hand @ git+https://github.com/backprop-by-hand/course"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)

# %%
import torch
import torch.nn.functional as F

from helpers.labcontract import check_contract

# %% [raw]
# # BEGIN QUESTION
# name: ex1

# %% [markdown]
# ## Exercise 1 · The cross-entropy gradient, smoothed and masked (2 points)
#
# **Goal:** derive the gradient of mean cross-entropy w.r.t. the logits, then see what label
# smoothing (a softer target) and `ignore_index` (rows left out) change in it.
#
# **You derive:** $\partial L/\partial z_r$ (C,) for one kept row with a smoothed target, then
# the factor the mean over the kept rows puts in front, and the rows that get 0: the whole
# (R, C) gradient.
#
# **You are given:** the loss itself (below) and `torch.softmax`, `F.one_hot`; chapter 5's
# sections 5.1, 5.3 and 5.4 did the plain, smoothed and masked cases one at a time.
#
# Write `ce_grad(logits, target, ignore_index=-100, label_smoothing=0.0)` for `logits` (R, C)
# in float32 or float64 and an int64 `target` (R,): return $\partial L/\partial\,\text{logits}$,
# of the shape and dtype of `logits`, for
# `L = F.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=eps)`, with
# $\varepsilon$ = `eps` the `label_smoothing` argument, where
# * row $r$ is kept unless `target[r] == ignore_index`; $L$ is the mean over the $N$ kept rows
#   of $-\sum_c q_c \log \mathrm{softmax}(z_r)_c$;
# * a kept row's target distribution is $q = (1 - \varepsilon)\,\text{one-hot}(t_r) +
#   \varepsilon / C$; ignored rows contribute nothing, so their gradient is exactly 0.
#
# Every argument counts: `ignore_index` is −100 when it is not given, but it may be any integer,
# another negative number, a number ≥ C that no class has, or a class index $0 \le$
# `ignore_index` $< C$ (then the rows of that class are the ones left out); `label_smoothing`
# is 0 when not given, or any $\varepsilon$ in $[0, 1)$, also together with ignored rows. When
# every row is ignored, $N = 0$: return a gradient of zeros (what autograd gives for
# `F.cross_entropy`, whose loss is then NaN). The logits may be large ($|z| \sim 10^3$): your
# gradient must stay finite.
#
# Derive $\partial L/\partial z_r$ for a kept row first: write $\log\mathrm{softmax}$ out and
# use $\sum_c q_c = 1$.
#
# <details><summary>Hint 1 of 4 · the idea: one row, then the mean</summary>
#
# Rows do not mix: kept row $r$'s loss depends on $z_r$ alone, so work on one row $z$ (C,)
# with its target distribution $q$ (C,) and differentiate w.r.t. one logit $z_k$. Write
# $\log\mathrm{softmax}(z)_c$ out as $z_c$ minus a log-sum-exp over all classes. Only then
# look at the mean: each kept row enters $L$ once, with the same weight; an ignored row not
# at all.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: one row's loss, rewritten</summary>
#
# Since the $q_c$ sum to 1, $-\sum_c q_c \log \mathrm{softmax}(z)_c = -\sum_c q_c z_c +
# \log \sum_j e^{z_j}$. The first term is linear in $z$; the second is the log-sum-exp of
# chapter 5.1. Differentiate each w.r.t. $z_k$: neither depends on which class is the target
# any more, only on $q$.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the ignored rows and the count</summary>
#
# $N$ counts the kept rows, not $R$. An ignored row's `target` may be −100 or ≥ C, which
# `F.one_hot` refuses: give those rows any valid class when you build $q$, then set their
# whole gradient row to 0 (multiply by the kept-row mask). When $N = 0$ every row is already
# 0, so divide by $\max(N, 1)$. Take the softmax with `torch.softmax`, which is stable; a
# hand-written `exp(z) / exp(z).sum()` overflows at $|z| \sim 10^3$.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: autograd in a scratch cell</summary>
#
# In a scratch cell (delete it before handing in), make 2×3 float64 logits with
# `requires_grad=True`, compute `F.cross_entropy(logits, target, ignore_index=...,
# label_smoothing=...)`, call `torch.autograd.grad` on it and compare with your `ce_grad`.
# Try: $\varepsilon = 0$ and 0.3; one row ignored with −100, with 7 (≥ C) and with a class
# index such as 1; every row ignored (autograd's gradient is then zeros); logits times 1000.
# Each kept row of your gradient sums to 0 (to round-off); each ignored row is exactly 0.
# The formula, to check yours against, with $m_r = 1$ for a kept row and 0 for an ignored
# one:
#
# $$\frac{\partial L}{\partial z_r} = \frac{m_r}{\max(N, 1)}\big(\mathrm{softmax}(z_r) - q_r\big),
# \qquad q_r = (1 - \varepsilon)\,\text{one-hot}(t_r) + \varepsilon / C.$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def ce_grad(logits, target, ignore_index=-100, label_smoothing=0.0):
    """∂L/∂logits (R, C) of F.cross_entropy with ignore_index and label_smoothing."""
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
    N = keep.sum().clamp(min=1)  # every row ignored: 0 / 1, a zero gradient
    return (P - q) * keep[:, None] / N
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** compares your function with reference outputs recorded from the course's
# solution. A `✗` names the kinds of case that fail before any number, then what is wrong in the
# first of them: a constant factor ($N$, $N/R$), a flipped sign, or a known mistake in $q$ or
# the softmax.

# %%
check_contract("lab05", "ex1", ce_grad)

# %% [raw]
# # BEGIN QUESTION
# name: ex2

# %% [markdown]
# ## Exercise 2 · A gradient-flow recorder keyed by name (3 points)
#
# **Goal:** see the gradient *as it flows past* each layer, with hooks, and label each
# measurement with the layer's name (seed 000's recorder stored by module and looked up by
# name, so it recorded nothing).
#
# **You derive:** the plumbing: which hook goes on which object and when it fires, how each
# measurement carries its module's name, and how the hooks are cleaned up.
#
# **You are given:** a fresh `model`, its input `X` and labels `y`; PyTorch's
# `register_forward_hook` on modules and `register_hook` on tensors; chapter 5.9 describes the
# same recorder (`helpers.gradflow.GradFlowRecorder`: compare with it in a scratch cell; called
# in your answer, it or `record_grad_flow` scores 0 for the exercise).
#
# Write `record_output_grad_norms(model, X, y)` for any `nn.Module` `model`, `X` its input
# and `y` int64 class labels: for every **leaf** module (one without children; the names
# `model.named_modules()` gives, skipping the root's empty name), register a **forward hook**
# that, when the module runs, registers a **tensor hook** on its output (not a module's backward
# hook, nor `retain_grad`: the method is the point here, and the check refuses both); the tensor
# hook stores `grad.norm().item()` (a Python float) under the module's **name** (a str: `"0"`, `"1"`, … in
# an `nn.Sequential`, `"blocks.0.linear"` when layers are nested). Then run
# `L = F.cross_entropy(model(X), y)` and `L.backward()`, remove every hook you registered (even
# if something raised: `try`/`finally`), and return the dict `{name: norm}`, each norm being
# $\lVert \partial L/\partial\,\text{output} \rVert$.
#
# A layer whose output needs no gradient (nothing before it, itself included, has parameters,
# such as an `nn.Flatten` first) gets no entry: a tensor that does not require grad cannot
# take a hook. The model may be float32 or float64, with LayerNorm and residual blocks; the
# dict's order does not matter (it fills during backward, the head first). The model you get is
# fresh, with no hooks; leave none on it.
#
# <details><summary>Hint 1 of 4 · the idea: a hook that plants a hook</summary>
#
# Two moments: the forward hands a module's forward hook its `output` tensor; the backward
# later hands a tensor hook on that `output` its gradient $\partial L/\partial\,\text{output}$,
# of the output's shape. So the forward hook's one job is to register the tensor hook, and
# the tensor hook's one job is to store the norm. Decide first which modules are leaves
# (`module.children()` is empty) and where the name comes from (`model.named_modules()`).
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: every entry lands under the last name</summary>
#
# A closure made in a loop reads the loop variable when it runs, not when it was made: by
# backward time the loop has ended, so every hook sees the last name. Make each hook *for*
# its name: capture it as a default argument, `def hook(m, i, o, name=name)`, or build the
# hook in a small function that takes the name.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the order, and what can go wrong</summary>
#
# Register the forward hooks and keep every handle they return in a list; run the forward
# and the backward inside `try`; remove every handle in `finally`, so an exception (a label
# out of range) still leaves no hook. The tensor hooks live on the outputs and go away with
# them. An output that does not require grad (an `nn.Flatten` first) refuses `register_hook`:
# test `output.requires_grad` first and skip it.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: against the chapter's recorder</summary>
#
# In a scratch cell (delete it before handing in), with `from torch import nn` and
# `from helpers.gradflow import GradFlowRecorder`, build a small float64 model, e.g.
# `nn.Sequential(nn.Flatten(), nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3)).double()` for `X`
# of shape (5, 2, 3), and a `copy.deepcopy` of it. Run your function on the model, then
# `with GradFlowRecorder(twin) as rec: F.cross_entropy(twin(X), y).backward()` on the copy,
# and compare your dict with `rec.output_grad_norms` key by key (`"0"`, the Flatten, must be
# missing from both). Try a nested model too (names like `"blocks.0.linear"`), and a label
# out of range: the error must reach you, and afterwards `module._forward_hooks` must be
# empty for every module.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def record_output_grad_norms(model, X, y):
    """{leaf module name: ‖∂L/∂(its output)‖}, L = cross_entropy(model(X), y)."""
    # BEGIN SOLUTION
    norms, handles = {}, []

    def forward_hook(module, inputs, output, name):
        if output.requires_grad:
            output.register_hook(lambda g: norms.__setitem__(name, g.norm().item()))

    try:
        for name, module in model.named_modules():
            if name and not list(module.children()):
                handles.append(
                    module.register_forward_hook(
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
# # END QUESTION

# %% [markdown]
# **Self-check 2** builds fresh models (an `nn.Sequential` of `Linear` and `ReLU`, chapter 5's
# `deep_mlp` with nested blocks, its LayerNorm-and-residual variant, a `Sequential` that starts
# with `Flatten`), runs your recorder on each and compares its dict with the recorded one, key
# by key.
#
# Then it counts the hooks left on the model, which must be none. In the case whose loss raises
# (a label out of range, after the forward ran), the error must reach you, and still no hook may
# be left (`try`/`finally`).

# %%
check_contract("lab05", "ex2", record_output_grad_norms)

# %% [markdown]
# ## What a healthy ReLU does to the gradient
#
# Before you look for a broken layer, know what a healthy one does. A ReLU passes the gradient
# only where its input was positive and zeroes it elsewhere. If it passes a fraction $f$ of the
# entries, it cuts the **squared** norm, a sum over the entries, to about $f$ of what entered,
# so the norm keeps about $\sqrt f$ of it: with half the entries passed, about 0.7, not a half.
# A well-initialised linear layer keeps the norm about the same.

# %% [raw]
# # BEGIN QUESTION
# name: ex3

# %% [markdown]
# ## Exercise 3 · Find the broken layer (2 points)
#
# **Goal:** in a healthy network the output-gradient norm changes by a factor of order 1 from
# one layer to the previous one; a broken layer that kills the signal shows up as a collapse
# **across it**: the gradient leaves it far smaller than it entered. (A layer that blows the
# gradient up would show the opposite, a ratio far above 1; here you look for the collapse.)
#
# **You derive:** the list of ratios, one per layer `names[i]` with $i \ge 1$, each from the
# right pair of norms, and which layer has the smallest.
#
# **You are given:** `norms` (a dict, in any order) and `names` (the forward order); the
# ratio's definition below.
#
# Write `steepest_drop(norms, names)`: `names` (a list of str) lists the layers in forward
# order and `norms` maps each to its $\lVert \partial L/\partial\,\text{output} \rVert$, in
# any order (a recorder fills it during backward, head first): the order to follow is that of
# `names`, as given, never sorted (`"blocks.1.act"` sorts before `"blocks.1.linear"`, `"10"`
# before `"2"`). For every layer `names[i]` with $i \ge 1$, the gradient enters it (backward)
# with norm `norms[names[i]]` and leaves it with norm `norms[names[i - 1]]` (the previous
# layer's output is this layer's input); `names[0]` has no layer before it. Return the name
# (a str of `names`) with the smallest ratio leaves / enters, also when no layer collapses.
# Compare ratios, not differences: the largest drop in absolute terms may be elsewhere.
#
# <details><summary>Hint 1 of 3 · the idea: follow names, not the dict</summary>
#
# The dict's order is whatever backward left, and sorting the keys breaks on `"10"` and
# nested names. Walk `names` by index: position $i$ and position $i - 1$ are neighbours in
# the network, so they give one ratio for `names[i]`; there are `len(names) - 1` ratios.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: keep the name with its ratio</summary>
#
# You return a name, not a ratio or an index into the ratios: store each ratio together with
# its layer's name (a dict keyed by name, or pairs), then pick the pair whose ratio is
# smallest. `min` with a `key` does that in one call. A ratio below 1 means the gradient
# shrank across that layer; with no collapse the smallest ratio may be above 1, and you still
# return it.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: a profile made by hand</summary>
#
# In a scratch cell (delete it before handing in): `names = ["0", "1", "2", "3"]`,
# `norms = {"3": 1.0, "2": 0.9, "1": 0.01, "0": 0.009}`. The gradient enters `"2"` at 0.9
# and leaves it at 0.01, a ratio of about 0.011, the smallest: the answer is `"2"`. Then try
# the same dict built in the other order (same answer), names `"2"` … `"10"` in forward
# order, and a profile where 100 → 50 (ratio 0.5, drop 50) sits beside 1 → 0.01 (ratio 0.01,
# drop 0.99). What to check yours against:
#
# $$\text{answer} = \arg\min_{i \ge 1}\ \frac{\text{norms}[\text{names}[i-1]]}{\text{norms}[\text{names}[i]]}.$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def steepest_drop(norms, names):
    """The name names[i] (i ≥ 1) across which the gradient shrinks the most."""
    # BEGIN SOLUTION
    ratios = {
        names[i]: norms[names[i - 1]] / norms[names[i]] for i in range(1, len(names))
    }
    return min(ratios, key=ratios.get)
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** runs your function on made-up profiles. The reference is the layer each was
# built to collapse at (or, without a collapse, the smallest ratio).

# %%
check_contract("lab05", "ex3", steepest_drop)

# %% [raw]
# # BEGIN QUESTION
# name: ex4

# %% [markdown]
# ## Exercise 4 · Clipping by global norm, by hand (3 points)
#
# **Goal:** clipping rescales **all** gradients by one factor, so the update keeps its
# direction and only its length shrinks.
#
# **You derive:** the global norm as one number over every gradient there is, the one factor
# and when it applies, and how to rescale the `.grad` tensors without replacing them.
#
# **You are given:** `params` with their `.grad` already filled (some may be `None`) and the
# rule below; chapter 5.7 wrote it out as `clip_by_hand`.
#
# Write `clip_by_global_norm(params, max_norm)` for a list of parameters (leaf tensors, of any
# shapes, float32 or float64): over the parameters whose `.grad` is not `None`, the global
# norm is $\lVert g\rVert = \sqrt{\sum_p \lVert g_p\rVert^2}$; if
# $\mathrm{max\_norm} / (\lVert g\rVert + 10^{-6}) < 1$, multiply every gradient **in place**
# (the same `.grad` tensors, not new ones) by that factor, as `torch.nn.utils.clip_grad_norm_`
# does; else leave them alone. Leave a `.grad` that is `None` as it is. Return $\lVert g\rVert$
# before clipping, as a 0-dim tensor of the gradients' dtype. There may be one parameter or
# several; the gradients may be tiny ($\lVert g\rVert \sim 10^{-5}$, where the $10^{-6}$ matters)
# or all zero ($\lVert g\rVert = 0$: nothing to clip, and nothing to divide by zero).
#
# <details><summary>Hint 1 of 3 · the idea: one long vector</summary>
#
# Think of all the gradients flattened and concatenated into one vector $g$. Its squared
# norm is a sum over its entries, so it is the sum over parameters of each $\lVert g_p\rVert^2$,
# whatever their shapes; a parameter whose `.grad` is `None` adds nothing. One factor then
# multiplies every entry of $g$, so the direction is kept.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the order, and "in place"</summary>
#
# First collect the gradients that are not `None`, then the norm, then the factor; compare
# it with 1, and only if it is smaller scale each gradient with an in-place method
# (`mul_`). `g = g * c` only rebinds a name, and `p.grad = p.grad * c` puts a new tensor
# there: neither is in place. With all-zero gradients the norm is 0, the $10^{-6}$ keeps the
# factor finite (and large), so nothing is clipped. Return the norm computed before the
# scaling, 0-dim, in the gradients' dtype.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: against PyTorch</summary>
#
# In a scratch cell (delete it before handing in), make two sets of the same parameters
# (e.g. shapes (2, 3) and (3,), float64) with the same `.grad`, call yours on one and
# `torch.nn.utils.clip_grad_norm_` on the other, and compare the returned norms and every
# gradient. Keep `ref = p.grad` before your call and check `p.grad is ref` after it. Try
# `max_norm` above the norm (nothing changes), a parameter whose `.grad` is `None`,
# gradients of size $10^{-5}$ with `max_norm` between $\lVert g\rVert$ and
# $\lVert g\rVert + 10^{-6}$, and all-zero gradients. The rule, to check yours against:
#
# $$\lVert g\rVert = \sqrt{\textstyle\sum_p \lVert g_p\rVert^2},\qquad g_p \leftarrow g_p \cdot
# \min\Big(1, \frac{\text{max\_norm}}{\lVert g\rVert + 10^{-6}}\Big).$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def clip_by_global_norm(params, max_norm):
    """Clip the .grad of params by their global norm, in place; return it (0-dim)."""
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
# # END QUESTION

# %% [markdown]
# **Self-check 4** builds parameters whose `.grad` hold recorded gradients and compares the norm
# you return and every gradient after your call with `torch.nn.utils.clip_grad_norm_`'s, and
# checks that each `.grad` is still the same tensor (scaled in place).

# %%
check_contract("lab05", "ex4", clip_by_global_norm)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the names: the grader calls `ce_grad`, `record_output_grad_norms`,
# `steepest_drop` and `clip_by_global_norm`.
