"""The lab system: no solutions in student notebooks, nothing stale (grading: tests/test_grader.py)."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
import nbtool  # noqa: E402

import labs  # noqa: E402

LABS = labs.labs()


def test_every_lab_has_a_source_and_a_student_notebook():
    assert LABS, "no lab sources in labs/source/"
    for lab in LABS:
        assert labs.student_path(lab).exists(), lab
        qs = labs.questions(lab)
        assert 3 <= len(qs) <= 6 and all(p > 0 for _, p in qs), (lab, qs)


def test_instructors_table_gives_each_labs_title_and_points():
    """The table's row says what the source says: '| Lab N · title | N | points |'."""
    page = (ROOT / "labs" / "instructors.md").read_text()
    for lab in LABS:
        nb = labs.read_nb(labs.source_path(lab))
        title = next(
            line[2:].strip()
            for c in nb.cells
            if c.cell_type == "markdown"
            for line in c.source.splitlines()
            if line.startswith("# Lab ")
        )
        points = f"{sum(p for _, p in labs.questions(lab)):g}"
        n = int(lab[3:5])
        assert f"| {title} | {n} | {points} |" in page, f"{lab}: no row '| {title} | {n} | {points} |'"


@pytest.mark.parametrize("lab", LABS)
def test_no_solution_or_hidden_test_text_in_the_student_notebook(lab):
    secrets = labs.secret_snippets(labs.read_nb(labs.source_path(lab)))
    assert len(secrets) >= 10, secrets  # the grep really looks for something
    assert labs.leaks(lab) == []
    # and the grep works: a student notebook with one solution line pasted in is caught
    text = labs.student_path(lab).read_text()
    nb = json.loads(text)
    nb["cells"][-1]["source"] += "\n" + secrets[0]
    assert labs.leaks(lab, json.dumps(nb)) == [secrets[0]]


@pytest.mark.slow
def test_student_notebooks_are_not_stale():
    labs.use_this_python()
    for lab in LABS:
        assert labs.stale(lab) is None


def _prompts(nb) -> dict:
    """{question: its prose before the first hint}, in a released notebook (the heading names the question)."""
    out, q = {}, None
    for c in nb.cells:
        if c.cell_type == "markdown" and (m := re.match(r"## Exercise (\d+)", c.source)):
            q = f"ex{m.group(1)}"
            out[q] = c.source.split("<details>")[0]
    return out


def test_every_prompt_says_what_its_exercise_may_not_call_and_which_of_its_calls_are_replaced():
    """A reader found rules the contracts held and no prompt said (lab 4's RMSNorm may not call
    F.rms_norm, forward included; lab 9's checkpoint helpers; lab 2 ex3 named chapter 2's
    linear_backward as given): the paragraph is now written from the declaration at release."""
    for lab in LABS:
        C, prompts = labs.contract(lab), _prompts(labs.read_nb(labs.student_path(lab)))
        for q, _ in labs.questions(lab):
            prompt = prompts[q]
            assert C.rule_line(q) in prompt, (lab, q)
            for b in C.declared[q]:
                said = "autograd" if b == "autograd" else b.rsplit(".", 1)[1]
                assert said in prompt.split("**Not allowed here:**")[1], (lab, q, b)
            for e in C.of_question(q):
                for c in e.calls:
                    assert f"`{C.exercises[c].function}` in place of yours" in prompt or (
                        f"`{C.exercises[c].function}`" in prompt.split("The hidden tests run it with")[1]
                    ), (lab, q, c)
    C = labs.contract("lab04_custom_functions")
    assert "`F.rms_norm`" in C.rule_line("ex3") and "autograd" in C.rule_line("ex3")
    assert "`.step` of any `torch.optim` class" in labs.contract("lab11_training_by_hand").rule_line("ex1")
    assert labs.contract("lab05_losses_and_flow").rule_line("ex3") == ""  # nothing declared: no paragraph


def test_every_self_check_lists_every_case_class_its_exercise_draws():
    """A reader found seven self-check texts that listed fewer kinds of case than the contract drew (labs 1, 3,
    6, 8, 9, 10, 11): the list is now written from the declaration at release, one bullet per class, in the
    self-check's paragraph (the one right after the question), and in no other cell."""
    for lab in LABS:
        C, nb = labs.contract(lab), labs.read_nb(labs.student_path(lab))
        checks = [
            c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("**Self-check")
        ]
        assert len(checks) == len(labs.questions(lab)), lab
        for (q, _), text in zip(labs.questions(lab), checks, strict=True):
            assert text.startswith(f"**Self-check {q.removeprefix('ex')}**"), (lab, q)
            assert C.promise_list(q) in text, (lab, q)
            bullets = [line for line in text.splitlines() if line.startswith("- ")]
            assert bullets == [f"- {c.name}" for e in C.of_question(q) for c in e.classes], (lab, q)
    several = labs.contract("lab10_flash_attention").promise_list("ex1")
    assert "For `merge_stats`, one" in several and "For `online_softmax_stats`, one" in several


def test_a_rule_paragraph_goes_after_what_is_given_or_else_before_the_first_hint():
    given = "Goal.\n\n**You are given:** x.\n\nWrite f.\n\n<details>h</details>"
    assert (
        labs.with_rule(given, "R")
        == "Goal.\n\n**You are given:** x.\n\nR\n\nWrite f.\n\n<details>h</details>"
    )
    assert labs.with_rule("Write f.\n\n<details>h</details>", "R") == "Write f.\n\nR\n\n<details>h</details>"
    assert labs.with_rule("Write f.", "R") == "Write f.\n\nR"
    assert labs.with_rule("Write f.", "") == "Write f."


def test_student_notebooks_hold_no_grader_cells_and_carry_the_lab_name():
    for lab in LABS:
        nb = labs.read_nb(labs.student_path(lab))
        text = "\n".join(c.source for c in nb.cells)
        assert "otter" not in text.lower() and "grader.check" not in text
        assert nb.metadata["otter"] == {"assignment_name": lab}
        assert nbtool.check() == [] or all(lab not in p for p in nbtool.check())


def test_every_self_check_in_a_student_notebook_says_not_implemented_yet():
    for lab in LABS:
        nb = labs.read_nb(labs.student_path(lab))
        lines = [
            ln
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.outputs
            for ln in o.get("text", "").splitlines()
            if ln.startswith(("✓", "✗", "·")) and "Exercise" in ln
        ]
        n = len(labs.questions(lab))
        numbers = {re.search(r"Exercise (\d+)", ln).group(1) for ln in lines}
        assert len(numbers) == n and all(ln.endswith("not implemented yet") for ln in lines), lines
        assert not any(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))


def test_every_self_check_in_a_source_notebook_passes():
    for lab in LABS:
        nb = labs.read_nb(labs.source_path(lab))
        lines = [
            ln
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.outputs
            for ln in o.get("text", "").splitlines()
            if "Exercise" in ln
        ]
        assert lines and all(ln.startswith("✓") for ln in lines), lines


def test_instructors_page_links_every_student_notebook_in_colab():
    page = (ROOT / "labs" / "instructors.md").read_text()
    repo = re.sub(r"^https://github.com/", "", nbtool.repo_url()).rstrip("/")
    for lab in LABS:
        assert f"https://colab.research.google.com/github/{repo}/blob/main/labs/{lab}.ipynb" in page, lab


@pytest.mark.parametrize("lab", LABS)
def test_every_by_hand_name_resolves_to_a_course_function(lab):
    """A renamed helper must not leave a lab's `by_hand:` list naming a function that is gone."""
    from grader.harness import questions

    from helpers.labcontract import _resolve  # a module's function, or a class's (torch.nn.Module.x)

    for q in questions(labs.source_path(lab)):
        for what in q.by_hand:
            if what == "autograd":
                continue
            try:
                found = callable(_resolve(what)[2])
            except (ImportError, AttributeError):
                found = False
            assert found, f"{lab} {q.name}: by_hand names {what}, which does not exist"


# ---------------------------------------------------------------------------------------------
# Issue #14: a lab whose answer can be copied from the chapter (or the helpers it imports)
# teaches copying. Each graded exercise asks for a variant the chapter derived the method for
# but did not print: at most half of its substantive solution lines may stand verbatim there.
# ---------------------------------------------------------------------------------------------

MAX_PRINTED = 0.5
# Lab 1 redoes chapter 1's worked cat MLP (seed 004's table) by hand on purpose: the pencil
# warm-up before anything new. Its new work is exercise 6, the batched backward.
BY_DESIGN = {("lab01_cat_mlp", q) for q in ("ex1", "ex2", "ex3", "ex4", "ex5")}
# The same in every Function and loop (house style): not an answer anyone could copy.
SCAFFOLDING = ("def ", "return ", "import ", "from ", '"""', "@", "class ", "with torch.", "for ")


def _code_lines(text: str) -> set[str]:
    return {_substance(line) for line in text.splitlines()} - {""}


def _substance(line: str) -> str:
    """A code line without comments and spacing; '' for scaffolding and lines under 12 characters."""
    line = re.sub(r"\s+", " ", line.replace("# SOLUTION", "").split("#")[0]).strip()
    if len(line) < 12 or line.startswith(SCAFFOLDING) or "ctx.save" in line or "ctx.saved" in line:
        return ""
    return "" if line.startswith("if not ctx.needs_input_grad") else line


def _solution_lines(lab: str) -> dict[str, list[str]]:
    """{question: its solution cells' substantive lines}."""
    nb = labs.read_nb(labs.source_path(lab))
    out = {q: [] for q, _ in labs.questions(lab)}
    for q, where, c in labs.regions(nb):
        if where == "solution":
            out[q] += [s for s in map(_substance, c.source.splitlines()) if s]
    return out


@pytest.mark.parametrize("lab", LABS)
def test_no_graded_exercise_is_printed_in_the_chapters_or_helpers(lab):
    printed = set()
    for p in sorted((ROOT / "chapters" / "src").glob("*.py")) + sorted((ROOT / "helpers").glob("*.py")):
        printed |= _code_lines(p.read_text(encoding="utf-8"))
    points = dict(labs.questions(lab))
    for q, lines in _solution_lines(lab).items():
        if points.get(q, 0) <= 0 or (lab, q) in BY_DESIGN or not lines:
            continue
        copied = [s for s in lines if s in printed]
        assert len(copied) <= MAX_PRINTED * len(lines), (
            f"{lab} {q}: {len(copied)} of {len(lines)} solution lines are printed in chapters/ or "
            f"helpers/, e.g. {copied[0]!r}: ask for a variant the chapter did not print"
        )


# ---------------------------------------------------------------------------------------------
# Issue #35: hints that climb. Each graded exercise says what the learner derives and what is
# given; its hints go from the idea to one step to how to check yourself, and a formula or a line
# of the answer's code stands, if anywhere, only behind the last one.
# ---------------------------------------------------------------------------------------------

HINT = re.compile(r"<summary>(Hint[^<]*)</summary>(.*?)</details>", re.S)
RUNG = re.compile(r"Hint (\d+) of (\d+) · (.+)")
SHOWN = ("$$", "```", "\\begin{")  # display math, code, an environment: the answer written out


def _prompt_markdown(lab: str) -> dict[str, str]:
    """{question: the Markdown of its prompt (prose and hints)}."""
    out = {q: "" for q, _ in labs.questions(lab)}
    for q, where, c in labs.regions(labs.read_nb(labs.source_path(lab)), markdown=True):
        if q in out and where == "prompt" and c.cell_type == "markdown":
            out[q] += c.source + "\n"
    return out


def _ladder_problems(md: str, solution: list[str]) -> list[str]:
    """What keeps a prompt's hints from climbing (idea, step, check) and its answer unwritten."""
    bad = [f"no '{s} …' line" for s in ("**You derive:**", "**You are given:**") if s not in md]
    hints = HINT.findall(md)
    rungs = [RUNG.fullmatch(t.strip()) for t, _ in hints]
    n = len(hints)
    if (
        n < 3
        or not all(rungs)
        or [(int(r[1]), int(r[2])) for r in rungs] != [(k, n) for k in range(1, n + 1)]
    ):
        return bad + [f"hints titled 'Hint k of n · …', n >= 3, in order; got {[t for t, _ in hints]}"]
    want = ["the idea"] + ["a step"] * (n - 2) + ["check yourself"]
    bad += [
        f"hint {k} is '{r[3]}', not '{w} …'"
        for k, (r, w) in enumerate(zip(rungs, want), 1)
        if not r[3].startswith(w)
    ]
    for k, (_, body) in enumerate(hints[:-1], 1):
        shown = [s for s in SHOWN if s in body] + [s for s in solution if labs.found(s, body)]
        bad += [f"hint {k} of {n} shows {s!r}: a formula or code only behind the last" for s in shown]
    return bad


@pytest.mark.parametrize("lab", LABS)
def test_every_exercise_says_what_is_derived_and_its_hints_climb(lab):
    solutions = _solution_lines(lab)
    for q, md in _prompt_markdown(lab).items():
        assert not _ladder_problems(md, solutions[q]), f"{lab} {q}: {_ladder_problems(md, solutions[q])}"


def test_the_ladder_check_catches_a_formula_or_a_line_of_code_before_the_last_hint():
    def hint(k, title, body):
        return f"<details><summary>Hint {k} of 3 · {title}</summary>\n\n{body}\n\n</details>\n"

    good = "**You derive:** grad_a.\n**You are given:** h.\n" + "".join(
        hint(k, t, "words") for k, t in ((1, "the idea"), (2, "a step: one term"), (3, "check yourself"))
    )
    assert _ladder_problems(good, ["grad_a = grad_h * (h > 0)"]) == []
    early_formula = good.replace("words", "$$g \\odot 1[h>0]$$", 1)
    early_code = good.replace("words", "`grad_a = grad_h * (h > 0)`", 1)
    assert "formula or code only behind the last" in _ladder_problems(early_formula, [])[0]
    assert (
        "formula or code only behind the last"
        in _ladder_problems(early_code, ["grad_a = grad_h * (h > 0)"])[0]
    )
    assert _ladder_problems(good.replace("$$", "").replace("check yourself", "the formula"), [])  # last rung
    assert _ladder_problems(good.replace("Hint 3 of 3", "Hint 3"), [])  # a rung out of the ladder
    assert _ladder_problems(good.replace("**You derive:**", "Derive"), [])  # what is derived unsaid


def test_regions_reads_every_question_and_region_of_a_source():
    """labs.regions, the one reader of the markers that tools/mutants.py and tests/test_contracts.py use."""
    for lab in LABS:
        nb = labs.read_nb(labs.source_path(lab))
        seen = list(labs.regions(nb))
        names = [q for q, _ in labs.questions(lab)]
        assert [q for q, w, _ in seen if w == "marker:prompt" and q not in (None,)][:1] == names[:1], lab
        assert {q for q, w, _ in seen if w == "solution"} == set(names), lab  # each question has a solution
        assert all(w == "setup" for q, w, _ in seen if q is None), lab
        assert {w for _, w, c in seen if c.cell_type == "code"} <= {
            "setup",
            "prompt",
            "solution",
            "selfcheck",
        }


@pytest.mark.parametrize(
    "snippet, text, whole",
    [
        ("grad_Y @ W", "x = grad_Y @ W\n", True),
        ("grad_Y @ W", "x = grad_Y @ W_out", False),  # a longer name
        ("grad_Y @ W", "x = my_grad_Y @ W", False),  # inside a name
        ("grad_Y @ W", "x = self.grad_Y @ W", False),  # an attribute
        ("grad_Y @ W", "grad_Y @ W_out; grad_Y @ W", True),  # a later occurrence is whole
        ("(h > 0)", "m = ((h > 0))", True),  # a snippet that starts with punctuation
        ("a", "é a", True),
        ("a", "éa", False),  # \w is Unicode
        ("a", "", False),
    ],
)
def test_found_finds_a_snippet_only_as_whole_code(snippet, text, whole):
    assert labs.found(snippet, text) is whole


@pytest.mark.parametrize("lab", LABS)
def test_each_exercise_heading_states_the_points_its_contract_declares(lab):
    """Points are declared once (the contract); the prompt's "(N points)" is checked against it."""
    nb = labs.read_nb(labs.source_path(lab))
    heads = [
        c.source.splitlines()[0]
        for c in nb.cells
        if c.cell_type == "markdown" and c.source.startswith("## Exercise ")
    ]
    stated = []
    for h in heads:
        m = re.match(r"## Exercise (\d+) · .*\((\d+(?:\.\d+)?) points?\)\s*$", h)
        assert m, f"{lab}: {h!r} states no points"
        stated.append((f"ex{m.group(1)}", float(m.group(2))))
    assert stated == labs.questions(lab)


@pytest.mark.parametrize(
    "code, student",
    [
        ("    h = W1 @ x + b1  # SOLUTION", "    h = ..."),
        ("    grad_W, grad_b = a.T @ g, g.sum(0)  # SOLUTION", "    grad_W, grad_b = ..."),
        ("    out[i] = x  # SOLUTION", "    out[i] = ..."),
        ("    return a + b  # SOLUTION", "    ..."),
        ("    if a == b:  # SOLUTION", "    ..."),
        (
            "def f(x):\n    # BEGIN SOLUTION\n    y = x\n    return y\n    # END SOLUTION",
            "def f(x):\n    ...",
        ),
        ("x = 1\ny = 2", "x = 1\ny = 2"),  # given code stays
    ],
)
def test_without_solution_strips_what_the_markers_mark_and_nothing_else(code, student):
    assert labs.without_solution(code) == student


@pytest.mark.parametrize(
    "code",
    [
        "# BEGIN SOLUTION\nx = 1",
        "x = 1\n# END SOLUTION",
        "# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION",
    ],
)
def test_without_solution_refuses_unbalanced_markers_in_one_line(code):
    with pytest.raises(ValueError, match="SOLUTION"):
        labs.without_solution(code)


def test_a_question_marker_holding_points_is_refused(tmp_path, monkeypatch):
    """Points, by_hand and in_place live in the contract only: a source that declares them again fails release."""
    lab = LABS[0]
    nb = labs.read_nb(labs.source_path(lab))
    marker = next(c for c in nb.cells if c.cell_type == "raw" and c.source.startswith("# BEGIN QUESTION"))
    marker.source += "\npoints: 3"
    (tmp_path / f"{lab}.ipynb").write_text(labs.nbformat.writes(nb))
    monkeypatch.setattr(labs, "SOURCES", tmp_path)
    with pytest.raises(ValueError, match=r"holds only its name .* got \['name', 'points'\]"):
        labs.student_notebook(lab)


@pytest.mark.parametrize("took, limit", [(2.0, 30), (3.7, 37), (12.0, 120), (45.0, 300)])
def test_without_a_timeout_a_notebook_gets_ten_times_what_the_solutions_took(monkeypatch, took, limit):
    """Issue 33: a notebook that spins held a grading slot for the whole 300 s (a class of 200 with two
    such: 1.4 × its clean run); the limit is now measured on the published solutions, graded first."""
    lab = "lab01_cat_mlp"
    qs = labs.graded_questions(lab)
    clock = iter([100.0, 100.0 + took])
    monkeypatch.setattr(labs.time, "monotonic", lambda: next(clock))
    full = {"status": "ok", "questions": {q: {"score": p} for q, p in qs}}
    monkeypatch.setattr(labs, "run_harness", lambda *a, **k: full)
    got = labs.calibrated_timeout(None, lab, qs, (), False)
    assert got[0] == pytest.approx(limit) and got[1] == pytest.approx(took) and got[2] is None, got


def test_grading_refuses_when_the_published_solutions_do_not_score_full_marks(monkeypatch):
    """What the limit is measured on must be right: anything less is the machine's problem, not a student's."""
    lab = "lab01_cat_mlp"
    qs = labs.graded_questions(lab)
    short = {"status": "ok", "questions": {q: {"score": p if q != "ex3" else 0} for q, p in qs}}
    monkeypatch.setattr(labs, "run_harness", lambda *a, **k: short)
    _, _, problem = labs.calibrated_timeout(None, lab, qs, (), False)
    assert problem == "the published solutions do not score full marks here (ex3 0 of 2)", problem


def _loc(text: str) -> int:
    """Lines of code: not blank, not a comment."""
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def test_the_check_layer_is_no_larger_than_the_teaching_layer():
    """Issue 32's measure. The check layer decides ✓, ✗ and the hidden points: the self-check and its
    diagnosis (``helpers/labcontract.py``, ``helpers/labcheck.py``) and the declarations
    (``labs/source/contracts/``). The teaching layer is what a learner reads and runs: the chapters'
    code, the helpers they import, the labs' given code, stubs and solutions. (The grader's sandbox,
    wire and copy report isolate and transport; they decide nothing, and are not counted.)"""
    check = [
        ROOT / "helpers/labcontract.py",
        ROOT / "helpers/labcheck.py",
        *ROOT.glob("labs/source/contracts/*.py"),
    ]
    teaching = [p for p in ROOT.glob("helpers/*.py") if not p.name.startswith("lab")]
    cells = [
        "".join(c["source"])
        for nb in [*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("labs/source/lab*.ipynb")]
        for c in json.loads(nb.read_text())["cells"]
        if c["cell_type"] == "code"
    ]
    n_check = sum(_loc(p.read_text()) for p in check)
    n_teaching = sum(_loc(p.read_text()) for p in teaching) + sum(_loc(c) for c in cells)
    print(f"check layer {n_check} lines of code, teaching layer {n_teaching}: {n_check / n_teaching:.2f} ×")
    assert n_check <= n_teaching, (n_check, n_teaching)
