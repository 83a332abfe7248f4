"""One contract per exercise: what a lab's self-check and its hidden tests both check, declared once.

A lab's contract module (``labs/source/contracts/labNN_name.py``, instructor side: not released,
not on the site) declares, per exercise, the function's name and signature, the reference
solution and the **case classes**: one per promise of the prompt (a shape, a flag value, a
default, an edge value), each named in words that read after "fails when". A class draws its
free parameters (shapes, reps, eps, …) from a ``hypothesis`` strategy, run from a fixed seed
(``@seed``, no example database), so the cases are the same on every run; the values in its
tensors come from ``helpers.device.randn`` with a seed per case.

* The first ``public`` cases of every class are the self-check's: ``record`` writes them, with
  the reference's outputs, to ``helpers/data/labNN_name.contract.json`` (values only), which
  ``helpers.labcontract.check_contract`` reads in the student's notebook.
* The next ``hidden`` cases of the same class are the hidden tests': ``Contract.questions()``
  generates one ``HiddenTest`` per class, ``hidden_check(lab, exercise, fn, class name)``, which
  the grader's harness runs against the reference computed here (the lab source holds no test).
* Known mistakes: a mutant of the lab's catalog (``labs/source/labNN_name.mutants.yml``) with a
  ``known:`` label is run on the public cases at record time; its outputs are recorded beside
  the reference's, and the self-check's ✗ says "grad_x matches <label>" when an answer equals one.

    python tools/labs.py release lab02     # records helpers/data/lab02_chain_rule.contract.json first
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import hypothesis.strategies as st
import torch

ROOT = Path(__file__).resolve().parents[3]
from helpers.labcontract import _AMOUNT as bounds_of  # noqa: E402  (the rules measured per case)
from helpers.labcontract import (  # noqa: E402  (one owner: the student side's)
    DATA,
    RULES,
    ByHand,
    _boundary,
    _changed,
    _clone,
    _differs,
    _versions,
    broken_rule,
    by_hand,
    decode,
    disagreement,
    encode,
    failed_part,
    measured,
    not_by_hand,
    not_in_place,
    rule_bounds,
    run_probe,
    two_per_entry,
    unguarded,
)
from helpers.labcontract import load as load_recorded  # noqa: E402  (the committed helpers/data JSON)

HERE = Path(__file__).resolve().parent
SOURCES = ROOT / "labs" / "source"


@dataclass
class Case:
    """One call: the arguments, and what a ✗ may use to name the cause (factors, terms)."""

    args: tuple
    kwargs: dict = field(default_factory=dict)
    factors: dict = field(default_factory=dict)  # {"R": 15}: labcheck names "1/R × the expected value"
    terms: dict = field(default_factory=dict)  # {"grad_X": {"the skip path": tensor}}
    options: dict = field(default_factory=dict)  # the probe's options: {"grad_output": tensor, "wrt": (0, 1)}


@dataclass
class CaseClass:
    """A promise of the prompt: its name in words, a strategy for its free parameters, a case maker."""

    name: str  # reads after "fails when": "X is 1-D (in,)"
    strategy: Any  # a hypothesis strategy
    make: Callable[[Any, int], Case]  # (drawn parameters, seed) -> Case
    public: int = 1
    hidden: int = 2
    atol: float = 1e-10
    rtol: float = 1e-8
    # stated rules measured on this class's cases only (a size where a rule bites on every draw), over
    # the exercise's own (Exercise.rules)
    rules: dict = field(default_factory=dict)


# an honest backward written otherwise (loops, a float64 copy, the forward recomputed) writes a few times
# the entries a derived one does; finite differences write (input entries) × (a forward pass) of them
WORK_FACTOR = 10


# the large class's stated rules (helpers.labcontract.BY_HAND_RULES): the entries written, the values read out,
# the comparisons read out; breaking one costs the exercise
BY_HAND_WORK = {"writes": WORK_FACTOR, "exits": WORK_FACTOR, "branches": two_per_entry}


def no_nonlinearity(*args, **kwargs) -> int:
    """The "nonlinear" bound of a backward whose nonlinearity is given (P = softmax(Z)): a derived one
    evaluates none, where a difference of softmax along grad_P evaluates log P and two softmaxes."""
    return 0


def no_directional_difference(bound: Callable) -> dict:
    """The large class's rules where the Jacobian is symmetric (softmax): a difference along the upstream
    gradient is then the whole product, for two more passes of the forward, so the entries that exp, log,
    softmax and such compute are bounded too (``bound``: of the case's arguments; the references here go
    through autograd at log P, so no factor of theirs would do)."""
    return {**BY_HAND_WORK, "nonlinear": bound}


def large_class(
    sizes: str,
    make: Callable[[int], Case],
    rules: dict = BY_HAND_WORK,
    claim: str = "the work grows with the sizes, not with their product",
    **tol,
) -> CaseClass:
    """The prompt's "by hand, no finite differences", measured: one case large enough that one forward pass
    per input entry writes hundreds of times the entries a derived backward writes (rule "writes";
    ``rules``: more of them, as ``no_directional_difference``; ``claim``: what the label promises)."""
    return CaseClass(
        f"the tensors are large ({sizes}): {claim}",
        st.integers(0, 10),  # no free size: the draw only moves the seed
        lambda i, seed: make(seed + i),
        public=1,
        hidden=1,
        rules=rules,
        **tol,
    )


@dataclass
class Exercise:
    name: str  # "ex2": the question's name in the source ("ex1b" for a question's second function)
    function: str  # the name the notebook defines and the grader calls
    signature: (
        str  # "(X, W, grad_Y)": checked against the notebook's def ("(torch.autograd.Function)" for a class)
    )
    title: str  # "Exercise 2 · dense_backward"
    reference: Callable
    outputs: tuple
    classes: list
    question: str = ""  # the source's question, if not `name` (a question with two graded functions)
    probe: str | None = None  # a helpers.labcontract.PROBES name: how a case calls the answer
    # the prompt lets the answer change its arguments: all of them (True: a merge, a clip) or those named
    # (an optimizer step's theta and state, never its gradient g); any other write is a ✗
    in_place: bool | tuple = False
    # the question's points and what its answers may not call ('autograd', dotted reference functions):
    # declared on its first function only (whose name is the question's); its other functions share them
    points: float = 0.0
    by_hand: tuple = ()
    calls: tuple = ()  # earlier exercises whose functions the answer calls: hidden tests put their references there
    # the prompt's stated rules that values cannot show, measured on every case against the reference's call
    # ({"multiply_adds": 1}: no more than it; helpers.labcontract.RULES)
    rules: dict = field(default_factory=dict)

    def __post_init__(self):
        self.question = self.question or self.name
        unknown = sorted(set(self.rules).union(*(c.rules for c in self.classes)) - set(RULES))
        if unknown:
            raise ValueError(f"{self.name} rules: expected names from {sorted(RULES)}, got {unknown}")

    def rules_of(self, cls: "CaseClass") -> dict:
        """The rules measured on one class's cases: the exercise's, and the class's own over them."""
        return {**self.rules, **cls.rules}

    def bounds(self, case: "Case", ref_seen: dict, rules: dict) -> dict:
        """The measured rules' bounds on one case (``rule_bounds``)."""
        return rule_bounds(rules, materialize(case.args), materialize(case.kwargs), ref_seen)

    def measured_on(self, fn, case: "Case", rules: dict) -> tuple:
        """(fn's outputs on the case, what the call computed: None without rules), on the learner's values."""
        args, kwargs, options = materialize(case.args), materialize(case.kwargs), materialize(case.options)
        return measured(self.probe, fn, args, kwargs, options, rules)

    def outputs_of(self, fn, case: "Case"):
        """fn's outputs on the case (through the probe), on values rebuilt as the learner gets them."""
        args, kwargs, options = materialize(case.args), materialize(case.kwargs), materialize(case.options)
        return run_probe(self.probe, fn, args, kwargs, options)


_ABSENT = object()


def _parameters(signature: str) -> list[str]:
    """The positional parameter names of a declared signature, "(theta, g, buf, lr, momentum=0.0)"."""
    if signature.startswith("(torch."):
        return []
    return [a.arg for a in ast.parse(f"def f{signature}: pass").body[0].args.args]


def _globals_of(fn) -> dict:
    """The namespace fn's code reads its global names from (an autograd.Function's: its forward's)."""
    target = getattr(fn, "forward", fn) if isinstance(fn, type) else fn
    return inspect.unwrap(target).__globals__


def _detached(ref):
    """ref, its tensors handed back detached: an earlier exercise's answer stands in for a by-hand step
    (inside a Function's forward, or a backward written by hand), where nothing it returns is tracked.
    Across the grader's boundary its values come back by value, with requires_grad as the harness's
    autograd left them: detached, they are what the learner's own answer there would have given."""

    def reference(*args, **kwargs):
        out = ref(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            return out.detach()
        if isinstance(out, (tuple, list)):
            return type(out)(o.detach() if isinstance(o, torch.Tensor) else o for o in out)
        if isinstance(out, dict):
            return {k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
        return out

    return reference


def _while(ref, live: list):
    """ref, answering only while live[0] is True (a handle the worker keeps is dead after its check)."""

    def reference(*args, **kwargs):
        if not live[0]:
            raise RuntimeError("this reference answers only while its exercise is graded")
        return ref(*args, **kwargs)

    return reference


def materialize(value):
    """The value as the learner's function gets it: encoded and decoded (a Made becomes its object)."""
    return decode(encode(value))


# how far from a threshold its edge points lie: a comparison against a small epsilon (h > 1e-6, not
# h > 0) or a floor on a norm gives itself away at one of them, whatever epsilon it chose
EDGE_SCALES = (1e-300, 1e-12, 1e-7, 1e-3)


def near(point: float = 0.0, scales=EDGE_SCALES) -> list[float]:
    """A threshold's edge points: the point itself (and −0.0 at 0), then point ± each scale."""
    out = [point] + ([-0.0] if point == 0 else [])
    for d in scales:
        out += [point + d, point - d]
    return out


class _Enough(Exception):
    """Raised inside a draw once it holds its n examples: hypothesis stops generating there."""


def draw(strategy, n: int, key: int) -> list:
    """The first n distinct examples of a hypothesis strategy, the same on every run (seeded, no database)."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    seen: list = []

    @seed(key)
    @settings(
        database=None,
        max_examples=max(50, 20 * n),
        phases=[Phase.generate],
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )
    @given(strategy)
    def collect(value):
        if len(seen) >= n:  # the first n are what the whole run would give (generation is seeded, in order)
            raise _Enough
        if value not in seen:
            seen.append(value)

    try:
        collect()  # stopping at n distinct: 22 s -> 3.5 s for the 437 classes of the eleven labs
    except _Enough:
        pass
    if len(seen) < n:
        raise ValueError(f"the strategy gave {len(seen)} distinct examples, {n} needed")
    return seen


@dataclass
class HiddenTest:
    """One case class of one exercise, graded on its hidden cases: what the grader runs, generated."""

    lab: str
    exercise: str
    function: str  # the notebook's name the test calls
    case_class: str
    in_place: bool | tuple = False  # as Exercise.in_place
    points: float = 0.0
    params: tuple = ()  # the function's positional parameter names (an edit is judged by the name)

    @property
    def code(self) -> str:
        """The test as the harness runs it, in a namespace whose ``function`` is the student's."""
        return (
            "from helpers.labcontract import hidden_check\n"
            f"hidden_check({self.lab[:5]!r}, {self.exercise!r}, {self.function}, {self.case_class!r})\n"
        )


def _and_joined(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _in_words(by_hand: tuple) -> str:
    """A by_hand declaration as a learner reads it: autograd spelled out, torch.nn.functional as F, and a
    family (an optimizer's step, a class's operators) said once."""
    words, rest = [], [b for b in by_hand if b != "autograd"]
    if "autograd" in by_hand:
        words += [
            "autograd (`.backward()`, `torch.autograd.grad`)",
            "a backward pass, Jacobian or finite difference of the course's `helpers` that this lab's code "
            "does not import for you",
        ]
    by_last: dict = {}
    for b in rest:  # torch.optim.SGD.step, torch.optim.Adam.step, ...: "`.step` of any `torch.optim` class"
        head, mid, last = b.rsplit(".", 2) if b.count(".") >= 2 else ("", "", b)
        if mid[:1].isupper():
            by_last.setdefault((head, last), []).append(b)
    family = {b for group in by_last.values() if len(group) >= 3 for b in group}
    words += [f"`.{last}` of any `{head}` class" for (head, last), g in by_last.items() if len(g) >= 3]
    by_owner: dict = {}
    for b in rest:
        if b not in family:
            owner, name = b.rsplit(".", 1)
            by_owner.setdefault(owner, []).append(name)
    for owner, names in by_owner.items():
        if owner.split(".")[-1][:1].isupper() and len(names) >= 3:  # a class's methods: Value's operators
            words.append(f"`{owner}`'s " + ", ".join(f"`{n}`" for n in names))
        else:
            short = owner.replace("torch.nn.functional", "F")
            words += [f"`{short}.{n}`" for n in names]
    return "; ".join(words)


class CaseFailed(AssertionError):
    """A hidden case's failure, with what the student's feedback may say of it: the case class (the
    self-check names the same classes) and the part that failed (``failed_part``, or a stated rule)."""

    def __init__(self, message: str, case_class: str, part: str | None):
        super().__init__(message)
        self.case_class, self.part = case_class, part


@dataclass
class Question:
    """A question of the lab: its name (the gradebook's column), points, guard and hidden tests."""

    name: str
    points: float
    by_hand: tuple = ()
    tests: list = field(default_factory=list)
    # the earlier exercises' functions its answers call, which its hidden tests replace by their references
    replaced: set = field(default_factory=set)


@functools.lru_cache(maxsize=None)
def course_backwards() -> tuple:
    """Every public backward pass, Jacobian and finite-difference tool the course's helpers define, by its
    dotted name (read from the files: importing every helper would bring matplotlib and widgets)."""
    found = []
    for path in sorted((ROOT / "helpers").glob("*.py")):
        if path.stem in ("labcontract", "labcheck", "__init__"):
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if (
                isinstance(node, ast.FunctionDef)
                and not node.name.startswith("_")
                and re.search(r"backward|jacobian|numerical_grad", node.name)
            ):
                found.append(f"helpers.{path.stem}.{node.name}")
    return tuple(found)


def _names_in(dotted: str) -> set:
    """The names a helper function's body mentions (``softmax_backward`` in attention_backward's)."""
    _, module, name = dotted.split(".", 2)
    path = ROOT / "helpers" / f"{module}.py"
    if not path.exists():
        return set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
                n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
            }
    return set()


def given_helpers(lab: str) -> set:
    """The helpers a lab's given cells import by name (``from helpers.attention import attention_backward``):
    tools its prompt hands the learner, so a by-hand exercise may call them unless it names them itself;
    with them, the course's backwards they call in turn (attention_backward calls softmax_backward)."""
    cells = json.loads((SOURCES / f"{lab}.ipynb").read_text(encoding="utf-8"))["cells"]  # what the grader has
    given = set()
    for cell in cells:
        try:
            tree = ast.parse("".join(cell["source"])) if cell["cell_type"] == "code" else None
        except SyntaxError:
            continue
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helpers."):
                given |= {f"{node.module}.{a.name}" for a in node.names}
    backwards, todo = course_backwards(), list(given)
    while todo:
        mentioned = _names_in(todo.pop())
        for b in backwards:
            if b.rsplit(".", 1)[1] in mentioned and b not in given:
                given.add(b)
                todo.append(b)
    return given


class Contract:
    """A lab's exercises and their case classes."""

    def __init__(self, lab: str, exercises: list[Exercise], base_seed: int):
        self.lab = lab
        self.exercises = {e.name: e for e in exercises}
        self.base_seed = base_seed
        self._drawn: dict = {}  # (exercise, class) -> (public, hidden): drawing is seeded, so once suffices
        self._expected: dict = {}  # (exercise, class, k) -> the reference's outputs on hidden case k
        # By construction, not by a list per exercise: an exercise that asks for a gradient by hand may call
        # none of the course's own backward passes but those its lab gives (red team 6: lab 1's backward as
        # helpers.numgrad.linear_backward, lab 10's as helpers.attention.attention_backward, full marks)
        given = given_helpers(lab)
        # as declared, before the line below adds the course's backwards: what the prompt's rule line names
        self.declared = {e.name: e.by_hand for e in exercises}
        for e in exercises:
            if e.question == e.name and "autograd" in e.by_hand:
                more = [b for b in course_backwards() if b not in given and b not in e.by_hand]
                e.by_hand = (*e.by_hand, *more)
        for e in exercises:
            if e.question != e.name:  # a question's later function: its first one declares for both
                if e.points or e.by_hand:
                    raise ValueError(f"{lab} {e.name}: points and by_hand are declared on {e.question}")
                first = self.exercises.get(e.question)
                if first is None:
                    raise ValueError(f"{lab} {e.name}: its question {e.question} is not declared before it")
                e.by_hand = first.by_hand
            elif not e.points > 0:
                raise ValueError(f"{lab} {e.name}: points: expected a number > 0, got {e.points!r}")

    def questions(self) -> list["Question"]:
        """The lab's questions in order: each one's points, guard and hidden tests, from the declarations."""
        out: dict[str, Question] = {}
        for e in self.exercises.values():
            q = out.setdefault(e.question, Question(e.question, e.points, e.by_hand))
            params = tuple(_parameters(e.signature))
            q.tests += [
                HiddenTest(self.lab, e.name, e.function, c.name, e.in_place, params=params) for c in e.classes
            ]
            q.replaced |= {self.exercises[c].function for c in e.calls}
        for q in out.values():
            q.replaced -= {t.function for t in q.tests}
        for q in out.values():  # a question's points are shared evenly by its hidden tests
            for t in q.tests:
                t.points = q.points / len(q.tests)
        return list(out.values())

    def rule_line(self, question: str) -> str:
        """The prompt's paragraph of what a question's answer may not call and which of its calls the hidden
        tests replace, in words, from the declaration (the released notebook carries it: no prose to drift)."""
        exs = self.of_question(question)
        banned = _in_words(self.declared.get(question, ()))
        replaced = [f"`{self.exercises[c].function}`" for e in exs for c in e.calls]
        out = []
        if banned:
            out.append(
                f"**Not allowed here:** {banned}. An answer that calls any of them, directly or through a "
                "function of yours, gets ✗ from the self-check and 0 for the exercise."
            )
        if replaced:
            out.append(
                f"The hidden tests run it with the course's {_and_joined(list(dict.fromkeys(replaced)))} in "
                "place of yours, so a mistake in an earlier exercise costs points there, once."
            )
        return " ".join(out)

    def promise_list(self, question: str) -> str:
        """The self-check's list of what it tries, one bullet per case class, from the declaration (the
        released notebook carries it after the self-check's paragraph: a list written by hand fell behind)."""
        exs = self.of_question(question)
        out = []
        for e in exs:
            head = f"For `{e.function}`, one" if len(exs) > 1 else "One"
            out.append(f"{head} recorded case of each promise, when:\n")
            out += [f"- {c.name}" for c in e.classes]
            out.append("")
        return "\n".join(out).strip()

    def of_question(self, question: str) -> list[Exercise]:
        """The exercises (graded functions) of one question of the source."""
        return [e for e in self.exercises.values() if e.question == question]

    def case_class(self, exercise: str, name: str) -> CaseClass:
        ex = self.exercises[exercise]
        hit = [c for c in ex.classes if c.name == name]
        if not hit:
            raise KeyError(
                f"{self.lab} {exercise}: no case class {name!r}; has {[c.name for c in ex.classes]}"
            )
        return hit[0]

    def cases(self, exercise: str, name: str) -> tuple[list[Case], list[Case]]:
        """(public, hidden) cases of one class, from one seeded draw (drawn once per process)."""
        if (exercise, name) not in self._drawn:
            self._drawn[exercise, name] = self._draw(exercise, name)
        return self._drawn[exercise, name]

    def _draw(self, exercise: str, name: str) -> tuple[list[Case], list[Case]]:
        ex = self.exercises[exercise]
        cls = self.case_class(exercise, name)
        k = [c.name for c in ex.classes].index(name)
        q = list(self.exercises).index(exercise)
        key = self.base_seed + 1000 * q + 50 * k
        params = draw(cls.strategy, cls.public + cls.hidden, key)
        made = [cls.make(p, key + 1 + 5 * i) for i, p in enumerate(params)]
        # hypothesis draws the simplest example first (all sides 1 or 2): a hidden case, not the public one
        return made[1 : 1 + cls.public], made[:1] + made[1 + cls.public :]

    def hidden_state(self) -> dict:
        """Every case drawn and the reference's outputs on every hidden one: what each grading process
        would otherwise compute again (a class of 200 draws once; ``use_hidden_state`` takes it)."""
        for ex in self.exercises.values():
            for cls in ex.classes:
                for k, case in enumerate(self.cases(ex.name, cls.name)[1]):
                    if (ex.name, cls.name, k) not in self._expected:
                        self._expected[ex.name, cls.name, k] = ex.measured_on(
                            ex.reference, case, ex.rules_of(cls)
                        )
        return {"drawn": dict(self._drawn), "expected": dict(self._expected)}

    def use_hidden_state(self, state: dict) -> None:
        """Take the draws and the reference's outputs ``hidden_state`` computed (in the grading run's parent)."""
        self._drawn.update(state["drawn"])
        self._expected.update(state["expected"])

    # ------------------------------------------------------------ hidden tests

    @contextmanager
    def references_in(self, ex: Exercise, fn):
        """While fn is graded, the functions of the earlier exercises it calls (``ex.calls``) are their
        references, so that a mistake there costs points once, in its own exercise. In this process: fn's
        global names. Across the grader's boundary: the worker binds those names to handles on the
        references here (tools/grader/worker.py, bind), which answer only while this check runs."""
        refs = {self.exercises[e].function: _detached(self.exercises[e].reference) for e in ex.calls}
        if not refs:
            yield
            return
        peer = _boundary(fn)
        if peer is not None:
            live = [True]
            peer.request({"op": "bind"}, {n: _while(r, live) for n, r in refs.items()}, True)
            try:
                yield
            finally:
                live[0] = False
                peer.request({"op": "bind"}, {}, True)
            return
        space = _globals_of(fn)
        before = {n: space.get(n, _ABSENT) for n in refs}
        space.update({n: unguarded(r) for n, r in refs.items()})
        try:
            yield
        finally:
            for n, v in before.items():
                if v is _ABSENT:
                    space.pop(n, None)
                else:
                    space[n] = v

    def hidden_check(self, exercise: str, fn, name: str) -> None:
        """Every hidden case of one class: fn's outputs against the reference; AssertionError naming the class."""
        ex = self.exercises[exercise]
        with self.references_in(ex, fn):
            self._hidden_cases(ex, fn, name)

    def _hidden_cases(self, ex: Exercise, fn, name: str) -> None:
        exercise = ex.name
        cls = self.case_class(exercise, name)
        rules = ex.rules_of(cls)
        for k, case in enumerate(self.cases(exercise, name)[1]):
            args, kwargs = materialize(case.args), materialize(case.kwargs)
            given, given_kw = _clone(args), _clone(kwargs)
            versions = _versions(list(given)), {k: _versions(v) for k, v in given_kw.items()}
            answer = by_hand(fn, ex.by_hand) if inspect.isfunction(fn) else fn  # not the harness's handle
            try:
                got, seen = measured(ex.probe, answer, given, given_kw, materialize(case.options), rules)
            except ByHand as e:
                raise AssertionError(f"{ex.title} {e} when {name}") from None
            names = _parameters(ex.signature)  # the grader's handle to the answer tells no names
            changed = (
                []
                if ex.in_place is True
                else not_in_place(ex.in_place, _changed(fn, given, args, given_kw, kwargs, versions, names))
            )
            assert not changed, (
                f"{ex.title} changed its argument(s) {' and '.join(changed)} in place when {name}"
            )
            if (exercise, name, k) not in self._expected:
                self._expected[exercise, name, k] = ex.measured_on(ex.reference, case, rules)
            expected, ref_seen = self._expected[exercise, name, k]
            bounds = ex.bounds(case, ref_seen, rules) if seen is not None else {}
            peer, not_derived = _boundary(fn), not_by_hand(rules, seen, bounds)
            if not_derived and peer is not None:  # right values or not: the exercise's points go (harness.py)
                peer.used.setdefault(peer.exercise, not_derived)
            why = disagreement(got, expected, ex.outputs, cls.atol, cls.rtol)
            part = failed_part(got, expected, ex.outputs, cls.atol, cls.rtol) if why else None
            if why is None and seen is not None:
                why = broken_rule(rules, seen, bounds)
                broken = next((r for r in rules if broken_rule({r: rules[r]}, seen, bounds)), None)
                part = f"the stated rule on {RULES[broken]}" if broken else None
            if why is not None:
                raise CaseFailed(f"{ex.title} fails when {name}: {why}", name, part)

    # ------------------------------------------------------------------ record

    def record(self, known: dict | None = None) -> dict:
        """The public cases with the reference's outputs (and the known mistakes' outputs), as JSON data."""
        known = known if known is not None else known_mistakes(self)
        out = {
            "lab": self.lab,
            "recorded_from": f"labs/source/contracts/{self.lab}.py (python tools/labs.py release {self.lab[:5]})",
            "exercises": {},
        }
        for ex in self.exercises.values():
            classes = []
            for cls in ex.classes:
                cases = []
                for case in self.cases(ex.name, cls.name)[0]:
                    expected, seen = ex.measured_on(ex.reference, case, ex.rules_of(cls))
                    node = {
                        "args": encode(tuple(case.args)),
                        "kwargs": encode(dict(case.kwargs)),
                        "expected": encode(expected),
                        "atol": cls.atol,
                        "rtol": cls.rtol,
                    }
                    if seen is not None:  # the most a call may use here, by the measured rules
                        node["bounds"] = ex.bounds(case, seen, ex.rules_of(cls))
                    if cls.rules:
                        node["rules"] = _rules_json(ex.rules_of(cls))
                    if case.options:
                        node["options"] = encode(dict(case.options))
                    if case.factors:
                        node["factors"] = encode(dict(case.factors))
                    if case.terms:
                        node["terms"] = {o: encode(dict(t)) for o, t in case.terms.items()}
                    wrong = _wrong_outputs(ex, cls, case, expected, known.get(ex.name, {}))
                    if wrong:
                        node["mistakes"] = wrong
                    cases.append(node)
                classes.append({"name": cls.name, "cases": cases})
            out["exercises"][ex.name] = {
                "function": ex.function,
                "title": ex.title,
                "outputs": list(ex.outputs),
                "classes": classes,
            }
            if ex.question != ex.name:
                out["exercises"][ex.name]["question"] = ex.question
            if ex.probe:
                out["exercises"][ex.name]["probe"] = ex.probe
            if ex.in_place:
                out["exercises"][ex.name]["in_place"] = True if ex.in_place is True else list(ex.in_place)
            if ex.by_hand:
                out["exercises"][ex.name]["by_hand"] = list(ex.by_hand)
            if ex.rules:
                out["exercises"][ex.name]["rules"] = _rules_json(ex.rules)
            if ex.calls:  # what the hidden tests replace: the self-check says what a failing one costs where
                out["exercises"][ex.name]["calls"] = list(ex.calls)
        return out

    def stale(self, recorded: dict | None = None) -> list[str]:
        """Where the recorded data is not what this contract records now (at each case's own tolerance)."""
        fresh = json.loads(json.dumps(self.record()))
        return differences(fresh, recorded if recorded is not None else load_recorded(self.lab))

    def write(self) -> Path:
        path = DATA / f"{self.lab}.contract.json"
        path.write_text(json.dumps(self.record(), ensure_ascii=False, indent=None) + "\n", encoding="utf-8")
        return path


def _rules_json(rules: dict) -> dict:
    """Rules as the recorded data holds them: the bounds are per case, so only the names and words."""
    return {
        k: list(v) if isinstance(v, tuple) else "per case" if k in bounds_of else v for k, v in rules.items()
    }


def differences(fresh, have, path: str = "", tol: tuple = (0.0, 0.0), exact: bool = False) -> list[str]:
    """Where two recordings disagree: structure, names and ints exactly; every float (in a tensor or
    not) at the tolerance its check uses, |fresh − have| ≤ atol + rtol·|have| (helpers.checks.close),
    so the last bits that depend on the machine's BLAS path never make a recording stale (``exact``:
    bit for bit, to count what moved)."""
    if not exact and isinstance(have, dict) and "atol" in have and "expected" in have:
        tol = (have["atol"], have["rtol"])  # a case: its values are judged at its class's tolerance
    if isinstance(have, dict) and "tensor" in have:
        if not (isinstance(fresh, dict) and "tensor" in fresh):
            return [f"{path}: a tensor was recorded, now {type(fresh).__name__}"]
        meta, now = ({k: v for k, v in node.items() if k != "tensor"} for node in (have, fresh))
        if meta != now:
            return [f"{path}: recorded {meta}, now {now}"]
        why = _differs(path, decode(fresh), decode(have), *tol)
        return [why] if why else []
    if isinstance(have, dict):
        if not isinstance(fresh, dict) or sorted(fresh) != sorted(have):
            keys = sorted(fresh) if isinstance(fresh, dict) else type(fresh).__name__
            return [f"{path}: recorded keys {sorted(have)}, now {keys}"]
        return [d for k in have for d in differences(fresh[k], have[k], f"{path}/{k}", tol, exact)]
    if isinstance(have, list):
        if not isinstance(fresh, list) or len(fresh) != len(have):
            return [
                f"{path}: recorded {len(have)} items, now {len(fresh) if isinstance(fresh, list) else fresh}"
            ]
        return [
            d
            for i, (f, h) in enumerate(zip(fresh, have))
            for d in differences(f, h, f"{path}/{i}", tol, exact)
        ]
    if isinstance(have, float) and type(fresh) in (float, int):
        why = _differs(path, float(fresh), have, *tol)
        return [why] if why else []
    return (
        [] if type(fresh) is type(have) and fresh == have else [f"{path}: recorded {have!r}, now {fresh!r}"]
    )


def _wrong_outputs(ex: Exercise, cls: CaseClass, case: Case, expected, known: dict) -> dict:
    """{output: {label: value}} of the known mistakes that give a wrong output of the right shape here."""
    from helpers.labcontract import _parts

    out: dict = {}
    exp_parts = _parts(expected, len(ex.outputs))
    for label, fn in known.items():
        try:
            got = ex.outputs_of(fn, case)
        except Exception:  # noqa: BLE001 - a mistake that crashes here needs no recorded value
            continue
        parts = _parts(got, len(ex.outputs))
        if parts is None or disagreement(got, expected, ex.outputs, cls.atol, cls.rtol) is None:
            continue
        for name, g, e in zip(ex.outputs, parts, exp_parts):
            number = type(g) is type(e) and type(e) in (int, float)  # a scale, a count: named like a tensor
            if number or isinstance(g, torch.Tensor) and g.shape == e.shape and g.dtype == e.dtype:
                if disagreement(g, e, (name,), cls.atol, cls.rtol) is not None:
                    out.setdefault(name, {})[label] = g if number else encode(g.detach())
    return out


# ------------------------------------------------------- the source's solutions


def _solutions(lab: str) -> tuple[list[str], dict[str, list[str]]]:
    """(setup code before the first question, {exercise: its solution cells' code}) of the source."""
    import labs as L  # the one reader of the lab format

    setup, sols = [], {}
    for q, where, cell in L.regions(L.read_nb(SOURCES / f"{lab}.ipynb")):
        if where == "setup":
            setup.append(cell.source)
        elif where == "solution":
            sols.setdefault(q, []).append(cell.source)
        elif where == "marker:prompt":
            sols.setdefault(q, [])
    return setup, sols


def solution_function(lab: str, exercise: Exercise, edits=()):
    """The source's solution of one exercise as a function, with a catalog mutant's edits applied."""
    import mutants

    setup, sols = _solutions(lab)
    code = mutants._mutate(sols[exercise.question], edits, f"{lab} {exercise.question}")
    ns: dict = {"__name__": "__contract__"}
    for c in [*setup, *code]:
        mutants._run(c, ns)
    return ns[exercise.function]


def known_mistakes(contract: Contract) -> dict:
    """{exercise: {label: mutant function}} for the catalog entries with a ``known:`` label."""
    import yaml

    path = SOURCES / f"{contract.lab}.mutants.yml"
    entries = yaml.safe_load(path.read_text()) if path.exists() else []
    out: dict = {}
    for e in entries or []:
        for ex in contract.of_question(e["exercise"]) if e.get("known") else ():
            out.setdefault(ex.name, {})[str(e["known"])] = solution_function(contract.lab, ex, e["replace"])
    return out


def load(lab: str) -> Contract:
    """The CONTRACT of labs/source/contracts/<lab>.py."""
    from helpers.labcontract import instructor_module  # the one loader of these modules, by file

    return instructor_module(lab).CONTRACT


def labs_with_contracts() -> list[str]:
    return sorted(p.stem for p in HERE.glob("lab*.py"))
