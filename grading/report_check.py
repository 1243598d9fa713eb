"""Report items: checks on the written report files of a submission (never executed, only read).

A report item names files (globs relative to the submission's lab folder),
Markdown headings that must be present, and a minimum word count. Notebooks
(`.ipynb`) are read as their Markdown cells. Whether the report is *good* is
for a human; this item checks that it is there and complete in form, so that
the grade of a missing or empty report is never a matter of opinion.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from grading.results import ItemResult
from grading.rubric import Item

MAX_BYTES = 2 << 20
WORD = re.compile(r"[A-Za-z0-9]+|[\u4e00-\u9fff]")      # an English word or one CJK character


def report_text(path: Path) -> str:
    raw = path.read_bytes()[:MAX_BYTES].decode("utf-8", "replace")
    if path.suffix == ".ipynb":
        try:
            cells = json.loads(raw).get("cells", [])
        except (json.JSONDecodeError, AttributeError):
            return ""
        return "\n".join("".join(c.get("source", [])) if isinstance(c.get("source"), list) else str(c.get("source", ""))
                         for c in cells if isinstance(c, dict) and c.get("cell_type") == "markdown")
    return raw


def headings(text: str) -> list[str]:
    return [line.lstrip("#").strip().lower() for line in text.splitlines() if re.match(r"^#{1,6}\s", line)]


def check_report(folder: Path, item: Item) -> ItemResult:
    problems: list[str] = []
    texts: list[str] = []
    for pattern in item.options["files"]:
        matches = sorted(p for p in folder.glob(pattern) if p.is_file() and not p.is_symlink())
        if not matches:
            problems.append(f"no file matching {pattern}")
        texts += [report_text(p) for p in matches]
    text = "\n".join(texts)
    found = headings(text)
    for heading in item.options["headings"]:
        if not any(heading.lower() in h for h in found):
            problems.append(f"no section headed '{heading}'")
    words = len(WORD.findall(text))
    if words < item.options["min_words"]:
        problems.append(f"{words} words, at least {item.options['min_words']} expected")
    passed = not problems
    return ItemResult(item.id, item.title, item.kind, item.points, item.points if passed else 0,
                      "passed" if passed else "failed",
                      "report present and complete in form" if passed else "; ".join(problems),
                      details=problems, measurements={"words": words})
