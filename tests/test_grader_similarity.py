"""tools/grader/similarity.py: copies are flagged, honest work is not.

Calibrated on ``tests/data/similarity/honest/labNN/<student>.py``: answers written independently
from each lab's prompt and stubs (not from the solutions), one file per student and lab, one
``# %% exN`` section per answer cell. Disguised copies are generated here from those answers
and from the published solutions (``disguise``: identifiers renamed, independent statements and
functions reordered, reformatted: spacing, comments, parentheses), so the copies follow the corpus.
Run with ``-s`` to see the measured numbers.
"""

import ast
import csv
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
import similarity  # noqa: E402
from similarity import SOLUTIONS, exercise_scores, similarity_pairs, write_report  # noqa: E402

import labs  # noqa: E402

DATA = ROOT / "tests" / "data" / "similarity" / "honest"
CORPUS_LABS = [lab for lab in labs.labs() if (DATA / lab[:5]).is_dir()]


# ----------------------------------------------------------------- the corpus


def corpus(lab: str) -> dict[str, dict[str, str]]:
    """{student: {"ex1": answer cell code, ...}} for one lab."""
    out = {}
    for f in sorted((DATA / lab[:5]).glob("*.py")):
        parts = re.split(r"^# %% (ex\d+)\n", f.read_text(encoding="utf-8"), flags=re.M)
        out[f.stem] = {parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}
    return out


def released(lab):
    return labs.read_nb(labs.student_path(lab))


def handed_in(lab: str, exs: dict[str, str]):
    """The released notebook with its answer cells (in order) replaced by a student's code."""
    nb = released(lab)
    cells = [c for c in nb.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
    for i, c in enumerate(cells):
        c.source = exs.get(f"ex{i + 1}", c.source)
    return nb


def class_answers(lab: str, extra=None) -> dict[str, dict[str, str]]:
    """{student: {exercise: code}} as the grader extracts it from the handed-in notebooks."""
    rel = released(lab)
    students = dict(corpus(lab), **(extra or {}))
    return {
        n: similarity.exercise_answers(handed_in(lab, exs), rel, labs.graded_functions(lab))
        for n, exs in students.items()
    }


def solutions(lab: str) -> dict[str, str]:
    """The published solutions' answers, through the grader's own path (labs.solution_notebook)."""
    return similarity.exercise_answers(labs.solution_notebook(lab), released(lab), labs.graded_functions(lab))


# ----------------------------------------------------------------- disguised copies

WORDS = "foo bar tmp val res acc out buf arr mat vec aux cur nxt prev tot part step gg hh zz"


def api_names(lab: str) -> set[str]:
    """The names the released notebook defines or uses: the lab's API, a copier keeps them."""
    return {
        n.id
        for n in ast.walk(ast.parse(similarity.given_code(released(lab)), "x", "exec"))
        if isinstance(n, ast.Name)
    } | {
        n.name
        for n in ast.walk(ast.parse(similarity.given_code(released(lab))))
        if isinstance(n, ast.FunctionDef)
    }


def renamable(code: str) -> set[str]:
    """The names code binds, less those also used as keyword names (f(x, dim=1), def f(x, w=None))."""
    return similarity.bound_names(code) - set(re.findall(r"[(,]\s*([A-Za-z_]\w*)\s*=(?!=)", code))


def rename(code: str, keep: set[str], rng: random.Random, bound: set[str] | None = None) -> str:
    """Every name bound (default: the names the code binds), except those in keep, renamed
    consistently (text otherwise as is)."""
    bound = sorted((renamable(code) if bound is None else bound) - keep)
    words = WORDS.split()
    new = {n: f"{random.Random(n).choice(words)}_{i}" for i, n in enumerate(bound)}  # same in every exercise
    out = []
    for m in re.finditer(
        # a string with its prefix (f"…", rb'…') is one token: the f of an f-string is not a name
        r"#[^\n]*|(?:[rRbBuUfF]{1,2})?\"(?:\\.|[^\"\\\n])*\"|(?:[rRbBuUfF]{1,2})?'(?:\\.|[^'\\\n])*'"
        r"|\d[\w.]*|[A-Za-z_]\w*|\s+|.",
        code,
    ):
        t = m.group(0)
        prev = code[: m.start()].rstrip()
        if t in new and not prev.endswith("."):
            t = new[t]
        elif t.startswith("#"):
            t = "# " + " ".join(reversed(t[1:].split()))  # comments reworded
        out.append(t)
    return "".join(out)


def _reads(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _writes(node) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}


def _simple(s) -> bool:
    return isinstance(s, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)) and not (
        isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
    )


def reorder(code: str, rng: random.Random) -> str:
    """Functions in reverse order, and adjacent independent statements swapped (as printed by ast)."""

    def shuffle(body):
        body = list(body)
        for i in range(len(body) - 1):
            a, b = body[i], body[i + 1]
            if (
                _simple(a)
                and _simple(b)
                and not (_writes(a) & (_reads(b) | _writes(b)))
                and not (_writes(b) & _reads(a))
            ):
                if rng.random() < 0.8:
                    body[i], body[i + 1] = b, a
        for s in body:
            for field in ("body", "orelse", "finalbody"):
                if isinstance(getattr(s, field, None), list) and getattr(s, field):
                    setattr(s, field, shuffle(getattr(s, field)))
        return body

    tree = ast.parse(code)
    defs = [s for s in tree.body if isinstance(s, (ast.FunctionDef, ast.ClassDef))]
    rest = [s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef))]
    tree.body = rest + defs[::-1]
    tree.body = shuffle(tree.body)
    return ast.unparse(tree) + "\n"


def _same_program(lines: list[str], dump: str) -> bool:
    try:
        return ast.dump(ast.parse("\n".join(lines))) == dump
    except SyntaxError:
        return False


def reformat(code: str, rng: random.Random) -> str:
    """Parentheses around right-hand sides, comments and blank lines added, spacing changed
    (each change kept only if the program is the same: a copier hands in code that runs)."""
    lines = code.splitlines()
    dump = ast.dump(ast.parse(code))
    for i, ln in enumerate(list(lines)):
        m = re.match(r"^(\s*)([\w\[\], .:]+?)\s*(=|\+=|-=|\*=)(?!=)\s*(.+?)\s*$", ln)
        if m and "#" not in ln:
            ind, lhs, op, rhs = m.groups()
            new = f"{ind}{lhs}  {op}  ({rhs})" + ("   # step" if rng.random() < 0.5 else "")
        elif ln.strip().startswith("return "):
            new = ln.replace("return ", "return  ", 1) + "  # done"
        else:
            continue
        if _same_program(lines[:i] + [new] + lines[i + 1 :], dump):
            lines[i] = new
    out = []
    for i, ln in enumerate(lines):
        out.append(ln)
        if ln.strip() and rng.random() < 0.3 and _same_program(out + [""] + lines[i + 1 :], dump):
            out.append("")
    return "\n".join(out) + "\n"


KINDS = ("renamed", "reordered", "reformatted", "all three")


def disguise(code: str, kind: str, keep: set[str], seed: int, bound: set[str] | None = None) -> str:
    """A copy of code disguised as kind (one of KINDS); bound: the names to rename (all the copied
    submission binds, so that a helper defined in one exercise is renamed where another calls it)."""
    rng = random.Random(seed)
    if kind in ("reordered", "all three"):
        code = reorder(code, rng)
    if kind in ("reformatted", "all three"):
        code = reformat(code, rng)
    if kind in ("renamed", "all three"):
        code = rename(code, keep, rng, bound)
    return code


def copies_of(lab: str, sources: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """One disguised copy of each source (kinds in turn), named copy-<kind>-of-<source>."""
    keep = api_names(lab)
    out = {}
    for i, (name, exs) in enumerate(sorted(sources.items())):
        kind = KINDS[i % len(KINDS)]
        bound = set().union(*map(similarity.bound_names, exs.values()))
        bound -= set().union(*(similarity.bound_names(c) - renamable(c) for c in exs.values()))
        out[f"copy-{kind.replace(' ', '-')}-of-{name}"] = {
            ex: disguise(code, kind, keep, seed=1000 * i + j, bound=bound)
            for j, (ex, code) in enumerate(sorted(exs.items()))
        }
    return out


# ----------------------------------------------------------------- corpus tests


def _report(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    for ex in sorted({r["exercise"] for r in rows}, key=lambda e: (len(e), e)):
        rs = [r for r in rows if r["exercise"] == ex]
        print(
            f"  {ex}: max {max(r['similarity'] for r in rs):.2f} over {len(rs)} pairs, "
            f"threshold {rs[0]['threshold']:.2f}, tellable pairs {sum(r['tellable'] for r in rs)}"
        )


@pytest.mark.parametrize("lab", CORPUS_LABS)
def test_the_corpus_has_five_students_per_exercise(lab):
    students = corpus(lab)
    assert len(students) >= 5
    n_answers = sum("otter_answer_cell" in c.metadata.get("tags", []) for c in released(lab).cells)
    for ex in (f"ex{i + 1}" for i in range(n_answers)):
        written = [s for s, exs in students.items() if ex in exs]
        assert len(written) >= 5, (ex, written)


@pytest.mark.parametrize("lab", CORPUS_LABS)
def test_no_honest_notebook_is_sent_to_review(lab):
    """Issue 33: "generous to honest math", measured on this corpus (written apart from the solutions). The
    reader the grader runs before any cell (``harness.read_plan``) sends none of the lab's honest
    notebooks to review. It sent 4 of 55 (a deque for a graph walk, a Counter, numbers.Real and
    type(v).__name__ in lab 3, itertools.chain.from_iterable in lab 9) before those were vetted."""
    import tempfile

    import harness

    qs = harness.questions(labs.source_path(lab))
    for name, exs in corpus(lab).items():
        with tempfile.NamedTemporaryFile("w", suffix=".ipynb", delete=False) as f:
            f.write(nbformat.writes(handed_in(lab, exs)))
        try:
            cells = harness.read_cells(f.name)
        finally:
            os.unlink(f.name)
        checked = harness.read_plan(cells, {"source": str(labs.source_path(lab))}, qs)
        assert not (checked.review or checked.reach or checked.gradient), (
            name,
            checked.review,
            checked.reach,
        )


@pytest.mark.parametrize("lab", CORPUS_LABS)
def test_no_honest_pair_is_flagged(lab):
    answers = class_answers(lab)
    rows = exercise_scores(answers, given=similarity.given_code(released(lab)))
    _report(f"{lab}: honest pairs ({len(answers)} students)", rows)
    assert [r for r in rows if r["flagged"]] == []
    assert similarity_pairs(answers, given=similarity.given_code(released(lab))) == []


@pytest.mark.parametrize("lab", CORPUS_LABS)
def test_no_honest_answer_is_flagged_against_the_published_solutions(lab):
    answers = class_answers(lab)
    rows = exercise_scores(answers, solutions(lab), given=similarity.given_code(released(lab)))
    _report(f"{lab}: honest pairs and pairs with the solutions", [r for r in rows if r["b"] == SOLUTIONS])
    assert [(r["exercise"], r["a"], r["b"], round(r["similarity"], 2)) for r in rows if r["flagged"]] == []


@pytest.mark.parametrize("lab", CORPUS_LABS)
def test_every_disguised_copy_is_flagged_and_no_honest_pair(lab, figure):
    honest = corpus(lab)
    sol = solutions(lab)
    copies = copies_of(lab, dict(honest, **{"solutions": sol}))
    answers = class_answers(lab, copies)
    given = similarity.given_code(released(lab))
    rows = exercise_scores(answers, sol, given=given)
    source = {c: c.split("-of-", 1)[1] for c in copies}
    source = {c: (SOLUTIONS if s == "solutions" else s) for c, s in source.items()}

    def is_copy_pair(r):
        return source.get(r["a"]) == r["b"] or source.get(r["b"]) == r["a"]

    copy_rows = [r for r in rows if is_copy_pair(r)]
    other = [r for r in rows if not is_copy_pair(r)]
    print(f"\n{lab}: {len(answers)} submissions ({len(copies)} disguised copies)")
    for ex in sorted({r["exercise"] for r in copy_rows}, key=lambda e: (len(e), e)):
        cs = [r for r in copy_rows if r["exercise"] == ex and r["tellable"]]
        peers = [r for r in other if r["exercise"] == ex and r["b"] != SOLUTIONS]
        tell = [r["similarity"] for r in peers if r["tellable"]]
        vs_sol = [
            r["similarity"] for r in other if r["exercise"] == ex and r["b"] == SOLUTIONS and r["tellable"]
        ]
        print(
            f"  {ex}: threshold {peers[0]['threshold']:.2f}; others' max: between students "
            + (f"{max(tell):.2f}" if tell else "-")
            + f" ({len(tell)} of {len(peers)} pairs tellable), against the solutions "
            + (f"{max(vs_sol):.2f}" if vs_sol else "-")
            + "; copies' min "
            + (
                f"{min(r['similarity'] for r in cs):.2f} ({len(cs)} tellable)"
                if cs
                else "- (too short to tell)"
            )
        )
    # every copy of a tellable answer is flagged on that exercise; a copy of the solutions is
    # judged as a whole lab, so it needs SOLUTION_MIN_EXERCISES tellable exercises
    sol_tellable = sum(r["tellable"] for r in copy_rows if r["b"] == SOLUTIONS)
    print(f"  copy of the solutions: {sol_tellable} tellable exercises")
    honest_max = max((r["similarity"] for r in other if r["tellable"] and r["b"] != SOLUTIONS), default=0.0)
    copy_min = min((r["similarity"] for r in copy_rows if r["tellable"]), default=float("nan"))
    figure(
        f"[{lab}] similarity: {len(honest)} honest students, {len(copies)} disguised copies; highest honest pair "
        f"{honest_max:.2f}, lowest tellable copy {copy_min:.2f}; honest pairs flagged "
        f"{sum(bool(r['flagged']) for r in other if r['b'] != SOLUTIONS)}"
    )

    def expected(r):
        return r["tellable"] and (r["b"] != SOLUTIONS or sol_tellable >= similarity.SOLUTION_MIN_EXERCISES)

    missed = [
        (r["exercise"], r["a"], r["b"], round(r["similarity"], 2))
        for r in copy_rows
        if expected(r) and not r["flagged"]
    ]
    assert missed == []
    # each copy is flagged as a pair, with its source named, whenever one of its exercises can tell
    pairs = {(r["a"], r["b"]) for r in similarity_pairs(answers, sol, given=given)}
    for c, s in source.items():
        if any(expected(r) for r in copy_rows if c in (r["a"], r["b"])):
            assert (min(c, s), max(c, s)) in pairs or (c, s) in pairs, c
    # and nothing else is
    flagged = [(r["exercise"], r["a"], r["b"], round(r["similarity"], 2)) for r in other if r["flagged"]]
    assert flagged == []


def test_a_disguised_copy_really_differs_from_its_source():
    lab = CORPUS_LABS[0]
    code = corpus(lab)["ana"]["ex6"]
    keep = api_names(lab)
    for i, kind in enumerate(KINDS):
        copy = disguise(code, kind, keep, seed=i)
        assert copy != code and ast.parse(copy)
    renamed = disguise(code, "renamed", keep, seed=0)
    assert "cat_backward_batch" in renamed and "dW1" not in renamed
    reordered = disguise(code, "reordered", keep, seed=0)
    assert reordered.splitlines() != ast.unparse(ast.parse(code)).splitlines()
    assert "  =  (" in disguise(code, "reformatted", keep, seed=0)


# ----------------------------------------------------------------- small, hand-made classes

# A student's answer to an attention-backward lab (three functions).
ATTENTION = """
def causal_mask(Nq, Nk, device=None):
    i = torch.arange(Nq, device=device)[:, None]   # (Nq, 1)
    j = torch.arange(Nk, device=device)[None, :]   # (1, Nk)
    return j <= i + (Nk - Nq)                      # (Nq, Nk)


def attention_forward(Q, K, V, mask=None):
    scale = 1.0 / math.sqrt(Q.shape[-1])
    S = (Q @ K.transpose(-2, -1)) * scale
    if mask is not None:
        S = S.masked_fill(~mask, float("-inf"))
    m = S.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    E = torch.exp(S - m)
    Z = E.sum(-1, keepdim=True)
    P = E / torch.where(Z > 0, Z, torch.ones_like(Z))
    return P @ V, P


def attention_backward(Q, K, V, P, grad_O, scale):
    grad_V = P.transpose(-2, -1) @ grad_O
    grad_P = grad_O @ V.transpose(-2, -1)
    grad_S = P * (grad_P - (grad_P * P).sum(-1, keepdim=True))
    grad_Q = (grad_S @ K) * scale
    grad_K = (grad_S.transpose(-2, -1) @ Q) * scale
    return grad_Q, grad_K, grad_V
"""

# The same code with every local renamed, comments reworded/added, spacing and blank lines changed.
ATTENTION_RENAMED = """
def causal_mask(Nq, Nk, device=None):
    # a key is visible unless it lies in the future
    rows = torch.arange(Nq, device=device)[:, None]
    cols = torch.arange(Nk, device=device)[None, :]
    return cols <= rows + (Nk - Nq)

def attention_forward(Q, K, V, mask=None):
    s = 1.0 / math.sqrt(Q.shape[-1])
    scores = (Q @ K.transpose(-2, -1)) * s        # raw attention scores
    if mask is not None:
        scores = scores.masked_fill(~mask,   float('-inf'))
    mx = scores.amax(-1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    ex = torch.exp(scores - mx)   # numerically stable
    tot = ex.sum(-1, keepdim=True)

    probs = ex / torch.where(tot > 0, tot, torch.ones_like(tot))
    return probs @ V, probs

def attention_backward(Q, K, V, P, grad_O, scale):
    # chain rule, one matmul at a time
    dv = P.transpose(-2, -1) @ grad_O
    dp = grad_O @ V.transpose(-2, -1)
    ds = P * (dp - (dp * P).sum(-1, keepdim=True))
    dq = (ds @ K) * scale
    dk = (ds.transpose(-2, -1) @ Q) * scale
    return dq, dk, dv
"""

SOFTMAX_JACOBIAN_EINSUM = """
def softmax_backward(y, grad_out):
    # the full Jacobian diag(y) - y y^T of each row, contracted with grad_out
    jac = torch.diag_embed(y) - torch.einsum("ni,nj->nij", y, y)
    return torch.einsum("nij,nj->ni", jac, grad_out)
"""
LINEAR_LOOP = """
def linear_backward(x, W, grad_out):
    grad_x = torch.zeros_like(x)
    grad_W = torch.zeros_like(W)
    grad_b = torch.zeros(W.shape[0])
    for i in range(x.shape[0]):
        grad_x[i] = W.T @ grad_out[i]
        grad_W += torch.outer(grad_out[i], x[i])
        grad_b += grad_out[i]
    return grad_x, grad_W, grad_b
"""
LINEAR_VECTORISED = """
def linear_backward(x, W, grad_out):
    grad_x = grad_out @ W
    grad_W = grad_out.T @ x
    grad_b = grad_out.sum(dim=0)
    return grad_x, grad_W, grad_b
"""


def pair(rows, a, b):
    """The row of pair {a, b}, or None."""
    found = [r for r in rows if {r["a"], r["b"]} == {a, b}]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_a_verbatim_copy_is_flagged_in_a_small_class_and_nothing_else_is():
    rows = similarity_pairs({"alice": ATTENTION, "bob": ATTENTION, "erin": LINEAR_LOOP})
    assert [(r["a"], r["b"]) for r in rows] == [("alice", "bob")]
    assert rows[0]["similarity"] == 1.0 and rows[0]["threshold"] == similarity.SMALL_CLASS_FLOOR


def test_a_renamed_recommented_respaced_copy_scores_one():
    """The issue's classmate: identifiers renamed scored 0.78 with copydetect; normalised, 1.0."""
    rows = similarity_pairs({"alice": ATTENTION, "carol": ATTENTION_RENAMED})
    assert pair(rows, "alice", "carol")["similarity"] == 1.0


def test_matched_lines_are_shown_side_by_side():
    (row,) = similarity_pairs({"alice": ATTENTION, "carol": ATTENTION_RENAMED})
    texts = {(la.strip(), lb.strip()) for _, la, lb, _ in row["matches"]}
    assert ("grad_V = P.transpose(-2, -1) @ grad_O", "dv = P.transpose(-2, -1) @ grad_O") in texts
    assert all(re.fullmatch(r"L\d+-\d+ ~ L\d+-\d+", where) for *_, where in row["matches"])


def test_different_implementations_of_the_same_function_are_not_flagged():
    answers = {"jacobian": SOFTMAX_JACOBIAN_EINSUM, "loop": LINEAR_LOOP, "vectorised": LINEAR_VECTORISED}
    assert similarity_pairs(answers) == []
    assert similarity_pairs({"loop": LINEAR_LOOP, "vectorised": LINEAR_VECTORISED}) == []
    everything = exercise_scores({"loop": LINEAR_LOOP, "vectorised": LINEAR_VECTORISED})
    assert len(everything) == 1 and everything[0]["similarity"] < 0.5


def test_a_one_line_answer_is_never_flagged():
    one_line = {"ex1": "def relu_backward(grad_a, h):\n    return grad_a * (h > 0)\n"}
    answers = {f"s{i}": dict(one_line) for i in range(30)}
    answers["s99"] = {"ex1": "def relu_backward(g, z):\n    out = g * (z > 0)  # the gate\n    return out\n"}
    rows = exercise_scores(answers)
    assert len(rows) == 31 * 30 // 2
    assert all(r["similarity"] == 1.0 for r in rows if "s99" not in (r["a"], r["b"]))  # the same line
    assert not any(r["flagged"] for r in rows) and not any(r["tellable"] for r in rows)
    assert similarity_pairs(answers) == [] and similarity_pairs(answers, solutions=one_line) == []


def test_code_given_in_the_released_notebook_is_nobodys_work():
    given = "def f(x):\n    h = x @ W1.T + b1\n    A = torch.relu(h)\n    return A @ W2.T + b2\n"
    rows = exercise_scores({"a": given, "b": given}, given=given)
    assert rows[0]["similarity"] == 0.0 and not rows[0]["flagged"]


def test_an_answer_that_does_not_parse_is_still_compared():
    broken = ATTENTION.replace(
        "def attention_backward(Q, K, V, P, grad_O, scale):",
        "def attention_backward(Q, K, V, P, grad_O, scale)",
    )
    rows = similarity_pairs({"alice": ATTENTION, "bob": broken})
    assert pair(rows, "alice", "bob")["similarity"] > 0.9


def test_the_grader_splits_a_notebook_by_exercise():
    lab = CORPUS_LABS[0]
    exs = corpus(lab)["ben"]
    got = similarity.exercise_answers(handed_in(lab, exs), released(lab), labs.graded_functions(lab))
    assert sorted(got) == sorted(exs)
    # as code: comments, docstrings and long strings are no one's evidence (similarity._plain)
    assert got["ex6"] == "\n\n".join(similarity._plain(n) for n in ast.parse(exs["ex6"]).body)
    # an untouched released notebook has no answers at all
    assert similarity.exercise_answers(released(lab), released(lab), labs.graded_functions(lab)) == {}


def test_a_submission_equal_to_the_published_solutions_is_paired_with_them():
    published = {"ex1": ATTENTION, "ex2": LINEAR_LOOP}
    answers = {
        "dave": {"ex1": ATTENTION_RENAMED, "ex2": LINEAR_LOOP},
        "frank": {"ex1": SOFTMAX_JACOBIAN_EINSUM, "ex2": LINEAR_VECTORISED},
        "gina": {"ex1": ATTENTION, "ex2": LINEAR_VECTORISED},  # one exercise as the solutions
    }
    rows = similarity_pairs(answers, solutions=published)
    assert [(r["a"], r["b"], r["exercises"]) for r in rows] == [("dave", SOLUTIONS, "ex1 1.00; ex2 1.00")]
    assert SOLUTIONS == "(published solutions)"
    # between students, what the solutions contain is expected: dave and gina share only that
    # without the solutions, the same answers are flagged between students (a class of three)
    assert [(r["a"], r["b"]) for r in similarity_pairs(answers)] == [("dave", "gina"), ("frank", "gina")]


def test_one_exercise_like_the_solutions_is_not_a_flag():
    """The course's hints give the formulas and its style fixes the names: an honest student's
    answer to one exercise can be the solution's; only most of a lab like it is flagged."""
    published = {"ex1": ATTENTION, "ex2": LINEAR_LOOP, "ex3": SOFTMAX_JACOBIAN_EINSUM * 4}
    answers = {"ann": {"ex1": ATTENTION_RENAMED, "ex2": LINEAR_VECTORISED, "ex3": LINEAR_LOOP}}
    rows = exercise_scores(answers, solutions=published)
    assert [r["similarity"] for r in rows if r["exercise"] == "ex1"] == [1.0]
    assert not any(r["flagged"] for r in rows)


def test_empty_answers_are_ignored():
    rows = exercise_scores({"empty": "", "blank": "  \n\n  ", "alice": ATTENTION}, solutions="")
    assert rows == []


def test_rows_are_sorted_by_similarity_then_names():
    partial = ATTENTION.replace(
        "(grad_P * P).sum(-1, keepdim=True)", "torch.sum(grad_P * P, dim=-1, keepdim=True)"
    )
    answers = {"zed": ATTENTION, "yan": ATTENTION, "bea": partial, "abe": ATTENTION_RENAMED}
    # four of seven share one answer: the class's own pairs set the scale
    answers.update(erin=LINEAR_LOOP, frank=SOFTMAX_JACOBIAN_EINSUM, gus=LINEAR_VECTORISED)
    rows = similarity_pairs(answers)
    assert len(rows) == 6
    keys = [(-r["similarity"], r["a"], r["b"]) for r in rows]
    assert keys == sorted(keys)
    assert all(r["a"] < r["b"] for r in rows)
    assert rows[0]["similarity"] > rows[-1]["similarity"]  # the edited copy scores lower


def test_a_class_that_all_hands_in_one_answer_cannot_tell():
    """Most pairs near-identical: the exercise has one way to write it (or everyone copied): no flag."""
    answers = {f"s{i}": ATTENTION_RENAMED if i % 2 else ATTENTION for i in range(6)}
    answers["odd"] = LINEAR_LOOP
    rows = exercise_scores(answers)
    assert {r["threshold"] for r in rows} == {similarity.NEVER}
    assert similarity_pairs(answers) == []


def test_same_inputs_give_exactly_the_same_rows_in_any_process():
    answers = {
        "alice": ATTENTION,
        "bob": ATTENTION_RENAMED,
        "erin": SOFTMAX_JACOBIAN_EINSUM,
        "frank": LINEAR_LOOP,
    }
    strip = lambda rows: [{k: v for k, v in r.items() if k != "_answers"} for r in rows]  # noqa: E731
    first = strip(exercise_scores(answers, solutions=LINEAR_VECTORISED))
    assert len(first) == 6 + 4
    assert strip(exercise_scores(dict(reversed(list(answers.items()))), solutions=LINEAR_VECTORISED)) == first
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import similarity; a, s = json.loads(sys.stdin.read()); "
        "print(json.dumps([{k: v for k, v in r.items() if k != '_answers'} for r in similarity.exercise_scores(a, s)]))"
    )
    for seed in (1, 2):
        out = subprocess.run(
            [sys.executable, "-c", code, str(ROOT / "tools" / "grader")],
            input=json.dumps([answers, LINEAR_VECTORISED]),
            capture_output=True,
            text=True,
            env=dict(os.environ, PYTHONHASHSEED=str(seed)),
            timeout=60,
            check=True,
        )
        assert json.loads(out.stdout) == json.loads(json.dumps(first))


def test_a_submission_may_not_take_the_solutions_name():
    with pytest.raises(ValueError, match="published solutions"):
        similarity_pairs({SOLUTIONS: ATTENTION, "bob": ATTENTION}, solutions=ATTENTION)


# ----------------------------------------------------------------- the report


def read_csv(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_write_report_writes_the_header_rows_and_the_side_by_side_page(tmp_path):
    rows = similarity_pairs({"alice": ATTENTION, "carol": ATTENTION_RENAMED, "dave": LINEAR_LOOP})
    path = tmp_path / "gradebook_similarity.csv"
    write_report(rows, path, cell=labs._cell)
    got = read_csv(path)
    assert got[0] == list(similarity.FIELDS)
    assert [line[:2] for line in got[1:]] == [[r["a"], r["b"]] for r in rows]
    assert all(len(line[2].split(".")[1]) == 3 for line in got[1:])
    assert all(re.match(r"all: \d+ statements, lines \d+-\d+ ~ \d+-\d+", line[6]) for line in got[1:])
    page = (tmp_path / "gradebook_similarity.html").read_text()
    assert "dv = P.transpose(-2, -1) @ grad_O" in page and "alice &harr; carol" in page


def test_write_report_with_no_rows_still_writes_the_header(tmp_path):
    path = tmp_path / "empty.csv"
    write_report([], path)
    assert read_csv(path) == [list(similarity.FIELDS)]
    assert "No pair stands out" in (tmp_path / "empty.html").read_text()


@pytest.mark.parametrize("cell", [None, labs._cell])
def test_every_cell_of_the_report_is_text_not_a_formula(tmp_path, cell):
    """Folder names are the students' own, and so is the code: every cell is escaped, also the page."""
    evil = ['=HYPERLINK("http://x","y")', "+1\x1b[31m", "-2", "@SUM(A1)", "\tx", "\rx"]
    rows = [
        {
            "a": a,
            "b": b,
            "similarity": 0.95,
            "threshold": 0.9,
            "exercises": "=ex1",
            "tokens_overlap": 5,
            "matches": [("ex1", "<script>x</script>", "y", "-L1")],
        }
        for a, b in zip(evil, evil[1:] + evil[:1])
    ]
    path = tmp_path / "similarity.csv"
    write_report(rows, path, cell=cell)
    for line in read_csv(path)[1:]:
        for value in line:
            assert value[:1] not in ("=", "+", "-", "@", "\t", "\r"), line
            assert all(ch.isprintable() for ch in value), line
    assert read_csv(path)[1][0] == '\'=HYPERLINK("http://x","y")'
    assert "<script>" not in (tmp_path / "similarity.html").read_text()


def test_csv_cell_escapes_what_starts_a_formula():
    assert similarity.csv_cell("=1+1") == "'=1+1"
    assert similarity.csv_cell("\t=1") == "' =1"
    assert similarity.csv_cell("\r@x") == "' @x"
    assert similarity.csv_cell("alice") == "alice"
    assert similarity.csv_cell(0.5) == "0.5"


def test_hostile_answers_do_not_break_the_report():
    deep = "x = " + "(" * 3000 + "1" + ")" * 3000 + "\n"
    nested = (
        "def f(a):\n" + "".join("    " * (i + 1) + "if a:\n" for i in range(90)) + "    " * 91 + "a = 1\n"
    )
    junk = "\x00\x1b[31m def ((( :: '''\n" * 50
    answers = {"deep": deep, "nested": nested, "junk": junk, "alice": ATTENTION, "bob": ATTENTION_RENAMED}
    rows = similarity_pairs(answers)
    assert [(r["a"], r["b"]) for r in rows] == [("alice", "bob")]


@pytest.mark.parametrize("lab", CORPUS_LABS)
def test_the_graders_whole_lab_texts_flag_no_honest_work(lab):
    """Until the grader passes answers per exercise, it passes each submission's new lines as one
    text (labs.answer_text): coarser (lines cut out of their def do not parse), never an honest flag."""
    flat = {n: labs.answer_text(handed_in(lab, exs), lab) for n, exs in corpus(lab).items()}
    assert similarity_pairs(flat, labs.answer_text(labs.solution_notebook(lab), lab)) == []


@pytest.mark.parametrize("lab", CORPUS_LABS)
def test_a_copy_moved_above_exercise_1_or_under_rewritten_headings_is_still_each_exercises(lab):
    """Red team s8: answers were cut at the "Exercise N" headings, so the solutions in one cell above
    exercise 1, or under headings written "Exercise\u00a0N" (a no-break space: the same on screen),
    were no exercise's and full marks went unflagged. An answer is what the graded functions run
    (``exercise_answers``): the moved copy, the rewritten one and a plain copy give the same answers;
    a markdown cell of 10⁵ newlines is not read at all."""
    rel, fns = released(lab), labs.graded_functions(lab)
    sol_nb = labs.solution_notebook(lab)
    sol = similarity.exercise_answers(sol_nb, rel, fns)
    given = {c.source.strip() for c in rel.cells if c.cell_type == "code"}
    answers = [c for c in sol_nb.cells if c.cell_type == "code" and c.source.strip() not in given]
    moved = released(lab)
    for c in moved.cells:
        if "otter_answer_cell" in c.metadata.get("tags", []):
            c.source = "# see above"
    moved.cells.insert(1, nbformat.v4.new_code_cell("\n\n".join(c.source for c in answers)))
    moved.cells.insert(0, nbformat.v4.new_markdown_cell("\n" * 100_000))
    renamed = labs.solution_notebook(lab)
    for c in renamed.cells:
        if c.cell_type == "markdown":
            c.source = re.sub(r"Exercise (\d)", "Exercise\u00a0\\1", c.source)
    assert sorted(sol) == sorted(fns), sorted(sol)
    assert similarity.exercise_answers(moved, rel, fns) == sol
    assert similarity.exercise_answers(renamed, rel, fns) == sol


@pytest.mark.parametrize("lab", CORPUS_LABS[:3])
def test_a_copy_padded_inside_its_functions_gives_the_plain_copys_answers(lab):
    """Red team s8: a 200,000-character comment (or docstring) as the first line of each def filled the
    length at which an answer is cut, and the copied code was never compared. Answers are code: comments,
    docstrings and long strings are gone before anything is cut."""
    rel, fns = released(lab), labs.graded_functions(lab)
    sol_nb = labs.solution_notebook(lab)
    sol = similarity.exercise_answers(sol_nb, rel, fns)
    pad = "x" * 200_000
    doc = '"' * 3
    for c in sol_nb.cells:
        if c.cell_type == "code":
            c.source = re.sub(
                r"^(\s*)(def .*:\n)",
                lambda m: f"{m[1]}{m[2]}{m[1]}    # {pad}\n{m[1]}    {doc}{pad}{doc}\n",
                c.source,
                flags=re.M,
            )
    assert any(pad in c.source for c in sol_nb.cells)
    assert similarity.exercise_answers(sol_nb, rel, fns) == sol


def test_a_cell_ipython_cannot_transform_is_no_answer_and_stops_nothing():
    """Red team s8: 501 `%time 1` lines make IPython's transformer raise RuntimeError; read in the grading
    process, it ended the class's run with no gradebook. Such a cell is unread, as one that does not parse."""
    nb = {
        "cells": [
            {"cell_type": "code", "source": "\n".join(["%time 1"] * 501)},
            {"cell_type": "code", "source": "def f(x):\n    return x"},
        ]
    }
    assert similarity.exercise_answers(nb, {"cells": []}, {"ex1": {"f"}}) == {
        "ex1": "def f(x):\n    return x"
    }


def test_two_long_identical_answers_show_at_most_matched_most_statements():
    code = "\n".join(f"x{i} = torch.ones({i}) * {i}" for i in range(3 * similarity.MATCHED_MOST))
    a = similarity.Answer(code, similarity.bound_names(code), set())
    lines = similarity.matched_lines(a, a)
    assert len(lines) == similarity.MATCHED_MOST and lines[0][2] == "L1-1 ~ L1-1"


def _padded(code: str, dead: str, n: int) -> str:
    """``code`` with ``n`` dead helpers appended: ``dead``'s functions and classes renamed, never called."""
    out = [code]
    for k in range(n):
        out.append(re.sub(r"^(def|class) (\w+)", rf"\1 _unused_{k}_\2", dead, flags=re.M))
    return "\n\n".join(out) + "\n"


@pytest.mark.parametrize("lab", CORPUS_LABS)
def test_a_copy_padded_with_dead_helpers_scores_as_the_copy_does(lab):
    """Issue 33: the published solutions padded with dead helper functions (another student's answers,
    renamed, never called) dropped below the copy line (0.75-0.94). What the graded functions cannot
    run is not the answer: the padded copy scores what the plain copy does, and is flagged."""
    sol = solutions(lab)
    dead = "\n\n".join(corpus(lab)["ana"].values())
    padded = {ex: _padded(code, dead, 3) for ex, code in sol.items()}
    rel = released(lab)
    answers = {
        n: similarity.exercise_answers(handed_in(lab, exs), rel, labs.graded_functions(lab))
        for n, exs in (("plain", sol), ("padded", padded))
    }
    given = similarity.given_code(released(lab))
    rows = exercise_scores(answers, sol, given=given)
    got = {(r["exercise"], r["a"]): round(r["similarity"], 6) for r in rows if r["b"] == SOLUTIONS}
    for ex in sol:
        if ("plain", ex) in {(a, e) for e, a in got}:
            assert got[(ex, "padded")] == got[(ex, "plain")], (ex, got[(ex, "padded")], got[(ex, "plain")])
    flagged = {(r["a"], r["b"]) for r in similarity_pairs(answers, sol, given=given)}
    assert (("padded", SOLUTIONS) in flagged) == (("plain", SOLUTIONS) in flagged), flagged
