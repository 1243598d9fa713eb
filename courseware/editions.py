"""The two editions of a tutorial: what students get and what the instructor teaches from.

A tutorial's source (tutorials/src/, courseware/tutorial_source.py) holds
everything: the lesson, the class exercises, the 参考答案 (cells tagged
`answer`) and notes for the instructor (markdown cells tagged `instructor`:
minutes per section, the numbers to expect and how much they vary). The
editions are cuts of one notebook: `inferlab build` cuts them from one
executed run, so the instructor's numbers and the students' pages come from
the same run, and the committed notebooks (tutorials/_make_notebooks.py) are
the student cut, without outputs:

- student: no `answer` and no `instructor` cells. The answers are left out
  rather than folded, because a PDF cannot fold, and an answer one page
  below its question is read before the question is tried.
- instructor: every cell; `instructor` notes are styled apart (the page's CSS
  class `celltag_instructor`).

The student repository (`inferlab release`, and build/experiments/assignment_<term>/)
gets the student cut of each notebook too, and not the percent-format sources
(tutorials/src/), which hold the answers in plain text. tests/courseware/test_answer_leaks.py
looks for every answer and note in the committed notebooks, the releases' and the student build.
"""
from __future__ import annotations

import copy

EDITIONS = ("student", "instructor")
HIDDEN_FROM_STUDENTS = frozenset({"answer", "instructor"})


def tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def edition(nb, which: str):
    """A copy of the notebook as that edition shows it."""
    if which not in EDITIONS:
        raise ValueError(f"unknown edition {which!r}; choose one of {EDITIONS}")
    out = copy.deepcopy(nb)             # a NotebookNode or the plain dict of the .ipynb JSON
    if which == "student":
        out["cells"] = [c for c in out["cells"] if not tags(c) & HIDDEN_FROM_STUDENTS]
    else:
        for cell in out["cells"]:
            if "answer" in tags(cell):                  # the instructor reads answers unfolded
                cell.get("metadata", {}).get("jupyter", {}).pop("source_hidden", None)
    return out
