"""A tiny reverse-mode autograd engine on Python floats (chapter 3), micrograd-style.

``Value`` records, for every result, its parents and a ``_backward`` closure that
applies the local chain rule: ``parent.grad += local_derivative * out.grad``.
``backward()`` orders the graph topologically and runs those closures from the
output back.  ``+=`` (not ``=``) is what makes a value used twice (``a * a``,
``x`` feeding two hidden units) receive the sum of its gradients.

``cat_mlp_grads`` runs chapter 1's cat MLP through it, scalar by scalar.
"""

from __future__ import annotations

import math

__all__ = ["Value", "topological_order", "cat_mlp_forward", "cat_mlp_grads"]


class Value:
    """A scalar that remembers how it was made: data, grad = ∂out/∂self, parents, backward rule."""

    def __init__(self, data: float, _parents=(), _op: str = "", name: str = ""):
        self.data = float(data)
        self.grad = 0.0
        self._parents = tuple(_parents)
        self._op = _op
        self.name = name
        self._backward = lambda: None

    def __repr__(self) -> str:
        return f"Value({self.name + '=' if self.name else ''}{self.data:.4f}, grad={self.grad:.4f})"

    def _wrap(self, other) -> "Value":
        return other if isinstance(other, Value) else type(self)(other)

    def _new(self, data: float, parents, op: str) -> "Value":
        return type(self)(data, parents, op)  # subclasses (e.g. a broken one in the tests) propagate

    # --- operations: forward value + local backward rule --------------------------------------
    def __add__(self, other):
        """out = a + b;  ∂out/∂a = 1, ∂out/∂b = 1."""
        other = self._wrap(other)
        out = self._new(self.data + other.data, (self, other), "+")

        def _backward():
            self.grad += out.grad
            other.grad += out.grad

        out._backward = _backward
        return out

    def __mul__(self, other):
        """out = a · b;  ∂out/∂a = b, ∂out/∂b = a."""
        other = self._wrap(other)
        out = self._new(self.data * other.data, (self, other), "*")

        def _backward():
            self.grad += other.data * out.grad
            other.grad += self.data * out.grad

        out._backward = _backward
        return out

    def __pow__(self, k):
        """out = aᵏ (k a number);  ∂out/∂a = k·aᵏ⁻¹."""
        if isinstance(k, Value):
            raise ValueError("pow: expected a constant int/float exponent, got a Value")
        out = self._new(self.data**k, (self,), f"**{k}")

        def _backward():
            self.grad += k * self.data ** (k - 1) * out.grad

        out._backward = _backward
        return out

    def relu(self):
        """out = max(a, 0);  ∂out/∂a = 1 if a > 0 else 0 (PyTorch's choice at 0)."""
        out = self._new(self.data if self.data > 0 else 0.0, (self,), "relu")

        def _backward():
            self.grad += (1.0 if self.data > 0 else 0.0) * out.grad

        out._backward = _backward
        return out

    def tanh(self):
        """out = tanh(a);  ∂out/∂a = 1 - out²."""
        t = math.tanh(self.data)
        out = self._new(t, (self,), "tanh")

        def _backward():
            self.grad += (1.0 - t * t) * out.grad

        out._backward = _backward
        return out

    def exp(self):
        """out = eᵃ;  ∂out/∂a = out."""
        e = math.exp(self.data)
        out = self._new(e, (self,), "exp")

        def _backward():
            self.grad += e * out.grad

        out._backward = _backward
        return out

    # --- derived operations: built from the ones above, so no new backward rules -------------
    def __neg__(self):
        """-a = a · (-1)."""
        return self * -1.0

    def __sub__(self, other):
        """a - b = a + (-b)."""
        return self + (-self._wrap(other))

    def __truediv__(self, other):
        """a / b = a · b⁻¹."""
        return self * self._wrap(other) ** -1

    def __radd__(self, other):
        return self + other

    def __rmul__(self, other):
        return self * other

    def __rsub__(self, other):
        return self._wrap(other) - self

    def __rtruediv__(self, other):
        return self._wrap(other) / self

    # --- the engine ---------------------------------------------------------------------------
    def backward(self) -> None:
        """Add ∂self/∂v into v.grad for every v self depends on: seed 1, run each rule, output first.

        Like PyTorch, intermediate grads start from 0 on every call but leaves (values
        with no parents) accumulate across calls: reset them yourself (``zero_grad``).
        """
        order = topological_order(self)
        for v in order:
            if v._parents:
                v.grad = 0.0
        self.grad = 1.0
        for v in reversed(order):
            v._backward()


def topological_order(root: Value) -> list:
    """Every node reachable from ``root``, each after all of its parents (depth-first post-order)."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:  # iterative, so deep graphs do not hit Python's recursion limit
        v, done = stack.pop()
        if done:
            order.append(v)
            continue
        if id(v) in seen:
            continue
        seen.add(id(v))
        stack.append((v, True))
        stack.extend((p, False) for p in v._parents if id(p) not in seen)
    return order


def _cat_numbers(params: dict | None) -> dict:
    if params is None:
        from helpers.cat_mlp import cat_params

        params = cat_params()
    return {k: (v.detach().cpu().tolist() if hasattr(v, "detach") else v) for k, v in params.items()}


def cat_mlp_forward(params: dict | None = None, value_cls=Value) -> dict:
    """The cat MLP on Values: h_i = Σ_j W1_ij x_j + b1_i, a = relu(h), ŷ = Σ_i W2_i a_i + b2, L = (ŷ - y)²."""
    p = _cat_numbers(params)
    V = value_cls
    x = [V(v, name=f"x{j}") for j, v in enumerate(p["x"])]
    W1 = [[V(v, name=f"W1[{i},{j}]") for j, v in enumerate(row)] for i, row in enumerate(p["W1"])]
    b1 = [V(v, name=f"b1[{i}]") for i, v in enumerate(p["b1"])]
    W2 = [[V(v, name=f"W2[{i},{j}]") for j, v in enumerate(row)] for i, row in enumerate(p["W2"])]
    b2 = [V(v, name=f"b2[{i}]") for i, v in enumerate(p["b2"])]
    # Sum in index order, starting from the first product (the order W1 @ x sums in on a CPU).
    h = []
    for i in range(len(W1)):
        s = W1[i][0] * x[0]
        for j in range(1, len(x)):
            s = s + W1[i][j] * x[j]
        h.append(s + b1[i])
    a = [hi.relu() for hi in h]
    y_hat = []
    for i in range(len(W2)):
        s = W2[i][0] * a[0]
        for j in range(1, len(a)):
            s = s + W2[i][j] * a[j]
        y_hat.append(s + b2[i])
    L = (y_hat[0] - p["y_true"][0]) ** 2
    for i in range(1, len(y_hat)):
        L = L + (y_hat[i] - p["y_true"][i]) ** 2
    return {"x": x, "W1": W1, "b1": b1, "W2": W2, "b2": b2, "h": h, "a": a, "y_hat": y_hat, "L": L}


def cat_mlp_grads(params: dict | None = None, value_cls=Value) -> dict:
    """Run the cat MLP forward and backward on Values; return L and ∂L/∂{x, W1, b1, W2, b2} as nested lists."""
    v = cat_mlp_forward(params, value_cls)
    v["L"].backward()

    def g(obj):
        return [g(o) for o in obj] if isinstance(obj, list) else obj.grad

    out = {"L": v["L"].data, "nodes": len(topological_order(v["L"]))}
    out.update({k: g(v[k]) for k in ("x", "W1", "b1", "W2", "b2")})
    return out
