# %% ex1
def layernorm_backward(x, mu, rstd, weight, grad_y):
    """y = γ·(x − μ)·rstd + β  ⇒  (grad_x, grad_weight, grad_bias), μ, rstd saved."""
    xh = (x - mu) * rstd
    gxh = grad_y * weight
    m1 = gxh.mean(dim=-1, keepdim=True)
    m2 = (gxh * xh).mean(dim=-1, keepdim=True)
    dx = (gxh - m1 - xh * m2) * rstd
    dgamma = (grad_y * xh).flatten(0, -2).sum(0) if x.dim() > 1 else grad_y * xh
    dbeta = grad_y.flatten(0, -2).sum(0) if x.dim() > 1 else grad_y.clone()
    return dx, dgamma, dbeta
# %% ex2
def ffn_backward(h, W1, b1, W2, b2, grad_F, activation="relu"):
    """F = act(h W1ᵀ + b1) W2ᵀ + b2  ⇒  (grad_h, grad_W1, grad_b1, grad_W2, grad_b2)."""
    shape = h.shape
    h = h.reshape(-1, shape[-1])
    dF = grad_F.reshape(-1, grad_F.shape[-1])
    U = torch.addmm(b1, h, W1.T)
    if activation == "gelu":
        a = F.gelu(U)
    else:
        a = F.relu(U)
    # step 1
    da = dF @ W2
    dW2 = dF.T @ a
    db2 = dF.sum(0)
    # step 2
    dU = gelu_backward(U, da) if activation == "gelu" else da * (U > 0).to(da.dtype)
    # step 3
    dh = dU @ W1
    dW1 = dU.T @ h
    db1 = dU.sum(0)
    return dh.reshape(shape), dW1, db1, dW2, db2
# %% ex3
def ffn_sublayer_backward(X1, mu2, rstd2, params, grad_Y, activation="relu"):
    """Y = X1 + FF(LN2(X1))  ⇒  {"X1": ∂L/∂X1, name: ∂L/∂θ for the six parameters}."""
    names = ["linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias"]
    W1, b1, W2, b2 = (params[n] for n in names)
    h2 = (X1 - mu2) * rstd2 * params["norm2.weight"] + params["norm2.bias"]
    dh2, dW1, db1, dW2, db2 = ffn_backward(h2, W1, b1, W2, b2, grad_Y, activation)
    dX1_branch, dg2, db_2 = layernorm_backward(X1, mu2, rstd2, params["norm2.weight"], dh2)
    grads = dict(zip(names, (dW1, db1, dW2, db2)))
    grads["norm2.weight"] = dg2
    grads["norm2.bias"] = db_2
    grads["X1"] = dX1_branch + grad_Y
    return grads
# %% ex4
def tied_embedding_backward(idx, grad_X0, Hf, grad_logits, n_ctx, start=0):
    """X0 = wte[idx] + wpe[start:start + N], logits = Hf wteᵀ ⇒ (grad_wte, grad_wpe)."""
    _, grad_wte, _ = linear_backward(Hf, None, grad_logits, needs=(False, True, False))
    grad_wte = grad_wte.clone()
    B, N, d = grad_X0.shape
    for b in range(B):
        for n in range(N):
            grad_wte[idx[b, n]] += grad_X0[b, n]
    grad_wpe = grad_X0.new_zeros(n_ctx, d)
    for n in range(N):
        grad_wpe[start + n] = grad_X0[:, n].sum(0)
    return grad_wte, grad_wpe
# %% ex5
def block_backward(grad_Y, cache):
    """X1 = X + SA(LN1(X)), Y = X1 + FF(LN2(X1))  ⇒  {"X": ∂L/∂X, name: ∂L/∂θ}."""
    p = cache["params"]
    res = ffn_sublayer_backward(cache["X1"], cache["mu2"], cache["rstd2"], p, grad_Y, cache["activation"])
    dX1 = res.pop("X1")
    # attention output projection
    dA, dWo, dbo = linear_backward(cache["A"], p["self_attn.out_proj.weight"], dX1)
    res["self_attn.out_proj.weight"], res["self_attn.out_proj.bias"] = dWo, dbo
    dO = split_heads(dA, cache["H"])
    Q, K, V = cache["Q"], cache["K"], cache["V"]
    dQ, dK, dV = attention_backward(Q, K, V, cache["P"], dO, 1 / math.sqrt(Q.size(-1)))
    dQKV = torch.cat([merge_heads(t) for t in (dQ, dK, dV)], dim=-1)
    dh1, dWin, dbin = linear_backward(cache["h1"], p["self_attn.in_proj_weight"], dQKV)
    res["self_attn.in_proj_weight"], res["self_attn.in_proj_bias"] = dWin, dbin
    dX, res["norm1.weight"], res["norm1.bias"] = layernorm_backward(
        cache["X"], cache["mu1"], cache["rstd1"], p["norm1.weight"], dh1
    )
    res["X"] = dX + dX1
    return res
