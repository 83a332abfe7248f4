import pytest
import torch

from helpers.device import describe, get_device, no_tf32, rand, randn


def test_randn_is_reproducible_and_dtype_independent():
    a = randn(3, 4, seed=1)
    b = randn(3, 4, seed=1, dtype=torch.float64)
    assert torch.equal(a, randn(3, 4, seed=1))
    assert torch.equal(a, b.float())
    assert not torch.equal(a, randn(3, 4, seed=2))


def test_rand_requires_grad_and_range():
    r = rand(5, seed=0, requires_grad=True)
    assert r.requires_grad and r.is_leaf and float(r.min()) >= 0 and float(r.max()) < 1


def test_get_device_and_describe():
    assert get_device("cpu").type == "cpu"
    assert get_device().type in ("cpu", "cuda")
    assert describe(torch.device("cpu")) == "cpu"


def test_no_tf32_sets_highest_precision():
    no_tf32()
    assert torch.get_float32_matmul_precision() == "highest"
    assert torch.backends.cuda.matmul.allow_tf32 is False


@pytest.mark.gpu
def test_cuda_draw_equals_cpu_draw():
    assert torch.equal(randn(8, seed=3, device="cuda").cpu(), randn(8, seed=3))


def test_shapes_as_tuple_or_empty():
    assert randn(seed=0).shape == ()
    assert torch.equal(randn((2, 3), seed=4), randn(2, 3, seed=4))
