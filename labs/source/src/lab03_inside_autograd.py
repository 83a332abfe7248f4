# %% [raw]
# # ASSIGNMENT CONFIG
# name: lab03_inside_autograd
# init_cell: false
# check_all_cell: false
# export_cell: false
# run_tests: true
# generate:
#   pdf: false
#   show_stdout: false

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
import itertools
import math

import torch

from helpers import micrograd
from helpers.device import get_device, no_tf32, randn
from helpers.labcheck import autograd_grads, check, checker, evaluate
from helpers.memory import SavedTensors, tensor_bytes

dev = get_device()
no_tf32()
dtype = torch.float64  # the engine works in Python floats (float64): compare in float64

# %% [markdown]
# ## The engine you extend
#
# `Value` holds a number, its gradient, its parents and a `_backward` closure. Addition is
# written out as the worked example; every other operation calls a function **you** write
# below (`mul`, `power`, `relu`, `tanh`, `exp`, `backward`). Python looks those names up when
# the operator runs, so the class works as soon as your function exists. Subtraction,
# negation and division are built from `+`, `*` and `**`, so they need no rule of their own.


# %%
def as_value(x):
    """x itself if it is a Value, else a constant Value(x) (a leaf, grad never read)."""
    return x if isinstance(x, Value) else Value(x)


class Value:
    """A scalar that remembers how it was made: data, grad, parents, backward rule."""

    def __init__(self, data, _parents=(), _op=""):
        self.data = float(data)
        self.grad = 0.0
        self._parents = tuple(_parents)
        self._op = _op
        self._backward = lambda: None  # a leaf has nothing to pass on

    def __repr__(self):
        return f"Value({self.data:.4f}, grad={self.grad:.4f})"

    def __add__(self, other):
        """out = a + b;  ∂out/∂a = 1, ∂out/∂b = 1 (the worked example)."""
        other = as_value(other)
        out = Value(self.data + other.data, (self, other), "+")

        def _backward():
            # +=, never =: if self feeds two ops, each adds its share
            # (and a + a adds twice)
            self.grad += 1.0 * out.grad
            other.grad += 1.0 * out.grad

        out._backward = _backward
        return out

    # the operations you write in the exercises
    def __mul__(self, other):
        return mul(self, as_value(other))

    def __pow__(self, k):
        return power(self, k)

    def relu(self):
        return relu(self)

    def tanh(self):
        return tanh(self)

    def exp(self):
        return exp(self)

    def backward(self):
        return backward(self)

    # derived from the ones above: no new backward rules
    def __neg__(self):
        return self * -1.0

    def __sub__(self, other):
        return self + (-as_value(other))

    def __truediv__(self, other):
        return self * as_value(other) ** -1

    def __radd__(self, other):
        return self + other

    def __rmul__(self, other):
        return self * other

    def __rsub__(self, other):
        return as_value(other) - self


def engine_grads(f, *numbers):
    """(f(x...), ∂f/∂x...) as float64 tensors, from f on Values and backward.

    Used by the self-checks of exercises 1 and 2 (they do not need your exercise 3 yet).
    None if one of your operations still returns None (not implemented yet).
    """
    for op in OPS_USED.get(f, ()):
        probe = (
            (Value(1.5), 2)
            if op.__name__ == "power"
            else (Value(1.5), Value(2.0))
            if op.__name__ == "mul"
            else (Value(1.5),)
        )
        result = op(*probe)
        if result is None:
            return None
        if not isinstance(result, Value):
            raise TypeError(
                f"{op.__name__} returned a {type(result).__name__}, expected a Value"
            )
    xs = [Value(x) for x in numbers]
    out = f(*xs)
    if not isinstance(out, Value):
        raise TypeError(
            f"the expression gave a {type(out).__name__}, expected a Value: "
            "does every operation return its out?"
        )
    out.grad = 1.0
    for v in reversed(micrograd.topological_order(out)):
        v._backward()
    return tuple(
        torch.tensor(v, dtype=torch.float64) for v in (out.data, *(x.grad for x in xs))
    )


def torch_grads(f, *numbers):
    """The same (f(x...), ∂f/∂x...) by PyTorch's autograd, the reference."""
    xs = tuple(torch.tensor(float(x), dtype=torch.float64) for x in numbers)
    value = f(*xs).detach()
    return (value, *autograd_grads(f, xs))


def engine_grad_at(f, points):
    """∂f/∂x at each point (a graph per point, f run on Values); None if unfinished."""
    grads = [engine_grads(f, x0) for x0 in points.tolist()]
    if None in grads:
        return None
    return torch.stack([g[1] for g in grads])


def torch_grad_at(f, points):
    """The same by autograd (f works elementwise on a tensor of points)."""
    (g,) = autograd_grads(lambda x: f(x).sum(), (points,))
    return g


# expression -> its operations (so an unfinished one reads "not implemented yet")
OPS_USED = {}

# %% [raw]
# # BEGIN QUESTION
# name: ex1
# points: 2

# %% [markdown]
# ## Exercise 1 · Multiply and power (2 points)
#
# **Goal:** a local backward rule is a closure that adds *local derivative × `out.grad`* into
# each input's `.grad`.
#
# Write `mul(a, b)` ($\partial(ab)/\partial a = b$, $\partial(ab)/\partial b = a$) and
# `power(a, k)` for a constant number `k` ($\partial a^k/\partial a = k\,a^{k-1}$). Each
# creates `out = Value(forward value, parents, op name)`, sets `out._backward` to a closure, and
# returns `out`; copy the pattern of `Value.__add__`. Use `+=` in the closure: in `x * x` the
# same Value is both `a` and `b`, and it must receive both shares, $2x$.

# %% [raw]
# # BEGIN SOLUTION


# %%
def mul(a, b):
    """out = a·b;  ∂out/∂a = b, ∂out/∂b = a."""
    # BEGIN SOLUTION
    out = Value(a.data * b.data, (a, b), "*")

    def _backward():
        a.grad += b.data * out.grad
        b.grad += a.data * out.grad

    out._backward = _backward
    return out
    # END SOLUTION


def power(a, k):
    """out = aᵏ for a constant number k;  ∂out/∂a = k·aᵏ⁻¹."""
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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
from helpers.micrograd import topological_order as _topo

_a, _b = Value(-1.25), Value(0.75)
_out = mul(mul(_a, _b), _a)  # a²b: ∂/∂a = 2ab, ∂/∂b = a²
_out.grad = 1.0
for _v in reversed(_topo(_out)):
    _v._backward()
assert abs(_out.data - 1.171875) < 1e-12
assert abs(_a.grad - 2 * -1.25 * 0.75) < 1e-12 and abs(_b.grad - 1.5625) < 1e-12

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
from helpers.micrograd import topological_order as _topo

_x = Value(3.0)
_sq = mul(_x, _x)  # the same Value as both inputs: 2x, not x
_sq.grad = 1.0
_sq._backward()
assert abs(_x.grad - 6.0) < 1e-12
_y = Value(4.0)
_out = power(_y, 0.5) + power(_y, -1)  # ∂/∂y = 0.5·y^-0.5 − y^-2
_out.grad = 1.0
for _v in reversed(_topo(_out)):
    _v._backward()
assert abs(_out.data - 2.25) < 1e-12 and abs(_y.grad - (0.25 - 1 / 16)) < 1e-12

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 1** (reference: autograd). First each operation alone, at three points: its
# `out` must record its inputs as parents; one call of `out._backward()`, with `out.grad` =
# 2.5 and 0.5 already in each input's `.grad` (another use's share), must add the right
# amounts; and $(x \cdot x) \cdot 3 + 2x$ (for `mul`) or $(x^2)^{1.5} + x^{-1}$ (for `power`)
# must get autograd's $\partial f/\partial x$. So a ✗ names the function that is wrong, and a
# known mistake when your rule makes one. Then both in $f(x, y) = x\,y\,x + y^3 - x/y$,
# where $x$ is used three times:


# %%
points1 = torch.tensor([0.7, -1.3, 2.0], dtype=dtype)
b1, k1, g1, before1 = -0.8, 3, 2.5, 0.5  # mul's b, power's k, out.grad, .grad before


def one_rule(op, x):
    """op on fresh Values (0.5 already in each .grad), then out._backward() once with
    out.grad = 2.5: (inputs missing from out._parents, the inputs' .grad after)."""
    inputs = (Value(x), Value(b1)) if op is mul else (Value(x),)
    for v in inputs:
        v.grad = before1
    out = op(*inputs) if op is mul else op(*inputs, k1)
    if out is None:
        return None
    missing = sum(not any(p is v for p in out._parents) for v in inputs)
    out.grad = g1
    out._backward()
    return missing, [v.grad for v in inputs]


def rules_at(op, f, points):
    """For each point: inputs missing from out._parents, the rule's .grad; ∂f/∂x."""
    runs = [one_rule(op, x) for x in points.tolist()]
    grads = engine_grad_at(f, points)
    if None in runs or grads is None:
        return None
    return {
        "inputs missing from out._parents": sum(n for n, _ in runs),
        "the rule's .grad": torch.tensor([g for _, g in runs], dtype=dtype),
        "∂f/∂x": grads,
    }


def torch_rules_at(op, f_torch, points):
    """The same by autograd: 0.5 plus the share out.grad × ∂out/∂input."""
    g, bs = torch.full_like(points, g1), torch.full_like(points, b1)
    if op is mul:
        share = torch.stack(autograd_grads(torch.mul, (points, bs), g), -1)
    else:
        share = autograd_grads(lambda a: a**k1, (points,), g)[0][:, None]
    return {
        "inputs missing from out._parents": 0,
        "the rule's .grad": before1 + share,
        "∂f/∂x": torch_grad_at(f_torch, points),
    }


def rule_mistakes(op, points):
    """Known wrong results of one out._backward(), from autograd's share."""
    share = torch_rules_at(op, lambda x: x, points)["the rule's .grad"] - before1
    known = {
        "the share alone: = replaced the 0.5 already in .grad": share,
        "the local derivatives alone, not × out.grad": before1 + share / g1,
    }
    if op is mul:
        known["the two local derivatives swapped"] = before1 + share.flip(-1)
    else:
        known["k·aᵏ: the exponent not lowered by one"] = (
            before1 + share * points[:, None]
        )
        known["aᵏ⁻¹ without the factor k"] = before1 + share / k1
    return known


CASES1 = (  # (your function, an expression using it on Values, the same on tensors)
    (
        mul,
        lambda x: mul(mul(x, x), Value(3.0)) + mul(x, Value(2.0)),
        lambda x: x * x * 3 + x * 2,
    ),
    (
        power,
        lambda x: power(power(x, 2), 1.5) + power(x, -1),
        lambda x: (x**2) ** 1.5 + x**-1,
    ),
)
for op, f, f_torch in CASES1:
    OPS_USED[f] = (op,)
    check(
        lambda: rules_at(op, f, points1),
        lambda: torch_rules_at(op, f_torch, points1),
        counts=("inputs missing from out._parents",),
        mistakes={"the rule's .grad": rule_mistakes(op, points1)},
        name=f"Exercise 1 · {op.__name__}",
        against="autograd",
    )


def f1(x, y):
    """x·y·x + y³ − x/y with your mul and power: x feeds three products."""
    minus_x_over_y = mul(mul(x, power(y, -1)), Value(-1.0))
    return mul(mul(x, y), x) + power(y, 3) + minus_x_over_y


def f1_torch(x, y):
    """The same expression on tensors, for autograd."""
    return x * y * x + y**3 - x / y


OPS_USED[f1] = (mul, power)
check(
    lambda x, y: engine_grads(f1, x, y),
    lambda x, y: torch_grads(f1_torch, x, y),
    args=(0.7, -1.3),
    outputs=("f", "∂f/∂x", "∂f/∂y"),
    name="Exercise 1 · mul, power",
    against="autograd",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex2
# points: 2

# %% [markdown]
# ## Exercise 2 · ReLU, tanh and exp (2 points)
#
# **Goal:** the derivative of a nonlinearity is often cheapest from its **output**, the
# number the forward already computed.
#
# Write `relu(a)`, `tanh(a)` and `exp(a)` in the same pattern (use `math.tanh`, `math.exp`),
# with `+=` again: in `relu(x) + relu(x)` both ReLUs add their share into `x.grad`. Derive
# each local derivative first, and write the tanh and exp ones in terms of the output. At
# exactly 0, take ReLU's derivative to be what PyTorch takes: 0.
#
# <details><summary>Hint: the three local derivatives</summary>
#
# $\tanh'(a) = 1 - \tanh^2(a)$, $\exp'(a) = \exp(a)$; ReLU's is 1 where the input is
# positive, else 0.
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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

for _x0, _d in ((0.8, 1.0), (-0.3, 0.0), (0.0, 0.0)):
    _x = Value(_x0)
    _r = relu(_x)
    _r.grad = 2.0
    _r._backward()
    assert abs(_r.data - max(_x0, 0.0)) < 1e-12 and abs(_x.grad - 2.0 * _d) < 1e-12, (
        _x0,
        _x.grad,
    )

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

_x = Value(-0.4)
_t, _e = tanh(_x), exp(_x)  # x used twice: both rules must add into x.grad
_t.grad, _e.grad = 1.5, -0.5
_t._backward()
_e._backward()
assert abs(_t.data - math.tanh(-0.4)) < 1e-12 and abs(_e.data - math.exp(-0.4)) < 1e-12
assert abs(_x.grad - (1.5 * (1 - math.tanh(-0.4) ** 2) - 0.5 * math.exp(-0.4))) < 1e-12

# %%
""" # BEGIN TEST CONFIG
hidden: true
points: 1
"""  # END TEST CONFIG
import math

# each operation used twice on one Value: both uses add into x.grad,
# 2 × the local derivative
for _op, _x0, _d in (
    (relu, 0.6, 1.0),
    (tanh, 0.3, 1 - math.tanh(0.3) ** 2),
    (exp, -0.2, math.exp(-0.2)),
):
    _x = Value(_x0)
    _u, _w = _op(_x), _op(_x)
    _u.grad = _w.grad = 1.0
    _u._backward()
    _w._backward()
    assert abs(_x.grad - 2 * _d) < 1e-12, (_op.__name__, _x.grad)

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 2** (reference: autograd on
# each operation alone, used twice on one Value (`relu(x) + relu(x)`) at four points, one
# of them 0, so a ✗ names the function that is wrong; then all of them in
# $f(x, y) = 2\,\mathrm{relu}(u) + \tanh(v) + e^{\tanh(v)} + \mathrm{relu}(y + 0.2) +
# \mathrm{relu}(y + 0.7) + 2e^{x}$ at $x = 0.5$, $y = -0.7$, with $u = x + 1$, $v = x + y$, each
# written as two uses of the same Value (`u.relu() + u.relu()`), so an `=` instead of `+=`
# shows; one ReLU is active, one not, and one sits at exactly 0; it uses only `+` and your
# three functions):


# %%
points2 = torch.tensor([0.8, -0.3, 0.0, 1.5], dtype=dtype)
CASES2 = (  # (your function, op(x) + op(x) with it, the same on tensors)
    (relu, lambda x: relu(x) + relu(x), lambda x: 2 * torch.relu(x)),
    (tanh, lambda x: tanh(x) + tanh(x), lambda x: 2 * torch.tanh(x)),
    (exp, lambda x: exp(x) + exp(x), lambda x: 2 * torch.exp(x)),
)
expected2 = {op: torch_grad_at(f_torch, points2) for op, _, f_torch in CASES2}
KNOWN2 = {  # known wrong ∂f/∂x of op(x) + op(x), from autograd's
    relu: {
        "out.grad passed on everywhere: the gate left out": torch.full_like(points2, 2),
    },
    tanh: {
        "2(1 − a²): the input squared, not the output": 2 * (1 - points2**2),
        "2 tanh(a): tanh itself as its derivative": 2 * torch.tanh(points2),
    },
    exp: {"2a: the input a as exp's derivative": 2 * points2},
}
for op, f, _ in CASES2:
    OPS_USED[f] = (op,)
    known = {"one use's share only: = replaced the other's": expected2[op] / 2}
    check(
        lambda: engine_grad_at(f, points2),
        expected2[op],
        outputs=("∂f/∂x",),
        mistakes={"∂f/∂x": known | KNOWN2[op]},
        regions={"∂f/∂x": {"x = 0 (ReLU's derivative there is 0)": points2 == 0}},
        name=f"Exercise 2 · {op.__name__}",
        against="autograd",
    )


def f2(x, y, relu=relu, tanh=tanh, exp=exp):
    """2 relu(u), tanh(v), exp(tanh(v)), relu(y + 0.2), relu(y + 0.7), 2 exp(x)."""
    u, v = x + 1.0, x + y
    return (
        relu(u)
        + relu(u)
        + tanh(v)
        + exp(tanh(v))
        + relu(y + 0.2)
        + relu(y + 0.7)  # y + 0.7 is exactly 0 here: ReLU's derivative there is 0
        + exp(x)
        + exp(x)
    )


def f2_torch(x, y):
    """The same expression on tensors, for autograd."""
    return f2(x, y, relu=torch.relu, tanh=torch.tanh, exp=torch.exp)


OPS_USED[f2] = (relu, tanh, exp)
check(
    lambda x, y: engine_grads(f2, x, y),
    lambda x, y: torch_grads(f2_torch, x, y),
    args=(0.5, -0.7),
    outputs=("f", "∂f/∂x", "∂f/∂y"),
    name="Exercise 2 · relu, tanh, exp",
    against="autograd",
)

# %% [raw]
# # BEGIN QUESTION
# name: ex3
# points: 3
# by_hand: [helpers.micrograd.topological_order]

# %% [markdown]
# ## Exercise 3 · Backward by counting dependencies (3 points)
#
# **Goal:** backward may run a node's rule only once every node that *uses* it has added its
# share to its `.grad`. Chapter 3's engine gets that from a topological sort. PyTorch's engine
# does not sort: it first counts, for each node, the uses still to send it a gradient, then
# runs a node as soon as its count drops to 0 (Kahn's algorithm). Write that engine.
#
# * `dependencies(root)`: a dict `{id(v): n}` with an entry for every node `v` reachable from
#   `root` through `_parents`, where `n` is the number of times `v` appears in the `_parents`
#   of the nodes reachable from `root` (in `v * v`, `v` is used twice; `root` gets 0). A graph
#   can be deep (a chain of 5000 operations): do not recurse, keep your own stack. Compare
#   nodes by identity (`id(v)`), not by value.
# * `backward(root)`: set `root.grad = 1.0`; start with `root` as the only node ready to run.
#   Run a ready node's `_backward()`, then take 1 off the count of each of its parents, once
#   per use; a parent whose count reaches 0 has received every share and is ready. Each rule
#   runs exactly once, after the rules of all its users. Assume every `.grad` starts at 0.
#
# The self-check and the tests build their graphs from `Node`, the course's engine
# (`helpers.micrograd.Value`, so this does not depend on exercises 1–2) plus a list `_users`:
# every node made from a value so far, in **any** graph. A use outside `root`'s graph never
# sends a gradient in `root`'s backward (PyTorch's nodes do not even know their users).
#
# <details><summary>Hint: the walk in dependencies</summary>
#
# Give `root` the count 0 and put it on a stack. Pop a node and go through its parents: a
# parent met for the first time gets the count 0 and goes on the stack (so each node is
# walked from once); then every parent, new or not, gets 1 added for this use.
# </details>
#
# <details><summary>Hint: the ready nodes in backward</summary>
#
# A list used as a stack is enough: the order among ready nodes does not matter, only that
# a node goes on it once, when the last of its uses has taken 1 off its count.
# </details>

# %% [raw]
# # BEGIN SOLUTION


# %%
class Node(micrograd.Value):
    """The course's Value plus _users: every node made from this one, in any graph."""

    def __init__(self, data, _parents=(), _op="", name=""):
        super().__init__(data, _parents, _op, name)
        self._users = []
        for p in self._parents:
            p._users.append(self)


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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
_a, _b = Node(0.5), Node(-2.0)
_c = _a * _b
_d = _c * _c + _a  # c used twice by one node, a reached along two paths
_e = _d * _c
_side = _d + 1.0  # a use of d outside e's graph
_n = dependencies(_e)
# e 0, d 1, c 3, a 2, b 1, c · c 1; the grader holds handles to the nodes, not
# their ids, so it compares the counts
assert len(_n) == 6 and all(isinstance(k, int) for k in _n)
assert sorted(_n.values()) == [0, 1, 1, 1, 2, 3]

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
_x = Node(0.3)
_h = _x
for _ in range(5000):  # deeper than Python's recursion limit
    _h = _h * 1.0001 + 0.0
_n = dependencies(_h)
# x, then per step: 2 constants, *, +
# h 0, every other node 1
assert len(_n) == 1 + 5000 * 4 and sorted(_n.values()) == [0] + [1] * 20000
backward(_h)
assert abs(_x.grad - 1.0001**5000) < 1e-9

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import math

_x, _y = Node(0.9), Node(-0.4)
_u, _w = _x * 1.0, _x + 0.0  # two nodes of equal value
_s = _u * _y  # used twice by one node, and once outside z's graph
_side = _s * 3.0
_z = (_s * _s).tanh() + _u * _w + (_y + 1.0).exp()
backward(_z)
_t = math.tanh((0.9 * -0.4) ** 2)
_ds = (1 - _t * _t) * 2 * (0.9 * -0.4)  # ∂z/∂s
assert abs(_z.grad - 1.0) < 1e-12
assert abs(_x.grad - (_ds * -0.4 + 1.8)) < 1e-12
assert abs(_y.grad - (_ds * 0.9 + math.exp(0.6))) < 1e-12

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 3** (reference: the course's engine and autograd, on a small MLP-like
# expression where $s = ab + c$ is used four times, once as $s \cdot s$, and once more
# outside the output's graph, plus a chain 5000 operations deep). It reports, in this order:
# your counts next to the uses each node has inside the output's graph, then what your
# `backward` does: rules that never run, rules run more than once, rules run before the
# rule of a node that uses their output, and the gradients it leaves in the inputs. A ✗
# names a node as the code below writes it, such as `s = a·b + c` or `relu(b·c − s)`.


# %%
def graph3(xs):
    """Leaves a, b, c; out uses s = a·b + c four times; side uses s outside out."""
    a, b, c = (Node(x, name=n) for x, n in zip(xs.tolist(), "abc"))
    s = a * b + c
    side = s * 3.0
    out = ((s * s).tanh() * a + (b * c - s).relu() * b + (a + c).exp() * s) ** 2
    s.name, out.name = "s", "out"
    return (a, b, c), out, side


@checker
def in_words(v):
    """Node v as graph3's code writes it: a, b, c, s, out by name, the rest as
    expressions."""
    if v.name:
        return v.name
    if not v._parents:
        return f"{v.data:g}".replace("-", "−")
    words = [in_words(p) for p in v._parents]
    if v._op == "+":
        if words[1].startswith("−"):  # x - y is built as x + y·(−1)
            return f"{words[0]} − {words[1][1:]}"
        return f"{words[0]} + {words[1]}"
    if v._op == "*":
        if not v._parents[1]._parents and v._parents[1].data == -1:
            return f"−{words[0]}"
        sums = [p._op == "+" and not p.name for p in v._parents]  # a sum needs brackets
        return "·".join(f"({w})" if sum_ else w for w, sum_ in zip(words, sums))
    if v._op.startswith("**"):
        return f"({words[0]})^{v._op[2:]}"
    return f"{v._op}({words[0]})"  # relu, tanh, exp


@checker
def node_label(v):
    """How a ✗ line names node v: its name or expression; a constant by the node
    using it."""
    if v.name == "s":
        return "s = a·b + c"
    if v.name == "out":
        return "the root out"
    if not v._parents and not v.name:
        return f"the constant {in_words(v)} in {in_words(v._users[0])}"
    return in_words(v)


@checker
def said_by_node(line, output, got, expected, labels, unit):
    """line with a generic '<output> is wrong…' message (entries by index) said by
    node."""
    head, colon, rest = line.partition(": ")
    message, also, tail = rest.partition(" [also wrong: ")
    if not message.startswith(f"{output} is wrong") or got is None:
        return line
    off = [i for i in range(len(labels)) if abs(got[i] - expected[i]) > 1e-10]
    off.sort(key=lambda i: -abs(got[i] - expected[i]))  # the largest errors first
    if not off:
        return line

    def value(x):
        return "no entry" if output == "counts" and x == -1 else f"{x:.6g}"

    said = "; ".join(
        f"{labels[i]}: {value(got[i])}, expected {value(expected[i])}" for i in off[:2]
    )
    more = f"; and {len(off) - 2} more" if len(off) > 2 else ""
    where = f"{len(off)} of {len(labels)} {unit}"
    return f"{head}{colon}{output} is wrong at {where} ({said}{more}){also}{tail}"


def f3_torch(a, b, c):
    """The same out on tensors, for autograd."""
    s = a * b + c
    return ((s * s).tanh() * a + (b * c - s).relu() * b + (a + c).exp() * s) ** 2


def counted(v, calls):
    """v's rule, appending id(v) to calls each time it runs."""
    rule = v._backward

    def run():
        calls.append(id(v))
        rule()

    return run


def rule_mistakes(nodes, calls):
    """(never run, run more than once, run before a user's rule), of non-leaf nodes."""
    inner = [v for v in nodes if v._parents]
    first = {}
    for k, i in enumerate(calls):
        first.setdefault(i, k)
    runs = {id(v): calls.count(id(v)) for v in inner}
    users = {id(v): [] for v in nodes}
    for v in nodes:
        for p in v._parents:
            users[id(p)].append(id(v))
    early = sum(
        1
        for v in inner
        if id(v) in first
        and any(u not in first or first[u] > first[id(v)] for u in users[id(v)])
    )
    never = sum(1 for n in runs.values() if n == 0)
    return never, sum(1 for n in runs.values() if n > 1), early


def your_counts(root, nodes):
    """Your dependencies(root) at each node (-1 where it has no entry)."""
    n = dependencies(root)
    if n is None:
        return None
    return torch.tensor([n.get(id(v), -1) for v in nodes], dtype=torch.float64)


last3 = {}  # what the last run of your backward did, for the diagnosis below


def counts_and_grads(xs):
    """Your dependencies and backward on graph3 and on a chain; count their mistakes."""
    last3.clear()
    V, out, side = graph3(xs)
    chain = Node(0.3)
    for _ in range(5000):  # deeper than Python's recursion limit
        chain = chain * 1.0001 + 0.0
    nodes = micrograd.topological_order(out)
    counts = your_counts(out, nodes)
    if counts is None or your_counts(chain, [chain]) is None:
        return None
    last3.update(labels=[node_label(v) for v in nodes], counts=counts.tolist())
    calls = []
    for v in nodes:  # record the local rules your backward runs
        v._backward = counted(v, calls)
    if backward(out) is None and not calls and out.grad == 0.0:
        todo = dict.fromkeys(("rules never run", "rules run twice", "rules run early"))
        return {"counts": counts, **todo, "gradients": None}  # backward not done yet
    never, twice, early = rule_mistakes(nodes, calls)
    last3.update(nodes=nodes, calls=calls, gradients=[v.grad for v in V])
    return {
        "counts": counts,
        "rules never run": never,
        "rules run twice": twice,
        "rules run early": early,
        "gradients": torch.tensor([v.grad for v in V], dtype=torch.float64),
    }


def reference_counts_and_grads(xs):
    """The course engine's graph counted by its users, and autograd's gradients."""
    _, out, _ = graph3(xs)
    nodes = micrograd.topological_order(out)
    inside = {id(v) for v in nodes}
    uses = [sum(id(u) in inside for u in v._users) for v in nodes]
    (g,) = autograd_grads(lambda t: f3_torch(*t.unbind()), (xs,))
    return {
        "counts": torch.tensor(uses, dtype=torch.float64),
        "rules never run": 0,
        "rules run twice": 0,
        "rules run early": 0,
        "gradients": g,
    }


def known_counts3(xs):
    """Known wrong counts: every use in any graph, and one per path from out."""
    _, out, _ = graph3(xs)
    nodes = micrograd.topological_order(out)
    paths = {id(out): 1}
    for v in reversed(nodes):
        for p in v._parents:
            paths[id(p)] = paths.get(id(p), 0) + paths[id(v)]
    return {
        "every use in any graph, also outside out's": [len(v._users) for v in nodes],
        "the paths from out to it: a node walked from once per path": [
            paths[id(v)] if v is not out else 0 for v in nodes
        ],
        "no node's id(v) among its keys (keyed by v.data?)": [-1] * len(nodes),
    }


def stuck_on_a_square():
    """Whether each rule never run though all its users ran is of a node used twice."""
    nodes, calls = last3.get("nodes", []), set(last3.get("calls", []))
    users = {id(v): [] for v in nodes}
    for v in nodes:
        for p in v._parents:
            users[id(p)].append(v)
    stuck = [
        v
        for v in nodes
        if v._parents
        and id(v) not in calls
        and all(id(u) in calls for u in users[id(v)])
    ]
    twice = [v for v in stuck if any(u._parents.count(v) > 1 for u in users[id(v)])]
    return bool(stuck) and len(twice) == len(stuck)


xs3 = torch.tensor([0.6, -0.8, 0.3], dtype=dtype)
known3 = {k: torch.tensor(v, dtype=dtype) for k, v in known_counts3(xs3).items()}
result = evaluate(
    counts_and_grads,
    reference_counts_and_grads,
    args=(xs3,),
    counts=("rules never run", "rules run twice", "rules run early"),
    mistakes={
        "counts": known3,
        "gradients": {
            "zero, as if root.grad = 1 were never set": torch.zeros_like(xs3)
        },
    },
    name="Exercise 3 · dependencies, backward",
    against="the course engine and autograd",
)
if "rules never run (expected 0)" in result.line and stuck_on_a_square():
    result.line += (
        "; all their users ran: s · s took 1 off s's count once, not per use?"
    )
elif "rules run twice (expected 0)" in result.line:
    result.line += "; a node ran before its count reached 0?"
ref3 = reference_counts_and_grads(xs3)  # the ✗ line names nodes, not indices
for output, labels, unit in (
    ("counts", last3.get("labels"), "nodes"),
    ("gradients", ["∂out/∂a", "∂out/∂b", "∂out/∂c"], "inputs"),
):
    result.line = said_by_node(
        result.line, output, last3.get(output), ref3[output].tolist(), labels, unit
    )
if "error in your code" in result.line and -1 in last3.get("counts", []):
    absent = [v for v, n in zip(last3["labels"], last3["counts"]) if n == -1]
    more = f" and {len(absent) - 3} more" if len(absent) > 3 else ""
    result.line += (
        f"; your dependencies(out) has no entry for {', '.join(absent[:3])}{more}"
    )
print(result.line)

# %% [raw]
# # BEGIN QUESTION
# name: ex4
# points: 3

# %% [markdown]
# ## Exercise 4 · Count what autograd saves for backward (3 points)
#
# **Goal:** the memory backward costs is the tensors each node **saves** in forward; a
# `torch.autograd.graph.saved_tensors_hooks(pack, unpack)` context sees every one of them.
#
# Write `saved_bytes(f, inputs)`: run `f(*inputs)` inside a `saved_tensors_hooks` context
# whose `pack(t)` records `t` and returns it unchanged (`unpack` returns what `pack`
# returned), and return, as an `int`, the bytes of everything saved, under three rules:
#
# * **whole storage**: a tensor's bytes are those of its whole storage,
#   `t.untyped_storage().nbytes()`, not numel × element size (a saved view, `W.T` or a slice,
#   keeps all of its storage alive);
# * **each storage once**: a storage counts once, however many ops save it (key:
#   `t.untyped_storage().data_ptr()`);
# * **inputs excluded**: storages of `inputs` count zero: they exist anyway; the extra memory is
#   the activations.
#
# If your total is wrong, the self-check says which of these rules it breaks.

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
# # BEGIN TESTS

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

_x = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
assert saved_bytes(lambda t: (t * t).sum(), (_x,)) == 0  # mul saves x twice: an input
# two exps: two saved outputs
_n = saved_bytes(lambda t: (t.exp() * t.exp()).sum(), (_x,))
assert _n == 2 * 7 * 5 * 8, _n


def _square_of_exp(t):
    """exp(t)², summed: one exp output, saved by exp and twice by mul."""
    y = t.exp()
    return (y * y).sum()


_n = saved_bytes(_square_of_exp, (_x,))
assert _n == 7 * 5 * 8, _n

# %%
""" # BEGIN TEST CONFIG
hidden: true
"""  # END TEST CONFIG
import torch

from helpers.device import randn
from helpers.memory import SavedTensors

_X = randn(16, 8, seed=401, dtype=torch.float32)
_W1 = randn(12, 8, seed=402, dtype=torch.float32).requires_grad_()
_W2 = randn(3, 12, seed=403, dtype=torch.float32).requires_grad_()
_f = lambda X, W1, W2: (torch.tanh(X @ W1.T).relu() @ W2.T).sum()
with SavedTensors(exclude=(_X, _W1, _W2)) as _s:
    _ = _f(_X, _W1, _W2)
assert saved_bytes(_f, (_X, _W1, _W2)) == _s.total_bytes > 0

# %%
""" # BEGIN TEST CONFIG
hidden: true
points: 0.75
"""  # END TEST CONFIG
import torch

from helpers.device import randn

# sin saves its input, a (5, 2) slice of the (5, 6) product:
# the whole product's storage stays alive
_t = randn(5, 3, seed=404, dtype=torch.float64).requires_grad_()
_W = randn(3, 6, seed=405, dtype=torch.float64).requires_grad_()
_n = saved_bytes(lambda t, W: (t @ W)[:, :2].sin().sum(), (_t, _W))
assert _n == 5 * 6 * 8, _n

# %%
""" # BEGIN TEST CONFIG
hidden: true
points: 0.25
"""  # END TEST CONFIG
import torch

from helpers.device import randn

_x = randn(4, 3, seed=406, dtype=torch.float32).requires_grad_()
_n = saved_bytes(lambda t: t.exp().sum(), (_x,))
assert isinstance(_n, int) and not isinstance(_n, bool) and _n == 4 * 3 * 4, _n

# %% [raw]
# # END TESTS

# %% [raw]
# # END QUESTION

# %% [markdown]
# **Self-check 4** (reference: `helpers.memory.SavedTensors`, chapter 3's counter, on a
# two-layer MLP with a softmax, and on a slice of a product followed by `sin` (which saves the
# slice: a view of the whole product); `X` and the weights are inputs, so only activations
# count; the answer must be an `int`). When your two totals are wrong, it recounts the saved
# tensors with one, two or all three rules broken and names the rules whose breaking gives
# exactly your totals:

# %%
X4 = randn(32, 16, seed=41, device=dev)
W4a = randn(64, 16, seed=42, device=dev).requires_grad_()
W4b = randn(10, 64, seed=43, device=dev).requires_grad_()


def mlp4(X, Wa, Wb):
    """softmax(relu(X Waᵀ) Wbᵀ): linear, relu, linear, softmax, summed."""
    H = (X @ Wa.T).relu()  # (32, 16) @ (16, 64) -> (32, 64)
    return torch.softmax(H @ Wb.T, dim=-1).sum()  # (32, 64) @ (64, 10) -> (32, 10)


def reference_saved_bytes(f, inputs):
    """Chapter 3's SavedTensors, the inputs excluded."""
    with SavedTensors(exclude=inputs) as saved:
        f(*inputs)
    return saved.total_bytes


def sliced4(X, Wa):
    """sin of two columns of X Waᵀ, summed: sin saves a view of the whole product."""
    return (X @ Wa.T)[:, :2].sin().sum()  # (32, 16) @ (16, 64) -> (32, 64) -> (32, 2)


CASES4 = {
    "bytes saved by the MLP": (mlp4, (X4, W4a, W4b)),
    "bytes saved by sin of a slice": (sliced4, (X4, W4a)),
}
RULES4 = ("inputs excluded", "whole storage", "each storage once")


def saved_bytes_cases(count):
    """count(f, inputs) on the two cases."""
    return {case: count(f, inputs) for case, (f, inputs) in CASES4.items()}


def totals_breaking(f, inputs):
    """{rules broken: the total they give} over SavedTensors' records of f(*inputs)."""
    with (
        SavedTensors() as saved
    ):  # nothing excluded; "counted" = a storage's first save
        f(*inputs)
    # no activation here has an input's size, so a size tells an input's storage
    input_sizes = {tensor_bytes(t) for t in inputs}
    totals = {}
    for broken in itertools.product((False, True), repeat=3):
        inputs_in, view_size, every_save = broken
        totals[broken] = sum(
            math.prod(r["shape"]) * r["dtype"].itemsize if view_size else r["bytes"]
            for r in saved.records
            if (inputs_in or r["bytes"] not in input_sizes)
            and (every_save or r["counted"])
        )
    return totals


def rules_broken(got):
    """The rules whose breaking gives exactly the totals got, or None."""
    totals = {case: totals_breaking(f, inputs) for case, (f, inputs) in CASES4.items()}
    for broken in itertools.product((False, True), repeat=3):
        if any(broken) and all(got[c] == totals[c][broken] for c in CASES4):
            return [rule for rule, b in zip(RULES4, broken) if b]
    return None


def reference_saved_count(f, inputs):
    """How many storages SavedTensors counts (a known mistake: tensors, not bytes)."""
    with SavedTensors(exclude=inputs) as saved:
        f(*inputs)
    return saved.count


known4 = {
    case: {
        "the number of storages saved, not their bytes": n,
        "no bytes at all: your pack never ran (passed as unpack?)": 0,
    }
    for case, n in saved_bytes_cases(reference_saved_count).items()
}
result = evaluate(
    lambda: saved_bytes_cases(saved_bytes),
    lambda: saved_bytes_cases(reference_saved_bytes),
    name="Exercise 4 · saved_bytes",
    against="SavedTensors",
    exact=True,
    mistakes=known4,
)
if result.status == "fail":
    got4 = saved_bytes_cases(saved_bytes)
    broken4 = rules_broken(got4) if all(type(n) is int for n in got4.values()) else None
    if broken4:
        rules = " and ".join(f"'{rule}'" for rule in broken4)
        word = "rule" if len(broken4) == 1 else "rules"
        result.line += f"; your totals break the {word} {rules}"
print(result.line)

# %% [markdown]
# ## Before you hand in
#
# Run *Runtime → Restart and run all* (Colab) or *Kernel → Restart & Run All* (Jupyter) and
# look at the self-check lines: each should be a `✓`. Then download the notebook (`.ipynb`)
# and hand it in. Keep the function names: the grader calls `mul`, `power`, `relu`, `tanh`,
# `exp`, `topological_order`, `backward` and `saved_bytes`.
