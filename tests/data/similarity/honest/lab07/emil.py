# %% ex1
def layernorm_backward(x, mu, rstd, weight, grad_y):
    """y = γ·(x − μ)·rstd + β  ⇒  (grad_x, grad_weight, grad_bias), μ, rstd saved."""
    D = x.shape[-1]
    centered = x - mu
    normalized = centered * rstd
    grad_norm = grad_y * weight
    # d xhat_i / d x_j = rstd (delta_ij - 1/D - xhat_i xhat_j / D)
    grad_x = rstd * grad_norm
    grad_x = grad_x - rstd * grad_norm.mean(dim=-1, keepdim=True)
    grad_x = grad_x - rstd * normalized * (grad_norm * normalized).sum(dim=-1, keepdim=True) / D
    flat_gy = grad_y.reshape(-1, D)
    grad_weight = (flat_gy * normalized.reshape(-1, D)).sum(dim=0)
    grad_bias = flat_gy.sum(dim=0)
    return grad_x, grad_weight, grad_bias
# %% ex2
def ffn_backward(h, W1, b1, W2, b2, grad_F, activation="relu"):
    """F = act(h W1ᵀ + b1) W2ᵀ + b2  ⇒  (grad_h, grad_W1, grad_b1, grad_W2, grad_b2)."""
    d_in = h.shape[-1]
    rows = h.reshape(-1, d_in)
    gout = grad_F.reshape(-1, W2.shape[0])
    pre = rows.matmul(W1.transpose(0, 1)).add(b1)
    post = pre.relu() if activation == "relu" else F.gelu(pre)
    grad_W2 = gout.transpose(0, 1).matmul(post)
    grad_b2 = gout.sum(dim=0)
    grad_post = gout.matmul(W2)
    if activation == "relu":
        grad_pre = grad_post.masked_fill(pre <= 0, 0.0)
    else:
        grad_pre = gelu_backward(pre, grad_post)
    grad_W1 = grad_pre.transpose(0, 1).matmul(rows)
    grad_b1 = grad_pre.sum(dim=0)
    grad_h = grad_pre.matmul(W1).view_as(h)
    return grad_h, grad_W1, grad_b1, grad_W2, grad_b2
# %% ex3
def ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation="relu"):
    """Y = X1 + FF(LN2(X1))  ⇒  {"X1": ∂L/∂X1, name: ∂L/∂θ for the six parameters}."""
    w_ln, b_ln = params["norm2.weight"], params["norm2.bias"]
    h2 = (X1 - mu2).mul(rstd2).mul(w_ln).add(b_ln)
    grads = {}
    (grad_h2, grads["linear1.weight"], grads["linear1.bias"],
     grads["linear2.weight"], grads["linear2.bias"]) = ffn_backward(
        h2, params["linear1.weight"], params["linear1.bias"],
        params["linear2.weight"], params["linear2.bias"], grad_Y, activation=activation,
    )
    branch, grads["norm2.weight"], grads["norm2.bias"] = layernorm_backward(X1, mu2, rstd2, w_ln, grad_h2)
    skip = grad_Y
    grads["X1"] = skip + branch
    return grads
# %% ex4
def tied_embedding_backward(idx, grad_X0, Hf, grad_logits, n_ctx, start=0):
    """X0 = wte[idx] + wpe[start:start + N], logits = Hf wteᵀ ⇒ (grad_wte, grad_wpe)."""
    B, N, d = Hf.shape
    vocab_size = grad_logits.shape[-1]
    grad_wte = torch.zeros(vocab_size, d, dtype=Hf.dtype, device=Hf.device)
    # use 1: the input embedding lookup (scatter-add, repeated ids add up)
    grad_wte.index_add_(0, idx.reshape(B * N), grad_X0.reshape(B * N, d))
    # use 2: the output head, a Linear with weight wte and input Hf
    grad_wte += grad_logits.reshape(B * N, vocab_size).T.matmul(Hf.reshape(B * N, d))
    grad_wpe = torch.zeros(n_ctx, d, dtype=Hf.dtype, device=Hf.device)
    grad_wpe.index_add_(0, torch.arange(start, start + N, device=Hf.device), grad_X0.sum(0))
    return grad_wte, grad_wpe
# %% ex5
def block_backward(grad_Y, cache):
    """X1 = X + SA(LN1(X)), Y = X1 + FF(LN2(X1))  ⇒  {"X": ∂L/∂X, name: ∂L/∂θ}."""
    params = cache["params"]
    # 1. second residual + FFN
    all_grads = ffn_sublayer_backward(
        cache["X1"], cache["mu2"], cache["rstd2"], params, grad_Y, activation=cache["activation"]
    )
    grad_X1 = all_grads.pop("X1")
    # 2. out projection, a copy of grad_X1 goes into the branch
    grad_A, gw, gb = linear_backward(cache["A"], params["self_attn.out_proj.weight"], grad_X1)
    all_grads["self_attn.out_proj.weight"] = gw
    all_grads["self_attn.out_proj.bias"] = gb
    # 3. attention heads
    n_heads = cache["H"]
    head_dim = cache["Q"].shape[-1]
    grad_heads = attention_backward(
        cache["Q"], cache["K"], cache["V"], cache["P"], split_heads(grad_A, n_heads), head_dim**-0.5
    )
    # 4. packed in_proj
    grad_qkv = torch.cat([merge_heads(gh) for gh in grad_heads], dim=-1)
    grad_h1, gw, gb = linear_backward(cache["h1"], params["self_attn.in_proj_weight"], grad_qkv)
    all_grads["self_attn.in_proj_weight"] = gw
    all_grads["self_attn.in_proj_bias"] = gb
    # 5. LN1 and the first residual
    grad_X_branch, gw, gb = layernorm_backward(cache["X"], cache["mu1"], cache["rstd1"], params["norm1.weight"], grad_h1)
    all_grads["norm1.weight"] = gw
    all_grads["norm1.bias"] = gb
    all_grads["X"] = grad_X1 + grad_X_branch
    return all_grads
