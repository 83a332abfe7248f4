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
