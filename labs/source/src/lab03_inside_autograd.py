# %% [markdown]
# # Lab 3 · Inside autograd: extend the engine
#
# Chapter 3 opened autograd up: a graph of nodes, each with a local backward rule, walked
# from the output back in topological order, with `+=` wherever a value is used twice. Here
# you write those pieces yourself, on a scalar engine small enough to read in one screen, and
# then count what PyTorch's own graph keeps for backward. This lab goes with
# [Chapter 3](../chapters/03_inside_autograd.ipynb).
#
# **Learning goals.** After this lab you can
# * write the local backward rule of an operation as a closure that *adds* into its inputs' `.grad`;
# * say why `+=`, not `=`, is what makes a value used twice get the sum of its gradients;
# * run backward the way PyTorch's engine does, without recursion: count each node's uses,
#   and run its rule once they have all sent their gradients;
# * count the bytes autograd saves for backward with `saved_tensors_hooks`.
#
# **How a lab works.** Each exercise states its goal and its points (10 in all). Replace every
# `...` with your code, keep the function names and signatures, then run the **self-check**
# cell right below. It runs your function on one case of each promise the prompt makes and
# compares with reference outputs recorded from the course's solution. It answers in one line:
# `✓` matches in every kind of case, `✗` names the kinds of case that fail (and, where it can
# tell, which mistake explains it), or `·` not implemented yet. Your instructor grades the
# notebook you hand in with hidden tests that call the same functions on other cases of the
# same kinds.

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

from helpers.labcontract import check_contract
from helpers.micrograd import Value

# %% [markdown]
# ## The engine you extend
#
# `Value` (chapter 3's engine, `helpers.micrograd`) holds a number `data`, its gradient
# `grad` (0 when made), its parents `_parents` (a tuple), an operation name `_op` and a
# `_backward` closure; `Value(data, parents, op)` makes one. Addition is its worked example:
#
# ```python
# def __add__(self, other):
#     out = Value(self.data + other.data, (self, other), "+")
#
#     def _backward():
#         # +=, never =: if self feeds two ops, each adds its share (and a + a adds twice)
#         self.grad += 1.0 * out.grad
#         other.grad += 1.0 * out.grad
#
#     out._backward = _backward
#     return out
# ```
#
# You write the other operations as functions of Values, `mul`, `power`, `relu`, `tanh` and
# `exp`, each in this pattern, and then the engine that runs the rules, `dependencies` and
# `backward`. Write each rule yourself from its derivative: do not call the Value's own
# operators (`a * b`, `a ** k`, `a.relu()`) inside your answers; they are the course's rules,
# and the exercise is to derive them. The checks build their Values from recorded numbers,
# call your function, then run `out._backward()` once (or a small expression through the
# course engine) and compare `out.data` and the inputs' `.grad` with the course's.

# %% [raw]
# # BEGIN QUESTION
# name: ex1

# %% [markdown]
# ## Exercise 1 · Multiply and power (2 points)
#
# **Goal:** a local backward rule is a closure that adds *local derivative × `out.grad`* into
# each input's `.grad`.
#
# **You derive:** the local derivatives of $a \cdot b$ (with respect to each input) and of
# $a^k$ for a constant $k$, and the closures that add them, times `out.grad`, into the inputs'
# `.grad`.
#
# **You are given:** the `Value` class and the pattern of its `__add__` above.
#
# Write `mul(a, b)` for two Values and `power(a, k)` for a Value `a` and a constant number
# `k`. Each creates `out = Value(forward value, parents, op name)` with its inputs as parents,
# sets `out._backward` to a closure, and returns `out`; copy the pattern of `__add__`. Derive
# the local derivatives first. The rule must **add** into `.grad`, which may already hold
# another use's share; in `mul(x, x)` the same Value is both `a` and `b` and must receive both
# shares. An input may be 0 (then a derivative that divides by it fails). `k` may be any
# number: an integer ≥ 2, a negative integer, or fractional (then `a > 0`), and `a` may be 0 for
# `k ≥ 2`. Your function is also used inside expressions (`x·y·x`, `x^k · x^k`) whose
# backward the course engine runs.
#
# <details><summary>Hint 1 of 3 · the idea: one partial derivative per input</summary>
#
# Write the forward value as a function of the inputs' `.data` and differentiate it w.r.t. each
# input, holding the others fixed. Each input's rule is then one line in the closure: local
# derivative × `out.grad`, **added** into that input's `.grad`. The closure reads `.data` and
# `out.grad` when backward runs it, not when you build `out`.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: the product's two slopes, the power's one</summary>
#
# Holding $b$ fixed, $a \cdot b$ changes with slope `b.data` per unit of $a$; the slope for $b$
# is the mirror image. Keep the two `+=` lines separate: in `mul(x, x)` both add into the same
# `x.grad`, and that is how it receives both shares. For $a^k$ use the power rule with `k` a
# constant, written with `a.data` directly, never as `out.data / a.data` (that divides by 0
# at $a = 0$).
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: small numbers you can do in your head</summary>
#
# In a scratch cell (delete it before handing in): `x, y = Value(3.0), Value(-2.0)`,
# `out = mul(x, y)`, set `x.grad = 0.5` and `out.grad = 2.5`, run `out._backward()`: `x.grad`
# must be $0.5 + 2.5 \cdot (-2) = -4.5$ and `y.grad` $2.5 \cdot 3 = 7.5$. `mul(x, x)` at
# $x = 3$ with `out.grad = 1` gives 6. With `out.grad = 1`, `power(Value(0.0), 3)` gives 0,
# `power(Value(4.0), 0.5)` 0.25, `power(Value(2.0), -1)` −0.25, `power(Value(-2.0), 2)` −4. The
# course's `x * y` and `x ** k` in the scratch cell give the same numbers. To check yours
# against:
#
# $$\frac{\partial (ab)}{\partial a} = b, \qquad \frac{\partial (ab)}{\partial b} = a,
# \qquad \frac{d\,a^k}{da} = k\,a^{k-1},$$
#
# each times `out.grad`, added into the input's `.grad`.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def mul(a, b):
    """out = a·b as a Value, with its local backward rule."""
    # BEGIN SOLUTION
    out = Value(a.data * b.data, (a, b), "*")

    def _backward():
        a.grad += b.data * out.grad
        b.grad += a.data * out.grad

    out._backward = _backward
    return out
    # END SOLUTION


def power(a, k):
    """out = aᵏ for a constant number k, with its local backward rule."""
    # BEGIN SOLUTION
    out = Value(a.data**k, (a,), f"**{k}")

    def _backward():
        a.grad += k * a.data ** (k - 1) * out.grad

    out._backward = _backward
    return out
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** compares your functions with reference outputs recorded from the course's
# rules. A `✗` names the kinds of case that fail before any number.

# %%
check_contract("lab03", "ex1", mul)

# %%
check_contract("lab03", "ex1b", power)

# %% [raw]
# # BEGIN QUESTION
# name: ex2

# %% [markdown]
# ## Exercise 2 · ReLU, tanh and exp (2 points)
#
# **Goal:** the derivative of a nonlinearity is often cheapest from its **output**, the
# number the forward already computed.
#
# **You derive:** the local derivatives of ReLU, tanh and exp, the ones of tanh and exp
# written with the output $y$, and their closures.
#
# **You are given:** `math.tanh`, `math.exp`, the `Value` pattern of `__add__` and your
# rules of exercise 1.
#
# Write `relu(a)`, `tanh(a)` and `exp(a)` in the same pattern (use `math.tanh`, `math.exp`),
# with `+=` again: in `relu(x) + relu(x)` both ReLUs add their share into `x.grad`. Derive
# each local derivative first. Write tanh's in terms of the output (the checks use inputs where
# $\cosh a$ overflows); exp's may be written so too, which saves a second `exp` (no check sees
# which you chose). At exactly 0, take ReLU's derivative to be what PyTorch takes: 0. The checks use each once
# (with `.grad` already 0.5), twice on one Value, chained (`op(op(x)·2 − 0.5)`), for
# negative inputs, at exactly 0 and a hair above it (ReLU: $10^{-300}$ passes too), where tanh
# saturates ($|a| \ge 4$), and where $\cosh a$ overflows a float ($|a| > 710$).
#
# <details><summary>Hint 1 of 3 · the idea: derivatives from the output</summary>
#
# Each op has one parent and one rule, as in exercise 1. Compute the output once in forward,
# keep it in a local name the closure can see, and write the tanh and exp derivatives with
# that output $y$: no `cosh`, no second `exp` in backward. ReLU is a gate: it passes the
# gradient where its input was positive and nowhere else.
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: tanh through its output</summary>
#
# Write $\tanh = \sinh/\cosh$ and use the quotient rule: the numerator becomes
# $\cosh^2 - \sinh^2 = 1$, so the derivative is $1/\cosh^2 a$. Now express $1/\cosh^2$ with
# $\tanh$ alone (divide the identity by $\cosh^2$). Computing $\cosh a$ itself fails for
# $|a| > 710$ (`math.cosh` overflows); the output form does not. For ReLU, compare the input
# with 0 strictly: closed at exactly 0, open at $10^{-300}$.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: against the course's operators</summary>
#
# In a scratch cell (delete it before handing in), build a fresh `Value` for each input, call
# your op, set `out.grad = 2.5`, run `out._backward()`, and compare the input's `.grad` with
# the same steps through the course's `x.relu()`, `x.tanh()`, `x.exp()`. Try $-2$, $0$,
# $10^{-300}$, $5$, and $800$ for tanh (its gradient is 0 there, not an error). For
# `s = relu(x) + relu(x)` at $x = 2$, the course's `s.backward()` must leave `x.grad` at 2.
# To check yours against, with $y$ the output:
#
# $$\mathrm{relu}'(a) = \mathbb{1}[a > 0], \qquad \tanh'(a) = 1 - y^2, \qquad
# (e^a)' = e^a = y.$$
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
import math


def relu(a):
    """out = max(a, 0), with its local backward rule."""
    # BEGIN SOLUTION
    out = Value(a.data if a.data > 0 else 0.0, (a,), "relu")

    def _backward():
        a.grad += (1.0 if a.data > 0 else 0.0) * out.grad

    out._backward = _backward
    return out
    # END SOLUTION


def tanh(a):
    """out = tanh(a), with its local backward rule (from the output)."""
    # BEGIN SOLUTION
    t = math.tanh(a.data)
    out = Value(t, (a,), "tanh")

    def _backward():
        a.grad += (1.0 - t * t) * out.grad

    out._backward = _backward
    return out
    # END SOLUTION


def exp(a):
    """out = eᵃ, with its local backward rule (from the output)."""
    # BEGIN SOLUTION
    e = math.exp(a.data)
    out = Value(e, (a,), "exp")

    def _backward():
        a.grad += e * out.grad

    out._backward = _backward
    return out
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** compares each of your three functions with reference outputs recorded from
# the course's rules. A `✗` names the function and the kinds of case that fail.

# %%
check_contract("lab03", "ex2", relu)

# %%
check_contract("lab03", "ex2b", tanh)

# %%
check_contract("lab03", "ex2c", exp)

# %% [raw]
# # BEGIN QUESTION
# name: ex3

# %% [markdown]
# ## Exercise 3 · Backward by counting dependencies (3 points)
#
# **Goal:** backward may run a node's rule only once every node that *uses* it has added its
# share to its `.grad`. Chapter 3's engine gets that from a topological sort. PyTorch's engine
# does not sort: it first counts, for each node, the uses still to send it a gradient, then
# runs a node as soon as its count drops to 0 (Kahn's algorithm). Write that engine, for a
# `root` Value of chapter 3's engine.
#
# **You derive:** the two loops: a walk without recursion that counts every use of every
# reachable node, and the ready-list loop that runs each rule once, after all its users.
#
# **You are given:** each node's `_parents` and its `_backward` rule (already set by the
# operations), and the rules of the two functions below.
#
# * `dependencies(root)`: a dict `{id(v): n}` with an entry for every node `v` reachable from
#   `root` through `_parents` (`root` included, leaves included), where `n` is the number of
#   times `v` appears in the `_parents` of the nodes reachable from `root` (in `v * v`, `v` is
#   used twice; `root` gets 0). A use outside `root`'s graph (a node made from `v` that `root`
#   does not depend on) does not count. A graph can be deep (a chain of 5000 operations): do
#   not recurse, keep your own stack. Compare nodes by identity (`id(v)`), not by value: two
#   nodes may hold equal numbers. `root` may be a leaf.
# * `backward(root)`: set `root.grad = 1.0`; start with `root` as the only node ready to run.
#   Run a ready node's `_backward()`, then take 1 off the count of each of its parents, once
#   per use; a parent whose count reaches 0 has received every share and is ready. Each rule
#   runs exactly once, after the rules of all its users. Assume every `.grad` starts at 0;
#   return nothing. This is the engine itself: calling the course's `Value.backward` or
#   `topological_order` here gives the exercise 0 points.
#
# The checks build their graphs with the course's `Value`: a node used twice by one node, a
# node reached along two paths, nodes used outside `root`'s graph too, two nodes of equal
# value, a shared node feeding a nonlinearity and more, a chain 3000–5000 deep, a root that is
# a leaf. They compare your counts (sorted: the grader sees your keys only as numbers) and, for
# `backward`, the leaves' gradients and how many rules never ran, ran twice or ran early.
#
# <details><summary>Hint 1 of 4 · the idea: count edges, visit nodes once</summary>
#
# `dependencies` is a graph walk with your own list as the stack: it must *visit* each node
# once (a node reached along two paths is walked from only once) but *count* every edge, every
# entry of a node's `_parents`, duplicates included. `backward` is Kahn's algorithm on those
# counts: a node is ready when its count reaches 0, and running it lowers its parents' counts.
#
# </details>
#
# <details><summary>Hint 2 of 4 · a step: the walk in dependencies</summary>
#
# Give `root` the count 0 and put it on a stack. Pop a node and go through its parents: a
# parent met for the first time gets the count 0 and goes on the stack (so each node is
# walked from once); then every parent, new or not, gets 1 added for this use.
#
# </details>
#
# <details><summary>Hint 3 of 4 · a step: the ready nodes in backward</summary>
#
# A list used as a stack is enough: the order among ready nodes does not matter, only that
# a node goes on it once, when the last of its uses has taken 1 off its count. In `v * v`,
# `v` is in the parents twice, so it loses 1 twice and is ready only after the second.
#
# </details>
#
# <details><summary>Hint 4 of 4 · check yourself: small graphs you can count by hand</summary>
#
# In a scratch cell (delete it before handing in), build graphs with the course's operators:
# for `w = v * v`, the counts are `{id(w): 0, id(v): 2}`. For `a = Value(1.5)`, `b = a.tanh()`,
# `c = a * b`, `d = c + b`: `d` 0, `c` 1, `b` 2, `a` 2; an extra `e = a.exp()` that `d` does not
# use changes nothing. A chain of 5000 `y = y * 1.0001` must not raise `RecursionError`. For
# `backward`, build the same graph twice (leaves keep their `.grad`), run yours on one and the
# course's `d.backward()` on the other, and compare the leaves' `.grad`: a rule run twice
# doubles a share, one run too early misses one.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def dependencies(root):
    """{id(v): uses of v by the nodes reachable from root}, for each v reachable."""
    # BEGIN SOLUTION
    count, stack = {id(root): 0}, [root]
    while stack:
        v = stack.pop()
        for p in v._parents:
            if id(p) not in count:  # met for the first time: walk on from it
                count[id(p)] = 0
                stack.append(p)
            count[id(p)] += 1
    return count
    # END SOLUTION


def backward(root):
    """root.grad = 1, then each rule once, when all its node's uses have sent theirs."""
    # BEGIN SOLUTION
    count = dependencies(root)
    root.grad = 1.0
    ready = [root]
    while ready:
        v = ready.pop()
        v._backward()
        for p in v._parents:
            count[id(p)] -= 1
            if count[id(p)] == 0:  # every use has sent its share
                ready.append(p)
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** runs your two functions and compares with reference outputs recorded from the
# course's engine.

# %%
check_contract("lab03", "ex3", dependencies)

# %%
check_contract("lab03", "ex3b", backward)

# %% [raw]
# # BEGIN QUESTION
# name: ex4

# %% [markdown]
# ## Exercise 4 · Count what autograd saves for backward (3 points)
#
# **Goal:** the memory backward costs is the tensors each node **saves** in forward; a
# `torch.autograd.graph.saved_tensors_hooks(pack, unpack)` context sees every one of them.
#
# **You derive:** which key tells one storage from another, and how the three rules below
# become bookkeeping inside `pack`.
#
# **You are given:** the `saved_tensors_hooks(pack, unpack)` context, `f` and `inputs`, and
# the three rules below.
#
# Write `saved_bytes(f, inputs)` for a function `f` and a tuple of tensors `inputs` (`f`
# marks the weights it needs gradients for itself): run `f(*inputs)` inside a
# `saved_tensors_hooks` context whose `pack(t)` records `t` and returns it unchanged (`unpack`
# returns what `pack` returned), and return, as an `int`, the bytes of everything saved, under
# three rules:
#
# * **whole storage**: a tensor's bytes are those of its whole storage, not numel × element
#   size (a saved view, `W.T` or a slice, keeps all of its storage alive);
# * **each storage once**: a storage counts once, however many ops save it, and whichever
#   views of it they save, at whatever offset into it;
# * **inputs excluded**: storages of `inputs` count zero, also when an op saves a view of an
#   input: they exist anyway; the extra memory is the activations.
#
# The checks use float32 and float64 tensors, functions that save only inputs, several
# outputs, one output saved by several ops, a slice of a larger product, two slices of one
# product at different offsets, a slice of an input at an offset, and a small MLP with a
# softmax.
#
# <details><summary>Hint 1 of 3 · the idea: storages, not tensors</summary>
#
# `pack` is called once per saved tensor, often a view. All three rules talk about
# *storages*, not tensors: two saved views of one storage cost its bytes once, and an input's
# storage costs nothing. What must `pack` remember between calls to apply them, and where can
# that memory live, since `pack` itself must return `t` unchanged?
#
# </details>
#
# <details><summary>Hint 2 of 3 · a step: which key tells storages apart</summary>
#
# `t.data_ptr()` is where a tensor's first element lives: two views of one storage at
# different offsets have different ones. `t.untyped_storage()` is the storage itself; look at
# what it offers for its size and its address.
#
# </details>
#
# <details><summary>Hint 3 of 3 · check yourself: totals you can predict</summary>
#
# In a scratch cell (delete it before handing in), with float64 `x` (2, 3) and `W` (3, 4)
# where only `W` requires grad and `inputs = (x, W)`: `torch.relu(x @ W)` saves `x` (an
# input: 0) and the ReLU's (2, 4) output: 64 bytes. `(x @ W)[:, 1:].sin()` saves a (2, 3)
# slice, but its whole (2, 4) storage counts: 64, not 48. `P = x @ W` then
# `P[:, :2].sin() + P[:, 2:].sin()`: two slices of one storage, 64 once. `W[1:].sin()`: a
# slice of an input, 0. Check that the result is an `int`.
#
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
def saved_bytes(f, inputs):
    """Bytes saved for backward while f(*inputs) runs, by the three rules (an int)."""
    # BEGIN SOLUTION
    seen = {t.untyped_storage().data_ptr() for t in inputs}
    total = 0

    def pack(t):
        nonlocal total
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    return total
    # END SOLUTION


# %% [raw]
# # END SOLUTION

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** runs your function and compares the total with the one recorded from the
# course's solution (an `int`).

# %%
check_contract("lab03", "ex4", saved_bytes)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the function names: the grader calls `mul`, `power`, `relu`, `tanh`,
# `exp`, `dependencies`, `backward` and `saved_bytes`.
