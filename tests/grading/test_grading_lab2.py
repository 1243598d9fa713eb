"""Lab 2 graded end to end: the reference scores 100, stubs 0, each bug-zoo mutant exactly the items that catch it.

One module fixture writes the submissions (nbgrader layout), grades them all
with `-j 2` in a background thread, and meanwhile computes, in this process
and without the grader, which items each mutant should lose (the oracle):
it imports the reference and every mutant side by side as separately named
packages, runs the hidden test functions on each directly, and compares the
mutant's observations with the reference's live ones. No harness, fork
server, sandbox, observation file, golden file or judge is involved in that
route, so the grader's verdicts are checked against an independent one.
"""
from __future__ import annotations

import csv
import importlib
import importlib.util
import inspect
import itertools
import json
import multiprocessing
import shutil
import sys
from pathlib import Path

import jsonschema
import pytest

from grading.sample_submissions import insert_in_region, release_submission, solved, stubs, write_submission
from grading.paths import PAYLOAD, SCHEMAS, hidden_dir
from grading.report import make_reports
from grading.results import stable_view
from labkit.rubric import load_rubric
from grading.grade_run import MISSING, RunOptions, grade_run
from courseware.bugzoo import load_mutants
from labkit.tree import generate, load_reference, write_package
from courseware.tiny_model import ensure_tiny_model

LAB = "lab2"
MUTANTS = load_mutants(lab=LAB)
RUBRIC = load_rubric(LAB)


# -- the oracle ---------------------------------------------------------------------------------

def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _cases(function):
    """Every parameter combination of a test function, from its parametrize marks."""
    axes = []
    for mark in getattr(function, "pytestmark", []):
        if mark.name == "parametrize":
            names = [n.strip() for n in (mark.args[0].split(",") if isinstance(mark.args[0], str) else mark.args[0])]
            values = [v if len(names) > 1 else (v,) for v in mark.args[1]]
            axes.append([dict(zip(names, v)) for v in values])
    for combo in itertools.product(*axes):
        yield {k: v for part in combo for k, v in part.items()}


def _run_case(function, kwargs) -> list:
    record: list = []
    monkeypatch = pytest.MonkeyPatch()

    def observe(key, value):
        record.append([key, json.loads(json.dumps(value, default=lambda o: f"<{type(o).__name__}>"))])

    wanted = inspect.signature(function).parameters
    extra = {"observe": observe, "monkeypatch": monkeypatch}
    try:
        function(**{k: v for k, v in {**kwargs, **extra}.items() if k in wanted})
    except Exception as err:  # noqa: BLE001 - an exception is an observation
        record.append(["raised", type(err).__name__])
    finally:
        monkeypatch.undo()
    return record


def oracle(work: Path, model: Path) -> dict[str, set[str]]:
    """Mutant name -> the 'file::function' tests whose observations differ from the reference's."""
    tree = load_reference()
    packages = {"oracle_reference": None, **{f"oracle_mut_{m.name}": m for m in MUTANTS}}
    for name, mutant in packages.items():
        write_package(generate(tree, mutant.choice(tree) if mutant else (lambda region: None), package=name),
                      work / name)
    sys.path.insert(0, str(work))
    saved_support = sys.modules.get("_inferlab_support")
    try:
        support = _load("_inferlab_support", PAYLOAD / "_inferlab_support.py")
        support.model_dir = lambda: str(model)
        tests = {}
        for path in sorted(hidden_dir(LAB).glob("test_*.py")):
            module = _load(f"oracle_{path.stem}", path)
            for fname, function in vars(module).items():
                if fname.startswith("test_") and callable(function):
                    tests[f"hidden/{LAB}/{path.name}::{fname}"] = function
        observed: dict[str, dict[str, list]] = {}
        for name in packages:
            support.PACKAGE = name
            observed[name] = {key: [_run_case(fn, case) for case in _cases(fn)] for key, fn in tests.items()}
        reference = observed.pop("oracle_reference")
        return {name.removeprefix("oracle_mut_"): {k for k in tests if obs[k] != reference[k]}
                for name, obs in observed.items()}
    finally:
        sys.path.remove(str(work))
        for name in [n for n in sys.modules if n.startswith("oracle_")]:
            del sys.modules[name]
        if saved_support is None:
            sys.modules.pop("_inferlab_support", None)
        else:
            sys.modules["_inferlab_support"] = saved_support


def expected_lost(differing: set[str]) -> set[str]:
    """Items a mutant must lose: those selecting a differing test, and a throughput item requiring one of them.

    Nothing else: no item gates another (labkit/rubric.py).
    """
    lost: set[str] = set()
    for item in RUBRIC.items:
        if item.observed and any(t == sel or t.startswith(sel + "::") for t in differing for sel in item.select):
            lost.add(item.id)
    lost |= {item.id for item in RUBRIC.items if item.kind == "throughput" and lost & set(item.options["requires"])}
    return lost


# -- the graded batch ---------------------------------------------------------------------------

def with_helpers(text: str) -> str:
    """A correct solution as students write it: an import, a helper function and a helper method, all
    outside the regions, used from inside one."""
    text = text.replace("from __future__ import annotations\n", "from __future__ import annotations\n\nimport math\n", 1)
    text = text.replace("\nclass BlockManager", "\ndef _twice(x: int) -> int:\n    return 2 * x\n\n\nclass BlockManager", 1)
    text = text.replace("    @property\n    def num_free_blocks(self", "    def _half(self, x: int) -> int:\n        return x // 2\n\n"
                        "    @property\n    def num_free_blocks(self", 1)
    return insert_in_region(text, "lab2.take_free_block", "assert self._half(_twice(math.floor(3.0))) == 3")


def edit_outside(text: str) -> str:
    """An edit of existing code outside the regions: listed, never run."""
    return text.replace("    def num_free_blocks(self) -> int:\n", "    def num_free_blocks(self) -> int:\n        print('hi')\n", 1)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    work = tmp_path_factory.mktemp("lab2_grading")
    tree = load_reference()
    submitted = work / "submitted"
    write_submission(submitted, "ref_student", LAB, tree, solved(LAB), {"report.md": "# notes\n"})
    write_submission(submitted, "stub_student", LAB, tree, stubs(LAB))
    for mutant in MUTANTS:
        write_submission(submitted, f"mut_{mutant.name}", LAB, tree, mutant.choice(tree))
    release_submission(submitted, "release_student", LAB, tree)
    release_submission(submitted, "helpers_student", LAB, tree, with_helpers, "engine/block_manager.py")
    release_submission(submitted, "outside_student", LAB, tree, edit_outside, "engine/block_manager.py")
    (submitted / "absent_student").mkdir()                 # a student folder with no lab2/ in it
    out = work / "results"
    # The oracle runs in a forked process (forked before any grading thread exists), beside the grading run.
    with multiprocessing.get_context("fork").Pool(1) as pool:
        pending = pool.apply_async(oracle, (work / "oracle", ensure_tiny_model()))
        summary = grade_run(RunOptions(LAB, submitted, out, jobs=2), show_progress=False)
        differing = pending.get(timeout=600)
    box = {"summary": summary}
    yield {"work": work, "submitted": submitted, "out": out, "summary": box["summary"], "differing": differing}
    shutil.rmtree(work, ignore_errors=True)


def result(graded, student: str) -> dict:
    return json.loads((graded["out"] / f"{student}.json").read_text())


def describe(res: dict) -> str:
    return "\n".join(f"  {i['id']}: {i['status']} {i['message']}\n    " + "\n    ".join(i["details"][:6])
                     for i in res["items"] if i["status"] != "passed")


def test_reference_solution_scores_100(graded):
    res = result(graded, "ref_student")
    assert res["score"] == 100, describe(res)
    assert all(i["status"] == "passed" for i in res["items"])
    assert res["flags"] == [] and {r["status"] for r in res["regions"]} == {"attempted"}


def test_a_release_with_its_regions_written_scores_100_without_flags(graded):
    """The release's own files (its tests' conftest.py, its pyproject.toml) are not the student's doing."""
    res = result(graded, "release_student")
    assert res["score"] == 100, describe(res)
    assert res["flags"] == [], res["flags"]
    assert not [n for n in res["notes"] if "not run" in n], res["notes"]


def test_imports_and_helpers_outside_the_regions_are_carried(graded):
    res = result(graded, "helpers_student")
    assert res["score"] == 100, describe(res)
    assert res["flags"] == [], res["flags"]
    assert not [n for n in res["notes"] if "not run" in n], res["notes"]


def test_an_edit_outside_the_regions_is_listed_and_not_run(graded):
    res = result(graded, "outside_student")
    assert res["score"] == 100, describe(res)
    listed = [n for n in res["notes"] if "not run" in n]
    assert len(listed) == 1 and "block_manager.py:" in listed[0] and "num_free_blocks" in listed[0], res["notes"]


def test_untouched_stubs_score_0(graded):
    res = result(graded, "stub_student")
    assert res["score"] == 0
    assert {r["status"] for r in res["regions"]} == {"not attempted"}
    assert all(i["status"] == "failed" for i in res["items"]), describe(res)


def test_the_oracle_sees_every_mutant(graded):
    """Every lab 2 mutant changes at least one hidden test's observations (else the hidden tests miss a bug)."""
    blind = [name for name, tests in graded["differing"].items() if not tests]
    assert not blind, f"no hidden test observes mutants {blind}"


@pytest.mark.parametrize("mutant", [m.name for m in MUTANTS])
def test_each_mutant_loses_exactly_the_items_that_catch_it(graded, mutant):
    res = result(graded, f"mut_{mutant}")
    lost = {i["id"] for i in res["items"] if i["status"] != "passed"}
    expected = expected_lost(graded["differing"][mutant])
    assert lost == expected, (f"grader: lost {sorted(lost)}; oracle: {sorted(expected)} "
                              f"(differing tests {sorted(graded['differing'][mutant])})\n{describe(res)}")
    assert res["score"] == sum(i["score"] for i in res["items"])
    assert all(i["score"] < i["points"] for i in res["items"] if i["id"] in expected), describe(res)
    assert all(i["status"] in ("passed", "failed") for i in res["items"]), describe(res)


def test_results_validate_against_the_schema(graded):
    validator = jsonschema.Draft202012Validator(json.loads((SCHEMAS / "result.schema.json").read_text()))
    for path in sorted(p for p in graded["out"].glob("*.json") if p.name != MISSING):
        errors = [e.message for e in validator.iter_errors(json.loads(path.read_text()))]
        assert not errors, f"{path.name}: {errors[:3]}"
    res = result(graded, "ref_student")
    assert "report.md" in res["files"] and len(res["files"]["report.md"]) == 64


def test_failures_explain_the_first_difference(graded):
    res = result(graded, "mut_stale_hash_kept")
    failed = [i for i in res["items"] if i["kind"] == "pytest" and i["status"] == "failed"]
    lines = [line for item in failed for line in item["details"]]
    assert failed and any(": yours is " in line for line in lines), lines          # the student's value at the difference
    assert not any(": expected " in line for line in lines), lines                  # never the hidden test's expected one
    assert any(line.startswith("the public tests of this rule") for line in lines), lines


def test_reports_csv_gradescope_feedback_histogram(graded):
    paths = make_reports(graded["out"], graded["work"] / "report")
    rows = list(csv.DictReader(open(paths.csv, encoding="utf-8")))
    students = {r["student_id"]: r for r in rows}
    assert len(rows) == 2 + len(MUTANTS) + 3 + 1            # + the release-made students, + one who submitted nothing
    assert students["ref_student"]["score"] == "100" and students["stub_student"]["score"] == "0"
    assert students["absent_student"]["status"] == "missing" and students["absent_student"]["score"] == "0"
    assert {r["status"] for r in rows if r["student_id"] != "absent_student"} == {"graded"}
    row_schema = json.loads((SCHEMAS / "grades_csv.schema.json").read_text())
    for row in rows:
        typed = {k: (v if k in ("student_id", "lab", "status") else (None if v == "" else json.loads(v)))
                 for k, v in row.items()}
        jsonschema.validate(typed, row_schema)
        assert typed["score"] == sum(v for k, v in typed.items() if k.startswith("item:") and v is not None)
    assert not (graded["out"] / "absent_student.json").exists(), "nothing to grade for a student who submitted nothing"
    gradescope = json.loads((paths.gradescope / "mut_stale_hash_kept" / "results.json").read_text())
    jsonschema.validate(gradescope, json.loads((SCHEMAS / "gradescope.schema.json").read_text()))
    assert gradescope["score"] == float(students["mut_stale_hash_kept"]["score"])
    feedback = (paths.feedback / "stub_student.md").read_text()
    assert "**Score: 0 / 100**" in feedback and "not attempted" in feedback
    assert paths.histogram.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_same_work_graded_twice_gets_identical_results(graded):
    students = ["ref_student", "mut_can_append_off_by_one"]
    first = {s: result(graded, s) for s in students}
    again = graded["work"] / "again"
    for s in students:
        shutil.copytree(graded["submitted"] / s, graded["work"] / "again_submitted" / s)
    grade_run(RunOptions(LAB, graded["work"] / "again_submitted", again, jobs=2), show_progress=False)
    for s in students:
        second = json.loads((again / f"{s}.json").read_text())
        assert stable_view(second) == stable_view(first[s]), (s, second["notes"][:1], first[s]["notes"][:1])


def test_a_rerun_skips_finished_submissions(graded):
    summary = grade_run(RunOptions(LAB, graded["submitted"], graded["out"], jobs=1, student="stub_student"),
                        show_progress=False)
    assert summary.skipped == ["stub_student"] and summary.graded == []
