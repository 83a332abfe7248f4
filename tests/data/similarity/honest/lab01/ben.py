# %% ex1
def forward_pass(x, W1, b1, W2, b2, y_true):
    """h = W1 x + b1, a = relu(h), ŷ = W2 a + b2, L = Σ(ŷ - y)², in a dict."""
    # (2, 4) @ (4,) -> (2,)
    h = torch.matmul(W1, x) + b1
    # (2,)
    a = torch.clamp(h, min=0)
    # (1, 2) @ (2,) -> (1,)
    y_hat = torch.matmul(W2, a) + b2
    # ()
    diff = y_hat - y_true
    L = torch.sum(diff * diff)
    return {"h": h, "a": a, "y_hat": y_hat, "L": L}
# %% ex2
def grad_loss(y_hat, y_true):
    """∂L/∂ŷ for L = Σ(ŷ - y)², with the shape of ŷ."""
    # (1,)
    # d/dŷ (ŷ - y)^2 = 2(ŷ - y), one entry at a time
    grad_y_hat = 2.0 * y_hat - 2.0 * y_true
    return grad_y_hat
# %% ex3
def layer2_backward(grad_y_hat, a, W2):
    """(grad_W2, grad_b2, grad_a) for ŷ = W2 a + b2, given grad_y_hat = ∂L/∂ŷ."""
    # -> (1, 2), the shape of W2
    grad_W2 = grad_y_hat[:, None] * a[None, :]
    # (1,)
    grad_b2 = grad_y_hat * 1.0
    # -> (2,), the shape of a
    grad_a = torch.matmul(W2.t(), grad_y_hat)
    return grad_W2, grad_b2, grad_a
# %% ex4
def relu_backward(grad_a, h):
    """∂L/∂h for a = relu(h), given grad_a = ∂L/∂a (relu'(0) = 0, as in PyTorch)."""
    # -> (n,), the shape of h
    grad_h = torch.where(h > 0, grad_a, torch.zeros_like(grad_a))
    return grad_h
# %% ex5
def layer1_backward(grad_h, x):
    """(grad_W1, grad_b1) for h = W1 x + b1, given grad_h = ∂L/∂h."""
    # -> (2, 4), the shape of W1
    grad_W1 = grad_h[:, None] * x[None, :]
    # (2,)
    grad_b1 = grad_h * 1.0
    return grad_W1, grad_b1
# %% ex6
def cat_backward_batch(X, W1, b1, W2, b2, Y):
    """Forward, then {"W1", "b1", "W2", "b2"}: ∂L/∂θ for L = Σ_b (ŷ_b - y_b)²."""
    # forward, nn.Linear layout
    h = torch.matmul(X, W1.t()) + b1
    a = torch.clamp(h, min=0)
    out = torch.matmul(a, W2.t()) + b2
    # backward
    g_out = 2.0 * (out - Y)
    g_W2 = torch.matmul(g_out.t(), a)
    g_b2 = torch.sum(g_out, dim=0)
    g_a = torch.matmul(g_out, W2)
    g_h = g_a * (h > 0).to(g_a.dtype)
    g_W1 = torch.matmul(g_h.t(), X)
    g_b1 = torch.sum(g_h, dim=0)
    grads = {"W1": g_W1, "b1": g_b1, "W2": g_W2, "b2": g_b2}
    return grads
