"""Lab 5's contract: each exercise's reference and its case classes, one per promise of its prompt.

The prompts promise (labs/source/src/lab05_losses_and_flow.py):

* ex1 ``ce_grad(logits, target, ignore_index=-100, label_smoothing=0.0)``: ``logits`` (R, C) in
  float32 or float64, int64 ``target`` (R,); the gradient of ``F.cross_entropy`` with the given
  ``ignore_index`` (its default −100, another negative value, a value ≥ C, or a class index
  0 ≤ ignore_index < C: rows whose target equals it are left out) and ``label_smoothing`` (its
  default 0, or ε > 0, also together with ignored rows); every row ignored gives an all-zero
  gradient; large logits (|z| ~ 1e3) give a finite gradient; the logits' dtype kept.
* ex2 ``record_output_grad_norms(model, X, y)``: {name: float} over the model's leaf modules
  (``named_modules`` names: "0", "1", … in an ``nn.Sequential``, "blocks.0.linear", … when
  nested), a leaf whose output needs no gradient (a parameter-free first layer) has no entry,
  LayerNorm and residual blocks, float32 or float64; every hook removed afterwards.
* ex3 ``steepest_drop(norms, names)``: the name (a str of ``names``) of the layer i ≥ 1 with the
  smallest ratio leaves / enters, ``names`` in forward order, ``norms`` in any order (a recorder
  fills it backward), names that sort otherwise ("blocks.1.act" < "blocks.1.linear", "10" < "2"),
  a profile whose largest absolute drop is elsewhere, one with no collapse whose smallest norm is
  at the head.
* ex4 ``clip_by_global_norm(params, max_norm)``: the global norm over the parameters whose
  ``.grad`` is not None (as a 0-dim tensor of the gradients' dtype), every ``.grad`` scaled in
  place by max_norm / (‖g‖ + 1e-6) when ‖g‖ > max_norm, untouched below it; one parameter or
  several of different shapes, parameters without a gradient skipped (left None), gradients of
  ‖g‖ ~ 1e-5 (the 1e-6 matters), all-zero gradients, float32.

The answers of ex2 and ex4 are judged through probes (helpers.labcontract): ex2's model is a
``Made`` object, built fresh for every call, and the probe counts the hooks left on it; ex4's
parameters are leaves built from recorded gradients, and the probe returns the norm, the
gradients after the call and whether every ``.grad`` is still the same tensor.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import torch
import torch.nn.functional as F
from contract import Case, CaseClass, Contract, Exercise, large_class

from helpers.device import randn
from helpers.labcontract import Made

F64, F32 = torch.float64, torch.float32

# --------------------------------------------------------------------------- ex1


def ce_grad(logits, target, ignore_index=-100, label_smoothing=0.0):
    """∂L/∂logits of F.cross_entropy(logits, target, ignore_index, label_smoothing), mean over kept rows."""
    C = logits.shape[-1]
    kept = (target != ignore_index).to(logits.dtype)  # (R,)
    q = torch.full_like(logits, label_smoothing / C)  # (R, C)
    rows = torch.arange(len(target))
    classes = torch.where(target == ignore_index, torch.zeros_like(target), target)
    q[rows, classes] += 1 - label_smoothing
    N = kept.sum().clamp(min=1)  # every row ignored: a zero gradient, as autograd gives
    return (logits.softmax(-1) - q) * kept[:, None] / N


def _ce(R, C, seed, ignored=(), ignore_index=None, eps=None, scale=2.0, dtype=F64) -> Case:
    """logits (R, C) × scale; target drawn in [0, C); rows in ``ignored`` set to ignore_index."""
    logits = randn(R, C, seed=seed, dtype=dtype) * scale
    g = torch.Generator().manual_seed(seed + 1)
    target = torch.randint(0, C, (R,), generator=g)
    skip = -100 if ignore_index is None else ignore_index
    if 0 <= skip < C:  # ignore_index a class: only the rows in `ignored` have it
        target = torch.where(target == skip, (target + 1) % C, target)
    for r in ignored:
        target[r] = skip
    kwargs = {}
    if ignore_index is not None:
        kwargs["ignore_index"] = ignore_index
    if eps is not None:
        kwargs["label_smoothing"] = eps
    N = R - len(set(ignored))
    factors = {"N": N} if N > 1 else {}
    if 0 < N < R:
        factors["N/R"] = N / R
    return Case((logits, target), kwargs, factors=factors)


def _some_rows(R: int):
    """A non-empty set of rows to ignore, not all of them."""
    return st.lists(st.integers(0, R - 1), min_size=1, max_size=R - 1, unique=True).map(sorted)


RC = st.tuples(st.integers(4, 9), st.integers(3, 7))
with_rows = RC.flatmap(lambda p: st.tuples(st.just(p), _some_rows(p[0])))
EPS = st.sampled_from([0.05, 0.1, 0.2, 0.3])
TOL = {"atol": 1e-12, "rtol": 1e-9}

ex1 = Exercise(
    "ex1",
    "ce_grad",
    "(logits, target, ignore_index=-100, label_smoothing=0.0)",
    "Exercise 1 · ce_grad",
    ce_grad,
    ("grad_logits",),
    [
        CaseClass(
            "nothing is ignored, label_smoothing at its default (0)",
            RC,
            lambda p, s: _ce(*p, s),
            **TOL,
        ),
        CaseClass(
            "label_smoothing > 0 (ε = 0.05–0.3)",
            st.tuples(RC, EPS),
            lambda p, s: _ce(*p[0], s, eps=p[1]),
            **TOL,
        ),
        CaseClass(
            "some targets are -100 (the default ignore_index)",
            with_rows,
            lambda p, s: _ce(*p[0], s, ignored=p[1]),
            **TOL,
        ),
        CaseClass(
            "ignore_index is another negative value (-1, -7)",
            with_rows.flatmap(lambda p: st.tuples(st.just(p), st.sampled_from([-1, -7]))),
            lambda p, s: _ce(*p[0][0], s, ignored=p[0][1], ignore_index=p[1]),
            **TOL,
        ),
        CaseClass(
            "ignore_index is ≥ C (a value no class has)",
            with_rows.flatmap(lambda p: st.tuples(st.just(p), st.sampled_from([p[0][1], p[0][1] + 3, 255]))),
            lambda p, s: _ce(*p[0][0], s, ignored=p[0][1], ignore_index=p[1]),
            **TOL,
        ),
        CaseClass(
            "ignore_index is a class index (0 ≤ ignore_index < C)",
            with_rows.flatmap(lambda p: st.tuples(st.just(p), st.integers(0, p[0][1] - 1))),
            lambda p, s: _ce(*p[0][0], s, ignored=p[0][1], ignore_index=p[1]),
            **TOL,
        ),
        CaseClass(
            "rows are ignored and label_smoothing > 0",
            st.tuples(with_rows, EPS),
            lambda p, s: _ce(*p[0][0], s, ignored=p[0][1], eps=p[1]),
            **TOL,
        ),
        CaseClass(
            "every row is ignored (the gradient is all zeros)",
            st.tuples(RC, st.sampled_from([None, 0.1])),
            lambda p, s: _ce(*p[0], s, ignored=range(p[0][0]), eps=p[1]),
            **TOL,
        ),
        CaseClass(
            "the logits are large (|z| ~ 1e3)",
            st.tuples(RC, st.sampled_from([500.0, 1000.0, 3000.0])),
            lambda p, s: _ce(*p[0], s, scale=p[1]),
            **TOL,
        ),
        CaseClass(
            "the logits are float32",
            st.tuples(with_rows, EPS),
            lambda p, s: _ce(*p[0][0], s, ignored=p[0][1], eps=p[1], dtype=F32),
            atol=1e-6,
            rtol=1e-5,
        ),
        large_class(
            "logits (16, 64), label_smoothing 0.1", lambda s: _ce(16, 64, s, ignored=(1, 5), eps=0.1), **TOL
        ),
    ],
    points=2,
    by_hand=("autograd", "helpers.functions.cross_entropy_backward"),
)

# --------------------------------------------------------------------------- ex2


def record_output_grad_norms(model, X, y):
    """{leaf module name: ‖∂L/∂(its output)‖} for L = F.cross_entropy(model(X), y); no hook left."""
    norms: dict = {}
    handles = []

    def watch(name):
        def on_forward(module, inputs, output):
            if output.requires_grad:
                output.register_hook(lambda g: norms.__setitem__(name, g.norm().item()))

        return on_forward

    try:
        for name, module in model.named_modules():
            if name and next(module.children(), None) is None:
                handles.append(module.register_forward_hook(watch(name)))
        F.cross_entropy(model(X), y).backward()
    finally:
        for h in handles:
            h.remove()
    return norms


def _sequential(sizes, seed: int, first=None) -> Made:
    """Linear → ReLU → … → Linear (float64, weights from the seed), after ``first`` if given."""
    layers = [] if first is None else [first]
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        W = randn(b, a, seed=seed + 2 * i, dtype=F64) / math.sqrt(a)
        bias = randn(b, seed=seed + 2 * i + 1, dtype=F64) * 0.1
        layers.append(Made("torch.nn.Linear", a, b, dtype=F64, state={"weight": W, "bias": bias}))
        if i < len(sizes) - 2:
            layers.append(Made("torch.nn.ReLU"))
    return Made("torch.nn.Sequential", *layers)


def _batch(B: int, shape, C: int, seed: int, dtype=F64):
    X = randn(B, *shape, seed=seed, dtype=dtype)
    y = torch.randint(0, C, (B,), generator=torch.Generator().manual_seed(seed + 1))
    return X, y


def _seq_case(p, seed: int) -> Case:
    B, sizes = p
    X, y = _batch(B, (sizes[0],), sizes[-1], seed + 7)
    return Case((_sequential(sizes, seed), X, y))


def _flatten_case(p, seed: int) -> Case:
    B, (h, w), sizes = p
    X, y = _batch(B, (h, w), sizes[-1], seed + 7)
    return Case((_sequential((h * w, *sizes), seed, first=Made("torch.nn.Flatten")), X, y))


def _mlp_case(p, seed: int, **kind) -> Case:
    B, depth, width, C = p
    X, y = _batch(B, (width,), C, seed + 7, dtype=F32)
    model = Made("helpers.gradflow.deep_mlp", depth=depth, width=width, n_classes=C, seed=seed, **kind)
    return Case((model, X, y))


def _raising_case(p, seed: int) -> Case:
    """A flat model whose last label is the class count: cross_entropy raises after the forward ran."""
    B, sizes = p
    X, y = _batch(B, (sizes[0],), sizes[-1], seed + 7)
    y[-1] = sizes[-1]
    return Case((_sequential(sizes, seed), X, y), options={"raises": True})


sizes = st.lists(st.integers(3, 8), min_size=3, max_size=5).map(tuple)
mlp = st.tuples(st.integers(3, 12), st.integers(2, 4), st.integers(4, 10), st.integers(3, 6))
NORM_TOL = {"atol": 1e-9, "rtol": 1e-6}
ex2 = Exercise(
    "ex2",
    "record_output_grad_norms",
    "(model, X, y)",
    "Exercise 2 · record_output_grad_norms",
    record_output_grad_norms,
    ("norms",),
    [
        CaseClass(
            "the model is a flat nn.Sequential",
            st.tuples(st.integers(3, 12), sizes),
            _seq_case,
            **NORM_TOL,
        ),
        CaseClass(
            "layers are nested ('blocks.0.linear')",
            mlp,
            lambda p, s: _mlp_case(p, s, activation="relu"),
            **NORM_TOL,
        ),
        CaseClass(
            "blocks have LayerNorm and a residual",
            mlp,
            lambda p, s: _mlp_case(p, s, activation="tanh", residual=True, layernorm=True),
            **NORM_TOL,
        ),
        CaseClass(
            "the first layer's output needs no grad",
            st.tuples(
                st.integers(3, 12),
                st.tuples(st.integers(2, 3), st.integers(2, 3)),
                st.lists(st.integers(3, 8), min_size=2, max_size=3).map(tuple),
            ),
            _flatten_case,
            **NORM_TOL,
        ),
        CaseClass(
            "the loss raises (a label out of range): the error passes on, no hook left",
            st.tuples(st.integers(3, 12), sizes),
            _raising_case,
            **NORM_TOL,
        ),
    ],
    probe="recorded_and_hooks_left",
    points=3,
    # the prompt's method is a forward hook and a tensor hook: a module's backward hook is another one
    # the course's recorder, by its function or its class (a newcomer's GradFlowRecorder got ✓ here)
    by_hand=(
        "helpers.gradflow.record_grad_flow",
        "helpers.gradflow.GradFlowRecorder",
        "torch.nn.Module.register_full_backward_hook",
        "torch.Tensor.retain_grad",
    ),
)

# --------------------------------------------------------------------------- ex3


def steepest_drop(norms, names):
    """The name names[i], i ≥ 1, whose ratio norms[names[i − 1]] / norms[names[i]] is the smallest."""
    best = min(range(1, len(names)), key=lambda i: norms[names[i - 1]] / norms[names[i]])
    return names[best]


def _profile(ratios, head: float) -> list[float]:
    """Norms in forward order from the head's norm and each layer i ≥ 1's ratio leaves/enters."""
    norms = [head]
    for r in reversed(ratios):
        norms.insert(0, norms[0] * r)
    return norms


def _drop_case(names, ratios, head, backward=False) -> Case:
    values = _profile(ratios, head)
    pairs = list(zip(names, values))
    if backward:  # as a recorder fills it: the head first
        pairs.reverse()
    return Case(({n: v for n, v in pairs}, list(names)))


def _plain_names(n: int) -> list[str]:
    return [f"layer{i}" for i in range(n)]  # sorted order is forward order (n ≤ 10)


HEALTHY = st.sampled_from([0.8, 0.85, 0.9, 0.95, 1.05, 1.1, 1.15, 1.2, 1.25])
COLLAPSE = st.sampled_from([1e-3, 3e-3, 1e-2, 2e-2])


def _collapse(n_low: int, n_high: int, where=None):
    """(number of layers, index of the collapse (1 ≤ k ≤ n − 2; ``where``: "first" k = 1, "last" k = n − 1,
    the ends of the index a loop over the layers must reach), ratios of the layers 1…n−1, head)."""
    index = {"first": lambda n: st.just(1), "last": lambda n: st.just(n - 1)}.get(
        where, lambda n: st.integers(1, n - 2)
    )
    return st.integers(n_low, n_high).flatmap(
        lambda n: st.tuples(
            st.just(n),
            index(n),
            st.lists(HEALTHY, min_size=n - 1, max_size=n - 1),
            COLLAPSE,
            st.sampled_from([0.5, 1.0, 3.0]),
        )
    )


def _ratios(p) -> list[float]:
    n, k, healthy, drop, _ = p
    return [drop if i == k else healthy[i - 1] for i in range(1, n)]


def _order_matters(p) -> bool:
    """In backward order, walking norms as they come (not names) names another layer than the collapse."""
    names = _plain_names(p[0])
    given = dict(zip(names, _profile(_ratios(p), p[4])))
    came = list(reversed(names))
    walked = min(range(1, len(came)), key=lambda i: given[came[i - 1]] / given[came[i]])
    return came[walked] != names[p[1]]


def _mlp_names(depth: int) -> list[str]:
    return [f"blocks.{j}.{part}" for j in range(depth) for part in ("linear", "act")] + ["head"]


def _grows(n: int):
    """Ratios all > 1 (the gradient grows towards the input), the smallest at 2 ≤ k ≤ n − 2: never the
    first layer a ratio has, where a fallback to names[1] is right by chance (a newcomer's ✓)."""
    return st.tuples(
        st.integers(2, n - 2),
        st.lists(st.sampled_from([1.5, 2.0, 2.5, 3.0, 4.0]), min_size=n - 1, max_size=n - 1),
    ).map(lambda p: (n, p[0], [1.2 if i == p[0] else r for i, r in enumerate(p[1], start=1)]))


ex3 = Exercise(
    "ex3",
    "steepest_drop",
    "(norms, names)",
    "Exercise 3 · steepest_drop",
    steepest_drop,
    ("layer",),
    [
        CaseClass(
            "one layer collapses, norms in forward order",
            _collapse(4, 8),
            lambda p, s: _drop_case(_plain_names(p[0]), _ratios(p), p[4]),
        ),
        *[
            CaseClass(
                name,
                _collapse(4, 8, where),
                lambda p, s: _drop_case(_plain_names(p[0]), _ratios(p), p[4]),
            )
            for name, where in (
                ("the collapse is at the first layer a ratio has (i = 1)", "first"),
                ("the collapse is at the last layer (i = n − 1, the head)", "last"),
            )
        ],
        CaseClass(
            "norms come in backward order (head first)",
            _collapse(4, 8).filter(_order_matters),
            lambda p, s: _drop_case(_plain_names(p[0]), _ratios(p), p[4], backward=True),
        ),
        CaseClass(
            "names sort otherwise ('blocks.1.act' first)",
            st.tuples(st.integers(2, 4), st.sampled_from([1e-3, 1e-2]), st.integers(1, 3)).filter(
                lambda p: p[2] < p[0]
            ),
            lambda p, s: _drop_case(
                _mlp_names(p[0]),
                [p[1] if i == 2 * p[2] else 0.9 + 0.05 * (i % 3) for i in range(1, 2 * p[0] + 1)],
                1.0,
            ),
        ),
        CaseClass(
            "10+ layers named '0', '1', … ('10' < '2')",
            st.tuples(st.integers(11, 14), st.integers(3, 9), COLLAPSE),
            lambda p, s: _drop_case(
                [str(i) for i in range(p[0])],
                [p[2] if i == p[1] else 0.9 + 0.05 * (i % 4) for i in range(1, p[0])],
                1.0,
            ),
        ),
        CaseClass(
            "the largest drop in absolute terms is elsewhere",
            st.integers(4, 7).flatmap(
                lambda n: st.tuples(
                    st.just(n),
                    st.integers(1, n - 2),
                    st.lists(st.sampled_from([0.25, 0.3, 0.35, 0.4]), min_size=n - 1, max_size=n - 1),
                    st.sampled_from([0.02, 0.03, 0.05]),
                    st.just(1000.0),
                )
            ),
            lambda p, s: _drop_case(_plain_names(p[0]), _ratios(p), p[4]),
        ),
        CaseClass(
            "no collapse, the head's norm is the smallest",
            st.integers(4, 7).flatmap(_grows),
            lambda p, s: _drop_case(_plain_names(p[0]), p[2], 0.1),
        ),
    ],
    points=2,
)

# --------------------------------------------------------------------------- ex4


def clip_by_global_norm(params, max_norm):
    """‖g‖ over the parameters' .grad (None skipped); above max_norm, every .grad scaled in place."""
    grads = [p.grad for p in params if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in grads]))
    factor = max_norm / (total + 1e-6)
    if factor < 1:  # ‖g‖ above max_norm (by more than the 1e-6), as clip_grad_norm_ decides
        for g in grads:
            g.mul_(factor.to(g.dtype))
    return total.to(grads[0].dtype)


def _grads(shapes, seed: int, scale=1.0, dtype=F64, none=(), zero=False):
    """The recorded .grad of each parameter (a torch.Size for a parameter whose .grad is None)."""
    out = []
    for i, shape in enumerate(shapes):
        if i in none:
            out.append(torch.Size(shape))
        elif zero:
            out.append(torch.zeros(shape, dtype=dtype))
        else:
            out.append(randn(*shape, seed=seed + i, dtype=dtype) * scale)
    return out


def _global(grads) -> float:
    return math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads if isinstance(g, torch.Tensor)))


def _clip_case(shapes, seed: int, fraction: float, offset: float = 0.0, **kw) -> Case:
    """max_norm = fraction × the global norm + offset (fraction below 1: clipping happens)."""
    grads = _grads(shapes, seed, **kw)
    total = _global(grads)
    max_norm = (fraction * total if total > 0 else fraction) + offset
    return Case((grads, max_norm), factors={"max_norm/‖g‖": max_norm / total} if total else {})


SHAPES = st.lists(
    st.sampled_from([(3, 4), (5,), (2, 3), (4,), (), (2, 2, 3), (6, 2)]), min_size=2, max_size=4
).map(tuple)
BELOW = st.sampled_from([0.1, 0.25, 0.5, 0.8])
CLIP_TOL = {"atol": 1e-12, "rtol": 1e-9}
ex4 = Exercise(
    "ex4",
    "clip_by_global_norm",
    "(params, max_norm)",
    "Exercise 4 · clip_by_global_norm",
    clip_by_global_norm,
    (
        "total",
        "None .grads filled in (a parameter without a gradient keeps .grad None)",
        "grads",
        "the number of .grad tensors replaced rather than scaled in place",
    ),
    [
        CaseClass(
            "‖g‖ exceeds max_norm (clipping happens)",
            st.tuples(SHAPES, BELOW),
            lambda p, s: _clip_case(p[0], s, p[1], scale=3.0),
            **CLIP_TOL,
        ),
        CaseClass(
            "‖g‖ is below max_norm (nothing changes)",
            st.tuples(SHAPES, st.sampled_from([1.5, 2.0, 10.0])),
            lambda p, s: _clip_case(p[0], s, p[1]),
            **CLIP_TOL,
        ),
        CaseClass(
            "there is one parameter",
            st.tuples(SHAPES.map(lambda t: t[:1]), BELOW),
            lambda p, s: _clip_case(p[0], s, p[1], scale=3.0),
            **CLIP_TOL,
        ),
        CaseClass(
            "a parameter's .grad is None (skipped)",
            st.tuples(SHAPES.filter(lambda t: len(t) >= 3), BELOW, st.integers(0, 1)),
            lambda p, s: _clip_case(p[0], s, p[1], scale=3.0, none=(p[2],)),
            **CLIP_TOL,
        ),
        CaseClass(
            "‖g‖ ~ 1e-5 (the + 1e-6 matters)",
            st.tuples(SHAPES, st.sampled_from([0.1, 0.2])),
            lambda p, s: _clip_case(p[0], s, p[1], scale=2e-6),
            **CLIP_TOL,
        ),
        CaseClass(
            # the decision's edge: max_norm / (‖g‖ + 1e-6) < 1 holds for ‖g‖ a hair below max_norm too
            "max_norm lies between ‖g‖ and ‖g‖ + 1e-6 (it still scales, by max_norm/(‖g‖ + 1e-6))",
            st.tuples(SHAPES, st.sampled_from([0.25, 0.5, 0.9]), st.sampled_from([2e-6, 1.0])),
            lambda p, s: _clip_case(p[0], s, 1.0, offset=p[1] * 1e-6, scale=p[2]),
            **CLIP_TOL,
        ),
        CaseClass(
            "every gradient is 0 (‖g‖ = 0)",
            st.tuples(SHAPES, st.sampled_from([0.5, 1.0])),
            lambda p, s: _clip_case(p[0], s, p[1], zero=True),
            **CLIP_TOL,
        ),
        CaseClass(
            "the gradients are float32",
            st.tuples(SHAPES, BELOW),
            lambda p, s: _clip_case(p[0], s, p[1], scale=3.0, dtype=F32),
            atol=1e-6,
            rtol=1e-5,
        ),
    ],
    probe="clipped_leaves",
    in_place=True,
    points=3,
    by_hand=("torch.nn.utils.clip_grad_norm_", "helpers.gradflow.clip_grad_norm"),
)

CONTRACT = Contract("lab05_losses_and_flow", [ex1, ex2, ex3, ex4], base_seed=50_000)
