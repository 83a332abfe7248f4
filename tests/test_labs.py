"""The lab system: no solutions in student notebooks, nothing stale, and grading of bad submissions."""
import csv
import json
import re
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import labs  # noqa: E402
import nbtool  # noqa: E402

LABS = labs.labs()
GRADE_TIMEOUT = 150  # seconds per notebook; a real one takes 10-40 s on a busy 2-core machine
LOOP_TIMEOUT = 15  # the infinite loop is graded on its own, so the suite need not wait 150 s


def test_every_lab_has_a_source_and_a_student_notebook():
    assert LABS, "no lab sources in labs/source/"
    for lab in LABS:
        assert labs.student_path(lab).exists(), lab
        qs = labs.questions(labs.read_nb(labs.source_path(lab)))
        assert 3 <= len(qs) <= 6 and all(p > 0 for _, p in qs), (lab, qs)


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


def test_student_notebooks_keep_the_otter_cells_out_and_the_lab_name_in():
    for lab in LABS:
        nb = labs.read_nb(labs.student_path(lab))
        text = "\n".join(c.source for c in nb.cells)
        assert "otter" not in text.lower() and "grader.check" not in text
        assert nb.metadata["otter"] == {"assignment_name": lab}
        assert nbtool.check() == [] or all(lab not in p for p in nbtool.check())


def test_every_self_check_in_a_student_notebook_says_not_implemented_yet():
    for lab in LABS:
        nb = labs.read_nb(labs.student_path(lab))
        lines = [ln for c in nb.cells if c.cell_type == "code" for o in c.outputs
                 for ln in o.get("text", "").splitlines() if ln.startswith(("✓", "✗", "·"))
                 and "Exercise" in ln]
        n = len(labs.questions(labs.read_nb(labs.source_path(lab))))
        numbers = {re.search(r"Exercise (\d+)", ln).group(1) for ln in lines}
        assert len(numbers) == n and all(ln.endswith("not implemented yet") for ln in lines), lines
        assert not any(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))


def test_every_self_check_in_a_source_notebook_passes():
    for lab in LABS:
        nb = labs.read_nb(labs.source_path(lab))
        lines = [ln for c in nb.cells if c.cell_type == "code" for o in c.outputs
                 for ln in o.get("text", "").splitlines() if "Exercise" in ln]
        assert lines and all(ln.startswith("✓") for ln in lines), lines


def test_instructors_page_links_every_student_notebook_in_colab():
    page = (ROOT / "labs" / "instructors.md").read_text()
    repo = re.sub(r"^https://github.com/", "", nbtool.repo_url()).rstrip("/")
    for lab in LABS:
        assert f"https://colab.research.google.com/github/{repo}/blob/main/labs/{lab}.ipynb" in page, lab


# ------------------------------------------------------------------ grading

def test_error_notes_name_the_cell_even_when_the_saved_source_is_a_list_of_lines():
    original = {"cells": [{"cell_type": "markdown", "source": ["# Lab\n", "text"]},
                          {"cell_type": "code", "source": ["x = 1\n", "raise ValueError('bad')"]},
                          {"cell_type": "code", "source": "y = 2"}]}
    executed = nbformat.from_dict({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
        nbformat.v4.new_markdown_cell("# Lab\ntext"),
        nbformat.v4.new_code_cell("x = 1\nraise ValueError('bad')", outputs=[nbformat.v4.new_output(
            "error", ename="ValueError", evalue="bad\nmore", traceback=[])]),
        nbformat.v4.new_code_cell("y = 2")]})
    assert labs._error_notes(executed, original) == ["cell 2: ValueError: bad"]
    original["cells"][1]["source"] = "".join(original["cells"][1]["source"])  # a string works too
    assert labs._error_notes(executed, original) == ["cell 2: ValueError: bad"]


def test_grade_can_leave_an_optional_question_out_of_the_total(tmp_path, monkeypatch):
    lab = "lab01_cat_mlp"
    points = {"ex1": 1.0, "ex2": 0.0, "ex3": 2.0, "ex4": 2.0, "ex5": 2.0, "ex6": 3.0}  # earned; possible 1 1 2 2 2 3

    def fake_grade_file(lab_, path, ag, qs, timeout):  # no notebook is run: only the bookkeeping
        detail = {"questions": {q: {"score": v, "possible": v, "passed": 1, "cases": 1} for q, v in points.items()}}
        return labs._row(path.name, "ok", qs, points), detail
    monkeypatch.setattr(labs, "grade_file", fake_grade_file)
    monkeypatch.setattr(labs, "autograder_zip", lambda lab_: tmp_path / "unused.zip")
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "a.ipynb").write_text("{}")
    out = tmp_path / "g.csv"
    labs.grade(lab, subs, out, skip=["ex6"])
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == ["submission", "status", "ex1", "ex2", "ex3", "ex4", "ex5", "total", "possible", "notes"]
    assert (rows[0]["total"], rows[0]["possible"]) == ("7", "8")
    fb = (tmp_path / "g_feedback" / "a.txt").read_text()
    assert "Score: 7 / 8" in fb and "ex6    optional this time: not graded, not counted" in fb
    with pytest.raises(SystemExit, match="no question ex9"):
        labs.grade(lab, subs, out, skip=["ex9"])
    assert labs.main(["grade", lab, str(subs), "--out", str(out), "--skip-question", "ex5",
                      "--skip-question", "ex6"]) == 0
    assert next(csv.DictReader(out.open()))["possible"] == "6"


def _solutions(lab):
    """The source's solution cells, otter markers removed, in order."""
    out, inside = [], False
    for cell in labs.read_nb(labs.source_path(lab)).cells:
        if cell.cell_type == "raw" and cell.source.strip().startswith("# BEGIN SOLUTION"):
            inside = True
        elif cell.cell_type == "raw" and cell.source.strip().startswith("# END SOLUTION"):
            inside = False
        elif inside and cell.cell_type == "code":
            lines = [ln.replace("  # SOLUTION", "") for ln in cell.source.splitlines()
                     if ln.strip() not in ("# BEGIN SOLUTION", "# END SOLUTION")]
            out.append("\n".join(lines))
    return out


def _submission(lab, answers=None, insert=None):
    """The student notebook with answers[i] in answer cell i (None: left as is), cells inserted."""
    nb = labs.read_nb(labs.student_path(lab))
    slots = [c for c in nb.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
    for cell, ans in zip(slots, answers or []):
        if ans is not None:
            cell.source = ans
    for after, code in (insert or []):
        nb.cells.insert(nb.cells.index(slots[after]) + 1, nbformat.v4.new_code_cell(code))
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = []
    return nbformat.writes(nb)


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    lab = "lab01_cat_mlp"
    sol = _solutions(lab)
    assert len(sol) == 6
    partial = sol[:3] + [sol[3].replace("(h > 0)", "(h >= 0)"),
                         sol[4].replace("torch.outer(grad_h, x)", "torch.outer(x, grad_h)"), None]
    assert partial[3] != sol[3] and partial[4] != sol[4]
    broken = sol[:4] + [sol[4].replace("def layer1_backward(grad_h, x):", "def layer1_backward(grad_h, x)")] + sol[5:]
    d = tmp_path_factory.mktemp("submissions")
    (d / "full.ipynb").write_text(_submission(lab, sol))
    (d / "partial.ipynb").write_text(_submission(lab, partial))
    (d / "empty.ipynb").write_text(_submission(lab))
    (d / "syntax_error.ipynb").write_text(_submission(lab, broken))
    (d / "crash.ipynb").write_text(_submission(lab, sol, insert=[(1, "import os\nos._exit(1)")]))
    (d / "corrupt.ipynb").write_text('{"cells": [ this is not json')
    (d / "wrong_lab.ipynb").write_text(labs.student_path("lab02_chain_rule").read_text())
    out = d.parent / "gradebook.csv"
    labs.grade(lab, d, out, timeout=GRADE_TIMEOUT, jobs=2)
    d_loop = tmp_path_factory.mktemp("hanging")
    (d_loop / "loop.ipynb").write_text(_submission(lab, sol, insert=[(0, "while True:\n    pass")]))
    out_loop = d_loop.parent / "gradebook_loop.csv"
    labs.grade(lab, d_loop, out_loop, timeout=LOOP_TIMEOUT, feedback_dir=out.with_name("gradebook_feedback"))
    rows = {}
    for path in (out, out_loop):
        with path.open() as f:
            rows.update({r["submission"]: r for r in csv.DictReader(f)})
    return dict(sorted(rows.items())), out


# submission: (status, ex1..ex6, total) with ex points 1, 1, 2, 2, 2, 3 (11 in all)
EXPECTED = {
    "full.ipynb": ("ok", "1 1 2 2 2 3", "11"),
    "partial.ipynb": ("ok", "1 1 2 1 0 0", "5"),  # relu'(0) = 1 fails one of two tests
    "empty.ipynb": ("ok", "0 0 0 0 0 0", "0"),
    "syntax_error.ipynb": ("errors", "1 1 2 2 0 3", "9"),
    "crash.ipynb": ("crashed", "0 0 0 0 0 0", "0"),
    "loop.ipynb": ("timeout", "0 0 0 0 0 0", "0"),
    "corrupt.ipynb": ("corrupt", "0 0 0 0 0 0", "0"),
    "wrong_lab.ipynb": ("wrong-lab", "0 0 0 0 0 0", "0"),
}


@pytest.mark.slow
def test_gradebook_has_one_clear_row_per_submission(gradebook):
    rows, out = gradebook
    assert list(rows) == sorted(EXPECTED)
    header = out.read_text().splitlines()[0]
    assert header == "submission,status,ex1,ex2,ex3,ex4,ex5,ex6,total,possible,notes"
    for name, (status, points, total) in EXPECTED.items():
        r = rows[name]
        got = (r["status"], " ".join(r[f"ex{i}"] for i in range(1, 7)), r["total"])
        assert got == (status, points, total), (name, r)
        assert r["possible"] == "11"


@pytest.mark.slow
def test_gradebook_notes_and_feedback_say_what_happened(gradebook):
    rows, out = gradebook
    # the note names the cell, numbered as in the submission: the answer cell of exercise 5
    notes = rows["syntax_error.ipynb"]["notes"]
    assert re.match(r"cell \d+: SyntaxError", notes), notes
    (sub,) = out.parent.glob("submissions[0-9]*/syntax_error.ipynb")
    cell = labs.read_nb(sub).cells[int(re.match(r"cell (\d+)", notes).group(1)) - 1]
    assert "def layer1_backward(grad_h, x)\n" in cell.source
    assert "kernel died" in rows["crash.ipynb"]["notes"]
    assert f"still running after {LOOP_TIMEOUT} s" in rows["loop.ipynb"]["notes"]
    assert "not a notebook" in rows["corrupt.ipynb"]["notes"]
    assert "lab02_chain_rule" in rows["wrong_lab.ipynb"]["notes"]
    fb = out.with_name("gradebook_feedback")
    assert sorted(p.name for p in fb.iterdir()) == sorted(Path(n).stem + ".txt" for n in EXPECTED)
    partial = (fb / "partial.txt").read_text()
    assert "Score: 5 / 11" in partial and "ex4    1 / 2   1 of 2 hidden tests pass" in partial
    # feedback never shows hidden test code
    secrets = labs.secret_snippets(labs.read_nb(labs.source_path("lab01_cat_mlp")))
    for p in fb.iterdir():
        assert not [s for s in secrets if s in p.read_text()]
