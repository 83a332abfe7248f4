# %% ex1
def grads_from_W_prime(grad_Wp, A, B, s):
    """grad_A = s·Bᵀ grad_Wp (r, in), grad_B = s·grad_Wp Aᵀ (out, r), W' = W + s·BA."""
    # W' = W + s B A: product rule on B A
    dA = torch.matmul(B.t(), grad_Wp) * s
    dB = torch.matmul(grad_Wp, A.t()) * s
    return dA, dB
# %% ex2
def lora_backward(g, x, W, A, B, s, needs=(True, True, True)):
    """grad_x = gW + s(gB)A, grad_A = s(gB)ᵀx, grad_B = s·gᵀ(xAᵀ); None where needs is
    False."""
    dx = dA = dB = None
    if needs[0] or needs[1]:
        gB = torch.matmul(g, B)
    if needs[0]:
        dx = torch.matmul(g, W) + s * torch.matmul(gB, A)
    if needs[1]:
        dA = s * torch.matmul(gB.t(), x)
    if needs[2]:
        xA = torch.matmul(x, A.t())
        dB = s * torch.matmul(g.t(), xA)
    return dx, dA, dB
# %% ex3
def init_adapter(W, r, seed):
    """A (r, in) uniform on ±1/√in (Kaiming-uniform, a = √5), B (out, r) zeros; W's
    dtype and device."""
    out_f, in_f = W.shape
    bound = 1.0 / math.sqrt(in_f)
    A = (2 * rand(r, in_f, seed=seed, dtype=torch.float64) - 1) * bound
    return A.to(W), torch.zeros((out_f, r), dtype=W.dtype, device=W.device)
# %% ex4
def merge_(layer, A, B, s):
    """layer.weight ← W + s·BA, in place; returns layer."""
    with torch.no_grad():
        layer.weight.add_(torch.matmul(B, A), alpha=s)
    return layer


def unmerge_(layer, A, B, s):
    """layer.weight ← W − s·BA, in place; returns layer."""
    with torch.no_grad():
        layer.weight.sub_(torch.matmul(B, A), alpha=s)
    return layer
# %% ex5
class LoRALinearFn(torch.autograd.Function):
    """y = x Wᵀ + s·(x Aᵀ) Bᵀ with W frozen; backward through the r-dim x Aᵀ only."""

    @staticmethod
    def forward(x, W, A, B, s):
        base = torch.matmul(x, W.t())
        low_rank = torch.matmul(torch.matmul(x, A.t()), B.t())
        return base + s * low_rank

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:4])
        ctx.s = inputs[4]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, W, A, B = ctx.saved_tensors
        in_dim = x.shape[-1]
        out_dim = grad_y.shape[-1]
        gy = grad_y.reshape(-1, out_dim)
        xx = x.reshape(-1, in_dim)
        needs = ctx.needs_input_grad
        dx, dA, dB = lora_backward(gy, xx, W, A, B, ctx.s, (needs[0], needs[2], needs[3]))
        dx = dx.reshape(x.shape) if dx is not None else None
        dW = torch.matmul(gy.t(), xx) if needs[1] else None
        return dx, dW, dA, dB, None
