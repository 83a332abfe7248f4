"""One Transformer block: the manual backward (helpers.block) vs autograd on nn.TransformerEncoderLayer.

    python benchmarks/block_backward.py                       # B=8, N=128, d=256, 4 heads, d_ff=1024, relu
    python benchmarks/block_backward.py --causal --activation gelu --repeats 21

For each placement (post-norm, pre-norm) the same weights and input go through both:

* autograd:  Y = layer(X), then torch.autograd.grad(Y, (X, *params), grad_Y)
* manual:    Y, cache = block_forward(X, params, ...), then block_manual_backward(grad_Y, cache)

The two are run interleaved in one process, so the ratio is measured under the same load; the
median of the repeats is reported.  Saved bytes exclude X and the parameters (they exist anyway):
autograd's are counted with helpers.memory.SavedTensors, ours are the cache's tensors.
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
from torch import nn  # noqa: E402

from helpers.block import (  # noqa: E402
    BLOCK_PARAM_NAMES,
    block_cache_bytes,
    block_forward,
    block_manual_backward,
    block_params,
    block_saved_bytes_formula,
    layer_from_params,
)
from helpers.checks import compare  # noqa: E402
from helpers.device import randn  # noqa: E402
from helpers.memory import SavedTensors, fmt_bytes  # noqa: E402


def measure(norm_first: bool, args) -> dict:
    """Median forward and backward times of both, and the bytes each keeps for backward."""
    B, N, d, H, d_ff = args.B, args.N, args.d, args.H, args.d_ff
    params = block_params(d, d_ff, seed=0)
    layer = layer_from_params(params, H, norm_first, args.activation)
    weights = [layer.get_parameter(n) for n in BLOCK_PARAM_NAMES]
    X = randn(B, N, d, seed=100, requires_grad=True)
    grad_Y = randn(B, N, d, seed=101)
    mask = nn.Transformer.generate_square_subsequent_mask(N) if args.causal else None

    def autograd_step():
        t0 = time.perf_counter()
        Y = layer(X, src_mask=mask, is_causal=args.causal)
        t1, c1 = time.perf_counter(), time.process_time()
        grads = torch.autograd.grad(Y, [X, *weights], grad_Y)
        t2, c2 = time.perf_counter(), time.process_time()
        return (t1 - t0, t2 - t1, c2 - c1), grads

    def manual_step():
        t0 = time.perf_counter()
        Y, cache = block_forward(X, params, H, norm_first, args.causal, args.activation)
        t1, c1 = time.perf_counter(), time.process_time()
        grads = block_manual_backward(grad_Y, cache)
        t2, c2 = time.perf_counter(), time.process_time()
        return (t1 - t0, t2 - t1, c2 - c1), grads

    autograd_step(), manual_step()  # warm-up
    times = {k: [] for k in ("auto_f", "auto_b", "auto_cpu", "man_f", "man_b", "man_cpu")}
    for i in range(args.repeats):
        # alternate which goes first, so neither always runs on a warmer cache
        order = (("auto", autograd_step), ("man", manual_step))
        for tag, step in order if i % 2 == 0 else order[::-1]:
            (f, b, cpu), _ = step()
            times[tag + "_f"].append(f)
            times[tag + "_b"].append(b)
            times[tag + "_cpu"].append(cpu)
    med = {k: statistics.median(v) for k, v in times.items()}

    _, g_auto = autograd_step()
    _, g_man = manual_step()
    ok = all(
        compare(n, g_man[n], g, atol=1e-4, rtol=1e-3, quiet=True)
        for n, g in zip(["X", *BLOCK_PARAM_NAMES], g_auto)
    )

    with SavedTensors(exclude=[X, *weights]) as saved:
        layer(X, src_mask=mask, is_causal=args.causal)
    _, cache = block_forward(X, params, H, norm_first, args.causal, args.activation)
    return dict(
        norm_first=norm_first,
        ok=ok,
        **med,
        auto_bytes=saved.total_bytes,
        man_bytes=block_cache_bytes(cache),
        formula=block_saved_bytes_formula(B, N, d, H, d_ff, X.element_size(), norm_first),
    )


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--B", type=int, default=8)
    p.add_argument("--N", type=int, default=128)
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--H", type=int, default=4)
    p.add_argument("--d_ff", type=int, default=1024)
    p.add_argument("--activation", choices=("relu", "gelu"), default="relu")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"B={args.B} N={args.N} d={args.d} H={args.H} d_ff={args.d_ff} {args.activation} "
        f"causal={args.causal} float32 CPU, threads={torch.get_num_threads()}, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, {datetime.date.today()}"
    )
    print(
        f"{'placement':<10} {'auto fwd':>9} {'auto bwd':>9} {'man fwd':>9} {'man bwd':>9} "
        f"{'bwd ratio':>9} {'cpu ratio':>9} {'f+b ratio':>9} {'auto saved':>11} {'man saved':>10} {'formula':>9}  grads"
    )
    rows = []
    for norm_first in (False, True):
        r = measure(norm_first, args)
        rows.append(r)
        name = "pre-norm" if norm_first else "post-norm"
        ms = {k: 1e3 * r[k] for k in ("auto_f", "auto_b", "man_f", "man_b")}
        print(
            f"{name:<10} {ms['auto_f']:>7.1f}ms {ms['auto_b']:>7.1f}ms {ms['man_f']:>7.1f}ms "
            f"{ms['man_b']:>7.1f}ms {r['man_b'] / r['auto_b']:>8.2f}x {r['man_cpu'] / r['auto_cpu']:>8.2f}x "
            f"{(r['man_f'] + r['man_b']) / (r['auto_f'] + r['auto_b']):>8.2f}x "
            f"{fmt_bytes(r['auto_bytes']):>11} {fmt_bytes(r['man_bytes']):>10} {fmt_bytes(r['formula']):>9}"
            f"  {'equal' if r['ok'] else 'DIFFER'}"
        )
    print(
        "bwd ratio = manual backward / autograd backward, wall time (median); cpu ratio = the same in process CPU\n"
        "time (steadier on a shared machine); f+b = forward + backward, wall. Target: bwd <= 1.25x, saved <= autograd's"
    )
    return rows


if __name__ == "__main__":
    main()
