"""One contract per exercise (labs/README.md "Contracts"): the self-check and the hidden tests draw on the
same case classes, the self-check reads recorded values only, and the mistake catalog is judged on them.

Covers every lab with a contract module in labs/source/contracts/ (all eleven).
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = ROOT / "labs" / "source" / "contracts"
import contract  # noqa: E402
import nbtool  # noqa: E402

import labs  # noqa: E402
from helpers import labcontract  # noqa: E402

LABS = contract.labs_with_contracts()


def _calls(lab: str) -> dict:
    """{exercise: [self-check call args]} from the source's cells."""
    checks = {}
    for q, where, cell in labs.regions(labs.read_nb(labs.source_path(lab))):
        if q is None or where.startswith("marker:"):
            continue
        tree = ast.parse(cell.source)
        calls = [
            n.value
            for n in tree.body
            if isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Name)
        ]
        for c in calls:
            args = [ast.literal_eval(a) if isinstance(a, ast.Constant) else ast.unparse(a) for a in c.args]
            if where == "selfcheck" and c.func.id == "check_contract":
                checks.setdefault(q, []).append(args)
    return checks


def test_there_is_a_contract_and_its_lab_is_a_lab():
    assert "lab02_chain_rule" in LABS
    assert set(LABS) <= set(labs.labs())


@pytest.mark.parametrize("lab", LABS)
def test_one_declaration_per_exercise_with_the_notebooks_name_and_signature(lab):
    c = contract.load(lab)
    questions = [q for q, _ in labs.questions(lab)]
    assert list(dict.fromkeys(ex.question for ex in c.exercises.values())) == questions
    text = (ROOT / "labs" / "source" / "src" / f"{lab}.py").read_text()
    for ex in c.exercises.values():
        kind = "class" if ex.signature.startswith("(torch.") else "def"
        assert f"{kind} {ex.function}{ex.signature}:" in text, (lab, ex.name, ex.function, ex.signature)
        assert ex.title.startswith(f"Exercise {ex.question[2:]} · {ex.function}")
        assert len(ex.classes) >= 3 and len({k.name for k in ex.classes}) == len(ex.classes)


@pytest.mark.parametrize("lab", LABS)
def test_self_check_and_hidden_tests_draw_on_the_same_case_classes(lab, figure):
    """Every class has public cases (recorded, the self-check's) and hidden ones (other values), and a
    hidden test generated for it; no class is hidden-only; each self-check is one call."""
    c = contract.load(lab)
    data = labcontract.load(lab)
    checks = _calls(lab)
    hidden: dict = {}  # (exercise, function) -> the case classes of its generated hidden tests
    for q in c.questions():
        for t in q.tests:
            assert t.lab == lab and c.exercises[t.exercise].question == q.name
            hidden.setdefault((t.exercise, t.function), []).append(t.case_class)
    rows = []
    for q in checks:  # one call per graded function, nothing else
        assert len(checks[q]) == len(c.of_question(q)), (q, checks[q])
    for ex in c.exercises.values():
        names = [k.name for k in ex.classes]
        recorded = data["exercises"][ex.name]
        assert [k["name"] for k in recorded["classes"]] == names, ex.name
        assert all(k["cases"] for k in recorded["classes"]), ex.name
        assert [lab[:5], ex.name, ex.function] in checks.get(ex.question, []), (
            ex.name,
            checks.get(ex.question),
        )
        assert hidden.get((ex.name, ex.function)) == names, (ex.name, hidden.get((ex.name, ex.function)))
        for k in ex.classes:
            public, secret = c.cases(ex.name, k.name)
            assert public and secret, (ex.name, k.name)
            enc = [json.dumps(labcontract.encode(tuple(x.args))) for x in public + secret]
            assert len(set(enc)) == len(enc), f"{ex.name} {k.name}: a hidden case repeats a public one"
            rows.append((len(public), len(secret)))
    figure(
        f"[{lab}] same generators: {len(rows)} case classes over {len(c.exercises)} exercises "
        f"({', '.join(f'{e}: {len(x.classes)}' for e, x in c.exercises.items())}); "
        f"{sum(p for p, _ in rows)} public and {sum(h for _, h in rows)} hidden cases in all; none hidden-only"
    )


@pytest.mark.parametrize("lab", LABS)
def test_the_recorded_data_is_what_the_contract_records_now(lab):
    """helpers/data/LAB.contract.json is fresh: the same cases, and every recorded number equal to what
    this machine records now at the tolerance its check uses (never bit for bit: another CPU's BLAS
    path changes the last bits)."""
    assert contract.load(lab).stale() == []


def _nudged(node, ulps: float = 0.0, rel: float = 0.0):
    """The recording with every float moved by `ulps` units in the last place of its dtype (a float
    outside a tensor is a float64), or by `rel` of its size (at least `rel` where it is 0)."""
    if isinstance(node, dict) and "tensor" in node:
        t = labcontract.decode(node)
        if t.is_floating_point():
            t = t + (ulps * torch.finfo(t.dtype).eps * t.abs() + rel * t.abs().clamp_min(1.0)).to(t.dtype)
        return {**node, "tensor": labcontract.encode(t)["tensor"]}
    if isinstance(node, dict):
        return {k: v if k in ("atol", "rtol") else _nudged(v, ulps, rel) for k, v in node.items()}
    if isinstance(node, list):
        return [_nudged(v, ulps, rel) for v in node]
    if isinstance(node, float):
        return node + ulps * sys.float_info.epsilon * abs(node) + rel * max(abs(node), 1.0)
    return node


@pytest.mark.parametrize("lab", ["lab02_chain_rule", "lab07_transformer_block"])
def test_a_recording_a_few_ulps_off_is_fresh_and_one_off_by_more_than_its_tolerance_is_not(lab):
    """What another machine's BLAS path does to the last bits passes the freshness rule; a real change
    (10⁻³ of every value, far above every class's tolerance) does not."""
    have = labcontract.load(lab)
    assert contract.differences(_nudged(have, ulps=2), have) == []
    stale = contract.differences(_nudged(have, rel=1e-3), have)
    assert stale and all("differs from the reference" in d or "expected" in d for d in stale), stale[:3]


@pytest.mark.slow
def test_a_recording_made_on_another_numerical_path_is_fresh(figure):
    """Recorded again in a fresh process on one thread, with ATen's plainest CPU kernels (no AVX): the
    last bits move, and the freshness rule still accepts the committed data."""
    lab = "lab07_transformer_block"
    code = (
        "import json, sys, torch; from helpers.labcontract import instructor_module; torch.set_num_threads(1); "
        "print(json.dumps(instructor_module(sys.argv[1]).CONTRACT.record()))"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1", "MKL_CBWR": "COMPATIBLE"}
    env["PYTHONPATH"] = str(
        ROOT / "tools"
    )  # the catalog's mutants are recorded too: tools/mutants.py reads them
    out = subprocess.run(
        [sys.executable, "-c", code, lab],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    other = json.loads(out.stdout)
    have = labcontract.load(lab)
    assert contract.differences(other, have) == []
    moved = contract.differences(other, have, exact=True)
    figure(
        f"[{lab}] recorded again on 1 thread without AVX: {len(moved)} recorded values differ bit for bit "
        "from the committed data, none beyond its check's tolerance"
    )


def _top_level_names(code: str) -> set:
    """The functions and classes a cell defines at its top level (a class's methods are the class's)."""
    return {n.name for n in ast.parse(code).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("lab", LABS)
def test_the_student_side_holds_no_reference(lab):
    """helpers/labcontract.py and the student notebook define none of the answers; the notebook's code
    outside the answer cells is the setup and one call per self-check."""
    c = contract.load(lab)
    tree = ast.parse((ROOT / "helpers" / "labcontract.py").read_text())
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    assert not defined & {ex.function for ex in c.exercises.values()}
    answers = set()  # what the learner writes: the functions and classes of the source's answer cells
    for _, where, cell in labs.regions(labs.read_nb(labs.source_path(lab))):
        if where == "solution" and cell.cell_type == "code":
            answers |= _top_level_names(cell.source)
    assert {ex.function for ex in c.exercises.values()} <= answers
    nb = labs.read_nb(labs.student_path(lab))
    for cell in nb.cells:
        if cell.cell_type != "code" or "google.colab" in cell.source:
            continue
        defs = _top_level_names(cell.source)
        assert defs <= answers, defs
        if not defs:
            lines = [ln for ln in cell.source.splitlines() if ln.strip()]
            assert all(ln.startswith(("import ", "from ", "check_contract(")) for ln in lines), lines
    assert "contracts" not in json.dumps(nb)


def test_a_functions_backward_that_calls_autograd_gets_a_cross_as_in_the_hidden_tests():
    """A newcomer's Softmax.backward ran torch.autograd.grad under enable_grad: ✓ in the self-check (a
    Function came back unguarded), 0 in the hidden tests (the worker guards autograd's engine). The
    self-check now runs the Function's backward guarded, as it runs a function."""
    from torch.autograd.function import once_differentiable

    honest = {
        "torch": torch,
        "once_differentiable": once_differentiable,
    }  # an honest corpus notebook's answers
    exec((ROOT / "tests/data/similarity/honest/lab04/ana.py").read_text(), honest)
    assert labcontract.evaluate_contract("lab04", "ex2", honest["Softmax"]).line.startswith("✓")

    class Softmax(honest["Softmax"]):  # the same forward, a backward by autograd
        @staticmethod
        @once_differentiable
        def backward(ctx, grad_P):
            (P,) = ctx.saved_tensors
            with torch.enable_grad():
                Z = P.log().detach().requires_grad_()
                return torch.autograd.grad(torch.softmax(Z, -1), Z, grad_P)[0]

    line = labcontract.evaluate_contract("lab04", "ex2", Softmax).line
    assert line.startswith("✗") and "uses autograd (grad), where this exercise asks for it by hand" in line, (
        line
    )
    guarded = labcontract.by_hand(Softmax, ("autograd",))
    assert issubclass(guarded, Softmax) and guarded.__name__ == "Softmax"
    assert labcontract.by_hand(Softmax, ()) is Softmax
    assert torch.autograd.grad is not None and "refused" not in torch.autograd.grad.__name__  # put back


def test_lab1s_forward_by_the_course_module_gets_a_cross_as_its_prompt_says():
    """Lab 1 imports helpers.cat_mlp for the seed's numbers; its prompt says cat_mlp.forward in exercise 1
    (and cat_mlp.backward after it) scores 0: the self-check says ✗ first."""
    from helpers import cat_mlp

    def forward_pass(x, W1, b1, W2, b2, y_true):
        return cat_mlp.forward(x, W1, b1, W2, b2, y_true)

    line = labcontract.evaluate_contract("lab01", "ex1", forward_pass).line
    assert line.startswith("✗") and "uses helpers.cat_mlp.forward" in line, line
    text = labs.read_nb(labs.source_path("lab01_cat_mlp")).cells
    assert any("calling it scores 0 for this exercise" in c.source for c in text if c.cell_type == "markdown")


def test_an_optimizer_step_answered_by_torch_optim_gets_a_cross():
    """Red team 11: lab 11's steps answered by loading the state into a torch.optim optimizer and calling
    its step (7 of 12 points, no review). Every optimizer's step is refused in the step exercises (found
    from torch.optim, so ASGD, which is plain SGD without decay, too); lab 11 ex5's loop still steps."""

    def sgd_step(theta, g, buf, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0):
        p = torch.nn.Parameter(theta.detach().clone())
        opt = torch.optim.SGD([p], lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay)
        if buf is not None:
            opt.state[p]["momentum_buffer"] = buf.detach().clone()
        p.grad = g.clone()
        opt.step()
        return p.detach(), opt.state[p].get("momentum_buffer", buf)

    line = labcontract.evaluate_contract("lab11", "ex1", sgd_step).line
    assert line.startswith("✗") and "uses torch.optim.SGD.step" in line, line
    listed = {q.name: set(q.by_hand) for q in labs.contract("lab11_training_by_hand").questions()}
    for q in ("ex1", "ex2", "ex3"):
        assert {"torch.optim.SGD.step", "torch.optim.ASGD.step", "torch.optim.AdamW.step"} <= listed[q], q
    assert not any(n.startswith("torch.optim") for n in listed["ex5"])


def test_a_cross_names_the_failing_case_class_before_any_number():
    def only_3d(X, W, grad_Y):  # a learner's dense_backward that works for (B, T, in) only
        return grad_Y @ W.T, (X.mT @ grad_Y).sum(0), grad_Y.sum((0, 1))

    line = labcontract.evaluate_contract("lab02", "ex2", only_3d).line
    assert line.startswith("✗ Exercise 2 · dense_backward fails when X is 1-D (in,)"), line
    assert "— works when X is 3-D (B, T, in)" in line, line
    with pytest.raises(AssertionError, match=r"fails when X is 2-D \(R, in\): grad_W has shape"):
        labcontract.hidden_check("lab02", "ex2", only_3d, "X is 2-D (R, in)")
    with pytest.raises(RuntimeError):  # a learner's error reaches the harness as itself (its notes name it)
        labcontract.hidden_check("lab02", "ex2", only_3d, "X is 1-D (in,)")
    labcontract.hidden_check("lab02", "ex2", only_3d, "X is 3-D (B, T, in)")  # right where it works


def test_a_transposed_view_crosses_the_grading_boundary_as_one():
    """The non-contiguous class means something in the harness: wire keeps a transpose's layout."""
    import wire

    a, b = wire.Peer(None, None), wire.Peer(None, None)
    for t in (torch.randn(2, 4, 3).transpose(-1, -2), torch.randn(3, 5).T):
        blobs = []
        back = b.decode(a.encode(t, blobs), blobs)
        assert torch.equal(back, t) and back.stride() == t.stride() and not back.is_contiguous()
    t = torch.randn(4, 6)[:, ::2]  # not a permutation of a dense layout: crosses contiguous, as before
    blobs = []
    back = b.decode(a.encode(t, blobs), blobs)
    assert torch.equal(back, t) and back.is_contiguous()


def test_contract_modules_are_linted_and_formatted():
    """labs/source/contracts/ is not under tests/test_lint.py's paths: ruff runs on it here."""
    import os

    env = dict(os.environ, RUFF_NO_CACHE="true")
    for args in (["check"], ["format", "--check"]):
        run = subprocess.run(
            [sys.executable, "-m", "ruff", *args, str(CONTRACTS)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env=env,
        )
        assert run.returncode == 0, run.stdout + run.stderr


def test_the_text_source_of_the_contract_lab_is_its_notebook():
    assert all(lab not in p for p in nbtool.check() for lab in LABS)


# ------------------------------------------------------------- the format's other kinds of answer


class _Square(torch.autograd.Function):
    """x² with its backward 2x·g (a learner's Function; `wrong` doubles the gradient)."""

    wrong = False

    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return (4 if _Square.wrong else 2) * x * g


def test_backward_through_judges_a_function_by_what_autograd_gets_from_it():
    x, g = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    out, grad_x = labcontract.run_probe("backward_through", _Square, (x,), {}, {"grad_output": g})
    assert torch.equal(out, x * x) and torch.allclose(grad_x, 2 * x * g) and not x.requires_grad
    _Square.wrong = True
    try:
        _, bad = labcontract.run_probe("backward_through", _Square, (x,), {}, {"grad_output": g})
    finally:
        _Square.wrong = False
    why = labcontract.disagreement((out, bad), (out, grad_x), ("out", "grad_x"), 1e-12, 0)
    assert why == "grad_x differs from the reference"
    with pytest.raises(NotImplementedError):  # a stub's forward returns None: "not implemented yet"
        labcontract.run_probe("backward_through", type("Stub", (), {"apply": lambda *a: None}), (x,), {}, {})


def test_returns_and_changes_reads_the_arguments_after_an_in_place_step():
    def step(theta, g, lr):
        theta.sub_(lr * g)
        return theta

    theta, g = torch.ones(2), torch.full((2,), 2.0)
    out = labcontract.run_probe("returns_and_changes", step, (theta, g, 0.5), {}, {"changed": (0,)})
    assert torch.equal(out[0], torch.zeros(2)) and torch.equal(out[1], torch.zeros(2))


def test_an_argument_written_in_place_to_the_same_values_gets_a_cross_on_both_sides():
    """A newcomer's lab 10 ``grad_O.mul_(1.0)`` kept every value, so a comparison of values passed it (✓ and
    4/4) where the prompt says the arguments are left alone: the version counter says it was written."""

    def row_D(O, grad_O):
        return (O * grad_O.mul_(1.0)).sum(-1)

    line = labcontract.evaluate_contract("lab10", "ex3", row_D).line
    assert line.startswith("✗") and "changed its argument grad_O in place" in line, line
    c = contract.load("lab10_flash_attention")
    with pytest.raises(AssertionError, match="changed its argument"):
        c.hidden_check("ex3", row_D, c.exercises["ex3"].classes[0].name)
    assert (
        labcontract.evaluate_contract("lab10", "ex3", lambda O, grad_O: (O * grad_O).sum(-1)).line[0] == "✓"
    )


def test_a_none_returned_by_an_answer_that_works_elsewhere_is_not_called_a_stub():
    def relu_backward(grad_a, h):
        return None if (h == 0).any() else grad_a * (h > 0)

    r = labcontract.evaluate_contract("lab01_cat_mlp", "ex4", relu_backward)
    assert r.status == "fail" and r.line.endswith("returned None where grad_h is expected"), r.line
    assert "not implemented" not in r.line


def test_a_meta_output_is_recorded_as_where_it_was_made_and_judged_on_that_alone():
    meta = torch.empty(3, 4, dtype=torch.bool, device="meta")
    (back,) = labcontract.decode(json.loads(json.dumps(labcontract.encode((meta,)))))
    assert back.device.type == "meta" and back.shape == (3, 4) and back.dtype == torch.bool
    cpu = torch.ones(3, 4, dtype=torch.bool)
    why = labcontract.disagreement(cpu, meta, ("mask",), 0, 0)
    assert why.startswith("mask is on cpu, expected meta"), why
    assert labcontract.disagreement(meta, meta, ("mask",), 0, 0) is None


def test_a_made_object_is_recorded_as_how_to_build_it():
    W, b = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, dtype=torch.float64)
    made = labcontract.Made("torch.nn.Linear", 3, 2, dtype=torch.float64, state={"weight": W, "bias": b})
    node = json.loads(json.dumps(labcontract.encode((made,))))
    (layer,) = labcontract.decode(node)
    assert isinstance(layer, torch.nn.Linear) and torch.equal(layer.weight, W) and torch.equal(layer.bias, b)
    with pytest.raises(ValueError, match="path: expected a name under"):
        labcontract.Made("os.system", "true")
    with pytest.raises(ValueError, match="cannot build"):
        labcontract.decode({"make": "builtins.eval", "args": {"tuple": ["1"]}})


@pytest.mark.parametrize(
    "got, expected, why",
    [
        (3, 3, None),
        (3.0, 3, "n is a float, expected an int"),
        (True, 1, "n is a bool, expected an int"),
        (4, 3, "n is 4, expected 3"),
        (0.5 + 1e-12, 0.5, None),
        (None, None, None),
        ([torch.ones(2)], [torch.ones(2)], None),
        ([torch.ones(2)], [torch.ones(2), torch.ones(2)], "n is a list, expected a list of 2"),
        ({"a": 1}, {"a": 2}, "n['a'] is 1, expected 2"),
        (torch.tensor([True, False]), torch.tensor([True, True]), "n differs from the reference"),
        (torch.tensor([1, 2]), torch.tensor([1.0, 2.0]), "n has dtype torch.int64, expected torch.float32"),
    ],
)
def test_the_comparison_rule_keeps_types_and_structure(got, expected, why):
    assert labcontract.disagreement(got, expected, ("n",), 1e-9, 1e-9) == why


def test_by_hand_refuses_what_the_exercise_forbids_only_while_the_answer_runs():
    """The question's ``by_hand`` list (autograd, reference functions) raises ByHand inside the answer,
    also under a name the learner's notebook bound it to, and everything is restored afterwards."""
    from helpers import cat_mlp

    original = (torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward, cat_mlp.backward)
    space = {"torch": torch, "backward": cat_mlp.backward}
    exec(
        "def by_autograd(x):\n    x = x.clone().requires_grad_()\n    (x * x).sum().backward()\n    return x.grad",
        space,
    )
    exec("def by_reference(*a):\n    return backward(*a)", space)
    exec("def honest(x):\n    return 2 * x", space)
    exec(
        "import threading\ndef in_a_thread(x):\n    out = []\n"
        "    t = threading.Thread(target=lambda: out.append(2 * x))\n    t.start()\n    t.join()\n    return out[0]",
        space,
    )
    with pytest.raises(labcontract.ByHand, match=r"uses a thread \(start\)"):
        labcontract.by_hand(space["in_a_thread"], ["autograd"])(torch.ones(2))
    guarded = labcontract.by_hand(space["by_autograd"], ["autograd", "helpers.cat_mlp.backward"])
    with pytest.raises(labcontract.ByHand, match=r"uses autograd \(backward\)"):
        guarded(torch.ones(3))
    with pytest.raises(labcontract.ByHand, match=r"uses helpers.cat_mlp.backward"):
        labcontract.by_hand(space["by_reference"], ["helpers.cat_mlp.backward"])(1, 2)
    assert torch.equal(
        labcontract.by_hand(space["honest"], ["autograd"])(torch.ones(2)), torch.full((2,), 2.0)
    )
    assert (torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward, cat_mlp.backward) == original
    assert space["backward"] is cat_mlp.backward
    assert labcontract.by_hand(space["honest"], ()) is space["honest"]
    assert labcontract.by_hand(torch.autograd.Function, ["autograd"]) is torch.autograd.Function


def _lab1_layer2(body: str, header: str = "") -> tuple[dict, str]:
    """(the namespace, the self-check's line) of a lab 1 exercise 3 answer: ``header``, then the def and ``body``."""
    space = {"torch": torch}
    exec(header + "def layer2_backward(grad_y_hat, a, W2):\n" + body, space)
    return space, labcontract.evaluate_contract("lab01", "ex3", space["layer2_backward"]).line


def test_a_by_hand_exercise_answered_with_autograd_gets_a_cross_on_both_sides():
    """Lab 1 exercise 3 asks for grad_a by hand: an answer by autograd is right in value, and gets ✗
    naming autograd in the self-check and an AssertionError in its hidden tests."""
    space, line = _lab1_layer2(
        "    a_ = a.detach().requires_grad_()\n"
        "    (grad_a,) = torch.autograd.grad(W2 @ a_, a_, grad_y_hat)\n"
        "    return torch.outer(grad_y_hat, a), grad_y_hat.clone(), grad_a\n"
    )
    assert line.startswith("✗") and "uses autograd (grad)" in line, line
    c = contract.load("lab01_cat_mlp")
    assert c.exercises["ex3"].by_hand[:2] == ("autograd", "helpers.cat_mlp.backward")  # then the course's
    with pytest.raises(AssertionError, match="uses autograd"):
        c.hidden_check("ex3", space["layer2_backward"], c.exercises["ex3"].classes[0].name)


# a backward by finite differences, written as a learner would (only ops every allow-list holds): right in
# value to 1e-10 (central differences are exact for a function linear in each entry), and no autograd
FINITE_DIFFERENCES = """
def _slope(f, args, i, eps=1.0):
    g = torch.zeros_like(args[i])
    for k in range(args[i].numel()):
        up = [a.clone() for a in args]
        down = [a.clone() for a in args]
        up[i].view(-1)[k] += eps
        down[i].view(-1)[k] -= eps
        g.view(-1)[k] = (f(*up) - f(*down)) / (2 * eps)
    return g

def layer2_backward(grad_y_hat, a, W2):
    b2 = torch.zeros_like(grad_y_hat)
    f = lambda a_, W, b: (grad_y_hat * (W @ a_ + b)).sum()
    return _slope(f, [a, W2, b2], 1), _slope(f, [a, W2, b2], 2), _slope(f, [a, W2, b2], 0)
"""


def test_a_backward_by_finite_differences_gets_a_cross_on_both_sides_on_the_large_case_only():
    """The prompt's "no finite differences", measured: the tensor entries written on the large case, against
    WORK_FACTOR × the reference's. Every other class passes, so the ✗ names the large one alone."""
    space = {"torch": torch}
    exec(FINITE_DIFFERENCES, space)
    line = labcontract.evaluate_contract("lab01", "ex3", space["layer2_backward"]).line
    assert line.startswith("✗ Exercise 3 · layer2_backward fails when the tensors are large"), line
    assert "works when the sizes are the cat's" in line and "(finite differences, not a backward)" in line
    c = contract.load("lab01_cat_mlp")
    large = [k.name for k in c.exercises["ex3"].classes if k.rules.get("writes")]
    assert len(large) == 1
    with pytest.raises(AssertionError, match="finite differences"):
        c.hidden_check("ex3", space["layer2_backward"], large[0])
    c.hidden_check("ex3", space["layer2_backward"], c.exercises["ex3"].classes[0].name)  # right in value
    c.hidden_check("ex3", c.exercises["ex3"].reference, large[0])


NUMPY_DIFFERENCES = """
import numpy as np

def layer1_backward(grad_h, x):
    gh, xx = grad_h.detach().double().numpy(), x.detach().double().numpy()
    W, g = np.zeros((gh.shape[0], xx.shape[0])), np.zeros((gh.shape[0], xx.shape[0]))
    for k in range(W.size):
        up, down = W.copy(), W.copy()
        up.flat[k] += 1.0
        down.flat[k] -= 1.0
        g.flat[k] = ((gh * (up @ xx)).sum() - (gh * (down @ xx)).sum()) / 2
    return torch.from_numpy(g).to(grad_h.dtype), grad_h.clone()
"""


def test_finite_differences_on_numpy_copies_get_a_cross_for_the_values_they_read_out_of_tensors():
    """NumPy's work writes no tensor entries ("writes" saw nothing): the large class counts the values the
    answer reads out of tensors instead ("exits"), and the course's own backward reads none."""
    space = {"torch": torch}
    exec(NUMPY_DIFFERENCES, space)
    line = labcontract.evaluate_contract("lab01", "ex5", space["layer1_backward"]).line
    assert line.startswith("✗ Exercise 5 · layer1_backward fails when the tensors are large"), line
    assert "values out of tensors into Python or NumPy" in line and "0 points for the exercise" in line, line
    c = contract.load("lab01_cat_mlp")
    large = [k.name for k in c.exercises["ex5"].classes if k.rules.get("exits")]
    assert len(large) == 1
    with pytest.raises(AssertionError, match="NumPy"):
        c.hidden_check("ex5", space["layer1_backward"], large[0])
    c.hidden_check("ex5", c.exercises["ex5"].reference, large[0])


def test_a_value_read_out_of_a_tensor_counts_where_the_answer_reads_it_not_where_torch_or_a_probe_does():
    """``.item()``, ``float()``, ``.tolist()``, ``.numpy()``, ``np.asarray`` and printing, each counted once
    per entry, and only from the answer's own code (torch's printer reads every entry itself); a bool
    tensor's bits (a loop's ``if h[i] > 0``) apart, as branches. Red team 6's two ways around it count too:
    the method kept before the call, and a read made from a standard-library frame."""
    import functools

    import numpy as np

    x = torch.arange(6.0).reshape(2, 3)
    kept = torch.Tensor.tolist  # taken before any trace: the counting wrapper, put there on import

    def reads(fn):
        seen = labcontract.traced(None, fn, (x,), {}, None)[1]
        return seen["exits"], seen["branches"]

    assert reads(lambda t: t * 2) == (0, 0)
    assert reads(lambda t: t[0, 0].item()) == (1, 0)
    assert reads(lambda t: float(t[1, 2])) == (1, 0)
    assert reads(lambda t: t.tolist()) == (6, 0)
    assert reads(lambda t: t.numpy() + 1) == (6, 0)
    assert reads(lambda t: np.asarray(t)) == (6, 0)
    assert reads(lambda t: repr(t)) == (6, 0)
    assert reads(lambda t: kept(t)) == (6, 0)
    assert reads(lambda t: functools.singledispatch(torch.Tensor.tolist)(t)) == (6, 0)
    assert reads(lambda t: functools.singledispatch(float)(t[0, 0])) == (1, 0)
    assert reads(lambda t: [bool(v > 2) for v in t.view(-1)]) == (0, 6)
    assert reads(lambda t: (t > 2).tolist()) == (0, 6)
    # every entry handed to a Python function (red team 10: differences in plain Python, 9.22/11 on lab 1)
    assert reads(lambda t: t.clone().apply_(lambda v: v)) == (6, 0)
    assert reads(lambda t: t.clone().map_(t, lambda a, b: a)) == (12, 0)
    assert reads(lambda t: t.clone().map2_(t, t, lambda a, b, c: a)) == (18, 0)
    # a number an op hands out (red team 12): a Python bool, a length the values decide; not an index's shape
    assert reads(lambda t: [torch.equal(t[0, 0].clamp(max=k / 8), t[0, 0]) for k in range(30)]) == (30, 0)
    assert reads(lambda t: t.allclose(t + 1)) == (1, 0)
    assert reads(lambda t: (t > 2).nonzero().shape[0]) == (0, 1)
    assert reads(lambda t: t[t > 2].numel()) == (0, 1)
    assert reads(lambda t: torch.repeat_interleave((t * 100).long().view(-1)).numel()) == (1, 0)
    assert reads(lambda t: t[torch.arange(2), torch.tensor([1, 2])]) == (0, 0)
    assert x.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]  # outside a trace the wrapper only passes through
    # a probe that traces inside the trace (within_budget's memory watch): the outer one counts too
    capped = labcontract.traced("within_budget", lambda t: t.tolist(), (x,), {}, {"cap": 1 << 30})[1]
    assert capped["exits"] == 6, capped["exits"]
    assert labcontract.two_per_entry(x, scale=torch.ones(3)) == 2 * 9 + labcontract.ALLOWANCE["exits"]


def test_every_tensor_method_a_by_hand_answer_may_call_counts_what_it_hands_out_of_the_values():
    """The audit of the allow-list's tensor surface, by construction rather than by listing attacks: every
    method of ``torch.Tensor`` that a by-hand answer may call (``reach.ALLOWED["by_hand"]``), called on
    tensors that differ only in their values, either hands back the same Python values and shapes for
    all of them, or is counted as a read on every call (red team 12: ``torch.equal`` and
    ``.nonzero().shape`` rebuilt floats one bit a call, uncounted)."""
    import warnings

    import reach

    def seen(v) -> list:  # what the caller gets that is not a tensor's values: Python values and shapes
        if isinstance(v, torch.Tensor):
            return [tuple(v.shape)]
        if isinstance(v, (list, tuple)):
            return [s for x in v for s in seen(x)]
        return [repr(v)]

    def variants():  # one shape, values that differ: signs, zeros, repeats, the second tensor equal or not
        g = torch.Generator().manual_seed(0)
        t, u = torch.randn(2, 3, 3, generator=g, dtype=torch.float64)
        for x, y in (
            (t, t),
            (t, u),
            (-t.abs(), u),
            (t.clamp(min=0), t.clamp(min=0)),
            (0 * t, 0 * t),
            (t.round(), u),
        ):
            yield x, y.clone()

    unseen, tried = [], 0
    names = sorted(
        n for n in reach.ALLOWED["by_hand"]["attributes"] if callable(getattr(torch.Tensor, n, None))
    )
    for name in names:
        for args in (
            (),
            ("u",),
            (0,),
            ("u", 0.5),
            ("m",),
            ("m", 0.5),
            (0, "i"),
            (-1,),
            (1, 0),
            ((9,),),
            (0, 1, 2),
            ("u", "u"),
        ):
            got = []
            for x, u in variants():

                def call(t, u_, _a=args, _n=name):
                    given = {"u": u_, "m": u_ > 0, "i": torch.tensor([0, 2])}
                    return getattr(t, _n)(*(given.get(a, a) if isinstance(a, str) else a for a in _a))

                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        out, trace = labcontract.traced(None, call, (x.clone(), u), {}, None)
                except Exception:
                    got = None
                    break
                got.append((seen(out), trace["exits"] + trace["branches"]))
            if got is None:
                continue  # these arguments do not fit the method: the next set
            if len({repr(s) for s, _ in got}) > 1 and not all(n for _, n in got):
                unseen.append(f"{name}{args}")
            tried += 1
            break
    # the rest take arguments drawn otherwise (integers for bitwise ops, batches, vectors, sparse layouts)
    assert tried > 0.75 * len(names), f"called {tried} of {len(names)}"
    assert not unseen, f"hand out values uncounted: {unseen}"


def test_integers_the_call_was_given_are_read_free_unless_it_wrote_them():
    """Red team 8's honest cross-entropy backward read each row's class, ``int(target[r])``, and lost lab 4
    ex4 (0/3): given integers carry no derivative. Integers the call computed, or wrote into an argument
    first (floats scaled into it), still count."""
    x = torch.randn(4, 3)

    def reads(fn):
        return labcontract.traced(None, fn, (x, torch.tensor([2, 0, 1, 1])), {}, None)[1]["exits"]

    assert reads(lambda x, t: [int(t[r]) for r in range(4)]) == 0
    # what is made from the given integers alone is given data too: the rows a mask keeps (an honest
    # corpus answer looped `for r in (target != ignore).nonzero()`: 42 reads, ✗ on lab 5 ex1)
    assert reads(lambda x, t: [int(t[r]) + int(r) for r in (t != 1).nonzero().flatten()]) == 0
    assert reads(lambda x, t: (t % 2).tolist() + torch.arange(4).tolist()) == 0
    assert reads(lambda x, t: (t + (x[:, 0] > 0).long()).tolist()) == 4  # a float's sign in it
    assert reads(lambda x, t: t.tolist()) == 0
    assert reads(lambda x, t: (x * 1e6).long().tolist()) == 12  # integers it made from floats
    assert reads(lambda x, t: t.copy_((x[:, 0] * 1e6).long()).tolist()) == 4  # written into the given
    assert reads(lambda x, t: [float(x[r, int(t[r])]) for r in range(4)]) == 4  # the floats still count
    # a float argument seen as integers is still the float's bits (red team 9: 11/11 on lab 1 that way)
    assert reads(lambda x, t: x.detach().view(torch.int32).tolist()) == 12
    assert reads(lambda x, t: x.detach().view(torch.int32).numpy()) == 12


def test_comparisons_read_out_one_per_entry_pass_and_thirty_per_value_do_not():
    """A branch per entry (``if h[i] > 0``) is derived work; rebuilding a value bit by bit from comparisons
    (red team 6's way to difference a forward in plain Python) reads many per entry: "branches"."""
    # entry by entry over any shape (flattened), so that only the large class can tell the two apart
    branch = (
        "def relu_backward(grad_a, h):\n    g_, h_ = grad_a.reshape(-1), h.reshape(-1)\n"
        "    return torch.stack([g if v > 0 else g * 0 for g, v in zip(g_, h_)]).reshape(h.shape)\n"
    )
    bits = (
        "def relu_backward(grad_a, h):\n    g_, h_ = grad_a.reshape(-1), h.reshape(-1)\n"
        "    gate = [sum(bool(v > k / 8) for k in range(-4, 4)) > 4 for v in h_]\n"
        "    return torch.stack([g if o else g * 0 for g, o in zip(g_, gate)]).reshape(h.shape)\n"
    )
    lines = {}
    for name, code in (("branch", branch), ("bits", bits)):
        space = {"torch": torch}
        exec(code, space)
        lines[name] = labcontract.evaluate_contract("lab01", "ex4", space["relu_backward"]).line
    large = "the tensors are large (h (1024,))"
    assert lines["branch"].startswith("✓"), lines["branch"]
    assert lines["bits"].startswith(f"✗ Exercise 4 · relu_backward fails when {large}"), lines["bits"]


def test_every_exercise_that_asks_for_a_gradient_by_hand_refuses_the_courses_backwards_it_is_not_given():
    """By construction (contract.course_backwards, contract.given_helpers): lab 1's answer may not be
    helpers.numgrad.linear_backward; lab 7 gives attention_backward, so only an exercise naming it refuses it."""
    backwards = set(contract.course_backwards())
    assert {"helpers.numgrad.linear_backward", "helpers.attention.attention_backward"} <= backwards
    # what a given helper calls in turn is given with it (lab 7's attention_backward calls softmax_backward)
    assert "helpers.functions.softmax_backward" in contract.given_helpers("lab07_transformer_block")
    for lab in LABS:
        c = contract.load(lab)
        given = contract.given_helpers(lab)
        for e in c.exercises.values():
            if "autograd" in e.by_hand:
                missing = backwards - given - set(e.by_hand)
                assert not missing, f"{lab} {e.name} may call {sorted(missing)[:3]}"
    _, line = _lab1_layer2(
        "    ga, gW, gb = linear_backward(a[None], W2, grad_y_hat[None])\n    return gW, gb[0], ga[0]\n",
        "from helpers.numgrad import linear_backward\n",
    )
    assert line.startswith("✗") and "helpers.numgrad.linear_backward" in line, line


def test_every_backward_a_question_asks_by_hand_declares_a_large_case_where_its_work_is_measured():
    """By construction, not by a list: an exercise returning a gradient whose question forbids autograd
    has a class with the "writes" rule (lab 9's backward is autograd's by design: its questions allow it)."""
    missing = []
    for lab in LABS:
        c = contract.load(lab)
        first: dict = {}
        for e in c.exercises.values():
            first.setdefault(e.question, e)
        for e in c.exercises.values():
            derived = "autograd" in first[e.question].by_hand and any(
                str(o).startswith("grad_") for o in e.outputs
            )
            if derived and not any("writes" in {**e.rules, **k.rules} for k in e.classes):
                missing.append(f"{lab} {e.name}")
    assert not missing, missing


def test_every_lab_that_measures_the_work_says_so_in_its_prompt_with_the_factor_it_uses():
    measured = {
        lab
        for lab in LABS
        for ex in contract.load(lab).exercises.values()
        for k in ex.classes
        if "writes" in {**ex.rules, **k.rules}
    }
    assert {"lab01_cat_mlp", "lab04_custom_functions", "lab06_attention_backward"} <= measured
    for lab in LABS:
        lines = (ROOT / "labs" / "source" / "src" / f"{lab}.py").read_text(encoding="utf-8").splitlines()
        text = " ".join(" ".join(ln.removeprefix("#").strip() for ln in lines).split())
        stated = f"at most {contract.WORK_FACTOR} × what the course's backward writes" in text
        assert stated == (lab in measured), lab
        exits = (
            f"count too, at most {labcontract.ALLOWANCE['exits']}" in text
            and "scores 0 for its exercise" in text
        )
        assert exits == (lab in measured), f"{lab}: the prompt does not state the exits rule and its cost"


def test_a_cross_caused_by_an_earlier_answer_says_so():
    """Lab 6 exercise 4 calls the learner's causal_mask: with exercise 1 wrong (align ignored) and exercise 4
    right, exercise 4's ✗ adds that exercise 1 fails its own self-check (one bug, named once at its source)."""
    import mutants

    setup, sols = contract._solutions("lab06_attention_backward")
    wrong_ex1 = [
        c.replace('shift = Nk - Nq if align == "bottom_right" else 0', "shift = 0") for c in sols["ex1"]
    ]
    assert wrong_ex1 != sols["ex1"]
    space: dict = {"__name__": "__learner__"}
    for code in [*setup, *wrong_ex1, *sols["ex2"], *sols["ex3"], *sols["ex4"]]:
        mutants._run(code, space)
    line = labcontract.evaluate_contract("lab06", "ex4", space["attention_grads"]).line
    assert line.startswith("✗") and line.endswith(
        "your causal_mask (Exercise 1) fails its own self-check: fix it first" + REPLACED
    ), line
    # two earlier answers wrong: both named (issue 32: only the first was)
    wrong_ex3 = [
        c.replace("    grad_V = P.transpose(-2, -1) @ grad_O", "    grad_V = P @ grad_O") for c in sols["ex3"]
    ]
    assert wrong_ex3 != sols["ex3"]
    for code in wrong_ex3:
        mutants._run(code, space)
    line = labcontract.evaluate_contract("lab06", "ex4", space["attention_grads"]).line
    assert line.endswith(
        "your causal_mask (Exercise 1) and your attention_backward (Exercise 3) fail their own self-checks: "
        "fix them first" + REPLACED
    ), line
    for code in [*sols["ex1"], *sols["ex3"]]:
        mutants._run(code, space)
    assert labcontract.evaluate_contract("lab06", "ex4", space["attention_grads"]).line.startswith("✓")


REPLACED = " (graded, this exercise runs with the course's in place of yours)"


def test_a_rule_broken_through_an_earlier_answer_the_hidden_tests_replace_costs_nothing_here():
    """Learner A, s10: lab 4 ex1 built the n × n Jacobian; ex2's Softmax, which calls it, read "writes … (finite
    differences, not a backward): 0 points for the exercise when graded", and the hidden tests gave ex2 2/2
    (they run the course's softmax_backward in its place: ex2 `calls` ex1). The ✗ names ex1 and says so."""
    import mutants

    setup, sols = contract._solutions("lab04_custom_functions")
    jacobian = [
        c.replace(
            "    inner = (grad_P * P).sum(-1, keepdim=True)  # (..., 1): one ⟨g, p⟩ per row\n"
            "    return P * (grad_P - inner)  # (..., n)",
            "    J = torch.diag_embed(P) - P[..., :, None] * P[..., None, :]\n"
            "    return (J @ grad_P[..., None])[..., 0]",
        )
        for c in sols["ex1"]
    ]
    calling = [  # the learner's Softmax.backward calls their softmax_backward, as the prompt allows
        c.replace(
            "        inner = (grad_P * P).sum(-1, keepdim=True)  # (..., 1)\n"
            "        return P * (grad_P - inner)  # (..., n)",
            "        return softmax_backward(P, grad_P)",
        )
        for c in sols["ex2"]
    ]
    assert jacobian != sols["ex1"] and calling != sols["ex2"]
    space: dict = {"__name__": "__learner__"}
    for code in [*setup, *jacobian, *calling]:
        mutants._run(code, space)
    line = labcontract.evaluate_contract("lab04", "ex2", space["Softmax"]).line
    assert line.startswith("✗") and "writes" in line, line
    assert labcontract.GRADED not in line, line
    assert line.endswith(
        "your softmax_backward (Exercise 1) fails its own self-check: fix it first" + REPLACED
    )
    # where nothing replaces the earlier answer, the cost stands (lab 1's exercises call none)
    assert "calls" not in labcontract.load("lab01")["exercises"]["ex6"]


def test_an_exercise_is_graded_with_the_references_of_the_earlier_ones_it_calls():
    """Issue 24: with lab 6's exercise 1 wrong, exercise 4 (which calls causal_mask) passes its hidden tests,
    graded with exercise 1's reference in its place; the learner's own causal_mask is back afterwards."""
    import mutants

    setup, sols = contract._solutions("lab06_attention_backward")
    wrong_ex1 = [
        c.replace('shift = Nk - Nq if align == "bottom_right" else 0', "shift = 0") for c in sols["ex1"]
    ]
    space: dict = {"__name__": "__learner__"}
    for code in [*setup, *wrong_ex1, *sols["ex2"], *sols["ex3"], *sols["ex4"]]:
        mutants._run(code, space)
    theirs = space["causal_mask"]
    c = contract.load("lab06_attention_backward")
    assert c.exercises["ex4"].calls == ("ex1", "ex2", "ex3")
    bottom_right = [k.name for k in c.exercises["ex4"].classes if "bottom" in k.name]
    assert bottom_right
    with pytest.raises(AssertionError):
        c.hidden_check("ex1", theirs, [k.name for k in c.exercises["ex1"].classes if "bottom" in k.name][0])
    for name in bottom_right:
        c.hidden_check("ex4", space["attention_grads"], name)
    assert space["causal_mask"] is theirs


@pytest.mark.parametrize("lab", LABS)
def test_every_earlier_exercise_a_solution_calls_is_declared_in_calls(lab):
    """An exercise's `calls` lists the earlier exercises whose functions its solution calls (read from the
    solution's code), but lab 9's exercise 4, whose callee runs the learner's blocks under autograd."""
    from helpers.labcontract import _names_used

    c = contract.load(lab)
    order = list(c.exercises)
    for ex in c.exercises.values():
        earlier = {}
        for e in order[: order.index(ex.name)]:
            if c.exercises[e].question != ex.question:
                earlier[c.exercises[e].function] = e  # a later definition of the same name wins
        used = _names_used(contract.solution_function(lab, ex))
        expected = tuple(sorted(e for f, e in earlier.items() if f in used))
        if (lab, ex.name) == ("lab09_memory_checkpointing", "ex4"):
            assert ex.calls == () and expected == ("ex3",)
            continue
        assert set(ex.calls) >= set(expected), (ex.name, ex.calls, expected)
        # beyond the solution's, an exercise calls only what its prompt invites the learner to call
        text = (ROOT / "labs" / "source" / "src" / f"{lab}.py").read_text()
        prompt = text.split(f"# name: {ex.question}\n", 1)[1].split("# # BEGIN SOLUTION", 1)[0]
        for e in set(ex.calls) - set(expected):
            assert f"`{c.exercises[e].function}`" in prompt, (ex.name, e, "not invited by the prompt")


def test_a_memory_class_names_the_product_in_the_learners_process():
    """products_formed with a cap: in the learner's process a watch sees what is formed (views and in-place
    results are not new memory); an answer that forms an out × in matrix is named by its shape."""
    from helpers.labcontract import products_formed

    W, A, B = torch.randn(64, 8), torch.randn(2, 8), torch.randn(64, 2)
    g = torch.randn(1, 64)
    cheap = lambda g, W, A, B: (g @ W + (g @ B) @ A,)  # noqa: E731
    merged = lambda g, W, A, B: (g @ (W + B @ A),)  # noqa: E731
    big = 64 * 8 * 4 - 1  # one byte less than an out × in float32 matrix
    opts = {"returned": ("grad_x",), "forbid": [[(64, 8)]], "cap": big}
    ok = products_formed(cheap, (g, W.T.contiguous().T, A, B), {}, **opts)
    assert ok[0] == "grad_x" and ok[-1] == "none formed"
    bad = products_formed(merged, (g, W, A, B), {}, **opts)
    assert bad[-1] == "formed (64, 8)"  # a plain call: no backward ran, so no pass is named
    opts_no_shape = {"returned": ("grad_x",), "forbid": [], "cap": big}
    assert products_formed(merged, (g, W, A, B), {}, **opts_no_shape)[0].startswith("over its 0.00195")
    assert products_formed(cheap, (g, W, A, B), {}, **opts_no_shape)[0] == "grad_x"


def test_a_reference_bound_for_a_check_answers_only_while_the_check_runs():
    """The handle the worker keeps after a check (Exercise.calls, across the grader's boundary) is dead."""
    live = [True]
    ref = contract._while(lambda x: 2 * x, live)
    assert ref(3) == 6
    live[0] = False
    with pytest.raises(RuntimeError, match="only while its exercise is graded"):
        ref(3)


def test_a_recorded_contract_is_read_again_when_its_file_changes(tmp_path, monkeypatch):
    """labcontract.load parses a file once per version: the same object while it stays the same, the new
    content as soon as it is rewritten (a release re-records it while a notebook may hold the old one)."""
    monkeypatch.setattr(labcontract, "DATA", tmp_path)
    path = tmp_path / "lab99_probe.contract.json"
    path.write_text(json.dumps({"lab": "lab99_probe", "exercises": {"ex1": {"v": 1}}}))
    first = labcontract.load("lab99_probe")
    assert labcontract.load("lab99_probe") is first
    path.write_text(json.dumps({"lab": "lab99_probe", "exercises": {"ex1": {"v": 22}}}))
    assert labcontract.load("lab99_probe")["exercises"]["ex1"] == {"v": 22}


# ------------------------------------------------------------ stated rules, measured (helpers.labcontract.RULES)


def test_traced_counts_multiply_adds_reads_largest_and_ungated_gradients():
    from helpers.labcontract import broken_rule, rule_bounds, traced

    A, B = torch.ones(3, 4, dtype=torch.float64), torch.ones(4, 5, dtype=torch.float64)
    out, seen = traced(None, lambda a, b: (a @ b) @ b.T, (A, B), {}, {})
    assert seen["multiply_adds"] == 3 * 4 * 5 + 3 * 5 * 4  # (3, 4) @ (4, 5), then (3, 5) @ (5, 4)
    assert seen["largest"] == [3 * 5 * 8, [3, 5]] and seen["reads"][0] == 20
    once = rule_bounds({"multiply_adds": 1}, (A, B), {}, {**seen, "multiply_adds": 60})
    assert "uses 120 multiply–adds where 60 suffice" in broken_rule({"multiply_adds": 1}, seen, once)
    assert broken_rule({"reads": lambda a, b: a.numel()}, seen, {"reads": 12}).startswith(
        "uses mm on a (4, 5)"
    )

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(a, b):
            return a * b

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            return g * b, g * a  # b needs no gradient: a gated backward returns None there

    a = torch.ones(3, requires_grad=True)
    _, seen = traced("backward_through", Twice, (a, torch.ones(3)), {}, {"grad_output": torch.ones(3)})
    assert seen["ungated"] == ["Twice's input 1"]
    assert "returns a gradient for Twice's input 1" in broken_rule({"gated": True}, seen, {}).replace(
        "return a", "returns a"
    )
    assert broken_rule({"avoids": ("softmax",)}, {**seen, "ops": ["_softmax"]}, {}).startswith(
        "uses _softmax"
    )
    g = torch.ones(3)  # "return a new tensor": the argument itself, or a view of it, is not one
    assert traced(None, lambda x: x, (g,), {}, {})[1]["aliases"] == [0]
    assert traced(None, lambda x: x[:2], (g,), {}, {})[1]["aliases"] == [0]
    assert traced(None, lambda x: x * 1, (g,), {}, {})[1]["aliases"] == []
    assert "output 0" in broken_rule({"new": True}, {"aliases": [0]}, {})


class _Squared(torch.autograd.Function):
    """y = x², backward 2x·g: a Function graded by its own backward (no `wrong` switch: _Square has one)."""

    @staticmethod
    def forward(x):
        return x * x

    @staticmethod
    def setup_context(ctx, inputs, output):
        (x,) = inputs
        ctx.save_for_backward(x)

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        return 2 * x * grad_y


def test_a_function_is_graded_through_its_own_backward_never_autograds_derivative_of_apply():
    """Issue 33: a lab 4 answer replaced `apply` by a differentiable expression, and the grader's own
    backward request let autograd do the work (7.7 of 10 with no backward written)."""
    x = torch.tensor([1.0, -2.0], dtype=torch.float64, requires_grad=True)
    y = labcontract.method_of(_Squared, "apply")(x)
    (g,) = torch.autograd.grad(y.sum(), x)
    assert torch.equal(g, 2 * x.detach())

    class Replaced(_Squared):
        pass

    Replaced.apply = staticmethod(lambda x: x * x)  # autograd would differentiate this itself
    with pytest.raises(
        TypeError, match=r"Replaced\.apply returned a tensor whose gradient autograd would take"
    ):
        labcontract.method_of(Replaced, "apply")(x)
    # a function is called as it is; another method by its name
    assert labcontract.method_of(torch.sin, None) is torch.sin
    assert labcontract.method_of(_Squared, "forward") is _Squared.forward
    # an output autograd does not track (a detached result, an int) is not the Function's to check
    assert labcontract.method_of(_Squared, "apply")(x.detach()).grad_fn is None


def test_the_trace_says_whether_a_product_was_formed_in_forward_or_in_backward():
    """Lab 8 ex 5's newcomer: B @ A formed in forward and dL/dW formed in backward (W frozen) read the same
    ✗ line; the trace keeps which pass formed each product."""
    from helpers.labcontract import _trace_mode

    x = torch.randn(3, 8, requires_grad=True)
    W = torch.randn(64, 8, requires_grad=True)
    mode = _trace_mode()
    with mode:
        y = x @ W.T  # (3, 8) @ (8, 64) -> (3, 64)
        y.sum().backward()  # grad_x (3, 8), grad_W (64, 8)
    products = mode.seen["products"]
    assert (3, 64, "forward") in products and (64, 8, "backward") in products, products


def test_a_hidden_cases_note_names_the_part_that_failed_and_no_value_the_answer_chose():
    """Issue 32: rule zeros came with no reason. ``failed_part`` says which output, the memory budget or
    the kind of value, never a number or a string the answer returned (it could carry hidden inputs)."""
    e = (torch.zeros(2), torch.ones(3))
    outs = ("grad_x", "grad_W")
    assert labcontract.failed_part((torch.zeros(2), torch.zeros(3)), e, outs, 1e-8, 0) == "grad_W"
    assert (
        labcontract.failed_part((labcontract._over(2 << 20), e[1]), e, outs, 1e-8, 0)
        == "the call's memory budget"
    )
    assert labcontract.failed_part(("hidden input 0.123", e[1]), e, outs, 1e-8, 0) == "grad_x"
    assert labcontract.failed_part({"grad_x": e[0]}, e, outs, 1e-8, 0) == "the returned dict's keys"
    assert labcontract.failed_part([e[0]], e, outs, 1e-8, 0) == "the kind of value returned"
