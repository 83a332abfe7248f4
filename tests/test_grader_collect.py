"""tools/grader/collect.py: one notebook per student, whatever the LMS export layout."""

import os
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
from collect import CollectError, Submission, collect, safe_name  # noqa: E402

T0 = 1_700_000_000  # a fixed modification time (seconds); later files get T0 + n


def put(root: Path, rel: str, mtime: float = T0, text: str = "{}") -> Path:
    """Write ``root/rel`` (parents made) and set its modification time."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    os.utime(path, (mtime, mtime))
    return path


def rows(subs):
    """{student: path relative to the export} for readable assertions."""
    return {s.student: s.path for s in subs}


def students(subs):
    return [s.student for s in subs]


# --------------------------------------------------------------------------- layouts


def test_flat_layout_any_extension_case(tmp_path):
    a = put(tmp_path, "alice.ipynb")
    b = put(tmp_path, "bob.IPYNB")
    subs = collect(tmp_path)
    assert students(subs) == ["alice", "bob"]
    assert rows(subs) == {"alice": a, "bob": b}
    assert all(s.is_notebook and s.others == () and s.note == "" for s in subs)


def test_moodle_folders_student_is_the_name_before_the_id(tmp_path):
    a = put(tmp_path, "Alice Smith_12345_assignsubmission_file_/lab01.ipynb")
    b = put(tmp_path, "Bob Jones_23456_assignsubmission_file_/sub/lab01.ipynb")
    subs = collect(tmp_path)
    assert students(subs) == ["Alice Smith", "Bob Jones"]
    assert rows(subs) == {"Alice Smith": a, "Bob Jones": b}
    # the full folder name stays available
    assert [s.source for s in subs] == [
        "Alice Smith_12345_assignsubmission_file_",
        "Bob Jones_23456_assignsubmission_file_",
    ]


def test_moodle_file_and_onlinetext_folders_of_one_participant_are_one_student(tmp_path):
    nb = put(tmp_path, "Alice Smith_12345_assignsubmission_file_/lab01.ipynb")
    put(tmp_path, "Alice Smith_12345_assignsubmission_onlinetext_/onlinetext.html", T0 + 50)
    [sub] = collect(tmp_path)
    assert (sub.student, sub.path, sub.others, sub.note) == ("Alice Smith", nb, (), "")


def test_moodle_flat_files(tmp_path):
    nb = put(tmp_path, "Alice Smith_12345_assignsubmission_file_lab01.ipynb")
    [sub] = collect(tmp_path)
    assert (sub.student, sub.path) == ("Alice Smith", nb)


def test_canvas_student_is_the_part_before_the_first_underscore(tmp_path):
    a = put(tmp_path, "smithalice_12345_67890_lab01.ipynb")
    b = put(tmp_path, "jonesbob_LATE_23456_67891_lab01.ipynb")
    subs = collect(tmp_path)
    assert rows(subs) == {"jonesbob": b, "smithalice": a}
    assert students(subs) == ["jonesbob", "smithalice"]


def test_canvas_resubmission_is_two_notebooks_from_one_student(tmp_path):
    old = put(tmp_path, "smithalice_12345_67890_lab01.ipynb", T0)
    new = put(tmp_path, "smithalice_LATE_12345_67999_lab01-1.ipynb", T0 + 60)
    [sub] = collect(tmp_path)
    assert (sub.student, sub.path, sub.others) == ("smithalice", new, (old,))
    assert sub.note == ("2 notebooks from this student: graded lab01-1.ipynb (the newest), not lab01.ipynb")


def test_gradescope_folders_and_metadata(tmp_path):
    a = put(tmp_path, "submission_123456/lab01.ipynb")
    b = put(tmp_path, "submission_234567/work/lab01.ipynb")
    put(tmp_path, "submission_metadata.yml", text="submission_123456:\n  :submitters: []\n")
    subs = collect(tmp_path)
    assert rows(subs) == {"submission_123456": a, "submission_234567": b}


def test_generic_folder_per_student_notebook_anywhere_below(tmp_path):
    a = put(tmp_path, "alice/deep/er/still/lab.ipynb")
    b = put(tmp_path, "bob/lab.ipynb")
    put(tmp_path, "bob/helpers.py", T0 + 100)
    put(tmp_path, "bob/data/notes.txt", T0 + 100)
    subs = collect(tmp_path)
    assert rows(subs) == {"alice": a, "bob": b}
    assert all(s.others == () and s.note == "" for s in subs)


# --------------------------------------------------------------------------- not submissions


def test_hidden_macosx_checkpoints_and_metadata_are_ignored(tmp_path):
    nb = put(tmp_path, "alice/lab.ipynb", T0)
    # newer copies that must not be taken for alice's notebook
    put(tmp_path, "alice/.ipynb_checkpoints/lab-checkpoint.ipynb", T0 + 100)
    put(tmp_path, "alice/._lab.ipynb", T0 + 100)
    put(tmp_path, "alice/.DS_Store", T0 + 100)
    # nor rows of their own
    put(tmp_path, ".DS_Store")
    put(tmp_path, "._alice.ipynb")
    put(tmp_path, ".hidden/lab.ipynb")
    put(tmp_path, ".ipynb_checkpoints/x-checkpoint.ipynb")
    put(tmp_path, "__MACOSX/alice/._lab.ipynb")
    put(tmp_path, "__MACOSX/bob/lab.ipynb")
    put(tmp_path, "submission_metadata.yml")
    subs = collect(tmp_path)
    assert [(s.student, s.path, s.others, s.note) for s in subs] == [("alice", nb, (), "")]


def test_a_non_notebook_beside_a_notebook_is_not_a_row(tmp_path):
    nb = put(tmp_path, "alice.ipynb", T0)
    put(tmp_path, "alice.py", T0 + 10)
    put(tmp_path, "alice.pdf", T0 + 10)
    [sub] = collect(tmp_path)
    assert (sub.student, sub.path, sub.others, sub.is_notebook) == ("alice", nb, (), True)


def test_folder_with_only_a_pdf_is_a_not_a_notebook_row(tmp_path):
    put(tmp_path, "alice/lab.ipynb")
    pdf = put(tmp_path, "carol/report.pdf")
    flat = put(tmp_path, "dave.pdf")
    subs = {s.student: s for s in collect(tmp_path)}
    assert sorted(subs) == ["alice", "carol", "dave"]
    assert subs["alice"].is_notebook
    assert (subs["carol"].path, subs["carol"].is_notebook) == (pdf, False)
    assert "report.pdf" in subs["carol"].note
    assert (subs["dave"].path, subs["dave"].is_notebook) == (flat, False)


def test_folder_with_nothing_but_hidden_files_still_gets_a_row(tmp_path):
    put(tmp_path, "erin/.DS_Store")
    put(tmp_path, "erin/.ipynb_checkpoints/lab-checkpoint.ipynb")
    [sub] = collect(tmp_path)
    assert (sub.student, sub.path, sub.is_notebook) == ("erin", tmp_path / "erin", False)


# --------------------------------------------------------------------------- several notebooks


@pytest.mark.parametrize("newer", ["lab01.ipynb", "lab01-final.ipynb"])
def test_two_notebooks_newest_is_graded_and_note_names_both(tmp_path, newer):
    older = "lab01-final.ipynb" if newer == "lab01.ipynb" else "lab01.ipynb"
    put(tmp_path, f"alice/{older}", T0)
    put(tmp_path, f"alice/{newer}", T0 + 60)
    [sub] = collect(tmp_path)
    assert sub.path == tmp_path / "alice" / newer
    assert sub.others == (tmp_path / "alice" / older,)
    assert sub.note == (f"2 notebooks from this student: graded {newer} (the newest), not {older}")


def test_three_notebooks_in_nested_folders(tmp_path):
    put(tmp_path, "alice/a/lab.ipynb", T0 + 10)
    put(tmp_path, "alice/b/lab.ipynb", T0 + 30)
    put(tmp_path, "alice/lab.ipynb", T0 + 20)
    [sub] = collect(tmp_path)
    assert sub.path == tmp_path / "alice/b/lab.ipynb"
    assert sub.others == (tmp_path / "alice/lab.ipynb", tmp_path / "alice/a/lab.ipynb")
    assert sub.note == (
        "3 notebooks from this student: graded b/lab.ipynb (the newest), not lab.ipynb, a/lab.ipynb"
    )


def test_canvas_same_mtime_the_later_upload_wins(tmp_path):
    put(tmp_path, "smithbob_3_5_zz.ipynb", T0)
    later = put(tmp_path, "smithbob_3_9_aa.ipynb", T0)  # larger attachment id: uploaded later
    [sub] = collect(tmp_path)
    assert sub.path == later
    assert sub.note == (
        "2 notebooks from this student: graded aa.ipynb (tied for the newest: the later upload), not zz.ipynb"
    )


def test_same_mtime_tie_is_broken_the_same_way_whatever_the_creation_order(tmp_path):
    first = tmp_path / "one"
    second = tmp_path / "two"
    put(first, "alice/x.ipynb", T0)
    put(first, "alice/y.ipynb", T0)
    put(second, "alice/y.ipynb", T0)
    put(second, "alice/x.ipynb", T0)
    [a], [b] = collect(first), collect(second)
    assert a.path.name == b.path.name == "y.ipynb"
    assert a.others[0].name == "x.ipynb"
    assert "x.ipynb" in a.note and "y.ipynb" in a.note


# --------------------------------------------------------------------------- names


def test_two_folders_giving_one_name_are_told_apart(tmp_path):
    put(tmp_path, "Alice Smith_111_assignsubmission_file_/lab.ipynb")
    put(tmp_path, "Alice Smith_222_assignsubmission_file_/lab.ipynb")
    subs = collect(tmp_path)
    names = students(subs)
    assert names == ["Alice Smith (111)", "Alice Smith (222)"]  # the Moodle participant id
    assert rows(subs)[names[0]].parent.name.startswith("Alice Smith_111")
    assert rows(subs)[names[1]].parent.name.startswith("Alice Smith_222")


def test_a_flat_file_and_a_folder_of_one_name_are_told_apart(tmp_path):
    put(tmp_path, "alice.ipynb")
    put(tmp_path, "alice/lab.ipynb")
    names = students(collect(tmp_path))
    assert len(names) == 2 and len({n.casefold() for n in names}) == 2


def test_moodle_names_differing_only_in_case_get_their_ids(tmp_path):
    put(tmp_path, "alice_1_assignsubmission_file_/lab.ipynb")
    put(tmp_path, "Alice_2_assignsubmission_file_/lab.ipynb")
    assert students(collect(tmp_path)) == ["alice (1)", "Alice (2)"]


def test_names_differing_only_in_case_are_unique_ignoring_case(tmp_path):
    put(tmp_path, "alice/lab.ipynb")
    if (tmp_path / "Alice").exists():
        pytest.skip("case-insensitive file system")
    put(tmp_path, "Alice/lab.ipynb")
    names = students(collect(tmp_path))
    assert len(names) == 2 and len({n.casefold() for n in names}) == 2


@pytest.mark.skipif(
    sys.platform == "win32", reason="Windows file names cannot hold '\\' or control characters"
)
def test_student_names_are_safe_file_stems(tmp_path):
    put(tmp_path, "a\\b\tc\x07 /lab.ipynb")  # a folder named 'a\b<TAB>c<BEL> '
    put(tmp_path, "José Núñez_7_assignsubmission_file_/lab.ipynb")
    nfd = unicodedata.normalize("NFD", "Zoë")
    put(tmp_path, f"{nfd}/lab.ipynb")
    subs = collect(tmp_path)
    names = students(subs)
    assert "abc" in names
    assert "José Núñez" in names
    assert "Zoë" in names  # NFC, whatever the file system wrote
    for n in names:
        assert "/" not in n and "\\" not in n and not n.startswith(".")
        assert n == n.strip() and all(unicodedata.category(c) != "Cc" for c in n)


def test_safe_name():
    assert safe_name("..secret") == "secret"
    assert safe_name("a/b\\c") == "abc"
    assert safe_name("line\nbreak\x00") == "linebreak"
    assert safe_name("Ana María López") == "Ana María López"
    assert safe_name("名前") == "名前"
    assert safe_name("trailing. ") == "trailing"
    assert safe_name("../..") == "unnamed"
    assert len(safe_name("é" * 500).encode()) <= 150


# --------------------------------------------------------------------------- errors, order


def test_missing_folder_raises_collect_error_naming_it(tmp_path):
    missing = tmp_path / "nope" / "subs"
    with pytest.raises(CollectError) as err:
        collect(missing)
    assert str(missing) in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


def test_a_file_is_not_a_submissions_folder(tmp_path):
    f = put(tmp_path, "subs.zip")
    with pytest.raises(CollectError, match="not a folder: .*subs.zip"):
        collect(f)


def test_empty_folder_gives_no_rows(tmp_path):
    assert collect(tmp_path) == []
    assert collect(str(tmp_path)) == []


def _mixed_export(root: Path, order: list[int]) -> None:
    items = [
        ("zed.ipynb", T0),
        ("Alice Smith_1_assignsubmission_file_/lab.ipynb", T0),
        ("Alice Smith_2_assignsubmission_file_/lab.ipynb", T0),
        ("smithbob_3_4_lab.ipynb", T0),
        ("smithbob_LATE_3_5_lab-1.ipynb", T0),  # same mtime: the later upload wins
        ("carol/report.pdf", T0),
        ("dave/a.ipynb", T0 + 1),
        ("dave/b.ipynb", T0 + 1),
        ("submission_9/x/lab.IPYNB", T0),
        ("submission_metadata.yml", T0),
        ("__MACOSX/zed.ipynb", T0),
    ]
    for i in order:
        put(root, items[i][0], items[i][1])


def test_deterministic_and_sorted(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    _mixed_export(one, list(range(11)))
    _mixed_export(two, list(reversed(range(11))))
    first = collect(one)
    assert collect(one) == first
    names = students(first)
    assert names == sorted(names, key=lambda n: (n.casefold(), n))
    assert len(set(names)) == len(names) == 7
    relative = lambda subs, root: [
        (
            s.student,
            s.path.relative_to(root),  # noqa: E731
            tuple(p.relative_to(root) for p in s.others),
            s.note,
        )
        for s in subs
    ]
    assert relative(collect(two), two) == relative(first, one)
    bob = {s.student: s for s in first}["smithbob"]
    assert bob.path.name == "smithbob_LATE_3_5_lab-1.ipynb"
    assert isinstance(first[0], Submission)
