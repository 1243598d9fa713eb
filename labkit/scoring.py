"""The scoring rule, written once: an item earns its points in proportion to its tests passed.

The grader scores an observed item from its hidden tests (grading.items);
the self-check scores the same item the same way from the public tests of
the same behaviour (the item's `public` list in rubric.json). Both call
`share`, so the two can differ only in which tests they count, never in
how. Items with no public tests (throughput, reports) are left to the grader.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.rubric import Rubric


def share(points: int, passed: int, total: int) -> int:
    """`points` scaled by passed/total, rounded down; nothing when no test counted.

    Rounding down means a partly working item never earns its full points,
    and an item whose tests all failed or never ran earns none.
    """
    return points * passed // total if total > 0 else 0


@dataclass(frozen=True)
class ItemPart:
    """The public part of one rubric item: how many of its public tests passed here."""

    item_id: str
    title: str
    points: int
    passed: int            # public tests of the item that passed
    total: int             # public tests of the item that ran here (a skipped GPU test does not count)
    skipped: int

    @property
    def earned(self) -> int:
        return share(self.points, self.passed, self.total)


def _short_id(test: dict[str, Any]) -> str:
    """`test_file.py::test_name` of a recorded test (parameters dropped), as rubric.json names it."""
    return f"{Path(test['file']).name}::{test['name'].split('[', 1)[0]}"


def public_parts(rubric: Rubric, tests: dict[str, dict[str, Any]]) -> list[ItemPart]:
    """One entry per rubric item that names public tests, from the outcomes of one public-suite run."""
    by_id: dict[str, list[str]] = {}
    for test in tests.values():
        by_id.setdefault(_short_id(test), []).append(test["outcome"] or "missing")
    parts = []
    for item in rubric.items:
        outcomes = [o for name in item.public for o in by_id.get(name, ["missing"])]
        if not outcomes:
            continue
        ran = [o for o in outcomes if o != "skipped"]
        parts.append(ItemPart(item.id, item.title, item.points,
                              sum(o == "passed" for o in ran), len(ran), len(outcomes) - len(ran)))
    return parts
