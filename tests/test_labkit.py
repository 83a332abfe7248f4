"""helpers.labkit: the scaffolding labs 4, 8 and 9 use to self-check a learner's autograd.Function."""

import pytest
import torch

import helpers.functions as hf
from helpers.device import randn
from helpers.labkit import applied, check_function, count_saved

F64 = torch.float64


def _softmax_inputs():
    Z = randn(3, 5, seed=1, dtype=F64)
    return (Z,), randn(3, 5, seed=2, dtype=F64)


def test_applied_turns_a_none_forward_into_not_implemented():
    with pytest.raises(NotImplementedError):
        applied(lambda x: None)(1)
    assert applied(lambda x: x + 1)(1) == 2


def test_count_saved_counts_distinct_saved_tensors():
    (Z,), _ = _softmax_inputs()
    assert count_saved(lambda z: hf.Softmax.apply(z, -1), (Z,)) == 1  # only P
    assert count_saved(lambda z: hf.SoftmaxDiagonalOnly.apply(z, -1), (Z,)) == 1
    x, W = randn(2, 4, seed=3, dtype=F64), randn(3, 4, seed=4, dtype=F64)
    assert count_saved(lambda x, W: hf.Linear.apply(x, W, None), (x, W)) == 2  # x and W


def test_check_function_pass_with_saves_and_gradcheck(capsys):
    inputs, g = _softmax_inputs()
    res = check_function(
        "softmax",
        lambda z: hf.Softmax.apply(z, -1),
        lambda z: torch.softmax(z, -1),
        inputs,
        g,
        ("P", "grad_Z"),
        saves=(1, "P"),
    )
    out = capsys.readouterr().out
    assert res and out == res.line + "\n"
    assert res.line.startswith("✓ softmax: P, grad_Z match autograd")
    assert res.line.endswith("; saves only P; gradcheck passes")


def test_check_function_fail_todo_and_saved_count(capsys):
    inputs, g = _softmax_inputs()
    ref = lambda z: torch.softmax(z, -1)  # noqa: E731
    wrong = check_function(
        "diag", lambda z: hf.SoftmaxDiagonalOnly.apply(z, -1), ref, inputs, g, ("P", "grad_Z"), quiet=True
    )
    assert wrong.status == "fail" and "grad_Z is wrong" in wrong.line
    todo = check_function("todo", lambda z: None, ref, inputs, g, ("P", "grad_Z"), quiet=True)
    assert todo.status == "todo" and todo.line == "· todo: not implemented yet"
    too_many = check_function(
        "saves",
        lambda z: hf.Softmax.apply(z, -1),
        ref,
        inputs,
        g,
        ("P", "grad_Z"),
        saves=(0, "nothing"),
        quiet=True,
    )
    assert too_many.status == "fail" and "1 tensors saved for backward (expected 0)" in too_many.line
    assert capsys.readouterr().out == ""


def test_check_function_names_a_declared_factor():
    x = randn(4, 3, seed=5, dtype=F64)
    ref = lambda x: 2.0 * x  # noqa: E731
    halved = check_function(
        "double",
        lambda x: x,
        ref,
        (x,),
        torch.ones(4, 3, dtype=F64),
        ("y", "grad_x"),
        quiet=True,
        factors={"the gain": 2.0},
    )
    assert halved.status == "fail" and "the gain" in halved.line, halved.line
