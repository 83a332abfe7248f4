# %% ex1
def directional_derivatives(f, x, U, eps=1e-6):
    """U[j]ᵀ∇f(x) for every direction U[j], by a central difference along it."""
    h = 1e-6 if eps is None else eps
    results = []
    with torch.no_grad():
        for u in U:
            plus = f(x + h * u)
            minus = f(x - h * u)
            results.append((plus - minus) / (2.0 * h))
    return torch.stack(results).to(x.dtype).reshape(-1)
# %% ex2
def dense_backward(X, W, grad_Y):
    """(grad_X, grad_W, grad_b) for Y = X W + b, W (in, out), given grad_Y = ∂L/∂Y."""
    # every leading index is a row: (..., in) -> (R, in), (..., out) -> (R, out)
    n_in, n_out = W.shape
    X_rows = X.contiguous().view(-1, n_in)
    grad_Y_rows = grad_Y.contiguous().view(-1, n_out)
    # -> (..., in), the shape of X
    grad_X = torch.matmul(grad_Y_rows, W.t()).view(X.shape)
    # -> (in, out), the shape of W
    grad_W = torch.matmul(X_rows.t(), grad_Y_rows)
    # -> (out,), the shape of b
    grad_b = torch.sum(grad_Y_rows, 0)
    return grad_X, grad_W, grad_b
# %% ex3
def residual_backward(grad_Y, X, W):
    """(grad_X, grad_W) for Y = tanh(X Wᵀ) + X, given grad_Y = ∂L/∂Y."""
    pre = torch.matmul(X, W.t())
    dtanh = 1.0 - torch.tanh(pre) ** 2
    g_pre = grad_Y * dtanh
    # branch 1: through the layer; branch 2: the identity
    grad_X = torch.matmul(g_pre, W) + grad_Y
    grad_W = torch.matmul(g_pre.t(), X)
    return grad_X, grad_W
# %% ex4
def unrepeat(grad, shape, reps):
    """∂L/∂x of shape `shape`, given grad = ∂L/∂y for y = x.repeat(*reps)."""
    shape = list(shape)
    full = [1] * (len(reps) - len(shape)) + shape
    # sum the copies one dimension at a time
    g = grad
    for d, (r, n) in enumerate(zip(reps, full)):
        if r > 1:
            pieces = torch.split(g, n, dim=d)
            g = sum(pieces)
    return g.reshape(shape)
