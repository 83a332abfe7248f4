"""Near-identical lab answers: pairs of submissions (or a submission and the published solutions).

Calibrated on honest work (``tests/data/similarity/``: answers written independently from the
prompts, and disguised copies generated from them); a flag means "this pair stands out from the
rest of the class on an exercise with enough code to tell", never "these two wrote the same
obvious three lines".

**What is compared.** Each exercise separately (``exercise_answers``: the code its graded
functions can run, wherever it stands; cells equal to a released cell are not the student's). The code is
normalised so that what a copier changes cheaply does not count:

* parsed (``ast``) and printed back one statement at a time: comments, docstrings, spacing,
  line breaks and redundant parentheses are gone; a compound statement (``def``, ``for``,
  ``if`` ...) is its header, its body statements are units of their own;
* every name the answer binds (parameters, assignments, loop variables, its own functions) is
  numbered by its first occurrence *within the statement* (``grad_h = grad_a * (h > 0)`` and
  ``g = up * (z > 0)`` are both ``v1 = v2 * (v3 > 0)``), so renaming does not count and
  reordering independent statements or functions does not renumber anything; names the answer
  does not bind (``torch``, ``math``, the lab's given variables), attributes and keyword
  names are kept, they are what differs between honest answers (``torch.outer`` vs ``[:, None]``);
  string literals become ``S`` (einsum letters are a free choice);
* code that fails to parse goes through a line tokenizer with the same rules (less exact).

**The figure.** Each statement gives its k-grams of K tokens (a statement shorter than K is one
gram); grams that occur anywhere in the released notebook (the stub's ``def`` line, its
``return``, the self-check cells) are dropped, they are nobody's work. The pair's similarity is
the mean of the two containments (share of a's grams found in b, and of b's in a), in [0, 1].
A renamed, reordered, reformatted copy scores 1.0.

**The flag.** For each exercise the class's own pairwise figures give the scale: the median and
the MAD (scaled by 1.4826 to a standard deviation). A pair is flagged on an exercise when

* both answers have at least ``MIN_TOKENS`` tokens of their own (in statements with a gram that
  is neither given nor the solutions'), so one-liners and short canonical answers are never
  flagged: everyone who gets them right writes the same thing; and
* its figure is at least ``max(FLOOR, min(CEILING, median + K_MAD * max(spread, MIN_SPREAD)))``
  (spread = 1.4826 MAD). With fewer than ``MIN_PAIRS`` pairs of tellable answers the class is
  too small to have a distribution and the threshold is ``SMALL_CLASS_FLOOR``; a class whose
  median is ``UNIFORM`` or more writes one answer, and nothing is flagged on that exercise.

**The published solutions are the expected answer.** The course's hints give the formulas and
its style guide fixes the names (``grad_<name>``), so an honest student who follows the chapter
writes, exercise after exercise, what the solutions write: in the corpus one honest student
matches the solutions at 1.00 on whole exercises of 100+ tokens (lab 6 ex3, lab 7 ex1 and ex3)
and at 0.80-0.93 on others, while disguised copies score 1.00. Hence:

* between students, grams that the solutions' answer to the exercise also contains are dropped
  like the given code: two students who both wrote the canonical answer share nothing that
  counts (and are not tellable), two who share their own way of writing it are;
* against the solutions, one exercise proves nothing; a submission is flagged only when at
  least ``SOLUTION_MIN_EXERCISES`` of its tellable exercises, and ``SOLUTION_SHARE`` of them,
  match at ``SOLUTION_SIM`` or more (the honest corpus: at most 2 of 5, lab 7). Copying one
  exercise of the solutions is therefore not flagged, nor is any copy in lab 1 (one exercise
  long enough to tell): it cannot be told from writing the canonical answer.

The measured numbers behind the constants are printed by ``tests/test_grader_similarity.py -s``
(honest maximum per exercise between students and against the solutions, copies' minimum).
"""

from __future__ import annotations

import ast
import builtins
import copy
import csv
import html
import io
import itertools
import keyword
import re
import statistics
import tokenize
from collections import Counter
from os import PathLike

SOLUTIONS = "(published solutions)"
K = 4  # tokens per gram
MIN_TOKENS = 40  # an answer shorter than this (own tokens) cannot tell a copy from the obvious answer
FLOOR = 0.8  # never flag below this, whatever the class does
CEILING = 0.9  # at or above this a tellable pair is flagged, however wide the class's spread
K_MAD = 3.0  # how far above the class's median, in robust standard deviations
MIN_SPREAD = 0.05  # a class whose answers all score alike still needs a clear margin
UNIFORM = 0.6  # a class median at or above this: everyone writes the same, nothing can be told
MIN_PAIRS = 6  # fewer tellable pairs than this: no distribution, SMALL_CLASS_FLOOR instead
SMALL_CLASS_FLOOR = 0.9
NEVER = 2.0  # the threshold of an exercise that cannot tell
SOLUTION_SIM = 0.95  # an exercise "matches the solutions" at or above this
SOLUTION_SHARE = 0.75  # flagged against the solutions: this share of the tellable exercises match
SOLUTION_MIN_EXERCISES = 2  # ... and at least this many
WHOLE = "all"  # the exercise name of an answer handed in as one text
FIELDS = ("a", "b", "similarity", "threshold", "exercises", "tokens_overlap", "matched_lines")

_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+|\*\*|//|->|[=!<>]=|\S")


# ----------------------------------------------------------------- notebooks -> exercises


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _cells(nb):
    return nb.get("cells", []) if isinstance(nb, dict) else nb.cells


def exercise_answers(nb, released, functions: dict) -> dict[str, str]:
    """{"ex1": code, ...}: each exercise's answer, the student's code its graded functions can run.

    ``functions``: {"ex1": the names the grader calls, ...} (the lab's contract, ``labs.graded_functions``).
    An exercise's answer is every top-level statement of the student's cells that those names can run
    (``reach.live``: the definition, then the helpers and aliases it reads, transitively), wherever it
    stands, less the definitions of another exercise's graded functions (an earlier exercise it calls is
    that exercise's answer; a name several exercises call, the first one's). Headings are not read: code moved above exercise 1, or under a heading
    rewritten (a no-break space in "Exercise 2"), is still the exercise's, and code nothing calls is no
    one's. A cell equal (stripped) to a released cell is given code, not the student's; a cell that does
    not parse ran nothing.
    """
    reach = _reach()
    given = {_source(c).strip() for c in _cells(released) if c.get("cell_type") == "code"}
    nodes = []  # read in the harness, under the submission's limits (harness.answers)
    for c in _cells(nb):
        src = _source(c)
        if c.get("cell_type") != "code" or not src.strip() or src.strip() in given:
            continue
        text = reach.as_run(src)
        tree = _parse(text) if text is not None else None
        nodes += getattr(tree, "body", [])
    owner: dict[str, str] = {}  # a name several exercises call is the first one's (lab 10's tiled_backward)
    for ex, names in functions.items():
        for n in names:
            owner.setdefault(n, ex)
    out = {}
    for ex, names in functions.items():
        foreign = {n for n, o in owner.items() if o != ex}
        ours = [i for i, node in enumerate(nodes) if not (reach.binds(node) & foreign)]
        seen = reach.live([nodes[i] for i in ours], set(names))
        parts = [_plain(nodes[i]) for i in sorted(ours[j] for j in seen)]
        if parts:
            out[ex] = "\n\n".join(parts)
    return out


class _Plain(ast.NodeTransformer):
    """Docstrings and other bare string statements dropped, long strings cut: what a copy pads an
    answer with must not fill the length at which an answer is cut (a 200,000-character comment or
    docstring in each def hid a copy; red team s8)."""

    def visit_Expr(self, node):
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, (str, bytes)):
            return None
        return self.generic_visit(node)

    def visit_Constant(self, node):
        if isinstance(node.value, (str, bytes)) and len(node.value) > 80:
            return ast.copy_location(ast.Constant(node.value[:80]), node)
        return node

    def generic_visit(self, node):
        super().generic_visit(node)
        if getattr(node, "body", None) == []:  # a def whose only statement was its docstring
            node.body = [ast.Pass()]
        return node


def _plain(node: ast.stmt) -> str:
    """A statement as code, comments, docstrings and long strings gone (``_Plain``)."""
    import copy

    try:
        return ast.unparse(ast.fix_missing_locations(_Plain().visit(copy.deepcopy(node))))
    except (RecursionError, ValueError):
        return ""


def given_code(released) -> str:
    """Every code cell of the released notebook: its grams are nobody's own work."""
    return "\n\n".join(_source(c) for c in _cells(released) if c.get("cell_type") == "code")


# ----------------------------------------------------------------- normalisation


def _bound_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return names


def _parse(code: str):
    for text in (code, _dedent_lines(code)):
        try:
            return ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    return None


def _dedent_lines(code: str) -> str:
    return "\n".join(ln.strip() for ln in code.splitlines())


# names code that does not parse is assumed not to bind: modules and the helpers' usual aliases
_LIBRARY = {"torch", "math", "F", "nn", "np", "numpy", "itertools", "functools", "helpers", "collections"}


def bound_names(code: str) -> set[str]:
    """The names an answer binds: from the AST when it parses; when it does not (a syntax error,
    or lines cut out of their ``def``), every identifier except keywords, builtins and _LIBRARY."""
    tree = _parse(code)
    if tree is not None:
        return _bound_names(tree)
    found = set()
    for m in re.finditer(r"(?<![.\w])([A-Za-z_]\w*)", re.sub(r"#.*", "", code)):
        found.add(m.group(1))
    return found - set(keyword.kwlist) - set(dir(builtins)) - _LIBRARY


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[1:]
    return body


_BODIES = ("body", "orelse", "finalbody", "handlers")


def _units(stmts: list[ast.stmt]):
    """(statement text, first line, last line) for each simple statement and compound header."""
    for s in _strip_docstring(list(stmts)):
        bodies = {f: getattr(s, f) for f in _BODIES if isinstance(getattr(s, f, None), list)}
        if isinstance(s, ast.Match):
            bodies = {}
        if not bodies:
            yield ast.unparse(s), s.lineno, getattr(s, "end_lineno", s.lineno) or s.lineno
            continue
        head = copy.copy(s)
        for f in bodies:
            setattr(head, f, [ast.Pass()] if f == "body" else [])
        if isinstance(s, ast.Try) or (hasattr(ast, "TryStar") and isinstance(s, ast.TryStar)):
            head.handlers = []
            head.finalbody = [ast.Pass()] if s.finalbody and not s.handlers else []
        first = s.body[0].lineno if s.body else s.lineno
        end = max(s.lineno, first - 1)
        yield ast.unparse(head), s.lineno, end
        yield from _units(s.body)
        for h in bodies.get("handlers", []):
            hname = ast.unparse(h.type) if h.type is not None else ""
            yield f"except {hname} as {h.name}:" if h.name else f"except {hname}:", h.lineno, h.lineno
            yield from _units(h.body)
        if bodies.get("orelse"):
            yield "else:", s.orelse[0].lineno, s.orelse[0].lineno
            yield from _units(s.orelse)
        if bodies.get("finalbody"):
            yield "finally:", s.finalbody[0].lineno, s.finalbody[0].lineno
            yield from _units(s.finalbody)


def _tokens(text: str) -> list[str]:
    try:
        toks = [
            t.string
            for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER, tokenize.STRING)
            or (hasattr(tokenize, "FSTRING_START") and t.type == tokenize.FSTRING_START)
        ]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        text = re.sub(r"#.*", "", text)
        toks = _TOKEN.findall(text)
    return [t for t in toks if t != "pass"]


def _canonical(toks: list[str], bound: set[str]) -> list[str]:
    """Bound names numbered by first occurrence in the statement; strings -> S; the rest kept."""
    out, numbers, depth = [], {}, 0
    for i, t in enumerate(toks):
        if t in "([{":
            depth += 1
        elif t in ")]}":
            depth = max(0, depth - 1)
        after_dot = i > 0 and toks[i - 1] == "."
        kwarg = depth > 0 and i + 1 < len(toks) and toks[i + 1] == "="
        if t[:1] in "\"'" or re.match(r"^[rbfuRBFU]{1,2}['\"]", t):
            out.append("S")
        elif t in bound and not after_dot and not kwarg and not keyword.iskeyword(t):
            numbers.setdefault(t, f"v{len(numbers) + 1}")
            out.append(numbers[t])
        else:
            out.append(t)
    return out


def statements(code: str, bound: set[str] | None = None) -> list[tuple[list[str], int, int]]:
    """The answer as (canonical tokens, first line, last line) per statement (see the module docstring)."""
    tree = _parse(code)
    if bound is None:
        bound = bound_names(code)
    units = []
    if tree is not None and (tree.body or not code.strip()):
        try:
            for text, first, last in _units(tree.body):
                toks = _canonical(_tokens(text), bound)
                if toks:
                    units.append((toks, first, last))
            return units
        except (RecursionError, ValueError, MemoryError):  # too deep to print back: by lines
            units = []
    for n, ln in enumerate(code.splitlines(), 1):  # does not parse: one line, one statement
        toks = _canonical(_tokens(re.sub(r"#.*", "", ln.strip())), bound)
        if toks:
            units.append((toks, n, n))
    return units


def _grams(toks: list[str]) -> list[tuple[str, ...]]:
    if len(toks) <= K:
        return [tuple(toks)]
    return [tuple(toks[i : i + K]) for i in range(len(toks) - K + 1)]


def _live_lines(code: str, roots: set[str]) -> set[int] | None:
    """The lines of the top-level statements that the names ``roots`` (those the released notebook's code
    uses: the graded functions) can run, or None (all of it) where it does not parse or defines none:
    a definition nothing calls and scratch code are not the answer, so padding a copy with them changes
    nothing."""
    tree = _parse(code)
    if tree is None or not roots:
        return None
    keep = _reach().live(tree.body, roots)
    if not keep:
        return None
    lines = set()
    for i in keep:
        node = tree.body[i]
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        lines.update(range(first, (node.end_lineno or node.lineno) + 1))
    return lines


def _reach():
    """tools/grader/reach.py (beside this file): one reading of what a statement binds and reads."""
    from pathlib import Path

    from helpers.labcontract import module_at

    return module_at("reach", Path(__file__).with_name("reach.py"))


class Answer:
    """One exercise answer, normalised: its statements, their grams (given grams removed), its size
    (only the statements ``roots`` can run, when given: see ``_live_lines``)."""

    def __init__(self, code: str, bound: set[str], base: set, roots: set[str] = frozenset()):
        self.code = code
        self.units = []  # (grams, first line, last line), statements with at least one own gram
        live = _live_lines(code, set(roots))
        for toks, first, last in statements(code, bound):
            if live is not None and first not in live:
                continue
            grams = [g for g in _grams(toks) if g not in base]
            if grams:
                self.units.append((grams, first, last, len(toks)))
        self.grams = Counter(g for u in self.units for g in u[0])
        self.tokens = sum(u[3] for u in self.units)

    def lines(self, first: int, last: int) -> str:
        return "\n".join(self.code.splitlines()[first - 1 : last])


def _base(given: str) -> set:
    if not given.strip():
        return set()
    grams: set = set()
    for cell in re.split(r"\n\s*\n(?=\S)", given):  # cells were joined by blank lines
        grams.update(g for toks, _, _ in statements(cell, bound_names(cell)) for g in _grams(toks))
    grams.update(g for toks, _, _ in statements(given) for g in _grams(toks))
    return grams


def score(a: Answer, b: Answer) -> tuple[float, int]:
    """(mean of the two containments, grams shared)."""
    if not a.grams or not b.grams:
        return 0.0, 0
    shared = sum((a.grams & b.grams).values())
    return (shared / sum(a.grams.values()) + shared / sum(b.grams.values())) / 2, shared


MATCHED_MOST = 200  # statements of a shown at most: a reader's evidence, and the work stays linear in b


def matched_lines(a: Answer, b: Answer) -> list[tuple[str, str, str]]:
    """(a's lines, b's lines, "La-b ~ Lc-d") for each statement of a mostly found in one of b's
    (a line shown once: an ``elif`` is an ``else`` and an ``if`` on one line); a's first ``MATCHED_MOST``
    statements (two long identical answers made this quadratic: no gradebook until it ended)."""
    where_gram: dict = {}  # gram -> [(b's statement k, its count there)]
    for k, u in enumerate(b.units):
        for g, n in Counter(u[0]).items():
            where_gram.setdefault(g, []).append((k, n))
    a_lines, b_lines = a.code.splitlines(), b.code.splitlines()
    out, seen = [], set()
    for grams, first, last, _ in a.units[:MATCHED_MOST]:
        if (first, last) in seen:
            continue
        shared: Counter = Counter()
        for g, n in Counter(grams).items():
            for k, m in where_gram.get(g, ()):
                shared[k] += min(n, m)
        if not shared:
            continue
        k, best_n = max(shared.items(), key=lambda kv: (kv[1], -kv[0]))  # the first of the best
        if best_n * 2 >= len(grams):
            best = b.units[k]
            seen.add((first, last))
            where = f"L{first}-{last} ~ L{best[1]}-{best[2]}"
            out.append(
                ("\n".join(a_lines[first - 1 : last]), "\n".join(b_lines[best[1] - 1 : best[2]]), where)
            )
    return out


def _where(matches) -> str:
    """The CSV's summary of the matches: per exercise, how many statements and which lines."""
    parts = []
    for ex in dict.fromkeys(m[0] for m in matches):
        locs = [re.findall(r"\d+", m[3]) for m in matches if m[0] == ex]
        if any(len(loc) != 4 for loc in locs):  # not "La-b ~ Lc-d": as given
            parts.append(f"{ex}: " + ", ".join(m[3] for m in matches if m[0] == ex))
            continue
        a_lines = [int(x) for loc in locs for x in loc[:2]]
        b_lines = [int(x) for loc in locs for x in loc[2:]]
        parts.append(
            f"{ex}: {len(locs)} statements, lines {min(a_lines)}-{max(a_lines)} ~ {min(b_lines)}-{max(b_lines)}"
        )
    return "; ".join(parts)


# ----------------------------------------------------------------- the class


def _as_exercises(answer) -> dict[str, str]:
    if isinstance(answer, dict):
        return {str(k): v or "" for k, v in answer.items()}
    return {WHOLE: answer or ""}


def exercise_scores(
    answers: dict, solutions=None, *, given: str = "", min_tokens: int = MIN_TOKENS
) -> list[dict]:
    """Every pair's figure on every exercise, with the exercise's threshold and whether it is flagged.

    answers: {submission name: {exercise: code}} (``exercise_answers``) or {name: one text}.
    solutions: the same for the published solutions (a dict or one text), or None.
    given: the released notebook's code (``given_code``); its grams are no one's work.
    Rows {"exercise", "a", "b", "similarity", "shared", "tokens" (the smaller answer's own
    tokens), "tellable", "threshold", "flagged"}, b = SOLUTIONS for rows against the solutions.
    """
    if solutions is not None and SOLUTIONS in answers:
        raise ValueError(f"a submission may not be named {SOLUTIONS!r}")
    base = _base(given)
    roots = set(re.findall(r"[A-Za-z_]\w*", given))  # the graded functions are named in the given code

    def bound_of(exs):
        return set().union(*(bound_names(code) for code in exs.values())) if exs else set()

    subs = {name: _as_exercises(a) for name, a in answers.items()}
    sol: dict[str, Answer] = {}
    if solutions is not None:
        sol_exs = _as_exercises(solutions)
        sol_bound = bound_of(sol_exs)
        sol = {ex: Answer(code, sol_bound, base, roots) for ex, code in sol_exs.items() if code.strip()}
    # between students, what the solutions also contain is the expected answer, not evidence
    peer: dict[str, dict[str, Answer]] = {}
    own: dict[str, dict[str, Answer]] = {}  # against the solutions: only the given code is excluded
    for name, exs in subs.items():
        bound = bound_of(exs)
        peer[name], own[name] = {}, {}
        for ex, code in exs.items():
            if code.strip():
                expected = base | set(sol[ex].grams) if ex in sol else base
                peer[name][ex] = Answer(code, bound, expected, roots)
                if ex in sol:
                    own[name][ex] = Answer(code, bound, base, roots)
    names = sorted(peer)
    exercises = sorted({ex for n in names for ex in peer[n]}, key=lambda e: (len(e), e))
    rows = []
    for ex in exercises:
        have = [n for n in names if ex in peer[n]]
        ex_rows = [
            _row(ex, a, b, peer[a][ex], peer[b][ex], min_tokens) for a, b in itertools.combinations(have, 2)
        ]
        threshold = _threshold([r["similarity"] for r in ex_rows if r["tellable"]])
        for r in ex_rows:
            r["threshold"] = threshold
            r["flagged"] = r["tellable"] and r["similarity"] >= threshold
        rows += ex_rows
    rows += _solution_rows(own, sol, min_tokens)
    rows.sort(key=lambda r: ((len(r["exercise"]), r["exercise"]), r["b"] == SOLUTIONS, r["a"], r["b"]))
    return rows


def _solution_rows(own, sol, min_tokens) -> list[dict]:
    """Each submission against the solutions; flagged only as a whole lab (see the module docstring)."""
    rows = []
    for name in sorted(own):
        mine = [
            _row(ex, name, SOLUTIONS, own[name][ex], sol[ex], min_tokens)
            for ex in sorted(own[name], key=lambda e: (len(e), e))
        ]
        tellable = [r for r in mine if r["tellable"]]
        close = [r for r in tellable if r["similarity"] >= SOLUTION_SIM]
        copied = len(close) >= SOLUTION_MIN_EXERCISES and len(close) >= SOLUTION_SHARE * len(tellable)
        for r in mine:
            r["threshold"] = SOLUTION_SIM
            r["flagged"] = copied and r in close
        rows += mine
    return rows


def _row(ex, a, b, ans_a, ans_b, min_tokens):
    sim, shared = score(ans_a, ans_b)
    tokens = min(ans_a.tokens, ans_b.tokens)
    return {
        "exercise": ex,
        "a": a,
        "b": b,
        "similarity": min(1.0, sim),
        "shared": shared,
        "tokens": tokens,
        "tellable": tokens >= min_tokens,
        "_answers": (ans_a, ans_b),
    }


def _threshold(scores: list[float]) -> float:
    """The exercise's threshold from its tellable pairs' figures (see the module docstring)."""
    if len(scores) < MIN_PAIRS:
        return SMALL_CLASS_FLOOR
    med = statistics.median(scores)
    if med >= UNIFORM:
        return NEVER
    spread = 1.4826 * statistics.median(abs(s - med) for s in scores)
    return max(FLOOR, min(CEILING, med + K_MAD * max(spread, MIN_SPREAD)))


def similarity_pairs(
    answers: dict, solutions=None, *, given: str = "", min_tokens: int = MIN_TOKENS
) -> list[dict]:
    """The flagged pairs: one row per pair with at least one flagged exercise.

    Rows {"a", "b", "similarity" (the highest flagged figure), "threshold" (that exercise's),
    "exercises" (the flagged ones, e.g. "ex3 0.97; ex6 0.91"), "tokens_overlap" (grams shared on
    the flagged exercises), "matches" [(exercise, a's lines, b's lines, "La-b ~ Lc-d")]}, sorted
    by similarity descending then names; "a" sorts first, b is SOLUTIONS against the solutions.
    The rows depend only on the texts and names.
    """
    by_pair: dict[tuple[str, str], list[dict]] = {}
    for r in exercise_scores(answers, solutions, given=given, min_tokens=min_tokens):
        if r["flagged"]:
            by_pair.setdefault((r["a"], r["b"]), []).append(r)
    rows = []
    for (a, b), rs in by_pair.items():
        top = max(rs, key=lambda r: (r["similarity"], -r["threshold"]))
        matches = [
            (r["exercise"], la, lb, where) for r in rs for la, lb, where in matched_lines(*r["_answers"])
        ]
        rows.append(
            {
                "a": a,
                "b": b,
                "similarity": top["similarity"],
                "threshold": top["threshold"],
                "exercises": "; ".join(f"{r['exercise']} {r['similarity']:.2f}" for r in rs),
                "tokens_overlap": sum(r["shared"] for r in rs),
                "matches": matches,
            }
        )
    rows.sort(key=lambda r: (-r["similarity"], r["a"], r["b"]))
    return rows


# ----------------------------------------------------------------- the report


def csv_cell(value) -> str:
    """A CSV field a spreadsheet shows as text: no control characters, no leading = + - @ tab CR."""
    value = str(value)
    risky = value[:1] in ("=", "+", "-", "@", "\t", "\r", "\n")
    value = "".join(ch if ch.isprintable() else " " for ch in value)
    return "'" + value if risky or value[:1] in ("=", "+", "-", "@") else value


def write_report(rows: list[dict], path: str | PathLike, *, cell=None) -> None:
    """CSV (FIELDS, a header even when empty, every cell escaped) and, beside it, an HTML page
    (same name, ``.html``) with each flagged pair's matched lines side by side.

    ``cell`` (the gradebook's own escaping, ``labs._cell``) is applied on top of ``csv_cell``."""
    esc = (lambda v: cell(csv_cell(v))) if cell else csv_cell
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([esc(x) for x in FIELDS])
        for r in rows:
            where = _where(r.get("matches", []))
            w.writerow(
                [
                    esc(r["a"]),
                    esc(r["b"]),
                    esc(f"{r['similarity']:.3f}"),
                    esc(f"{r.get('threshold', 0.0):.3f}"),
                    esc(r.get("exercises", "")),
                    esc(int(r.get("tokens_overlap", 0))),
                    esc(where),
                ]
            )
    page = str(path)
    page = (page[: -len(".csv")] if page.endswith(".csv") else page) + ".html"
    with open(page, "w", encoding="utf-8") as f:
        f.write(side_by_side(rows))


def side_by_side(rows: list[dict]) -> str:
    """An HTML page: per flagged pair, each matched statement of a beside the one of b (escaped)."""
    e = html.escape
    out = [
        "<!doctype html><meta charset='utf-8'><title>Similar answers</title>",
        "<style>td{vertical-align:top}pre{margin:0}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px}</style>",
        "<h1>Similar answers</h1>",
        "<p>Code normalised (names, comments, spacing, order do not count); a pair is listed when it"
        " stands out from the class on an exercise with enough code. A reason to look, not a verdict.</p>",
    ]
    if not rows:
        out.append("<p>No pair stands out.</p>")
    for r in rows:
        out.append(
            f"<h2>{e(r['a'])} &harr; {e(r['b'])}: {r['similarity']:.2f}"
            f" (threshold {r.get('threshold', 0.0):.2f}; {e(r.get('exercises', ''))})</h2>"
        )
        out.append(f"<table><tr><th>exercise</th><th>{e(r['a'])}</th><th>{e(r['b'])}</th></tr>")
        for ex, la, lb, where in r.get("matches", []):
            out.append(
                f"<tr><td>{e(ex)}<br>{e(where)}</td><td><pre>{e(la)}</pre></td><td><pre>{e(lb)}</pre></td></tr>"
            )
        out.append("</table>")
    return "\n".join(out) + "\n"
