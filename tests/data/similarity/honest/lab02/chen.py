# %% ex1
def directional_derivatives(f, x, U, eps=1e-6):
    """U[j]ᵀ∇f(x) for every direction U[j], by a central difference along it."""
    eps = eps or 1e-6
    k = len(U)
    d = torch.zeros(k, dtype=x.dtype)
    for j in range(k):
        step = eps * U[j]
        fp = f(x + step).item()
        fm = f(x - step).item()
        d[j] = (fp - fm) / (2 * eps)
    return d.to(x.device)
# %% ex2
def dense_backward(X, W, grad_Y):
    """(grad_X, grad_W, grad_b) for Y = X W + b, W (in, out), given grad_Y = ∂L/∂Y."""
    X_rows = X.flatten(0, -2) if X.dim() > 1 else X[None]
    grad_Y_rows = grad_Y.flatten(0, -2) if grad_Y.dim() > 1 else grad_Y[None]
    # dL/dX_ri = sum_o g_ro W_io
    grad_X = (grad_Y_rows @ W.transpose(0, 1)).reshape_as(X)
    # dL/dW_io = sum_r X_ri g_ro
    grad_W = X_rows.transpose(0, 1) @ grad_Y_rows
    # dL/db_o = sum_r g_ro
    grad_b = grad_Y_rows.sum(0)
    return grad_X, grad_W, grad_b
# %% ex3
def residual_backward(grad_Y, X, W):
    """(grad_X, grad_W) for Y = tanh(X Wᵀ) + X, given grad_Y = ∂L/∂Y."""
    a = torch.tanh(X @ W.T)
    g = grad_Y * (1 - a * a)
    grad_X = grad_Y.clone()
    grad_X += g @ W
    grad_W = g.T @ X
    return grad_X, grad_W
# %% ex4
def unrepeat(grad, shape, reps):
    """∂L/∂x of shape `shape`, given grad = ∂L/∂y for y = x.repeat(*reps)."""
    n_pad = len(reps) - len(shape)
    base = [1] * n_pad + list(shape)
    new_shape = []
    for r, n in zip(reps, base):
        new_shape.append(r)
        new_shape.append(n)
    tiles = grad.reshape(*new_shape)
    tile_dims = [2 * i for i in range(len(reps))]
    out = tiles.sum(dim=tile_dims)
    return out.reshape(tuple(shape))
