"""Author, execute and check the course notebooks.

    python tools/nbtool.py build TEXT.py [OUT.ipynb]  # percent script -> executed notebook
    python tools/nbtool.py sync [NB.ipynb ...]        # notebook -> its paired text source
    python tools/nbtool.py sync --check [NB ...]      # exit 1 if a text source and its notebook disagree
    python tools/nbtool.py execute NB.ipynb [...]     # re-execute in place (commit the outputs)
    python tools/nbtool.py export NB.ipynb SRC.py     # notebook -> percent script anywhere (scratch copies)
    python tools/nbtool.py sync-setup                 # rewrite every setup cell from _config.yml
    python tools/nbtool.py check                      # every notebook has the right setup cell

Every chapter ``chapters/NN_name.ipynb`` and lab source ``labs/source/labNN_name.ipynb`` is
paired with a committed text source, ``src/NN_name.py`` next to it, in jupytext's
``py:percent`` format (the pairing is declared in ``chapters/jupytext.toml`` and
``labs/source/jupytext.toml``, so ``jupytext --sync`` and Jupyter's jupytext extension know it
too).  The executed ipynb is what nbval, the site and the lab release read; the text is what a
reviewer reads.  jupytext does the conversions and carries the outputs and cell ids over
(``combine_inputs_with_outputs``).  This file adds what jupytext cannot do: the Colab setup
cell (first code cell, tagged ``remove-cell``, from ``_config.yml``), executing from a
temporary working directory, stripping volatile metadata, refusing outputs that show a
machine path, and checking that every pair agrees.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

# nbformat imports jsonschema, and jsonschema imports its optional IRI format checker (rfc3987_syntax,
# installed because jupyter-events asks for jsonschema[format-nongpl]), which compiles 39 grammars:
# about 1 s in every process that reads a notebook, each grading's harness among them. No notebook
# schema has an IRI field, so the checker is left out (jsonschema skips it on an ImportError).
sys.modules.setdefault("rfc3987_syntax", None)
import nbformat  # noqa: E402

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
    """The first code cell of every notebook: installs the helpers in Colab only.

    Plain Python, no ``%pip`` magic: its text source must parse, so that ruff can lint it
    (jupytext comments a magic out, which would leave the ``if`` without a body).
    """
    spec = f"backprop-by-hand{extra} @ git+{repo_url()}"
    return (
        f"{SETUP_MARK} (hidden on the site): installs the course helpers in Colab only.\n"
        "import subprocess\n"
        "import sys\n"
        "\n"
        'if "google.colab" in sys.modules:\n'
        f'    spec = "{spec}"\n'
        '    subprocess.run([sys.executable, "-m", "pip", "install", "-q", spec], check=True)'
    )


def setup_cell(extra: str = "") -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(setup_source(extra))
    cell.metadata["tags"] = ["remove-cell"]
    return cell


def _extra_of(src: str) -> str:
    m = re.search(r"backprop-by-hand(\[[a-z,]+\])? @", src)
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
    # jupytext's read records metadata filters here; the folder's jupytext.toml holds them instead
    nb.metadata.pop("jupytext", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("ExecuteTime", None)
        if cell.cell_type == "code":
            cell.outputs = _merged_streams(cell.outputs)


def _merged_streams(outputs: list) -> list:
    """Consecutive stdout (or stderr) pieces as one output: how they were split is timing, not content."""
    out = []
    for o in outputs:
        prev = out[-1] if out else None
        if o.get("output_type") == "stream" and prev is not None and prev.get("output_type") == "stream":
            if prev.get("name") == o.get("name"):
                prev["text"] = "".join(prev["text"]) + "".join(o["text"])
                continue
        out.append(o)
    return out


def _has_widgets(nb) -> bool:
    """Whether the site shows a widget: a widget output in a cell the site keeps.

    A live panel tagged ``remove-cell`` runs in Jupyter and Colab only; keeping its saved state
    would make every reader download the widgets' JavaScript (about 1.9 MB) for nothing.
    """
    return any(
        "application/vnd.jupyter.widget-view+json" in o.get("data", {})
        for c in nb.cells
        if c.cell_type == "code" and "remove-cell" not in c.metadata.get("tags", [])
        for o in c.get("outputs", [])
    )


def execute(path: Path, timeout: int = 600) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    ensure_setup(nb)
    with tempfile.TemporaryDirectory() as cwd:
        client = NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": cwd}},
            store_widget_state=True,
        )
        client.execute()
    clean(nb)
    leaks = re.findall(r"(?<![\w.~-])/(?:work|tmp|root|home)/\S*", nbformat.writes(nb))
    if leaks:
        raise SystemExit(f"{path}: outputs show machine paths, e.g. {leaks[0]}")
    nbformat.write(nb, path)
    if text_of(path).exists() or path.resolve() in paired_notebooks():
        write_text(path)  # the setup cell may have been refreshed: keep the pair equal
    print(f"executed {_rel(path)}")


def build(src: Path, out: Path | None = None) -> None:
    """Text source -> executed notebook (outputs and cell ids of the old notebook carried over)."""
    import jupytext
    from jupytext.combine import combine_inputs_with_outputs

    if out is None:
        out = notebook_of(src)
    nb = nbformat.from_dict(jupytext.read(src, fmt=TEXT_FORMAT))
    ensure_setup(nb)
    if out.exists():
        nb = combine_inputs_with_outputs(nb, nbformat.read(out, as_version=4), fmt=TEXT_FORMAT)
    nbformat.write(nb, out)
    execute(out)


def export(nb_path: Path, src: Path) -> None:
    """Notebook -> a percent script at any path (same text as its paired source)."""
    src.write_text(to_text(nbformat.read(nb_path, as_version=4)))


# ------------------------------------------------------------------ paired text sources
# The folders whose notebooks are authored by hand (the student notebooks in labs/ are
# generated by tools/labs.py, so they have no text source).
PAIRED_DIRS = ("chapters", "labs/source")
TEXT_DIR = "src"  # = the prefix "src//" in each folder's jupytext.toml
TEXT_FORMAT = "py:percent"


def paired_notebooks(root: Path = ROOT) -> list[Path]:
    """Every notebook that has (or must have) a committed text source."""
    return sorted(p for d in PAIRED_DIRS for p in (root / d).glob("*.ipynb"))


def text_of(nb_path: Path) -> Path:
    """chapters/01_cat_mlp.ipynb -> chapters/src/01_cat_mlp.py"""
    return nb_path.parent / TEXT_DIR / (nb_path.stem + ".py")


def notebook_of(text_path: Path) -> Path:
    """chapters/src/01_cat_mlp.py -> chapters/01_cat_mlp.ipynb"""
    if text_path.parent.name != TEXT_DIR:
        raise SystemExit(
            f"{text_path}: not a paired text source (those live in <folder>/{TEXT_DIR}/); "
            "give the notebook to write: build TEXT.py OUT.ipynb"
        )
    return text_path.parent.parent / (text_path.stem + ".ipynb")


def _jupytext_config(folder: Path):
    """The folder's jupytext.toml (the pairing and metadata filters), or None outside PAIRED_DIRS."""
    from jupytext.config import find_jupytext_configuration_file, load_jupytext_configuration_file

    path = find_jupytext_configuration_file(str(folder))
    return load_jupytext_configuration_file(path) if path else None


def to_text(nb, folder: Path = ROOT / "chapters") -> str:
    """The notebook as its text source: no outputs, no header, cell tags kept."""
    import copy

    import jupytext

    nb = copy.deepcopy(nb)
    # Metadata filters recorded by an old jupytext read would override the folder's config.
    nb.metadata.pop("jupytext", None)
    return jupytext.writes(nb, fmt=TEXT_FORMAT, config=_jupytext_config(folder))


def _cells(nb) -> list[tuple[str, str, list]]:
    """What a pair must agree on: each cell's type, source and tags."""
    return [(c.cell_type, c.source, list(c.metadata.get("tags", []))) for c in nb.cells]


def write_text(nb_path: Path) -> bool:
    """(Re)write the notebook's text source; True if it changed."""
    text_path = text_of(nb_path)
    text = to_text(nbformat.read(nb_path, as_version=4), nb_path.parent)
    if text_path.exists() and text_path.read_text() == text:
        return False
    text_path.parent.mkdir(exist_ok=True)
    text_path.write_text(text)
    return True


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def sync_problem(nb_path: Path) -> str | None:
    """One line saying how a notebook and its text source disagree (None when they agree)."""
    import jupytext

    text_path = text_of(nb_path)
    fix = (
        f"edited the .py? run `python tools/nbtool.py build {_rel(text_path)}`; "
        f"edited the notebook? run `python tools/nbtool.py sync {_rel(nb_path)}`"
    )
    if not text_path.exists():
        return (
            f"{_rel(text_path)}: missing (the text source of {_rel(nb_path)}); "
            f"run `python tools/nbtool.py sync {_rel(nb_path)}`"
        )
    nb = _cells(nbformat.read(nb_path, as_version=4))
    txt = _cells(jupytext.read(text_path, fmt=TEXT_FORMAT))
    for i, (a, b) in enumerate(zip(nb, txt)):
        if a != b:
            what = "cell type" if a[0] != b[0] else "source" if a[1] != b[1] else "tags"
            return f"{_rel(text_path)}: cell {i} ({what}) differs from {_rel(nb_path)}; {fix}"
    if len(nb) != len(txt):
        return f"{_rel(text_path)}: {len(txt)} cells, {_rel(nb_path)} has {len(nb)}; {fix}"
    return None


def sync_problems(root: Path = ROOT) -> list[str]:
    """Every disagreement between a notebook and its text source, and every orphan text source."""
    problems = [m for p in paired_notebooks(root) if (m := sync_problem(p))]
    for d in PAIRED_DIRS:
        for text_path in sorted((root / d / TEXT_DIR).glob("*.py")):
            if not notebook_of(text_path).exists():
                problems.append(
                    f"{_rel(text_path)}: no notebook {_rel(notebook_of(text_path))}; "
                    f"build it (`python tools/nbtool.py build {_rel(text_path)}`) or delete the text"
                )
    return problems


def notebooks() -> list[Path]:
    return sorted(
        p
        for d in ("chapters", "labs")
        for p in (ROOT / d).rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts
    )


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
            problems.append(
                f"{rel}: setup cell is not the one nbtool writes from _config.yml; "
                "run `python tools/nbtool.py sync-setup`"
            )
        if "remove-cell" not in code[0].metadata.get("tags", []):
            problems.append(f"{rel}: setup cell is not tagged remove-cell")
    return problems


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    cmd = argv[0]
    flags = {a for a in argv[1:] if a.startswith("--")}
    args = [Path(a).resolve() for a in argv[1:] if not a.startswith("--")]
    if cmd == "build" and len(args) in (1, 2):
        build(*args)
    elif cmd == "export" and len(args) == 2:
        export(*args)
    elif cmd == "execute":
        for p in args:
            execute(p)
    elif cmd == "sync" and flags <= {"--check"}:
        if "--check" in flags:
            problems = [m for p in args if (m := sync_problem(p))] if args else sync_problems()
            print("\n".join(problems) or "every text source matches its notebook")
            raise SystemExit(1 if problems else 0)
        for p in args or paired_notebooks():
            if write_text(p):
                print(f"wrote {_rel(text_of(p))}")
    elif cmd == "sync-setup":
        for p in notebooks():
            nb = nbformat.read(p, as_version=4)
            ensure_setup(nb)
            nbformat.write(nb, p)
            if p in paired_notebooks():
                write_text(p)
    elif cmd == "check":
        problems = check()
        print("\n".join(problems) or "all setup cells OK")
        raise SystemExit(1 if problems else 0)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
