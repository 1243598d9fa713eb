"""Submissions: where they are, what is in them, and the student's region bodies cut out by id.

Layout (nbgrader's): `SUBMITTED/<student_id>/<labN>/`, holding the student's
`student_exercises/` and any report files. Only the bodies of the lab's
exercise regions are ever run; everything else is hashed, and anything that
looks like an attempt to run code outside the regions (a `conftest.py`, a
`sitecustomize.py`, a `.pth`, edits outside the regions) is named in the
result as ignored.

Built on the public functions of `courseware.regions` (parse_regions, stub_body);
`courseware.exercises` has no "bodies of one student's tree by id" function yet,
so that small piece lives here.
"""
from __future__ import annotations

import ast
import hashlib
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from courseware.exercises import PACKAGE, ReferenceTree, generate
from courseware.regions import Region, RegionError, parse_regions, stub_body

STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")
MAX_FILES = 2000
MAX_FILE_BYTES = 5 << 20
IGNORED_NAMES = {"conftest.py": "a pytest conftest.py", "sitecustomize.py": "a sitecustomize.py",
                 "usercustomize.py": "a usercustomize.py", "pytest.ini": "a pytest.ini", "tox.ini": "a tox.ini",
                 "setup.cfg": "a setup.cfg", "pyproject.toml": "a pyproject.toml", "setup.py": "a setup.py",
                 "__main__.py": "a __main__.py"}
# Names in a region body worth a TA's look; they never change a score (the sandbox and the judge do that).
SUSPICIOUS = {"_exit", "exit", "system", "popen", "Popen", "subprocess", "socket", "ctypes", "__import__",
              "importlib", "open", "builtins", "__builtins__", "modules", "settrace", "setprofile", "isclose",
              "testing", "signal", "kill", "sleep", "exec", "eval", "compile", "gc", "inspect", "pytest", "_pytest",
              "golden", "environ", "setattr", "globals", "addaudithook", "fork", "chdir", "remove", "unlink",
              "rmtree", "write_text", "write_bytes"}


@dataclass(frozen=True)
class Submission:
    student_id: str
    lab: str
    path: Path

    @property
    def package(self) -> Path:
        return self.path / PACKAGE


def find_submissions(root: Path, lab: str, student: str | None = None) -> tuple[list[Submission], list[str]]:
    """Every `root/<student>/<lab>/` folder, sorted by student id; plus notes on folders skipped."""
    found, notes = [], []
    if not root.is_dir():
        raise FileNotFoundError(f"no submissions folder {root}")
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or folder.name.startswith("."):
            continue
        if student is not None and folder.name != student:
            continue
        if not STUDENT_ID.match(folder.name):
            notes.append(f"skipped {folder.name!r}: not a valid student id")
            continue
        lab_dir = folder / lab
        if folder.is_symlink() or lab_dir.is_symlink():
            notes.append(f"skipped {folder.name}: a symbolic link, not a submitted folder")
            continue
        if not lab_dir.is_dir():
            notes.append(f"{folder.name}: no {lab}/ folder (nothing submitted)")
            continue
        found.append(Submission(folder.name, lab, lab_dir))
    if student is not None and not found:
        raise FileNotFoundError(f"no submission {root}/{student}/{lab}/")
    return found, notes


def file_hashes(folder: Path) -> tuple[dict[str, str], list[str]]:
    """sha256 of every regular file under `folder` (symlinks are listed, never followed)."""
    hashes: dict[str, str] = {}
    notes: list[str] = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if "__pycache__" in path.parts:
            continue
        if path.is_symlink():
            hashes[rel] = "symlink"
            notes.append(f"{rel} is a symbolic link: ignored")
            continue
        if not path.is_file():
            continue
        if len(hashes) >= MAX_FILES:
            notes.append(f"more than {MAX_FILES} files: the rest are not hashed")
            break
        if path.stat().st_size > MAX_FILE_BYTES:
            hashes[rel] = "too-large"
            notes.append(f"{rel} is larger than {MAX_FILE_BYTES >> 20} MiB: ignored")
            continue
        hashes[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes, notes


def ignored_files(hashes: dict[str, str]) -> list[str]:
    """Files that would run code if we let them; they are never copied anywhere."""
    notes = []
    for rel in hashes:
        name = rel.rsplit("/", 1)[-1]
        if name in IGNORED_NAMES:
            notes.append(f"{rel}: {IGNORED_NAMES[name]} in a submission is ignored (only region bodies are run)")
        elif name.endswith(".pth"):
            notes.append(f"{rel}: a .pth file in a submission is ignored")
    return notes


@dataclass
class RegionStatus:
    region_id: str
    status: str            # attempted | not attempted | missing | broken
    message: str = ""


@dataclass
class Extraction:
    """The student's bodies for one lab's regions, ready to splice, and what happened to each region."""

    bodies: dict[str, str] = field(default_factory=dict)
    regions: list[RegionStatus] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    suspicious: list[str] = field(default_factory=list)


def _dedent(body: str) -> str:
    """The body with its common indentation removed (students indent regions in their own way)."""
    return textwrap.dedent(body)


def _reindent(body: str, indent: str) -> str:
    return "".join(indent + line if line.strip() else "\n" for line in body.splitlines(keepends=True))


def _is_stub(body: str, region: Region) -> bool:
    code = [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]
    return code == [stub_body(region).strip()]


def _outside_regions(text: str, path: str) -> list[str]:
    """The lines of a file that are not region bodies (markers and hints included)."""
    source = parse_regions(text, path)
    skip: set[int] = set()
    for region in source.regions:
        skip.update(range(region.body_start, region.end_line))
    return [line.rstrip() for number, line in enumerate(source.lines, start=1) if number not in skip]


def _names(body: str) -> set[str]:
    try:
        tree = ast.parse("def _body():\n" + _reindent(body, "    "))
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(alias.name.split(".")[0] for alias in node.names)
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module.split(".")[0])
    return names


def extract(submission_package: Path, tree: ReferenceTree, lab: str) -> Extraction:
    """Cut the student's lab regions out of their `student_exercises/`, by id, whatever the line numbers.

    A region whose file or markers are missing counts as missing; one still
    holding the stub as not attempted; one whose body does not compile in the
    instructor's file as broken. Those get the stub (so they fail, visibly),
    and the others keep working: one broken region never sinks the rest.
    """
    out = Extraction()
    stubs = generate(tree)                     # what the student started from, to spot edits outside regions
    by_file: dict[str, list[Region]] = {}
    for relpath, source in tree.files.items():
        for region in source.regions:
            if region.lab == lab:
                by_file.setdefault(relpath, []).append(region)
    for relpath, regions in sorted(by_file.items()):
        student_file = submission_package / relpath
        shown = f"{PACKAGE}/{relpath}"
        if not student_file.is_file() or student_file.is_symlink():
            for region in regions:
                out.regions.append(RegionStatus(region.region_id, "missing", f"{shown} is not in the submission"))
            continue
        try:
            text = student_file.read_text(encoding="utf-8")
            source = parse_regions(text, shown)
        except (UnicodeDecodeError, RegionError) as err:
            for region in regions:
                out.regions.append(RegionStatus(region.region_id, "broken", f"region markers unreadable: {err}"))
            continue
        try:
            if _outside_regions(text, shown)[1:] != _outside_regions(stubs[relpath], shown)[1:]:
                out.suspicious.append(f"{shown}: changes outside the exercise regions are ignored (never run)")
        except RegionError:
            pass
        found = {r.region_id: r for r in source.regions}
        for region in regions:
            mine = found.get(region.region_id)
            if mine is None:
                out.regions.append(RegionStatus(region.region_id, "missing",
                                                f"no `# >>> EXERCISE {region.region_id}` region in {shown}"))
                continue
            body = source.body(mine)
            if _is_stub(body, region):
                out.regions.append(RegionStatus(region.region_id, "not attempted", "still raises NotImplementedError"))
                continue
            spliced = _reindent(_dedent(body), region.indent)
            problem = _compile_problem(tree.files[relpath], region, spliced, shown)
            if problem:
                out.regions.append(RegionStatus(region.region_id, "broken", problem))
                continue
            out.bodies[region.region_id] = spliced
            out.regions.append(RegionStatus(region.region_id, "attempted"))
            names = sorted(_names(spliced) & SUSPICIOUS)
            if names:
                out.suspicious.append(f"{region.region_id} uses {', '.join(names)}")
    return out


def _compile_problem(source, region: Region, body: str, shown: str) -> str:
    """Why `body` cannot stand in for the region in the instructor's file ('' when it can)."""
    lines = source.lines
    text = "".join(lines[:region.body_start - 1]) + body + "".join(lines[region.end_line - 1:])
    try:
        compile(text, region.path, "exec", dont_inherit=True)
    except SyntaxError as err:
        offset = (err.lineno or region.body_start) - region.body_start + 1
        return f"does not compile: {err.msg} (line {offset} of the region body in {shown})"
    except ValueError as err:          # e.g. NUL bytes
        return f"does not compile: {err}"
    return ""
