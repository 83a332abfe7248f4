"""What a student's code uses, read without running it: an allow-list for by-hand answers.

The worker's guards (autograd's engine, the by-hand reference functions) live in the student's process, so they hold only against what
they were written for; public APIs around them (forward-mode AD, calling `grad_fn` nodes, `jacfwd`,
`torch.ops` aliases) and ways to switch them off (`sys.modules`, `__globals__`) are many. So the
code a student wrote is read against a list of what the labs' own solutions use (``ALLOWED``,
derived by ``python reach.py derive`` from every lab's solutions): ordinary Python, a vetted set of
tensor operations and attributes, the course's helpers the solutions call. Anything else sends the
exercise to "instructor review" (its points pending, the construct named); nothing is zeroed for it.

What goes to review, and which exercises (``plan``), statement by statement:

* off the "any" list (what any solution uses, ordinary Python, torch's public math: ``public_math``),
  wherever it stands (before exercise 1 included): every by-hand exercise, since it runs, or can be
  called, before every hidden test; except a name a by-hand list guards at run time, which counts
  only where reached (below);
* off the by-hand solutions' list (``ALLOWED["by_hand"]``) in a statement an exercise asking for
  gradients by hand can run (its graded function, and what that reads, transitively: ``live``): that
  exercise;
* a gradient computed where no run-time guard sees it (``UNSEEN``: forward AD, the functional API,
  `torch.func`, `.grad_fn` nodes), anywhere: every exercise asking for gradients by hand;
* what could switch the guards off (``NEVER_ANY``: `sys.modules`, `getattr`, a dunder, a private
  name, a magic), anywhere: every by-hand exercise (``Plan.reach``).

Given cells as released are the course's code and are not read; what they use a student may use.

    plan(cells, released, by_hand) -> Plan           # each cell's kind and question, what goes to review
    unlisted(code, scope, tier) -> [(construct, line, severity)]   # what the list does not hold
    python tools/grader/reach.py derive [--write]    # the lists the labs' solutions need
"""

from __future__ import annotations

import ast
import builtins
import difflib
import functools
import hashlib
import os
import re
import sys
import types
from dataclasses import dataclass, field

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


# ------------------------------------------------------------------ the allow-list

# Never on the list, whatever a solution uses (`derive` refuses them): what reaches past the public
# API into the grader's process, or switches its guards off. Dotted entries cover what is below them.
NEVER_ANY = {
    "dotted": (
        "sys",
        "os",
        "ctypes",
        "importlib",
        "builtins",
        "gc",
        "inspect",
        "types",
        "subprocess",
        "signal",
        "threading",
        "multiprocessing",
        "pickle",
        "marshal",
        "code",
        "codeop",
        "runpy",
        "pathlib",
        "shutil",
        "io",
        "torch._C",
        "torch._dynamo",
        "torch.ops",
        "torch.library",
        "torch.utils.cpp_extension",
        "operator.attrgetter",
        "operator.methodcaller",
        "worker",
        "wire",
        "harness",
    ),
    "attributes": ("_execution_engine", "_C", "f_globals", "f_locals", "f_back", "tb_frame", "gi_frame"),
    "builtins": (
        "eval",
        "exec",
        "compile",
        "getattr",
        "setattr",
        "delattr",
        "globals",
        "vars",
        "locals",
        "__import__",
        "open",
        "breakpoint",
        "memoryview",
        "input",
        "help",
        "dir",
        "get_ipython",
        "__builtins__",
        "type(name, bases, namespace)",  # TYPE3: a class built from strings (``visit_Call``; red team s8)
        # super(torch.Tensor, t).tolist() is TensorBase's own method, under the wrappers that count the
        # values read out of tensors (red team 8); a bare `super()` in a class's method is read as
        # ordinary (``visit_Call``): it reaches only past the student's own class
        "super",
    ),
}
TYPE3 = "type(name, bases, namespace)"
# modules that other modules hand on as attributes (`torch.sys`, `os.sys`)
REACHING_MODULES = {"sys", "os", "builtins", "gc", "importlib", "ctypes", "inspect", "subprocess"}
# the modules of NEVER_ANY's paths, refused wherever they stand in a path, not only at its start
NEVER_SEGMENTS = {d for d in NEVER_ANY["dotted"] if "." not in d}
# and, where an exercise asks for the gradient by hand ("autograd" in its by_hand list): what computes
# one without autograd's engine, whose guard sees only backward passes (forward-mode AD, a node called
# directly, functorch's transforms, the functional API, an aten alias of a fused kernel)
NEVER_BY_HAND = {
    "dotted": (
        "torch.autograd.grad",
        "torch.autograd.backward",
        "torch.autograd.forward_ad",
        "torch.autograd.functional",
        "torch.autograd.graph",
        "torch.autograd.gradcheck",
        "torch.func",
        "torch.vmap",
        "torch.nn.functional.scaled_dot_product_attention",
    ),
    "attributes": ("grad_fn", "next_functions", "backward", "register_hook", "retain_grad"),
    "builtins": (),
}


# what a string may not spell: the way around an attribute check is to look the name up by text
SPELLED = (
    r"\b(?:grad_fn|next_functions|forward_ad|make_dual|_functorch|jacfwd|_execution_engine|_saved_\w+)\b"
)


# of those, what no run-time guard sees (autograd's engine sees torch.autograd.grad and .backward())
UNSEEN = {
    "dotted": ("torch.autograd.forward_ad", "torch.autograd.functional", "torch.func", "torch.vmap"),
    # forward-mode AD's C twins are reached by name on any object that holds torch (red team 5)
    "attributes": (
        "grad_fn",
        "next_functions",
        "_make_dual",
        "_unpack_dual",
        "dual_level",
        "_fw_grad",
        "forward_ad",
    ),
}


# Complex numbers: f(x + ih)'s imaginary part over h is f'(x) to machine precision (complex-step
# differentiation), a derivative no backward was written for and no guard sees. The labs are real-valued:
# a complex literal, dtype or part (`1e-30j`, `torch.complex128`, `.imag`, `view_as_real`) computes one.
COMPLEX = re.compile(r"complex|cfloat|cdouble|chalf|imag|^real$|view_as_real|polar|^conj|resolve_conj|angle")


def _names_module(name: str) -> bool:
    """Whether ``name`` is a module's (``hub``, ``labcontract``, ``zipfile``): assigning ``box.hub = None``
    somewhere does not make ``x.hub`` the student's own attribute (red team 5 reached torch.hub so)."""
    # the standard library's names and torch's and the course's modules, not whatever else the reading process
    # has imported (matplotlib.scale made an honest `ctx.scale` read as a module in the test run, not in grading)
    return (
        name in sys.stdlib_module_names
        or name in _COURSE_MODULES
        or any(m.endswith("." + name) and m.split(".")[0] in ("torch", "helpers") for m in list(sys.modules))
    )


# the course's helper modules by name, whether or not this process imported them
_HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "helpers")
_COURSE_MODULES = {n.removesuffix(".py") for n in (os.listdir(_HELPERS) if os.path.isdir(_HELPERS) else ())}


def _unseen(kind: str, text: str) -> bool:
    """Whether a use computes a gradient where no run-time guard sees it (so it can serve any exercise)."""
    if kind == "complex":
        return True
    if kind in ("import", "dotted"):
        return (
            any(text == d or text.startswith(d + ".") for d in UNSEEN["dotted"])
            or any(p in UNSEEN["attributes"] for p in text.split(".")[1:])
            or any(COMPLEX.search(p) for p in text.split(".")[1:])
        )
    if kind == "builtin":
        return text == "complex"
    return kind == "attr" and (text in UNSEEN["attributes"] or COMPLEX.search(text) is not None)


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


# a notebook may end a cell the way scripts do (`import sys; sys.exit()`): the worker makes it end the cell
EXITS = {"sys.exit", "os._exit"}
# `import sys` alone reaches nothing: what is then taken from it is read. NumPy too: a newcomer's unused
# `import numpy as np` sent all of lab 1 to review (0/11 shown, every self-check ✓); `np.` anything is read
BARE_IMPORTS = {"sys", "os", "numpy"}


def _never(kind: str, text: str, tier: str) -> bool:
    """Whether ``text`` (of ``kind``) can never be on the ``tier`` list."""
    sets = [NEVER_ANY] + ([NEVER_BY_HAND] if tier == "by_hand" else [])
    if (kind == "import" and text in BARE_IMPORTS) or (kind == "dotted" and text in EXITS):
        return False
    if kind in ("import", "dotted"):
        parts = text.split(".")
        if any(p.startswith("_") and not _is_dunder(p) for p in parts[1:]) or any(
            _is_dunder(p) for p in parts
        ):
            return True  # torch._functorch, collections._sys, a module's __dict__
        # `torch.sys.modules`, `os.sys`, `helpers.attention.torch.utils.data.dataloader.threading`: a module
        # that imported one of these hands it on, however deep (red team s10 started a thread so)
        return any(text == d or text.startswith(d + ".") for s in sets for d in s["dotted"]) or any(
            p in s["attributes"] or p in REACHING_MODULES or p in NEVER_SEGMENTS
            for s in sets
            for p in parts[1:]
        )
    if kind == "attr":
        return (
            any(text in s["attributes"] for s in sets)
            or text in REACHING_MODULES
            or (_is_dunder(text) and text not in HARMLESS_DUNDERS)
        )
    if kind in ("builtin", "given"):
        return any(text in s["builtins"] for s in sets) or _is_dunder(text)
    return kind in ("string", "store")


# a line IPython transforms (a magic, a shell escape, an assigned one, a help request): it transforms one
# per pass over the whole cell, so a cell's reading grows with the square of their number (501 `%time 1`
# lines took 13 s to be refused, 499 took 12 s to be read, 43 s on a busy machine). No honest cell holds
# dozens: a cell of more than 64 is not transformed (64 take about half a second) but read as one call into
# IPython the reader cannot see into, which sends what it can reach to review: it runs all the same
_TRANSFORMED = re.compile(r"^\s*[%!]|=\s*[%!]|^[^#\n]*\?\s*$", re.M)
_MOST_TRANSFORMED = 64
_UNREAD = "get_ipython()  # more lines for IPython to transform than the reader reads\n"


@functools.lru_cache(maxsize=1024)
def as_run(code: str) -> str | None:
    """The cell's text as IPython runs it (`%magic` and `!shell` lines become calls), or None where
    IPython cannot transform it (read once per text: the plan reads a cell several times)."""
    if len(_TRANSFORMED.findall(code)) > _MOST_TRANSFORMED:
        return _UNREAD
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(code)
    except Exception:  # noqa: BLE001 - IPython's own errors (501 `%time` lines raise RuntimeError): unread
        return None


def parse(code: str) -> ast.Module | None:
    """The cell as IPython runs it (``as_run``), parsed, or None if it does not parse."""
    text = as_run(code)
    try:
        return None if text is None else ast.parse(text)
    except (SyntaxError, ValueError):
        return None  # code that does not parse cannot have run either: the cells that raised are noted apart


@dataclass
class Scope:
    """What the whole notebook binds: the reading of a name in one cell depends on the others."""

    imports: dict = field(
        default_factory=dict
    )  # name -> dotted path, from imports and `F = torch.nn.functional`
    given: set = field(default_factory=set)  # names the released cells define
    own: set = field(default_factory=set)  # names the student's cells bind
    own_attrs: set = field(default_factory=set)  # attributes the student's cells assign or define as methods

    def path(self, node) -> str | None:
        """The dotted path of an expression that names a module or an object in one (`F.softmax`), else None."""
        attrs = []
        while isinstance(node, ast.Attribute):
            attrs.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.imports:
            return ".".join([self.imports[node.id]] + attrs[::-1])
        return None


def _bind(tree: ast.AST, scope: Scope, own: bool) -> None:
    """Add what ``tree`` binds to ``scope`` (as the student's own when ``own``)."""
    names = scope.own if own else scope.given
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                scope.imports[a.asname or top] = a.name if a.asname else top
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for a in node.names:
                if a.name != "*":
                    scope.imports[a.asname or a.name] = f"{node.module}.{a.name}"
        elif (
            isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
        ):
            path = scope.path(node.value)
            if path:
                scope.imports[node.targets[0].id] = path
            names.add(node.targets[0].id)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if isinstance(node, ast.ClassDef) and own:
                scope.own_attrs |= {
                    n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                }
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:  # `case object(x=name)`
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and own:
            scope.own_attrs.add(node.attr)


def scope(given: list[str], own: list[str]) -> Scope:
    """The Scope of a notebook whose released cells are ``given`` and whose student cells are ``own``."""
    s = Scope()
    for codes, is_own in ((given, False), (own, True)):
        for code in codes:
            tree = parse(code)
            if tree is not None:
                _bind(tree, s, is_own)
    return s


TIMING_MAGICS = {"time", "timeit", "capture"}  # magics that only run their code (and time or quieten it)


def _magic(node: ast.Call) -> str | None:
    """For a magic as IPython rewrites it (`get_ipython().run_line_magic('time', 'x = f()')`): the code a
    timing magic runs, "" for any other magic, None for a call that is not a magic."""
    f = node.func
    if not (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Call)
        and isinstance(f.value.func, ast.Name)
        and f.value.func.id == "get_ipython"
    ):
        return None
    args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    if f.attr in ("run_line_magic", "run_cell_magic") and len(args) == len(node.args) >= 2:
        if args[0] in TIMING_MAGICS and not node.keywords:
            code = args[-1] if f.attr == "run_cell_magic" else args[1]
            return code or "pass"
    return ""


class _Uses(ast.NodeVisitor):
    """Every use in a tree as (kind, text, line): kinds import, dotted, attr, builtin, given, string."""

    def __init__(self, scope: Scope):
        self.scope, self.found = scope, []
        self.locals: list[set[str]] = []  # the names each enclosing function or lambda binds itself

    def add(self, kind: str, text: str, node) -> None:
        self.found.append((kind, text, getattr(node, "lineno", 0)))

    def visit_Import(self, node):
        for a in node.names:
            self.add("import", a.name, node)

    def visit_ImportFrom(self, node):
        if node.level or not node.module:
            self.add("import", "a relative import", node)
        for a in node.names:
            self.add("import", f"{node.module or ''}.{a.name}" if a.name != "*" else f"{node.module}.*", node)

    def visit_Attribute(self, node):
        path = self.scope.path(node)
        if path is not None and not isinstance(node.ctx, ast.Load):
            # `T = torch.Tensor; T.join = staticmethod(f)`: the library changed under every later call, an
            # allowed name made to run the student's code where no by-hand list reads it (red team s10)
            self.add("store", path, node)
            return
        if path is not None:
            self.add("dotted", path, node)
            return
        self.add("attr", node.attr, node)
        self.visit(node.value)

    def _defines(self, name: str, node) -> None:
        # a dunder the student defines runs when Python or the grader touches the object (a property
        # `__class__` runs in the grader's isinstance, `__del__` whenever it is collected): unless harmless
        if _is_dunder(name) and name not in HARMLESS_DUNDERS:
            self.add("attr", name, node)

    def visit_FunctionDef(self, node):
        self._defines(node.name, node)
        # decorators, defaults and annotations run in the enclosing scope; the body, in the function's own
        for n in node.decorator_list:
            self.visit(n)
        self.visit(node.args)
        if node.returns is not None:
            self.visit(node.returns)
        self.locals.append(_own_locals(node))
        for n in node.body:
            self.visit(n)
        self.locals.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.visit(node.args)
        self.locals.append(_own_locals(node))
        self.visit(node.body)
        self.locals.pop()

    def visit_Name(self, node):
        n = node.id
        if not isinstance(node.ctx, ast.Load):
            self._defines(n, node)  # `__class__ = property(...)` in a class body
            return
        if n in self.scope.imports:
            self.add("dotted", self.scope.imports[n], node)
        elif n in self.scope.own and (not _is_dunder(n) or n in HARMLESS_DUNDERS):
            # the student's own name, `__radd__ = __add__` in their class too (red team 12); but a builtin
            # off the ordinary list (`exec`) is theirs only where a function binds it itself: at the top
            # level or as a global, the reading may come before the binding or after a cell that failed
            # before it (`exec = exec` read the real `exec`; red team s8)
            if _builtin_off_list(n) and not any(n in names for names in self.locals):
                self.add("builtin", n, node)
            return
        elif n in self.scope.given and not _is_dunder(n):
            self.add("given", n, node)
        elif hasattr(builtins, n) or _is_dunder(n) or n in NEVER_ANY["builtins"]:
            self.add("builtin", n, node)

    def visit_Match(self, node):
        # `match x: case object(attr=y)` reads x.attr by name, with no Attribute node: read each such
        # attribute as the dotted path it is (`torch.func`) where the subject names one, else as `.attr`
        path = self.scope.path(node.subject)
        self.visit(node.subject)
        for case in node.cases:
            top = case.pattern
            while isinstance(top, ast.MatchAs) and top.pattern is not None:
                top = top.pattern
            tops = top.patterns if isinstance(top, ast.MatchOr) else [top]
            for pat in ast.walk(case.pattern):
                if isinstance(pat, ast.MatchClass):
                    for attr in pat.kwd_attrs:
                        if path is not None and pat in tops:
                            self.add("dotted", f"{path}.{attr}", pat)
                        else:
                            self.add("attr", attr, pat)
            self.visit(case.pattern)
            if case.guard is not None:
                self.visit(case.guard)
            for stmt in case.body:
                self.visit(stmt)

    def visit_Call(self, node):
        magic = _magic(node)
        bare_super = (
            isinstance(node.func, ast.Name) and node.func.id == "super" and not (node.args or node.keywords)
        )
        if bare_super and "super" not in self.scope.own:
            return
        if (  # getattr(x, "shape") is x.shape: read as that attribute (a self-check's line, lab 8's once)
            isinstance(node.func, ast.Name)
            and node.func.id == "getattr"
            and "getattr" not in self.scope.own
            and 2 <= len(node.args) <= 3
            and not node.keywords
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and node.args[1].value.isidentifier()
        ):
            path = self.scope.path(node.args[0])
            if path is not None:  # getattr(torch, "sys") is torch.sys
                self.add("dotted", f"{path}.{node.args[1].value}", node)
            else:
                self.add("attr", node.args[1].value, node)
                self.visit(node.args[0])
            for a in node.args[2:]:
                self.visit(a)
            return
        if (
            isinstance(node.func, ast.Name)
            and node.func.id == "type"
            and not any("type" in names for names in self.locals)
            and len(node.args) + len(node.keywords) != 1
        ):  # type(name, bases, namespace) builds a class whose attributes (dunders too) are strings
            self.add("builtin", TYPE3, node)
        if magic is None:
            self.generic_visit(node)
        elif magic:  # %time, %%timeit: the code they run is read as the cell's own
            tree = parse(magic)
            if tree is not None:
                self.visit(tree)
            else:  # code the reader cannot parse, handed to a magic that may run it: fail closed
                self.add("builtin", "get_ipython", node)
        else:  # any other magic (!shell, %run, %load): code the list cannot read
            self.add("builtin", "get_ipython", node)

    def visit_Constant(self, node):
        if isinstance(node.value, complex):
            self.add("complex", repr(node.value), node)
        if isinstance(node.value, str):
            for d in sorted(set(re.findall(r"__\w+?__", node.value))):
                self.add("string", d, node)
            # a name to look up by text (attrgetter, a dict of a module): the ones no answer spells
            for w in sorted(set(re.findall(SPELLED, node.value))):
                self.add("string", w, node)


def uses(code: str, scope: Scope, nodes: list | None = None) -> list[tuple[str, str, int]]:
    """(kind, text, line) of every import, module path, attribute, builtin and given name ``code`` uses
    (or, given ``nodes``, statements of ``code`` already parsed, only those)."""
    if nodes is None:
        tree = parse(code)
        nodes = [] if tree is None else [tree]
    v = _Uses(scope)
    for node in nodes:
        v.visit(node)
    return v.found


def allowed(kind: str, text: str, tier: str) -> bool:
    """Whether a use is on the ``tier`` list ("by_hand" or "any")."""
    if _never(kind, text, tier):
        return False
    a = ALLOWED[tier]
    if (kind == "import" and text in BARE_IMPORTS) or (kind == "dotted" and text in EXITS):
        return True
    if kind in ("dotted", "import") and _course_helper(text) and (tier == "any" or _course_forward(text)):
        return True
    if kind == "import":  # a module, or an object imported from one (`from helpers.show import show`)
        return text in a["imports"] or text in a["dotted"]
    if kind == "dotted":
        parts = text.split(".")
        for k in range(len(parts), 0, -1):
            head = ".".join(parts[:k])
            if head in a["dotted"] or head in a["imports"]:
                return all(p in a["attributes"] for p in parts[k:])
        return False
    if kind == "attr":
        return text in a["attributes"]
    if kind == "builtin":
        return text in a["builtins"]
    if kind == "given":
        return text in a["given"]
    if kind == "string":
        return text in HARMLESS_DUNDERS
    return False


# the course's helper modules a learner may call in any code that is not a by-hand answer (the course's
# reference answers are named in the by-hand lists and guarded at run time); labcontract is the checks'
COURSE_HELPERS = re.compile(r"helpers(\.(?!labcontract\b)[A-Za-z]\w*)*")


def _course_helper(text: str) -> bool:
    """Whether a module path is the course's helpers or a public name the course defines in one
    (`helpers.cat_mlp.cat_params`, `helpers.lora.LoRALinear.merge`), not a module or function a helper
    imported (`helpers.attention.torch` is torch, with everything under it: red team s10)."""
    import importlib

    if COURSE_HELPERS.fullmatch(text) is None:
        return False
    parts = text.split(".")
    if len(parts) <= 2:
        return True
    try:
        obj = getattr(importlib.import_module(".".join(parts[:2])), parts[2])
    except Exception:  # noqa: BLE001 - not a name the course defines
        return False
    if not isinstance(obj, types.ModuleType) and not callable(obj):
        return True  # the course's data (helpers.block.BLOCK_PARAM_NAMES)
    home = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None)
    return isinstance(home, str) and (home == "helpers" or home.startswith("helpers."))


def _course_forward(text: str) -> bool:
    """Whether a path names a forward the course defines, ``helpers.<module>.<function>``, whose name says
    no gradient (``NOT_MATH``, "jacobian") in a module that is not the checks' (``lab*``): what a by-hand
    answer may call, as the labs promise ("every forward function": a newcomer's lab 7 answer calling
    ``layernorm_forward`` went to review). The course's backwards are refused at run time besides."""
    import importlib

    parts = text.split(".")
    if len(parts) != 3 or parts[1].startswith(("lab", "_")) or parts[2].startswith("_"):
        return False
    if NOT_MATH.search(parts[2]) or re.search("jacob|numgrad|numerical", parts[1] + "." + parts[2]):
        return False
    try:
        obj = getattr(importlib.import_module(".".join(parts[:2])), parts[2])
    except Exception:  # noqa: BLE001 - not a course function: not on the list
        return False
    return callable(obj) and (getattr(obj, "__module__", "") or "").startswith("helpers.")


def describe(kind: str, text: str) -> str:
    """How a note names a use: `import sys`, `torch.autograd.forward_ad.make_dual`, `.grad_fn`, `getattr`."""
    if kind == "import":
        return text if text == "a relative import" else f"import {text}"
    if kind == "attr":
        return f".{text}"
    if kind == "string":
        return f"a string holding {text}"
    if kind == "complex":
        return f"a complex number ({text})"
    if kind == "store":
        return f"an assignment to {text}"
    return text


def unlisted(
    code: str,
    scope: Scope,
    tier: str,
    released: str = "",
    also: frozenset = frozenset(),
    nodes: list | None = None,
) -> list[tuple[str, int, str]]:
    """What ``code`` uses that the ``tier`` list does not hold: [(construct, line, severity)], lines of
    ``released`` (the cell as handed out, for a given cell the student edited) excused, and uses in
    ``also`` ((kind, text): what the released notebook's own cells use) allowed. Severity:
    "reach" (could switch the grader's guards off), "gradient" (computes a gradient no run-time guard
    sees), "unlisted" (anything else off the list). ``nodes``: read only these statements of ``code``."""
    excused = {ln.strip() for ln in released.splitlines() if ln.strip()}
    lines = code.splitlines()
    out = []
    for kind, text, line in uses(code, scope, nodes):
        if (
            kind == "attr"
            and text in scope.own_attrs
            and not _never(kind, text, tier)
            and not _unseen(kind, text)
        ):
            if not _names_module(text):
                continue  # the student's own attribute (self.cache, ctx.shape)
        if allowed(kind, text, tier) or ((kind, text) in also and not _never(kind, text, tier)):
            continue
        if 0 < line <= len(lines) and lines[line - 1].strip() in excused:
            continue  # the released cell's own line (a self-check's getattr), not the student's code
        severity = "reach" if _never(kind, text, "any") else "gradient" if _unseen(kind, text) else "unlisted"
        out.append((describe(kind, text), line, severity))
    return out


# ordinary Python: every builtin but the few that reach into a running program
ORDINARY_BUILTINS = frozenset(
    n
    for n in dir(builtins)
    if not n.startswith("_") and n not in NEVER_ANY["builtins"] and not COMPLEX.search(n)
)

# Ordinary tensor work, vetted by hand: what an honest answer may use beyond what the solutions use
# (a student who writes `torch.matmul` where the solution has `@` did the exercise). Names here are
# allowed as `torch.X`, `F.X` and `tensor.X`; nothing that computes a gradient or reaches a graph.
# A module's forward-hook dicts: an honest check that hooks were removed reads len(net[0]._forward_hooks)
# (lab 5; the honest corpus's one review); the backward ones stay out, since writing into them registers
# a backward hook with no register_* call for the guard to see.
VETTED_TENSOR = """
T mT H abs absolute acos add add_ addcdiv_ addcmul_ addmm all allclose amax amin any arange argmax argmin
argsort asin atan atan2 baddbmm bfloat16 bmm bool broadcast_to cat ceil chunk clamp clamp_ clamp_max
clamp_min clip clone contiguous copy_ cos cosh count_nonzero cpu cross cumprod cumsum detach device diag
diag_embed diagonal diff dim div div_ dot double dtype einsum empty empty_like eq equal erf exp exp_ expand
expand_as eye fill_ flatten flip float float16 float32 float64 floor full full_like gather ge gelu gt half
index_add index_add_ index_fill index_select inner int int32 int64 is_contiguous isclose isfinite isinf isnan
item kron layer_norm le lerp lerp_ linear linspace log log1p log_softmax logical_and logical_not logical_or
logsumexp long lt masked_fill masked_fill_ masked_select matmul max maximum mean min minimum mm movedim mse_loss
mul mul_ multiply mv nan_to_num ndim ne neg neg_ new_empty new_full new_ones new_tensor new_zeros nonzero norm
numel one_hot ones ones_like outer pad permute pow prod rand rand_like randn randn_like reciprocal relu
repeat repeat_interleave requires_grad reshape reshape_as roll round rsqrt scatter scatter_add select shape
sigmoid sign silu sin sinh size softmax sort split sqrt sqrt_ square squeeze stack std stride sub sub_
subtract sum t tanh tensor tile to tolist topk trace transpose tril triu true_divide type_as unbind unflatten
unique unsqueeze var view view_as where zero_ zeros zeros_like
linalg vector_norm matrix_norm special expit logit softplus logsigmoid log_sigmoid dropout embedding
cross_entropy nll_loss binary_cross_entropy narrow index_put_ scatter_ scatter_add_ swapaxes indices
values type is_floating_point nelement element_size storage_offset sigmoid_ relu_ fill_diagonal_
isneginf isposinf signbit fmax fmin exp2 expm1 log2 log10 hypot abs_ square_ weight bias in_features out_features
modules named_modules children named_children parameters named_parameters
_forward_hooks _forward_pre_hooks
"""
# Public tensor math, by construction rather than by list: every public function, method, dtype and
# class of torch's math namespaces, less the names that compute or reach a gradient, hook into
# autograd, alias memory, serialise, compile or trace, or change a global setting. A student who
# writes `torch.linalg.solve` or `x.unsqueeze_(0)` did ordinary tensor work.
MATH_NAMESPACES = (
    "math",
    "torch.optim",
    "torch.optim.Optimizer",
    "itertools",
    "functools",
    "copy",
    "torch",
    "torch.Tensor",
    "torch.nn",
    "torch.nn.Module",
    "torch.nn.functional",
    "torch.linalg",
    "torch.special",
    "torch.fft",
)
NOT_MATH = re.compile(
    r"grad|backward|hook|register|storage|_ptr|share_memory|pin_memory|dlpack|from_file|frombuffer|save|load"
    r"|compile|script|jit|vmap|func|autograd|library|deterministic|anomaly|autocast|thread|^set_(?!rng_state)"
    # quantized tensors hand out their scale as a Python float, 22 bits of a value a call (red team 12)
    r"|quantiz|^q_|int_repr|dequantiz"
    # what copies attributes named by strings: functools.update_wrapper(w, obj, (), (name,)) is
    # getattr(obj, name) for any name built at run time (red team s8: grad_fn nodes walked so, 11/11);
    # what evaluates string annotations: functools.singledispatch's register (it handed back getattr)
    r"|wrap|dispatch"
    r"|" + COMPLEX.pattern
)


def public_math() -> frozenset:
    """The attribute names of ``MATH_NAMESPACES``' public functions, methods, dtypes and classes, less
    ``NOT_MATH`` (a namespace's submodules are not in it: `torch.linalg` is read part by part)."""
    import importlib
    import types

    names = set()
    for path in MATH_NAMESPACES:
        mod, _, attr = (
            path.rpartition(".") if path.count(".") and path.split(".")[-1][0].isupper() else (path, "", "")
        )
        obj = importlib.import_module(mod)
        obj = getattr(obj, attr) if attr else obj
        for n in dir(obj):
            if n.startswith("_") or NOT_MATH.search(n):
                continue
            if not isinstance(getattr(obj, n, None), types.ModuleType):
                names.add(n)
    return frozenset(names)


VETTED = {
    "imports": (
        "math",
        "torch",
        "torch.nn",
        "torch.nn.functional",
        "torch.optim",
        "functools",
        "itertools",
        "typing",
        "copy",
        # plain Python an honest answer reaches for (the honest corpus: a queue for a graph walk, a count
        # of uses, an isinstance against numbers.Real)
        "collections",
        "numbers",
    ),
    "dotted": (
        "collections.deque",
        "collections.Counter",
        "collections.defaultdict",
        "collections.OrderedDict",
        "numbers.Number",
        "numbers.Real",
        "numbers.Integral",
        "torch.Tensor",
        "torch.testing.assert_close",  # a scratch check: allclose with a message
        "torch.no_grad",
        "torch.finfo",
        "math.inf",
        "math.pi",
        "math.e",
        # the course's display and comparison helpers (a student's own check in a scratch cell)
        "helpers.show.show",
        "helpers.show.fmt",
        "helpers.checks.compare",
        "helpers.device.randn",
        "helpers.device.get_device",
        "helpers.device.no_tf32",
        "helpers.labcontract.ffn_block",  # lab 9's prose names it beside the given ffn_dropout
        # chapter 4's checks, which the labs ask learners to pass (they compare, they return a bool)
        "torch.autograd.gradcheck",
        "torch.autograd.gradgradcheck",
    ),
    # plain Python on lists, dicts and strings
    "attributes": tuple(VETTED_TENSOR.split())
    + tuple(public_math())
    # every public method of Python's lists, dicts, sets, tuples and strings (red team s10: a scratch
    # cell's `losses.clear()` or `name.strip()` sent every by-hand exercise to review)
    + tuple(n for t in (list, dict, set, frozenset, tuple, str) for n in dir(t) if not n.startswith("_"))
    + (
        "fft",
        "state",  # an optimizer's (the labs' hints print opt.state[p])
        # autograd's own way to keep a non-leaf's gradient: honest where autograd is allowed (a
        # newcomer's lab 5 recorder went to review for it); never where it is not (NEVER_BY_HAND)
        "retain_grad",
        "param_groups",
        "append",
        "extend",
        "items",
        "keys",
        "values",
        "get",
        "pop",
        "update",
        "insert",
        "format",
        "join",
        "popleft",
        "appendleft",
        "most_common",
        "setdefault",
        "from_iterable",  # itertools.chain's
        "__name__",  # type(x).__name__ in an error message
    ),
}

# BEGIN ALLOWED (written by `python tools/grader/reach.py derive --write` from the labs' solutions)
ALLOWED: dict = {
    "by_hand": {
        "imports": (),
        "dotted": (
            "helpers.attention.attention_backward",
            "helpers.attention.merge_heads",
            "helpers.attention.split_heads",
            "helpers.functions.gelu_backward",
            "helpers.numgrad.linear_backward",
            "helpers.numgrad.unbroadcast",
            "math.sqrt",
            "torch.arange",
            "torch.autograd.Function",
            "torch.autograd.function.once_differentiable",
            "torch.cat",
            "torch.exp",
            "torch.logsumexp",
            "torch.nn.functional.gelu",
            "torch.nn.functional.one_hot",
            "torch.ones_like",
            "torch.outer",
            "torch.relu",
            "torch.rsqrt",
            "torch.softmax",
            "torch.tanh",
            "torch.where",
            "torch.zeros",
            "torch.zeros_like",
        ),
        "attributes": (
            "T",
            "abs",
            "amax",
            "apply",
            "clamp",
            "clone",
            "detach",
            "device",
            "dtype",
            "flatten",
            "gather",
            "index_add_",
            "mark_non_differentiable",
            "masked_fill",
            "mean",
            "needs_input_grad",
            "pop",
            "pow",
            "reshape",
            "save_for_backward",
            "saved_tensors",
            "shape",
            "sum",
            "to",
            "transpose",
        ),
        "given": (),
    },
    "any": {
        "imports": ("math",),
        "dotted": (
            "helpers.attention.attention_backward",
            "helpers.attention.merge_heads",
            "helpers.attention.split_heads",
            "helpers.checkpoint.get_rng_state",
            "helpers.checkpoint.set_rng_state",
            "helpers.device.rand",
            "helpers.functions.gelu_backward",
            "helpers.labcontract.ffn_dropout",
            "helpers.micrograd.Value",
            "helpers.numgrad.linear_backward",
            "helpers.numgrad.unbroadcast",
            "math.cos",
            "math.exp",
            "math.inf",
            "math.pi",
            "math.sqrt",
            "math.tanh",
            "torch.arange",
            "torch.autograd.Function",
            "torch.autograd.function.once_differentiable",
            "torch.autograd.grad",
            "torch.autograd.graph.saved_tensors_hooks",
            "torch.cat",
            "torch.enable_grad",
            "torch.exp",
            "torch.float64",
            "torch.full",
            "torch.isfinite",
            "torch.isinf",
            "torch.log",
            "torch.logsumexp",
            "torch.maximum",
            "torch.nn.functional.cross_entropy",
            "torch.nn.functional.gelu",
            "torch.nn.functional.mse_loss",
            "torch.nn.functional.one_hot",
            "torch.nn.utils.clip_grad_norm_",
            "torch.no_grad",
            "torch.ones_like",
            "torch.outer",
            "torch.random.fork_rng",
            "torch.relu",
            "torch.rsqrt",
            "torch.softmax",
            "torch.sqrt",
            "torch.tanh",
            "torch.where",
            "torch.zeros",
            "torch.zeros_like",
        ),
        "attributes": (
            "T",
            "__setitem__",
            "_parents",
            "abs",
            "add",
            "all",
            "amax",
            "append",
            "apply",
            "backward",
            "children",
            "clamp",
            "clone",
            "cuda",
            "data",
            "data_ptr",
            "detach",
            "device",
            "double",
            "dtype",
            "flatten",
            "gather",
            "get",
            "grad",
            "index_add_",
            "item",
            "mark_non_differentiable",
            "masked_fill",
            "mean",
            "mul_",
            "named_modules",
            "nbytes",
            "needs_input_grad",
            "norm",
            "parameters",
            "pop",
            "pow",
            "register_forward_hook",
            "register_hook",
            "remove",
            "requires_grad",
            "requires_grad_",
            "reshape",
            "save_for_backward",
            "saved_tensors",
            "shape",
            "split",
            "sqrt",
            "step",
            "sub_",
            "sum",
            "to",
            "transpose",
            "untyped_storage",
            "zero_grad",
        ),
        "given": (),
    },
}
# END ALLOWED
for _tier in ALLOWED.values():
    for _k in ("imports", "dotted", "attributes", "given"):
        _tier[_k] = frozenset(_tier.get(_k, ())) | frozenset(VETTED.get(_k, ()))
    _tier["builtins"] = ORDINARY_BUILTINS


def _lab_cells(lab: str):
    """(the source's given code cells, its solution cells as [(source, question)], {question: by_hand}),
    from the lab's source and contract: what the lists need does not wait for a release."""
    import labs as L

    src = L.read_nb(L.source_path(lab))
    by_hand = {q.name: list(q.by_hand) for q in L.contract(lab).questions()}
    solutions = [(c.source, q) for q, where, c in L.regions(src) if where == "solution"]
    given = [c.source for q, where, c in L.regions(src) if where in ("setup", "prompt", "selfcheck")]
    return given, solutions, by_hand


def released_cells(nb, questions: list[str]) -> list[tuple[str, str | None]]:
    """The released notebook's code cells as (source, question of the answer cell or None for a given cell).

    The k-th answer cell (tagged `otter_answer_cell`) belongs to the k-th question: one answer cell
    per question (``tests/test_grader.py`` checks it for every lab)."""
    out, k = [], 0
    for c in nb["cells"]:
        if c.get("cell_type") != "code":
            continue
        src = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        if "otter_answer_cell" in (c.get("metadata") or {}).get("tags", []) and k < len(questions):
            out.append((src, questions[k]))
            k += 1
        else:
            out.append((src, None))
    return out


def tier_of(by_hand: list[str] | None) -> str:
    """The list a question's answer is read against: "by_hand" where it asks for the gradient by hand."""
    return "by_hand" if by_hand and "autograd" in by_hand else "any"


def derive(labs: list[str]) -> tuple[dict, list[str]]:
    """(the ALLOWED lists from the solutions of ``labs``, what the solutions use that can never be on one)."""
    got = {t: {k: set() for k in ("imports", "dotted", "attributes", "given")} for t in ("by_hand", "any")}
    refused = []
    key = {"import": "imports", "dotted": "dotted", "attr": "attributes", "given": "given"}
    for lab in labs:
        given, solutions, by_hand = _lab_cells(lab)
        sc = scope(given, [s for s, _ in solutions])
        for code, q in solutions:
            tiers = ("by_hand", "any") if tier_of(by_hand.get(q)) == "by_hand" else ("any",)
            for kind, text, line in uses(code, sc):
                if kind not in key or (kind == "attr" and text in sc.own_attrs):
                    continue
                for t in tiers:
                    if _never(kind, text, t):
                        refused.append(f"{lab} {q} line {line}: {describe(kind, text)} ({t})")
                    else:
                        got[t][key[kind]].add(text)
    return got, refused


def _write(got: dict, path) -> None:
    """Rewrite the ALLOWED block of this file with ``got``."""
    import json
    from pathlib import Path

    q = json.dumps  # double quotes, as ruff formats them
    lines = ["ALLOWED: dict = {"]
    for t, kinds in got.items():
        lines.append(f"    {q(t)}: {{")
        for k, names in kinds.items():
            if len(names) < 2:  # as ruff writes them: () and ("math",) on one line
                lines.append(f"        {q(k)}: ({''.join(q(n) + ',' for n in names)}),")
                continue
            lines.append(f"        {q(k)}: (")
            lines += [f"            {q(n)}," for n in sorted(names)]
            lines.append("        ),")
        lines.append("    },")
    lines.append("}")
    text = Path(path).read_text()
    start = text.index("# BEGIN ALLOWED")
    start = text.index("\n", start) + 1
    end = text.index("# END ALLOWED")
    Path(path).write_text(text[:start] + "\n".join(lines) + "\n" + text[end:])


def main(argv: list[str]) -> int:
    """`derive [--write]`: the lists the labs' solutions need (printed, or written into this file)."""
    from pathlib import Path

    from helpers.labcontract import module_at

    tools = Path(__file__).resolve().parents[1]
    module_at("nbtool", tools / "nbtool.py")  # what labs.py imports from beside itself
    L = module_at("labs", tools / "labs.py")

    got, refused = derive(L.labs())
    for r in refused:
        print("never allowed, but a solution uses it:", r)
    if "--write" in argv:
        _write(got, __file__)
    else:
        for t, kinds in got.items():
            for k, names in kinds.items():
                print(t, k, len(names), sorted(names))
    return 1 if refused else 0


# ------------------------------------------------------------------ a submission's cells


@dataclass
class Cell:
    """One code cell of a submission, as the grader runs and reads it."""

    number: int  # its place among all the notebook's cells, from 1 (as notes name cells)
    source: str  # what runs: the student's bytes, exactly
    kind: str  # "given" (as released), "edited" (a given cell the student changed), "answer", "added"
    owner: str | None  # the question whose part of the notebook it is in (None: before the first)
    released: str = ""  # the released cell it stands for ("" for a cell the student added)


@dataclass
class Plan:
    """What a submission runs and what of it goes to the instructor."""

    cells: list[Cell]
    review: dict = field(default_factory=dict)  # question -> constructs off its list (sorted)
    reach: list = field(default_factory=list)  # constructs off every list: all by-hand questions to review
    gradient: list = field(default_factory=list)  # gradients computed unseen: every autograd-by-hand question


SIMILAR = 0.5  # a submitted cell this like a released given cell (difflib's ratio) is that cell, edited
PAIRS = 4000  # similarity comparisons one changed stretch may take (a notebook of 5000 cells is not slow)


def _pairs(subs: list[str], rels: list[tuple[str, str | None]]) -> dict[int, int]:
    """Within one changed stretch: which submitted cell stands for which released one (indices).

    Most alike first; an answer cell takes any submitted cell (a finished answer may share little
    with its stub), a given cell only one at least SIMILAR to it."""
    if len(subs) * len(rels) > PAIRS:
        return {}  # nothing stands for a released cell: all are the student's own, read as added
    scored = sorted(
        (
            (-difflib.SequenceMatcher(None, r[:4000], s[:4000], autojunk=False).ratio(), j, i)
            for j, s in enumerate(subs)
            for i, (r, _) in enumerate(rels)
        )
    )
    out, taken = {}, set()
    for neg, j, i in scored:
        if j in out or i in taken or (rels[i][1] is None and -neg < SIMILAR):
            continue
        out[j] = i
        taken.add(i)
    return out


def classify(cells: list[tuple[int, str]], released: list[tuple[str, str | None]]) -> list[Cell]:
    """Each submitted code cell ((number, source)) as given, edited, answer or added, with its question.

    Cells equal to released ones anchor the alignment (difflib over whole cells); between anchors a
    cell stands for the released cell it is most like, or is one the student added, which belongs to
    the question whose answer cell comes last before it."""
    owners, region = [], None
    for _, owner in released:
        region = owner or region
        owners.append(region)
    subs = [s for _, s in cells]
    sm = difflib.SequenceMatcher(None, [r for r, _ in released], subs, autojunk=False)
    out = []
    for op, i1, i2, j1, j2 in sm.get_opcodes():
        if op == "equal":
            for k in range(i2 - i1):
                src, owner = released[i1 + k]
                n = cells[j1 + k][0]
                out.append(Cell(n, src, "answer" if owner else "given", owner or owners[i1 + k], src))
            continue
        pairs = _pairs(subs[j1:j2], released[i1:i2])
        answer = next((o for _, o in released[i1:i2] if o), None)
        before = owners[i1 - 1] if i1 > 0 else None
        for j in range(j1, j2):
            n, src = cells[j]
            i = pairs.get(j - j1)
            if i is None:
                out.append(Cell(n, src, "added", answer or before))
            else:
                rsrc, owner = released[i1 + i]
                out.append(Cell(n, src, "answer" if owner else "edited", owner or owners[i1 + i], rsrc))
    return out


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def _builtin_off_list(name: str) -> bool:
    """Whether ``name`` is a builtin's that the ordinary list leaves out (`exec`, `getattr`, `open`)."""
    return (hasattr(builtins, name) or name in NEVER_ANY["builtins"]) and name not in ORDINARY_BUILTINS


def _own_locals(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """The names a function or lambda binds in its own scope (its arguments, what its body assigns,
    defines, imports or deletes; not what a nested function, lambda or class binds), less those it
    declares global or nonlocal: as Python resolves them, these are the function's, not a builtin."""
    a = fn.args
    names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x is not None}
    declared = set()
    todo = list(fn.body) if isinstance(fn.body, list) else [fn.body]
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            declared.update(n.names)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names.update((x.asname or x.name).split(".")[0] for x in n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            names.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            names.add(n.rest)
        if isinstance(n, (*_SCOPES, *_COMPREHENSIONS)):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            # what runs in this scope: decorators, defaults, a comprehension's first iterable
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                todo += n.decorator_list
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                todo += [*n.args.defaults, *filter(None, n.args.kw_defaults)]
            if isinstance(n, ast.ClassDef):
                todo += [*n.bases, *n.keywords]
            if isinstance(n, _COMPREHENSIONS):
                todo.append(n.generators[0].iter)
            continue
        todo += ast.iter_child_nodes(n)
    return names - declared


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
# a container's methods that store what they are given in it (`tools.append(helper)` binds tools)
STORING_METHODS = frozenset(
    ("append", "extend", "insert", "update", "setdefault", "add", "appendleft", "extendleft", "__setitem__")
)


def _outer(node: ast.AST):
    """The nodes of ``node`` in its own scope: a nested def, class or lambda, but not its body."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if n is node or not isinstance(n, _SCOPES):
            todo += ast.iter_child_nodes(n)


def _bodies(node: ast.AST):
    """The outermost function, lambda and class definitions in ``node`` (``node`` itself if it is one)."""
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, _SCOPES):
            yield n
        else:
            todo += ast.iter_child_nodes(n)


def binds(node: ast.stmt) -> set[str]:
    """The names a top-level statement binds (a def, a class, an import, an assignment, a loop's target)."""
    out = set()
    for n in _outer(node) if not isinstance(node, _SCOPES) else [node]:
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {a.asname or a.name.split(".")[0] for a in n.names}
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:  # a pattern's capture binds a name
            out.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            out.add(n.rest)
        elif (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in STORING_METHODS
            and isinstance(n.func.value, ast.Name)
        ):
            out.add(n.func.value.id)  # `tools.append(g)`: what is stored in tools is tools'
        elif isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, ast.Store):
            base = n.value  # `box.f = g`, `tools["ag"] = g`: what is stored in box is box's
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            if isinstance(base, ast.Name):
                out.add(base.id)
    return out


def _reads(node: ast.stmt) -> set[str]:
    """The names a statement reads from the notebook's globals: which other statements it can call or use
    (a function's own arguments and locals are not the notebook's)."""
    loads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        local = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        local |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        local -= {g for n in ast.walk(node) if isinstance(n, (ast.Global, ast.Nonlocal)) for g in n.names}
        loads -= local
    return loads


def live(nodes: list[ast.stmt], roots) -> set[int]:
    """The indices of the top-level statements the names ``roots`` can run: those binding a root, then,
    transitively, those binding a name they read (a helper, an alias, a class)."""
    return live_each(nodes, {None: roots})[None]


def live_each(nodes: list[ast.stmt], roots: dict) -> dict:
    """``live`` for each of several sets of roots ({key: names} -> {key: indices}), reading each
    statement once."""
    binders: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for n in binds(node):
            binders.setdefault(n, []).append(i)
    reads: dict[int, set[str]] = {}
    out = {}
    for key, names in roots.items():
        # each name's binders are pushed once: 8,000 statements reading and rebinding one name made
        # this quadratic (red team 5: 32 s of a notebook's time limit, 35 s of the similarity pass)
        done = set(names)
        todo, seen = [i for n in done for i in binders.get(n, [])], set()
        while todo:
            i = todo.pop()
            if i not in seen:
                seen.add(i)
                if i not in reads:
                    reads[i] = _reads(nodes[i])
                new = reads[i] - done
                done |= new
                todo += [j for n in new for j in binders.get(n, [])]
        out[key] = seen
    return out


def _reached(parts: list[tuple[Cell, ast.stmt]], functions: dict, replaced: dict) -> list[set[str]]:
    """For each statement, the questions whose graded functions can run it (``live`` from their names),
    not following the definitions of ``replaced[q]``: an earlier exercise's functions, which q's hidden
    tests replace by their references (a mistake there is that exercise's alone)."""
    nodes = [node for _, node in parts]
    out = [set() for _ in parts]
    plain = {q: names for q, names in functions.items() if not replaced.get(q)}
    for q, seen in live_each(nodes, plain).items():
        for i in seen:
            out[i].add(q)
    for q, names in functions.items():
        if q in plain:
            continue
        keep = [i for i, node in enumerate(nodes) if not (binds(node) & set(replaced[q]))]
        for j in live([nodes[i] for i in keep], names):
            out[keep[j]].add(q)
    return out


def _names_a_reach(line: str) -> bool:
    """Whether a line's text names, as a word, a builtin, module or attribute that can reach around the
    grader (``NEVER_ANY``), or holds a dunder: read as text, since a line of a cell may not parse alone."""
    words = set(re.findall(r"[A-Za-z_]\w*", line))
    never = {
        *NEVER_ANY["builtins"],
        *NEVER_ANY["attributes"],
        *(d.split(".")[0] for d in NEVER_ANY["dotted"]),
    }
    return bool(words & never) or any(_is_dunder(w) and w not in HARMLESS_DUNDERS for w in words)


def _guarded(construct: str, guarded: set[str]) -> bool:
    """Whether a construct (as ``describe`` names it) is, or is a module of, a name a by-hand list guards."""
    text = construct.removeprefix("import ")
    if text.startswith("."):  # an attribute (`.register_full_backward_hook`): the guarded method's name
        return any(g.endswith(text) for g in guarded)
    return any(text == g or text.startswith(g + ".") or g.startswith(text + ".") for g in guarded)


def given_key(src: str) -> str:
    """A given cell's key in the release history: its stripped text's sha256 (16 hex digits)."""
    return hashlib.sha256(src.strip().encode()).hexdigest()[:16]


def given_record(given: list[str]) -> dict:
    """{"cells": [given_key], "lines": [stripped line]} of a release's given cells: its entry in the
    history of releases (labs/source/given_history.json, written by `tools/labs.py release`)."""
    return {
        "cells": sorted({given_key(c) for c in given if c.strip()}),
        "lines": sorted({ln.strip() for c in given for ln in c.splitlines() if ln.strip()}),
    }


def plan(
    cells: list[tuple[int, str]],
    released: list[tuple[str, str | None]],
    by_hand: dict,
    functions: dict | None = None,
    earlier: dict | None = None,
    replaced: dict | None = None,
) -> Plan:
    """Read a submission's code cells against the released ones: what each is, what goes to review.

    ``by_hand``: {question: its by_hand list}; ``functions``: {question: the names the grader calls}.
    A given cell as released is not read (it is the course's code); of a given cell the student edited,
    only the lines they wrote count. Every statement the student wrote is read twice:

    * against the list any answer may use: off it, every by-hand exercise goes to review, wherever the
      statement stands (before exercise 1 included). It runs, or can be called, before any hidden test,
      and whatever it changes stays changed in the process the hidden tests call into;
    * against the list of each by-hand exercise whose graded functions can run it (the function, the
      helpers and aliases it reads, transitively): off that list, that exercise goes to review.
      Without ``functions``, a statement in a by-hand exercise's part of the notebook is that exercise's.

    ``replaced``: {question: the earlier exercises' functions its hidden tests replace by their references}:
    their definitions are not read as that question's (a forbidden call in exercise 3 sent a correct
    exercise 4, graded with exercise 3's reference, to review).

    ``earlier``: the given cells of every release of the lab (``given_record``'s form): a notebook handed
    in from an earlier release has that release's given cells, which are the course's code too (a cell
    equal to one is given; a line of one, in a cell the student changed or added, is not theirs).
    """
    out = Plan(classify(cells, released))
    past = set((earlier or {}).get("cells", ()))
    for c in out.cells:
        if c.kind in ("edited", "added") and given_key(c.source) in past:
            c.kind, c.released = "given", c.source  # as an earlier release handed it out
    # an earlier release's line is excused where it stands in a cell the student wrote or changed, unless it
    # names what could reach around the grader: its names may be the student's by now (red team s8 pasted
    # lab 9's old `ns, saved_names = globals(), …` and `getattr(watch, n)` lines, rebound `watch` and
    # `saved_names` on lines of their own, and switched the by-hand guards off with nothing read)
    past_lines = "\n".join(ln for ln in (earlier or {}).get("lines", ()) if not _names_a_reach(ln))
    own = [c for c in out.cells if c.kind != "given"]
    given = [r for r, o in released if o is None]
    sc = scope(given, [c.source for c in own])
    # what the course's own cells use a student may use too (a self-check line copied to debug)
    also = frozenset((k, t) for g in given for k, t, _ in uses(g, sc))
    also |= {("dotted", t) for k, t in also if k == "import"}  # `cat_params()` after the given import
    parts = [(c, node) for c in own for node in getattr(parse(c.source), "body", [])]
    if functions is None:
        reached = [{c.owner} if by_hand.get(c.owner) else set() for c, _ in parts]
    else:
        reached = _reached(
            parts, {q: functions.get(q, ()) for q, names in by_hand.items() if names}, replaced or {}
        )
    # what a by-hand list names is guarded at run time in the exercises that refuse it: read only where reached
    guarded = {n for names in by_hand.values() for n in names if "." in n}
    # read a cell at a time (and a group of its statements that the same exercises reach), not a statement
    # at a time: a cell of many statements is read in time linear in its size
    groups: dict[int, dict[frozenset, list]] = {}
    for (c, node), qs in zip(parts, reached):
        groups.setdefault(id(c), {}).setdefault(frozenset(qs), []).append(node)
    reach, gradient, anywhere = set(), set(), set()
    review: dict[str, set] = {}
    for c in own:
        if id(c) not in groups:
            continue
        excuse = "\n".join(filter(None, (c.released if c.kind == "edited" else "", past_lines)))
        everywhere = set()
        every_node = [n for nodes in groups[id(c)].values() for n in nodes]
        reached_nodes = [n for qs, nodes in groups[id(c)].items() if qs for n in nodes]
        # a gradient computed unseen counts where a by-hand exercise can run it: in a statement its graded
        # functions reach by name, or in any function, lambda or class body, which can be handed on where
        # no name shows it (`_put(torch.Tensor, helper)`, a decorator, a default argument)
        callable_nodes = [b for n in every_node for b in _bodies(n)]
        unseen_here = {
            x
            for x, _, sev in unlisted(c.source, sc, "any", excuse, also, reached_nodes + callable_nodes)
            if sev == "gradient"
        }
        for construct, _, severity in unlisted(c.source, sc, "any", excuse, also, every_node):
            named = f"{construct} (cell {c.number})"
            if severity == "reach":  # could switch the guards off, wherever it stands
                reach.add(named)
            elif severity == "gradient":  # a gradient computed unseen: where a by-hand exercise can run it
                if construct in unseen_here:  # (at the top level it runs once, on the notebook's own values)
                    gradient.add(named)
            elif not _guarded(construct, guarded):
                anywhere.add(named)
            else:
                continue
            everywhere.add(construct)
        for qs, nodes in groups[
            id(c)
        ].items():  # and against the list of each by-hand exercise that can run it
            for tier in {tier_of(by_hand[q]) for q in qs}:
                for construct, _, _ in unlisted(c.source, sc, tier, excuse, also, nodes):
                    if construct not in everywhere:
                        for q in qs:
                            if tier_of(by_hand[q]) == tier:
                                review.setdefault(q, set()).add(f"{construct} (cell {c.number})")
    for q, names in by_hand.items():
        if not names:
            continue
        got = review.setdefault(q, set())
        got |= anywhere  # off every list, wherever it stands: every by-hand exercise
        if gradient and tier_of(names) == "by_hand":  # a gradient computed unseen: every autograd-by-hand one
            got |= gradient
    out.reach, out.gradient = sorted(reach), sorted(gradient)
    out.review = {q: sorted(v) for q, v in review.items() if v}
    return out


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
