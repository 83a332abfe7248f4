"""Devices and reproducible random tensors.

Random tensors are drawn on the CPU from a fixed seed and only then moved to the
device, so CPU and CUDA runs start from the very same numbers.  TF32 is switched
off because it silently changes fp32 matmul results on Ampere+ GPUs.
"""

from __future__ import annotations

import torch

__all__ = ["get_device", "randn", "rand", "no_tf32", "describe"]


def get_device(prefer: str | None = None) -> torch.device:
    """CUDA when present (or ``prefer`` if given), else CPU."""
    if prefer is not None:
        return torch.device(prefer)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def no_tf32() -> None:
    """Make fp32 matmuls and convolutions run in true fp32 on GPUs (TF32 off)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def _shape(shape) -> tuple:
    """Accept randn(2, 3), randn((2, 3)) and randn() (a 0-d tensor)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = shape[0]
    return tuple(shape)


def _generator(seed: int) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def randn(*shape, seed: int = 0, device=None, dtype=torch.float32, requires_grad=False) -> torch.Tensor:
    """Standard-normal tensor drawn on the CPU from ``seed``, then moved to ``device``."""
    t = torch.randn(_shape(shape), generator=_generator(seed), dtype=torch.float64)
    t = t.to(device=device or "cpu", dtype=dtype)
    return t.requires_grad_(requires_grad)


def rand(*shape, seed: int = 0, device=None, dtype=torch.float32, requires_grad=False) -> torch.Tensor:
    """Uniform [0, 1) tensor drawn on the CPU from ``seed``, then moved to ``device``."""
    t = torch.rand(_shape(shape), generator=_generator(seed), dtype=torch.float64)
    t = t.to(device=device or "cpu", dtype=dtype)
    return t.requires_grad_(requires_grad)


def describe(device: torch.device) -> str:
    """One line naming the device, e.g. 'cpu' or 'cuda (NVIDIA T4, sm_75)'."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    major, minor = torch.cuda.get_device_capability(device)
    return f"cuda ({torch.cuda.get_device_name(device)}, sm_{major}{minor})"
