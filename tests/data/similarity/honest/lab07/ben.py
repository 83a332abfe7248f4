# %% ex1
def layernorm_backward(x, mu, rstd, weight, grad_y):
    """y = γ·(x − μ)·rstd + β  ⇒  (grad_x, grad_weight, grad_bias), μ, rstd saved."""
    D = x.size(-1)
    xhat = (x - mu) * rstd
    dxhat = grad_y * weight
    # direct path
    direct = dxhat * rstd
    # through mu
    via_mu = -dxhat.sum(-1, keepdim=True) * rstd / D
    # through sigma
    via_sigma = -xhat * (dxhat * xhat).sum(-1, keepdim=True) * rstd / D
    grad_x = direct + via_mu + via_sigma
    rows = tuple(range(x.dim() - 1))
    grad_weight = (grad_y * xhat).sum(dim=rows)
    grad_bias = grad_y.sum(dim=rows)
    return grad_x, grad_weight, grad_bias
# %% ex2
def ffn_backward(h, W1, b1, W2, b2, grad_F, activation="relu"):
    """F = act(h W1ᵀ + b1) W2ᵀ + b2  ⇒  (grad_h, grad_W1, grad_b1, grad_W2, grad_b2)."""
    U = torch.matmul(h, W1.t()) + b1
    if activation == "relu":
        act = U.clamp(min=0)
    elif activation == "gelu":
        act = torch.nn.functional.gelu(U)
    else:
        raise ValueError(activation)
    Rh = h.reshape(-1, h.shape[-1])
    Ra = act.reshape(-1, act.shape[-1])
    RgF = grad_F.reshape(-1, grad_F.shape[-1])
    gW2 = torch.matmul(RgF.t(), Ra)
    gb2 = RgF.sum(dim=0)
    g_act = torch.matmul(grad_F, W2)
    if activation == "relu":
        gU = g_act * (U > 0).to(g_act.dtype)
    else:
        gU = gelu_backward(U, g_act)
    RgU = gU.reshape(-1, gU.shape[-1])
    gW1 = torch.matmul(RgU.t(), Rh)
    gb1 = RgU.sum(dim=0)
    gh = torch.matmul(gU, W1)
    return gh, gW1, gb1, gW2, gb2
# %% ex3
def ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation="relu"):
    """Y = X1 + FF(LN2(X1))  ⇒  {"X1": ∂L/∂X1, name: ∂L/∂θ for the six parameters}."""
    gamma, beta = params["norm2.weight"], params["norm2.bias"]
    W1, b1 = params["linear1.weight"], params["linear1.bias"]
    W2, b2 = params["linear2.weight"], params["linear2.bias"]
    h2 = gamma * ((X1 - mu2) * rstd2) + beta
    out = {}
    g_h2, out["linear1.weight"], out["linear1.bias"], out["linear2.weight"], out["linear2.bias"] = ffn_backward(
        h2, W1, b1, W2, b2, grad_Y, activation=activation
    )
    g_branch, out["norm2.weight"], out["norm2.bias"] = layernorm_backward(X1, mu2, rstd2, gamma, g_h2)
    out["X1"] = grad_Y.clone() + g_branch  # skip + branch
    return out
# %% ex4
def tied_embedding_backward(idx, grad_X0, Hf, grad_logits, n_ctx, start=0):
    """X0 = wte[idx] + wpe[start:start + N], logits = Hf wteᵀ ⇒ (grad_wte, grad_wpe)."""
    vocab = grad_logits.shape[-1]
    d = Hf.shape[-1]
    N = idx.shape[1]
    from_head = torch.einsum("bnv,bnd->vd", grad_logits, Hf)
    from_input = torch.zeros(vocab, d, dtype=Hf.dtype, device=Hf.device)
    from_input.index_add_(0, idx.flatten(), grad_X0.reshape(-1, d))
    grad_wpe = torch.zeros(n_ctx, d, dtype=Hf.dtype, device=Hf.device)
    grad_wpe[start : start + N] += grad_X0.sum(dim=0)
    return from_head + from_input, grad_wpe
# %% ex5
def block_backward(grad_Y, cache):
    """X1 = X + SA(LN1(X)), Y = X1 + FF(LN2(X1))  ⇒  {"X": ∂L/∂X, name: ∂L/∂θ}."""
    params = cache["params"]
    out = ffn_sublayer_backward(
        cache["X1"], cache["mu2"], cache["rstd2"], params, grad_Y, activation=cache["activation"]
    )
    g_X1 = out["X1"]
    del out["X1"]
    # out_proj: X1 = X + A Wo^T + bo
    g_A, out["self_attn.out_proj.weight"], out["self_attn.out_proj.bias"] = linear_backward(
        cache["A"], params["self_attn.out_proj.weight"], g_X1
    )
    Q, K, V, P = cache["Q"], cache["K"], cache["V"], cache["P"]
    d_h = Q.shape[-1]
    g_Q, g_K, g_V = attention_backward(Q, K, V, P, split_heads(g_A, cache["H"]), d_h**-0.5)
    g_QKV = torch.cat((merge_heads(g_Q), merge_heads(g_K), merge_heads(g_V)), -1)
    g_h1, out["self_attn.in_proj_weight"], out["self_attn.in_proj_bias"] = linear_backward(
        cache["h1"], params["self_attn.in_proj_weight"], g_QKV
    )
    g_X_branch, out["norm1.weight"], out["norm1.bias"] = layernorm_backward(
        cache["X"], cache["mu1"], cache["rstd1"], params["norm1.weight"], g_h1
    )
    out["X"] = g_X1 + g_X_branch
    return out
