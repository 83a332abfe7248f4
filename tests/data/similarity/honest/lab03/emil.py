# %% ex1
def mul(a, b):
    """out = a·b as a Value, with its local backward rule."""
    # out = a b
    out = Value(a.data * b.data, (a, b), "*")

    # ∂out/∂a = b,  ∂out/∂b = a
    def _backward():
        dout_da = b.data
        dout_db = a.data
        a.grad = a.grad + dout_da * out.grad
        b.grad = b.grad + dout_db * out.grad

    out._backward = _backward
    return out


def power(a, k):
    """out = aᵏ for a constant number k, with its local backward rule."""
    # out = a^k
    out = Value(a.data**k, (a,), "^")

    # ∂out/∂a = k a^(k-1)
    def _backward():
        dout_da = k * a.data ** (k - 1)
        a.grad = a.grad + dout_da * out.grad

    out._backward = _backward
    return out
# %% ex2
import math


def relu(a):
    """out = max(a, 0), with its local backward rule."""
    # y = max(a, 0)
    y = Value(max(a.data, 0), (a,), "ReLU")

    # dy/da = 1 if a > 0, 0 if a <= 0
    def _backward():
        if a.data > 0:
            dy_da = 1.0
        else:
            dy_da = 0.0
        a.grad = a.grad + dy_da * y.grad

    y._backward = _backward
    return y


def tanh(a):
    """out = tanh(a), with its local backward rule (from the output)."""
    # y = tanh(a)
    y = Value(math.tanh(a.data), (a,), "tanh")

    # dy/da = 1/cosh²(a) = (cosh² - sinh²)/cosh² = 1 - tanh²(a) = 1 - y²
    def _backward():
        dy_da = 1 - y.data**2
        a.grad = a.grad + dy_da * y.grad

    y._backward = _backward
    return y


def exp(a):
    """out = eᵃ, with its local backward rule (from the output)."""
    # y = e^a
    y = Value(math.exp(a.data), (a,), "exp")

    # dy/da = e^a = y
    def _backward():
        dy_da = y.data
        a.grad = a.grad + dy_da * y.grad

    y._backward = _backward
    return y
# %% ex3
def dependencies(root):
    """{id(v): uses of v by the nodes reachable from root}, for each v reachable."""
    # R = the nodes reachable from root (root included), found in order without recursion
    R = [root]
    in_R = {id(root)}
    i = 0
    while i < len(R):
        u = R[i]
        i = i + 1
        for v in u._parents:
            if id(v) not in in_R:
                in_R.add(id(v))
                R.append(v)
    # n(v) = Σ over u in R of the times v appears in u._parents
    n = {}
    for v in R:
        n[id(v)] = 0
    for u in R:
        for v in u._parents:
            n[id(v)] = n[id(v)] + 1
    return n


def backward(root):
    """root.grad = 1, then each rule once, when all its node's uses have sent theirs."""
    n = dependencies(root)
    # set root.grad = 1.0; root is the only node ready to run
    root.grad = 1.0
    ready = [root]
    while len(ready) > 0:
        # run a ready node's _backward()
        u = ready.pop()
        u._backward()
        # take 1 off the count of each of its parents, once per use
        for v in u._parents:
            n[id(v)] = n[id(v)] - 1
            # a parent whose count reaches 0 has received every share: ready
            if n[id(v)] == 0:
                ready.append(v)
# %% ex4
def saved_bytes(f, inputs):
    """Bytes saved for backward while f(*inputs) runs, by the three rules (an int)."""
    storage_of = lambda t: t.untyped_storage()
    saved = []

    def pack(t):
        saved.append(storage_of(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda p: p):
        f(*inputs)

    # S = the storages saved, each once (rule 2), told apart by their address
    S = {s.data_ptr(): s for s in saved}
    # I = the storages of the inputs (rule 3)
    I = {storage_of(x).data_ptr() for x in inputs}
    # bytes = sum over s in S minus I of the size of the whole storage s (rule 1)
    return int(sum(S[p].nbytes() for p in S.keys() - I))
