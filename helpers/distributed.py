"""Gradients across processes: data parallelism on one CPU with torch.distributed (chapter 11).

``data_parallel_grads(world_size=2)`` starts ``world_size`` processes (a fork server, backend
gloo, ``MASTER_ADDR=127.0.0.1`` and a free port).  The full batch (X, y) is split in equal
shards, one per rank.  Each rank

1. computes the gradient of the mean loss over its own shard, ``g_r = ∇ (1/b) Σ_{i∈shard r} ℓ_i``;
2. ``all_reduce(SUM)`` gives Σ_r g_r on every rank; dividing by the world size R gives
   (1/R) Σ_r g_r = ∇ (1/(Rb)) Σ_i ℓ_i, the full-batch gradient (shards of equal size b);
3. does the same with ``DistributedDataParallel``, which averages for us (bucketed all-reduce
   launched from autograd hooks during backward);
4. takes a few SGD steps with DDP, so that the parameters on the ranks can be compared.

Rank 0 (and every rank, for the parameter check) writes its results to a temporary file that
the parent reads back, so the notebook prints them with ``show``/``compare``.  Everything runs
in float64 on the CPU: the comparisons are then about the algorithm, not round-off.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.device import randn

__all__ = ["free_port", "make_model", "make_batch", "full_batch_grads", "shard", "data_parallel_grads"]


def free_port() -> int:
    """A TCP port that was free a moment ago: bind to port 0 and let the OS choose."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(d_in: int = 6, d_hidden: int = 16, d_out: int = 3, seed: int = 0) -> nn.Module:
    """The same small MLP ``Linear → tanh → Linear`` (float64) in every process, from ``seed``."""
    model = nn.Sequential(nn.Linear(d_in, d_hidden), nn.Tanh(), nn.Linear(d_hidden, d_out)).double()
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.copy_(0.5 * randn(*p.shape, seed=seed + i, dtype=torch.float64))
    return model


def make_batch(B: int = 16, d_in: int = 6, d_out: int = 3, seed: int = 100):
    """The full batch: X (B, d_in) float64 and integer class labels y (B,)."""
    X = randn(B, d_in, seed=seed, dtype=torch.float64)
    y = torch.arange(B) % d_out
    return X, y


def full_batch_grads(model: nn.Module, X, y) -> dict:
    """∇ of the mean cross-entropy over the whole batch, one process: {name: grad}."""
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(X), y).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def shard(X, y, rank: int, world_size: int):
    """Rank r's contiguous shard (B/R rows) of the batch; B must be a multiple of R."""
    B = X.shape[0]
    if B % world_size:
        raise ValueError(f"shard: expected a batch size divisible by world_size {world_size}, got {B}")
    b = B // world_size
    return X[rank * b : (rank + 1) * b], y[rank * b : (rank + 1) * b]


def _worker(rank: int, world_size: int, port: int, out_dir: str, cfg: dict) -> None:
    """One process: shard gradient, manual all_reduce, DDP gradient, a few DDP SGD steps."""
    torch.set_num_threads(1)  # R processes share the cores
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    # A timeout turns a stuck rendezvous or collective into an error instead of a hang.
    dist.init_process_group(
        "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=cfg["timeout_s"])
    )
    try:
        X, y = make_batch(cfg["B"], cfg["d_in"], cfg["d_out"])
        X_r, y_r = shard(X, y, rank, world_size)
        out = {"shard_rows": X_r.shape[0]}

        # 1-2. By hand: the gradient of this shard's mean loss, then all_reduce.
        model = make_model(cfg["d_in"], cfg["d_hidden"], cfg["d_out"])
        g_shard = full_batch_grads(model, X_r, y_r)
        g_sum = {n: g.clone() for n, g in g_shard.items()}
        for g in g_sum.values():
            dist.all_reduce(g, op=dist.ReduceOp.SUM)  # every rank now holds Σ_r g_r
        out["shard_grads"] = g_shard
        out["allreduce_sum"] = g_sum
        out["allreduce_mean"] = {n: g / world_size for n, g in g_sum.items()}

        # 3. DistributedDataParallel: the same averaging, done by hooks during backward.
        ddp = DDP(make_model(cfg["d_in"], cfg["d_hidden"], cfg["d_out"]))
        F.cross_entropy(ddp(X_r), y_r).backward()
        out["ddp_grads"] = {n: p.grad.detach().clone() for n, p in ddp.module.named_parameters()}

        # 4. A few SGD steps through DDP: every rank applies the same averaged gradient.
        opt = torch.optim.SGD(ddp.parameters(), lr=cfg["lr"])
        for _ in range(cfg["steps"]):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(X_r), y_r).backward()
            opt.step()
        out["ddp_params"] = {n: p.detach().clone() for n, p in ddp.module.named_parameters()}
        torch.save(out, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def data_parallel_grads(
    world_size: int = 2,
    B: int = 16,
    d_in: int = 6,
    d_hidden: int = 16,
    d_out: int = 3,
    steps: int = 3,
    lr: float = 0.5,
    start_method: str | None = None,
    timeout_s: float = 60.0,
) -> dict:
    """Run the R-process experiment; returns {'ranks': [per-rank results], 'full': single-process reference}.

    ``full`` holds the full-batch gradient and the parameters after ``steps`` single-process SGD
    steps on the full batch, computed here in the parent for comparison.  ``start_method``:
    'forkserver' where the OS has it, else 'spawn'.  Not 'fork': a Jupyter kernel runs several
    threads, and a fork of a multi-threaded process can deadlock in the child (a lock held by
    another thread at the moment of the fork is never released); the fork server is a fresh
    single-threaded process that imports torch once and forks every rank from there.  Ranks
    still running after ``timeout_s`` are killed and the run is tried once more on a new port;
    a second timeout raises ``TimeoutError``.
    """
    import torch.multiprocessing as mp

    if world_size < 1 or B % world_size:
        raise ValueError(f"data_parallel_grads: expected world_size >= 1 dividing B={B}, got {world_size}")
    # The single-process reference, computed here in the parent.
    X, y = make_batch(B, d_in, d_out)
    model = make_model(d_in, d_hidden, d_out)
    full = {"grads": full_batch_grads(model, X, y)}
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(X), y).backward()
        opt.step()
    full["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}

    cfg = dict(B=B, d_in=d_in, d_hidden=d_hidden, d_out=d_out, steps=steps, lr=lr, timeout_s=timeout_s)
    if start_method is None:
        start_method = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
    if start_method == "forkserver":
        # The server imports torch once; every rank is then a fork of that single-threaded process.
        mp.set_forkserver_preload(["helpers.distributed"])
    try:
        return _run_ranks(world_size, start_method, cfg, full)
    except TimeoutError:
        # A port chosen by free_port() can be taken by another program before rank 0 binds it,
        # and the ranks then wait for each other until the timeout: once more, on a new port.
        return _run_ranks(world_size, start_method, cfg, full)


def _run_ranks(world_size: int, start_method: str, cfg: dict, full: dict) -> dict:
    """Start the ranks on a fresh port, wait at most cfg['timeout_s'], read their results back."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _worker,
            args=(world_size, free_port(), out_dir, cfg),
            nprocs=world_size,
            join=False,
            start_method=start_method,
        )
        deadline = time.monotonic() + cfg["timeout_s"]
        while not ctx.join(timeout=0.2):  # raises if a rank raised
            if time.monotonic() > deadline:
                for proc in ctx.processes:
                    if proc.is_alive():
                        proc.kill()
                raise TimeoutError(f"data_parallel_grads: ranks still running after {cfg['timeout_s']:g} s")
        ranks = [torch.load(Path(out_dir) / f"rank{r}.pt") for r in range(world_size)]
    return {"ranks": ranks, "full": full, "world_size": world_size}
