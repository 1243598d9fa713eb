"""The judge: compare a graded process's observations with the golden outputs, and explain the first difference.

This module runs in the grader, which never imports student code; it reads
only plain JSON. An item passes when every test the golden outputs expect for
it was reported, ran to its end, and observed exactly what the reference
observed (floats within a tight tolerance). A test that is missing, cut short,
or reported twice fails; nothing the graded process claims about itself
(exit status, pytest's verdicts) is consulted.

Explanations follow the item's kind:
- log: the lifecycle logs line by line, xv6-style: GOOD lines of context,
  then BAD (what the student's engine logged) and MISSING (what the
  reference logged there);
- blocks: the first step whose scheduling or block tables differ, with the
  differing sequence's table side by side;
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


def same(expected: Any, got: Any) -> bool:
    """Structural equality; numbers must match in kind (bool is not int), floats within tolerance."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, float) or isinstance(got, float):
        numbers = (int, float)
        return (isinstance(expected, numbers) and isinstance(got, numbers)
                and math.isclose(expected, got, rel_tol=REL_TOL, abs_tol=ABS_TOL))
    if type(expected) is not type(got):
        return False
    if isinstance(expected, list):
        return len(expected) == len(got) and all(same(a, b) for a, b in zip(expected, got))
    if isinstance(expected, dict):
        return expected.keys() == got.keys() and all(same(expected[k], got[k]) for k in expected)
    return expected == got


def where_different(expected: Any, got: Any, path: str = "") -> tuple[str, Any, Any]:
    """The innermost path at which two values differ, with the values there."""
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in expected:
            if key not in got:
                return f"{path}[{key!r}]", expected[key], "(missing)"
            if not same(expected[key], got[key]):
                return where_different(expected[key], got[key], f"{path}[{key!r}]")
        extra = [k for k in got if k not in expected]
        if extra:
            return f"{path}[{extra[0]!r}]", "(absent)", got[extra[0]]
    if isinstance(expected, list) and isinstance(got, list) and len(expected) == len(got):
        for i, (a, b) in enumerate(zip(expected, got)):
            if not same(a, b):
                return where_different(a, b, f"{path}[{i}]")
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
    if not error:
        return ""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    e_lines = [line[1:].strip() for line in lines if line.startswith("E ")]
    return (e_lines or lines[-1:] or [""])[-1][:300]


def explain_log(expected: list[str], got: list[str]) -> list[str]:
    """xv6-style log comparison: context, then the first BAD / MISSING lines."""
    if not isinstance(got, list):
        return [f"BAD     the log is {show(got)}, not a list of events"]
    i = 0
    while i < len(expected) and i < len(got) and expected[i] == got[i]:
        i += 1
    out = [f"GOOD    {line}" for line in expected[max(0, i - CONTEXT):i]]
    if i < len(got):
        out.append(f"BAD     {got[i]}")
    if i < len(expected):
        out.append(f"MISSING {expected[i]}")
        rest = len(expected) - i - 1
        if rest:
            out.append(f"        ... and {rest} more expected event(s) after it")
    elif i < len(got):
        out.append(f"        (the reference's log ends before this: {len(got) - i} extra event(s))")
    return out


def explain_value(key: str, expected: Any, got: Any, kind: str) -> list[str]:
    if kind == "log" and key == "log" and isinstance(expected, list):
        return explain_log(expected, got)
    path, want, have = where_different(expected, got)
    lines = []
    if kind == "blocks" and key.startswith("step "):
        lines.append(f"at engine {key} (after the step):")
        if isinstance(expected, dict) and isinstance(got, dict):
            lines.append(f"  reference scheduled: {show(expected.get('scheduled'))}")
            lines.append(f"  yours scheduled:     {show(got.get('scheduled'))}")
    label = f"{key}{path}"
    lines.append(f"  {label}: expected {show(want)}")
    lines.append(f"  {' ' * len(label)}  got      {show(have)}")
    return lines


def judge_test(test: str, expected: list[list[Any]], record: dict[str, Any] | None, kind: str) -> TestVerdict:
    if record is None:
        return TestVerdict(test, False, "missing", ["never reported: the process ended or was killed before this "
                                                    "test finished (or never collected it)"])
    got = record.get("obs") or []
    for index, pair in enumerate(expected):
        key, value = pair
        if index >= len(got):
            gist = _error_gist(record.get("error"))
            lines = [f"GOOD    {k}" for k, _ in expected[max(0, index - CONTEXT):index]]
            lines.append(f"MISSING {key}" + (f"  (your code raised: {gist})" if gist else ""))
            return TestVerdict(test, False, "incomplete", lines)
        got_pair = got[index]
        if not (isinstance(got_pair, list) and len(got_pair) == 2 and got_pair[0] == key):
            return TestVerdict(test, False, "differs", [f"BAD     observation {index} is {show(got_pair)}, "
                                                        f"expected {key!r}"])
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
