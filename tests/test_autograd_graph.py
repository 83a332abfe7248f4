import pytest
import torch

from helpers.autograd_graph import autograd_graph, format_graph
from helpers.cat_mlp import cat_params, forward


def _cat_graph():
    p = cat_params(requires_grad=True)
    c = forward(**p)
    names = {
        **{k: p[k] for k in ("x", "W1", "b1", "W2", "b2")},
        **{k: c[k] for k in ("h", "a", "y_hat", "L")},
    }
    return p, c, autograd_graph(c["L"], names)


def test_cat_mlp_graph_nodes_leaves_and_edges():
    p, c, g = _cat_graph()
    assert g.node(0)["name"] == "SumBackward0" and g.node(0)["label"] == "L"
    assert sorted(n["label"] for n in g.leaves) == ["W1", "W2", "b1", "b2"]
    assert {n["label"]: n["shape"] for n in g.leaves}["W1"] == (2, 4)
    # x needs no grad: no AccumulateGrad for it, and W1 @ x keeps x (for grad_W1) but not W1.
    ops = [n["name"] for n in g.nodes if n["kind"] == "op"]
    assert ops.count("MvBackward0") == 2 and "ReluBackward0" in ops
    assert len(g.edges) == len(g.nodes) - 1  # the cat MLP's graph is a tree
    assert all(g.node(b)["depth"] > g.node(a)["depth"] for a, b, _ in g.edges)
    assert max(n["depth"] for n in g.nodes) == 8


def test_saved_tensors_named_and_freed_after_backward():
    p, c, g = _cat_graph()
    relu = g.by_name("ReluBackward0")[0]
    assert relu["saved"][0]["tensor"] == "a" and relu["saved"][0]["shape"] == (2,)
    mv_top = [n for n in g.by_name("MvBackward0") if n["depth"] == 4][0]
    assert {s["tensor"] for s in mv_top["saved"]} == {"W2", "a"}
    mv_low = [n for n in g.by_name("MvBackward0") if n["depth"] == 7][0]
    assert [s["tensor"] for s in mv_low["saved"]] == ["x"]
    assert g.saved_bytes == 8 * (1 + 2 + 2 + 4)  # float64: pow's input, W2, a, x
    c["L"].backward()
    g2 = autograd_graph(c["L"])
    assert g2.saved_bytes == 0
    assert all(s["freed"] for n in g2.nodes for s in n["saved"])
    assert "(freed)" in format_graph(g2)


def test_shared_node_has_two_parents_and_format():
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    y = x * x + x  # x feeds MulBackward0 twice and AddBackward0 once
    g = autograd_graph(y.sum(), {"x": x})
    leaf = g.leaves[0]
    into_leaf = [e for e in g.edges if e[1] == leaf["id"]]
    assert len(into_leaf) == 3
    text = format_graph(g)
    assert "→ x.grad (2,)" in text and "MulBackward0" in text


def test_bad_input_raises():
    with pytest.raises(ValueError, match="grad_fn"):
        autograd_graph(torch.ones(2, requires_grad=True))
    with pytest.raises(ValueError, match="torch.Tensor"):
        autograd_graph([1.0])
