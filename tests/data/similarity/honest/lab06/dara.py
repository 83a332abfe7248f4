# %% ex1
def causal_mask(Nq, Nk, align="top_left", device=None, window=None):
    """(Nq, Nk) bool, True = may attend: causal, either corner, optionally windowed."""
    d = 0
    if align == "bottom_right":
        d = Nk - Nq
    m = torch.ones(Nq, Nk, dtype=torch.bool, device=device).tril(diagonal=d)
    if window is not None:
        m = m & ~torch.ones(Nq, Nk, dtype=torch.bool, device=device).tril(diagonal=d - window)
    return m
# %% ex2
def attention_forward(Q, K, V, mask=None, Bias=None, scale=None):
    """(O, P) of softmax(Q Kᵀ·scale + Bias, masked) V; no key visible: P = O = 0."""
    scale = 1 / Q.shape[-1] ** 0.5 if scale is None else scale
    logits = Q @ K.mT * scale + (0 if Bias is None else Bias)
    if mask is not None:
        neg = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
        logits = torch.where(mask, logits, neg)
    top = logits.amax(-1, keepdim=True)
    safe_top = torch.where(torch.isfinite(top), top, 0.0)
    num = (logits - safe_top).exp()
    denom = num.sum(-1, keepdim=True)
    P = torch.where(denom > 0, num / denom, 0.0)
    return P @ V, P
# %% ex3
def attention_backward(Q, K, V, P, grad_O, scale, Bias):
    """grad_Q, grad_K, grad_V, grad_scale, grad_Bias of softmax(Q Kᵀ·scale + Bias) V"""
    # O = P V
    dP = grad_O @ V.mT
    dV = P.mT @ grad_O
    # P = softmax(S)
    dS = (dP - (P * dP).sum(-1, keepdim=True)) * P
    # S = A * scale + Bias,   A = Q K^T
    A = Q @ K.mT
    dBias = unbroadcast(dS, Bias.shape)
    dscale = unbroadcast(A * dS, scale.shape)
    dA = scale * dS
    dQ = dA @ K
    dK = dA.mT @ Q
    return dQ, dK, dV, dscale, dBias
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
    masks = []
    if causal:
        masks.append(causal_mask(Q.size(-2), K.size(-2), align=align, device=Q.device, window=window))
    if key_padding_mask is not None:
        masks.append(~key_padding_mask.unsqueeze(1).unsqueeze(2))
    mask = None
    for m in masks:
        mask = m if mask is None else (mask & m)
    P = attention_forward(Q, K, V, mask=mask, Bias=Bias, scale=scale)[1]
    return attention_backward(Q, K, V, P, grad_O, scale, Bias)
