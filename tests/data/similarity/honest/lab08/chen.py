# %% ex1
def grads_from_W_prime(grad_Wp, A, B, s):
    """grad_A = s·Bᵀ grad_Wp (r, in), grad_B = s·grad_Wp Aᵀ (out, r), W' = W + s·BA."""
    return s * torch.einsum("or,oi->ri", B, grad_Wp), s * torch.einsum("oi,ri->or", grad_Wp, A)
# %% ex2
def lora_backward(g, x, W, A, B, s, needs=(True, True, True)):
    """grad_x = gW + s(gB)A, grad_A = s(gB)ᵀx, grad_B = s·gᵀ(xAᵀ); None where needs is
    False."""
    want_x, want_A, want_B = needs
    out = [None, None, None]
    gB = torch.einsum("ro,ok->rk", g, B) if want_x or want_A else None
    if want_x:
        out[0] = torch.einsum("ro,oi->ri", g, W) + s * torch.einsum("rk,ki->ri", gB, A)
    if want_A:
        out[1] = s * torch.einsum("rk,ri->ki", gB, x)
    if want_B:
        out[2] = s * torch.einsum("ro,rk->ok", g, torch.einsum("ri,ki->rk", x, A))
    return tuple(out)
# %% ex3
def init_adapter(W, r, seed):
    """A (r, in) uniform on ±1/√in (Kaiming-uniform, a = √5), B (out, r) zeros; W's
    dtype and device."""
    fan_in = W.size(1)
    u = rand(r, fan_in, seed=seed, dtype=torch.float64)
    A = ((2 * u - 1) / math.sqrt(fan_in)).to(device=W.device, dtype=W.dtype)
    B = W.new_zeros(W.size(0), r)
    return A, B
# %% ex4
def merge_(layer, A, B, s):
    """layer.weight ← W + s·BA, in place; returns layer."""
    delta = s * torch.einsum("or,ri->oi", B, A)
    with torch.no_grad():
        layer.weight.copy_(layer.weight + delta)
    return layer


def unmerge_(layer, A, B, s):
    """layer.weight ← W − s·BA, in place; returns layer."""
    delta = s * torch.einsum("or,ri->oi", B, A)
    with torch.no_grad():
        layer.weight.copy_(layer.weight - delta)
    return layer
# %% ex5
class LoRALinearFn(torch.autograd.Function):
    """y = x Wᵀ + s·(x Aᵀ) Bᵀ with W frozen; backward through the r-dim x Aᵀ only."""

    @staticmethod
    def forward(x, W, A, B, s):
        xa = torch.einsum("...i,ki->...k", x, A)
        return torch.einsum("...i,oi->...o", x, W) + s * torch.einsum("...k,ok->...o", xa, B)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, W, A, B, s = inputs
        ctx.save_for_backward(x, W, A, B)
        ctx.scale = float(s)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, W, A, B = ctx.saved_tensors
        g = grad_y.flatten(0, -2)
        xf = x.flatten(0, -2)
        n = ctx.needs_input_grad
        gx, gA, gB = lora_backward(g, xf, W, A, B, ctx.scale, needs=(n[0], n[2], n[3]))
        gW = None
        if n[1]:
            gW = torch.einsum("ro,ri->oi", g, xf)
        if gx is not None:
            gx = gx.view(x.shape)
        return gx, gW, gA, gB, None
