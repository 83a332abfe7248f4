"""helpers.labcheck: one readable line per self-check, never a traceback."""

import pytest
import torch

from helpers.labcheck import autograd_grads, check, check_gradcheck, evaluate

X = torch.arange(6.0, dtype=torch.float64).reshape(2, 3)


def double(x):
    return 2 * x


def one_line(capsys):
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out
    assert "Traceback" not in out
    return out.strip()


def test_correct_function_prints_a_tick_with_the_sanitizable_difference(capsys):
    check(double, double, args=(X,), name="double")
    line = one_line(capsys)
    assert line.startswith("✓ double: output matches (max|Δ| 0.0e+00;")
    assert "atol 1e-10, rtol 1e-08" in line  # float64 defaults from helpers.checks


def test_wrong_value_names_the_output_the_largest_error_and_its_index():
    wrong = lambda x: 2 * x + torch.tensor([[0, 0, 0], [0, 0, 0.5]], dtype=torch.float64)  # noqa: E731
    r = evaluate(wrong, double, args=(X,), outputs=("grad_W",), name="ex")
    assert r.status == "fail" and not r
    assert "grad_W is wrong: largest error 5.0e-01 at [1, 2]" in r.line
    assert "got 10.5, expected 10" in r.line and "1 of 6 entries off" in r.line


def test_the_worst_of_several_outputs_is_named():
    r = evaluate(
        lambda x: (2 * x, x), lambda x: (2 * x, 2 * x), args=(X,), outputs=("grad_X", "grad_W"), name="lin"
    )
    assert r.line.startswith("✗ lin: grad_W is wrong")


def test_shape_dtype_and_type_mismatches_say_what_was_expected():
    assert (
        "grad_W has shape (3, 2), expected (2, 3) (transposed?)"
        in evaluate(lambda x: x.T, X, args=(X,), outputs=("grad_W",)).line
    )
    assert (
        "has shape (6,), expected (2, 3) (same numbers of elements"
        in evaluate(lambda x: x.flatten(), X, args=(X,)).line
    )
    assert "has dtype torch.float32, expected torch.float64" in evaluate(X.float(), X).line
    mask = torch.ones(2, 3, dtype=torch.bool).tril()
    assert "has dtype torch.float32, expected torch.bool" in evaluate(mask.float(), mask).line
    assert "expected a torch.Tensor, got list" in evaluate(X.tolist(), X).line
    assert (
        "returned 2 values, expected 3 (a, b, c)" in evaluate((X, X), (X, X, X), outputs=("a", "b", "c")).line
    )
    assert "b1 is missing from the returned dict" in evaluate({"W1": X}, {"W1": X, "b1": X}).line
    assert "expected a dict with keys W1" in evaluate(X, {"W1": X}).line


@pytest.mark.parametrize(
    "unfinished",
    [
        lambda x: None,
        lambda x: ...,
        lambda x: (_ for _ in ()).throw(NotImplementedError()),
        lambda x: ... * x,  # a `...` left in an expression
    ],
)
def test_unfinished_answers_say_not_implemented_yet(unfinished, capsys):
    check(unfinished, double, args=(X,), name="ex1")
    assert one_line(capsys) == "· ex1: not implemented yet"


def test_partly_unfinished_tuple_names_what_is_left():
    r = evaluate(lambda x: (2 * x, ...), lambda x: (2 * x, x), args=(X,), outputs=("a", "b"))
    assert r.status == "todo"
    assert r.line.endswith("not implemented yet: b still ... (1 other already matches)")


def test_an_exception_in_the_learners_code_is_one_line(capsys):
    def broken(x):
        return torch.mm(x, x)  # (2, 3) @ (2, 3): shapes do not fit

    check(broken, double, args=(X,), name="ex2")
    line = one_line(capsys)
    assert line.startswith(
        "✗ ex2: error in your code: RuntimeError: mat1 and mat2 shapes cannot be multiplied"
    )
    assert "(in broken, line" in line


def test_the_learner_cannot_change_the_inputs_the_reference_sees():
    def sneaky(x):
        x.zero_()
        return 2 * x

    r = evaluate(sneaky, double, args=(X,))
    assert r.status == "fail"  # the reference still saw the original X
    assert X[1, 2] == 5


def test_plain_numbers_and_scalars():
    assert evaluate(lambda: 0.19140625, 0.19140625).status == "pass"
    assert evaluate(torch.tensor(-0.875, dtype=torch.float64), -0.875).status == "pass"
    assert evaluate(0.5, 0.25).status == "fail"


def test_nan_is_reported_where_it_appears():
    bad = X.clone()
    bad[0, 1] = float("nan")
    assert "has NaN at [0, 1]" in evaluate(bad, X).line


def test_tolerances_can_be_loosened():
    near = X + 1e-7
    assert evaluate(near, X).status == "fail"
    r = evaluate(near, X, atol=1e-6)
    assert r.status == "pass" and "atol 1e-06" in r.line


def test_autograd_grads_is_the_vjp():
    W = torch.randn(4, 3, dtype=torch.float64)
    gY = torch.randn(2, 4, dtype=torch.float64)
    gX, gW = autograd_grads(lambda X, W: X @ W.T, (X, W), gY)
    torch.testing.assert_close(gX, gY @ W)
    torch.testing.assert_close(gW, gY.T @ X)
    (g_unused,) = autograd_grads(lambda X: torch.zeros(()), (X,))
    assert torch.equal(g_unused, torch.zeros_like(X))


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(x, wrong):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.wrong = inputs[1]

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x if ctx.wrong else 2 * x), None


def test_check_gradcheck_passes_a_right_backward_and_fails_a_wrong_one(capsys):
    assert check_gradcheck(lambda x: _Square.apply(x, False), (X,), name="sq", quiet=True)
    r = check_gradcheck(lambda x: _Square.apply(x, True), (X,), name="sq")
    assert r.status == "fail"
    assert one_line(capsys).startswith("✗ sq: backward disagrees with finite differences")

    def todo(x):
        raise NotImplementedError

    assert check_gradcheck(todo, (X,), quiet=True).status == "todo"


def test_an_argument_changed_in_place_is_named_in_one_line(capsys):
    def softmax_backward(P, grad_P):
        inner = (grad_P * P).sum(-1, keepdim=True)
        return grad_P.sub_(inner).mul_(P)  # right values, but grad_P is overwritten

    P = torch.softmax(X, -1)
    ref = lambda P, grad_P: P * (grad_P - (grad_P * P).sum(-1, keepdim=True))  # noqa: E731
    check(softmax_backward, ref, args=(P, X), name="ex1")
    assert one_line(capsys) == "✗ ex1: changed its argument grad_P in place"
    assert torch.equal(X, torch.arange(6.0, dtype=torch.float64).reshape(2, 3))  # ours is untouched

    def nudge(f, x, eps=0.1):  # + eps then - eps: not always the same float again
        x.view(-1)[0] += eps
        x.view(-1)[0] -= eps
        return x.clone()

    x = torch.tensor([0.3], dtype=torch.float64)
    assert (0.3 + 0.1) - 0.1 != 0.3
    assert (
        evaluate(nudge, lambda f, x, eps=0.1: x, args=(None, x)).line
        == "✗ check: changed its argument x in place"
    )
    r = evaluate(lambda xs: xs[1].zero_(), X, args=([X, X.clone()],))
    assert r.line == "✗ check: changed its argument xs[1] in place"
    nan = torch.tensor([float("nan"), 1.0])
    assert (
        evaluate(lambda t: t + 0, nan, args=(nan,)).status == "pass"
    )  # a NaN argument left alone is unchanged


def test_counts_exact_types_and_strings_read_as_sentences():
    r = evaluate(
        lambda: {"nodes missing or repeated": 9, "g": X},
        {"nodes missing or repeated": 0, "g": X},
        counts=("nodes missing or repeated",),
        name="ex3",
    )
    assert r.line == "✗ ex3: 9 nodes missing or repeated (expected 0)"
    r = evaluate(
        lambda: {"nodes missing or repeated": 0, "g": X},
        {"nodes missing or repeated": 0, "g": X},
        counts=("nodes missing or repeated",),
        name="ex3",
    )
    assert r.line.startswith("✓ ex3: nodes missing or repeated, g match (max|Δ| 0.0e+00; atol 1e-10")
    assert (
        evaluate(lambda: 2048.0, 2048, outputs=("bytes",), exact=True).line
        == "✗ check: bytes: returned float, expected int"
    )
    assert (
        evaluate(lambda: 2048.0, 2048, outputs=("bytes",)).status == "pass"
    )  # without exact a float will do
    r = evaluate(lambda: 2048, 2048, outputs=("bytes",), exact=True)
    assert r.status == "pass" and "atol 0, rtol 0" in r.line
    assert evaluate(lambda: 2047, 2048, exact=True).status == "fail"
    r = evaluate(lambda n, names: "in", "mid.act", args=({}, []), outputs=("the layer returned",), name="ex3")
    assert r.line == "✗ ex3: the layer returned is 'in', expected 'mid.act'"
    r = evaluate(
        lambda: "mid.act", "mid.act", outputs=("the layer returned",), name="ex3", against="the profile"
    )
    assert r.line == "✓ ex3: the layer returned matches the profile"


def test_a_long_list_of_names_on_a_tick_line_becomes_a_count():
    many = {f"blocks.{i}.linear": X for i in range(13)}
    r = evaluate(many, many, name="ex2", noun="layers", against="the recorder")
    assert r.line.startswith("✓ ex2: 13 layers match the recorder (max|Δ|")
    few = {k: X for k in ("grad_h", "grad_W1", "grad_b1", "grad_W2", "grad_b2")}  # short: still listed
    assert evaluate(few, few).line.startswith("✓ check: grad_h, grad_W1, grad_b1, grad_W2, grad_b2 match")


class _Unscaled(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x  # forgets g


def test_check_gradcheck_says_what_gradcheck_found_when_it_is_not_a_jacobian_mismatch():
    r = check_gradcheck(lambda x: _Unscaled.apply(x).sum(), (X,), name="ce", quiet=True)
    assert r.line == "✗ ce: gradcheck fails: backward not multiplied by grad_output"


def test_several_wrong_outputs_are_all_named():
    r = evaluate(
        lambda x: (x, x, x),
        lambda x: (2 * x, 3 * x, 4 * x),
        args=(X,),
        outputs=("grad_Q", "grad_K", "grad_V"),
        name="ex",
    )
    assert r.status == "fail" and "[also wrong: grad_K, grad_V]" in r.line


def test_one_tolerance_rule_for_compare_and_the_labs():
    """checks.close is the rule both use: equal infs pass, a finite value against inf fails, NaN = NaN only in labs."""
    from helpers.checks import close, compare

    inf, nan = float("inf"), float("nan")
    ok = close(
        torch.tensor([inf, 1.0, 1.0, nan, 2.0]), torch.tensor([inf, inf, 1.0 + 1e-9, nan, 2.1]), 1e-6, 0.0
    )
    assert ok.tolist() == [True, False, True, False, False]
    assert close(torch.tensor([nan]), torch.tensor([nan]), 0.0, 0.0, equal_nan=True).item()
    ref = torch.tensor([1.0, inf], dtype=torch.float64)
    assert compare("x", ref.clone(), ref, quiet=True)
    assert not compare("x", torch.tensor([1.0, 1e300], dtype=torch.float64), ref, quiet=True)
    assert evaluate(lambda: ref.clone(), ref).status == "pass"
    assert evaluate(lambda: torch.tensor([1.0, 1e300], dtype=torch.float64), ref).status == "fail"
