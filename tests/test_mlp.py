"""helpers.mlp: the MLP built from our Functions equals nn.Sequential, gradients included."""

import pytest
import torch
import torch.nn.functional as F

import helpers.functions as hf
from helpers.checks import tolerance
from helpers.device import get_device, no_tf32, randn
from helpers.mlp import MLP

no_tf32()
DEV = get_device()
ATOL32, RTOL32 = tolerance(torch.float32)  # (1e-5, 1e-4): O(1) values summed in another order


def _target(n, C, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, C, (n,), generator=g).to(DEV)


@pytest.mark.parametrize("activation,layer_norm", [("relu", False), ("gelu", True), ("gelu_tanh", True)])
def test_mlp_gradients_equal_sequential(activation, layer_norm):
    mlp = MLP((5, 16, 16, 3), activation=activation, layer_norm=layer_norm, seed=1, device=DEV)
    seq = mlp.to_sequential()
    X = randn(8, 5, seed=11, device=DEV)
    t = _target(8, C=3, seed=3)
    L_ours = hf.cross_entropy(mlp(X), t)
    L_ref = F.cross_entropy(seq(X), t)
    torch.testing.assert_close(L_ours, L_ref, atol=ATOL32, rtol=RTOL32)
    L_ours.backward()
    L_ref.backward()
    pairs = mlp.param_pairs(seq)
    assert len(pairs) == len(list(seq.parameters())) == len(list(mlp.parameters()))
    for name, p_ours, p_ref in pairs:
        torch.testing.assert_close(p_ours.grad, p_ref.grad, atol=ATOL32, rtol=RTOL32, msg=name)


def test_mlp_uses_only_our_functions():
    mlp = MLP((3, 4, 2), activation="gelu", layer_norm=True)
    y = mlp(randn(2, 3, seed=1, device=DEV))
    seen, stack = set(), [y.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        stack += [n for n, _ in node.next_functions]
    names = {type(n).__name__ for n in seen} - {"AccumulateGrad"}
    assert names <= {"LinearBackward", "LayerNormBackward", "GELUBackward"}, names


def test_bad_sizes_or_activation_raise_one_line_value_error():
    for call in (lambda: MLP((3,)), lambda: MLP((3, 2), activation="tanh")):
        with pytest.raises(ValueError) as e:
            call()
        assert "\n" not in str(e.value)
