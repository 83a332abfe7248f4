"""Author, execute and check the course notebooks.

    python tools/nbtool.py build SRC.py OUT.ipynb   # jupytext percent script -> executed notebook
    python tools/nbtool.py export NB.ipynb SRC.py   # notebook -> percent script (to edit it)
    python tools/nbtool.py execute NB.ipynb [...]   # re-execute in place (commit the outputs)
    python tools/nbtool.py sync-setup               # rewrite every setup cell from _config.yml
    python tools/nbtool.py check                    # every notebook has the right setup cell

The ipynb files are the source of truth.  ``build`` puts the Colab setup cell
first (tagged ``remove-cell`` so the site hides it), executes the notebook from a
temporary working directory (notebooks must not depend on the cwd) and strips
volatile metadata so diffs stay small.
"""
from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SETUP_MARK = "# Colab setup"


def repo_url() -> str:
    """The repository URL from _config.yml (repository.url)."""
    text = (ROOT / "_config.yml").read_text()
    m = re.search(r"^repository:\s*\n(?:\s+#.*\n)*\s+url:\s*(\S+)", text, re.M)
    if not m:
        raise SystemExit("_config.yml has no repository.url")
    return m.group(1)


def setup_source(extra: str = "") -> str:
    """The first code cell of every notebook: installs the helpers in Colab only."""
    spec = f"backprop-by-hand{extra} @ git+{repo_url()}"
    return (
        f"{SETUP_MARK} (hidden on the site): in Colab, install the course helpers; elsewhere do nothing.\n"
        "import sys\n"
        "if \"google.colab\" in sys.modules:\n"
        f"    %pip install -q \"{spec}\""
    )


def setup_cell(extra: str = "") -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(setup_source(extra))
    cell.metadata["tags"] = ["remove-cell"]
    return cell


def _extra_of(src: str) -> str:
    m = re.search(r'backprop-by-hand(\[[a-z,]+\])? @', src)
    return m.group(1) or "" if m else ""


def ensure_setup(nb) -> None:
    """Put (or refresh) the setup cell as the first code cell."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            if cell.source.startswith(SETUP_MARK):
                cell.source = setup_source(_extra_of(cell.source))
                cell.metadata["tags"] = ["remove-cell"]
                cell.outputs = []
                return
            break
    first_code = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code"), len(nb.cells))
    nb.cells.insert(first_code, setup_cell())


def clean(nb) -> None:
    """Drop volatile metadata (timings, ids of executions) from a notebook."""
    if not _has_widgets(nb):
        nb.metadata.pop("widgets", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("ExecuteTime", None)


def _has_widgets(nb) -> bool:
    return any("application/vnd.jupyter.widget-view+json" in o.get("data", {})
               for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def execute(path: Path, timeout: int = 600) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    ensure_setup(nb)
    with tempfile.TemporaryDirectory() as cwd:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": cwd}}, store_widget_state=True)
        client.execute()
    clean(nb)
    leaks = re.findall(r"(?<![\w.~-])/(?:work|tmp|root|home)/\S*", nbformat.writes(nb))
    if leaks:
        raise SystemExit(f"{path}: outputs show machine paths, e.g. {leaks[0]}")
    nbformat.write(nb, path)
    print(f"executed {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


def build(src: Path, out: Path) -> None:
    import jupytext

    nb = jupytext.read(src)
    nb = nbformat.from_dict(nb)
    ensure_setup(nb)
    if out.exists():
        keep_ids(nb, nbformat.read(out, as_version=4))
    nbformat.write(nb, out)
    execute(out)


def keep_ids(nb, old) -> None:
    """Reuse the old notebook's cell ids (same source first, else same position) so diffs show content."""
    by_source = {}
    for c in old.cells:
        by_source.setdefault((c.cell_type, c.source), []).append(c.get("id"))
    used = set()
    for i, c in enumerate(nb.cells):
        same = [x for x in by_source.get((c.cell_type, c.source), []) if x and x not in used]
        if not same and i < len(old.cells) and old.cells[i].cell_type == c.cell_type:
            same = [x for x in [old.cells[i].get("id")] if x and x not in used]
        if same:
            c["id"] = same[0]
            used.add(same[0])
    taken = {c.get("id") for c in nb.cells}
    if len(taken) != len(nb.cells):              # a positional reuse collided: fresh ids for the rest
        seen = set()
        for c in nb.cells:
            if c.get("id") in seen:
                c["id"] = nbformat.v4.new_code_cell().id
            seen.add(c["id"])


def export(nb_path: Path, src: Path) -> None:
    import jupytext

    nb = jupytext.read(nb_path)
    jupytext.write(nb, src, fmt="py:percent")


def notebooks() -> list[Path]:
    return sorted(p for d in ("chapters", "labs") for p in (ROOT / d).rglob("*.ipynb")
                  if ".ipynb_checkpoints" not in p.parts)


def check() -> list[str]:
    """Problems with setup cells, as one line each (empty when all is well)."""
    problems = []
    for path in notebooks():
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        rel = path.relative_to(ROOT)
        if not code or not code[0].source.startswith(SETUP_MARK):
            problems.append(f"{rel}: first code cell is not the Colab setup cell")
            continue
        if code[0].source != setup_source(_extra_of(code[0].source)):
            problems.append(f"{rel}: setup cell differs from _config.yml's repository URL")
        if "remove-cell" not in code[0].metadata.get("tags", []):
            problems.append(f"{rel}: setup cell is not tagged remove-cell")
    return problems


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    cmd, args = argv[0], [Path(a).resolve() for a in argv[1:]]
    if cmd == "build":
        build(*args)
    elif cmd == "export":
        export(*args)
    elif cmd == "execute":
        for p in args:
            execute(p)
    elif cmd == "sync-setup":
        for p in notebooks():
            nb = nbformat.read(p, as_version=4)
            ensure_setup(nb)
            nbformat.write(nb, p)
    elif cmd == "check":
        problems = check()
        print("\n".join(problems) or "all setup cells OK")
        raise SystemExit(1 if problems else 0)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
