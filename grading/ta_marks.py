"""A TA's marks for the rubric items no file can settle, merged into the results that `grade run` wrote.

Some of a report's worth is judgement: is the explanation of a preemption
the mechanism the log shows, or "the CPU fan"; was the comparison fair.
Those are rubric items of kind `ta` (labkit/rubric.py), each with anchors:
the marks a TA may give and what each means. `grade run` leaves them
`pending`; the TA writes one CSV row per student and item,

    student_id,item,points,comment
    alice,ta_mechanism,5,"preemption explained by KV pool size; the log's kv_blocks_used is not quoted"

(`inferlab grade ta-sheet` writes the sheet with every pending item and its
anchors), and `grade report` merges it (`merge`): a marked item gets the
marked points, the anchor's meaning and the comment, in GOOD/BAD lines as
the checks' feedback has. Result files are never rewritten, so either side
can be redone alone, as with nbgrader's scores.
"""
from __future__ import annotations

import copy
import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.rubric import Rubric

TA_FILE = "ta_marks.csv"
COLUMNS = ("student_id", "item", "points", "comment")


@dataclass(frozen=True)
class Mark:
    points: int
    comment: str


class MarksError(ValueError):
    """A marks file that does not fit the rubric; the message names the line."""


def anchors(rubric: Rubric, item_id: str) -> dict[int, str]:
    return {a["points"]: a["means"] for a in rubric.item(item_id).options["anchors"]}


def read_marks(path: Path, rubric: Rubric) -> dict[str, dict[str, Mark]]:
    """student id -> item id -> Mark; every mark must be one of the item's anchors."""
    marks: dict[str, dict[str, Mark]] = {}
    ta_items = {item.id for item in rubric.items if item.kind == "ta"}
    with path.open(encoding="utf-8", newline="") as handle:
        for number, row in enumerate(csv.DictReader(handle), start=2):
            where = f"{path.name} line {number}"
            item, student = (row.get("item") or "").strip(), (row.get("student_id") or "").strip()
            if item not in ta_items:
                raise MarksError(f"{where}: {item!r} is not a TA item of {rubric.lab} ({', '.join(sorted(ta_items))})")
            if not (row.get("points") or "").strip():
                continue                                        # not marked yet
            try:
                points = int(row["points"])
            except ValueError:
                raise MarksError(f"{where}: points {row['points']!r} is not a whole number") from None
            if points not in anchors(rubric, item):
                raise MarksError(f"{where}: {points} is not an anchor of {item} "
                                 f"({', '.join(map(str, sorted(anchors(rubric, item))))})")
            if item in marks.get(student, {}):
                raise MarksError(f"{where}: {student} is marked twice for {item}")
            marks.setdefault(student, {})[item] = Mark(points, (row.get("comment") or "").strip())
    return marks


def merge(result: dict[str, Any], marks: dict[str, Mark], rubric: Rubric) -> dict[str, Any]:
    """A copy of the result with its pending TA items marked (unmarked ones stay pending)."""
    out = copy.deepcopy(result)
    for item in out["items"]:
        mark = marks.get(item["id"])
        if item["status"] != "pending" or mark is None:
            continue
        full = mark.points == item["points"]
        meaning = anchors(rubric, item["id"])[mark.points]
        item.update(score=mark.points, status="passed" if full else "failed",
                    message=f"marked by a TA: {mark.points}/{item['points']}: {meaning}",
                    details=[f"{'GOOD' if full else 'BAD':<7} {meaning}"]
                    + ([f"{'NOTE':<7} {mark.comment}"] if mark.comment else []))
    out["score"] = sum(item["score"] for item in out["items"])
    return out


def merge_all(results: list[dict[str, Any]], results_dir: Path, rubric: Rubric) -> list[dict[str, Any]]:
    """Every result with the marks of RESULTS/ta_marks.csv merged (the results as they are, without one)."""
    path = results_dir / TA_FILE
    if not path.is_file():
        return results
    marks = read_marks(path, rubric)
    return [merge(r, marks.get(r["student_id"], {}), rubric) for r in results]


def write_sheet(results: list[dict[str, Any]], path: Path, rubric: Rubric) -> Path:
    """A marks sheet for the TA: one empty row per student and pending TA item, with its anchors beside it."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=(*COLUMNS, "anchors"))
        writer.writeheader()
        for result in results:
            for item in result["items"]:
                if item["status"] == "pending":
                    scale = "; ".join(f"{p}: {m}" for p, m in sorted(anchors(rubric, item["id"]).items()))
                    writer.writerow({"student_id": result["student_id"], "item": item["id"], "points": "",
                                     "comment": "", "anchors": scale})
    return path
