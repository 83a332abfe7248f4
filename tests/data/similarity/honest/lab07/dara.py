# %% ex1
def layernorm_backward(x, mu, rstd, weight, grad_y):
    """y = γ·(x − μ)·rstd + β  ⇒  (grad_x, grad_weight, grad_bias), μ, rstd saved."""
    N = x.shape[-1]
    xhat = (x - mu) * rstd
    g = grad_y * weight
    sum_g = g.sum(-1, keepdim=True)
    sum_gx = (g * xhat).sum(-1, keepdim=True)
    grad_x = (rstd / N) * (N * g - sum_g - xhat * sum_gx)
    grad_weight = torch.einsum("...d,...d->d", grad_y, xhat)
    grad_bias = torch.einsum("...d->d", grad_y)
    return grad_x, grad_weight, grad_bias
# %% ex2
def ffn_backward(h, W1, b1, W2, b2, grad_F, activation="relu"):
    """F = act(h W1ᵀ + b1) W2ᵀ + b2  ⇒  (grad_h, grad_W1, grad_b1, grad_W2, grad_b2)."""
    U = torch.einsum("...i,oi->...o", h, W1) + b1
    a = F.relu(U) if activation == "relu" else F.gelu(U)
    grad_W2 = torch.einsum("...o,...i->oi", grad_F, a)
    grad_b2 = torch.einsum("...o->o", grad_F)
    grad_a = torch.einsum("...o,oi->...i", grad_F, W2)
    grad_U = grad_a * (U > 0) if activation == "relu" else gelu_backward(U, grad_a)
    grad_W1 = torch.einsum("...o,...i->oi", grad_U, h)
    grad_b1 = torch.einsum("...o->o", grad_U)
    grad_h = torch.einsum("...o,oi->...i", grad_U, W1)
    return grad_h, grad_W1, grad_b1, grad_W2, grad_b2
# %% ex3
def ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation="relu"):
    """Y = X1 + FF(LN2(X1))  ⇒  {"X1": ∂L/∂X1, name: ∂L/∂θ for the six parameters}."""
    P = params
    normed = (X1 - mu2) * rstd2
    h2 = normed * P["norm2.weight"] + P["norm2.bias"]
    ffn = ffn_backward(h2, P["linear1.weight"], P["linear1.bias"], P["linear2.weight"], P["linear2.bias"],
                       grad_Y, activation)
    ln = layernorm_backward(X1, mu2, rstd2, P["norm2.weight"], ffn[0])
    result = {"X1": grad_Y + ln[0], "norm2.weight": ln[1], "norm2.bias": ln[2]}
    for key, g in zip(("linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"), ffn[1:]):
        result[key] = g
    return result
# %% ex4
def tied_embedding_backward(idx, grad_X0, Hf, grad_logits, n_ctx, start=0):
    """X0 = wte[idx] + wpe[start:start + N], logits = Hf wteᵀ ⇒ (grad_wte, grad_wpe)."""
    d = Hf.size(-1)
    head = grad_logits.flatten(0, 1).mT @ Hf.flatten(0, 1)
    onehot = F.one_hot(idx.flatten(), grad_logits.size(-1)).to(grad_X0.dtype)
    emb = onehot.mT @ grad_X0.flatten(0, 1)
    grad_wpe = grad_X0.new_zeros((n_ctx, d))
    grad_wpe[start : start + idx.size(1)] = grad_X0.sum(0)
    return head + emb, grad_wpe
# %% ex5
def block_backward(grad_Y, cache):
    """X1 = X + SA(LN1(X)), Y = X1 + FF(LN2(X1))  ⇒  {"X": ∂L/∂X, name: ∂L/∂θ}."""
    P = cache["params"]
    g = ffn_sublayer_backward(cache["X1"], cache["mu2"], cache["rstd2"], P, grad_Y, cache["activation"])
    gX1 = g["X1"]
    A_grad, Wo_grad, bo_grad = linear_backward(cache["A"], P["self_attn.out_proj.weight"], gX1)
    heads = split_heads(A_grad, cache["H"])
    dh = cache["Q"].shape[-1]
    qkv = attention_backward(cache["Q"], cache["K"], cache["V"], cache["P"], heads, 1.0 / dh**0.5)
    packed = torch.cat(list(map(merge_heads, qkv)), dim=-1)
    h1_grad, Win_grad, bin_grad = linear_backward(cache["h1"], P["self_attn.in_proj_weight"], packed)
    x_branch, n1w, n1b = layernorm_backward(cache["X"], cache["mu1"], cache["rstd1"], P["norm1.weight"], h1_grad)
    return {
        "X": gX1 + x_branch,
        "self_attn.in_proj_weight": Win_grad,
        "self_attn.in_proj_bias": bin_grad,
        "self_attn.out_proj.weight": Wo_grad,
        "self_attn.out_proj.bias": bo_grad,
        "linear1.weight": g["linear1.weight"],
        "linear1.bias": g["linear1.bias"],
        "linear2.weight": g["linear2.weight"],
        "linear2.bias": g["linear2.bias"],
        "norm1.weight": n1w,
        "norm1.bias": n1b,
        "norm2.weight": g["norm2.weight"],
        "norm2.bias": g["norm2.bias"],
    }
