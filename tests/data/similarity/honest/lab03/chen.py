# %% ex1
def _node(data, parents, op, local_grads):
    """A Value whose rule adds local_grads()[i] · out.grad into parents[i].grad."""
    node = Value(data, parents, op)

    def _backward():
        for parent, d in zip(parents, local_grads()):
            parent.grad += d * node.grad

    node._backward = _backward
    return node


def mul(a, b):
    """out = a·b as a Value, with its local backward rule."""
    return _node(a.data * b.data, (a, b), "*", lambda: (b.data, a.data))


def power(a, k):
    """out = aᵏ for a constant number k, with its local backward rule."""
    return _node(math.pow(a.data, k), (a,), "pow", lambda: (k * math.pow(a.data, k - 1),))
# %% ex2
import math


def relu(a):
    """out = max(a, 0), with its local backward rule."""
    x = a.data
    return _node(x if x > 0 else 0.0, (a,), "relu", lambda: (1.0 if x > 0 else 0.0,))


def tanh(a):
    """out = tanh(a), with its local backward rule (from the output)."""
    th = math.tanh(a.data)
    return _node(th, (a,), "tanh", lambda: (1.0 - th * th,))


def exp(a):
    """out = eᵃ, with its local backward rule (from the output)."""
    ex = math.exp(a.data)
    return _node(ex, (a,), "exp", lambda: (ex,))
# %% ex3
from collections import Counter


def _reachable(root):
    """Every node root depends on, once each (by identity), walked without recursion."""
    found = {id(root): root}
    todo = [root]
    while todo:
        node = todo.pop()
        for par in node._parents:
            if id(par) not in found:
                found[id(par)] = par
                todo.append(par)
    return list(found.values())


def dependencies(root):
    """{id(v): uses of v by the nodes reachable from root}, for each v reachable."""
    graph = _reachable(root)
    uses = Counter(id(par) for node in graph for par in node._parents)
    return {id(node): uses[id(node)] for node in graph}


def _release(node, pending):
    """Take one off each parent's count per use; return the parents that reached 0."""
    freed = []
    for par in node._parents:
        pending[id(par)] -= 1
        if pending[id(par)] == 0:
            freed.append(par)
    return freed


def backward(root):
    """root.grad = 1, then each rule once, when all its node's uses have sent theirs."""
    pending = dependencies(root)
    root.grad = 1.0
    agenda = [root]
    while agenda:
        node = agenda.pop()
        node._backward()
        agenda.extend(_release(node, pending))
# %% ex4
def _storage_key(t):
    return t.untyped_storage().data_ptr()


def _storage_size(t):
    return t.untyped_storage().nbytes()


def saved_bytes(f, inputs):
    """Bytes saved for backward while f(*inputs) runs, by the three rules (an int)."""
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        f(*inputs)
    skip = {_storage_key(x) for x in inputs}
    sizes = {_storage_key(t): _storage_size(t) for t in packed if _storage_key(t) not in skip}
    return int(sum(sizes.values()))
