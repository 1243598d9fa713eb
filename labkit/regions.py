"""Exercise regions: the comment markers in `reference/` that say what students write.

A region is a run of lines inside a function body, fenced by two comments:

    # >>> EXERCISE lab2.allocate: Give `seq` a block for every token, sharing cached prefix blocks.
    # HINT: self._prefix_hits(seq) lists the leading blocks already in the cache.
    <the reference solution: the region's body>
    # <<< EXERCISE lab2.allocate

Why comments and not a decorator or a separate solutions file: the solution
stays where it runs, so the reference engine is the single source of truth and
every region is exercised by the engine's own tests. The student copy keeps the
markers, the task and the hints, and replaces only the body with
`raise NotImplementedError("<id>")`; the grader later finds the student's body
by the same markers.

This module is pure text processing (no imports of the engine), so the
generator, the release builder, the bug zoo and the grader can all share it.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

BEGIN = ">>> EXERCISE"
END = "<<< EXERCISE"
HINT = "HINT:"

REGION_ID = r"lab(?P<lab>[0-9]+)\.(?P<name>[a-z][a-z0-9_]*)"
_BEGIN_RE = re.compile(rf"^(?P<indent>[ \t]*)# >>> EXERCISE (?P<id>{REGION_ID}): (?P<task>\S.*)$")
_END_RE = re.compile(rf"^(?P<indent>[ \t]*)# <<< EXERCISE (?P<id>{REGION_ID})$")
_HINT_RE = re.compile(r"^(?P<indent>[ \t]*)# HINT: (?P<hint>\S.*)$")


class RegionError(ValueError):
    """A malformed region marker; the message names the file and line."""


@dataclass(frozen=True)
class Region:
    """One exercise region of one file. Line numbers are 1-based and inclusive."""

    region_id: str
    task: str
    hints: tuple[str, ...]
    path: str            # as given to parse_regions (for messages and listings)
    begin_line: int      # the `>>> EXERCISE` line
    body_start: int      # first body line (after the hints)
    end_line: int        # the `<<< EXERCISE` line
    indent: str

    @property
    def lab(self) -> str:
        """`lab2` for `lab2.allocate`: labs are the unit of release and grading."""
        return self.region_id.split(".", 1)[0]

    @property
    def body_lines(self) -> tuple[int, int]:
        """First and last line of the body (what a student replaces)."""
        return self.body_start, self.end_line - 1


@dataclass
class SourceFile:
    """A source text split into lines, with its regions in file order."""

    path: str
    lines: list[str]
    regions: list[Region] = field(default_factory=list)

    def body(self, region: Region) -> str:
        """The region's body text, exactly as in the file (with indentation)."""
        return "".join(self.lines[region.body_start - 1:region.end_line - 1])


def _split(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return lines


def parse_regions(text: str, path: str = "<text>") -> SourceFile:
    """Find every region in `text` and check that the markers are well formed.

    Raises RegionError for anything the generator could misread: a marker line
    that does not match the syntax, an end without a begin (or with another
    id), nesting, mismatched indentation, an empty body, or a body line indented
    less than its markers (which would cut a function in half).
    """
    source = SourceFile(path, _split(text))
    open_region: dict | None = None
    for number, line in enumerate(source.lines, start=1):
        stripped = line.rstrip("\n")
        where = f"{path}:{number}"
        if BEGIN in stripped:
            match = _BEGIN_RE.match(stripped)
            if match is None:
                raise RegionError(f"{where}: malformed begin marker; expected "
                                  f"'# {BEGIN} labN.name: one-line task'")
            if open_region is not None:
                raise RegionError(f"{where}: region {match['id']} starts inside region {open_region['id']} "
                                  f"(begun at line {open_region['begin']}); regions cannot nest")
            open_region = {"id": match["id"], "task": match["task"].strip(), "indent": match["indent"],
                           "begin": number, "hints": [], "body_start": None}
            continue
        if END in stripped:
            match = _END_RE.match(stripped)
            if match is None:
                raise RegionError(f"{where}: malformed end marker; expected '# {END} labN.name'")
            if open_region is None:
                raise RegionError(f"{where}: end of region {match['id']} without a begin marker")
            if match["id"] != open_region["id"]:
                raise RegionError(f"{where}: end marker says {match['id']} but region {open_region['id']} "
                                  f"is open (begun at line {open_region['begin']})")
            if match["indent"] != open_region["indent"]:
                raise RegionError(f"{where}: end marker of {match['id']} is indented differently from its begin")
            source.regions.append(_close(open_region, number, source, path))
            open_region = None
            continue
        if open_region is None:
            if _HINT_RE.match(stripped):
                raise RegionError(f"{where}: HINT line outside any region")
            continue
        hint = _HINT_RE.match(stripped)
        if open_region["body_start"] is None and hint is not None:
            if hint["indent"] != open_region["indent"]:
                raise RegionError(f"{where}: HINT of {open_region['id']} is indented differently from its marker")
            open_region["hints"].append(hint["hint"].strip())
            continue
        if open_region["body_start"] is None:
            open_region["body_start"] = number
    if open_region is not None:
        raise RegionError(f"{path}:{open_region['begin']}: region {open_region['id']} is never closed")
    _check_unique(source.regions)
    return source


def _close(open_region: dict, end_line: int, source: SourceFile, path: str) -> Region:
    """Validate a region's body and freeze it."""
    region_id, indent = open_region["id"], open_region["indent"]
    body_start = open_region["body_start"] or end_line
    body = source.lines[body_start - 1:end_line - 1]
    code = [line for line in body if line.strip() and not line.lstrip().startswith("#")]
    if not code:
        raise RegionError(f"{path}:{open_region['begin']}: region {region_id} has no code in its body")
    if not indent:
        raise RegionError(f"{path}:{open_region['begin']}: region {region_id} is at module level; "
                          "regions must sit inside a function so the stubbed module still imports")
    for offset, line in enumerate(body):
        if line.strip() and not line.startswith(indent):
            raise RegionError(f"{path}:{body_start + offset}: body line of {region_id} is indented less "
                              "than its markers")
    return Region(region_id, open_region["task"], tuple(open_region["hints"]), path,
                  open_region["begin"], body_start, end_line, indent)


def _check_unique(regions: list[Region]) -> None:
    seen: dict[str, Region] = {}
    for region in regions:
        if region.region_id in seen:
            first = seen[region.region_id]
            raise RegionError(f"{region.path}:{region.begin_line}: region id {region.region_id} is already "
                              f"used at {first.path}:{first.begin_line}")
        seen[region.region_id] = region


def stub_body(region: Region) -> str:
    """What a student starts from: a single raise naming the region.

    Raising (rather than `pass`) makes every test that reaches an unwritten
    region fail loudly with the region's id, instead of failing somewhere
    later with a confusing None.
    """
    return f'{region.indent}raise NotImplementedError("{region.region_id}")\n'


def render(source: SourceFile, body_for: Callable[[Region], str | None]) -> str:
    """The file with each region's body replaced by `body_for(region)` (None: keep it).

    Markers and hints are always kept, so the output can be parsed again (by the
    grader, or by `check`) with the same region ids and tasks.
    """
    out: list[str] = []
    cursor = 0
    for region in source.regions:
        start, end = region.body_start - 1, region.end_line - 1
        out += source.lines[cursor:start]
        replacement = body_for(region)
        out.append(source.body(region) if replacement is None else replacement)
        cursor = end
    out += source.lines[cursor:]
    return "".join(out)


def reindent(body: str, indent: str) -> str:
    """Indent a dedented body to `indent` (blank lines stay blank)."""
    lines = _split(body.strip("\n") + "\n")
    return "".join(indent + line if line.strip() else "\n" for line in lines)


def check_inside_functions(text: str, source: SourceFile) -> None:
    """Every region must lie inside one function body, or stubbing it could break imports."""
    tree = ast.parse(text, filename=source.path)
    spans = [(node.lineno + 1, node.end_lineno) for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for region in source.regions:
        first, last = region.body_lines
        if not any(lo <= first and last <= hi for lo, hi in spans):
            raise RegionError(f"{source.path}:{region.begin_line}: region {region.region_id} is not inside "
                              "a single function body")


def bodies_by_id(sources: Mapping[str, SourceFile]) -> dict[str, str]:
    """Region id -> body text over several files (ids are unique across a tree)."""
    bodies: dict[str, str] = {}
    for source in sources.values():
        for region in source.regions:
            if region.region_id in bodies:
                raise RegionError(f"{source.path}:{region.begin_line}: region id {region.region_id} "
                                  "is used in two files")
            bodies[region.region_id] = source.body(region)
    return bodies
