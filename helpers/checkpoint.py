"""Where backward's memory goes: activation bytes and gradient checkpointing (chapter 9).

Two pieces (mixed precision, the chapter's third, is ``helpers.precision``):

* ``activation_bytes_formula`` - the bytes autograd keeps for backward in a stack of
  ``nn.TransformerEncoderLayer(norm_first=True, dropout=0)`` blocks (chapter 7's TinyGPT), term
  by term, as measured with ``helpers.memory.SavedTensors`` on PyTorch's CPU kernels;
* ``Checkpoint`` / ``checkpoint`` - gradient checkpointing by hand: the forward runs under
  ``torch.no_grad`` and keeps only the block's input; backward re-runs the forward with grad on
  and takes the vector-Jacobian product with ``torch.autograd.grad``.  The RNG state is saved
  before the forward and restored for the re-run, so dropout draws the same mask twice; the
  ``torch.autocast`` settings are recorded too and re-entered for the re-run (backward runs
  outside the caller's autocast region, so without them the re-run would be in float32 and
  differentiate another function than the one that produced the output).

Why the parameters are explicit inputs of ``Checkpoint``: autograd asks a Function for gradients
of its *inputs* only.  A block whose weights are captured inside ``fn`` (a closure, a module's
attributes) looks to autograd like a function of ``x`` alone, so its weight gradients are never
produced: they stay ``None`` and the optimizer silently skips those weights.  Passed as inputs,
they come out of ``backward`` like ``grad_x`` does, and the Function works with both
``L.backward()`` and ``torch.autograd.grad``.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.func import functional_call

from helpers.checks import expect_int, expect_tensor

__all__ = [
    # memory
    "block_activation_bytes",
    "activation_bytes_formula",
    # checkpointing
    "RNGState",
    "get_rng_state",
    "set_rng_state",
    "AutocastState",
    "get_autocast_state",
    "autocast_from",
    "recompute_backward",
    "Checkpoint",
    "checkpoint",
    "checkpoint_module",
    "checkpoint_sequential",
]


# --------------------------------------------------------------------------- activation bytes


def block_activation_bytes(
    B: int,
    N: int,
    d: int,
    H: int,
    d_ff: int,
    bytes: int,
    attention: str = "fused",
    activation: str = "gelu",
) -> int:
    """One pre-norm block: B·N·(8d + H + 4 + 2d_ff)·bytes (fused SDPA, GELU).

    Math attention keeps 10d + H·N per token instead of 8d + H.
    """
    sizes = {"B": B, "N": N, "d": d, "H": H, "d_ff": d_ff, "bytes": bytes}
    for name, v in sizes.items():
        expect_int(name, v)
    if attention not in ("fused", "math"):
        raise ValueError(f"attention: expected 'fused' or 'math', got {attention!r}")
    if activation not in ("gelu", "relu"):
        raise ValueError(f"activation: expected 'gelu' or 'relu', got {activation!r}")
    # Elements kept per token, op by op (as SavedTensors(by_op=True) lists a block):
    ln1 = d + 2  # LayerNorm 1: its input X (the block input), μ and 1/σ
    in_proj = d  # in_proj: its input, LN1's output
    if attention == "fused":
        # SDPA kernel: Q, K, V (views of one packed (B, N, 3d) storage: 3d), its output
        # O (d), the row log-sum-exp (H); out_proj's input is O merged back, the same
        # storage.
        attn = 3 * d + d + H
    else:
        # Math path: Q·√scale and Kᵀ·√scale (two copies, d each), V (a view that keeps
        # the whole packed QKV storage alive, 3d), P (H·N per token: the N² term), the
        # merged output (d).
        attn = d + d + 3 * d + H * N + d
    ln2 = d + 2  # LayerNorm 2: its input X1 = X + SA(..), μ and 1/σ
    linear1 = d  # linear1: its input, LN2's output
    # GELU keeps its input, linear2 its input (the GELU output): two tensors.  ReLU
    # keeps its output, which is linear2's input too: one tensor.
    ffn = 2 * d_ff if activation == "gelu" else d_ff
    return B * N * (ln1 + in_proj + attn + ln2 + linear1 + ffn) * bytes


def activation_bytes_formula(
    B: int,
    N: int,
    d: int,
    H: int,
    n_layers: int,
    d_ff: int,
    bytes: int,
    attention: str = "fused",
    activation: str = "gelu",
    head: bool = False,
) -> int:
    """n_layers · B·N·(8d + H + 4 + 2d_ff)·bytes for the block stack (+ B·N·((2d + 2)·bytes + 8) with head=True).

    Exact (not approximated) for ``nn.TransformerEncoderLayer(norm_first=True, dropout=0.0)`` blocks
    measured with ``SavedTensors`` on PyTorch's CPU kernels, parameters excluded.  ``head=True``
    adds TinyGPT's ends: the int64 token ids (8 bytes each, the embedding's backward needs them),
    ln_f's input, μ, 1/σ and the head's input.  Not covered: dropout > 0 (masks), and CUDA's SDPA
    kernels, whose own bookkeeping (log-sum-exp layout, dropout seed) may differ from the CPU
    kernel's (B, H, N) log-sum-exp (not measured here).
    """
    expect_int("n_layers", n_layers)
    total = n_layers * block_activation_bytes(B, N, d, H, d_ff, bytes, attention, activation)
    if head:
        total += B * N * ((2 * d + 2) * bytes + 8)
    return total


# --------------------------------------------------------------------------- RNG state


@dataclass(frozen=True)
class RNGState:
    """The CPU generator's state and the CUDA generators' states (by device index), taken before a forward."""

    cpu: torch.Tensor
    cuda: tuple = ()  # ((device index, state), ...)


def _cuda_indices(tensors) -> list[int]:
    return sorted({t.device.index or 0 for t in tensors if isinstance(t, torch.Tensor) and t.is_cuda})


def get_rng_state(tensors=()) -> RNGState:
    """RNGState of the CPU and of every CUDA device any of ``tensors`` lives on."""
    cuda = tuple((i, torch.cuda.get_rng_state(i)) for i in _cuda_indices(tensors))
    return RNGState(torch.get_rng_state(), cuda)


def set_rng_state(state: RNGState) -> None:
    """Put the CPU and CUDA generators back to ``state`` (the next random draws repeat)."""
    if not isinstance(state, RNGState):
        raise ValueError(f"set_rng_state: expected an RNGState, got {type(state).__name__}")
    torch.set_rng_state(state.cpu)
    for i, s in state.cuda:
        torch.cuda.set_rng_state(s, i)


# --------------------------------------------------------------------------- autocast state


@dataclass(frozen=True)
class AutocastState:
    """torch.autocast's settings at forward time: ((device_type, enabled, dtype), ...) and the cast cache flag."""

    devices: tuple = ()  # (("cpu", False, torch.bfloat16), ("cuda", True, torch.float16), ...)
    cache_enabled: bool = True


def _autocast_device_types() -> list[str]:
    # torch.autocast("cuda", ...) warns on a machine without CUDA; only record it where it exists.
    return ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]


def get_autocast_state() -> AutocastState:
    """AutocastState of the CPU (and CUDA, if present): is autocast on, and to which dtype."""
    devices = tuple((dt, *_autocast_of(dt)) for dt in _autocast_device_types())
    return AutocastState(devices, torch.is_autocast_cache_enabled())


def _autocast_of(device_type: str) -> tuple[bool, torch.dtype]:
    """(enabled, dtype) of autocast on ``device_type``; torch < 2.4 has only per-device functions."""
    try:
        return torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)
    except TypeError:  # torch 2.1-2.3
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()


def autocast_from(state: AutocastState | None) -> ExitStack:
    """A context that re-enters torch.autocast(device_type, dtype, enabled) for each device in ``state``."""
    stack = ExitStack()
    if state is None:
        return stack
    if not isinstance(state, AutocastState):
        raise ValueError(f"autocast_from: expected an AutocastState, got {type(state).__name__}")
    for device_type, enabled, dtype in state.devices:
        # enabled=False is entered too: a backward called inside someone else's autocast region
        # must not cast a re-run whose forward was not cast.
        stack.enter_context(
            torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=state.cache_enabled)
        )
    return stack


# --------------------------------------------------------------------------- checkpointing


def recompute_backward(
    fn,
    x,
    params,
    grad_y,
    rng_state: RNGState | None = None,
    needs=None,
    autocast_state: AutocastState | None = None,
):
    """Re-run y = fn(x, *params) with grad on (RNG, autocast restored); VJP with grad_y.

    Returns (grad_x, [grad_θ]).  ``needs`` (one bool for x, then one per parameter, like
    ``ctx.needs_input_grad``) says which gradients to compute; the others are ``None``.
    """
    params = list(params)
    needs = tuple(needs) if needs is not None else (True,) * (1 + len(params))
    if len(needs) != 1 + len(params):
        raise ValueError(f"needs: expected {1 + len(params)} flags, got {len(needs)}")
    # Fresh leaves that share memory with x and θ: the re-run builds a small local graph
    # from them, which autograd.grad walks once and frees.
    x_ = x.detach().requires_grad_(bool(needs[0]))
    ps = [p.detach().requires_grad_(bool(n)) for p, n in zip(params, needs[1:])]
    devices = [i for i, _ in rng_state.cuda] if rng_state is not None else []
    # fork_rng: the re-run's draws must not advance the RNG the rest of training uses.
    with torch.random.fork_rng(devices=devices, enabled=rng_state is not None):
        if rng_state is not None:
            set_rng_state(rng_state)
        with torch.enable_grad(), autocast_from(autocast_state):
            y = fn(x_, *ps)
    wrt = [t for t, n in zip([x_, *ps], needs) if n]
    got = iter(torch.autograd.grad(y, wrt, grad_y, allow_unused=True) if wrt else ())
    grads = [next(got) if n else None for n in needs]
    return grads[0], grads[1:]


class Checkpoint(torch.autograd.Function):
    """y = fn(x, *params) keeping only x (and the params); backward recomputes fn."""

    @staticmethod
    def forward(fn, rng_state, autocast_state, x, *params):
        with torch.no_grad():  # no graph: fn's intermediate tensors are freed at once
            return fn(x, *params)

    @staticmethod
    def setup_context(ctx, inputs, output):
        fn, rng_state, autocast_state, x, *params = inputs
        # non-tensors live on ctx
        ctx.fn, ctx.rng_state, ctx.autocast_state = fn, rng_state, autocast_state
        ctx.save_for_backward(x, *params)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y):
        x, *params = ctx.saved_tensors
        needs = ctx.needs_input_grad[3:]
        grad_x, grad_params = recompute_backward(
            ctx.fn, x, params, grad_y, ctx.rng_state, needs, ctx.autocast_state
        )
        return (None, None, None, grad_x, *grad_params)


def checkpoint(fn, x, *params, preserve_rng_state: bool = True):
    """y = fn(x, *params) with gradient checkpointing; fn must use the params it is given, not captured ones."""
    expect_tensor("x", x, floating=True)
    if not callable(fn):
        raise ValueError(f"checkpoint: expected a callable fn, got {type(fn).__name__}")
    for i, p in enumerate(params):
        expect_tensor(f"params[{i}]", p)
    # Both taken here, before the forward: the RNG before dropout draws, autocast as the caller set it.
    rng_state = get_rng_state([x, *params]) if preserve_rng_state else None
    return Checkpoint.apply(fn, rng_state, get_autocast_state(), x, *params)


def checkpoint_module(module: nn.Module, x, preserve_rng_state: bool = True, **kwargs):
    """module(x, **kwargs) checkpointed: its parameters become explicit inputs via torch.func.functional_call."""
    if not isinstance(module, nn.Module):
        raise ValueError(f"checkpoint_module: expected an nn.Module, got {type(module).__name__}")
    names, params = zip(*module.named_parameters()) if any(True for _ in module.parameters()) else ((), ())

    def fn(x, *ps):
        return functional_call(module, dict(zip(names, ps)), (x,), kwargs)

    return checkpoint(fn, x, *params, preserve_rng_state=preserve_rng_state)


def checkpoint_sequential(blocks, x, preserve_rng_state: bool = True, **kwargs):
    """x_l = block_l(x_{l−1}, **kwargs) for every block, each checkpointed: backward keeps one input per block."""
    blocks = list(blocks)
    if not all(isinstance(b, nn.Module) for b in blocks):
        raise ValueError("checkpoint_sequential: expected an iterable of nn.Module blocks")
    for block in blocks:
        x = checkpoint_module(block, x, preserve_rng_state, **kwargs)
    return x
