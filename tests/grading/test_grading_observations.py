"""The observations parser refuses malformed lines as the submission's problem, never a grader error.

Each malformed line below is one a graded process can write into its own
observations file (it is untrusted code). The parser must skip it, name what
is wrong in a problem (which becomes a flag in the result), and keep reading
the good lines around it.
"""
from __future__ import annotations

import json

import pytest

from grading.execute import MAX_DEPTH, MAX_LINE_BYTES, read_observations
from grading.judge import judge_item

GOOD = json.dumps({"test": "good", "obs": [["k", [1, 2.5, "x", None, True]]], "complete": True, "error": None})

MALFORMED = {
    "deep": ("[" * 100_000 + "]" * 100_000, "nested deeper"),
    "deep_but_parsable": (json.dumps({"test": "t", "obs": [["k", json.loads("[" * 80 + "]" * 80)]],
                                      "complete": True}), "nested deeper"),
    "huge_int": ('{"test": "t", "obs": [["k", ' + "9" * 5000 + ']], "complete": true}', "5000 digits"),
    "long_int": ('{"test": "t", "obs": [["k", ' + "1" * 60 + ']], "complete": true}', "digits"),
    "overflowing_float": ('{"test": "t", "obs": [["k", 1e400]], "complete": true}', "out of range"),
    "nan": ('{"test": "t", "obs": [["k", NaN]], "complete": true}', "NaN is not a JSON number"),
    "infinity": ('{"test": "t", "obs": [["k", -Infinity]], "complete": true}', "Infinity is not"),
    "not_utf8": (b'{"test": "t", "obs": [["k", "\xff\xfe"]], "complete": true}', "not UTF-8"),
    "lone_surrogate": ('{"test": "t", "obs": [["k", "\\ud800"]], "complete": true}', "surrogate"),
    "too_long": ('{"test": "t", "obs": [["k", "' + "x" * (MAX_LINE_BYTES + 1) + '"]], "complete": true}',
                 "bytes long"),
    "not_pairs": ('{"test": "t", "obs": [["k", 1, 2]], "complete": true}', "not a [key, value] pair"),
    "bad_complete": ('{"test": "t", "obs": [], "complete": "yes"}', "'complete' or 'error'"),
    "bad_error": ('{"test": "t", "obs": [], "complete": true, "error": {"x": 1}}', "'complete' or 'error'"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_line_is_refused_with_a_clear_problem_and_the_rest_is_read(tmp_path, name):
    line, words = MALFORMED[name]
    raw = line if isinstance(line, bytes) else line.encode("utf-8")
    path = tmp_path / "observations.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + raw + b"\n")
    records, order, _, problems = read_observations(path)
    assert order == ["good"] and set(records) == {"good"}
    assert len(problems) == 1 and "observations line 2" in problems[0] and words in problems[0], problems


def test_nesting_up_to_the_limit_is_accepted(tmp_path):
    depth = MAX_DEPTH - 4                      # record, obs list, pair, then the value's own levels
    value = json.loads("[" * depth + "]" * depth)
    path = tmp_path / "observations.jsonl"
    path.write_text(json.dumps({"test": "t", "obs": [["k", value]], "complete": True}) + "\n")
    records, _, _, problems = read_observations(path)
    assert set(records) == {"t"} and not problems


def test_a_forged_sandbox_summary_that_is_not_an_object_is_ignored(tmp_path):
    path = tmp_path / "observations.jsonl"
    path.write_text(json.dumps({"sandbox": [1, 2]}) + "\n" + json.dumps({"sandbox": {"x": "y" * 10_000}}) + "\n")
    assert read_observations(path)[2] is None


def test_problems_are_capped(tmp_path):
    path = tmp_path / "observations.jsonl"
    path.write_text("not json\n" * 500)
    problems = read_observations(path)[3]
    assert len(problems) == 21 and problems[-1] == "... and 480 more observations problem(s)"


def test_the_judge_takes_every_accepted_record_without_raising(tmp_path):
    """Whatever passes the parser is safe to judge: odd but well-formed values just fail to match."""
    path = tmp_path / "observations.jsonl"
    value = json.loads("[" * (MAX_DEPTH - 4) + "]" * (MAX_DEPTH - 4))
    lines = [{"test": "t", "obs": [["k", value], ["extra", {"raised": 1}]], "complete": True},
             {"test": "u", "obs": [["other", -10 ** 39]], "complete": False, "error": "x" * 10_000}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    records = read_observations(path)[0]
    verdict = judge_item("blocks", ["t", "u"], {"t": [["k", [1]]], "u": [["step 1", {"tables": {}}]]}, records)
    assert not verdict.passed and verdict.tests_passed == 0
