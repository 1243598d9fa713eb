"""Turn what a student uploaded to Gradescope into a submission folder the grader reads.

Students upload either their whole tree (the release folder, possibly inside
another folder) or only the files they edited (`block_manager.py`, or
`engine/block_manager.py`). Either way the submission is the pristine release
package with the uploaded package files laid over it, so a file the student
did not upload holds the stubs it was handed out with (its regions count as
not attempted), never something of the instructor's.

Where an uploaded file goes:
- under a `student_exercises/` folder: the same path inside the package;
- anywhere else: the one package file whose path ends with the uploaded path
  (`block_manager.py` -> `engine/block_manager.py`), trying the longest
  suffix first; a name several package files share (`__init__.py`) is not
  guessed but named in the notes;
- the package's `tests/` (the public tests) are never used.
For labs graded on files other than code (report items), every file that is
not package code is copied as it lies relative to the tree's root (the folder
holding `student_exercises/`, or the upload's root).
Symbolic links, hidden folders (.git) and caches are skipped. Every decision
that drops or guesses something is returned as a note, shown to the student.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from labkit.tree import PACKAGE, TESTS_DIR

MAX_UPLOAD_FILES = 5000


@dataclass
class Placement:
    placed: dict[str, str] = field(default_factory=dict)        # package path -> uploaded path
    copied: list[str] = field(default_factory=list)              # report files copied as they lie
    notes: list[str] = field(default_factory=list)


def package_files(pristine: Path) -> list[str]:
    """Paths (posix, relative to the package) of the release package's files, public tests excluded."""
    return sorted(p.relative_to(pristine).as_posix() for p in pristine.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.relative_to(pristine).parts[0] != TESTS_DIR)


def uploaded_files(upload: Path, notes: list[str]) -> list[Path]:
    files = []
    for path in sorted(upload.rglob("*")):
        rel = path.relative_to(upload)
        if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
            continue
        if path.is_symlink():
            notes.append(f"{rel.as_posix()} is a symbolic link: ignored")
            continue
        if path.is_file():
            files.append(path)
        if len(files) >= MAX_UPLOAD_FILES:
            notes.append(f"more than {MAX_UPLOAD_FILES} files uploaded: the rest are ignored")
            break
    return files


def tree_root(upload: Path, files: list[Path]) -> Path:
    """The folder holding the shallowest uploaded `student_exercises/` (the upload's root when there is none)."""
    roots = []
    for path in files:
        parts = path.relative_to(upload).parts
        if PACKAGE in parts[:-1]:
            roots.append(upload.joinpath(*parts[:parts.index(PACKAGE)]))
    return min(roots, key=lambda p: (len(p.parts), str(p))) if roots else upload


def package_path(rel_parts: tuple[str, ...], known: list[str]) -> tuple[str | None, str]:
    """Where in the package an uploaded file belongs, or None and why not ("tests" for the public tests)."""
    inside = [i for i, part in enumerate(rel_parts[:-1]) if part == PACKAGE]
    if inside:
        inner = rel_parts[inside[-1] + 1:]
        if inner[0] == TESTS_DIR:
            return None, "tests"
        target = "/".join(inner)
        return (target, "") if target in known else (None, f"not a file of the release's {PACKAGE}/")
    for size in range(len(rel_parts), 0, -1):
        suffix = "/".join(rel_parts[-size:])
        matches = [k for k in known if k == suffix or k.endswith("/" + suffix)]
        if len(matches) == 1:
            return matches[0], ""
        if len(matches) > 1:
            return None, f"matches {len(matches)} package files ({', '.join(matches[:3])}...): upload it inside its folder"
    return None, "not a file of the release"


def place_upload(upload: Path, pristine: Path, dest: Path, copy_other_files: bool = False) -> Placement:
    """Write `dest/student_exercises/` (pristine package + uploaded package files) and return what happened."""
    out = Placement()
    known = package_files(pristine)
    package = dest / PACKAGE
    package.mkdir(parents=True, exist_ok=True)
    for rel in known:
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pristine / rel, package / rel)
    files = uploaded_files(upload, out.notes) if upload.is_dir() else []
    if not files:
        out.notes.append("the upload is empty: every exercise region is graded as handed out (not attempted)")
    root = tree_root(upload, files)
    skipped_tests, ignored = 0, []
    for path in files:
        rel_parts = path.relative_to(upload).parts
        target, why = package_path(rel_parts, known) if path.suffix == ".py" else (None, "not Python")
        shown = "/".join(rel_parts)
        if target is not None:
            if target in out.placed:
                out.notes.append(f"{shown} and {out.placed[target]} both go to {PACKAGE}/{target}: the first is kept")
                continue
            shutil.copyfile(path, package / target)
            out.placed[target] = shown
        elif why == "tests":
            skipped_tests += 1
        elif copy_other_files and path.is_relative_to(root) and PACKAGE not in path.relative_to(root).parts:
            rel = path.relative_to(root)
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / rel)
            out.copied.append(rel.as_posix())
        elif path.suffix == ".py":
            ignored.append(f"{shown} ({why})")
    if skipped_tests:
        out.notes.append(f"{skipped_tests} file(s) under {PACKAGE}/{TESTS_DIR}/ ignored: the public tests are not graded")
    if ignored:
        out.notes.append(f"not placed, so not graded: {'; '.join(ignored[:10])}"
                         + (f" and {len(ignored) - 10} more" if len(ignored) > 10 else ""))
    for target, shown in sorted(out.placed.items()):
        if shown != f"{PACKAGE}/{target}" and not shown.endswith(f"/{PACKAGE}/{target}"):
            out.notes.append(f"{shown} graded as {PACKAGE}/{target}")
    return out
