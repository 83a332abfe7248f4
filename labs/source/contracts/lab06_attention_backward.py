"""Lab 6's contract: each exercise's reference and its case classes, one per promise of its prompt.

The prompts promise (labs/source/src/lab06_attention_backward.py):

* ex1 ``causal_mask(Nq, Nk, align="top_left", device=None, window=None)``: a (Nq, Nk) **bool**
  mask, True = may attend; Nq = Nk, Nq < Nk and Nq > Nk in both alignments (bottom-right with
  Nq > Nk: the first queries see no key); ``align`` and ``window`` left at their defaults or
  given (explicitly as their defaults too); ``window`` = 1 (the diagonal alone), between, and
  at least Nk (nothing cut).
* ex2 ``attention_forward(Q, K, V, mask=None, Bias=None, scale=None)`` -> (O, P): Q, K, V of any
  ``(..., N, d)`` (2-D or (B, H, N, d), B > 1 and H > 1), Nq < Nk and Nq > Nk, d_v ≠ d; ``scale``
  None (1/√d), a float, or a tensor per head (H, 1, 1); ``Bias`` None, (H, Nq, Nk) or (H, 1, Nk);
  ``mask`` None, (Nq, Nk) or per batch row (B, 1, 1, Nk); a query that sees no key gets zeros;
  every score near +10³ (a stable softmax), a masked score far above the visible ones (the row max taken
  after masking), visible scores far below 0 (masked scores exactly −∞, not a finite number);
  float32 as well as float64.
* ex3 ``attention_backward(Q, K, V, P, grad_O, scale, Bias)``: the five gradients, each in its
  input's shape: ``scale`` 0-dim or per head (H, 1, 1); ``Bias`` full size, (H, Nq, Nk),
  (H, 1, Nk) or (Nq, Nk); Nq < Nk and Nq > Nk; a P from a masked forward (zeros, a row of zeros);
  3-D inputs (B, N, d).
* ex4 ``attention_grads(Q, K, V, Bias, scale, grad_O, causal=False, key_padding_mask=None,
  align="top_left", window=None)``: every flag at each value, its default included: no mask;
  causal top-left with Nq = Nk, Nq < Nk, Nq > Nk; bottom-right; a window in either alignment;
  padding alone, with a causal mask, and a batch row padded entirely (zeros, no NaN); align and
  window given with causal=False (they apply to a causal mask only); a 0-dim scale with a
  (Nq, Nk) bias.

Exercise 4 calls the learner's exercises 1-3 (the prompt asks it to): a mistake there shows here
too. The catalog's mutants of exercise 4 run with the source's solutions of exercises 1-3
(:func:`_with_earlier_solutions`).
"""

from __future__ import annotations

import hypothesis.strategies as st
import torch
from contract import Case, CaseClass, Contract, Exercise, large_class

from helpers.device import randn

F64, F32 = torch.float64, torch.float32
LAB = "lab06_attention_backward"
TOL = {"atol": 1e-10, "rtol": 1e-8}

# --------------------------------------------------------------------------- ex1


def causal_mask(Nq, Nk, align="top_left", device=None, window=None):
    """(Nq, Nk) bool, True = may attend: the lower triangle moved right by Nk − Nq (bottom_right),
    minus the keys `window` or more behind the last visible one."""
    off = Nk - Nq if align == "bottom_right" else 0
    full = torch.ones(Nq, Nk, dtype=torch.bool, device=device)
    keep = full.tril(off)
    if window is not None:
        keep = keep & ~full.tril(off - window)
    return keep


def _mask_case(p, seed):
    Nq, Nk, kwargs = p
    return Case((Nq, Nk), kwargs=dict(kwargs))


def _sizes(rel: str, low=1, high=7):
    """(Nq, Nk) with Nq = Nk, Nq < Nk or Nq > Nk."""
    pairs = st.tuples(st.integers(low, high), st.integers(low, high))
    return {
        "eq": st.integers(max(low, 2), high).map(lambda n: (n, n)),
        "lt": pairs.filter(lambda p: p[0] < p[1]),
        "gt": pairs.filter(lambda p: p[0] > p[1]),
    }[rel]


def _with(sizes, kwargs_of):
    return sizes.flatmap(lambda p: kwargs_of(*p).map(lambda kw: (p[0], p[1], kw)))


BR = {"align": "bottom_right"}
ex1 = Exercise(
    "ex1",
    "causal_mask",
    '(Nq, Nk, align="top_left", device=None, window=None)',
    "Exercise 1 · causal_mask",
    causal_mask,
    ("mask",),
    [
        CaseClass(
            "Nq = Nk and align, window are left at their defaults",
            _with(_sizes("eq"), lambda q, k: st.just({})),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            "there are fewer queries than keys (Nq < Nk, top_left)",
            _with(_sizes("lt"), lambda q, k: st.just({})),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            "there are more queries than keys (Nq > Nk, top_left)",
            _with(_sizes("gt"), lambda q, k: st.just({})),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            "align and window are passed as their defaults ('top_left', None)",
            _with(_sizes("lt"), lambda q, k: st.just({"align": "top_left", "window": None})),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            "align='bottom_right' with Nq < Nk (a KV cache)",
            _with(_sizes("lt"), lambda q, k: st.just(BR)),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            "align='bottom_right' with Nq > Nk (the first queries see no key)",
            _with(_sizes("gt"), lambda q, k: st.just(BR)),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            "a window is given (top_left, 2 ≤ window < Nk)",
            _with(
                st.tuples(st.integers(3, 7), st.integers(3, 7)).filter(lambda p: p[0] != p[1]),
                lambda q, k: st.just({"window": 2 + (q + k) % (k - 2)}),
            ),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            "a window is given with align='bottom_right'",
            _with(
                # window ≤ Nq here: a window between Nq and Nk is the next class
                st.tuples(st.integers(2, 6), st.integers(3, 7)).filter(
                    lambda p: p[0] != p[1] and 2 + (p[0] + p[1]) % (p[1] - 2) <= p[0]
                ),
                lambda q, k: st.just({"align": "bottom_right", "window": 2 + (q + k) % (k - 2)}),
            ),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            "a window between Nq and Nk with align='bottom_right' (Nq < window < Nk)",
            _with(
                st.tuples(st.integers(1, 4), st.integers(4, 8)).filter(lambda p: p[1] - p[0] >= 2),
                lambda q, k: st.just({"align": "bottom_right", "window": q + 1 + (q + k) % (k - q - 1)}),
            ),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            "window = 1 (the diagonal key alone, top_left)",
            _with(
                st.tuples(st.integers(2, 6), st.integers(2, 6)).filter(lambda p: p[0] != p[1]),
                lambda q, k: st.just({"window": 1}),
            ),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            # a newcomer's "window ≥ Nk: no window" kept every key for the last rows (top_left, Nq > Nk)
            "Nk ≤ window < Nq (top_left: the last rows lose their first keys)",
            _with(
                st.tuples(st.integers(4, 8), st.integers(2, 4)).filter(lambda p: p[0] > p[1] + 1),
                lambda q, k: st.integers(k, q - 2).map(lambda w: {"window": w}),
            ),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            "window ≥ Nk > Nq (no key is cut)",
            _with(
                st.tuples(st.integers(1, 5), st.integers(2, 6)).filter(lambda p: p[0] < p[1]),
                lambda q, k: st.just({"window": k + (q + k) % 3}),
            ),
            _mask_case,
            atol=0,
            rtol=0,
        ),
        CaseClass(
            # the meta device holds no values: this class sees where the mask is made, its shape and dtype
            "device='meta' is passed, with align='bottom_right' and a window (the mask is made there)",
            _with(_sizes("lt", low=2), lambda q, k: st.just({**BR, "window": 2, "device": "meta"})),
            _mask_case,
            atol=0,
            rtol=0,
        ),
    ],
    points=2,
    by_hand=("helpers.attention.causal_mask",),
)

# --------------------------------------------------------------------------- ex2


def attention_forward(Q, K, V, mask=None, Bias=None, scale=None):
    """(O, P): P the row softmax of Q Kᵀ·scale + Bias where mask allows (0 rows where nothing is
    allowed), O = P V."""
    if scale is None:
        scale = Q.shape[-1] ** -0.5
    S = torch.einsum("...qd,...kd->...qk", Q, K) * scale
    if Bias is not None:
        S = S + Bias
    if mask is not None:
        S = torch.where(mask, S, torch.tensor(float("-inf"), dtype=S.dtype))
    seen = torch.isfinite(S).any(-1, keepdim=True)  # (..., Nq, 1)
    P = torch.softmax(torch.where(seen, S, torch.zeros_like(S)), dim=-1) * seen
    return torch.einsum("...qk,...kv->...qv", P, V), P


def _qkv(lead, Nq, Nk, d, dv, seed, dtype=F64):
    Q = randn(*lead, Nq, d, seed=seed, dtype=dtype)
    K = randn(*lead, Nk, d, seed=seed + 1, dtype=dtype)
    V = randn(*lead, Nk, dv, seed=seed + 2, dtype=dtype)
    return Q, K, V


def _per_head(H, seed, dtype=F64):
    """(H, 1, 1) temperatures, all different (0.3–1.8)."""
    g = torch.Generator().manual_seed(seed)
    return (0.3 + 1.5 * torch.rand(H, generator=g, dtype=F64)).to(dtype)[:, None, None]


def _fwd(p, seed, kind):
    """A (B, H, Nq, Nk) forward case of one kind (mask, Bias, scale as the class promises)."""
    B, H, Nq, Nk, d, dv = p
    dtype = F32 if kind in ("f32", "f32_low") else F64
    lead = () if kind == "2d" else (B, H)
    Q, K, V = _qkv(lead, Nq, Nk, d, dv, seed, dtype)
    mask, Bias, scale = None, None, None
    causal = causal_mask(Nq, Nk)
    if kind == "float":
        scale = 0.3 + 0.1 * (seed % 7)
    elif kind == "per_head":
        scale = _per_head(H, seed + 3)
    elif kind == "bias":
        Bias = randn(H, Nq, Nk, seed=seed + 4, dtype=dtype)
    elif kind == "bias_keys":
        Bias = randn(H, 1, Nk, seed=seed + 4, dtype=dtype)
    elif kind == "causal":
        mask = causal
    elif kind == "padding":
        pad = torch.zeros(B, Nk, dtype=torch.bool)
        pad[1:, Nk // 2 :] = True  # batch rows 1… lose their last keys
        mask = ~pad[:, None, None, :]
    elif kind == "no_key":
        mask = causal.clone()
        mask[0] = False  # query 0 sees nothing
    elif kind == "masked_high":  # a masked score far above the visible ones
        mask = causal
        Bias = torch.where(causal, torch.zeros(Nq, Nk, dtype=dtype), torch.full((Nq, Nk), 1e3, dtype=dtype))
    elif kind == "visible_low":  # every visible score far below 0: −100 in place of −∞ leaks
        mask = causal
        Bias = torch.full((H, Nq, Nk), -200.0, dtype=dtype) + randn(H, Nq, Nk, seed=seed + 4, dtype=dtype)
    elif kind == "f32_low":  # float32: e^(−200) underflows, so only the visible max can be subtracted
        mask = causal
        low = torch.full((H, Nq, Nk), -200.0, dtype=dtype) + randn(H, Nq, Nk, seed=seed + 4, dtype=dtype)
        Bias = torch.where(causal, low, torch.full_like(low, 1e3))
    elif kind == "large":  # a shift of every score: softmax unchanged, exp(S) overflows
        Bias = torch.tensor(1e3, dtype=dtype)
    elif kind == "rows_apart":  # query rows of one head alternately near +1300 and −200: a max per row
        rows = torch.arange(Nq, dtype=dtype)[:, None] + torch.arange(H, dtype=dtype)[:, None, None]
        Bias = 1500.0 * (rows % 2) - 200.0 + randn(H, Nq, Nk, seed=seed + 4, dtype=dtype)
    elif kind == "heads_apart":  # head 0 near +10³, the others near −200: one max for all underflows
        Bias = torch.full((H, 1, 1), -200.0, dtype=dtype)
        Bias[0] = 1e3
        Bias = Bias + randn(H, Nq, Nk, seed=seed + 4, dtype=dtype)
    kwargs = {}
    if mask is not None:
        kwargs["mask"] = mask
    if Bias is not None:
        kwargs["Bias"] = Bias
    if scale is not None:
        kwargs["scale"] = scale
    return Case((Q, K, V), kwargs=kwargs)


def _fwd_sizes(rel="any"):
    bh = st.tuples(st.integers(2, 3), st.integers(2, 3))
    n = st.tuples(st.integers(2, 6), st.integers(2, 6))
    n = {
        "any": n,
        "eq": st.integers(2, 6).map(lambda k: (k, k)),
        "ne": n.filter(lambda p: p[0] != p[1]),
        "lt": n.filter(lambda p: p[0] < p[1]),
        "gt": n.filter(lambda p: p[0] > p[1]),
    }[rel]
    dd = st.tuples(st.integers(2, 5), st.integers(2, 5)).filter(lambda p: p[0] != p[1])
    return st.tuples(bh, n, dd).map(lambda t: (*t[0], *t[1], *t[2]))


def _fwd_class(name, kind, rel="any", **tol):
    return CaseClass(name, _fwd_sizes(rel), lambda p, s: _fwd(p, s, kind), **(tol or TOL))


ex2 = Exercise(
    "ex2",
    "attention_forward",
    "(Q, K, V, mask=None, Bias=None, scale=None)",
    "Exercise 2 · attention_forward",
    attention_forward,
    ("O", "P"),
    [
        _fwd_class("mask, Bias and scale are left at None (scale 1/√d)", "plain"),
        _fwd_class("there are fewer queries than keys (Nq < Nk)", "plain", "lt"),
        _fwd_class("there are more queries than keys (Nq > Nk)", "plain", "gt"),
        _fwd_class("Q, K, V are 2-D (N, d): no batch dims", "2d"),
        _fwd_class("scale is a Python float", "float"),
        _fwd_class("scale is a tensor, one per head (H, 1, 1)", "per_head"),
        _fwd_class("Bias is shared by the batch (H, Nq, Nk)", "bias"),
        _fwd_class("Bias broadcasts over the queries (H, 1, Nk)", "bias_keys"),
        _fwd_class("mask is causal (Nq, Nk), shared by batch and heads", "causal"),
        _fwd_class("mask pads keys per batch row (B, 1, 1, Nk)", "padding"),
        _fwd_class("a query sees no key (its rows of P and O are 0, not NaN)", "no_key"),
        _fwd_class("every score is near +10³ (Bias = 10³): exp must not overflow", "large"),
        _fwd_class("heads' scores lie far apart (head 0 near +10³, the others near −200)", "heads_apart"),
        _fwd_class("query rows' scores lie far apart (alternately near +1300 and −200)", "rows_apart", "gt"),
        _fwd_class("a masked score is far above the visible ones (Bias +10³ where masked)", "masked_high"),
        _fwd_class("every visible score is far below 0 (Bias ≈ −200): masked means −∞", "visible_low"),
        _fwd_class("Q, K, V are float32", "f32", atol=1e-5, rtol=1e-5),
        _fwd_class(
            "every visible score near −200 and a masked one at +10³, in float32 (subtract the visible max)",
            "f32_low",
            atol=1e-5,
            rtol=1e-5,
        ),
    ],
    points=2,
    by_hand=(
        "helpers.attention.masked_softmax",
        "helpers.attention.attention_forward",
        "torch.nn.functional.scaled_dot_product_attention",
    ),
)

# --------------------------------------------------------------------------- ex3


def _sum_to(t, shape):
    """t summed over the dims a tensor of `shape` was broadcast along."""
    shape = tuple(shape)
    lead = t.dim() - len(shape)
    t = t.sum(tuple(range(lead))) if lead else t
    dims = tuple(i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1)
    return t.sum(dims, keepdim=True) if dims else t


def attention_backward(Q, K, V, P, grad_O, scale, Bias):
    """(grad_Q, grad_K, grad_V, grad_scale, grad_Bias) of O = softmax(Q Kᵀ·scale + Bias) V."""
    grad_V = torch.einsum("...qk,...qv->...kv", P, grad_O)
    grad_P = torch.einsum("...qv,...kv->...qk", grad_O, V)
    grad_S = P * grad_P - P * (P * grad_P).sum(-1, keepdim=True)
    A = torch.einsum("...qd,...kd->...qk", Q, K)
    grad_Q = torch.einsum("...qk,...kd->...qd", grad_S * scale, K)
    grad_K = torch.einsum("...qk,...qd->...kd", grad_S * scale, Q)
    return grad_Q, grad_K, grad_V, _sum_to(grad_S * A, scale.shape), _sum_to(grad_S, Bias.shape)


def _bwd(p, seed, kind):
    B, H, Nq, Nk, d, dv = p
    lead = (B,) if kind == "3d" else (B, H)
    Q, K, V = _qkv(lead, Nq, Nk, d, dv, seed)
    grad_O = randn(*lead, Nq, dv, seed=seed + 3, dtype=F64)
    scale = torch.tensor(0.25 + 0.05 * (seed % 9), dtype=F64)
    bias_shape = {
        "full": (*lead, Nq, Nk),
        "bias_keys": (H, 1, Nk),
        "bias_qk": (Nq, Nk),
        "3d": (Nq, Nk),
    }.get(kind, (H, Nq, Nk))
    Bias = randn(*bias_shape, seed=seed + 4, dtype=F64)
    if kind == "per_head":
        scale = _per_head(H, seed + 5)
    mask = None
    if kind == "masked":
        mask = causal_mask(Nq, Nk, align="bottom_right", window=2)
        mask[0] = False  # a query that saw no key: a row of zeros in P
    _, P = attention_forward(Q, K, V, mask, Bias, scale)
    factors = {"scale": scale, "scale²": scale**2}
    if kind not in ("full",):
        factors["B"] = B
    return Case((Q, K, V, P, grad_O, scale, Bias), factors=factors)


def _bwd_class(name, kind, rel="any"):
    return CaseClass(name, _fwd_sizes(rel), lambda p, s: _bwd(p, s, kind), **TOL)


ex3 = Exercise(
    "ex3",
    "attention_backward",
    "(Q, K, V, P, grad_O, scale, Bias)",
    "Exercise 3 · attention_backward",
    attention_backward,
    ("grad_Q", "grad_K", "grad_V", "grad_scale", "grad_Bias"),
    [
        _bwd_class("scale is 0-dim and Bias is full size (B, H, Nq, Nk): grad_Bias is dS", "full"),
        _bwd_class("scale is a tensor, one per head (H, 1, 1)", "per_head"),
        _bwd_class("Bias is shared by the batch (H, Nq, Nk)", "plain"),
        _bwd_class("Bias broadcasts over the queries (H, 1, Nk)", "bias_keys"),
        _bwd_class("Bias is (Nq, Nk), shared by batch and heads", "bias_qk"),
        _bwd_class("there are fewer queries than keys (Nq < Nk)", "plain", "lt"),
        _bwd_class("there are more queries than keys (Nq > Nk)", "plain", "gt"),
        _bwd_class("P comes from a masked forward (zeros, a row of zeros)", "masked"),
        _bwd_class("Q, K, V are 3-D (B, N, d): no head dim", "3d"),
        large_class(
            "B = H = 2, Nq = Nk = 16, d = 8", lambda s: _bwd((2, 2, 16, 16, 8, 8), s, "plain"), **TOL
        ),
    ],
    points=3,
    by_hand=("autograd", "helpers.attention.attention_backward", "helpers.functions.softmax_backward"),
    rules={
        "largest": 1.5
    },  # "the vector–Jacobian product, never its N × N Jacobian" (an Nk-fold larger tensor)
)

# --------------------------------------------------------------------------- ex4


def attention_grads(
    Q, K, V, Bias, scale, grad_O, causal=False, key_padding_mask=None, align="top_left", window=None
):
    """The five gradients of attention masked by a causal mask (if causal) and a key padding mask."""
    keep = torch.ones(*Q.shape[:-2], Q.shape[-2], K.shape[-2], dtype=torch.bool)  # (B, H, Nq, Nk)
    if causal:
        keep = keep & causal_mask(Q.shape[-2], K.shape[-2], align, window=window)
    if key_padding_mask is not None:
        keep = keep & ~key_padding_mask.reshape(keep.shape[0], 1, 1, -1)
    _, P = attention_forward(Q, K, V, keep, Bias, scale)
    return attention_backward(Q, K, V, P, grad_O, scale, Bias)


def _grads(p, seed, kind):
    B, H, Nq, Nk, d, dv = p
    Q, K, V = _qkv((B, H), Nq, Nk, d, dv, seed)
    grad_O = randn(B, H, Nq, dv, seed=seed + 3, dtype=F64)
    scale, Bias = _per_head(H, seed + 5), randn(H, Nq, Nk, seed=seed + 4, dtype=F64)
    if kind == "scalar":
        scale, Bias = torch.tensor(0.45, dtype=F64), randn(Nq, Nk, seed=seed + 4, dtype=F64)
    pad = torch.zeros(B, Nk, dtype=torch.bool)
    pad[1, Nk // 2 :] = True  # batch row 1 loses its last keys (key 0 stays)
    pad_all = torch.zeros(B, Nk, dtype=torch.bool)
    pad_all[-1] = True  # the last batch row has no key at all
    kw = {
        "plain": {},
        "scalar": {"causal": True},
        "causal": {"causal": True},
        "br": {"causal": True, "align": "bottom_right"},
        "window": {"causal": True, "window": 2},
        "br_window": {"causal": True, "align": "bottom_right", "window": 2},
        "pad": {"key_padding_mask": pad},
        "causal_pad": {"causal": True, "key_padding_mask": pad},
        "pad_all": {"causal": True, "key_padding_mask": pad_all},
        "not_causal": {"causal": False, "align": "bottom_right", "window": 1},
    }[kind]
    args = (Q, K, V, Bias, scale, grad_O)
    if "key_padding_mask" in kw:  # positional: a mask written into is then seen (kwargs are not copied)
        args, kw = args + (kw.pop("causal", False), kw.pop("key_padding_mask")), kw
    return Case(args, kwargs=kw, factors={"scale": scale, "B": B})


def _grads_class(name, kind, rel="ne"):  # Nq ≠ Nk unless a class says otherwise
    sizes = _fwd_sizes(rel)
    if "window" in kind:  # Nk ≥ 3: a window of 2 leaves some row two keys (else P is one-hot)
        sizes = sizes.filter(lambda p: p[3] >= 3)
    return CaseClass(name, sizes, lambda p, s: _grads(p, s, kind), **TOL)


ex4 = Exercise(
    "ex4",
    "attention_grads",
    '(\n    Q,\n    K,\n    V,\n    Bias,\n    scale,\n    grad_O,\n    causal=False,\n    key_padding_mask=None,\n    align="top_left",\n    window=None,\n)',
    "Exercise 4 · attention_grads",
    attention_grads,
    ("grad_Q", "grad_K", "grad_V", "grad_scale", "grad_Bias"),
    [
        _grads_class("causal and key_padding_mask are left at their defaults (no mask)", "plain"),
        _grads_class("causal=True with Nq = Nk", "causal", "eq"),
        _grads_class("causal=True with Nq < Nk (top-left, SDPA's is_causal)", "causal", "lt"),
        _grads_class("causal=True with Nq > Nk", "causal", "gt"),
        _grads_class("causal=True, align='bottom_right' (Nq < Nk)", "br", "lt"),
        _grads_class("causal=True with a window (top_left)", "window"),
        _grads_class("causal=True, align='bottom_right' and a window", "br_window", "lt"),
        _grads_class("key_padding_mask pads keys, causal=False", "pad"),
        _grads_class("causal=True and key_padding_mask pads keys", "causal_pad"),
        _grads_class("key_padding_mask pads every key of a batch row (zeros, no NaN)", "pad_all"),
        _grads_class("causal=False with align and window given (no mask at all)", "not_causal"),
        _grads_class("scale is 0-dim and Bias is (Nq, Nk)", "scalar"),
        large_class(
            "B = H = 2, Nq = 8, Nk = 12, d = 8, causal",
            lambda s: _grads((2, 2, 8, 12, 8, 8), s, "causal"),
            **TOL,
        ),
    ],
    calls=("ex1", "ex2", "ex3"),
    points=3,
    by_hand=(
        "autograd",
        "helpers.attention.attention",
        "helpers.attention.mha_backward",
        "helpers.attention.attention_backward",
        "helpers.functions.softmax_backward",
    ),
)

CONTRACT = Contract(LAB, [ex1, ex2, ex3, ex4], base_seed=60_000)


# ---------------------------------------------------------------- the catalog's mutants of ex4


def _with_earlier_solutions():
    """contract.solution_function runs the setup and one question's solution cells; exercise 4's
    solution calls exercises 1-3's functions, so this lab's setup also runs their solutions (an
    earlier question's mutant redefines its own function after them). A workaround here, not in
    contract.py, which other labs share."""

    import contract

    for module in (contract,):  # loaded once, by helpers.labcontract.instructor_module
        chained = module.__dict__.setdefault("_chained_labs", set())
        chained.add(LAB)
        if getattr(module._solutions, "chains", False):
            continue

        def _solutions(lab, plain=module._solutions, chained=chained):
            setup, sols = plain(lab)
            if lab in chained:
                setup = setup + [code for q in sols for code in sols[q]]
            return setup, sols

        _solutions.chains = True
        module._solutions = _solutions


_with_earlier_solutions()
