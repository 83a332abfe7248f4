# %% ex1
def grads_from_W_prime(grad_Wp, A, B, s):
    """grad_A = s·Bᵀ grad_Wp (r, in), grad_B = s·grad_Wp Aᵀ (out, r), W' = W + s·BA."""
    grad_A = s * B.T @ grad_Wp
    grad_B = s * grad_Wp @ A.T
    return grad_A, grad_B
# %% ex2
def lora_backward(g, x, W, A, B, s, needs=(True, True, True)):
    """grad_x = gW + s(gB)A, grad_A = s(gB)ᵀx, grad_B = s·gᵀ(xAᵀ); None where needs is
    False."""
    need_x, need_A, need_B = needs
    gB = g @ B if (need_x or need_A) else None  # (R, r)
    grad_x = g @ W + s * (gB @ A) if need_x else None
    grad_A = s * (gB.T @ x) if need_A else None
    grad_B = s * (g.T @ (x @ A.T)) if need_B else None
    return grad_x, grad_A, grad_B
# %% ex3
def init_adapter(W, r, seed):
    """A (r, in) uniform on ±1/√in (Kaiming-uniform, a = √5), B (out, r) zeros; W's
    dtype and device."""
    d_out, d_in = W.shape
    A = (2 * rand(r, d_in, seed=seed, dtype=torch.float64) - 1) / math.sqrt(d_in)
    A = A.to(dtype=W.dtype, device=W.device)
    B = torch.zeros(d_out, r, dtype=W.dtype, device=W.device)
    return A, B
# %% ex4
def merge_(layer, A, B, s):
    """layer.weight ← W + s·BA, in place; returns layer."""
    with torch.no_grad():
        layer.weight += s * (B @ A)
    return layer


def unmerge_(layer, A, B, s):
    """layer.weight ← W − s·BA, in place; returns layer."""
    with torch.no_grad():
        layer.weight -= s * (B @ A)
    return layer
# %% ex5
class LoRALinearFn(torch.autograd.Function):
    """y = x Wᵀ + s·(x Aᵀ) Bᵀ with W frozen; backward through the r-dim x Aᵀ only."""

    @staticmethod
    def forward(x, W, A, B, s):
        return x @ W.T + s * ((x @ A.T) @ B.T)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, W, A, B, s = inputs
        ctx.save_for_backward(x, W, A, B)
        ctx.s = s

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, W, A, B = ctx.saved_tensors
        g2 = grad_y.reshape(-1, grad_y.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        nig = ctx.needs_input_grad
        grad_x, grad_A, grad_B = lora_backward(g2, x2, W, A, B, ctx.s, needs=(nig[0], nig[2], nig[3]))
        if grad_x is not None:
            grad_x = grad_x.reshape(x.shape)
        grad_W = g2.T @ x2 if nig[1] else None
        return grad_x, grad_W, grad_A, grad_B, None
