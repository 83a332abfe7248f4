"""What autograd keeps for backward, in bytes (chapter 3; reused in chapters 6-10).

Two views of the same thing:

* ``SavedTensors`` - a ``torch.autograd.graph.saved_tensors_hooks`` context that
  sees every tensor an operation saves during forward, and adds up the bytes;
* ``saved_by_node`` - walks a finished graph from its output and lists, per
  backward node, the tensors it holds (the ``_saved_*`` attributes).

Bytes are counted once per storage (a saved view keeps its whole storage alive): a tensor saved by two operations (or an
output saved as the next op's input) costs memory only once.  Tensors that
exist anyway (parameters, inputs you pass in ``exclude``) can be left out, so
the figure is the *extra* memory backward needs: the activations.
"""
from __future__ import annotations

import torch

__all__ = ["SavedTensors", "saved_by_node", "tensor_bytes", "fmt_bytes"]


def tensor_bytes(t: torch.Tensor) -> int:
    """numel × element size: the bytes of the tensor's own elements."""
    return t.numel() * t.element_size()


def fmt_bytes(n: int) -> str:
    """Human-readable bytes in powers of 1024 (B, KiB, MiB, GiB), 1 decimal."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _key(t: torch.Tensor):
    # A view (a transpose, a slice) keeps its whole storage alive: count storages.
    return t.untyped_storage().data_ptr()


def _storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


class SavedTensors:
    """Context manager: record every tensor saved for backward inside the block.

    >>> with SavedTensors(exclude=model.parameters()) as saved:
    ...     L = model(x).sum()
    >>> saved.total_bytes, saved.count
    """

    def __init__(self, exclude=()):
        self._exclude = {_key(t) for t in exclude}
        self.records: list[dict] = []
        self._seen: set = set()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        key = _key(t)
        shared = key in self._seen or key in self._exclude
        self._seen.add(key)
        self.records.append({"shape": tuple(t.shape), "dtype": t.dtype,
                             "bytes": _storage_bytes(t), "counted": not shared})
        return t

    @staticmethod
    def _unpack(t):
        return t

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        return False

    @property
    def count(self) -> int:
        """Number of distinct tensors counted (shared and excluded ones left out)."""
        return sum(r["counted"] for r in self.records)

    @property
    def total_bytes(self) -> int:
        """Bytes of the distinct saved tensors that are not excluded."""
        return sum(r["bytes"] for r in self.records if r["counted"])


def saved_by_node(output: torch.Tensor, exclude=()) -> list[dict]:
    """Per backward node reachable from ``output``: the tensors it saved (name, shape, bytes).

    A storage shared by several nodes is charged to the first one met; tensors in
    ``exclude`` (parameters, inputs) are listed with ``counted=False``.
    """
    excluded = {_key(t) for t in exclude}
    seen_storage: set = set()
    rows, stack, visited = [], [output.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        saved = []
        for attr in dir(node):
            if attr.startswith("_saved_"):
                try:
                    value = getattr(node, attr)
                except RuntimeError:  # freed after backward
                    continue
                values = value if isinstance(value, (tuple, list)) else [value]
                saved += [(attr[len("_saved_"):], v) for v in values if isinstance(v, torch.Tensor)]
        if not saved and hasattr(node, "saved_tensors"):  # custom autograd.Function
            try:
                saved = [(f"saved_tensors[{i}]", t) for i, t in enumerate(node.saved_tensors)]
            except RuntimeError:
                saved = []
        for name, t in saved:
            key = _key(t)
            counted = key not in excluded and key not in seen_storage
            seen_storage.add(key)
            rows.append({"node": node.name(), "name": name, "shape": tuple(t.shape),
                         "dtype": t.dtype, "bytes": _storage_bytes(t), "counted": counted})
        stack.extend(fn for fn, _ in node.next_functions)
    return rows
