"""Comparing our gradients with PyTorch's: exact vs allclose, said out loud.

``compare`` prints one line with the largest difference and the tolerance used.
The difference itself is round-off, so it may differ between CPU and CUDA; the
line keeps it in a fixed ``max|Δ| <number>`` form that the nbval sanitizer
replaces, while the verdict (✓/✗) and the tolerance stay checked.
"""

from __future__ import annotations

import torch

__all__ = [
    "DEFAULT_TOL",
    "tolerance",
    "close",
    "max_abs_diff",
    "compare",
    "expect_tensor",
    "expect_like",
    "expect_int",
    "expect_bool",
]

# (atol, rtol) per dtype, for O(1) values summed in a different order (CPU vs CUDA, ours vs
# autograd). float32: atol 1e-5 is 84 ulps at 1.0, rtol 1e-4 is 840 ulps. float64: round-off is
# ~1e-15, so 1e-10 (about 4.5e5 ulps at 1.0) is loose on purpose; it still fails any real bug,
# whose errors are O(1), and the printed max|Δ| shows how far inside it a result lands.
# float16/bfloat16: a few ulps of their 10 and 7 mantissa bits.
DEFAULT_TOL = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (1e-5, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}


def tolerance(
    dtype: torch.dtype, atol: float | None = None, rtol: float | None = None
) -> tuple[float, float]:
    """(atol, rtol) for comparing tensors of ``dtype``: the ones given, else the dtype's defaults."""
    d_atol, d_rtol = DEFAULT_TOL.get(dtype, DEFAULT_TOL[torch.float32])
    return (d_atol if atol is None else atol), (d_rtol if rtol is None else rtol)


def close(ours, ref, atol: float, rtol: float, equal_nan: bool = False) -> torch.Tensor:
    """Elementwise ours ≈ ref: equal (inf = inf), or both finite and |ours − ref| ≤ atol + rtol·|ref|.

    The one tolerance rule of the course (``compare`` here, the labs' ``helpers.labcheck``);
    computed in float64 on the CPU.  ``equal_nan=True`` counts NaN against NaN as equal.
    """
    a = torch.as_tensor(ours).detach().to("cpu", torch.float64)
    b = torch.as_tensor(ref).detach().to("cpu", torch.float64)
    # The finiteness test keeps 1 vs inf from passing as |1 − inf| = inf ≤ rtol·inf = inf.
    ok = (a == b) | (torch.isfinite(a) & torch.isfinite(b) & ((a - b).abs() <= atol + rtol * b.abs()))
    if equal_nan:
        ok |= torch.isnan(a) & torch.isnan(b)
    return ok


def max_abs_diff(a, b) -> float:
    """max |a - b| computed in float64 on the CPU."""
    a = torch.as_tensor(a).detach().to("cpu", torch.float64)
    b = torch.as_tensor(b).detach().to("cpu", torch.float64)
    return (a - b).abs().max().item() if a.numel() else 0.0


def expect_tensor(name: str, x, shape=None, dtype=None, device=None, floating: bool = False) -> None:
    """Raise a one-line ValueError unless ``x`` is a tensor of the expected shape/dtype/device.

    ``floating=True`` also demands a floating dtype (float16/bfloat16/float32/float64).
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if dtype is not None and x.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {x.dtype}")
    if floating and not x.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    if device is not None and x.device.type != torch.device(device).type:
        raise ValueError(f"{name}: expected device {torch.device(device).type}, got {x.device.type}")


def expect_like(name: str, x, ref_name: str, ref: torch.Tensor) -> None:
    """Raise a one-line ValueError unless tensor ``x`` has ``ref``'s dtype and device (torch would fail later)."""
    expect_tensor(name, x)
    if x.dtype != ref.dtype or x.device != ref.device:
        raise ValueError(
            f"{name}: expected {ref.dtype} on {ref.device} like {ref_name}, got {x.dtype} on {x.device}"
        )


def expect_int(name: str, v, low: int = 1, high: int | None = None) -> int:
    """Return ``v`` if it is an int (not a bool) with low ≤ v (≤ high); else a one-line ValueError."""
    if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v > high):
        want = f"an int ≥ {low}" if high is None else f"an int in [{low}, {high}]"
        raise ValueError(f"{name}: expected {want}, got {v!r}")
    return v


def expect_bool(name: str, v) -> bool:
    """Return ``v`` if it is a bool (``causal='yes'`` is a mistake, not True); else a one-line ValueError."""
    if not isinstance(v, bool):
        raise ValueError(f"{name}: expected True or False, got {v!r}")
    return v


def compare(
    name: str,
    ours,
    ref,
    atol: float | None = None,
    rtol: float | None = None,
    exact: bool = False,
    quiet: bool = False,
) -> bool:
    """Print '✓/✗ name: max|Δ| d (tolerance)' and return whether ours ≈ ref.

    ``exact=True`` demands bit equality (used where both sides do the same
    float operations in the same order); otherwise ``|ours - ref| <= atol + rtol*|ref|``
    elementwise, with defaults from the dtype (``tolerance``).
    """
    ours_t = torch.as_tensor(ours).detach()
    ref_t = torch.as_tensor(ref).detach()
    if tuple(ours_t.shape) != tuple(ref_t.shape):
        if not quiet:
            print(f"✗ {name}: shape {tuple(ours_t.shape)}, expected {tuple(ref_t.shape)}")
        return False
    diff = max_abs_diff(ours_t, ref_t)
    if exact:
        ok = diff == 0.0
        rule = "exact"
    else:
        atol, rtol = tolerance(ref_t.dtype, atol, rtol)
        ok = bool(close(ours_t, ref_t, atol, rtol).all())
        rule = f"atol {atol:g}, rtol {rtol:g}"
    if not quiet:
        print(f"{'✓' if ok else '✗'} {name}: max|Δ| {diff:.1e} ({rule})")
    return ok
