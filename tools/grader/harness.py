"""The grading harness: the hidden tests run here, in a process that no student code ever runs in.

It starts the submission's worker in the sandbox (``sandbox.py``), which runs the notebook, and
then runs each hidden test of the lab source in this process. A test's references to the
student's functions and classes are ``Remote`` handles (``wire.py``): calling one sends the
arguments by value to the worker and brings the result back by value; arguments the student's
code changed in place are changed here too, so "left its input unchanged" is still tested; a
call on tensors that need gradients becomes a node of this process's autograd graph whose
backward asks the worker, so ``gradcheck`` and ``.backward()`` test a student's
``autograd.Function`` across the boundary. Comparisons (``torch.allclose``, ``assert``) all
run here, on this process's untouched torch. Scores are computed here and capped.

The notebook is read here once, before any of the student's code runs: ``reach.plan`` reads its
cells against the released notebook and the allow-list (what goes to "instructor review"), and
those same cells, not the file, are what every start of the worker runs.

    python harness.py SPEC.json      # SPEC: source, worker command, limits; writes spec["result"]
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

import reach  # noqa: E402  (beside this file, the folder the script runs from)
import sandbox  # noqa: E402
import torch
import wire  # noqa: E402
from torch.autograd.function import once_differentiable

# the exception names feedback may repeat: Python's own and a few of torch's. Any other name is the
# student's choice (a class named after a hidden test's seed), so it reads as "an exception"
SAFE_KINDS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
SAFE_KINDS |= {"ByHandError", "OutOfMemoryError"}
MAX_NOTEBOOK = 64 << 20  # bytes: a lab notebook with outputs is well under 1 MiB


def questions(source_path: Path, cases: str | None = None) -> list:
    """The lab's questions, each with its points, guard and hidden tests, generated from the lab's
    contract (``labs/source/contracts/LAB.py``): one test per case class of each of its functions,
    the question's points shared evenly by them. The source notebook holds no test code. ``cases``:
    a file of the hidden cases the grading run drew once (``Contract.hidden_state``; the run's own)."""
    from helpers.labcontract import instructor_module  # labs/source/contracts: each exercise declared once

    contract = instructor_module(Path(source_path).stem).CONTRACT
    if cases:
        with open(cases, "rb") as f:
            contract.use_hidden_state(pickle.load(f))  # written by tools/labs.py for this run, not a student
    return contract.questions()


def _portable(fn, source: str):
    """Mark a test-defined function so that it crosses as its source (wire.Peer.portable)."""
    fn.__portable_source__ = source
    return fn


class _MarkFunctions(ast.NodeTransformer):
    """Wrap every lambda and def of a test so the function carries its own source text."""

    def __init__(self, code: str):
        self.code = code

    def visit_Lambda(self, node):
        src = ast.get_source_segment(self.code, node)
        self.generic_visit(node)
        return ast.Call(ast.Name("__portable__", ast.Load()), [node, ast.Constant(src)], [])

    def _after_def(self, node):
        src = ast.get_source_segment(self.code, node)
        self.generic_visit(node)
        mark = ast.Expr(
            ast.Call(
                ast.Name("__portable__", ast.Load()), [ast.Name(node.name, ast.Load()), ast.Constant(src)], []
            )
        )
        return [node, mark] if not node.decorator_list else [node]

    visit_FunctionDef = _after_def


def compile_test(code: str, filename: str):
    """The test's code object, its functions marked portable."""
    tree = ast.fix_missing_locations(_MarkFunctions(code).visit(ast.parse(code)))
    return compile(tree, filename, "exec")


def free_names(code: str) -> set[str]:
    """Names a test reads that it does not define itself (the student's functions among them)."""
    tree = ast.parse(code)
    loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loads - set(dir(builtins))


# --------------------------------------------------------------- the student


class Across(torch.autograd.Function):
    """A student's call in this process's autograd graph: its backward is computed by the worker."""

    @staticmethod
    def forward(box, *inputs):
        return tuple(o.detach().clone() for o in box["outs"])

    @staticmethod
    def setup_context(ctx, inputs, output):
        # a dict on ctx, no tensor directly in it: helpers.memory.ctx_attributes finds only ctx.held
        box = ctx.box = inputs[0]
        # keep what the student's graph keeps (inputs and outputs as themselves), so saved-tensor
        # hooks here (SavedTensors) and grad_fn.saved_tensors see what the student's code saved
        entries, storages = box["saved"]
        outs = dict(zip(box["diff"], output))
        kept, held = [], []
        for e in entries:
            if "input" in e:
                t = box["ins"][e["input"]]
            elif "output" in e:
                j = e["output"]
                t = outs[j] if j in outs else box["all_outs"][j]
            else:
                flat = storages[e["storage"]]
                t = torch.empty(0, dtype=e["dtype"]).set_(
                    flat.untyped_storage(), e["offset"], e["shape"], e["stride"]
                )
            (held if e.get("held") is True else kept).append(t)
        ctx.save_for_backward(*kept)
        ctx.held = held  # what the student's ctx held as attributes (`ctx.Z = Z`), held here the same way

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outs):
        box = ctx.box
        aligned = [None] * box["n_all"]
        for i, g in zip(box["diff"], grad_outs):
            aligned[i] = g
        reply = box["peer"].synced({"op": "backward", "graph": box["graph"]}, aligned)
        for entry in reply.get("written") or []:  # the student's backward wrote into a gradient it was given
            i, value = entry if isinstance(entry, list) and len(entry) == 2 else (None, None)
            mine = aligned[i] if isinstance(i, int) and 0 <= i < len(aligned) else None
            if isinstance(mine, torch.Tensor) and isinstance(value, torch.Tensor):
                if value.shape == mine.shape and value.dtype == mine.dtype:
                    mine.copy_(value)  # as the caller's tensor changed there: "changed in place" shows here
        grads = reply["grads"]
        return (None, *[g if isinstance(g, torch.Tensor) else None for g in grads])


def _replace(value, new: iter):
    """``value`` with its tensors replaced, in order, by ``new``'s."""
    if isinstance(value, torch.Tensor):
        return next(new)
    if isinstance(value, (list, tuple)):
        return type(value)(_replace(v, new) for v in value)
    if isinstance(value, dict):
        return {k: _replace(v, new) for k, v in value.items()}
    return value


class InPlaceEdit(Exception):
    """A student's function changed a tensor it was given, where its exercise does not allow it."""


class HarnessPeer(wire.Peer):
    """The harness's end: calls of the student's functions carry the exercise, echo in-place edits, join autograd."""

    exercise: str | None = None
    in_place: bool | tuple = False  # the hidden test's: any argument, those named, or none may change
    params: tuple = ()  # the graded function's positional parameter names
    returned_nothing: set = set()

    forbidden: dict = {}  # question -> the dotted names its by-hand rule forbids
    used: dict = {}  # question -> the first of them the student's code asked this process for

    def serve(self, msg: dict, blobs: list[bytes]) -> None:
        """As wire.Peer.serve; but while a by-hand question is graded, an operator or a method of one of the
        harness's objects that the question forbids (``helpers.micrograd.Value.__mul__`` on the case's
        Values, which live here) is refused and recorded, as the worker's guards do for its own objects."""
        obj = self.objects.get(msg.get("ref")) if msg.get("op") in ("dunder", "getattr") else None
        name = msg.get("name")
        if obj is not None and isinstance(name, str) and self.exercise in self.forbidden:
            what = f"{type(obj).__module__}.{type(obj).__qualname__}.{name}"
            if what in self.forbidden[self.exercise]:
                self.used.setdefault(self.exercise, what)
                self.send(
                    {
                        "kind": "reply",
                        "error": "ByHandError",
                        "message": f"{what} is not allowed in {self.exercise}, which asks for it by hand",
                    }
                )
                return
        super().serve(msg, blobs)

    def synced(self, header: dict, value):
        """A request that shares this process's random stream with the worker (sent along, brought back),
        and brings back what the test's own functions appended to the test's lists there."""
        reply = self.request(header, (value, torch.get_rng_state()), True)
        torch.set_rng_state(reply["rng"])
        self.apply_mutated(reply["mutated"])
        self.apply_echo(
            reply["modules"]
        )  # a call that raised brings back what it left too (hooks on a model)
        if "raised" in reply:
            kind, message = (list(reply["raised"]) + ["", ""])[:2]
            raise wire.RemoteError(str(kind)[:80], str(message)[:300])
        return reply

    def capped(self, fn, args, kwargs, inner, options, budget: int | None, trace: bool = False) -> dict:
        """{"result": the probe's outputs, "over": False}, or {"result": None, "over": True}: fn run through
        the probe ``inner`` in a child of the worker whose address space may grow by ``budget`` bytes (None:
        no limit); with ``trace``, also {"trace": what the call computed} (helpers.labcontract.traced)."""
        value = (fn, tuple(args), dict(kwargs), inner, dict(options or {}), budget and int(budget), trace)
        reply = self.request({"op": "capped", "opts": {"exercise": self.exercise}}, value, True)
        if isinstance(reply, dict) and reply.get("stub") is True:  # the test fails quietly: "not written yet"
            self.returned_nothing.add(self.exercise)
            raise ValueError("the answer is still the stub")
        if isinstance(reply, dict) and self.edits(reply.get("changed") or [], args, kwargs):
            raise InPlaceEdit(f"changed {len(reply['changed'])} of its tensor arguments in place")
        return reply

    def edits(self, changed: list[int], args, kwargs) -> list[str]:
        """The arguments (by name) holding the ``changed`` tensors (indices into ``wire.tensors((args,
        kwargs))``) that the exercise does not let the answer change (``helpers.labcontract.not_in_place``)."""
        from helpers.labcontract import not_in_place

        owners = [
            name
            for name, v in [
                *((self.params[i] if i < len(self.params) else str(i), a) for i, a in enumerate(args)),
                *kwargs.items(),
            ]
            for _ in wire.tensors(v)
        ]
        return not_in_place(
            self.in_place, sorted({owners[i] if i < len(owners) else str(i) for i in changed})
        )

    def call(self, fn, args, kwargs, **opts):
        ins = wire.tensors((args, kwargs))
        track = torch.is_grad_enabled() and any(t.requires_grad for t in ins)
        reply = self.synced(
            {"op": "call", "ref": fn._id, "opts": {"exercise": self.exercise, "track": track}},
            (tuple(args), dict(kwargs)),
        )
        if self.edits([c[0] for c in reply["changed"]], args, kwargs):
            # the test's own tensors stay as they were, so a reference computed after the call is still right
            raise InPlaceEdit(f"changed {len(reply['changed'])} of its tensor arguments in place")
        with torch.no_grad():
            for i, value, grad, same_grad in reply["changed"]:
                t = ins[i]
                if t.shape == value.shape and t.dtype == value.dtype:
                    t.copy_(value)
                else:
                    t.data = value
                if not t.is_leaf:
                    continue
                if same_grad and t.grad is not None and grad is not None and t.grad.shape == grad.shape:
                    t.grad.copy_(grad)  # edited in place there: in place here too
                else:
                    t.grad = grad
        result = reply["result"]
        if wire.stub_value(result):
            self.returned_nothing.add(self.exercise)
        if not track:
            return result
        outs = wire.tensors(result)
        diff = [i for i, o in enumerate(outs) if o.requires_grad]
        grad_ins = [t for t in ins if t.requires_grad]
        if not diff:
            return result
        box = {
            "peer": self,
            "graph": reply["graph"],
            "outs": [outs[i] for i in diff],
            "diff": diff,
            "n_all": len(outs),
            "ins": ins,
            "saved": reply["saved"],
            "all_outs": outs,
        }
        joined = Across.apply(box, *grad_ins)
        for i, o in zip(diff, joined):
            outs[i] = o
        return _replace(result, iter([o if i in diff else o.detach() for i, o in enumerate(outs)]))


class NotebookTimeout(TimeoutError):
    """The notebook was still running at the time limit; ``cell``: (number, first line) of the cell it ran."""

    def __init__(self, cell: tuple | None):
        super().__init__("the notebook was still running at the time limit")
        self.cell = cell


class Student:
    """The submission's worker process, reached through a ``HarnessPeer``."""

    def __init__(
        self,
        argv: list[str],
        forbidden: dict,
        start_timeout: float,
        cell_timeout: float | None = None,
        cells: list[reach.Cell] = (),
        reap: bool = False,
        zygote: str | None = None,
    ):
        if zygote:  # a held sandbox: the zygote forks the worker into it (sandbox.start_held)
            try:
                self.proc, rfile, wfile = sandbox.start_held(argv, zygote, start_timeout)
            except sandbox.WarmStartError:  # the grader's own failure: this submission starts cold
                argv, zygote = sandbox.cold(argv), None
        if not zygote:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            rfile, wfile = self.proc.stdout, self.proc.stdin
        self.peer = HarnessPeer(rfile, wfile)
        self.peer.forbidden = {q: set(names) for q, names in forbidden.items()}
        self.peer.used = {}
        self.peer.returned_nothing = set()
        self.peer.send_code = True
        self.running = None  # (cell number, its first line): the cell the worker said it was starting
        # first lines from the harness's own copy: what the worker says is only a number
        self.lines = {c.number: _first_line(c.source) for c in cells}
        self.peer.handlers = {"progress": self._progress}
        self.peer.deadline = time.monotonic() + start_timeout
        todo = [[c.number, c.source] for c in cells]
        try:
            reply = self.peer.request(
                {"op": "start"},
                {"forbidden": forbidden, "cell_timeout": cell_timeout, "cells": todo, "reap": reap},
                True,
            )
        except TimeoutError:
            self.close()
            raise NotebookTimeout(self.running) from None
        self.peer.handlers = {}
        self.errors = reply.get("errors") if isinstance(reply, dict) else []
        names = self.peer.request({"op": "names"})
        self.names = {n for n in names if isinstance(n, str)} if isinstance(names, list) else set()
        self.peer.deadline = None

    def _progress(self, msg, value) -> None:
        """The worker starts a cell: only its number is taken, and only one the harness sent."""
        if isinstance(value, dict) and value.get("cell") in self.lines:
            self.running = (value["cell"], self.lines[value["cell"]])

    def bind(self, code: str) -> dict:
        """A fresh namespace for one test: builtins, plus handles on the student's names it uses."""
        # zip is strict: `all(... for o, r in zip(answer, reference))` must not pass on an empty answer
        ns = {
            "__builtins__": builtins,
            "__name__": "__hidden_test__",
            "__portable__": _portable,
            "zip": functools.partial(zip, strict=True),
        }
        for name in sorted(free_names(code) & self.names):
            ns[name] = self.peer.request({"op": "get"}, name, True)
        return ns

    def violations(self) -> dict:
        """{question: what the worker's guards saw used there}: a name the question's by-hand list holds,
        else "a function this exercise forbids" (the worker is the student's process: text it sends is
        not repeated to them, where it could carry a hidden test's inputs)."""
        got = self.peer.request({"op": "violations"})
        if not isinstance(got, dict):
            return {}
        return {
            q: what
            if isinstance(what, str) and (what in self.peer.forbidden.get(q, ()) or what == wire.THREAD)
            else "a function this exercise forbids"
            for q, what in got.items()
            if q in self.peer.forbidden
        }

    def close(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        self.proc.wait()
        for f in (self.peer.rfile, self.peer.wfile):
            with contextlib.suppress(OSError):
                f.close()


# ------------------------------------------------------------- comparisons


def _strict(real, mismatched: list):
    """``allclose`` that is False for tensors of different shapes (torch's broadcasts them: a zero-size
    tensor shaped (0, 1, 1, ...) was "close" to every reference, and a (1, n) row to an (m, n) matrix)
    and for tensors with no elements (two empty results are "close" to each other)."""

    def allclose(input, other, *args, **kwargs):
        if isinstance(input, torch.Tensor) and isinstance(other, torch.Tensor):
            # different shapes, or no element at all: nothing was shown to be close
            if input.shape != other.shape or input.numel() == 0:
                mismatched.append((tuple(input.shape), tuple(other.shape)))
                return False
        return real(input, other, *args, **kwargs)

    return allclose


@contextlib.contextmanager
def strict_comparisons(mismatched: list):
    """While a hidden test runs here: ``torch.allclose`` and ``Tensor.allclose`` compare shapes first.

    Only in this process (no student code runs in it), only for the test's duration; the shapes of
    each refused comparison go to ``mismatched``."""
    fn, had = torch.allclose, "allclose" in vars(torch.Tensor)
    method = torch.Tensor.allclose
    torch.allclose = _strict(fn, mismatched)
    torch.Tensor.allclose = _strict(method, mismatched)
    try:
        yield
    finally:
        torch.allclose = fn
        if had:
            torch.Tensor.allclose = method
        else:
            del torch.Tensor.allclose


def _tests(ks: list[int]) -> str:
    """`hidden test 3`, `hidden tests 1, 4`."""
    return f"hidden test {ks[0]}" if len(ks) == 1 else f"hidden tests {', '.join(map(str, ks))}"


# the exceptions a wrong answer raises by mistake, the only ones a hidden test's note names: each name
# is a value the student's code could pick from a hidden input (red team 4: one of 60 built-in classes)
HIDDEN_KINDS = frozenset(
    "TypeError ValueError RuntimeError IndexError AttributeError KeyError NotImplementedError "
    "ZeroDivisionError NameError OverflowError ByHandError OutOfMemoryError".split()
)


def kind(exc: BaseException, hidden: bool = False) -> str:
    """An exception's type name fit for feedback: the student's own class names are not repeated, and in
    a hidden test's note only ``HIDDEN_KINDS`` are."""
    k = exc.kind if isinstance(exc, wire.RemoteError) else type(exc).__name__
    return k if k in (HIDDEN_KINDS if hidden else SAFE_KINDS) else "an exception"


def graded_functions(qs: list) -> dict[str, set[str]]:
    """{question: the names its hidden tests call}."""
    return {q.name: {t.function for t in q.tests} for q in qs}


def read_plan(cells: list, spec: dict, qs: list) -> "reach.Plan":
    """What the grader reads in a submission's cells before any of them runs (``reach.plan``): against
    the released notebook and its earlier releases, each question's graded functions followed, not the
    earlier exercises' its hidden tests replace by their references."""
    return reach.plan(
        cells,
        released_cells(spec, qs),
        {q.name: list(q.by_hand) for q in qs},
        graded_functions(qs),
        earlier_given(spec),
        {q.name: set(q.replaced) for q in qs},
    )


def grade(spec: dict) -> dict:
    """Run every hidden test against the worker; per-question scores, per-case results, notes."""
    qs = questions(Path(spec["source"]), spec.get("cases"))
    skip = set(spec.get("skip", ()))
    forbidden = {q.name: list(q.by_hand) for q in qs if q.by_hand}
    case_timeout = float(spec.get("case_timeout", 60))
    # a cell may take a quarter of the notebook's time (at most a minute): a stray loop costs that cell
    cell_timeout = float(spec.get("cell_timeout") or min(60.0, spec["timeout"] / 4))
    started = time.monotonic()

    try:
        cells = read_cells(spec["notebook"])
    except (OSError, ValueError, RecursionError) as e:
        return {"status": "crashed", "message": f"the notebook could not be read ({type(e).__name__})"}
    # read once: what is checked here is what every start of the worker runs
    checked = read_plan(cells, spec, qs)
    review = _review(checked, qs, spec.get("distrust", ()))

    def start():
        left = spec["timeout"] - (time.monotonic() - started)
        if left <= 1:
            raise TimeoutError("no time left")
        return Student(
            spec["worker"],
            forbidden,
            left,
            cell_timeout,
            checked.cells,
            bool(spec.get("reap")),
            spec.get("zygote"),
        )

    # Every note a hidden test leads to names its exercise: it then shows with that exercise's result,
    # which Gradescope hides until the due date (red team 8 read one bit of a hidden input per submission
    # from a note shown at once: spin in a hidden test when the input says so, and the restart fails).
    result = {"questions": {}, "errors": [], "notes": [], "restarts": 0, "review": {}}
    result["edited"] = [c.number for c in checked.cells if c.kind == "edited"]
    result["reach"] = checked.reach
    try:
        student = start()
    except NotebookTimeout as e:
        return {"status": "timeout", "reach": checked.reach, **({"cell": list(e.cell)} if e.cell else {})}
    except TimeoutError:
        return {"status": "timeout", "reach": checked.reach}
    except (EOFError, wire.WireError, wire.RemoteError, OSError) as e:
        return {"status": "crashed", "reach": checked.reach, "message": f"{type(e).__name__}"}
    result["errors"] = _errors(student.errors)
    for q in qs:
        if q.name in skip:
            continue
        passed, raised, edited, shapes, failed = [], {}, [], [], {}
        student.peer.exercise = q.name
        for k, case in enumerate(q.tests, 1):
            ok, mismatched = False, []
            student.peer.in_place, student.peer.params = case.in_place, case.params
            try:
                student.peer.deadline = time.monotonic() + min(
                    case_timeout, spec["timeout"] - (time.monotonic() - started)
                )
                ns = student.bind(case.code)
                with torch.random.fork_rng(), strict_comparisons(mismatched):
                    torch.manual_seed(0)
                    exec(compile_test(case.code, f"<{q.name} test {k}>"), ns)
                ok = True
            except AssertionError as e:  # the contract's CaseFailed: which class, which part, in our words
                if getattr(e, "case_class", None):
                    failed.setdefault((e.case_class, e.part), []).append(k)
            except InPlaceEdit:
                edited.append(k)
            except (TimeoutError, EOFError, wire.WireError) as e:
                what = "took too long" if isinstance(e, TimeoutError) else "ended the grading process"
                result["notes"].append(f"{q.name}: your code {what} in hidden test {k}")
                student.close()
                result["restarts"] += 1
                try:
                    student = start()
                except Exception:  # noqa: BLE001 - nothing more can be graded
                    result["questions"][q.name] = _score(q, passed)
                    result["notes"].append(
                        f"{q.name}: grading stopped here: the notebook could not be restarted in time"
                    )
                    return _finish(result, qs, skip)
                student.peer.exercise, student.peer.in_place = q.name, case.in_place
                student.peer.params = case.params
            except wire.RemoteError as e:
                raised.setdefault(kind(e, hidden=True), []).append(k)
            except Exception:  # noqa: BLE001 - a wrong return type etc.: the test fails, quietly
                pass
            finally:
                student.peer.deadline = None
            if not ok and mismatched:
                shapes.append(k)
            passed.append(ok)
        student.peer.exercise = None
        used = student.violations().get(q.name) or student.peer.used.get(q.name)
        raised.pop("ByHandError", None)  # said once, below
        if edited:
            result["notes"].append(
                f"{q.name}: your function changed its input tensors in place in {_tests(edited)} "
                "(it must leave them as they were)"
            )
        # A hidden test's note says what happened, never a value the student's code chose: a returned
        # shape or an exception's class picked from the hidden inputs would carry those inputs out
        # (the self-check, on cases the learner sees, prints both shapes and every exception).
        if shapes:
            result["notes"].append(
                f"{q.name}: a result of the wrong shape, or with no elements, in {_tests(shapes)} "
                "(shapes must match: the self-check prints both)"
            )
        if failed:
            said = [f"when {c}" + (f" ({part})" if part else "") for (c, part) in failed]
            more = f"; and {len(said) - 3} more classes" if len(said) > 3 else ""
            ks = sorted(k for v in failed.values() for k in v)
            result["notes"].append(
                f"{q.name}: {_tests(ks)} {'fails' if len(ks) == 1 else 'fail'}: " + "; ".join(said[:3]) + more
            )
        if raised:
            first = min(raised, key=lambda w: raised[w][0])
            ks = sorted(k for v in raised.values() for k in v)
            also = "" if len(raised) == 1 else ", and other exceptions"
            result["notes"].append(f"{q.name}: your code raised {first} in {_tests(ks)}{also}")
        if not any(passed) and q.name in student.peer.returned_nothing and not raised:
            result["notes"].append(
                f"{q.name}: your function returned None (or ...) in every hidden test: not written yet, "
                "or a missing `return`?"
            )
        if used:
            asks = "for the gradient by hand" if used == "autograd" else "you to write it yourself"
            result["notes"].append(f"used {used} in {q.name}, which asks {asks}: 0 points for {q.name}")
        elif q.name in review:
            result["review"][q.name] = review[q.name]
            result["notes"].append(
                f"{q.name}: your code uses {', '.join(review[q.name])}, which this exercise's list of "
                f"allowed operations does not hold: its points wait for your instructor's review"
            )
        if used:
            passed = [False] * len(passed)
            result.setdefault("by_hand", {})[q.name] = used
        result["questions"][q.name] = _score(q, passed)
    student.close()
    return _finish(result, qs, skip)


def _first_line(src: str) -> str:
    """A cell's first non-blank line, printable, at most 60 characters (how notes name a cell)."""
    line = next((ln.strip() for ln in src.splitlines() if ln.strip()), "")[:60]
    return "".join(ch if ch.isprintable() else " " for ch in line)


def read_cells(path) -> list[tuple[int, str]]:
    """The notebook's code cells as (number among all cells from 1, source): read once, for every start."""
    with open(path, "rb") as f:
        raw = f.read(MAX_NOTEBOOK + 1)
    if len(raw) > MAX_NOTEBOOK:
        raise ValueError("notebook too large")
    nb = json.loads(raw.decode("utf-8"))
    out = []
    for n, c in enumerate(nb.get("cells", []) if isinstance(nb, dict) else [], 1):
        if isinstance(c, dict) and c.get("cell_type") == "code":
            src = c.get("source", "")
            out.append((n, "".join(map(str, src)) if isinstance(src, list) else str(src)))
    return out


def released_cells(spec: dict, qs: list) -> list[tuple[str, str | None]]:
    """The released student notebook's code cells as (source, question of an answer cell or None)."""
    source = Path(spec["source"])
    path = Path(spec.get("released") or source.parent.parent / source.name)
    return reach.released_cells(json.loads(path.read_text(encoding="utf-8")), [q.name for q in qs])


def earlier_given(spec: dict) -> dict:
    """The given cells of every release of the lab (labs/source/given_history.json, beside the source)."""
    source = Path(spec["source"])
    path = source.parent / "given_history.json"
    return json.loads(path.read_text(encoding="utf-8")).get(source.stem, {}) if path.exists() else {}


def _review(checked: reach.Plan, qs: list, distrust=()) -> dict[str, list[str]]:
    """{question: the constructs that send it to the instructor}: its own, and what could switch off
    the guards anywhere (for every by-hand question)."""
    out = {q: set(v) for q, v in checked.review.items()}
    anywhere = set(checked.reach) | set(distrust)
    if anywhere:
        for q in qs:
            if q.by_hand:
                out.setdefault(q.name, set()).update(anywhere)
    return {q: sorted(v) for q, v in out.items()}


def _errors(reported) -> list[dict]:
    """The worker's list of cells that raised, as plain one-line records (it comes from the student's process)."""
    out = []
    for e in reported if isinstance(reported, list) else []:
        if isinstance(e, dict) and isinstance(e.get("cell"), int) and isinstance(e.get("ename"), str):
            evalue = e.get("evalue") if isinstance(e.get("evalue"), str) else ""
            ename = e["ename"] if e["ename"] in SAFE_KINDS else "an exception"
            out.append({"cell": e["cell"], "ename": ename, "evalue": evalue[:160]})
        if len(out) >= 50:
            break
    return out


def _score(q, passed: list[bool]) -> dict:
    got = sum(c.points for c, ok in zip(q.tests, passed) if ok)
    return {
        "score": min(round(got, 6), q.points),
        "possible": q.points,
        "passed": sum(passed),
        "cases": len(q.tests),
    }


def _finish(result: dict, qs, skip) -> dict:
    for q in qs:
        if q.name not in skip and q.name not in result["questions"]:
            result["questions"][q.name] = _score(q, [])
    result["status"] = "errors" if result["errors"] else "ok"
    return result


HARNESS_MEMORY = 6 << 30  # bytes of address space: what a submission sends back cannot exhaust the machine


def main(argv: list[str]) -> int:
    import resource

    spec = json.loads(Path(argv[0]).read_text())
    resource.setrlimit(resource.RLIMIT_AS, (HARNESS_MEMORY, HARNESS_MEMORY))
    torch.set_num_threads(1)
    out = grade(spec)
    out["answers"] = answers(spec)
    Path(spec["result"]).write_text(json.dumps(out))
    return 0


def answers(spec: dict) -> dict[str, str]:
    """{question: the student's code its graded functions run} for the copy check
    (``similarity.exercise_answers``), read here, under the submission's limits, not in the grading
    process: a notebook's text never costs the class's run more than its own time."""
    import similarity

    try:
        qs = questions(Path(spec["source"]))
        nb = {"cells": [{"cell_type": "code", "source": src} for _, src in read_cells(spec["notebook"])]}
        released = {"cells": [{"cell_type": "code", "source": r} for r, _ in released_cells(spec, qs)]}
        return similarity.exercise_answers(nb, released, graded_functions(qs))
    except Exception:  # noqa: BLE001 - no answers read: no copy check for this one, its grade stands
        return {}


def serve() -> None:
    """Start harnesses by fork, torch and the contracts already imported (``tools/labs.py``'s ``Run``):
    each line on stdin is [spec path, lab source stem]; the reply line is the new harness's pid.

    A fresh ``python harness.py`` spends about 2.3 s of CPU importing before it grades (on a 2-core
    machine, about a third of a lab 1 submission); forked from here it starts at once. This process
    runs no tensor op, so the child inherits no thread. It ends when its stdin closes (the grading run
    ended, however it ended); a harness it started lives on until its own grading ends.
    """
    import os
    import signal

    from helpers.labcontract import instructor_module

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps them; the run waits with a pidfd
    for line in sys.stdin:
        spec_path, stem = json.loads(line)
        instructor_module(stem)  # imported once here, not once per submission
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setsid()  # its own group: the run ends it and its worker with one killpg
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.chdir(Path(spec_path).parent)
                null = os.open(os.devnull, os.O_RDWR)
                err = os.open("harness.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(null, 0)
                os.dup2(null, 1)
                os.dup2(err, 2)
                sys.stdin = open(os.devnull)  # noqa: SIM115 - the server's stdin is not this child's
                code = main([spec_path])
            except BaseException:  # noqa: BLE001 - the run reads the last line of harness.err
                import traceback

                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        print(pid, flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
