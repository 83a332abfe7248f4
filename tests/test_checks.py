import pytest
import torch

from helpers.checks import (
    compare,
    expect_bool,
    expect_int,
    expect_like,
    expect_tensor,
    max_abs_diff,
    tolerance,
)


def test_compare_exact_and_tolerant(capsys):
    a = torch.tensor([1.0, 2.0])
    assert compare("g", a, a.clone(), exact=True)
    assert not compare("g", a, a + 1e-7, exact=True)
    assert compare("g", a, a + 1e-7)
    assert not compare("g", a, a + 1e-2)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "✓ g: max|Δ| 0.0e+00 (exact)"
    assert out[1].startswith("✗ g: max|Δ| 1.2e-07 (exact)")
    assert out[3].startswith("✗")


def test_compare_shape_mismatch_is_one_line(capsys):
    assert not compare("grad_W", torch.zeros(2, 3), torch.zeros(3, 2))
    assert capsys.readouterr().out == "✗ grad_W: shape (2, 3), expected (3, 2)\n"


def test_tolerance_per_dtype():
    assert tolerance(torch.float64)[0] < tolerance(torch.float32)[0] < tolerance(torch.float16)[0]
    assert max_abs_diff([1.0, 3.0], [1.5, 2.0]) == 1.0


def test_expect_tensor_messages():
    expect_tensor("x", torch.zeros(2), shape=(2,), dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match=r"x: expected shape \(3,\), got \(2,\)"):
        expect_tensor("x", torch.zeros(2), shape=(3,))
    with pytest.raises(ValueError, match="expected a torch.Tensor, got list"):
        expect_tensor("x", [1.0])
    with pytest.raises(ValueError, match="expected dtype torch.float64"):
        expect_tensor("x", torch.zeros(2), dtype=torch.float64)


def test_expect_tensor_floating_and_like():
    expect_tensor("x", torch.zeros(2), floating=True)
    with pytest.raises(ValueError, match="x: expected a floating-point tensor, got torch.int64"):
        expect_tensor("x", torch.zeros(2, dtype=torch.long), floating=True)
    expect_like("b", torch.zeros(2), "x", torch.ones(3))
    with pytest.raises(ValueError, match="b: expected torch.float32 on cpu like x, got torch.float64 on cpu"):
        expect_like("b", torch.zeros(2, dtype=torch.float64), "x", torch.ones(3))


@pytest.mark.parametrize("v", [0, -1, 2.5, True, "3", None])
def test_expect_int_rejects(v):
    with pytest.raises(ValueError, match=r"^block_q: expected an int ≥ 1, got "):
        expect_int("block_q", v)


def test_expect_int_and_bool_accept():
    assert expect_int("r", 3, low=1, high=4) == 3
    with pytest.raises(ValueError, match=r"r: expected an int in \[1, 4\], got 5"):
        expect_int("r", 5, low=1, high=4)
    assert expect_int("steps", 0, low=0) == 0
    assert expect_bool("causal", False) is False
    with pytest.raises(ValueError, match="causal: expected True or False, got 'yes'"):
        expect_bool("causal", "yes")
