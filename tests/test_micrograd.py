import math

import pytest
import torch

from helpers.cat_mlp import cat_params, forward
from helpers.micrograd import Value, cat_mlp_grads, topological_order

BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "radd_rmul_rsub_rtruediv": lambda a, b: (2.0 + a) * (3.0 * b) + (1.0 - a) + 2.0 / b,
}
UNARY = {
    "neg": lambda a: -a,
    "pow3": lambda a: a**3,
    "pow_half": lambda a: a**0.5,
    "relu": lambda a: a.relu(),
    "tanh": lambda a: a.tanh(),
    "exp": lambda a: a.exp(),
}


def _torch_grads(f, *xs):
    ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in xs]
    out = f(*ts)
    out.backward()
    return out.item(), [t.grad.item() for t in ts]


def _ours(f, *xs, cls=Value):
    vs = [cls(x) for x in xs]
    out = f(*vs)
    out.backward()
    return out.data, [v.grad for v in vs]


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("a,b", [(1.5, -0.7), (-2.0, 3.0)])
def test_binary_ops_match_torch(name, a, b):
    f = BINARY[name]
    (y, g), (y_ref, g_ref) = _ours(f, a, b), _torch_grads(f, a, b)
    assert y == pytest.approx(y_ref, rel=1e-12)
    assert g == pytest.approx(g_ref, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("a", [0.8, -1.3, 2.5])
def test_unary_ops_match_torch(name, a):
    if name == "pow_half" and a < 0:
        pytest.skip("sqrt of a negative number")
    f = {"relu": lambda t: t.relu() if isinstance(t, Value) else torch.relu(t)}.get(name, UNARY[name])
    (y, g), (y_ref, g_ref) = _ours(f, a), _torch_grads(f, a)
    assert y == pytest.approx(y_ref, rel=1e-12)
    assert g == pytest.approx(g_ref, rel=1e-12, abs=1e-15)


def test_node_used_twice_accumulates():
    for f, expected in [
        (lambda a: a + a, 2.0),
        (lambda a: a * a, 6.0),
        (lambda a: a * a + a.exp(), 6.0 + math.exp(3.0)),
    ]:
        _, (g,) = _ours(f, 3.0)
        assert g == pytest.approx(expected, rel=1e-12)


def test_backward_twice_accumulates_into_leaves_like_torch():
    a = Value(2.0)
    b = a * a
    c = b + a
    c.backward()
    assert a.grad == 5.0
    c.backward()  # intermediates restart from 0, the leaf accumulates (PyTorch does the same)
    assert a.grad == 10.0 and b.grad == 1.0
    order = topological_order(c)
    assert order.index(a) < order.index(b) < order.index(c)


def test_pow_rejects_value_exponent():
    with pytest.raises(ValueError, match="exponent"):
        Value(2.0) ** Value(3.0)


def _torch_cat():
    p = cat_params(dtype=torch.float64, requires_grad=True)
    p["x"].requires_grad_(True)
    c = forward(**p)
    c["L"].backward()
    return c["L"].item(), {k: p[k].grad for k in ("x", "W1", "b1", "W2", "b2")}


def test_cat_mlp_matches_torch_exactly():
    ours = cat_mlp_grads()
    L_ref, ref = _torch_cat()
    assert ours["L"] == L_ref
    for k, g in ref.items():
        assert torch.equal(torch.tensor(ours[k], dtype=torch.float64), g), k


class AssignMul(Value):
    """A deliberately broken engine: the product rule overwrites (=) instead of accumulating (+=)."""

    def __mul__(self, other):
        other = self._wrap(other)
        out = self._new(self.data * other.data, (self, other), "*")

        def _backward():
            self.grad = other.data * out.grad
            other.grad = self.data * out.grad

        out._backward = _backward
        return out


def test_broken_rule_is_caught():
    _, (g,) = _ours(lambda a: a * a, 3.0, cls=AssignMul)
    assert g != pytest.approx(6.0)
    ours = cat_mlp_grads(value_cls=AssignMul)  # x feeds both hidden units
    _, ref = _torch_cat()
    assert not torch.equal(torch.tensor(ours["x"], dtype=torch.float64), ref["x"])
