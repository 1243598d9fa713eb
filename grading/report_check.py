"""Report items: checks on the written report files of a submission (never executed, only read).

A report item names files (globs relative to the submission's lab folder).
Its `check` says what is checked: `form` (the default) wants Markdown
headings and a minimum word count; the content checks of
grading.report_content compare a section of the report with the submitted
evidence (a trace, logs, CSV files). Notebooks (`.ipynb`) are read as their
Markdown cells. Whether an explanation is *right* is for a human; whether the
report is there, and whether its quotes and numbers are in its own data, is
never a matter of opinion.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

from grading.report_content import CHECKS
from grading.report_files import BAD, GOOD, MISSING, line
from grading.report_files import problems as problems_of
from grading.results import ItemResult
from labkit.rubric import Item

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
    if item.options.get("check", "form") != "form":
        lines = [line(MISSING, p, "submit the report files") for p in problems]
        if not problems:
            try:
                lines = CHECKS[item.options["check"]](text, folder, item.options)
            except (OSError, ValueError, csv.Error, RecursionError, KeyError, TypeError) as err:
                lines = [line(BAD, f"could not read the submitted evidence: {type(err).__name__}: {err}",
                              "evidence files are the ones lab5_run.py and lab5_summary.py write")]
        wrong = problems_of(lines)
        passed = not wrong
        return ItemResult(item.id, item.title, item.kind, item.points, item.points if passed else 0,
                          "passed" if passed else "failed",
                          f"{item.options['check']}: backed by the submitted files" if passed
                          else f"{item.options['check']}: {len(wrong)} problem(s); first: {wrong[0].split(maxsplit=1)[1]}",
                          details=wrong + [entry for entry in lines if entry not in wrong])
    found = headings(text)
    lines = [line(MISSING, p, "submit the report files") for p in problems]
    for heading in item.options["headings"]:
        if not any(heading.lower() in h for h in found):
            lines.append(line(MISSING, f"a section headed '{heading}'", "keep the template's section headings"))
        else:
            lines.append(line(GOOD, f"a section headed '{heading}'"))
    words = len(WORD.findall(text))
    if words < item.options["min_words"]:
        lines.append(line(MISSING, f"{words} words, at least {item.options['min_words']} expected",
                          "a report of the rubric's length"))
    wrong = problems_of(lines)
    passed = not wrong
    return ItemResult(item.id, item.title, item.kind, item.points, item.points if passed else 0,
                      "passed" if passed else "failed",
                      "report present and complete in form" if passed else "; ".join(w.split(maxsplit=1)[1] for w in wrong),
                      details=wrong + [entry for entry in lines if entry not in wrong], measurements={"words": words})
