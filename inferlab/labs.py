"""The lab registry: which labs exist, derived from the files that make them, never from a list.

- A lab with exercises is one with a public suite, `student_exercises/tests/test_labN_*.py`. The
  same rule works in the course repository and in a student release (which ships only its own
  lab's suite), so the self-check offers exactly the labs a tree can check.
- A graded lab is one with `assignments/labN_<topic>/rubric.json`.

Adding a lab therefore means adding its files; every command, the generator, the release, the
grader and the tests read this module.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLIC_TESTS = Path("student_exercises") / "tests"
ASSIGNMENTS = Path("assignments")
_LAB = re.compile(r"^(?:test_)?(lab(\d+))_")


def _sorted_ids(names) -> list[str]:
    found = {m.group(1): int(m.group(2)) for name in names if (m := _LAB.match(name))}
    return sorted(found, key=found.get)


def exercise_labs(root: Path = ROOT) -> list[str]:
    """Labs with exercise regions and a public suite, in lab order."""
    return _sorted_ids(p.name for p in (root / PUBLIC_TESTS).glob("test_lab*_*.py"))


def graded_labs(root: Path = ROOT) -> list[str]:
    """Labs with a rubric, in lab order."""
    return _sorted_ids(p.parent.name for p in (root / ASSIGNMENTS).glob("lab*_*/rubric.json"))


def lab_folder(lab: str, root: Path = ROOT) -> Path:
    """assignments/labN_<topic>/ of a lab."""
    folders = sorted((root / ASSIGNMENTS).glob(f"{lab}_*/"))
    if len(folders) != 1:
        raise ValueError(f"unknown lab {lab!r}: expected one folder assignments/{lab}_<topic>/, found {len(folders)}")
    return folders[0]
