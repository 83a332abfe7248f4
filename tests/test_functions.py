"""helpers.functions: every custom autograd.Function against torch's built-in and gradcheck.

Tolerances.  float32 forward and backward are compared with helpers.checks' float32
default, atol 1e-5 / rtol 1e-4: both sides round each O(1) value to 24 bits but sum in a
different order, so they agree to a few hundred ulps and no closer (the largest
difference seen here is about 1e-6).  gradcheck runs in float64 with its own defaults
(eps 1e-6, atol 1e-5, rtol 1e-3): central differences are accurate to ~eps², so a wrong
backward (an O(1) error) is far outside them.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck, gradgradcheck

import helpers.functions as hf
from helpers.checks import tolerance
from helpers.device import get_device, no_tf32, randn

no_tf32()
DEV = get_device()
ATOL32, RTOL32 = tolerance(torch.float32)  # (1e-5, 1e-4)


def _target(*shape, C, seed, ignore_every=0):
    """int64 class labels in [0, C), every `ignore_every`-th one set to -100."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, C, shape, generator=g)
    if ignore_every:
        t.view(-1)[::ignore_every] = -100
    return t.to(DEV)


class Case:
    """One Function under test: build(dtype) -> (args, indices of differentiable args)."""

    def __init__(self, name, ours, ref, build, n_out=1):
        self.name, self.ours, self.ref, self.build, self.n_out = name, ours, ref, build, n_out

    def __repr__(self):
        return self.name


def _r(*shape, seed, dtype):
    return randn(*shape, seed=seed, device=DEV, dtype=dtype)


T_CE = _target(6, C=5, seed=7)
T_CE_IGN = _target(6, C=5, seed=8, ignore_every=3)
T_CE_3D = _target(2, 3, C=5, seed=9, ignore_every=4)
MASK = hf.dropout_mask((2, 3, 4), 0.3, generator=11, device=DEV)

CASES = [
    Case(
        "linear",
        hf.linear,
        F.linear,
        lambda d: (
            [_r(2, 3, 5, seed=1, dtype=d), _r(4, 5, seed=2, dtype=d), _r(4, seed=3, dtype=d)],
            [0, 1, 2],
        ),
    ),
    Case(
        "linear_no_bias",
        lambda x, W: hf.linear(x, W),
        lambda x, W: F.linear(x, W),
        lambda d: ([_r(6, 5, seed=1, dtype=d), _r(4, 5, seed=2, dtype=d)], [0, 1]),
    ),
    Case("relu", hf.relu, torch.relu, lambda d: ([_r(3, 7, seed=4, dtype=d)], [0])),
    Case("gelu_erf", hf.gelu, F.gelu, lambda d: ([3 * _r(3, 7, seed=5, dtype=d)], [0])),
    Case(
        "gelu_tanh",
        lambda x: hf.gelu(x, "tanh"),
        lambda x: F.gelu(x, approximate="tanh"),
        lambda d: ([3 * _r(3, 7, seed=5, dtype=d)], [0]),
    ),
    Case(
        "softmax_last",
        lambda x: hf.softmax(x, -1),
        lambda x: torch.softmax(x, -1),
        lambda d: ([_r(2, 3, 6, seed=6, dtype=d)], [0]),
    ),
    Case(
        "softmax_dim1",
        lambda x: hf.softmax(x, 1),
        lambda x: torch.softmax(x, 1),
        lambda d: ([_r(2, 3, 6, seed=6, dtype=d)], [0]),
    ),
    Case(
        "log_softmax",
        lambda x: hf.log_softmax(x, -1),
        lambda x: torch.log_softmax(x, -1),
        lambda d: ([_r(4, 6, seed=7, dtype=d)], [0]),
    ),
    Case(
        "cross_entropy",
        lambda z: hf.cross_entropy(z, T_CE),
        lambda z: F.cross_entropy(z, T_CE),
        lambda d: ([2 * _r(6, 5, seed=8, dtype=d)], [0]),
        n_out=2,
    ),
    Case(
        "cross_entropy_ignore_smooth",
        lambda z: hf.cross_entropy(z, T_CE_IGN, ignore_index=-100, label_smoothing=0.1),
        lambda z: F.cross_entropy(z, T_CE_IGN, ignore_index=-100, label_smoothing=0.1),
        lambda d: ([2 * _r(6, 5, seed=9, dtype=d)], [0]),
        n_out=2,
    ),
    Case(
        "cross_entropy_3d_classes_last",
        lambda z: hf.cross_entropy(z, T_CE_3D, label_smoothing=0.2),
        lambda z: F.cross_entropy(z.reshape(-1, 5), T_CE_3D.reshape(-1), label_smoothing=0.2),
        lambda d: ([2 * _r(2, 3, 5, seed=10, dtype=d)], [0]),
        n_out=2,
    ),
    Case(
        "mse",
        hf.mse_loss,
        F.mse_loss,
        lambda d: ([_r(3, 4, seed=11, dtype=d), _r(3, 4, seed=12, dtype=d)], [0, 1]),
    ),
    Case(
        "layer_norm",
        lambda x, w, b: hf.layer_norm(x, w, b, 1e-5),
        lambda x, w, b: F.layer_norm(x, (6,), w, b, 1e-5),
        lambda d: (
            [2 * _r(2, 4, 6, seed=13, dtype=d) + 1, 1 + _r(6, seed=14, dtype=d), _r(6, seed=15, dtype=d)],
            [0, 1, 2],
        ),
        n_out=3,
    ),
    Case(
        "layer_norm_no_affine",
        lambda x: hf.layer_norm(x),
        lambda x: F.layer_norm(x, (6,)),
        lambda d: ([_r(5, 6, seed=16, dtype=d)], [0]),
        n_out=3,
    ),
    Case(
        "dropout_fixed_mask",
        lambda x: hf.dropout(x, 0.3, True, 11),
        lambda x: x * MASK / 0.7,
        lambda d: ([_r(2, 3, 4, seed=17, dtype=d)], [0]),
    ),
]
DOUBLE = ["linear", "linear_no_bias", "relu"]  # the Functions that claim double backward


def _upstream(y, seed):
    """A random grad_output shaped like y (a scalar too), not just ones."""
    return randn(max(y.numel(), 1), seed=seed, device=DEV, dtype=y.dtype).reshape(y.shape)


def _leaves(args, diff, which=None):
    """Detached copies; those in `which` (default: all of diff) require grad."""
    which = diff if which is None else which
    return [a.detach().clone().requires_grad_(i in which) for i, a in enumerate(args)]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_forward_matches_builtin_float32(case):
    args, _ = case.build(torch.float32)
    torch.testing.assert_close(case.ours(*args), case.ref(*args), atol=ATOL32, rtol=RTOL32)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_backward_matches_autograd_of_builtin_float32(case):
    args, diff = case.build(torch.float32)
    ours_in, ref_in = _leaves(args, diff), _leaves(args, diff)
    y_ours, y_ref = case.ours(*ours_in), case.ref(*ref_in)
    g = _upstream(y_ref, seed=99)
    grads_ours = torch.autograd.grad(y_ours, [ours_in[i] for i in diff], g)
    grads_ref = torch.autograd.grad(y_ref, [ref_in[i] for i in diff], g)
    for i, go, gr in zip(diff, grads_ours, grads_ref):
        torch.testing.assert_close(go, gr, atol=ATOL32, rtol=RTOL32, msg=f"{case.name}: grad of input {i}")


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_gradcheck_float64(case):
    args, diff = case.build(torch.float64)
    assert gradcheck(case.ours, tuple(_leaves(args, diff)))


@pytest.mark.parametrize("case", [c for c in CASES if c.name in DOUBLE], ids=repr)
def test_gradgradcheck_where_double_backward_is_claimed(case):
    args, diff = case.build(torch.float64)
    assert gradgradcheck(case.ours, tuple(_leaves(args, diff)))


def test_once_differentiable_refuses_double_backward():
    x = _r(2, 5, seed=1, dtype=torch.float64).requires_grad_()
    (gx,) = torch.autograd.grad(hf.softmax(x, -1)[:, 0].sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        gx.sum().backward()


def _call_backward(case, inputs):
    """Run the Function's backward directly on a random grad_output; return (grads, g, copy of g before)."""
    y = case.ours(*inputs)
    g = _upstream(y, seed=98)
    g_before = g.clone()
    grads = y.grad_fn.apply(g, *([None] * (case.n_out - 1)))
    return (grads if isinstance(grads, tuple) else (grads,)), g, g_before


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_needs_input_grad_respected(case):
    args, diff = case.build(torch.float64)
    for keep in diff:
        inputs = _leaves(args, diff, which=[keep])
        grads, _, _ = _call_backward(case, inputs)
        # Our Functions take their differentiable inputs first, in the wrapper's order.
        assert grads[keep] is not None, f"{case.name}: input {keep} asked for but not given"
        others = [i for i, gr in enumerate(grads) if gr is not None and i != keep]
        assert others == [], f"{case.name}: asked for input {keep} only, also computed {others}"


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_grad_output_is_not_modified(case):
    args, diff = case.build(torch.float64)
    _, g, g_before = _call_backward(case, _leaves(args, diff))
    assert torch.equal(g, g_before)


def test_linear_saves_only_what_backward_needs():
    x, W = _r(3, 5, seed=1, dtype=torch.float32), _r(4, 5, seed=2, dtype=torch.float32)
    y = hf.linear(x.requires_grad_(), W)  # W frozen: grad_W is never needed
    saved_x, saved_W = y.grad_fn.saved_tensors
    assert saved_x is None and saved_W is not None  # grad_x = grad_y W needs W only


# ---------------------------------------------------------------- softmax's Jacobian


def test_softmax_jacobian_and_vjp():
    z = _r(5, seed=3, dtype=torch.float64)
    p = torch.softmax(z, 0)
    J = hf.softmax_jacobian(p)
    torch.testing.assert_close(J, torch.autograd.functional.jacobian(lambda t: torch.softmax(t, 0), z))
    v = _r(5, seed=4, dtype=torch.float64)
    torch.testing.assert_close(hf.softmax_backward(p, v), v @ J)  # (5,) @ (5, 5) -> (5,)
    assert not torch.allclose(hf.softmax_backward_diagonal_only(p, v), v @ J, atol=1e-3)


def test_diagonal_only_softmax_backward_fails_gradcheck():
    z = _r(3, 6, seed=5, dtype=torch.float64).requires_grad_()
    assert not gradcheck(lambda t: hf.SoftmaxDiagonalOnly.apply(t, 1), (z,), raise_exception=False)
    assert gradcheck(lambda t: hf.Softmax.apply(t, 1), (z,))


# ---------------------------------------------------------------- a broken backward is caught


def test_broken_layernorm_backward_is_caught(monkeypatch, broken_layernorm_backward):
    case = next(c for c in CASES if c.name == "layer_norm")
    args, diff = case.build(torch.float64)
    assert gradcheck(case.ours, tuple(_leaves(args, diff)))
    monkeypatch.setattr(hf, "layernorm_backward", broken_layernorm_backward)
    assert not gradcheck(case.ours, tuple(_leaves(args, diff)), raise_exception=False)
    with pytest.raises(AssertionError):
        test_backward_matches_autograd_of_builtin_float32(case)


# ---------------------------------------------------------------- cross-entropy details


def test_cross_entropy_is_stable_at_huge_logits():
    z = _r(4, 5, seed=6, dtype=torch.float32)
    t = _target(4, C=5, seed=1)
    big = hf.cross_entropy(z + 1000.0, t)  # naive exp(1000) = inf in float32
    assert torch.isfinite(big)
    torch.testing.assert_close(big, hf.cross_entropy(z, t), atol=1e-4, rtol=1e-4)


def test_cross_entropy_gradient_is_softmax_minus_onehot_over_n():
    z = _r(4, 5, seed=7, dtype=torch.float64).requires_grad_()
    t = _target(4, C=5, seed=2)
    hf.cross_entropy(z, t).backward()
    expected = (torch.softmax(z, 1) - F.one_hot(t, 5)) / 4
    torch.testing.assert_close(z.grad, expected.detach())


def test_cross_entropy_all_ignored_is_nan_like_torch():
    z = _r(3, 4, seed=8, dtype=torch.float32)
    t = torch.full((3,), -100, device=DEV)
    assert torch.isnan(hf.cross_entropy(z, t)) and torch.isnan(F.cross_entropy(z, t))


# ---------------------------------------------------------------- dropout


def test_dropout_reproducible_eval_identity_and_p_edges():
    x = _r(64, 64, seed=9, dtype=torch.float32)
    a, b = hf.dropout(x, 0.25, True, 5), hf.dropout(x, 0.25, True, 5)
    assert torch.equal(a, b)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(hf.dropout(x, 0.25, True, g1), a) and torch.equal(hf.dropout(x, 0.25, True, g2), a)
    kept = (a != 0).float().mean().item()
    assert abs(kept - 0.75) < 0.03
    assert hf.dropout(x, 0.5, training=False) is x and hf.dropout(x, 0.0) is x
    xr = x.clone().requires_grad_()
    y = hf.dropout(xr, 1.0, True, 0)
    y.sum().backward()
    assert torch.count_nonzero(y) == 0 and torch.count_nonzero(xr.grad) == 0


def test_dropout_saves_only_the_bool_mask():
    x = _r(8, 8, seed=10, dtype=torch.float32).requires_grad_()
    (mask,) = hf.dropout(x, 0.5, True, 3).grad_fn.saved_tensors
    assert mask.dtype == torch.bool and mask.shape == x.shape


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call",
    [
        lambda: hf.linear([1.0], torch.ones(2, 1)),
        lambda: hf.linear(torch.ones(3, 4), torch.ones(2, 5)),
        lambda: hf.linear(torch.ones(3, 4), torch.ones(2, 4), torch.ones(3)),
        lambda: hf.relu(torch.ones(3, dtype=torch.long)),
        lambda: hf.gelu(torch.ones(3), approximate="fast"),
        lambda: hf.softmax(torch.ones(2, 3), dim=2),
        lambda: hf.cross_entropy(torch.ones(4, 3), torch.ones(4)),
        lambda: hf.cross_entropy(torch.ones(4, 3), torch.zeros(3, dtype=torch.long)),
        lambda: hf.cross_entropy(torch.ones(4, 3), torch.zeros(4, dtype=torch.long), label_smoothing=1.5),
        lambda: hf.mse_loss(torch.ones(3), torch.ones(3, 1)),
        lambda: hf.layer_norm(torch.ones(2, 4), torch.ones(3)),
        lambda: hf.dropout(torch.ones(3), p=1.2),
        lambda: hf.dropout(torch.ones(3), p=0.5, generator="seed"),
    ],
)
def test_bad_input_raises_one_line_value_error(call):
    with pytest.raises(ValueError) as e:
        call()
    assert "\n" not in str(e.value)


F32, F64 = torch.float32, torch.float64


@pytest.mark.parametrize(
    "call,names",
    [
        (lambda: hf.linear(torch.ones(3, 4), torch.ones(2, 4, dtype=F64)), "W"),
        (lambda: hf.linear(torch.ones(3, 4), torch.ones(2, 4), torch.ones(2, dtype=F64)), "b"),
        (lambda: hf.layer_norm(torch.ones(2, 4), torch.ones(4, dtype=F64)), "weight"),
        (lambda: hf.layer_norm(torch.ones(2, 4), torch.ones(4), torch.ones(4, dtype=F64)), "bias"),
        (lambda: hf.mse_loss(torch.ones(3), torch.ones(3, dtype=F64)), "y"),
    ],
)
def test_mixed_dtypes_raise_at_forward_like_torch(call, names):
    """torch refuses f32 with f64 in linear/layer_norm/mse_loss; ours says so at forward, naming the argument."""
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{names}: expected torch.float32")


def test_same_dtypes_still_work_in_float64():
    x, W, b = torch.ones(3, 4, dtype=F64), torch.ones(2, 4, dtype=F64), torch.ones(2, dtype=F64)
    assert hf.linear(x, W, b).dtype == F64
    assert hf.layer_norm(x, torch.ones(4, dtype=F64), torch.zeros(4, dtype=F64)).dtype == F64
    assert hf.mse_loss(x, x).dtype == F64


def test_layernorm_forward_from_saved_statistics_rebuilds_the_same_output():
    """Given μ and 1/σ from a first call, y is rebuilt bit for bit (what the block's backward does)."""
    x, w, b = (
        _r(3, 6, seed=30, dtype=torch.float32),
        _r(6, seed=31, dtype=torch.float32),
        _r(6, seed=32, dtype=torch.float32),
    )
    y, mu, rstd = hf.layernorm_forward(x, w, b)
    y2, mu2, rstd2 = hf.layernorm_forward(x, w, b, mu=mu, rstd=rstd)
    assert torch.equal(y, y2) and mu2 is mu and rstd2 is rstd
    with pytest.raises(ValueError, match="both mu and rstd"):
        hf.layernorm_forward(x, w, b, mu=mu)


def test_layernorm_forward_computes_in_its_inputs_dtype():
    """float16 in, float16 arithmetic: eps = 1e-12 rounds to 0 and a constant row is 0·∞ = NaN (chapter 9)."""
    row = torch.full((1, 8), 3.0, dtype=torch.float16)
    assert torch.isnan(hf.layernorm_forward(row, None, None, 1e-12)[0]).all()
    assert torch.equal(hf.layernorm_forward(row, None, None, 1e-5)[0], torch.zeros_like(row))
    y64 = torch.randn(4, 8, dtype=torch.float64)
    torch.testing.assert_close(hf.layernorm_forward(y64, None, None)[0], F.layer_norm(y64, (8,)))


def test_softmax_dim_is_checked_with_the_shared_int_validator():
    with pytest.raises(ValueError, match=r"dim: expected an int in \[-2, 1\], got 2"):
        hf.softmax(torch.ones(2, 3), dim=2)
    with pytest.raises(ValueError, match=r"dim: expected an int in \[-1, 0\], got 1.0"):
        hf.log_softmax(torch.ones(3), dim=1.0)
    assert torch.equal(hf.softmax(torch.ones(2, 3), dim=-2), torch.full((2, 3), 0.5))
