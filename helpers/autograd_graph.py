"""The graph autograd records, as plain data (chapter 3).

``autograd_graph(L, names)`` starts at ``L.grad_fn`` and follows
``grad_fn.next_functions`` to the leaves, the same walk ``L.backward()`` makes.
It returns a ``Graph``: a list of node dicts and a list of edges, nothing drawn.

* an *op* node is a backward function (``MvBackward0``...) with the tensors it
  saved during forward (``_saved_*`` attributes; marked ``freed`` once backward
  has released them);
* a *leaf* node is an ``AccumulateGrad``: it adds the incoming gradient into
  ``variable.grad``; with ``names={"W1": W1, ...}`` it is labelled ``W1``;
* an edge ``(a, b, i)`` says node ``a`` sends a gradient to node ``b`` through
  its ``i``-th input: gradients flow along edges, forward values flow against them.

``helpers.plot_graph`` draws a ``Graph``; ``format_graph`` prints it as text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["Graph", "autograd_graph", "format_graph", "node_kind_name"]


@dataclass
class Graph:
    """Nodes (dicts: id, kind, name, label, shape, depth, saved) and edges (src, dst, input index)."""

    nodes: list = field(default_factory=list)
    edges: list = field(default_factory=list)

    def node(self, node_id: int) -> dict:
        """The node dict with this id."""
        return self.nodes[node_id]

    def by_name(self, name: str) -> list:
        """All nodes whose backward-function name (or leaf label) is ``name``."""
        return [n for n in self.nodes if n["name"] == name or n["label"] == name]

    @property
    def leaves(self) -> list:
        """The AccumulateGrad nodes: where gradients end up in ``.grad``."""
        return [n for n in self.nodes if n["kind"] == "leaf"]

    @property
    def saved_bytes(self) -> int:
        """Bytes of the saved tensors still held (not freed), each storage once."""
        seen, total = set(), 0
        for n in self.nodes:
            for s in n["saved"]:
                if not s["freed"] and s["key"] not in seen:
                    seen.add(s["key"])
                    total += s["bytes"]
        return total


def node_kind_name(fn) -> str:
    """'AccumulateGrad' for leaves (drops the C++ namespace), else the node's own name."""
    return fn.name().split("::")[-1]


def _tensor_key(t: torch.Tensor):
    # Two tensor objects are "the same value" if they look at the same memory the same way.
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def _saved_of(fn, name_of: dict) -> list:
    """The tensors ``fn`` saved for backward, each as a dict (or marked freed)."""
    out = []
    for attr in sorted(a for a in dir(fn) if a.startswith("_saved_")):
        short = attr[len("_saved_") :]
        try:
            value = getattr(fn, attr)
        except RuntimeError:  # "...after they have already been freed"
            out.append(
                {
                    "name": short,
                    "shape": None,
                    "dtype": None,
                    "bytes": 0,
                    "tensor": None,
                    "key": None,
                    "freed": True,
                }
            )
            continue
        values = value if isinstance(value, (tuple, list)) else [value]
        for v in values:
            if isinstance(v, torch.Tensor):
                out.append(
                    {
                        "name": short,
                        "shape": tuple(v.shape),
                        "dtype": v.dtype,
                        "bytes": v.untyped_storage().nbytes(),
                        "tensor": name_of.get(_tensor_key(v)),
                        "key": v.untyped_storage().data_ptr(),
                        "freed": False,
                    }
                )
    return out


def autograd_graph(output: torch.Tensor, names: dict | None = None) -> Graph:
    """Walk ``output.grad_fn.next_functions`` to the leaves; return the graph as plain data.

    ``names`` maps a name to a tensor (``{"W1": W1, "h": h}``): leaves get their
    variable's name, op nodes the name of the tensor they produced, saved tensors
    the name of the tensor they are.  Depth is the longest path from the output.
    """
    if not isinstance(output, torch.Tensor):
        raise ValueError(f"output: expected a torch.Tensor, got {type(output).__name__}")
    if output.grad_fn is None:
        raise ValueError("output: expected a tensor with a grad_fn (computed from tensors that require grad)")
    names = names or {}
    name_of = {_tensor_key(t): n for n, t in names.items() if isinstance(t, torch.Tensor)}
    leaf_name = {id(t): n for n, t in names.items() if isinstance(t, torch.Tensor) and t.is_leaf}
    made_by = {
        id(t.grad_fn): n for n, t in names.items() if isinstance(t, torch.Tensor) and t.grad_fn is not None
    }

    graph = Graph()
    ids: dict = {}  # id(backward function) -> node id
    order = [output.grad_fn]
    ids[id(output.grad_fn)] = 0
    fns = [output.grad_fn]  # keep the Python objects alive while we walk
    i = 0
    while i < len(order):
        fn = order[i]
        i += 1
        kind_name = node_kind_name(fn)
        if kind_name == "AccumulateGrad":
            var = fn.variable
            label = leaf_name.get(id(var), "")
            graph.nodes.append(
                {
                    "id": ids[id(fn)],
                    "kind": "leaf",
                    "name": kind_name,
                    "label": label,
                    "shape": tuple(var.shape),
                    "depth": 0,
                    "saved": [],
                }
            )
        else:
            graph.nodes.append(
                {
                    "id": ids[id(fn)],
                    "kind": "op",
                    "name": kind_name,
                    "label": made_by.get(id(fn), ""),
                    "shape": None,
                    "depth": 0,
                    "saved": _saved_of(fn, name_of),
                }
            )
        for k, (nxt, _) in enumerate(fn.next_functions):
            if nxt is None:  # that input needs no gradient
                continue
            if id(nxt) not in ids:
                ids[id(nxt)] = len(order)
                order.append(nxt)
                fns.append(nxt)
            graph.edges.append((ids[id(fn)], ids[id(nxt)], k))

    # Longest distance from the output (a node sits below everything that feeds it a gradient).
    depth = [0] * len(graph.nodes)
    for _ in range(len(graph.nodes)):
        changed = False
        for a, b, _k in graph.edges:
            if depth[b] < depth[a] + 1:
                depth[b] = depth[a] + 1
                changed = True
        if not changed:
            break
    for n in graph.nodes:
        n["depth"] = depth[n["id"]]
    return graph


def _fmt_shape(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def format_graph(graph: Graph) -> str:
    """One line per node: depth, backward function, what it produced or accumulates, what it saved, where it sends gradients."""
    lines = []
    for n in sorted(graph.nodes, key=lambda n: (n["depth"], n["id"])):
        if n["kind"] == "leaf":
            what = f"→ {n['label'] or '?'}.grad {_fmt_shape(n['shape'])}"
            saved = ""
        else:
            what = f"makes {n['label']}" if n["label"] else ""
            parts = []
            for s in n["saved"]:
                if s["freed"]:
                    parts.append(f"{s['name']} (freed)")
                else:
                    who = f"={s['tensor']}" if s["tensor"] else ""
                    parts.append(f"{s['name']}{who} {_fmt_shape(s['shape'])}")
            saved = "saves " + ", ".join(parts) if parts else ""
        nxt = [graph.node(b) for a, b, _k in graph.edges if a == n["id"]]
        to = ", ".join(f"#{m['id']}" for m in nxt)
        lines.append(
            f"#{n['id']:<2d} d{n['depth']}  {n['name']:<15s} {what:<12s} {saved:<34s}"
            + (f" grad → {to}" if to else "")
        )
    return "\n".join(line.rstrip() for line in lines)
