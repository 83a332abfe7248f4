"""helpers.labcheck: one readable line per self-check, never a traceback."""

import math

import pytest
import torch

from helpers.labcheck import evaluate


def check(*args, **kwargs):
    """What a self-check prints: evaluate's one line."""
    print(evaluate(*args, **kwargs).line)


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
    assert r.line == "✗ lin: grad_W is 1/2 × the expected value everywhere"


def test_shape_dtype_and_type_mismatches_say_what_was_expected():
    assert (
        "grad_W has shape (3, 2), expected (2, 3) (transposed?)"
        in evaluate(lambda x: x.T, X, args=(X,), outputs=("grad_W",)).line
    )
    assert (
        "has shape (6,), expected (2, 3) (the right values in another shape"
        in evaluate(lambda x: x.flatten(), X, args=(X,)).line
    )
    # as many entries, other values: the shapes, no hint (s10: an elementwise a·g for an outer product)
    line = evaluate(lambda x: x.flatten() + 1, X, args=(X,)).line
    assert line.endswith("has shape (6,), expected (2, 3)"), line
    line = evaluate(lambda x: x.T + 1, X, args=(X,), outputs=("grad_W",)).line
    assert line.endswith("grad_W has shape (3, 2), expected (2, 3)"), line
    assert "has dtype torch.float32, expected torch.float64" in evaluate(X.float(), X).line
    mask = torch.ones(2, 3, dtype=torch.bool).tril()
    assert "has dtype torch.float32, expected torch.bool" in evaluate(mask.float(), mask).line
    assert "expected a torch.Tensor, got list" in evaluate(X.tolist(), X).line
    assert (
        "returned 2 values, expected 3 (a, b, c)" in evaluate((X, X), (X, X, X), outputs=("a", "b", "c")).line
    )
    assert evaluate({"W1": X}, {"W1": X, "b1": X}).line == "✗ check: missing from the returned dict: b1"
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


# --- Diagnoses: the cause a wrong value reveals, in the same one line -------------------------------

G = torch.linspace(-1.3, 2.1, 12, dtype=torch.float64).reshape(3, 4) ** 3 + 0.25  # no zero, no symmetry
S = torch.randn(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))  # square


def test_a_correct_answer_still_gets_a_tick_with_factors_and_terms_declared():
    r = evaluate(
        lambda g: 1 * g,
        lambda g: g,
        args=(G,),
        outputs=("grad_W",),
        factors={"B": 8},
        terms={"grad_W": {"t": G}},
    )
    assert r.status == "pass" and r.line.startswith("✓ check: grad_W matches")


@pytest.mark.parametrize(
    "c, says",
    [
        (1 / 8, "grad_W is 1/B × the expected value (B = 8)"),
        (8, "grad_W is B × the expected value (B = 8)"),
        (4.0, "grad_W is √d × the expected value (√d = 4)"),
        (1 / 4.0, "grad_W is 1/√d × the expected value (√d = 4)"),
        (8 / 7, "grad_W is N/(N−1) × the expected value (N/(N−1) = 1.143)"),
        (7 / 8, "grad_W is 1/(N/(N−1)) × the expected value (N/(N−1) = 1.143)"),
        (-1 / 8, "grad_W is −1/B × the expected value (B = 8)"),
        (-1, "grad_W has the sign flipped (−1 × the expected value)"),
        (2, "grad_W is 2 × the expected value everywhere"),
        (0.5, "grad_W is 1/2 × the expected value everywhere"),
        (2.5, "grad_W is 2.5 × the expected value everywhere"),
        (1 / 3, "grad_W is 0.333 × the expected value everywhere"),
        (8.008, "grad_W is 8.01 × the expected value everywhere"),  # 1e-3 off B: not B
        (7.992, "grad_W is 7.99 × the expected value everywhere"),
        (0.125 * 1.001, "grad_W is 0.1251 × the expected value everywhere"),
    ],
)
def test_a_constant_ratio_is_named_by_the_exercise_factor_it_matches(c, says):
    factors = {"B": 8, "√d": math.sqrt(16), "N/(N−1)": 8 / 7}
    r = evaluate(lambda g: c * g, lambda g: g, args=(G,), outputs=("grad_W",), factors=factors, name="ex3")
    assert r.status == "fail" and r.line == f"✗ ex3: {says}"


def test_a_ratio_is_tested_against_the_dtype_tolerance_and_zeros_must_stay_zero():
    G32 = G.float()
    r = evaluate(lambda g: g / 8, G32, args=(G32,), outputs=("grad_W",), factors={"B": 8})
    assert r.line == "✗ check: grad_W is 1/B × the expected value (B = 8)"
    Z = G.clone()
    Z[0] = 0.0  # a row the reference leaves at zero
    bad = Z / 8
    bad[0, 1] = 0.3  # not zero where expected is zero: no constant ratio
    r = evaluate(bad, Z, outputs=("grad_W",), factors={"B": 8})
    assert r.line.startswith("✗ check: grad_W is wrong: largest error")
    assert evaluate(Z / 8, Z, outputs=("grad_W",), factors={"B": 8}).line.endswith(
        "1/B × the expected value (B = 8)"
    )


def test_random_wrong_answers_are_not_diagnosed_as_a_ratio_or_transpose():
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        wrong = torch.randn(5, 5, dtype=torch.float64, generator=gen)
        r = evaluate(wrong, S, outputs=("grad_W",), factors={"B": 8})
        assert r.line.startswith("✗ check: grad_W is wrong: largest error"), r.line
    near = G / 8
    near[1, 2] *= 1.01  # one entry off the ratio
    assert "is wrong: largest error" in evaluate(near, G, factors={"B": 8}).line
    assert "is wrong" in evaluate(0.5, 0.3).line  # one number: no unnamed ratio


def test_a_ratio_of_one_number_is_named_only_by_a_factor():
    assert evaluate(2.4, 0.3, outputs=("loss",), factors={"B": 8}).line == (
        "✗ check: loss is B × the expected value (B = 8)"
    )


def test_the_transpose_of_a_square_answer_is_named():
    r = evaluate(lambda s: s.T, lambda s: s, args=(S,), outputs=("grad_W",), name="ex2")
    assert r.line == "✗ ex2: grad_W is the transpose of the expected value"
    batched = torch.randn(2, 3, 3, dtype=torch.float64)
    r = evaluate(batched.transpose(-1, -2), batched, outputs=("grad_S",))
    assert r.line == "✗ check: grad_S is the transpose of the expected value"
    assert "(transposed?)" in evaluate(G.T, G, outputs=("grad_W",)).line  # shapes differ: as before


def test_an_all_zero_answer_says_so():
    assert evaluate(torch.zeros_like(G), G, outputs=("grad_W",)).line == "✗ check: grad_W is zero everywhere"


def test_a_declared_term_missing_or_counted_twice_is_named():
    skip = torch.randn(3, 4, dtype=torch.float64)
    ref = lambda g: g + skip  # noqa: E731
    terms = {"grad_x": {"the skip path": lambda g: skip}}
    r = evaluate(lambda g: g, ref, args=(G,), outputs=("grad_x",), terms=terms, name="ex4")
    assert r.line == "✗ ex4: grad_x matches the expected value minus the skip path (that term is missing)"
    r = evaluate(
        lambda g: g + 2 * skip, ref, args=(G,), outputs=("grad_x",), terms={"grad_x": {"the skip path": skip}}
    )
    assert r.line == "✗ check: grad_x matches the expected value plus the skip path (counted twice?)"
    r = evaluate(lambda g: g + 0.5 * skip, ref, args=(G,), outputs=("grad_x",), terms=terms)
    assert "grad_x is wrong: largest error" in r.line  # half the term: no diagnosis
    r = evaluate(lambda g: g, ref, args=(G,), outputs=("grad_x",), terms={"grad_x": {"t": torch.ones(5)}})
    assert "grad_x is wrong: largest error" in r.line  # a term that cannot broadcast is skipped
    with pytest.raises(ValueError, match="terms: 'grad_y' is not one of the outputs"):
        evaluate(lambda g: g, ref, args=(G,), outputs=("grad_x",), terms={"grad_y": {"t": skip}})


def test_missing_keys_are_reported_first_and_as_missing():
    exp = {"W1": G, "b1": G, "W2": G}
    r = evaluate({"W1": 2 * G, "bias1": G}, exp, name="ex5")
    assert r.line == "✗ ex5: missing from the returned dict: b1, W2 (it has bias1 instead?) [also wrong: W1]"
    assert evaluate({"W1": G}, exp).line == "✗ check: missing from the returned dict: b1, W2"


def test_outputs_are_judged_in_the_declared_order_root_cause_first():
    exp = {"W": G, "b": G, "scale": G}
    got = {"W": 2 * G, "b": 3 * G, "scale": G + 1}
    r = evaluate(got, exp, outputs=("scale", "W", "b"), name="ex9")
    assert r.line.startswith("✗ ex9: scale is wrong: largest error") and r.line.endswith("[also wrong: W, b]")
    r = evaluate(got, exp, name="ex9")  # no declaration: the dict's order
    assert r.line.startswith("✗ ex9: W is 2 × the expected value everywhere [also wrong: b, scale]")


def test_an_error_inside_course_code_is_reported_at_the_learners_call(capsys):
    from helpers.numgrad import linear_backward

    X_, W_ = torch.randn(4, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    gY = torch.randn(4, 2, dtype=torch.float64)

    def my_backward(grad_Y, X, W):
        return linear_backward(grad_Y, X, W)  # lab 2's order, not the helper's (X, W, grad_Y)

    check(my_backward, lambda g, X, W: linear_backward(X, W, g), args=(gY, X_, W_), name="ex7")
    line = one_line(capsys)
    line_no = my_backward.__code__.co_firstlineno + 1
    assert line.startswith("✗ ex7: error in your code: ValueError: linear_backward(X, W, grad_Y): expected")
    assert line.endswith(f"(in my_backward, line {line_no}, in the call to linear_backward)")

    def my_mm(x):
        return torch.nn.functional.linear(x, x[:, :2])  # torch raises in C: no Python callee frame

    line = evaluate(my_mm, X, args=(X,)).line
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in line and "(in my_mm, line" in line


def test_a_next_that_runs_out_in_a_generator_is_explained_not_only_named():
    """Python says "generator raised StopIteration" (PEP 479); a newcomer who zipped flags with fewer
    gradients (lab 9: chapter 9's needs_input_grad[1:] where this Function needs [2:]) read nothing more."""
    flags = (True, True, True)

    def my_grads(x):
        got = iter([x, x])  # two gradients, three flags
        return tuple(next(got) if n else None for n in flags)

    line = evaluate(my_grads, (X, X, X), args=(X,)).line
    assert "RuntimeError: generator raised StopIteration (a next() inside a generator ran out" in line, line


def test_a_gradient_returned_out_of_place_is_explained_by_its_position():
    """autograd says "returned an invalid gradient at index 2" (lab 9 ex2's newcomer: frozen weights'
    gradients misaligned with forward's inputs); the line says what the index counts."""

    class Swapped(torch.autograd.Function):
        @staticmethod
        def forward(x, W):
            return x @ W  # (1, 3) @ (3, 2) -> (1, 2)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        @staticmethod
        def backward(ctx, g):
            x, W = ctx.saved_tensors
            return x.T @ g, g @ W.T  # in the wrong order: W's (3, 2) where x's (1, 3) is due

    def my_grads(x, W):
        x, W = x.detach().requires_grad_(), W.detach().requires_grad_()
        return torch.autograd.grad(Swapped.apply(x, W).sum(), (x, W))

    x, W = torch.ones(1, 3), torch.ones(3, 2)
    line = evaluate(my_grads, (x, W), args=(x, W)).line
    assert "invalid gradient at index 0" in line and "the one at position 0, counting from 0" in line, line


def test_every_diagnosis_is_one_short_line():
    factors = {"B": 8, "√d": 4.0, "α/r": 2.0, "N/(N−1)": 8 / 7}
    for got in (G / 8, -G, G * 2.5, torch.zeros_like(G)):
        line = evaluate(
            got, G, outputs=("grad_W",), factors=factors, name="Exercise 3 · linear_backward"
        ).line
        assert "\n" not in line and len(line) <= 200, line


def test_a_bool_mask_gets_transpose_and_all_false_but_no_ratio():
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    assert (
        evaluate(mask.T, mask, outputs=("mask",)).line
        == "✗ check: mask is the transpose of the expected value"
    )
    assert (
        evaluate(torch.zeros_like(mask), mask, outputs=("mask",)).line == "✗ check: mask is False everywhere"
    )
    assert evaluate(torch.ones_like(mask), mask, outputs=("mask",)).line == "✗ check: mask is True everywhere"


def test_round_off_around_zero_is_zero_not_a_tiny_ratio():
    noise = 1e-17 * torch.linspace(-1, 1, 12, dtype=torch.float64).reshape(3, 4)
    r = evaluate(noise * G, G, outputs=("grad_Z",))  # e.g. softmax rows summed: 0 up to round-off
    assert r.line == "✗ check: grad_Z is zero everywhere (up to round-off)"


def test_check_prints_the_diagnosis_and_long_also_wrong_lists_shrink_to_fit(capsys):
    check(lambda g: g / 8, lambda g: g, args=(G,), outputs=("grad_W",), factors={"B": 8}, name="ex3")
    assert one_line(capsys) == "✗ ex3: grad_W is 1/B × the expected value (B = 8)"
    names = [f"padded keys' gradient entries of head {i}" for i in range(5)]
    r = evaluate(tuple(G + i + 1 for i in range(5)), tuple(G for _ in range(5)), outputs=names, name="ex4")
    assert len(r.line) <= 200 and r.line.endswith("[also wrong: …]")
    r = evaluate(tuple(G + i + 1 for i in range(5)), tuple(G for _ in range(5)), outputs=list("abcde"))
    assert r.line.endswith("[also wrong: b, c, d, …]")


# ----------------------------------------------------------------- known mistakes and regions


def test_a_declared_mistake_is_named_and_the_right_answer_is_not():
    h = torch.tensor([1.0, -2.0, 0.0, 3.0], dtype=torch.float64)
    g = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    ref = g * (h > 0)
    mistakes = {"grad_h": {"the gradient times h (h in place of 𝟙[h > 0])": lambda g, h: ref * h}}
    line = evaluate(lambda g, h: g * h.relu(), ref, args=(g, h), outputs=("grad_h",), mistakes=mistakes).line
    assert line == "✗ check: grad_h matches the gradient times h (h in place of 𝟙[h > 0])"
    other = evaluate(lambda g, h: g + 1, ref, args=(g, h), outputs=("grad_h",), mistakes=mistakes).line
    assert "matches" not in other and "is wrong" in other
    assert evaluate(lambda g, h: ref, ref, args=(g, h), outputs=("grad_h",), mistakes=mistakes)


def test_a_str_output_names_its_known_mistake():
    r = evaluate(
        "out.act",
        "mid.act",
        outputs=("a collapse",),
        mistakes={"a collapse": {"the ratio inverted": "out.act"}},
    )
    assert r.line == "✗ check: a collapse is 'out.act', expected 'mid.act' (the ratio inverted)"
    r = evaluate(
        "in", "mid.act", outputs=("a collapse",), mistakes={"a collapse": {"the ratio inverted": "out.act"}}
    )
    assert r.line == "✗ check: a collapse is 'in', expected 'mid.act'"


def test_wrong_entries_inside_a_declared_region_are_located_there_only():
    h = torch.tensor([1.0, -2.0, 0.0, 3.0], dtype=torch.float64)
    ref = torch.tensor([1.0, 0.0, 0.0, 4.0], dtype=torch.float64)
    regions = {"grad_h": {"h = 0": h == 0}}
    at_zero = ref.clone()
    at_zero[2] = 3.0
    line = evaluate(at_zero, ref, outputs=("grad_h",), regions=regions).line
    assert line == "✗ check: grad_h is wrong only where h = 0 (1 of 4 entries)"
    elsewhere = ref.clone()
    elsewhere[1] = 3.0
    assert "only where" not in evaluate(elsewhere, ref, outputs=("grad_h",), regions=regions).line


def test_wrong_entries_in_one_index_range_are_located_and_scattered_ones_are_not():
    O = torch.randn(2, 3, 11, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    last_block = O.clone()
    last_block[:, :, 8:] = 0
    line = evaluate(last_block, O, outputs=("O",)).line
    assert line == "✗ check: O is wrong only at indices 8–10 of dim 2 (of 11) (72 of 264 entries)"
    scattered = O.clone()
    scattered[0, 0, 0, 0] += 1
    scattered[1, 2, 10, 3] += 1
    assert "only at" not in evaluate(scattered, O, outputs=("O",)).line


def test_a_constant_answer_is_named_as_one_number_everywhere():
    ref = torch.tensor([-0.875, 0.5, 2.0], dtype=torch.float64)
    assert (
        evaluate(torch.ones(3, dtype=torch.float64), ref, outputs=("grad_b2",)).line
        == "✗ check: grad_b2 is 1 everywhere (the expected value is not constant)"
    )
    flat = torch.full((3,), 2.0, dtype=torch.float64)
    assert (
        "everywhere"
        not in evaluate(
            torch.full((3,), 3.0, dtype=torch.float64) + torch.arange(3), flat, outputs=("g",)
        ).line
    )


def test_nans_in_one_index_range_are_located_like_other_wrong_entries():
    O = torch.randn(2, 11, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    rows = O.clone()
    rows[:, 8:] = float("nan")  # e.g. a skipped last block left as torch.empty
    line = evaluate(rows, O, outputs=("O",)).line
    assert (
        line.startswith("✗ check: O is wrong only at indices 8–10 of dim 1 (of 11)")
        and "; NaN at [0, 8, 0]" in line
    )
    lone = O.clone()
    lone[0, 0, 0] = float("nan")
    lone[1, 5, 2] = float("nan")
    assert evaluate(lone, O, outputs=("O",)).line.startswith("✗ check: O has NaN at [0, 0, 0]")


def test_a_known_mistake_that_makes_nans_is_named():
    Z = torch.tensor([[1000.0, 0.0], [1.0, 2.0]], dtype=torch.float64)
    naive = Z.exp() / Z.exp().sum(-1, keepdim=True)  # inf / inf = NaN in row 0
    line = evaluate(
        naive, Z.softmax(-1), outputs=("P",), mistakes={"P": {"e^Z without the max shift": naive}}
    ).line
    assert line.startswith("✗ check: P matches e^Z without the max shift (NaN at [0, 0]")


# ----------------------------------------------------------- a factor per index, not an index range

HEADS = torch.tensor([0.2, 0.6], dtype=torch.float64)[:, None, None]  # one temperature per head (H, 1, 1)


def _per_head_reference():
    ref = torch.randn(2, 2, 4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ref[:, :, 0] = 0  # query 0 sees one key: its gradient is 0, right or wrong (lab 6, window 3)
    return ref


def test_a_factor_that_differs_per_head_is_named_as_such_not_as_an_index_range():
    ref = _per_head_reference()
    got = ref / HEADS  # the per-head scale left out: wrong in every row but the zero one
    line = evaluate(got, ref, outputs=("grad_Q",)).line
    assert line == (
        "✗ check: grad_Q is wrong by a factor that differs along dim 1 (of 2): 5, 1.67 × the expected value"
    )
    assert "only at" not in line  # it was "wrong only at indices 1–3 of dim 2 (of 4)"
    named = evaluate(got, ref, outputs=("grad_Q",), factors={"scale": HEADS, "B": 2}).line
    assert named == "✗ check: grad_Q is 1/scale × the expected value (scale = 0.2, 0.6 along dim 1)"
    twice = evaluate(ref * HEADS, ref, outputs=("grad_Q",), factors={"scale": HEADS}).line
    assert twice == "✗ check: grad_Q is scale × the expected value (scale = 0.2, 0.6 along dim 1)"
    # a 0-d tensor factor is a plain number; a constant tensor too
    assert evaluate(ref / 0.5, ref, factors={"scale": torch.tensor(0.5)}).line.endswith(
        "is 1/scale × the expected value (scale = 0.5)"
    )
    assert evaluate(ref * 3, ref, factors={"s": torch.full((2, 1, 1), 3.0)}).line.endswith(
        "is s × the expected value (s = 3)"
    )
    assert evaluate(ref, ref, factors={"scale": HEADS}).status == "pass"


def test_one_head_off_by_a_factor_says_which_and_that_the_rest_is_right():
    ref = _per_head_reference()
    one = ref.clone()
    one[:, 1] *= 2
    line = evaluate(one, ref, outputs=("grad_K",)).line
    assert line == "✗ check: grad_K is 2 × the expected value at index 1 of dim 1 (of 2) and right elsewhere"
    three = torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    got = three.clone()
    got[5:] *= torch.tensor([2.0, 3.0, -1.0], dtype=torch.float64)[:, None]
    line = evaluate(got, three, outputs=("grad_K",)).line
    assert line == (
        "✗ check: grad_K is 2, 3, -1 × the expected value at indices 5, 6, 7 of dim 0 (of 8) and right elsewhere"
    )
    zero = ref.clone()
    zero[1] = 0  # left out, not scaled: located as before
    line = evaluate(zero, ref, outputs=("grad_K",)).line
    assert line == "✗ check: grad_K is wrong only at index 1 of dim 0 (of 2) (48 of 128 entries)"


def test_many_per_index_factors_are_listed_shortly_and_a_1d_answer_has_none():
    ref = torch.randn(8, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    c = torch.arange(1.0, 9.0, dtype=torch.float64)[:, None] + 1  # 2..9 per row
    line = evaluate(ref * c, ref, outputs=("g",)).line
    assert (
        line
        == "✗ check: g is wrong by a factor that differs along dim 0 (of 8): 2, 3, 4, 5, … × the expected value"
    )
    v = torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    assert "is wrong: largest error" in evaluate(v * torch.arange(1.0, 7.0), v).line  # one entry per "slice"


def test_random_wrong_answers_are_not_read_as_a_factor_per_index():
    gen = torch.Generator().manual_seed(6)
    for shape in ((5, 5), (3, 2), (2, 3, 4)):
        for _ in range(10):
            ref = torch.randn(*shape, dtype=torch.float64, generator=gen)
            wrong = torch.randn(*shape, dtype=torch.float64, generator=gen)
            line = evaluate(wrong, ref, outputs=("g",)).line
            assert "factor" not in line and "×" not in line, line
    ref = torch.randn(4, 6, dtype=torch.float64, generator=gen)
    near = ref.clone()
    near[0] *= 2
    near[0, 3] += 0.5  # row 0 is not one multiple of the expected row
    assert "factor" not in evaluate(near, ref).line and "× the expected" not in evaluate(near, ref).line


def test_an_index_range_is_located_only_when_it_covers_at_most_half_of_its_dim():
    v = torch.randn(520, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    nearly_all = v.clone()
    nearly_all[:515] += 1  # it was "wrong only at indices 0–514 (of 520)"
    line = evaluate(nearly_all, v, outputs=("grad_params",)).line
    assert "only at" not in line and line.startswith("✗ check: grad_params is wrong: largest error")
    half = v.clone()
    half[:260] += 1
    assert evaluate(half, v, outputs=("grad_params",)).line == (
        "✗ check: grad_params is wrong only at indices 0–259 (of 520) (260 of 520 entries)"
    )
    more = v.clone()
    more[:261] += 1
    assert "only at" not in evaluate(more, v, outputs=("grad_params",)).line
    O = torch.randn(2, 4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    rows = O.clone()
    rows[:, 1:] += 1  # 3 of 4 rows: not a small part
    assert "only at" not in evaluate(rows, O, outputs=("O",)).line


def test_an_output_that_must_stay_none_is_compared_not_crashed_on():
    """An expected None (an optimizer's buffer before any momentum) is an output like the others."""
    t = torch.zeros(2)
    line = evaluate((t, torch.ones(2)), (t, None), outputs=("theta", "buf"), name="step", atol=0, rtol=0).line
    assert line == "✗ step: buf is a Tensor, expected None"


def _module_forward(x):
    return torch.nn.Module()(x)  # nn.Module.forward left undefined: torch raises NotImplementedError


def _stub_raise(x):
    raise NotImplementedError("write it")


def test_only_the_learners_own_stub_reads_not_implemented_and_torchs_error_is_an_error():
    """Issue 32: a NotImplementedError torch raised read "not implemented yet", hiding a real error."""
    torch_raised = evaluate(_module_forward, double, args=(X,), name="f")
    assert torch_raised.status == "error" and "NotImplementedError" in torch_raised.line, torch_raised.line
    assert "not implemented yet" not in torch_raised.line
    own = evaluate(_stub_raise, double, args=(X,), name="f")
    assert own.status == "todo" and own.line == "· f: not implemented yet"


@pytest.mark.parametrize("got, expected", [(1.0000001, 1.0), (0.30000000000000004, 0.3), (7.0, 7.000000001)])
def test_got_and_expected_are_printed_with_enough_digits_to_differ(got, expected):
    """Issue 32: "got 1, expected 1" taught nothing; the digits grow until the two differ."""
    line = evaluate(
        lambda x: torch.tensor([got], dtype=torch.float64),
        torch.tensor([expected], dtype=torch.float64),
        args=(X,),
        name="f",
        atol=0,
        rtol=0,
    ).line
    g, e = line.split("(got ")[1].split(", expected ")
    assert g != e.split(";")[0].split(",")[0], line


def test_only_the_answers_own_stub_reads_not_implemented():
    """Learner A, s10: lab 10's FlashAttentionFn, written, read "· not implemented yet" because it called
    exercise 5's untouched stub. A NotImplementedError is the answer's stub only where the answer raised it."""
    from helpers import labcheck

    space: dict = {}
    exec("def stub(x):\n    raise NotImplementedError\n\ndef later(x):\n    return stub(x) + 1\n", space)
    with pytest.raises(NotImplementedError) as info:
        space["later"](1)
    assert labcheck._is_todo_error(info.value)  # read without the answer: any learner's raise
    assert not labcheck._is_todo_error(info.value, labcheck.own_codes(space["later"]))
    assert labcheck._is_todo_error(info.value, labcheck.own_codes(space["stub"]))
