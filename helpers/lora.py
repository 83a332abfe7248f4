"""LoRA from the gradient up (chapter 8): W' = W + (α/r)·B·A with W frozen.

Layout is ``nn.Linear``'s: ``W`` is ``(out, in)``, ``B`` is ``(out, r)``, ``A`` is ``(r, in)`` and
``y = x W'ᵀ + b``.  The Function never forms ``W'`` nor ``∂L/∂W'``: the LoRA path is
``x → x Aᵀ (r numbers per row) → (x Aᵀ) Bᵀ``, so backward needs ``x``, the r-dimensional
activation ``x Aᵀ`` and the three matrices, and costs O(r·(in + out)) per row on top of
the frozen layer's ``grad_y W``.

* ``lora_linear_forward`` / ``lora_linear_backward`` - the math, as plain functions;
* ``LoRALinearFunction`` - the ``autograd.Function`` (forward + setup_context);
* ``lora_linear(x, W, b, A, B, alpha, r)`` - the public, checked wrapper;
* ``LoRALinear`` - wraps an existing ``nn.Linear`` (frozen), with merge/unmerge and dropout
  on the LoRA input path only;
* ``LoRASelfAttention`` - an ``nn.MultiheadAttention`` with its packed Q/K/V projection split
  into three frozen ``nn.Linear`` so Q and V can carry their own adapters;
* ``add_lora`` / ``add_lora_attention`` / ``lora_state_dict`` / ``load_lora_state_dict`` and
  parameter / optimizer-state counting.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from helpers.checks import expect_tensor
from helpers.device import rand

__all__ = [
    "lora_scale", "lora_linear_forward", "lora_linear_backward", "LoRALinearFunction", "lora_linear",
    "delta_weight", "LoRALinear", "LoRASelfAttention", "add_lora", "add_lora_attention",
    "lora_modules", "merge_lora", "unmerge_lora", "lora_state_dict", "load_lora_state_dict",
    "parameter_counts", "trainable_parameters", "optimizer_state_bytes", "adam_state_bytes_formula",
    "train_lm", "eval_lm",
]


# --------------------------------------------------------------------------- the math

def lora_scale(alpha: float, r: int, rslora: bool = False) -> float:
    """s = α/r (LoRA) or α/√r (rsLoRA)."""
    return float(alpha) / (math.sqrt(r) if rslora else r)


def lora_linear_forward(x, W, b, A, B, scale, x_lora=None):
    """y = x Wᵀ + b + s·(x_l Aᵀ) Bᵀ with x_l = x (or the dropped-out x_lora); returns (y, x_l Aᵀ)."""
    xl = x if x_lora is None else x_lora
    xA = xl @ A.T                                                # (..., in) @ (in, r) -> (..., r)
    y = F.linear(x, W, b)                                        # x Wᵀ + b: (..., in) -> (..., out), as nn.Linear
    y2 = y.view(-1, y.shape[-1])                                 # (..., out) -> (R, out), a view of y
    # y2 += s·(xA Bᵀ) in one addmm: no (R, out) temporaries for the product and the scaling.
    y2.addmm_(xA.reshape(-1, xA.shape[-1]), B.T, alpha=scale)    # (R, r) @ (r, out) -> (R, out)
    return y, xA


def lora_linear_backward(grad_y, x, W, A, B, xA, scale, needs=(True, False, True, True, True, False, False),
                         x_lora=None):
    """grad_B = s·grad_yᵀ(x_l Aᵀ), grad_A = s·(grad_y B)ᵀ x_l, grad_x = grad_y W + s·(grad_y B) A.

    ``needs`` follows the Function's inputs ``(x, W, b, A, B, scale, x_lora)``.  With a separate
    ``x_lora`` (dropout on the LoRA path) the LoRA term of grad_x goes to ``x_lora`` instead.
    ``grad_W = grad_yᵀ x`` is only formed if asked for (a trainable base); LoRA never asks.
    Returns ``(grad_x, grad_W, grad_b, grad_A, grad_B, None, grad_x_lora)``.
    """
    need_x, need_W, need_b, need_A, need_B, _, need_xl = (tuple(needs) + (False,) * 7)[:7]
    xl = x if x_lora is None else x_lora
    grad_y2 = grad_y.reshape(-1, grad_y.shape[-1])               # (..., out) -> (R, out)
    grad_x = grad_W = grad_b = grad_A = grad_B = grad_xl = None
    gB = None
    if need_A or need_x or need_xl:
        gB = grad_y @ B                                          # (..., out) @ (out, r) -> (..., r)
    if need_x:
        grad_x = grad_y @ W                                      # (..., out) @ (out, in) -> (..., in)
        if x_lora is None:                                       # += s·(gB A), fused as in the forward
            grad_x.view(-1, grad_x.shape[-1]).addmm_(gB.reshape(-1, gB.shape[-1]), A, alpha=scale)  # (R, r) @ (r, in)
    if need_xl and x_lora is not None:
        grad_xl = scale * (gB @ A)                               # (..., r) @ (r, in) -> (..., in)
    if need_W:
        grad_W = grad_y2.T @ x.reshape(-1, x.shape[-1])          # (out, R) @ (R, in) -> (out, in)
    if need_b:
        grad_b = grad_y2.sum(0)                                  # (R, out) -> (out,)
    if need_A:
        gB2 = gB.reshape(-1, gB.shape[-1])                       # (..., r) -> (R, r)
        grad_A = scale * (gB2.T @ xl.reshape(-1, xl.shape[-1]))  # (r, R) @ (R, in) -> (r, in)
    if need_B:
        grad_B = scale * (grad_y2.T @ xA.reshape(-1, xA.shape[-1]))  # (out, R) @ (R, r) -> (out, r)
    return grad_x, grad_W, grad_b, grad_A, grad_B, None, grad_xl


class LoRALinearFunction(torch.autograd.Function):
    """y = x Wᵀ + b + s·(x Aᵀ) Bᵀ; saves x and the r-dim x Aᵀ, never W' = W + s·BA or ∂L/∂W'.

    Inputs ``(x, W, b, A, B, scale, x_lora)``; outputs ``(y, xA)`` where ``xA`` is returned only so
    that it can be saved (non-differentiable; the wrapper drops it).
    """

    @staticmethod
    def forward(x, W, b, A, B, scale, x_lora):
        return lora_linear_forward(x, W, b, A, B, scale, x_lora)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, W, b, A, B, scale, x_lora = inputs
        _, xA = output
        need_x, need_W, _, need_A, need_B, _, need_xl = ctx.needs_input_grad
        xl = x if x_lora is None else x_lora
        # grad_A needs x_l, grad_B needs xA, grad_x needs W (and A, B for the LoRA term),
        # grad_W (only for a trainable base) needs x: keep nothing nobody will ask for.
        ctx.save_for_backward(
            x if need_W else None,
            W if need_x else None,
            A if (need_x or need_xl) else None,
            B if (need_x or need_xl or need_A) else None,
            xA if need_B else None,
            xl if need_A else None,                              # x itself unless dropout made x_lora
        )
        ctx.scale = scale
        ctx.has_x_lora = x_lora is not None
        ctx.mark_non_differentiable(xA)
        ctx.set_materialize_grads(False)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_y, _grad_xA):
        x, W, A, B, xA, xl = ctx.saved_tensors
        if grad_y is None:
            return (None,) * 7
        x_lora = xl if ctx.has_x_lora else None
        if x is None and not ctx.has_x_lora:
            x = xl                                               # the LoRA path reads x itself
        return lora_linear_backward(grad_y, x, W, A, B, xA, ctx.scale, ctx.needs_input_grad, x_lora=x_lora)


def _check_rank(where: str, r, d_in: int, d_out: int) -> int:
    """r as an int in [1, min(in, out)], or a one-line ValueError."""
    if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= min(d_in, d_out):
        raise ValueError(f"{where}: expected rank r an int in [1, min(in, out)] = [1, {min(d_in, d_out)}], got {r!r}")
    return r


def _float(name: str, t) -> None:
    """One-line ValueError unless t is a floating-point tensor."""
    expect_tensor(name, t)
    if not t.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got {t.dtype}")


def lora_linear(x, W, b, A, B, alpha, r, *, rslora: bool = False, x_lora=None):
    """y = x Wᵀ + b + (α/r)·(x Aᵀ) Bᵀ for x (..., in), W (out, in), A (r, in), B (out, r), b (out,) or None."""
    _float("x", x)
    _float("W", W)
    if W.dim() != 2 or x.dim() < 1 or x.shape[-1] != W.shape[1]:
        raise ValueError(f"lora_linear: expected x (..., in) and W (out, in) with matching in, "
                         f"got {tuple(x.shape)} and {tuple(W.shape)}")
    d_out, d_in = W.shape
    r = _check_rank("lora_linear", r, d_in, d_out)
    expect_tensor("A", A, shape=(r, d_in))
    expect_tensor("B", B, shape=(d_out, r))
    if b is not None:
        expect_tensor("b", b, shape=(d_out,))
    if x_lora is not None:
        expect_tensor("x_lora", x_lora, shape=tuple(x.shape))
    y, _ = LoRALinearFunction.apply(x, W, b, A, B, lora_scale(alpha, r, rslora), x_lora)
    return y


def delta_weight(A, B, scale: float):
    """ΔW = s·B A, the (out, in) update LoRA adds to W (formed only to merge or to explain)."""
    return scale * (B @ A)                                       # (out, r) @ (r, in) -> (out, in)


# --------------------------------------------------------------------------- the module

class LoRALinear(nn.Module):
    """Wraps an nn.Linear: y = base(x) + (α/r)·(drop(x) Aᵀ) Bᵀ; base frozen, A Kaiming-uniform, B = 0."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, dropout: float = 0.0, rslora: bool = False,
                 seed: int = 0):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise ValueError(f"LoRALinear: expected an nn.Linear to wrap, got {type(base).__name__}")
        d_out, d_in = base.weight.shape
        self.r = _check_rank("LoRALinear", r, d_in, d_out)
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"LoRALinear: expected dropout in [0, 1), got {dropout}")
        for p in base.parameters():
            p.requires_grad_(False)                              # frozen: autograd computes no ∂L/∂W at all
        self.base = base
        self.alpha, self.rslora, self.dropout = float(alpha), bool(rslora), float(dropout)
        self.scale = lora_scale(alpha, r, rslora)
        W = base.weight
        # Kaiming-uniform with a = √5 (nn.Linear's own init, as loralib and PEFT use):
        # gain √(2/(1+a²)) = √(1/3), bound = gain·√(3/in) = 1/√in.
        bound = 1.0 / math.sqrt(d_in)
        A = (rand(r, d_in, seed=seed, dtype=torch.float64) * 2 - 1) * bound   # (r, in)
        self.lora_A = nn.Parameter(A.to(device=W.device, dtype=W.dtype))
        self.lora_B = nn.Parameter(torch.zeros(d_out, r, device=W.device, dtype=W.dtype))  # (out, r)
        self.merged = False

    @property
    def weight(self):
        """The frozen base weight W, (out, in)."""
        return self.base.weight

    @property
    def bias(self):
        """The frozen base bias b, (out,) or None."""
        return self.base.bias

    @property
    def in_features(self) -> int:
        """in, as nn.Linear."""
        return self.base.in_features

    @property
    def out_features(self) -> int:
        """out, as nn.Linear."""
        return self.base.out_features

    def extra_repr(self) -> str:
        rule = "α/√r" if self.rslora else "α/r"
        return f"r={self.r}, alpha={self.alpha:g}, scale={rule}={self.scale:g}, dropout={self.dropout:g}, merged={self.merged}"

    def forward(self, x):
        """y = x Wᵀ + b + s·(drop(x) Aᵀ) Bᵀ (merged: y = x W'ᵀ + b)."""
        if self.merged:
            return F.linear(x, self.base.weight, self.base.bias)
        x_lora = F.dropout(x, self.dropout, training=True) if self.training and self.dropout > 0 else None
        y, _ = LoRALinearFunction.apply(x, self.base.weight, self.base.bias, self.lora_A, self.lora_B,
                                        self.scale, x_lora)
        return y

    def delta_weight(self):
        """ΔW = s·B A, (out, in)."""
        return delta_weight(self.lora_A.detach(), self.lora_B.detach(), self.scale)

    @torch.no_grad()
    def merge(self):
        """W ← W + s·BA for inference (one matmul per layer then); no-op if already merged."""
        if not self.merged:
            self.base.weight += self.delta_weight()
            self.merged = True
        return self

    @torch.no_grad()
    def unmerge(self):
        """W ← W − s·BA (back to the frozen base, to float round-off); no-op if not merged."""
        if self.merged:
            self.base.weight -= self.delta_weight()
            self.merged = False
        return self


# --------------------------------------------------------------------------- attention: Q and V

class LoRASelfAttention(nn.Module):
    """Self-attention equal to a batch_first nn.MultiheadAttention, its packed in_proj split into
    frozen q_proj, k_proj, v_proj (+ out_proj) nn.Linear layers so that chosen ones carry adapters.

    The packed ``in_proj_weight`` (3E, E) stacks W_Q, W_K, W_V by rows; one adapter on the packed
    matrix would couple the three (its B has rows for K too).  Splitting gives each projection its
    own A and B, as for separate q_proj/v_proj layers.  Drop-in for ``TransformerEncoderLayer.self_attn``.
    """

    # TransformerEncoderLayer's inference fast path reads the packed weights directly and would
    # skip the adapters; with the projections split there is no packed weight, which also turns the
    # fast path off (it requires _qkv_same_embed_dim).
    _qkv_same_embed_dim = False

    def __init__(self, mha: nn.MultiheadAttention, r: int, alpha: float, targets=("q", "v"),
                 dropout: float = 0.0, rslora: bool = False, seed: int = 0):
        super().__init__()
        if not isinstance(mha, nn.MultiheadAttention):
            raise ValueError(f"LoRASelfAttention: expected an nn.MultiheadAttention, got {type(mha).__name__}")
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("LoRASelfAttention: expected a plain packed nn.MultiheadAttention "
                             "(same q/k/v dims, no bias_k/bias_v, no add_zero_attn)")
        bad = [t for t in targets if t not in ("q", "k", "v", "o")]
        if bad or not targets:
            raise ValueError(f"LoRASelfAttention: expected targets among 'q', 'k', 'v', 'o', got {tuple(targets)}")
        E = mha.embed_dim
        self.embed_dim, self.num_heads, self.batch_first = E, mha.num_heads, mha.batch_first
        self.attn_dropout = mha.dropout
        W, b = mha.in_proj_weight.detach(), mha.in_proj_bias
        for i, name in enumerate(("q", "k", "v")):
            lin = nn.Linear(E, E, bias=b is not None, device=W.device, dtype=W.dtype)
            with torch.no_grad():
                lin.weight.copy_(W[i * E:(i + 1) * E])           # row block i of the packed (3E, E)
                if b is not None:
                    lin.bias.copy_(b.detach()[i * E:(i + 1) * E])
            lin.requires_grad_(False)
            setattr(self, f"{name}_proj", lin)
        o = mha.out_proj
        out = nn.Linear(E, E, bias=o.bias is not None, device=W.device, dtype=W.dtype)
        with torch.no_grad():
            out.weight.copy_(o.weight)
            if o.bias is not None:
                out.bias.copy_(o.bias)
        out.requires_grad_(False)
        self.out_proj = out
        for j, t in enumerate(targets):
            name = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}[t]
            setattr(self, name, LoRALinear(getattr(self, name), r, alpha, dropout, rslora, seed=seed + j))

    @property
    def in_proj_bias(self):
        """The three biases stacked as in the packed module (read by TransformerEncoderLayer)."""
        bs = [getattr(self, f"{n}_proj").bias for n in ("q", "k", "v")]
        return None if bs[0] is None else torch.cat(bs)

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights=False, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        """O = softmax(Q Kᵀ/√d + mask) V per head, then out_proj; self-attention only (key, value = query)."""
        x = query
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise ValueError("LoRASelfAttention: expected self-attention (key and value the same tensor as query)")
        if need_weights:
            raise ValueError("LoRASelfAttention: need_weights=True is not supported")
        if not self.batch_first:
            x = x.transpose(0, 1)                                # (N, B, E) -> (B, N, E)
        Bsz, N, E = x.shape
        H = self.num_heads
        d = E // H

        def heads(t):
            return t.reshape(Bsz, N, H, d).transpose(1, 2)       # (B, N, E) -> (B, H, N, d)

        Q, K, V = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        if is_causal and attn_mask is None and key_padding_mask is not None:
            # SDPA takes is_causal or a mask, not both: fold the triangle into the padding mask.
            attn_mask = torch.ones(N, N, dtype=torch.bool, device=x.device).triu(1)  # (N, N), True = future key
        mask = _additive_mask(attn_mask, key_padding_mask, Bsz, N, x.dtype)
        causal = is_causal and mask is None
        O = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask, is_causal=causal,
                                           dropout_p=self.attn_dropout if self.training else 0.0)  # (B, H, N, d)
        O = O.transpose(1, 2).reshape(Bsz, N, E)                 # (B, H, N, d) -> (B, N, E)
        Y = self.out_proj(O)
        if not self.batch_first:
            Y = Y.transpose(0, 1)                                # (B, N, E) -> (N, B, E)
        return Y, None


def _additive_mask(attn_mask, key_padding_mask, Bsz, N, dtype):
    """MultiheadAttention's masks (bool True = blocked, or additive floats) as one additive mask."""
    def additive(m):
        if m is None:
            return None
        if m.dtype == torch.bool:
            return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(m, float("-inf"))
        return m.to(dtype)

    mask = additive(attn_mask)                                   # (N, N) or (B·H, N, N)
    if mask is not None and mask.dim() == 3:
        mask = mask.reshape(Bsz, -1, N, N)                       # (B·H, N, N) -> (B, H, N, N)
    kpm = additive(key_padding_mask)                             # (B, N)
    if kpm is not None:
        kpm = kpm.reshape(Bsz, 1, 1, N)                          # (B, N) -> (B, 1, 1, N)
        mask = kpm if mask is None else mask + kpm
    return mask


# --------------------------------------------------------------------------- models

def _freeze_base(model: nn.Module) -> None:
    """requires_grad=False on every parameter except the adapters' lora_A and lora_B."""
    model.requires_grad_(False)
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.lora_A.requires_grad_(True)
            m.lora_B.requires_grad_(True)


def _targets_matching(model: nn.Module, target: str) -> list[str]:
    """Names of submodules called ``target`` or ending in '.target'."""
    return [n for n, _ in model.named_modules() if n and (n == target or n.endswith("." + target))]


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` where the submodule ``name`` was."""
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def add_lora(model: nn.Module, target_names, r: int, alpha: float, dropout: float = 0.0, rslora: bool = False,
             seed: int = 0, freeze: bool = True) -> nn.Module:
    """Replace every nn.Linear whose name is (or ends with '.') a target by a LoRALinear; freeze the rest."""
    if isinstance(target_names, str):
        target_names = [target_names]
    if freeze:
        _freeze_base(model)
    found = []
    for t in target_names:
        names = _targets_matching(model, t)
        if not names:
            raise ValueError(f"add_lora: expected a module named {t!r} (or ending in '.{t}'), found none")
        found += [n for n in names if n not in found]
    for i, name in enumerate(found):
        module = model.get_submodule(name)
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        if isinstance(parent, nn.MultiheadAttention):
            raise ValueError(f"add_lora: {name!r} belongs to an nn.MultiheadAttention, which reads its weights "
                             "directly; use add_lora_attention")
        if isinstance(module, LoRALinear):
            continue
        _replace(model, name, LoRALinear(module, r, alpha, dropout, rslora, seed=seed + 1000 * i))
    return model


def add_lora_attention(model: nn.Module, r: int, alpha: float, targets=("q", "v"), dropout: float = 0.0,
                       rslora: bool = False, seed: int = 0, freeze: bool = True) -> nn.Module:
    """Replace every nn.MultiheadAttention by a LoRASelfAttention with adapters on ``targets`` (default Q, V)."""
    if freeze:
        _freeze_base(model)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]
    if not names:
        raise ValueError("add_lora_attention: expected the model to contain an nn.MultiheadAttention, found none")
    for i, name in enumerate(names):
        new = LoRASelfAttention(model.get_submodule(name), r, alpha, targets, dropout, rslora, seed=seed + 1000 * i)
        if name:
            _replace(model, name, new)
        else:
            raise ValueError("add_lora_attention: expected a model containing attention, not the attention itself")
    return model


def lora_modules(model: nn.Module) -> dict:
    """{name: LoRALinear} for every adapter in the model."""
    return {n: m for n, m in model.named_modules() if isinstance(m, LoRALinear)}


def merge_lora(model: nn.Module) -> nn.Module:
    """Merge every adapter into its base weight (W ← W + s·BA)."""
    for m in lora_modules(model).values():
        m.merge()
    return model


def unmerge_lora(model: nn.Module) -> nn.Module:
    """Undo merge_lora (W ← W − s·BA)."""
    for m in lora_modules(model).values():
        m.unmerge()
    return model


def lora_state_dict(model: nn.Module) -> dict:
    """Only the adapters: {'<module>.lora_A': (r, in), '<module>.lora_B': (out, r)} (detached copies)."""
    sd = {}
    for name, m in lora_modules(model).items():
        prefix = f"{name}." if name else ""
        sd[prefix + "lora_A"] = m.lora_A.detach().clone()
        sd[prefix + "lora_B"] = m.lora_B.detach().clone()
    return sd


def load_lora_state_dict(model: nn.Module, sd: dict) -> nn.Module:
    """Copy adapter weights (from lora_state_dict) into a model with the same adapters; checks keys and shapes."""
    mods = lora_modules(model)
    if not mods:
        raise ValueError("load_lora_state_dict: expected a model with LoRA adapters (add_lora first), found none")
    expected = {}
    for name, m in mods.items():
        if m.merged:
            raise ValueError(f"load_lora_state_dict: adapter {name!r} is merged; unmerge before loading")
        prefix = f"{name}." if name else ""
        expected[prefix + "lora_A"] = m.lora_A
        expected[prefix + "lora_B"] = m.lora_B
    missing = [k for k in expected if k not in sd]
    unexpected = [k for k in sd if k not in expected]
    if missing or unexpected:
        raise ValueError(f"load_lora_state_dict: expected keys {sorted(expected)[:4]}..., "
                         f"missing {missing[:3]}, unexpected {unexpected[:3]}")
    for k, p in expected.items():
        v = sd[k]
        expect_tensor(f"load_lora_state_dict: {k}", v, shape=tuple(p.shape))
    with torch.no_grad():
        for k, p in expected.items():
            p.copy_(sd[k])
    return model


# --------------------------------------------------------------------------- counting

def parameter_counts(model: nn.Module) -> dict:
    """{'trainable': n, 'total': n, 'trainable_bytes': b} over the model's parameters."""
    ps = list(model.parameters())
    tr = [p for p in ps if p.requires_grad]
    return {"trainable": sum(p.numel() for p in tr), "total": sum(p.numel() for p in ps),
            "trainable_bytes": sum(p.numel() * p.element_size() for p in tr)}


def trainable_parameters(model: nn.Module) -> int:
    """Number of parameters with requires_grad=True."""
    return parameter_counts(model)["trainable"]


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of every tensor an optimizer keeps in its state (Adam: exp_avg, exp_avg_sq, step)."""
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))


def adam_state_bytes_formula(model: nn.Module) -> int:
    """Adam keeps two moments per trainable parameter: 2 × trainable bytes (the scalar step aside)."""
    return 2 * parameter_counts(model)["trainable_bytes"]


# --------------------------------------------------------------------------- training (chapter 8's fine-tuning)

def train_lm(model: nn.Module, data: torch.Tensor, steps: int, lr: float, batch_size: int = 16, n_ctx: int = 32,
             seed: int = 0, progress=None) -> dict:
    """Adam on the mean next-token cross-entropy of random windows of ``data`` (batch s uses seed + s).

    Only parameters with requires_grad=True are given to Adam.  ``progress`` wraps the step
    range (e.g. ``tqdm``) and gets ``set_postfix(loss=...)`` if it has one.
    Returns {'losses': [float per step], 'optimizer': the Adam, 'seconds': wall time of the loop}.
    """
    import time

    from helpers.gpt import get_batch

    if not isinstance(steps, int) or steps < 0:
        raise ValueError(f"train_lm: expected steps an int >= 0, got {steps!r}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("train_lm: expected some parameters with requires_grad=True, found none")
    device = params[0].device
    opt = torch.optim.Adam(params, lr=lr)
    losses = []
    it = range(steps) if progress is None else progress(range(steps))
    t0 = time.perf_counter()
    for s in it:
        idx, targets = get_batch(data, batch_size, n_ctx, seed=seed + s, device=device)   # (B, N), (B, N)
        logits = model(idx)                                                              # (B, N, V)
        L = F.cross_entropy(logits.flatten(0, 1), targets.flatten())                     # (B·N, V) vs (B·N,)
        opt.zero_grad(set_to_none=True)
        L.backward()
        opt.step()
        losses.append(L.item())
        if progress is not None and hasattr(it, "set_postfix") and (s % 10 == 0 or s == steps - 1):
            it.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
    return {"losses": losses, "optimizer": opt, "seconds": time.perf_counter() - t0}


@torch.no_grad()
def eval_lm(model: nn.Module, data: torch.Tensor, batches: int = 8, batch_size: int = 16, n_ctx: int = 32,
            seed: int = 10_000) -> float:
    """Mean next-token cross-entropy over ``batches`` fixed random windows of ``data`` (no training)."""
    from helpers.gpt import get_batch

    device = next(model.parameters()).device
    total = 0.0
    for s in range(batches):
        idx, targets = get_batch(data, batch_size, n_ctx, seed=seed + s, device=device)
        logits = model(idx).flatten(0, 1)                        # (B, N, V) -> (B·N, V)
        total += F.cross_entropy(logits, targets.flatten()).item()
    return total / batches
