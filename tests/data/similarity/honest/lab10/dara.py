# %% ex1
def merge_stats(m_a, ell_a, m_b, ell_b):
    """(m, ℓ) of two parts of a row together, from each part's m, ℓ = Σ exp(x − m)."""
    m = torch.where(m_a > m_b, m_a, m_b)
    m_fin = torch.nan_to_num(m, neginf=0.0)
    return m, ell_a * torch.exp(m_a - m_fin) + ell_b * torch.exp(m_b - m_fin)


def online_softmax_stats(x, block):
    """m = max x and ℓ = Σ exp(x − m) over the last dim, merged block by block."""
    stats = None
    for s in range(0, x.shape[-1], block):
        part = x[..., s : s + block]
        pm, _ = part.max(dim=-1, keepdim=True)
        pl = torch.exp(part - pm).sum(dim=-1)
        pm = pm.squeeze(-1)
        stats = (pm, pl) if stats is None else merge_stats(*stats, pm, pl)
    return stats
# %% ex2
def alibi_tile(q0, k0, bq, bk, slopes):
    """bias[h, r, c] = −slopes[h] · |(k0 + c) − (q0 + r)|: one tile of ALiBi bias."""
    q_idx = torch.arange(q0, q0 + bq, device=slopes.device)
    k_idx = torch.arange(k0, k0 + bk, device=slopes.device)
    D = torch.abs(k_idx.unsqueeze(0) - q_idx.unsqueeze(1)).to(slopes.dtype)
    return torch.einsum("h,qk->hqk", -slopes, D)


def tiled_forward(Q, K, V, slopes, block_q=16, block_k=16, causal=False, window=None):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V and L = logsumexp, tile by tile."""
    B, H, Nq, d = Q.shape
    _, _, Nk, _ = K.shape
    scale = d ** -0.5
    O_blocks, L_blocks = [], []
    ninf = float("-inf")
    for q0 in range(0, Nq, block_q):
        Qi = Q[:, :, q0 : q0 + block_q, :]
        bq = Qi.shape[-2]
        mi = Qi.new_full((B, H, bq), ninf)
        li = Qi.new_zeros((B, H, bq))
        Oi = Qi.new_zeros((B, H, bq, d))
        for k0 in range(0, Nk, block_k):
            bk = min(block_k, Nk - k0)
            if causal:
                if k0 > q0 + bq - 1:
                    continue  # entirely in the future
                if window is not None and k0 + bk - 1 <= q0 - window:
                    continue  # entirely out of the window
            Sij = (Qi @ K[:, :, k0 : k0 + bk, :].mT) * scale + alibi_tile(q0, k0, bq, bk, slopes)
            if causal:
                vis = causal_tile_mask(q0, k0, bq, bk, window, device=Q.device)
                Sij = torch.where(vis, Sij, ninf)
            mij = torch.maximum(mi, Sij.amax(dim=-1))
            ref = torch.where(mij == ninf, 0.0, mij)
            Pij = torch.exp(Sij - ref[..., None])
            a = torch.exp(mi - ref)
            li = a * li + Pij.sum(dim=-1)
            Oi = a[..., None] * Oi + Pij @ V[:, :, k0 : k0 + bk, :]
            mi = mij
        O_blocks.append(Oi / li[..., None])
        L_blocks.append(mi + torch.log(li))
    return torch.cat(O_blocks, dim=-2), torch.cat(L_blocks, dim=-1)
# %% ex3
def row_D(O, grad_O):
    """D_i = Σ_k P_ik dP_ik, computed from O and dO alone (one number per row)."""
    # dP_ik = dO_i . V_k, so sum_k P_ik dO_i . V_k = dO_i . sum_k P_ik V_k = dO_i . O_i
    return (grad_O * O).sum(dim=-1)


def attention_backward_from_L(Q, K, V, O, L, grad_O, slopes):
    """(grad_Q, grad_K, grad_V, grad_slopes) of ALiBi attention from Q, K, V, O, L."""
    B, H, Nq, d = Q.shape
    Nk = K.shape[-2]
    scale = d ** -0.5
    pos_q = torch.arange(Nq, device=Q.device)
    pos_k = torch.arange(Nk, device=Q.device)
    absd = (pos_q[:, None] - pos_k[None, :]).abs().to(Q.dtype)
    S = (Q @ K.mT) * scale - slopes[:, None, None] * absd
    P = torch.exp(S - L[..., None])
    D = row_D(O, grad_O)
    grad_V = P.mT @ grad_O
    grad_S = P * (grad_O @ V.mT - D[..., None])
    grad_Q = (grad_S @ K) * scale
    grad_K = (grad_S.mT @ Q) * scale
    grad_slopes = -(grad_S * absd).sum(dim=(0, 2, 3))
    return grad_Q, grad_K, grad_V, grad_slopes
# %% ex4
def tiled_backward(
    Q, K, V, O, L, grad_O, slopes, block_q=16, block_k=16, causal=False, window=None
):
    """(grad_Q, grad_K, grad_V, grad_slopes) from Q, K, V, O, L; query blocks outer."""
    B, H, Nq, d = Q.shape
    Nk = K.shape[-2]
    scale = d ** -0.5
    D = row_D(O, grad_O)
    grad_Q, grad_K, grad_V = Q.new_zeros(Q.shape), K.new_zeros(K.shape), V.new_zeros(V.shape)
    grad_slopes = slopes.new_zeros(slopes.shape)
    for q0 in range(0, Nq, block_q):
        rows = slice(q0, q0 + block_q)
        Qi, dOi, Li, Di = Q[:, :, rows], grad_O[:, :, rows], L[:, :, rows], D[:, :, rows]
        bq = Qi.shape[-2]
        dQ_acc = Qi.new_zeros(Qi.shape)
        for k0 in range(0, Nk, block_k):
            bk = min(block_k, Nk - k0)
            if causal:
                if k0 > q0 + bq - 1:
                    continue
                if window is not None and k0 + bk - 1 <= q0 - window:
                    continue
            cols = slice(k0, k0 + bk)
            Kj, Vj = K[:, :, cols], V[:, :, cols]
            negdist = alibi_tile(q0, k0, bq, bk, torch.ones_like(slopes))
            Pij = torch.exp((Qi @ Kj.mT) * scale + alibi_tile(q0, k0, bq, bk, slopes) - Li[..., None])
            if causal:
                Pij = torch.where(causal_tile_mask(q0, k0, bq, bk, window, device=Q.device), Pij, 0.0)
            grad_V[:, :, cols] += Pij.mT @ dOi
            dSij = Pij * (dOi @ Vj.mT - Di[..., None])
            dQ_acc += (dSij @ Kj) * scale
            grad_K[:, :, cols] += (dSij.mT @ Qi) * scale
            grad_slopes += (dSij * negdist).sum(dim=(0, 2, 3))
        grad_Q[:, :, rows] = dQ_acc
    return grad_Q, grad_K, grad_V, grad_slopes
# %% ex5
def causal_tile_mask(q0, k0, bq, bk, window=None, device=None):
    """allowed[r, c]: key k0 + c visible to query q0 + r (j ≤ i, and i − window < j)."""
    # same as tril with an offset of q0 - k0
    m = torch.ones(bq, bk, dtype=torch.bool, device=device).tril(diagonal=q0 - k0)
    if window is not None:
        m &= ~torch.ones(bq, bk, dtype=torch.bool, device=device).tril(diagonal=q0 - k0 - window)
    return m
# %% ex6
class FlashAttentionFn(torch.autograd.Function):
    """(O, L) = tiled_forward(Q, K, V, slopes); backward recomputes P tile by tile."""

    @staticmethod
    def forward(Q, K, V, slopes, causal, window, block_q, block_k):
        """(O, L) by the tiled forward; no ctx here."""
        O, L = tiled_forward(Q, K, V, slopes, block_q, block_k, causal=causal, window=window)
        return O, L

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save what backward needs (nothing N × N) and the non-tensor arguments."""
        Q, K, V, slopes = inputs[:4]
        ctx.causal, ctx.window, ctx.block_q, ctx.block_k = inputs[4:]
        O, L = output
        ctx.save_for_backward(Q, K, V, O, L, slopes)  # all O(N d), plus the (H,) slopes
        ctx.mark_non_differentiable(L)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_O, grad_L):
        """Gradients of Q, K, V, slopes by the tiled backward; None for the rest."""
        Q, K, V, O, L, slopes = ctx.saved_tensors
        res = tiled_backward(Q, K, V, O, L, grad_O, slopes, ctx.block_q, ctx.block_k,
                             causal=ctx.causal, window=ctx.window)
        res = tuple(r if n else None for r, n in zip(res, ctx.needs_input_grad))
        return res + (None,) * 4


def flash_attn(Q, K, V, slopes, causal=False, window=None, block_q=16, block_k=16):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V by FlashAttentionFn (L dropped)."""
    O, L = FlashAttentionFn.apply(Q, K, V, slopes, causal, window, block_q, block_k)
    return O
