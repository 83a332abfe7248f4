# %% ex1
def forward_pass(x, W1, b1, W2, b2, y_true):
    """h = W1 x + b1, a = relu(h), ŷ = W2 a + b2, L = Σ(ŷ - y)², in a dict."""
    # (2, 4) @ (4,) -> (2,)
    h = W1 @ x + b1
    # (2,)
    a = torch.relu(h)
    # (1, 2) @ (2,) -> (1,)
    y_hat = W2 @ a + b2
    # ()
    L = ((y_hat - y_true) ** 2).sum()
    return {"h": h, "a": a, "y_hat": y_hat, "L": L}
# %% ex2
def grad_loss(y_hat, y_true):
    """∂L/∂ŷ for L = Σ(ŷ - y)², with the shape of ŷ."""
    # (1,)
    grad_y_hat = 2 * (y_hat - y_true)
    return grad_y_hat
# %% ex3
def layer2_backward(grad_y_hat, a, W2):
    """(grad_W2, grad_b2, grad_a) for ŷ = W2 a + b2, given grad_y_hat = ∂L/∂ŷ."""
    # -> (1, 2), the shape of W2
    grad_W2 = torch.outer(grad_y_hat, a)
    # (1,)
    grad_b2 = grad_y_hat.clone()
    # -> (2,), the shape of a
    grad_a = W2.T @ grad_y_hat
    return grad_W2, grad_b2, grad_a
# %% ex4
def relu_backward(grad_a, h):
    """∂L/∂h for a = relu(h), given grad_a = ∂L/∂a (relu'(0) = 0, as in PyTorch)."""
    # -> (n,), the shape of h
    grad_h = grad_a * (h > 0)
    return grad_h
# %% ex5
def layer1_backward(grad_h, x):
    """(grad_W1, grad_b1) for h = W1 x + b1, given grad_h = ∂L/∂h."""
    # -> (2, 4), the shape of W1
    grad_W1 = torch.outer(grad_h, x)
    # (2,)
    grad_b1 = grad_h.clone()
    return grad_W1, grad_b1
# %% ex6
def cat_backward_batch(X, W1, b1, W2, b2, Y):
    """Forward, then {"W1", "b1", "W2", "b2"}: ∂L/∂θ for L = Σ_b (ŷ_b - y_b)²."""
    H = X @ W1.T + b1  # (B, 2)
    A = torch.relu(H)
    Y_hat = A @ W2.T + b2  # (B, 1)
    dY = 2 * (Y_hat - Y)  # (B, 1)
    dW2 = dY.T @ A  # (1, 2)
    db2 = dY.sum(dim=0)
    dA = dY @ W2  # (B, 2)
    dH = dA * (H > 0)
    dW1 = dH.T @ X  # (2, 4)
    db1 = dH.sum(dim=0)
    return {"W1": dW1, "b1": db1, "W2": dW2, "b2": db2}
