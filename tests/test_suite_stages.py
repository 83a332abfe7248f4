"""The suite's own figures (benchmarks/suite_stages.py): pages/testing.md shows a passing full run, copied
from the run itself, and whether it met the budget; no committed result records a failing stage."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import suite_stages  # noqa: E402
from conftest import STAGE_NAMES  # noqa: E402

RUN = """\
figures:
  [lab01_cat_mlp] something measured

unit tests                    1012 tests    111.8 s
lint                             4 tests      0.3 s
text sources                    33 tests      8.2 s
lab format                     138 tests     19.0 s
Chinese edition                  7 tests      6.1 s
notebooks: chapters (nbval)    282 tests    102.1 s
notebooks: labs (nbval)        699 tests    147.7 s
no-Triton run                    6 tests     32.8 s
mistake catalogs                14 tests     51.9 s
grading in the sandbox          48 tests    423.2 s
site and browser                86 tests    105.0 s
all stages                    2329 tests   1008.1 s of test time, 524 s wall
[test] full run, install 0 s, tests 527 s (budget 600 s) on 2 workers (2 cores), exit {exit}
"""


def test_the_page_shows_a_passing_full_run_and_whether_it_met_the_budget():
    """What the page shows is a run's own table (its stages, adding up, exit 0) and says truly whether it
    met the budget (the times are a run's figures, never asserted: a slower machine is no failure)."""
    block = suite_stages.page_block((ROOT / "pages" / "testing.md").read_text())
    run = suite_stages.parse_run(block)
    assert list(run["stages"]) == list(STAGE_NAMES), run["stages"]
    assert sum(n for n, _ in run["stages"].values()) == run["tests"]
    assert abs(sum(s for _, s in run["stages"].values()) - run["test_time"]) < 0.1 * len(STAGE_NAMES)
    assert run["tier"] == "full" and run["exit"] == 0, run
    assert run["wall"] <= run["tests_s"], run
    met = run["tests_s"] <= suite_stages.BUDGET_S["full"]
    assert ("**Within the budget**" if met else "**Over the budget**") in block, block[-300:]


def test_the_page_writer_copies_a_passing_full_run_and_refuses_any_other(tmp_path):
    page = tmp_path / "testing.md"
    page.write_text(f"before\n{suite_stages.BEGIN}\nold\n{suite_stages.END}\nafter\n")
    stages = tmp_path / "stages.txt"
    for text, refused in [
        (RUN.format(exit=1), "not a passing full run"),
        (RUN.format(exit=0).replace("full run", "partial run"), "not a passing full run"),
        (RUN.format(exit=0).replace("lint  ", "lent  "), "stages"),
    ]:
        stages.write_text(text)
        assert refused in suite_stages.write_page(stages, page)
        assert "\nold\n" in page.read_text()
    stages.write_text(RUN.format(exit=0))
    assert suite_stages.write_page(stages, page) is None
    written = page.read_text()
    assert written.startswith("before\n") and written.endswith("after\n") and "old" not in written
    assert "[lab01_cat_mlp]" not in written  # the figures stay in the run's own output
    assert suite_stages.parse_run(suite_stages.page_block(written))["wall"] == 524
    assert "**Within the budget**: 527 s of at most 600 s" in written
    stages.write_text(RUN.format(exit=0).replace("tests 527 s", "tests 655 s"))
    assert suite_stages.write_page(stages, page) is None
    assert "**Over the budget**: 655 s, the budget is 600 s" in page.read_text()


def test_the_stage_benchmark_writes_no_result_when_a_stage_fails(tmp_path, monkeypatch, capsys):
    """suite_stages.py times every stage, the fast tier and the full run; one failing stage and it writes
    nothing (a committed figure is one of a passing run)."""
    out = tmp_path / "suite_stages.json"
    ran = []

    def timed(args):
        ran.append(args)
        return {"seconds": 1.0, "exit": int(args[:2] == ["--stage", "lint"]), "summary": ""}

    monkeypatch.setattr(suite_stages, "timed", timed)
    monkeypatch.setattr(sys, "argv", ["suite_stages.py", "--out", str(out)])
    assert suite_stages.main() == 1 and not out.exists()
    assert "not written: lint failed" in capsys.readouterr().err
    assert len(ran) == len(STAGE_NAMES) + 2
    monkeypatch.setattr(suite_stages, "timed", lambda args: {"seconds": 1.0, "exit": 0, "summary": ""})
    assert suite_stages.main() == 0 and json.loads(out.read_text())["full"]["exit"] == 0
