"""How gradients flow through a deep network (chapter 5).

* ``GradFlowRecorder`` - module hooks that record, keyed by module **name**, the
  norm of each layer's output gradient ‖∂L/∂out‖ and of each parameter's gradient
  ‖∂L/∂θ‖ (the corrected version of seed 000's ``debug_gradient_flow``, which
  stored activations keyed by module but looked them up by name).
* ``global_grad_norm`` / ``clip_grad_norm`` - the global gradient norm and clipping by it,
  written out (equals ``torch.nn.utils.clip_grad_norm_``); the course's only copy: chapter 11's
  loop clips its hand-computed gradients with ``are_grads=True``.
* ``deep_mlp`` / ``layer_grad_norms`` - a configurable deep MLP (activation,
  residual, LayerNorm, init scale) and its per-layer gradient norms on a batch.
* ``dead_relu_units`` - hidden ReLU units that output 0 for every example.

No plotting here (see ``helpers.plot_flow``); everything returns plain floats.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from helpers.checks import expect_bool, expect_tensor
from helpers.device import randn

__all__ = [
    "GradFlowRecorder",
    "record_grad_flow",
    "clip_grad_norm",
    "global_grad_norm",
    "ACTIVATIONS",
    "Block",
    "DeepMLP",
    "deep_mlp",
    "fixed_batch",
    "layer_grad_norms",
    "dead_relu_units",
]


# --------------------------------------------------------------------------- recorder


class GradFlowRecorder:
    """Record ‖∂L/∂output‖ per module name and ‖∂L/∂θ‖ per parameter name during backward.

    Use as a context manager (hooks are removed on exit) or call ``.remove()``::

        with GradFlowRecorder(model) as rec:
            loss_fn(model(X), y).backward()
        rec.output_grad_norms   # {'0': 0.41, '1': 0.23, ...}   keyed by module name
        rec.param_grad_norms    # {'0.weight': 0.12, ...}       keyed by parameter name

    ``modules``: names to watch (default: every leaf module). A forward hook puts a
    tensor hook on each output, so the gradient is seen as it flows past; parameters
    use post-accumulate-grad hooks, so the norm is that of ``.grad`` after backward.
    """

    def __init__(self, model: nn.Module, modules=None):
        """One forward hook per watched module name, one post-accumulate-grad hook per trainable parameter."""
        if not isinstance(model, nn.Module):
            raise ValueError(f"model: expected an nn.Module, got {type(model).__name__}")
        named = dict(model.named_modules())
        if modules is None:
            modules = [n for n, m in named.items() if n and not list(m.children())]
        missing = [n for n in modules if n not in named]
        if missing:
            raise ValueError(f"modules: expected names from model.named_modules(), got {missing[0]!r}")
        self.names = list(modules)
        self.output_grad_norms: dict[str, float] = {}
        self.param_grad_norms: dict[str, float] = {}
        self._handles = []
        for name in self.names:
            self._handles.append(named[name].register_forward_hook(self._forward_hook(name)))
        for pname, p in model.named_parameters():
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._param_hook(pname)))

    def _forward_hook(self, name):
        """A forward hook that puts a tensor hook on the output: records ‖∂L/∂out‖ under ``name``."""

        def hook(module, inputs, output):
            """output → output.register_hook(g ↦ store ‖g‖ under name)."""
            out = output[0] if isinstance(output, (tuple, list)) else output
            if isinstance(out, torch.Tensor) and out.requires_grad:
                # The key is the module's NAME, decided here, not the module object.
                out.register_hook(lambda g: self.output_grad_norms.__setitem__(name, g.norm().item()))

        return hook

    def _param_hook(self, pname):
        """A post-accumulate-grad hook that records ‖p.grad‖ under ``pname``."""

        def hook(p):
            """param_grad_norms[pname] = ‖p.grad‖ (after accumulation)."""
            self.param_grad_norms[pname] = p.grad.norm().item()

        return hook

    def remove(self) -> None:
        """Remove every hook this recorder registered."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        """The recorder itself; hooks are already registered."""
        return self

    def __exit__(self, *exc):
        """Remove every hook; never swallows an exception."""
        self.remove()
        return False


def record_grad_flow(model: nn.Module, X, y, loss_fn=F.cross_entropy, modules=None) -> GradFlowRecorder:
    """One forward + backward of loss_fn(model(X), y) under a recorder; returns the (removed) recorder."""
    model.zero_grad(set_to_none=True)
    with GradFlowRecorder(model, modules) as rec:
        loss_fn(model(X), y).backward()
    return rec


# --------------------------------------------------------------------------- clipping


def _grads_of(tensors, are_grads: bool) -> list:
    """The gradients to measure: each parameter's .grad (skipping None), or the tensors themselves."""
    expect_bool("are_grads", are_grads)
    tensors = list(tensors.values()) if isinstance(tensors, dict) else list(tensors)
    if are_grads:
        for i, g in enumerate(tensors):
            expect_tensor(f"grads[{i}]", g, floating=True)
        return tensors
    for i, p in enumerate(tensors):
        expect_tensor(f"params[{i}]", p)
    return [p.grad for p in tensors if p.grad is not None]


def global_grad_norm(tensors, *, are_grads: bool = False) -> torch.Tensor:
    """‖g‖ = sqrt(Σ_p ‖g_p‖²), a 0-dim tensor (0 when there is no gradient).

    ``tensors``: parameters (a list, an iterator or a dict of them), whose ``.grad`` is read; or,
    with ``are_grads=True``, the gradients themselves (chapter 11's manual mode, where no
    ``.grad`` exists).
    """
    grads = _grads_of(tensors, are_grads)
    if not grads:
        return torch.tensor(0.0)
    per_param = torch.stack([torch.linalg.vector_norm(g, 2) for g in grads])  # (P,)
    return torch.linalg.vector_norm(per_param, 2)


@torch.no_grad()
def clip_grad_norm(tensors, max_norm: float, *, are_grads: bool = False) -> torch.Tensor:
    """If ‖g‖ > max_norm, scale every gradient by max_norm / (‖g‖ + 1e-6) in place; returns ‖g‖ before clipping.

    ``tensors`` as in ``global_grad_norm``: parameters (their ``.grad`` is scaled) or, with
    ``are_grads=True``, the gradient tensors themselves.  Equals ``torch.nn.utils.clip_grad_norm_``.
    """
    if isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0:
        raise ValueError(f"max_norm: expected a number > 0 (inf: measure only), got {max_norm!r}")
    grads = _grads_of(tensors, are_grads)
    total = global_grad_norm(grads, are_grads=True)
    clip_coef = max_norm / (total + 1e-6)
    # Scaling by min(coef, 1) keeps the direction of the whole update, only its length shrinks.
    clip_coef = torch.clamp(clip_coef, max=1.0)
    for g in grads:
        g.mul_(clip_coef.to(g.device))
    return total


# --------------------------------------------------------------------------- deep MLP

ACTIVATIONS = {"sigmoid": nn.Sigmoid, "relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh}


class Block(nn.Module):
    """h ↦ act(Linear(LN(h))), plus h itself when residual: h + act(Linear(LN(h)))."""

    def __init__(self, width: int, activation: str, residual: bool, layernorm: bool):
        """LN (width) if layernorm, Linear (width → width), the activation by name, and the residual flag."""
        super().__init__()
        self.norm = nn.LayerNorm(width) if layernorm else None
        self.linear = nn.Linear(width, width)
        self.act = ACTIVATIONS[activation]()
        self.residual = residual

    def forward(self, h):
        """a = act(LN(h) Wᵀ + b); returns h + a if residual else a (no LN without layernorm)."""
        a = self.norm(h) if self.norm is not None else h
        a = self.act(self.linear(a))  # (B, width) @ (width, width).T -> (B, width)
        return h + a if self.residual else a


class DeepMLP(nn.Module):
    """X (B, width) → depth Blocks → head Linear (B, n_classes)."""

    def __init__(self, depth, width, activation, residual, layernorm, n_classes):
        """depth Blocks of width ``width``, then a head Linear (width → n_classes)."""
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, activation, residual, layernorm) for _ in range(depth))
        self.head = nn.Linear(width, n_classes)

    def forward(self, X):
        """h_0 = X, h_i = Block_i(h_{i−1}), logits = h_depth W_headᵀ + b_head."""
        h = X
        for block in self.blocks:
            h = block(h)
        return self.head(h)  # (B, width) -> (B, n_classes)


def deep_mlp(
    depth: int = 20,
    width: int = 32,
    activation: str = "relu",
    residual: bool = False,
    layernorm: bool = False,
    init_scale: float = 1.0,
    n_classes: int = 10,
    seed: int = 0,
    device=None,
) -> DeepMLP:
    """A DeepMLP with W ~ init_scale · N(0, 1/fan_in), b = 0, drawn on the CPU from ``seed``."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {sorted(ACTIVATIONS)}, got {activation!r}")
    if depth < 1 or width < 1:
        raise ValueError(f"depth, width: expected positive integers, got {depth}, {width}")
    model = DeepMLP(depth, width, activation, residual, layernorm, n_classes)
    with torch.no_grad():
        linears = [b.linear for b in model.blocks] + [model.head]
        for i, lin in enumerate(linears):
            fan_in = lin.weight.shape[1]
            lin.weight.copy_(init_scale * randn(*lin.weight.shape, seed=seed + i) / math.sqrt(fan_in))
            lin.bias.zero_()
    return model.to(device or "cpu")


def fixed_batch(batch: int = 64, width: int = 32, n_classes: int = 10, seed: int = 1000, device=None):
    """X ~ N(0, 1) of shape (batch, width) and labels y = i mod n_classes: the same batch everywhere."""
    X = randn(batch, width, seed=seed, device=device)
    y = torch.arange(batch, device=device or "cpu") % n_classes
    return X, y


def layer_grad_norms(model: DeepMLP, X, y, which: str = "weight") -> list[float]:
    """Per block, input side first: ‖∂L/∂W_i‖ (which='weight') or ‖∂L/∂h_i‖ (which='output'), L = CE."""
    if which not in ("weight", "output"):
        raise ValueError(f"which: expected 'weight' or 'output', got {which!r}")
    names = [f"blocks.{i}" for i in range(len(model.blocks))]
    rec = record_grad_flow(model, X, y, modules=names)
    if which == "output":
        return [rec.output_grad_norms[n] for n in names]
    return [rec.param_grad_norms[f"{n}.linear.weight"] for n in names]


# --------------------------------------------------------------------------- dead ReLUs


@torch.no_grad()
def dead_relu_units(model: nn.Module, X) -> dict[str, tuple[int, int]]:
    """Per nn.ReLU (by name): (units that output 0 on every row of X, units).

    Such a unit is dead *on X*: its own weight row and bias get no gradient from these rows
    (it may be alive on other inputs, and earlier layers can still change its input).
    """
    counts, handles = {}, []
    for name, m in model.named_modules():
        if isinstance(m, nn.ReLU):

            def hook(module, inputs, output, name=name):
                """counts[name] = (#units with output 0 on every row, #units)."""
                a = output.reshape(-1, output.shape[-1])  # (rows, units)
                counts[name] = (int((a == 0).all(dim=0).sum().item()), a.shape[-1])

            handles.append(m.register_forward_hook(hook))
    try:
        model(X)
    finally:
        for h in handles:
            h.remove()
    return counts
