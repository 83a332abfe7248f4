# %% ex1
def causal_mask(Nq, Nk, align="top_left", device=None, window=None):
    """(Nq, Nk) bool, True = may attend: causal, either corner, optionally windowed."""
    i = torch.arange(Nq, device=device)[:, None]
    j = torch.arange(Nk, device=device)[None, :]
    offset = Nk - Nq if align == "bottom_right" else 0
    last = i + offset  # last key query i may see
    mask = j <= last
    if window is not None:
        mask = mask & (j > last - window)
    return mask
# %% ex2
def attention_forward(Q, K, V, mask=None, Bias=None, scale=None):
    """(O, P) of softmax(Q Kᵀ·scale + Bias, masked) V; no key visible: P = O = 0."""
    if scale is None:
        scale = 1.0 / math.sqrt(Q.shape[-1])
    S = Q @ K.transpose(-2, -1) * scale
    if Bias is not None:
        S = S + Bias
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    m = S.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    E = torch.exp(S - m)
    Z = E.sum(dim=-1, keepdim=True)
    P = E / torch.where(Z == 0, torch.ones_like(Z), Z)
    O = P @ V
    return O, P
# %% ex3
def attention_backward(Q, K, V, P, grad_O, scale, Bias):
    """grad_Q, grad_K, grad_V, grad_scale, grad_Bias of softmax(Q Kᵀ·scale + Bias) V"""
    grad_V = P.transpose(-2, -1) @ grad_O
    grad_P = grad_O @ V.transpose(-2, -1)
    grad_S = P * (grad_P - (grad_P * P).sum(-1, keepdim=True))
    A = Q @ K.transpose(-2, -1)
    grad_A = grad_S * scale
    grad_scale = unbroadcast(grad_S * A, scale.shape)
    grad_Bias = unbroadcast(grad_S, Bias.shape)
    grad_Q = grad_A @ K
    grad_K = grad_A.transpose(-2, -1) @ Q
    return grad_Q, grad_K, grad_V, grad_scale, grad_Bias
# %% ex4
def attention_grads(
    Q,
    K,
    V,
    Bias,
    scale,
    grad_O,
    causal=False,
    key_padding_mask=None,
    align="top_left",
    window=None,
):
    """The five gradients of masked, biased, scaled attention for grad_O, by hand."""
    Nq, Nk = Q.shape[-2], K.shape[-2]
    mask = None
    if causal:
        mask = causal_mask(Nq, Nk, align=align, device=Q.device, window=window)
    if key_padding_mask is not None:
        keep = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, Nk)
        mask = keep if mask is None else mask & keep
    O, P = attention_forward(Q, K, V, mask=mask, Bias=Bias, scale=scale)
    return attention_backward(Q, K, V, P, grad_O, scale, Bias)
