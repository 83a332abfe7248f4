"""Mistake catalogs (tools/mutants.py): every typical wrong answer turns its self-check into ✗ and loses points."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import mutants  # noqa: E402

LABS = mutants.labs_with_catalogs()


@pytest.mark.slow
def test_every_cataloged_mistake_is_caught(capsys):
    """One process for all labs (torch imported once): every solution passes, and each mutant gets ✗
    naming its cause in one line and fails a hidden test."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "mutants.py"), *LABS],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
    )
    lines = out.stdout.splitlines()
    bad = [ln for ln in lines if ln.startswith("BAD")]
    assert out.returncode == 0 and not bad and lines, "\n".join(bad) or out.stderr[-3000:]
    assert all(f"[{lab}] mistake catalog:" in out.stdout for lab in LABS), out.stdout[-3000:]
    with capsys.disabled():  # each catalog's size and kill rate, and the total, in the test log
        print("\n" + "\n".join(ln for ln in lines if ln.startswith(("[", "mistake catalog"))))


GENERIC = ("largest error", "entries off")  # says: must name a cause, not only the wrong output


def test_the_catalogs_are_big_enough_and_well_formed():
    """At least five mistakes judged by each graded exercise of every cataloged lab; each names its
    edits and the cause its ✗ line gives (not just which output is wrong)."""
    import yaml

    import labs as labtools

    for lab in LABS:
        counts = {}
        for e in yaml.safe_load(mutants.catalog_path(lab).read_text()):
            assert {"exercise", "mistake", "replace"} <= set(e), (lab, e)
            assert all(len(edit) == 2 for edit in e["replace"]), (lab, e)
            says = str(e.get("says", ""))
            assert says and not says.endswith("is wrong") and not any(g in says for g in GENERIC), (
                f"{lab}: {e['mistake']!r} needs a says: naming its cause, got {says!r}"
            )
            judge = e.get("checked_by", e["exercise"])
            counts[judge] = counts.get(judge, 0) + 1
        graded = [
            q for q, points in labtools.questions(labtools.read_nb(labtools.source_path(lab))) if points > 0
        ]
        assert all(counts.get(q, 0) >= 5 for q in graded), (lab, counts)


def test_a_mutant_that_slips_through_is_reported(tmp_path, monkeypatch):
    """The runner is not vacuous: an edit that changes nothing ('a mistake' that is correct) is reported BAD."""
    lab = LABS[0]
    first = mutants.exercises(lab)
    ex = next(iter(first.values()))
    v = mutants.run_one(lab, ex, ex.solution, "no change at all", None)
    assert not v.caught_by_selfcheck and not v.caught_by_tests


# ---------------------------------------------------------------------------------------------
# Labs with a contract (labs/source/contracts/, labs/README.md "Contracts"): the self-check and the
# hidden tests draw on the same case classes, so a mutant gets ✗ if and only if it loses points.
# ---------------------------------------------------------------------------------------------

CONTRACT_LABS = [lab for lab in LABS if (ROOT / "labs" / "source" / "contracts" / f"{lab}.py").exists()]


@pytest.mark.slow
@pytest.mark.parametrize("lab", CONTRACT_LABS)
def test_with_a_contract_the_self_check_says_x_if_and_only_if_the_hidden_tests_take_points(lab, figure):
    """Each catalogued mistake, run through the notebook's self-check cell and hidden-test cells
    (tools/mutants.py), and class by class: the self-check fails a class if and only if its hidden test fails."""
    import yaml

    sys.path.insert(0, str(ROOT / "labs" / "source" / "contracts"))
    import contract

    from helpers import labcontract

    controls, verdicts = mutants.run_lab(lab)
    assert all(not v.caught_by_selfcheck and not v.caught_by_tests for v in controls)
    off = [v for v in verdicts if v.caught_by_selfcheck != v.caught_by_tests]
    assert not off, "\n".join(f"{v.exercise} {v.mistake}: {v.selfcheck} [{v.tests_failed}]" for v in off)

    c, data = contract.load(lab), labcontract.load(lab)
    pairs, apart = 0, []
    for entry in yaml.safe_load(mutants.catalog_path(lab).read_text()):
        for ex in c.of_question(entry["exercise"]):
            fn = contract.solution_function(lab, ex, entry["replace"])
            spec = data["exercises"][ex.name]
            for k in spec["classes"]:
                public = any(labcontract._run_case(fn, case, spec)[0] != "pass" for case in k["cases"])
                try:
                    c.hidden_check(ex.name, fn, k["name"])
                    hidden = False
                except Exception:  # noqa: BLE001 - any failure of a hidden test takes points
                    hidden = True
                pairs += 1
                if public != hidden:
                    apart.append(
                        f"{ex.name} {entry['mistake']}: self-check ✗ {public}, hidden ✗ {hidden} when {k['name']}"
                    )
    classes = {e: len(x.classes) for e, x in c.exercises.items()}
    figure(
        f"[{lab}] {len(verdicts)} mutants: self-check ✗ if and only if the hidden tests take points on "
        f"{len(verdicts) - len(off)} of {len(verdicts)}; case classes per exercise {classes}; "
        f"class by class, self-check and hidden tests agree on {pairs - len(apart)} of {pairs} (mutant, class) pairs"
    )
    # a class whose public case cannot see what its hidden cases see is a gap in the self-check:
    # give the class a public case that shows it, or split the class
    assert not apart, "\n".join(apart)
