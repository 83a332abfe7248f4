"""Contract self-checks for the labs (chapter 1 on, like labcheck): a function against recorded reference outputs.

    check_contract("lab02", "ex2", dense_backward)

prints one line, naming the failing *case class* in words before any number:

* ``✓ Exercise 2 · dense_backward: matches the recorded reference in all 8 case classes (X is 1-D (in,), …)``
* ``✗ Exercise 2 · dense_backward fails when X is 1-D (in,) — works when X is 2-D (R, in), …: grad_W has
  shape (4,), expected (4, 3)`` (the part after the colon is ``helpers.labcheck``'s diagnosis of
  the first failing case: a shape, a dtype, a factor, the transpose, a known mistake, …)
* ``· Exercise 2 · dense_backward: not implemented yet``

The cases and the reference outputs are values (``helpers/data/labNN_name.contract.json``),
recorded at release from the instructor's contract module (``labs/source/contracts/``, not
shipped): this module holds no reference solution, only the format's reader, the comparison
rule (one rule, :func:`disagreement`, for the self-check and the hidden tests) and the
public scalar functions that exercises on functions are called with (:data:`FUNCTIONS`).
:func:`hidden_check` is the hidden tests' entry: it loads the instructor's module from the
checkout and fails outside it.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import torch

from helpers.checks import close
from helpers.labcheck import CheckResult, evaluate

__all__ = [
    "check_contract",
    "evaluate_contract",
    "disagreement",
    "FUNCTIONS",
    "encode",
    "decode",
    "hidden_check",
]

DATA = Path(__file__).resolve().parent / "data"
TODO = "not implemented yet"


# ------------------------------------------------------------ public test functions
# Functions handed to an exercise that takes a function (lab 2's gradient check): data by name.


def x_sin_x_plus_prod(x):
    """Σ x·sin(x) + Π x: every entry of the gradient depends on the others."""
    return (x * x.sin()).sum() + x.prod()


def sum_of_cubes(x):
    """Σ x³: its central difference along u is exactly uᵀ∇f + ε² Σ u³."""
    return (x**3).sum()


def log_sum_exp(x):
    """log Σ exp(x) over every entry."""
    return x.reshape(-1).logsumexp(0)


FUNCTIONS = {f.__name__: f for f in (x_sin_x_plus_prod, sum_of_cubes, log_sum_exp)}

_DTYPES = {
    str(d).removeprefix("torch."): d for d in (torch.float16, torch.float32, torch.float64, torch.int64)
}


# ------------------------------------------------------------------- the format


def encode(value):
    """A case's value as JSON: tensors (values, shape, dtype, layout), sizes, tuples, functions by name."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        node = {"tensor": t.reshape(-1).tolist(), "shape": list(t.shape), "dtype": str(t.dtype)[6:]}
        if t.dim() >= 2 and not t.is_contiguous() and t.mT.is_contiguous():
            node["layout"] = "transposed"  # a view whose last two dims are swapped in memory
        return node
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, tuple):
        return {"tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {"dict": {str(k): encode(v) for k, v in value.items()}}
    if callable(value):
        name = getattr(value, "__name__", "")
        if FUNCTIONS.get(name) is not value:
            raise ValueError(f"only the functions of helpers.labcontract.FUNCTIONS are data, not {value!r}")
        return {"function": name}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise ValueError(f"cannot record a {type(value).__name__}")


def decode(node):
    """The value :func:`encode` wrote (a transposed layout comes back as a non-contiguous view)."""
    if isinstance(node, list):
        return [decode(v) for v in node]
    if not isinstance(node, dict):
        return node
    if "tensor" in node:
        t = torch.tensor(node["tensor"], dtype=_DTYPES[node["dtype"]]).reshape(node["shape"])
        if node.get("layout") == "transposed":
            t = t.mT.contiguous().mT
        return t
    if "size" in node:
        return torch.Size(node["size"])
    if "tuple" in node:
        return tuple(decode(v) for v in node["tuple"])
    if "dict" in node:
        return {k: decode(v) for k, v in node["dict"].items()}
    if "function" in node:
        return FUNCTIONS[node["function"]]
    raise ValueError(f"unknown recorded value {sorted(node)}")


def data_path(lab: str) -> Path:
    """helpers/data/labNN_name.contract.json for 'lab02' or 'lab02_chain_rule'."""
    hits = sorted(DATA.glob(f"{lab}*.contract.json")) if len(lab) == 5 else [DATA / f"{lab}.contract.json"]
    if len(hits) != 1 or not hits[0].exists():
        raise FileNotFoundError(f"no recorded contract for {lab} in {DATA}")
    return hits[0]


def load(lab: str) -> dict:
    return json.loads(data_path(lab).read_text(encoding="utf-8"))


# ------------------------------------------------------------ the comparison rule


def _parts(value, n: int):
    if n == 1:
        return [value]
    if isinstance(value, (tuple, list)) and len(value) == n:
        return list(value)
    return None


def disagreement(got, expected, outputs, atol: float, rtol: float) -> str | None:
    """None if ``got`` is ``expected`` (same structure, shapes, dtypes; values within atol + rtol·|ref|),
    else why not, in a few words. The self-check and the hidden tests both judge with this."""
    got_parts, exp_parts = _parts(got, len(outputs)), _parts(expected, len(outputs))
    if got_parts is None:
        return f"returned {type(got).__name__}, expected {len(outputs)} outputs ({', '.join(outputs)})"
    for name, g, e in zip(outputs, got_parts, exp_parts):
        if not isinstance(g, torch.Tensor):
            return f"{name} is a {type(g).__name__}, expected a tensor"
        if tuple(g.shape) != tuple(e.shape):
            return f"{name} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
        if g.dtype != e.dtype:
            return f"{name} has dtype {g.dtype}, expected {e.dtype}"
        if not bool(close(g, e, atol, rtol).all()):
            return f"{name} differs from the reference"
    return None


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return True


def _clone(v):
    if isinstance(v, torch.Tensor):
        return v.clone()  # keeps a transposed layout (clone preserves the strides of a dense view)
    if isinstance(v, tuple) and not isinstance(v, torch.Size):
        return tuple(_clone(x) for x in v)
    if isinstance(v, list):
        return [_clone(x) for x in v]
    return v


def _todo(e: BaseException) -> bool:
    return isinstance(e, NotImplementedError) or (isinstance(e, TypeError) and "ellipsis" in str(e).lower())


def _run_case(fn, case: dict, outputs) -> tuple[str, str | None]:
    """('pass' | 'fail' | 'todo' | 'error', reason) of one recorded case."""
    args, kwargs = decode(case["args"]), decode(case.get("kwargs", {"dict": {}}))
    given, given_kw = _clone(args), _clone(kwargs)
    try:
        got = fn(*given, **given_kw)
    except Exception as e:  # noqa: BLE001 - a learner's error is a verdict
        return ("todo", None) if _todo(e) else ("error", f"{type(e).__name__}: {e}")
    if (
        got is None
        or got is Ellipsis
        or (isinstance(got, (tuple, list)) and got and all(v is None or v is Ellipsis for v in got))
    ):
        return "todo", None
    if isinstance(got, (tuple, list)) and any(v is None or v is Ellipsis for v in got):
        return "partial", None  # some outputs still `...`: labcheck says which
    if not (_same(given, args) and _same(list(given_kw.values()), list(kwargs.values()))):
        return "fail", "changed its arguments in place"
    why = disagreement(got, decode(case["expected"]), outputs, case["atol"], case["rtol"])
    return ("fail", why) if why else ("pass", None)


def _diagnosis(fn, case: dict, outputs, title: str, why: str) -> str:
    """labcheck's one-line diagnosis of the failing case (factors, transpose, terms, recorded mistakes)."""
    mistakes = {
        out: {label: decode(v) for label, v in by_label.items()}
        for out, by_label in case.get("mistakes", {}).items()
    }
    result = evaluate(
        fn,
        decode(case["expected"]),
        args=decode(case["args"]),
        kwargs=decode(case.get("kwargs", {"dict": {}})),
        outputs=tuple(outputs),
        name=title,
        atol=case["atol"],
        rtol=case["rtol"],
        factors=decode(case.get("factors", {"dict": {}})) or None,
        terms={out: decode(t) for out, t in case.get("terms", {}).items()} or None,
        mistakes=mistakes or None,
    )
    prefix = f"✗ {title}: "
    if result.status in ("fail", "error") and result.line.startswith(prefix):
        return result.line[len(prefix) :]
    return why


def _listed(names: list[str], most: int = 2) -> str:
    return ", ".join(names[:most]) + (f" (and {len(names) - most} more)" if len(names) > most else "")


def evaluate_contract(lab: str, exercise: str, fn) -> CheckResult:
    """The self-check's verdict on every public case, class by class; nothing printed."""
    spec = load(lab)["exercises"][exercise]
    title, outputs = spec["title"], spec["outputs"]
    verdicts = []  # (class name, status, reason, case)
    for cls in spec["classes"]:
        status, why, bad = "pass", None, None
        for case in cls["cases"]:
            status, why = _run_case(fn, case, outputs)
            if status != "pass":
                bad = case
                break
        verdicts.append((cls["name"], status, why, bad))
    if any(s == "todo" for _, s, _, _ in verdicts) and not any(s == "pass" for _, s, _, _ in verdicts):
        return CheckResult("todo", f"· {title}: {TODO}")
    failing = [v for v in verdicts if v[1] != "pass"]
    working = [name for name, s, _, _ in verdicts if s == "pass"]
    n_cases = sum(len(c["cases"]) for c in spec["classes"])
    if not failing:
        return CheckResult(
            "pass",
            f"✓ {title}: matches the recorded reference in all {len(verdicts)} case classes ({n_cases} cases)",
        )
    name, status, why, case = failing[0]
    if status == "partial":
        return evaluate(
            fn, decode(case["expected"]), args=decode(case["args"]), outputs=tuple(outputs), name=title
        )
    detail = (
        "returned None (not implemented for this case?)"
        if status == "todo"
        else _diagnosis(fn, case, outputs, title, why)
    )
    fails = [v[0] for v in failing]
    if working:
        head = f"✗ {title} fails when {_listed(fails)} — works when {_listed(working)}"
    else:
        head = f"✗ {title} fails in every case class ({_listed(fails)})"
    return CheckResult("fail", f"{head}: {detail}")


def check_contract(lab: str, exercise: str, fn) -> None:
    """Print one ✓/✗/· line: ``fn`` against the exercise's recorded cases, class by class."""
    print(evaluate_contract(lab, exercise, fn).line)


# ------------------------------------------------------------------ hidden side


def instructor_module(lab: str):
    """The lab's contract module from the instructor's checkout (labs/source/contracts/); never shipped."""
    root = Path(__file__).resolve().parents[1] / "labs" / "source" / "contracts"
    name = data_path(lab).name.removesuffix(".contract.json") if len(lab) == 5 else lab
    if not (root / f"{name}.py").exists():
        raise RuntimeError(f"the hidden tests of {name} run in the instructor's checkout only")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(name)


def hidden_check(lab: str, exercise: str, fn, case_class: str) -> None:
    """A hidden test: ``fn`` on the hidden cases of one case class; AssertionError naming the class."""
    instructor_module(lab).CONTRACT.hidden_check(exercise, fn, case_class)
