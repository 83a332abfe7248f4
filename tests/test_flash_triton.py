"""helpers.flash_triton: Triton kernels vs SDPA, under TRITON_INTERPRET=1 on a CPU (compiled on a GPU)."""
import os

import torch

if not torch.cuda.is_available():  # must precede the first import of triton
    os.environ["TRITON_INTERPRET"] = "1"

import math  # noqa: E402

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

pytest.importorskip("triton")
pytest.importorskip("numpy")  # the interpreter runs kernels with numpy

import helpers.flash_triton as ft  # noqa: E402
from helpers.checks import compare  # noqa: E402
from helpers.device import randn  # noqa: E402

# Interpreted on CPU tensors; compiled on CUDA tensors when a GPU is present and
# TRITON_INTERPRET is not set.
DEV = "cpu" if ft.INTERPRET else "cuda"
# float32 (fp32 dots, "ieee" on a GPU): same tolerance as the PyTorch tiled version.
ATOL, RTOL = 1e-5, 1e-4
gpu = pytest.mark.skipif(not torch.cuda.is_available() or ft.INTERPRET,
                         reason="needs CUDA and compiled (not interpreted) Triton")


def _qkv(B, H, Nq, Nk, d, dtype=torch.float32, seed=0, device=DEV):
    return (randn(B, H, Nq, d, seed=seed, dtype=dtype, device=device, requires_grad=True),
            randn(B, H, Nk, d, seed=seed + 1, dtype=dtype, device=device, requires_grad=True),
            randn(B, H, Nk, d, seed=seed + 2, dtype=dtype, device=device, requires_grad=True))


def _lse_ref(Q, K, causal):
    S = (Q.float() @ K.float().transpose(-2, -1)) * Q.shape[-1] ** -0.5    # (B, H, Nq, Nk)
    if causal:
        S = S.masked_fill(~torch.ones(Q.shape[2], K.shape[2], dtype=torch.bool, device=Q.device).tril(), -math.inf)
    return torch.logsumexp(S, dim=-1)


def _check(Q, K, V, causal, atol=ATOL, rtol=RTOL):
    O, L = ft.triton_flash_attention(Q, K, V, causal, return_lse=True)
    grad_O = randn(*O.shape, seed=9, dtype=O.dtype, device=O.device)
    grads = torch.autograd.grad(O, (Q, K, V), grad_O)
    # The reference runs in float32 from the same (possibly rounded) inputs.
    Qr, Kr, Vr = (t.detach().float().requires_grad_() for t in (Q, K, V))
    O_ref = F.scaled_dot_product_attention(Qr, Kr, Vr, is_causal=causal)
    grads_ref = torch.autograd.grad(O_ref, (Qr, Kr, Vr), grad_O.float())
    ok = compare("O", O, O_ref.to(O.dtype), atol=atol, rtol=rtol, quiet=True)
    ok &= compare("L", L, _lse_ref(Q, K, causal), atol=atol, rtol=rtol, quiet=True)
    for g, r in zip(grads, grads_ref):
        ok &= compare("grad", g, r.to(g.dtype), atol=atol, rtol=rtol, quiet=True)
    return ok


# Small shapes with 16×16 tiles (interpreter): ragged N, Nq ≠ Nk, several head dims.
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,H,Nq,Nk,d", [(1, 2, 37, 37, 16), (2, 1, 20, 45, 24), (1, 1, 45, 20, 32)])
def test_triton_forward_backward_match_sdpa(B, H, Nq, Nk, d, causal):
    assert _check(*_qkv(B, H, Nq, Nk, d), causal)


def test_triton_matches_the_pytorch_tiled_version():
    from helpers.flash import flash_attention
    Q, K, V = _qkv(1, 1, 24, 24, 16)
    O = ft.triton_flash_attention(Q, K, V, causal=True)
    assert compare("O", O, flash_attention(Q, K, V, causal=True, block_q=16, block_k=16), atol=ATOL, rtol=RTOL, quiet=True)
    assert [tuple(t.shape) for t in O.grad_fn.saved_tensors] == [(1, 1, 24, 16)] * 4 + [(1, 1, 24)]


def test_broken_backward_without_D_is_caught(monkeypatch):
    real = ft.triton_flash_backward
    # dS = P ∘ dP, forgetting − D: D = rowsum(dO ∘ O) is 0 when O is replaced by zeros.
    monkeypatch.setattr(ft, "triton_flash_backward",
                        lambda Q, K, V, O, L, dO, *a: real(Q, K, V, torch.zeros_like(O), L, dO, *a))
    assert not _check(*_qkv(1, 1, 20, 20, 16), causal=False)


def test_clear_errors():
    Q, K, V = _qkv(1, 1, 4, 4, 8)
    with pytest.raises(ValueError, match="K: expected shape"):
        ft.triton_flash_attention(Q, K[..., :4], V)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N,d", [(256, 64), (1000, 128), (77, 32)])
def test_gpu_dtypes_match_sdpa(dtype, causal, N, d):
    if dtype not in ft.supported_dtypes("cuda"):
        pytest.skip(f"{dtype} not supported on this GPU (bf16 needs sm_80+)")
    from helpers.device import no_tf32
    no_tf32()
    # fp16/bf16: inputs and P, dS are rounded to 8-11 bits before each dot; fp32 accumulation.
    tol = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (3e-2, 3e-2), torch.float32: (1e-4, 1e-4)}[dtype]
    assert _check(*_qkv(2, 3, N, N, d, dtype=dtype, device="cuda"), causal, *tol)


def test_import_without_triton_does_not_fail():
    import subprocess
    import sys
    code = ("import sys; sys.modules['triton'] = None\n"
            "import helpers.flash_triton as ft, torch\nassert not ft.HAS_TRITON\n"
            "try:\n    ft.triton_flash_attention(*[torch.zeros(1, 1, 2, 4)] * 3)\n"
            "except RuntimeError as e:\n    assert 'triton is not installed' in str(e); print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.stdout.strip() == "ok", out.stderr
