"""A student's code, read the way the grader and the self-check both read it.

From a student's `student_exercises/` and the package the student started
from (the lab's release), this finds by id the bodies of the lab's exercise
regions, the definitions added outside them (carried), and every other edit
outside them (listed, never run). The grader splices the result into its
harness; `inferlab check` splices it into a pristine copy of the release and
runs the public suite there: one reading, so the two never disagree about
what the student wrote.
"""
from __future__ import annotations

import ast
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from labkit.additions import Addition, OutsideEdit, apply, clashes, compare
from labkit.manifest import PRISTINE
from labkit.tree import PACKAGE
from labkit.regions import Region, RegionError, parse_regions, stub_body

# What in a region body or an added definition is worth a TA's look: calls a block manager, scheduler or
# model runner has no use for, and which an attack on the grader needs. Flags never change a score (the
# sandbox and the judge do that), but a flag on correct code costs a TA's time and a student's trust, so
# an attribute counts by its object where its name alone is common: `self.running.remove(seq)` is a
# deque's, `os.remove(path)` is not; `re.compile` is not `compile(...)`.
SUSPICIOUS_NAMES = {"exec", "eval", "compile", "open", "__import__", "globals", "locals", "setattr", "delattr",
                    "exit", "quit", "breakpoint", "input", "__builtins__", "vars"}
SUSPICIOUS_MODULES = {"os", "shutil", "subprocess", "socket", "ctypes", "importlib", "builtins", "signal", "gc",
                      "inspect", "pytest", "_pytest", "threading", "multiprocessing", "tempfile", "pickle",
                      "marshal", "atexit", "faulthandler", "resource"}
# Modules a body may reach without importing them (the engine's files import them at the top).
LIBRARY_ROOTS = {"torch", "numpy", "np", "math", "triton", "transformers", "reference", "student_exercises",
                 "courseware", "grading", "builtins", "sys", "os"}
SUSPICIOUS_ATTRIBUTES = {"_exit", "system", "popen", "Popen", "settrace", "setprofile", "addaudithook", "fork",
                         "environ", "modules", "rmtree", "unlink", "write_text", "write_bytes", "read_text",
                         "read_bytes", "chdir", "kill", "sleep", "exit", "_getframe", "isclose", "golden", "__globals__", "__code__",
                         "__subclasses__", "__builtins__", "f_back", "f_globals", "f_locals", "tb_frame"}


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
    additions: dict[str, list[Addition]] = field(default_factory=dict)     # module path -> definitions carried
    outside_edits: list[OutsideEdit] = field(default_factory=list)         # listed, never run
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


def _dotted(node) -> str:
    """"torch.testing.assert_close" for that attribute chain, "" for anything not rooted at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) and parts else ""


def suspicious_uses(body: str) -> list[str]:
    """The uses in `body` (a region body or added definitions) that SUSPICIOUS_* name, sorted, as written."""
    try:
        tree = ast.parse("def _body():\n" + _reindent(body, "    "))
    except SyntaxError:
        return []
    imported = {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    found = set()
    for node in ast.walk(tree):
        for target in getattr(node, "targets", [getattr(node, "target", None)]):
            dotted = _dotted(target)
            if dotted and dotted.split(".")[0] in imported | LIBRARY_ROOTS:
                found.add(f"sets {dotted}")          # monkeypatching a library (the judge's comparisons)
        if isinstance(node, ast.Name) and node.id in SUSPICIOUS_NAMES:
            found.add(node.id)
        elif isinstance(node, ast.Attribute):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if node.attr in SUSPICIOUS_ATTRIBUTES or owner in SUSPICIOUS_MODULES:
                found.add(f"{owner}.{node.attr}" if owner else node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found.update(m.split(".")[0] for m in modules if m.split(".")[0] in SUSPICIOUS_MODULES)
            if isinstance(node, ast.ImportFrom):
                found.update(a.name for a in node.names if a.name in SUSPICIOUS_NAMES | SUSPICIOUS_ATTRIBUTES)
    return sorted(found)


def outside_regions(submission_package: Path, stubs: dict[str, str], out: Extraction) -> None:
    """Every module's additions (carried when they compile in place) and edits outside the regions.

    A module the student added (a `helpers.py` of their own) is listed too:
    nothing of it runs, and a region that imports it fails in the grader's
    copy of the engine as in the self-check's, so the student is told why.
    """
    for path in sorted(submission_package.rglob("*.py")) if submission_package.is_dir() else []:
        relpath = path.relative_to(submission_package).as_posix()
        if relpath not in stubs and not relpath.startswith("tests/") and "__pycache__" not in path.parts:
            out.outside_edits.append(OutsideEdit(f"{PACKAGE}/{relpath}", 1, "added a new module: put its code in "
                                                 "the file that uses it, outside the regions", ""))
    for relpath, pristine in sorted(stubs.items()):
        student_file = submission_package / relpath
        shown = f"{PACKAGE}/{relpath}"
        if not student_file.is_file() or student_file.is_symlink():
            continue
        try:
            text = student_file.read_text(encoding="utf-8")
            additions, edits = compare(text, pristine, shown)
        except SyntaxError as err:
            out.outside_edits.append(OutsideEdit(shown, err.lineno or 0, f"does not parse: {err.msg}",
                                                 (err.text or "").rstrip(),
                                                 "nothing you wrote outside the regions of this file is carried"))
            continue
        except (UnicodeDecodeError, RegionError, ValueError):
            continue                            # reported with the regions of that file
        out.outside_edits += edits
        out.notes += clashes(text, additions, shown)
        for addition in additions:
            names = suspicious_uses(addition.text)
            if names:
                out.suspicious.append(f"{shown}:{addition.line} `{addition.name}` uses {', '.join(names)}")
        if additions:
            try:
                compile(apply(pristine, additions), shown, "exec", dont_inherit=True)
                out.additions[relpath] = additions
            except (SyntaxError, ValueError) as err:
                names = ", ".join(a.name for a in additions)
                out.outside_edits.append(OutsideEdit(shown, additions[0].line,
                                                     f"added definitions ({names}) that do not fit in the file: {err}",
                                                     "", "not run: none of them is carried"))


MAX_STARTED_FROM_BYTES = 1 << 20


def started_from(submission_package: Path) -> dict[str, str] | None:
    """The package as the student's own release shipped it (`.inferlab/pristine/` beside their package), if any.

    Read only to word the notes (which edits are the student's, which are a
    newer release's): it never decides what runs, so a submission may carry
    any text here without changing its grade.
    """
    pristine = submission_package.parent / PRISTINE / PACKAGE
    if not pristine.is_dir() or pristine.is_symlink():
        return None
    texts = {}
    for path in sorted(pristine.rglob("*.py")):
        if path.is_symlink() or "__pycache__" in path.parts or path.stat().st_size > MAX_STARTED_FROM_BYTES:
            continue
        try:
            texts[path.relative_to(pristine).as_posix()] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return texts or None


def _own_edits(submission_package: Path, given: Mapping[str, str], mine_from: Mapping[str, str],
               out: Extraction) -> None:
    """Keep only the edits outside the regions that the student made; sum up the rest as release drift.

    Against the current release (`given`), a tree made from an older release
    shows every outside-region difference between the two releases as if the
    student had made it. Compared with the release the student started from,
    those vanish; what is left is theirs.
    """
    theirs = Extraction()
    outside_regions(submission_package, {rel: mine_from.get(rel, text) for rel, text in given.items()}, theirs)
    own = {(e.path, e.what) for e in theirs.outside_edits}
    drift = [e for e in out.outside_edits if (e.path, e.what) not in own]
    if not drift:
        return
    out.outside_edits = [e for e in out.outside_edits if (e.path, e.what) in own]
    files = sorted({e.path for e in drift})
    out.notes.append(f"your release is older than the grader's: {len(drift)} difference(s) outside the regions of "
                     f"{', '.join(files)} come from the release, not from you (the current release's code runs "
                     f"there; nothing to do): " + "; ".join(e.what for e in drift[:5])
                     + (" ..." if len(drift) > 5 else ""))


def read_student_code(submission_package: Path, given: Mapping[str, str], lab: str) -> Extraction:
    """Cut the student's lab regions out of their `student_exercises/`, by id, whatever the line numbers.

    `given` is the package the student started from (module path -> text:
    the lab's release). A region whose file or markers are missing counts as
    missing; one still holding the stub as not attempted; one whose body does
    not compile in its file as broken. Those get the stub (so they fail,
    visibly), and the others keep working: one broken region never sinks the
    rest. Definitions added outside the regions are carried, other edits
    outside them listed (`labkit.additions`): only the student's own, when
    the tree carries the release it was made from (`started_from`).
    """
    out = Extraction()
    outside_regions(submission_package, dict(given), out)
    mine_from = started_from(submission_package)
    if mine_from is not None and any(mine_from.get(rel, text) != text for rel, text in given.items()):
        _own_edits(submission_package, given, mine_from, out)
    by_file: dict[str, list[Region]] = {}
    sources = {relpath: parse_regions(text, f"{PACKAGE}/{relpath}") for relpath, text in given.items()
               if not relpath.startswith("tests/")}
    for relpath, source in sources.items():
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
            problem = _compile_problem(sources[relpath], region, spliced, shown, mine.body_start)
            if problem:
                out.regions.append(RegionStatus(region.region_id, "broken", problem))
                continue
            out.bodies[region.region_id] = spliced
            out.regions.append(RegionStatus(region.region_id, "attempted"))
            names = suspicious_uses(spliced)
            if names:
                out.suspicious.append(f"{region.region_id} uses {', '.join(names)}")
    return out


def _compile_problem(source, region: Region, body: str, shown: str, student_start: int) -> str:
    """Why `body` cannot stand in for the region in its file ('' when it can), naming the student's own line."""
    lines = source.lines
    text = "".join(lines[:region.body_start - 1]) + body + "".join(lines[region.end_line - 1:])
    try:
        compile(text, region.path, "exec", dont_inherit=True)
    except SyntaxError as err:
        offset = (err.lineno or region.body_start) - region.body_start
        where = f"{shown}:{student_start + offset}"
        code = (err.text or "").strip()
        return f"does not compile: {type(err).__name__}: {err.msg} at {where}" + (f": {code}" if code else "")
    except ValueError as err:          # e.g. NUL bytes
        return f"does not compile: {err}"
    return ""
