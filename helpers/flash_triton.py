"""Flash attention as Triton kernels (chapter 10): the same math as ``helpers.flash``, one tile per program.

Forward: one program per (query block, batch·head) keeps a running max ``m``, normaliser
``ℓ`` and accumulator in registers while it walks over key/value blocks; it writes ``O``
and the row log-sum-exp ``L`` (natural log, like ``helpers.flash``).  Inside the kernel we
work in base 2 (``exp2``, with ``scale·log2 e`` folded into the scores), which is what GPUs
compute natively.

Backward (FlashAttention-2 style, three launches, no atomics):

1. ``_bwd_preprocess``: ``D = rowsum(dO ∘ O)`` per query row;
2. ``_bwd_dk_dv``: one program per *key* block walks over query blocks, recomputes
   ``S`` and ``P = exp(S − L)``, and ``dP = dO Vᵀ``, and accumulates ``dV = Pᵀ dO`` and
   ``dK = dSᵀ Q · scale`` in registers;
3. ``_bwd_dq``: one program per *query* block walks over key blocks, recomputes ``S``, ``P``
   and ``dP`` again, for ``dQ = dS K · scale``.

So the backward does 7 matmuls of N²d size (kernel 2: S, dV, dP, dK; kernel 3: S, dP, dQ),
where a single pass that adds each tile's ``dS K`` into ``dQ`` with ``atomic_add`` does 5 (S,
dV, dP, dK, dQ).  We pay the 2 extra: atomics would need an fp32 ``dQ`` buffer and make the
result depend on the order the blocks finish (not bit-reproducible), which a course that prints
gradients cannot afford.  (FLOP counts that use the usual "backward = 2.5× forward", i.e. 5
matmuls, count 5 of these 7: the real work is 1.4× the counted, and TFLOP/s computed that way
come out 1.4× too low.)

Runs on a CUDA GPU (fp16, bf16 on sm_80+, fp32 with ``input_precision="ieee"`` so that it is
not silently TF32) and on a CPU under ``TRITON_INTERPRET=1``, which must be set before
Triton is imported.  The interpreter gets bf16 ``tl.dot`` wrong, so when interpreting every
tile is cast to float32 before its dot.  **Colab's T4 (sm_75)**: Triton's official support
starts at sm_80, and since Triton 3.3 its ``tl.dot`` on sm_75 is lowered to FMA instructions,
not tensor-core ``mma``; on a T4 the kernels run (fp16/fp32) without tensor cores: correct but
slow.  There every tile is cast to float32 before its dot as well (fp16 FMA dots spill
registers), and bf16 is not offered.  ``tools/compile_triton.py`` compiles every kernel offline
for sm_75/80/90 and reports registers, spills and which dot instruction was used.
``causal=True`` is top-left aligned, as everywhere in the course (SDPA's ``is_causal``); the kernels do
not compute ``align="bottom_right"`` and refuse it in one line (``helpers.flash`` has it).
Importing this module never fails; calling a kernel without Triton raises one clear error.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
from torch.autograd.function import once_differentiable

from helpers.attention import check_causal, check_qkv

__all__ = [
    "HAS_TRITON",
    "INTERPRET",
    "triton_flash_forward",
    "triton_flash_backward",
    "TritonFlashAttention",
    "triton_flash_attention",
    "supported_dtypes",
    "kernel_source",
]

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the module stays importable: the book runs without Triton
    triton = tl = None
    HAS_TRITON = False

# triton.jit decides at decoration time (this import) whether kernels are interpreted.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x · log2 e)
LN2 = 0.6931471805599453


def _require_triton(device: torch.device) -> None:
    """One-line errors for the two ways a kernel cannot run here."""
    if not HAS_TRITON:
        raise RuntimeError(
            "triton is not installed: pip install 'backprop-by-hand[triton]' (or pip install triton)"
        )
    if device.type != "cuda" and not INTERPRET:
        raise RuntimeError(
            "Triton kernels need a CUDA tensor, or TRITON_INTERPRET=1 set before importing triton for CPU tensors"
        )


if HAS_TRITON:

    @triton.jit
    def _attn_fwd(
        Q,
        K,
        V,
        O,
        L,
        Nq,
        Nk,
        qk_scale,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr,
        DOT_F32: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """O = softmax(S) V, L = m + log ℓ for one (BLOCK_M, d) query tile; S in log2 units."""
        start_m = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)  # bh·N·d overflows int32 once B·H·N·d ≥ 2³¹
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # query rows of this program
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)  # BLOCK_D = next power of 2 ≥ d
        mask_d = offs_d < HEAD_DIM
        # Only the per-(batch, head) base pointers carry the int64 offset; tile offsets stay int32.
        q_ptrs = (Q + bh * Nq * HEAD_DIM) + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_ptrs, mask=(offs_m[:, None] < Nq) & mask_d[None, :], other=0.0)  # (BLOCK_M, BLOCK_D)
        if DOT_F32:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        K_bh = K + bh * Nk * HEAD_DIM
        V_bh = V + bh * Nk * HEAD_DIM
        hi = Nk
        if CAUSAL:  # key blocks past the last row of this tile are fully masked
            hi = tl.minimum(Nk, (start_m + 1) * BLOCK_M)
        # <listing: forward loop>  (chapter 10 prints the lines up to the closing marker)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            kT = tl.load(
                K_bh + cols[None, :] * HEAD_DIM + offs_d[:, None],
                mask=(cols[None, :] < Nk) & mask_d[:, None],
                other=0.0,
            )  # (BLOCK_D, BLOCK_N)
            v = tl.load(
                V_bh + cols[:, None] * HEAD_DIM + offs_d[None, :],
                mask=(cols[:, None] < Nk) & mask_d[None, :],
                other=0.0,
            )  # (BLOCK_N, BLOCK_D)
            if DOT_F32:
                kT = kT.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
            valid = cols[None, :] < Nk
            if CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: key 0 is always visible
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)  # the rescaling step
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            m_i = m_new
        # </listing: forward loop>
        acc = acc / l_i[:, None]
        o_ptrs = (O + bh * Nq * HEAD_DIM) + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=(offs_m[:, None] < Nq) & mask_d[None, :])
        tl.store((L + bh * Nq) + offs_m, (m_i + tl.math.log2(l_i)) * 0.6931471805599453, mask=offs_m < Nq)

    @triton.jit
    def _bwd_preprocess(O, dO, D, Nq, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
        """D = rowsum(dO ∘ O) for BLOCK_M rows (fp32)."""
        offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        bh = tl.program_id(1).to(tl.int64)  # bh·N·d overflows int32 once B·H·N·d ≥ 2³¹
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_DIM)
        base = bh * Nq * HEAD_DIM
        ptrs = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        o = tl.load((O + base) + ptrs, mask=mask, other=0.0).to(tl.float32)
        do = tl.load((dO + base) + ptrs, mask=mask, other=0.0).to(tl.float32)
        tl.store((D + bh * Nq) + offs_m, tl.sum(o * do, 1), mask=offs_m < Nq)

    @triton.jit
    def _bwd_dk_dv(
        Q,
        K,
        V,
        dO,
        L,
        D,
        dK,
        dV,
        Nq,
        Nk,
        qk_scale,
        scale,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr,
        DOT_F32: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """dV = Σ_i Pᵀ dO, dK = Σ_i dSᵀ Q·scale for one key tile, in transposed form (rows = keys)."""
        start_n = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)  # bh·N·d overflows int32 once B·H·N·d ≥ 2³¹
        offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)  # key rows of this program
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        kv_mask = (offs_n[:, None] < Nk) & mask_d[None, :]
        kv_base = bh * Nk * HEAD_DIM
        kv_off = offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        k = tl.load((K + kv_base) + kv_off, mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
        v = tl.load((V + kv_base) + kv_off, mask=kv_mask, other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        Q_bh = Q + bh * Nq * HEAD_DIM
        dO_bh = dO + bh * Nq * HEAD_DIM
        L_bh = L + bh * Nq
        D_bh = D + bh * Nq
        lo = 0
        if CAUSAL:  # query rows before this key tile's first key see none of it
            lo = (start_n * BLOCK_N // BLOCK_M) * BLOCK_M
        for start_m in range(lo, Nq, BLOCK_M):
            rows = start_m + offs_m
            row_ok = rows < Nq
            qT = tl.load(
                Q_bh + rows[None, :] * HEAD_DIM + offs_d[:, None],
                mask=row_ok[None, :] & mask_d[:, None],
                other=0.0,
            )  # (BLOCK_D, BLOCK_M)
            do = tl.load(
                dO_bh + rows[:, None] * HEAD_DIM + offs_d[None, :],
                mask=row_ok[:, None] & mask_d[None, :],
                other=0.0,
            )  # (BLOCK_M, BLOCK_D)
            if DOT_F32:
                qT = qT.to(tl.float32)
                do = do.to(tl.float32)
            l2 = tl.load(L_bh + rows, mask=row_ok, other=0.0) * 1.4426950408889634
            Di = tl.load(D_bh + rows, mask=row_ok, other=0.0)
            sT = tl.dot(k, qT, input_precision=PRECISION) * qk_scale  # (BLOCK_N, BLOCK_M)
            pT = tl.math.exp2(sT - l2[None, :])  # normalised P, recomputed
            valid = row_ok[None, :] & (offs_n[:, None] < Nk)
            if CAUSAL:
                valid = valid & (offs_n[:, None] <= rows[None, :])
            pT = tl.where(valid, pT, 0.0)
            dv += tl.dot(pT.to(do.dtype), do, input_precision=PRECISION)  # (BLOCK_N, BLOCK_D)
            dpT = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # (BLOCK_N, BLOCK_M)
            dsT = pT * (dpT - Di[None, :])
            dk += tl.dot(dsT.to(qT.dtype), tl.trans(qT), input_precision=PRECISION)  # (BLOCK_N, BLOCK_D)
        dk = dk * scale
        tl.store((dK + kv_base) + kv_off, dk.to(dK.dtype.element_ty), mask=kv_mask)
        tl.store((dV + kv_base) + kv_off, dv.to(dV.dtype.element_ty), mask=kv_mask)

    @triton.jit
    def _bwd_dq(
        Q,
        K,
        V,
        dO,
        L,
        D,
        dQ,
        Nq,
        Nk,
        qk_scale,
        scale,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        CAUSAL: tl.constexpr,
        DOT_F32: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        """dQ = Σ_j dS K·scale for one query tile, dS = P ∘ (dO Vᵀ − D) recomputed."""
        start_m = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)  # bh·N·d overflows int32 once B·H·N·d ≥ 2³¹
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < HEAD_DIM
        row_ok = offs_m < Nq
        q_mask = row_ok[:, None] & mask_d[None, :]
        q_base = bh * Nq * HEAD_DIM
        q_off = offs_m[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load((Q + q_base) + q_off, mask=q_mask, other=0.0)  # (BLOCK_M, BLOCK_D)
        do = tl.load((dO + q_base) + q_off, mask=q_mask, other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        l2 = tl.load((L + bh * Nq) + offs_m, mask=row_ok, other=0.0) * 1.4426950408889634
        Di = tl.load((D + bh * Nq) + offs_m, mask=row_ok, other=0.0)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        K_bh = K + bh * Nk * HEAD_DIM
        V_bh = V + bh * Nk * HEAD_DIM
        hi = Nk
        if CAUSAL:
            hi = tl.minimum(Nk, (start_m + 1) * BLOCK_M)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            col_ok = cols < Nk
            kT = tl.load(
                K_bh + cols[None, :] * HEAD_DIM + offs_d[:, None],
                mask=col_ok[None, :] & mask_d[:, None],
                other=0.0,
            )  # (BLOCK_D, BLOCK_N)
            vT = tl.load(
                V_bh + cols[None, :] * HEAD_DIM + offs_d[:, None],
                mask=col_ok[None, :] & mask_d[:, None],
                other=0.0,
            )
            if DOT_F32:
                kT = kT.to(tl.float32)
                vT = vT.to(tl.float32)
            s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale  # (BLOCK_M, BLOCK_N)
            p = tl.math.exp2(s - l2[:, None])
            valid = col_ok[None, :] & row_ok[:, None]
            if CAUSAL:
                valid = valid & (cols[None, :] <= offs_m[:, None])
            p = tl.where(valid, p, 0.0)
            dp = tl.dot(do, vT, input_precision=PRECISION)  # (BLOCK_M, BLOCK_N)
            ds = p * (dp - Di[:, None])
            dq += tl.dot(ds.to(kT.dtype), tl.trans(kT), input_precision=PRECISION)  # (BLOCK_M, BLOCK_D)
        dq = dq * scale
        tl.store((dQ + q_base) + q_off, dq.to(dQ.dtype.element_ty), mask=q_mask)


def kernel_source(name: str, listing: str | None = None) -> str:
    """The text of kernel ``name`` in this file, or only its ``# <listing: …>`` block; needs no Triton."""
    import ast
    import inspect
    import textwrap

    text = inspect.getsource(inspect.getmodule(kernel_source))
    fn = next(
        (n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name), None
    )
    if fn is None:
        raise ValueError(f"name: expected a function of helpers.flash_triton, got {name!r}")
    lines = text.splitlines()[fn.lineno - 1 : fn.end_lineno]
    if listing is not None:
        opens = [i for i, line in enumerate(lines) if line.strip().startswith(f"# <listing: {listing}>")]
        closes = [i for i, line in enumerate(lines) if line.strip() == f"# </listing: {listing}>"]
        if len(opens) != 1 or len(closes) != 1:
            raise ValueError(
                f"listing: expected one '# <listing: {listing}>' block in {name}, found {len(opens)}"
            )
        lines = lines[opens[0] + 1 : closes[0]]
    return textwrap.dedent("\n".join(lines)) + "\n"


def supported_dtypes(device) -> list[torch.dtype]:
    """Dtypes the kernels run in on ``device``: bf16 only where the GPU has bf16 (sm_80+)."""
    device = torch.device(device)
    if INTERPRET:  # tiles are cast to fp32 before every dot: fp32 is what is computed
        return [torch.float32]
    if device.type != "cuda":
        return []
    out = [torch.float16, torch.float32]
    if torch.cuda.get_device_capability(device)[0] >= 8:
        out.insert(1, torch.bfloat16)
    return out


def _major(device: torch.device) -> int:
    """Compute capability major of a CUDA device (0 for a CPU tensor under the interpreter)."""
    return torch.cuda.get_device_capability(device)[0] if device.type == "cuda" else 0


def _config(major: int, d: int, dtype: torch.dtype) -> dict:
    """Tile sizes per launch for a GPU of compute capability major.x (untuned; the interpreter gets 16×16 tiles)."""
    if INTERPRET:
        t = dict(BLOCK_M=16, BLOCK_N=16)
        return dict(fwd=t, dkdv=t, dq=t, num_warps=1, num_stages=1)
    if major < 8 or dtype == torch.float32:
        # No tensor-core dots (sm_75 under Triton >= 3.3, fp32 "ieee" everywhere): every dot is
        # FMAs on registers, so tiles stay small.  Tiles and warps are the ones for which
        # tools/compile_triton.py reports 0 spilled bytes on sm_75, sm_80 and sm_90 (Triton 3.9).
        if d <= 64:
            return dict(
                fwd=dict(BLOCK_M=32, BLOCK_N=32),
                dkdv=dict(BLOCK_M=16, BLOCK_N=32),
                dq=dict(BLOCK_M=32, BLOCK_N=16),
                num_warps=4 if major < 8 and dtype != torch.float32 else 8,
                num_stages=1,
            )
        return dict(
            fwd=dict(BLOCK_M=16, BLOCK_N=16),
            dkdv=dict(BLOCK_M=16, BLOCK_N=16),
            dq=dict(BLOCK_M=16, BLOCK_N=32),
            num_warps=4,
            num_stages=1,
        )
    if d > 64:
        return dict(
            fwd=dict(BLOCK_M=64, BLOCK_N=32),
            dkdv=dict(BLOCK_M=32, BLOCK_N=64),
            dq=dict(BLOCK_M=64, BLOCK_N=32),
            num_warps=8,
            num_stages=2,
        )
    return dict(
        fwd=dict(BLOCK_M=128, BLOCK_N=64),
        dkdv=dict(BLOCK_M=32, BLOCK_N=64),  # 32 × 128 spills
        dq=dict(BLOCK_M=128, BLOCK_N=32),
        num_warps=4,
        num_stages=3,
    )


def _meta(d: int, dtype: torch.dtype, major: int) -> dict:
    """The kernels' constexprs for head dim d: BLOCK_D, whether tiles go to fp32 before tl.dot, dot precision."""
    # fp32 dots where there are no tensor cores anyway (the interpreter, sm_75): fp16 FMA dots spill.
    dot_f32 = INTERPRET or major < 8
    # fp32 dots in true fp32 (not TF32): "ieee"; fp16/bf16 dots ignore the flag.
    precision = "ieee" if (dot_f32 or dtype == torch.float32) else None
    return dict(HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), DOT_F32=dot_f32, PRECISION=precision)


def _scale(d: int, scale) -> float:
    """The softmax scale: 1/√d unless given."""
    return d**-0.5 if scale is None else float(scale)


def _on(device: torch.device):
    """Launch on the tensors' GPU, not the current one (a no-op for CPU tensors under the interpreter)."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def _check(Q, K, V, causal, align) -> None:
    """One-line ValueErrors for anything the kernels do not compute: they never silently cast or truncate."""
    check_qkv(Q, K, V, dims=4)
    check_causal(causal, align)
    _require_triton(Q.device)
    if align != "top_left":
        raise ValueError(
            f"align: the Triton kernels compute only 'top_left' (SDPA's is_causal), got {align!r}; "
            "helpers.flash.flash_attention has 'bottom_right'"
        )
    if Q.dtype not in supported_dtypes(Q.device):
        where = "under TRITON_INTERPRET=1" if INTERPRET else "on this GPU"
        raise ValueError(f"Q: expected one of {supported_dtypes(Q.device)} {where}, got {Q.dtype}")
    if Q.shape[-1] > 128 or V.shape[-1] != Q.shape[-1]:
        raise ValueError(
            f"V: expected head dims d = d_v <= 128 (the kernels' tiles), got d={Q.shape[-1]}, "
            f"d_v={V.shape[-1]}"
        )


def triton_flash_forward(Q, K, V, causal: bool = False, scale: float | None = None, align: str = "top_left"):
    """(O, L) = (softmax(scale·Q Kᵀ) V, logsumexp rows) by the Triton forward kernel; Q (B, H, Nq, d)."""
    _check(Q, K, V, causal, align)
    Q, K, V = Q.contiguous(), K.contiguous(), V.contiguous()
    B, H, Nq, d = Q.shape
    Nk = K.shape[2]
    major = _major(Q.device)
    meta, scale = _meta(d, Q.dtype, major), _scale(d, scale)
    cfg = _config(major, d, Q.dtype)
    O = torch.empty_like(Q)  # (B, H, Nq, d)
    L = torch.empty(B, H, Nq, device=Q.device, dtype=torch.float32)  # (B, H, Nq), fp32 always
    grid = (triton.cdiv(Nq, cfg["fwd"]["BLOCK_M"]), B * H)
    with _on(Q.device):
        _attn_fwd[grid](
            Q,
            K,
            V,
            O,
            L,
            Nq,
            Nk,
            scale * LOG2E,
            CAUSAL=bool(causal),
            **meta,
            **cfg["fwd"],
            num_warps=cfg["num_warps"],
            num_stages=cfg["num_stages"],
        )
    return O, L


def triton_flash_backward(
    Q, K, V, O, L, grad_O, causal: bool = False, scale: float | None = None, needs=(True, True, True)
):
    """(dQ, dK, dV) by recomputation: D = rowsum(dO∘O); dK, dV per key tile; dQ per query tile.

    ``needs`` (for Q, K, V, like ``ctx.needs_input_grad``): the dQ kernel runs only if Q needs a
    gradient, the dK/dV kernel only if K or V does; a gradient not needed comes back as ``None``.
    """
    _require_triton(Q.device)
    need_Q, need_K, need_V = (bool(n) for n in needs)
    Q, K, V, O, grad_O = (t.contiguous() for t in (Q, K, V, O, grad_O))
    B, H, Nq, d = Q.shape
    Nk = K.shape[2]
    major = _major(Q.device)
    meta, scale = _meta(d, Q.dtype, major), _scale(d, scale)
    cfg = _config(major, d, Q.dtype)
    launch = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    grad_Q = grad_K = grad_V = None
    if not (need_Q or need_K or need_V):
        return grad_Q, grad_K, grad_V
    D = torch.empty(B, H, Nq, device=Q.device, dtype=torch.float32)  # (B, H, Nq)
    bm = cfg["dq"]["BLOCK_M"]
    args = (Q, K, V, grad_O, L, D)
    with _on(Q.device):
        _bwd_preprocess[(triton.cdiv(Nq, bm), B * H)](
            O, grad_O, D, Nq, HEAD_DIM=d, BLOCK_D=meta["BLOCK_D"], BLOCK_M=bm
        )
        if need_K or need_V:  # one kernel makes both: dK needs dP, whose tile loop also gives dV
            grad_K, grad_V = torch.empty_like(K), torch.empty_like(V)
            _bwd_dk_dv[(triton.cdiv(Nk, cfg["dkdv"]["BLOCK_N"]), B * H)](
                *args,
                grad_K,
                grad_V,
                Nq,
                Nk,
                scale * LOG2E,
                scale,
                CAUSAL=bool(causal),
                **meta,
                **cfg["dkdv"],
                **launch,
            )
        if need_Q:
            grad_Q = torch.empty_like(Q)
            _bwd_dq[(triton.cdiv(Nq, bm), B * H)](
                *args,
                grad_Q,
                Nq,
                Nk,
                scale * LOG2E,
                scale,
                CAUSAL=bool(causal),
                **meta,
                **cfg["dq"],
                **launch,
            )
    return grad_Q, grad_K if need_K else None, grad_V if need_V else None


class TritonFlashAttention(torch.autograd.Function):
    """(O, L) from the Triton forward; backward runs the three Triton backward kernels on Q, K, V, O, L."""

    @staticmethod
    def forward(Q, K, V, causal, scale):
        return triton_flash_forward(Q, K, V, causal, scale)

    @staticmethod
    def setup_context(ctx, inputs, output):
        Q, K, V, causal, scale = inputs
        O, L = output
        ctx.save_for_backward(Q, K, V, O, L)
        ctx.causal, ctx.scale = causal, scale
        ctx.mark_non_differentiable(L)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_O, grad_L):
        Q, K, V, O, L = ctx.saved_tensors
        # Only the kernels whose gradients are wanted run (a frozen K and V skip dK/dV entirely).
        grad_Q, grad_K, grad_V = triton_flash_backward(
            Q, K, V, O, L, grad_O, ctx.causal, ctx.scale, needs=ctx.needs_input_grad[:3]
        )
        return grad_Q, grad_K, grad_V, None, None


def triton_flash_attention(
    Q,
    K,
    V,
    causal: bool = False,
    scale: float | None = None,
    return_lse: bool = False,
    align: str = "top_left",
):
    """O = softmax(scale·Q Kᵀ) V for (B, H, N, d) tensors by Triton kernels; (O, L) if return_lse (L fp32)."""
    _check(Q, K, V, causal, align)
    O, L = TritonFlashAttention.apply(Q, K, V, causal, scale)
    return (O, L) if return_lse else O
