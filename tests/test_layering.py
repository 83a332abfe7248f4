"""Chapter N imports only what chapters ≤ N introduced: helper modules and notebooks, checked from their source."""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Course infrastructure every chapter may use (comparing, printing, devices, the lab self-checks).
INFRASTRUCTURE = {"__init__", "checks", "show", "device", "labcheck"}


def chapter_of(module: str) -> int | None:
    """The chapter a helper module says (in its docstring's first lines) it belongs to: '(chapter 6)'."""
    if module in INFRASTRUCTURE:
        return 0
    head = "\n".join((ROOT / "helpers" / f"{module}.py").read_text().splitlines()[:3])
    m = re.search(r"[Cc]hapters? (\d+)", head)
    return int(m.group(1)) if m else None


def helper_imports(code: str) -> set[str]:
    """Every helpers.X that code imports, at module level or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "helpers":
            if node.module == "helpers":
                out |= {a.name for a in node.names}
            else:
                out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("helpers.")}
    return out


MODULES = sorted(p.stem for p in (ROOT / "helpers").glob("*.py"))
# The labs' probes (helpers/labcontract.py) run a lab's answers the way that lab's contract says; a probe
# may import, inside itself, a module of the chapter its labs follow. Checked per function below.
PER_LAB = {"labcontract"}


def _later_imports_by_function(code: str, own: int) -> dict[str, set[str]]:
    """For each top-level function of code: the later chapters' helper modules it imports inside itself."""
    out = {}
    for node in ast.parse(code).body:
        if isinstance(node, ast.FunctionDef):
            later = {m for m in helper_imports(ast.unparse(node)) if (chapter_of(m) or 0) > own}
            if later:
                out[node.name] = later
    return out


def _callers(code: str) -> dict[str, set[str]]:
    """For each top-level function of code: the top-level functions that name it, directly or through others."""
    bodies = {n.name: ast.unparse(n) for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)}
    named = {f: {g for g, b in bodies.items() if g != f and re.search(rf"\b{f}\b", b)} for f in bodies}
    closed = {f: set(gs) for f, gs in named.items()}
    changed = True
    while changed:
        changed = False
        for f, gs in closed.items():
            more = set().union(*(closed[g] for g in gs)) - gs - {f} if gs else set()
            if more:
                gs |= more
                changed = True
    return closed


def test_a_probe_imports_only_chapters_its_labs_follow():
    """A function of helpers/labcontract.py that imports a later chapter's module is named (itself or
    through a function calling it) only by contracts of labs at or after that chapter."""
    contracts = {
        int(re.search(r"lab(\d+)", p.stem).group(1)): p.read_text()
        for p in (ROOT / "labs" / "source" / "contracts").glob("lab*.py")
    }
    for module in PER_LAB:
        code = (ROOT / "helpers" / f"{module}.py").read_text()
        callers = _callers(code)
        for fn, mods in _later_imports_by_function(code, chapter_of(module)).items():
            names = {fn} | callers[fn]
            labs = {n for n, src in contracts.items() if any(re.search(rf"\b{g}\b", src) for g in names)}
            need = max(chapter_of(m) for m in mods)
            early = {n for n in labs if n < need}
            assert labs and not early, (
                f"helpers/{module}.py: {fn} imports {sorted(mods)} (chapter {need}) but is used by labs "
                f"{sorted(labs) or 'none'}"
            )


@pytest.mark.parametrize("module", MODULES)
def test_a_helper_module_imports_only_earlier_chapters(module):
    own = chapter_of(module)
    assert own is not None, (
        f"helpers/{module}.py names no chapter in its docstring's first lines "
        "('(chapter N)'), nor is it infrastructure"
    )
    code = (ROOT / "helpers" / f"{module}.py").read_text()
    if module in PER_LAB:  # its functions' own imports are checked per lab above; the module's must hold
        code = "\n".join(ast.unparse(n) for n in ast.parse(code).body if not isinstance(n, ast.FunctionDef))
    later = {m: chapter_of(m) for m in helper_imports(code) if (chapter_of(m) or 0) > own}
    assert not later, f"helpers/{module}.py (chapter {own}) imports later chapters' modules: {later}"


def _code_of(notebook: Path) -> str:
    cells = json.loads(notebook.read_text())["cells"]
    lines = []
    for c in cells:
        if c["cell_type"] == "code":
            lines += [re.sub(r"^(\s*)[%!].*$", r"\1pass", ln) for ln in "".join(c["source"]).splitlines()]
    return "\n".join(lines)


@pytest.mark.parametrize(
    "notebook",
    sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "labs").glob("lab*.ipynb")),
    ids=lambda p: p.stem,
)
def test_a_chapter_or_lab_imports_only_what_chapters_up_to_it_introduced(notebook):
    n = int(re.search(r"(\d+)", notebook.stem).group(1))
    later = {m: chapter_of(m) for m in helper_imports(_code_of(notebook)) if (chapter_of(m) or 0) > n}
    assert not later, f"{notebook.name} (chapter {n}) imports later chapters' modules: {later}"


def test_the_rule_can_fail():
    assert helper_imports(
        "from helpers.flash import x\nimport helpers.lora\ndef f():\n    from helpers import gpt"
    ) == {"flash", "lora", "gpt"}
    assert chapter_of("flash") == 10 and chapter_of("attention") == 6 and chapter_of("checks") == 0
    code = "def a():\n    from helpers.flash import x\ndef b():\n    a()\ndef c():\n    pass"
    assert _later_imports_by_function(code, 1) == {"a": {"flash"}}
    assert _callers(code) == {"a": {"b"}, "b": set(), "c": set()}
