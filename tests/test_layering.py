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


@pytest.mark.parametrize("module", MODULES)
def test_a_helper_module_imports_only_earlier_chapters(module):
    own = chapter_of(module)
    assert own is not None, (
        f"helpers/{module}.py names no chapter in its docstring's first lines "
        "('(chapter N)'), nor is it infrastructure"
    )
    later = {
        m: chapter_of(m)
        for m in helper_imports((ROOT / "helpers" / f"{module}.py").read_text())
        if (chapter_of(m) or 0) > own
    }
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
