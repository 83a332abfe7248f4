# %% ex1
def directional_derivatives(f, x, U, eps=1e-6):
    """U[j]ᵀ∇f(x) for every direction U[j], by a central difference along it."""
    if eps is None:
        eps = 1e-6
    out = torch.empty(U.shape[0], dtype=x.dtype, device=x.device)
    for j in range(U.shape[0]):
        u = U[j]
        out[j] = (f(x + eps * u) - f(x - eps * u)) / (2 * eps)
    return out
# %% ex2
def dense_backward(X, W, grad_Y):
    """(grad_X, grad_W, grad_b) for Y = X W + b, W (in, out), given grad_Y = ∂L/∂Y."""
    # every leading index is a row: (..., in) -> (R, in), (..., out) -> (R, out)
    X_rows = X.reshape(-1, X.shape[-1])
    grad_Y_rows = grad_Y.reshape(-1, grad_Y.shape[-1])
    # -> (..., in), the shape of X
    grad_X = grad_Y @ W.T
    # -> (in, out), the shape of W
    grad_W = X_rows.T @ grad_Y_rows
    # -> (out,), the shape of b
    grad_b = grad_Y_rows.sum(dim=0)
    return grad_X, grad_W, grad_b
# %% ex3
def residual_backward(grad_Y, X, W):
    """(grad_X, grad_W) for Y = tanh(X Wᵀ) + X, given grad_Y = ∂L/∂Y."""
    Z = X @ W.T  # (B, D)
    T = torch.tanh(Z)
    grad_Z = grad_Y * (1 - T**2)
    grad_W = grad_Z.T @ X
    grad_X = grad_Z @ W
    grad_X += grad_Y  # the skip connection
    return grad_X, grad_W
# %% ex4
def unrepeat(grad, shape, reps):
    """∂L/∂x of shape `shape`, given grad = ∂L/∂y for y = x.repeat(*reps)."""
    shape = tuple(shape)
    padded = (1,) * (len(reps) - len(shape)) + shape
    split = []
    for r, n in zip(reps, padded):
        split += [r, n]
    g = grad.reshape(split)
    g = g.sum(dim=tuple(range(0, len(split), 2)))
    return g.reshape(shape)
