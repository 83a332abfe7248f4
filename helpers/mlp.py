"""An MLP built only from chapter 4's Functions, and the same network from torch's modules (chapter 4).

``MLP(sizes)`` runs ``linear → (layer_norm) → relu/gelu`` per hidden layer, then ``linear``, all
from ``helpers.functions``; ``to_sequential()`` copies its parameters into an ``nn.Sequential`` of
``nn.Linear`` / ``nn.LayerNorm`` / ``nn.ReLU`` / ``nn.GELU``, and ``param_pairs`` lines the two
up, so a test (or the chapter) compares every gradient with autograd's.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from helpers.functions import gelu, layer_norm, linear, relu

__all__ = ["MLP"]


class MLP(nn.Module):
    """sizes (d0, ..., dL): [Linear → (LayerNorm) → act] per hidden layer, then Linear; our Functions only."""

    def __init__(self, sizes, activation="relu", layer_norm=False, seed=0, dtype=torch.float32, device=None):
        """W_i ~ U(−1/√d_in, 1/√d_in) (out, in), b_i likewise, drawn in float64 from seed; LN γ = 1, β = 0."""
        super().__init__()
        if len(sizes) < 2 or activation not in ("relu", "gelu", "gelu_tanh"):
            raise ValueError(
                f"MLP: expected >= 2 sizes and activation relu|gelu|gelu_tanh, got {sizes}, {activation!r}"
            )
        self.sizes, self.activation, self.use_layer_norm = tuple(sizes), activation, layer_norm
        g = torch.Generator().manual_seed(seed)
        self.weights, self.biases = nn.ParameterList(), nn.ParameterList()
        self.ln_weights, self.ln_biases = nn.ParameterList(), nn.ParameterList()
        for i, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            bound = 1.0 / math.sqrt(d_in)  # nn.Linear's U(−1/√in, 1/√in)
            W = (torch.rand(d_out, d_in, generator=g, dtype=torch.float64) * 2 - 1) * bound  # (out, in)
            b = (torch.rand(d_out, generator=g, dtype=torch.float64) * 2 - 1) * bound  # (out,)
            self.weights.append(nn.Parameter(W.to(device=device, dtype=dtype)))
            self.biases.append(nn.Parameter(b.to(device=device, dtype=dtype)))
            if layer_norm and i < len(sizes) - 2:
                self.ln_weights.append(nn.Parameter(torch.ones(d_out, device=device, dtype=dtype)))
                self.ln_biases.append(nn.Parameter(torch.zeros(d_out, device=device, dtype=dtype)))

    def _act(self, h):
        """act(h) = relu(h), gelu(h) (erf form) or gelu(h) (tanh form), by self.activation."""
        if self.activation == "relu":
            return relu(h)
        return gelu(h, "tanh" if self.activation == "gelu_tanh" else "none")

    def forward(self, x):
        """h_i = act(LN(h_{i−1} W_iᵀ + b_i)) for hidden layers, y = h W_Lᵀ + b_L."""
        h = x
        last = len(self.weights) - 1
        for i, (W, b) in enumerate(zip(self.weights, self.biases)):
            h = linear(h, W, b)  # (..., d_i) -> (..., d_{i+1})
            if i < last:
                if self.use_layer_norm:
                    h = layer_norm(h, self.ln_weights[i], self.ln_biases[i])
                h = self._act(h)
        return h

    def to_sequential(self) -> nn.Sequential:
        """The same network as nn.Sequential of torch's own modules, with copied parameters."""
        layers = []
        last = len(self.weights) - 1
        for i, (W, b) in enumerate(zip(self.weights, self.biases)):
            lin = nn.Linear(W.shape[1], W.shape[0], device=W.device, dtype=W.dtype)
            with torch.no_grad():
                lin.weight.copy_(W)
                lin.bias.copy_(b)
            layers.append(lin)
            if i < last:
                if self.use_layer_norm:
                    ln = nn.LayerNorm(W.shape[0], device=W.device, dtype=W.dtype)
                    with torch.no_grad():
                        ln.weight.copy_(self.ln_weights[i])
                        ln.bias.copy_(self.ln_biases[i])
                    layers.append(ln)
                if self.activation == "relu":
                    layers.append(nn.ReLU())
                else:
                    layers.append(nn.GELU("tanh" if self.activation == "gelu_tanh" else "none"))
        return nn.Sequential(*layers)

    def param_pairs(self, seq: nn.Sequential):
        """[(name, our parameter, the matching nn.Sequential parameter)] in layer order."""
        pairs = []
        mods = list(seq)
        lins = [m for m in mods if isinstance(m, nn.Linear)]
        lns = [m for m in mods if isinstance(m, nn.LayerNorm)]
        for i, (W, b) in enumerate(zip(self.weights, self.biases)):
            pairs += [(f"W{i + 1}", W, lins[i].weight), (f"b{i + 1}", b, lins[i].bias)]
            if i < len(lns):
                pairs += [
                    (f"gamma{i + 1}", self.ln_weights[i], lns[i].weight),
                    (f"beta{i + 1}", self.ln_biases[i], lns[i].bias),
                ]
        return pairs
