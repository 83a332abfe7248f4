"""Labs: generate student notebooks from the sources, check them, grade.

    python tools/labs.py release [LAB ...] [--no-execute]   # sources -> labs/LAB.ipynb
    python tools/labs.py record [LAB ...]                    # contract -> helpers/data/LAB.contract.json
    python tools/labs.py check-stale                         # fail if a student notebook is stale or leaks
    python tools/labs.py grade LAB SUBMISSIONS_DIR [--out gradebook.csv] [--timeout S] [--jobs 1]
                                                             # [--feedback DIR] [--skip-question ex6] [--unsafe]
    python tools/labs.py gradescope LAB [--out autograder.zip] [--timeout S] [--skip-question ex6] [--visibility V]
                                                             # a Gradescope autograder (tools/grader/gradescope.py)

A lab is two files: its source, ``labs/source/LAB.ipynb`` (prose, given code, solutions between
``# BEGIN/END SOLUTION`` or on ``# SOLUTION`` lines, one ``# BEGIN QUESTION`` marker per question
naming it), and its contract, ``labs/source/contracts/LAB.py`` (each exercise declared once:
signature, points, by-hand guard, case classes, reference; the self-check's recorded cases and
the hidden tests are both generated from it).  ``release`` records the contract's public cases,
executes the source, writes ``labs/LAB.ipynb`` (markers gone, solutions stripped, Colab setup
cell, clean metadata) and executes it.
``grade`` runs each submission in a bubblewrap sandbox (``tools/grader/sandbox.py``) and its
hidden tests in a separate harness process (``tools/grader/harness.py``) that calls the
student's functions across a by-value boundary (``tools/grader/wire.py``); it writes a gradebook
CSV, one feedback file per student and a similarity report.  See labs/README.md.
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures as cf
import contextlib
import csv
import itertools
import json
import os
import pickle
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
import nbtool  # noqa: E402  (beside this file: the folder a script runs from, and the tests' pythonpath)

nbformat = nbtool.nbformat  # imported there, without the IRI checker that costs 1 s a process

LABS = ROOT / "labs"
SOURCES = LABS / "source"
DEFAULT_TIMEOUT = 300
# without --timeout, a notebook may take CALIBRATION times what the published solutions took to grade in
# the same run (at least TIMEOUT_FLOOR s, at most DEFAULT_TIMEOUT): a notebook that spins holds a grading
# slot for some 40 s in lab 1, not 300 (labs/instructors.md has the class of 200 that two such slow down)
CALIBRATION = 10
TIMEOUT_FLOOR = 30

# ---------------------------------------------------------------- lab sources


def labs() -> list[str]:
    """Every lab, by name (the source notebook's stem), in order."""
    return sorted(p.stem for p in SOURCES.glob("lab*.ipynb"))


def resolve_lab(arg: str) -> str:
    """'lab01_cat_mlp', 'lab01', '01' or '1' -> 'lab01_cat_mlp'."""
    names = labs()
    if arg in names:
        return arg
    m = re.fullmatch(r"(?:lab)?0*(\d+)\w*", arg)
    if m:
        hits = [n for n in names if re.match(rf"lab0*{int(m.group(1))}(?:_|$)", n)]
        if len(hits) == 1:
            return hits[0]
    raise SystemExit(f"unknown lab {arg!r}; labs: {', '.join(names) or '(none)'}")


def source_path(lab: str) -> Path:
    return SOURCES / f"{lab}.ipynb"


def student_path(lab: str) -> Path:
    return LABS / f"{lab}.ipynb"


def read_nb(path: Path):
    return nbformat.read(path, as_version=4)


# every release's given cells, per lab: a notebook handed in from an earlier release is read against its own
GIVEN_HISTORY = SOURCES / "given_history.json"


def given_history() -> dict:
    """{lab: {"cells": [key of a given cell], "lines": [a given cell's line]}} of every release so far."""
    return json.loads(GIVEN_HISTORY.read_text(encoding="utf-8")) if GIVEN_HISTORY.exists() else {}


def _given_of(nb) -> list[str]:
    """A released notebook's given code cells (its answer cells left out)."""
    return [
        c.source
        for c in nb.cells
        if c.cell_type == "code" and "otter_answer_cell" not in c.metadata.get("tags", [])
    ]


def remember_given(lab: str) -> None:
    """Add labs/LAB.ipynb's given cells to GIVEN_HISTORY (what release does after writing it)."""
    history = given_history()
    had = history.get(lab, {"cells": [], "lines": []})
    now = reach().given_record(_given_of(read_nb(student_path(lab))))
    history[lab] = {k: sorted(set(had[k]) | set(now[k])) for k in ("cells", "lines")}
    GIVEN_HISTORY.write_text(json.dumps(history, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def reach():
    """tools/grader/reach.py: how the grader reads a submission's code."""
    return module_at("reach", ROOT / "tools" / "grader" / "reach.py")


def contract(lab: str):
    """The lab's contract (labs/source/contracts/LAB.py): the one declaration of its exercises."""
    from helpers.labcontract import instructor_module

    return instructor_module(lab).CONTRACT


def questions(lab: str) -> list[tuple[str, float]]:
    """[(question name, points)] in order, as the lab's contract declares them."""
    return [(q.name, float(q.points)) for q in contract(lab).questions()]


# what a marker cell starts: the region every later code cell belongs to
REGION_MARKERS = (
    ("# BEGIN QUESTION", "prompt"),
    ("# BEGIN SOLUTION", "solution"),
    ("# END SOLUTION", "prompt"),
    ("# END QUESTION", "selfcheck"),
)


def regions(src_nb, markdown=False):
    """Each code cell of a lab source with its question and region: (question, where, cell).

    ``where`` is 'setup' before the first question, then 'prompt', 'solution' or 'selfcheck'
    (after ``# END QUESTION``, up to the next question);
    ``question`` is the name of the current question (None in the setup). A raw marker cell
    yields (question, marker, cell) with ``where`` the region it starts, so a reader can act
    on entering a region. With ``markdown=True`` the Markdown cells come too (a prompt's prose and
    hints). One reader of the lab format's markers for the tools and the tests.
    """
    question, where = None, "setup"
    for cell in src_nb.cells:
        if cell.cell_type == "raw":
            text = cell.source.strip()
            for marker, region in REGION_MARKERS:
                if text.startswith(marker):
                    if marker == "# BEGIN QUESTION":
                        question = str((yaml.safe_load(cell.source.split("\n", 1)[1]) or {})["name"])
                    where = region
                    yield question, "marker:" + region, cell
                    break
            continue
        if cell.cell_type == "code" or (markdown and cell.cell_type == "markdown"):
            yield question, where, cell


def title(nb) -> str:
    """The first Markdown heading ('# Lab 1 · ...'), used to recognise a lab without metadata."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            m = re.search(r"^#\s+(.+)$", src, re.M)
            if m:
                return m.group(1).strip()
    return ""


# ------------------------------------------------------------------ release


def use_this_python() -> None:
    """Run notebooks with this interpreter: a private 'python3' kernelspec first on JUPYTER_PATH.

    A user-level kernelspec may point at another environment (e.g. a venv without the
    helpers); nbclient picks kernels by name, so give it ours.
    """
    if os.environ.get("LABS_KERNEL_DIR"):
        return
    d = Path(tempfile.mkdtemp(prefix="labs-kernel-"))
    spec = d / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3",
                "language": "python",
            }
        )
    )
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(d), os.environ.get("JUPYTER_PATH")]))
    os.environ["LABS_KERNEL_DIR"] = str(d)
    atexit.register(remove_tree, d)  # release left a labs-kernel-* folder in the temp dir per run


def remove_tree(path: Path) -> None:
    """Remove a folder whatever a submission left in it; never raises.

    ``shutil.rmtree`` recurses once per level on Python < 3.12, so a 5000-deep tree in a sandbox
    home raised RecursionError (not an OSError, so ``ignore_errors`` let it through): ``grade``
    died with no gradebook for anyone and left its run folder behind. ``rm -rf`` walks any depth.
    """
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except (OSError, RecursionError):
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=False, capture_output=True)


ANSWER_TAG = (
    "otter_answer_cell"  # an answer cell's tag: the name otter gave it, which handed-out notebooks carry
)
_ASSIGNED = re.compile(
    r"^(\s*(?:[\w.]+(?:\[[^\]]*\])*\s*,\s*)*[\w.]+(?:\[[^\]]*\])*\s*=)[^=].*#\s?SOLUTION\s*$"
)


def without_solution(code: str) -> str:
    """An answer cell as the student gets it: ``x = expr  # SOLUTION`` becomes ``x = ...``, another
    ``# SOLUTION`` line ``...``, and a ``# BEGIN SOLUTION`` … ``# END SOLUTION`` block one ``...``
    (each at its own indentation)."""
    out, inside = [], False
    for line in code.split("\n"):
        stripped = line.strip()
        if stripped.startswith("# BEGIN SOLUTION"):
            if inside:
                raise ValueError(f"a BEGIN SOLUTION inside another one: {line!r}")
            inside = True
            out.append(line[: len(line) - len(line.lstrip())] + "...")
        elif stripped.startswith("# END SOLUTION"):
            if not inside:
                raise ValueError(f"an END SOLUTION without its BEGIN: {line!r}")
            inside = False
        elif inside:
            continue
        elif line.rstrip().endswith("# SOLUTION"):
            m = _ASSIGNED.match(line)
            out.append(m.group(1) + " ..." if m else line[: len(line) - len(line.lstrip())] + "...")
        else:
            out.append(line)
    if inside:
        raise ValueError("a BEGIN SOLUTION without its END SOLUTION")
    return "\n".join(out)


def with_rule(prompt: str, rule: str) -> str:
    """A question's prompt with its contract's rule paragraph (``Contract.rule_line``) after the paragraph that
    says what is given, or else before the first hint: what may not be called is read off the declaration."""
    if not rule:
        return prompt
    paras = prompt.split("\n\n")
    at = next((i + 1 for i, p in enumerate(paras) if p.startswith("**You are given:**")), None)
    if at is None:
        at = next((i for i, p in enumerate(paras) if p.lstrip().startswith("<details>")), len(paras))
    return "\n\n".join([*paras[:at], rule, *paras[at:]])


def student_notebook(lab: str):
    """labs/LAB.ipynb as the source makes it: the markers gone, each solution cell an answer cell
    without its solution, our Colab setup cell first, no outputs, the lab's name in the metadata."""
    src = read_nb(source_path(lab))
    nb = nbformat.v4.new_notebook(metadata={k: v for k, v in src.metadata.items() if k != "jupytext"})
    # the name the grader recognises a submission by (``identify``); otter's key, kept for handed-out notebooks
    nb.metadata["otter"] = {"assignment_name": lab}
    where, rule, question = "setup", "", None
    for cell in src.cells:
        if cell.cell_type == "raw":
            text = cell.source.strip()
            if text.startswith("# BEGIN QUESTION") and "\n" in text:
                conf = yaml.safe_load(text.split("\n", 1)[1]) or {}
                if set(conf) != {"name"}:
                    raise ValueError(
                        f"{lab}: a question's marker holds only its name (points, by_hand, in_place are "
                        f"declared in labs/source/contracts/{lab}.py), got {sorted(conf)}"
                    )
                question = str(conf["name"])
                rule = contract(lab).rule_line(question)
            where = next((r for m, r in REGION_MARKERS if text.startswith(m)), where)
            continue
        meta = {
            k: v for k, v in cell.metadata.items() if k not in ("lines_to_next_cell", "editable", "deletable")
        }
        if cell.cell_type == "markdown":
            text = with_rule(cell.source, rule)
            if text.startswith("**Self-check") and question:
                first, _, rest = text.partition("\n\n")  # the list goes after the first paragraph
                text = "\n\n".join(x for x in (first, contract(lab).promise_list(question), rest) if x)
            new = nbformat.v4.new_markdown_cell(text, metadata=meta)
            rule = ""  # the question's first prose cell carries it
        elif where == "solution":
            tags = [*meta.get("tags", []), ANSWER_TAG]
            new = nbformat.v4.new_code_cell(without_solution(cell.source), metadata={**meta, "tags": tags})
        else:
            new = nbformat.v4.new_code_cell(cell.source, metadata=meta)
        new.id = cell.get("id", new.id)  # the source cell's id: a release writes the same notebook twice
        nb.cells.append(new)
    nbtool.ensure_setup(nb)
    nbtool.clean(nb)
    return nb


def contract_path(lab: str) -> Path:
    """The lab's contract module (labs/source/contracts/LAB.py; labs/README.md "Contracts"), if it has one."""
    return SOURCES / "contracts" / f"{lab}.py"


def record_contract(lab: str) -> None:
    """Write helpers/data/LAB.contract.json (the self-check's cases and reference outputs) from the contract."""
    if contract_path(lab).exists():
        print(f"recorded {contract(lab).write().relative_to(ROOT)}")


def release(lab: str, execute: bool = True) -> None:
    """Source -> executed source (its self-checks print ✓), executed labs/LAB.ipynb."""
    use_this_python()
    src = source_path(lab)
    record_contract(lab)  # before the source runs: its self-checks read the recorded outputs
    if execute:
        nbtool.execute(src)  # fresh outputs
    dest = student_path(lab)
    nbformat.write(student_notebook(lab), dest)
    if execute:
        nbtool.execute(dest)
    remember_given(lab)
    print(f"released {lab}: {dest.relative_to(ROOT)}")


# ------------------------------------------------------------ stale and leaks


def skeleton(nb) -> list:
    """What must match between a committed student notebook and a fresh one: cells, not outputs."""
    cells = [(c.cell_type, c.source, sorted(c.metadata.get("tags", []))) for c in nb.cells]
    return [nb.metadata.get("otter", {}).get("assignment_name")] + cells


def stale(lab: str) -> str | None:
    """Why labs/LAB.ipynb differs from what the source generates now (None if it does not)."""
    dest = student_path(lab)
    if not dest.exists():
        return f"{dest.relative_to(ROOT)} is missing: run `python tools/labs.py release {lab}`"
    try:
        fresh = student_notebook(lab)
    except Exception as exc:  # a broken source is a problem to report, not a crash
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"{lab}: cannot generate the student notebook ({type(exc).__name__}: {first})"
    have, want = skeleton(read_nb(dest)), skeleton(fresh)
    if have == want:
        record = given_history().get(lab, {"cells": [], "lines": []})
        if set(reach().given_record(_given_of(fresh))["cells"]) <= set(record["cells"]):
            return None
        return f"{GIVEN_HISTORY.relative_to(ROOT)} lacks this release's given cells: run `python tools/labs.py release {lab}`"
    first = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
    return (
        f"{dest.relative_to(ROOT)} is stale (first difference at cell {first}): "
        f"run `python tools/labs.py release {lab}`"
    )


_CODE = re.compile(r"\s+#.*$")


def _norm(line: str) -> str:
    """A code line without its trailing comment and outer spaces."""
    line = line.rstrip()
    for marker in ("# SOLUTION", "# BEGIN SOLUTION", "# END SOLUTION"):
        line = line.replace(marker, "")
    return _CODE.sub("", line).strip()


def secret_snippets(src_nb, min_len: int = 8) -> list[str]:
    """Code that only the solutions contain (each ≥ min_len characters).

    Lines inside ``# BEGIN/END SOLUTION`` comments and the right-hand side of ``x = ...  # SOLUTION``
    lines (or the whole line); minus any text that also appears in the public part of the source
    (prompts, given code, self-checks). The hidden tests are no text of the source: they are
    generated from the lab's contract, which is never released.
    """
    secret, public = [], []
    for cell in src_nb.cells:
        if cell.cell_type != "code":
            public.append(cell.source)
            continue
        inside = False
        for ln in cell.source.splitlines():
            if ln.strip().startswith("# BEGIN SOLUTION"):
                inside = True
            elif ln.strip().startswith("# END SOLUTION"):
                inside = False
            elif inside:
                secret.append(_norm(ln))
            elif ln.rstrip().endswith("# SOLUTION"):
                code = _norm(ln)
                secret.append(
                    code.split("=", 1)[1].strip() if re.match(r"^[\w.,\s\[\]'\"]+=[^=]", code) else code
                )
            else:
                public.append(ln)
    public_text = "\n".join(public)
    course = _course_code()
    return sorted(
        {
            s
            for s in secret
            if len(s) >= min_len and s not in public_text and not _GENERIC.match(s) and not found(s, course)
        }
    )


def found(snippet: str, text: str) -> bool:
    """``snippet`` occurs in ``text`` as whole code: 'grad_Y @ W' does not occur in 'grad_Y @ W_out'."""

    def word(c: str) -> bool:  # what the regex \w matches
        return c.isalnum() or c == "_"

    i = text.find(snippet)  # each occurrence, then its two neighbours (a regex scan took 3 ms a snippet)
    while i != -1:
        j = i + len(snippet)
        if not (i and (word(text[i - 1]) or text[i - 1] == ".")) and not (j < len(text) and word(text[j])):
            return True
        i = text.find(snippet, i + 1)
    return False


# Lines any Python program may contain: finding them on a page proves nothing.
_GENERIC = re.compile(
    r"^(import \S+|from \S+ import .*|except\b.*|try:|else:|finally:|continue|break|pass"
    r"|return|return None|return True|return False|with torch\.no_grad\(\):)$"
)
_COURSE_CODE: str | None = None


def _course_code() -> str:
    """Every chapter (cells and outputs) and the helpers package: public, so never a lab's secret."""
    global _COURSE_CODE
    if _COURSE_CODE is None:
        parts = [p.read_text() for p in sorted((ROOT / "helpers").glob("*.py"))]
        for p in sorted((ROOT / "chapters").glob("*.ipynb")):
            for c in read_nb(p).cells:
                parts.append(c.source)
                parts += ["".join(o.get("text", "")) for o in c.get("outputs", [])]
        _COURSE_CODE = "\n".join(parts)
    return _COURSE_CODE


def leaks(lab: str, student_text: str | None = None) -> list[str]:
    """Secret snippets of the source that appear in the student notebook (or in ``student_text``)."""
    if student_text is None and not student_path(lab).exists():
        return []  # stale() already reports the missing notebook
    text = student_text if student_text is not None else student_path(lab).read_text()
    # compare code with code: the notebook's JSON strings decoded
    try:
        nb = json.loads(text)
        text = "\n".join(
            "".join(c["source"]) + "\n" + json.dumps(c.get("outputs", []), ensure_ascii=False)
            for c in nb["cells"]
        ) + json.dumps(nb.get("metadata", {}), ensure_ascii=False)
    except (ValueError, KeyError, TypeError):
        pass
    return [s for s in secret_snippets(read_nb(source_path(lab))) if found(s, text)]


# ---------------------------------------------------------------------- grade

# the grader's modules by file, under their own names (the tests import them by those names too)
from helpers.labcontract import module_at  # noqa: E402  (the one loader of a module by file)

collect = module_at("collect", ROOT / "tools" / "grader" / "collect.py")
sandbox = module_at("sandbox", ROOT / "tools" / "grader" / "sandbox.py")
similarity = module_at("similarity", ROOT / "tools" / "grader" / "similarity.py")

STATUS_HELP = {
    "ok": "graded",
    "errors": "graded; some cells raised an exception (see notes)",
    "timeout": "still running at the time limit (infinite loop?): not graded, 0 points",
    "crashed": "the notebook or the grader died (os._exit, a segfault, out of memory): 0 points",
    "corrupt": "not a readable notebook (invalid JSON or no cells): 0 points",
    "wrong-lab": "a notebook for another lab: 0 points",
    "not-a-notebook": "not an .ipynb file: 0 points",
    "review": "graded, but some exercises wait for your instructor's review (see notes): their points are pending",
}
PENDING = "review"  # an exercise's gradebook cell while its points wait for the instructor
RUN_PREFIX = "labs-grade-"


def default_out(lab: str) -> Path:
    """Where the gradebook goes unless told: outside the repository, so grades are not committed by accident."""
    return Path.home() / "backprop-by-hand-grades" / lab / "gradebook.csv"


def identify(nb, lab: str) -> tuple[str, str]:
    """('ok'|'wrong-lab'|'unknown', note) from the otter assignment name, else from the title."""
    name = (nb.get("metadata", {}).get("otter") or {}).get("assignment_name")
    if name:
        return ("ok", "") if name == lab else ("wrong-lab", f"this notebook is {name}, expected {lab}")
    titles = {other: title(read_nb(student_path(other))) for other in labs() if student_path(other).exists()}
    got = title(nb)
    for other, t in titles.items():
        if t and got == t:
            if other == lab:
                return "ok", "lab metadata missing; recognised by its title"
            return "wrong-lab", f"this notebook is {other} (by its title), expected {lab}"
    return "unknown", "no lab metadata and an unfamiliar title: graded as " + lab


def _row(name, status, qs, scores=None, notes=(), graded="", flags="", review=None):
    """A gradebook row; questions in ``review`` ({question: constructs}) read "review", their points pending."""
    review = review or {}
    row = {
        "submission": name,
        "status": "review" if review and status in ("ok", "errors") else status,
        "graded_file": graded,
    }
    pending = {}
    for q, p in qs:
        row[q] = min(float((scores or {}).get(q, 0.0)), p)  # capped, whatever came back
        if q in review:
            pending[q], row[q] = row[q], PENDING
    row["total"] = sum(row[q] for q, _ in qs if q not in review)
    row["possible"] = sum(p for _, p in qs)
    row["notes"] = list(notes)
    row["flags"] = flags
    row["review"] = "; ".join(
        f"{q}: {pending[q]:g} of {p:g} pending, uses {', '.join(review[q])}" for q, p in qs if q in review
    )
    return row


MAX_NOTEBOOK = 64 << 20  # bytes: a lab notebook with outputs is well under 1 MiB
# cells: a lab has under 100, a student's scratch cells add some dozens. Reading a notebook runs in this
# process, outside any submission's limits: 1,150,000 empty cells (58 MB) took 10 minutes and 7.6 GB
# here before its sandbox started (red team s8), so the count is checked before anything is built
MAX_CELLS = 2000
# JSON objects and lists ("{" and "[", strings' included: an upper bound, counted in milliseconds): building
# them is what costs (1.15 M cells took 39 s to parse here, a lab notebook holds some thousands)
MAX_NESTS = 200_000
MAX_ANSWER = 200_000  # characters of a student's own code compared for similarity


def read_submission(path: Path):
    """(notebook, None) or (None, (status, note)) for a file that cannot be graded."""
    if path.suffix.lower() != ".ipynb":
        return None, ("not-a-notebook", f"{path.suffix or 'no extension'}, expected .ipynb")
    if path.stat().st_size > MAX_NOTEBOOK:
        return None, ("corrupt", f"{path.stat().st_size >> 20} MiB: too large for a lab notebook")
    try:
        data = path.read_bytes()
        nests = data.count(b"{") + data.count(b"[")
        if nests > MAX_NESTS:
            return None, ("corrupt", f"{nests} JSON objects and lists: far more than a lab notebook holds")
        raw = json.loads(data.decode("utf-8"))
        cells = raw.get("cells") if isinstance(raw, dict) else None
        if isinstance(cells, list) and len(cells) > MAX_CELLS:
            return None, ("corrupt", f"{len(cells)} cells: more than the {MAX_CELLS} a lab notebook may hold")
        for cell in cells if isinstance(cells, list) else ():
            if isinstance(cell, dict) and cell.get("cell_type") == "code":
                # what the student's run printed is never graded (the notebook runs again): not kept
                cell["outputs"], cell["execution_count"] = [], None
        nb = nbformat.from_dict(raw)
        if not isinstance(nb.get("cells"), list) or nb.get("nbformat") != 4:
            raise ValueError("no cells list or not nbformat 4")
        for cell in nb.cells:  # repair what editors get wrong instead of failing the student
            if not isinstance(cell, dict) or not isinstance(cell.get("source", ""), (str, list)):
                raise ValueError("a cell has no text source")
            if cell.get("cell_type") == "code" and not isinstance(cell.get("outputs"), list):
                cell["outputs"] = []
            elif cell.get("cell_type") != "code":
                cell.pop("outputs", None)
    except UnicodeDecodeError:
        return None, ("corrupt", "not text (not UTF-8)")
    except (ValueError, RecursionError) as e:
        return None, (
            "corrupt",
            f"not a notebook: {str(e).splitlines()[0][:120] if str(e) else type(e).__name__}",
        )
    return nb, None


def _code(nb) -> list[str]:
    return [
        "".join(c.source) if isinstance(c.source, list) else c.source
        for c in nb.cells
        if c.get("cell_type") == "code"
    ]


def graded_functions(lab: str) -> dict[str, set[str]]:
    """{question: the names its hidden tests call}, as the lab's contract declares them."""
    return {q.name: {t.function for t in q.tests} for q in contract(lab).questions()}


def _exercise_answers(nb, lab: str) -> dict[str, str]:
    """{"ex1": the student's own code of exercise 1, ...}, each cut at MAX_ANSWER characters; {} where
    the notebook's code cannot be read (it is graded all the same: a copy check never stops a run)."""
    try:
        answers = similarity.exercise_answers(nb, read_nb(student_path(lab)), graded_functions(lab))
    except Exception:  # noqa: BLE001 - a submission's text must not abort the class's run
        return {}
    return {ex: code[:MAX_ANSWER] for ex, code in answers.items()}


def answer_text(nb, lab: str) -> str:
    """The lines a student wrote: code lines of the submission that the released notebook does not have."""
    given = {ln.strip() for src in _code(read_nb(student_path(lab))) for ln in src.splitlines()}
    return "\n".join(
        ln for src in _code(nb) for ln in src.splitlines() if ln.strip() and ln.strip() not in given
    )


def solution_notebook(lab: str):
    """The source without its markers: the notebook a perfect student hands in."""
    nb = read_nb(source_path(lab))
    nb.cells = [c for c in nb.cells if c.cell_type != "raw"]
    nb.metadata["otter"] = {"assignment_name": lab}
    return nb


class Run:
    """One grading run: its private folder (removed even when interrupted) and the harness processes it started."""

    _uids = itertools.count()
    _lock = threading.Lock()

    def next_uid(self) -> int:
        with self._lock:
            return sandbox.UID_BASE + next(self._uids) % sandbox.UID_COUNT

    def __init__(self, mode: str = "bwrap"):
        self.mode = mode  # the sandbox: "bwrap", or "user", the fallback without namespaces (sandbox.py)
        self.dir = Path(tempfile.mkdtemp(prefix=RUN_PREFIX))
        (self.dir / "owner.pid").write_text(str(os.getpid()))
        self.procs: set[int] = set()  # the harnesses running: each leads a process group of its own
        self.closing = False
        self._cases: dict[str, Path] = {}
        self._server: subprocess.Popen | None = None
        self._zygote: subprocess.Popen | None = None
        self._zygote_path: str | None = None
        self._asked = 0  # calls of zygote(): the workers asked for
        self.planned = 0  # the notebooks the run will grade, where known (grading_run)
        # the warm start (tools/grader/zygote.py): bubblewrap as root, unless BBH_ZYGOTE=0
        self.warm = mode == "bwrap" and os.geteuid() == 0 and os.environ.get("BBH_ZYGOTE", "1") != "0"

    def start_harness(self, spec: Path, lab: str) -> int:
        """Start a harness on ``spec`` (its folder is its working directory); its pid. Forked by one
        server per run (``harness.py serve``) that has imported torch and the lab's contract once."""
        with self._lock:
            if self._server is None or self._server.poll() is not None:
                self._server = subprocess.Popen(
                    [sys.executable, str(ROOT / "tools" / "grader" / "harness.py"), "serve"],
                    cwd=self.dir,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            self._server.stdin.write(json.dumps([str(spec), lab]) + "\n")
            self._server.stdin.flush()
            reply = self._server.stdout.readline()
            if not reply.strip().isdigit():
                raise RuntimeError("the harness server stopped")
            pid = int(reply)
            self.procs.add(pid)
            return pid

    def zygote(self, at_once: bool = False) -> str | None:
        """The socket of this run's zygote, or None: the worker then starts cold, as ``python worker.py``.
        It starts, importing torch once, at the first call where the run will grade two notebooks or more
        (``planned``), else at the second (``at_once``: the first): a run that grades one notebook (a
        Gradescope submission with a set time limit) would only pay that import twice."""
        if not self.warm:
            return None
        with self._lock:
            if self._zygote_path and self._zygote.poll() is not None:  # it died: the rest start cold
                self._zygote_path = None
                print(
                    f"[grade] the warm start stopped (exit {self._zygote.returncode}): the rest start cold",
                    flush=True,
                )
            self._asked += 1
            if self._zygote is None and max(self._asked, self.planned) < 2 and not at_once:
                return None
            if self._zygote is None:
                import socket

                path = str(self.dir / "zygote.sock")  # in the run's folder: root's alone
                log = self.dir / "zygote.log"  # what it refused, and why
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener, log.open("wb") as err:
                    listener.bind(path)
                    listener.listen(64)
                    self._zygote = subprocess.Popen(
                        [sys.executable, "-I", str(ROOT / "tools" / "grader" / "zygote.py")],
                        stdin=listener.fileno(),
                        stdout=subprocess.PIPE,
                        stderr=err,
                        env=sandbox.environment(),
                        cwd="/",
                        start_new_session=True,
                    )
                ready = (
                    select.select([self._zygote.stdout], [], [], 180)[0] and self._zygote.stdout.readline()
                )
                if ready == b"ready\n":
                    self._zygote_path = path
                else:
                    self._zygote.kill()
                    self._zygote.wait()
                    why = (log.read_text(errors="replace").strip().splitlines() or ["no reason given"])[-1][
                        :160
                    ]
                    print(
                        f"[grade] the warm start did not start ({why}): each worker imports torch itself",
                        flush=True,
                    )
            return self._zygote_path

    def hidden_cases(self, lab: str) -> Path:
        """The lab's hidden cases and the references' outputs on them, drawn once for the whole run
        (each harness would draw them again: about 1 s of a lab 8 submission's 3.3), in this run's
        private folder, where no submission reaches."""
        with self._lock:
            if lab not in self._cases:
                path = self.dir / f"{lab}.cases.pickle"
                with path.open("wb") as f:
                    pickle.dump(contract(lab).hidden_state(), f)
                self._cases[lab] = path
            return self._cases[lab]

    def kill_all(self) -> None:
        for pid in list(self.procs):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)

    def close(self) -> None:
        for server in (self._server, self._zygote):
            if server is not None:
                server.kill()
                server.wait()
        self.kill_all()
        remove_tree(self.dir)


def wait_for(pid: int, timeout: float) -> bool:
    """Whether the process ``pid`` (not our child: the harness server's) ended within ``timeout`` s."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # already ended and reaped
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def remove_stale_runs() -> None:
    """Folders of grading runs whose process is gone (killed with SIGKILL): removed."""
    for d in Path(tempfile.gettempdir()).glob(RUN_PREFIX + "*"):
        try:
            pid = int((d / "owner.pid").read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            remove_tree(d)


# what the worker needs before any submission can be graded: torch, IPython and the course's helpers;
# and what it must not have: a route to the network, a view of the paths given as arguments (the lab
# sources, the run's folder). A UDP socket's connect sends nothing: it only needs a route.
PROBE = """import json, os, socket, sys
out = {}
try:
    import torch, IPython, helpers
    out["helpers"] = getattr(helpers, "__file__", None) or str(list(helpers.__path__))
except BaseException as e:
    out["error"] = f"{type(e).__name__}: {str(e)[:160]}"
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("192.0.2.1", 9))
    out["network"] = True
except OSError:
    out["network"] = False
out["readable"] = [p for p in sys.argv[1:] if os.access(p, os.R_OK)]
print(json.dumps(out))
"""


def setup_problem(run: Run, unsafe: bool) -> str | None:
    """Why this machine cannot grade anyone (one line, for the instructor), or None.

    The submission's process (in the sandbox, or plain with ``--unsafe``) must import torch, IPython
    and this checkout's ``helpers``: a venv whose editable ``helpers`` points at another checkout
    (not bound into the sandbox) made every student's notebook "crash" with a note blaming them.
    """
    import importlib.util

    home = Path(tempfile.mkdtemp(prefix="probe-", dir=run.dir)) / "home"
    home.mkdir()
    hidden = [SOURCES, SOURCES / "contracts" / "contract.py", run.dir]
    argv = [sys.executable, "-I", "-c", PROBE, *map(str, hidden)]
    if unsafe:
        cmd = sandbox.unsafe_command(argv)
    else:
        cmd = sandbox.command(home, argv, helpers_dir=ROOT / "helpers", uid=run.next_uid(), mode=run.mode)
    ours = ROOT / "helpers" / "__init__.py"
    spec = importlib.util.find_spec("helpers")
    host = Path(spec.origin) if spec is not None and spec.origin else None
    hint = (
        f"this Python ({sys.executable}) imports helpers from {host.parent}, not from this checkout: "
        f"run `pip install -e {ROOT}` with it"
        if host is not None and host.resolve() != ours.resolve()
        else f"check that {sys.executable} has this checkout's helpers installed (`pip install -e {ROOT}`)"
    )
    where = "the submissions' process" if unsafe else "the sandbox"
    try:
        p = subprocess.run(cmd, cwd=home, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return f"{where} did not import torch and the course's helpers within 180 s"
    try:
        got = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        last = (p.stderr.strip().splitlines() or ["no output"])[-1][:160]
        return f"{where} could not start Python ({last})"
    if "error" in got:
        return f"{where} cannot import torch, IPython and the course's helpers ({got['error']}): {hint}"
    if Path(str(got["helpers"])).resolve() != ours.resolve():
        return f"{where} imports helpers from {got['helpers']}, not {ours}: {hint}"
    if not unsafe and got.get("network") is not False:
        return f"{where} reaches the network (a UDP socket connected to 192.0.2.1)"
    if not unsafe and got.get("readable"):
        return f"{where} can read {', '.join(map(str, got['readable']))}: the lab sources and the run's folder must be root's alone"
    return None


def run_harness(run: Run, lab: str, name: str, nb, timeout: float, skip, unsafe: bool, distrust=()) -> dict:
    """Grade one notebook: the worker in the sandbox, the hidden tests in a harness process; its result."""
    work = Path(tempfile.mkdtemp(prefix="sub-", dir=run.dir))
    home, ctl = work / "home", work / "ctl"
    home.mkdir()
    ctl.mkdir()
    # as JSON, not nbformat.write: its schema check runs in pure Python, cell by cell, in this process
    (home / "submission.ipynb").write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    limits = {"cpu_s": int(timeout * 2) + 30}
    zygote = None
    if unsafe:
        worker = sandbox.unsafe_command(sandbox.worker_argv(home), **limits)
    else:
        zygote = run.zygote()
        worker = sandbox.command(
            home,
            sandbox.worker_argv(),
            helpers_dir=ROOT / "helpers",
            uid=run.next_uid(),
            mode=run.mode,
            hold=zygote is not None,
            **limits,
        )
    spec = {
        "source": str(source_path(lab)),
        "worker": worker,
        "timeout": timeout,
        # a hidden test may take a third of the notebook's limit, which scales with how long the
        # solutions took here (at least a minute): a busy machine gave a newcomer's correct lab 3 answer
        # "took too long" on the 5000-deep chain in 4 of 5 notebooks at a fixed minute
        "case_timeout": max(60.0, timeout / 3),
        "skip": list(skip),
        "result": str(ctl / "result.json"),
        "distrust": list(distrust),
        # in bubblewrap the worker has a PID namespace of its own: what a cell starts ends with it
        "reap": not unsafe and run.mode == "bwrap",
        # the harness reads it once, before any of the student's code runs, and hands the same cells
        # to every start of the worker (a notebook that rewrites its file changes nothing)
        "notebook": str(home / "submission.ipynb"),
        "released": str(student_path(lab)),
        "cases": str(run.hidden_cases(lab)),
        "zygote": zygote,
    }
    (ctl / "spec.json").write_text(json.dumps(spec))
    if run.closing:
        raise KeyboardInterrupt("grading stopped")
    pid = None
    try:
        pid = run.start_harness(ctl / "spec.json", lab)
        if not wait_for(pid, timeout + 60):
            return {"status": "timeout"}
        result = Path(spec["result"])
        if result.exists():
            return json.loads(result.read_text())
        return _no_result((ctl / "harness.err").read_bytes() if (ctl / "harness.err").exists() else b"")
    except (OSError, ValueError, RuntimeError):
        return _no_result(b"")
    finally:
        if pid is not None:
            run.procs.discard(pid)
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)  # nothing of this submission outlives its grading
            wait_for(pid, 10)
        remove_tree(work)


def _no_result(err: bytes) -> dict:
    last = (err.decode(errors="replace").strip().splitlines() or [""])[-1][:160]
    return {"status": "crashed", "message": f"the harness stopped without a result ({last})"}


# a path under a grading run's folder, wherever it shows (also as /proc/self/mountinfo shows a bind
# mount's source: relative to its filesystem, e.g. /labs-grade-x/sub-y/home when /tmp is a tmpfs)
_RUN_PATH = re.compile(
    r"(?:/[^\s/'\"]+)*/" + re.escape(RUN_PREFIX) + r"[^\s/'\"]*(?:/sub-[^\s/'\"]*)?(?P<rest>(?:/[^\s'\"]*)?)"
)


def _neutral_run_path(m: re.Match) -> str:
    rest = m.group("rest")
    for host, inside in (("/home", sandbox.HOME), ("/tmp", "/tmp")):
        if rest == host or rest.startswith(host + "/"):
            return inside + rest[len(host) :]
    return "<grading folder>" + rest


def scrub(text: str, more=()) -> str:
    """``text`` with the grading machine's paths in neutral names: a run's folders as the sandbox shows
    them (/home/student, /tmp), the course as <course>, its Python as <python>, ``more`` (the
    submissions and gradebook folders) as <submissions> and <grades>, the home folder as ~."""
    text = _RUN_PATH.sub(_neutral_run_path, text)
    names = {}
    for path, name in [
        (Path.home(), "~"),
        (ROOT, "<course>"),
        (Path(sys.base_prefix), "<python>"),
        (Path(sys.prefix), "<python>"),
        *more,
    ]:
        for p in {str(path), str(Path(path).resolve())}:
            if len(p) > 1:
                names[p] = name
    for p in sorted(names, key=len, reverse=True):
        text = re.sub(re.escape(p) + r"(?![^/\s'\":,;)\]])", lambda _m, n=names[p]: n, text)
    return text


def _clean(note: str, secrets: list[str]) -> str:
    """A note as feedback may show it: one line of printable text, never quoting a hidden test or a solution."""
    note = " ".join("".join(ch if ch.isprintable() else " " for ch in str(note)).split())[:240]
    return (
        "(message withheld: it quotes the lab's hidden material)"
        if any(found(x, note) for x in secrets)
        else note
    )


def _csv_row(row: dict) -> dict:
    """A gradebook row as CSV cells: numbers as %g, lists joined by "; ", every cell through ``_cell``."""
    return {
        k: f"{v:g}" if isinstance(v, float) else _cell("; ".join(v) if isinstance(v, list) else str(v))
        for k, v in row.items()
    }


def _cell(value: str) -> str:
    """A CSV field a spreadsheet shows as text: no control characters, no leading = + - @ (a formula)."""
    value = "".join(ch if ch.isprintable() else " " for ch in value)
    return "'" + value if value[:1] in ("=", "+", "-", "@") else value


def grade_submission(
    run: Run, lab: str, sub, qs, timeout: float, skip, unsafe: bool, secrets
) -> tuple[dict, dict]:
    """One gradebook row and the details for feedback; never raises for a bad submission."""
    graded = str(sub.path.name)
    notes = [sub.note] if sub.note else []
    nb, bad = read_submission(sub.path)
    if bad:
        return _row(sub.student, bad[0], qs, notes=notes + [bad[1]], graded=graded), {}
    verdict, note = identify(nb, lab)
    if verdict == "wrong-lab":
        return _row(sub.student, "wrong-lab", qs, notes=notes + [note], graded=graded), {}
    notes += [note] if note else []
    nb.metadata.setdefault("otter", {})["assignment_name"] = lab
    answer = answer_text(nb, lab)
    out = run_harness(run, lab, sub.student, nb, timeout, skip, unsafe)
    # each exercise's code, as the harness read it (under the submission's limits), cut for comparing
    got = out.get("answers") if isinstance(out.get("answers"), dict) else {}
    answers = {str(q): v[:MAX_ANSWER] for q, v in got.items() if isinstance(v, str)}
    # what the harness read in the student's own cells that could reach around the grader's checks
    flags = [str(x) for x in out.get("reach", []) if isinstance(x, str)]
    detail = {"questions": out.get("questions", {}), "answer": answer, "answers": answers}
    if out.get("status") in ("timeout", "crashed"):
        cell = out.get("cell")
        where = (
            f", in cell {cell[0]} (`{cell[1]}`)"
            if isinstance(cell, list)
            and len(cell) == 2
            and isinstance(cell[0], int)
            and isinstance(cell[1], str)
            else ""
        )
        msg = (
            f"still running at the notebook's time limit ({timeout:.0f} s){where}: an infinite loop, "
            "or cells that each ran to their own limit?"
            if out["status"] == "timeout"
            else "the notebook's process died before it could be graded (os._exit, a segfault, out of memory?)"
        )
        return _row(
            sub.student,
            out["status"],
            qs,
            notes=notes + [msg],
            graded=graded,
            flags="; ".join(f"uses {f}" for f in flags),
        ), detail
    notes += [
        f"cell {e['cell']}: {e['ename']}" + (f": {e['evalue']}" if e.get("evalue") else "")
        for e in out["errors"]
    ]
    edited = [n for n in out.get("edited", []) if isinstance(n, int)]
    notes += [
        f"cell {n}: a given cell you changed: it ran as you wrote it, and only your lines in it were "
        "read as your code"
        for n in edited
    ]
    notes += out["notes"]
    scores = {q: v["score"] for q, v in out["questions"].items()}
    review = {q: [str(x) for x in v] for q, v in (out.get("review") or {}).items() if q in dict(qs)}
    flag_text = "; ".join(
        (
            [
                f"uses {', '.join(flags)} (can reach around the grader's checks: by-hand exercises "
                "wait for your review; look at it)"
            ]
            if flags
            else []
        )
        + ([f"edited given cells {', '.join(map(str, edited))}"] if edited else [])
        + ([f"{len(sub.others) + 1} notebooks handed in"] if sub.others else [])
    )
    return _row(
        sub.student,
        out["status"],
        qs,
        scores,
        [_clean(n, secrets) for n in notes],
        graded,
        flag_text,
        review,
    ), detail


FEEDBACK_TAIL = [
    "Run your notebook top to bottom and read the self-check lines: each exercise's",
    "self-check names what is wrong. The hidden tests call the same functions on other inputs.",
]


def feedback_parts(lab: str, row: dict, detail: dict, qs, skipped=()) -> dict:
    """A student's feedback in parts: "head" (title, score, status), "questions" ({question: its line}),
    "skipped" (lines), "notes" (their notes); ``feedback_text`` and the Gradescope results join them."""
    head = [
        f"{title(read_nb(student_path(lab))) or lab}: feedback for {row['submission']}",
        f"Score: {row['total']:g} / {row['possible']:g}   (status: {row['status']}: "
        f"{STATUS_HELP[row['status']]})",
    ]
    qd = detail.get("questions", {})
    lines = {}
    for q, pts in qs:
        d = qd.get(q)
        tests = f"{d['passed']} of {d['cases']} hidden tests pass" if d else "not graded"
        got = "review" if row[q] == PENDING else f"{row[q]:g}"
        lines[q] = f"  {q:<6} {got} / {pts:g}   {tests}" + (
            "   (points pending your instructor's review)" if row[q] == PENDING else ""
        )
    skipped_lines = [f"  {q:<6} optional this time: not graded, not counted" for q in skipped]
    return {"head": head, "questions": lines, "skipped": skipped_lines, "notes": list(row["notes"])}


def feedback_text(lab: str, row: dict, detail: dict, qs, skipped=()) -> str:
    """What a student reads: status, points per exercise, how many hidden tests passed, their own errors."""
    parts = feedback_parts(lab, row, detail, qs, skipped)
    lines = parts["head"] + [""] + list(parts["questions"].values()) + parts["skipped"]
    if parts["notes"]:
        lines += ["", "Notes:"] + [f"  {n}" for n in parts["notes"]]
    lines += [""] + FEEDBACK_TAIL
    return "\n".join(lines) + "\n"


def graded_questions(lab: str, skip=()) -> list[tuple[str, float]]:
    """The lab's [(question, points)] without the ones the instructor made optional (``skip``)."""
    qs = questions(lab)
    unknown = sorted(set(skip) - {q for q, _ in qs})
    if unknown:
        raise SystemExit(
            f"{lab} has no question {', '.join(unknown)}; its questions: {', '.join(q for q, _ in qs)}"
        )
    return [(q, p) for q, p in qs if q not in skip]


def grading_report() -> tuple[str, int, float]:
    """Per lab: its points, the hidden tests generated from its contract, its by-hand questions; (text, tests, points)."""
    lines, n_tests, total = [], 0, 0.0
    for lab in labs():
        qs = contract(lab).questions()
        tests, pts = sum(len(q.tests) for q in qs), sum(q.points for q in qs)
        n_tests, total = n_tests + tests, total + pts
        by_hand = [q.name for q in qs if q.by_hand]
        lines.append(
            f"{lab}: {pts:g} points, {tests} hidden tests (one per case class), all run in the harness; "
            f"by hand: {', '.join(by_hand) or 'none'}"
        )
    lines.append(f"all labs: {total:g} points, {n_tests} hidden tests, none in the student's process")
    return "\n".join(lines), n_tests, total


def _ensure_ignored(path: Path) -> None:
    """A gradebook written inside the repository is git-ignored (grades are never committed by accident)."""
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        return
    gi = ROOT / ".gitignore"
    lines = gi.read_text().splitlines() if gi.exists() else []
    if "/" + rel.as_posix() not in lines:
        gi.write_text("\n".join(lines + ["/" + rel.as_posix()]) + "\n")


def calibrated_timeout(run: Run, lab: str, qs, skip, unsafe: bool) -> tuple[float, float, str | None]:
    """(CALIBRATION × the seconds the published solutions take to grade here, within [TIMEOUT_FLOOR,
    DEFAULT_TIMEOUT]; those seconds; why grading cannot go on, or None): the solutions graded first, as
    a notebook is.
    They must score every point: anything less is this machine's or this checkout's problem, not a
    student's, and nobody is graded on it."""
    t0 = time.monotonic()
    out = run_harness(run, lab, "solutions", solution_notebook(lab), DEFAULT_TIMEOUT, skip, unsafe)
    took = time.monotonic() - t0
    got = {q: (out.get("questions", {}).get(q) or {}).get("score", 0) for q, _ in qs}
    short = [f"{q} {got[q]:g} of {p:g}" for q, p in qs if got[q] < p]
    if out.get("status") not in ("ok", None) or short:
        why = ", ".join(short) or out.get("status", "?")
        return DEFAULT_TIMEOUT, took, f"the published solutions do not score full marks here ({why})"
    return min(DEFAULT_TIMEOUT, max(TIMEOUT_FLOOR, CALIBRATION * took)), took, None


def all_secrets() -> list[str]:
    """Every lab's solution snippets: a note quoting one is withheld (``_clean``)."""
    return sorted({x for other in labs() for x in secret_snippets(read_nb(source_path(other)))})


@contextlib.contextmanager
def grading_run(
    lab: str,
    qs,
    timeout: float | None,
    skip=(),
    unsafe: bool = False,
    mode: str = "bwrap",
    notebooks: int = 1,
):
    """A grading run, ready: (the Run, the time limit per notebook). Refuses (SystemExit, one line) where
    the sandbox (``mode``: "bwrap", or "user", the fallback) cannot hold, where the grader's own setup is
    broken, or where the published solutions do not score every point; stops its processes and removes
    its folder however it ends. ``grade`` and the Gradescope runner both grade in one, ``notebooks``
    submissions in all: with the published solutions, two or more start warm (``Run.zygote``)."""
    reason = sandbox.missing_reason() if mode == "bwrap" else sandbox.user_mode_reason()
    if reason and not unsafe:
        raise SystemExit(f"refusing to grade: {reason}")
    if unsafe:
        print("WARNING: --unsafe: submissions run without a sandbox, as you, with your files in reach")
    remove_stale_runs()
    run = Run(mode)
    run.planned = notebooks + (timeout is None)  # the solutions, graded first when calibrating
    try:
        problem = setup_problem(run, unsafe)  # the grader's own setup first: nobody is graded on a broken one
        if problem:
            raise SystemExit(f"refusing to grade: {problem}")
        if timeout is None:
            timeout, took, problem = calibrated_timeout(run, lab, qs, skip, unsafe)
            if problem:
                raise SystemExit(f"refusing to grade: {problem}")
            print(
                f"[grade] time limit per notebook: {timeout:.0f} s ({CALIBRATION} × the {took:.1f} s the "
                f"published solutions took here, {TIMEOUT_FLOOR} to {DEFAULT_TIMEOUT} s; --timeout S sets it)"
            )
        yield run, timeout
    finally:
        run.closing = True
        run.kill_all()
        run.close()


def grade_one(
    run: Run, lab: str, sub, qs, timeout: float, skip, unsafe: bool, secrets, where
) -> tuple[dict, dict]:
    """One submission graded: its gradebook row, notes without the grading machine's paths (``where``:
    more (path, name) for ``scrub``), and the details for feedback. What ``grade`` calls per student."""
    row, detail = grade_submission(run, lab, sub, qs, timeout, skip, unsafe, secrets)
    row["notes"] = [scrub(n, where) for n in row["notes"]]
    return row, detail


def similarity_flags(lab: str, results: list) -> tuple[list[dict], dict[str, list[str]]]:
    """(flagged pairs, {submission: ["near-identical to B (0.97)", ...]}) for ``results`` [(row, detail)]."""
    # a student named like the solutions' pseudo-submission is renamed in the report, not a crash
    label = {
        row["submission"]: row["submission"]
        + (" (a student)" if row["submission"] == similarity.SOLUTIONS else "")
        for row, _ in results
    }
    # exercise by exercise, against the class's own pairs (tools/grader/similarity.py: calibrated on
    # tests/data/similarity's honest corpus); the released notebook's code is nobody's own work
    answers = {label[row["submission"]]: d.get("answers", {}) for row, d in results}
    sol = _exercise_answers(solution_notebook(lab), lab)
    pairs = similarity.similarity_pairs(answers, sol, given=similarity.given_code(read_nb(student_path(lab))))
    unlabel = {v: k for k, v in label.items()}
    for p in pairs:
        p["a"], p["b"] = unlabel.get(p["a"], p["a"]), unlabel.get(p["b"], p["b"])
    flagged: dict[str, list[str]] = {}
    for p in sorted(
        pairs, key=lambda p: p["b"] != similarity.SOLUTIONS
    ):  # a copy of the solutions named first
        for a, b in ((p["a"], p["b"]), (p["b"], p["a"])):
            flagged.setdefault(a, []).append(f"near-identical to {b} ({p['similarity']:.2f})")
    return pairs, flagged


def grade(
    lab: str,
    subs_dir: Path,
    out_csv: Path | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    jobs: int = 1,
    feedback_dir: Path | None = None,
    skip=(),
    unsafe: bool = False,
) -> list[dict]:
    """Grade every student's notebook in an LMS export folder: a CSV row each, a feedback file each, a similarity report.

    Questions in ``skip`` (made optional) get no column and count neither in ``total`` nor in ``possible``.
    ``timeout`` None: ``calibrated_timeout`` (the command's default).
    """
    if not unsafe and sandbox.missing_reason():
        raise SystemExit(f"refusing to grade: {sandbox.missing_reason()}")
    try:
        subs = collect.collect(subs_dir)
    except collect.CollectError as e:
        raise SystemExit(str(e)) from None
    qs = graded_questions(lab, skip)
    skipped = [q for q, _ in questions(lab) if q in skip]
    out_csv = Path(out_csv) if out_csv else default_out(lab)
    fb = Path(feedback_dir) if feedback_dir else out_csv.with_name(out_csv.stem + "_feedback")
    similarity_csv = out_csv.with_name(out_csv.stem + "_similarity.csv")
    secrets = all_secrets()
    fields = (
        ["submission", "status"]
        + [q for q, _ in qs]
        + ["total", "possible", "graded_file", "notes", "flags", "review"]
    )
    where = ((subs_dir, "<submissions>"), (out_csv.parent, "<grades>"), (fb, "<grades>"))
    # the rows so far, as each submission's grading ends (no similarity flags yet: those need the class)
    progress = out_csv.with_name(out_csv.stem + "_in_progress.csv")
    with grading_run(lab, qs, timeout, skip, unsafe, notebooks=len(subs)) as (run, timeout):
        results = _grade_all(
            run, lab, subs, qs, timeout, jobs, skip, unsafe, secrets, where, progress, fields
        )
    pairs, flagged = similarity_flags(lab, results)
    rows = [r for r, _ in results]
    for r in rows:
        similar = flagged.get(r["submission"], [])
        if len(similar) > 3:
            similar = similar[:3] + [f"and {len(similar) - 3} more (see {similarity_csv.name})"]
        r["flags"] = "; ".join(filter(None, [r["flags"], *similar]))
    for path in (out_csv, fb, similarity_csv, similarity_csv.with_suffix(".html")):
        path.parent.mkdir(parents=True, exist_ok=True)
        _ensure_ignored(path)
    with out_csv.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow(_csv_row(r))
    progress.unlink(missing_ok=True)  # the gradebook is complete
    similarity.write_report(pairs, similarity_csv, cell=_cell)
    fb.mkdir(parents=True, exist_ok=True)
    for row, detail in results:
        (fb / f"{row['submission']}.txt").write_text(
            feedback_text(lab, row, detail, qs, skipped), encoding="utf-8"
        )
    for r in rows:
        print(
            _cell(
                f"{r['submission']:<32} {r['status']:<14} {r['total']:g}/{r['possible']:g}  {'; '.join(r['notes'])[:100]}"
            )
        )
    print(f"gradebook: {out_csv}   feedback: {fb}/   similarity: {similarity_csv} ({len(pairs)} pairs)")
    return rows


def _grade_all(run, lab, subs, qs, timeout, jobs, skip, unsafe, secrets, where, progress, fields) -> list:
    """[(row, detail)] of every submission, ``jobs`` at once, each row written to ``progress`` as it ends."""
    pool = cf.ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        progress.parent.mkdir(parents=True, exist_ok=True)
        _ensure_ignored(progress)
        results: list = [None] * len(subs)
        with progress.open("w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            f.flush()  # the header is there before anyone is graded
            futures = {
                pool.submit(grade_one, run, lab, s, qs, timeout, skip, unsafe, secrets, where): i
                for i, s in enumerate(subs)
            }
            for done in cf.as_completed(futures):
                results[futures[done]] = done.result()
                w.writerow(_csv_row(dict(results[futures[done]][0])))
                f.flush()
    finally:  # interrupted too: start nothing more, stop what runs (grading_run then removes the folders)
        run.closing = True
        pool.shutdown(wait=False, cancel_futures=True)
        run.kill_all()
        pool.shutdown(wait=True)
    return results


# ----------------------------------------------------------------------- main


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="tools/labs.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("release", help="regenerate the student notebooks")
    r.add_argument("labs", nargs="*")
    r.add_argument("--no-execute", action="store_true", help="skip executing the notebooks")
    rec = sub.add_parser("record", help="record a lab's public cases from its contract (helpers/data/)")
    rec.add_argument("labs", nargs="*")
    sub.add_parser("check-stale", help="fail if a committed student notebook is stale or leaks")
    sub.add_parser("grading-report", help="per lab: points, hidden tests, by-hand questions")
    g = sub.add_parser("grade", help="grade a folder of submitted notebooks")
    g.add_argument("lab")
    g.add_argument("submissions", type=Path)
    g.add_argument(
        "--out",
        type=Path,
        default=None,
        help="gradebook CSV (default: ~/backprop-by-hand-grades/LAB/gradebook.csv, outside the repository)",
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds per notebook (default: {CALIBRATION} × what the published solutions take to grade "
        f"here, {TIMEOUT_FLOOR} to {DEFAULT_TIMEOUT} s)",
    )
    g.add_argument("--jobs", type=int, default=1, help="notebooks graded at once")
    g.add_argument("--feedback", type=Path, default=None, help="folder for feedback files")
    g.add_argument(
        "--skip-question",
        action="append",
        default=[],
        metavar="NAME",
        help="a question made optional (e.g. ex6): no column, not in total or possible; repeatable",
    )
    g.add_argument(
        "--unsafe",
        action="store_true",
        help="grade without the sandbox (where bubblewrap is missing): submissions can read and write your files",
    )
    gs = sub.add_parser("gradescope", help="write a lab's Gradescope autograder zip (labs/instructors.md)")
    gs.add_argument("lab")
    gs.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the zip (default: ~/backprop-by-hand-grades/LAB/gradescope_autograder.zip, outside the repository)",
    )
    gs.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds per notebook (default: as grade: {CALIBRATION} × what the published solutions take "
        "to grade there, measured for each submission)",
    )
    gs.add_argument("--skip-question", action="append", default=[], metavar="NAME", help="as for grade")
    gs.add_argument(
        "--visibility",
        default="after_due_date",
        help="when students see each exercise's hidden-test results: after_due_date (default), "
        "after_published, visible or hidden",
    )
    a = ap.parse_args(argv)
    if a.cmd == "gradescope":
        sys.modules.setdefault("labs", sys.modules[__name__])  # gradescope.py imports this module as labs
        gradescope = module_at("gradescope", ROOT / "tools" / "grader" / "gradescope.py")
        out = gradescope.build(resolve_lab(a.lab), a.out, a.timeout, a.skip_question, a.visibility)
        print(
            f"gradescope autograder: {out} ({out.stat().st_size >> 10} KiB; it holds the solutions: upload it, never publish it)"
        )
        return 0
    if a.cmd == "release":
        for lab in [resolve_lab(x) for x in a.labs] or labs():
            release(lab, execute=not a.no_execute)
        return 0
    if a.cmd == "record":
        for lab in [resolve_lab(x) for x in a.labs] or labs():
            record_contract(lab)
        return 0
    if a.cmd == "check-stale":
        use_this_python()
        problems = [
            p
            for lab in labs()
            for p in ([stale(lab)] + [f"{lab}: student notebook contains {s!r}" for s in leaks(lab)])
            if p
        ]
        print("\n".join(problems) or f"student notebooks up to date: {', '.join(labs())}")
        return 1 if problems else 0
    if a.cmd == "grading-report":
        print(grading_report()[0])
        return 0
    if a.cmd == "grade":
        # a grading killed with SIGTERM still removes its folders and stops its sandboxes
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        grade(
            resolve_lab(a.lab),
            a.submissions,
            a.out,
            a.timeout,
            a.jobs,
            a.feedback,
            skip=a.skip_question,
            unsafe=a.unsafe,
        )
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
