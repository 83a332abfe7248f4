"""Attention on a CUDA GPU: naive, tiled PyTorch, Triton and every SDPA backend; ms, TFLOP/s, peak memory.

    python benchmarks/flash_gpu.py                  # full sweep (a few minutes on an H100/H200)
    python benchmarks/flash_gpu.py --quick          # d=64, N = 1024, 4096, the first dtype this GPU has
    python benchmarks/flash_gpu.py --impl triton sdpa-flash --dtype bf16 --d 64 --N 4096 8192

Shapes: B = max(1, tokens // N) sequences of N tokens, H = width // d heads (defaults
tokens = 16384, width = 2048), so every N does comparable work per layer.
FLOPs: 4·B·H·N²·d forward (QKᵀ and PV), backward counted as 2.5× forward (fwd+bwd = 3.5×),
halved when causal.  That convention counts 5 N²d matmuls in backward; the Triton backward does
7 (S and dP are recomputed in both of its kernels), so its TFLOP/s understate its work by 40%.
Peak memory: max_memory_allocated above what Q, K, V, dO already use.
Writes benchmarks/results/flash_gpu_<gpu>.{csv,json,png} (or --out DIR) and prints a table.
bf16 is skipped on GPUs without bf16 support (T4, sm_75); naive attention is skipped where
its N×N matrices would not fit; the tiled PyTorch version (Python loops) only up to --tiled-max-N.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from helpers.flash import attention_flops, flash_attention, naive_attention  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
SDPA = ["flash", "efficient", "cudnn", "math"]
IMPLS = ["naive", "tiled", "triton"] + [f"sdpa-{b}" for b in SDPA]


def sdpa_fn(backend: str):
    """F.scaled_dot_product_attention restricted to one backend via torch.nn.attention.sdpa_kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
        "cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None),
    }[backend]
    if which is None:
        return None

    def attn(Q, K, V, causal):
        with sdpa_kernel([which]):
            return F.scaled_dot_product_attention(Q, K, V, is_causal=causal)

    return attn


def get_impl(name: str, tiled_block: int):
    if name == "naive":
        return lambda Q, K, V, causal: naive_attention(Q, K, V, causal)
    if name == "tiled":
        return lambda Q, K, V, causal: flash_attention(Q, K, V, causal, tiled_block, tiled_block)
    if name == "triton":
        from helpers.flash_triton import triton_flash_attention

        return lambda Q, K, V, causal: triton_flash_attention(Q, K, V, causal)
    return sdpa_fn(name.split("-", 1)[1])


def cuda_ms(fn, warmup: int = 3, budget_ms: float = 300.0) -> float:
    """Median milliseconds of fn() with CUDA events, repeated for about budget_ms."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    reps = int(max(3, min(200, budget_ms / max(start.elapsed_time(end), 1e-3))))
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def measure(attn, B, H, N, d, dtype, causal, mode):
    """(ms, peak extra bytes) of one forward, or forward+backward, of attn."""
    g = torch.Generator(device="cuda").manual_seed(0)
    Q, K, V, dO = (torch.randn(B, H, N, d, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    Q.requires_grad_(mode == "fwd+bwd")
    K.requires_grad_(mode == "fwd+bwd")
    V.requires_grad_(mode == "fwd+bwd")

    def step():
        O = attn(Q, K, V, causal)
        if mode == "fwd+bwd":
            torch.autograd.grad(O, (Q, K, V), dO)

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    return cuda_ms(step), peak


def naive_fits(B, H, N, dtype, mode) -> bool:
    """S, P (and dP, dS for backward) as B·H·N² matrices must fit in 80% of free memory."""
    matrices = 2 if mode == "fwd" else 5
    need = matrices * B * H * N * N * torch.tensor([], dtype=dtype).element_size()
    return need < 0.8 * torch.cuda.mem_get_info()[0]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", nargs="+", default=IMPLS, choices=IMPLS)
    p.add_argument("--dtype", nargs="+", default=["bf16", "fp16"], choices=list(DTYPES))
    p.add_argument("--d", type=int, nargs="+", default=[64, 128])
    p.add_argument("--N", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--causal", nargs="+", default=["no", "yes"], choices=["no", "yes"])
    p.add_argument("--mode", nargs="+", default=["fwd", "fwd+bwd"], choices=["fwd", "fwd+bwd"])
    p.add_argument("--tokens", type=int, default=16384, help="B = max(1, tokens // N)")
    p.add_argument("--width", type=int, default=2048, help="H = width // d")
    p.add_argument("--tiled-max-N", type=int, default=4096)
    p.add_argument("--tiled-block", type=int, default=256)
    p.add_argument("--quick", action="store_true", help="d=64, N=1024 and 4096, first supported dtype only")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("flash_gpu.py needs a CUDA GPU (on a CPU, run benchmarks/flash_cpu.py)")
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("unset TRITON_INTERPRET: on a GPU the Triton kernels must be compiled")
    from helpers.device import describe, no_tf32

    no_tf32()
    major = torch.cuda.get_device_capability()[0]
    gpu = torch.cuda.get_device_name()
    if args.quick:  # the first dtype this GPU runs: on a T4 (sm_75) the default bf16 would leave nothing
        usable = [n for n in args.dtype if not (DTYPES[n] == torch.bfloat16 and major < 8)]
        args.d, args.N, args.dtype = [64], [1024, 4096], usable[:1]
    print(f"{describe(torch.device('cuda'))}, torch {torch.__version__}")
    rows = []
    header = (
        f"{'impl':<15} {'dtype':<5} {'d':>4} {'causal':<6} {'mode':<8} {'N':>6} {'B':>3} {'H':>3} "
        f"{'ms':>9} {'TFLOP/s':>8} {'peak MiB':>9}"
    )
    print(header)
    for dname in args.dtype:
        dtype = DTYPES[dname]
        if dtype == torch.bfloat16 and major < 8:
            print(f"skip bf16: {gpu} (sm_{major}x) has no bf16 support; fp16 only")
            continue
        for d in args.d:
            for causal in (c == "yes" for c in args.causal):
                for mode in args.mode:
                    for N in args.N:
                        B, H = max(1, args.tokens // N), max(1, args.width // d)
                        flops = attention_flops(B, H, N, d, causal, backward=(mode == "fwd+bwd"))
                        for name in args.impl:
                            row = dict(
                                gpu=gpu,
                                impl=name,
                                dtype=dname,
                                d=d,
                                causal=causal,
                                mode=mode,
                                N=N,
                                B=B,
                                H=H,
                                ms=None,
                                tflops=None,
                                peak_mib=None,
                                note="",
                            )
                            attn = get_impl(name, args.tiled_block)
                            if attn is None:
                                row["note"] = "backend not in this torch"
                            elif name == "naive" and not naive_fits(B, H, N, dtype, mode):
                                row["note"] = "skipped: would not fit"
                            elif name == "tiled" and N > args.tiled_max_N:
                                row["note"] = f"skipped: N > --tiled-max-N {args.tiled_max_N}"
                            else:
                                try:
                                    ms, peak = measure(attn, B, H, N, d, dtype, causal, mode)
                                    row.update(ms=ms, tflops=flops / ms / 1e9, peak_mib=peak / 2**20)
                                except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # unsupported or OOM
                                    row["note"] = "failed: " + str(e).splitlines()[0][:80]
                                torch.cuda.empty_cache()
                            rows.append(row)
                            if row["ms"] is None:
                                print(
                                    f"{name:<15} {dname:<5} {d:>4} {str(causal):<6} {mode:<8} {N:>6} {B:>3} {H:>3} "
                                    f"{row['note']}"
                                )
                            else:
                                print(
                                    f"{name:<15} {dname:<5} {d:>4} {str(causal):<6} {mode:<8} {N:>6} {B:>3} {H:>3} "
                                    f"{row['ms']:>9.3f} {row['tflops']:>8.1f} {row['peak_mib']:>9.1f}"
                                )
    if not rows:
        print("nothing measured (no dtype this GPU supports among --dtype); nothing written")
        return rows
    summarize(rows)
    save(rows, args.out, gpu)
    return rows


def summarize(rows) -> None:
    """The target: Triton fwd+bwd ≥ 0.8× SDPA flash throughput at N ≥ 4096, d = 64, bf16."""
    key = lambda r: (r["dtype"], r["d"], r["causal"], r["mode"], r["N"])  # noqa: E731
    flash = {key(r): r for r in rows if r["impl"] == "sdpa-flash" and r["tflops"]}
    print(
        "\nTriton / SDPA-flash throughput (target ≥ 0.80 at N ≥ 4096, d = 64, bf16, fwd+bwd;"
        " both counted with backward = 2.5× forward):"
    )
    for r in rows:
        if r["impl"] == "triton" and r["tflops"] and key(r) in flash:
            ratio = r["tflops"] / flash[key(r)]["tflops"]
            target = r["dtype"] == "bf16" and r["d"] == 64 and r["N"] >= 4096 and r["mode"] == "fwd+bwd"
            flag = (" ✓" if ratio >= 0.8 else " ✗ below target") if target else ""
            print(
                f"  {r['dtype']} d={r['d']} causal={r['causal']} {r['mode']:<8} N={r['N']:>6}: {ratio:.2f}{flag}"
            )


def save(rows, out: Path, gpu: str) -> None:
    """Write rows to <out>/flash_gpu_<gpu>.csv and .json, and a TFLOP/s plot if matplotlib is there."""
    if not rows:
        return
    out.mkdir(parents=True, exist_ok=True)
    stem = out / ("flash_gpu_" + re.sub(r"[^A-Za-z0-9]+", "_", gpu).strip("_"))
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    meta = {"gpu": gpu, "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"wrote {stem}.csv/.json (no matplotlib: no plot)")
        return
    dname = "bf16" if any(r["dtype"] == "bf16" for r in rows) else "fp16"
    d = 64 if any(r["d"] == 64 for r in rows) else rows[0]["d"]
    panels = sorted({(r["mode"], r["causal"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (mode, causal) in zip(axes[0], panels):
        for impl in IMPLS:
            pts = [
                (r["N"], r["tflops"])
                for r in rows
                if r["impl"] == impl
                and r["mode"] == mode
                and r["causal"] == causal
                and r["dtype"] == dname
                and r["d"] == d
                and r["tflops"]
            ]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{mode}, causal={causal}")
        ax.set_xlabel("N")
        ax.set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{gpu}: attention, {dname}, d={d}")
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=120)
    print(f"wrote {stem}.csv, .json and .png")


if __name__ == "__main__":
    main()
