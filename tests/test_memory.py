import torch

from helpers.memory import SavedTensors, fmt_bytes, saved_by_node, tensor_bytes


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
