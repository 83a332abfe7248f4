"""One notebook per student from a folder of lab submissions exported from a learning platform.

``collect(folder)`` reads the top level of the export and returns one ``Submission`` per student,
sorted by student, whatever the layout:

* flat: ``alice.ipynb``, ``bob.IPYNB`` (the extension in any case): student = the file's stem;
* Moodle, "download submissions in folders": ``Alice Smith_12345_assignsubmission_file_/lab01.ipynb``:
  student = the folder name up to ``_<participant id>_assignsubmission_`` (for names without an
  underscore, the part before the first ``_``); the full folder name is kept in ``source``. The
  folders of one participant (``..._file_`` and ``..._onlinetext_``) are one student. Moodle's
  flat variant (``Alice Smith_12345_assignsubmission_file_lab01.ipynb``) is read the same way;
* Canvas: ``smithalice_12345_67890_lab01.ipynb``, ``smithalice_LATE_12345_67890_lab01-1.ipynb``:
  student = the part before the first ``_``; the files of one Canvas user id are one student
  (a resubmission is "two notebooks from one student");
* Gradescope: ``submission_123456/.../lab.ipynb``: student = the folder name
  (``submission_metadata.yml`` at the top is platform metadata, not a submission);
* generic: one folder per student, the notebook anywhere below it.

Not submissions, anywhere: hidden files and folders (``.DS_Store``, ``.ipynb_checkpoints/``,
``._x.ipynb``), ``__MACOSX/``, ``__pycache__/``, and at the top level the platforms' metadata
(``submission_metadata.yml``) and OS litter (``Thumbs.db``, ``desktop.ini``). Other files (a
``.py``, a ``.pdf``) are not graded, but a student whose folder or flat files hold no notebook at
all still gets a row, whose ``path`` is one of those files (or the folder itself when it is empty)
and whose ``is_notebook`` is False: the gradebook shows that student as "not-a-notebook".

A student with two or more notebooks: the newest by modification time is graded (ties broken by
the Canvas attachment id, then a ``-N`` resubmission suffix, then the name: deterministic), the
rest are listed in ``others``, and ``note`` says which was graded. Student names are unique even
ignoring case (so they are safe as file names on macOS and Windows too): two different folders
that give one name both get a suffix (the Moodle/Canvas id, else the folder or file name), and a
counter if that is not enough. Names are NFC-normalised; path separators, control characters,
leading dots and trailing dots/spaces are removed; letters of any script and spaces are kept.

    python collect.py SUBMISSIONS_FOLDER     # prints one line per student
"""

from __future__ import annotations

import os
import re
import sys
import unicodedata
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CollectError", "Submission", "collect", "one_student", "safe_name"]

NOTEBOOK_SUFFIX = ".ipynb"
# Never submissions, at any depth (hidden names, starting with ".", are skipped as well).
IGNORED_DIRS = frozenset({"__MACOSX", "__pycache__"})
# Never submissions at the top level of an export: platform metadata and OS litter.
IGNORED_TOP_FILES = frozenset(
    {"submission_metadata.yml", "submission_metadata.yaml", "thumbs.db", "desktop.ini"}
)
MAX_NAME_BYTES = 150  # a student's name, before any suffix: well under a file name's 255

_MOODLE = re.compile(
    r"^(?P<name>.+?)_(?P<id>\d+)_assign(?:submission|feedback)_"
    r"(?P<plugin>[A-Za-z0-9]+)_(?P<rest>.*)$",
    re.DOTALL,
)
_CANVAS = re.compile(r"^(?P<name>[^_]+)_(?:LATE_)?(?P<id>\d+)_(?P<attachment>\d+)_(?P<rest>.+)$", re.DOTALL)
_RESUBMISSION = re.compile(r"^(?P<base>.*?)-(?P<n>\d+)$", re.DOTALL)


class CollectError(ValueError):
    """The submissions folder cannot be read (missing, not a folder, unreadable)."""


@dataclass(frozen=True)
class Submission:
    student: str  # the gradebook's 'submission' column: unique, stable, filesystem-safe
    path: Path  # the file to grade (a notebook, or the non-notebook file for a not-a-notebook row)
    others: tuple[Path, ...] = ()  # other notebooks the same student handed in (not graded)
    note: str = ""  # e.g. "2 notebooks from this student: graded lab01-1.ipynb (the newest), not lab01.ipynb"
    source: str = (
        ""  # the export entry (folder or file name) the graded file came from, e.g. Moodle's full folder name
    )

    @property
    def is_notebook(self) -> bool:
        """False for a not-a-notebook row (the student handed in no notebook)."""
        return self.path.suffix.lower() == NOTEBOOK_SUFFIX and not self.path.is_dir()


@dataclass
class _File:
    path: Path
    label: str  # how the note names it: the original file name, or the path inside the student's folder
    entry: str  # the top-level entry it came from
    attachment: int = 0  # Canvas attachment id (a later upload has a larger one)

    @property
    def is_notebook(self) -> bool:
        return self.path.suffix.lower() == NOTEBOOK_SUFFIX


@dataclass
class _Group:
    identity: tuple[str, ...]  # what makes two entries one student; also the deterministic order
    name: str  # the student, before making it unique
    tag: str  # what tells this student apart from another of the same name
    entries: list[str] = field(default_factory=list)
    files: list[_File] = field(default_factory=list)
    folders: list[Path] = field(default_factory=list)


def safe_name(text: str, fallback: str = "unnamed") -> str:
    """``text`` as a file stem: NFC; no path separators, control characters, leading dots, or
    trailing dots/spaces; at most MAX_NAME_BYTES of UTF-8. Letters of any script and spaces stay."""
    text = unicodedata.normalize("NFC", text)
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "/\\" or cat in ("Cc", "Zl", "Zp"):
            continue  # separators, control characters, line breaks
        out.append("\ufffd" if cat == "Cs" else ch)  # undecodable bytes (surrogateescape)
    name = "".join(out).strip().lstrip(".").strip()
    encoded = name.encode("utf-8")
    if len(encoded) > MAX_NAME_BYTES:
        name = encoded[:MAX_NAME_BYTES].decode("utf-8", "ignore")
    name = name.rstrip(". ")
    return name or fallback


def _ignored(name: str) -> bool:
    return name.startswith(".") or name in IGNORED_DIRS


def _mtime_ns(path: Path) -> int:
    for stat in (os.stat, os.lstat):
        try:
            return stat(path).st_mtime_ns
        except OSError:
            pass
    return 0


def _walk(folder: Path) -> list[tuple[Path, str]]:
    """The files below ``folder`` (not following links to folders), hidden/ignored ones left
    out, each with its path relative to ``folder`` as a label; sorted."""
    found = []
    for root, dirs, files in os.walk(folder, onerror=lambda err: None):
        dirs[:] = sorted(d for d in dirs if not _ignored(d))
        rel = Path(root).relative_to(folder)
        for name in sorted(files):
            if not _ignored(name):
                found.append((Path(root) / name, (rel / name).as_posix()))
    return found


def _classify(entry: Path) -> tuple[tuple[str, ...], str, str, str, int]:
    """(identity, name, tag, label of a flat file, Canvas attachment id) of a top-level entry."""
    raw = entry.name
    moodle = _MOODLE.match(raw)
    if moodle:
        label = moodle["rest"] or raw
        return ("moodle", moodle["name"], moodle["id"]), moodle["name"], moodle["id"], label, 0
    if entry.is_dir():
        return ("folder", raw), raw, raw, raw, 0
    canvas = _CANVAS.match(raw)
    if canvas:
        return (
            ("canvas", canvas["name"], canvas["id"]),
            canvas["name"],
            canvas["id"],
            canvas["rest"],
            int(canvas["attachment"]),
        )
    stem = Path(raw).stem
    return ("file", stem), stem, raw, raw, 0


def _newest_first(files: list[_File]) -> list[_File]:
    def key(f: _File):
        stem = Path(f.label).stem
        resub = _RESUBMISSION.match(stem)
        n = int(resub["n"]) if resub else 0
        return (_mtime_ns(f.path), f.attachment, n, f.label, str(f.path))

    return sorted(files, key=key, reverse=True)


def _labels(files: list[_File]) -> list[str]:
    """How the note names these files: their labels, or their paths in the export if two labels
    are the same (one notebook name in two Moodle folders of one participant)."""
    labels = [f.label for f in files]
    if len(set(labels)) < len(labels):
        labels = [f"{f.entry}/{f.label}" if f.label != f.entry else f.entry for f in files]
    return labels


def _submission(group: _Group, student: str) -> Submission:
    notebooks = _newest_first([f for f in group.files if f.is_notebook])
    if notebooks:
        graded, rest = notebooks[0], notebooks[1:]
        note = ""
        if rest:
            labels = _labels(notebooks)
            why = "the newest"
            if _mtime_ns(rest[0].path) == _mtime_ns(graded.path):
                why = (
                    "tied for the newest: the later upload"
                    if graded.attachment != rest[0].attachment
                    else "tied for the newest: chosen by name"
                )
            note = (
                f"{len(notebooks)} notebooks from this student: graded {labels[0]} ({why}), "
                f"not {', '.join(labels[1:])}"
            )
        return Submission(student, graded.path, tuple(f.path for f in rest), note, graded.entry)
    others = _newest_first(group.files)
    if others:
        labels = _labels(others)
        shown = ", ".join(labels[:5]) + (f", and {len(labels) - 5} more" if len(labels) > 5 else "")
        return Submission(student, others[0].path, (), f"no notebook: handed in {shown}", others[0].entry)
    folder = sorted(group.folders)[0]
    return Submission(student, folder, (), "no notebook: the folder is empty", folder.name)


def _unique_names(groups: list[_Group]) -> dict[int, str]:
    """A unique (ignoring case) student name for each group, by index: a name shared by several
    groups gets each group's tag appended, then a counter if it is still not unique."""
    names = [safe_name(g.name) for g in groups]
    by_key: dict[str, list[int]] = defaultdict(list)
    for i, name in enumerate(names):
        by_key[name.casefold()].append(i)
    for indices in by_key.values():
        if len(indices) > 1:
            for i in indices:
                tag = safe_name(groups[i].tag, fallback="")
                if tag and tag.casefold() != names[i].casefold():
                    names[i] = f"{names[i]} ({tag})"
    counts: dict[str, int] = defaultdict(int)
    for name in names:
        counts[name.casefold()] += 1
    taken = {name.casefold() for name in names}
    result: dict[int, str] = {}
    seen: set[str] = set()
    for i in sorted(range(len(groups)), key=lambda i: groups[i].identity):
        name = names[i]
        if name.casefold() in seen:  # a repeat: the first (in identity order) kept it
            k = 2
            while f"{name} ({k})".casefold() in taken:
                k += 1
            name = f"{name} ({k})"
            taken.add(name.casefold())
        seen.add(name.casefold())
        result[i] = name
    return result


def collect(folder) -> list[Submission]:
    """One Submission per student in an LMS export folder, sorted by student."""
    root = Path(folder)
    if not root.exists():
        raise CollectError(f"submissions folder not found: {root}")
    if not root.is_dir():
        raise CollectError(f"submissions folder is not a folder: {root}")
    try:
        entries = sorted(os.listdir(root))
    except OSError as err:
        raise CollectError(f"cannot read submissions folder {root}: {err.strerror or err}") from None

    groups: dict[tuple[str, ...], _Group] = {}
    for raw in entries:
        entry = root / raw
        if _ignored(raw) or (raw.casefold() in IGNORED_TOP_FILES and not entry.is_dir()):
            continue
        identity, name, tag, label, attachment = _classify(entry)
        group = groups.setdefault(identity, _Group(identity, name, tag))
        group.entries.append(raw)
        if entry.is_dir():
            group.folders.append(entry)
            for path, rel in _walk(entry):
                group.files.append(_File(path, rel, raw))
        else:
            group.files.append(_File(entry, label, raw, attachment))

    ordered = sorted(groups.values(), key=lambda g: g.identity)
    names = _unique_names(ordered)
    subs = [_submission(g, names[i]) for i, g in enumerate(ordered)]
    return sorted(subs, key=lambda s: (s.student.casefold(), s.student))


def one_student(folder, student: str) -> Submission:
    """Everything under ``folder`` as one student's hand-in (Gradescope's /autograder/submission): the
    notebook graded and the note chosen as ``collect`` chooses them for a student's folder."""
    root = Path(folder)
    group = _Group(("folder", student), student, student, [root.name], [], [root])
    group.files = [_File(path, rel, root.name) for path, rel in _walk(root)]
    return _submission(group, student)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python collect.py SUBMISSIONS_FOLDER", file=sys.stderr)
        return 2
    try:
        subs = collect(args[0])
    except CollectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for s in subs:
        status = "notebook" if s.is_notebook else "not-a-notebook"
        print(f"{s.student}\t{status}\t{s.path}" + (f"\t{s.note}" if s.note else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
