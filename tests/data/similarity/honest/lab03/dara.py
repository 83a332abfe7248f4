# %% ex1
def mul(a, b):
    """out = a·b;  ∂out/∂a = b, ∂out/∂b = a."""
    out = Value(a.data * b.data, _parents=(a, b), _op="*")

    def _backward():
        a.grad = a.grad + b.data * out.grad
        b.grad = b.grad + a.data * out.grad

    out._backward = _backward
    return out


def power(a, k):
    """out = aᵏ for a constant number k;  ∂out/∂a = k·aᵏ⁻¹."""
    out = Value(a.data**k, _parents=(a,), _op="**")

    def _backward():
        a.grad = a.grad + k * a.data ** (k - 1) * out.grad

    out._backward = _backward
    return out
# %% ex2
import math


def _unary(a, value, local, name):
    # shared pattern: out = g(a), a.grad += g'(a) * out.grad, g' from a function of out
    out = Value(value, (a,), name)

    def _backward():
        a.grad += local(out) * out.grad

    out._backward = _backward
    return out


def relu(a):
    """out = max(a, 0), with its local backward rule."""
    return _unary(a, max(0.0, a.data), lambda o: 1.0 if o.data > 0 else 0.0, "relu")


def tanh(a):
    """out = tanh(a), with its local backward rule (from the output)."""
    return _unary(a, math.tanh(a.data), lambda o: 1.0 - o.data**2, "tanh")


def exp(a):
    """out = eᵃ, with its local backward rule (from the output)."""
    return _unary(a, math.exp(a.data), lambda o: o.data, "exp")
# %% ex3
class Node(micrograd.Value):
    """The course's Value plus _users: every node made from this one, in any graph."""

    def __init__(self, data, _parents=(), _op="", name=""):
        super().__init__(data, _parents, _op, name)
        self._users = []
        for p in self._parents:
            p._users.append(self)


def dependencies(root):
    """{id(v): uses of v by the nodes reachable from root}, for each v reachable."""
    n = {id(root): 0}
    frontier = [root]
    while frontier:
        v = frontier.pop()
        for u in v._parents:
            first = id(u) not in n
            n[id(u)] = n.get(id(u), 0) + 1
            if first:
                frontier.append(u)
    return n


def backward(root):
    """root.grad = 1, then each rule once, when all its node's uses have sent theirs."""
    n = dependencies(root)
    root.grad = 1.0
    frontier = [root]
    while frontier:
        v = frontier.pop()
        v._backward()
        for u in v._parents:
            n[id(u)] = n[id(u)] - 1
            if n[id(u)] == 0:
                frontier.append(u)
# %% ex4
def saved_bytes(f, inputs):
    """Bytes saved for backward while f(*inputs) runs, by the three rules (an int)."""
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        f(*inputs)
    skip = {t.untyped_storage().data_ptr() for t in inputs}
    by_storage = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in packed
        if t.untyped_storage().data_ptr() not in skip
    }
    return sum(by_storage.values())
