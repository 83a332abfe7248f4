"""helpers.flash: online softmax, tiled forward/backward vs SDPA, gradcheck, memory linear in N."""

import math
import os

import pytest
import torch
import torch.nn.functional as F

import helpers.flash as flash
from helpers.checks import compare
from helpers.device import randn
from helpers.flash import (
    attention_flops,
    flash_attention,
    flash_backward,
    flash_forward,
    naive_attention,
    online_softmax,
    online_softmax_trace,
    saved_bytes,
)

# float32 tolerances: a tiled sum in a different order than SDPA's, O(1) values and
# N ≤ 100 terms per row: 1e-5 absolute (84 ulps at 1.0) and 1e-4 relative (840 ulps) is plenty.
ATOL, RTOL = 1e-5, 1e-4
CASES = [  # (B, H, Nq, Nk, d, block_q, block_k): ragged N, Nq ≠ Nk, several head dims
    (2, 3, 37, 37, 16, 16, 16),
    (1, 2, 64, 64, 32, 16, 32),
    (1, 2, 50, 50, 64, 32, 16),
    (2, 1, 20, 45, 8, 8, 16),
    (2, 1, 45, 20, 8, 16, 8),
]


def _qkv(B, H, Nq, Nk, d, dtype=torch.float32, seed=0):
    Q = randn(B, H, Nq, d, seed=seed, dtype=dtype, requires_grad=True)
    K = randn(B, H, Nk, d, seed=seed + 1, dtype=dtype, requires_grad=True)
    V = randn(B, H, Nk, d, seed=seed + 2, dtype=dtype, requires_grad=True)
    return Q, K, V


def _lse_ref(Q, K, causal):
    S = (Q @ K.transpose(-2, -1)) * Q.shape[-1] ** -0.5  # (B, H, Nq, Nk)
    if causal:  # SDPA's is_causal: top-left aligned
        S = S.masked_fill(~torch.ones(Q.shape[2], K.shape[2], dtype=torch.bool).tril(), -math.inf)
    return torch.logsumexp(S, dim=-1)


def test_online_softmax_equals_softmax_for_any_block():
    x = randn(3, 5, 23, seed=4) * 10
    for block in (1, 4, 7, 23, 64):
        assert compare(
            f"block {block}", online_softmax(x, block), torch.softmax(x, -1), atol=1e-7, rtol=1e-6, quiet=True
        )


def test_online_softmax_trace_ends_at_max_and_normaliser():
    x = randn(10, seed=5) * 3
    steps = online_softmax_trace(x, block=3)
    assert len(steps) == 4 and steps[0]["rescale"] == 0.0
    assert steps[-1]["m"] == pytest.approx(x.max().item())
    assert steps[-1]["ell"] == pytest.approx(torch.exp(x.double() - x.max()).sum().item(), rel=1e-12)
    assert all(s["m"] >= s["m_old"] for s in steps)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", CASES)
def test_tiled_forward_and_backward_match_sdpa(case, causal):
    B, H, Nq, Nk, d, bq, bk = case
    Q, K, V = _qkv(B, H, Nq, Nk, d)
    O, L = flash_attention(Q, K, V, causal, block_q=bq, block_k=bk, return_lse=True)
    O_ref = F.scaled_dot_product_attention(Q, K, V, is_causal=causal)
    grad_O = randn(*O.shape, seed=9)
    grads = torch.autograd.grad(O, (Q, K, V), grad_O)
    grads_ref = torch.autograd.grad(O_ref, (Q, K, V), grad_O)
    assert compare("O", O, O_ref, atol=ATOL, rtol=RTOL, quiet=True)
    assert compare("L", L, _lse_ref(Q, K, causal), atol=ATOL, rtol=RTOL, quiet=True)
    for name, g, r in zip(("grad_Q", "grad_K", "grad_V"), grads, grads_ref):
        assert compare(name, g, r, atol=ATOL, rtol=RTOL, quiet=True), name


def test_naive_matches_sdpa_and_tiled_backward_is_a_plain_function():
    Q, K, V = _qkv(1, 2, 33, 33, 16)
    for causal in (False, True):
        O, L = naive_attention(Q, K, V, causal, return_lse=True)
        assert compare(
            "O",
            O,
            F.scaled_dot_product_attention(Q, K, V, is_causal=causal),
            atol=ATOL,
            rtol=RTOL,
            quiet=True,
        )
        grad_O = randn(*O.shape, seed=3)
        ref = torch.autograd.grad(O, (Q, K, V), grad_O)
        with torch.no_grad():
            O2, L2 = flash_forward(Q, K, V, causal, 8, 8)
            ours = flash_backward(Q, K, V, O2, L2, grad_O, causal, 8, 8)
        for g, r in zip(ours, ref):
            assert compare("grad", g, r, atol=ATOL, rtol=RTOL, quiet=True)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_float64(causal):
    Q, K, V = _qkv(1, 2, 7, 7, 4, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, causal, block_q=3, block_k=2), (Q, K, V)
    )
    Q, K, V = _qkv(1, 1, 5, 9, 3, dtype=torch.float64, seed=7)  # Nq ≠ Nk
    assert torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, causal, block_q=2, block_k=4), (Q, K, V)
    )


def test_saves_only_q_k_v_o_l_and_gates_gradients():
    Q, K, V = _qkv(1, 2, 20, 20, 8)
    O = flash_attention(Q, K, V, block_q=8, block_k=8)
    assert [tuple(t.shape) for t in O.grad_fn.saved_tensors] == [(1, 2, 20, 8)] * 4 + [(1, 2, 20)]
    K2 = K.detach()
    (grad_Q,) = torch.autograd.grad(flash_attention(Q, K2, V).sum(), (Q,))
    assert K2.grad is None and grad_Q.shape == Q.shape


@pytest.mark.parametrize("wanted", ["Q", "K", "V", "KV", "QV"])
@pytest.mark.parametrize("causal", [False, True])
def test_only_some_inputs_need_grad(wanted, causal):
    Q, K, V = (t.detach().requires_grad_(n in wanted) for t, n in zip(_qkv(1, 2, 21, 30, 8), "QKV"))
    grad_O = randn(1, 2, 21, 8, seed=9)
    inputs = [t for t in (Q, K, V) if t.requires_grad]
    ours = torch.autograd.grad(flash_attention(Q, K, V, causal, block_q=8, block_k=8), inputs, grad_O)
    ref = torch.autograd.grad(F.scaled_dot_product_attention(Q, K, V, is_causal=causal), inputs, grad_O)
    for g, r in zip(ours, ref):
        assert compare("grad", g, r, atol=ATOL, rtol=RTOL, quiet=True)


def test_flash_backward_skips_unwanted_gradients():
    Q, K, V = (t.detach() for t in _qkv(1, 1, 12, 12, 4))
    O, L = flash_forward(Q, K, V, block_q=4, block_k=4)
    grad_O = randn(1, 1, 12, 4, seed=3)
    full = flash_backward(Q, K, V, O, L, grad_O, False, 4, 4)
    for needs in [(True, False, False), (False, True, False), (False, False, True), (False, False, False)]:
        got = flash_backward(Q, K, V, O, L, grad_O, False, 4, 4, needs=needs)
        for g, f, n in zip(got, full, needs):
            assert (g is None) != n and (g is None or torch.equal(g, f))  # same bits as the full backward


def test_saved_bytes_tiled_linear_naive_quadratic():
    Ns = [64, 128, 256]
    tiled = [saved_bytes(flash_attention, 1, 1, N, 8) for N in Ns]
    naive = [saved_bytes(naive_attention, 1, 1, N, 8) for N in Ns]
    assert tiled == [N * (8 + 1) * 4 for N in Ns]  # O (N·d) and L (N) in float32: exactly linear
    assert [b / a for a, b in zip(naive, naive[1:])] == [4.0, 4.0]  # P is N × N
    assert saved_bytes(flash_attention, 1, 1, 128, 8, causal=True) == tiled[1]


_Q, _K, _V = _qkv(1, 1, 4, 4, 8)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: flash_attention(_Q[0], _K[0], _V[0]), r"Q: expected a \(B, H, N, d\) tensor"),
        (lambda: flash_attention(_Q, _K[..., :4], _V), "Q, K, V: expected"),
        (
            lambda: flash_attention(_Q, _K[:, :, :0], _V[:, :, :0]),
            "K, V: expected at least one key, got Nk = 0",
        ),
        (lambda: flash_attention(_Q, _K.double(), _V), "K: expected torch.float32 on cpu like Q"),
        (
            lambda: flash_attention(_Q, _K.to("meta"), _V),
            "K: expected torch.float32 on cpu like Q, got .* on meta",
        ),
        (lambda: flash_attention(_Q.long(), _K.long(), _V.long()), "Q: expected a floating-point tensor"),
        (lambda: flash_attention(_Q, _K, _V, block_q=2.5), r"block_q: expected an int ≥ 1, got 2.5"),
        (lambda: flash_attention(_Q, _K, _V, block_k=0), r"block_k: expected an int ≥ 1, got 0"),
        (lambda: flash_attention(_Q, _K, _V, causal="yes"), "causal: expected True or False, got 'yes'"),
        (lambda: flash_attention(_Q, _K, _V, True, align="lower_right"), "align: expected one of"),
        (lambda: naive_attention(_Q, _K, _V, causal=1), "causal: expected True or False, got 1"),
        (lambda: flash_backward(_Q, _K, _V, _Q, _Q[..., 0], _Q, block_q=-1), r"block_q: expected an int ≥ 1"),
    ],
)
def test_bad_input_raises_one_line_value_error(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- one meaning of `causal`


def _apis():
    """Every attention API of the course that takes Q, K, V with Nq ≠ Nk and a `causal` flag."""
    from helpers.attention import attention

    apis = {
        "attention.attention": attention,
        "flash.naive_attention": naive_attention,
        "flash.flash_attention": lambda *a, **k: flash_attention(*a, block_q=4, block_k=3, **k),
    }
    # Only where the kernels run on CPU tensors: importing Triton without TRITON_INTERPRET=1 would
    # fix it in compiled mode for the rest of the session (tests/test_flash_triton.py sets it).
    if os.environ.get("TRITON_INTERPRET") == "1":
        import helpers.flash_triton as ft

        if ft.HAS_TRITON and ft.INTERPRET:
            apis["flash_triton.triton_flash_attention"] = ft.triton_flash_attention
    return apis


@pytest.mark.parametrize("api", sorted(_apis()))
@pytest.mark.parametrize("Nq,Nk", [(1, 9), (5, 11), (11, 5), (7, 7)])
@pytest.mark.parametrize("causal", [False, True])
def test_every_attention_api_agrees_with_sdpa_for_the_same_causal(api, Nq, Nk, causal):
    """causal=True means SDPA's is_causal (top-left) in every API, decode steps (Nq = 1) included."""
    fn = _apis()[api]
    Q, K, V = _qkv(1, 2, Nq, Nk, 16, seed=3)
    grad_O = randn(1, 2, Nq, 16, seed=4)
    ours = fn(Q, K, V, causal=causal)
    ref = F.scaled_dot_product_attention(Q, K, V, is_causal=causal)
    assert compare("O", ours, ref, atol=ATOL, rtol=RTOL, quiet=True)
    for g, r in zip(
        torch.autograd.grad(ours, (Q, K, V), grad_O), torch.autograd.grad(ref, (Q, K, V), grad_O)
    ):
        assert compare("grad", g, r, atol=ATOL, rtol=RTOL, quiet=True)


@pytest.mark.parametrize("api", ["attention.attention", "flash.naive_attention", "flash.flash_attention"])
@pytest.mark.parametrize("Nq,Nk", [(1, 9), (5, 11), (11, 5), (7, 7)])
def test_bottom_right_is_the_named_alternative_and_matches_sdpa_lower_right(api, Nq, Nk):
    """align='bottom_right' = torch.nn.attention.bias.causal_lower_right; rows that see no key give 0, not NaN."""
    from torch.nn.attention.bias import causal_lower_right

    fn = _apis()[api]
    Q, K, V = _qkv(1, 2, Nq, Nk, 16, seed=5)
    grad_O = randn(1, 2, Nq, 16, seed=6)
    ours = fn(Q, K, V, causal=True, align="bottom_right")
    ref = F.scaled_dot_product_attention(Q, K, V, attn_mask=causal_lower_right(Nq, Nk))
    ref = ref.nan_to_num(
        0.0
    )  # SDPA's lower-right bias gives NaN rows where no key is visible (its bool mask: 0)
    assert compare("O", ours, ref, atol=ATOL, rtol=RTOL, quiet=True)
    assert not ours.isnan().any()
    for g, r in zip(
        torch.autograd.grad(ours, (Q, K, V), grad_O), torch.autograd.grad(ref, (Q, K, V), grad_O)
    ):
        assert compare("grad", g, r.nan_to_num(0.0), atol=ATOL, rtol=RTOL, quiet=True)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
def test_gradcheck_float64_both_alignments_nq_ne_nk(align):
    for Nq, Nk in ((3, 7), (7, 3)):
        Q, K, V = _qkv(1, 2, Nq, Nk, 4, dtype=torch.float64, seed=7)
        assert torch.autograd.gradcheck(
            lambda q, k, v: flash_attention(q, k, v, True, block_q=2, block_k=3, align=align), (Q, K, V)
        )


def test_flash_accepts_d_v_other_than_d():
    Q, K, _ = _qkv(1, 2, 6, 9, 8, seed=8)
    V = randn(1, 2, 9, 5, seed=9, requires_grad=True)
    ours = flash_attention(Q, K, V, True, block_q=4, block_k=4)
    assert compare("O", ours, F.scaled_dot_product_attention(Q, K, V, is_causal=True), atol=ATOL, rtol=RTOL)


def test_flops_formula():
    assert attention_flops(1, 1, 2, 3) == 4 * 4 * 3
    assert attention_flops(1, 1, 2, 3, causal=True, backward=True) == 4 * 4 * 3 * 3.5 / 2


def _broken_no_D(Q, K, V, O, L, grad_O, *args, **kw):
    """dS = P ∘ dP, forgetting − D: D = rowsum(dO ∘ O) is 0 when O is replaced by zeros."""
    return flash_backward(Q, K, V, torch.zeros_like(O), L, grad_O, *args, **kw)


def _broken_unnormalised(Q, K, V, O, L, grad_O, *args, **kw):
    """P = exp(S − m) instead of exp(S − L): skips dividing by ℓ (approximated by shifting L)."""
    return flash_backward(Q, K, V, O, L - 1.0, grad_O, *args, **kw)


@pytest.mark.parametrize("broken", [_broken_no_D, _broken_unnormalised])
def test_a_broken_backward_is_caught(monkeypatch, broken):
    monkeypatch.setattr(flash, "flash_backward", broken)
    Q, K, V = _qkv(1, 2, 7, 7, 4, dtype=torch.float64)
    assert not torch.autograd.gradcheck(
        lambda q, k, v: flash_attention(q, k, v, block_q=3, block_k=2), (Q, K, V), raise_exception=False
    )
