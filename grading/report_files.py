"""Reading a report's evidence: only plain files of the submission itself, of bounded size, never run.

Every content check of a lab report (grading/report_content.py,
grading/report_runs.py) reads the submitted logs, CSV files, traces and
figures through here, so one rule decides what a submission may point at:
a file inside its own folder, not a link, at most MAX_EVIDENCE_BYTES.
And one format for what the checks say back: xv6-style lines, GOOD for what
holds, BAD for what the files contradict, MISSING for what is not there,
each naming the rule it applies.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from grading.report_markdown import sections

MAX_EVIDENCE_BYTES = 20 << 20
GOOD, BAD, MISSING = "GOOD", "BAD", "MISSING"


def line(kind: str, text: str, rule: str | None = None) -> str:
    """One feedback line: `BAD     <what> (rule: <the rule it breaks>)`."""
    return f"{kind:<7} {text}" + (f" (rule: {rule})" if rule else "")


def problems(lines: list[str]) -> list[str]:
    """The lines that cost the item its points (every line but the GOOD ones)."""
    return [entry for entry in lines if not entry.startswith(GOOD)]


def readable(folder: Path, path: Path) -> bool:
    """A plain file of the submission itself (no link out of it, nothing above it), small enough to read."""
    try:
        inside = path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False
    return inside and path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_EVIDENCE_BYTES


def files(folder: Path, patterns: list[str]) -> list[Path]:
    return sorted({p for pattern in patterns for p in folder.glob(pattern) if readable(folder, p)})


def read_csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", errors="replace", newline="") as handle:
        return list(csv.DictReader(handle))


def read_events(path: Path) -> list[dict]:
    """The JSON objects of a JSON Lines file, one a line; lines that are not JSON objects are skipped."""
    events = []
    for text in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(text)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def read_json(path: Path) -> object:
    """A JSON file's value, or None when it is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except json.JSONDecodeError:
        return None


def section(text: str, name: str) -> tuple[str | None, list[str]]:
    """The body of the report's sections headed `name` (joined), or None and the MISSING line."""
    found = sections(text, name)
    return ("\n\n".join(found), []) if found else (None, [line(MISSING, f"a section headed '{name}'",
                                                                "keep the template's section headings")])
