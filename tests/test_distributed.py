"""Data parallelism with gloo on one CPU: all_reduce and DDP give the full-batch gradient."""

import pytest
import torch

from helpers.checks import max_abs_diff
from helpers.distributed import data_parallel_grads, free_port, make_batch, shard

TOL = 1e-12  # float64: the two sides differ only in the order of a handful of additions


@pytest.fixture(scope="module")
def result():
    return data_parallel_grads(world_size=2)


def test_allreduce_mean_is_full_batch_gradient(result):
    full = result["full"]["grads"]
    for rank in result["ranks"]:
        for name, g in full.items():
            assert max_abs_diff(rank["allreduce_mean"][name], g) < TOL


def test_shards_differ_and_sum_is_world_size_times_mean(result):
    r0, r1 = result["ranks"]
    full = result["full"]["grads"]
    assert r0["shard_rows"] == r1["shard_rows"] == 8
    for name, g in full.items():
        assert max_abs_diff(r0["shard_grads"][name], r1["shard_grads"][name]) > 1e-3
        assert max_abs_diff(r0["shard_grads"][name], g) > 1e-4  # one shard is not enough
        # The classic mistake: forgetting to divide by the world size doubles the gradient.
        assert max_abs_diff(r0["allreduce_sum"][name], 2 * g) < TOL


def test_ddp_gradient_is_full_batch_gradient(result):
    full = result["full"]["grads"]
    for rank in result["ranks"]:
        for name, g in full.items():
            assert max_abs_diff(rank["ddp_grads"][name], g) < TOL


def test_ddp_steps_keep_ranks_identical_and_match_one_process(result):
    r0, r1 = result["ranks"]
    for name, p in result["full"]["params"].items():
        assert torch.equal(r0["ddp_params"][name], r1["ddp_params"][name])
        assert max_abs_diff(r0["ddp_params"][name], p) < TOL


def test_free_port_and_shard_checks():
    assert 0 < free_port() < 65536
    X, y = make_batch(6)
    with pytest.raises(ValueError):
        shard(X, y, 0, 4)
    with pytest.raises(ValueError):
        data_parallel_grads(world_size=3, B=16)


@pytest.mark.slow
def test_spawn_start_method_gives_the_same():
    """'spawn' (each rank a fresh interpreter, as on macOS/Windows) computes the same thing."""
    res = data_parallel_grads(world_size=2, start_method="spawn", timeout_s=300)
    full = res["full"]["grads"]
    for name, g in full.items():
        assert max_abs_diff(res["ranks"][1]["ddp_grads"][name], g) < TOL
