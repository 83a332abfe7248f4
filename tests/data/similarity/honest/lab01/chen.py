# %% ex1
def forward_pass(x, W1, b1, W2, b2, y_true):
    """h = W1 x + b1, a = relu(h), ŷ = W2 a + b2, L = Σ(ŷ - y)², in a dict."""
    h = W1 @ x + b1  # (2,)
    a = h.relu()
    y_hat = W2 @ a + b2  # (1,)
    L = (y_hat - y_true).pow(2).sum()
    return {"h": h, "a": a, "y_hat": y_hat, "L": L}
# %% ex2
def grad_loss(y_hat, y_true):
    """∂L/∂ŷ for L = Σ(ŷ - y)², with the shape of ŷ."""
    return 2 * (y_hat - y_true)
# %% ex3
def layer2_backward(grad_y_hat, a, W2):
    """(grad_W2, grad_b2, grad_a) for ŷ = W2 a + b2, given grad_y_hat = ∂L/∂ŷ."""
    # y_i = sum_j W_ij a_j + b_i  ->  dL/dW_ij = g_i a_j
    grad_W2 = grad_y_hat.unsqueeze(1) @ a.unsqueeze(0)
    grad_b2 = grad_y_hat
    # dL/da_j = sum_i g_i W_ij
    grad_a = grad_y_hat @ W2
    return grad_W2, grad_b2, grad_a
# %% ex4
def relu_backward(grad_a, h):
    """∂L/∂h for a = relu(h), given grad_a = ∂L/∂a (relu'(0) = 0, as in PyTorch)."""
    mask = (h > 0).to(grad_a.dtype)
    return grad_a * mask
# %% ex5
def layer1_backward(grad_h, x):
    """(grad_W1, grad_b1) for h = W1 x + b1, given grad_h = ∂L/∂h."""
    grad_W1 = grad_h.unsqueeze(1) @ x.unsqueeze(0)  # (2,1)@(1,4)
    grad_b1 = grad_h
    return grad_W1, grad_b1
# %% ex6
def cat_backward_batch(X, W1, b1, W2, b2, Y):
    """Forward, then {"W1", "b1", "W2", "b2"}: ∂L/∂θ for L = Σ_b (ŷ_b - y_b)²."""
    B = X.shape[0]
    grads = {"W1": torch.zeros_like(W1), "b1": torch.zeros_like(b1),
             "W2": torch.zeros_like(W2), "b2": torch.zeros_like(b2)}
    # loop over the samples first, to check against the vectorised version later
    for i in range(B):
        h = W1 @ X[i] + b1
        a = h.relu()
        y_hat = W2 @ a + b2
        g = 2 * (y_hat - Y[i])
        grads["W2"] += g.unsqueeze(1) @ a.unsqueeze(0)
        grads["b2"] += g
        g_a = g @ W2
        g_h = g_a * (h > 0)
        grads["W1"] += g_h.unsqueeze(1) @ X[i].unsqueeze(0)
        grads["b1"] += g_h
    return grads
