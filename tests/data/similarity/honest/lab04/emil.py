# %% ex1
def softmax_backward(P, grad_P):
    """grad_Z = Jᵀ grad_P per row along the last dim, without building the Jacobian."""
    # row-wise: dz_j = p_j (g_j - sum_i g_i p_i)
    weighted = grad_P.mul(P).sum(dim=-1, keepdim=True)
    return P.mul(grad_P.sub(weighted))
# %% ex2
class Softmax(torch.autograd.Function):
    """P = softmax(Z) over the last dim; saves only P."""

    @staticmethod
    def forward(Z):
        Zs = Z.sub(Z.max(dim=-1, keepdim=True).values)
        num = Zs.exp()
        P = num.div(num.sum(dim=-1, keepdim=True))
        return P

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_P):
        (P,) = ctx.saved_tensors
        needs_Z = ctx.needs_input_grad[0]
        grad_Z = softmax_backward(P, grad_P) if needs_Z else None
        return grad_Z
# %% ex3
class RMSNorm(torch.autograd.Function):
    """y = γ x / √(mean(x²) + eps) over the last dim; saves x and γ."""

    @staticmethod
    def forward(x, weight, eps):
        return x.div(x.square().mean(-1, keepdim=True).add(eps).sqrt()).mul(weight)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        need_x, need_w, _ = ctx.needs_input_grad
        r = x.square().mean(-1, keepdim=True).add(ctx.eps).sqrt()
        normed = x.div(r)
        grad_x = None
        grad_w = None
        if need_x:
            g = grad_y.mul(weight)
            proj = g.mul(normed).mean(-1, keepdim=True)
            grad_x = g.sub(normed.mul(proj)).div(r)
        if need_w:
            grad_w = grad_y.mul(normed).flatten(0, -2).sum(0) if x.dim() > 1 else grad_y.mul(normed)
        return grad_x, grad_w, None
# %% ex4
class CrossEntropy(torch.autograd.Function):
    """L = mean over kept rows of lse(z) − z[target]; ignore_index rows left out."""

    @staticmethod
    def forward(logits, target, ignore_index):
        total = logits.new_zeros(())
        count = 0
        for r in range(logits.shape[0]):
            t = int(target[r])
            if t == ignore_index:
                continue
            total = total + torch.logsumexp(logits[r], dim=0) - logits[r, t]
            count += 1
        return total / count

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, target, ignore_index = inputs
        ctx.save_for_backward(logits, target)
        ctx.ignore_index = ignore_index

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_L):
        logits, target = ctx.saved_tensors
        rows = [r for r in range(logits.shape[0]) if int(target[r]) != ctx.ignore_index]
        grad = torch.zeros_like(logits)
        for r in rows:
            grad[r] = torch.softmax(logits[r], dim=0)
            grad[r, int(target[r])] -= 1.0
        grad = grad * grad_L / len(rows)
        return grad, None, None
