import torch

from helpers.memory import (
    SavedTensors,
    ctx_attributes,
    fmt_bytes,
    saved_by_node,
    saved_in_graph,
    tensor_bytes,
)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_saved_tensors_counts_activations_not_parameters():
    model, x = _mlp(), torch.randn(32, 8)
    with SavedTensors(exclude=[*model.parameters(), x]) as saved:
        model(x).sum().backward()
    # Linear1 saves x (excluded); ReLU saves its output (32x16); Linear2 saves that same tensor.
    assert saved.total_bytes == 32 * 16 * 4
    assert saved.count == 1


def test_saved_tensors_without_exclusion_counts_input_too():
    model, x = _mlp(), torch.randn(32, 8)
    with SavedTensors() as saved:
        model(x)
    weights = tensor_bytes(model[2].weight)  # Linear 1 needs no W for grad_W alone: x needs no grad
    assert saved.total_bytes == 32 * 8 * 4 + 32 * 16 * 4 + weights


def test_saved_by_node_lists_per_op_and_dedupes():
    model, x = _mlp(), torch.randn(32, 8)
    out = model(x).sum()
    rows = saved_by_node(out, exclude=[*model.parameters(), x])
    counted = [r for r in rows if r["counted"]]
    assert sum(r["bytes"] for r in counted) == 32 * 16 * 4
    assert {r["node"] for r in rows} >= {"ReluBackward0", "AddmmBackward0"}


def test_nothing_saved_under_no_grad_and_fmt_bytes():
    model, x = _mlp(), torch.randn(4, 8)
    with SavedTensors() as saved, torch.no_grad():
        model(x)
    assert saved.total_bytes == 0
    assert fmt_bytes(512) == "512 B" and fmt_bytes(3 * 1024**2) == "3.0 MiB"


def test_by_op_labels_each_call_and_keeps_totals():
    model, x = _mlp(), torch.randn(32, 8)
    with SavedTensors(exclude=[*model.parameters(), x], by_op=True) as saved:
        L = (model(x) ** 2).mean()
    rows = saved.per_op()
    assert [r["op"] for r in rows] == ["linear", "relu", "linear", "pow"]
    assert [r["bytes"] for r in rows] == [0, 32 * 16 * 4, 0, 32 * 4 * 4]
    assert sum(r["bytes"] for r in rows) == saved.total_bytes
    text = saved.table()
    assert text.splitlines()[2].startswith("relu") and "2.0 KiB" in text
    L.backward()  # the hooks left the graph usable


def test_by_op_matches_plain_counter_and_nested_calls_keep_outer_name():
    x = torch.randn(16, 8, requires_grad=True)
    with SavedTensors() as plain:
        torch.nn.functional.layer_norm(x, (8,)).sum()
    with SavedTensors(by_op=True) as named:
        torch.nn.functional.layer_norm(x, (8,)).sum()
    assert named.total_bytes == plain.total_bytes > 0
    assert {r["op"] for r in named.per_op()} == {"layer_norm"}
    assert all(r["op"] == "?" for r in plain.records)


class _KeepsOnCtx(torch.autograd.Function):
    """exp(Z), saving its output, and keeping Z (and Z², in a list) on ctx as attributes."""

    @staticmethod
    def forward(Z):
        return Z.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)
        ctx.Z, ctx.more, ctx.n = inputs[0], [inputs[0] ** 2], 3

    @staticmethod
    def backward(ctx, g):
        (P,) = ctx.saved_tensors
        return g * P


def test_tensors_kept_on_ctx_count_as_saved_in_the_one_walk():
    """Issue 32: `ctx.Z = Z` keeps Z alive for backward as surely as save_for_backward; the walk sees it."""
    Z = torch.randn(3, requires_grad=True)
    P = _KeepsOnCtx.apply(Z)
    assert [n for n, _ in ctx_attributes(P.grad_fn)] == ["ctx.Z", "ctx.more[0]"]
    names = [name for _, name, _ in saved_in_graph([P])]
    assert names == ["saved_tensors[0]", "ctx.Z", "ctx.more[0]"]
    rows = saved_by_node(P, exclude=[Z])
    assert [(r["name"], r["counted"]) for r in rows] == [
        ("saved_tensors[0]", True),
        ("ctx.Z", False),
        ("ctx.more[0]", True),
    ]
    assert (
        ctx_attributes(torch.randn(2, requires_grad=True).exp().grad_fn) == []
    )  # a built-in node has no ctx
