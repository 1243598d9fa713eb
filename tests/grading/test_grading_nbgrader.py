"""The nbgrader bridge: headless generate_assignment + autograde, scores read back and merged into grades.csv.

nbgrader is in the `grading` extra, not in `dev`: where it is not installed
this module is skipped (and counts as not run, never as passed).
"""
from __future__ import annotations

import csv
import json

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbgrader")

from grading.nbgrader_bridge import NBGRADER_FILE, run_nbgrader  # noqa: E402
from grading.report import make_reports  # noqa: E402


def _meta(**fields):
    base = {"grade": False, "locked": False, "schema_version": 3, "solution": False, "task": False}
    return {"nbgrader": {**base, **fields}}


def _notebook(answer: str):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell("# Question 1: speedup"),
                nbformat.v4.new_code_cell(answer, metadata=_meta(grade_id="answer", solution=True)),
                nbformat.v4.new_code_cell("assert speedup(3.0, 1.5) == 2.0",
                                          metadata=_meta(grade=True, grade_id="check", locked=True, points=3))]
    return nb


def test_nbgrader_scores_land_in_the_gradebook_rows(tmp_path):
    course = tmp_path / "course"
    (course / "source" / "lab5").mkdir(parents=True)
    nbformat.write(_notebook("def speedup(a, b):\n    ### BEGIN SOLUTION\n    return a / b\n    ### END SOLUTION"),
                   course / "source" / "lab5" / "analysis.ipynb")
    for student, body in (("ann", "def speedup(a, b):\n    return a / b"),
                          ("ben", "def speedup(a, b):\n    return b / a")):
        folder = course / "submitted" / student / "lab5"
        folder.mkdir(parents=True)
        nbformat.write(_notebook(body), folder / "analysis.ipynb")
    results = tmp_path / "results"
    results.mkdir()
    for student, score in (("ann", 100), ("ben", 40)):
        item = {"id": "sections", "title": "Sections", "kind": "report", "points": 100, "score": score,
                "status": "passed" if score == 100 else "failed", "message": "", "details": [], "flags": [],
                "tests": None, "wall_s": 0.0, "output_tail": "", "measurements": {}}
        (results / f"{student}.json").write_text(json.dumps({
            "format": 1, "complete": True, "lab": "lab5", "student_id": student, "score": score if score == 100 else 0,
            "max_score": 100, "gradable_points": 100, "blocked_points": 0, "items": [item], "regions": [],
            "flags": [], "notes": [], "files": {}, "submission_sha256": "", "rubric_sha256": "0" * 64,
            "golden_sha256": "", "environment": {"device": "cpu", "versions": {}, "spawn": "fork", "sandbox": None},
            "timing": {"started": "", "finished": "", "wall_s": 0.0}}))
    assert run_nbgrader("lab5", course, results) == 0
    merged = json.loads((results / NBGRADER_FILE).read_text())["scores"]
    assert merged == {"ann": {"score": 3.0, "max_score": 3.0}, "ben": {"score": 0.0, "max_score": 3.0}}
    rows = {r["student_id"]: r for r in csv.DictReader(open(make_reports(results).csv, encoding="utf-8"))}
    assert rows["ann"]["nbgrader_score"] == "3.0" and rows["ben"]["nbgrader_score"] == "0.0"
    assert rows["ann"]["score"] == "100"
