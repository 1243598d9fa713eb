"""The scoring rules: the grader's, and what the public tests can promise of it.

The grader scores an observed item from its hidden tests (grading.items): an
item earns its points in proportion to its hidden tests passed (`share`).

The self-check cannot run those tests. What it can say is which points the
public tests *secure*: an item is secured when every public test of the same
behaviour (the item's `public` list in rubric.json) ran and passed, and then
the public part counts its points; otherwise none of them (`secured`). We
chose all or nothing over scaling by the public tests passed because the
scaled number over-promised: an engine item's hidden check is one whole run
compared step by step, which one wrong rule fails entirely, and a wrong
free-list order that fails a third of the public tests fails almost every
hidden one. Scaled, the public part exceeded the grade by several items'
points on many bug-zoo mutants; all or nothing, by at most 10 points on any
(tests/courseware/test_lab_suites.py checks every mutant). The price: a partly right item shows 0 here, though the
grader may give it part of its points; the self-check says so, naming those
points as not checked here, with throughput, GPU items without CUDA and
reports (`not_checked`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.rubric import Item, Rubric


def share(points: int, passed: int, total: int) -> int:
    """`points` scaled by passed/total, rounded down; nothing when no test counted (the grader's rule).

    Rounding down means a partly working item never earns its full points,
    and an item whose tests all failed or never ran earns none.
    """
    return points * passed // total if total > 0 else 0


def secured(points: int, passed: int, total: int, skipped: int = 0) -> int:
    """The points an item's public tests secure: all of them when every one ran and passed, else none."""
    return points if total > 0 and passed == total and skipped == 0 else 0


@dataclass(frozen=True)
class ItemPart:
    """The public part of one rubric item: how many of its public tests passed here, and what that secures."""

    item_id: str
    title: str
    points: int
    passed: int            # public tests of the item that passed
    total: int             # public tests of the item that ran here (a skipped GPU test does not count)
    skipped: int
    gpu: bool = False

    @property
    def earned(self) -> int:
        return secured(self.points, self.passed, self.total, self.skipped)

    @property
    def not_checked(self) -> str:
        """Why this item's points are not secured here ('' when they are), in the student's terms."""
        if self.earned:
            return ""
        if self.skipped and self.passed == self.total:
            return "its GPU tests need CUDA: not run here" if self.gpu else f"{self.skipped} public test(s) skipped here"
        return (f"{self.total - self.passed} of its public tests fail; the grader scores it from its hidden "
                "tests, in proportion to those passed")


def _short_id(test: dict[str, Any]) -> str:
    """`test_file.py::test_name` of a recorded test (parameters dropped), as rubric.json names it."""
    return f"{Path(test['file']).name}::{test['name'].split('[', 1)[0]}"


def item_part(item: Item, tests: dict[str, dict[str, Any]]) -> ItemPart | None:
    """The public part of one item from one public-suite run; None for an item with no public tests."""
    by_id: dict[str, list[str]] = {}
    for test in tests.values():
        by_id.setdefault(_short_id(test), []).append(test["outcome"] or "missing")
    outcomes = [o for name in item.public for o in by_id.get(name, ["missing"])]
    if not outcomes:
        return None
    ran = [o for o in outcomes if o != "skipped"]
    return ItemPart(item.id, item.title, item.points, sum(o == "passed" for o in ran), len(ran),
                    len(outcomes) - len(ran), item.gpu)


def public_parts(rubric: Rubric, tests: dict[str, dict[str, Any]]) -> list[ItemPart]:
    """One entry per rubric item that names public tests, from the outcomes of one public-suite run."""
    return [part for part in (item_part(item, tests) for item in rubric.items) if part is not None]


def unchecked_item(item: Item) -> str:
    """Why an item with no public tests is left to the grader, in the student's terms."""
    if item.kind == "throughput":
        needs = ", ".join(item.options.get("requires", [])) or "every correctness item"
        return (f"throughput: your engine against the reference on the grading machine, scored only when "
                f"{needs} passed there")
    if item.kind == "report":
        return "the report: checked only by the grader"
    return "checked only by hidden tests"
