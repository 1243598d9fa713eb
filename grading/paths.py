"""Where the grader's inputs live, and what a graded process may not see.

Each lab's hidden tests, golden outputs and mutants live in its folder
(`labkit.labs`); the files copied into every harness live in
`grading/payload/`, under the module names they run as.
"""
from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

from labkit.labs import ROOT, lab

GRADING = Path(__file__).resolve().parent
PAYLOAD = GRADING / "payload"
SCHEMAS = GRADING / "schemas"
HARNESS_PACKAGE = "student_exercises"   # the one package of the course a graded process imports (its own copy)


def hidden_roots() -> list[Path]:
    """What a graded process may not read: the whole course repository (deny by default).

    Nothing in the repository is needed by graded code: its harness is a
    copy made elsewhere, so hiding the root hides every lab's hidden tests,
    golden outputs, mutants and private parts, and every folder added later,
    without a list to keep. What it must read is allowed explicitly by
    `readable_roots` (which wins over this), so a harness or virtualenv
    placed inside the repository still works.
    """
    return [ROOT]


def python_roots() -> list[Path]:
    """The Python installation a graded process imports its libraries from (even inside the repository).

    A folder that holds the repository itself (a Python installed in a parent
    of it) is left out: allowing it would allow everything it was to hide.
    """
    paths = {Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values()}
             if p and Path(p).exists()}
    return sorted(p for p in paths if not ROOT.is_relative_to(p))


def private_modules() -> list[str]:
    """Top-level names of the course repository a graded process may not import (all but its harness package)."""
    names = {p.stem if p.suffix == ".py" else p.name for p in ROOT.iterdir()
             if not p.name.startswith(".") and (p.is_dir() or p.suffix == ".py")}
    return sorted(names - {HARNESS_PACKAGE})


def golden_path(lab_id: str) -> Path:
    return lab(lab_id).golden


def golden_gpu_path(lab_id: str) -> Path:
    """GPU items' golden outputs, built on a GPU machine, beside the CPU ones (grading.golden)."""
    return lab(lab_id).golden_gpu


def hidden_dir(lab_id: str) -> Path:
    return lab(lab_id).hidden
