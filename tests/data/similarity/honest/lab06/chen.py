# %% ex1
def causal_mask(Nq, Nk, align="top_left", device=None, window=None):
    """(Nq, Nk) bool, True = may attend: causal, either corner, optionally windowed."""
    mask = torch.zeros(Nq, Nk, dtype=torch.bool, device=device)
    for qi in range(Nq):
        hi = qi if align == "top_left" else qi + Nk - Nq   # last visible key
        lo = 0 if window is None else max(0, hi - window + 1)
        if hi >= 0:
            mask[qi, lo : hi + 1] = True
    return mask
# %% ex2
def attention_forward(Q, K, V, mask=None, Bias=None, scale=None):
    """(O, P) of softmax(Q Kᵀ·scale + Bias, masked) V; no key visible: P = O = 0."""
    if scale is None:
        scale = Q.shape[-1] ** -0.5
    S = torch.einsum("...qd,...kd->...qk", Q, K) * scale
    if Bias is not None:
        S += Bias
    if mask is not None:
        S = S.masked_fill(mask.logical_not(), -float("inf"))
    mx = S.max(-1, keepdim=True)[0]
    mx[mx == -float("inf")] = 0  # fully masked rows
    e = (S - mx).exp()
    den = e.sum(-1, keepdim=True)
    den[den == 0] = 1
    P = e / den
    return torch.einsum("...qk,...kd->...qd", P, V), P
# %% ex3
def attention_backward(Q, K, V, P, grad_O, scale, Bias):
    """grad_Q, grad_K, grad_V, grad_scale, grad_Bias of softmax(Q Kᵀ·scale + Bias) V"""
    from helpers.numgrad import unbroadcast
    gV = torch.einsum("...qk,...qd->...kd", P, grad_O)
    gP = torch.einsum("...qd,...kd->...qk", grad_O, V)
    # softmax vjp, no jacobian
    gS = P * gP - P * (P * gP).sum(-1, keepdim=True)
    logits = torch.einsum("...qd,...kd->...qk", Q, K)
    g_scale = unbroadcast(gS * logits, scale.shape)
    g_bias = unbroadcast(gS, Bias.shape)
    gL = gS * scale
    gQ = torch.einsum("...qk,...kd->...qd", gL, K)
    gK = torch.einsum("...qk,...qd->...kd", gL, Q)
    return gQ, gK, gV, g_scale, g_bias
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
    m = None
    if causal:
        m = causal_mask(Q.shape[2], K.shape[2], align=align, device=Q.device, window=window)
        m = m[None, None]
    if key_padding_mask is not None:
        kp = (~key_padding_mask)[:, None, None, :]
        if m is None:
            m = kp
        else:
            m = m & kp
    out, probs = attention_forward(Q, K, V, mask=m, Bias=Bias, scale=scale)
    gQ, gK, gV, gs, gb = attention_backward(Q, K, V, probs, grad_O, scale, Bias)
    return gQ, gK, gV, gs, gb
