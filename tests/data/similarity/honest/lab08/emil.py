# %% ex1
def grads_from_W_prime(grad_Wp, A, B, s):
    """grad_A = s·Bᵀ grad_Wp (r, in), grad_B = s·grad_Wp Aᵀ (out, r), W' = W + s·BA."""
    grad_A = torch.mm(B.t(), grad_Wp).mul(s)  # (r, out) @ (out, in)
    grad_B = torch.mm(grad_Wp, A.t()).mul(s)  # (out, in) @ (in, r)
    return grad_A, grad_B
# %% ex2
def lora_backward(g, x, W, A, B, s, needs=(True, True, True)):
    """grad_x = gW + s(gB)A, grad_A = s(gB)ᵀx, grad_B = s·gᵀ(xAᵀ); None where needs is
    False."""
    results = {"x": None, "A": None, "B": None}
    cache = {}

    def g_B():
        if "gB" not in cache:
            cache["gB"] = torch.mm(g, B)
        return cache["gB"]

    if needs[0]:
        results["x"] = torch.mm(g, W).add(torch.mm(g_B(), A), alpha=s)
    if needs[1]:
        results["A"] = torch.mm(g_B().t(), x).mul(s)
    if needs[2]:
        results["B"] = torch.mm(g.t(), torch.mm(x, A.t())).mul(s)
    return results["x"], results["A"], results["B"]
# %% ex3
def init_adapter(W, r, seed):
    """A (r, in) uniform on ±1/√in (Kaiming-uniform, a = √5), B (out, r) zeros; W's
    dtype and device."""
    d_in = W.shape[1]
    lim = d_in ** -0.5
    uniform01 = rand(r, d_in, seed=seed, dtype=torch.float64)
    A = (uniform01 * 2 - 1) * lim
    A = A.to(dtype=W.dtype, device=W.device)
    B = torch.zeros(W.shape[0], r, dtype=W.dtype, device=W.device)
    return A, B
# %% ex4
def merge_(layer, A, B, s):
    """layer.weight ← W + s·BA, in place; returns layer."""
    with torch.no_grad():
        update = torch.mm(B, A).mul(s).to(layer.weight.dtype)
        layer.weight.data.add_(update)
    return layer


def unmerge_(layer, A, B, s):
    """layer.weight ← W − s·BA, in place; returns layer."""
    with torch.no_grad():
        update = torch.mm(B, A).mul(s).to(layer.weight.dtype)
        layer.weight.data.sub_(update)
    return layer
# %% ex5
class LoRALinearFn(torch.autograd.Function):
    """y = x Wᵀ + s·(x Aᵀ) Bᵀ with W frozen; backward through the r-dim x Aᵀ only."""

    @staticmethod
    def forward(x, W, A, B, s):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        y2 = torch.mm(x2, W.t()) + s * torch.mm(torch.mm(x2, A.t()), B.t())
        return y2.reshape(*lead, W.shape[0])

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, W, A, B, s = inputs
        ctx.save_for_backward(x, W, A, B)
        ctx.s = s

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, W, A, B = ctx.saved_tensors
        needs_x, needs_W, needs_A, needs_B, _ = ctx.needs_input_grad
        g2 = grad_y.reshape(-1, grad_y.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        grad_x, grad_A, grad_B = lora_backward(g2, x2, W, A, B, ctx.s, needs=(needs_x, needs_A, needs_B))
        if needs_x:
            grad_x = grad_x.reshape(x.shape)
        grad_W = torch.mm(g2.t(), x2) if needs_W else None
        return grad_x, grad_W, grad_A, grad_B, None
