"""Lab 1's contract: each exercise's reference and its case classes, one per promise of its prompt.

The prompts promise (labs/source/src/lab01_cat_mlp.py):

* ex1 ``forward_pass(x, W1, b1, W2, b2, y_true)``: the dict {"h", "a", "y_hat", "L"} for any sizes
  (x (n_in,), W1 (n_h, n_in), W2 (k, n_h), y (k,)); the seed's cat among them; units active and
  dead; L a 0-dim tensor (a sum over the k outputs); float32 or float64, kept.
* ex2 ``grad_loss(y_hat, y_true)``: ∂L/∂ŷ with the shape of ŷ: one entry (1,), several (n,), a
  2-D (B, k); in ŷ's dtype.
* ex3 ``layer2_backward(grad_y_hat, a, W2)``: W2 (k, n), a (n,), grad (k,): the cat's (1, 2), a
  longer a, several outputs, a square W2; the gradients in the shapes of W2, b2 (k,), a.
* ex4 ``relu_backward(grad_a, h)``: h of any shape, relu'(0) = 0 at +0.0 and at −0.0, in grad_a's
  dtype, grad_a left unchanged.
* ex5 ``layer1_backward(grad_h, x)``: x (n_in,), grad_h (n_h,): the cat's sizes, another n_in,
  more units, a square grad_W1, a unit with ∂L/∂h = 0; in the dtype of the inputs.
* ex6 ``cat_backward_batch(X, W1, b1, W2, b2, Y)``: nn.Linear's layout, L a sum over the batch:
  B = 1, B > 1, a pre-activation exactly 0, other sizes, several outputs, float32; compared
  with the reference (an all-zero or per-sample answer fails, not only "batch = sum of rows").
"""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import torch
from contract import Case, CaseClass, Contract, Exercise, large_class, near

from helpers.device import randn

F64, F32 = torch.float64, torch.float32
F64_TOL = {"atol": 1e-10, "rtol": 1e-8}
F32_TOL = {"atol": 1e-5, "rtol": 1e-5}
CAT = {  # chapter 1's seed (helpers.cat_mlp.cat_params), written out: the contract owns its data
    "x": [1.0, 2.0, -1.0, 0.5],
    "W1": [[0.1, 0.2, -0.1, 0.05], [0.3, -0.1, 0.2, 0.1]],
    "b1": [0.1, -0.1],
    "W2": [[0.5, -0.4]],
    "b2": [0.2],
}


def _offsets(signs, seed: int, dtype) -> torch.Tensor:
    """Pre-activations of the given signs, at least 0.1 away from 0 (no unit sits on the kink)."""
    mag = 0.1 + randn(len(signs), seed=seed, dtype=dtype).abs()
    return torch.tensor(signs, dtype=dtype) * mag


def _signs(n_h: int, live: str) -> list[int]:
    """'all': every unit active; 'mixed': the second unit dead (as the cat's), the others active."""
    return [1] * n_h if live == "all" else [-1 if i == 1 else 1 for i in range(n_h)]


# --------------------------------------------------------------------------- ex1


def forward_pass(x, W1, b1, W2, b2, y_true):
    """h = W1 x + b1, a = relu(h), ŷ = W2 a + b2, L = Σ(ŷ - y)², in a dict."""
    h = W1 @ x + b1  # (n_h, n_in) @ (n_in,) -> (n_h,)
    a = h.clamp(min=0)  # (n_h,)
    y_hat = W2 @ a + b2  # (k, n_h) @ (n_h,) -> (k,)
    return {"h": h, "a": a, "y_hat": y_hat, "L": ((y_hat - y_true) ** 2).sum()}


FORWARD_KEYS = {"keys": ("h", "a", "y_hat", "L")}


def _forward(n_in: int, n_h: int, k: int, seed: int, live="mixed", dtype=F64) -> Case:
    x = randn(n_in, seed=seed, dtype=dtype)
    W1 = randn(n_h, n_in, seed=seed + 1, dtype=dtype)
    b1 = _offsets(_signs(n_h, live), seed + 2, dtype) - W1 @ x  # h has the signs asked for
    W2 = randn(k, n_h, seed=seed + 3, dtype=dtype)
    b2 = randn(k, seed=seed + 4, dtype=dtype)
    y = randn(k, seed=seed + 5, dtype=dtype)
    factors = {"k": k} if k > 1 else {}  # a mean over the outputs is 1/k of the sum
    return Case(
        (x, W1, b1, W2, b2, y), factors=factors, terms={"h": {"the bias b1": b1}}, options=FORWARD_KEYS
    )


def _cat_forward(y: float) -> Case:
    t = {k: torch.tensor(v, dtype=F64) for k, v in CAT.items()}
    args = (t["x"], t["W1"], t["b1"], t["W2"], t["b2"], torch.tensor([y], dtype=F64))
    return Case(args, terms={"h": {"the bias b1": t["b1"]}}, options=FORWARD_KEYS)


index = st.integers(0, 10)  # a class with no free size: the draw only moves the seed
ex1 = Exercise(
    "ex1",
    "forward_pass",
    "(x, W1, b1, W2, b2, y_true)",
    "Exercise 1 · forward_pass",
    forward_pass,
    ("h", "a", "y_hat", "L"),
    [
        CaseClass(
            "the weights are the seed's cat (another target y)",
            st.sampled_from([1.0, 0.0, 2.0, -1.0, 0.5, 3.0]),
            lambda y, s: _cat_forward(y),
            **F64_TOL,
        ),
        CaseClass(
            "every hidden unit is active (h > 0)",
            index,
            lambda i, s: _forward(4, 2, 1, s + i, live="all"),
            **F64_TOL,
        ),
        CaseClass(
            "a hidden unit is dead (h < 0)",
            index,
            lambda i, s: _forward(4, 2, 1, s + i),
            **F64_TOL,
        ),
        CaseClass(
            "there are several outputs (W2 (k, n_h), k > 1)",
            st.integers(2, 4),
            lambda k, s: _forward(4, 2, k, s),
            **F64_TOL,
        ),
        CaseClass(
            "the hidden layer is wider (n_h > 2)",
            st.integers(3, 6),
            lambda n, s: _forward(4, n, 1, s),
            **F64_TOL,
        ),
        CaseClass(
            "the tensors are float32",
            index,
            lambda i, s: _forward(4, 2, 1, s + i, dtype=F32),
            **F32_TOL,
        ),
    ],
    probe="dict_entries",
    points=1,
    by_hand=("helpers.cat_mlp.forward",),
)

# --------------------------------------------------------------------------- ex2


def grad_loss(y_hat, y_true):
    """∂L/∂ŷ for L = Σ(ŷ - y)², with the shape of ŷ."""
    return (y_hat - y_true) * 2


def _loss(shape, seed: int, dtype=F64) -> Case:
    return Case((randn(*shape, seed=seed, dtype=dtype), randn(*shape, seed=seed + 1, dtype=dtype)))


ex2 = Exercise(
    "ex2",
    "grad_loss",
    "(y_hat, y_true)",
    "Exercise 2 · grad_loss",
    grad_loss,
    ("grad_y_hat",),
    [
        CaseClass(
            "ŷ has one entry (shape (1,), as the cat's)",
            index,
            lambda i, s: _loss((1,), s + i),
            **F64_TOL,
        ),
        CaseClass(
            "ŷ has several entries (shape (n,), n > 1)",
            st.integers(2, 6),
            lambda n, s: _loss((n,), s),
            **F64_TOL,
        ),
        CaseClass(
            "ŷ is 2-D (B, k)",
            st.tuples(st.integers(2, 5), st.integers(1, 3)),
            lambda p, s: _loss(p, s),
            **F64_TOL,
        ),
        CaseClass(
            "ŷ and y are float32",
            st.integers(2, 5),
            lambda n, s: _loss((n,), s, dtype=F32),
            **F32_TOL,
        ),
        large_class("ŷ (256,)", lambda s: _loss((256,), s), **F64_TOL),
    ],
    points=1,
    by_hand=("autograd", "helpers.cat_mlp.backward"),
)

# --------------------------------------------------------------------------- ex3


def layer2_backward(grad_y_hat, a, W2):
    """(grad_W2, grad_b2, grad_a) for ŷ = W2 a + b2, given grad_y_hat = ∂L/∂ŷ."""
    return grad_y_hat[:, None] * a[None, :], grad_y_hat.clone(), (grad_y_hat[:, None] * W2).sum(0)


def _layer2(k: int, n: int, seed: int, dtype=F64) -> Case:
    a = randn(n, seed=seed, dtype=dtype).abs() + 0.1  # an activation: relu's output, here all live
    W2 = randn(k, n, seed=seed + 1, dtype=dtype)
    g = randn(k, seed=seed + 2, dtype=dtype)
    return Case((g, a, W2))


ex3 = Exercise(
    "ex3",
    "layer2_backward",
    "(grad_y_hat, a, W2)",
    "Exercise 3 · layer2_backward",
    layer2_backward,
    ("grad_W2", "grad_b2", "grad_a"),
    [
        CaseClass(
            "the sizes are the cat's (W2 (1, 2), a (2,))",
            index,
            lambda i, s: _layer2(1, 2, s + i),
            **F64_TOL,
        ),
        CaseClass(
            "a is longer (W2 (1, n), n > 2)",
            st.integers(3, 6),
            lambda n, s: _layer2(1, n, s),
            **F64_TOL,
        ),
        CaseClass(
            "there are several outputs (W2 (k, n), k > 1, k ≠ n)",
            st.tuples(st.integers(2, 4), st.integers(2, 5)).filter(lambda p: p[0] != p[1]),
            lambda p, s: _layer2(p[0], p[1], s),
            **F64_TOL,
        ),
        CaseClass(
            "W2 is square (k = n > 1)",
            st.integers(2, 4),
            lambda n, s: _layer2(n, n, s),
            **F64_TOL,
        ),
        CaseClass(
            "the tensors are float32",
            index,
            lambda i, s: _layer2(1, 2, s + i, dtype=F32),
            **F32_TOL,
        ),
        large_class("W2 (16, 32)", lambda s: _layer2(16, 32, s), **F64_TOL),
    ],
    points=2,
    by_hand=("autograd", "helpers.cat_mlp.backward"),
)

# --------------------------------------------------------------------------- ex4


def relu_backward(grad_a, h):
    """∂L/∂h for a = relu(h), given grad_a = ∂L/∂a (relu'(0) = 0, as in PyTorch)."""
    return torch.where(h > 0, grad_a, torch.zeros_like(grad_a))


def _relu(shape, seed: int, zeros=None, dtype=F64) -> Case:
    h = randn(*shape, seed=seed, dtype=dtype)
    h = torch.where(h.abs() < 0.05, h + 0.1, h)  # no entry near the kink but the ones asked for
    if zeros is not None:  # every third entry: +0.0, -0.0, or the kink's edge points in turn
        flat = h.reshape(-1).clone()
        values = torch.tensor(zeros if isinstance(zeros, list) else [zeros], dtype=dtype)
        slots = flat[::3].numel()
        flat[::3] = values.repeat(slots // len(values) + 1)[:slots]
        h = flat.reshape(shape)
    return Case((randn(*shape, seed=seed + 1, dtype=dtype), h))


sizes = st.integers(4, 8)
ex4 = Exercise(
    "ex4",
    "relu_backward",
    "(grad_a, h)",
    "Exercise 4 · relu_backward",
    relu_backward,
    ("grad_h",),
    [
        CaseClass("h is 1-D (n,)", sizes, lambda n, s: _relu((n,), s), **F64_TOL),
        # 2-D and 3-D apart: one class drawing either showed a 2-D case and hid the 3-D one (a newcomer's
        # answer that reshaped to 2-D got ✓ and lost a hidden test)
        CaseClass(
            "h is 2-D (R, n)",
            st.tuples(st.integers(2, 4), st.integers(2, 4)),
            lambda p, s: _relu(p, s),
            **F64_TOL,
        ),
        CaseClass(
            "h has 3 or more dims (any shape)",
            hnp.array_shapes(min_dims=3, max_dims=4, min_side=2, max_side=3),
            lambda p, s: _relu(p, s),
            **F64_TOL,
        ),
        CaseClass(
            "h has entries exactly 0 (relu'(0) = 0)",
            sizes,
            lambda n, s: _relu((n,), s, zeros=0.0),
            **F64_TOL,
        ),
        CaseClass(
            "h has entries −0.0 (relu'(−0) = 0 too)",
            sizes,
            lambda n, s: _relu((n,), s, zeros=-0.0),
            **F64_TOL,
        ),
        CaseClass(
            "h has entries a hair from 0 (±1e-300, ±1e-12, ±1e-7, ±1e-3: the gate is h > 0)",
            st.integers(30, 36),  # 10 or more entries on the edge: each of near(0)'s 10 points at least once
            lambda n, s: _relu((n,), s, zeros=near(0.0)),
            **F64_TOL,
        ),
        CaseClass(
            "grad_a and h are float32",
            sizes,
            lambda n, s: _relu((n,), s, dtype=F32),
            **F32_TOL,
        ),
        CaseClass(  # nothing to cut: grad_a itself has the right values, but is not a new tensor
            "every unit is active (h > 0 everywhere)",
            sizes,
            lambda n, s: Case((randn(n, seed=s + 1, dtype=F64), randn(n, seed=s, dtype=F64).abs() + 0.1)),
            rules={"new": True},  # "return a new tensor": where grad_a itself would have the right values
            **F64_TOL,
        ),
        large_class("h (1024,)", lambda s: _relu((1024,), s), **F64_TOL),
    ],
    points=2,
    by_hand=("autograd", "helpers.cat_mlp.backward"),
)

# --------------------------------------------------------------------------- ex5


def layer1_backward(grad_h, x):
    """(grad_W1, grad_b1) for h = W1 x + b1, given grad_h = ∂L/∂h."""
    return grad_h[:, None] * x[None, :], grad_h.clone()


def _layer1(n_h: int, n_in: int, seed: int, dead=False, dtype=F64) -> Case:
    g = randn(n_h, seed=seed, dtype=dtype)
    if dead:
        g[-1] = 0.0  # the last unit is dead: its ∂L/∂h is 0
    return Case((g, randn(n_in, seed=seed + 1, dtype=dtype)))


ex5 = Exercise(
    "ex5",
    "layer1_backward",
    "(grad_h, x)",
    "Exercise 5 · layer1_backward",
    layer1_backward,
    ("grad_W1", "grad_b1"),
    [
        CaseClass(
            "the sizes are the cat's (x (4,), h (2,))",
            index,
            lambda i, s: _layer1(2, 4, s + i),
            **F64_TOL,
        ),
        CaseClass(
            "x has another length (n_in ≠ 4)",
            st.sampled_from([3, 5, 6, 7]),
            lambda n, s: _layer1(2, n, s),
            **F64_TOL,
        ),
        CaseClass(
            "h has more units (n_h > 2)",
            st.integers(3, 5),
            lambda n, s: _layer1(n, 4, s),
            **F64_TOL,
        ),
        CaseClass(
            "grad_W1 is square (n_h = n_in)",
            st.integers(3, 5),
            lambda n, s: _layer1(n, n, s),
            **F64_TOL,
        ),
        CaseClass(
            "a unit's ∂L/∂h is 0 (a dead unit)",
            index,
            lambda i, s: _layer1(2, 4, s + i, dead=True),
            **F64_TOL,
        ),
        CaseClass(
            "the tensors are float32",
            index,
            lambda i, s: _layer1(2, 4, s + i, dtype=F32),
            **F32_TOL,
        ),
        large_class("x (32,), h (32,)", lambda s: _layer1(32, 32, s), **F64_TOL),
    ],
    points=2,
    by_hand=("autograd", "helpers.cat_mlp.backward"),
)

# --------------------------------------------------------------------------- ex6


def cat_backward_batch(X, W1, b1, W2, b2, Y):
    """Forward, then {"W1", "b1", "W2", "b2"}: ∂L/∂θ for L = Σ_b (ŷ_b - y_b)²."""
    H = torch.einsum("bi,hi->bh", X, W1) + b1  # (B, n_h)
    A = H.clamp(min=0)  # (B, n_h)
    D = 2 * (torch.einsum("bh,kh->bk", A, W2) + b2 - Y)  # ∂L/∂Ŷ (B, k)
    G = torch.einsum("bk,kh->bh", D, W2) * (H > 0)  # ∂L/∂H (B, n_h)
    return {
        "W1": torch.einsum("bh,bi->hi", G, X),
        "b1": G.sum(0),
        "W2": torch.einsum("bk,bh->kh", D, A),
        "b2": D.sum(0),
    }


BATCH_KEYS = {"keys": ("W2", "b2", "W1", "b1")}


def _batch(B: int, n_in: int, n_h: int, k: int, seed: int, at_zero=False, dtype=F64) -> Case:
    X = randn(B, n_in, seed=seed, dtype=dtype)
    W1 = randn(n_h, n_in, seed=seed + 1, dtype=dtype)
    b1 = _offsets(_signs(n_h, "mixed"), seed + 2, dtype) - W1 @ X[0]  # sample 0: unit 0 live, the last dead
    if at_zero:  # H[0, 0] = 0 exactly: relu'(0) = 0 in the batch too
        X[0] = 0.0
        b1[0] = 0.0
    W2 = randn(k, n_h, seed=seed + 3, dtype=dtype)
    b2 = randn(k, seed=seed + 4, dtype=dtype)
    Y = randn(B, k, seed=seed + 5, dtype=dtype)
    return Case((X, W1, b1, W2, b2, Y), factors={"B": B} if B > 1 else {}, options=BATCH_KEYS)


batch_s = st.integers(3, 8)
ex6 = Exercise(
    "ex6",
    "cat_backward_batch",
    "(X, W1, b1, W2, b2, Y)",
    "Exercise 6 · cat_backward_batch",
    cat_backward_batch,
    ("W2", "b2", "W1", "b1"),
    [
        CaseClass(
            "there is one sample (B = 1)",
            index,
            lambda i, s: _batch(1, 4, 2, 1, s + i),
            **F64_TOL,
        ),
        CaseClass(
            "there are several samples (B > 1)",
            batch_s,
            lambda b, s: _batch(b, 4, 2, 1, s),
            **F64_TOL,
        ),
        CaseClass(
            "a pre-activation is exactly 0 (relu'(0) = 0)",
            batch_s,
            lambda b, s: _batch(b, 4, 2, 1, s, at_zero=True),
            **F64_TOL,
        ),
        CaseClass(
            "the layers have other sizes (n_in ≠ 4, n_h > 2)",
            st.tuples(batch_s, st.sampled_from([3, 5, 6]), st.integers(3, 5)),
            lambda p, s: _batch(p[0], p[1], p[2], 1, s),
            **F64_TOL,
        ),
        CaseClass(
            "there are several outputs (W2 (k, n_h), Y (B, k), k > 1)",
            st.tuples(batch_s, st.integers(2, 3)),
            lambda p, s: _batch(p[0], 4, 2, p[1], s),
            **F64_TOL,
        ),
        CaseClass(
            "the tensors are float32",
            batch_s,
            lambda b, s: _batch(b, 4, 2, 1, s, dtype=F32),
            atol=1e-4,
            rtol=1e-4,
        ),
        large_class("X (8, 16), W1 (16, 16), W2 (4, 16)", lambda s: _batch(8, 16, 16, 4, s), **F64_TOL),
    ],
    probe="dict_entries",
    points=3,
    by_hand=("autograd", "helpers.cat_mlp.backward"),
)

CONTRACT = Contract("lab01_cat_mlp", [ex1, ex2, ex3, ex4, ex5, ex6], base_seed=10_000)
