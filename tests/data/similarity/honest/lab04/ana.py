# %% ex1
def softmax_backward(P, grad_P):
    """grad_Z = Jᵀ grad_P per row along the last dim, without building the Jacobian."""
    return P * (grad_P - (grad_P * P).sum(dim=-1, keepdim=True))
# %% ex2
class Softmax(torch.autograd.Function):
    """P = softmax(Z) over the last dim; saves only P."""

    @staticmethod
    def forward(Z):
        shifted = Z - Z.amax(dim=-1, keepdim=True)
        e = shifted.exp()
        return e / e.sum(dim=-1, keepdim=True)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_P):
        (P,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None
        return softmax_backward(P, grad_P)
# %% ex3
class RMSNorm(torch.autograd.Function):
    """y = γ x / √(mean(x²) + eps) over the last dim; saves x and γ."""

    @staticmethod
    def forward(x, weight, eps):
        r = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        return weight * (x / r)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = eps

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        r = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + ctx.eps)
        x_hat = x / r
        grad_x = grad_weight = None
        if ctx.needs_input_grad[0]:
            g = grad_y * weight
            grad_x = (g - x_hat * (g * x_hat).mean(dim=-1, keepdim=True)) / r
        if ctx.needs_input_grad[1]:
            grad_weight = (grad_y * x_hat).reshape(-1, x.shape[-1]).sum(dim=0)
        return grad_x, grad_weight, None
# %% ex4
class CrossEntropy(torch.autograd.Function):
    """L = mean over kept rows of lse(z) − z[target]; ignore_index rows left out."""

    @staticmethod
    def forward(logits, target, ignore_index):
        keep = target != ignore_index
        safe_t = torch.where(keep, target, torch.zeros_like(target))
        lse = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(1, safe_t[:, None]).squeeze(1)
        losses = (lse - picked) * keep
        return losses.sum() / keep.sum()

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, target, ignore_index = inputs
        ctx.save_for_backward(logits, target)
        ctx.ignore_index = ignore_index

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_L):
        logits, target = ctx.saved_tensors
        keep = target != ctx.ignore_index
        n = keep.sum()
        safe_t = torch.where(keep, target, torch.zeros_like(target))
        p = torch.softmax(logits, dim=-1)
        onehot = torch.nn.functional.one_hot(safe_t, logits.shape[-1]).to(logits.dtype)
        grad = (p - onehot) * keep[:, None] / n * grad_L
        return grad, None, None
