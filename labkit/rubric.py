"""Rubrics as data: `assignments/labN_*/rubric.json`, one per lab.

A rubric lists items; each item is worth a whole number of points, and the
points of a lab add up to 100. An observed item earns its points in proportion
to the hidden tests it passes (rounded down), and items never gate each other:
one missed condition costs the items whose tests check it, nothing more. The
one exception is a throughput item, scored only when the items it `requires`
passed, because the speed of an engine that computes the wrong thing means
nothing. (The price: a rubric can no longer say "this part is worthless until
that part works"; the handouts state the rule.)

Item fields:
    id          unique within the lab
    title       one line for tables and feedback
    points      positive integer
    kind        pytest | log | blocks | throughput | report | ta
    select      (pytest, log, blocks) pytest node ids or files under the harness's hidden/ folder
    public      (pytest, log, blocks) the public tests of the same behaviour, `test_file.py::test_name`:
                the self-check scores the item from them, so no rule is tested only in hidden tests
    deadline_s  seconds the item's process may run before it is killed
    gpu         true when the item needs CUDA (reported `blocked` without it)
    + kind-specific fields: throughput (workload, rounds, min_ratio, requires: item ids),
      report (files, headings, min_words; or check, sections, evidence, min_count, must_name: a content
      check of grading.report_content, e.g. the report's call chain against a submitted trace; a `runs` check
      also takes experiments and min_repeats, a `tables` check logged and per_subsection),
      ta (anchors: [{points, means}], the marks a TA may give and what each means; reads: what to read):
      judged by a person, `pending` in a result until `grade report` merges the TA's marks

The kinds differ in what is compared and how a difference is explained, not
in who decides: every verdict is computed by the grader (grading.judge).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.labs import lab as registry_lab

KINDS = ("pytest", "log", "blocks", "throughput", "report", "ta")
OBSERVED_KINDS = ("pytest", "log", "blocks")
TOTAL = 100
MAX_DEADLINE_S = 600


class RubricError(ValueError):
    """A rubric file that is not valid; the message names the file and the item."""


@dataclass(frozen=True)
class Item:
    id: str
    title: str
    points: int
    kind: str
    deadline_s: float
    select: tuple[str, ...] = ()
    public: tuple[str, ...] = ()
    gpu: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def observed(self) -> bool:
        """Judged by comparing observations with golden outputs (a pytest run in a graded process)."""
        return self.kind in OBSERVED_KINDS


@dataclass(frozen=True)
class Rubric:
    lab: str
    title: str
    items: tuple[Item, ...]
    path: Path
    due: str | None = None

    def item(self, item_id: str) -> Item:
        for item in self.items:
            if item.id == item_id:
                return item
        raise KeyError(f"{self.lab} rubric has no item {item_id!r}")

    @property
    def total(self) -> int:
        return sum(item.points for item in self.items)

    @property
    def correctness_items(self) -> list[Item]:
        """Every item that checks behaviour (the ones with public tests)."""
        return [item for item in self.items if item.observed]


_COMMON = {"id", "title", "points", "kind", "deadline_s", "select", "public", "gpu", "description"}
_EXTRA = {"pytest": set(), "log": set(), "blocks": set(), "throughput": {"workload", "rounds", "min_ratio", "requires"},
          "report": {"files", "headings", "min_words", "check", "sections", "evidence", "min_count", "must_name",
                     "experiments", "min_repeats", "logged", "per_subsection"},
          "ta": {"anchors", "reads"}}
REPORT_CHECKS = ("form", "call_chain", "planes", "log_excerpts", "tables", "explanations", "figures", "runs")
NEEDS_EVIDENCE = ("call_chain", "log_excerpts", "tables")


def _item(raw: dict[str, Any], where: str, seen: dict[str, Item]) -> Item:
    if not isinstance(raw, dict):
        raise RubricError(f"{where}: each item must be an object")
    item_id = raw.get("id")
    if not isinstance(item_id, str) or not item_id.replace("_", "").isalnum():
        raise RubricError(f"{where}: item id must be a word (letters, digits, _), got {item_id!r}")
    where = f"{where} item {item_id!r}"
    if item_id in seen:
        raise RubricError(f"{where}: duplicate id")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise RubricError(f"{where}: kind must be one of {KINDS}, got {kind!r}")
    unknown = set(raw) - _COMMON - _EXTRA[kind]
    if unknown:
        raise RubricError(f"{where}: unknown field(s) {sorted(unknown)} for kind {kind}")
    points = raw.get("points")
    if isinstance(points, bool) or not isinstance(points, int) or points <= 0:
        raise RubricError(f"{where}: points must be a positive integer")
    deadline = raw.get("deadline_s", 60)
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not 0 < deadline <= MAX_DEADLINE_S:
        raise RubricError(f"{where}: deadline_s must be in (0, {MAX_DEADLINE_S}]")
    select = raw.get("select", [])
    if kind in OBSERVED_KINDS:
        if not select or not all(isinstance(s, str) and s.startswith("hidden/") for s in select):
            raise RubricError(f"{where}: select must list pytest node ids or files under hidden/")
    elif select:
        raise RubricError(f"{where}: only pytest, log and blocks items select tests")
    public = raw.get("public", [])
    if kind in OBSERVED_KINDS:
        if not public or not all(isinstance(t, str) and t.startswith("test_") and "::" in t for t in public):
            raise RubricError(f"{where}: public must list the public tests of the same behaviour "
                              "(test_file.py::test_name)")
    elif public:
        raise RubricError(f"{where}: only pytest, log and blocks items name public tests")
    gpu = raw.get("gpu", False)
    if not isinstance(gpu, bool):
        raise RubricError(f"{where}: gpu must be true or false")
    options = {k: raw[k] for k in _EXTRA[kind] if k in raw}
    if kind == "throughput":
        if not isinstance(options.get("workload"), str):
            raise RubricError(f"{where}: throughput items name a workload")
        options.setdefault("rounds", 3)
        options.setdefault("min_ratio", 0.5)
        options["requires"] = list(options.get("requires", []))
        unknown_items = [r for r in options["requires"] if r not in seen]
        if unknown_items:
            raise RubricError(f"{where}: requires {unknown_items}, which must be items listed before it")
    if kind == "report":
        if not options.get("files"):
            raise RubricError(f"{where}: report items list the files to check")
        options.setdefault("headings", [])
        options.setdefault("min_words", 0)
        options.setdefault("check", "form")
        if options["check"] not in REPORT_CHECKS:
            raise RubricError(f"{where}: check must be one of {REPORT_CHECKS}, got {options['check']!r}")
        if options["check"] not in ("form", "figures", "runs") and not options.get("sections"):
            raise RubricError(f"{where}: a {options['check']} check names the report sections it reads")
        if options["check"] in NEEDS_EVIDENCE and not options.get("evidence"):
            raise RubricError(f"{where}: a {options['check']} check names its evidence files (globs)")
        options.setdefault("sections", [])
        options.setdefault("evidence", [])
        options.setdefault("min_count", 1)
        options.setdefault("must_name", [])
        if isinstance(options["min_count"], bool) or not isinstance(options["min_count"], int) \
                or options["min_count"] < 0:
            raise RubricError(f"{where}: min_count must be a whole number")
    if kind == "ta":
        _check_anchors(options.get("anchors"), points, where)
        options.setdefault("reads", [])
    return Item(item_id, str(raw.get("title", item_id)), points, kind, float(deadline), tuple(select),
                tuple(public), gpu, options)


def _check_anchors(anchors: Any, points: int, where: str) -> None:
    """A TA item's anchors: distinct marks from 0 to the item's points, each saying what earns it."""
    if not isinstance(anchors, list) or not anchors or not all(
            isinstance(a, dict) and set(a) == {"points", "means"} and isinstance(a["means"], str) and a["means"]
            and isinstance(a["points"], int) and not isinstance(a["points"], bool) for a in anchors):
        raise RubricError(f"{where}: a ta item lists anchors, each {{\"points\": N, \"means\": \"...\"}}")
    marks = [a["points"] for a in anchors]
    if len(set(marks)) != len(marks) or min(marks) != 0 or max(marks) != points:
        raise RubricError(f"{where}: anchors are distinct marks from 0 to the item's {points} points, got {marks}")


def parse_rubric(data: dict[str, Any], path: Path) -> Rubric:
    where = str(path)
    if not isinstance(data, dict) or not isinstance(data.get("items"), list) or not data["items"]:
        raise RubricError(f"{where}: a rubric is an object with a non-empty 'items' list")
    lab = data.get("lab")
    if not isinstance(lab, str) or not lab.startswith("lab"):
        raise RubricError(f"{where}: 'lab' must name the lab, e.g. \"lab2\"")
    seen: dict[str, Item] = {}
    for raw in data["items"]:
        item = _item(raw, where, seen)
        seen[item.id] = item
    rubric = Rubric(lab, str(data.get("title", lab)), tuple(seen.values()), path, data.get("due"))
    if rubric.total != TOTAL:
        raise RubricError(f"{where}: points add up to {rubric.total}, not {TOTAL}")
    return rubric


def load_rubric(lab: str, path: Path | None = None) -> Rubric:
    """The lab's rubric, validated (RubricError says what is wrong and where)."""
    path = path or registry_lab(lab).rubric
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise RubricError(f"{path}: not valid JSON ({err})") from err
    rubric = parse_rubric(data, path)
    if rubric.lab != lab:
        raise RubricError(f"{path}: says lab {rubric.lab!r}, expected {lab!r}")
    return rubric
