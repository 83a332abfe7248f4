"""Mistake catalogs: typical wrong answers to each lab exercise, run through its self-check and hidden tests.

    python tools/mutants.py [lab ...]      # every mutant's verdicts, then the catalog's size and kill rates

A catalog sits beside its lab's source, ``labs/source/labNN_name.mutants.yml`` (hidden like the
solutions), one entry per typical mistake::

    - exercise: ex1
      mistake: the KV-cache alignment used for causal=True     # what a learner did
      replace:                                                 # (old, new) edits of the solution
        - ['shift = Nk - Nq if align == "bottom_right" else 0', 'shift = Nk - Nq']
      says: "top_left mask (3, 6)"                             # optional: the ✗ line names the cause
      checked_by: ex5      # optional: edit this exercise's solution, judge by another's checks
      known: "the KV-cache alignment"  # optional, labs with a contract (labs/source/contracts/): its outputs
                                       # on the public cases are recorded, and its ✗ says "… matches <known>"
      honest: true         # optional: not a mistake but an honest answer written otherwise, which
                           # must pass (✓, every hidden test) like the solution

Each ``old`` must occur exactly once in the exercise's solution cells.  A mutant is *caught by
the self-check* when the exercise's self-check prints a ✗ line (a crash of the self-check cell
itself does not count), and *caught by the hidden tests* when at least one of the exercise's
hidden tests (generated from its contract) fails.  The mutants are ours, not a student's, so they run in this process:
the lab's source runs once, and each mutant re-runs only its exercise's solution, self-check
and tests on a copy of the namespace as it stood before that exercise.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import yaml

import labs as labtools  # noqa: E402  (beside this file)

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ROOT / "labs" / "source"


@dataclass
class Exercise:
    name: str
    before: dict = field(default_factory=dict)  # the namespace before its solution ran
    solution: list[str] = field(default_factory=list)  # code of its solution cells
    selfcheck: list[str] = field(
        default_factory=list
    )  # code cells between END QUESTION and the next question
    tests: list = field(
        default_factory=list
    )  # its hidden tests (contract.HiddenTest), from the lab's contract


@dataclass
class Verdict:
    lab: str
    exercise: str
    mistake: str
    selfcheck: str  # the self-check's ✓/✗/· lines for this exercise, or the crash
    caught_by_selfcheck: bool
    tests_failed: int
    tests_total: int
    says: str | None
    named: bool | None  # None when the catalog does not ask for a cause
    # (exercise, case class) of each failing hidden test
    hidden_failed: frozenset = frozenset()
    namespace: dict = field(default_factory=dict, repr=False)  # after the solution (or mutant) ran

    @property
    def caught_by_tests(self) -> bool:
        return self.tests_failed > 0


def catalog_path(lab: str) -> Path:
    return SOURCES / f"{lab}.mutants.yml"


def labs_with_catalogs() -> list[str]:
    return sorted(p.name[: -len(".mutants.yml")] for p in SOURCES.glob("lab*.mutants.yml"))


def _runnable(code: str) -> str:
    """Notebook code as plain Python: IPython magics and shell lines become ``pass``."""
    return "\n".join(re.sub(r"^(\s*)[%!].*$", r"\1pass", line) for line in code.splitlines())


def _run(code: str, ns: dict) -> str:
    """Execute code in ns; return what it printed."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_runnable(code), "<lab cell>", "exec"), ns)  # noqa: S102 - our own lab sources
    return out.getvalue()


def _copy(ns: dict) -> dict:
    """A copy of a namespace whose tensors are cloned (a mutant that edits its inputs spoils no other)."""
    import torch

    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in ns.items()}


def exercises(lab: str) -> dict[str, Exercise]:
    """Run the lab's source top to bottom and cut it into exercises (hidden tests from its contract)."""
    nb = nbformat.read(SOURCES / f"{lab}.ipynb", as_version=4)
    tests = {q.name: q.tests for q in labtools.contract(lab).questions()}
    ns: dict = {"__name__": "__lab__"}
    out: dict[str, Exercise] = {}
    for question, where, cell in labtools.regions(nb):
        if where.startswith("marker:"):
            if where == "marker:prompt" and question not in out:  # the question starts
                out[question] = Exercise(question, tests=tests[question])
            elif where == "marker:solution" and not out[question].before:
                out[question].before = _copy(ns)
            continue
        current = out.get(question)
        if where == "solution":
            current.solution.append(cell.source)
        elif where == "selfcheck":
            current.selfcheck.append(cell.source)
        _run(cell.source, ns)
    return out


def _verdict_lines(printed: str) -> list[str]:
    return [ln for ln in printed.splitlines() if ln[:1] in ("✓", "✗", "·")]


def run_one(
    lab: str, ex: Exercise, solution: list[str], mistake: str, says: str | None, earlier: list[str] = ()
) -> Verdict:
    """The exercise's self-check and hidden tests against ``solution`` (its cells' code).

    ``earlier``: an earlier exercise's (edited) solution cells, run first, for a mistake made
    there that only this exercise's checks can see (lab 10's causal masking lives in ex2's code).
    """
    ns = _copy(ex.before)
    try:
        for code in [*earlier, *solution]:
            _run(code, ns)
        lines = _verdict_lines("".join(_run(code, ns) for code in ex.selfcheck))
        shown = " | ".join(lines) or "(no ✓/✗ line)"
        caught = any(ln.startswith("✗") for ln in lines)
    except Exception as e:  # noqa: BLE001 - a self-check that crashes is not a caught mutant
        shown, caught = f"self-check crashed: {type(e).__name__}: {e}", False
    failed, classes = 0, set()
    for test in ex.tests:
        try:
            _run(test.code, _copy(ns))
        except Exception:  # noqa: BLE001 - any failure of a hidden test takes points
            failed += 1
            classes.add((test.exercise, test.case_class))
    named = None if says is None else (caught and says in shown)
    return Verdict(
        lab, ex.name, mistake, shown, caught, failed, len(ex.tests), says, named, frozenset(classes), ns
    )


def _mutate(code: list[str], edits: list, where: str) -> list[str]:
    out = list(code)
    for old, new in edits:
        hits = [i for i, c in enumerate(out) if old in c]
        if len(hits) != 1 or out[hits[0]].count(old) != 1:
            raise ValueError(
                f"{where}: expected {old!r} exactly once in the solution, found it "
                f"{sum(c.count(old) for c in out)} times"
            )
        out[hits[0]] = out[hits[0]].replace(old, new)
    return out


def run_lab(lab: str) -> tuple[list[Verdict], list[Verdict]]:
    """(controls, mutants): the unchanged solutions and the catalog's honest variants (``honest: true``,
    an answer written otherwise: must pass), then every catalogued mistake."""
    exs = exercises(lab)
    catalog = yaml.safe_load(catalog_path(lab).read_text()) or []
    controls = [run_one(lab, ex, ex.solution, "(the solution)", None) for ex in exs.values()]
    mutants = []
    for i, entry in enumerate(catalog):
        where = f"{catalog_path(lab).name} entry {i + 1} ({entry.get('mistake', '?')})"
        if entry.get("exercise") not in exs:
            raise ValueError(
                f"{where}: exercise: expected one of {sorted(exs)}, got {entry.get('exercise')!r}"
            )
        edited = _mutate(exs[entry["exercise"]].solution, entry["replace"], where)
        if entry.get("honest"):  # an honest answer written otherwise: it must pass, as the solution does
            controls.append(run_one(lab, exs[entry["exercise"]], edited, entry["mistake"], None))
            continue
        judge = entry.get("checked_by", entry["exercise"])
        if judge not in exs:
            raise ValueError(f"{where}: checked_by: expected one of {sorted(exs)}, got {judge!r}")
        if judge == entry["exercise"]:
            verdict = run_one(lab, exs[judge], edited, entry["mistake"], entry.get("says"))
        else:
            verdict = run_one(
                lab, exs[judge], exs[judge].solution, entry["mistake"], entry.get("says"), edited
            )
        mutants.append(verdict)
    return controls, mutants


def summary(mutants: list[Verdict]) -> str:
    """One line: the catalog's size and what caught how many."""
    n = len(mutants)
    by_self = sum(v.caught_by_selfcheck for v in mutants)
    by_tests = sum(v.caught_by_tests for v in mutants)
    asked = [v for v in mutants if v.named is not None]
    named = sum(bool(v.named) for v in asked)
    labs = len({v.lab for v in mutants})
    pct = (lambda k: f"{100 * k / n:.0f}%") if n else (lambda k: "n/a")
    return (
        f"mistake catalog: {n} mutants over {labs} labs; self-check ✗ on {by_self} ({pct(by_self)}), "
        f"hidden tests fail on {by_tests} ({pct(by_tests)}), cause named on {named} of {len(asked)} asked"
    )


def main(argv: list[str]) -> int:
    labs = argv or labs_with_catalogs()
    everything, bad = [], 0
    for lab in labs:
        controls, mutants = run_lab(lab)
        for v in controls:
            ok = not v.caught_by_selfcheck and not v.caught_by_tests and v.selfcheck.startswith("✓")
            bad += not ok
            print(
                f"{'ok ' if ok else 'BAD'} {lab} {v.exercise} {v.mistake}: {v.selfcheck}  "
                f"[hidden tests failed {v.tests_failed}/{v.tests_total}]"
            )
        for v in mutants:
            ok = v.caught_by_selfcheck and v.caught_by_tests and v.named is not False
            bad += not ok
            print(
                f"{'ok ' if ok else 'BAD'} {lab} {v.exercise} {v.mistake}: {v.selfcheck}  "
                f"[hidden tests failed {v.tests_failed}/{v.tests_total}]"
                + ("" if v.named is None else f" [cause {'named' if v.named else 'NOT named'}: {v.says!r}]")
            )
        everything += mutants
        if len(labs) > 1:
            print(f"[{lab}] {summary(mutants)}")
    print(summary(everything))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
