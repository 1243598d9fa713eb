"""Where the grader's inputs live in the course repository."""
from __future__ import annotations

from pathlib import Path

GRADING = Path(__file__).resolve().parent
ROOT = GRADING.parent
GOLDEN = GRADING / "golden"
HIDDEN = GRADING / "hidden"
CHILD = GRADING / "child"
SCHEMAS = GRADING / "schemas"
ASSIGNMENTS = ROOT / "assignments"

# Folders of the course repository a graded process may not read: solutions, golden outputs, tooling, tests.
PRIVATE_DIRS = ("grading", "reference", "bugzoo", "assignments", "tests", ".git", "student_exercises", "inferlab",
                "slides_code", "tutorials", "scripts", "docs")
# Top-level packages a graded process may not import.
PRIVATE_MODULES = ("reference", "grading", "bugzoo", "tests", "inferlab")


def lab_folder(lab: str) -> Path:
    """assignments/labN_<topic>/ for `lab` (the folder names come from docs/labs.md's lab map)."""
    matches = sorted(ASSIGNMENTS.glob(f"{lab}_*"))
    if not matches:
        raise FileNotFoundError(f"no assignments/{lab}_*/ folder")
    return matches[0]


def rubric_path(lab: str) -> Path:
    return lab_folder(lab) / "rubric.json"


def golden_path(lab: str) -> Path:
    return GOLDEN / f"{lab}.json"
