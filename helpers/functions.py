"""Custom ``torch.autograd.Function``s with hand-written backward passes (chapter 4).

Each Function keeps its backward math in a plain function (``softmax_backward``,
``layernorm_backward``, ...; ``Linear`` uses chapter 2's ``helpers.numgrad.linear_backward``)
that takes tensors and returns tensors, so it can be tested without autograd.  The Functions use the modern form
(``forward`` + ``setup_context``), save only what backward needs, gate every
gradient on ``ctx.needs_input_grad`` and never write into ``grad_output``.

Double backward is claimed for ``Linear`` and ``ReLU`` only (their backward is
built from differentiable torch ops); every other backward is ``@once_differentiable``.

The public API is the lowercase wrappers: ``linear, relu, gelu, softmax,
log_softmax, cross_entropy, mse_loss, layer_norm, dropout``; ``helpers.mlp.MLP`` is a network
built from them.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from helpers.checks import expect_int, expect_like, expect_tensor
from helpers.numgrad import linear_backward

__all__ = [
    # wrappers (the public API)
    "linear",
    "relu",
    "gelu",
    "softmax",
    "log_softmax",
    "cross_entropy",
    "mse_loss",
    "layer_norm",
    "dropout",
    "dropout_mask",
    # the Functions
    "Linear",
    "ReLU",
    "GELU",
    "Softmax",
    "LogSoftmax",
    "CrossEntropy",
    "MSE",
    "LayerNorm",
    "Dropout",
    "SoftmaxDiagonalOnly",
    # plain backward math (testable without autograd)
    "relu_backward",
    "gelu_backward",
    "softmax_backward",
    "softmax_backward_diagonal_only",
    "softmax_jacobian",
    "log_softmax_backward",
    "cross_entropy_forward",
    "cross_entropy_backward",
    "mse_backward",
    "layernorm_forward",
    "layernorm_backward",
    "dropout_backward",
]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GELU_C = 0.044715


def _check_dim(x: torch.Tensor, dim: int) -> int:
    """dim as a non-negative index into x (a scalar counts as one dim), or a one-line ValueError."""
    n = max(x.dim(), 1)
    return expect_int("dim", dim, low=-n, high=n - 1) % n


# --------------------------------------------------------------------------- Linear


class Linear(torch.autograd.Function):
    """y = x Wᵀ + b (nn.Linear layout, W is (out, in)); twice differentiable."""

    @staticmethod
    def forward(x, W, b):
        """y = x Wᵀ + b (+ b only when b is given); runs with autograd off."""
        y = x @ W.T  # (..., in) @ (in, out) -> (..., out)
        return y if b is None else y + b

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save x only if grad_W is needed (grad_W = grad_yᵀ x) and W only if grad_x is (grad_x = grad_y W)."""
        x, W, b = inputs
        need_x, need_W = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        # grad_x needs only W and grad_W needs only x: keep neither if nobody asks.
        ctx.save_for_backward(x if need_W else None, W if need_x else None)

    @staticmethod
    def backward(ctx, grad_y):
        """grad_x = grad_y W, grad_W = grad_yᵀ x, grad_b = Σ_rows grad_y (each only if needed)."""
        x, W = ctx.saved_tensors
        grad_x, grad_W, grad_b = linear_backward(x, W, grad_y, ctx.needs_input_grad)
        return grad_x, grad_W, grad_b


def linear(x, W, b=None):
    """y = x Wᵀ + b for x (..., in), W (out, in), b (out,) or None."""
    expect_tensor("x", x, floating=True)
    expect_tensor("W", W, floating=True)
    if W.dim() != 2 or x.dim() < 1 or x.shape[-1] != W.shape[1]:
        raise ValueError(
            f"linear: expected x (..., in) and W (out, in) with matching in, "
            f"got {tuple(x.shape)} and {tuple(W.shape)}"
        )
    # torch.nn.functional.linear refuses mixed dtypes; without this check the forward would
    # promote to the wider one and the backward fail with a dtype error deep inside a matmul.
    expect_like("W", W, "x", x)
    if b is not None:
        expect_tensor("b", b, shape=(W.shape[0],))
        expect_like("b", b, "x", x)
    return Linear.apply(x, W, b)


# --------------------------------------------------------------------------- ReLU


def relu_backward(y, grad_y):
    """y = max(x, 0)  ⇒  grad_x = grad_y · [y > 0] (the output tells where x > 0)."""
    return grad_y * (y > 0)


class ReLU(torch.autograd.Function):
    """y = max(x, 0); saves its output; twice differentiable (the second derivative is 0)."""

    @staticmethod
    def forward(x):
        """y = max(x, 0) = x.clamp(min=0)."""
        return x.clamp(min=0)

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save the output y: [y > 0] = [x > 0] is all backward needs."""
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad_y):
        """grad_x = grad_y · [y > 0]."""
        (y,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None
        return relu_backward(y, grad_y)


def relu(x):
    """y = max(x, 0), elementwise."""
    expect_tensor("x", x, floating=True)
    return ReLU.apply(x)


# --------------------------------------------------------------------------- GELU


def gelu_forward(x, approximate="none"):
    """gelu(x) = x Φ(x) (erf form) or ½x(1 + tanh(√(2/π)(x + 0.044715x³))) (tanh form)."""
    if approximate == "tanh":
        u = _SQRT_2_OVER_PI * (x + _GELU_C * x**3)
        return 0.5 * x * (1.0 + torch.tanh(u))
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_backward(x, grad_y, approximate="none"):
    """erf: gelu'(x) = Φ(x) + x φ(x);  tanh: ½(1 + t) + ½x(1 − t²)·√(2/π)(1 + 3·0.044715x²)."""
    if approximate == "tanh":
        t = torch.tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x**3))
        du = _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * x**2)
        return grad_y * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du)
    cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
    pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return grad_y * (cdf + x * pdf)


class GELU(torch.autograd.Function):
    """y = gelu(x) in the erf ('none') or tanh form; saves x (the derivative needs it)."""

    @staticmethod
    def forward(x, approximate):
        """y = x Φ(x) (approximate='none') or ½x(1 + tanh(√(2/π)(x + 0.044715x³))) (approximate='tanh')."""
        return gelu_forward(x, approximate)

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save x (gelu′(x) needs it) and the form string on ctx."""
        x, approximate = inputs
        ctx.save_for_backward(x)
        ctx.approximate = approximate  # a str: on ctx, not saved

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        """grad_x = grad_y · gelu′(x); no gradient for the form string."""
        (x,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        return gelu_backward(x, grad_y, ctx.approximate), None


def gelu(x, approximate="none"):
    """y = x Φ(x) (approximate='none') or its tanh approximation (approximate='tanh')."""
    expect_tensor("x", x, floating=True)
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: expected approximate 'none' or 'tanh', got {approximate!r}")
    return GELU.apply(x, approximate)


# --------------------------------------------------------------------------- Softmax


def softmax_jacobian(p):
    """J = diag(p) − p pᵀ for one probability vector p (n,): J[i, j] = ∂p_i/∂z_j."""
    return torch.diag(p) - torch.outer(p, p)  # (n, n)


def softmax_backward(P, grad_P, dim=-1):
    """p = softmax(z)  ⇒  grad_z = Jᵀ grad_p = p ∘ (grad_p − ⟨grad_p, p⟩) along dim."""
    inner = (grad_P * P).sum(dim, keepdim=True)  # (..., 1, ...) one ⟨g, p⟩ per row
    return P * (grad_P - inner)


def softmax_backward_diagonal_only(P, grad_P, dim=-1):
    """WRONG on purpose: grad_z = p ∘ (1 − p) ∘ grad_p keeps only J's diagonal (seed 000's mistake)."""
    return P * (1.0 - P) * grad_P


def _stable_softmax(z, dim):
    """softmax(z) = exp(z − max z) / Σ exp(z − max z): the shift keeps exp from overflowing."""
    e = torch.exp(z - z.amax(dim, keepdim=True))
    return e / e.sum(dim, keepdim=True)


class Softmax(torch.autograd.Function):
    """P = softmax(z) along dim; saves only its output P."""

    @staticmethod
    def forward(z, dim):
        """P = exp(z − max z) / Σ exp(z − max z) along dim."""
        return _stable_softmax(z, dim)

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save the output P and dim: grad_z = P ∘ (grad_P − ⟨grad_P, P⟩) needs nothing else."""
        ctx.save_for_backward(output)
        ctx.dim = inputs[1]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_P):
        """grad_z = P ∘ (grad_P − ⟨grad_P, P⟩) along dim; no gradient for dim."""
        (P,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        return softmax_backward(P, grad_P, ctx.dim), None


class SoftmaxDiagonalOnly(Softmax):
    """Softmax with the plausible wrong backward p(1 − p)·g: a teaching example that gradcheck rejects."""

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_P):
        """WRONG on purpose: grad_z = P ∘ (1 − P) ∘ grad_P (the Jacobian's diagonal only)."""
        (P,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        return softmax_backward_diagonal_only(P, grad_P, ctx.dim), None


def softmax(x, dim=-1):
    """P = exp(x) / Σ exp(x) along dim (computed as exp(x − max x) / Σ exp(x − max x))."""
    expect_tensor("x", x, floating=True)
    return Softmax.apply(x, _check_dim(x, dim))


# --------------------------------------------------------------------------- LogSoftmax


def log_softmax_backward(logP, grad_logP, dim=-1):
    """ℓ = z − logsumexp(z)  ⇒  grad_z = grad_ℓ − exp(ℓ) · Σ grad_ℓ along dim."""
    return grad_logP - torch.exp(logP) * grad_logP.sum(dim, keepdim=True)


class LogSoftmax(torch.autograd.Function):
    """ℓ = z − logsumexp(z) along dim; saves only its output ℓ."""

    @staticmethod
    def forward(z, dim):
        """ℓ = z − logsumexp(z) along dim."""
        return z - torch.logsumexp(z, dim, keepdim=True)

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save the output ℓ and dim: grad_z = grad_ℓ − exp(ℓ) Σ grad_ℓ needs nothing else."""
        ctx.save_for_backward(output)
        ctx.dim = inputs[1]

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logP):
        """grad_z = grad_ℓ − exp(ℓ) · Σ grad_ℓ along dim; no gradient for dim."""
        (logP,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None
        return log_softmax_backward(logP, grad_logP, ctx.dim), None


def log_softmax(x, dim=-1):
    """ℓ = x − log Σ exp(x) along dim (log-sum-exp shifted by max x, so it never overflows)."""
    expect_tensor("x", x, floating=True)
    return LogSoftmax.apply(x, _check_dim(x, dim))


# --------------------------------------------------------------------------- Cross-entropy


def _targets(logits, target, ignore_index, label_smoothing):
    """q = (1 − ε)·onehot(t) + ε/C on kept rows, 0 on ignored ones; also the kept-row mask and count."""
    C = logits.shape[-1]
    keep = target != ignore_index  # (R,)
    safe_t = torch.where(keep, target, torch.zeros_like(target))  # an in-range class for ignored rows
    q = torch.full_like(logits, label_smoothing / C)  # (R, C)
    q.scatter_add_(1, safe_t[:, None], torch.full_like(logits[:, :1], 1.0 - label_smoothing))
    q = q * keep[:, None]  # (R, C)
    return q, keep, keep.sum()


def cross_entropy_forward(logits, target, ignore_index=-100, label_smoothing=0.0):
    """L = (1/N_kept) Σ_rows −Σ_c q_c (z_c − lse(z)), lse(z) = m + log Σ exp(z − m); returns (L, lse)."""
    lse = torch.logsumexp(logits, dim=1)  # (R,) max-shifted inside
    q, _, n_kept = _targets(logits, target, ignore_index, label_smoothing)
    logp = logits - lse[:, None]  # (R, C)
    L = -(q * logp).sum() / n_kept  # 0/0 = nan if every row is ignored, as torch
    return L, lse


def cross_entropy_backward(logits, lse, target, grad_L, ignore_index=-100, label_smoothing=0.0):
    """grad_z = grad_L · (softmax(z) − q) / N_kept on kept rows (q = smoothed one-hot), 0 on ignored rows."""
    P = torch.exp(logits - lse[:, None])  # (R, C) softmax, from the saved lse
    q, keep, n_kept = _targets(logits, target, ignore_index, label_smoothing)
    return (P * keep[:, None] - q) * (grad_L / n_kept)


class CrossEntropy(torch.autograd.Function):
    """(L, lse): L = mean_kept −Σ q log softmax(z) for logits (R, C); saves logits, lse (R,), target."""

    @staticmethod
    def forward(logits, target, ignore_index, label_smoothing):
        """(L, lse): L = (1/N_kept) Σ_rows −Σ_c q_c (z_c − lse), lse = log Σ_c exp(z_c) per row."""
        L, lse = cross_entropy_forward(logits, target, ignore_index, label_smoothing)
        return L, lse

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save logits z, lse (R,) and target; mark lse non-differentiable: softmax(z) = exp(z − lse)."""
        logits, target, ignore_index, label_smoothing = inputs
        _, lse = output
        # lse is a by-product returned only to be saved: one float per row rebuilds softmax(z) = exp(z − lse).
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(logits, lse, target)
        ctx.ignore_index, ctx.label_smoothing = ignore_index, label_smoothing

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_L, _grad_lse):
        """grad_z = grad_L · (exp(z − lse) − q) / N_kept on kept rows, 0 on ignored ones; none for the rest."""
        logits, lse, target = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        grad_z = cross_entropy_backward(logits, lse, target, grad_L, ctx.ignore_index, ctx.label_smoothing)
        return grad_z, None, None, None


def cross_entropy(logits, target, ignore_index=-100, label_smoothing=0.0):
    """L = mean_kept −Σ_c q_c log softmax(z)_c for logits (..., C) (classes LAST) and integer target (...)."""
    expect_tensor("logits", logits, floating=True)
    expect_tensor("target", target)
    if logits.dim() < 1 or target.dtype != torch.long or tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"cross_entropy: expected logits (..., C) and int64 target (...), "
            f"got {tuple(logits.shape)} and {tuple(target.shape)} {target.dtype}"
        )
    if not 0.0 <= float(label_smoothing) <= 1.0:
        raise ValueError(f"cross_entropy: expected label_smoothing in [0, 1], got {label_smoothing}")
    C = logits.shape[-1]
    z = logits.reshape(-1, C)  # (..., C) -> (R, C)
    t = target.reshape(-1)  # (...) -> (R,)
    L, _ = CrossEntropy.apply(z, t, int(ignore_index), float(label_smoothing))
    return L


# --------------------------------------------------------------------------- MSE


def mse_backward(y_hat, y, grad_L):
    """L = (1/n) Σ (ŷ − y)²  ⇒  grad_ŷ = grad_L · 2(ŷ − y)/n,  grad_y = −grad_ŷ."""
    return (y_hat - y) * (2.0 * grad_L / y_hat.numel())


class MSE(torch.autograd.Function):
    """L = mean((ŷ − y)²); saves its two inputs (they exist anyway, a difference would be a new tensor)."""

    @staticmethod
    def forward(y_hat, y):
        """L = mean((ŷ − y)²) over all elements."""
        return ((y_hat - y) ** 2).mean()

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save ŷ and y: grad_ŷ = 2(ŷ − y)/n needs both."""
        ctx.save_for_backward(*inputs)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_L):
        """grad_ŷ = grad_L · 2(ŷ − y)/n, grad_y = −grad_ŷ (each only if needed)."""
        y_hat, y = ctx.saved_tensors
        need_y_hat, need_y = ctx.needs_input_grad
        if not (need_y_hat or need_y):
            return None, None
        grad_y_hat = mse_backward(y_hat, y, grad_L)
        return (grad_y_hat if need_y_hat else None), (-grad_y_hat if need_y else None)


def mse_loss(y_hat, y):
    """L = (1/n) Σ (ŷ − y)² over all n elements; ŷ and y must have the same shape."""
    expect_tensor("y_hat", y_hat, floating=True)
    expect_tensor("y", y, floating=True, shape=y_hat.shape)
    expect_like("y", y, "y_hat", y_hat)  # torch's mse_loss refuses f32 vs f64 too
    return MSE.apply(y_hat, y)


# --------------------------------------------------------------------------- LayerNorm


def layernorm_forward(x, weight, bias, eps=1e-5, mu=None, rstd=None):
    """μ = mean(x), σ = √(var(x) + eps) (last dim), x̂ = (x − μ)/σ, y = γ x̂ + β; returns (y, μ, 1/σ).

    Every operation runs in x's dtype (float16 in, float16 arithmetic: chapter 9's eps story).
    Given ``mu`` and ``rstd`` saved by an earlier call, y is rebuilt from them without
    recomputing the statistics (the block's backward recomputes LayerNorm outputs this way).
    """
    if (mu is None) != (rstd is None):
        raise ValueError("layernorm_forward: expected both mu and rstd (saved statistics) or neither")
    if mu is None:
        mu = x.mean(-1, keepdim=True)  # (..., 1)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)  # (..., 1) biased, as nn.LayerNorm
        rstd = torch.rsqrt(var + eps)  # (..., 1)
    y = (x - mu) * rstd  # (..., D)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y, mu, rstd


def layernorm_backward(x, mu, rstd, weight, grad_y, needs=(True, True, True)):
    """g = grad_y·γ: grad_x = (1/σ)(g − mean(g) − x̂·mean(g·x̂)), grad_γ = Σ grad_y·x̂, grad_β = Σ grad_y."""
    grad_x = grad_w = grad_b = None
    x_hat = (x - mu) * rstd  # (..., D)
    if needs[0]:
        g = grad_y if weight is None else grad_y * weight  # (..., D)
        # mean(g): the path through μ;  x̂·mean(g·x̂): the path through σ.
        grad_x = rstd * (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True))
    D = x.shape[-1]
    if needs[1]:
        grad_w = (grad_y * x_hat).reshape(-1, D).sum(0)  # (..., D) -> (R, D) -> (D,)
    if needs[2]:
        grad_b = grad_y.reshape(-1, D).sum(0)  # (..., D) -> (R, D) -> (D,)
    return grad_x, grad_w, grad_b


class LayerNorm(torch.autograd.Function):
    """(y, μ, 1/σ): y = γ (x − μ)/√(var + eps) + β over the last dim; saves x, μ, 1/σ, γ."""

    @staticmethod
    def forward(x, weight, bias, eps):
        """(y, μ, 1/σ): y = γ (x − μ)/σ + β, σ = √(var(x) + eps), over the last dim."""
        return layernorm_forward(x, weight, bias, eps)

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save x, μ, 1/σ, γ (not x̂ = (x − μ)/σ, rebuilt in backward); μ and 1/σ are non-differentiable."""
        x, weight, _, _ = inputs
        _, mu, rstd = output
        # μ and 1/σ are returned only to be saved: two floats per row rebuild x̂ from x,
        # so no (..., D) copy of x̂ is kept.
        ctx.mark_non_differentiable(mu, rstd)
        ctx.save_for_backward(x, mu, rstd, weight)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y, _grad_mu, _grad_rstd):
        """g = grad_y γ: grad_x = (1/σ)(g − mean(g) − x̂ mean(g x̂)), grad_γ = Σ grad_y x̂, grad_β = Σ grad_y."""
        x, mu, rstd, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad[:3]
        if not any(needs):
            return None, None, None, None
        grad_x, grad_w, grad_b = layernorm_backward(x, mu, rstd, weight, grad_y, needs)
        return grad_x, grad_w, grad_b, None


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """y = γ (x − mean(x)) / √(var(x) + eps) + β over the last dim; γ, β are (D,) or None."""
    expect_tensor("x", x, floating=True)
    if x.dim() < 1:
        raise ValueError("layer_norm: expected x with at least one dim (..., D), got a scalar")
    D = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            expect_tensor(name, t, shape=(D,))
            expect_like(name, t, "x", x)  # as F.layer_norm: no silent float64 output
    y, _, _ = LayerNorm.apply(x, weight, bias, float(eps))
    return y


# --------------------------------------------------------------------------- Dropout


def dropout_backward(mask, grad_y, p):
    """y = x · m / (1 − p)  ⇒  grad_x = grad_y · m / (1 − p) (0 when p = 1)."""
    scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
    return grad_y * mask * scale


def dropout_mask(shape, p, generator=None, device=None):
    """m = [u ≥ p] with u ~ U[0, 1) drawn on the generator's device (an int seeds a CPU generator), then moved."""
    if isinstance(generator, int):
        seed, generator = generator, torch.Generator(device="cpu")
        generator.manual_seed(seed)
    gen_device = generator.device if generator is not None else "cpu"
    u = torch.rand(shape, generator=generator, device=gen_device)
    return (u >= p).to(device or gen_device)  # bool: 1 byte per element


class Dropout(torch.autograd.Function):
    """y = x · m / (1 − p) for a given bool mask m; saves only the mask (1 byte per element)."""

    @staticmethod
    def forward(x, mask, p):
        """y = x · m / (1 − p) (0 when p = 1)."""
        scale = 0.0 if p >= 1.0 else 1.0 / (1.0 - p)
        return x * mask * scale

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save the bool mask m (1 byte per element) and p on ctx."""
        _, mask, p = inputs
        ctx.save_for_backward(mask)
        ctx.p = p

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        """grad_x = grad_y · m / (1 − p); no gradient for the mask or p."""
        (mask,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return dropout_backward(mask, grad_y, ctx.p), None, None


def dropout(x, p=0.5, training=True, generator=None):
    """y = x · m / (1 − p), m_i ~ Bernoulli(1 − p) in training; y = x in eval (generator: Generator, int or None)."""
    expect_tensor("x", x, floating=True)
    if not 0.0 <= float(p) <= 1.0:
        raise ValueError(f"dropout: expected p in [0, 1], got {p}")
    if generator is not None and not isinstance(generator, (int, torch.Generator)):
        raise ValueError(
            "dropout: expected generator to be a torch.Generator, an int seed or None, "
            f"got {type(generator).__name__}"
        )
    if not training or p == 0.0:
        return x
    mask = dropout_mask(x.shape, float(p), generator, x.device)
    return Dropout.apply(x, mask, float(p))
