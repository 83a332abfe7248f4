"""Gradient checkpointing on a small block stack: bytes kept for backward and forward+backward time.

    python benchmarks/checkpoint_cpu.py                    # B=4, N=128, d=128, 4 heads, d_ff=512, 4 blocks
    python benchmarks/checkpoint_cpu.py --N 256 --layers 8 --repeats 15

Three ways to run the same nn.TransformerEncoderLayer(norm_first=True, dropout=0) stack (float32, CPU):

* none:   every block keeps what autograd saves;
* torch:  torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) per block;
* ours:   helpers.checkpoint.checkpoint_sequential(blocks, x) (one Checkpoint Function per block).

Saved bytes are counted with helpers.memory.SavedTensors (parameters and the input excluded;
the formula line is helpers.checkpoint.activation_bytes_formula minus the excluded input).
Times are the median of interleaved repeats in one process, so the ratios are measured under
the same load; absolute times depend on the machine.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.utils.checkpoint as tuc  # noqa: E402
from torch import nn  # noqa: E402

from helpers.checkpoint import activation_bytes_formula, checkpoint_sequential  # noqa: E402
from helpers.device import randn  # noqa: E402
from helpers.memory import SavedTensors, fmt_bytes  # noqa: E402


def run(blocks, x, mode):
    """Output of the stack under one checkpointing mode."""
    if mode == "ours":
        return checkpoint_sequential(blocks, x)
    h = x
    for b in blocks:
        h = b(h) if mode == "none" else tuc.checkpoint(b, h, use_reentrant=False)
    return h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--N", type=int, default=128)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--H", type=int, default=4)
    ap.add_argument("--d_ff", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    torch.manual_seed(0)
    blocks = nn.ModuleList(
        nn.TransformerEncoderLayer(
            args.d, args.H, args.d_ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        for _ in range(args.layers)
    )
    params = list(blocks.parameters())
    x = randn(args.B, args.N, args.d, seed=1, requires_grad=True)
    modes = ("none", "torch", "ours")

    saved = {}
    for m in modes:
        with SavedTensors(exclude=[x, *params]) as s:
            run(blocks, x, m)
        saved[m] = s.total_bytes
    formula = (
        activation_bytes_formula(args.B, args.N, args.d, args.H, args.layers, args.d_ff, 4)
        - args.B * args.N * args.d * 4
    )  # x excluded above

    grads = {}
    times = {m: [] for m in modes}
    for r in range(args.repeats + 1):
        for m in modes:
            t0 = time.perf_counter()
            y = run(blocks, x, m)
            g = torch.autograd.grad((y * y).sum(), [x, *params])
            dt = time.perf_counter() - t0
            if r > 0:  # first round warms up
                times[m].append(dt)
            grads[m] = g
    med = {m: statistics.median(times[m]) for m in modes}
    diff = {m: max((a - b).abs().max().item() for a, b in zip(grads[m], grads["none"])) for m in modes}

    print(
        f"# {datetime.date.today()}  {platform.processor() or platform.machine()}  "
        f"torch {torch.__version__}  threads {torch.get_num_threads()}"
    )
    print(
        f"# B={args.B} N={args.N} d={args.d} H={args.H} d_ff={args.d_ff} layers={args.layers} float32 CPU, "
        f"median of {args.repeats}"
    )
    print(f"formula (no checkpointing, x excluded): {formula} B ({fmt_bytes(formula)})")
    print(
        f"{'mode':<6s} {'saved bytes':>12s} {'':>10s} {'saved/none':>10s} {'fwd+bwd ms':>11s} "
        f"{'time/none':>9s} {'max|Δgrad|':>11s}"
    )
    for m in modes:
        print(
            f"{m:<6s} {saved[m]:>12d} {fmt_bytes(saved[m]):>10s} {saved[m] / saved['none']:>10.4f} "
            f"{1e3 * med[m]:>11.2f} {med[m] / med['none']:>9.2f} {diff[m]:>11.1e}"
        )


if __name__ == "__main__":
    main()
