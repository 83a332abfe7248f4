"""What in a student's own code could reach around the grader's guards, found by reading it (no running).

The worker's guards (autograd, the by-hand reference functions, the pristine modules a
`runs_in: student` test relies on) live in the student's process, so they hold only against code
that uses the public API. Getting around them takes introspection (`__globals__`, `__closure__`,
`gc`, `sys.modules`, a computed `getattr`), executing text (`eval`, `exec`, `get_ipython`), or
importing the grader's own modules. None of that belongs in a lab answer, so its presence is the
signal: ``labs.py grade`` then gives the submission's by-hand exercises and in-process tests no
points, with a note naming the construct, and flags it for the instructor.

    reach_around(code) -> ["__globals__", "import sys", ...]   # sorted, empty for honest code
"""

from __future__ import annotations

import ast
import re

# modules a lab answer may import (the course's own and what its labs use)
ALLOWED_IMPORTS = (
    "torch",
    "math",
    "numpy",
    "einops",
    "helpers",
    "functools",
    "itertools",
    "collections",
    "typing",
    "dataclasses",
    "time",
    "random",
    "matplotlib",
    "__future__",
    "statistics",
    "contextlib",
    "copy",
    "os",
    "sys",
    "signal",
    "warnings",
    "re",
    "string",
    "abc",
    "enum",
)
# names whose use alone can switch a guard off or run hidden code
NAMES = {
    "eval",
    "exec",
    "compile",
    "globals",
    "vars",
    "__import__",
    "getattr",
    "setattr",
    "delattr",
    "get_ipython",
    "breakpoint",
    "memoryview",
    "open",
}
# attributes that reach past the public API of torch
ATTRIBUTES = {
    "_execution_engine",
    "_ImperativeEngine",
    "_EngineBase",
    "_C",
    "_getframe",
    "settrace",
    "setprofile",
    "f_globals",
    "f_locals",
    "f_back",
    "gi_frame",
    "tb_frame",
    "cell_contents",
    "meta_path",
    "path_hooks",
}
# attributes flagged on one module only (`sys.modules` reaches the grader's own modules; `model.modules()` is fine)
MODULE_ATTRIBUTES = {("sys", "modules"), ("os", "environ")}
# plain attribute names a dunder check would otherwise flag, but which any answer may use
HARMLESS_DUNDERS = {
    "__init__",
    "__name__",
    "__doc__",
    "__len__",
    "__call__",
    "__repr__",
    "__str__",
    "__add__",
    "__radd__",
    "__mul__",
    "__rmul__",
    "__sub__",
    "__rsub__",
    "__neg__",
    "__truediv__",
    "__rtruediv__",
    "__pow__",
    "__rpow__",
    "__matmul__",
    "__rmatmul__",
    "__getitem__",
    "__setitem__",
    "__iter__",
    "__next__",
    "__enter__",
    "__exit__",
    "__eq__",
    "__hash__",
    "__lt__",
    "__le__",
    "__gt__",
    "__ge__",
    "__bool__",
    "__float__",
    "__int__",
    "__slots__",
    "__post_init__",
    "__contains__",
    "__future__",
}


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__") and name not in HARMLESS_DUNDERS


def reach_around(code: str) -> list[str]:
    """The constructs in a cell's ``code`` that could reach around the grader's guards (sorted, unique).

    The cell is read as IPython runs it (`%magic` and `!shell` lines become calls), so a magic
    cannot hide code from the check.
    """
    found: set[str] = set()
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        tree = ast.parse(TransformerManager().transform_cell(code))
    except SyntaxError:
        # code that does not parse cannot have run either: the cells that raised are noted apart
        return []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for n in names:
                if node.__class__ is ast.ImportFrom and node.level:
                    found.add("a relative import")
                elif n.split(".")[0] not in ALLOWED_IMPORTS:
                    found.add(f"import {n.split('.')[0]}")
            if isinstance(node, ast.ImportFrom):
                found |= {a.name for a in node.names if a.name in ATTRIBUTES or _dunder(a.name)}
        elif isinstance(node, ast.Name):
            if node.id in NAMES or _dunder(node.id):
                found.add(node.id)
        elif isinstance(node, ast.Attribute):
            if node.attr in ATTRIBUTES or _dunder(node.attr):
                found.add(node.attr)
            elif isinstance(node.value, ast.Name) and (node.value.id, node.attr) in MODULE_ATTRIBUTES:
                found.add(f"{node.value.id}.{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.strip()
            named = {m for m in re.findall(r"__\w+?__", text)} - HARMLESS_DUNDERS
            if named or ((text.startswith("__") or text.endswith("__")) and text not in HARMLESS_DUNDERS):
                found.add("a string holding a __name__")
    return sorted(found)
