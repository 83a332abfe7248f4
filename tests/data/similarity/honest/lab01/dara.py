# %% ex1
def forward_pass(x, W1, b1, W2, b2, y_true):
    """h = W1 x + b1, a = relu(h), ŷ = W2 a + b2, L = Σ(ŷ - y)², in a dict."""
    # (2, 4) @ (4,) -> (2,)
    h = W1.mv(x) + b1
    # (2,)
    a = torch.maximum(h, torch.zeros_like(h))
    # (1, 2) @ (2,) -> (1,)
    y_hat = W2.mv(a) + b2
    # ()
    L = torch.sum((y_hat - y_true) ** 2)
    return {"h": h, "a": a, "y_hat": y_hat, "L": L}
# %% ex2
def grad_loss(y_hat, y_true):
    """∂L/∂ŷ for L = Σ(ŷ - y)², with the shape of ŷ."""
    # (1,)
    err = y_hat - y_true
    grad_y_hat = err + err
    return grad_y_hat
# %% ex3
def layer2_backward(grad_y_hat, a, W2):
    """(grad_W2, grad_b2, grad_a) for ŷ = W2 a + b2, given grad_y_hat = ∂L/∂ŷ."""
    # -> (1, 2), the shape of W2
    grad_W2 = torch.ger(grad_y_hat, a)
    # (1,)
    grad_b2 = grad_y_hat.detach().clone()
    # -> (2,), the shape of a
    grad_a = W2.t().mv(grad_y_hat)
    return grad_W2, grad_b2, grad_a
# %% ex4
def relu_backward(grad_a, h):
    """∂L/∂h for a = relu(h), given grad_a = ∂L/∂a (relu'(0) = 0, as in PyTorch)."""
    # -> (n,), the shape of h
    grad_h = grad_a.clone()
    grad_h[h <= 0] = 0.0
    return grad_h
# %% ex5
def layer1_backward(grad_h, x):
    """(grad_W1, grad_b1) for h = W1 x + b1, given grad_h = ∂L/∂h."""
    # -> (2, 4), the shape of W1
    grad_W1 = torch.ger(grad_h, x)
    # (2,)
    grad_b1 = grad_h.detach().clone()
    return grad_W1, grad_b1
# %% ex6
def cat_backward_batch(X, W1, b1, W2, b2, Y):
    """Forward, then {"W1", "b1", "W2", "b2"}: ∂L/∂θ for L = Σ_b (ŷ_b - y_b)²."""
    Z1 = X.mm(W1.t()) + b1          # (B, 2)
    A1 = torch.maximum(Z1, torch.zeros_like(Z1))
    Z2 = A1.mm(W2.t()) + b2         # (B, 1)
    err = Z2 - Y
    dZ2 = err + err                 # (B, 1)
    dA1 = dZ2.mm(W2)                # (B, 2)
    dZ1 = dA1.clone()
    dZ1[Z1 <= 0] = 0.0
    return {
        "W1": dZ1.t().mm(X),
        "b1": dZ1.sum(0),
        "W2": dZ2.t().mm(A1),
        "b2": dZ2.sum(0),
    }
