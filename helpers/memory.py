"""What autograd keeps for backward, in bytes (chapter 3; reused in chapters 6-10).

Two views of the same thing:

* ``SavedTensors`` - a ``torch.autograd.graph.saved_tensors_hooks`` context that
  sees every tensor an operation saves during forward, and adds up the bytes;
* ``saved_by_node`` - walks a finished graph from its output and lists, per
  backward node, the tensors it holds (the ``_saved_*`` attributes).

With ``SavedTensors(by_op=True)`` each saved tensor is also labelled with the
PyTorch function that saved it (``linear``, ``relu``, ``matmul``...), so
``saved.per_op()`` / ``saved.table()`` say which operation keeps what.

Bytes are counted once per storage (a saved view keeps its whole storage alive): a tensor saved by two operations (or an
output saved as the next op's input) costs memory only once.  Tensors that
exist anyway (parameters, inputs you pass in ``exclude``) can be left out, so
the figure is the *extra* memory backward needs: the activations.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["SavedTensors", "saved_by_node", "saved_in_graph", "ctx_attributes", "tensor_bytes", "fmt_bytes"]


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


def _op_name(func) -> str:
    name = getattr(func, "__name__", None) or str(func)
    if name.startswith("__") and name.endswith("__"):  # Tensor.__matmul__ -> matmul
        name = name[2:-2]
        if name.startswith("r") and name[1:] in ("add", "sub", "mul", "truediv", "matmul", "pow"):
            name = name[1:]
    return name


class _OpNamer(TorchFunctionMode):
    """Tells a SavedTensors which top-level torch function is running (nested calls keep the outer name)."""

    def __init__(self, owner: "SavedTensors"):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.owner._op is not None:
            return func(*args, **kwargs)
        self.owner._op = _op_name(func)
        self.owner._call += 1
        try:
            return func(*args, **kwargs)
        finally:
            self.owner._op = None


class SavedTensors:
    """Context manager: record every tensor saved for backward inside the block.

    >>> with SavedTensors(exclude=model.parameters()) as saved:
    ...     L = model(x).sum()
    >>> saved.total_bytes, saved.count

    ``by_op=True`` also records which torch function saved each tensor
    (``saved.per_op()``, ``print(saved.table())``).
    """

    def __init__(self, exclude=(), by_op: bool = False):
        self._exclude = {_key(t) for t in exclude}
        self.records: list[dict] = []
        self._seen: set = set()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._op: str | None = None
        self._call = 0
        self._namer = _OpNamer(self) if by_op else None

    def _pack(self, t: torch.Tensor):
        key = _key(t)
        shared = key in self._seen or key in self._exclude
        self._seen.add(key)
        self.records.append(
            {
                "shape": tuple(t.shape),
                "dtype": t.dtype,
                "bytes": _storage_bytes(t),
                "counted": not shared,
                "op": self._op or "?",
                "call": self._call if self._op else None,
                "storage": key,  # which storage: a saved output or input is told by it
            }
        )
        return t

    @staticmethod
    def _unpack(t):
        return t

    def __enter__(self):
        self._hooks.__enter__()
        if self._namer is not None:
            self._namer.__enter__()
        return self

    def __exit__(self, *exc):
        if self._namer is not None:
            self._namer.__exit__(*exc)
        self._hooks.__exit__(*exc)
        return False

    def per_op(self) -> list[dict]:
        """One row per operation call that saved something, in order: op, tensors saved, bytes counted, shapes."""
        rows: dict = {}
        for i, r in enumerate(self.records):
            key = r["call"] if r.get("call") is not None else f"?{i}"
            row = rows.setdefault(key, {"op": r["op"], "saved": 0, "bytes": 0, "shapes": []})
            row["saved"] += 1
            row["bytes"] += r["bytes"] if r["counted"] else 0
            row["shapes"].append(tuple(r["shape"]) if r["counted"] else ("shared",) + tuple(r["shape"]))
        return list(rows.values())

    def table(self) -> str:
        """The per-operation view as text: op, saved tensors (shared/excluded ones marked), bytes.

        72 columns at most, to fit an 88-column cell: a long op name gets a line of its own, a
        long list of shapes wraps after a comma onto the lines below.
        """
        lines = [f"{'op':<14s} {'saved tensors':<44s} {'bytes':>10s}"]
        for row in self.per_op():
            shapes = [("=" + str(s[1:]) if s and s[0] == "shared" else str(s)) for s in row["shapes"]]
            parts = [""]
            for k, shape in enumerate(shapes):
                piece = shape + ("," if k < len(shapes) - 1 else "")
                if parts[-1] and len(parts[-1]) + 1 + len(piece) > 44:
                    parts.append("")
                parts[-1] += (" " if parts[-1] else "") + piece
            op = row["op"]
            if len(op) > 14:
                lines.append(op)
                op = ""
            lines.append(f"{op:<14s} {parts[0]:<44s} {fmt_bytes(row['bytes']):>10s}")
            lines.extend(f"{'':<14s} {part}" for part in parts[1:])
        lines.append(
            f"{'total':<14s} {'(= marks a tensor already counted or excluded)':<44s} "
            f"{fmt_bytes(self.total_bytes):>10s}"
        )
        return "\n".join(lines)

    @property
    def count(self) -> int:
        """Number of distinct tensors counted (shared and excluded ones left out)."""
        return sum(r["counted"] for r in self.records)

    @property
    def total_bytes(self) -> int:
        """Bytes of the distinct saved tensors that are not excluded."""
        return sum(r["bytes"] for r in self.records if r["counted"])


def ctx_attributes(node) -> list[tuple[str, torch.Tensor]]:
    """Tensors a custom autograd.Function's ctx holds as attributes (``ctx.Z = Z``), directly or in a
    list, tuple or dict: kept alive for backward as surely as ``save_for_backward`` keeps them."""
    if not isinstance(node, torch.autograd.function.BackwardCFunction):
        return []
    found = []
    for name, value in vars(node).items():
        if isinstance(value, dict):
            items = [(f"ctx.{name}[{k!r}]", v) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            items = [(f"ctx.{name}[{k}]", v) for k, v in enumerate(value)]
        else:
            items = [(f"ctx.{name}", value)]
        found += [(n, t) for n, t in items if isinstance(t, torch.Tensor)]
    return found


def saved_in_graph(outputs) -> list[tuple[object, str, torch.Tensor]]:
    """(node, name, tensor) for every tensor the graph behind ``outputs`` keeps for backward: each
    backward node's saved tensors (``_saved_*``; a custom Function's ``saved_tensors``) and its ctx's
    tensor attributes (``ctx_attributes``), node by node from the outputs. The one walk of a graph's
    saved tensors: ``saved_by_node`` here and the grader's worker use it."""
    out, visited = [], set()
    stack = [o.grad_fn for o in outputs if isinstance(o, torch.Tensor)]
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
                saved += [(attr[len("_saved_") :], v) for v in values if isinstance(v, torch.Tensor)]
        if not saved and hasattr(node, "saved_tensors"):  # custom autograd.Function
            try:
                saved = [(f"saved_tensors[{i}]", t) for i, t in enumerate(node.saved_tensors)]
            except RuntimeError:
                saved = []
        out += [(node, name, t) for name, t in saved + ctx_attributes(node)]
        stack.extend(fn for fn, _ in node.next_functions)
    return out


def saved_by_node(output: torch.Tensor, exclude=()) -> list[dict]:
    """Per backward node reachable from ``output``: the tensors it saved (name, shape, bytes).

    A storage shared by several nodes is charged to the first one met; tensors in
    ``exclude`` (parameters, inputs) are listed with ``counted=False``.
    """
    excluded = {_key(t) for t in exclude}
    seen_storage: set = set()
    rows = []
    for node, name, t in saved_in_graph([output]):
        key = _key(t)
        counted = key not in excluded and key not in seen_storage
        seen_storage.add(key)
        rows.append(
            {
                "node": node.name(),
                "name": name,
                "shape": tuple(t.shape),
                "dtype": t.dtype,
                "bytes": _storage_bytes(t),
                "counted": counted,
            }
        )
    return rows
