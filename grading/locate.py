"""Where an error happened, in the student's own terms: the region and the line of their file.

A graded process reports frames of the harness's copy of the engine
(`student_exercises/engine/block_manager.py:131`), whose line numbers are not
the student's: the grader spliced their region bodies (and added definitions)
into its own copy. This maps such a location back: inside a region body, to
that region's id and the same line of the region in the student's file.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from courseware.exercises import PACKAGE
from courseware.regions import RegionError, parse_regions

FRAME = re.compile(rf"({PACKAGE}/((?:[\w]+/)*[\w]+\.py)):(\d+)")


def _student_region_start(package_dir: Path, relpath: str, region_id: str) -> int | None:
    path = package_dir / relpath
    try:
        source = parse_regions(path.read_text(encoding="utf-8"), str(path))
    except (OSError, UnicodeDecodeError, RegionError):
        return None
    return next((r.body_start for r in source.regions if r.region_id == region_id), None)


def in_student_terms(text: str, harness: Mapping[str, str], package_dir: Path) -> str:
    """`text` with each harness location inside a region followed by the region and the student's line."""
    def annotate(match: re.Match) -> str:
        shown, relpath, line = match.group(1), match.group(2), int(match.group(3))
        if relpath not in harness:
            return match.group(0)
        try:
            regions = parse_regions(harness[relpath], shown).regions
        except RegionError:
            return match.group(0)
        region = next((r for r in regions if r.body_start <= line < r.end_line), None)
        if region is None:
            return match.group(0)
        start = _student_region_start(package_dir, relpath, region.region_id)
        if start is None:
            return f"{match.group(0)} (in region {region.region_id})"
        return f"{shown}:{start + line - region.body_start} (your line, in region {region.region_id})"
    return FRAME.sub(annotate, text)
