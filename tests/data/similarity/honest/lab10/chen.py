# %% ex1
def merge_stats(m_a, ell_a, m_b, ell_b):
    """(m, ℓ) of two parts of a row together, from each part's m, ℓ = Σ exp(x − m)."""
    m = torch.maximum(m_a, m_b)
    both_empty = m == float("-inf")
    m_ref = m.masked_fill(both_empty, 0.0)
    ell = ell_a * (m_a - m_ref).exp() + ell_b * (m_b - m_ref).exp()
    return m, ell


def online_softmax_stats(x, block):
    """m = max x and ℓ = Σ exp(x − m) over the last dim, merged block by block."""
    m = torch.full_like(x[..., 0], float("-inf"))
    ell = torch.zeros_like(x[..., 0])
    n = x.size(-1)
    start = 0
    while start < n:
        chunk = x[..., start : min(start + block, n)]
        cm = chunk.max(-1).values
        cl = (chunk - cm[..., None]).exp().sum(-1)
        m, ell = merge_stats(m, ell, cm, cl)
        start += block
    return m, ell
# %% ex2
def alibi_tile(q0, k0, bq, bk, slopes):
    """bias[h, r, c] = −slopes[h] · |(k0 + c) − (q0 + r)|: one tile of ALiBi bias."""
    H = slopes.shape[0]
    out = torch.empty(H, bq, bk, dtype=slopes.dtype, device=slopes.device)
    r = torch.arange(bq, device=slopes.device).unsqueeze(1)
    c = torch.arange(bk, device=slopes.device).unsqueeze(0)
    absdist = ((k0 + c) - (q0 + r)).abs()
    for h in range(H):
        out[h] = -slopes[h] * absdist
    return out


def tiled_forward(Q, K, V, slopes, block_q=16, block_k=16, causal=False, window=None):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V and L = logsumexp, tile by tile."""
    Nq, Nk, d = Q.size(-2), K.size(-2), Q.size(-1)
    sc = 1 / d**0.5
    O = Q.new_empty(Q.shape)
    L = Q.new_empty(Q.shape[:-1])
    for qs in range(0, Nq, block_q):
        qe = min(qs + block_q, Nq)
        q = Q[..., qs:qe, :]
        run_max = torch.full(q.shape[:-1], -float("inf"), dtype=Q.dtype, device=Q.device)
        run_sum = torch.zeros_like(run_max)
        acc = torch.zeros_like(q)
        if causal:
            lo = 0 if window is None else max(0, qs - window + 1) // block_k * block_k
            hi = min(Nk, qe)
        else:
            lo, hi = 0, Nk
        for ks in range(lo, hi, block_k):
            ke = min(ks + block_k, Nk)
            scores = torch.einsum("bhqd,bhkd->bhqk", q, K[..., ks:ke, :]) * sc
            scores += alibi_tile(qs, ks, qe - qs, ke - ks, slopes)
            if causal:
                allowed = causal_tile_mask(qs, ks, qe - qs, ke - ks, window=window, device=Q.device)
                scores = scores.masked_fill(~allowed, -float("inf"))
            new_max = torch.maximum(run_max, scores.amax(-1))
            base = new_max.masked_fill(new_max == -float("inf"), 0.0)
            p = (scores - base[..., None]).exp()
            rescale = (run_max - base).exp()
            run_sum = run_sum * rescale + p.sum(-1)
            acc = acc * rescale[..., None] + torch.einsum("bhqk,bhkd->bhqd", p, V[..., ks:ke, :])
            run_max = new_max
        O[..., qs:qe, :] = acc / run_sum[..., None]
        L[..., qs:qe] = run_max + run_sum.log()
    return O, L
# %% ex3
def row_D(O, grad_O):
    """D_i = Σ_k P_ik dP_ik, computed from O and dO alone (one number per row)."""
    return torch.einsum("bhid,bhid->bhi", grad_O, O)


def attention_backward_from_L(Q, K, V, O, L, grad_O, slopes):
    """(grad_Q, grad_K, grad_V, grad_slopes) of ALiBi attention from Q, K, V, O, L."""
    d = Q.size(-1)
    sc = 1 / d**0.5
    bias = alibi_tile(0, 0, Q.size(-2), K.size(-2), slopes)
    S = torch.einsum("bhqd,bhkd->bhqk", Q, K) * sc + bias
    P = (S - L[..., None]).exp()  # L is the log of the softmax denominator
    gV = torch.einsum("bhqk,bhqd->bhkd", P, grad_O)
    gP = torch.einsum("bhqd,bhkd->bhqk", grad_O, V)
    gS = P * (gP - row_D(O, grad_O)[..., None])
    gQ = torch.einsum("bhqk,bhkd->bhqd", gS, K) * sc
    gK = torch.einsum("bhqk,bhqd->bhkd", gS, Q) * sc
    # bias = -slope * |i-j|, so dBias/dslope = -|i-j| = bias / slope (slope may be 0: rebuild)
    dist = alibi_tile(0, 0, Q.size(-2), K.size(-2), torch.ones_like(slopes))
    g_slopes = torch.einsum("bhqk,hqk->h", gS, dist)
    return gQ, gK, gV, g_slopes
# %% ex4
def tiled_backward(
    Q, K, V, O, L, grad_O, slopes, block_q=16, block_k=16, causal=False, window=None
):
    """(grad_Q, grad_K, grad_V, grad_slopes) from Q, K, V, O, L; query blocks outer."""
    Nq, Nk, d = Q.size(-2), K.size(-2), Q.size(-1)
    sc = 1 / d**0.5
    D = row_D(O, grad_O)
    gQ, gK, gV = torch.zeros_like(Q), torch.zeros_like(K), torch.zeros_like(V)
    g_slopes = torch.zeros_like(slopes)
    unit = torch.ones_like(slopes)
    for qs in range(0, Nq, block_q):
        qe = min(qs + block_q, Nq)
        q, do = Q[..., qs:qe, :], grad_O[..., qs:qe, :]
        l_i, d_i = L[..., qs:qe, None], D[..., qs:qe, None]
        dq = torch.zeros_like(q)
        if causal:
            lo = 0 if window is None else max(0, qs - window + 1) // block_k * block_k
            hi = min(Nk, qe)
        else:
            lo, hi = 0, Nk
        for ks in range(lo, hi, block_k):
            ke = min(ks + block_k, Nk)
            k, v = K[..., ks:ke, :], V[..., ks:ke, :]
            scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * sc + alibi_tile(qs, ks, qe - qs, ke - ks, slopes)
            p = (scores - l_i).exp()
            if causal:
                p = p.masked_fill(~causal_tile_mask(qs, ks, qe - qs, ke - ks, window=window, device=Q.device), 0.0)
            gV[..., ks:ke, :] += torch.einsum("bhqk,bhqd->bhkd", p, do)
            dp = torch.einsum("bhqd,bhkd->bhqk", do, v)
            ds = p * (dp - d_i)
            dq += torch.einsum("bhqk,bhkd->bhqd", ds, k) * sc
            gK[..., ks:ke, :] += torch.einsum("bhqk,bhqd->bhkd", ds, q) * sc
            g_slopes += torch.einsum("bhqk,hqk->h", ds, alibi_tile(qs, ks, qe - qs, ke - ks, unit))
        gQ[..., qs:qe, :] = dq
    return gQ, gK, gV, g_slopes
# %% ex5
def causal_tile_mask(q0, k0, bq, bk, window=None, device=None):
    """allowed[r, c]: key k0 + c visible to query q0 + r (j ≤ i, and i − window < j)."""
    allowed = torch.zeros(bq, bk, dtype=torch.bool, device=device)
    for r in range(bq):
        i = q0 + r
        for c in range(bk):
            j = k0 + c
            if j <= i and (window is None or i - window < j):
                allowed[r, c] = True
    return allowed
# %% ex6
class FlashAttentionFn(torch.autograd.Function):
    """(O, L) = tiled_forward(Q, K, V, slopes); backward recomputes P tile by tile."""

    @staticmethod
    def forward(Q, K, V, slopes, causal, window, block_q, block_k):
        """(O, L) by the tiled forward; no ctx here."""
        return tiled_forward(Q, K, V, slopes, block_q=block_q, block_k=block_k, causal=causal, window=window)

    @staticmethod
    def setup_context(ctx, inputs, output):
        """Save what backward needs (nothing N × N) and the non-tensor arguments."""
        Q, K, V, slopes, causal, window, block_q, block_k = inputs
        O, L = output
        ctx.mark_non_differentiable(L)
        ctx.save_for_backward(Q, K, V, slopes, O, L)
        ctx.causal = causal
        ctx.window = window
        ctx.block_q = block_q
        ctx.block_k = block_k

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_O, grad_L):
        """Gradients of Q, K, V, slopes by the tiled backward; None for the rest."""
        Q, K, V, slopes, O, L = ctx.saved_tensors
        gQ, gK, gV, gS = tiled_backward(
            Q, K, V, O, L, grad_O, slopes,
            block_q=ctx.block_q, block_k=ctx.block_k, causal=ctx.causal, window=ctx.window,
        )
        if not ctx.needs_input_grad[0]:
            gQ = None
        if not ctx.needs_input_grad[1]:
            gK = None
        if not ctx.needs_input_grad[2]:
            gV = None
        if not ctx.needs_input_grad[3]:
            gS = None
        return gQ, gK, gV, gS, None, None, None, None


def flash_attn(Q, K, V, slopes, causal=False, window=None, block_q=16, block_k=16):
    """O = softmax(Q Kᵀ/√d + ALiBi bias [+ mask]) V by FlashAttentionFn (L dropped)."""
    out, lse = FlashAttentionFn.apply(Q, K, V, slopes, causal, window, block_q, block_k)
    return out
