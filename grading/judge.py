"""The judge: compare a graded process's observations with the golden outputs, and explain the first difference.

This module runs in the grader, which never imports student code; it reads
only plain JSON. An item passes when every test the golden outputs expect for
it was reported, ran to its end, and observed exactly what the reference
observed (floats within a tight tolerance). A test that is missing, cut short,
or reported twice fails; nothing the graded process claims about itself
(exit status, pytest's verdicts) is consulted.

An explanation shows what the student's code did and where it first differs,
never the reference's value there: every graded test is hidden, and its
expected values would give the test away (the public tests behind each item
check the same rule and show both, `inferlab check`). Context the student's
code already matched (GOOD lines) is the student's own output. By the item's kind:
- log: the lifecycle logs line by line, xv6-style: GOOD lines of context,
  then BAD (what the student's engine logged where the reference's log
  differs), or MISSING where the student's log ends early;
- blocks: the first step whose scheduling or block tables differ: the
  student's schedule of that step and the differing field;
- pytest: the first differing observation, narrowed to the exact field.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

CONTEXT = 3
REL_TOL = 1e-6
ABS_TOL = 1e-9
SHOW = 240


TOLERANCE_KEY = "__rtol__"


def same(expected: Any, got: Any, rel_tol: float = REL_TOL) -> bool:
    """Structural equality; numbers must match in kind (bool is not int), floats within tolerance.

    A golden value {"__rtol__": r, "value": v} compares `v` with relative (and
    absolute) tolerance r: the tolerance comes from the golden outputs, so the
    graded process cannot loosen it by what it reports.
    """
    if isinstance(expected, dict) and TOLERANCE_KEY in expected:
        tol = float(expected[TOLERANCE_KEY])
        return (isinstance(got, dict) and set(got) == set(expected)
                and same(expected["value"], got["value"], rel_tol=tol))
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, float) or isinstance(got, float):
        numbers = (int, float)
        return (isinstance(expected, numbers) and isinstance(got, numbers)
                and math.isclose(expected, got, rel_tol=rel_tol, abs_tol=max(ABS_TOL, rel_tol if rel_tol > REL_TOL
                                                                             else ABS_TOL)))
    if type(expected) is not type(got):
        return False
    if isinstance(expected, list):
        return len(expected) == len(got) and all(same(a, b, rel_tol) for a, b in zip(expected, got))
    if isinstance(expected, dict):
        return expected.keys() == got.keys() and all(same(expected[k], got[k], rel_tol) for k in expected)
    return expected == got


def where_different(expected: Any, got: Any, path: str = "", rel_tol: float = REL_TOL) -> tuple[str, Any, Any]:
    """The innermost path at which two values differ, with the values there.

    Where the two mappings have different keys the path stops at the mapping:
    naming the key the reference has would tell what the reference did.
    """
    if isinstance(expected, dict) and TOLERANCE_KEY in expected and isinstance(got, dict) and "value" in got:
        return where_different(expected["value"], got["value"], path, float(expected[TOLERANCE_KEY]))
    if isinstance(expected, dict) and isinstance(got, dict):
        if expected.keys() != got.keys():
            return path, expected, got
        for key in expected:
            if not same(expected[key], got[key], rel_tol):
                return where_different(expected[key], got[key], f"{path}[{key!r}]", rel_tol)
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        for i, (a, b) in enumerate(zip(expected, got)):
            if not same(a, b, rel_tol):
                return where_different(a, b, f"{path}[{i}]", rel_tol)
    return path, expected, got


def show(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= SHOW else text[:SHOW - 3] + "..."


@dataclass
class TestVerdict:
    test: str
    passed: bool
    reason: str = ""                      # missing | incomplete | differs | ""
    explanation: list[str] = field(default_factory=list)


@dataclass
class ItemVerdict:
    passed: bool
    tests_expected: int
    tests_passed: int
    message: str
    failures: list[TestVerdict] = field(default_factory=list)


def _error_gist(error: str | None) -> str:
    """The exception, and where in the engine's code it was raised (the grader maps that to the student's line)."""
    if not error:
        return ""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    e_lines = [line[1:].strip() for line in lines if line.startswith("E ")]
    gist = (e_lines or lines[-1:] or [""])[-1][:300]
    frames = [line for line in lines if line.startswith("student_exercises/") and " in " in line]
    return f"{gist} at {frames[-1]}" if frames else gist


def explain_log(expected: list[str], got: list[str]) -> list[str]:
    """xv6-style log comparison: context, then the first BAD line, or MISSING where the log ends early.

    Only the student's own lines are shown (GOOD lines equal the
    reference's), never the reference's line at the difference.
    """
    if not isinstance(got, list):
        return [f"BAD     your log is {show(got)}, not a list of events"]
    i = 0
    while i < len(expected) and i < len(got) and expected[i] == got[i]:
        i += 1
    out = [f"GOOD    {line}" for line in got[max(0, i - CONTEXT):i]]
    if i < len(got) and i < len(expected):
        out.append(f"BAD     {show(got[i])}")
        out.append(f"        (event {i + 1}: the reference's log has a different event here; "
                   f"it has {len(expected)} events, yours {len(got)})")
    elif i < len(expected):
        out.append(f"MISSING (your log ends after {len(got)} events; the reference's goes on for {len(expected) - i} "
                   f"more)")
    elif i < len(got):
        out.append(f"BAD     {show(got[i])}")
        out.append(f"        (the reference's log ends before this: {len(got) - i} extra event(s))")
    return out


def explain_value(key: str, expected: Any, got: Any, kind: str) -> list[str]:
    """Where the student's observation `key` first differs, and the student's value there (not the reference's)."""
    if kind == "log" and key == "log" and isinstance(expected, list):
        return explain_log(expected, got)
    if isinstance(got, dict) and set(got) == {"raised"} and not (isinstance(expected, dict) and "raised" in expected):
        return [f"  {key}: your code raised {got['raised']} here, which differs from the reference's observation"]
    path, _, have = where_different(expected, got)
    lines = []
    if kind == "blocks" and key.startswith("step "):
        lines.append(f"at engine {key} (after the step):")
        if isinstance(got, dict):
            lines.append(f"  yours scheduled: {show(got.get('scheduled'))}")
    lines.append(f"  {key}{path}: yours is {show(have)}, which differs from the reference's")
    return lines


def judge_test(test: str, expected: list[list[Any]], record: dict[str, Any] | None, kind: str) -> TestVerdict:
    if record is None:
        return TestVerdict(test, False, "missing", ["never reported: the process ended or was killed before this "
                                                    "test finished (or never collected it)"])
    got = record.get("obs") or []
    if kind == "log":
        # A log item is about the log: explain the log's first difference, even if something before it differs too.
        want_log = next((value for key, value in expected if key == "log"), None)
        got_log = next((pair[1] for pair in got if isinstance(pair, list) and len(pair) == 2 and pair[0] == "log"),
                       None)
        if want_log is not None and got_log is not None and not same(want_log, got_log):
            return TestVerdict(test, False, "differs", explain_log(want_log, got_log))
    for index, pair in enumerate(expected):
        key, value = pair
        if index >= len(got):
            gist = _error_gist(record.get("error"))
            lines = [f"GOOD    {k}" for k, _ in expected[max(0, index - CONTEXT):index]]
            lines.append(f"MISSING (your observations stop after {index} of {len(expected)})"
                         + (f"  your code raised: {gist}" if gist else ""))
            return TestVerdict(test, False, "incomplete", lines)
        got_pair = got[index]
        if not (isinstance(got_pair, list) and len(got_pair) == 2 and got_pair[0] == key):
            context = [f"GOOD    {k}" for k, _ in expected[max(0, index - CONTEXT):index]]
            return TestVerdict(test, False, "differs", context + [
                f"BAD     observation {index + 1} is {show(got_pair)}: the reference observed something else here"])
        if not same(value, got_pair[1]):
            context = [f"GOOD    {k}" for k, _ in expected[max(0, index - CONTEXT):index]]
            return TestVerdict(test, False, "differs", context + explain_value(key, value, got_pair[1], kind))
    if len(got) > len(expected):
        return TestVerdict(test, False, "differs", [f"BAD     {len(got) - len(expected)} observation(s) more than "
                                                    f"the reference made, from {show(got[len(expected)])}"])
    if not record.get("complete"):
        gist = _error_gist(record.get("error"))
        return TestVerdict(test, False, "incomplete", [f"the test did not finish normally: {gist or 'no report'}"])
    return TestVerdict(test, True)


def judge_item(kind: str, expected_tests: list[str], golden_tests: dict[str, list], records: dict[str, dict]
               ) -> ItemVerdict:
    """All-or-nothing verdict for one item, with the first failure explained."""
    verdicts = [judge_test(t, golden_tests[t], records.get(t), kind) for t in expected_tests]
    failures = [v for v in verdicts if not v.passed]
    passed = not failures and bool(expected_tests)
    n = len(expected_tests)
    if passed:
        message = f"all {n} hidden test(s) match the reference"
    elif not expected_tests:
        message = "no hidden tests expected for this item (golden outputs missing?)"
    else:
        first = failures[0]
        message = f"{len(failures)} of {n} hidden test(s) differ from the reference; first: {first.test}"
    return ItemVerdict(passed, n, n - len(failures), message, failures)
