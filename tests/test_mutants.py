"""Mistake catalogs (tools/mutants.py): every typical wrong answer turns its self-check into ✗ and loses points."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
import mutants  # noqa: E402

LABS = mutants.labs_with_catalogs()


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
            if e.get("honest"):  # an honest variant: it must pass, so it names no cause and is no mistake
                assert "says" not in e and "known" not in e, (lab, e)
                continue
            says = str(e.get("says", ""))
            assert says and not says.endswith("is wrong") and not any(g in says for g in GENERIC), (
                f"{lab}: {e['mistake']!r} needs a says: naming its cause, got {says!r}"
            )
            judge = e.get("checked_by", e["exercise"])
            counts[judge] = counts.get(judge, 0) + 1
        graded = [q for q, points in labtools.questions(lab) if points > 0]
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


def test_every_cataloged_lab_has_a_contract():
    assert CONTRACT_LABS == LABS


@pytest.mark.slow
@pytest.mark.parametrize("lab", CONTRACT_LABS)
def test_with_a_contract_the_self_check_says_x_if_and_only_if_the_hidden_tests_take_points(lab, figure):
    """The lab's source runs once (tools/mutants.py); each solution gets ✓ and passes every hidden test;
    each catalogued mistake, run through the notebook's self-check cell and the hidden tests, gets ✗
    naming its cause and loses points; and class by class, the self-check fails a class (on its public
    cases) if and only if that class's hidden test failed in the same run."""
    import contract

    from helpers import labcontract

    controls, verdicts = mutants.run_lab(lab)
    wrong = [
        v for v in controls if v.caught_by_selfcheck or v.caught_by_tests or not v.selfcheck.startswith("✓")
    ]
    assert not wrong, "\n".join(f"{v.exercise} {v.mistake}: {v.selfcheck} [{v.tests_failed}]" for v in wrong)
    unnamed = [v for v in verdicts if v.named is False]
    assert not unnamed, "\n".join(
        f"{v.exercise} {v.mistake}: {v.selfcheck} [cause NOT named: {v.says!r}]" for v in unnamed
    )
    off = [v for v in verdicts if v.caught_by_selfcheck != v.caught_by_tests]
    missed = [v for v in verdicts if not v.caught_by_selfcheck and not v.caught_by_tests]
    assert not off and not missed, "\n".join(
        f"{v.exercise} {v.mistake}: {v.selfcheck} [hidden tests failed {v.tests_failed}/{v.tests_total}]"
        for v in off + missed
    )

    c, data = contract.load(lab), labcontract.load(lab)
    pairs, apart = 0, []
    for v in verdicts:
        for ex in c.of_question(v.exercise):
            fn = v.namespace[ex.function]
            spec = data["exercises"][ex.name]
            for k in spec["classes"]:
                public = any(labcontract._run_case(fn, case, spec)[0] != "pass" for case in k["cases"])
                hidden = (ex.name, k["name"]) in v.hidden_failed
                pairs += 1
                if public != hidden:
                    apart.append(
                        f"{ex.name} {v.mistake}: self-check ✗ {public}, hidden ✗ {hidden} when {k['name']}"
                    )
    classes = {e: len(x.classes) for e, x in c.exercises.items()}
    figure(
        f"[{lab}] {len(verdicts)} mutants: self-check ✗ if and only if the hidden tests take points on "
        f"{len(verdicts) - len(off)} of {len(verdicts)}; case classes per exercise {classes}; "
        f"class by class, self-check and hidden tests agree on {pairs - len(apart)} of {pairs} (mutant, class) "
        f"pairs; {mutants.summary(verdicts)}"
    )
    # a class whose public case cannot see what its hidden cases see is a gap in the self-check:
    # give the class a public case that shows it, or split the class
    assert not apart, "\n".join(apart)
