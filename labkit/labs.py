"""The lab registry: which labs exist and where each part of a lab lives, derived from the folders.

One lab is one folder, `assignments/labN_<topic>/`:

    README.md            the handout (Chinese), plus any report template beside it
    rubric.json          what is graded: a lab with a rubric is a graded lab
    public/              the public tests, `test_labN_*.py`: a lab with them is a lab with exercises
    hidden/              the hidden tests (instructor only)
    golden.json          the golden outputs (generated: `inferlab golden build`)
    golden_gpu.json      the GPU items' golden outputs (generated on a GPU machine)
    bugzoo/              the bug-zoo mutants (instructor only)
    private/             anything else for instructors only; private/source/ is an nbgrader assignment's
                         source, whose student copy (solutions stubbed, hidden tests removed) a release ships
    *.py                 scripts the students run (e.g. lab 5's `lab5_run.py`), shipped with the handout

`assignments/shared/public/` holds the fixtures every public suite uses
(conftest.py, the failure-message helpers, the lab 1 test doubles).
`student_exercises/tests/` is generated from the public parts
(`courseware.exercises`). A student release ships its lab's handout and
rubric in the same folder, but its public tests only where they run, in
`student_exercises/tests/` (one copy, so nobody edits the wrong one): the
registry looks there when a lab folder has no `public/`, so the self-check
in a release answers the same questions with the same rules.

Adding a lab therefore means adding one folder (plus its regions in
`reference/`); every command, the generator, the release, the self-check,
the grader and the tests read this module, never a list of their own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENTS = "assignments"
SHARED_PUBLIC = Path(ASSIGNMENTS) / "shared" / "public"
GENERATED_TESTS = Path("student_exercises") / "tests"
# The parts of a lab folder a student may see, besides its top-level scripts (`*.py`); everything else in
# it is instructor-only (instructor code goes under private/, so a script at the top is a student's tool).
PUBLIC_PARTS = ("README.md", "report_template.md", "rubric.json", "public")


def is_public_part(path: Path) -> bool:
    """True for a lab folder entry a student may see: a PUBLIC_PARTS name or a top-level script."""
    return path.name in PUBLIC_PARTS or (path.is_file() and path.suffix == ".py")
_FOLDER = re.compile(r"^(lab(\d+))_[a-z0-9_]+$")


@dataclass(frozen=True)
class Lab:
    """One lab's folder and the paths of its parts (which may not exist: a report-only lab has no tests)."""

    lab_id: str
    number: int
    folder: Path

    @property
    def rubric(self) -> Path:
        return self.folder / "rubric.json"

    @property
    def public(self) -> Path:
        return self.folder / "public"

    @property
    def hidden(self) -> Path:
        return self.folder / "hidden"

    @property
    def golden(self) -> Path:
        return self.folder / "golden.json"

    @property
    def golden_gpu(self) -> Path:
        return self.folder / "golden_gpu.json"

    @property
    def bugzoo(self) -> Path:
        return self.folder / "bugzoo"

    @property
    def private(self) -> Path:
        return self.folder / "private"

    @property
    def nbgrader_source(self) -> Path:
        """private/source/: an nbgrader assignment's source (notebooks with solutions, and their data files).

        A release ships what `nbgrader generate_assignment` would make of it
        (courseware/nbgrader_edition.py): never the source itself.
        """
        return self.private / "source"

    def public_tests(self) -> list[Path]:
        """The lab's public test modules: in public/, or (in a student release) where they were generated."""
        where = self.public if self.public.is_dir() else self.folder.parents[1] / GENERATED_TESTS
        return sorted(where.glob(f"test_{self.lab_id}_*.py"))

    def hidden_tests(self) -> list[Path]:
        return sorted(self.hidden.glob("*.py"))

    def private_parts(self) -> list[Path]:
        """Every entry of the folder that is not public: hidden tests, golden outputs, mutants, private/."""
        return sorted(p for p in self.folder.iterdir() if not is_public_part(p))

    def public_parts(self) -> list[Path]:
        """Every entry of the folder a student gets: handout, report template, rubric, public/, scripts."""
        return sorted(p for p in self.folder.iterdir() if is_public_part(p))


def all_labs(root: Path = ROOT) -> list[Lab]:
    """Every `assignments/labN_<topic>/` folder, in lab order; two folders for one lab are refused."""
    found: dict[str, Lab] = {}
    for folder in sorted((root / ASSIGNMENTS).iterdir()) if (root / ASSIGNMENTS).is_dir() else []:
        match = _FOLDER.match(folder.name)
        if not match or not folder.is_dir():
            continue
        lab_id = match.group(1)
        if lab_id in found:
            raise ValueError(f"two folders for {lab_id}: {found[lab_id].folder.name} and {folder.name}")
        found[lab_id] = Lab(lab_id, int(match.group(2)), folder)
    return sorted(found.values(), key=lambda lab: lab.number)


def lab(lab_id: str, root: Path = ROOT) -> Lab:
    """The lab called `lab_id` (e.g. "lab2"); ValueError names the labs there are."""
    for candidate in all_labs(root):
        if candidate.lab_id == lab_id:
            return candidate
    known = ", ".join(lab.lab_id for lab in all_labs(root)) or "none"
    raise ValueError(f"unknown lab {lab_id!r}: no folder {ASSIGNMENTS}/{lab_id}_<topic>/ (labs: {known})")


def lab_folder(lab_id: str, root: Path = ROOT) -> Path:
    """assignments/labN_<topic>/ of a lab."""
    return lab(lab_id, root).folder


def exercise_labs(root: Path = ROOT) -> list[str]:
    """Labs with a public suite (and so with exercise regions), in lab order."""
    return [lab.lab_id for lab in all_labs(root) if lab.public_tests()]


def release_labs(root: Path = ROOT) -> list[str]:
    """Labs a student gets a release of: those with exercises, and graded labs without them (lab 5's report)."""
    return [lab.lab_id for lab in all_labs(root) if lab.public_tests() or lab.rubric.is_file()]


def _place(lab_id: str, root: Path) -> int:
    labs = {entry.lab_id: entry.number for entry in all_labs(root)}
    if lab_id not in release_labs(root):
        raise ValueError(f"unknown lab {lab_id!r}; choose one of {', '.join(release_labs(root))}")
    return labs[lab_id]


def earlier_labs(lab_id: str, root: Path = ROOT) -> list[str]:
    """The exercise labs before `lab_id`: their regions come filled in a release of `lab_id`.

    For a lab without exercises (lab 5), every exercise lab before it: its
    release runs the whole engine, solutions of labs 1-4 included.
    """
    place = _place(lab_id, root)
    return [entry.lab_id for entry in all_labs(root) if entry.number < place and entry.public_tests()]


def later_labs(lab_id: str, root: Path = ROOT) -> list[str]:
    """The exercise labs after `lab_id`: their regions are stubs in a release of `lab_id`, their parts stand-ins."""
    place = _place(lab_id, root)
    return [entry.lab_id for entry in all_labs(root) if entry.number > place and entry.public_tests()]


def graded_labs(root: Path = ROOT) -> list[str]:
    """Labs with a rubric, in lab order."""
    return [lab.lab_id for lab in all_labs(root) if lab.rubric.is_file()]


def shared_public(root: Path = ROOT) -> list[Path]:
    """The fixtures shared by every public suite (assignments/shared/public/)."""
    return sorted(p for p in (root / SHARED_PUBLIC).glob("*.py"))
