"""Where an error happened, in the student's own terms: the region and the line of their file.

The code that ran is never the student's file: the grader splices their region
bodies (and added definitions) into its own copy of the engine, and
`inferlab check` into a pristine copy of the release in a temporary folder.
So a traceback names `.../student_exercises/engine/block_manager.py:131`, a
line of that copy. This maps such a location back: inside a region body, to
that region's id and the same line of the region in the student's file. One
implementation for both, so feedback and self-check name the same place.

A location outside every region is left as it is: mapping it would need the
splice's whole line arithmetic, and the code there is the course's, not the
student's (the price: a crash in course code still names the copy's line).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from labkit.tree import PACKAGE
from labkit.regions import RegionError, parse_regions

# An optional folder prefix (a harness or temporary copy), the package, the module's path inside it, the line.
FRAME = re.compile(rf"((?:[^\s:\"'()\[\]]*/)?{PACKAGE}/((?:\w+/)*\w+\.py)):(\d+)")
REGION_NOTE = "(your line, in region {})"


def _student_region_start(package_dir: Path, relpath: str, region_id: str) -> int | None:
    path = package_dir / relpath
    try:
        source = parse_regions(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, RegionError):
        return None
    return next((r.body_start for r in source.regions if r.region_id == region_id), None)


def student_location(relpath: str, line: int, ran: Mapping[str, str], package_dir: Path) -> str | None:
    """`student_exercises/<relpath>:<student line> (your line, in region <id>)` for a line of a region body
    in the copy that ran (`ran`: module path -> text), or None when the line is outside every region."""
    if relpath not in ran:
        return None
    try:
        regions = parse_regions(ran[relpath], relpath).regions
    except RegionError:
        return None
    region = next((r for r in regions if r.body_start <= line < r.end_line), None)
    if region is None:
        return None
    start = _student_region_start(package_dir, relpath, region.region_id)
    if start is None:
        return f"{PACKAGE}/{relpath}:{line} (line of the copy that ran, in region {region.region_id})"
    return f"{PACKAGE}/{relpath}:{start + line - region.body_start} {REGION_NOTE.format(region.region_id)}"


def region_locations(text: str, ran: Mapping[str, str], package_dir: Path) -> list[str]:
    """Every location in `text` that falls inside a region, in the student's terms, in order of appearance."""
    found = (student_location(m.group(2), int(m.group(3)), ran, package_dir) for m in FRAME.finditer(text))
    return [loc for loc in found if loc is not None]


def in_student_terms(text: str, ran: Mapping[str, str], package_dir: Path) -> str:
    """`text` with each location inside a region replaced by the student's file, line and the region."""
    def annotate(match: re.Match) -> str:
        found = student_location(match.group(2), int(match.group(3)), ran, package_dir)
        return match.group(0) if found is None else found
    return FRAME.sub(annotate, text)
