"""helpers.flash_triton: Triton kernels vs SDPA, under TRITON_INTERPRET=1 on a CPU (compiled on a GPU)."""

import os

import torch

if not torch.cuda.is_available():  # must precede the first import of triton
    os.environ["TRITON_INTERPRET"] = "1"

import itertools  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

pytestmark = pytest.mark.triton  # skipped, saying so, where Triton has no wheel (macOS)

import helpers.flash_triton as ft  # noqa: E402
from helpers.checks import compare  # noqa: E402
from helpers.device import randn  # noqa: E402

# Interpreted on CPU tensors; compiled on CUDA tensors when a GPU is present and
# TRITON_INTERPRET is not set.
DEV = "cpu" if ft.INTERPRET else "cuda"
# float32 (fp32 dots, "ieee" on a GPU): same tolerance as the PyTorch tiled version.
ATOL, RTOL = 1e-5, 1e-4
gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or ft.INTERPRET, reason="needs CUDA and compiled (not interpreted) Triton"
)


def _qkv(B, H, Nq, Nk, d, dtype=torch.float32, seed=0, device=DEV):
    return (
        randn(B, H, Nq, d, seed=seed, dtype=dtype, device=device, requires_grad=True),
        randn(B, H, Nk, d, seed=seed + 1, dtype=dtype, device=device, requires_grad=True),
        randn(B, H, Nk, d, seed=seed + 2, dtype=dtype, device=device, requires_grad=True),
    )


def _lse_ref(Q, K, causal, scale=None):
    scale = Q.shape[-1] ** -0.5 if scale is None else scale
    S = (Q.float() @ K.float().transpose(-2, -1)) * scale  # (B, H, Nq, Nk)
    if causal:
        S = S.masked_fill(
            ~torch.ones(Q.shape[2], K.shape[2], dtype=torch.bool, device=Q.device).tril(), -math.inf
        )
    return torch.logsumexp(S, dim=-1)


def _check(Q, K, V, causal, atol=ATOL, rtol=RTOL, scale=None):
    O, L = ft.triton_flash_attention(Q, K, V, causal, scale=scale, return_lse=True)
    grad_O = randn(*O.shape, seed=9, dtype=O.dtype, device=O.device)
    grads = torch.autograd.grad(O, (Q, K, V), grad_O)
    # The reference runs in float32 from the same (possibly rounded) inputs.
    Qr, Kr, Vr = (t.detach().float().requires_grad_() for t in (Q, K, V))
    O_ref = F.scaled_dot_product_attention(Qr, Kr, Vr, is_causal=causal, scale=scale)
    grads_ref = torch.autograd.grad(O_ref, (Qr, Kr, Vr), grad_O.float())
    ok = compare("O", O, O_ref.to(O.dtype), atol=atol, rtol=rtol, quiet=True)
    ok &= compare("L", L, _lse_ref(Q, K, causal, scale), atol=atol, rtol=rtol, quiet=True)
    for g, r in zip(grads, grads_ref):
        ok &= compare("grad", g, r.to(g.dtype), atol=atol, rtol=rtol, quiet=True)
    return ok


# Small shapes with 16×16 tiles (interpreter): ragged N, Nq ≠ Nk, several head dims.
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,H,Nq,Nk,d", [(1, 2, 37, 37, 16), (2, 1, 20, 45, 24), (1, 1, 45, 20, 32)])
def test_triton_forward_backward_match_sdpa(B, H, Nq, Nk, d, causal):
    assert _check(*_qkv(B, H, Nq, Nk, d), causal)


def _gpu_configs() -> dict:
    """Every distinct tile configuration _config picks on a real GPU (sm_75, sm_8x, sm_90; fp16/fp32; d ≤ / > 64)."""
    interpret, ft.INTERPRET = ft.INTERPRET, False  # _config returns 16×16 tiles when interpreting
    try:
        out = {}
        for major, dtype, d in itertools.product((7, 8, 9), (torch.float16, torch.float32), (64, 128)):
            cfg = ft._config(major, d, dtype)
            name = "fwd{}x{} dkdv{}x{} dq{}x{}".format(
                *(cfg[k][b] for k in ("fwd", "dkdv", "dq") for b in ("BLOCK_M", "BLOCK_N"))
            )
            out.setdefault(name, cfg)
        return out
    finally:
        ft.INTERPRET = interpret


GPU_CONFIGS = _gpu_configs()


# The GPU tile sizes (BLOCK_M ≠ BLOCK_N, the causal start `lo` rounded down to BLOCK_M, tiles
# larger than N) run under the interpreter too, on shapes that cross several tiles of each.
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,d", [(77, 77, 64), (50, 150, 32), (150, 50, 40), (1, 130, 16), (130, 1, 16)])
@pytest.mark.parametrize("name", sorted(GPU_CONFIGS))
def test_gpu_tile_configs_under_the_interpreter(monkeypatch, name, Nq, Nk, d, causal):
    monkeypatch.setattr(ft, "_config", lambda major, d, dtype: GPU_CONFIGS[name])
    assert _check(*_qkv(1, 2, Nq, Nk, d), causal)


def test_the_configs_cover_unequal_tiles():
    assert len(GPU_CONFIGS) >= 4
    assert any(c["dkdv"]["BLOCK_M"] != c["dkdv"]["BLOCK_N"] for c in GPU_CONFIGS.values())
    assert any(c["fwd"]["BLOCK_M"] != c["dkdv"]["BLOCK_M"] for c in GPU_CONFIGS.values())


def test_scale_and_non_contiguous_inputs():
    Q, K, V = _qkv(1, 2, 30, 30, 16)
    Qt = randn(1, 30, 2, 16, seed=3, device=DEV, requires_grad=True).transpose(1, 2)  # (B, H, N, d) view
    assert not Qt.is_contiguous()
    assert _check(Qt, K, V, causal=True, scale=0.3)
    assert _check(Q, K, V, causal=False, scale=1.7)


class _Launches:
    """Wraps a Triton kernel and counts its launches (kernel[grid](...))."""

    def __init__(self, kernel):
        self.kernel, self.count = kernel, 0

    def __getitem__(self, grid):
        self.count += 1
        return self.kernel[grid]


@pytest.mark.parametrize("wanted", ["Q", "K", "V", "KV", "QKV"])
def test_only_the_wanted_gradients_are_computed(monkeypatch, wanted):
    dq, dkdv = _Launches(ft._bwd_dq), _Launches(ft._bwd_dk_dv)
    monkeypatch.setattr(ft, "_bwd_dq", dq)
    monkeypatch.setattr(ft, "_bwd_dk_dv", dkdv)
    Q, K, V = (t.detach().requires_grad_(n in wanted) for t, n in zip(_qkv(1, 2, 20, 33, 16), "QKV"))
    grad_O = randn(1, 2, 20, 16, seed=9, device=DEV)
    inputs = [t for t in (Q, K, V) if t.requires_grad]
    ours = torch.autograd.grad(ft.triton_flash_attention(Q, K, V, causal=True), inputs, grad_O)
    ref = torch.autograd.grad(F.scaled_dot_product_attention(Q, K, V, is_causal=True), inputs, grad_O)
    for g, r in zip(ours, ref):
        assert compare("grad", g, r, atol=ATOL, rtol=RTOL, quiet=True)
    assert dq.count == ("Q" in wanted)  # the dQ kernel runs only for Q
    assert dkdv.count == ("K" in wanted or "V" in wanted)  # one kernel makes dK and dV


def test_triton_matches_the_pytorch_tiled_version():
    from helpers.flash import flash_attention

    Q, K, V = _qkv(1, 1, 24, 24, 16)
    O = ft.triton_flash_attention(Q, K, V, causal=True)
    assert compare(
        "O",
        O,
        flash_attention(Q, K, V, causal=True, block_q=16, block_k=16),
        atol=ATOL,
        rtol=RTOL,
        quiet=True,
    )
    assert [tuple(t.shape) for t in O.grad_fn.saved_tensors] == [(1, 1, 24, 16)] * 4 + [(1, 1, 24)]


def test_broken_backward_without_D_is_caught(monkeypatch):
    real = ft.triton_flash_backward
    # dS = P ∘ dP, forgetting − D: D = rowsum(dO ∘ O) is 0 when O is replaced by zeros.
    monkeypatch.setattr(
        ft,
        "triton_flash_backward",
        lambda Q, K, V, O, L, dO, *a, **kw: real(Q, K, V, torch.zeros_like(O), L, dO, *a, **kw),
    )
    assert not _check(*_qkv(1, 1, 20, 20, 16), causal=False)


# Each case gets small (Q, K, V) on the kernels' device (built in the test, not at import).
@pytest.mark.parametrize(
    "call,match",
    [
        (lambda Q, K, V: ft.triton_flash_attention(Q, K[..., :4], V), "Q, K, V: expected"),
        (
            lambda Q, K, V: ft.triton_flash_attention(Q.long(), K.long(), V.long()),
            "Q: expected a floating-point tensor",
        ),
        (
            lambda Q, K, V: ft.triton_flash_attention(Q.double(), K.double(), V.double()),
            r"Q: expected one of \[.*\] .*, got torch.float64",
        ),
        (
            lambda Q, K, V: ft.triton_flash_attention(*(t.to(torch.int32) for t in (Q, K, V))),
            "Q: expected a floating-point tensor, got torch.int32",
        ),
        (
            lambda Q, K, V: ft.triton_flash_attention(*_qkv(1, 1, 4, 4, 200)),
            r"expected head dims d = d_v <= 128",
        ),
        (lambda Q, K, V: ft.triton_flash_attention(Q, K, V[..., :8]), r"expected head dims d = d_v <= 128"),
        (lambda Q, K, V: ft.triton_flash_attention(Q, K[:, :, :0], V[:, :, :0]), "expected at least one key"),
        (
            lambda Q, K, V: ft.triton_flash_attention(Q, K, V, causal=True, align="bottom_right"),
            "align: the Triton kernels compute only 'top_left'",
        ),
        (lambda Q, K, V: ft.triton_flash_attention(Q, K, V, causal="yes"), "causal: expected True or False"),
    ],
)
def test_clear_errors(call, match):
    """What the kernels do not compute in is refused in one line, never silently cast or truncated."""
    with pytest.raises(ValueError, match=match) as e:
        call(*_qkv(1, 1, 4, 4, 16))
    assert "\n" not in str(e.value)


# fp16/bf16: inputs and P, dS are rounded to 8-11 bits before each dot; fp32 accumulation.
GPU_TOL = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (3e-2, 3e-2), torch.float32: (1e-4, 1e-4)}


def _gpu_dtype(dtype):
    if dtype not in ft.supported_dtypes("cuda"):
        pytest.skip(f"{dtype} not supported on this GPU (bf16 needs sm_80+)")
    from helpers.device import no_tf32

    no_tf32()


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N,d", [(256, 64), (1000, 128), (77, 32), (300, 80), (129, 96)])
def test_gpu_dtypes_match_sdpa(dtype, causal, N, d):
    _gpu_dtype(dtype)
    assert _check(*_qkv(2, 3, N, N, d, dtype=dtype, device="cuda"), causal, *GPU_TOL[dtype])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Nq,Nk,d", [(100, 333, 64), (333, 100, 64), (1, 500, 128), (77, 1, 80)])
def test_gpu_nq_ne_nk(dtype, causal, Nq, Nk, d):
    _gpu_dtype(dtype)
    assert _check(*_qkv(2, 3, Nq, Nk, d, dtype=dtype, device="cuda"), causal, *GPU_TOL[dtype])


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gpu_non_contiguous_and_scale(dtype):
    _gpu_dtype(dtype)
    _, K, V = _qkv(2, 3, 200, 200, 64, dtype=dtype, device="cuda")
    Qt = randn(2, 200, 3, 64, seed=3, dtype=dtype, device="cuda", requires_grad=True).transpose(1, 2)
    assert not Qt.is_contiguous()
    assert _check(Qt, K, V, True, *GPU_TOL[dtype], scale=0.05)


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or ft.INTERPRET or torch.cuda.device_count() < 2,
    reason="needs two CUDA GPUs and compiled Triton",
)
def test_gpu_launches_on_the_tensors_device():
    with torch.cuda.device(0):
        assert _check(
            *_qkv(1, 2, 64, 64, 64, dtype=torch.float16, device="cuda:1"), True, *GPU_TOL[torch.float16]
        )


def test_import_without_triton_does_not_fail():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import helpers.flash_triton as ft, torch\nassert not ft.HAS_TRITON\n"
        "try:\n    ft.triton_flash_attention(*[torch.zeros(1, 1, 2, 4)] * 3)\n"
        "except RuntimeError as e:\n    assert 'triton is not installed' in str(e); print('ok')\n"
        "assert ft.kernel_source('_attn_fwd', 'forward loop').startswith('for start_n')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_kernel_source_reads_kernels_and_marked_listings():
    loop = ft.kernel_source("_attn_fwd", "forward loop")
    assert loop.startswith("for start_n in range(0, hi, BLOCK_N):") and loop.rstrip().endswith("m_i = m_new")
    assert [ft.kernel_source(n).count("tl.dot(") for n in ("_attn_fwd", "_bwd_dk_dv", "_bwd_dq")] == [2, 4, 3]
    with pytest.raises(ValueError, match="name: expected a function of helpers.flash_triton, got 'nope'"):
        ft.kernel_source("nope")
    with pytest.raises(ValueError, match="listing: expected one '# <listing: nope>' block in _bwd_dq"):
        ft.kernel_source("_bwd_dq", "nope")
