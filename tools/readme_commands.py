"""The README's commands, as written: what CI runs, so the README is the test.

    python tools/readme_commands.py            # one command per line, comments dropped

The commands are the lines of the first ``bash`` block under the heading "## The two
commands" of README.md (a trailing ``# comment`` is dropped); the virtual environment CI makes
comes from the same section's text (``python3 -m venv .venv && . .venv/bin/activate``).
``.ci/run`` runs each line in a fresh clone; ``tests/test_readme.py`` checks that the block
holds the book and test commands and nothing else.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## The two commands"


def section(text: str, heading: str = SECTION) -> str:
    """The README's text from ``heading`` to the next heading of the same level."""
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def commands(text: str) -> list[str]:
    """The lines of the first ```bash block of the section, without comments or blank lines."""
    m = re.search(r"```bash\n(.*?)```", section(text), re.S)
    if m is None:
        raise ValueError(f"README.md: no ```bash block under {SECTION!r}")
    lines = [re.sub(r"\s+#.*$", "", ln).strip() for ln in m.group(1).splitlines()]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def venv_command(text: str) -> str:
    """The section's own virtual-environment command (in backticks)."""
    m = re.search(r"`(python3 -m venv \S+ && \. \S+/bin/activate)`", section(text))
    if m is None:
        raise ValueError(f"README.md: no `python3 -m venv ... && . .../bin/activate` under {SECTION!r}")
    return m.group(1)


def main() -> int:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    print(venv_command(text) if sys.argv[1:] == ["--venv"] else "\n".join(commands(text)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
