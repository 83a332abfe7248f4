# %% ex1
def mul(a, b):
    """out = a·b;  ∂out/∂a = b, ∂out/∂b = a."""
    result = Value(a.data * b.data, (a, b), "mul")

    def backward_rule():
        # product rule: each factor gets the other one
        a.grad += result.grad * b.data
        b.grad += result.grad * a.data

    result._backward = backward_rule
    return result


def power(a, k):
    """out = aᵏ for a constant number k;  ∂out/∂a = k·aᵏ⁻¹."""
    result = Value(a.data**k, (a,), "pow")

    def backward_rule():
        local = k * (a.data ** (k - 1))
        a.grad += result.grad * local

    result._backward = backward_rule
    return result
# %% ex2
import math


def relu(a):
    """out = max(a, 0), with its local backward rule."""
    result = Value(a.data if a.data > 0 else 0.0, (a,), "relu")

    def backward_rule():
        if a.data > 0:
            a.grad += result.grad

    result._backward = backward_rule
    return result


def tanh(a):
    """out = tanh(a), with its local backward rule (from the output)."""
    t = math.tanh(a.data)
    result = Value(t, (a,), "tanh")

    def backward_rule():
        a.grad += result.grad * (1.0 - t * t)

    result._backward = backward_rule
    return result


def exp(a):
    """out = eᵃ, with its local backward rule (from the output)."""
    e = math.exp(a.data)
    result = Value(e, (a,), "exp")

    def backward_rule():
        a.grad += result.grad * e

    result._backward = backward_rule
    return result
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
    deps = {}
    deps[id(root)] = 0
    todo = [root]
    visited = {id(root)}
    while len(todo) > 0:
        v = todo.pop()
        for parent in v._parents:
            key = id(parent)
            deps[key] = deps.get(key, 0) + 1
            if key not in visited:
                visited.add(key)
                todo.append(parent)
    return deps


def backward(root):
    """root.grad = 1, then each rule once, when all its node's uses have sent theirs."""
    remaining = dependencies(root)
    root.grad = 1.0
    queue = [root]
    i = 0
    # a growing list read front to back (Kahn's algorithm)
    while i < len(queue):
        v = queue[i]
        i += 1
        v._backward()
        for parent in v._parents:
            remaining[id(parent)] -= 1
            if remaining[id(parent)] == 0:
                queue.append(parent)
# %% ex4
def saved_bytes(f, inputs):
    """Bytes saved for backward while f(*inputs) runs, by the three rules (an int)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        f(*inputs)
    for x in inputs:
        storages.pop(x.untyped_storage().data_ptr(), None)
    total = 0
    for nbytes in storages.values():
        total += nbytes
    return total
