"""Lab 3's contract: each exercise's reference and its case classes, one per promise of its prompt.

The prompts promise (labs/source/src/lab03_inside_autograd.py):

* ex1 ``mul(a, b)`` and ``power(a, k)`` on ``helpers.micrograd.Value``s: ``out`` with the forward
  value, its rule adding (``+=``) local derivative × ``out.grad`` into each input's ``.grad`` (which
  may already hold another use's share); ``a`` and ``b`` the same Value (``x · x``); an input of 0;
  ``k`` any constant number (integer ≥ 2, a negative integer, fractional on a > 0); a = 0 with
  k ≥ 2; inside an expression walked by the course engine.
* ex2 ``relu(a)``, ``tanh(a)``, ``exp(a)``: the same pattern; ReLU's derivative 0 at exactly 0 and
  below; a Value used twice; inside a chain; large |a| (tanh saturates); a < 0 for exp.
* ex3 ``dependencies(root)``: {id(v): uses of v inside root's graph} for every node reachable
  (root 0); a node used twice by one node, reached along two paths, used outside root's graph,
  two nodes of equal value, a chain 5000 deep (no recursion), a root that is a leaf.
  ``backward(root)``: root.grad = 1, each rule once, after all its users' rules, on the same graphs.
* ex4 ``saved_bytes(f, inputs)`` → int: whole storages, each once, inputs' storages excluded;
  only inputs saved (0), several saved outputs, one storage saved by several ops, a saved view
  (offset 0) of a larger storage, two saved views at different offsets of one storage, a saved
  view of an input at an offset, an MLP with a softmax; float32 and float64.

The operations are judged through the probe ``value_rule`` (helpers.labcontract): it builds
``helpers.micrograd.Value`` leaves from recorded numbers, runs one rule (or an expression), and
returns out.data and the inputs' .grad; the graphs of ex3 are recorded as specs that the probes
``dependency_counts`` and ``backward_run`` build.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import torch
from contract import Case, CaseClass, Contract, Exercise, near

from helpers.device import randn
from helpers.labcontract import FUNCTIONS
from helpers.micrograd import Value

F64, F32 = torch.float64, torch.float32
TOL = {"atol": 1e-12, "rtol": 1e-10}
NONZERO = st.sampled_from([-1.7, -1.25, -0.8, -0.3, 0.4, 0.75, 1.3, 2.2])
POSITIVE = st.sampled_from([0.3, 0.6, 0.9, 1.4, 2.5])

# --------------------------------------------------------------------------- ex1, ex2


def mul(a, b):
    """out = a·b, its rule adding each input's share."""
    out = Value(a.data * b.data, (a, b), "*")

    def _backward():
        a.grad += b.data * out.grad
        b.grad += a.data * out.grad

    out._backward = _backward
    return out


def power(a, k):
    """out = aᵏ for a constant k."""
    out = Value(a.data**k, (a,), f"**{k}")

    def _backward():
        a.grad += (k * a.data ** (k - 1) if k != 0 else 0.0) * out.grad

    out._backward = _backward
    return out


def _unary(name, forward, local):
    def op(a):
        y = forward(a.data)
        out = Value(y, (a,), name)

        def _backward():
            a.grad += local(a.data, y) * out.grad

        out._backward = _backward
        return out

    op.__name__ = name
    return op


relu = _unary("relu", lambda x: max(x, 0.0), lambda x, y: 1.0 if x > 0 else 0.0)
tanh = _unary("tanh", math.tanh, lambda x, y: 1.0 - y * y)
exp = _unary("exp", math.exp, lambda x, y: y)


def _rule(*args, **options) -> Case:
    return Case(tuple(float(a) if isinstance(a, float) else a for a in args), options=options)


VALUE_OPERATORS = tuple(
    f"helpers.micrograd.Value.{op}"
    for op in ("__add__", "__radd__", "__mul__", "__rmul__", "__pow__", "relu", "tanh", "exp", "backward")
)


def _op_exercise(name, function, signature, question, classes, values=1, points=0.0):
    for c in classes:
        c.atol, c.rtol = TOL["atol"], TOL["rtol"]
    title = f"Exercise {question[2:]} · {function.__name__}"
    return Exercise(
        name,
        function.__name__,
        signature,
        title,
        function,
        ("out.data", "the inputs' .grad"),
        classes,
        question=question,
        probe="value_rule",
        points=points,
        # "do not call the Value's own operators": the rules are written by hand (declared on a question's
        # first function; its others share it)
        by_hand=VALUE_OPERATORS if points else (),
    )


ex1 = _op_exercise(
    "ex1",
    mul,
    "(a, b)",
    "ex1",
    [
        CaseClass(
            "a and b are two Values (.grad already 0.5)",
            st.tuples(NONZERO, NONZERO),
            lambda p, s: _rule(*p, values=2),
        ),
        CaseClass("a is b (x · x)", NONZERO, lambda x, s: _rule(x, x, values=2, same=True)),
        CaseClass(
            "an input is 0",
            st.tuples(NONZERO, st.booleans()),
            lambda p, s: _rule(*((0.0, p[0]) if p[1] else (p[0], 0.0)), values=2),
        ),
        CaseClass(
            "it is used in x·y·x (backward by the course engine)",
            st.tuples(NONZERO, NONZERO),
            lambda p, s: _rule(*p, values=2, expression="x·y·x"),
        ),
    ],
    values=2,
    points=2,
)

ex1b = _op_exercise(
    "ex1b",
    power,
    "(a, k)",
    "ex1",
    [
        CaseClass(
            "k is an integer ≥ 2 (a > 0)",
            st.tuples(POSITIVE, st.integers(2, 4)),
            lambda p, s: _rule(*p, values=1),
        ),
        CaseClass(
            "k is a negative integer",
            st.tuples(NONZERO, st.sampled_from([-1, -2, -3])),
            lambda p, s: _rule(*p, values=1),
        ),
        CaseClass(
            "k is fractional (0.5, 1.5, −0.5) on a > 0",
            st.tuples(POSITIVE, st.sampled_from([0.5, 1.5, -0.5])),
            lambda p, s: _rule(*p, values=1),
        ),
        CaseClass("a is 0 and k ≥ 2", st.integers(2, 4), lambda k, s: _rule(0.0, k, values=1)),
        CaseClass(
            "a < 0 and k − 1 is odd (k = 2, 4: the sign of a^(k−1) counts)",
            st.tuples(st.sampled_from([-1.7, -1.25, -0.8, -0.3]), st.sampled_from([2, 4])),
            lambda p, s: _rule(*p, values=1),
        ),
        CaseClass(
            "it is used in x^k · x^k (backward by the course engine)",
            st.tuples(POSITIVE, st.integers(2, 3)),
            lambda p, s: _rule(*p, values=1, expression="x^k · x^k"),
        ),
        # a power of a power: the inner node is reached only through the outer one's parents (a newcomer's
        # `Value(a.data ** k)`, with no parents, got ✓ from x^k · x^k, where both nodes hang off `*`)
        CaseClass(
            "it is applied to its own output, (x²)^1.5 + x⁻¹ (backward by the course engine)",
            POSITIVE,
            lambda x, s: _rule(x, values=1, expression="(x²)^1.5 + x⁻¹"),
        ),
    ],
)


def _unary_classes(extra, values=NONZERO):
    return [
        CaseClass("it is used once (.grad already 0.5)", values, lambda x, s: _rule(x)),
        CaseClass(
            "it is used twice on one Value, op(x) + op(x)",
            values,
            lambda x, s: _rule(x, expression="op(x) + op(x)"),
        ),
        CaseClass(
            "it is chained, op(op(x)·2 − 0.5)",
            values,
            lambda x, s: _rule(x, expression="op(op(x) · 2 − 0.5)"),
        ),
        *extra,
    ]


ex2 = _op_exercise(
    "ex2",
    relu,
    "(a)",
    "ex2",
    _unary_classes(
        [
            CaseClass("a < 0 (nothing passes)", st.sampled_from([-2.0, -0.7, -0.1]), lambda x, s: _rule(x)),
            CaseClass(
                "a is exactly 0 (the derivative is 0)",
                NONZERO,
                lambda c, s: _rule(c, c, expression="op(x − c) with x = c"),
            ),
            CaseClass(
                "a is tiny and positive (1e-300, 1e-12, 1e-7): a > 0 passes, however small",
                st.sampled_from([a for a in near(0.0) if 0 < a < 1e-6]),
                lambda x, s: _rule(x),
            ),
        ],
        values=POSITIVE,
    ),
    points=2,
)
ex2b = _op_exercise(
    "ex2b",
    tanh,
    "(a)",
    "ex2",
    _unary_classes(
        [
            CaseClass(
                "|a| is large (tanh saturates)",
                st.sampled_from([-6.0, -4.0, 4.0, 5.0, 7.0]),
                lambda x, s: _rule(x),
            ),
            CaseClass(
                "|a| > 710, where cosh(a) overflows (tanh'(a) is 0.0, from the output)",
                st.sampled_from([-1000.0, -800.0, 711.0, 750.0, 900.0]),
                lambda x, s: _rule(x),
            ),
        ]
    ),
)
ex2c = _op_exercise(
    "ex2c",
    exp,
    "(a)",
    "ex2",
    _unary_classes([CaseClass("a < 0", st.sampled_from([-3.0, -1.5, -0.4]), lambda x, s: _rule(x))]),
)

# --------------------------------------------------------------------------- ex3


def dependencies(root):
    """{id(v): uses of v by the nodes reachable from root}."""
    count, todo = {id(root): 0}, [root]
    while todo:
        v = todo.pop()
        for p in v._parents:
            if id(p) not in count:
                count[id(p)] = 0
                todo.append(p)
            count[id(p)] += 1
    return count


def backward(root):
    """root.grad = 1, then each rule once, when all its node's uses have sent theirs (Kahn)."""
    left = dependencies(root)
    root.grad = 1.0
    ready = [root]
    while ready:
        v = ready.pop()
        v._backward()
        for p in v._parents:
            left[id(p)] -= 1
            if left[id(p)] == 0:
                ready.append(p)


GRAPHS = {  # name: (number of leaves, ops, root): see helpers.labcontract._micro_graph
    # c = a·b; d = c·c; out = d
    "square": (2, [["*", 0, 1], ["*", 2, 2], ["tanh", 3]], 4),
    # c = a·b; d = c + a; e = d·c: a reached along two paths, c used by two nodes
    "paths": (2, [["*", 0, 1], ["+", 2, 0], ["*", 3, 2], ["exp", 4]], 5),
    # the same, and side = d + 1 and c · 3 outside out's graph
    "side": (2, [["*", 0, 1], ["+", 2, 0], ["*", 3, 2], ["tanh", 4], ["+c", 3, 1.0], ["*c", 2, 3.0]], 5),
    # u = x·1, w = x + 0: two nodes of equal value; out = tanh(u·w + u)
    "equal": (1, [["*c", 0, 1.0], ["+c", 0, 0.0], ["*", 1, 2], ["+", 3, 1], ["tanh", 4]], 5),
    # s = a·b + c used four times (once as s·s), and once outside out
    "shared": (
        3,
        [
            ["*", 0, 1],  # 3: a·b
            ["+", 3, 2],  # 4: s
            ["*", 4, 4],  # 5: s·s
            ["tanh", 5],  # 6
            ["*", 6, 0],  # 7: tanh(s·s)·a
            ["*", 1, 2],  # 8: b·c
            ["*c", 4, -1.0],  # 9: −s
            ["+", 8, 9],  # 10: b·c − s
            ["relu", 10],  # 11
            ["*", 11, 1],  # 12
            ["+", 7, 12],  # 13
            ["*", 13, 4],  # 14: (…)·s
            ["*c", 4, 3.0],  # 15: side, outside out's graph
        ],
        14,
    ),
}


def _graph(name, numbers) -> Case:
    n, ops, root = GRAPHS[name]
    return Case(([list(numbers), ops, root],))


def _leaves(name):
    """As many distinct leaf values as the graph has leaves."""
    n = GRAPHS[name][0]
    return st.lists(NONZERO, min_size=n, max_size=n, unique=True)


def _chain(x, n) -> Case:
    return Case(([[x], [["chain", 0, n]], 1],))


DEEP = st.tuples(NONZERO, st.sampled_from([3000, 4000, 5000]))
GRAPH_CLASSES = [
    ("a node is used twice by one node (v · v)", _leaves("square"), lambda p, s: _graph("square", p)),
    ("a node is reached along two paths", _leaves("paths"), lambda p, s: _graph("paths", p)),
    ("nodes are used outside root's graph too", _leaves("side"), lambda p, s: _graph("side", p)),
    ("two nodes have equal values (compare by id)", _leaves("equal"), lambda p, s: _graph("equal", p)),
    ("a shared node feeds a nonlinearity and more", _leaves("shared"), lambda p, s: _graph("shared", p)),
    ("the graph is a chain 3000–5000 deep (no recursion)", DEEP, lambda p, s: _chain(*p)),
    ("root is a leaf", NONZERO, lambda x, s: Case(([[x], [], 0],))),
]

# one hidden chain, not two: every step of the learner's walk over the grader's Values is a round trip
# across the boundary (about 25,000 a chain, 6 s), and one chain shows recursion as well as two
ONE_HIDDEN = {"the graph is a chain 3000–5000 deep (no recursion)"}

ex3 = Exercise(
    "ex3",
    "dependencies",
    "(root)",
    "Exercise 3 · dependencies",
    dependencies,
    ("the counts, sorted",),
    [
        CaseClass(name, strategy, make, hidden=1 if name in ONE_HIDDEN else 2, atol=0, rtol=0)
        for name, strategy, make in GRAPH_CLASSES
    ],
    probe="dependency_counts",
    points=3,
    # the course's Value.backward is the engine this exercise writes: its walk and its call are refused
    by_hand=("helpers.micrograd.topological_order", "helpers.micrograd.Value.backward"),
)
ex3b = Exercise(
    "ex3b",
    "backward",
    "(root)",
    "Exercise 3 · backward",
    backward,
    ("the leaves' .grad", "rules never run", "rules run more than once", "rules run before a user's rule"),
    [
        CaseClass(name, strategy, make, hidden=1 if name in ONE_HIDDEN else 2, atol=1e-9, rtol=1e-9)
        for name, strategy, make in GRAPH_CLASSES
    ],
    question="ex3",
    probe="backward_run",
)

# --------------------------------------------------------------------------- ex4


def saved_bytes(f, inputs):
    """Bytes of the storages saved for backward while f(*inputs) runs, each once, inputs' excluded."""
    storages = {t.untyped_storage().data_ptr(): 0 for t in inputs}
    saved: dict = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in storages:
            saved[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    return int(sum(saved.values()))


DTYPES = st.sampled_from([F32, F64])
SIDES = st.tuples(st.integers(3, 8), st.integers(4, 7))


def _saved(fname, shapes, seed, dtype) -> Case:
    inputs = tuple(randn(*shape, seed=seed + i, dtype=dtype) for i, shape in enumerate(shapes))
    return Case((FUNCTIONS[fname], inputs))


ex4 = Exercise(
    "ex4",
    "saved_bytes",
    "(f, inputs)",
    "Exercise 4 · saved_bytes",
    saved_bytes,
    ("bytes",),
    [
        CaseClass(
            "only inputs are saved (0 bytes)",
            st.tuples(SIDES, DTYPES),
            lambda p, s: _saved("mul_self", [p[0]], s, p[1]),
        ),
        CaseClass(
            "two ops save their outputs",
            st.tuples(SIDES, DTYPES),
            lambda p, s: _saved("exp_times_exp", [p[0]], s, p[1]),
        ),
        CaseClass(
            "one storage is saved by several ops (counted once)",
            st.tuples(SIDES, DTYPES),
            lambda p, s: _saved("square_of_exp", [p[0]], s, p[1]),
        ),
        CaseClass(
            "a saved view (offset 0) keeps a larger storage alive",
            st.tuples(SIDES, st.integers(4, 7), DTYPES),
            lambda p, s: _saved("sin_of_a_slice", [p[0], (p[1], p[0][1])], s, p[2]),
        ),
        CaseClass(
            "two saved views at different offsets share a storage",
            st.tuples(SIDES, st.integers(5, 8), DTYPES),
            lambda p, s: _saved("sin_of_two_slices", [p[0], (p[1], p[0][1])], s, p[2]),
        ),
        CaseClass(
            "a view of an input at an offset is saved",
            st.tuples(SIDES, st.integers(2, 5), DTYPES),
            lambda p, s: _saved("matmul_of_an_input_slice", [p[0], (p[1], p[0][1] - 1)], s, p[2]),
        ),
        CaseClass(
            "an MLP with a softmax",
            st.tuples(st.integers(4, 16), st.integers(3, 8), st.integers(5, 12), st.integers(2, 6), DTYPES),
            lambda p, s: _saved("mlp_softmax", [(p[0], p[1]), (p[2], p[1]), (p[3], p[2])], s, p[4]),
        ),
    ],
    points=3,
)

CONTRACT = Contract("lab03_inside_autograd", [ex1, ex1b, ex2, ex2b, ex2c, ex3, ex3b, ex4], base_seed=30_000)
