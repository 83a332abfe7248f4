# %% ex1
def mul(a, b):
    """out = a·b;  ∂out/∂a = b, ∂out/∂b = a."""
    prod = a.data * b.data
    out = Value(prod, (a, b), "mul")

    def _backward():
        g = out.grad
        a.grad += g * b.data
        b.grad += g * a.data

    out._backward = _backward
    return out


def power(a, k):
    """out = aᵏ for a constant number k;  ∂out/∂a = k·aᵏ⁻¹."""
    x = a.data
    out = Value(x**k, (a,), "pow" + str(k))

    def _backward():
        a.grad += out.grad * k * x ** (k - 1)

    out._backward = _backward
    return out
# %% ex2
import math


def relu(a):
    """out = max(a, 0), with its local backward rule."""
    positive = a.data > 0
    out = Value(a.data if positive else 0.0, (a,), "relu")

    def _backward():
        a.grad += out.grad if positive else 0.0

    out._backward = _backward
    return out


def tanh(a):
    """out = tanh(a), with its local backward rule (from the output)."""
    y = math.tanh(a.data)
    out = Value(y, (a,), "tanh")

    def _backward():
        a.grad += out.grad * (1 - y**2)  # tanh' = 1 - tanh^2

    out._backward = _backward
    return out


def exp(a):
    """out = eᵃ, with its local backward rule (from the output)."""
    y = math.exp(a.data)
    out = Value(y, (a,), "exp")

    def _backward():
        a.grad += out.grad * y

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
    result = {}
    order = [root]
    result[id(root)] = 0
    k = 0
    while k < len(order):  # breadth first, each node expanded once
        node = order[k]
        k += 1
        for parent in node._parents:
            if id(parent) in result:
                result[id(parent)] += 1
            else:
                result[id(parent)] = 1
                order.append(parent)
    return result


def backward(root):
    """root.grad = 1, then each rule once, when all its node's uses have sent theirs."""
    left = dict(dependencies(root))
    root.grad = 1.0
    ready = [root]
    done = 0
    while ready:
        node = ready.pop()
        node._backward()
        done += 1
        for parent in node._parents:
            left[id(parent)] -= 1
            if left[id(parent)] == 0:
                ready.append(parent)
# %% ex4
def saved_bytes(f, inputs):
    """Bytes saved for backward while f(*inputs) runs, by the three rules (an int)."""
    log = []

    def pack(t):
        log.append(t)
        return t

    def unpack(x):
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        f(*inputs)
    counted = set(t.untyped_storage().data_ptr() for t in inputs)
    total = 0
    for t in log:
        s = t.untyped_storage()
        if s.data_ptr() in counted:
            continue
        counted.add(s.data_ptr())
        total += s.nbytes()
    return int(total)
