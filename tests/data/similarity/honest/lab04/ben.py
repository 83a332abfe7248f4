# %% ex1
def softmax_backward(P, grad_P):
    """grad_Z = Jᵀ grad_P per row along the last dim, without building the Jacobian."""
    # J = diag(p) - p p^T, so J^T g = p*g - p <p, g>
    inner = torch.sum(P * grad_P, dim=-1, keepdim=True)
    grad_Z = P * grad_P - P * inner
    return grad_Z
# %% ex2
class Softmax(torch.autograd.Function):
    """P = softmax(Z) over the last dim; saves only P."""

    @staticmethod
    def forward(Z):
        m, _ = torch.max(Z, dim=-1, keepdim=True)
        num = torch.exp(Z - m)
        den = torch.sum(num, dim=-1, keepdim=True)
        P = num / den
        return P

    @staticmethod
    def setup_context(ctx, inputs, output):
        P = output
        ctx.save_for_backward(P)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_P):
        P = ctx.saved_tensors[0]
        grad_Z = None
        if ctx.needs_input_grad[0]:
            grad_Z = softmax_backward(P, grad_P)
        return grad_Z
# %% ex3
class RMSNorm(torch.autograd.Function):
    """y = γ x / √(mean(x²) + eps) over the last dim; saves x and γ."""

    @staticmethod
    def forward(x, weight, eps):
        ms = torch.mean(x * x, dim=-1, keepdim=True)
        rms = torch.sqrt(ms + eps)
        y = x / rms * weight
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1])
        ctx.eps = inputs[2]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        D = x.shape[-1]
        rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + ctx.eps)
        xhat = x / rms
        gx = gw = None
        if ctx.needs_input_grad[0]:
            g = grad_y * weight
            # direct path + path through rms
            dot = torch.sum(g * x, dim=-1, keepdim=True)
            gx = g / rms - x * dot / (D * rms**3)
        if ctx.needs_input_grad[1]:
            gw = grad_y * xhat
            while gw.dim() > 1:
                gw = gw.sum(0)
        return gx, gw, None
# %% ex4
class CrossEntropy(torch.autograd.Function):
    """L = mean over kept rows of lse(z) − z[target]; ignore_index rows left out."""

    @staticmethod
    def forward(logits, target, ignore_index):
        mask = (target != ignore_index).to(logits.dtype)
        m = logits.max(dim=1, keepdim=True).values
        lse = m.squeeze(1) + torch.log(torch.exp(logits - m).sum(dim=1))
        t = target.clone()
        t[target == ignore_index] = 0
        z_t = logits[torch.arange(logits.shape[0]), t]
        return ((lse - z_t) * mask).sum() / mask.sum()

    @staticmethod
    def setup_context(ctx, inputs, output):
        logits, target, ignore_index = inputs
        ctx.save_for_backward(logits, target)
        ctx.ignore_index = ignore_index

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_L):
        logits, target = ctx.saved_tensors
        mask = (target != ctx.ignore_index).to(logits.dtype)
        t = target.clone()
        t[target == ctx.ignore_index] = 0
        m = logits.max(dim=1, keepdim=True).values
        e = torch.exp(logits - m)
        soft = e / e.sum(dim=1, keepdim=True)
        soft[torch.arange(logits.shape[0]), t] -= 1.0
        grad_logits = soft * mask.unsqueeze(1) * (grad_L / mask.sum())
        return grad_logits, None, None
