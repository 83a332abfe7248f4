"""Lab 7's contract: each exercise's reference and its case classes, one per promise of its prompt.

The prompts promise (labs/source/src/lab07_transformer_block.py):

* ex1 ``layernorm_backward(x, mu, rstd, weight, grad_y)``: ``x`` of any ``(..., D)`` (1-D, 2-D,
  3-D, 4-D), ``mu`` and ``rstd`` the saved ``(..., 1)`` statistics of ``layernorm_forward`` at
  whatever ``eps`` it ran with (1e-5 or a large one: the saved ones must be used), ``γ ≠ 1``,
  float32 or float64; ``grad_weight``, ``grad_bias`` summed over every row.
* ex2 ``ffn_backward(h, W1, b1, W2, b2, grad_F, activation="relu")``: ``h`` of any ``(..., d)``,
  ``activation`` given as "relu", left at its default, or "gelu"; ``d_ff`` ≠ d or = d; float32.
* ex3 ``ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation="relu")``: ``params`` a
  dict with ``nn.TransformerEncoderLayer``'s names; each activation value and the default; LN2's
  statistics from any eps; ``linear2.weight`` = 0 (the skip path alone); a dict of 7 gradients.
* ex4 ``tied_embedding_backward(idx, grad_X0, Hf, grad_logits, n_ctx, start=0)``: repeated ids
  (summed), ids all distinct with some of the vocabulary absent, one id everywhere, ``start``
  left at its default 0 or > 0, the chunk ending the context, B > 1, float32.
* ex5 ``block_backward(grad_Y, cache)``: the cache of the lab's ``block_forward`` (a dict of tensors,
  the params dict, ``H``, the settings), ReLU or GELU, causal or not, one head or several, a
  large LayerNorm eps; a dict with ``"X"`` and every name of ``BLOCK_PARAM_NAMES``.

ex3's and ex5's answers call the learner's earlier functions: the source's solution of a later
exercise runs with the earlier solutions beside it (``_solution_function`` below wraps the
machinery's ``solution_function`` for this lab only, since ``contract.py`` runs one question's
cells alone), and their dict answers get their known mistakes recorded key by key
(``LabContract.record``: the machinery records known mistakes for tensor outputs only).
"""

from __future__ import annotations

import math

import contract as machinery
import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import torch
import torch.nn.functional as F
from contract import Case, CaseClass, Contract, Exercise, large_class

from helpers.attention import attention_forward, causal_mask, merge_heads, split_heads
from helpers.block import BLOCK_PARAM_NAMES, block_params
from helpers.device import randn
from helpers.functions import layernorm_forward
from helpers.labcontract import encode

F64, F32 = torch.float64, torch.float32
F64_TOL = {"atol": 1e-10, "rtol": 1e-8}
F32_TOL = {"atol": 1e-4, "rtol": 1e-4}
LAB = "lab07_transformer_block"


def _grads(f, leaves, grad_out):
    """Autograd's gradients of ⟨f(*leaves), grad_out⟩ with respect to every leaf."""
    leaves = [t.detach().clone().requires_grad_() for t in leaves]
    with torch.enable_grad():
        return tuple(torch.autograd.grad(f(*leaves), leaves, grad_out))


# --------------------------------------------------------------------------- ex1


def layernorm_backward(x, mu, rstd, weight, grad_y):
    """(grad_x, grad_weight, grad_bias) of y = γ·(x − μ)·rstd + β, with μ and rstd saved."""
    D = x.shape[-1]
    x_hat = (x - mu) * rstd  # (..., D)
    g = grad_y * weight  # (..., D)
    through_mu = g.mean(-1, keepdim=True)  # (..., 1)
    through_sigma = x_hat * (g * x_hat).mean(-1, keepdim=True)  # (..., D)
    grad_x = rstd * (g - through_mu - through_sigma)
    return grad_x, (grad_y * x_hat).reshape(-1, D).sum(0), grad_y.reshape(-1, D).sum(0)


def _held(x, w, b, eps, hold_mu, hold_sigma):
    """LayerNorm with μ and/or σ detached: autograd skips the paths through them."""
    mu = x.mean(-1, keepdim=True)
    rstd = torch.rsqrt(((x - mu) ** 2).mean(-1, keepdim=True) + eps)
    mu = mu.detach() if hold_mu else mu
    rstd = rstd.detach() if hold_sigma else rstd
    return (x - mu) * rstd * w + b


def _ln_case(lead, D: int, seed: int, eps: float = 1e-5, dtype=F64, spread: float = 2.0) -> Case:
    x = randn(*lead, D, seed=seed, dtype=F64) * spread + 1
    w = 1 + 0.3 * randn(D, seed=seed + 1, dtype=F64)
    b = 0.5 * randn(D, seed=seed + 2, dtype=F64)
    g = randn(*lead, D, seed=seed + 3, dtype=F64)
    _, mu, rstd = layernorm_forward(x, w, b, eps)
    paths = {
        held: _grads(lambda x_, held=held: _held(x_, w, b, eps, *held), (x,), g)[0]
        for held in ((True, True), (False, True), (False, False))
    }
    terms = {
        "grad_x": {
            "the path through μ": (paths[False, True] - paths[True, True]).to(dtype),
            "the path through σ": (paths[False, False] - paths[False, True]).to(dtype),
        }
    }
    rows = math.prod(lead)
    args = tuple(t.to(dtype) for t in (x, mu, rstd, w, g))
    return Case(args, factors={"rows": rows} if rows > 1 else {}, terms=terms)


# the leading dims of the classes about eps and dtype: (B, N), as the main class's, not 1 to 3 dims (its public
# case drew 2-D x and its hidden ones 3-D, so a grad_weight summed over dim 0 only passed the self-check
# and failed the hidden tests: a learner's, s10)
leads = hnp.array_shapes(min_dims=2, max_dims=2, min_side=2, max_side=4)
ex1 = Exercise(
    "ex1",
    "layernorm_backward",
    "(x, mu, rstd, weight, grad_y)",
    "Exercise 1 · layernorm_backward",
    layernorm_backward,
    ("grad_x", "grad_weight", "grad_bias"),
    [
        CaseClass(
            "x is 3-D (B, N, D)",
            st.tuples(hnp.array_shapes(min_dims=2, max_dims=2, min_side=2, max_side=4), st.integers(3, 7)),
            lambda p, s: _ln_case(p[0], p[1], s),
            **F64_TOL,
        ),
        CaseClass(
            "x is 2-D (R, D)",
            st.tuples(st.integers(2, 6), st.integers(3, 7)),
            lambda p, s: _ln_case((p[0],), p[1], s),
            **F64_TOL,
        ),
        CaseClass("x is 1-D (D,): one row", st.integers(3, 8), lambda D, s: _ln_case((), D, s), **F64_TOL),
        CaseClass(
            "x has 4 dims (…, D)",
            st.tuples(hnp.array_shapes(min_dims=3, max_dims=3, min_side=2, max_side=3), st.integers(3, 5)),
            lambda p, s: _ln_case(p[0], p[1], s),
            **F64_TOL,
        ),
        CaseClass(
            "mu and rstd were computed with a large eps (0.1–1)",
            st.tuples(leads, st.integers(3, 6), st.sampled_from([0.1, 0.25, 0.5, 1.0])),
            lambda p, s: _ln_case(p[0], p[1], s, eps=p[2]),
            **F64_TOL,
        ),
        CaseClass(
            "x is float32",
            st.tuples(leads, st.integers(3, 7)),
            # rows of small spread: the saved rstd's eps shows at float32's tolerance in every case, not in
            # the public case only (a 1/σ recomputed without eps: public ✗, hidden ✓ before)
            lambda p, s: _ln_case(p[0], p[1], s, dtype=F32, spread=0.05),
            **F32_TOL,
        ),
        large_class("x (4, 8, 64)", lambda s: _ln_case((4, 8), 64, s), **F64_TOL),
    ],
    points=2,
    by_hand=("autograd", "helpers.block.block_manual_backward", "helpers.functions.layernorm_backward"),
)

# --------------------------------------------------------------------------- ex2

ACTS = {"relu": F.relu, "gelu": F.gelu}


def ffn_backward(h, W1, b1, W2, b2, grad_F, activation="relu"):
    """(grad_h, grad_W1, grad_b1, grad_W2, grad_b2) of F = act(h W1ᵀ + b1) W2ᵀ + b2, by autograd."""
    act = ACTS[activation]
    return _grads(lambda h_, W1_, b1_, W2_, b2_: F.linear(act(F.linear(h_, W1_, b1_)), W2_, b2_),
                  (h, W1, b1, W2, b2), grad_F)  # fmt: skip


def _ffn_case(lead, d: int, d_ff: int, seed: int, activation=None, dtype=F64) -> Case:
    h = randn(*lead, d, seed=seed, dtype=dtype)
    W1 = randn(d_ff, d, seed=seed + 1, dtype=dtype) / d**0.5
    b1 = 0.3 * randn(d_ff, seed=seed + 2, dtype=dtype)
    W2 = randn(d, d_ff, seed=seed + 3, dtype=dtype) / d_ff**0.5
    b2 = 0.3 * randn(d, seed=seed + 4, dtype=dtype)
    grad_F = randn(*lead, d, seed=seed + 5, dtype=dtype)
    args = (h, W1, b1, W2, b2, grad_F) + (() if activation is None else (activation,))
    rows = math.prod(lead)
    return Case(args, factors={"rows": rows} if rows > 1 else {})


d_dff = st.tuples(st.integers(2, 5), st.integers(2, 8)).filter(lambda p: p[0] != p[1])
lead3 = hnp.array_shapes(min_dims=2, max_dims=2, min_side=2, max_side=4)
ex2 = Exercise(
    "ex2",
    "ffn_backward",
    '(h, W1, b1, W2, b2, grad_F, activation="relu")',
    "Exercise 2 · ffn_backward",
    ffn_backward,
    ("grad_h", "grad_W1", "grad_b1", "grad_W2", "grad_b2"),
    [
        CaseClass(
            'h is 3-D (B, N, d) and activation="relu"',
            st.tuples(lead3, d_dff),
            lambda p, s: _ffn_case(p[0], *p[1], s, "relu"),
            **F64_TOL,
        ),
        CaseClass(
            'activation is left at its default ("relu")',
            st.tuples(lead3, d_dff),
            lambda p, s: _ffn_case(p[0], *p[1], s),
            **F64_TOL,
        ),
        CaseClass(
            'activation="gelu"',
            st.tuples(lead3, d_dff),
            lambda p, s: _ffn_case(p[0], *p[1], s, "gelu"),
            **F64_TOL,
        ),
        CaseClass(
            "h is 2-D (R, d)",
            st.tuples(st.integers(2, 6), d_dff, st.just("relu")),
            lambda p, s: _ffn_case((p[0],), *p[1], s, p[2]),
            **F64_TOL,
        ),
        CaseClass(
            "h has 4 dims (…, d)",
            st.tuples(hnp.array_shapes(min_dims=3, max_dims=3, min_side=2, max_side=3), d_dff),
            lambda p, s: _ffn_case(p[0], *p[1], s, "relu"),
            **F64_TOL,
        ),
        CaseClass(
            "d_ff = d (square W1 and W2)",
            st.tuples(lead3, st.integers(2, 6)),
            lambda p, s: _ffn_case(p[0], p[1], p[1], s, "relu"),
            **F64_TOL,
        ),
        CaseClass(
            "h is float32",
            st.tuples(lead3, d_dff, st.just("relu")),
            lambda p, s: _ffn_case(p[0], *p[1], s, p[2], dtype=F32),
            **F32_TOL,
        ),
        # the activation named: a learner whose GELU was wrong read this class as a size problem (s10)
        large_class(
            'h (4, 8, 16), d_ff 64, activation="gelu"',
            lambda s: _ffn_case((4, 8), 16, 64, s, "gelu"),
            **F64_TOL,
        ),
        # each activation's path measured: a newcomer's ReLU branch read every entry with .item() (✓ before)
        large_class(
            'h (4, 8, 16), d_ff 64, activation="relu"',
            lambda s: _ffn_case((4, 8), 16, 64, s, "relu"),
            **F64_TOL,
        ),
    ],
    points=2,
    by_hand=("autograd", "helpers.block.block_manual_backward", "helpers.numgrad.linear_backward"),
)

# --------------------------------------------------------------------------- ex3

NAMES3 = ("norm2.weight", "norm2.bias", "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias")
ORDER3 = (
    "linear2.weight",
    "linear2.bias",
    "linear1.weight",
    "linear1.bias",
    "norm2.weight",
    "norm2.bias",
    "X1",
)


def ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation="relu"):
    """{"X1": ∂L/∂X1, name: ∂L/∂θ} of Y = X1 + FF(LN2(X1)), in the order backward computes them."""
    p = params
    h2 = (X1 - mu2) * rstd2 * p["norm2.weight"] + p["norm2.bias"]
    W = (p["linear1.weight"], p["linear1.bias"], p["linear2.weight"], p["linear2.bias"])
    grad_h2, gW1, gb1, gW2, gb2 = ffn_backward(h2, *W, grad_Y, activation)
    grad_branch, g_gamma, g_beta = layernorm_backward(X1, mu2, rstd2, p["norm2.weight"], grad_h2)
    grads = {"linear2.weight": gW2, "linear2.bias": gb2, "linear1.weight": gW1, "linear1.bias": gb1}
    return {**grads, "norm2.weight": g_gamma, "norm2.bias": g_beta, "X1": grad_Y + grad_branch}


def _sublayer_case(B: int, N: int, d: int, d_ff: int, seed: int, activation=None, eps=1e-5, zero_W2=False):
    full = block_params(d, d_ff, seed=seed, dtype=F64)
    p = {n: full[n] for n in NAMES3}
    if zero_W2:
        p["linear2.weight"] = torch.zeros_like(p["linear2.weight"])
    X1 = randn(B, N, d, seed=seed + 20, dtype=F64)
    grad_Y = randn(B, N, d, seed=seed + 21, dtype=F64)
    _, mu2, rstd2 = layernorm_forward(X1, p["norm2.weight"], p["norm2.bias"], eps)
    args = (X1, mu2, rstd2, p, grad_Y) + (() if activation is None else (activation,))
    return Case(args, terms={"X1": {"the skip path (grad_Y)": grad_Y}})


bnd = st.tuples(st.integers(2, 3), st.integers(2, 4), st.integers(3, 5), st.integers(2, 8)).filter(
    lambda p: p[2] != p[3]
)
ex3 = Exercise(
    "ex3",
    "ffn_sublayer_backward",
    '(X1, mu2, rstd2, params, grad_Y, activation="relu")',
    "Exercise 3 · ffn_sublayer_backward",
    ffn_sublayer_backward,
    ("grads",),
    [
        CaseClass('activation="relu"', bnd, lambda p, s: _sublayer_case(*p, s, "relu"), **F64_TOL),
        CaseClass(
            'activation is left at its default ("relu")', bnd, lambda p, s: _sublayer_case(*p, s), **F64_TOL
        ),
        CaseClass('activation="gelu"', bnd, lambda p, s: _sublayer_case(*p, s, "gelu"), **F64_TOL),
        CaseClass(
            "mu2 and rstd2 were computed with a large eps (0.1–1)",
            st.tuples(bnd, st.sampled_from([0.1, 0.25, 0.5, 1.0]), st.just("relu")),
            lambda p, s: _sublayer_case(*p[0], s, p[2], eps=p[1]),
            **F64_TOL,
        ),
        CaseClass(
            "linear2.weight is 0 (only the skip path sends grad_Y back)",
            st.tuples(bnd, st.just("relu")),
            lambda p, s: _sublayer_case(*p[0], s, p[1], zero_W2=True),
            **F64_TOL,
        ),
    ],
    calls=("ex1", "ex2"),
    points=2,
    by_hand=("autograd", "helpers.block.block_manual_backward"),
)

# --------------------------------------------------------------------------- ex4


def tied_embedding_backward(idx, grad_X0, Hf, grad_logits, n_ctx, start=0):
    """(grad_wte, grad_wpe) of X0 = wte[idx] + wpe[start:start + N] and logits = Hf wteᵀ, by autograd."""
    B, N, d = grad_X0.shape
    V = grad_logits.shape[-1]
    wte = torch.zeros(V, d, dtype=grad_X0.dtype)
    wpe = torch.zeros(n_ctx, d, dtype=grad_X0.dtype)

    def L(wte_, wpe_):
        X0 = F.embedding(idx, wte_) + wpe_[start : start + N]
        return (X0 * grad_X0).sum() + ((Hf @ wte_.T) * grad_logits).sum()

    return _grads(lambda a, b: L(a, b), (wte, wpe), torch.ones((), dtype=grad_X0.dtype))


def _tied_case(B, N, d, V, n_ctx, start, seed, ids="repeats", dtype=F64, default_start=False) -> Case:
    gen = torch.Generator().manual_seed(seed)
    if ids == "same":
        idx = torch.full((B, N), int(torch.randint(V, (), generator=gen)), dtype=torch.long)
    elif ids == "distinct":  # B·N different ids, some of the vocabulary absent
        idx = torch.randperm(V, generator=gen)[: B * N].reshape(B, N)
    else:  # at least one id repeated, at least one absent
        idx = torch.randint(V - 1, (B, N), generator=gen)
        idx.view(-1)[-1] = idx.view(-1)[0]
    grad_X0 = randn(B, N, d, seed=seed + 1, dtype=dtype)
    Hf = randn(B, N, d, seed=seed + 2, dtype=dtype)
    grad_logits = randn(B, N, V, seed=seed + 3, dtype=dtype)
    args = (idx, grad_X0, Hf, grad_logits, n_ctx) + (() if default_start else (start,))
    zero = torch.zeros_like(grad_X0), torch.zeros_like(grad_logits)
    terms = {
        "grad_wte": {
            "the head's gradient": tied_embedding_backward(idx, zero[0], Hf, grad_logits, n_ctx, start)[0],
            "the input scatter": tied_embedding_backward(idx, grad_X0, Hf, zero[1], n_ctx, start)[0],
        }
    }
    return Case(args, factors={"B": B} if B > 1 else {}, terms=terms)


def _tied(ids="repeats", start="some", end=False, dtype=F64, B=(2, 3)):
    """Strategy and maker: (B, N, d, V, start) drawn; n_ctx = start + N (+ a tail unless end)."""
    strategy = st.tuples(
        st.integers(*B),
        st.integers(2, 4),
        st.integers(2, 4),
        st.integers(0 if start == "default" else 1, 4),
        st.integers(0 if end else 1, 3),
    )

    def make(p, s):
        B, N, d, st_, tail = p
        V = B * N + 2 if ids == "distinct" else st_ + 3 + N
        s0 = 0 if start == "default" else st_
        n_ctx = s0 + N + tail
        return _tied_case(B, N, d, V, n_ctx, s0, s, ids, dtype, default_start=start == "default")

    return strategy, make


def _tied_class(name, **kw):
    strategy, make = _tied(**kw)
    tol = F32_TOL if kw.get("dtype") == F32 else F64_TOL
    return CaseClass(name, strategy, make, **tol)


ex4 = Exercise(
    "ex4",
    "tied_embedding_backward",
    "(idx, grad_X0, Hf, grad_logits, n_ctx, start=0)",
    "Exercise 4 · tied_embedding_backward",
    tied_embedding_backward,
    ("grad_wte", "grad_wpe"),
    [
        _tied_class("a token occurs several times in idx (start > 0)"),
        _tied_class("every token of idx is different (some ids absent)", ids="distinct"),
        _tied_class("every token of idx is the same id", ids="same"),
        _tied_class("start is left at its default (0)", start="default"),
        _tied_class("the chunk ends the context (start + N = n_ctx)", end=True),
        _tied_class("there is one sequence (B = 1)", B=(1, 1)),
        _tied_class("grad_X0 is float32", dtype=F32),
        large_class("B 2, N 8, d 16, V 64", lambda s: _tied_case(2, 8, 16, 64, 12, 2, s), **F64_TOL),
    ],
    points=1,
    by_hand=("autograd", "helpers.block.block_manual_backward", "helpers.gpt.embedding_backward"),
)

# --------------------------------------------------------------------------- ex5

ORDER5 = (
    "linear2.weight",
    "linear2.bias",
    "linear1.weight",
    "linear1.bias",
    "norm2.weight",
    "norm2.bias",
    "self_attn.out_proj.weight",
    "self_attn.out_proj.bias",
    "self_attn.in_proj_weight",
    "self_attn.in_proj_bias",
    "norm1.weight",
    "norm1.bias",
    "X",
)


def _forward(X, p, H, causal, activation, eps):
    """The pre-norm block in torch's own functions: X1 = X + SA(LN1(X)), Y = X1 + FF(LN2(X1))."""
    B, N, d = X.shape
    h1 = F.layer_norm(X, (d,), p["norm1.weight"], p["norm1.bias"], eps)
    QKV = F.linear(h1, p["self_attn.in_proj_weight"], p["self_attn.in_proj_bias"])  # (B, N, 3d)
    Q, K, V = (split_heads(t, H) for t in QKV.chunk(3, -1))  # 3 × (B, H, N, d_h)
    S = Q @ K.transpose(-1, -2) / math.sqrt(d // H)  # (B, H, N, N)
    if causal:
        S = S.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    A = merge_heads(S.softmax(-1) @ V)  # (B, N, d)
    X1 = X + F.linear(A, p["self_attn.out_proj.weight"], p["self_attn.out_proj.bias"])
    h2 = F.layer_norm(X1, (d,), p["norm2.weight"], p["norm2.bias"], eps)
    U = F.linear(h2, p["linear1.weight"], p["linear1.bias"])
    return X1 + F.linear(ACTS[activation](U), p["linear2.weight"], p["linear2.bias"])


def block_backward(grad_Y, cache):
    """{"X": ∂L/∂X, name: ∂L/∂θ} of the block whose cache is given, by autograd, in backward's order."""
    c = cache
    names = list(BLOCK_PARAM_NAMES)
    grads = _grads(
        lambda X, *theta: _forward(
            X, dict(zip(names, theta)), c["H"], c["causal"], c["activation"], c["eps"]
        ),
        (c["X"], *(c["params"][n] for n in names)),
        grad_Y,
    )
    by_name = dict(zip(["X", *names], grads))
    return {k: by_name[k] for k in ORDER5}


def block_forward(X, params, H, causal=False, activation="relu", eps=1e-5):
    """The lab's block_forward (shown in its prompt): (Y, cache)."""
    p = params
    h1, mu1, rstd1 = layernorm_forward(X, p["norm1.weight"], p["norm1.bias"], eps)
    QKV = h1 @ p["self_attn.in_proj_weight"].T + p["self_attn.in_proj_bias"]  # (B, N, 3d)
    Q, K, V = (split_heads(t, H) for t in QKV.chunk(3, dim=-1))  # 3 × (B, H, N, d_h)
    mask = causal_mask(X.shape[1], X.shape[1]) if causal else None
    O, P = attention_forward(Q, K, V, mask)  # (B, H, N, d_h), (B, H, N, N)
    A = merge_heads(O)  # (B, N, d)
    X1 = X + A @ p["self_attn.out_proj.weight"].T + p["self_attn.out_proj.bias"]
    h2, mu2, rstd2 = layernorm_forward(X1, p["norm2.weight"], p["norm2.bias"], eps)
    U = h2 @ p["linear1.weight"].T + p["linear1.bias"]  # (B, N, d_ff)
    Y = X1 + ACTS[activation](U) @ p["linear2.weight"].T + p["linear2.bias"]
    cache = {"X": X, "mu1": mu1, "rstd1": rstd1, "h1": h1, "Q": Q, "K": K, "V": V, "P": P, "A": A}
    cache |= {"X1": X1, "mu2": mu2, "rstd2": rstd2, "params": p, "H": H, "activation": activation}
    return Y, cache | {"causal": causal, "eps": eps}


def _block_case(B, N, H, d_h, seed, activation="relu", causal=False, eps=1e-5) -> Case:
    d = H * d_h
    p = block_params(d, 2 * d + 1, seed=seed, dtype=F64)
    X = randn(B, N, d, seed=seed + 20, dtype=F64)
    grad_Y = randn(B, N, d, seed=seed + 21, dtype=F64)
    _, cache = block_forward(X, p, H, causal, activation, eps)
    c = cache  # ∂L/∂X1, what the first residual's skip path carries to X
    grad_X1 = ffn_sublayer_backward(c["X1"], c["mu2"], c["rstd2"], p, grad_Y, activation)["X1"]
    return Case((grad_Y, cache), terms={"X": {"the first skip path (∂L/∂X1)": grad_X1}})


shapes5 = st.tuples(st.integers(1, 2), st.integers(2, 4), st.integers(2, 3))  # (B − 1, N − 1, d_h), H = 2


def _block_class(name, strategy=shapes5, make=None, **kw):
    make = make or (lambda p, s: _block_case(p[0] + 1, p[1] + 1, 2, p[2], s, **kw))
    return CaseClass(name, strategy, make, **F64_TOL)


ex5 = Exercise(
    "ex5",
    "block_backward",
    "(grad_Y, cache)",
    "Exercise 5 · block_backward",
    block_backward,
    ("grads",),
    [
        _block_class('activation="relu", no mask, 2 heads'),
        _block_class('activation="gelu"', activation="gelu"),
        _block_class("causal=True (a causal mask)", causal=True),
        _block_class(
            "there is one head (H = 1)",
            st.tuples(st.integers(2, 3), st.integers(3, 5), st.integers(3, 5)),
            lambda p, s: _block_case(p[0], p[1], 1, p[2], s),
        ),
        _block_class(
            "there are 3 or 4 heads",
            st.tuples(st.integers(2, 3), st.integers(2, 4), st.integers(3, 4), st.integers(1, 2)),
            lambda p, s: _block_case(p[0], p[1], p[2], p[3], s),
        ),
        _block_class(
            "the LayerNorms' eps is large (0.1–1)",
            st.tuples(shapes5, st.sampled_from([0.1, 0.25, 0.5, 1.0])),
            lambda p, s: _block_case(p[0][0] + 1, p[0][1] + 1, 2, p[0][2], s, eps=p[1]),
        ),
        _block_class(
            "B = 1 (one sequence), GELU and causal",
            st.tuples(st.integers(3, 5), st.integers(2, 3)),
            lambda p, s: _block_case(1, p[0], 2, p[1], s, activation="gelu", causal=True),
        ),
        large_class("B 2, N 8, H 2, d_h 8", lambda s: _block_case(2, 8, 2, 8, s), **F64_TOL),
    ],
    calls=("ex1", "ex3"),
    points=3,
    by_hand=("autograd", "helpers.block.block_manual_backward"),
)

# ------------------------------------------------------------ the machinery's two gaps, worked around here

_plain_solution_function = machinery.solution_function
ORDER = ("ex1", "ex2", "ex3", "ex4", "ex5")


def _solution_function(lab, exercise, edits=()):
    """The machinery's solution_function; for this lab, the earlier questions' solutions defined beside it."""
    fn = _plain_solution_function(lab, exercise, edits)
    if lab == LAB and exercise.question in ORDER[2:]:
        setup, sols = machinery._solutions(lab)
        ns: dict = {"__name__": "__contract__"}
        import mutants  # tools/, on the path once the machinery's solution_function ran

        for code in [*setup, *(c for q in ORDER[: ORDER.index(exercise.question)] for c in sols[q])]:
            mutants._run(code, ns)
        for name, value in ns.items():
            fn.__globals__.setdefault(name, value)
    return fn


machinery.solution_function = _solution_function  # only this lab's questions get their earlier solutions


class LabContract(Contract):
    """Contract whose dict answers (ex3, ex5) also get their known mistakes recorded, key by key."""

    def record(self, known: dict | None = None) -> dict:
        known = known if known is not None else machinery.known_mistakes(self)
        out = super().record(known)
        for ex in self.exercises.values():
            if ex.outputs != ("grads",) or not known.get(ex.name):
                continue
            for cls, node in zip(ex.classes, out["exercises"][ex.name]["classes"]):
                for case, case_node in zip(self.cases(ex.name, cls.name)[0], node["cases"]):
                    expected = ex.outputs_of(ex.reference, case)
                    wrong: dict = {}
                    for label, fn in known[ex.name].items():
                        try:
                            got = ex.outputs_of(fn, case)
                        except Exception:  # noqa: BLE001 - a mistake that crashes here needs no value
                            continue
                        if not isinstance(got, dict):
                            continue
                        for k, e in expected.items():
                            g = got.get(k)
                            if isinstance(g, torch.Tensor) and g.shape == e.shape and g.dtype == e.dtype:
                                if not torch.allclose(g, e, atol=cls.atol, rtol=cls.rtol):
                                    wrong.setdefault(k, {})[label] = encode(g.detach())
                    if wrong:
                        case_node["mistakes"] = wrong
        return out


CONTRACT = LabContract(LAB, [ex1, ex2, ex3, ex4, ex5], base_seed=70_000)
