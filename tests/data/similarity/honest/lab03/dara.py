# %% ex1
import numbers


def _check_value(v, what):
    if not isinstance(v, Value):
        raise TypeError("%s must be a Value, got %s" % (what, type(v).__name__))


def mul(a, b):
    """out = a·b as a Value, with its local backward rule."""
    _check_value(a, "a")
    _check_value(b, "b")
    out = Value(a.data * b.data, (a, b), "*")

    def _backward():
        g = out.grad
        # no division anywhere: an input of 0 is fine
        a.grad += b.data * g
        b.grad += a.data * g

    out._backward = _backward
    return out


def power(a, k):
    """out = aᵏ for a constant number k, with its local backward rule."""
    _check_value(a, "a")
    if isinstance(k, Value) or not isinstance(k, numbers.Real):
        raise TypeError("k must be a constant number, not a Value")
    if a.data < 0 and float(k) != int(k):
        raise ValueError("a fractional power of a negative number: %r ** %r" % (a.data, k))
    if a.data == 0 and k < 1 and k != 0:
        raise ZeroDivisionError("0 ** %r: the derivative is not defined" % (k,))
    out = Value(a.data**k, (a,), "pow")

    def _backward():
        if k == 0:
            slope = 0.0  # a constant
        else:
            slope = k * a.data ** (k - 1)
        a.grad += slope * out.grad

    out._backward = _backward
    return out
# %% ex2
import math


def relu(a):
    """out = max(a, 0), with its local backward rule."""
    _check_value(a, "a")
    positive = a.data > 0  # at exactly 0: not positive, slope 0 (PyTorch's choice)
    out = Value(a.data if positive else 0.0, (a,), "relu")

    def _backward():
        if positive:
            a.grad += out.grad

    out._backward = _backward
    return out


def tanh(a):
    """out = tanh(a), with its local backward rule (from the output)."""
    _check_value(a, "a")
    out = Value(math.tanh(a.data), (a,), "tanh")

    def _backward():
        y = out.data
        assert -1.0 <= y <= 1.0, y
        a.grad += (1.0 - y) * (1.0 + y) * out.grad  # 1 - y², 0 when it saturates

    out._backward = _backward
    return out


def exp(a):
    """out = eᵃ, with its local backward rule (from the output)."""
    _check_value(a, "a")
    try:
        e = math.exp(a.data)
    except OverflowError:
        e = math.inf
    out = Value(e, (a,), "exp")

    def _backward():
        a.grad += e * out.grad

    out._backward = _backward
    return out
# %% ex3
def _parents_of(node):
    parents = getattr(node, "_parents", None)
    if parents is None:
        raise TypeError("not a graph node: %r" % (node,))
    return parents


def dependencies(root):
    """{id(v): uses of v by the nodes reachable from root}, for each v reachable."""
    uses = {id(root): 0}
    visited = set()
    pending = [root]
    while pending:
        node = pending.pop()
        if id(node) in visited:  # never walk a node twice
            continue
        visited.add(id(node))
        for parent in _parents_of(node):
            uses[id(parent)] = uses.get(id(parent), 0) + 1
            if id(parent) not in visited:
                pending.append(parent)
    return uses


def backward(root):
    """root.grad = 1, then each rule once, when all its node's uses have sent theirs."""
    waiting = dependencies(root)
    if waiting[id(root)] != 0:
        raise RuntimeError("root is used inside its own graph (a cycle?)")
    root.grad = 1.0
    ready = [root]
    ran = set()
    while ready:
        node = ready.pop()
        if id(node) in ran:
            raise RuntimeError("a node became ready twice")
        ran.add(id(node))
        node._backward()
        for parent in _parents_of(node):
            waiting[id(parent)] -= 1
            left = waiting[id(parent)]
            if left < 0:
                raise RuntimeError("more uses sent a gradient than were counted")
            if left == 0:
                ready.append(parent)
    if len(ran) != len(waiting):
        raise RuntimeError("%d nodes never ran their rule" % (len(waiting) - len(ran)))
# %% ex4
def saved_bytes(f, inputs):
    """Bytes saved for backward while f(*inputs) runs, by the three rules (an int)."""
    if not callable(f):
        raise TypeError("f must be callable")
    if torch.is_tensor(inputs):
        inputs = (inputs,)
    inputs = tuple(inputs)

    def where(t):
        # the storage's own address: equal for every view of it, whatever the offset
        return t.untyped_storage().data_ptr()

    excluded = {where(x) for x in inputs if torch.is_tensor(x)}
    kept = []  # held until we are done, so no storage is freed and its address reused

    def pack(t):
        if torch.is_tensor(t):
            kept.append(t)
        return t

    def unpack(packed):
        return packed

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        output = f(*inputs)

    nbytes_at = {}
    for t in kept:
        addr = where(t)
        if addr in excluded:
            continue
        size = t.untyped_storage().nbytes()
        if addr in nbytes_at and nbytes_at[addr] != size:
            raise RuntimeError("two storages of different sizes at one address")
        nbytes_at[addr] = size
    total = sum(nbytes_at.values())
    del output
    assert total >= 0
    return int(total)
