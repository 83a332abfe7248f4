# %% ex1
def directional_derivatives(f, x, U, eps=1e-6):
    """U[j]ᵀ∇f(x) for every direction U[j], by a central difference along it."""
    e = 1e-6 if eps is None else float(eps)
    derivs = torch.zeros(U.shape[0], dtype=x.dtype, device=x.device)
    for j, direction in enumerate(U):
        x_plus = x + e * direction
        x_minus = x - e * direction
        # central difference: the even Taylor terms cancel
        derivs[j] = (f(x_plus) - f(x_minus)) / (e + e)
    return derivs
# %% ex2
def dense_backward(X, W, grad_Y):
    """(grad_X, grad_W, grad_b) for Y = X W + b, W (in, out), given grad_Y = ∂L/∂Y."""
    # every leading index is a row: (..., in) -> (R, in), (..., out) -> (R, out)
    X_rows = X.reshape(-1, X.size(-1))
    grad_Y_rows = grad_Y.reshape(-1, grad_Y.size(-1))
    # -> (..., in), the shape of X
    grad_X = (grad_Y_rows @ W.T).reshape(X.shape).to(X.dtype)
    # -> (in, out), the shape of W
    grad_W = sum(torch.outer(X_rows[r], grad_Y_rows[r]) for r in range(X_rows.shape[0]))
    # -> (out,), the shape of b
    grad_b = grad_Y_rows.sum(0)
    return grad_X, grad_W, grad_b
# %% ex3
def residual_backward(grad_Y, X, W):
    """(grad_X, grad_W) for Y = tanh(X Wᵀ) + X, given grad_Y = ∂L/∂Y."""
    grad_X = torch.zeros_like(X)
    # skip path
    grad_X += grad_Y
    # layer path
    H = torch.tanh(X.matmul(W.t()))
    delta = grad_Y.mul(1.0 - H.pow(2))
    grad_X += delta.matmul(W)
    grad_W = delta.t().matmul(X)
    return grad_X, grad_W
# %% ex4
def unrepeat(grad, shape, reps):
    """∂L/∂x of shape `shape`, given grad = ∂L/∂y for y = x.repeat(*reps)."""
    shape = tuple(shape)
    padded = (1,) * (len(reps) - len(shape)) + shape
    out = torch.zeros(padded, dtype=grad.dtype, device=grad.device)
    # walk over every tile and add it in
    for idx in itertools.product(*[range(r) for r in reps]):
        sl = tuple(slice(t * n, (t + 1) * n) for t, n in zip(idx, padded))
        out += grad[sl]
    return out.reshape(shape)
