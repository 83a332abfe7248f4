# %% ex1
def softmax_backward(P, grad_P):
    """grad_Z = Jᵀ grad_P per row along the last dim, without building the Jacobian."""
    s = (P * grad_P).sum(-1).unsqueeze(-1)
    return P * grad_P - s * P
# %% ex2
class Softmax(torch.autograd.Function):
    """P = softmax(Z) over the last dim; saves only P."""

    @staticmethod
    def forward(Z):
        ex = torch.exp(Z - Z.amax(-1).unsqueeze(-1))
        return ex / ex.sum(-1).unsqueeze(-1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)  # only P, never Z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_P):
        saved = ctx.saved_tensors
        if ctx.needs_input_grad[0]:
            return softmax_backward(saved[0], grad_P)
        return None
# %% ex3
class RMSNorm(torch.autograd.Function):
    """y = γ x / √(mean(x²) + eps) over the last dim; saves x and γ."""

    @staticmethod
    def forward(x, weight, eps):
        D = x.shape[-1]
        r = ((x * x).sum(-1, keepdim=True) / D + eps) ** 0.5
        return weight * x / r

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, eps = inputs
        ctx.save_for_backward(x, weight)
        ctx.eps = float(eps)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        D = x.shape[-1]
        r = ((x * x).sum(-1, keepdim=True) / D + ctx.eps) ** 0.5
        x_hat = x / r
        out = [None, None, None]
        if ctx.needs_input_grad[0]:
            g = grad_y * weight
            m = (g * x_hat).sum(-1, keepdim=True) / D
            out[0] = (g - x_hat * m) / r
        if ctx.needs_input_grad[1]:
            lead = tuple(range(x.dim() - 1))
            out[1] = (grad_y * x_hat).sum(dim=lead)
        return tuple(out)
# %% ex4
class CrossEntropy(torch.autograd.Function):
    """L = mean over kept rows of lse(z) − z[target]; ignore_index rows left out."""

    @staticmethod
    def forward(logits, target, ignore_index):
        valid = target != ignore_index
        tgt = target.masked_fill(~valid, 0)
        m = logits.amax(-1, keepdim=True)
        log_probs = logits - m - (logits - m).exp().sum(-1, keepdim=True).log()
        nll = -log_probs.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        return nll.masked_fill(~valid, 0.0).sum() / valid.sum().clamp(min=1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, target, ignore_index = inputs
        ctx.save_for_backward(logits, target)
        ctx.ignore_index = ignore_index

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_L):
        logits, target = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        valid = target != ctx.ignore_index
        tgt = target.masked_fill(~valid, 0)
        probs = (logits - logits.amax(-1, keepdim=True)).exp()
        probs = probs / probs.sum(-1, keepdim=True)
        probs = probs.scatter_add(-1, tgt.unsqueeze(-1), -torch.ones_like(probs[:, :1]))
        probs = probs.masked_fill(~valid.unsqueeze(-1), 0.0)
        return probs * grad_L / valid.sum().clamp(min=1), None, None
