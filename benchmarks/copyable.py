"""How much of each graded answer a learner could copy instead of derive (issue 35's measure).

For every graded exercise: the statements of the published solution (the code its graded functions run,
as the copy check reads it: ``tools/grader/similarity.py``, names canonicalised, so a renamed copy counts)
with at least MIN_TOKENS tokens, and how many of them stand, same shape, in what the learner reads before
the last hint: the code of the chapters up to the lab's, every ``helpers/`` module, and the code in the
lab's hints but the last. Statements the lab's given cells hold are left out (they are not the answer).

    python benchmarks/copyable.py             # the table, and the totals
    python benchmarks/copyable.py --json benchmarks/results/copyable.json

A figure, not a verdict: a statement found elsewhere may be a common line (``return out``), and a
formula printed in prose is not code; the totals say how far the labs are from "nothing to copy".
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT)]
from grader import similarity  # noqa: E402

import labs  # noqa: E402

MIN_TOKENS = 8  # shorter statements (x = a + b) are everyone's


def shapes(code: str) -> set[tuple]:
    """The statements of ``code`` with at least MIN_TOKENS tokens, as canonical token tuples."""
    return {tuple(t) for t, _, _ in similarity.statements(code) if len(t) >= MIN_TOKENS}


def hint_code(lab: str) -> list[str]:
    """The code in every hint but each exercise's last: fenced blocks and inline spans of 12+ characters."""
    out = []
    for c in labs.read_nb(labs.student_path(lab)).cells:
        if c.cell_type == "markdown":
            for h in re.findall(r"<details>(.*?)</details>", c.source, re.S)[:-1]:
                out += re.findall(r"```(?:python)?\n(.*?)```", h, re.S) + re.findall(r"`([^`\n]{12,})`", h)
    return out


def readable(lab: str) -> dict[tuple, str]:
    """{statement shape: where the learner reads it} before the lab's last hints."""
    n = int(lab[3:5])
    where: dict[tuple, str] = {}
    for nb in sorted((ROOT / "chapters").glob("*.ipynb")):
        if int(nb.name[:2]) <= n:
            for c in json.loads(nb.read_text())["cells"]:
                if c["cell_type"] == "code":
                    for s in shapes("".join(c["source"])):
                        where.setdefault(s, f"chapters/{nb.name}")
    for py in sorted((ROOT / "helpers").glob("*.py")):
        for s in shapes(py.read_text()):
            where.setdefault(s, f"helpers/{py.name}")
    for code in hint_code(lab):
        for s in shapes(code):
            where.setdefault(s, f"{lab} hints")
    return where


def measure(lab: str) -> list[dict]:
    """One row per graded exercise: statements, how many the learner can read elsewhere, and where."""
    given = set().union(
        *(shapes(c.source) for c in labs.read_nb(labs.student_path(lab)).cells if c.cell_type == "code")
    )
    where = readable(lab)
    rows = []
    for q, code in labs._exercise_answers(labs.solution_notebook(lab), lab).items():
        own = shapes(code) - given
        found = sorted({where[s] for s in own if s in where})
        n_found = sum(1 for s in own if s in where)
        rows.append({"lab": lab, "exercise": q, "statements": len(own), "found": n_found, "where": found})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    rows = [r for lab in labs.labs() for r in measure(lab)]
    for r in rows:
        print(
            f"{r['lab'][:5]} {r['exercise']:<4} {r['found']:>2}/{r['statements']:<2}  {', '.join(r['where'])}"
        )
    total, found = sum(r["statements"] for r in rows), sum(r["found"] for r in rows)
    half = sum(1 for r in rows if r["statements"] and 2 * r["found"] >= r["statements"])
    print(
        f"\n{found} of {total} solution statements ({found / max(total, 1):.0%}) stand, same shape, where the "
        f"learner reads before the last hint; {half} of {len(rows)} exercises have half or more there"
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "found": found, "statements": total}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
