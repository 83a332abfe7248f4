"""Lab 10's contract: each exercise's reference and its case classes, one per promise of its prompt.

The prompts promise (labs/source/src/lab10_flash_attention.py); ``slopes`` is (H,), Q (B, H, Nq, d),
K and V (B, H, Nk, d), the scale 1/√d, the bias −slopes[h]·|i − j| in global indices:

* ex1 ``merge_stats(m_a, ell_a, m_b, ell_b)``: elementwise over any shape; the larger max in
  either part (or equal); an empty part (m = −∞, ℓ = 0) on either side leaves the other unchanged,
  and two empty parts merge into an empty part (−∞, 0), not NaN.
  ``online_softmax_stats(x, block)``: x of any ``(..., n)`` (1-D included); a block that divides n
  or not (a short last block), block = 1, a block of n or more; a late max (ℓ rescaled); entries
  near 1000 (no overflow).
* ex2 ``alibi_tile(q0, k0, bq, bk, slopes)``: tiles on, below and above the diagonal, one head,
  a slope of 0, slopes in float32 (the tile in slopes' dtype).
  ``tiled_forward(Q, K, V, slopes, block_q=16, block_k=16, causal=False, window=None)``: blocks
  that divide N and that do not, Nq < Nk and Nq > Nk, blocks of 1, a block longer than N, the
  default blocks (16), B > 1, slopes of 0, scores in the thousands, the flags passed explicitly.
* ex3 ``row_D(O, grad_O)``: (B, H, N) for any B, H, d (d = 1). ``attention_backward_from_L(Q, K,
  V, O, L, grad_O, slopes)``: Nq = Nk, Nq < Nk, Nq > Nk, B > 1 (grad_slopes summed over the
  batch), slopes of 0, a large slope.
* ex4 ``tiled_backward(Q, K, V, O, L, grad_O, slopes, block_q=16, block_k=16, causal=False,
  window=None)``: as tiled_forward's blocks and shapes, and B > 1 (grad_slopes from every batch).
* ex5 ``causal_tile_mask(q0, k0, bq, bk, window=None, device=None)``: a tile across the diagonal,
  wholly above it, wholly below it, a window, window = 1; then ``tiled_forward`` and
  ``tiled_backward`` with ``causal=True`` (top-left) for Nq = Nk, Nq < Nk, Nq > Nk, with a window,
  window = 1, rows that see no key in the first tile they visit (no NaN), B > 1.
* ex6 ``FlashAttentionFn`` (an autograd.Function, judged by what autograd gets from it and by what
  it saves: Q, K, V, O (B, H, N, d), L (B, H, N) and slopes, nothing N × N) for each flag value,
  Nq ≠ Nk, B > 1, one input needing a gradient; ``flash_attn`` with its defaults and flags.

Every query sees at least one key (the prompt says so: with Nq > Nk and a window, the window is
wider than Nq − Nk). Exercises 5 and 6 call the learner's functions of exercises 2 and 4 (the
prompts ask them to): the catalog's mutants run with the source's other solutions
(:func:`_with_earlier_solutions`, as lab 6's contract).
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import torch
from contract import Case, CaseClass, Contract, Exercise, large_class

from helpers.device import randn

F64, F32 = torch.float64, torch.float32
LAB = "lab10_flash_attention"
TOL = {"atol": 1e-10, "rtol": 1e-8}
INF = math.inf
ONE, TWO_THREE, TWO, NONE = st.just(1), st.integers(2, 3), st.just(2), st.none()

# --------------------------------------------------------------------------- references


def _visible(Nq, Nk, causal=False, window=None, q0=0, k0=0):
    """(Nq, Nk) bool: key k0 + c visible to query q0 + r (top-left causal, optionally windowed)."""
    i = torch.arange(q0, q0 + Nq)[:, None]
    j = torch.arange(k0, k0 + Nk)[None, :]
    seen = torch.ones(Nq, Nk, dtype=torch.bool)
    if causal:
        seen = j <= i
        if window is not None:
            seen = seen & (i - j < window)
    return seen


def _scores(Q, K, slopes, causal=False, window=None):
    """The full (B, H, Nq, Nk) scores Q Kᵀ/√d − slopes·|i − j|, −∞ where masked."""
    Nq, Nk = Q.shape[-2], K.shape[-2]
    dist = (torch.arange(Nk)[None, :] - torch.arange(Nq)[:, None]).abs().to(Q.dtype)
    S = torch.einsum("bhqd,bhkd->bhqk", Q, K) / math.sqrt(Q.shape[-1]) - slopes[:, None, None] * dist
    return S.masked_fill(~_visible(Nq, Nk, causal, window), -INF)


def _full(Q, K, V, slopes, causal=False, window=None):
    """(O, L) from the full scores."""
    S = _scores(Q, K, slopes, causal, window)
    return torch.softmax(S, -1) @ V, torch.logsumexp(S, -1)


def _full_grads(Q, K, V, slopes, grad_O, causal=False, window=None):
    """(grad_Q, grad_K, grad_V, grad_slopes) by autograd through the full scores."""
    leaves = [t.detach().clone().requires_grad_() for t in (Q, K, V, slopes)]
    with torch.enable_grad():
        O, _ = _full(*leaves, causal, window)
        return tuple(g.detach() for g in torch.autograd.grad(O, leaves, grad_O))


# --------------------------------------------------------------------------- ex1


def merge_stats(m_a, ell_a, m_b, ell_b):
    """(m, ℓ) of the union of two parts; two empty parts stay empty (−∞, 0)."""
    m = torch.maximum(m_a, m_b)
    base = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return m, ell_a * torch.exp(m_a - base) + ell_b * torch.exp(m_b - base)


def online_softmax_stats(x, block):
    """m = max x and ℓ = Σ exp(x − m) over the last dim (two passes: the reference)."""
    m = x.amax(-1)
    return m, torch.exp(x - m[..., None]).sum(-1)


def _stats(x):
    return online_softmax_stats(x, x.shape[-1])


def _merge_case(p, seed, kind):
    shape, na, nb = p
    xa = randn(*shape, na, seed=seed, dtype=F64) * 2
    xb = randn(*shape, nb, seed=seed + 1, dtype=F64) * 2
    if kind == "a":
        xa = xa + 6
    elif kind == "b":
        xb = xb + 6
    elif kind == "equal":
        xa[..., 0] = 9.0
        xb[..., -1] = 9.0
    (ma, la), (mb, lb) = _stats(xa), _stats(xb)
    empty = (torch.full(shape, -INF, dtype=F64), torch.zeros(shape, dtype=F64))
    if kind in ("empty_a", "empty_both"):
        ma, la = empty
    if kind in ("empty_b", "empty_both"):
        mb, lb = empty
    return Case((ma, la, mb, lb))


def _parts(min_dims=1, max_dims=2):
    shapes = st.lists(st.integers(2, 4), min_size=min_dims, max_size=max_dims).map(tuple)
    return st.tuples(shapes, st.integers(2, 6), st.integers(2, 6))


def _merge_class(name, kind, parts=None):
    return CaseClass(name, _parts() if parts is None else parts, lambda p, s: _merge_case(p, s, kind), **TOL)


# what every by-hand exercise of this lab that recomputes attention may not call
BACKWARD_BY_HAND = (
    "autograd",
    "helpers.flash.naive_attention",
    "helpers.flash.flash_backward",
    "helpers.flash.flash_attention",
    "torch.nn.functional.scaled_dot_product_attention",
)

ex1 = Exercise(
    "ex1",
    "merge_stats",
    "(m_a, ell_a, m_b, ell_b)",
    "Exercise 1 · merge_stats",
    merge_stats,
    ("m", "ell"),
    [
        _merge_class("the larger max is in part a", "a"),
        _merge_class("the larger max is in part b", "b"),
        _merge_class("the two parts' maxima are equal", "equal"),
        _merge_class("the statistics have 3 dims (any shape)", "a", _parts(3, 3)),
        _merge_class("part a is empty (m = −∞, ℓ = 0)", "empty_a"),
        _merge_class("part b is empty (m = −∞, ℓ = 0)", "empty_b"),
        _merge_class("both parts are empty (−∞, 0: not NaN)", "empty_both"),
    ],
    question="ex1",
    points=2,
    by_hand=("helpers.flash.online_softmax", "helpers.flash.online_softmax_trace"),
)


def _row_case(p, seed, kind):
    shape, n, block = p
    x = randn(*shape, n, seed=seed, dtype=F64) * 2
    if kind == "late":
        x[..., -1] = 9.0  # the max in the last (short) block: ℓ rescaled
    elif kind == "large":
        x = x * 3 + 1000
    return Case((x, block))


def _rows(rel, min_dims=1, max_dims=2):
    shapes = st.lists(st.integers(2, 3), min_size=min_dims - 1, max_size=max_dims - 1).map(tuple)
    pick = {
        "divides": st.tuples(st.integers(2, 4), st.integers(2, 3)).map(lambda p: (p[0] * p[1], p[1])),
        "short": st.tuples(st.integers(5, 12), st.integers(2, 4)).filter(lambda p: p[0] % p[1]),
        "one": st.integers(2, 8).map(lambda n: (n, 1)),
        "whole": st.tuples(st.integers(2, 8), st.integers(1, 4)).map(lambda p: (p[0], p[0] + p[1])),
    }[rel]
    return st.tuples(shapes, pick).map(lambda t: (t[0], *t[1]))


def _row_class(name, rel, kind="plain", min_dims=2, max_dims=2):
    return CaseClass(name, _rows(rel, min_dims, max_dims), lambda p, s: _row_case(p, s, kind), **TOL)


ex1b = Exercise(
    "ex1b",
    "online_softmax_stats",
    "(x, block)",
    "Exercise 1 · online_softmax_stats",
    online_softmax_stats,
    ("m", "ell"),
    [
        _row_class("block divides n", "divides"),
        _row_class("the last block is shorter (block does not divide n)", "short"),
        _row_class("block = 1", "one"),
        _row_class("block > n (one block, shorter than block)", "whole"),
        _row_class("x is 1-D (n,)", "short", min_dims=1, max_dims=1),
        _row_class("x is 3-D (B, H, n)", "short", min_dims=3, max_dims=3),
        _row_class("the max is in the last, short block (ℓ rescaled)", "short", "late"),
        _row_class("the entries are near 1000 (exp(x) overflows)", "short", "large"),
    ],
    question="ex1",
    # "do not compute x.amax(-1) over the whole row: the point is to see each block once"
    rules={"reads": lambda x, block: x[..., :block].numel()},
)

# --------------------------------------------------------------------------- ex2


def alibi_tile(q0, k0, bq, bk, slopes):
    """(H, bq, bk): −slopes[h]·|j − i| for the global indices of the tile."""
    i = torch.arange(q0, q0 + bq, dtype=slopes.dtype, device=slopes.device)[:, None]
    j = torch.arange(k0, k0 + bk, dtype=slopes.dtype, device=slopes.device)[None, :]
    return -slopes[:, None, None] * (j - i).abs()


def _slopes(H, seed, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return (0.02 + 0.3 * torch.rand(H, generator=g, dtype=F64)).to(dtype)  # mild: a row's max may come late


def _tile_case(p, seed, kind):
    q0, k0, bq, bk, H = p
    slopes = _slopes(H, seed, F32 if kind == "f32" else F64)
    if kind == "zero":
        slopes[0] = 0.0
    if kind == "meta":  # no values there: the class sees where the tile is made, its shape and dtype
        slopes = slopes.to("meta")
    return Case((q0, k0, bq, bk, slopes))


def _tiles(where, H=TWO_THREE):
    corner = {
        "diag": st.integers(0, 8).map(lambda q: (q, q)),
        "below": st.tuples(st.integers(6, 12), st.integers(0, 3)),
        "above": st.tuples(st.integers(0, 3), st.integers(6, 12)),
        "any": st.tuples(st.integers(1, 8), st.integers(1, 8)).filter(lambda p: p[0] != p[1]),
    }[where]
    tiles = st.tuples(corner, st.integers(2, 5), st.integers(2, 5), H).map(lambda t: (*t[0], *t[1:]))
    side = {  # wholly below or above the diagonal; "any": across it, off its corner
        "below": lambda p: p[0] >= p[1] + p[3],
        "above": lambda p: p[1] >= p[0] + p[2],
        "any": lambda p: max(p[0], p[1]) < min(p[0] + p[2], p[1] + p[3]),
        "diag": lambda p: True,
    }[where]
    return tiles.filter(side)


def _tile_room(q0, k0, bq, bk, slopes):
    """Bytes one tile's bias may take, twice over: a square from index 0 is larger off the diagonal."""
    return 2 * slopes.numel() * bq * bk * slopes.element_size()


def _tile_class(name, where, kind="plain", H=TWO_THREE):
    # "without building the (Nq, Nk) bias": measured off the diagonal, where a square from 0 is 2.5× or more
    rules = {"largest": _tile_room} if where in ("below", "above") else {}
    return CaseClass(name, _tiles(where, H), lambda p, s: _tile_case(p, s, kind), rules=rules, **TOL)


ex2 = Exercise(
    "ex2",
    "alibi_tile",
    "(q0, k0, bq, bk, slopes)",
    "Exercise 2 · alibi_tile",
    alibi_tile,
    ("bias",),
    [
        _tile_class("the tile is on the diagonal (q0 = k0)", "diag"),
        _tile_class("the tile is wholly below the diagonal (j < i)", "below"),
        _tile_class("the tile is wholly above the diagonal (j > i)", "above"),
        _tile_class("there is one head (H = 1)", "any", H=st.just(1)),
        _tile_class("a slope is 0", "any", "zero"),
        _tile_class("the slopes are float32", "any", "f32"),
        # the prompt's "on slopes' device": a newcomer's tile made on the CPU whatever the slopes' (s10, ✓ before)
        _tile_class("the slopes are on the meta device (the tile is made there)", "any", "meta"),
    ],
    question="ex2",
    points=3,
    by_hand=(
        "helpers.flash.naive_attention",
        "helpers.flash.flash_forward",
        "helpers.flash.flash_attention",
        "torch.nn.functional.scaled_dot_product_attention",
    ),
)


def tiled_forward(Q, K, V, slopes, block_q=16, block_k=16, causal=False, window=None):
    """(O, L) of ALiBi attention (full scores: the reference)."""
    return _full(Q, K, V, slopes, causal, window)


def _attn(p, seed, flags=None, big=1.0, zero=False):
    """Q, K, V, slopes of one case: p = (B, H, Nq, Nk, d, block_q, block_k)."""
    B, H, Nq, Nk, d = p[:5]
    Q = randn(B, H, Nq, d, seed=seed, dtype=F64) * big
    K = randn(B, H, Nk, d, seed=seed + 1, dtype=F64) * big
    K[..., p[6] :, :] *= 2.5  # keys past the first key block score higher: rows' maxima come late
    V = randn(B, H, Nk, d, seed=seed + 2, dtype=F64)
    slopes = torch.zeros(H, dtype=F64) if zero else _slopes(H, seed + 3)
    return Q, K, V, slopes


def _far_below(Q, K):
    """Q, K whose every score is −1500 plus a spread of order 1 (the last dim carries the offset): exp of a
    score underflows (a running max started at 0 gives ℓ = 0 and L = −∞), where a max taken from the
    scores is exact, and the tiles still weigh alike (a missing rescale shows)."""
    Q, K = Q.clone(), K.clone()
    Q[..., -1], K[..., -1] = 50.0, -30.0 * math.sqrt(Q.shape[-1])
    return Q, K


def _fwd_case(p, seed, kind, flags=()):
    Q, K, V, slopes = _attn(p, seed, big=40.0 if kind == "large" else 1.0, zero=kind == "zero")
    if kind == "negative":
        Q, K = _far_below(Q, K)
    blocks = () if kind == "default" else p[5:]
    flags = tuple(flags)
    if kind == "explicit":
        flags = (False, None)
    return Case((Q, K, V, slopes, *blocks, *flags))


def _shapes(rel="any", blocks="ragged", B=ONE, H=TWO):
    """(B, H, Nq, Nk, d, block_q, block_k): Nq vs Nk as `rel` says, blocks as `blocks` says."""
    n = st.tuples(st.integers(4, 11), st.integers(4, 11))
    n = {
        "any": n.filter(lambda t: t[0] != t[1]),  # Nq ≠ Nk unless a class says otherwise
        "eq": st.integers(4, 11).map(lambda k: (k, k)),
        "lt": n.filter(lambda t: t[0] < t[1]),
        "gt": n.filter(lambda t: t[0] > t[1]),
        "default": st.tuples(st.integers(17, 20), st.integers(17, 20)),
    }[rel]
    bl = {
        "ragged": st.tuples(st.integers(2, 4), st.integers(2, 4)),
        "one": st.just((1, 1)),
        "long": st.tuples(st.integers(12, 20), st.integers(12, 20)),
        "default": st.just((16, 16)),
    }[blocks]
    shapes = st.tuples(B, H, n, st.integers(2, 4), bl).map(lambda t: (t[0], t[1], *t[2], t[3], *t[4]))
    if blocks == "ragged":  # neither N a multiple of its block, block_q ≠ block_k
        shapes = shapes.filter(lambda p: p[2] % p[5] and p[3] % p[6] and p[5] != p[6])
    if blocks == "long":
        shapes = shapes.filter(lambda p: p[5] != p[6])
    return shapes


def _divides():
    return (
        st.tuples(st.integers(2, 3), st.integers(2, 3), st.integers(2, 3), st.integers(2, 4))
        .filter(lambda t: t[0] != t[1])
        .map(lambda t: (1, 2, t[0] * t[2], t[1] * t[2], t[3], t[2], t[2]))
    )


def _tiled_room(Q, K, V, slopes, block_q=16, block_k=16, causal=False, window=None):
    """Bytes a tiled pass may hold in one tensor: twice an input's, or twice one (B, H, bq, bk) tile's."""
    B, H, Nq, _ = Q.shape
    tile = B * H * min(block_q, Nq) * min(block_k, K.shape[-2]) * Q.element_size()
    return 2 * max(Q.nbytes, K.nbytes, V.nbytes, tile)


def _long():
    """Nq, Nk of 40–48 in blocks of 8, d ≤ 4: the (H, Nq, Nk) bias is 10× what a tiled pass holds."""
    n = st.tuples(st.integers(40, 48), st.integers(40, 48), st.integers(2, 4))
    return n.map(lambda t: (1, 2, t[0], t[1], t[2], 8, 8))


def _fwd_class(name, shapes, kind="plain", flags=()):
    return CaseClass(name, shapes, lambda p, s: _fwd_case(p, s, kind, flags), **TOL)


ex2b = Exercise(
    "ex2b",
    "tiled_forward",
    "(Q, K, V, slopes, block_q=16, block_k=16, causal=False, window=None)",
    "Exercise 2 · tiled_forward",
    tiled_forward,
    ("O", "L"),
    [
        _fwd_class("N is a multiple of both block sizes", _divides()),
        _fwd_class("the last blocks are shorter (N not a multiple of the block)", _shapes()),
        _fwd_class("there are fewer queries than keys (Nq < Nk)", _shapes("lt")),
        _fwd_class("there are more queries than keys (Nq > Nk)", _shapes("gt")),
        _fwd_class("the blocks hold one row (block_q = block_k = 1)", _shapes(blocks="one")),
        _fwd_class("a block is longer than N (one tile)", _shapes(blocks="long")),
        _fwd_class(
            "block_q and block_k are left at their defaults (16; N = 17–20)", _shapes("default"), "default"
        ),
        _fwd_class("B > 1 and H > 2", _shapes(B=st.integers(2, 3), H=st.integers(3, 4))),
        _fwd_class("the slopes are 0 (plain attention)", _shapes(), "zero"),
        _fwd_class("the scores are in the thousands (exp(S) overflows)", _shapes(), "large"),
        _fwd_class("causal=False and window=None are passed", _shapes(), "explicit"),
        CaseClass(  # "without building the (Nq, Nk) bias": measured where it is 10× a tile on every draw
            "Nq, Nk = 40–48 in blocks of 8 (no room for the whole (H, Nq, Nk) bias)",
            _long(),
            lambda p, s: _fwd_case(p, s, "plain"),
            rules={"largest": _tiled_room},
            **TOL,
        ),
        _fwd_class("every score is near −1500 (exp(S) underflows to 0)", _shapes(), "negative"),
    ],
    question="ex2",
)

# --------------------------------------------------------------------------- ex3


def row_D(O, grad_O):
    """(B, H, N): Σ_d grad_O·O."""
    return torch.einsum("...nd,...nd->...n", O, grad_O)


def _D_case(p, seed, dtype=F64):
    B, H, N, d = p
    O, grad_O = randn(B, H, N, d, seed=seed, dtype=dtype), randn(B, H, N, d, seed=seed + 1, dtype=dtype)
    return Case((O, grad_O), factors={"d": d} if d > 1 else {})


ex3 = Exercise(
    "ex3",
    "row_D",
    "(O, grad_O)",
    "Exercise 3 · row_D",
    row_D,
    ("D",),
    [
        CaseClass(
            "B > 1, H > 1, d > 1",
            st.tuples(st.integers(2, 3), st.integers(2, 3), st.integers(2, 5), st.integers(2, 4)),
            lambda p, s: _D_case(p, s),
            **TOL,
        ),
        CaseClass(
            "d = 1",
            st.tuples(st.integers(1, 2), st.integers(2, 3), st.integers(2, 5), st.just(1)),
            lambda p, s: _D_case(p, s),
            **TOL,
        ),
        CaseClass(
            "there is one row (N = 1)",
            st.tuples(st.integers(1, 2), st.integers(2, 3), st.just(1), st.integers(2, 4)),
            lambda p, s: _D_case(p, s),
            **TOL,
        ),
    ],
    question="ex3",
    points=3,
    by_hand=BACKWARD_BY_HAND,
)


def attention_backward_from_L(Q, K, V, O, L, grad_O, slopes):
    """(grad_Q, grad_K, grad_V, grad_slopes) by autograd through the full scores (the reference)."""
    return _full_grads(Q, K, V, slopes, grad_O)


def _bwd_args(p, seed, kind="plain", causal=False, window=None):
    Q, K, V, slopes = _attn(p, seed, zero=kind == "zero")
    if kind == "steep":
        slopes[0] = 4.0  # far keys get almost no weight
    O, L = _full(Q, K, V, slopes, causal, window)
    grad_O = randn(*O.shape, seed=seed + 4, dtype=F64)
    return Q, K, V, O, L, grad_O, slopes


def _factors(p):
    return {"√d": math.sqrt(p[4]), **({"B": p[0]} if p[0] > 1 else {})}


def _bwd_case(p, seed, kind):
    return Case(_bwd_args(p, seed, kind), factors=_factors(p))


def _bwd_class(name, shapes, kind="plain"):
    return CaseClass(name, shapes, lambda p, s: _bwd_case(p, s, kind), **TOL)


ex3b = Exercise(
    "ex3b",
    "attention_backward_from_L",
    "(Q, K, V, O, L, grad_O, slopes)",
    "Exercise 3 · attention_backward_from_L",
    attention_backward_from_L,
    ("grad_Q", "grad_K", "grad_V", "grad_slopes"),
    [
        _bwd_class("Nq = Nk", _shapes("eq")),
        _bwd_class("there are fewer queries than keys (Nq < Nk)", _shapes("lt")),
        _bwd_class("there are more queries than keys (Nq > Nk)", _shapes("gt")),
        _bwd_class("B > 1 (grad_slopes sums over the batch)", _shapes(B=st.integers(2, 3))),
        _bwd_class("the slopes are 0 (plain attention)", _shapes(), "zero"),
        _bwd_class("a slope is steep (4: far keys get ~0 weight)", _shapes(), "steep"),
        large_class(
            "H = 2, Nq = Nk = 16, d = 8", lambda s: _bwd_case((1, 2, 16, 16, 8, 4, 4), s, "plain"), **TOL
        ),
    ],
    question="ex3",
    rules={"avoids": ("softmax",)},  # "do not call torch.softmax"
)

# --------------------------------------------------------------------------- ex4


def tiled_backward(Q, K, V, O, L, grad_O, slopes, block_q=16, block_k=16, causal=False, window=None):
    """(grad_Q, grad_K, grad_V, grad_slopes) (full scores, autograd: the reference)."""
    return _full_grads(Q, K, V, slopes, grad_O, causal, window)


def _tbwd_case(p, seed, kind="plain", flags=()):
    causal, window = (tuple(flags) + (False, None))[:2]
    args = _bwd_args(p, seed, kind, causal, window)
    blocks = () if kind == "default" else p[5:]
    return Case((*args, *blocks, *flags), factors=_factors(p))


def _tbwd_class(name, shapes, kind="plain", flags=(), rules=None):
    return CaseClass(name, shapes, lambda p, s: _tbwd_case(p, s, kind, flags), rules=rules or {}, **TOL)


def _tiled_bwd_room(Q, K, V, O, L, grad_O, slopes, block_q=16, block_k=16, causal=False, window=None):
    """Bytes a tiled backward may hold in one tensor: as the forward (``_tiled_room``); the gradients it
    accumulates are the inputs' size."""
    return _tiled_room(Q, K, V, slopes, block_q, block_k)


ex4 = Exercise(
    "ex4",
    "tiled_backward",
    "(\n    Q, K, V, O, L, grad_O, slopes, block_q=16, block_k=16, causal=False, window=None\n)",
    "Exercise 4 · tiled_backward",
    tiled_backward,
    ("grad_Q", "grad_K", "grad_V", "grad_slopes"),
    [
        _tbwd_class("N is a multiple of both block sizes", _divides()),
        _tbwd_class("the last blocks are shorter (N not a multiple of the block)", _shapes()),
        _tbwd_class("there are fewer queries than keys (Nq < Nk)", _shapes("lt")),
        _tbwd_class("there are more queries than keys (Nq > Nk)", _shapes("gt")),
        _tbwd_class("the blocks hold one row (block_q = block_k = 1)", _shapes(blocks="one")),
        _tbwd_class("a block is longer than N (one tile)", _shapes(blocks="long")),
        _tbwd_class(
            "block_q and block_k are left at their defaults (16; N = 17–20)", _shapes("default"), "default"
        ),
        _tbwd_class("B > 1 (grad_slopes from every batch)", _shapes(B=st.integers(2, 3))),
        _tbwd_class("the slopes are 0 (plain attention)", _shapes(), "zero"),
        _tbwd_class("causal=False and window=None are passed", _shapes(), flags=(False, None)),
        # "only ever holding one (block_q, block_k) tile of S, P, dP and dS": measured where the whole
        # (B, H, Nq, Nk) matrix is 10× a tile on every draw (a backward from the full matrices passed)
        _tbwd_class(
            "Nq, Nk = 40–48 in blocks of 8 (no room for the whole (B, H, Nq, Nk) matrices)",
            _long(),
            rules={"largest": _tiled_bwd_room},
        ),
        large_class(
            "H = 2, Nq = Nk = 16, d = 8, blocks of 4", lambda s: _tbwd_case((1, 2, 16, 16, 8, 4, 4), s), **TOL
        ),
    ],
    question="ex4",
    calls=("ex2", "ex3"),
    points=4,
    by_hand=BACKWARD_BY_HAND,
)

# --------------------------------------------------------------------------- ex5


def causal_tile_mask(q0, k0, bq, bk, window=None, device=None):
    """(bq, bk) bool: key k0 + c visible to query q0 + r (j ≤ i, and i − j < window)."""
    mask = _visible(bq, bk, True, window, q0, k0)
    return mask if device is None else mask.to(device)


def _crosses(p):
    """The tile holds a key on the diagonal (j = i) and, with a window w, one at j = i − w; q0 ≠ k0 (the
    tile at (0, 0) differs)."""
    (q0, k0), bq, bk, w = p
    return q0 != k0 and all(max(q0 - lag, k0) < min(q0 + bq - lag, k0 + bk) for lag in {0, w or 0})


def _mask_class(name, corner, window=NONE, crosses=False):
    shapes = st.tuples(corner, st.integers(2, 5), st.integers(2, 5), window)
    if crosses:
        shapes = shapes.filter(_crosses)
    return CaseClass(
        name,
        shapes,
        lambda p, s: Case((*p[0], p[1], p[2]) + (() if p[3] is None else (p[3],))),
        atol=0,
        rtol=0,
    )


ex5 = Exercise(
    "ex5",
    "causal_tile_mask",
    "(q0, k0, bq, bk, window=None, device=None)",
    "Exercise 5 · causal_tile_mask",
    causal_tile_mask,
    ("mask",),
    [
        _mask_class(
            "the tile crosses the diagonal",
            # k0 ≠ q0 − 1: there the tile at (0, 0) and the strict j < i give the same mask
            st.tuples(st.integers(2, 6), st.integers(0, 4)).filter(lambda c: c[1] != c[0] - 1),
            crosses=True,
        ),
        _mask_class(
            "the tile is wholly above the diagonal (no key visible)",
            st.tuples(st.integers(0, 3), st.integers(9, 12)),
        ),
        _mask_class(
            "the tile is wholly below the diagonal (every key visible)",
            st.tuples(st.integers(9, 12), st.integers(0, 3)),
        ),
        _mask_class(
            "a window is given (2–4)",
            st.tuples(st.integers(3, 8), st.integers(0, 4)),
            st.integers(2, 4),
            crosses=True,
        ),
        _mask_class(
            "window = 1 (the diagonal alone)",
            st.tuples(st.integers(2, 6), st.integers(0, 4)),
            st.just(1),
            crosses=True,
        ),
        CaseClass(
            # the meta device holds no values: this class sees where the tile is made, its shape and dtype
            "device='meta' is passed (the tile is made there)",
            st.tuples(st.integers(2, 6), st.integers(0, 4), st.integers(2, 5), st.integers(2, 5)),
            lambda p, s: Case(p, kwargs={"window": 2, "device": "meta"}),
            atol=0,
            rtol=0,
        ),
    ],
    question="ex5",
    points=3,
    by_hand=("helpers.attention.causal_mask", "torch.nn.functional.scaled_dot_product_attention"),
)


def _causal_shapes(rel="any", B=ONE, window="none"):
    """(B, H, Nq, Nk, d, block_q, block_k, window): every query sees a key (window > Nq − Nk)."""
    base = _shapes(rel, B=B)
    w = {
        "none": lambda p: st.none(),
        "some": lambda p: st.integers(max(2, p[2] - p[3] + 1), max(2, p[2] - p[3] + 1) + 3),
        "one": lambda p: st.just(1),
        "first_tile": lambda p: st.just(2),
    }[window]
    out = base.flatmap(lambda p: w(p).map(lambda v: (*p, v)))
    if window == "one":
        out = out.filter(lambda p: p[2] <= p[3])
    if window == "first_tile":  # blocks of 4 × 3, window 2: query 7's first key block (3–5) shows it nothing
        out = st.tuples(B, st.integers(8, 11), st.integers(2, 4)).map(
            lambda t: (t[0], 2, t[1], t[1], t[2], 4, 3, 2)
        )
    return out


def _late_keys(Q, K):
    """Q, K whose scores grow by 2000 from one key to the next: the first key a row may not see scores far
    above every key it sees (a max taken before the mask, or exp(S − L) where masked, gives NaN)."""
    Q = Q.abs() + 0.5
    steps = torch.arange(1, K.shape[-2] + 1, dtype=K.dtype)[:, None]  # (Nk, 1)
    return Q, torch.ones_like(K) * steps * 2000 * math.sqrt(K.shape[-1]) / Q.sum(-1).min()


def _causal_case(p, seed, backward, late=False):
    window = p[7]
    Q, K, V, slopes = _attn(p[:7], seed)
    if late:
        Q, K = _late_keys(Q, K)
    if backward:
        O, L = _full(Q, K, V, slopes, True, window)
        args = (Q, K, V, O, L, randn(*O.shape, seed=seed + 4, dtype=F64), slopes)
    else:
        args = (Q, K, V, slopes)
    return Case((*args, *p[5:7], True, window), factors=_factors(p))


def _causal_classes(backward):
    make = lambda p, s: _causal_case(p, s, backward)  # noqa: E731
    return [
        CaseClass("causal=True with Nq = Nk", _causal_shapes("eq"), make, **TOL),
        CaseClass("causal=True with Nq < Nk (top-left)", _causal_shapes("lt"), make, **TOL),
        CaseClass("causal=True with Nq > Nk", _causal_shapes("gt"), make, **TOL),
        CaseClass("causal=True with a window", _causal_shapes(window="some"), make, **TOL),
        CaseClass("causal=True with window = 1", _causal_shapes(window="one"), make, **TOL),
        CaseClass(
            "a row sees no key in the first tile it visits (window 2, tiles of 4 × 3)",
            _causal_shapes(window="first_tile"),
            make,
            **TOL,
        ),
        CaseClass("causal=True with B > 1", _causal_shapes(B=st.integers(2, 3)), make, **TOL),
        CaseClass(
            "causal=True, a key a row may not see scores thousands above those it sees",
            _causal_shapes("eq"),
            lambda p, s: _causal_case(p, s, backward, late=True),
            **TOL,
        ),
    ]


ex5b = Exercise(
    "ex5b",
    "tiled_forward",
    "(Q, K, V, slopes, block_q=16, block_k=16, causal=False, window=None)",
    "Exercise 5 · tiled_forward (causal)",
    tiled_forward,
    ("O", "L"),
    _causal_classes(backward=False),
    question="ex5",
    calls=("ex2",),
)
ex5c = Exercise(
    "ex5c",
    "tiled_backward",
    "(\n    Q, K, V, O, L, grad_O, slopes, block_q=16, block_k=16, causal=False, window=None\n)",
    "Exercise 5 · tiled_backward (causal)",
    tiled_backward,
    ("grad_Q", "grad_K", "grad_V", "grad_slopes"),
    _causal_classes(backward=True)
    + [
        large_class(
            "H = 2, Nq = Nk = 16, d = 8, blocks of 4, window 6",
            lambda s: _causal_case((1, 2, 16, 16, 8, 4, 4, 6), s, True),
            **TOL,
        )
    ],
    question="ex5",
    calls=("ex2", "ex3"),
)

# --------------------------------------------------------------------------- ex6


class FlashAttentionFn(torch.autograd.Function):
    """(O, L) from the full scores; saves Q, K, V, slopes, O, L; backward by autograd on them."""

    @staticmethod
    def forward(Q, K, V, slopes, causal, window, block_q, block_k):
        return _full(Q, K, V, slopes, causal, window)

    @staticmethod
    def setup_context(ctx, inputs, output):
        Q, K, V, slopes, causal, window = inputs[:6]
        ctx.save_for_backward(Q, K, V, slopes, *output)
        ctx.flags = (causal, window)
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx, grad_O, grad_L):
        Q, K, V, slopes, _, _ = ctx.saved_tensors
        grads = _full_grads(Q, K, V, slopes, grad_O, *ctx.flags)
        return (*(g if n else None for g, n in zip(grads, ctx.needs_input_grad)), None, None, None, None)


def flash_attn(Q, K, V, slopes, causal=False, window=None, block_q=16, block_k=16):
    """O of FlashAttentionFn."""
    return FlashAttentionFn.apply(Q, K, V, slopes, causal, window, block_q, block_k)[0]


def _fn_case(p, seed, flags, wrt=(0, 1, 2, 3), wrapper=False, defaults=False):
    Q, K, V, slopes = _attn(p[:7], seed)
    grad_O = randn(*Q.shape[:-1], V.shape[-1], seed=seed + 4, dtype=F64)
    causal, window = flags
    if wrapper:
        args = (Q, K, V, slopes) if defaults else (Q, K, V, slopes, causal, window, *p[5:7])
        options = {"grad_output": grad_O, "wrt": wrt, "report": (0, 1, 2, 3), "method": None}
    else:
        args = (Q, K, V, slopes, causal, window, *p[5:7])
        options = {"grad_output": (grad_O, None), "wrt": wrt, "report": (0, 1, 2, 3), "tracked": True}
    return Case(args, options=options)


def _fn_classes(wrapper):
    def cls(name, shapes, flags, rules=None, **kw):
        make = lambda p, s: _fn_case(p, s, flags, wrapper=wrapper, **kw)  # noqa: E731
        return CaseClass(name, shapes, make, rules=rules or {}, **TOL)

    out = [
        cls("causal=False", _shapes(), (False, None)),
        cls("causal=True", _shapes("eq"), (True, None)),
        cls("causal=True with a window", _shapes("lt"), (True, 2)),
        cls("Nq > Nk (causal=False)", _shapes("gt"), (False, None)),
        cls("B > 1", _shapes(B=st.integers(2, 3)), (True, None)),
        # "gated on ctx.needs_input_grad (None when it is not needed)": measured where inputs need none
        cls("only V needs a gradient (needs_input_grad)", _shapes(), (True, None), {"gated": True}, wrt=(2,)),
    ]
    if wrapper:
        out.append(
            cls(
                "causal, window and the blocks are left at their defaults",
                _shapes("default"),
                (False, None),
                defaults=True,
            )
        )
    return out


ex6 = Exercise(
    "ex6",
    "FlashAttentionFn",
    "(torch.autograd.Function)",
    "Exercise 6 · FlashAttentionFn",
    FlashAttentionFn,
    (
        "O",
        "L",
        "the outputs autograd tracks",
        "grad_Q",
        "grad_K",
        "grad_V",
        "grad_slopes",
        "what it saves (shapes)",
    ),
    _fn_classes(wrapper=False)
    + [
        large_class(
            "H = 2, Nq = Nk = 16, d = 8, blocks of 4, causal",
            lambda s: _fn_case((1, 2, 16, 16, 8, 4, 4), s, (True, None)),
            **TOL,
        )
    ],
    question="ex6",
    probe="backward_saving",
    calls=("ex5b", "ex5c"),
    points=2,
    by_hand=BACKWARD_BY_HAND,
)
ex6b = Exercise(
    "ex6b",
    "flash_attn",
    "(Q, K, V, slopes, causal=False, window=None, block_q=16, block_k=16)",
    "Exercise 6 · flash_attn",
    flash_attn,
    ("O", "grad_Q", "grad_K", "grad_V", "grad_slopes", "what it saves (shapes)"),
    _fn_classes(wrapper=True)
    + [
        large_class(
            "H = 2, Nq = Nk = 16, d = 8, blocks of 4, causal",
            lambda s: _fn_case((1, 2, 16, 16, 8, 4, 4), s, (True, None), wrapper=True),
            **TOL,
        )
    ],
    question="ex6",
    probe="backward_saving",
    calls=("ex5b", "ex5c"),  # a mistake in tiled_forward or tiled_backward costs points there, once
)

CONTRACT = Contract(
    LAB, [ex1, ex1b, ex2, ex2b, ex3, ex3b, ex4, ex5, ex5b, ex5c, ex6, ex6b], base_seed=100_000
)


# ---------------------------------------------------------------- the catalog's mutants


def _with_earlier_solutions():
    """contract.solution_function runs the setup and one question's solution cells; exercises 5 and 6
    call the functions of exercises 2 and 4, so this lab's setup also runs every solution (a
    question's mutant then redefines its own functions after them); and known mistakes whose
    value holds a NaN are not recorded (:func:`_without_nan`). Workarounds here, not in
    contract.py, which other labs share (lab 6's contract does the first too)."""

    import contract

    for module in (contract,):  # loaded once, by helpers.labcontract.instructor_module
        chained = module.__dict__.setdefault("_chained_labs", set())
        chained.add(LAB)
        if not getattr(module._solutions, "chains", False):  # lab 6's contract may have put it there

            def _solutions(lab, plain=module._solutions, chained=chained):
                setup, sols = plain(lab)
                if lab in chained:
                    setup = setup + [code for q in sols for code in sols[q]]
                return setup, sols

            _solutions.chains = True
            module._solutions = _solutions
        if not getattr(module._wrong_outputs, "drops_nan", False):
            module._wrong_outputs = _without_nan(module._wrong_outputs)


def _without_nan(wrong_outputs):
    """contract._wrong_outputs, minus the known mistakes whose value holds a NaN on this lab's cases (labcheck
    says "NaN at …" for those itself, and a recorded NaN never equals itself in the data's freshness test)."""

    def kept(ex, cls, case, expected, known):
        out = wrong_outputs(ex, cls, case, expected, known)
        if not any(ex is e for e in CONTRACT.exercises.values()):
            return out
        nan = lambda node: isinstance(node, dict) and any(v != v for v in node.get("tensor", []))  # noqa: E731
        out = {o: {k: v for k, v in by.items() if not nan(v)} for o, by in out.items()}
        return {o: by for o, by in out.items() if by}

    kept.drops_nan = True
    return kept


_with_earlier_solutions()
