"""The lab registry derives the labs from their files, and every lab list in the project is the registry's."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grading.cli import graded_labs as grading_labs
from inferlab.cli import build_parser
from labkit.tree import LABS, load_reference
from labkit.labs import ROOT, exercise_labs, graded_labs, lab_folder, release_labs


def _choices(parser, *path):
    for name in path:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[name]
    return parser


def test_registry_agrees_with_the_regions_and_the_rubrics():
    region_labs = sorted({r.lab for r in load_reference(ROOT).regions}, key=lambda lab: int(lab[3:]))
    assert exercise_labs() == region_labs == list(LABS)
    assert graded_labs() == sorted((p.name.split("_")[0] for p in (ROOT / "assignments").glob("lab*_*")
                                    if (p / "rubric.json").is_file()), key=lambda lab: int(lab[3:]))
    assert grading_labs() == graded_labs()
    assert all(lab_folder(lab).is_dir() for lab in graded_labs())


def test_cli_choices_come_from_the_registry():
    parser = build_parser()
    release = _choices(parser, "release")
    lab_action = next(a for a in release._actions if a.dest == "lab")
    assert list(lab_action.choices) == release_labs() == exercise_labs() + ["lab5"]


def test_a_release_layout_is_read_from_the_generated_tests(tmp_path):
    """A release ships a lab folder without public/ (its tests only in student_exercises/tests/): still a lab."""
    root = tmp_path / "repo"
    (root / "student_exercises" / "tests").mkdir(parents=True)
    for path in (ROOT / "student_exercises" / "tests").glob("test_lab*_*.py"):
        shutil.copy(path, root / "student_exercises" / "tests" / path.name)
    shutil.copytree(ROOT / "assignments", root / "assignments")
    (root / "student_exercises" / "tests" / "test_lab6_speculative.py").write_text("def test_x():\n    pass\n")
    (root / "assignments" / "lab6_speculative").mkdir()
    (root / "assignments" / "lab6_speculative" / "rubric.json").write_text("{}")
    assert exercise_labs(root) == exercise_labs() + ["lab6"]
    assert graded_labs(root) == graded_labs() + ["lab6"]
    assert lab_folder("lab6", root).name == "lab6_speculative"


# -- a throwaway lab: one folder (plus its region), picked up by every tool ------------------------

REGION = """

def lab6_double(x: int) -> int:
    \"\"\"A throwaway lab's one region.\"\"\"
    # >>> EXERCISE lab6.double: Return twice x.
    return 2 * x
    # <<< EXERCISE lab6.double
"""
LAB6 = {
    "README.md": "# Lab 6 (throwaway)\n\nWrite `lab6.double`.\n",
    "rubric.json": json.dumps({"lab": "lab6", "title": "Throwaway", "items": [
        {"id": "double", "title": "Doubling", "points": 100, "kind": "pytest", "select": ["hidden/lab6/test_double.py"],
         "public": ["test_lab6_throwaway.py::test_double"], "deadline_s": 60, "description": "Twice x, for a few x."}]}),
    "public/test_lab6_throwaway.py": (
        "import pytest\n\npytestmark = pytest.mark.lab6\n\n\n@pytest.mark.points(1)\n"
        "@pytest.mark.covers('lab6.double')\ndef test_double(impl):\n"
        "    assert impl.module('metrics').lab6_double(3) == 6, 'lab6.double(3) should be 6'\n"),
    "hidden/test_double.py": (
        "import student_exercises.metrics as metrics\n\n\ndef test_double(observe):\n"
        "    for x in (0, 1, 5):\n        observe(f'double {x}', metrics.lab6_double(x))\n"),
    "bugzoo/plus_two.py": '"""Adds two instead of doubling."""\nEDITS = {"lab6.double": [("2 * x", "x + 2")]}\n',
}
IGNORED = shutil.ignore_patterns(".git", ".venv", "venv", "__pycache__", "*.egg-info", "build", "inferlab_logs",
                                 ".perf", ".whl", ".pytest_cache")


def _inferlab(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the copy's own `inferlab` command (its packages first on the path, as a checkout would)."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "inferlab.cli", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600)
    if check:
        assert proc.returncode == 0, f"inferlab {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_a_throwaway_lab_is_one_folder(tmp_path):
    """docs/workflows.md's "Add a lab": one folder plus its region, and every tool picks it up."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT, root, ignore=IGNORED)
    metrics = root / "reference" / "metrics.py"
    metrics.write_text(metrics.read_text() + REGION)
    folder = root / "assignments" / "lab6_throwaway"
    for rel, text in LAB6.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)

    assert exercise_labs(root) == exercise_labs() + ["lab6"] and graded_labs(root)[-1] == "lab6"
    _inferlab(root, "exercises", "build")
    assert (root / "student_exercises" / "tests" / "test_lab6_throwaway.py").is_file()
    assert 'raise NotImplementedError("lab6.double")' in (root / "student_exercises" / "metrics.py").read_text()
    assert "lab6.double" in _inferlab(root, "exercises", "list").stdout
    assert "1/1" in _inferlab(root, "check", "lab6", "--impl", "reference").stdout
    assert _inferlab(root, "check", "lab6", check=False).returncode != 0, "the stub must fail its public test"

    listed = subprocess.run([sys.executable, "-c", "from courseware.bugzoo import load_mutants; "
                             "print([(m.lab, m.name) for m in load_mutants(lab='lab6')])"],
                            cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True)
    assert listed.stdout.strip() == "[('lab6', 'plus_two')]", listed.stdout + listed.stderr

    release = tmp_path / "release"
    _inferlab(root, "release", "--lab", "lab6", "--out", str(release))
    assert (release / "assignments" / "lab6_throwaway" / "README.md").is_file()
    assert not (release / "assignments" / "lab6_throwaway" / "hidden").exists()

    _inferlab(root, "golden", "build", "--lab", "lab6")
    golden = json.loads((folder / "golden.json").read_text())
    assert [obs[1] for obs in next(iter(golden["tests"].values()))] == [0, 2, 10]

    submissions = tmp_path / "submissions"
    solved = (release / "student_exercises" / "metrics.py").read_text().replace(
        'raise NotImplementedError("lab6.double")', "return x * 2")
    for student, text in (("alice", None), ("bob", solved), ("carol", solved.replace("x * 2", "x + 2"))):
        shutil.copytree(release, submissions / student / "lab6")
        if text is not None:
            (submissions / student / "lab6" / "student_exercises" / "metrics.py").write_text(text)
    _inferlab(root, "grade", "run", "--lab", "lab6", "--submissions", str(submissions), "--out", str(tmp_path / "out"))
    scores = {s: json.loads((tmp_path / "out" / f"{s}.json").read_text())["score"] for s in ("alice", "bob", "carol")}
    assert scores == {"alice": 0, "bob": 100, "carol": 0}, scores
