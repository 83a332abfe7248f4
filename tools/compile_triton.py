"""Compile helpers/flash_triton.py's kernels offline for sm_75, sm_80 and sm_90: no GPU needed.

    python tools/compile_triton.py                 # every target, dtype, d in {64, 128}, causal or not
    python tools/compile_triton.py --cap 75 --d 64 --dtype fp16

For each kernel it compiles, with the tile sizes ``helpers.flash_triton._config`` picks for that
GPU generation, Triton's source down to a cubin (with the ptxas shipped in Triton's wheel), and
prints registers per thread, spilled bytes (Triton's own ``ptxas -v`` run), shared memory, and which matrix
instruction the dots became: ``wgmma`` (sm_90), ``mma`` (sm_80 tensor cores), or ``fma`` (no
tensor cores: Triton >= 3.3 lowers sm_75 dots to FMA).  It also checks that fp32 dots are not TF32.
Exit status 1 if a kernel fails to compile, spills, or computes an fp32 dot in TF32.

This checks that the kernels compile and fit the register file; it says nothing about speed and
does not run them (``tests/test_flash_triton.py -m gpu`` and ``benchmarks/flash_gpu.py`` do, on a GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import re
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, do not interpret: must precede importing triton
# A fresh cache, so that Triton runs ptxas for every kernel and its -v log (spills) can be read.
_CACHE = tempfile.TemporaryDirectory(prefix="compile_triton_")
os.environ["TRITON_CACHE_DIR"] = _CACHE.name
ROOT = Path(__file__).resolve().parents[1]

import torch  # noqa: E402

try:
    import triton  # noqa: E402
    from triton import knobs  # noqa: E402
    from triton.backends.compiler import GPUTarget  # noqa: E402
    from triton.compiler import ASTSource  # noqa: E402
except ImportError:
    raise SystemExit("tools/compile_triton.py needs triton (pip install triton)") from None

import helpers.flash_triton as ft  # noqa: E402

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
PTR = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32"}


def compile_kernel(kernel, ptrs: dict, ints, floats, consts: dict, cap: int, num_warps: int, num_stages: int):
    """triton.compile of one @triton.jit kernel for GPUTarget('cuda', cap); pointers assumed 16-byte aligned."""
    sig = {}
    for name in kernel.arg_names:
        sig[name] = ptrs.get(name) or ("i32" if name in ints else "fp32" if name in floats else "constexpr")
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in ptrs}
    src = ASTSource(kernel, sig, consts, attrs)
    return triton.compile(
        src, target=GPUTarget("cuda", cap, 32), options=dict(num_warps=num_warps, num_stages=num_stages)
    )


def compile_with_log(*args, **kw):
    """(compiled kernel, ptxas -v log): Triton's own ptxas run, its log captured (a fresh cache forces the run)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        ck = compile_kernel(*args, **kw)
    return ck, buf.getvalue()


def ptxas_usage(log: str) -> dict:
    """Registers, spill stores + loads and stack bytes from ptxas -v's log."""
    num = lambda pat: int(m.group(1)) if (m := re.search(pat, log)) else 0  # noqa: E731
    if "Used" not in log:
        raise RuntimeError("no ptxas log (was the kernel taken from Triton's cache?)")
    return dict(
        regs=num(r"Used (\d+) registers"),
        stack=num(r"(\d+) bytes stack frame"),
        spill=num(r"(\d+) bytes spill stores") + num(r"(\d+) bytes spill loads"),
    )


def dot_kind(ptx: str) -> str:
    """Which instruction the dots became: wgmma, mma or fma (no tensor cores)."""
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    if re.search(r"\bmma\.sync", ptx):
        return "mma"
    return "fma"


def jobs(cap: int, dtype: torch.dtype, d: int, causal: bool):
    """(name, kernel, pointer types, int args, float args, constexprs, num_warps, num_stages) per launch.

    The tile sizes and constexprs are the ones helpers.flash_triton picks for this GPU generation.
    """
    cfg = ft._config(cap // 10, d, dtype)
    P = PTR[dtype]
    meta = dict(ft._meta(d, dtype, cap // 10), CAUSAL=causal)
    nw, ns = cfg["num_warps"], cfg["num_stages"]
    common = dict(Q=P, K=P, V=P, dO=P, L="*fp32", D="*fp32")
    return [
        (
            "fwd",
            ft._attn_fwd,
            dict(Q=P, K=P, V=P, O=P, L="*fp32"),
            ["Nq", "Nk"],
            ["qk_scale"],
            {**meta, **cfg["fwd"]},
            nw,
            ns,
        ),
        (
            "pre",
            ft._bwd_preprocess,
            dict(O=P, dO=P, D="*fp32"),
            ["Nq"],
            [],
            dict(HEAD_DIM=d, BLOCK_D=meta["BLOCK_D"], BLOCK_M=cfg["dq"]["BLOCK_M"]),
            4,
            3,
        ),  # launched with the defaults
        (
            "dkdv",
            ft._bwd_dk_dv,
            dict(common, dK=P, dV=P),
            ["Nq", "Nk"],
            ["qk_scale", "scale"],
            {**meta, **cfg["dkdv"]},
            nw,
            ns,
        ),
        (
            "dq",
            ft._bwd_dq,
            dict(common, dQ=P),
            ["Nq", "Nk"],
            ["qk_scale", "scale"],
            {**meta, **cfg["dq"]},
            nw,
            ns,
        ),
    ]


def meta_is_f32(consts: dict) -> bool:
    """Whether this launch's dots are fp32 ("ieee"), so that TF32 in its PTX would be a bug."""
    return consts.get("PRECISION") == "ieee"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--cap", type=int, nargs="+", default=[75, 80, 90], help="compute capabilities, e.g. 75 80 90"
    )
    p.add_argument("--dtype", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    p.add_argument("--d", type=int, nargs="+", default=[64, 128])
    args = p.parse_args(argv)
    knobs.nvidia.dump_ptxas_log = True  # Triton prints its ptxas -v output: registers, spills
    print(f"triton {triton.__version__}, torch {torch.__version__}")
    print(
        f"{'sm':>3} {'dtype':<5} {'d':>4} {'causal':<6} {'kernel':<5} {'tiles':<9} {'warps':>5} {'regs':>4} "
        f"{'spill B':>7} {'smem B':>7} {'dots':<5}"
    )
    bad = 0
    for cap, dname, d, causal in itertools.product(args.cap, args.dtype, args.d, (False, True)):
        dtype = DTYPES[dname]
        if dtype == torch.bfloat16 and cap < 80:
            continue  # supported_dtypes: no bf16 before sm_80
        for name, kern, ptrs, ints, floats, consts, nw, ns in jobs(cap, dtype, d, causal):
            if name == "pre" and causal:
                continue  # has no CAUSAL: the same kernel as causal=False
            tiles = f"{consts.get('BLOCK_M', '')}x{consts.get('BLOCK_N', '-')}"
            try:
                ck, log = compile_with_log(kern, ptrs, ints, floats, consts, cap, nw, ns)
            except Exception as e:  # noqa: BLE001 - report and go on
                bad += 1
                msg = (str(e).strip().splitlines() or [repr(e)])[-1][:120]
                print(f"{cap:>3} {dname:<5} {d:>4} {str(causal):<6} {name:<5} {tiles:<9} FAILED: {msg}")
                continue
            ptx = ck.asm["ptx"]
            use = ptxas_usage(log)
            kind = dot_kind(ptx) if name != "pre" else "-"
            tf32 = meta_is_f32(consts) and "tf32" in ptx
            flag = " ✗ spills" if use["spill"] else ""
            flag += " ✗ TF32" if tf32 else ""
            bad += bool(flag)
            print(
                f"{cap:>3} {dname:<5} {d:>4} {str(causal):<6} {name:<5} {tiles:<9} {nw:>5} {use['regs']:>4} "
                f"{use['spill']:>7} {ck.metadata.shared:>7} {kind:<5}{flag}"
            )
    print("all kernels compiled, no spills, no TF32" if not bad else f"{bad} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
