"""LoRA in a whole model (chapter 8): put adapters in, save and load only them, count what they cost.

* ``add_lora`` / ``add_lora_attention`` - replace chosen ``nn.Linear`` layers by ``LoRALinear``
  (``helpers.lora``) and every ``nn.MultiheadAttention`` by ``LoRASelfAttention``
  (``helpers.lora_attention``), freezing the rest;
* ``lora_state_dict`` / ``load_lora_state_dict`` - the adapters alone, a few KiB to ship;
* ``parameter_counts`` / ``trainable_parameters`` / ``optimizer_state_bytes`` /
  ``adam_state_bytes_formula`` - what training them costs (chapter 11 counts its optimizers'
  state with the same ``optimizer_state_bytes``).
"""

from __future__ import annotations

import torch
from torch import nn

from helpers.checks import expect_bool, expect_tensor
from helpers.lora import LoRALinear, lora_modules
from helpers.lora_attention import LoRASelfAttention

__all__ = [
    "add_lora",
    "add_lora_attention",
    "lora_state_dict",
    "load_lora_state_dict",
    "parameter_counts",
    "trainable_parameters",
    "optimizer_state_bytes",
    "adam_state_bytes_formula",
]


# --------------------------------------------------------------------------- surgery


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


def add_lora(
    model: nn.Module,
    target_names,
    r: int,
    alpha: float,
    dropout: float = 0.0,
    rslora: bool = False,
    seed: int = 0,
    freeze: bool = True,
) -> nn.Module:
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
            raise ValueError(
                f"add_lora: {name!r} belongs to an nn.MultiheadAttention, which reads its weights "
                "directly; use add_lora_attention"
            )
        if isinstance(module, LoRALinear):
            continue
        _replace(model, name, LoRALinear(module, r, alpha, dropout, rslora, seed=seed + 1000 * i))
    return model


def add_lora_attention(
    model: nn.Module,
    r: int,
    alpha: float,
    targets=("q", "v"),
    dropout: float = 0.0,
    rslora: bool = False,
    seed: int = 0,
    freeze: bool = True,
) -> nn.Module:
    """Replace every nn.MultiheadAttention by a LoRASelfAttention with adapters on ``targets`` (default Q, V)."""
    if freeze:
        _freeze_base(model)
    names = [n for n, m in model.named_modules() if isinstance(m, nn.MultiheadAttention)]
    if not names:
        raise ValueError(
            "add_lora_attention: expected the model to contain an nn.MultiheadAttention, found none"
        )
    for i, name in enumerate(names):
        new = LoRASelfAttention(
            model.get_submodule(name), r, alpha, targets, dropout, rslora, seed=seed + 1000 * i
        )
        if name:
            _replace(model, name, new)
        else:
            raise ValueError(
                "add_lora_attention: expected a model containing attention, not the attention itself"
            )
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
        raise ValueError(
            "load_lora_state_dict: expected a model with LoRA adapters (add_lora first), found none"
        )
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
        raise ValueError(
            f"load_lora_state_dict: expected keys {sorted(expected)[:4]}..., "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
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
    return {
        "trainable": sum(p.numel() for p in tr),
        "total": sum(p.numel() for p in ps),
        "trainable_bytes": sum(p.numel() * p.element_size() for p in tr),
    }


def trainable_parameters(model: nn.Module) -> int:
    """Number of parameters with requires_grad=True."""
    return parameter_counts(model)["trainable"]


def optimizer_state_bytes(opt, step_counters: bool = True) -> int:
    """Σ bytes of the tensors an optimizer keeps in ``opt.state`` (momentum b; Adam's m, v and step).

    Works for ``torch.optim`` optimizers and ``helpers.optim``'s (whose step count ``t`` is a
    Python int, no tensor).  torch's Adam keeps its step count as a 0-dim tensor per parameter;
    ``step_counters=False`` leaves those ``'step'`` entries out, so that only the per-parameter
    buffers count (what ``adam_state_bytes_formula`` predicts).
    """
    expect_bool("step_counters", step_counters)
    return sum(
        v.numel() * v.element_size()
        for s in opt.state.values()
        for k, v in s.items()
        if isinstance(v, torch.Tensor) and (step_counters or k != "step")
    )


def adam_state_bytes_formula(model: nn.Module) -> int:
    """Adam keeps two moments per trainable parameter: 2 × trainable bytes (the scalar step aside)."""
    return 2 * parameter_counts(model)["trainable_bytes"]
