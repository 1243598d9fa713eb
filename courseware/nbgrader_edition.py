"""The student copy of an nbgrader assignment, as `nbgrader generate_assignment` would release it.

A lab's nbgrader source (`assignments/labN_*/private/source/`) holds the
notebook with its solutions and hidden tests, and the data files it reads.
What students get is what nbgrader releases: every solution region replaced
by a stub, every hidden-test region removed, outputs cleared, and the other
files of the folder copied beside it. A lab's release (`inferlab release`)
ships that, so a student never needs the course repository, and the source
never leaves it.

Written here rather than by calling nbgrader, which is an optional extra (the
`grading` one) that the machine making a release need not have;
tests/courseware/test_answer_leaks.py compares this with nbgrader's own
ClearSolutions and ClearHiddenTests wherever nbgrader is installed. The
nbgrader metadata stays on the cells, so `nbgrader autograde` matches a
submitted copy to the source's graded cells as it would its own release.
"""
from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"
BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
TEXT_STUB = "YOUR ANSWER HERE"


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _replace_regions(source: str, begin: str, end: str, stub: str | None) -> str:
    """Each begin..end region (marker lines included) replaced by `stub` at the begin line's indent, or removed."""
    out, inside = [], False
    for line in source.split("\n"):
        marker = line.strip()
        if not inside and marker == begin:
            inside = True
            if stub is not None:
                indent = line[:len(line) - len(line.lstrip())]
                out += [indent + stub_line for stub_line in stub.split("\n")]
        elif inside and marker == end:
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"'{begin}' without '{end}'")
    return "\n".join(out)


def student_cell(cell: dict) -> dict:
    """A cell as nbgrader releases it."""
    out = copy.deepcopy(cell)
    meta = out.get("metadata", {}).get("nbgrader", {})
    source = _source(out)
    if meta.get("solution"):
        if BEGIN_SOLUTION in source:
            source = _replace_regions(source, BEGIN_SOLUTION, END_SOLUTION,
                                      CODE_STUB if out["cell_type"] == "code" else TEXT_STUB)
        else:
            source = CODE_STUB if out["cell_type"] == "code" else TEXT_STUB
    if BEGIN_HIDDEN in source:
        source = _replace_regions(source, BEGIN_HIDDEN, END_HIDDEN, None)
    out["source"] = source
    if out["cell_type"] == "code":
        out["outputs"], out["execution_count"] = [], None
    return out


def student_notebook(nb: dict) -> dict:
    out = copy.deepcopy(nb)
    out["cells"] = [student_cell(cell) for cell in out["cells"]]
    return out


def release_assignment(source: Path, dest: Path) -> list[str]:
    """Write the student copy of an nbgrader source folder into `dest`; return the names written."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for path in sorted(source.iterdir()):
        if path.is_dir() or path.name.startswith("."):
            continue
        if path.suffix == ".ipynb":
            nb = student_notebook(json.loads(path.read_text(encoding="utf-8")))
            (dest / path.name).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        else:
            shutil.copy2(path, dest / path.name)
        written.append(path.name)
    return written
