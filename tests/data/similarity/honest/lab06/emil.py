# %% ex1
def causal_mask(Nq, Nk, align="top_left", device=None, window=None):
    """(Nq, Nk) bool, True = may attend: causal, either corner, optionally windowed."""
    rows = torch.arange(Nq, device=device).view(-1, 1)
    cols = torch.arange(Nk, device=device).view(1, -1)
    if align == "bottom_right":
        rows = rows + (Nk - Nq)
    dist = rows - cols  # how far back key j is from query i's own position
    ok = dist >= 0
    if window is not None:
        ok = torch.logical_and(ok, dist < window)
    return ok
# %% ex2
def attention_forward(Q, K, V, mask=None, Bias=None, scale=None):
    """(O, P) of softmax(Q Kᵀ·scale + Bias, masked) V; no key visible: P = O = 0."""
    if scale is None:
        scale = 1.0 / Q.size(-1) ** 0.5
    s = Q.matmul(K.transpose(-2, -1)).mul(scale)
    if Bias is not None:
        s = s.add(Bias)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    # stable softmax that survives all -inf rows
    any_visible = torch.isfinite(s).any(dim=-1, keepdim=True)
    shift = torch.where(any_visible, s.amax(-1, keepdim=True), torch.zeros_like(s[..., :1]))
    p = (s - shift).exp()
    p = p / p.sum(-1, keepdim=True).where(any_visible, torch.ones_like(shift))
    out = p.matmul(V)
    return out, p
# %% ex3
def attention_backward(Q, K, V, P, grad_O, scale, Bias):
    """grad_Q, grad_K, grad_V, grad_scale, grad_Bias of softmax(Q Kᵀ·scale + Bias) V"""
    def reduce_to(t, shape):
        extra = t.ndim - len(shape)
        t = t.sum(dim=tuple(range(extra))) if extra > 0 else t
        dims = tuple(i for i, s in enumerate(shape) if s == 1 and t.shape[i] != 1)
        return t.sum(dim=dims, keepdim=True) if dims else t

    scale = torch.as_tensor(scale, dtype=Q.dtype, device=Q.device)
    gradV = P.transpose(-2, -1).matmul(grad_O)
    gradP = grad_O.matmul(V.transpose(-2, -1))
    inner = (gradP * P).sum(dim=-1, keepdim=True)
    gradS = P * (gradP - inner)
    raw = Q.matmul(K.transpose(-2, -1))
    gradQ = (gradS * scale).matmul(K)
    gradK = (gradS * scale).transpose(-2, -1).matmul(Q)
    return gradQ, gradK, gradV, reduce_to(gradS * raw, scale.shape), reduce_to(gradS, Bias.shape)
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
    B = Q.shape[0]
    Nq, Nk = Q.shape[-2], K.shape[-2]
    allow = torch.ones(B, 1, Nq, Nk, dtype=torch.bool, device=Q.device)
    if causal:
        allow = allow & causal_mask(Nq, Nk, align=align, device=Q.device, window=window)
    if key_padding_mask is not None:
        allow = allow & key_padding_mask.logical_not().reshape(B, 1, 1, Nk)
    out, P = attention_forward(Q, K, V, mask=allow, Bias=Bias, scale=scale)
    return attention_backward(Q, K, V, P, grad_O, scale, Bias)
