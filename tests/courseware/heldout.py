"""Held-out students: whole solutions written from a lab's handout alone, right ones and subtly wrong ones.

`assignments/labN_<topic>/private/students/<name>.py` holds data only (parsed with `ast`, never imported):

    \"\"\"One line: who the student is: right, or the mistake they make.\"\"\"
    RIGHT = True            # a right solution: every public test passes and the grader gives full marks
    BODIES = {"lab2.allocate": '''...''', ...}     # region id -> body (any indentation: re-indented here)
    ADDED = {"engine/block_manager.py": '''...'''} # optional: module-level definitions added at the end

Unlike a bug-zoo mutant (one edit of the reference body), a held-out student
writes every region of the lab in their own way, which is what the
self-check's prediction of the grade must hold for too (`private/` is never
shipped: these are checks of the course, not examples for students).
"""
from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

from labkit.labs import all_labs
from labkit.regions import Region
from labkit.tree import PACKAGE, BodyChoice, ReferenceTree, filled_labs, generate
from labkit.labs import earlier_labs


@dataclass(frozen=True)
class Student:
    lab: str
    name: str
    description: str
    right: bool
    bodies: dict[str, str]
    added: dict[str, str]

    @property
    def student_id(self) -> str:
        return f"{self.lab}/{self.name}"

    def choice(self, tree: ReferenceTree) -> BodyChoice:
        """The student's bodies in their lab's regions, the release's everywhere else."""
        missing = [rid for rid in self.bodies if rid not in {r.region_id for r in tree.regions}]
        if missing:
            raise ValueError(f"{self.student_id}: no region {missing}")
        release = filled_labs(earlier_labs(self.lab, tree.root))

        def choose(region: Region) -> str | None:
            body = self.bodies.get(region.region_id)
            if body is None:
                return release(region)
            return "".join(region.indent + line if line.strip() else "\n"
                           for line in textwrap.dedent(body).strip("\n").splitlines(keepends=True)) + "\n"
        return choose

    def package(self, tree: ReferenceTree) -> dict[str, str]:
        """The student's `student_exercises/` (module path -> text), additions appended to their modules."""
        files = generate(tree, self.choice(tree))
        for relpath, text in self.added.items():
            files[relpath] = files[relpath].rstrip("\n") + "\n\n\n" + textwrap.dedent(text).strip("\n") + "\n"
        return files


def load_student(path: Path, lab: str) -> Student:
    module = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    values = {node.targets[0].id: ast.literal_eval(node.value) for node in module.body
              if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)}
    description = ast.get_docstring(module) or ""
    if not description or "\n" in description or not values.get("BODIES"):
        raise ValueError(f"{path}: needs a one-line docstring and BODIES")
    return Student(lab, path.stem, description, bool(values.get("RIGHT", False)), dict(values["BODIES"]),
                   dict(values.get("ADDED", {})))


def load_students(root: Path | None = None) -> list[Student]:
    labs = all_labs(root) if root else all_labs()
    return [load_student(path, lab.lab_id) for lab in labs
            for path in sorted((lab.private / "students").glob("*.py"))]


__all__ = ["PACKAGE", "Student", "load_student", "load_students"]
