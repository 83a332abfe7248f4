# %% ex1
def merge_stats(m_a, ell_a, m_b, ell_b):
    """(m, ℓ) of two parts of a row together, from each part's m, ℓ = Σ exp(x − m)."""
    m = torch.max(m_a, m_b)
    # an empty part has m = -inf; exp(-inf - (-inf)) would be nan, so guard both terms
    wa = torch.where(ell_a > 0, torch.exp(m_a - m), torch.zeros_like(m))
    wb = torch.where(ell_b > 0, torch.exp(m_b - m), torch.zeros_like(m))
    return m, ell_a * wa + ell_b * wb


def online_softmax_stats(x, block):
    """m = max x and ℓ = Σ exp(x − m) over the last dim, merged block by block."""
    lead = x.shape[:-1]
    run_m = x.new_full(lead, -math.inf)
    run_l = x.new_zeros(lead)
    for blk in torch.split(x, block, dim=-1):
        bm = blk.max(dim=-1).values
        bl = (blk - bm.unsqueeze(-1)).exp().sum(dim=-1)
        run_m, run_l = merge_stats(run_m, run_l, bm, bl)
    return run_m, run_l
# %% ex2
def alibi_tile(q0, k0, bq, bk, slopes):
    """bias[h, r, c] = −slopes[h] · |(k0 + c) − (q0 + r)|: one tile of ALiBi bias."""
    rows = q0 + torch.arange(bq, device=slopes.device)
    cols = k0 + torch.arange(bk, device=slopes.device)
    gap = (cols.view(1, -1) - rows.view(-1, 1)).abs().to(slopes.dtype)
    return -(slopes.view(-1, 1, 1) * gap.unsqueeze(0))


def tiled_forward(Q, K, V, slopes, block_q=16, block_k=16, causal=False, window=None):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V and L = logsumexp, tile by tile."""
    B, H, Nq, d = Q.shape
    Nk = K.shape[2]
    scale = 1.0 / math.sqrt(d)
    outs, lses = [], []
    for q0 in range(0, Nq, block_q):
        q1 = min(q0 + block_q, Nq)
        Qi = Q[:, :, q0:q1]
        m = Q.new_full((B, H, q1 - q0), -math.inf)
        l = Q.new_zeros((B, H, q1 - q0))
        acc = Q.new_zeros((B, H, q1 - q0, d))
        for k0 in range(0, Nk, block_k):
            k1 = min(k0 + block_k, Nk)
            if causal and k0 > q1 - 1:
                break
            if causal and window is not None and k1 - 1 <= q0 - window:
                continue
            S = torch.matmul(Qi, K[:, :, k0:k1].transpose(2, 3)) * scale
            S = S + alibi_tile(q0, k0, q1 - q0, k1 - k0, slopes)
            if causal:
                keep = causal_tile_mask(q0, k0, q1 - q0, k1 - k0, window, Q.device)
                S = torch.where(keep, S, torch.full_like(S, -math.inf))
            m_new = torch.max(m, S.max(dim=-1).values)
            sub = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
            Pt = torch.exp(S - sub.unsqueeze(-1))
            corr = torch.exp(m - sub)
            l = corr * l + Pt.sum(dim=-1)
            acc = corr.unsqueeze(-1) * acc + torch.matmul(Pt, V[:, :, k0:k1])
            m = m_new
        outs.append(acc / l.unsqueeze(-1))
        lses.append(m + l.log())
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)
# %% ex3
def row_D(O, grad_O):
    """D_i = Σ_k P_ik dP_ik, computed from O and dO alone (one number per row)."""
    D = torch.sum(grad_O * O, dim=-1)
    return D


def attention_backward_from_L(Q, K, V, O, L, grad_O, slopes):
    """(grad_Q, grad_K, grad_V, grad_slopes) of ALiBi attention from Q, K, V, O, L."""
    Nq, Nk = Q.shape[2], K.shape[2]
    scale = 1.0 / math.sqrt(Q.shape[-1])
    i = torch.arange(Nq, device=Q.device).view(-1, 1)
    j = torch.arange(Nk, device=Q.device).view(1, -1)
    dist = (i - j).abs().to(Q.dtype)  # (Nq, Nk)
    S = torch.matmul(Q, K.transpose(2, 3)) * scale - slopes.view(1, -1, 1, 1) * dist
    P = torch.exp(S - L.unsqueeze(-1))
    dV = torch.matmul(P.transpose(2, 3), grad_O)
    dP = torch.matmul(grad_O, V.transpose(2, 3))
    dS = P * (dP - row_D(O, grad_O).unsqueeze(-1))
    dQ = torch.matmul(dS, K) * scale
    dK = torch.matmul(dS.transpose(2, 3), Q) * scale
    dslopes = -(dS * dist).sum(dim=(0, 2, 3))
    return dQ, dK, dV, dslopes
# %% ex4
def tiled_backward(
    Q, K, V, O, L, grad_O, slopes, block_q=16, block_k=16, causal=False, window=None
):
    """(grad_Q, grad_K, grad_V, grad_slopes) from Q, K, V, O, L; query blocks outer."""
    B, H, Nq, d = Q.shape
    Nk = K.shape[2]
    scale = 1.0 / math.sqrt(d)
    D = torch.sum(grad_O * O, dim=-1)
    dQ = torch.zeros_like(Q)
    dK = torch.zeros_like(K)
    dV = torch.zeros_like(V)
    dslopes = torch.zeros_like(slopes)
    for q0 in range(0, Nq, block_q):
        q1 = min(q0 + block_q, Nq)
        Qi, dOi = Q[:, :, q0:q1], grad_O[:, :, q0:q1]
        Li, Di = L[:, :, q0:q1].unsqueeze(-1), D[:, :, q0:q1].unsqueeze(-1)
        dQi = torch.zeros_like(Qi)
        for k0 in range(0, Nk, block_k):
            k1 = min(k0 + block_k, Nk)
            if causal and k0 > q1 - 1:
                break
            if causal and window is not None and k1 - 1 <= q0 - window:
                continue
            Kj, Vj = K[:, :, k0:k1], V[:, :, k0:k1]
            neg = alibi_tile(q0, k0, q1 - q0, k1 - k0, torch.ones_like(slopes))
            S = torch.matmul(Qi, Kj.transpose(2, 3)) * scale + slopes.view(-1, 1, 1) * neg
            P = torch.exp(S - Li)
            if causal:
                P = torch.where(causal_tile_mask(q0, k0, q1 - q0, k1 - k0, window, Q.device), P, 0.0)
            dV[:, :, k0:k1] += torch.matmul(P.transpose(2, 3), dOi)
            dS = P * (torch.matmul(dOi, Vj.transpose(2, 3)) - Di)
            dQi += torch.matmul(dS, Kj) * scale
            dK[:, :, k0:k1] += torch.matmul(dS.transpose(2, 3), Qi) * scale
            dslopes += (dS * neg).sum(dim=(0, 2, 3))
        dQ[:, :, q0:q1] = dQi
    return dQ, dK, dV, dslopes
# %% ex5
def causal_tile_mask(q0, k0, bq, bk, window=None, device=None):
    """allowed[r, c]: key k0 + c visible to query q0 + r (j ≤ i, and i − window < j)."""
    qi = (q0 + torch.arange(bq, device=device)).view(-1, 1)
    kj = (k0 + torch.arange(bk, device=device)).view(1, -1)
    ok = kj <= qi
    if window is not None:
        ok = ok & (qi - kj < window)
    return ok
# %% ex6
class FlashAttentionFn(torch.autograd.Function):
    """(O, L) = tiled_forward(Q, K, V, slopes); backward recomputes P tile by tile."""

    @staticmethod
    def forward(Q, K, V, slopes, causal, window, block_q, block_k):
        """(O, L) by the tiled forward; no ctx here."""
        O, L = tiled_forward(Q, K, V, slopes, block_q=block_q, block_k=block_k, causal=causal, window=window)
        return O, L

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save what backward needs (nothing N × N) and the non-tensor arguments."""
        ctx.save_for_backward(inputs[0], inputs[1], inputs[2], inputs[3], output[0], output[1])
        ctx.args = inputs[4:]
        ctx.mark_non_differentiable(output[1])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_O, grad_L):
        """Gradients of Q, K, V, slopes by the tiled backward; None for the rest."""
        Q, K, V, slopes, O, L = ctx.saved_tensors
        causal, window, block_q, block_k = ctx.args
        grads = tiled_backward(Q, K, V, O, L, grad_O, slopes, block_q=block_q, block_k=block_k, causal=causal, window=window)
        out = [g if need else None for g, need in zip(grads, ctx.needs_input_grad[:4])]
        return (*out, None, None, None, None)


def flash_attn(Q, K, V, slopes, causal=False, window=None, block_q=16, block_k=16):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V by FlashAttentionFn (L dropped)."""
    return FlashAttentionFn.apply(Q, K, V, slopes, causal, window, block_q, block_k)[0]
