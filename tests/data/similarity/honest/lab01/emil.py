# %% ex1
def forward_pass(x, W1, b1, W2, b2, y_true):
    """h = W1 x + b1, a = relu(h), ŷ = W2 a + b2, L = Σ(ŷ - y)², in a dict."""
    # (2, 4) @ (4,) -> (2,)
    h = torch.einsum("ij,j->i", W1, x) + b1
    # (2,)
    a = torch.nn.functional.relu(h)
    # (1, 2) @ (2,) -> (1,)
    y_hat = torch.einsum("ij,j->i", W2, a) + b2
    # ()
    L = torch.square(y_hat - y_true).sum()
    return {"h": h, "a": a, "y_hat": y_hat, "L": L}
# %% ex2
def grad_loss(y_hat, y_true):
    """∂L/∂ŷ for L = Σ(ŷ - y)², with the shape of ŷ."""
    # (1,)
    grad_y_hat = (y_hat - y_true) * 2
    return grad_y_hat
# %% ex3
def layer2_backward(grad_y_hat, a, W2):
    """(grad_W2, grad_b2, grad_a) for ŷ = W2 a + b2, given grad_y_hat = ∂L/∂ŷ."""
    # -> (1, 2), the shape of W2
    grad_W2 = torch.einsum("i,j->ij", grad_y_hat, a)
    # (1,)
    grad_b2 = grad_y_hat.clone()
    # -> (2,), the shape of a
    grad_a = torch.einsum("ij,i->j", W2, grad_y_hat)
    return grad_W2, grad_b2, grad_a
# %% ex4
def relu_backward(grad_a, h):
    """∂L/∂h for a = relu(h), given grad_a = ∂L/∂a (relu'(0) = 0, as in PyTorch)."""
    # -> (n,), the shape of h
    slope = torch.heaviside(h, torch.zeros_like(h))  # 1 where h > 0, 0 at and below 0
    grad_h = slope * grad_a
    return grad_h
# %% ex5
def layer1_backward(grad_h, x):
    """(grad_W1, grad_b1) for h = W1 x + b1, given grad_h = ∂L/∂h."""
    # -> (2, 4), the shape of W1
    grad_W1 = torch.einsum("i,j->ij", grad_h, x)
    # (2,)
    grad_b1 = grad_h.clone()
    return grad_W1, grad_b1
# %% ex6
def cat_backward_batch(X, W1, b1, W2, b2, Y):
    """Forward, then {"W1", "b1", "W2", "b2"}: ∂L/∂θ for L = Σ_b (ŷ_b - y_b)²."""
    # forward: batch on the rows
    H = torch.einsum("bi,oi->bo", X, W1) + b1
    A = torch.nn.functional.relu(H)
    Yh = torch.einsum("bi,oi->bo", A, W2) + b2
    # backward, the same as the single-sample case but summed over b
    gY = (Yh - Y) * 2
    gW2 = torch.einsum("bo,bi->oi", gY, A)
    gb2 = gY.sum(0)
    gA = torch.einsum("bo,oi->bi", gY, W2)
    gH = gA * torch.heaviside(H, torch.zeros_like(H))
    gW1 = torch.einsum("bo,bi->oi", gH, X)
    gb1 = gH.sum(0)
    return dict(W1=gW1, b1=gb1, W2=gW2, b2=gb2)
