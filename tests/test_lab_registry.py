"""The lab registry derives the labs from their files, and every lab list in the project is the registry's."""
from __future__ import annotations

import shutil

from grading.cli import graded_labs as grading_labs
from inferlab.cli import build_parser
from inferlab.exercises import LABS, load_reference
from inferlab.labs import ROOT, exercise_labs, graded_labs, lab_folder


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
    assert list(lab_action.choices) == exercise_labs()


def test_a_new_lab_folder_is_picked_up(tmp_path):
    """Adding a lab is adding its files: a throwaway lab6 appears in both registries."""
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
