"""Unit tests of the grader's pieces that need no graded process: rubrics, judge, extraction, output, reports.

Expected values here are written out by hand from the rules in each module's
docstring, never computed with the code under test.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import jsonschema
import pytest

from grading.execute import read_observations
from grading.judge import explain_log, judge_item, judge_test, same
from labkit.labs import all_labs
from grading.paths import SCHEMAS
from grading.report import csv_rows, feedback_markdown, gradescope_results, write_csv
from labkit.rubric import RubricError, load_rubric, parse_rubric
from grading.spawn import KEEP_BYTES, Output
from labkit.student_code import suspicious_uses
from grading.submission import extract, ignored_files
from labkit.tree import PACKAGE, generate, load_reference, write_package
from labkit.regions import stub_body

RUBRICS = [lab.rubric for lab in all_labs() if lab.rubric.is_file()]


def schema(name: str) -> dict:
    return json.loads((SCHEMAS / name).read_text())


# -- rubrics ------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", RUBRICS, ids=lambda p: p.parent.name)
def test_every_rubric_is_valid_and_totals_100(path):
    lab = path.parent.name.split("_", 1)[0]
    rubric = load_rubric(lab, path)
    assert sum(item.points for item in rubric.items) == 100
    assert len({item.id for item in rubric.items}) == len(rubric.items)


@pytest.mark.parametrize("path", RUBRICS, ids=lambda p: p.parent.name)
def test_public_tests_named_by_a_rubric_exist(path):
    """Each `public` entry names a test function defined in one of the lab's public test files (read with ast)."""
    import ast
    lab = next(each for each in all_labs() if each.rubric == path)
    defined = {f"{f.name}::{node.name}" for f in lab.public_tests()
               for node in ast.parse(f.read_text(encoding="utf-8")).body if isinstance(node, ast.FunctionDef)}
    named = {test for item in load_rubric(lab.lab_id, path).items for test in item.public}
    assert named <= defined, sorted(named - defined)


def test_the_labs_with_rubrics():
    assert {p.parent.name.split("_", 1)[0] for p in RUBRICS} >= {"lab1", "lab2", "lab3"}


def _rubric(items):
    return {"lab": "lab9", "items": items}


GOOD_ITEM = {"id": "a", "points": 100, "kind": "pytest", "select": ["hidden/lab9/test_x.py"],
             "public": ["test_lab9_x.py::test_x"]}


@pytest.mark.parametrize("items, complaint", [
    ([{**GOOD_ITEM, "points": 99}], "add up to 99"),
    ([GOOD_ITEM, {**GOOD_ITEM}], "duplicate id"),
    ([{**GOOD_ITEM, "kind": "magic"}], "kind must be one of"),
    ([{**GOOD_ITEM, "parent": "a"}], "unknown field"),
    ([{**GOOD_ITEM, "public": []}], "public must list"),
    ([{**GOOD_ITEM, "points": 90}, {"id": "t", "points": 10, "kind": "throughput", "workload": "w",
                                   "requires": ["zzz"]}], "requires \\['zzz'\\]"),
    ([{**GOOD_ITEM, "select": ["tests/test_x.py"]}], "under hidden/"),
    ([{**GOOD_ITEM, "points": 0}], "positive integer"),
    ([{**GOOD_ITEM, "deadline_s": 10_000}], "deadline_s"),
    ([{**GOOD_ITEM, "colour": "red"}], "unknown field"),
    ([{"id": "t", "points": 100, "kind": "throughput"}], "name a workload"),
    ([{**GOOD_ITEM, "public": ["test_x.py"]}], "public must list the public tests"),
    ([{**GOOD_ITEM, "public": "test_lab9_x.py::test_y"}], "public must list the public tests"),
])
def test_bad_rubrics_are_refused_with_a_reason(items, complaint):
    with pytest.raises(RubricError, match=complaint):
        parse_rubric(_rubric(items), Path("rubric.json"))


# -- judge --------------------------------------------------------------------------------------

def test_same_is_strict_about_kinds_and_lenient_only_on_floats():
    assert same([1, 2], [1, 2]) and not same([1, 2], [2, 1])
    assert not same(True, 1) and not same(1, True)
    assert same(0.1 + 0.2, 0.3) and not same(0.3, 0.31)
    assert not same({"a": 1}, {"a": 1, "b": 2})
    assert not same("1", 1)


def test_log_explanation_is_good_bad_missing_without_the_references_lines():
    expected = ["step=0 ARRIVED seq=0", "step=0 QUEUED seq=0", "step=0 SCHEDULED seq=0 n=3", "step=1 TOKEN seq=0"]
    got = ["step=0 ARRIVED seq=0", "step=0 QUEUED seq=0", "step=0 SCHEDULED seq=0 n=4", "step=1 TOKEN seq=0"]
    assert explain_log(expected, got) == [
        "GOOD    step=0 ARRIVED seq=0",
        "GOOD    step=0 QUEUED seq=0",
        "BAD     step=0 SCHEDULED seq=0 n=4",
        "        (event 3: the reference's log has a different event here; it has 4 events, yours 4)",
    ]
    short = explain_log(expected, got[:2])
    assert short[-1].startswith("MISSING (your log ends after 2 events") and not any("n=3" in line for line in short)


def test_a_test_fails_when_missing_cut_short_or_different():
    expected = [["a", 1], ["b", [1, 2]]]
    assert judge_test("t", expected, None, "pytest").reason == "missing"
    short = judge_test("t", expected, {"obs": [["a", 1]], "complete": False, "error": "E   NotImplementedError: lab2.x"},
                       "pytest")
    assert short.reason == "incomplete" and "NotImplementedError: lab2.x" in short.explanation[-1]
    wrong = judge_test("t", expected, {"obs": [["a", 1], ["b", [1, 3]]], "complete": True}, "pytest")
    assert wrong.reason == "differs" and any("b[1]: yours is 3" in line for line in wrong.explanation)
    not_finished = judge_test("t", expected, {"obs": expected, "complete": False, "error": None}, "pytest")
    assert not not_finished.passed
    assert judge_test("t", expected, {"obs": expected, "complete": True}, "pytest").passed


SECRET = "SECRET-4242"     # a value only the reference observed: no explanation may show it


@pytest.mark.parametrize(("kind", "expected", "got"), [
    ("pytest", [["a", 1], ["b", {"x": [1, SECRET]}]], [["a", 1], ["b", {"x": [1, "mine"]}]]),
    ("pytest", [["b", {"x": 1, SECRET: 2}]], [["b", {"x": 1, "y": 2}]]),            # a key only the reference has
    ("pytest", [["b", SECRET]], [["b", {"raised": "ValueError"}]]),
    ("pytest", [["b", {"raised": SECRET}]], [["b", 3]]),
    ("pytest", [["b", 1], [SECRET, 2]], [["b", 1], ["mine", 2]]),
    ("log", [["log", ["e1", SECRET, "e3"]]], [["log", ["e1", "mine", "e3"]]]),
    ("log", [["log", ["e1", SECRET]]], [["log", ["e1"]]]),
    ("blocks", [["step 3", {"scheduled": [SECRET], "changed": {"r1": [4]}, "free": 2}]],
     [["step 3", {"scheduled": ["r0:D1+4"], "changed": {"r1": [5]}, "free": 2}]]),
    ("blocks", [["step 3", {"scheduled": ["r0:D1+4"], "changed": {SECRET: [4]}, "free": 2}]],
     [["step 3", {"scheduled": ["r0:D1+4"], "changed": {"r1": [5]}, "free": 2}]]),
])
def test_an_explanation_never_shows_what_only_the_reference_observed(kind, expected, got):
    verdict = judge_test("t", expected, {"obs": got, "complete": True, "error": None}, kind)
    assert not verdict.passed and verdict.explanation
    assert not any(SECRET in line for line in verdict.explanation), verdict.explanation


def test_an_item_needs_every_expected_test():
    golden = {"t1": [["x", 1]], "t2": [["x", 2]]}
    good = {"t1": {"obs": [["x", 1]], "complete": True}, "t2": {"obs": [["x", 2]], "complete": True}}
    assert judge_item("pytest", ["t1", "t2"], golden, good).passed
    verdict = judge_item("pytest", ["t1", "t2"], golden, {"t1": good["t1"]})
    assert not verdict.passed and verdict.tests_passed == 1
    assert not judge_item("pytest", [], golden, good).passed


def test_observation_files_are_read_defensively(tmp_path):
    path = tmp_path / "obs.jsonl"
    lines = [json.dumps({"sandbox": {"audit_hook": True}}), "not json", json.dumps([1, 2]),
             json.dumps({"test": "t1", "obs": [], "complete": True}),
             json.dumps({"test": "t2", "obs": [["k", 1]], "complete": True}),
             json.dumps({"test": "t2", "obs": [["k", 2]], "complete": True}),
             json.dumps({"test": "t3"})]
    path.write_text("\n".join(lines) + "\n")
    records, order, sandbox, problems = read_observations(path)
    assert order == ["t1"] and set(records) == {"t1"}
    assert sandbox == {"audit_hook": True}
    assert len(problems) == 4      # not JSON, not an object, t2 twice, t3 without observations


# -- output bounding ----------------------------------------------------------------------------

def test_output_keeps_head_and_tail_and_finds_refusals():
    out = Output()
    out.feed(b"start\n")
    out.feed(b"x" * (5 * KEEP_BYTES))
    out.feed(b"\nINFERLAB-SANDBOX-DENIED open '/secret'\nend\n")
    assert out.total == 6 + 5 * KEEP_BYTES + 44
    text = out.text()
    assert text.startswith("start") and text.rstrip().endswith("end") and "bytes not kept" in text
    assert len(text) < 3 * KEEP_BYTES
    assert out.denials == ["open '/secret'"]


# -- extraction ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tree():
    return load_reference()


def _student_tree(tmp_path, tree, edit=None):
    files = generate(tree, lambda region: stub_body(region) if region.lab == "lab2" else None)
    if edit:
        edit(files)
    write_package(files, tmp_path / PACKAGE)
    return tmp_path / PACKAGE


def test_stubs_count_as_not_attempted(tmp_path, tree):
    out = extract(_student_tree(tmp_path, tree), tree, "lab2")
    assert out.bodies == {}
    assert {r.status for r in out.regions} == {"not attempted"}
    assert len(out.regions) == sum(1 for r in tree.regions if r.lab == "lab2")


def test_a_region_is_found_by_id_reindented_and_checked(tmp_path, tree):
    path = "engine/block_manager.py"

    def edit(files):
        text = files[path]
        stub = '        raise NotImplementedError("lab2.can_append")\n'
        # the student's body, indented by 12 instead of 8, plus a broken region and an edit outside regions
        text = text.replace(stub, "            return True\n", 1)
        text = text.replace('        raise NotImplementedError("lab2.may_append")\n', "        if (:\n", 1)
        files[path] = text + "\nimport math\nmath.isclose = lambda *a, **k: True\n"

    out = extract(_student_tree(tmp_path, tree, edit), tree, "lab2")
    status = {r.region_id: r for r in out.regions}
    assert status["lab2.can_append"].status == "attempted"
    assert out.bodies["lab2.can_append"] == "        return True\n"
    assert status["lab2.may_append"].status == "broken" and "does not compile" in status["lab2.may_append"].message
    assert [a.name for a in out.additions[path]] == ["import math"], "a new import is carried"
    assert any("math.isclose" in e.describe() and "not run" in e.describe() for e in out.outside_edits), \
        "patching a module's attribute outside the regions is an edit, never run"


@pytest.mark.parametrize("body, flagged", [
    ("self.running.remove(seq)\n", []),                          # a deque's remove: correct lab 3 code
    ("pattern = re.compile('x')\nfast = torch.compile(f)\n", []),
    ("limit = sys.maxsize\nstart = time.perf_counter()\n", []),
    ("os.remove(path)\n", ["os.remove"]),
    ("open('/etc/passwd').read()\n", ["open"]),
    ("sys.modules['grading'] = None\n", ["sys.modules"]),
    ("math.isclose = lambda *a, **k: True\n", ["math.isclose", "sets math.isclose"]),
    ("import numpy.testing\nnumpy.testing.assert_allclose = None\nseq.status = 1\nself.x.y = 2\n",
     ["sets numpy.testing.assert_allclose"]),
    ("import subprocess\nfrom os import environ\n", ["environ", "os", "subprocess"]),
    ("time.sleep(5)\nexec(code)\n", ["exec", "time.sleep"]),
])
def test_only_uses_an_engine_has_no_need_for_are_flagged(body, flagged):
    """Flags are for a TA's review: an attack on the grader is flagged, idioms of correct code are not
    (a correct lab 3 `preempt` that calls `self.running.remove(seq)` was flagged by its attribute name)."""
    assert suspicious_uses(body) == flagged


def test_no_reference_body_is_flagged(tree):
    assert {r.region_id: suspicious_uses(tree.body(r.region_id)) for r in tree.regions
            if suspicious_uses(tree.body(r.region_id))} == {}


def test_missing_file_and_missing_marker(tmp_path, tree):
    def edit(files):
        lines = files["engine/block_manager.py"].splitlines(keepends=True)
        begin = next(i for i, line in enumerate(lines) if "# >>> EXERCISE lab2.deallocate" in line)
        end = next(i for i, line in enumerate(lines) if "# <<< EXERCISE lab2.deallocate" in line)
        files["engine/block_manager.py"] = "".join(lines[:begin] + ["        return 0\n"] + lines[end + 1:])
    package = _student_tree(tmp_path, tree, edit)
    out = extract(package, tree, "lab2")
    assert {r.region_id: r.status for r in out.regions}["lab2.deallocate"] == "missing"
    (package / "engine" / "block_manager.py").unlink()
    out = extract(package, tree, "lab2")
    assert {r.status for r in out.regions} == {"missing"}


def test_damaged_markers_make_the_file_s_regions_broken(tmp_path, tree):
    def edit(files):
        files["engine/block_manager.py"] = files["engine/block_manager.py"].replace(
            "# <<< EXERCISE lab2.deallocate", "# (end marker deleted)")
    out = extract(_student_tree(tmp_path, tree, edit), tree, "lab2")
    assert {r.status for r in out.regions if r.region_id != "lab2.request_metrics"} == {"broken"}


def test_files_that_could_run_code_are_named():
    notes = ignored_files({"conftest.py": "0" * 64, "student_exercises/sitecustomize.py": "0" * 64,
                           "x.pth": "0" * 64, "report.md": "0" * 64})
    assert len(notes) == 3 and not any("report.md" in n for n in notes)


# -- reports ------------------------------------------------------------------------------------

def _result(student: str, score: int, status: str = "passed") -> dict:
    item = {"id": "alloc", "title": "Allocation", "kind": "pytest", "points": 100, "score": score, "status": status,
            "message": "m", "details": ["GOOD    a", "BAD     b"], "flags": [], "tests": {"expected": 2, "passed": 1},
            "wall_s": 1.0, "output_tail": "", "measurements": {}}
    return {"format": 1, "complete": True, "lab": "lab2", "student_id": student, "score": score, "max_score": 100,
            "gradable_points": 100, "blocked_points": 0, "items": [item],
            "regions": [{"region_id": "lab2.allocate", "status": "attempted", "message": ""}], "flags": ["x"],
            "notes": [], "files": {"a.py": "a" * 64}, "submission_sha256": "b" * 64, "rubric_sha256": "c" * 64,
            "golden_sha256": "d" * 64, "environment": {"device": "cpu", "versions": {}, "spawn": "fork", "sandbox": None},
            "timing": {"started": "", "finished": "", "wall_s": 1.0}}


def test_schemas_are_valid_and_reject_what_they_should():
    for name in ("result.schema.json", "gradescope.schema.json", "grades_csv.schema.json"):
        jsonschema.Draft202012Validator.check_schema(schema(name))
    validator = jsonschema.Draft202012Validator(schema("result.schema.json"))
    assert not list(validator.iter_errors(_result("s", 100)))
    broken = _result("s", 100)
    broken["items"][0]["status"] = "maybe"
    assert list(validator.iter_errors(broken))


def test_csv_gradescope_and_feedback_from_results(tmp_path):
    results = [_result("ann", 100), _result("ben", 0, "failed")]
    path = write_csv(results, tmp_path / "grades.csv", {"ann": {"score": 3.0, "max_score": 3.0}})
    rows = list(csv.DictReader(open(path, encoding="utf-8")))
    assert [r["student_id"] for r in rows] == ["ann", "ben"]
    assert rows[0]["item:alloc"] == "100" and rows[1]["item:alloc"] == "0"
    assert rows[0]["nbgrader_score"] == "3.0" and rows[1]["nbgrader_score"] == ""
    header, _ = csv_rows(results)
    assert "nbgrader_score" not in header
    gradescope = gradescope_results(results[1])
    jsonschema.validate(gradescope, schema("gradescope.schema.json"))
    assert gradescope["tests"][0]["status"] == "failed" and gradescope["score"] == 0.0
    feedback = feedback_markdown(results[1])
    assert "**Score: 0 / 100**" in feedback and "BAD     b" in feedback and "flagged for review: x" in feedback


def _public_test_ids(lab_id: str) -> set[str]:
    import ast as _ast
    from labkit.labs import lab as registry_lab
    ids = set()
    for path in registry_lab(lab_id).public_tests():
        for node in _ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, _ast.FunctionDef) and node.name.startswith("test_"):
                ids.add(f"{path.name}::{node.name}")
    return ids


@pytest.mark.parametrize("lab", [lab.lab_id for lab in all_labs() if lab.public_tests() and lab.rubric.is_file()])
def test_every_rubric_item_names_public_tests_of_its_behaviour(lab):
    """No rule is tested only in hidden tests: each behaviour item names public tests that exist, and every
    public test counts towards some item (so the self-check's points are the rubric's)."""
    rubric = load_rubric(lab)
    defined = _public_test_ids(lab)
    named: set[str] = set()
    for item in rubric.correctness_items:
        missing = [t for t in item.public if t not in defined]
        assert item.public and not missing, f"{lab} item {item.id}: public tests {missing or '(none)'} do not exist"
        named |= set(item.public)
    assert not defined - named, f"{lab}: public tests no rubric item names: {sorted(defined - named)}"


# -- Landlock rules around the hidden tests -----------------------------------------------------

def test_landlock_roots_cut_out_the_secret_folder_and_nothing_else(tmp_path):
    from grading.payload._inferlab_sandbox import split_around
    harness = tmp_path / "harness"
    for folder in ("hidden/lab2", "student_exercises/engine"):
        (harness / folder).mkdir(parents=True)
    (harness / "conftest.py").write_text("")
    (harness / "hidden" / "lab2" / "test_x.py").write_text("")
    other = tmp_path / "model"
    other.mkdir()
    full, list_only = split_around([str(harness), str(other)], [str(harness / "hidden")])
    assert sorted(full) == sorted([str(other), str(harness / "conftest.py"), str(harness / "student_exercises")])
    assert sorted(list_only) == sorted([str(harness), str(harness / "hidden")])


def test_an_error_location_is_given_in_the_students_own_file(tmp_path, tree):
    """The harness's line of a failing region body maps to the region and the line of the student's file."""
    from grading.harness import harness_package
    from grading.judge import _error_gist
    from labkit.locate import in_student_terms
    path = "engine/block_manager.py"

    def edit(files):
        text = files[path]
        # the student's file: four blank lines on top (so its numbering differs), and a body that fails
        stub = '        raise NotImplementedError("lab2.can_append")\n'
        files[path] = "\n\n\n\n" + text.replace(stub, "        x = 1\n        return 1 / 0\n", 1)

    package = _student_tree(tmp_path, tree, edit)
    out = extract(package, tree, "lab2")
    files = harness_package("lab2", tree, out.bodies, out.additions)
    harness_line = next(i for i, line in enumerate(files[path].splitlines(), 1) if "return 1 / 0" in line)
    student_line = next(i for i, line in enumerate((package / path).read_text().splitlines(), 1)
                        if "return 1 / 0" in line)
    assert harness_line != student_line
    error = f"  student_exercises/{path}:{harness_line} in can_append\nE   ZeroDivisionError: division by zero"
    gist = _error_gist(error)
    told = in_student_terms(gist, files, package)
    assert "ZeroDivisionError" in told and f"{path}:{student_line} (your line, in region lab2.can_append)" in told, told


def test_an_extended_import_line_is_an_addition_not_a_removal(tmp_path, tree):
    """`from collections import OrderedDict` turned into `..., deque` brings in one more name: carried, and
    not reported as a removal of the old line (which read as if the student had broken the file)."""
    path = "engine/block_manager.py"
    original = next(line for line in generate(tree)[path].splitlines() if line.startswith("from collections import"))

    def edit(files):
        files[path] = files[path].replace(original + "\n", original + ", Counter\n", 1)

    out = extract(_student_tree(tmp_path, tree, edit), tree, "lab2")
    assert [a.name for a in out.additions[path]] == [original + ", Counter"]
    mine = [e.describe() for e in out.outside_edits if e.path.endswith(path)]   # (this tree is no release:
    assert mine == [], mine                                                   # its stand-in switch differs)

    def drop(files):
        files[path] = files[path].replace(original + "\n", "", 1)

    out = extract(_student_tree(tmp_path / "dropped", tree, drop), tree, "lab2")
    assert [e.what for e in out.outside_edits if e.path.endswith(path)] == [f"removed `{original}`"]


PRISTINE_MODULE = '''"""A module."""
import math


def area(r):
    """Area of a circle."""
    return math.pi * r * r


class Box:
    def size(self):
        # >>> EXERCISE lab9.size: Return the size.
        raise NotImplementedError("lab9.size")
        # <<< EXERCISE lab9.size
'''


@pytest.mark.parametrize("change, edited, added", [
    (lambda t: t, [], []),
    (lambda t: t.replace('raise NotImplementedError("lab9.size")', "return 3"), [], []),
    (lambda t: t.replace("Area of a circle.", "The disc's area, pi r^2."), [], []),
    (lambda t: t.replace("return math.pi * r * r", "return 3.14 * r * r"), ["changed `def area`"], []),
    (lambda t: t.replace("import math\n", "import math\nimport os\n"), [], ["import os"]),
], ids=["as-given", "region-filled", "docstring-reworded", "statement-changed", "import-added"])
def test_outside_the_regions_only_code_changes_count(change, edited, added):
    """The comparison's rules (labkit/additions.py): region bodies and docstrings never count;
    a changed statement does; a new import is an addition, not an edit."""
    from labkit.additions import compare
    additions, edits = compare(change(PRISTINE_MODULE), PRISTINE_MODULE, "m.py")
    assert [e.what for e in edits] == edited
    assert [a.name for a in additions] == added


def test_a_syntax_error_outside_the_regions_raises_with_its_line():
    from labkit.additions import compare
    broken = PRISTINE_MODULE.replace("def area(r):", "def area(r)")
    with pytest.raises(SyntaxError) as err:
        compare(broken, PRISTINE_MODULE, "m.py")
    assert err.value.lineno == 5


def test_a_module_the_student_added_is_named_as_not_run(tmp_path, tree):
    def edit(files):
        files["engine/my_helpers.py"] = "def ceil_div(a, b):\n    return -(-a // b)\n"

    out = extract(_student_tree(tmp_path, tree, edit), tree, "lab2")
    added = [e.describe() for e in out.outside_edits if "my_helpers" in e.path]
    assert added == [f"{PACKAGE}/engine/my_helpers.py:1: added a new module: put its code in the file that uses it, "
                     "outside the regions (not run: only region bodies and added definitions are)"]


def test_a_failing_throughput_median_is_confirmed_with_more_rounds():
    """Below the bar after the rubric's rounds, more rounds run (up to CONFIRM_FACTOR times); above it, none."""
    from grading.throughput_check import CONFIRM_FACTOR, needs_more_rounds
    assert needs_more_rounds([], 3, 0.5) and needs_more_rounds([1.0, 1.0], 3, 0.5)
    assert not needs_more_rounds([1.0, 0.4, 0.9], 3, 0.5)             # median 0.9: passes as it stands
    assert needs_more_rounds([0.4, 0.45, 1.0], 3, 0.5)                 # two slow rounds of three: confirm
    assert not needs_more_rounds([0.4, 0.45, 1.0, 1.0, 1.1], 3, 0.5)   # the busy moment passed: median 1.0
    slow = [0.2] * (CONFIRM_FACTOR * 3)
    assert needs_more_rounds(slow[:-1], 3, 0.5) and not needs_more_rounds(slow, 3, 0.5)
