# %% ex1
def grads_from_W_prime(grad_Wp, A, B, s):
    """grad_A = s·Bᵀ grad_Wp (r, in), grad_B = s·grad_Wp Aᵀ (out, r), W' = W + s·BA."""
    scaled = s * grad_Wp
    return B.mT @ scaled, scaled @ A.mT
# %% ex2
def lora_backward(g, x, W, A, B, s, needs=(True, True, True)):
    """grad_x = gW + s(gB)A, grad_A = s(gB)ᵀx, grad_B = s·gᵀ(xAᵀ); None where needs is
    False."""
    nx, nA, nB = needs
    gB = (g @ B) * s if nx or nA else None  # (R, r), already scaled
    grad_x = g @ W + gB @ A if nx else None
    grad_A = gB.mT @ x if nA else None
    grad_B = s * g.mT @ (x @ A.mT) if nB else None
    return grad_x, grad_A, grad_B
# %% ex3
def init_adapter(W, r, seed):
    """A (r, in) uniform on ±1/√in (Kaiming-uniform, a = √5), B (out, r) zeros; W's
    dtype and device."""
    n_out, n_in = W.shape
    A = 2 * rand(r, n_in, seed=seed, dtype=torch.float64) - 1
    A = A / math.sqrt(n_in)
    A = A.to(W.device).to(W.dtype)
    B = torch.zeros_like(W[:, :r]) if r <= n_in else torch.zeros(n_out, r, dtype=W.dtype, device=W.device)
    return A, B
# %% ex4
def _shift(layer, A, B, s):
    with torch.no_grad():
        layer.weight.addmm_(B, A, alpha=s)
    return layer


def merge_(layer, A, B, s):
    """layer.weight ← W + s·BA, in place; returns layer."""
    return _shift(layer, A, B, s)


def unmerge_(layer, A, B, s):
    """layer.weight ← W − s·BA, in place; returns layer."""
    return _shift(layer, A, B, -s)
# %% ex5
class LoRALinearFn(torch.autograd.Function):
    """y = x Wᵀ + s·(x Aᵀ) Bᵀ with W frozen; backward through the r-dim x Aᵀ only."""

    @staticmethod
    def forward(x, W, A, B, s):
        y = x @ W.mT
        y = y + s * (x @ A.mT) @ B.mT
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, W, A, B, s = inputs
        ctx.s = s
        ctx.save_for_backward(x, W, A, B)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, W, A, B = ctx.saved_tensors
        need = ctx.needs_input_grad
        G = grad_y.reshape(-1, W.shape[0])
        X = x.reshape(-1, W.shape[1])
        gx, gA, gB = lora_backward(G, X, W, A, B, ctx.s, needs=(need[0], need[2], need[3]))
        return (
            None if gx is None else gx.reshape(x.shape),
            G.mT @ X if need[1] else None,
            gA,
            gB,
            None,
        )
