"""Reproducible printing: the only way the course prints numbers.

Every gradient in the book goes through ``fmt``/``show`` so that the text is the
same on CPU and CUDA, in float32 or float64: fixed decimals, no ``-0.0000``,
no ``device=`` or ``grad_fn=`` noise.  nbval compares this text bit for bit.
"""

from __future__ import annotations

import math

import torch

__all__ = ["fmt", "fmt_scalar", "fmt_sci", "fmt_sig", "show", "varies"]


def _format(v, spec: str) -> str:
    """format(v, spec) for one float, with nan/inf spelled out and a rounded -0 printed as 0."""
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    s = format(v, spec)
    return s[1:] if s.startswith("-") and float(s) == 0.0 else s


def fmt_scalar(v: float, decimals: int = 4) -> str:
    """One number with a fixed number of decimals; a rounded -0 prints as 0."""
    return _format(v, f".{decimals}f")


def fmt_sci(v, digits: int = 1) -> str:
    """One number as m.dde±XX with ``digits`` after the point (1.2e-07); a -0 prints as 0.0e+00.

    For values spanning many decades (gradient norms, finite-difference errors). Only
    numbers that are the same on every device belong here: round-off (a max|Δ|) goes
    through ``helpers.checks.compare``, timings through ``varies``.
    """
    return _format(v, f".{digits}e")


def fmt_sig(v, digits: int = 6, zeros: bool = False) -> str:
    """One number with ``digits`` significant digits (0.4, -0.923077, 1.5e-07); a rounded -0 prints as 0.
    With ``zeros``, trailing zeros are kept (1.21015270 beside 1.21015268, not 1.2101527).

    For messages that quote a value (the labs' "got 0.4, expected -0.9"), not for tables.
    """
    return _format(v, f"{'#' if zeros else ''}.{digits}g")


def _rows(values, decimals, width, edge):
    """Format a nested list of floats, eliding the middle of long dimensions."""
    if not isinstance(values, list):
        return fmt_scalar(values, decimals).rjust(width)
    items = values
    if edge and len(items) > 2 * edge:
        items = items[:edge] + ["..."] + items[-edge:]
    parts = ["...".rjust(width) if it == "..." else _rows(it, decimals, width, edge) for it in items]
    if values and isinstance(values[0], list):
        return "[" + (",\n" + " ").join(p.replace("\n", "\n ") for p in parts) + "]"
    return "[" + ", ".join(parts) + "]"


def fmt(x, decimals: int = 4, edge: int = 4) -> str:
    """Text of a tensor, array, list or number: fixed decimals, same on every device.

    Dimensions longer than ``2 * edge`` show their first and last ``edge`` entries.
    """
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return fmt_scalar(x, decimals)
    t = torch.as_tensor(x).detach().to("cpu", torch.float64)
    if t.dim() == 0:
        return fmt_scalar(t.item(), decimals)
    values = t.tolist()
    flat = t.flatten().tolist()
    width = max(len(fmt_scalar(v, decimals)) for v in flat) if flat else 1
    return _rows(values, decimals, width, edge)


def show(name: str, x, decimals: int = 4, edge: int = 4) -> None:
    """Print ``name = value`` (scalars) or ``name (shape)`` then the values (tensors)."""
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        print(f"{name} = {fmt_scalar(x, decimals)}")
        return
    t = torch.as_tensor(x)
    if t.dim() == 0:
        print(f"{name} = {fmt_scalar(t.item(), decimals)}")
        return
    print(f"{name} {tuple(t.shape)}")
    print(fmt(t, decimals, edge))


def varies(text: str) -> None:
    """Print a line that legitimately varies between runs (timings): '[this run] text'.

    The nbval sanitizer replaces the rest of a line starting with '[this run]', so such lines never make
    a notebook test flaky, and readers can tell measured-here numbers apart.
    """
    print(f"[this run] {text}")
