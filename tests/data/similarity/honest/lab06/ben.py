# %% ex1
def causal_mask(Nq, Nk, align="top_left", device=None, window=None):
    """(Nq, Nk) bool, True = may attend: causal, either corner, optionally windowed."""
    if align == "top_left":
        shift = 0
    elif align == "bottom_right":
        shift = Nk - Nq
    else:
        raise ValueError("align must be top_left or bottom_right")
    q = torch.arange(Nq, device=device).unsqueeze(1)
    k = torch.arange(Nk, device=device).unsqueeze(0)
    allowed = k <= q + shift
    if window is not None:
        # keep keys q+shift-window+1 .. q+shift
        allowed &= k >= q + shift - window + 1
    return allowed
# %% ex2
def attention_forward(Q, K, V, mask=None, Bias=None, scale=None):
    """(O, P) of softmax(Q Kᵀ·scale + Bias, masked) V; no key visible: P = O = 0."""
    d = Q.shape[-1]
    if scale is None:
        scale = d ** -0.5
    scores = torch.matmul(Q, K.transpose(-1, -2)) * scale
    if Bias is not None:
        scores = scores + Bias
    if mask is not None:
        scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
    row_max = scores.max(dim=-1, keepdim=True).values
    row_max = torch.nan_to_num(row_max, neginf=0.0)
    w = torch.exp(scores - row_max)
    total = w.sum(dim=-1, keepdim=True)
    total = total.clamp(min=1e-30)
    P = w / total
    O = torch.matmul(P, V)
    return O, P
# %% ex3
def sum_to_shape(g, shape):
    # undo broadcasting: sum leading dims, then the dims that were 1
    while g.dim() > len(shape):
        g = g.sum(0)
    for ax, n in enumerate(shape):
        if n == 1 and g.shape[ax] != 1:
            g = g.sum(ax, keepdim=True)
    return g


def attention_backward(Q, K, V, P, grad_O, scale, Bias):
    """grad_Q, grad_K, grad_V, grad_scale, grad_Bias of softmax(Q Kᵀ·scale + Bias) V"""
    dV = torch.matmul(P.transpose(-1, -2), grad_O)
    dP = torch.matmul(grad_O, V.transpose(-1, -2))
    row_dot = torch.sum(dP * P, dim=-1, keepdim=True)
    dS = P * (dP - row_dot)
    raw = torch.matmul(Q, K.transpose(-1, -2))
    d_scale = sum_to_shape(dS * raw, scale.shape)
    d_bias = sum_to_shape(dS, Bias.shape)
    dRaw = dS * scale
    dQ = torch.matmul(dRaw, K)
    dK = torch.matmul(dRaw.transpose(-1, -2), Q)
    return dQ, dK, dV, d_scale, d_bias
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
    B, H, N, d = Q.shape
    full = torch.ones(N, K.shape[-2], dtype=torch.bool, device=Q.device)
    if causal:
        full = causal_mask(N, K.shape[-2], align, Q.device, window)
    if key_padding_mask is not None:
        pad_ok = key_padding_mask.logical_not().view(B, 1, 1, -1)
        full = full & pad_ok
    _, P = attention_forward(Q, K, V, full, Bias, scale)
    grads = attention_backward(Q, K, V, P, grad_O, scale, Bias)
    return grads
