# %% ex1
def mul(a, b):
    """out = a·b as a Value, with its local backward rule."""
    # forward pass: just multiply the two numbers
    product = a.data * b.data
    out = Value(product, (a, b), "*")

    def _backward():
        # d(a*b)/da = b and d(a*b)/db = a
        # chain rule: times out.grad
        grad_a = b.data * out.grad
        grad_b = a.data * out.grad
        # ADD, don't overwrite: in mul(x, x) a and b are the same Value
        # and it has to get both shares
        a.grad += grad_a
        b.grad += grad_b

    out._backward = _backward
    return out


def power(a, k):
    """out = aᵏ for a constant number k, with its local backward rule."""
    # k is a plain number, only a is a node in the graph
    result = a.data**k
    out = Value(result, (a,), "**")

    def _backward():
        # d(a^k)/da = k * a^(k-1)
        # (written with a itself, not out/a, so a = 0 works when k >= 2)
        local = k * a.data ** (k - 1)
        a.grad += local * out.grad

    out._backward = _backward
    return out
# %% ex2
import math


def relu(a):
    """out = max(a, 0), with its local backward rule."""
    # forward: keep a positive number, anything else becomes 0
    if a.data > 0:
        value = a.data
    else:
        value = 0.0
    out = Value(value, (a,), "relu")

    def _backward():
        # the slope is 1 where the input was positive and 0 everywhere else
        # (also at exactly 0, which is what PyTorch does)
        if a.data > 0:
            a.grad += out.grad
        # otherwise nothing flows back to a

    out._backward = _backward
    return out


def tanh(a):
    """out = tanh(a), with its local backward rule (from the output)."""
    out = Value(math.tanh(a.data), (a,), "tanh")

    def _backward():
        # tanh'(a) = 1 / cosh(a)^2 = 1 - tanh(a)^2 = 1 - y^2
        # y is the output, already computed in the forward pass
        y = out.data
        slope = 1.0 - y * y
        a.grad += slope * out.grad

    out._backward = _backward
    return out


def exp(a):
    """out = eᵃ, with its local backward rule (from the output)."""
    out = Value(math.exp(a.data), (a,), "exp")

    def _backward():
        # e^a is its own derivative, so the slope is the output itself
        slope = out.data
        a.grad += slope * out.grad

    out._backward = _backward
    return out
# %% ex3
from collections import deque


def dependencies(root):
    """{id(v): uses of v by the nodes reachable from root}, for each v reachable."""
    # counts[id(node)] = how many times node shows up as a parent of a node in root's graph
    counts = {}
    counts[id(root)] = 0  # nothing in the graph uses the root
    # my own stack of nodes still to look at, no recursion (chains can be 5000 deep)
    to_visit = [root]
    while len(to_visit) > 0:
        node = to_visit.pop()
        for parent in node._parents:
            key = id(parent)
            if key in counts:
                # already met: this is one more use of it
                counts[key] = counts[key] + 1
            else:
                # first time we meet it: one use so far, and its own parents still to visit
                counts[key] = 1
                to_visit.append(parent)
    return counts


def backward(root):
    """root.grad = 1, then each rule once, when all its node's uses have sent theirs."""
    # how many users still have to send their gradient to each node
    remaining = dependencies(root)
    root.grad = 1.0
    # queue of nodes whose users have all sent their share (first only the root)
    ready = deque()
    ready.append(root)
    while len(ready) > 0:
        node = ready.popleft()
        # send this node's gradient on to its parents
        node._backward()
        # each parent has one use fewer to wait for (twice if node uses it twice)
        for parent in node._parents:
            remaining[id(parent)] -= 1
            if remaining[id(parent)] == 0:
                # its last user just ran: its gradient is complete
                ready.append(parent)
# %% ex4
def saved_bytes(f, inputs):
    """Bytes saved for backward while f(*inputs) runs, by the three rules (an int)."""
    saved = []  # every tensor that autograd packs for backward

    def pack(t):
        # keep a reference, so its memory cannot be freed and reused while we count
        saved.append(t)
        return t

    def unpack(t):
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        result = f(*inputs)

    # the inputs' storages exist anyway, so they count zero
    input_storages = set()
    for x in inputs:
        input_storages.add(x.untyped_storage().data_ptr())

    counted = set()  # storages already added to the total
    total = 0
    for t in saved:
        storage = t.untyped_storage()
        # the address of the storage itself; t.data_ptr() would move with a view's offset
        address = storage.data_ptr()
        if address in input_storages:
            continue
        if address in counted:
            continue
        counted.add(address)
        # the whole storage stays alive, even if only a view of it was saved
        total += storage.nbytes()
    del result
    return total
