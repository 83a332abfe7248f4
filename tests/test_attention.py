"""helpers.attention: the hand-written attention backward against autograd, SDPA and nn.MultiheadAttention."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import gradcheck

import helpers.attention as attn_mod
from helpers.attention import (
    Attention,
    MultiHeadSelfAttention,
    attention,
    attention_backward,
    attention_forward,
    attention_saved_bytes_formula,
    causal_mask,
    masked_softmax,
    merge_heads,
    mha_backward,
    mha_forward,
    mha_params,
    split_heads,
)
from helpers.device import randn
from helpers.memory import SavedTensors

F64 = torch.float64
# float32 vs PyTorch: atol 1e-5 = 84 ulps at 1.0, rtol 1e-4 = 840 ulps; the two sides sum in a different order
# (SDPA's CPU kernel is blocked with an online softmax), so bit equality is not expected.
ATOL32, RTOL32 = 1e-5, 1e-4


def qkv(B=2, H=3, Nq=5, Nk=5, d=4, dtype=F64, seed=0):
    Q = randn(B, H, Nq, d, seed=seed, dtype=dtype, requires_grad=True)
    K = randn(B, H, Nk, d, seed=seed + 1, dtype=dtype, requires_grad=True)
    V = randn(B, H, Nk, d, seed=seed + 2, dtype=dtype, requires_grad=True)
    return Q, K, V


def padding(B, Nk, pads):
    """(B, Nk) bool, True = padding: the last pads[b] keys of sequence b."""
    kpm = torch.zeros(B, Nk, dtype=torch.bool)
    for b, p in enumerate(pads):
        if p:
            kpm[b, Nk - p :] = True
    return kpm


def sdpa_mask(Nq, Nk, causal, kpm, align="top_left"):
    """The same keep-mask for F.scaled_dot_product_attention (True = attend), built independently."""
    keep = torch.ones(1, 1, Nq, Nk, dtype=torch.bool)
    if causal:  # bottom-right: query i is position i + Nk - Nq of the key sequence; top-left: i
        i = torch.arange(Nq)[:, None] + (Nk - Nq if align == "bottom_right" else 0)
        keep = keep & (torch.arange(Nk)[None, :] <= i)
    if kpm is not None:
        keep = keep & ~kpm[:, None, None, :]
    return keep


# ---------------------------------------------------------------- softmax


def test_masked_softmax_matches_torch_and_gives_zero_rows():
    S = randn(4, 7, seed=3, dtype=F64)
    assert torch.allclose(masked_softmax(S), torch.softmax(S, -1), atol=1e-15)
    mask = torch.ones(4, 7, dtype=torch.bool)
    mask[1] = False
    mask[2, 3:] = False
    P = masked_softmax(S, mask)
    assert torch.equal(P[1], torch.zeros(7, dtype=F64))
    assert torch.equal(P[2, 3:], torch.zeros(4, dtype=F64))
    assert torch.allclose(P[2, :3], torch.softmax(S[2, :3], -1), atol=1e-15)
    assert not torch.isnan(P).any()


# ---------------------------------------------------------------- gradcheck (float64)


@pytest.mark.parametrize(
    "Nq,Nk,causal,pads,align",
    [
        (5, 5, False, None, "top_left"),  # no mask
        (5, 5, True, None, "top_left"),  # causal, square
        (3, 6, True, None, "top_left"),  # causal, fewer queries than keys
        (3, 6, True, None, "bottom_right"),  # the KV-cache alignment
        (6, 4, True, None, "bottom_right"),  # more queries than keys: two rows see nothing
        (6, 4, True, None, "top_left"),  # ... but every row sees key 0 top-left
        (5, 5, False, (0, 2), "top_left"),  # key padding
        (4, 6, True, (1, 6), "bottom_right"),  # both, and a fully padded sequence
    ],
)
def test_gradcheck_attention(Nq, Nk, causal, pads, align):
    Q, K, V = qkv(H=2, Nq=Nq, Nk=Nk, d=3)
    kpm = None if pads is None else padding(2, Nk, pads)
    assert gradcheck(
        lambda q, k, v: attention(q, k, v, causal=causal, key_padding_mask=kpm, align=align), (Q, K, V)
    )


def test_gradcheck_explicit_scale_and_dv_not_equal_d():
    Q, K, _ = qkv(Nq=4, Nk=3, d=3)
    V = randn(2, 3, 3, 5, seed=9, dtype=F64, requires_grad=True)
    assert gradcheck(lambda q, k, v: Attention.apply(q, k, v, None, 0.7)[0], (Q, K, V))


def test_needs_input_grad_is_respected():
    Q, K, V = qkv()
    K.requires_grad_(False)
    attention(Q, K, V).sum().backward()
    assert K.grad is None and Q.grad is not None and V.grad is not None
    gQ, gK, gV = attention_backward(
        Q, K, V, torch.softmax(Q @ K.mT / 2, -1), torch.ones_like(Q), 0.5, needs=(False, False, True)
    )
    assert gQ is None and gK is None and gV is not None


# ---------------------------------------------------------------- vs PyTorch (float32)


@pytest.mark.parametrize(
    "Nq,Nk,causal,pads,align",
    [
        (6, 6, False, None, "top_left"),
        (6, 6, True, None, "top_left"),
        (3, 7, True, None, "top_left"),
        (3, 7, True, None, "bottom_right"),
        (7, 3, True, None, "top_left"),
        (5, 5, True, (0, 2), "bottom_right"),
        (4, 6, False, (3, 0), "top_left"),
    ],
)
def test_forward_and_grads_match_sdpa_float32(Nq, Nk, causal, pads, align):
    Q, K, V = qkv(Nq=Nq, Nk=Nk, d=8, dtype=torch.float32, seed=5)
    Q2, K2, V2 = (t.detach().clone().requires_grad_() for t in (Q, K, V))
    kpm = None if pads is None else padding(2, Nk, pads)
    G = randn(2, 3, Nq, 8, seed=11)
    O = attention(Q, K, V, causal=causal, key_padding_mask=kpm, align=align)
    O.backward(G)
    mask = sdpa_mask(Nq, Nk, causal, kpm, align) if (causal or kpm is not None) else None
    O_ref = F.scaled_dot_product_attention(Q2, K2, V2, attn_mask=mask)
    O_ref.backward(G)
    assert torch.allclose(O, O_ref, atol=ATOL32, rtol=RTOL32)
    for ours, ref in ((Q.grad, Q2.grad), (K.grad, K2.grad), (V.grad, V2.grad)):
        assert torch.allclose(ours, ref, atol=ATOL32, rtol=RTOL32)


def test_causal_means_sdpa_is_causal_and_bottom_right_is_named():
    assert torch.equal(
        causal_mask(3, 5), torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]).bool()
    )
    assert torch.equal(
        causal_mask(3, 5, "bottom_right"),
        torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).bool(),
    )
    assert torch.equal(causal_mask(4, 4), causal_mask(4, 4, "bottom_right"))
    assert torch.equal(causal_mask(4, 4), torch.ones(4, 4, dtype=torch.bool).tril())
    # a tile is the same block of the whole mask, for both alignments
    for align in ("top_left", "bottom_right"):
        assert torch.equal(causal_mask(7, 9, align, tile=(2, 3, 4, 5)), causal_mask(7, 9, align)[2:6, 3:8])
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    Q, K, V = qkv(Nq=3, Nk=6, dtype=torch.float32)
    ours = attention(Q, K, V, causal=True)
    assert torch.allclose(
        ours, F.scaled_dot_product_attention(Q, K, V, is_causal=True), atol=ATOL32, rtol=RTOL32
    )
    assert torch.allclose(
        ours,
        F.scaled_dot_product_attention(Q, K, V, attn_mask=causal_upper_left(3, 6)),
        atol=ATOL32,
        rtol=RTOL32,
    )
    ours = attention(Q, K, V, causal=True, align="bottom_right")
    assert not torch.allclose(ours, F.scaled_dot_product_attention(Q, K, V, is_causal=True), atol=1e-3)
    ref = F.scaled_dot_product_attention(Q, K, V, attn_mask=causal_lower_right(3, 6))
    assert torch.allclose(ours, ref, atol=ATOL32, rtol=RTOL32)


def test_fully_masked_rows_give_zeros_not_nan():
    Q, K, V = qkv(Nq=6, Nk=4)
    kpm = padding(2, 4, (0, 4))
    O = attention(Q, K, V, causal=True, key_padding_mask=kpm, align="bottom_right")
    O.sum().backward()
    assert not torch.isnan(O).any() and not torch.isnan(Q.grad).any()
    assert torch.equal(O[0, :, :2], torch.zeros_like(O[0, :, :2]))  # rows 0, 1 see no key (6 > 4)
    assert torch.equal(O[1], torch.zeros_like(O[1]))  # every key padded
    assert torch.equal(Q.grad[1], torch.zeros_like(Q.grad[1]))


def test_padded_key_gets_exactly_zero_gradient():
    Q, K, V = qkv(Nq=5, Nk=5, dtype=torch.float32)
    kpm = padding(2, 5, (2, 0))
    O, P = Attention.apply(Q, K, V, ~kpm[:, None, None, :], None)
    (O * randn(*O.shape, seed=4)).sum().backward()
    assert torch.count_nonzero(P[0, :, :, 3:]) == 0  # the padded columns
    assert torch.count_nonzero(K.grad[0, :, 3:]) == 0 and torch.count_nonzero(V.grad[0, :, 3:]) == 0
    assert torch.count_nonzero(Q.grad[0, :, 3:]) > 0  # padded *queries* still get grads
    assert torch.count_nonzero(P[0, :, 3:, :]) > 0  # ...their rows are not zero


# ---------------------------------------------------------------- deliberately wrong backwards fail


class SeedAttention(torch.autograd.Function):
    """Seed 000's SimpleAttention: no 1/√d, and a softmax backward that keeps only diag p(1 − p)."""

    @staticmethod
    def forward(q, k, v):
        P = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return P @ v

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v = inputs
        ctx.save_for_backward(q, k, v)

    @staticmethod
    def backward(ctx, grad_output):
        q, k, v = ctx.saved_tensors
        P = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        grad_v = P.transpose(-2, -1) @ grad_output
        grad_P = grad_output @ v.transpose(-2, -1)
        grad_S = grad_P * (P - P**2)  # the seed's diagonal-only softmax derivative
        return grad_S @ k, grad_S.transpose(-2, -1) @ q, grad_v


def test_seed_diagonal_only_softmax_backward_fails_gradcheck():
    Q, K, V = qkv(B=1, H=1, Nq=4, Nk=4, d=3)
    assert not gradcheck(SeedAttention.apply, (Q, K, V), raise_exception=False)
    # grad_V does not involve the softmax backward, so it alone is right: only Q and K are off.
    q, k, v = (t.detach().requires_grad_() for t in (Q, K, V))
    SeedAttention.apply(q, k, v).sum().backward()
    q2, k2, v2 = (t.detach().requires_grad_() for t in (Q, K, V))
    (torch.softmax(q2 @ k2.mT, -1) @ v2).sum().backward()
    assert torch.allclose(v.grad, v2.grad) and not torch.allclose(k.grad, k2.grad)


def test_broken_backward_missing_scale_fails_gradcheck(monkeypatch):
    def no_scale(Q, K, V, P, grad_O, scale, needs=(True, True, True)):
        return attention_backward(Q, K, V, P, grad_O, 1.0, needs)

    monkeypatch.setattr(attn_mod, "attention_backward", no_scale)
    Q, K, V = qkv()
    assert not gradcheck(lambda q, k, v: attention(q, k, v), (Q, K, V), raise_exception=False)


def test_broken_softmax_backward_fails_gradcheck(monkeypatch):
    monkeypatch.setattr(attn_mod, "softmax_backward", lambda P, g: P * (1 - P) * g)
    Q, K, V = qkv()
    assert not gradcheck(lambda q, k, v: attention(q, k, v), (Q, K, V), raise_exception=False)


# ---------------------------------------------------------------- heads and nn.MultiheadAttention


def test_split_merge_heads_roundtrip_and_layout():
    x = torch.arange(2 * 3 * 8, dtype=F64).reshape(2, 3, 8)
    h = split_heads(x, 4)
    assert h.shape == (2, 4, 3, 2)
    assert torch.equal(h[1, 2, 0], x[1, 0, 4:6])  # head 2 owns columns 4, 5
    assert torch.equal(merge_heads(h), x)


def _mha_pair(E, H, dtype, seed=0):
    torch.manual_seed(seed)
    ref = torch.nn.MultiheadAttention(E, H, dropout=0.0, batch_first=True, dtype=dtype)
    with torch.no_grad():  # non-zero biases so their gradients are exercised
        ref.in_proj_bias.copy_(randn(3 * E, seed=seed + 7, dtype=dtype) * 0.1)
        ref.out_proj.bias.copy_(randn(E, seed=seed + 8, dtype=dtype) * 0.1)
    return ref, MultiHeadSelfAttention.from_module(ref)


@pytest.mark.parametrize("dtype,atol,rtol", [(F64, 1e-10, 1e-8), (torch.float32, ATOL32, RTOL32)])
@pytest.mark.parametrize("causal,pads", [(False, None), (True, None), (False, (0, 3)), (True, (2, 1))])
def test_mha_forward_and_manual_backward_match_nn_multiheadattention(dtype, atol, rtol, causal, pads):
    B, N, E, H = 2, 6, 8, 2
    ref, ours = _mha_pair(E, H, dtype)
    X = randn(B, N, E, seed=3, dtype=dtype, requires_grad=True)
    G = randn(B, N, E, seed=4, dtype=dtype)
    kpm = None if pads is None else padding(B, N, pads)
    attn_mask = ~causal_mask(N, N) if causal else None  # nn.MultiheadAttention: True = blocked
    Y_ref, _ = ref(X, X, X, key_padding_mask=kpm, attn_mask=attn_mask, need_weights=False)
    Y_ref.backward(G)
    Y = ours.forward(X.detach(), causal=causal, key_padding_mask=kpm)
    assert torch.allclose(Y, Y_ref, atol=atol, rtol=rtol)
    grads = ours.backward(G)
    assert torch.allclose(grads["X"], X.grad, atol=atol, rtol=rtol)
    for name, p in ref.named_parameters():
        assert torch.allclose(grads[name], p.grad, atol=atol, rtol=rtol), name


def test_mha_functional_api_and_no_autograd_used():
    params = mha_params(8, seed=1, dtype=F64)
    X = randn(1, 4, 8, seed=2, dtype=F64)
    with torch.no_grad():
        Y, cache = mha_forward(X, params, 2)
        grads = mha_backward(torch.ones_like(Y), cache)
    P = {k: v.clone().requires_grad_() for k, v in params.items()}
    Xr = X.clone().requires_grad_()
    mha_forward(Xr, P, 2)[0].sum().backward()
    assert torch.allclose(grads["X"], Xr.grad, atol=1e-12)
    for k in params:
        assert torch.allclose(grads[k], P[k].grad, atol=1e-12), k


def test_mha_padded_token_embedding_gets_zero_grad_from_other_tokens_loss():
    _, ours = _mha_pair(8, 2, F64)
    kpm = padding(1, 5, (2,))
    X = randn(1, 5, 8, seed=3, dtype=F64)
    ours.forward(X, key_padding_mask=kpm)
    G = torch.zeros(1, 5, 8, dtype=F64)
    G[0, 0] = 1.0  # the loss reads token 0 only
    g = ours.backward(G)
    assert torch.count_nonzero(g["X"][0, 3:]) == 0 and torch.count_nonzero(g["X"][0, :3]) > 0


# ---------------------------------------------------------------- memory


def test_saved_bytes_equal_formula_for_the_function_and_for_naive_attention():
    B, H, N, d = 2, 3, 16, 4
    Q, K, V = qkv(B, H, N, N, d, dtype=torch.float32)
    with SavedTensors(exclude=[Q, K, V]) as saved:
        attention(Q, K, V)
    assert saved.count == 1 and saved.total_bytes == attention_saved_bytes_formula(B, H, N, 4)
    with SavedTensors(exclude=[Q, K, V]) as naive:
        torch.softmax(Q @ K.mT / math.sqrt(d), -1) @ V
    assert naive.total_bytes == attention_saved_bytes_formula(B, H, N, 4)
    assert attention_saved_bytes_formula(16, 12, 512, 4) == 201_326_592


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call",
    [
        lambda: attention(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4), torch.zeros(2, 3, 4)),  # 3-D
        lambda: attention(
            torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 3, 5), torch.zeros(1, 1, 3, 5)
        ),  # d differs
        lambda: attention(
            torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 2, 4)
        ),  # Nk differs
        lambda: attention(*qkv(Nk=5), key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)),
        lambda: attention(*qkv(Nk=5), key_padding_mask=torch.zeros(2, 5)),  # not bool
        lambda: attention_forward(*qkv(), mask=torch.ones(3, 3, dtype=torch.bool)),
        lambda: attention(torch.zeros(1, 1, 2, 4, dtype=torch.long), *qkv(1, 1, 2, 2)[1:]),
        lambda: split_heads(torch.zeros(2, 3, 8), 3),
        lambda: merge_heads(torch.zeros(2, 3, 8)),
        lambda: causal_mask(0, 3),
        lambda: causal_mask(3, 3.0),
        lambda: causal_mask(3, 3, "diagonal"),
        lambda: attention(*qkv(), causal="yes"),
        lambda: attention(*qkv(), causal=True, align="bottom-right"),
        lambda: attention(*qkv(Nk=0)),  # no keys
        lambda: attention(qkv()[0], qkv()[1].float(), qkv()[2]),  # mixed dtypes
        lambda: attention(qkv()[0], qkv()[1].to("meta"), qkv()[2]),  # mixed devices
        lambda: attention_saved_bytes_formula(16, 12, 512, 0),
        lambda: MultiHeadSelfAttention(8, 3),
        lambda: mha_forward(torch.zeros(2, 3, 8), {}, 2),
        lambda: MultiHeadSelfAttention(8, 2).backward(torch.zeros(1, 2, 8)),
    ],
)
def test_bad_input_raises_one_line_value_error(call):
    with pytest.raises(ValueError) as e:
        call()
    assert "\n" not in str(e.value)
