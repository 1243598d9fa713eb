"""Submissions: where they are, what is in them, and the student's region bodies cut out by id.

Layout (nbgrader's): `SUBMITTED/<student_id>/<labN>/`, holding the student's
`student_exercises/` and any report files. What runs is the bodies of the lab's
exercise regions plus the definitions the student added outside them
(`labkit.additions`: imports, helpers, constants, helper methods); any other
edit outside the regions is listed, never run. The tree is read once, by
`grading.tree_walk` (links, limits, odd names), into a private copy that the
rest of the grader reads; everything read is hashed, and a
file that would run code on its own (a `conftest.py`, a `sitecustomize.py`, a
`.pth`) is flagged only when the student added or changed it: the release's
own files (its tests' conftest.py, its pyproject.toml) are compared against the
release's hashes, never flagged.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from labkit.tree import PACKAGE, ReferenceTree, generate
from labkit.labs import exercise_labs
from labkit.tree import release_package
from grading.tree_walk import Limits, TreeReading, read_tree
from labkit.student_code import Extraction, RegionStatus, read_student_code

__all__ = ["Extraction", "RegionStatus", "Submission", "extract", "find_submissions", "given_package",
           "ignored_files", "missing_students", "read_submission"]

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")
IGNORED_NAMES = {"conftest.py": "a pytest conftest.py", "sitecustomize.py": "a sitecustomize.py",
                 "usercustomize.py": "a usercustomize.py", "pytest.ini": "a pytest.ini", "tox.ini": "a tox.ini",
                 "setup.cfg": "a setup.cfg", "pyproject.toml": "a pyproject.toml", "setup.py": "a setup.py",
                 "__main__.py": "a __main__.py"}


@dataclass(frozen=True)
class Submission:
    student_id: str
    lab: str
    path: Path

    @property
    def package(self) -> Path:
        return self.path / PACKAGE


def find_submissions(root: Path, lab: str, student: str | None = None) -> tuple[list[Submission], list[str]]:
    """Every `root/<student>/<lab>/` folder, sorted by student id; plus notes on folders skipped."""
    found, notes = [], []
    if not root.is_dir():
        raise FileNotFoundError(f"no submissions folder {root}")
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.name.startswith("."):
            continue
        if student is not None and folder.name != student:
            continue
        if not STUDENT_ID.match(folder.name):
            notes.append(f"skipped {folder.name!r}: not a valid student id")
            continue
        lab_dir = folder / lab
        if folder.is_symlink() or lab_dir.is_symlink():
            notes.append(f"skipped {folder.name}: a symbolic link, not a submitted folder")
            continue
        if not lab_dir.is_dir():
            notes.append(f"{folder.name}: no {lab}/ folder (nothing submitted)")
            continue
        found.append(Submission(folder.name, lab, lab_dir))
    if student is not None and not found:
        raise FileNotFoundError(f"no submission {root}/{student}/{lab}/")
    return found, notes


def missing_students(root: Path, lab: str) -> list[str]:
    """Students with a folder under `root` but no `<lab>/` in it: they are listed in grades.csv as missing."""
    if not root.is_dir():
        return []
    return sorted(folder.name for folder in root.iterdir()
                  if folder.is_dir() and not folder.is_symlink() and STUDENT_ID.match(folder.name)
                  and not folder.name.startswith(".") and not (folder / lab).exists())


def read_submission(folder: Path, limits: Limits | None = None, copy_to: Path | None = None) -> TreeReading:
    """Every file of a submission that the grader reads, hashed (and copied to `copy_to`): `grading.tree_walk`.

    Hashing for the resume rule and copying for grading are the same walk,
    so a result is kept only when every byte that was graded is unchanged.
    """
    return read_tree(folder, limits, copy_to)


def ignored_files(hashes: dict[str, str], shipped: dict[str, str] | None = None) -> list[str]:
    """Files that would run code if we let them, added or changed by the student; never copied anywhere.

    `shipped` holds the hashes of the lab's release: a file the release ships
    unchanged (its tests' conftest.py, its pyproject.toml) is not the student's doing.
    """
    notes = []
    for rel, digest in hashes.items():
        if shipped is not None and shipped.get(rel) == digest:
            continue
        name = rel.rsplit("/", 1)[-1]
        if name in IGNORED_NAMES:
            notes.append(f"{rel}: {IGNORED_NAMES[name]} in a submission is ignored (only region bodies are run)")
        elif name.endswith(".pth"):
            notes.append(f"{rel}: a .pth file in a submission is ignored")
    return notes


def given_package(tree: ReferenceTree, lab: str) -> dict[str, str]:
    """What a student of `lab` was given: the lab's release package (the whole generated engine for a lab
    without exercises). A grading run computes it once, not once per submission."""
    return release_package(tree, lab) if lab in exercise_labs(tree.root) else generate(tree)


def extract(submission_package: Path, tree: ReferenceTree, lab: str,
            given: dict[str, str] | None = None) -> Extraction:
    """The student's code for `lab`, read against what the student was given (`given_package`)."""
    return read_student_code(submission_package, given if given is not None else given_package(tree, lab), lab)
