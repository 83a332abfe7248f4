# %% ex1
def merge_stats(m_a, ell_a, m_b, ell_b):
    """(m, ℓ) of two parts of a row together, from each part's m, ℓ = Σ exp(x − m)."""
    new_max = torch.max(torch.stack([m_a, m_b]), dim=0).values
    # rebase each sum; an empty side contributes exp(-inf) * 0 = 0
    fa = torch.exp(m_a - new_max)
    fb = torch.exp(m_b - new_max)
    fa = torch.nan_to_num(fa, nan=0.0)
    fb = torch.nan_to_num(fb, nan=0.0)
    return new_max, fa * ell_a + fb * ell_b


def online_softmax_stats(x, block):
    """m = max x and ℓ = Σ exp(x − m) over the last dim, merged block by block."""
    shape = x.shape[:-1]
    M = torch.full(shape, -torch.inf, dtype=x.dtype, device=x.device)
    S = torch.zeros(shape, dtype=x.dtype, device=x.device)
    nblocks = (x.shape[-1] + block - 1) // block
    for b in range(nblocks):
        xs = x[..., b * block : (b + 1) * block]
        M_b = torch.amax(xs, dim=-1)
        S_b = torch.sum(torch.exp(xs - M_b.unsqueeze(-1)), dim=-1)
        M, S = merge_stats(M, S, M_b, S_b)
    return M, S
# %% ex2
def alibi_tile(q0, k0, bq, bk, slopes):
    """bias[h, r, c] = −slopes[h] · |(k0 + c) − (q0 + r)|: one tile of ALiBi bias."""
    qpos = torch.arange(bq, device=slopes.device, dtype=slopes.dtype) + q0
    kpos = torch.arange(bk, device=slopes.device, dtype=slopes.dtype) + k0
    rel = kpos.reshape(1, 1, bk) - qpos.reshape(1, bq, 1)
    return slopes.reshape(-1, 1, 1) * -rel.abs()


def key_range(q0, bq, Nk, block_k, causal, window):
    # which key blocks a query block has to visit
    if not causal:
        return range(0, Nk, block_k)
    first = 0 if window is None else max(0, q0 - window + 1) // block_k * block_k
    return range(first, min(Nk, q0 + bq), block_k)


def tiled_forward(Q, K, V, slopes, block_q=16, block_k=16, causal=False, window=None):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V and L = logsumexp, tile by tile."""
    n_q, n_k, dim = Q.shape[2], K.shape[2], Q.shape[3]
    temp = 1.0 / math.sqrt(dim)
    out = torch.empty_like(Q)
    lse = torch.empty(Q.shape[:3], dtype=Q.dtype, device=Q.device)
    for qb in range(0, n_q, block_q):
        q_tile = Q[:, :, qb : qb + block_q]
        nq = q_tile.shape[2]
        M = torch.full(q_tile.shape[:3], -torch.inf, dtype=Q.dtype, device=Q.device)
        Lsum = torch.zeros_like(M)
        A = torch.zeros_like(q_tile)
        for kb in key_range(qb, nq, n_k, block_k, causal, window):
            k_tile, v_tile = K[:, :, kb : kb + block_k], V[:, :, kb : kb + block_k]
            nk = k_tile.shape[2]
            sc = q_tile.matmul(k_tile.transpose(-1, -2)).mul(temp).add(alibi_tile(qb, kb, nq, nk, slopes))
            if causal:
                sc = sc.masked_fill(causal_tile_mask(qb, kb, nq, nk, window, Q.device).logical_not(), -torch.inf)
            M_new = torch.maximum(M, sc.amax(-1))
            shift = torch.where(torch.isneginf(M_new), torch.zeros_like(M_new), M_new)
            expd = torch.exp(sc - shift.unsqueeze(-1))
            factor = torch.exp(M - shift)
            Lsum = factor * Lsum + expd.sum(-1)
            A = factor.unsqueeze(-1) * A + expd.matmul(v_tile)
            M = M_new
        out[:, :, qb : qb + nq] = A / Lsum.unsqueeze(-1)
        lse[:, :, qb : qb + nq] = M + torch.log(Lsum)
    return out, lse
# %% ex3
def row_D(O, grad_O):
    """D_i = Σ_k P_ik dP_ik, computed from O and dO alone (one number per row)."""
    return torch.linalg.vecdot(grad_O, O, dim=-1)


def attention_backward_from_L(Q, K, V, O, L, grad_O, slopes):
    """(grad_Q, grad_K, grad_V, grad_slopes) of ALiBi attention from Q, K, V, O, L."""
    n_q, n_k = Q.shape[2], K.shape[2]
    temp = 1.0 / math.sqrt(Q.shape[3])
    scores = Q.matmul(K.transpose(-1, -2)).mul(temp) + alibi_tile(0, 0, n_q, n_k, slopes)
    probs = torch.exp(scores - L.unsqueeze(-1))
    g_probs = grad_O.matmul(V.transpose(-1, -2))
    g_scores = probs * (g_probs - row_D(O, grad_O).unsqueeze(-1))
    g_V = probs.transpose(-1, -2).matmul(grad_O)
    g_Q = g_scores.matmul(K).mul(temp)
    g_K = g_scores.transpose(-1, -2).matmul(Q).mul(temp)
    unit_bias = alibi_tile(0, 0, n_q, n_k, torch.ones_like(slopes))  # -|i-j| per head
    g_slopes = (g_scores * unit_bias).sum(0).sum(-1).sum(-1)
    return g_Q, g_K, g_V, g_slopes
# %% ex4
def tiled_backward(
    Q, K, V, O, L, grad_O, slopes, block_q=16, block_k=16, causal=False, window=None
):
    """(grad_Q, grad_K, grad_V, grad_slopes) from Q, K, V, O, L; query blocks outer."""
    n_q, n_k, dim = Q.shape[2], K.shape[2], Q.shape[3]
    temp = 1.0 / math.sqrt(dim)
    Dvec = row_D(O, grad_O)
    g_Q = torch.zeros_like(Q)
    g_K = torch.zeros_like(K)
    g_V = torch.zeros_like(V)
    g_slopes = torch.zeros_like(slopes)
    for qb in range(0, n_q, block_q):
        q_tile = Q[:, :, qb : qb + block_q]
        nq = q_tile.shape[2]
        do_tile = grad_O[:, :, qb : qb + nq]
        l_tile = L[:, :, qb : qb + nq].unsqueeze(-1)
        d_tile = Dvec[:, :, qb : qb + nq].unsqueeze(-1)
        gq_local = torch.zeros_like(q_tile)
        for kb in key_range(qb, nq, n_k, block_k, causal, window):
            k_tile, v_tile = K[:, :, kb : kb + block_k], V[:, :, kb : kb + block_k]
            nk = k_tile.shape[2]
            sc = q_tile.matmul(k_tile.transpose(-1, -2)).mul(temp).add(alibi_tile(qb, kb, nq, nk, slopes))
            pr = torch.exp(sc - l_tile)
            if causal:
                pr = pr * causal_tile_mask(qb, kb, nq, nk, window, Q.device).to(pr.dtype)
            g_V[:, :, kb : kb + nk] += pr.transpose(-1, -2).matmul(do_tile)
            gs = pr * (do_tile.matmul(v_tile.transpose(-1, -2)) - d_tile)
            gq_local += gs.matmul(k_tile).mul(temp)
            g_K[:, :, kb : kb + nk] += gs.transpose(-1, -2).matmul(q_tile).mul(temp)
            unit_bias = alibi_tile(qb, kb, nq, nk, torch.ones_like(slopes))
            g_slopes += (gs * unit_bias).sum(0).sum(-1).sum(-1)
        g_Q[:, :, qb : qb + nq] = gq_local
    return g_Q, g_K, g_V, g_slopes
# %% ex5
def causal_tile_mask(q0, k0, bq, bk, window=None, device=None):
    """allowed[r, c]: key k0 + c visible to query q0 + r (j ≤ i, and i − window < j)."""
    qpos = torch.arange(q0, q0 + bq, device=device).reshape(bq, 1)
    kpos = torch.arange(k0, k0 + bk, device=device).reshape(1, bk)
    lag = qpos - kpos
    if window is None:
        return lag >= 0
    return (lag >= 0) & (lag < window)
# %% ex6
class FlashAttentionFn(torch.autograd.Function):
    """(O, L) = tiled_forward(Q, K, V, slopes); backward recomputes P tile by tile."""

    @staticmethod
    def forward(Q, K, V, slopes, causal, window, block_q, block_k):
        """(O, L) by the tiled forward; no ctx here."""
        return tiled_forward(Q, K, V, slopes, block_q, block_k, causal, window)

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save what backward needs (nothing N × N) and the non-tensor arguments."""
        q, k, v, sl, causal, window, bq, bk = inputs
        o, lse = output
        ctx.save_for_backward(q, k, v, sl, o, lse)
        ctx.opts = dict(block_q=bq, block_k=bk, causal=causal, window=window)
        ctx.mark_non_differentiable(lse)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_O, grad_L):
        """Gradients of Q, K, V, slopes by the tiled backward; None for the rest."""
        q, k, v, sl, o, lse = ctx.saved_tensors
        grads = list(tiled_backward(q, k, v, o, lse, grad_O, sl, **ctx.opts))
        for n in range(4):
            if not ctx.needs_input_grad[n]:
                grads[n] = None
        return tuple(grads) + (None, None, None, None)


def flash_attn(Q, K, V, slopes, causal=False, window=None, block_q=16, block_k=16):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V by FlashAttentionFn (L dropped)."""
    return FlashAttentionFn.apply(Q, K, V, slopes, causal, window, block_q, block_k)[0]
