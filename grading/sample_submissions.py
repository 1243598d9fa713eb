"""Fake submissions in nbgrader's layout, for the grader's tests and the scale benchmark.

`write_submission(root, student, lab, choose)` writes
`root/<student>/<lab>/student_exercises/` generated from the reference with
`choose` deciding each region's body (None keeps the reference body), exactly
as a student's tree looks: markers and hints kept, imports pointing at
`student_exercises`. The presets are the three kinds of work a grader must
tell apart: the reference solution, untouched stubs, and a bug-zoo mutant.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from labkit.tree import PACKAGE, ReferenceTree, generate, write_package
from labkit.regions import Region, stub_body


def write_submission(root: Path, student: str, lab: str, tree: ReferenceTree,
                     choose: Callable[[Region], str | None], extra_files: Mapping[str, str] | None = None) -> Path:
    folder = root / student / lab
    write_package(generate(tree, choose), folder / PACKAGE)
    for relpath, text in (extra_files or {}).items():
        path = folder / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return folder


def solved(lab: str) -> Callable[[Region], str | None]:
    """The reference bodies for `lab` (and every other lab), as a student who got everything right."""
    return lambda region: None


def stubs(lab: str) -> Callable[[Region], str | None]:
    """`lab`'s regions untouched (still raising NotImplementedError); the others filled in."""
    return lambda region: stub_body(region) if region.lab == lab else None


def with_bodies(bodies: Mapping[str, str], tree: ReferenceTree) -> Callable[[Region], str | None]:
    """Reference bodies except the given ones (dedented text, indented here to each region's level)."""
    from labkit.regions import reindent
    return lambda region: reindent(bodies[region.region_id], region.indent) if region.region_id in bodies else None


def release_submission(root: Path, student: str, lab: str, tree: ReferenceTree,
                       edit: Callable[[str], str] | None = None, module: str = "") -> Path:
    """A submission as a student makes it: the lab's release, its regions holding the reference bodies,
    then `edit` applied to one module's text (e.g. adding an import and a helper outside the regions)."""
    from labkit.tree import splice
    from courseware.release import make_release
    folder = root / student / lab
    make_release(lab, folder)
    splice(folder / PACKAGE, {r.region_id: tree.body(r.region_id) for r in tree.regions if r.lab == lab})
    if edit is not None:
        path = folder / PACKAGE / module
        path.write_text(edit(path.read_text(encoding="utf-8")), encoding="utf-8")
    return folder


def insert_in_region(text: str, region_id: str, line: str) -> str:
    """`line` (indented like the region) as the first line of a region's body, after its hints."""
    lines = text.splitlines(keepends=True)
    begin = next(i for i, l in enumerate(lines) if l.strip().startswith(f"# >>> EXERCISE {region_id}:"))
    indent = lines[begin][:len(lines[begin]) - len(lines[begin].lstrip())]
    at = begin + 1
    while lines[at].strip().startswith("# HINT:"):
        at += 1
    lines.insert(at, indent + line + "\n")
    return "".join(lines)


def searchable_folder(prefix: str):
    """A temp folder every user may search, removed at the end (a context manager).

    pytest's temp folders are 0700: the grader's unprivileged user (uid 65534)
    reaches a harness there only through the mounts the process fence makes in
    the item's namespace (`grading.process_fence.expose`); tests that grade in
    here take the plain path, with nothing of the harness mounted.
    """
    import contextlib
    import os
    import tempfile

    from grading.execute import clear

    @contextlib.contextmanager
    def folder():
        path = Path(tempfile.mkdtemp(prefix=prefix))
        os.chmod(path, 0o755)
        try:
            yield path
        finally:
            clear(path)
    return folder()
