# %% ex1
def mul(a, b):
    """out = a·b;  ∂out/∂a = b, ∂out/∂b = a."""
    out = Value(a.data * b.data, (a, b), "*")

    def _backward():
        da = b.data * out.grad
        db = a.data * out.grad
        a.grad += da
        b.grad += db

    out._backward = _backward
    return out


def power(a, k):
    """out = aᵏ for a constant number k;  ∂out/∂a = k·aᵏ⁻¹."""
    assert isinstance(k, (int, float)), "only constant powers"
    out = Value(math.pow(a.data, k), (a,), "pow")

    def _backward():
        a.grad += k * math.pow(a.data, k - 1) * out.grad

    out._backward = _backward
    return out
# %% ex2
import math


def relu(a):
    """out = max(a, 0), with its local backward rule."""
    out = Value(a.data * (a.data > 0), (a,), "ReLU")

    def _backward():
        a.grad += float(out.data > 0) * out.grad

    out._backward = _backward
    return out


def tanh(a):
    """out = tanh(a), with its local backward rule (from the output)."""
    out = Value(math.tanh(a.data), (a,), "tanh")

    def _backward():
        a.grad += (1 - out.data * out.data) * out.grad

    out._backward = _backward
    return out


def exp(a):
    """out = eᵃ, with its local backward rule (from the output)."""
    out = Value(math.exp(a.data), (a,), "exp")

    def _backward():
        # d/da e^a = e^a = out
        a.grad += out.data * out.grad

    out._backward = _backward
    return out
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
    from collections import defaultdict

    uses = defaultdict(int)
    uses[id(root)] = 0
    seen = set()
    stack = [root]
    while stack:
        cur = stack.pop()
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        for par in cur._parents:
            uses[id(par)] += 1
            stack.append(par)
    return dict(uses)


def backward(root):
    """root.grad = 1, then each rule once, when all its node's uses have sent theirs."""
    pending = dependencies(root)
    root.grad = 1.0
    stack = [root]
    while stack:
        cur = stack.pop()
        cur._backward()
        for par in cur._parents:
            pending[id(par)] -= 1
            if not pending[id(par)]:
                stack.append(par)
# %% ex4
def saved_bytes(f, inputs):
    """Bytes saved for backward while f(*inputs) runs, by the three rules (an int)."""
    saved = {}
    exclude = set()
    for x in inputs:
        exclude.add(x.untyped_storage().data_ptr())

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in exclude:
            saved[st.data_ptr()] = st.nbytes()
        return t

    def unpack(t):
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = f(*inputs)
    return int(sum(saved.values()))
