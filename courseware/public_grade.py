"""The public part of a lab's grade: each rubric item scored from the public tests it names.

The grader scores an item from its hidden tests, in proportion to those
passed; the self-check scores the same item the same way from the public
tests of the same behaviour (the item's `public` list in rubric.json). Items
with no public tests (throughput, reports) are left to the grader. Reading
the rubric takes four fields, so this module does it itself rather than ship
the grader's rubric validator in every student release.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ItemPart:
    item_id: str
    title: str
    points: int
    passed: int            # public tests of the item that passed
    total: int             # public tests of the item that ran here (a skipped GPU test does not count)
    skipped: int

    @property
    def earned(self) -> int:
        return self.points * self.passed // self.total if self.total else 0


def _short_id(test: dict[str, Any]) -> str:
    """`test_file.py::test_name` of a recorded test (parameters dropped), as rubric.json names it."""
    return f"{Path(test['file']).name}::{test['name'].split('[', 1)[0]}"


def public_parts(rubric_path: Path, tests: dict[str, dict[str, Any]]) -> list[ItemPart]:
    """One entry per rubric item that names public tests, from the outcomes of one public-suite run."""
    rubric = json.loads(rubric_path.read_text(encoding="utf-8"))
    by_id: dict[str, list[str]] = {}
    for test in tests.values():
        by_id.setdefault(_short_id(test), []).append(test["outcome"] or "missing")
    parts = []
    for item in rubric["items"]:
        outcomes = [o for name in item.get("public", []) for o in by_id.get(name, ["missing"])]
        if not outcomes:
            continue
        ran = [o for o in outcomes if o != "skipped"]
        parts.append(ItemPart(item["id"], item.get("title", item["id"]), int(item["points"]),
                              sum(o == "passed" for o in ran), len(ran), len(outcomes) - len(ran)))
    return parts
