# %% ex1
def layernorm_backward(x, mu, rstd, weight, grad_y):
    """y = γ·(x − μ)·rstd + β  ⇒  (grad_x, grad_weight, grad_bias), μ, rstd saved."""
    x_hat = (x - mu) * rstd
    g = grad_y * weight
    grad_x = rstd * (g - g.mean(-1, keepdim=True) - x_hat * (g * x_hat).mean(-1, keepdim=True))
    D = x.shape[-1]
    grad_weight = (grad_y * x_hat).reshape(-1, D).sum(0)
    grad_bias = grad_y.reshape(-1, D).sum(0)
    return grad_x, grad_weight, grad_bias
# %% ex2
def ffn_backward(h, W1, b1, W2, b2, grad_F, activation="relu"):
    """F = act(h W1ᵀ + b1) W2ᵀ + b2  ⇒  (grad_h, grad_W1, grad_b1, grad_W2, grad_b2)."""
    d = h.shape[-1]
    h2d = h.reshape(-1, d)
    dF = grad_F.reshape(-1, grad_F.shape[-1])
    U = h2d @ W1.T + b1
    a = torch.relu(U) if activation == "relu" else F.gelu(U)
    grad_W2 = dF.T @ a
    grad_b2 = dF.sum(0)
    da = dF @ W2
    if activation == "relu":
        dU = da * (U > 0)
    else:
        dU = gelu_backward(U, da)
    grad_W1 = dU.T @ h2d
    grad_b1 = dU.sum(0)
    grad_h = (dU @ W1).reshape(h.shape)
    return grad_h, grad_W1, grad_b1, grad_W2, grad_b2
# %% ex3
def ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation="relu"):
    """Y = X1 + FF(LN2(X1))  ⇒  {"X1": ∂L/∂X1, name: ∂L/∂θ for the six parameters}."""
    p = params
    h2 = (X1 - mu2) * rstd2 * p["norm2.weight"] + p["norm2.bias"]
    gh2, gW1, gb1, gW2, gb2 = ffn_backward(
        h2, p["linear1.weight"], p["linear1.bias"], p["linear2.weight"], p["linear2.bias"], grad_Y, activation
    )
    gx, gg, gb = layernorm_backward(X1, mu2, rstd2, p["norm2.weight"], gh2)
    return {
        "X1": grad_Y + gx,
        "norm2.weight": gg,
        "norm2.bias": gb,
        "linear1.weight": gW1,
        "linear1.bias": gb1,
        "linear2.weight": gW2,
        "linear2.bias": gb2,
    }
# %% ex4
def tied_embedding_backward(idx, grad_X0, Hf, grad_logits, n_ctx, start=0):
    """X0 = wte[idx] + wpe[start:start + N], logits = Hf wteᵀ ⇒ (grad_wte, grad_wpe)."""
    B, N, d = grad_X0.shape
    V = grad_logits.shape[-1]
    grad_wte = grad_logits.reshape(-1, V).T @ Hf.reshape(-1, d)  # head's share
    grad_wte.index_add_(0, idx.reshape(-1), grad_X0.reshape(-1, d))  # input's share
    grad_wpe = torch.zeros(n_ctx, d, dtype=grad_X0.dtype, device=grad_X0.device)
    grad_wpe[start : start + N] = grad_X0.sum(0)
    return grad_wte, grad_wpe
# %% ex5
def block_backward(grad_Y, cache):
    """X1 = X + SA(LN1(X)), Y = X1 + FF(LN2(X1))  ⇒  {"X": ∂L/∂X, name: ∂L/∂θ}."""
    c = cache
    p = c["params"]
    H = c["H"]
    grads = ffn_sublayer_backward(c["X1"], c["mu2"], c["rstd2"], p, grad_Y, c["activation"])
    grad_X1 = grads.pop("X1")
    grad_A, gWo, gbo = linear_backward(c["A"], p["self_attn.out_proj.weight"], grad_X1)
    grad_O = split_heads(grad_A, H)
    scale = 1.0 / math.sqrt(c["Q"].shape[-1])
    gQ, gK, gV = attention_backward(c["Q"], c["K"], c["V"], c["P"], grad_O, scale)
    grad_QKV = torch.cat([merge_heads(gQ), merge_heads(gK), merge_heads(gV)], dim=-1)
    grad_h1, gWin, gbin = linear_backward(c["h1"], p["self_attn.in_proj_weight"], grad_QKV)
    gX, gn1w, gn1b = layernorm_backward(c["X"], c["mu1"], c["rstd1"], p["norm1.weight"], grad_h1)
    grads.update(
        {
            "X": grad_X1 + gX,
            "self_attn.in_proj_weight": gWin,
            "self_attn.in_proj_bias": gbin,
            "self_attn.out_proj.weight": gWo,
            "self_attn.out_proj.bias": gbo,
            "norm1.weight": gn1w,
            "norm1.bias": gn1b,
        }
    )
    return grads
