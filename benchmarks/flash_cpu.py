"""Naive vs tiled (flash-style) attention in PyTorch on the CPU: fwd+bwd time ratio and bytes saved for backward.

    python benchmarks/flash_cpu.py                 # B=1, H=2, d=32, N = 256 ... 2048
    python benchmarks/flash_cpu.py --N 512 1024 --block 128 --repeats 5 --threads 4 --causal

Both run in the same process, interleaved, so the ratio is measured under the same load;
absolute milliseconds depend on the machine.  Saved bytes exclude Q, K, V (they exist anyway).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from helpers.device import randn  # noqa: E402
from helpers.flash import flash_attention, naive_attention, saved_bytes  # noqa: E402
from helpers.memory import fmt_bytes  # noqa: E402


def fwd_bwd_seconds(attn, Q, K, V, grad_O, repeats: int) -> float:
    """Median wall time of attn(Q, K, V) forward + backward."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        O = attn(Q, K, V)
        torch.autograd.grad(O, (Q, K, V), grad_O)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--N", type=int, nargs="+", default=[256, 512, 1024, 2048])
    p.add_argument("--B", type=int, default=1)
    p.add_argument("--H", type=int, default=2)
    p.add_argument("--d", type=int, default=32)
    p.add_argument("--block", type=int, default=128, help="block_q = block_k of the tiled version")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--causal", action="store_true")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared machine, more threads mostly measure OpenMP waiting)",
    )
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    tiled = lambda Q, K, V, causal=args.causal: flash_attention(Q, K, V, causal, args.block, args.block)  # noqa: E731
    naive = lambda Q, K, V, causal=args.causal: naive_attention(Q, K, V, causal)  # noqa: E731
    print(
        f"B={args.B} H={args.H} d={args.d} causal={args.causal} block={args.block} "
        f"threads={torch.get_num_threads()} torch {torch.__version__}"
    )
    print(
        f"{'N':>6} {'naive ms':>9} {'tiled ms':>9} {'tiled/naive':>11} {'naive saved':>12} {'tiled saved':>12}"
    )
    rows = []
    for N in args.N:
        Q, K, V = (randn(args.B, args.H, N, args.d, seed=s, requires_grad=True) for s in (1, 2, 3))
        grad_O = randn(args.B, args.H, N, args.d, seed=4)
        fwd_bwd_seconds(naive, Q, K, V, grad_O, 1)  # warm-up
        fwd_bwd_seconds(tiled, Q, K, V, grad_O, 1)
        t_naive = fwd_bwd_seconds(naive, Q, K, V, grad_O, args.repeats)
        t_tiled = fwd_bwd_seconds(tiled, Q, K, V, grad_O, args.repeats)
        b_naive = saved_bytes(naive, args.B, args.H, N, args.d, args.causal)
        b_tiled = saved_bytes(tiled, args.B, args.H, N, args.d, args.causal)
        rows.append(
            dict(
                N=N,
                naive_ms=1e3 * t_naive,
                tiled_ms=1e3 * t_tiled,
                ratio=t_tiled / t_naive,
                naive_bytes=b_naive,
                tiled_bytes=b_tiled,
            )
        )
        print(
            f"{N:>6} {1e3 * t_naive:>9.1f} {1e3 * t_tiled:>9.1f} {t_tiled / t_naive:>10.2f}x "
            f"{fmt_bytes(b_naive):>12} {fmt_bytes(b_tiled):>12}"
        )
    return rows


if __name__ == "__main__":
    main()
