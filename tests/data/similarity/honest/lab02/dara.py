# %% ex1
def directional_derivatives(f, x, U, eps=1e-6):
    """U[j]ᵀ∇f(x) for every direction U[j], by a central difference along it."""
    if eps is None:
        eps = 1e-6
    x0 = x.detach().clone()
    vals = [(f(x0 + eps * U[j]) - f(x0 - eps * U[j])) / (2 * eps) for j in range(U.shape[0])]
    return torch.tensor([float(v) for v in vals], dtype=x.dtype, device=x.device)
# %% ex2
def dense_backward(X, W, grad_Y):
    """(grad_X, grad_W, grad_b) for Y = X W + b, W (in, out), given grad_Y = ∂L/∂Y."""
    # every leading index is a row: (..., in) -> (R, in), (..., out) -> (R, out)
    X_rows = X.reshape(-1, W.shape[0])
    grad_Y_rows = grad_Y.reshape(-1, W.shape[1])
    # -> (..., in), the shape of X
    grad_X = torch.einsum("...o,io->...i", grad_Y, W)
    # -> (in, out), the shape of W
    grad_W = torch.einsum("ri,ro->io", X_rows, grad_Y_rows)
    # -> (out,), the shape of b
    grad_b = torch.einsum("ro->o", grad_Y_rows)
    return grad_X, grad_W, grad_b
# %% ex3
def residual_backward(grad_Y, X, W):
    """(grad_X, grad_W) for Y = tanh(X Wᵀ) + X, given grad_Y = ∂L/∂Y."""
    # forward again
    U = torch.einsum("bi,oi->bo", X, W)
    # d tanh(u)/du = 1/cosh(u)^2
    dU = grad_Y / torch.cosh(U) ** 2
    grad_W = torch.einsum("bo,bi->oi", dU, X)
    grad_X = grad_Y + torch.einsum("bo,oi->bi", dU, W)
    return grad_X, grad_W
# %% ex4
def unrepeat(grad, shape, reps):
    """∂L/∂x of shape `shape`, given grad = ∂L/∂y for y = x.repeat(*reps)."""
    shape = torch.Size(shape)
    lead = len(reps) - len(shape)
    g = grad
    # the padded leading dims are whole copies: sum them away
    for _ in range(lead):
        g = g.sum(0)
    for d in range(len(shape)):
        r, n = reps[lead + d], shape[d]
        g = g.unflatten(d, (r, n)).sum(d)
    return g.reshape(shape)
