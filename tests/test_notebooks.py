"""Repository-wide checks on the committed notebooks (not their outputs: nbval does that)."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import nbtool  # noqa: E402

NOTEBOOKS = nbtool.notebooks()


def test_there_are_notebooks():
    assert any(p.parent.name == "chapters" for p in NOTEBOOKS)


def test_every_notebook_has_the_colab_setup_cell_matching_config():
    assert nbtool.check() == []


def test_notebooks_are_committed_executed_and_show_no_machine_paths():
    for path in NOTEBOOKS:
        text = path.read_text()
        nb = json.loads(text)
        code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
        assert any(c.get("outputs") for c in code), f"{path.name} has no outputs"
        leak = re.search(r"(?<![\w.~-])/(work|tmp|root|home)/", text)
        assert not leak, f"{path.name} shows a machine path"


def test_toc_lists_only_existing_files_and_every_chapter():
    toc = (ROOT / "_toc.yml").read_text()
    files = re.findall(r"file:\s*(\S+)", toc)
    for f in files:
        assert any((ROOT / (f + ext)).exists() for ext in ("", ".md", ".ipynb")), f
    for path in NOTEBOOKS:
        rel = path.relative_to(ROOT).with_suffix("").as_posix()
        if path.parent.name == "chapters":
            assert rel in files, f"{rel} is not in _toc.yml"


def test_widget_state_is_kept_only_for_widgets_the_site_shows():
    """A live panel tagged remove-cell runs in Jupyter/Colab only: its saved state is dropped."""
    import nbformat

    view = {
        "output_type": "display_data",
        "metadata": {},
        "data": {"application/vnd.jupyter.widget-view+json": {}},
    }
    shown = nbformat.v4.new_code_cell("panel")
    shown.outputs = [nbformat.from_dict(view)]
    hidden = nbformat.v4.new_code_cell("panel", metadata={"tags": ["remove-cell"]})
    hidden.outputs = [nbformat.from_dict(view)]
    for cells, kept in (([shown], True), ([hidden], False), ([hidden, shown], True)):
        nb = nbformat.v4.new_notebook(cells=cells, metadata={"widgets": {"state": 1}})
        nbtool.clean(nb)
        assert ("widgets" in nb.metadata) is kept
    for path in ROOT.glob("chapters/*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        assert ("widgets" in nb.metadata) <= nbtool._has_widgets(nb), f"{path.name} keeps unused widget state"
