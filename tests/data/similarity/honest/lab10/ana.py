# %% ex1
def merge_stats(m_a, ell_a, m_b, ell_b):
    """(m, ℓ) of two parts of a row together, from each part's m, ℓ = Σ exp(x − m)."""
    m = torch.maximum(m_a, m_b)
    safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    ell = ell_a * torch.exp(m_a - safe) + ell_b * torch.exp(m_b - safe)
    return m, ell


def online_softmax_stats(x, block):
    """m = max x and ℓ = Σ exp(x − m) over the last dim, merged block by block."""
    n = x.shape[-1]
    m = torch.full(x.shape[:-1], float("-inf"), dtype=x.dtype, device=x.device)
    ell = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for start in range(0, n, block):
        xb = x[..., start : start + block]
        mb = xb.amax(-1)
        lb = torch.exp(xb - mb[..., None]).sum(-1)
        m, ell = merge_stats(m, ell, mb, lb)
    return m, ell
# %% ex2
def alibi_tile(q0, k0, bq, bk, slopes):
    """bias[h, r, c] = −slopes[h] · |(k0 + c) − (q0 + r)|: one tile of ALiBi bias."""
    i = torch.arange(q0, q0 + bq, device=slopes.device, dtype=slopes.dtype)
    j = torch.arange(k0, k0 + bk, device=slopes.device, dtype=slopes.dtype)
    dist = (j[None, :] - i[:, None]).abs()  # (bq, bk)
    return -slopes[:, None, None] * dist[None]


def tiled_forward(Q, K, V, slopes, block_q=16, block_k=16, causal=False, window=None):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V and L = logsumexp, tile by tile."""
    B, H, Nq, d = Q.shape
    Nk = K.shape[-2]
    s = d ** -0.5
    O = torch.zeros_like(Q)
    L = torch.zeros(B, H, Nq, dtype=Q.dtype, device=Q.device)
    for q0 in range(0, Nq, block_q):
        Qi = Q[:, :, q0 : q0 + block_q]
        bq = Qi.shape[2]
        m = torch.full((B, H, bq), float("-inf"), dtype=Q.dtype, device=Q.device)
        ell = torch.zeros(B, H, bq, dtype=Q.dtype, device=Q.device)
        acc = torch.zeros(B, H, bq, d, dtype=Q.dtype, device=Q.device)
        k_start, k_end = 0, Nk
        if causal:
            k_end = min(Nk, q0 + bq)
            if window is not None:
                k_start = max(0, q0 - window + 1) // block_k * block_k
        for k0 in range(k_start, k_end, block_k):
            Kj = K[:, :, k0 : k0 + block_k]
            Vj = V[:, :, k0 : k0 + block_k]
            bk = Kj.shape[2]
            S = Qi @ Kj.transpose(-2, -1) * s + alibi_tile(q0, k0, bq, bk, slopes)
            if causal:
                S = S.masked_fill(~causal_tile_mask(q0, k0, bq, bk, window, Q.device), float("-inf"))
            m_new = torch.maximum(m, S.amax(-1))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            P = torch.exp(S - m_safe[..., None])
            alpha = torch.exp(m - m_safe)
            ell = alpha * ell + P.sum(-1)
            acc = alpha[..., None] * acc + P @ Vj
            m = m_new
        O[:, :, q0 : q0 + bq] = acc / ell[..., None]
        L[:, :, q0 : q0 + bq] = m + torch.log(ell)
    return O, L
# %% ex3
def row_D(O, grad_O):
    """D_i = Σ_k P_ik dP_ik, computed from O and dO alone (one number per row)."""
    return (O * grad_O).sum(-1)


def attention_backward_from_L(Q, K, V, O, L, grad_O, slopes):
    """(grad_Q, grad_K, grad_V, grad_slopes) of ALiBi attention from Q, K, V, O, L."""
    Nq, Nk, d = Q.shape[-2], K.shape[-2], Q.shape[-1]
    s = d ** -0.5
    bias = alibi_tile(0, 0, Nq, Nk, slopes)
    S = Q @ K.transpose(-2, -1) * s + bias
    P = torch.exp(S - L[..., None])
    D = row_D(O, grad_O)
    grad_V = P.transpose(-2, -1) @ grad_O
    dP = grad_O @ V.transpose(-2, -1)
    dS = P * (dP - D[..., None])
    grad_Q = dS @ K * s
    grad_K = dS.transpose(-2, -1) @ Q * s
    neg_dist = alibi_tile(0, 0, Nq, Nk, torch.ones_like(slopes))
    grad_slopes = (dS * neg_dist).sum(dim=(0, 2, 3))
    return grad_Q, grad_K, grad_V, grad_slopes
# %% ex4
def tiled_backward(
    Q, K, V, O, L, grad_O, slopes, block_q=16, block_k=16, causal=False, window=None
):
    """(grad_Q, grad_K, grad_V, grad_slopes) from Q, K, V, O, L; query blocks outer."""
    B, H, Nq, d = Q.shape
    Nk = K.shape[-2]
    s = d ** -0.5
    D = row_D(O, grad_O)
    grad_Q = torch.zeros_like(Q)
    grad_K = torch.zeros_like(K)
    grad_V = torch.zeros_like(V)
    grad_slopes = torch.zeros_like(slopes)
    ones = torch.ones_like(slopes)
    for q0 in range(0, Nq, block_q):
        Qi = Q[:, :, q0 : q0 + block_q]
        dOi = grad_O[:, :, q0 : q0 + block_q]
        Li = L[:, :, q0 : q0 + block_q]
        Di = D[:, :, q0 : q0 + block_q]
        bq = Qi.shape[2]
        dQi = torch.zeros_like(Qi)
        k_start, k_end = 0, Nk
        if causal:
            k_end = min(Nk, q0 + bq)
            if window is not None:
                k_start = max(0, q0 - window + 1) // block_k * block_k
        for k0 in range(k_start, k_end, block_k):
            Kj = K[:, :, k0 : k0 + block_k]
            Vj = V[:, :, k0 : k0 + block_k]
            bk = Kj.shape[2]
            S = Qi @ Kj.transpose(-2, -1) * s + alibi_tile(q0, k0, bq, bk, slopes)
            P = torch.exp(S - Li[..., None])
            if causal:
                P = P * causal_tile_mask(q0, k0, bq, bk, window, Q.device)
            grad_V[:, :, k0 : k0 + bk] += P.transpose(-2, -1) @ dOi
            dP = dOi @ Vj.transpose(-2, -1)
            dS = P * (dP - Di[..., None])
            dQi += dS @ Kj * s
            grad_K[:, :, k0 : k0 + bk] += dS.transpose(-2, -1) @ Qi * s
            grad_slopes += (dS * alibi_tile(q0, k0, bq, bk, ones)).sum(dim=(0, 2, 3))
        grad_Q[:, :, q0 : q0 + bq] = dQi
    return grad_Q, grad_K, grad_V, grad_slopes
# %% ex5
def causal_tile_mask(q0, k0, bq, bk, window=None, device=None):
    """allowed[r, c]: key k0 + c visible to query q0 + r (j ≤ i, and i − window < j)."""
    i = torch.arange(q0, q0 + bq, device=device)[:, None]
    j = torch.arange(k0, k0 + bk, device=device)[None, :]
    allowed = j <= i
    if window is not None:
        allowed = allowed & (j > i - window)
    return allowed
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
        Q, K, V, slopes, causal, window, block_q, block_k = inputs
        O, L = output
        ctx.save_for_backward(Q, K, V, O, L, slopes)
        ctx.causal, ctx.window = causal, window
        ctx.block_q, ctx.block_k = block_q, block_k
        ctx.mark_non_differentiable(L)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_O, grad_L):
        """Gradients of Q, K, V, slopes by the tiled backward; None for the rest."""
        Q, K, V, O, L, slopes = ctx.saved_tensors
        gQ, gK, gV, gs = tiled_backward(
            Q, K, V, O, L, grad_O, slopes, ctx.block_q, ctx.block_k, ctx.causal, ctx.window
        )
        need = ctx.needs_input_grad
        return (
            gQ if need[0] else None,
            gK if need[1] else None,
            gV if need[2] else None,
            gs if need[3] else None,
            None,
            None,
            None,
            None,
        )


def flash_attn(Q, K, V, slopes, causal=False, window=None, block_q=16, block_k=16):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V by FlashAttentionFn (L dropped)."""
    O, _ = FlashAttentionFn.apply(Q, K, V, slopes, causal, window, block_q, block_k)
    return O
