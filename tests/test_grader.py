"""Grading that holds against a determined student: the red-team suite for `tools/labs.py grade`.

Every hostile submission below is graded by the real `grade` command, in one batch (two at a
time, as an instructor would run it), next to honest ones. Each must score exactly what its
honest work deserves, and leave the repository, the other submissions, their grades and the
autograder as they were. A correct submission is graded right after (and beside) each hostile one
that reaches past its own process (files, processes, descriptors, memory: ``REACHES_OUT``); one
that only lies inside its own process is graded beside honest ones, which prove the same.
"""

import csv
import functools
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
import sandbox  # noqa: E402

import labs  # noqa: E402

LAB = "lab01_cat_mlp"
TIMEOUT = 150  # seconds per notebook; a real one takes 4-10 s
# the hostile batch's limit: about what `grade` gives lab 1 by itself (10 × the solutions' 4 s, at least
# 30 s), with room for a busy machine; its fork bomb and hogs hold their slots for this long
BATCH_TIMEOUT = 60
LOOP_TIMEOUT = 16  # the infinite loops are graded on their own (a cell may spin 4 s; lab 1 grades in about 3)
# a loop that catches what stops its cell: only the notebook's time limit ends it (it waits rather
# than spins: what it proves is the same, and the suite's other worker keeps the core for 30 s)
STUBBORN_LOOP = (
    "while True:\n    try:\n        while True:\n            __import__('time').sleep(0.05)\n"
    "    except BaseException:\n        pass"
)


def _solutions(lab):
    """The source's solution cells, markers removed, in order."""
    out = []
    for _, where, cell in labs.regions(labs.read_nb(labs.source_path(lab))):
        if where == "solution":
            lines = [
                ln.replace("  # SOLUTION", "")
                for ln in cell.source.splitlines()
                if ln.strip() not in ("# BEGIN SOLUTION", "# END SOLUTION")
            ]
            out.append("\n".join(lines))
    return out


def _submission(lab, answers=None, insert=None):
    """The student notebook with answers[i] in answer cell i (None: left as is), cells inserted after slots."""
    nb = labs.read_nb(labs.student_path(lab))
    slots = [c for c in nb.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
    for cell, ans in zip(slots, answers or []):
        if ans is not None:
            cell.source = ans
    for after, code in insert or []:  # after = -1: before exercise 1's answer cell
        at = nb.cells.index(slots[0]) if after < 0 else nb.cells.index(slots[after]) + 1
        nb.cells.insert(at, nbformat.v4.new_code_cell(code))
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs = []
    return nbformat.writes(nb)


def _tree_hashes(
    root: Path,
    skip=(".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", "_build", "node_modules"),
) -> dict:
    """sha256 of every file under root (what a hostile submission must not change)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skip]
        for f in filenames:
            if f.endswith(".mo"):  # compiled catalogs: a Chinese build beside the red team writes them
                continue
            p = Path(dirpath) / f
            try:
                out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
            except OSError:
                pass
    return out


# ------------------------------------------------------------------ the hostile submissions
# Each is code inserted into the empty student notebook (so honest work = 0 points) unless its
# entry says otherwise. {subs}, {out}, {root} are filled with the real paths: a student who
# knows where everything lives on the grading machine still gets nowhere.

FORGED = json.dumps(
    {
        "status": "ok",
        "errors": [],
        "notes": [],
        "questions": {
            q: {"score": 99.0, "possible": 1.0, "passed": 9, "cases": 9}
            for q in ("ex1", "ex2", "ex3", "ex4", "ex5", "ex6")
        },
    }
)

HOSTILE = {
    "fake_output": 'print("All tests passed!\\nScore: 11/11")\nfrom IPython.display import HTML, display\n'
    'display(HTML("<p><strong>q1</strong> passed! 🎉</p>"))',
    "monkeypatch": "import doctest, unittest, math, builtins, operator\nimport numpy as np\nimport torch\n"
    "doctest.DocTestRunner.summarize = lambda *a, **k: doctest.TestResults(0, 0)\n"
    "torch.allclose = torch.equal = torch.isclose = lambda *a, **k: True\n"
    "torch.Tensor.__eq__ = lambda *a: True\ntorch.Tensor.all = lambda *a, **k: True\n"
    "torch.testing.assert_close = lambda *a, **k: None\nnp.allclose = lambda *a, **k: True\n"
    "unittest.TestCase.assertTrue = lambda *a, **k: None\nmath.isclose = lambda *a, **k: True\n"
    "builtins.abs = lambda x: 0\noperator.lt = lambda a, b: True\n"
    "builtins.AssertionError = type('Nothing', (Exception,), {{}})",
    "rewrite_tests": "import os, glob, shutil\nfor p in glob.glob('{root}/labs/source/**', recursive=True) "
    "+ glob.glob('{root}/tools/grader/*.py') + glob.glob('{root}/tests/*.py'):\n"
    "    try:\n        open(p, 'w').write('assert True')\n    except Exception:\n        pass\n"
    "    try:\n        os.remove(p)\n    except Exception:\n        pass\n"
    "shutil.rmtree('{root}/labs', ignore_errors=True)\nshutil.rmtree('/grader', ignore_errors=True)",
    "forge_results": "import os\nforged = {forged!r}\nfor d, _, _ in os.walk('/'):\n"
    "    if d.startswith(('/proc', '/sys', '/dev', '/usr')):\n        continue\n"
    "    for name in ('result.json', 'results.json', 'spec.json'):\n        try:\n"
    "            open(os.path.join(d, name), 'w').write(forged)\n        except Exception:\n            pass\n"
    "for p in ('{out}', '{out}.tmp'):\n    try:\n        open(p, 'w').write('submission,total\\nforge_results,11\\n')\n"
    "    except Exception:\n        pass\nprint(forged)",
    "kill_parent": "import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
    "    except Exception:\n        pass",
    "daemon": "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(2)\n"
    "        for p in ('{out}', '{subs}/zz_classmate.ipynb'):\n            try:\n"
    "                open(p, 'w').write('daemon,11\\n')\n            except Exception:\n                pass\n"
    "        os._exit(0)\n    os._exit(0)",
    "classmates": "import glob, json, os\nmine = {{}}\nfor p in glob.glob('{subs}/*.ipynb') + glob.glob('/proc/*/cwd/*.ipynb') + glob.glob('/proc/*/root{subs}/*.ipynb'):\n"
    "    try:\n        nb = json.load(open(p))\n        for c in nb['cells']:\n            if c['cell_type'] == 'code':\n"
    "                exec(''.join(c['source']), mine)\n    except Exception:\n        pass\n"
    "    try:\n        open(p, 'w').write('{{}}')\n    except Exception:\n        pass\n"
    "globals().update({{k: v for k, v in mine.items() if k.endswith(('_pass', '_loss', '_backward', '_batch'))}})",
    "poison_autograder": "import glob, os\nfor p in glob.glob('{root}/**/*autograder*', recursive=True) + glob.glob('{root}/helpers/*.py'):\n"
    "    try:\n        open(p, 'a').write('\\nimport builtins; builtins.__dict__[\"all\"] = lambda *a: True\\n')\n"
    "    except Exception:\n        pass\nimport helpers\ntry:\n    open(helpers.__file__, 'a').write('x = 1')\n"
    "except Exception:\n    pass",
    "leak_feedback": "secret = []\nfor p in ('{root}/labs/source/{lab}.ipynb', '{root}/labs/source/contracts/{lab}.py'):\n    try:\n"
    "        secret.append(open(p).read())\n    except Exception as e:\n        secret.append(repr(e))\n"
    "raise RuntimeError({snippet!r} + ' LEAK ' + ' '.join(secret))",
    "memory_bomb": "import torch\nx = bytearray(64 * 2 ** 30)",
    # where the sandbox's home and the course live on the grading machine, in the error's message
    "host_paths": "import sys, helpers\n"
    "_m = [ln.split()[3] for ln in open('/proc/self/mountinfo') if ' /home/student ' in ln]\n"
    "raise FileNotFoundError(' '.join(_m + [helpers.__file__, sys.prefix]))",
    "fork_bomb": "import os\nif os.fork() == 0:\n    while True:\n        try:\n            os.fork()\n        except Exception:\n            pass",
    "protocol_forgery": "import os, json, struct\nfor fd in range(3, 64):\n    for reply in ({{'kind': 'reply', 'value': {{'result': 1}}}}, {{'kind': 'request', 'op': 'x'}}):\n"
    "        head = json.dumps(reply).encode()\n        try:\n"
    "            os.write(fd, struct.pack('<QI', len(head), 0) + head)\n        except Exception:\n            pass",
}


# the hostile submissions below that switch the worker's guards off (their exercises wait for review)
GUARDS_SWITCHED_OFF = {"guards_off", "forge_worker"}

# these go after the last answer cell (so the stubs do not overwrite what they define); from a red-team review
HOSTILE_LAST = {
    "guards_off": "import torch\nfrom helpers import cat_mlp\nG = getattr(cat_mlp.forward, '__glo' + 'bals__')\n"
    "G['STATE']['forbidden'] = {{}}\n"
    "def forward_pass(x, W1, b1, W2, b2, y_true):\n    return cat_mlp.forward(x, W1, b1, W2, b2, y_true)\n"
    "def relu_backward(g, h):\n    hh = h.clone().requires_grad_()\n    return torch.autograd.grad(torch.relu(hh), hh, g)[0]\n"
    "def cat_backward_batch(X, W1, b1, W2, b2, Y):\n    P = [t.clone().requires_grad_() for t in (W1, b1, W2, b2)]\n"
    "    L = ((torch.relu(X @ P[0].T + P[1]) @ P[2].T + P[3] - Y) ** 2).sum()\n"
    "    return dict(zip(('W1', 'b1', 'W2', 'b2'), torch.autograd.grad(L, P)))",
    "forge_worker": "import torch\nG = torch.autograd.variable.Variable._execution_engine.run_backward.__globals__\n"
    "P = G['PEER']\nP.handlers['run_test'] = lambda msg, value: {{'ok': True}}\n"
    "P.handlers['violations'] = lambda msg, value: {{}}\n_send = P.send\n"
    "def send(header, value=None, has_value=False):\n    if isinstance(value, dict) and 'errors' in value:\n"
    "        value = {{'errors': [1, {{'cell': 'x'}}, '\\x1b[31m=HYPERLINK(1)']}}\n    return _send(header, value, has_value)\n"
    "P.send = send",
    "zero_inputs": "import torch\ndef forward_pass(x, W1, b1, W2, b2, y_true):\n    for t in (x, W1, b1, W2, b2, y_true):\n        t.zero_()\n"
    "    z = lambda *s: torch.zeros(*s, dtype=x.dtype)\n"
    "    return {{'h': z(W1.shape[0]), 'a': z(W1.shape[0]), 'y_hat': z(W2.shape[0]), 'L': z(())}}\n"
    "def grad_loss(y_hat, y_true):\n    y_hat.zero_(); y_true.zero_()\n    return torch.zeros_like(y_hat)\n"
    "def layer2_backward(grad_y_hat, a, W2):\n    return ()\n"
    "def relu_backward(grad_a, h):\n    h.zero_()\n    return torch.zeros_like(grad_a)\n"
    "def layer1_backward(grad_h, x):\n    return ()\n"
    "def cat_backward_batch(X, W1, b1, W2, b2, Y):\n    for t in (X, W1, b1, W2, b2, Y):\n        t.zero_()\n"
    "    return {{}}",
    "huge_returns": "import torch\ndef cat_backward_batch(X, W1, b1, W2, b2, Y):\n"
    "    big = lambda: torch.zeros(1, dtype=torch.float64).expand(8 << 20)\n"
    "    return {{'W1': big(), 'b1': big(), 'W2': big(), 'b2': big()}}",
}


# the hostile submissions whose harm could outlive their own process (a process left behind, a
# file written, memory or processes exhausted, the harness killed): each is followed by a correct
# one. Those that only lie inside their own process are graded beside the honest ones, which
# prove the same (their twins were 12 more gradings: about 45 s of the suite on 2 cores).
REACHES_OUT = {
    "rewrite_tests",
    "forge_results",
    "kill_parent",
    "daemon",
    "classmates",
    "poison_autograder",
    "memory_bomb",
    "fork_bomb",
}
assert REACHES_OUT <= set(HOSTILE) | set(HOSTILE_LAST)


@pytest.fixture(scope="module")
def redteam(tmp_path_factory):
    """Grade every hostile submission beside honest ones; (rows, feedback dir, paths, snapshots)."""
    sol = _solutions(LAB)
    assert len(sol) == 6
    d = tmp_path_factory.mktemp("subs")
    out_dir = tmp_path_factory.mktemp("grades")
    out = out_dir / "gradebook.csv"
    secrets = labs.secret_snippets(labs.read_nb(labs.source_path(LAB)))
    fill = {
        "subs": str(d),
        "out": str(out),
        "root": str(ROOT),
        "lab": LAB,
        "forged": FORGED,
        "snippet": secrets[0],
    }
    for name, code in HOSTILE.items():
        (d / f"{name}.ipynb").write_text(_submission(LAB, insert=[(0, code.format(**fill))]))
    for name, code in HOSTILE_LAST.items():
        (d / f"{name}.ipynb").write_text(_submission(LAB, insert=[(5, code.format(**fill))]))
    for name in REACHES_OUT:
        (d / f"{name}_then_correct.ipynb").write_text(_submission(LAB, sol))
    # names, not notebooks: a name the report uses itself, a formula in a spreadsheet (a file that is
    # not a notebook takes no grading's time and still gets its row, its feedback and its label)
    (d / "(published solutions).ipynb").write_text('{"cells": [')
    (d / '=HYPERLINK("x").ipynb').write_text('{"cells": [')
    partial = sol[:3] + [
        sol[3].replace("(h > 0)", "(h >= 0)"),
        sol[4].replace("torch.outer(grad_h, x)", "torch.outer(x, grad_h)"),
        None,
    ]
    assert partial[3] != sol[3] and partial[4] != sol[4]
    broken = (
        sol[:4]
        + [sol[4].replace("def layer1_backward(grad_h, x):", "def layer1_backward(grad_h, x)")]
        + sol[5:]
    )
    autograd_ex3 = (
        sol[:2]
        + [
            "import torch\n\ndef layer2_backward(grad_y_hat, a, W2):\n"
            "    W, b, x = W2.clone().requires_grad_(), torch.zeros(W2.shape[0], dtype=a.dtype).requires_grad_(), a.clone().requires_grad_()\n"
            "    return torch.autograd.grad(W @ x + b, (W, b, x), grad_y_hat)"
        ]
        + sol[3:]
    )
    # ex3 by autograd and ex6 by the course's reference, in one notebook: each costs its own exercise only
    reference_ex6 = autograd_ex3[:5] + [
        "from helpers import cat_mlp\n\n"
        "def cat_backward_batch(X, W1, b1, W2, b2, Y):\n    out = {k: 0 for k in ('W1', 'b1', 'W2', 'b2')}\n"
        "    for i in range(X.shape[0]):\n        g = cat_mlp.backward(cat_mlp.forward(X[i], W1, b1, W2, b2, Y[i]), W2, Y[i])\n"
        "        out = {k: out[k] + g[k] for k in out}\n    return out"
    ]
    honest = {
        "full": _submission(LAB, sol),
        "partial": _submission(LAB, partial),
        "empty": _submission(LAB),
        "syntax_error": _submission(LAB, broken),
        "exits_midway": _submission(
            LAB, sol, insert=[(1, "import sys\nsys.exit(1)"), (3, "import os\nos._exit(0)")]
        ),
        "kills_itself": _submission(
            LAB, sol, insert=[(5, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")]
        ),
        "autograd_in_ex3_reference_in_ex6": _submission(LAB, reference_ex6),
        "zz_classmate": _submission(LAB, sol),
    }
    for name, text in honest.items():
        (d / f"{name}.ipynb").write_text(text)
    (d / "corrupt.ipynb").write_text('{"cells": [ this is not json')
    (d / "wrong_lab.ipynb").write_text(labs.student_path("lab02_chain_rule").read_text())
    before_subs, before_root = _tree_hashes(d), _tree_hashes(ROOT)
    t0 = time.monotonic()
    labs.grade(LAB, d, out, timeout=BATCH_TIMEOUT, jobs=2)
    seconds = time.monotonic() - t0
    gradebook = out.read_bytes()
    time.sleep(4)  # the daemon would have struck by now
    d_loop = tmp_path_factory.mktemp("hanging")
    (d_loop / "infinite_loop.ipynb").write_text(_submission(LAB, sol, insert=[(0, "while True:\n    pass")]))
    (d_loop / "stubborn_loop.ipynb").write_text(_submission(LAB, sol, insert=[(0, STUBBORN_LOOP)]))
    labs.grade(
        LAB,
        d_loop,
        out_dir / "loop.csv",
        timeout=LOOP_TIMEOUT,
        jobs=2,
        feedback_dir=out_dir / "gradebook_feedback",
    )
    rows = {}
    for path in (out, out_dir / "loop.csv"):
        with path.open(encoding="utf-8") as f:
            rows.update({r["submission"].removeprefix("'"): r for r in csv.DictReader(f)})
    return {
        "rows": rows,
        "out": out,
        "fb": out_dir / "gradebook_feedback",
        "subs": d,
        "loops": d_loop,
        "seconds": seconds,
        "gradebook": gradebook,
        "before_subs": before_subs,
        "before_root": before_root,
        "secrets": secrets,
    }


# submission: (status, ex1..ex6, total) with ex points 1, 1, 2, 2, 2, 3 (11 in all)
EXPECTED = {
    "full": ("ok", "1 1 2 2 2 3", "11"),
    # relu'(0) = 1 fails three of ex4's nine tests (0, −0.0, the edge): 2 × 6/9
    "partial": ("ok", "1 1 2 1.33333 0 0", "5.33333"),
    "empty": ("ok", "0 0 0 0 0 0", "0"),
    "syntax_error": ("errors", "1 1 2 2 0 3", "9"),
    "exits_midway": ("errors", "1 1 2 2 2 3", "11"),  # sys.exit / os._exit end a cell, not the grading
    "kills_itself": ("crashed", "0 0 0 0 0 0", "0"),  # a process that is gone has no answers
    "infinite_loop": ("errors", "1 1 2 2 2 3", "11"),  # the looping cell is stopped, the others run
    "stubborn_loop": ("timeout", "0 0 0 0 0 0", "0"),  # catches what stops its cell: the notebook times out
    "corrupt": ("corrupt", "0 0 0 0 0 0", "0"),
    "wrong_lab": ("wrong-lab", "0 0 0 0 0 0", "0"),
    "autograd_in_ex3_reference_in_ex6": ("ok", "1 1 0 2 2 0", "6"),
    "zz_classmate": ("ok", "1 1 2 2 2 3", "11"),
}
for _name in REACHES_OUT:
    EXPECTED[f"{_name}_then_correct"] = ("ok", "1 1 2 2 2 3", "11")
EXPECTED["(published solutions)"] = ("corrupt", "0 0 0 0 0 0", "0")
EXPECTED['=HYPERLINK("x")'] = ("corrupt", "0 0 0 0 0 0", "0")


def _points(row):
    return " ".join(row[f"ex{i}"] for i in range(1, 7))


@pytest.mark.sandbox
@pytest.mark.slow
def test_every_hostile_submission_scores_what_its_honest_work_deserves(redteam):
    rows = redteam["rows"]
    everyone = set(EXPECTED) | set(HOSTILE) | set(HOSTILE_LAST)
    assert set(rows) == everyone, set(rows) ^ everyone
    for name in list(HOSTILE) + list(HOSTILE_LAST):
        r = rows[name]
        # nothing earned; an exercise whose code is off the allow-list waits for review (with 0 pending)
        assert all(p in ("0", "review") for p in _points(r).split()) and r["total"] == "0", (name, r)
        assert r["possible"] == "11"
        if name not in GUARDS_SWITCHED_OFF:  # there, what the tests gave while unguarded waits for review
            pending = [x for x in r["review"].split("; ") if x]
            assert all(re.match(r"ex\d: 0 of \d+ pending, uses ", x) for x in pending), (name, r["review"])


@pytest.mark.sandbox
@pytest.mark.slow
def test_honest_and_correct_submissions_keep_their_grades_beside_hostile_ones(redteam):
    rows = redteam["rows"]
    for name, (status, points, total) in EXPECTED.items():
        r = rows[name]
        assert (r["status"], _points(r), r["total"]) == (status, points, total), (name, r)


@pytest.mark.sandbox
@pytest.mark.slow
def test_nothing_outside_a_submissions_scratch_space_changed(redteam):
    assert _tree_hashes(redteam["subs"]) == redteam["before_subs"]  # no classmate's file touched
    after = _tree_hashes(ROOT)
    changed = {
        k for k in set(after) | set(redteam["before_root"]) if after.get(k) != redteam["before_root"].get(k)
    }
    assert not changed, sorted(changed)[:10]  # tests, sources, autograder, helpers
    assert redteam["out"].read_bytes() == redteam["gradebook"]  # no daemon rewrote the gradebook
    ours = [
        d
        for d in Path(tempfile.gettempdir()).glob(labs.RUN_PREFIX + "*")
        if (d / "owner.pid").exists() and (d / "owner.pid").read_text() == str(os.getpid())
    ]
    assert not ours  # scratch folders removed
    assert not _leftovers()  # nothing of a submission outlives grading


def _processes() -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process on the machine, read from /proc (``ps`` cuts
    its lines at $COLUMNS, and a long checkout path then hides "/grader/zygote.py")."""
    rows = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            args = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # it ended while we read
            continue
        # the fields after the command name in parentheses (which may itself hold ") "): state, ppid
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        rows.append((int(d.name), ppid, args or stat[stat.index("(") + 1 : stat.rindex(")")]))
    return rows


def _under(pid: int, ancestor: int, rows) -> bool:
    parent = {p: pp for p, pp, _ in rows}
    while pid > 1:
        pid = parent.get(pid, 0)
        if pid == ancestor:
            return True
    return False


def _is_worker(p: int, pp: int, args: str, rows) -> bool:
    """A grader worker: started cold (tools/grader/worker.py), or forked by a zygote (its command line
    is the zygote's: a child of one, or a child of such a child)."""
    zygotes = {q for q, _, a in rows if "/grader/zygote.py" in a}
    return "/grader/worker.py" in args or ("/grader/zygote.py" in args and pp in zygotes)


def _workers_under(pid: int) -> list[int]:
    """The grader workers among pid's descendants."""
    rows = _processes()
    return [p for p, pp, args in rows if _is_worker(p, pp, args, rows) and _under(p, pid, rows)]


def _leftovers() -> list[str]:
    """Grading processes still running that this test process started (but the warm start its in-harness
    gradings keep, ``_zygote``), or orphaned workers (a daemon that escaped)."""
    rows = _processes()
    ours = {run._zygote.pid for run in _RUNS if run._zygote is not None}
    return [
        args
        for p, pp, args in rows
        if (_is_worker(p, pp, args, rows) or "harness.py" in args or "/grader/zygote.py" in args)
        and p not in ours
        and (_under(p, os.getpid(), rows) or pp == 1)
    ]


@pytest.mark.sandbox
@pytest.mark.slow
def test_notes_and_feedback_name_the_cause_and_never_quote_hidden_material(redteam):
    rows, fb = redteam["rows"], redteam["fb"]
    assert (
        "used autograd in ex3, which asks for the gradient by hand"
        in rows["autograd_in_ex3_reference_in_ex6"]["notes"]
    )
    assert "used helpers.cat_mlp.backward in ex6" in rows["autograd_in_ex3_reference_in_ex6"]["notes"]
    notes = rows["syntax_error"]["notes"]
    assert re.match(r"cell \d+: SyntaxError", notes), notes
    cell = labs.read_nb(redteam["subs"] / "syntax_error.ipynb").cells[
        int(re.match(r"cell (\d+)", notes).group(1)) - 1
    ]
    assert "def layer1_backward(grad_h, x)\n" in cell.source
    assert "died" in rows["kills_itself"]["notes"]
    # the looping cell is named (its number in the notebook and its first line)
    loop_cell = 1 + next(
        i
        for i, c in enumerate(labs.read_nb(redteam["loops"] / "infinite_loop.ipynb").cells)
        if c.source.startswith("while True:")
    )
    assert (
        f"cell {loop_cell}: TimeoutError: still running after {LOOP_TIMEOUT / 4:g} s, stopped there "
        "(the cells after it ran): `while True:`" in rows["infinite_loop"]["notes"]
    ), rows["infinite_loop"]["notes"]
    assert (
        f"still running at the notebook's time limit ({LOOP_TIMEOUT:.0f} s), in cell {loop_cell} (`while True:`)"
        in rows["stubborn_loop"]["notes"]
    ), rows["stubborn_loop"]["notes"]
    assert "not a notebook" in rows["corrupt"]["notes"]
    assert "lab02_chain_rule" in rows["wrong_lab"]["notes"]
    assert "MemoryError" in rows["memory_bomb"]["notes"]
    assert "message withheld" in rows["leak_feedback"]["notes"]
    # every exercise, its large class too (there the worker runs the probe: a stub's TypeError read "raised")
    for q in ("ex1", "ex2", "ex3", "ex4", "ex5", "ex6"):
        assert (
            f"{q}: your function returned None (or ...) in every hidden test: not written yet"
            in (rows["empty"]["notes"])
        ), rows["empty"]["notes"]
    assert "raised" not in rows["empty"]["notes"], rows["empty"]["notes"]
    assert (
        "getattr" in rows["guards_off"]["flags"]
        and "wait for your instructor's review" in rows["guards_off"]["notes"]
        and rows["guards_off"]["status"] == "review"
    )
    assert "changed its input tensors in place" in rows["zero_inputs"]["notes"]
    # no path of the grading machine in a note: the sandbox's home as the student sees it, the course as <course>
    # (with the home a tmpfs, mountinfo shows its root as "/": no host path either way)
    assert re.search(
        r"FileNotFoundError: (/home/student|/) <course>/helpers/__init__.py", rows["host_paths"]["notes"]
    ), rows["host_paths"]["notes"]
    texts = [r["notes"] for r in rows.values()] + [p.read_text() for p in fb.iterdir()]
    for path in (str(ROOT), labs.RUN_PREFIX, str(redteam["subs"]), str(redteam["out"].parent)):
        assert not [t for t in texts if path in t], path
    assert rows['=HYPERLINK("x")']["submission"].startswith("'=")
    assert all(ch.isprintable() for r in rows.values() for v in r.values() for ch in v)
    files = sorted(p.name for p in fb.iterdir())
    assert files == sorted(f"{n}.txt" for n in rows), files
    partial = (fb / "partial.txt").read_text()
    assert "Score: 5.33333 / 11" in partial and "6 of 9 hidden tests pass" in partial
    for p in fb.iterdir():
        text = p.read_text()
        assert not [s for s in redteam["secrets"] if labs.found(s, text)], p.name
        assert "BEGIN TEST CONFIG" not in text and "assert " not in text


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_similarity_report_accuses_no_one_on_answers_too_short_to_tell(redteam):
    """Lab 1's answers are a line or two each (under tools/grader/similarity.py's 40 own tokens): a
    copy of the solutions, a classmate's copy and honest work cannot be told apart there, so the grader
    writes the report (header, side-by-side page) and flags nobody. Copies are flagged where there is
    code enough to tell: tests/test_grader_similarity.py, on the honest corpus and its disguised copies."""
    report = redteam["out"].with_name("gradebook_similarity.csv")
    assert report.read_text().splitlines()[0].startswith("a,b,")
    assert report.with_suffix(".html").exists()
    assert list(csv.DictReader(report.open())) == []
    assert not [n for n, r in redteam["rows"].items() if "near-identical" in r["flags"]]


@pytest.mark.sandbox
@pytest.mark.slow
def test_grading_a_folder_twice_gives_the_same_gradebook_from_an_lms_export(tmp_path, monkeypatch):
    sol = _solutions(LAB)
    started, popen = [], subprocess.Popen

    def counted(argv, *a, **kw):  # every process grade starts with harness.py: one server per run
        if any(str(x).endswith("harness.py") for x in argv):
            started.append(argv[-1])
        return popen(argv, *a, **kw)

    monkeypatch.setattr(labs.subprocess, "Popen", counted)
    d = tmp_path / "moodle"
    for folder, text in (
        ("Ada Lovelace_101_assignsubmission_file_", _submission(LAB, sol)),
        ("Alan Turing_102_assignsubmission_file_", _submission(LAB, sol[:2])),
    ):
        (d / folder).mkdir(parents=True)
        (d / folder / "lab01_cat_mlp.IPYNB").write_text(text)
    (d / "Alan Turing_102_assignsubmission_file_" / "old.ipynb").write_text(_submission(LAB))
    os.utime(d / "Alan Turing_102_assignsubmission_file_" / "old.ipynb", (1, 1))
    outs = []
    for k in (1, 2):
        labs.grade(LAB, d, tmp_path / f"g{k}" / "gradebook.csv", timeout=TIMEOUT, jobs=2)
        outs.append(
            (
                (tmp_path / f"g{k}" / "gradebook.csv").read_bytes(),
                [p.read_bytes() for p in sorted((tmp_path / f"g{k}" / "gradebook_feedback").iterdir())],
            )
        )
    assert outs[0] == outs[1]
    # the harnesses were forked by a server that imported torch once (2.3 s of CPU less per notebook)
    assert started == ["serve", "serve"]
    rows = {r["submission"]: r for r in csv.DictReader((tmp_path / "g1" / "gradebook.csv").open())}
    assert (
        rows["Ada Lovelace"]["total"] == "11" and rows["Alan Turing"]["graded_file"] == "lab01_cat_mlp.IPYNB"
    )
    assert "2 notebooks from this student" in rows["Alan Turing"]["notes"]
    assert rows["Alan Turing"]["total"] == "2"


def test_a_5000_deep_tree_left_in_a_run_folder_is_removed_without_an_error(tmp_path):
    """shutil.rmtree raised RecursionError on it (Python 3.11): grade died and every later one too."""
    top = tmp_path / "labs-grade-deep"
    top.mkdir()
    fd = os.open(top, os.O_RDONLY)
    for _ in range(5000):  # one level at a time: the path is longer than PATH_MAX
        os.mkdir("d", dir_fd=fd)
        fd, parent = os.open("d", os.O_RDONLY, dir_fd=fd), fd
        os.close(parent)
    os.close(fd)
    (top / "owner.pid").write_text("999999999")  # a run whose process is gone
    labs.remove_tree(top)
    assert not top.exists()
    labs.remove_tree(top)  # already gone: nothing to do, no error


def test_release_leaves_no_kernel_folder_in_the_temp_dir(tmp_path):
    code = "import labs, os; labs.use_this_python(); print(os.environ['LABS_KERNEL_DIR'])"
    env = {k: v for k, v in os.environ.items() if k != "LABS_KERNEL_DIR"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT / "tools", env=env, capture_output=True, text=True, timeout=120
    )
    kernel_dir = Path(out.stdout.strip())
    assert out.returncode == 0 and kernel_dir.name.startswith("labs-kernel-"), out.stderr[-2000:]
    assert not kernel_dir.exists()


def test_grade_refuses_in_one_line_without_a_sandbox_unless_told_unsafe(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap", lambda: None)
    (tmp_path / "a.ipynb").write_text(_submission(LAB))
    with pytest.raises(SystemExit) as e:
        labs.grade(LAB, tmp_path, tmp_path / "g.csv")
    assert str(e.value).startswith(
        "refusing to grade: bubblewrap (bwrap) is not installed"
    ) and "\n" not in str(e.value)


@pytest.mark.sandbox
@pytest.mark.slow
def test_grade_refuses_in_one_line_when_the_sandbox_cannot_import_the_courses_helpers(tmp_path, monkeypatch):
    """A venv whose editable helpers is another checkout's: the sandbox (which binds only this
    checkout's) cannot import it, and every student was graded "crashed", 0, with a note blaming them."""
    elsewhere = tmp_path / "other-checkout" / "helpers"
    elsewhere.mkdir(parents=True)
    real = sandbox.command
    monkeypatch.setattr(
        sandbox, "command", lambda home, argv, **kw: real(home, argv, **{**kw, "helpers_dir": elsewhere})
    )
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "a.ipynb").write_text(_submission(LAB, _solutions(LAB)))
    with pytest.raises(SystemExit) as e:
        labs.grade(LAB, tmp_path / "subs", tmp_path / "grades" / "g.csv", timeout=TIMEOUT)
    msg = str(e.value)
    assert msg.startswith("refusing to grade: the sandbox cannot import") and "\n" not in msg, msg
    assert "No module named 'helpers'" in msg and "pip install -e" in msg, msg
    assert not (tmp_path / "grades").exists()  # nobody graded


def test_notes_name_no_path_of_the_grading_machine():
    run = f"{tempfile.gettempdir()}/{labs.RUN_PREFIX}ab_c1/sub-x1"
    text = (
        f"{run}/home/a.py {run}/tmp/f /{labs.RUN_PREFIX}q/sub-2/home {run}/ctl/spec.json "
        f"{ROOT}/helpers/x.py {sys.prefix}/lib /data/subs/a.ipynb /data/subsx"
    )
    assert labs.scrub(text, ((Path("/data/subs"), "<submissions>"),)) == (
        "/home/student/a.py /tmp/f /home/student <grading folder>/ctl/spec.json "
        "<course>/helpers/x.py <python>/lib <submissions>/a.ipynb /data/subsx"
    )


def test_a_missing_folder_is_a_one_line_error(tmp_path):
    with pytest.raises(
        SystemExit, match=f"submissions folder not found: {re.escape(str(tmp_path / 'nope'))}$"
    ):
        labs.grade(LAB, tmp_path / "nope", tmp_path / "g.csv", unsafe=True)


def test_the_default_gradebook_is_outside_the_repository_and_an_inside_one_is_git_ignored(
    tmp_path, monkeypatch
):
    assert not labs.default_out(LAB).resolve().is_relative_to(ROOT)
    monkeypatch.setattr(labs, "ROOT", tmp_path)
    (tmp_path / ".gitignore").write_text("_build/\n")
    labs._ensure_ignored(tmp_path / "grades" / "gradebook.csv")
    labs._ensure_ignored(tmp_path / "grades" / "gradebook.csv")
    labs._ensure_ignored(Path("/elsewhere/gradebook.csv"))
    assert (tmp_path / ".gitignore").read_text() == "_build/\n/grades/gradebook.csv\n"


def test_the_gradebook_is_written_as_grading_goes(tmp_path, monkeypatch):
    """Each row reaches `<gradebook>_in_progress.csv` when its submission's grading ends (a run stopped
    midway keeps what it graded); the file goes once the gradebook is complete."""
    out = tmp_path / "g.csv"
    progress = tmp_path / "g_in_progress.csv"
    seen_before = []

    def fake_harness(run, lab, name, nb, timeout, skip, unsafe, **kw):  # nothing runs: only the bookkeeping
        seen_before.append(progress.read_text().count("\n") - 1 if progress.exists() else None)
        if name == "c":
            raise KeyboardInterrupt("the instructor stopped grading")
        return {"status": "ok", "errors": [], "notes": [], "questions": {}}

    monkeypatch.setattr(labs, "run_harness", fake_harness)
    monkeypatch.setattr(labs, "setup_problem", lambda run, unsafe: None)  # not what is tested here
    subs = tmp_path / "subs"
    subs.mkdir()
    for name in ("a", "b"):
        (subs / f"{name}.ipynb").write_text(_submission(LAB))
    labs.grade(LAB, subs, out, unsafe=True, jobs=1)
    assert seen_before[0] == 0, seen_before  # the header is there before anyone is graded
    assert out.exists() and not progress.exists()
    (subs / "c.ipynb").write_text(_submission(LAB))
    with pytest.raises(KeyboardInterrupt):
        labs.grade(LAB, subs, out, unsafe=True, jobs=1)
    rows = list(csv.DictReader(progress.open()))
    assert [r["submission"] for r in rows] == ["a", "b"], rows


def test_grade_can_leave_an_optional_question_out_of_the_total(tmp_path, monkeypatch):
    earned = {"ex1": 1.0, "ex2": 0.0, "ex3": 2.0, "ex4": 2.0, "ex5": 2.0, "ex6": 3.0}

    def fake_harness(run, lab, name, nb, timeout, skip, unsafe, **kw):  # nothing runs: only the bookkeeping
        if name == "solutions":  # the command's calibration (no --timeout): the published solutions
            return {"status": "ok", "questions": {q: {"score": p} for q, p in labs.questions(LAB)}}
        return {
            "status": "ok",
            "errors": [],
            "notes": [],
            "questions": {
                q: {"score": v, "possible": v, "passed": 1, "cases": 1}
                for q, v in earned.items()
                if q not in skip
            },
        }

    monkeypatch.setattr(labs, "run_harness", fake_harness)
    subs = tmp_path / "subs"
    subs.mkdir()
    (subs / "a.ipynb").write_text(_submission(LAB))
    out = tmp_path / "g.csv"
    labs.grade(LAB, subs, out, skip=["ex6"], unsafe=True)
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0]) == [
        "submission",
        "status",
        "ex1",
        "ex2",
        "ex3",
        "ex4",
        "ex5",
        "total",
        "possible",
        "graded_file",
        "notes",
        "flags",
        "review",
    ]
    assert (rows[0]["total"], rows[0]["possible"]) == ("7", "8")
    fb = (tmp_path / "g_feedback" / "a.txt").read_text()
    assert "Score: 7 / 8" in fb and "ex6    optional this time: not graded, not counted" in fb
    with pytest.raises(SystemExit, match="no question ex9"):
        labs.grade(LAB, subs, out, skip=["ex9"], unsafe=True)
    assert (
        labs.main(
            [
                "grade",
                LAB,
                str(subs),
                "--out",
                str(out),
                "--skip-question",
                "ex5",
                "--skip-question",
                "ex6",
                "--unsafe",
            ]
        )
        == 0
    )
    assert next(csv.DictReader(out.open()))["possible"] == "6"


def test_scores_are_capped_at_each_exercises_points_whatever_comes_back(tmp_path, monkeypatch):
    monkeypatch.setattr(
        labs,
        "run_harness",
        lambda *a, **k: {
            "status": "ok",
            "errors": [],
            "notes": [],
            "questions": {
                q: {"score": 600.0, "possible": 1.0, "passed": 9, "cases": 1}
                for q in ("ex1", "ex2", "ex3", "ex4", "ex5", "ex6")
            },
        },
    )
    (tmp_path / "a.ipynb").write_text(_submission(LAB))
    labs.grade(LAB, tmp_path, tmp_path / "out" / "g.csv", unsafe=True)
    assert next(csv.DictReader((tmp_path / "out" / "g.csv").open()))["total"] == "11"


def test_the_instructors_page_states_the_points_graded_in_the_harness_as_measured():
    text, n_tests, total = labs.grading_report()
    page = " ".join((ROOT / "labs" / "instructors.md").read_text().split())
    assert f"all {total:g} points of the eleven labs are graded in the harness" in page
    classes = sum(len(e.classes) for lab in labs.labs() for e in labs.contract(lab).exercises.values())
    lab1 = sum(len(e.classes) for e in labs.contract(LAB).exercises.values())
    assert n_tests == classes and f"lab01_cat_mlp: 11 points, {lab1} hidden tests" in text, text


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_grading_stopped_with_sigterm_leaves_no_folder_and_no_process(tmp_path):
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "loop.ipynb").write_text(_submission(LAB, insert=[(0, "while True:\n    pass")]))
    before = set(Path(tempfile.gettempdir()).glob(labs.RUN_PREFIX + "*"))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tools" / "labs.py"),
            "grade",
            LAB,
            str(tmp_path / "subs"),
            "--out",
            str(tmp_path / "g.csv"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # wait for this grading's own worker (not another test's: the suite runs in parallel), however
    # long a busy machine takes to start it
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None and not _workers_under(proc.pid):
        time.sleep(0.5)
    assert _workers_under(proc.pid), "the grading started no worker"
    time.sleep(1)
    proc.terminate()
    # its handler exits 143; a signal that lands before the handler is set is reported as -15
    assert proc.wait(120) in (143, -signal.SIGTERM)
    time.sleep(1)
    assert not [
        d
        for d in set(Path(tempfile.gettempdir()).glob(labs.RUN_PREFIX + "*")) - before
        if (d / "owner.pid").exists() and (d / "owner.pid").read_text() == str(proc.pid)
    ]
    assert not _leftovers()


def test_a_notebook_of_very_many_cells_is_refused_before_it_is_built(tmp_path):
    """Reading a notebook runs in the grading process, outside any submission's limits: 1,150,000 empty
    cells (58 MB) took 10 minutes and 7.6 GB there before the sandbox started, 21.7 × the clean run
    (red team s8). Counted first (JSON objects and lists, then cells), refused with one line; what a
    student's run printed is dropped (the notebook runs again)."""
    honest = json.loads(_submission(LAB))
    many = dict(
        honest, cells=honest["cells"] + [{"cell_type": "markdown", "metadata": {}, "source": ""}] * 300_000
    )
    (tmp_path / "many.ipynb").write_text(json.dumps(many))
    over = dict(honest, cells=honest["cells"] + [{"cell_type": "raw", "source": ""}] * labs.MAX_CELLS)
    (tmp_path / "over.ipynb").write_text(json.dumps(over))
    printed = json.loads(_submission(LAB))
    code = next(c for c in printed["cells"] if c["cell_type"] == "code")
    code["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "✓ all done"}] * 3
    (tmp_path / "printed.ipynb").write_text(json.dumps(printed))
    assert labs.read_submission(tmp_path / "many.ipynb") == (
        None,
        (
            "corrupt",
            f"{2 * 300_000 + json.dumps(honest).count('{') + json.dumps(honest).count('[')} "
            "JSON objects and lists: far more than a lab notebook holds",
        ),
    )
    n = len(over["cells"])
    assert labs.read_submission(tmp_path / "over.ipynb")[1] == (
        "corrupt",
        f"{n} cells: more than the {labs.MAX_CELLS} a lab notebook may hold",
    )
    nb, bad = labs.read_submission(tmp_path / "printed.ipynb")
    assert bad is None and all(c.outputs == [] for c in nb.cells if c.cell_type == "code")


_RUNS: list = []


def _zygote() -> str | None:
    """This test process's warm start (``tools/grader/zygote.py``), kept as a grading run keeps it:
    the in-harness gradings below fork their workers from it (None where it cannot run: not root)."""
    if not _RUNS:
        import atexit

        _RUNS.append(labs.Run())
        atexit.register(_RUNS[0].close)
    return _RUNS[0].zygote(at_once=True)


def _harness_grade(lab, nb, **spec) -> dict:
    """The harness's result for notebook `nb` (a notebook or its JSON text), its worker sandboxed
    and forked from the warm start where there is one; ``spec``: more of the harness's settings
    (case_timeout)."""
    import harness

    with tempfile.TemporaryDirectory() as d:
        home = Path(d) / "home"
        home.mkdir()
        if isinstance(nb, str):
            (home / "submission.ipynb").write_text(nb)
        else:
            nbformat.write(nb, home / "submission.ipynb")
        zygote = _zygote()
        cmd = sandbox.command(
            home, sandbox.worker_argv(), helpers_dir=ROOT / "helpers", hold=zygote is not None
        )
        return harness.grade(
            {
                "source": str(labs.source_path(lab)),
                "worker": cmd,
                "timeout": TIMEOUT,
                "notebook": str(home / "submission.ipynb"),
                "zygote": zygote,
                **spec,
            }
        )


def _grade_in_harness(lab, replace=(), **spec):
    """The solutions (with `replace` applied) graded by the harness against a sandboxed worker: {ex: (passed, cases)}
    (``spec``: more of the harness's settings, ``skip``)."""
    nb = labs.solution_notebook(lab)
    for old, new in replace:
        assert any(old in c.source for c in nb.cells), old
        for c in nb.cells:
            c.source = c.source.replace(old, new)
    out = _harness_grade(lab, nb, **spec)
    return {q: (v["passed"], v["cases"]) for q, v in out["questions"].items()}, out["notes"]


# every function of lab 1 answering with tensors that have no elements, shaped to broadcast against
# anything (torch.allclose said True to each), or the right values in a (1, n) row where (n,) is asked
ZERO_SIZE = (
    "import torch\n_Z = lambda t: torch.zeros((0,) + (1,) * 8, dtype=t.dtype)\n"
    "def forward_pass(x, W1, b1, W2, b2, y_true):\n    return {'h': _Z(x), 'a': _Z(x), 'y_hat': _Z(x), 'L': _Z(x)}\n"
    "def grad_loss(y_hat, y_true):\n    return _Z(y_hat)\n"
    "def layer2_backward(grad_y_hat, a, W2):\n    return _Z(a), _Z(a), _Z(a)\n"
    "def relu_backward(grad_a, h):\n    return _Z(h)\n"
    "def layer1_backward(grad_h, x):\n    return _Z(x), _Z(x)\n"
    "def cat_backward_batch(X, W1, b1, W2, b2, Y):\n    return {k: _Z(X) for k in ('W1', 'b1', 'W2', 'b2')}\n"
)
A_ROW = "def grad_loss(y_hat, y_true):\n    return (2 * (y_hat - y_true))[None]\n"


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_result_of_the_wrong_shape_or_with_no_elements_is_not_close_to_the_reference():
    """torch.allclose broadcasts: an empty lab 1 answering (0, 1, ..., 1) tensors scored 1.5 of 11, a
    (1, n) row for an (n,) gradient passed; in the harness, the hidden tests' allclose compares shapes."""
    out = _harness_grade(LAB, _submission(LAB, insert=[(5, ZERO_SIZE)]))
    assert {q: v["score"] for q, v in out["questions"].items()} == dict.fromkeys(
        ("ex1", "ex2", "ex3", "ex4", "ex5", "ex6"), 0
    ), out
    out = _harness_grade(LAB, _submission(LAB, _solutions(LAB)[:1] + [A_ROW] + _solutions(LAB)[2:]))
    scores = {q: v["score"] for q, v in out["questions"].items()}
    assert scores == {"ex1": 1, "ex2": 0, "ex3": 2, "ex4": 2, "ex5": 2, "ex6": 3}, scores
    # lab 1's hidden tests are contract checks now (issue 23): they compare shape and dtype first
    # themselves, so the harness's strict allclose names no shapes for it; the scores are the promise


# a channel out of the hidden tests (red team 3): an exception class picked from a hidden input, one
# of eight per test; the notes name one class an exercise, whatever the tests raised
CHANNEL = (
    "_K = [ValueError, KeyError, IndexError, ZeroDivisionError, LookupError, ArithmeticError, OSError, EOFError]\n"
    "def grad_loss(y_hat, y_true):\n"
    "    raise _K[int(abs(float(y_hat.reshape(-1)[0])) * 1000) % 8]('x')\n"
)


@pytest.mark.sandbox
@pytest.mark.slow
def test_the_hidden_tests_notes_carry_no_value_the_student_chose():
    """Red teams 3 and 4 picked an exception class from a hidden input, one per test: the notes name one
    class an exercise, and only the few a wrong answer raises by mistake (``harness.HIDDEN_KINDS``)."""
    import harness

    out = _harness_grade(LAB, _submission(LAB, _solutions(LAB)[:1] + [CHANNEL] + _solutions(LAB)[2:]))
    ex2 = [n for n in out["notes"] if n.startswith("ex2:")]
    assert len(ex2) == 1 and "and other exceptions" in ex2[0], ex2
    named = re.search(r"raised (.+?) in hidden test", ex2[0]).group(1)
    assert named in harness.HIDDEN_KINDS | {"an exception"}, ex2
    for rare in ("LookupError", "ArithmeticError", "OSError", "EOFError"):
        assert rare not in ex2[0], ex2
    assert out["questions"]["ex2"]["score"] == 0 and out["questions"]["ex3"]["score"] == 2, out


# an empty lab 8 that answers what used to be counted in its own process: FLOP counts read as zero,
# every function a TorchFunctionMode entered for good (3 to 5.33 of 11 before; issue 24)
FLOP_FORGER = (
    "import torch\n"
    "import torch.utils.flop_counter as _fc\n"
    "_fc.FlopCounterMode.get_total_flops = lambda self: 0\n"
    "class _Quiet(torch.overrides.TorchFunctionMode):\n"
    "    def __torch_function__(self, func, types, args=(), kwargs=None):\n"
    "        return func(*args, **(kwargs or {}))\n"
    "_Quiet().__enter__()\n"
)


@pytest.mark.sandbox
@pytest.mark.slow
def test_an_empty_lab8_that_forges_flop_counts_scores_nothing():
    """No hidden test runs in the student's process any more, so there is nothing there to answer."""
    lab = "lab08_lora"
    out = _harness_grade(lab, _submission(lab, insert=[(0, FLOP_FORGER)]))
    assert {q: v["score"] for q, v in out["questions"].items()} == dict.fromkeys(
        ("ex1", "ex2", "ex3", "ex4", "ex5"), 0
    ), out


def test_the_harness_allclose_compares_shapes_first():
    """What a hidden test that calls torch.allclose sees in the harness (labs not on contracts)."""
    import harness

    seen = []
    with harness.strict_comparisons(seen):
        assert not torch.allclose(torch.zeros((0,) + (1,) * 8), torch.ones(3))
        assert not torch.ones(1, 3).allclose(torch.ones(3))
        assert torch.allclose(torch.ones(3), torch.ones(3))
    assert seen == [((0, 1, 1, 1, 1, 1, 1, 1, 1), (3,)), ((1, 3), (3,))], seen
    assert torch.allclose(torch.ones(1, 3), torch.ones(3))  # torch's own again outside


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.parametrize("lab", labs.labs())
def test_every_labs_solutions_pass_every_hidden_test_across_the_boundary(lab):
    if labs.stale(lab):  # the harness reads given cells against the released notebook: release first
        pytest.skip(f"{lab}'s student notebook is stale: {labs.stale(lab)}")
    got, notes = _grade_in_harness(lab)
    assert all(p == n for p, n in got.values()) and not notes, (got, notes)


# a mistake that only shows through what crosses the boundary: in-place edits, saved tensors,
# the random stream, a test's list appended to, hooks and Parameters of a module, an optimizer
MUTANTS = {
    # the stated rules (helpers.labcontract.RULES), measured in the worker where the call runs
    "g @ B computed twice (lab 8)": (
        "lab08_lora",
        "ex2",
        [("        grad_A = s * g_r.T @ x", "        grad_A = s * (g @ B).T @ x")],
    ),
    "grad_a itself returned (lab 1)": (
        "lab01_cat_mlp",
        "ex4",
        [
            (
                "    grad_h = grad_a * (h > 0).to(grad_a.dtype)  # SOLUTION",
                "    grad_h = grad_a if bool((h > 0).all()) else grad_a * (h > 0).to(grad_a.dtype)",
            )
        ],
    ),
    # issue 33's red team: an autograd.Function whose apply became a differentiable expression (autograd
    # differentiated it, across the boundary too); the worker hands out the Function's own_apply
    "apply replaced by a differentiable expression (lab 4)": (
        "lab04_custom_functions",
        "ex2",
        [
            (
                "        ctx.save_for_backward(output)",
                "        ctx.save_for_backward(output)\n\n    apply = staticmethod(lambda Z: torch.softmax(Z, -1))",
            )
        ],
    ),
    # issue 33's red team: the forbidden out × in product written into memory allocated before the call
    # (the capped class's budget counted only new memory); the trace now counts memory a call writes
    "gᵀx built in a buffer allocated before the call (lab 8)": (
        "lab08_lora",
        "ex5",
        [
            (
                "class LoRALinearFn(torch.autograd.Function):",
                "_SCRATCH = torch.empty(1 << 27, dtype=torch.uint8)\n\n\nclass LoRALinearFn(torch.autograd.Function):",
            ),
            (
                "        grad_W = g2.T @ x2 if need_W else None",
                "        gw = _SCRATCH[: g2.shape[1] * x2.shape[1] * g2.element_size()]"
                ".view(g2.dtype).view(g2.shape[1], x2.shape[1])\n        gw.zero_()\n"
                "        for k in range(g2.shape[0]):\n"
                "            torch.addcmul(gw, g2[k][:, None], x2[k][None, :], out=gw)\n"
                "        grad_W = gw.clone() if need_W else None",
            ),
        ],
    ),
    # a call that raises brings back the state it left: the hooks still on the model (the self-check saw
    # them, the hidden tests did not: ✗ but 3 of 3)
    "hooks removed without a finally (lab 5)": (
        "lab05_losses_and_flow",
        "ex2",
        [
            (
                "    try:\n        for name, module in model.named_modules():\n            if name and not list(module.children()):\n                handles.append(\n                    module.register_forward_hook(\n                        lambda m, i, o, name=name: forward_hook(m, i, o, name)\n                    )\n                )\n        F.cross_entropy(model(X), y).backward()\n    finally:\n        for h in handles:\n            h.remove()",
                "    for name, module in model.named_modules():\n        if name and not list(module.children()):\n            handles.append(\n                module.register_forward_hook(\n                    lambda m, i, o, name=name: forward_hook(m, i, o, name)\n                )\n            )\n    F.cross_entropy(model(X), y).backward()\n    for h in handles:\n        h.remove()",
            )
        ],
    ),
    # issue 33's second red team: lab 3's backward(root) as root.backward(), the course's engine, on Values
    # that live in the harness: 3 of 3 before; the harness now refuses Value.backward in exercise 3
    "backward(root) as root.backward() (lab 3)": (
        "lab03_inside_autograd",
        "ex3",
        [
            (
                "    count = dependencies(root)\n    root.grad = 1.0\n    ready = [root]\n    while ready:\n"
                "        v = ready.pop()\n        v._backward()\n        for p in v._parents:\n"
                "            count[id(p)] -= 1\n            if count[id(p)] == 0:  # every use has sent its share\n"
                "                ready.append(p)",
                "    root.backward()",
            )
        ],
    ),
    # issue 33's third red team: autograd inside a by-hand answer whose every hidden case is a capped or
    # traced call (lab 6 ex3), where the worker let the first backward through as the probe's own
    "autograd in a call with rules (lab 6 ex3)": (
        "lab06_attention_backward",
        "ex3",
        [
            (
                "def attention_backward(Q, K, V, P, grad_O, scale, Bias):\n",
                "def attention_backward(Q, K, V, P, grad_O, scale, Bias):\n"
                "    with torch.enable_grad():\n"
                "        q, k, v, sc, b = [t.detach().clone().requires_grad_() for t in (Q, K, V, scale, Bias)]\n"
                "        S = q @ k.transpose(-2, -1) * sc + b\n"
                "        logp = torch.where(P > 0, P.log(), torch.full_like(P, -1e30))\n"
                "        P2 = torch.where(P > 0, torch.softmax(S + (logp - S).detach(), dim=-1), torch.zeros_like(P))\n"
                "        g = torch.autograd.grad(P2 @ v, (q, k, v, sc, b), grad_O)\n"
                "    return tuple(x.detach() for x in g)\n",
            )
        ],
    ),
    "both gradients returned ungated (lab 4)": (
        "lab04_custom_functions",
        "ex3",
        [("        if need_x:", "        if True:"), ("        if need_w:", "        if True:")],
    ),
    "a frozen weight's gradient computed (lab 9)": (
        "lab09_memory_checkpointing",
        "ex2",
        [
            (
                "leaves = [params[i].detach().requires_grad_(need_p[i]) for i in idx]",
                "leaves = [params[i].detach().requires_grad_() for i in idx]",
            ),
            (
                "                if need_p[i]:\n                    grads[i] = next(got)",
                "                grads[i] = next(got)",
            ),
        ],
    ),
    "a frozen weight's gradient returned (lab 9)": (
        "lab09_memory_checkpointing",
        "ex3",
        [
            (
                "        return (None, None, *(next(got) if n else None for n in needs))",
                "        return (None, None, *(next(got) if (n or i > 0) else None for i, n in enumerate(needs)))",
            ),
            (
                "leaves = [t.detach().requires_grad_(n) for t, n in zip((x, *params), needs)]",
                "leaves = [t.detach().requires_grad_(n or i > 0) for i, (t, n) in enumerate(zip((x, *params), needs))]",
            ),
            (
                "torch.autograd.grad(y, [t for t, n in zip(leaves, needs) if n], grad_y)",
                "torch.autograd.grad(y, [t for i, (t, n) in enumerate(zip(leaves, needs)) if n or i > 0], grad_y)",
            ),
        ],
    ),
    "the whole row's max (lab 10)": (
        "lab10_flash_attention",
        "ex1",
        [("        m_b = xb.amax(dim=-1)  # (...,)", "        m_b = x.amax(dim=-1)  # (...,)")],
    ),
    "the whole bias built (lab 10)": (
        "lab10_flash_attention",
        "ex2",
        [
            (
                "    for q0 in range(0, Nq, block_q):",
                "    bias = alibi_tile(0, 0, Nq, Nk, slopes)\n    for q0 in range(0, Nq, block_q):",
            ),
            ("alibi_tile(q0, k0, bq, bk, slopes)\n", "bias[:, q0 : q0 + bq, k0 : k0 + bk]\n"),
        ],
    ),
    "torch.softmax called (lab 10)": (
        "lab10_flash_attention",
        "ex3",
        [("    P = torch.exp(S - L[..., None])", "    P = torch.softmax(S, dim=-1)")],
    ),
    "needs_input_grad ignored (lab 10)": (
        "lab10_flash_attention",
        "ex6",
        [
            (
                "        gated = tuple(g if need else None for g, need in zip(grads, needs))",
                "        gated = tuple(grads)",
            )
        ],
    ),
    "rng not put back (lab 9)": (
        "lab09_memory_checkpointing",
        "ex3",
        [("            set_rng_state(ctx.rng_state)", "            pass")],
    ),
    # the case's Values live in the harness: their operators are refused there while ex1 is graded
    "the Value's own operator (lab 3)": (
        "lab03_inside_autograd",
        "ex1",
        [
            (
                '    out = Value(a.data * b.data, (a, b), "*")\n\n    def _backward():\n'
                "        a.grad += b.data * out.grad\n        b.grad += a.data * out.grad\n\n"
                "    out._backward = _backward\n    return out",
                "    return a * b",
            )
        ],
    ),
    "inputs counted (lab 3)": (
        "lab03_inside_autograd",
        "ex4",
        [("    seen = {t.untyped_storage().data_ptr() for t in inputs}", "    seen = set()")],
    ),
    "an N x N tensor saved (lab 10)": (
        "lab10_flash_attention",
        "ex6",
        [
            (
                "        ctx.save_for_backward(Q, K, V, slopes, O, L)",
                "        ctx.save_for_backward(Q, K, V, slopes, O, L, Q @ K.transpose(-1, -2))",
            ),
            (
                "        Q, K, V, slopes, O, L = ctx.saved_tensors",
                "        Q, K, V, slopes, O, L, _S = ctx.saved_tensors",
            ),
        ],
    ),
    # which outputs autograd tracks crosses as the student's code left it (an earlier exercise's reference,
    # called across the boundary inside forward, hands back untracked values, as the learner's own would)
    "L not marked non-differentiable (lab 10)": (
        "lab10_flash_attention",
        "ex6",
        [("        ctx.mark_non_differentiable(L)\n", "")],
    ),
    # written in place to the same values: the worker's version counter says so (a newcomer's, ✓ and 4/4)
    "grad_O written in place, every value kept (lab 10 ex3)": (
        "lab10_flash_attention",
        "ex3",
        [("    return (grad_O * O).sum(dim=-1)", "    return (grad_O.mul_(1.0) * O).sum(dim=-1)")],
    ),
    "hooks left on the model (lab 5)": (
        "lab05_losses_and_flow",
        "ex2",
        [("        for h in handles:\n            h.remove()", "        pass")],
    ),
    "Parameter replaced, not merged in place (lab 8)": (
        "lab08_lora",
        "ex4",
        [
            (
                "    with torch.no_grad():\n        layer.weight += s * (B @ A)",
                "    with torch.no_grad():\n        layer.weight = torch.nn.Parameter(layer.weight + s * (B @ A), requires_grad=layer.weight.requires_grad)",
            )
        ],
    ),
    # lab 2's contract (labs/source/contracts/): a transposed X crosses as a transposed view, an argument
    # written into is seen, and a function from helpers.labcontract.FUNCTIONS is called across
    "X.view on a non-contiguous X (lab 2)": (
        "lab02_chain_rule",
        "ex2",
        [("X_rows = X.reshape(-1, X.shape[-1])", "X_rows = X.view(-1, X.shape[-1])")],
    ),
    "grad_X aliased to grad_Y, written into (lab 2)": (
        "lab02_chain_rule",
        "ex3",
        [("grad_X = grad_H @ W ", "grad_X = grad_Y "), ("grad_X += grad_Y ", "grad_X += grad_H @ W ")],
    ),
    "eps ignored (lab 2)": (
        "lab02_chain_rule",
        "ex1",
        [
            ("/ (2 * eps)", "/ (2 * 1e-6)"),
            ("f(x + eps * U[j])", "f(x + 1e-6 * U[j])"),
            ("f(x - eps * U[j])", "f(x - 1e-6 * U[j])"),
        ],
    ),
    # an exercise is graded with the references of the earlier ones it calls: ex4 calls ex3's function,
    # whose mistake costs ex3's points only (issue 24: it zeroed ex4 as well)
    "grad_V without the transpose of P (lab 6 ex3, called by ex4)": (
        "lab06_attention_backward",
        "ex3",
        [("    grad_V = P.transpose(-2, -1) @ grad_O", "    grad_V = P @ grad_O")],
    ),
    # memory classes: the call runs in a child of the worker under a hard address-space limit
    "the n x n Jacobian built (lab 4)": (
        "lab04_custom_functions",
        "ex1",
        [
            (
                "\n    return P * (grad_P - inner)  # (..., n)",  # ex1's line, not Softmax.backward's
                "\n    J = torch.diag_embed(P) - P[..., :, None] * P[..., None, :]\n"
                "    return (J.mT @ grad_P[..., None])[..., 0]",
            )
        ],
    ),
    # a tensor kept on ctx as an attribute is kept alive for backward: the worker's walk reports it as saved
    "Z kept on ctx beside save_for_backward(P) (lab 4)": (
        "lab04_custom_functions",
        "ex2",
        [
            (
                "        ctx.save_for_backward(output)\n",
                "        ctx.save_for_backward(output)\n        ctx.Z = inputs[0]\n",
            )
        ],
    ),
    # a backward that writes into the gradient it is given: the worker says so, the harness's copy changes too
    "grad_L divided in place (lab 4)": (
        "lab04_custom_functions",
        "ex4",
        [("(grad_L / keep.sum())", "grad_L.div_(keep.sum())")],
    ),
    "B @ A formed in grad_x (lab 8)": (
        "lab08_lora",
        "ex2",
        [("        grad_x = g @ W + s * g_r @ A", "        grad_x = g @ (W + s * B @ A)")],
    ),
    # a call with a stated rule runs in the worker (capped): the arguments it changed there are said too
    "P written in place (lab 6 ex3)": (
        "lab06_attention_backward",
        "ex3",
        [
            (
                "    grad_S = P * (grad_P - (grad_P * P).sum(-1, keepdim=True))  # (..., Nq, Nk)",
                "    grad_S = P.mul_(grad_P - (grad_P * P).sum(-1, keepdim=True))  # (..., Nq, Nk)",
            )
        ],
    ),
    "gᵀx formed for a frozen W in LoRALinearFn (lab 8)": (
        "lab08_lora",
        "ex5",
        [("        grad_W = g2.T @ x2 if need_W else None", "        grad_W = g2.T @ x2")],
    ),
    "all three gradients computed whatever needs asks (lab 8)": (
        "lab08_lora",
        "ex2",
        [
            ("    if need_x or need_A:", "    if True:"),
            ("    if need_x:", "    if True:"),
            ("    if need_A:", "    if True:"),
            (
                "    return (grad_x, grad_A, grad_B)",
                "    return tuple(v if n else None for v, n in zip((grad_x, grad_A, grad_B), needs))",
            ),
        ],
    ),
    # issue 33's fourth red team: a backward by central differences of the student's own forward, exact to
    # the tolerance on every small case; the large class's "writes" rule counts the forward passes
    "grad_W2 by finite differences (lab 1)": (
        "lab01_cat_mlp",
        "ex3",
        [
            (
                "    grad_W2 = torch.outer(grad_y_hat, a)  # SOLUTION",
                "    grad_W2 = torch.zeros_like(W2)\n    for k in range(W2.numel()):\n"
                "        up, down = W2.clone(), W2.clone()\n        up.view(-1)[k] += 1.0\n"
                "        down.view(-1)[k] -= 1.0\n"
                "        grad_W2.view(-1)[k] = ((grad_y_hat * (up @ a)).sum() - (grad_y_hat * (down @ a)).sum()) / 2",
            )
        ],
    ),
    # the fifth red team's: the same differences taken on NumPy copies, which write no tensor entries; the
    # large class's "exits" rule counts the values read out of tensors
    "grad_W1 by finite differences in NumPy (lab 1)": (
        "lab01_cat_mlp",
        "ex5",
        [
            (
                "    grad_W1 = torch.outer(grad_h, x)  # SOLUTION",
                "    import numpy as np\n"
                "    gh, xx = grad_h.detach().double().numpy(), x.detach().double().numpy()\n"
                "    W, g = np.zeros((gh.shape[0], xx.shape[0])), np.zeros((gh.shape[0], xx.shape[0]))\n"
                "    for k in range(W.size):\n"
                "        up, down = W.copy(), W.copy()\n"
                "        up.flat[k] += 1.0\n"
                "        down.flat[k] -= 1.0\n"
                "        g.flat[k] = ((gh * (up @ xx)).sum() - (gh * (down @ xx)).sum()) / 2\n"
                "    grad_W1 = torch.from_numpy(g).to(grad_h.dtype)",
            )
        ],
    ),
    # the sixth red team's: the course's own linear backward in a by-hand exercise of a lab that does not give
    # it (every helpers backward is refused unless the lab's given cells import it)
    "grad_W2 by the course's linear_backward (lab 1)": (
        "lab01_cat_mlp",
        "ex3",
        [
            (
                "    grad_W2 = torch.outer(grad_y_hat, a)  # SOLUTION",
                "    from helpers.numgrad import linear_backward\n"
                "    grad_W2 = linear_backward(a[None], W2, grad_y_hat[None])[1]  # right values",
            )
        ],
    ),
    # red team 7's: softmax's Jacobian is symmetric, so a central difference along grad_P is the whole product
    # (two forward passes, exact to the tolerance); the large class bounds what exp, log, softmax compute
    "softmax again along grad_P (lab 4 ex1)": (
        "lab04_custom_functions",
        "ex1",
        [
            (
                "    inner = (grad_P * P).sum(-1, keepdim=True)  # (..., 1): one ⟨g, p⟩ per row\n"
                "    return P * (grad_P - inner)  # (..., n)",
                "    s = grad_P.abs().amax(-1, keepdim=True).clamp_min(1e-300)\n"
                "    Z, d, e = P.double().log(), (grad_P / s).double(), 1e-5\n"
                "    return (s * (torch.softmax(Z + e * d, -1) - torch.softmax(Z - e * d, -1)) / (2 * e)).to(P.dtype)",
            )
        ],
    ),
    # red team s8 (A6): the step made of the two helpers loss_scale_step calls, 3/3 with nothing read
    "scaled_step from helpers.precision's parts (lab 9)": (
        "lab09_memory_checkpointing",
        "ex5",
        [
            (
                "    grads = [g * (1.0 / scale) for g in scaled]",
                "    from helpers.precision import unscale_grads\n    grads, _ = unscale_grads(scaled, scale)",
            )
        ],
    ),
    "micro-batch losses summed (lab 11)": (
        "lab11_training_by_hand",
        "ex5",
        [
            (
                "            L = F.mse_loss(model(Xb), Yb) * len(Xb) / B",
                "            L = F.mse_loss(model(Xb), Yb)",
            )
        ],
    ),
}


@pytest.mark.sandbox
@pytest.mark.slow
@pytest.mark.parametrize("name", MUTANTS)
def test_a_mistake_seen_only_through_the_boundary_loses_points(name):
    lab, ex, _ = MUTANTS[name]
    got = _graded_with_mistakes(_mutant_group(name))
    mutated = {MUTANTS[m][1] for m in _mutant_group(name)}
    assert got[ex][0] < got[ex][1], got
    assert all(
        p == n
        for q, (p, n) in got.items()
        if q not in mutated and not (lab.startswith("lab09") and q == "ex4")
    ), got
    # every point lost comes with a reason in the student's feedback, in the grader's words
    notes = NOTES[_mutant_group(name)]
    assert any(
        n.startswith((f"{ex}: hidden test", f"{ex}: your")) or f" in {ex}, which" in n for n in notes
    ), notes
    if name in SAYS:
        assert any(f"{ex}: hidden test" in n and SAYS[name] in n for n in notes), notes


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_difference_along_one_direction_scores_0_for_its_exercise():
    """Red team 7 kept lab 4 ex1 in full with softmax differenced along grad_P (two forward passes, right to
    the tolerance in every class): the large class counts what exp, log and softmax compute, none here."""
    got = _graded_with_mistakes(_mutant_group("softmax again along grad_P (lab 4 ex1)"))
    assert got["ex1"][0] == 0, got


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_backward_not_derived_scores_0_for_its_exercise():
    """Finite differences pass every small case to the tolerance, so losing the large class alone left them
    most of the points (10.57 of 11 in NumPy, for no backward written): a break of a by-hand rule ("writes",
    "exits") now costs the exercise, as calling autograd does: none of its hidden tests pass."""
    by_torch, by_numpy = (
        "grad_W2 by finite differences (lab 1)",
        "grad_W1 by finite differences in NumPy (lab 1)",
    )
    assert _mutant_group(by_torch) == _mutant_group(by_numpy)  # one grading of both
    got = _graded_with_mistakes(_mutant_group(by_torch))
    assert got["ex3"][0] == 0 and got["ex5"][0] == 0, got


# red team 12: every value read out into Python and the Jacobian built there, as Python lists; in the one
# class that measures reads (n = 1024, under a 2 MiB memory cap) the lists ran out of memory first
READER = (
    "    inner = (grad_P * P).sum(-1, keepdim=True)  # (..., 1): one ⟨g, p⟩ per row\n"
    "    return P * (grad_P - inner)  # (..., n)",
    "    n = P.shape[-1]\n"
    "    rows = []\n"
    "    for p, g in zip(P.reshape(-1, n).tolist(), grad_P.reshape(-1, n).tolist()):\n"
    "        J = [[pi * ((i == j) - pj) for j, pj in enumerate(p)] for i, pi in enumerate(p)]\n"
    "        rows.append([sum(J[j][i] * g[j] for j in range(n)) for i in range(n)])\n"
    "    return torch.tensor(rows, dtype=P.dtype).reshape(P.shape)",
)


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_reader_that_runs_out_of_memory_is_judged_on_what_it_read_before():
    """The reader passed every small class and failed the capped one as out of memory, with no rule judged
    there: 5 of 6 classes, 1.67 of 2 points for no backward derived. The capped call now sends back what it
    computed before its memory ran out (reads only grow), and reading every value breaks a by-hand rule."""
    got, notes = _grade_in_harness("lab04_custom_functions", [READER], skip=["ex2", "ex3", "ex4", "ex5"])
    assert got["ex1"][0] == 0, (got, notes)
    assert any(n.startswith("used ") and "ex1" in n for n in notes), notes


@pytest.mark.sandbox
@pytest.mark.slow
def test_lab4s_softmax_function_may_call_a_wrong_exercise_1_and_keep_its_points():
    """Lab 4 exercise 2 asked learners to write exercise 1's lines again "so that it is graded on its own",
    a rule nothing measured (a newcomer's call got ✓) and a wrong exercise 1 cost both. It now declares
    that it calls exercise 1: the hidden tests put the course's softmax_backward there."""
    got, _ = _grade_in_harness(
        "lab04_custom_functions",
        [
            (
                "        inner = (grad_P * P).sum(-1, keepdim=True)  # (..., 1)\n        return P * (grad_P - inner)  # (..., n)",
                "        return softmax_backward(P, grad_P)",
            ),
            ("    return P * (grad_P - inner)  # (..., n)", "    return P * (grad_P - inner) * 1.5"),
        ],
        skip=["ex3", "ex4"],
    )
    assert got["ex1"][0] < got["ex1"][1] and got["ex2"][0] == got["ex2"][1], got


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_product_formed_in_the_workers_process_is_seen_in_every_class_not_only_the_memory_capped_one():
    """products_formed runs the call, and its trace, where the answer runs: across the boundary as in the
    self-check (the harness's own trace saw none of the worker's ops: 1 of 9 classes lost, the capped one)."""
    got = _graded_with_mistakes(_mutant_group("gᵀx formed for a frozen W in LoRALinearFn (lab 8)"))
    assert got["ex5"] == (1, 10), got  # only "W is trainable (it gets gᵀx)" may form it


def _mutant_group(name: str) -> tuple:
    """The mistakes graded in one notebook with `name`: those of its lab, each in an exercise of its own
    (an exercise is graded with the references of those it calls, so each costs its own points only)."""
    groups: list = []
    for m, (lab, ex, _) in MUTANTS.items():
        home = next(
            (g for g in groups if MUTANTS[g[0]][0] == lab and ex not in {MUTANTS[x][1] for x in g}), None
        )
        if home is None:
            groups.append([m])
        else:
            home.append(m)
    return next(tuple(g) for g in groups if name in g)


@functools.lru_cache(maxsize=None)
def _graded_with_mistakes(group: tuple) -> dict:
    """One grading of the lab's solutions with every mistake of the group in place (lab 2's three: one)."""
    lab = MUTANTS[group[0]][0]
    # graded: the mutated questions and those that call them (whose points the mistakes must not cost);
    # the others run as the solutions do (test_every_labs_solutions_pass_...), so their hidden tests are skipped
    c = labs.contract(lab)
    mutated = {MUTANTS[m][1] for m in group}
    callers = {
        e.question for e in c.exercises.values() if any(c.exercises[x].question in mutated for x in e.calls)
    }
    skip = [q.name for q in c.questions() if q.name not in mutated | callers]
    got, notes = _grade_in_harness(lab, [edit for m in group for edit in MUTANTS[m][2]], skip=skip)
    NOTES[group] = notes
    return got


NOTES: dict = {}  # a group's notes, as the student's feedback shows them

# what the note of a failing hidden test says failed (issue 32: rule zeros came with no reason)
SAYS = {
    "the n x n Jacobian built (lab 4)": "(the call's memory budget)",
    "g @ B computed twice (lab 8)": "(the stated rule on the multiply–adds of every matrix product)",
    "grad_V without the transpose of P (lab 6 ex3, called by ex4)": "(grad_V)",
}


@pytest.mark.sandbox
@pytest.mark.slow
def test_lab6_the_course_reference_and_autograd_score_nothing_where_the_work_is_by_hand(tmp_path):
    lab = "lab06_attention_backward"
    if labs.stale(lab):  # the harness reads given cells against the released notebook: release first
        pytest.skip(f"{lab}'s student notebook is stale: {labs.stale(lab)}")
    sol = _solutions(lab)
    # ex3 computes the right gradients but asks the course's attention_backward for dQ, dK, dV
    body = sol[2].split("\n")
    reference = (
        sol[:2]
        + ["\n".join(body[:2] + ["    _ = ref.attention_backward(Q, K, V, P, grad_O, 1.0)"] + body[2:])]
        + sol[3:]
    )
    via_autograd = sol[:3] + [
        "def attention_grads(Q, K, V, Bias, scale, grad_O, causal=False, key_padding_mask=None,\n"
        "                    align='top_left', window=None):\n"
        "    leaves = [t.detach().clone().requires_grad_() for t in (Q, K, V, scale, Bias)]\n"
        "    Nq, Nk = Q.shape[-2], K.shape[-2]\n"
        "    mask = causal_mask(Nq, Nk, align, device=Q.device, window=window) if causal else None\n"
        "    if key_padding_mask is not None:\n"
        "        keep = ~key_padding_mask[:, None, None, :]\n"
        "        mask = keep if mask is None else mask & keep\n"
        "    O, _ = attention_forward(leaves[0], leaves[1], leaves[2], mask, leaves[4], leaves[3])\n"
        "    return torch.autograd.grad(O, leaves, grad_O)"
    ]
    (tmp_path / "subs").mkdir()
    for name, text in {
        "full": _submission(lab, sol),
        "reference_in_ex3": _submission(lab, reference),
        "autograd_in_ex4": _submission(lab, via_autograd),
        "monkeypatch": _submission(lab, insert=[(0, HOSTILE["monkeypatch"].replace("{{}}", "{}"))]),
    }.items():
        (tmp_path / "subs" / f"{name}.ipynb").write_text(text)
    labs.grade(lab, tmp_path / "subs", tmp_path / "g.csv", timeout=TIMEOUT, jobs=2)
    rows = {r["submission"]: r for r in csv.DictReader((tmp_path / "g.csv").open())}
    pts = {n: " ".join(r[f"ex{i}"] for i in range(1, 5)) for n, r in rows.items()}
    assert (
        pts
        == {
            "full": "2 2 3 3",
            "reference_in_ex3": "2 2 0 3",  # ex4 is graded with ex3's reference in place of theirs
            "autograd_in_ex4": "2 2 3 0",
            "monkeypatch": "review review review review",  # `import builtins`: every by-hand exercise waits, 0 pending
        }
    ), pts
    # ex4 calls ex3's function: its hidden tests put ex3's reference there, so ex4's own work keeps its 3
    assert "used helpers.attention.attention_backward in ex3" in rows["reference_in_ex3"]["notes"]
    assert "used autograd in ex4, which asks for the gradient by hand" in rows["autograd_in_ex4"]["notes"]


def test_a_run_folder_left_by_a_killed_grading_is_removed_by_the_next_and_a_live_ones_kept(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for name, pid in (("dead", dead.pid), ("alive", os.getpid()), ("nopid", None)):
        d = tmp_path / f"{labs.RUN_PREFIX}{name}"
        (d / "sub-x" / "home").mkdir(parents=True)
        if pid is not None:
            (d / "owner.pid").write_text(str(pid))
    labs.remove_stale_runs()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{labs.RUN_PREFIX}alive"]


# ------------------------------------------------ by hand: an allow-list, read on the bytes that run (issue 24)

# lab 1's exercise 3 (`layer2_backward`, by hand) answered without autograd's engine, each in its own way
EX3_FORWARD_AD = (
    "import torch\nimport torch.autograd.forward_ad as fwAD\n\n"
    "def layer2_backward(grad_y_hat, a, W2):\n    grad_a = torch.zeros_like(a)\n"
    "    for i in range(a.shape[0]):\n        t = torch.zeros_like(a)\n        t[i] = 1\n"
    "        with fwAD.dual_level():\n            y = W2 @ fwAD.make_dual(a, t)\n"
    "            grad_a[i] = (fwAD.unpack_dual(y).tangent * grad_y_hat).sum()\n"
    "    return torch.outer(grad_y_hat, a), grad_y_hat.clone(), grad_a"
)
EX3_GRAD_FN = (
    "import torch\n\ndef layer2_backward(grad_y_hat, a, W2):\n"
    "    W, x = W2.detach().requires_grad_(), a.detach().requires_grad_()\n"
    "    b = torch.zeros(W2.shape[0], dtype=a.dtype).requires_grad_()\n    y = W @ x + b\n"
    "    g_mv, g_b = y.grad_fn(grad_y_hat)\n    g_W, g_x = y.grad_fn.next_functions[0][0](g_mv)\n"
    "    return g_W, g_b, g_x"
)
EX3_JACFWD = (
    "import torch\nfrom torch._functorch.eager_transforms import jacfwd\n\n"
    "def layer2_backward(grad_y_hat, a, W2):\n    b = torch.zeros(W2.shape[0], dtype=a.dtype)\n"
    "    J_W = jacfwd(lambda W: W @ a + b)(W2)\n    J_a = jacfwd(lambda x: W2 @ x + b)(a)\n"
    "    return torch.einsum('o,oij->ij', grad_y_hat, J_W), grad_y_hat.clone(), grad_y_hat @ J_a"
)
EX3_JACOBIAN = (
    "import torch\n\ndef layer2_backward(grad_y_hat, a, W2):\n    b = torch.zeros(W2.shape[0], dtype=a.dtype)\n"
    "    J_W, J_a = torch.autograd.functional.jacobian(lambda W, x: W @ x + b, (W2, a), "
    "strategy='forward-mode', vectorize=True)\n"
    "    return torch.einsum('o,oij->ij', grad_y_hat, J_W), grad_y_hat.clone(), grad_y_hat @ J_a"
)
EX3_AUTOGRAD = (
    "import torch\n\ndef layer2_backward(grad_y_hat, a, W2):\n"
    "    W, x = W2.detach().requires_grad_(), a.detach().requires_grad_()\n"
    "    b = torch.zeros(W2.shape[0], dtype=a.dtype).requires_grad_()\n"
    "    return torch.autograd.grad(W @ x + b, (W, b, x), grad_y_hat)"
)
# the guards switched off through sys.modules, in spellings the old deny-list missed (then autograd in ex3)
GUARDS_OFF = {
    "from_sys_import_modules": "from sys import modules\nfor _m in list(modules.values()):\n"
    "    if hasattr(_m, 'STATE') and hasattr(_m, 'install_guards'):\n        _m.STATE['forbidden'] = {}",
    "collections_sys": "import collections\nfor _m in list(collections._sys.modules.values()):\n"
    "    if hasattr(_m, 'STATE') and hasattr(_m, 'install_guards'):\n        _m.STATE['forbidden'].clear()",
}
# a student's own exception class, named to carry what a hidden test gave (digits of a seed)
CUSTOM_EXCEPTION = (
    "class Seed_2718(Exception):\n    pass\n\ndef grad_loss(y_hat, y_true):\n"
    "    raise Seed_2718(str(y_hat.tolist()))"
)


def _cells(text: str) -> list[tuple[int, str]]:
    """A notebook's code cells as the harness reads them."""
    import harness

    with tempfile.NamedTemporaryFile("w", suffix=".ipynb", delete=False) as f:
        f.write(text)
    try:
        return harness.read_cells(f.name)
    finally:
        os.unlink(f.name)


def _plan(lab, text):
    """What the harness reads in a submission: reach.plan against the released notebook."""
    import harness

    qs = harness.questions(labs.source_path(lab))
    return harness.read_plan(_cells(text), {"source": str(labs.source_path(lab))}, qs)


def _edit_given(text: str, old: str, new: str) -> str:
    """The notebook ``text`` with ``old`` replaced by ``new`` in the one given (not answer) cell holding it."""
    nb = nbformat.reads(text, as_version=4)
    cells = [
        c
        for c in nb.cells
        if c.cell_type == "code" and old in c.source and "otter_answer_cell" not in c.metadata.get("tags", [])
    ]
    assert len(cells) == 1, old
    cells[0].source = cells[0].source.replace(old, new)
    return nbformat.writes(nb)


@pytest.mark.parametrize("lab", labs.labs())
def test_every_labs_published_solutions_use_only_what_the_allow_list_holds(lab):
    """The allow-list (reach.ALLOWED, `python tools/grader/reach.py derive --write`) holds every solution."""
    if labs.stale(lab):
        pytest.skip(f"{lab}'s student notebook is stale (release it): {labs.stale(lab)}")
    checked = _plan(lab, nbformat.writes(labs.solution_notebook(lab)))
    assert not checked.review and not checked.reach, (checked.review, checked.reach)
    kinds = [c.kind for c in checked.cells]
    assert "added" not in kinds and "edited" not in kinds, kinds
    released = labs.read_nb(labs.student_path(lab))
    answers = [c for c in released.cells if "otter_answer_cell" in c.metadata.get("tags", [])]
    assert len(answers) == len(labs.questions(lab))  # one answer cell each


def test_the_allow_list_holds_what_every_labs_solutions_use_and_none_needs_a_refused_construct():
    """`python tools/grader/reach.py derive --write` was run after the solutions last changed."""
    import reach

    got, refused = reach.derive(labs.labs())
    assert not refused, refused
    for tier, kinds in got.items():
        for kind, names in kinds.items():
            assert names <= reach.ALLOWED[tier][kind], (tier, kind, sorted(names - reach.ALLOWED[tier][kind]))


def test_the_allow_list_never_holds_what_computes_a_gradient_unseen_or_reaches_the_grader():
    import reach

    for kind, text in [
        ("dotted", "torch.autograd.forward_ad.make_dual"),
        ("dotted", "torch.autograd.functional.jacobian"),
        ("dotted", "torch.func.jacfwd"),
        ("import", "torch._functorch.eager_transforms.jacfwd"),
        ("dotted", "torch.ops.aten._scaled_dot_product_attention_math"),
        ("attr", "grad_fn"),
        ("attr", "next_functions"),
        ("import", "sys.modules"),
        ("dotted", "collections._sys.modules"),
        ("dotted", "torch.sys.modules"),
        ("builtin", "getattr"),
        ("attr", "__globals__"),
    ]:
        assert not reach.allowed(kind, text, "by_hand"), text
    assert reach.allowed("dotted", "torch.outer", "by_hand") and reach.allowed("attr", "T", "by_hand")
    assert reach.allowed("dotted", "torch.autograd.Function", "by_hand")


# red team 5: names any object may hold, assigned once on a box of the student's so that they read as
# the student's own attributes; then reached on an object that holds torch or the course's helpers
OWN_ATTR_BOX = (
    "import torch\nimport helpers\nclass Box:\n    pass\nbox = Box()\n"
    "box._make_dual = box._unpack_dual = box.labcontract = box.backward_through = None\n"
    "store = {}\ndef fill(s):\n    s['t'], s['h'] = torch, helpers\nfill(store)\n"
)
EX3_DUAL_TWINS = OWN_ATTR_BOX + (
    "def layer2_backward(grad_y_hat, a, W2):\n    t = store['t']\n"
    "    d = t._make_dual(a, torch.ones_like(a), level=0)\n"
    "    return torch.outer(grad_y_hat, a), grad_y_hat.clone(), t._unpack_dual(W2.T @ grad_y_hat + 0 * d, level=0)[0]"
)
EX3_PROBE = OWN_ATTR_BOX + (
    "def layer2_backward(grad_y_hat, a, W2):\n    h = store['h']\n"
    "    out = h.labcontract.backward_through(lambda W, v, b: W @ v + b, (W2, a, grad_y_hat * 0), {},\n"
    "                                         wrt=(0, 1, 2), grad_output=grad_y_hat, method=None)\n"
    "    return out[1], out[3], out[2]"
)
# red team s10: the same probe started in a thread, whose stack ends before the worker's start
EX3_PROBE_IN_A_THREAD = OWN_ATTR_BOX + (
    "import threading\n"
    "def layer2_backward(grad_y_hat, a, W2):\n    h, keep = store['h'], []\n"
    "    f = lambda W, v, b: (keep.extend((W, v, b)), W @ v + b)[1]\n"
    "    th = threading.Thread(target=h.labcontract.backward_through, args=(f, (W2, a, grad_y_hat * 0), {}),\n"
    "                          kwargs={'wrt': (0, 1, 2), 'grad_output': grad_y_hat, 'method': None})\n"
    "    th.start()\n    th.join()\n"
    "    return keep[0].grad, keep[2].grad, keep[1].grad"
)
EX3_IN_A_THREAD = (
    "import threading\nimport torch\n"
    "def layer2_backward(grad_y_hat, a, W2):\n    out = []\n"
    "    th = threading.Thread(target=lambda: out.append((torch.outer(grad_y_hat, a), grad_y_hat.clone(),\n"
    "                                                     W2.T @ grad_y_hat)))\n"
    "    th.start()\n    th.join()\n    return out[0]"
)

OFF_THE_LIST = {  # name: (lab 1's ex3 answer, the construct named, whether every by-hand exercise goes too)
    "forward AD's C twins as own attributes": (EX3_DUAL_TWINS, "._make_dual", False),
    "forward AD": (EX3_FORWARD_AD, "import torch.autograd.forward_ad", False),
    "grad_fn nodes": (EX3_GRAD_FN, ".grad_fn", False),
    "jacfwd": (EX3_JACFWD, "import torch._functorch.eager_transforms.jacfwd", True),
    "jacobian forward-mode": (EX3_JACOBIAN, "torch.autograd.functional.jacobian", False),
    "from sys import modules": (GUARDS_OFF["from_sys_import_modules"], "import sys.modules", True),
    "collections._sys": (GUARDS_OFF["collections_sys"], "collections._sys", True),
}


@pytest.mark.parametrize("name", OFF_THE_LIST)
def test_a_by_hand_answer_off_the_allow_list_goes_to_review_naming_the_construct(name):
    answer, review, reach_all = OFF_THE_LIST[name]
    sol = _solutions(LAB)
    checked = _plan(LAB, _submission(LAB, sol[:2] + [answer] + sol[3:]))
    named = checked.reach if reach_all else checked.review.get("ex3", [])
    assert any(x.startswith(review + " (cell ") or x.startswith(review) for x in named), (
        checked.review,
        checked.reach,
    )
    if not reach_all:  # a gradient computed unseen serves any exercise: all that ask for one by hand
        # (ex1 too where the answer also uses what no list holds: forward AD's `.tangent`)
        assert {"ex2", "ex3", "ex4", "ex5", "ex6"} <= set(checked.review) and not checked.reach, checked
        assert checked.gradient, checked


def test_a_module_reached_through_a_name_the_student_also_assigns_is_not_their_own_attribute():
    """`box.labcontract = None` once does not make `helpers.labcontract` the student's (red team 5)."""
    sol = _solutions(LAB)
    checked = _plan(LAB, _submission(LAB, sol[:2] + [EX3_PROBE] + sol[3:]))
    assert any(x.startswith(".labcontract") for x in checked.review.get("ex3", [])), checked.review


# A builtin off the list under a name the student binds: at the top level, or read as a global, the
# reading may come before the binding (`exec = exec` reads the real one) or after a cell that failed
# before it; a function's own argument or local is the function's (red team s8: `exec = exec`, then an
# engine walking grad_fn nodes in an exec'd string, 11/11 with no review)
SHADOWED = {
    "exec = exec\nexec('y = 1')": True,
    "def _(exec):\n    pass\n\nexec('y = 1')": True,  # a parameter elsewhere is not this scope's
    "def f():\n    def g(exec):\n        pass\n    return exec('y = 1')": True,
    "def f():\n    global exec\n    exec = print\n    return exec('y')": True,
    "def f(x=exec):\n    return x": True,  # a default runs in the enclosing scope
    "g = lambda exec: exec('y = 1')": False,  # the argument: whatever the caller passed, read there
    "def f(input, weight):\n    return input @ weight": False,
    "def f(x):\n    open = x + 1\n    return open * 2": False,
}


@pytest.mark.parametrize("code", SHADOWED)
def test_a_builtin_off_the_list_is_the_students_own_only_where_a_function_binds_it(code):
    import reach

    sc = reach.scope([], [code])
    found = [c for c, _, severity in reach.unlisted(code, sc, "any") if severity == "reach"]
    assert bool(found) is SHADOWED[code], (code, found)


# Attributes named by strings built at run time, through what the list held whole (red team s8:
# functools.update_wrapper(holder, x, (), ("grad" + "_fn",)) is getattr(x, "grad_fn"); a class made by
# type(name, bases, {...}) has the attributes, dunders too, of a dict's string keys): read, not run
BY_STRINGS = {
    "import functools\nfunctools.update_wrapper(box, x, (), (name,))": True,
    "from functools import wraps\nf = wraps(x, (name,))(f)": True,
    "H = type('H', (), {k: f})": True,
    "H = type('H', (object,), {}, **kw)": True,
    "k = type(x).__name__ if False else type(x)": False,
    "import functools\ng = functools.partial(f, 2)\ny = functools.reduce(g, [1, 2])": False,
    # singledispatch's register evaluates a string annotation: `def g(x: "getattr")` handed getattr back
    "import functools\n@functools.singledispatch\ndef f(x):\n    pass": True,
    "import numpy as np": False,  # an unused import (a newcomer's lab 1 went to review for it)
    "import numpy as np\ny = np.sqrt(2.0)": True,  # what is taken from it is read
}


@pytest.mark.parametrize("code", BY_STRINGS)
def test_an_attribute_named_by_a_string_built_at_run_time_is_off_the_list(code):
    import reach

    sc = reach.scope([], [code])
    found = [c for c, _, _ in reach.unlisted(code, sc, "any") if "__name__" not in c]
    assert bool(found) is BY_STRINGS[code], (code, found)


@pytest.mark.sandbox
def test_a_course_probe_called_by_the_answer_runs_no_backward_for_it():
    """The autograd guard lets a probe's backward through only when the grader called the probe (red team
    5: an answer calling helpers.labcontract.backward_through got autograd's gradients: 11/11)."""
    sol = _solutions(LAB)
    out = _harness_grade(LAB, _submission(LAB, sol[:2] + [EX3_PROBE] + sol[3:]))
    assert out["questions"]["ex3"]["score"] == 0, out["questions"]
    assert any("used autograd in ex3" in n for n in out["notes"]), out["notes"]
    assert out["questions"]["ex4"]["score"] == 2, out["questions"]  # the others keep their points
    # in a thread (red team s10: 17/17 on lab 10 so): the walk ends before the worker's start frame
    out = _harness_grade(LAB, _submission(LAB, sol[:2] + [EX3_PROBE_IN_A_THREAD] + sol[3:]))
    assert out["questions"]["ex3"]["score"] == 0, out["questions"]
    assert any("used a thread in ex3" in n for n in out["notes"]), out["notes"]
    # any thread at all, right values or not: the work rules' trace sees its own thread only
    out = _harness_grade(LAB, _submission(LAB, sol[:2] + [EX3_IN_A_THREAD] + sol[3:]))
    assert out["questions"]["ex3"]["score"] == 0, out["questions"]
    assert any("used a thread in ex3" in n for n in out["notes"]), out["notes"]
    assert out["questions"]["ex4"]["score"] == 2, out["questions"]


def test_a_self_check_line_copied_into_a_cell_the_student_added_is_not_sent_to_review():
    """What the released notebook's own cells use, a student may use too (copying a self-check to debug)."""
    released = labs.read_nb(labs.student_path(LAB))
    given = [
        c.source
        for c in released.cells
        if c.cell_type == "code" and "otter_answer_cell" not in c.metadata.get("tags", [])
    ]
    copied = given[-1]  # the last self-check
    checked = _plan(LAB, _submission(LAB, _solutions(LAB), insert=[(2, copied), (5, copied)]))
    # two cells more than the released notebook has, each read as the course's code (added, or equal to a
    # given cell of some release)
    kinds = [c.kind for c in checked.cells]
    plain = [c.kind for c in _plan(LAB, _submission(LAB, _solutions(LAB))).cells]
    assert len(kinds) == len(plain) + 2
    assert kinds.count("added") + kinds.count("given") == plain.count("added") + plain.count("given") + 2
    assert not checked.review and not checked.reach, (checked.review, checked.reach)


# lab 1's ex3 and ex6 written otherwise than the solutions: ordinary tensor work, a helper, a scratch check
HONEST_OTHERWISE = [
    "import torch\n\ndef layer2_backward(grad_y_hat, a, W2):\n"
    "    grad_W2 = torch.matmul(grad_y_hat.unsqueeze(1), a.unsqueeze(0))\n"
    "    return grad_W2, grad_y_hat.detach().clone(), torch.mv(W2.t(), grad_y_hat)",
    "import math\nfrom helpers.checks import compare\n\n"
    "def _relu_grad(h):\n    return torch.where(h > 0, torch.ones_like(h), torch.zeros_like(h))\n\n"
    "def cat_backward_batch(X, W1, b1, W2, b2, Y):\n    grads = {}\n"
    "    H = torch.einsum('bi,hi->bh', X, W1) + b1\n    A = H.clamp(min=0)\n    G = 2 * (A @ W2.T + b2 - Y)\n"
    "    grads['W2'], grads['b2'] = G.T @ A, G.sum(dim=0)\n    G_H = (G @ W2) * _relu_grad(H)\n"
    "    grads['W1'], grads['b1'] = G_H.T @ X, G_H.sum(dim=0)\n    assert not math.isnan(float(G_H.sum()))\n"
    "    return {k: grads[k] for k in sorted(grads)}",
]


def test_honest_answers_written_otherwise_than_the_solutions_are_not_sent_to_review():
    sol = _solutions(LAB)
    text = _submission(
        LAB,
        sol[:2] + [HONEST_OTHERWISE[0]] + sol[3:5] + [HONEST_OTHERWISE[1]],
        insert=[(2, "print(layer2_backward(torch.ones(2), torch.ones(3), torch.ones(2, 3)))")],
    )
    checked = _plan(LAB, text)
    assert not checked.review and not checked.reach and not checked.gradient, checked.review


BY_HAND_1 = {"ex1", "ex2", "ex3", "ex4", "ex5", "ex6"}  # lab 1: every exercise is by hand


def test_code_before_exercise_1_is_read_and_off_the_list_sends_every_by_hand_exercise_to_review():
    """Issue 33's red team ran code from a string with a timing utility in a cell before exercise 1, which
    was read against nothing. Every statement a student wrote runs before every hidden test."""
    sol = _solutions(LAB)
    for code, named in [
        ("import timeit\ntimeit.timeit('pass', number=1)", "import timeit"),
        ("from torch.fx.experimental.proxy_tensor import make_fx", "import torch.fx.experimental"),
        ("traced = torch.jit.trace(lambda x: x * 2, torch.ones(2))", "torch.jit.trace"),
    ]:
        checked = _plan(LAB, _submission(LAB, sol, insert=[(-1, code)]))
        assert set(checked.review) == BY_HAND_1, (code, checked.review)
        assert all(any(x.startswith(named) for x in v) for v in checked.review.values()), (code, checked)
    # the same anywhere else: in a scratch cell after a later exercise
    checked = _plan(LAB, _submission(LAB, sol, insert=[(4, "import timeit")]))
    assert set(checked.review) == BY_HAND_1, checked.review


def test_a_helper_defined_anywhere_is_read_against_the_list_of_the_by_hand_exercise_that_calls_it():
    """A gradient helper before exercise 1, called by ex3's answer: ex3 goes to review for it (its list
    refuses autograd); the exercises that do not call it do not."""
    sol = _solutions(LAB)
    helper = "def _vjp(y, x, g):\n    return torch.autograd.grad(y, x, g)[0]"
    answer = sol[2].replace("    return grad_W2", "    _check = _vjp\n    return grad_W2")
    checked = _plan(LAB, _submission(LAB, sol[:2] + [answer] + sol[3:], insert=[(-1, helper)]))
    assert set(checked.review) == {"ex3"}, checked.review
    assert any(x.startswith("torch.autograd.grad (cell ") for x in checked.review["ex3"]), checked.review
    # an alias of it, bound in another cell, is followed the same way
    alias = "check_grad = _vjp"
    answer = sol[3].replace("    return grad_h", "    check_grad\n    return grad_h")
    checked = _plan(LAB, _submission(LAB, sol[:3] + [answer] + sol[4:], insert=[(-1, helper), (1, alias)]))
    assert set(checked.review) == {"ex4"}, checked.review


def test_a_cell_of_many_statements_is_read_a_cell_at_a_time(monkeypatch):
    """Reading a statement at a time split the cell's text once per statement: a cell of 8,000 lines took
    8 s, 32,000 would take minutes (a stalled class). Now each cell is read a few times (all of it, the
    part by-hand exercises reach, each group the same exercises reach), whatever its length."""
    import reach

    calls = []
    real = reach.unlisted
    monkeypatch.setattr(reach, "unlisted", lambda *a, **k: calls.append(1) or real(*a, **k))
    big = "\n".join(f"x{i} = torch.zeros({i})" for i in range(5000))
    checked = _plan(LAB, _submission(LAB, _solutions(LAB), insert=[(2, big)]))
    assert not checked.review and not checked.reach
    assert len(calls) <= 3 * 8, len(calls)  # the solutions' 6 answer cells and the added one


def test_a_helper_stored_in_a_container_or_a_dunder_defined_is_read_where_it_can_run():
    """Issue 33's third red team: an autograd helper appended to a list at the top level (append bound no
    name, so the answer calling tools[0] did not reach it); a dict key whose class defines a property
    `__class__`, which runs in the grader's own isinstance, after the guards are off."""
    sol = _solutions(LAB)
    helper = (
        "tools = []\n\ndef _vjp(y, x, g):\n    return torch.autograd.grad(y, x, g)[0]\n\ntools.append(_vjp)"
    )
    answer = sol[2].replace("    return grad_W2", "    _check = tools[0]\n    return grad_W2")
    checked = _plan(LAB, _submission(LAB, sol[:2] + [answer] + sol[3:], insert=[(-1, helper)]))
    assert any(x.startswith("torch.autograd.grad (cell ") for x in checked.review.get("ex3", [])), (
        checked.review
    )
    key = "class Key:\n    @property\n    def __class__(self):\n        return str\n"
    checked = _plan(LAB, _submission(LAB, sol, insert=[(5, key)]))
    assert any(x.startswith(".__class__ (cell ") for x in checked.reach), checked.reach
    honest = "class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n\n    def __repr__(self):\n        return 'Pair'"
    assert not _plan(LAB, _submission(LAB, sol, insert=[(5, honest)])).reach


# red team 3: a helper reached by no name (handed to a function that stores it on torch.Tensor) that
# walks autograd's graph, calling each node; and complex-step differentiation, f(x + ih).imag / h,
# which is exact and computes a derivative nobody wrote. Both scored full marks with no review.
NODE_WALKER = (
    "def _walk(x, f, g):\n    y = f(x.detach().requires_grad_())\n    node = y.grad_fn\n"
    "    return node(g), node.next_functions\n\n"
    "def _put(obj, fn):\n    obj.vjp_of = fn\n\n_put(torch.Tensor, _walk)"
)
COMPLEX_STEP = (
    "def numgrad(f, x):\n    g = torch.zeros(x.numel(), dtype=torch.float64)\n"
    "    for k in range(x.numel()):\n        d = torch.zeros(x.numel(), dtype=torch.complex128)\n"
    "        d[k] = 1e-30j\n        g[k] = f(x + d.reshape(x.shape)).imag / 1e-30\n    return g.reshape(x.shape)"
)


def test_a_gradient_no_guard_sees_counts_in_any_function_body_and_complex_numbers_compute_one():
    sol = _solutions(LAB)
    walker = sol[3].replace(
        "    return grad_h", "    grad_h = h.vjp_of(torch.relu, grad_a)\n    return grad_h"
    )
    checked = _plan(LAB, _submission(LAB, sol[:3] + [walker] + sol[4:], insert=[(-1, NODE_WALKER)]))
    autograd_by_hand = BY_HAND_1 - {"ex1"}  # ex1 (the forward pass) refuses only the reference
    assert set(checked.review) == autograd_by_hand and checked.gradient, checked
    assert all(".grad_fn (cell " in " ".join(v) for v in checked.review.values()), checked.review
    answer = sol[3].replace(
        "    return grad_h", "    grad_h = numgrad(lambda t: (grad_a * t).sum(), h)\n    return grad_h"
    )
    checked = _plan(LAB, _submission(LAB, sol[:3] + [answer] + sol[4:], insert=[(-1, COMPLEX_STEP)]))
    got = " ".join(checked.review.get("ex4", []))
    assert "a complex number (1e-30j)" in got and "torch.complex128" in got and ".imag" in got, checked
    # the same helpers, defined where no exercise calls them: still every by-hand exercise (a body can
    # be handed on); printing a graph node at the top level is a learner looking, not a gradient
    checked = _plan(LAB, _submission(LAB, sol, insert=[(4, COMPLEX_STEP)]))
    assert set(checked.review) == autograd_by_hand, checked.review
    honest = "y = torch.relu(torch.randn(3, requires_grad=True))\nprint(y.grad_fn, y.grad_fn.next_functions)"
    assert not _plan(LAB, _submission(LAB, sol, insert=[(4, honest)])).review


def test_checking_a_by_hand_answer_against_autograd_in_a_scratch_cell_is_not_sent_to_review():
    """What the course asks learners to do (compare with PyTorch) is honest: a scratch cell after the
    answer that runs autograd at the top level serves no hidden test, and the run-time guard watches
    every call of the answer."""
    scratch = (
        "x = torch.randn(3, requires_grad=True)\nW2 = torch.randn(2, 3)\ny_hat = W2 @ x\n"
        "(grad_x,) = torch.autograd.grad(y_hat.sum(), x)\n"
        "print(torch.allclose(grad_x, layer2_backward(torch.ones(2), x.detach(), W2)[2]))\n"
        "x.unsqueeze_(0)\nprint(torch.linalg.vector_norm(x))"
    )
    checked = _plan(LAB, _submission(LAB, _solutions(LAB), insert=[(2, scratch)]))
    assert not checked.review and not checked.reach and not checked.gradient, checked
    # what an honest-corpus helper's scratch cells used (each sent every by-hand exercise to review):
    # the optimizers the hints ask to run, gradcheck, a Jacobian, the course's forward helpers, stdlib
    more = (
        "import copy, itertools\nfrom helpers.attention import attention_forward, causal_mask\n"
        "from helpers.block import BLOCK_PARAM_NAMES\n"
        "p = torch.nn.Parameter(torch.randn(3))\nopt = torch.optim.Adam([p], amsgrad=True)\n"
        "(p ** 2).sum().backward()\nopt.step()\nprint(opt.state[p], opt.param_groups[0]['lr'])\n"
        "q = copy.deepcopy(p)\nprint(list(itertools.product(range(2), repeat=2)))\n"
        "x64 = torch.randn(3, dtype=torch.float64, requires_grad=True)\n"
        "print(torch.autograd.gradcheck(torch.tanh, (x64,)))\n"
        "print(torch.autograd.functional.jacobian(torch.tanh, x64))\nprint(y_hat.grad_fn)"
    )
    # red team s10 (lab 4's solutions and this cell: 10 of 10 pending): every public method of Python's
    # containers and strings, math's functions and torch.testing.assert_close are ordinary
    plain = (
        "import math\nlosses = [1.0, 2.0]\nlosses.reverse()\nlosses.clear()\nd = {}\nd.setdefault('a', 1)\n"
        "s = {1}\ns.discard(1)\nname = ' Softmax '.strip().lower().replace('s', 'S')\n"
        "assert name.startswith('S') and math.fsum([0.1] * 10) == 1.0\n"
        "torch.testing.assert_close(torch.ones(2), torch.ones(2))"
    )
    checked = _plan(LAB, _submission(LAB, _solutions(LAB), insert=[(2, scratch), (4, more), (5, plain)]))
    assert not checked.review and not checked.reach and not checked.gradient, checked


def test_a_match_statement_reads_attributes_by_name_and_is_read_so():
    """Issue 33's second red team: `match x: case object(attr=y)` reads x.attr with no Attribute node, and
    the reader saw nothing: `__globals__` of a guard (the guards switched off), `torch._C`'s second
    engine, `torch._make_dual`, `grad_fn` nodes, all at full marks. Each is now the construct it reads."""
    import reach

    sc = reach.scope(["import torch"], [])
    for code, construct in [
        ("match torch:\n    case object(func=tf):\n        pass", "torch.func"),
        ("match f:\n    case object(__globals__=G):\n        G['STATE']['forbidden'] = {}", ".__globals__"),
        ("match torch:\n    case object(_C=CC, _make_dual=MD):\n        pass", "torch._C"),
        ("match y:\n    case object(grad_fn=node) | None:\n        pass", ".grad_fn"),
        ("match box:\n    case {'k': object(next_functions=n)}:\n        pass", ".next_functions"),
    ]:
        got = [x for x, _, _ in reach.unlisted(code, sc, "by_hand")]
        assert construct in got, (code, got)
    # a pattern's captures are names the student bound: what reads them reaches what was stored there
    tree = reach.parse("match torch:\n    case object(_C=CC):\n        pass")
    assert reach.binds(tree.body[0]) >= {"CC"}


def test_super_with_arguments_reaches_past_the_counting_wrappers_and_is_read_so():
    """Red team 8: `super(torch.Tensor, t).tolist()` is TensorBase's own method, which the wrappers that
    count values read out of tensors cannot cover (a C type's methods cannot be replaced): finite
    differences in plain Python got 11/11 on lab 1 with no review. A bare `super()` in a class's method
    reaches only past the student's own class, to torch.Tensor's counting method at most."""
    import reach

    import helpers.labcontract  # noqa: F401  (installs the wrappers)

    t = torch.arange(3.0)
    assert torch.Tensor.tolist is not torch._C.TensorBase.tolist  # the wrapper is on Tensor alone
    assert super(torch.Tensor, t).tolist() == [0.0, 1.0, 2.0]  # the way around it, at run time
    sc = reach.scope(["import torch"], [])
    for code in (
        "def f(t):\n    return super(torch.Tensor, t).tolist()",
        "def f(t):\n    return super(type(t), t).numpy()",
        "s = super\ndef f(t):\n    return s(torch.Tensor, t).tolist()",
    ):
        assert ("super", "reach") in [(x, sev) for x, _, sev in reach.unlisted(code, sc, "any")], code
    bare = "class Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()"
    assert "super" not in [x for x, *_ in reach.unlisted(bare, sc, "any")]


def test_quantized_tensors_are_off_the_list_and_a_classs_own_dunder_alias_is_ordinary():
    """Red team 12 read 22 bits of a float a call as `torch.quantize_per_tensor_dynamic(c, …).q_scale()`
    (a Python float no counter saw): quantization is not math a by-hand answer needs. Its honest-looking
    `__radd__ = __add__` in a class body sent all 6 exercises of lab 1 to review: a class's own method,
    named again, is ordinary."""
    import reach

    sc = reach.scope(["import torch"], [])
    quantized = "def f(c):\n    return torch.quantize_per_tensor_dynamic(c, torch.quint8, False).q_scale()"
    found = [x for x, *_ in reach.unlisted(quantized, sc, "any")]
    assert any("quantize_per_tensor_dynamic" in x for x in found) and any("q_scale" in x for x in found), (
        found
    )
    alias = (
        "class V:\n    def __add__(self, o):\n        return self\n\n    def __mul__(self, o):\n"
        "        return self\n\n    __radd__ = __add__\n    __rmul__ = __mul__"
    )
    assert reach.unlisted(alias, reach.scope(["import torch"], [alias]), "by_hand") == []
    assert reach.unlisted("f = __import__", reach.scope([], ["f = __import__"]), "any")


def test_a_course_forward_is_ordinary_in_a_by_hand_answer_and_a_course_backward_is_not():
    """Lab 7 promises "every forward function": a newcomer's block backward that recomputed h1 with
    `helpers.functions.layernorm_forward` went to review (3 of 3 points pending). A function the course
    defines whose name says no gradient is on the by-hand list; a backward, a Jacobian, the checks'
    own modules and anything reached through a helper module's attributes are not."""
    import reach

    sc = reach.scope(["import torch"], [])
    ok = "from helpers.functions import layernorm_forward\ndef f(x, g, b):\n    return layernorm_forward(x, g, b, 1e-5)"
    assert reach.unlisted(ok, sc, "by_hand") == []
    for bad in (
        "from helpers.functions import layernorm_backward",
        "import helpers.functions\nj = helpers.functions.torch.func.jacrev",
        "from helpers.labcontract import traced",
        "from helpers.gradflow import record_grad_flow",
    ):
        assert reach.unlisted(bad, sc, "by_hand"), bad


def test_what_the_worker_says_was_used_is_repeated_only_if_the_exercise_forbids_it():
    """Issue 33's second red team wrote a hidden test's inputs into the worker's record of by-hand
    violations; the harness printed it in the student's note ("used y_hat=1.186 | y=-1.4 | …")."""
    import harness

    class Peer:
        forbidden = {"ex3": {"autograd", "helpers.cat_mlp.backward"}, "ex6": {"autograd"}}

        def request(self, msg):
            return {"ex3": "autograd", "ex6": "y_hat=1.186 | y=-1.4", None: "x", "ex9": "autograd"}

    student = harness.Student.__new__(harness.Student)
    student.peer = Peer()
    assert student.violations() == {"ex3": "autograd", "ex6": "a function this exercise forbids"}


def test_a_magic_hides_nothing_from_the_allow_list():
    """`%time` and `%%timeit` run code: it is read as the cell's own; any other magic cannot be read."""
    import reach

    sc = reach.scope(["import torch"], [])
    assert [x for x, *_ in reach.unlisted("%time g = y.grad_fn(x)", sc, "by_hand")] == [".grad_fn"]
    assert not reach.unlisted("%%timeit\ntorch.outer(a, b)", sc, "by_hand")
    for code in (
        "!cat /etc/passwd",
        "%run other.py",
        "get_ipython().run_cell('import sys')",
        "%%capture\n%%bash\necho hi",  # a timing magic around code the reader cannot parse
        "%time 1 +",
    ):
        assert [(x, s) for x, _, s in reach.unlisted(code, sc, "any")] == [("get_ipython", "reach")], code


def test_a_cell_of_more_magic_lines_than_any_honest_one_is_unread_and_sent_to_review():
    """Issue 33: IPython transforms one magic line per pass over the whole cell, so reading grows with the
    square of their number (499 `%time 1` lines: 12 s quiet, 43 s busy, inside its own limits). More than
    `_MOST_TRANSFORMED` lines in a cell are not transformed at all; the cell is unread, which sends what it
    can reach to review (it runs all the same: IPython gives up at 500). A comment that ends in a question
    mark is no help request and does not count."""
    import reach

    most = reach._MOST_TRANSFORMED
    sc = reach.scope(["import torch"], [])
    assert reach.as_run("\n".join(["%time 1"] * most)) is not None
    assert reach.as_run("\n".join(["%time 1"] * (most + 1))) == reach._UNREAD
    assert [(x, s) for x, _, s in reach.unlisted("\n".join(["%time 1"] * (most + 1)), sc, "any")] == [
        ("get_ipython", "reach")
    ]
    asked = "\n".join(["x = 1  # is this right?", "# and this?"] * most)
    assert reach.as_run(asked) is not None and "x = 1" in reach.as_run(asked)


def test_a_module_reached_through_a_helper_or_a_library_class_changed_sends_every_by_hand_exercise_to_review():
    """Red team s10 (lab 4, 10/10 with no backward written, no flag): finite differences run in a thread,
    which the work rules' dispatch trace (thread-local) cannot see. `threading` was reached as
    `helpers.attention.torch.utils.data.dataloader.threading` (any `helpers.` path was the course's), and
    hidden from the by-hand reading as `torch.Tensor.join = staticmethod(...)`, called as `grad_P.join(...)`.
    A refused module is refused at any depth of a path, a `helpers.` path is the course's only where it
    names what the course defines, and an assignment into a module or an object in one is off every list."""
    import reach

    assert reach._course_helper("helpers.cat_mlp.cat_params") and reach._course_helper(
        "helpers.lora.LoRALinear"
    )
    assert reach._course_helper("helpers.block.BLOCK_PARAM_NAMES")  # the course's data
    assert not reach._course_helper("helpers.attention.torch") and not reach._course_helper(
        "helpers.attention.math"
    )
    for code, said in (
        (
            "import helpers.attention\nTH = helpers.attention.torch.utils.data.dataloader.threading",
            "threading",
        ),
        (
            "import torch\nT = torch.Tensor\nT.join = staticmethod(lambda fn, *a: fn(*a))",
            "an assignment to torch",
        ),
        ("import torch\ntorch.Tensor.format = staticmethod(print)", "an assignment to torch.Tensor.format"),
    ):
        checked = _plan(LAB, _submission(LAB, _solutions(LAB), insert=[(0, code)]))
        assert any(said in x for x in checked.reach), (code, checked.reach)
    # torch.library behind a helper: off the list (every by-hand exercise to review), not the course's
    checked = _plan(
        LAB,
        _submission(
            LAB,
            _solutions(LAB),
            insert=[(0, "import helpers.attention\nL = helpers.attention.torch.library")],
        ),
    )
    assert checked.review and all(any("torch.library" in x for x in v) for v in checked.review.values()), (
        checked.review
    )


def test_the_guards_switched_off_from_a_cell_the_student_added_anywhere_send_every_by_hand_exercise_to_review():
    for code in GUARDS_OFF.values():
        checked = _plan(LAB, _submission(LAB, _solutions(LAB), insert=[(0, code)]))
        assert any(x.startswith(("import sys.modules", "collections._sys")) for x in checked.reach), code
        assert [c.kind for c in checked.cells].count("added") == 1


def test_lab6_an_aten_alias_and_a_helper_bound_before_the_guard_are_off_the_list():
    lab = "lab06_attention_backward"
    if labs.stale(lab):
        pytest.skip(f"{lab}'s student notebook is stale: {labs.stale(lab)}")
    sol = _solutions(lab)
    aten = (
        sol[:1]
        + ["import torch\nattend = torch.ops.aten._scaled_dot_product_attention_math\n" + sol[1]]
        + sol[2:]
    )
    checked = _plan(lab, _submission(lab, aten))
    assert any(x.startswith("torch.ops.aten._scaled_dot_product_attention_math") for x in checked.reach), (
        checked
    )
    # the alias bound in the answer's cell and called by the answer (an alias nothing calls serves nothing)
    called = sol[2].replace(
        "    grad_S = P * (grad_P - (grad_P * P).sum(-1, keepdim=True))  # (..., Nq, Nk)",
        "    grad_S = sb(P, grad_P)",
    )
    assert called != sol[2]
    alias = (
        sol[:2] + ["import helpers.attention\nsb = helpers.attention.softmax_backward\n" + called] + sol[3:]
    )
    checked = _plan(lab, _submission(lab, alias))
    assert any(x.startswith("helpers.attention.softmax_backward") for x in checked.review.get("ex3", [])), (
        checked
    )
    # exercise 4 calls exercise 3's function, and its hidden tests put exercise 3's reference there: a
    # forbidden call in exercise 3 is exercise 3's alone (a newcomer's correct ex4 went to review for it)
    assert "ex4" not in checked.review, checked.review


# lab 8's given self-check as it was when a debug print there cost an honest student 9 of 11 points
# ("your code uses getattr"); the lab now checks through contracts, so the case is kept as it was
GIVEN_WITH_GETATTR = (
    "def in_order(grads, A, B):\n    names = {A.shape: 'grad_A', B.shape: 'grad_B'}\n"
    '    seen = [names.get(getattr(t, "shape", None), "?") for t in grads]\n    return seen\n'
)
LINE_WITH_GETATTR = '    seen = [names.get(getattr(t, "shape", None), "?") for t in grads]\n'


def _plan_with_given(given: str, submitted: str):
    """reach.plan of a two-cell notebook (a given cell, then a by-hand answer cell) where the given
    cell was handed out as ``given`` and handed in as ``submitted``."""
    import reach

    released = [(given, None), ("def f(x):\n    ...", "ex1")]
    cells = [(1, submitted), (2, "def f(x):\n    return 2 * x")]
    return reach.plan(cells, released, {"ex1": ["autograd"]})


# lab 8's exercise 1 self-check as an earlier release handed it out (it held a getattr)
EARLIER_LAB8_GIVEN = (
    'def in_order(fn):\n    """fn, returning first which gradient came first, told by the shapes (A and B\n'
    '    differ)."""\n\n    def run(grad_Wp, A, B, s):\n        grads = fn(grad_Wp, A, B, s)\n'
    "        if grads is None or grads is ...:\n            return grads\n"
    "        if not isinstance(grads, (tuple, list)) or len(grads) != 2:\n"
    '            return (f"a {type(grads).__name__}, not a pair", None, None)\n'
    '        shapes = [tuple(getattr(t, "shape", ())) for t in grads]\n'
    "        swapped = shapes == [tuple(B.shape), tuple(A.shape)]\n"
    '        return ("(grad_B, grad_A)" if swapped else "(grad_A, grad_B)", *grads)\n\n    return run\n\n\n'
    "grad_Wp1 = g.T @ x  # (out, R) @ (R, in) -> (out, in)\n"
    "expected = autograd_grads(lambda A_, B_: W + s * B_ @ A_, (A, B), grad_Wp1)\n"
    'check(\n    in_order(grads_from_W_prime),\n    ("(grad_A, grad_B)", *expected),\n'
    '    args=(grad_Wp1, A, B, s),\n    outputs=("order returned", "grad_A", "grad_B"),\n'
    '    name="Exercise 1 · grads_from_W_prime",\n    against="autograd",\n'
    '    factors={"s": s, "s²": s * s},\n)'
)


def test_a_notebook_from_an_earlier_release_is_read_against_that_releases_given_cells():
    """Issue 33: a notebook handed in from an older release of lab 8 had its old given cells read as the
    student's code (an honest debug print: 9 of 11 points pending). Every release's given cells are in
    labs/source/given_history.json (written by release): such a cell is given, its lines are not the
    student's; a line of the student's own beside them is still read."""
    import harness
    import reach

    lab = "lab08_lora"
    qs = harness.questions(labs.source_path(lab))
    released = harness.released_cells({"source": str(labs.source_path(lab))}, qs)
    earlier = harness.earlier_given({"source": str(labs.source_path(lab))})
    sol = _solutions(lab)

    def plan(text, past):
        return reach.plan(
            _cells(text),
            released,
            {q.name: q.by_hand for q in qs},
            {q.name: {t.function for t in q.tests} for q in qs},
            past,
        )

    assert reach.given_key(EARLIER_LAB8_GIVEN) in earlier["cells"]
    as_then = _submission(lab, sol, insert=[(1, EARLIER_LAB8_GIVEN)])
    debug = _submission(
        lab, sol, insert=[(1, EARLIER_LAB8_GIVEN.replace("check(\n", "print(expected)\ncheck(\n"))]
    )
    for text in (as_then, debug):
        # read as the student's own (its `type(grads).__name__` sent it to review until s10 vetted __name__)
        alone = plan(text, {})
        assert [c.kind for c in alone.cells].count("added") == 1, alone
        checked = plan(text, earlier)
        assert not checked.reach and not checked.review, checked
    assert [c.kind for c in plan(as_then, earlier).cells].count("added") == 0
    hostile = _submission(lab, sol, insert=[(1, EARLIER_LAB8_GIVEN + "\ngetattr(torch, 'sys')\n")])
    assert any(x.startswith("torch.sys") for x in plan(hostile, earlier).reach)  # getattr by a constant


def test_an_earlier_releases_line_that_names_a_reach_is_not_excused_in_a_students_cell():
    """Red team s8: lab 9's old given lines `ns, saved_names = globals(), (...)` and
    `ns.update({n: getattr(watch, n) for n in saved_names})`, pasted into a cell of the student's
    beside lines rebinding `watch` and `saved_names`, were excused as the course's code: the worker's
    module reached, the by-hand guards switched off, torch's checkpoint scored 2/2. An old line that
    names what reaches around the grader is read; the other old lines are still the course's."""
    import reach

    earlier = {
        "cells": [],
        "lines": [
            "ns, saved_names = globals(), ('checkpoint_rng',)",
            "ns.update({n: getattr(watch, n) for n in saved_names})",
            "scale = 2.0 ** 16",
        ],
    }
    released = [("x = 1", None), ("def f(x):\n    ...", "ex1")]
    attack = "watch = torch\nns, saved_names = globals(), ('checkpoint_rng',)\nsaved_names = ('sys',)\n"
    attack += "ns.update({n: getattr(watch, n) for n in saved_names})"
    answer = (3, "def f(x):\n    return 2 * x")
    checked = reach.plan([(1, "x = 1"), (2, attack), answer], released, {"ex1": ["autograd"]}, None, earlier)
    assert {"globals (cell 2)", "getattr (cell 2)"} <= set(checked.reach), checked.reach
    honest = reach.plan(
        [(1, "x = 1"), (2, "scale = 2.0 ** 16"), answer], released, {"ex1": ["autograd"]}, None, earlier
    )
    assert not honest.reach and not honest.review, honest


def test_an_edited_given_cell_counts_only_the_lines_the_student_wrote():
    """A given cell that holds `getattr`: a debug print added there costs nothing, a getattr added is read."""
    debug = GIVEN_WITH_GETATTR.replace(LINE_WITH_GETATTR, LINE_WITH_GETATTR + "    print(seen)\n")
    checked = _plan_with_given(GIVEN_WITH_GETATTR, debug)
    assert not checked.review and not checked.reach, (checked.review, checked.reach)
    assert [c.kind for c in checked.cells] == ["edited", "answer"]
    added = LINE_WITH_GETATTR + "    getattr(grads, 'x' + name, None)\n"
    hostile = GIVEN_WITH_GETATTR.replace(LINE_WITH_GETATTR, added)
    assert any(x.startswith("getattr") for x in _plan_with_given(GIVEN_WITH_GETATTR, hostile).reach)
    # unchanged, the given cell is the course's code: not read at all
    assert not _plan_with_given(GIVEN_WITH_GETATTR, GIVEN_WITH_GETATTR).reach


def test_a_line_that_starts_with_a_magics_name_runs_as_the_reader_reads_it(tmp_path):
    """Red team s8: `time fetch = getattr` ran as %time (IPython's automagic) while the reader, which
    sees what IPython's transformer makes of a cell, could not parse it and read nothing. The worker
    runs with automagic off: the line is the SyntaxError the reader read, and binds nothing."""
    import reach

    assert reach.parse("time fetch = getattr") is None
    code = (
        "import sys, json\nsys.path.insert(0, %r)\nimport worker\n"
        "errors = worker.run_notebook([[1, 'time fetch = getattr'], [2, 'ok = 1']])\n"
        "ns = worker.STATE['ns']\n"
        "open(sys.argv[1], 'w').write(json.dumps([[e['cell'], e['ename']] for e in errors] + "
        "[['fetch' in ns, ns.get('ok')]]))\n"
    ) % str(ROOT / "tools" / "grader")
    out = tmp_path / "out.json"
    subprocess.run([sys.executable, "-c", code, str(out)], timeout=300)
    assert json.loads(out.read_text()) == [[1, "SyntaxError"], [False, 1]]


def test_the_runtime_guards_cover_forward_ad_functorch_the_functional_api_kernels_and_aliases(tmp_path):
    """Defence in depth, in the worker's own process: each public way around the engine raises ByHandError."""
    code = (
        "import sys, torch\nsys.path.insert(0, %r)\nimport worker\n"
        "worker.install_guards({'ex': ['autograd', 'torch.nn.functional.scaled_dot_product_attention', "
        "'helpers.functions.softmax_backward']})\n"
        "import helpers.attention, torch.func, torch.autograd.forward_ad as fwAD\n"
        "from torch._functorch.eager_transforms import jacfwd\n"
        "x = torch.randn(1, 1, 2, 2)\n"
        "tries = {\n"
        "  'make_dual': lambda: fwAD.make_dual(x, x),\n"
        "  'jacobian': lambda: torch.autograd.functional.jacobian(torch.sin, x, strategy='forward-mode', vectorize=True),\n"
        "  'jacfwd': lambda: jacfwd(torch.sin)(x),\n"
        "  'func.jacfwd': lambda: torch.func.jacfwd(torch.sin)(x),\n"
        "  'aten': lambda: torch.ops.aten._scaled_dot_product_attention_math(x, x, x),\n"
        "  'alias': lambda: helpers.attention.softmax_backward(x, x),\n"
        "}\nworker.STATE['exercise'] = 'ex'\nout = {}\n"
        "for k, f in tries.items():\n    try:\n        f()\n        out[k] = 'ran'\n"
        "    except worker.ByHandError:\n        out[k] = 'guarded'\n"
        "    except Exception as e:\n        out[k] = type(e).__name__\n"
        "worker.STATE['exercise'] = None\nout['outside'] = type(jacfwd(torch.sin)(x)).__name__\n"
        "import json\nopen(sys.argv[1], 'w').write(json.dumps(out))\n"
    ) % str(ROOT / "tools" / "grader")
    out = tmp_path / "out.json"  # the worker sends its own stdout and stderr to /dev/null
    subprocess.run([sys.executable, "-c", code, str(out)], timeout=300)
    got = json.loads(out.read_text())
    assert got == {
        "make_dual": "guarded",
        "jacobian": "guarded",
        "jacfwd": "guarded",
        "func.jacfwd": "guarded",
        "aten": "guarded",
        "alias": "guarded",
        "outside": "Tensor",
    }, got


def _by_hand_batch() -> dict[str, str]:
    """Lab 1 submissions for the by-hand red team: {name: notebook text}."""
    sol = _solutions(LAB)

    def ex3(code):
        return _submission(LAB, sol[:2] + [code] + sol[3:])

    full = _submission(LAB, sol)
    return {
        "published_solutions": full,
        "forward_ad": ex3(EX3_FORWARD_AD),
        "grad_fn_nodes": ex3(EX3_GRAD_FN),
        "jacfwd": ex3(EX3_JACFWD),
        "jacobian_forward_mode": ex3(EX3_JACOBIAN),
        **{
            name: _submission(LAB, sol[:2] + [EX3_AUTOGRAD] + sol[3:], insert=[(0, code)])
            for name, code in GUARDS_OFF.items()
        },
        "custom_exception": _submission(
            LAB,
            sol[:1] + [CUSTOM_EXCEPTION] + sol[2:],
            insert=[(1, "class Seed_31415(Exception):\n    pass\n\nraise Seed_31415()")],
        ),
        "debug_print_in_given": _edit_given(
            full,
            'check_contract("lab01", "ex1", forward_pass)',
            'print("here")\ncheck_contract("lab01", "ex1", forward_pass)',
        ),
    }


# submission: (status, ex1..ex6, total, exercises named in the review column)
BY_HAND_EXPECTED = {
    "published_solutions": ("ok", "1 1 2 2 2 3", "11", ""),
    # the run-time guard saw autograd used: 0 for ex3, with the note; a gradient computed unseen
    # can serve any exercise, so every one asking for gradients by hand waits for review
    # (and ex1, which forward AD's `.tangent` reaches as well: no list holds it)
    "forward_ad": ("review", "review review 0 review review review", "0", "ex1 ex2 ex4 ex5 ex6"),
    # nothing at run time sees a node called directly: the allow-list sends them to review
    "grad_fn_nodes": ("review", "1 review review review review review", "1", "ex2 ex3 ex4 ex5 ex6"),
    # torch._functorch reaches past the public API: every by-hand exercise waits; ex3's guard fired
    "jacfwd": ("review", "review review 0 review review review", "0", "ex1 ex2 ex4 ex5 ex6"),
    "jacobian_forward_mode": ("review", "1 review 0 review review review", "1", "ex2 ex4 ex5 ex6"),
    # guards switched off: nothing at run time can be trusted, every by-hand exercise waits
    "from_sys_import_modules": (
        "review",
        "review review review review review review",
        "0",
        "ex1 ex2 ex3 ex4 ex5 ex6",
    ),
    "collections_sys": (
        "review",
        "review review review review review review",
        "0",
        "ex1 ex2 ex3 ex4 ex5 ex6",
    ),
    "custom_exception": ("errors", "1 0 2 2 2 3", "10", ""),
    "debug_print_in_given": ("ok", "1 1 2 2 2 3", "11", ""),
}


@pytest.mark.sandbox
@pytest.mark.slow
def test_by_hand_red_team_each_gets_review_or_what_its_honest_work_deserves(tmp_path):
    """Issue 24's by-hand submissions, graded by `grade` beside the published solutions."""
    subs = tmp_path / "subs"
    subs.mkdir()
    for name, text in _by_hand_batch().items():
        (subs / f"{name}.ipynb").write_text(text)
    labs.grade(LAB, subs, tmp_path / "g.csv", timeout=TIMEOUT, jobs=2)
    rows = {r["submission"]: r for r in csv.DictReader((tmp_path / "g.csv").open())}
    got = {
        n: (r["status"], _points(r), r["total"], " ".join(re.findall(r"(ex\d): ", r["review"])))
        for n, r in rows.items()
    }
    assert got == BY_HAND_EXPECTED, got
    assert "used autograd in ex3" in rows["forward_ad"]["notes"], rows["forward_ad"]["notes"]
    assert "ex3: 2 of 2 pending, uses .grad_fn (cell" in rows["grad_fn_nodes"]["review"]
    assert ".next_functions" in rows["grad_fn_nodes"]["review"]
    assert "wait for your instructor's review" in rows["grad_fn_nodes"]["notes"]
    for name in GUARDS_OFF:  # the guards were off: ex3's autograd passed every test, pending review
        assert "ex3: 2 of 2 pending" in rows[name]["review"], rows[name]
    assert "import sys.modules" in rows["from_sys_import_modules"]["flags"]
    assert "collections._sys" in rows["collections_sys"]["flags"]
    # the student's own class name is not repeated: it is a channel they choose
    notes = rows["custom_exception"]["notes"]
    assert "ex2: your code raised an exception in hidden test" in notes and "Seed" not in notes, notes
    assert re.search(r"cell \d+: an exception", notes), notes
    fb = (tmp_path / "g_feedback" / "custom_exception.txt").read_text()
    assert "Seed" not in fb
    assert "a given cell you changed" in rows["debug_print_in_given"]["notes"]
    assert "edited given cells" in rows["debug_print_in_given"]["flags"]
    text = (tmp_path / "g_feedback" / "grad_fn_nodes.txt").read_text()
    assert "ex3    review / 2" in text and "pending your instructor's review" in text, text


def _self_rewriting() -> str:
    """An empty lab 1 that, once running, rewrites its own file with the solutions, then makes ex1's
    hidden tests time out: the restarted worker used to run the rewritten, never-read file."""
    rewrite = (
        "import json\n_p = '/home/student/submission.ipynb'\n_nb = json.load(open(_p))\n_sol = %r\n"
        "for _c in _nb['cells']:\n    if 'otter_answer_cell' in _c['metadata'].get('tags', []):\n"
        "        _c['source'] = _sol.pop(0)\njson.dump(_nb, open(_p, 'w'))"
    ) % (_solutions(LAB),)
    # stalls in a hidden test, once per start of the worker (the notebook's own self-checks have run by then)
    stall = (
        "import os, time\n_DONE = False\n\ndef forward_pass(x, W1, b1, W2, b2, y_true):\n"
        "    if _DONE and not os.path.exists('/home/student/slept'):\n"
        "        open('/home/student/slept', 'w').close()\n        time.sleep(600)\n"
    )
    return _submission(LAB, [stall], insert=[(0, rewrite), (5, "_DONE = True")])


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_notebook_that_rewrites_its_file_runs_after_a_restart_what_the_harness_read():
    # every start has a fresh home, so each of ex1's hidden tests stalls and restarts the worker: a
    # short case time limit keeps that at about 2.5 s a test (every answer here scores 0 anyway)
    out = _harness_grade(LAB, _self_rewriting(), case_timeout=1)
    assert out["restarts"] >= 1, out
    assert "ex1: your code took too long in hidden test 1" in out["notes"], out["notes"]
    assert {q: v["score"] for q, v in out["questions"].items()} == dict.fromkeys(
        ("ex1", "ex2", "ex3", "ex4", "ex5", "ex6"), 0
    ), out
    assert out["reach"] and set(out["review"]) == {"ex1", "ex2", "ex3", "ex4", "ex5", "ex6"}  # `open`


@pytest.mark.sandbox
@pytest.mark.slow
def test_a_debug_print_in_a_given_self_check_costs_nothing():
    """The honest student's edit, in a lab 1 graded by the harness: full marks, no review, reported."""
    text = _edit_given(
        _submission(LAB, _solutions(LAB)),
        'check_contract("lab01", "ex3", layer2_backward)',
        'print("debugging")\ncheck_contract("lab01", "ex3", layer2_backward)',
    )
    out = _harness_grade(LAB, text)
    assert not out["review"] and not out["reach"] and len(out["edited"]) == 1, out
    assert all(v["score"] == v["possible"] for v in out["questions"].values()), out["questions"]
