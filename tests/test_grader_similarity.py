"""tools/grader/similarity.py: near-identical answers are flagged (copydetect), different ones are not."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "grader"))
sys.path.insert(0, str(ROOT / "tools"))
import similarity  # noqa: E402
from similarity import SOLUTIONS, similarity_pairs, write_report  # noqa: E402

import labs  # noqa: E402

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

# Two genuinely different softmax backwards (y = softmax output, g = upstream gradient) ...
SOFTMAX_KEEPDIM = """
def softmax_backward(y, grad_out):
    # one dot product per row: <grad_out, y>
    dot = (grad_out * y).sum(dim=-1, keepdim=True)
    return y * (grad_out - dot)
"""
SOFTMAX_JACOBIAN_EINSUM = """
def softmax_backward(y, grad_out):
    # the full Jacobian diag(y) - y y^T of each row, contracted with grad_out
    jac = torch.diag_embed(y) - torch.einsum("ni,nj->nij", y, y)
    return torch.einsum("nij,nj->ni", jac, grad_out)
"""
SOFTMAX_DOT_EINSUM = """
def softmax_backward(probs, upstream):
    s = torch.einsum("bi,bi->b", probs, upstream)
    return probs * upstream - probs * s[:, None]
"""
# ... and a linear layer's backward written with loops and vectorised.
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
PUBLISHED = SOFTMAX_KEEPDIM + LINEAR_VECTORISED


def pair(rows, a, b):
    """The row of pair {a, b}, or None."""
    found = [r for r in rows if {r["a"], r["b"]} == {a, b}]
    assert len(found) <= 1, found
    return found[0] if found else None


def test_a_verbatim_copy_is_flagged_near_one_and_nothing_else_is():
    rows = similarity_pairs({"alice": ATTENTION, "bob": ATTENTION, "erin": SOFTMAX_JACOBIAN_EINSUM})
    assert [(r["a"], r["b"]) for r in rows] == [("alice", "bob")]
    assert rows[0]["similarity"] > 0.95
    assert rows[0]["tokens_overlap"] > 100  # three functions' worth of filtered code


def test_renamed_variables_and_reworded_comments_are_still_flagged():
    assert ATTENTION_RENAMED != ATTENTION
    rows = similarity_pairs({"alice": ATTENTION, "carol": ATTENTION_RENAMED})
    r = pair(rows, "alice", "carol")
    assert r is not None and r["similarity"] >= 0.8, rows


def test_different_implementations_of_the_same_function_are_not_flagged():
    answers = {
        "einsum_jacobian": SOFTMAX_JACOBIAN_EINSUM,
        "einsum_dot": SOFTMAX_DOT_EINSUM,
        "keepdim": SOFTMAX_KEEPDIM,
        "loop": LINEAR_LOOP,
        "vectorised": LINEAR_VECTORISED,
    }
    assert similarity_pairs(answers) == []
    # "clearly below" 0.8, not just below: every pair's figure (threshold 0 lists them all)
    everything = similarity_pairs(answers, threshold=0.0)
    assert len(everything) == 10
    assert max(r["similarity"] for r in everything) < 0.5, everything


def test_threshold_zero_lists_low_scoring_pairs_so_the_above_is_not_vacuous():
    rows = similarity_pairs({"loop": LINEAR_LOOP, "vectorised": LINEAR_VECTORISED}, threshold=0.0)
    assert len(rows) == 1 and 0.0 <= rows[0]["similarity"] < 0.8


def test_a_submission_equal_to_the_published_solutions_is_paired_with_them():
    answers = {"dave": PUBLISHED, "frank": LINEAR_LOOP + SOFTMAX_JACOBIAN_EINSUM}
    rows = similarity_pairs(answers, solutions=PUBLISHED)
    assert [(r["a"], r["b"]) for r in rows] == [("dave", SOLUTIONS)]
    assert SOLUTIONS == "(published solutions)"
    assert rows[0]["similarity"] > 0.95
    # without the solutions nobody is flagged
    assert similarity_pairs(answers) == []


def test_an_answer_that_is_only_part_of_the_other_scores_the_mean_of_both_shares():
    # all of gina's code is in the solutions, but only about half of the solutions is in hers:
    # the figure is the mean of the two shares (the max would be 1.0), so not "near-identical"
    rows = similarity_pairs({"gina": SOFTMAX_KEEPDIM}, solutions=PUBLISHED, threshold=0.0)
    assert len(rows) == 1 and 0.6 < rows[0]["similarity"] < 0.8, rows
    assert similarity_pairs({"gina": SOFTMAX_KEEPDIM}, solutions=PUBLISHED) == []


def test_empty_and_short_answers_are_ignored():
    short = "return (g*y).sum(-1, keepdim=True)"  # under 40 characters
    answers = {
        "empty": "",
        "blank": "  \n\n   ",
        "short1": short,
        "short2": short,
        "stub": "def f(x):\n    ...\n",
        "alice": ATTENTION,
    }
    assert similarity_pairs(answers, solutions="", threshold=0.0) == []
    # it is min_chars that drops the identical short answers: allowed, they are flagged
    rows = similarity_pairs(answers, threshold=0.0, min_chars=10)
    assert pair(rows, "short1", "short2")["similarity"] > 0.95
    assert all("empty" not in (r["a"], r["b"]) and "blank" not in (r["a"], r["b"]) for r in rows)


def test_rows_are_sorted_by_similarity_then_names():
    partial = ATTENTION.replace(
        "(grad_P * P).sum(-1, keepdim=True)", "torch.sum(grad_P * P, dim=-1, keepdim=True)"
    )
    answers = {"zed": ATTENTION, "yan": ATTENTION, "bea": partial, "abe": ATTENTION_RENAMED}
    rows = similarity_pairs(answers)
    assert len(rows) == 6
    keys = [(-r["similarity"], r["a"], r["b"]) for r in rows]
    assert keys == sorted(keys)
    assert all(r["a"] < r["b"] for r in rows)
    assert rows[0]["similarity"] > rows[-1]["similarity"]  # the edited copy scores lower


def run_in_fresh_process(answers, solutions, hashseed):
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import similarity; "
        "a, s = json.loads(sys.stdin.read()); "
        "print(json.dumps(similarity.similarity_pairs(a, s, threshold=0.0)))"
    )
    env = dict(os.environ, PYTHONHASHSEED=str(hashseed))
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "tools" / "grader")],
        input=json.dumps([answers, solutions]),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout)


def test_same_inputs_give_exactly_the_same_rows():
    answers = {
        "alice": ATTENTION,
        "bob": ATTENTION_RENAMED,
        "carol": SOFTMAX_DOT_EINSUM,
        "dave": PUBLISHED,
        "erin": SOFTMAX_JACOBIAN_EINSUM,
        "frank": LINEAR_LOOP,
    }
    first = similarity_pairs(answers, solutions=PUBLISHED, threshold=0.0)
    assert len(first) == 21  # 15 pairs + 6 against the solutions
    assert similarity_pairs(answers, solutions=PUBLISHED, threshold=0.0) == first
    reordered = dict(reversed(list(answers.items())))
    assert similarity_pairs(reordered, solutions=PUBLISHED, threshold=0.0) == first
    # copydetect hashes k-grams with Python's salted str hash: other seeds, same rows
    assert all(isinstance(r["similarity"], float) and isinstance(r["tokens_overlap"], int) for r in first)
    for seed in (1, 2):
        assert run_in_fresh_process(answers, PUBLISHED, seed) == json.loads(json.dumps(first))


def test_a_submission_may_not_take_the_solutions_name():
    with pytest.raises(ValueError, match="published solutions"):
        similarity_pairs({SOLUTIONS: ATTENTION, "bob": ATTENTION}, solutions=PUBLISHED)


def test_write_report_writes_the_header_and_rows(tmp_path):
    rows = similarity_pairs(
        {"alice": ATTENTION, "carol": ATTENTION_RENAMED, "dave": PUBLISHED}, solutions=PUBLISHED
    )
    assert len(rows) == 2
    path = tmp_path / "similarity.csv"
    write_report(rows, path, cell=labs._cell)
    with open(path, newline="") as f:
        got = list(csv.reader(f))
    assert got[0] == ["a", "b", "similarity", "tokens_overlap"]
    assert got[1:] == [[r["a"], r["b"], f"{r['similarity']:.3f}", str(r["tokens_overlap"])] for r in rows]
    assert all(len(line[2].split(".")[1]) == 3 for line in got[1:])
    assert {tuple(line[:2]) for line in got[1:]} == {("alice", "carol"), ("dave", SOLUTIONS)}


def test_write_report_with_no_rows_still_writes_the_header(tmp_path):
    path = tmp_path / "empty.csv"
    write_report([], path, cell=labs._cell)
    assert path.read_text().splitlines() == ["a,b,similarity,tokens_overlap"]
    assert similarity.FIELDS == ("a", "b", "similarity", "tokens_overlap")


def test_a_student_name_in_the_report_is_text_not_a_formula(tmp_path):
    """Folder names are the students' own: the report escapes them as the gradebook does."""
    rows = [{"a": '=HYPERLINK("http://x","y")', "b": "+1\x1b[31m", "similarity": 0.9, "tokens_overlap": 5}]
    path = tmp_path / "similarity.csv"
    write_report(rows, path, cell=labs._cell)
    with open(path, newline="", encoding="utf-8") as f:
        got = list(csv.reader(f))[1]
    assert got[:2] == ['\'=HYPERLINK("http://x","y")', "'+1 [31m"]
