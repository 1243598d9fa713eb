"""Labs 1, 3 and 4 graded end to end (reference, stubs, every bug-zoo mutant); lab 5's report: test_lab5_report.py.

Lab 2's test module checks, against an independent oracle, that a mutant
loses exactly the items that catch it; here the same grader must give the
reference 100 and the stubs 0, catch every mutant in at least one
correctness item, and keep its arithmetic: the score is the sum of the
items' scores (whole points for a passed item, the share of hidden tests
passed for a failed one), and a throughput item is never scored beside a
failed item it requires.
"""
from __future__ import annotations

import json

import pytest

from grading.sample_submissions import solved, stubs, write_submission
from labkit.rubric import load_rubric
from grading.grade_run import RunOptions, grade_run
from courseware.bugzoo import load_mutants
from labkit.tree import load_reference

LABS = ("lab1", "lab3", "lab4")


@pytest.fixture(scope="module", params=LABS)
def graded(request, tmp_path_factory):
    lab = request.param
    work = tmp_path_factory.mktemp(f"{lab}_grading")
    tree = load_reference()
    write_submission(work / "submitted", "ref_student", lab, tree, solved(lab))
    write_submission(work / "submitted", "stub_student", lab, tree, stubs(lab))
    mutants = load_mutants(lab=lab)
    for mutant in mutants:
        write_submission(work / "submitted", f"mut_{mutant.name}", lab, tree, mutant.choice(tree))
    grade_run(RunOptions(lab, work / "submitted", work / "results", jobs=2), show_progress=False)
    results = {p.stem: json.loads(p.read_text()) for p in (work / "results").glob("*.json")}
    return lab, results, mutants


def i_share(item: dict) -> int:
    """A failed item's points: its share of the hidden tests it passed, rounded down (none for the others)."""
    tests = item.get("tests") or {}
    if item["kind"] in ("throughput", "report") or not tests.get("expected"):
        return 0
    return item["points"] * tests["passed"] // tests["expected"]


def _why(res):
    return [(i["id"], i["status"], i["message"], i["details"][:4]) for i in res["items"] if i["status"] != "passed"]


def test_reference_scores_every_gradable_point_and_stubs_0(graded):
    """100, less the points of GPU items on a machine without CUDA (those are blocked, never failed)."""
    lab, results, _ = graded
    ref = results["ref_student"]
    assert ref["score"] == ref["gradable_points"] == 100 - ref["blocked_points"], _why(ref)
    assert all(i["status"] == "blocked" for i in ref["items"] if i["status"] != "passed")
    assert results["stub_student"]["score"] == 0
    assert {r["status"] for r in results["stub_student"]["regions"]} == {"not attempted"}


def test_every_mutant_is_caught_and_the_arithmetic_holds(graded):
    lab, results, mutants = graded
    rubric = load_rubric(lab)
    correctness = {i.id for i in rubric.correctness_items}
    gpu_items = {i.id for i in rubric.items if i.gpu}
    for mutant in mutants:
        res = results[f"mut_{mutant.name}"]
        lost = {i["id"] for i in res["items"] if i["status"] == "failed"}
        assert {i["status"] for i in res["items"]} <= {"passed", "failed", "blocked"}, _why(res)
        assert res["score"] == sum(i["score"] for i in res["items"])
        for item in res["items"]:
            share = i_share(item)
            assert item["score"] == (item["points"] if item["status"] == "passed" else share), item
        required = {r for i in rubric.items if i.kind == "throughput" for r in i.options["requires"]}
        if lost & required:
            assert all(i["status"] != "passed" for i in res["items"] if i["kind"] == "throughput"), _why(res)
        blocked = {i["id"] for i in res["items"] if i["status"] == "blocked"}
        if mutant.grader_needs_gpu and blocked >= gpu_items:
            # a `GPU = True` or `GRADED_ON_GPU = True` mistake is visible to the grader's GPU items only, and
            # without CUDA those are blocked (its public tests may still catch it on a CPU)
            assert res["score"] == res["gradable_points"], _why(res)
            continue
        assert lost & correctness, f"{lab} mutant {mutant.name} is not caught"
        assert res["score"] < res["gradable_points"]
