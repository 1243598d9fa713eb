"""The public lab suites can fail, do fail on unwritten code, and catch the bug zoo (docs/design.md §3).

One module-scoped fixture builds every tree and runs every suite in child
processes, as many at once as there are cores; the tests below only read the
outcomes. The runs:

- reference:          all labs, `--impl=reference`, with region tracing
- stubs:              all labs, the committed student_exercises/ (every region stubbed)
- release-stubs:labN: labs before N filled, N and later stubbed (what a lab N student starts from)
- filled:labN:        labs up to N filled, later ones stubbed (a lab N student who is done)
- only:labN:          only lab N filled (for the labs whose tests need no other lab)
- mutant:labN/name:   a student who wrote one bug-zoo mutant, read by the grader (extract + harness package)
                      into the student's release; lab N's suite

Each distinct tree runs once. The self-check's reading of each mutant's tree is not run again: it is
checked to be the same code as the grader's, up to the later labs' regions, which stand-ins keep
unreached (test_the_self_check_runs_the_graders_code).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from courseware.bugzoo import load_mutants
from labkit.tree import LABS, PACKAGE, filled_labs, load_reference, write_package, write_tree
from courseware.release_code import write_release_code
from labkit.labs import later_labs
from labkit.regions import parse_regions, render, stub_body
from courseware.selfcheck import package_texts, spliced_copy
from grading.harness import harness_package
from grading.submission import extract
from courseware.tiny_model import ensure_tiny_model
from tests.courseware.lab_runs import ALL_LABS, ROOT, Job, by_outcome, problems_of, run_all

MUTANTS = load_mutants()
SELF_CONTAINED_LABS = ("lab1", "lab4")   # their tests need no other lab's regions (lab2's engine run needs lab1's log)


def release_tree(dest: Path, tree, lab: str, filled) -> Path:
    """A lab's release (its code: later labs run by their stand-ins) with `filled` labs' regions written."""
    return write_release_code(lab, dest, tree, choose=filled_labs(filled))


def student_tree(dest: Path, tree, mutant) -> Path:
    """The tree of a student who wrote the mutant: the lab's release with the mutant's region bodies in it."""
    return write_release_code(mutant.lab, dest, tree, choose=mutant.choice(tree))


def grader_view(dest: Path, tree, student: Path, lab: str) -> Path:
    """The grader's reading of a student tree (extract + harness package), in the student's release.

    Later labs run on their stand-ins here, as in the release: the public part is what the student can see,
    so it is measured on the engine the student has. (The hidden engine items run on the reference's own
    later labs; docs/labs.md says what that means for a lab 2 student's engine test.)
    """
    write_release_code(lab, dest, tree)
    code = extract(student / PACKAGE, tree, lab)
    tests = {path: text for path, text in package_texts(dest / PACKAGE).items() if path.startswith("tests/")}
    write_package(harness_package(lab, tree, code.bodies, code.additions) | tests, dest / PACKAGE)
    return dest


def self_check_view(dest: Path, tree, student: Path, lab: str) -> Path:
    """What `inferlab check` runs: the release's tools, and the student's tree read into a pristine copy."""
    write_release_code(lab, dest, tree)
    spliced_copy(student, lab, dest)
    return dest


@pytest.fixture(scope="module")
def lab_runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("lab_runs")
    cache = work / "cache"
    ensure_tiny_model(cache / "tiny-qwen3-seed0")          # built once, shared by every child
    tree = load_reference()
    trace = work / "trace.json"
    views: dict[str, list[str]] = {}      # mutant -> modules where the self-check's code differs from the grader's
    jobs = [
        Job("reference", ROOT, ALL_LABS, impl="reference",
            extra=("-p", "courseware.region_trace", "--inferlab-trace-regions", str(trace))),
        Job("stubs", ROOT, ALL_LABS),
    ]
    for i, lab in enumerate(LABS):
        jobs.append(Job(f"filled:{lab}", release_tree(work / f"filled_{lab}", tree, lab, LABS[:i + 1]), lab))
        if i > 0:
            jobs.append(Job(f"release-stubs:{lab}", release_tree(work / f"release_{lab}", tree, lab, LABS[:i]), lab))
        if lab in SELF_CONTAINED_LABS and i > 0:
            jobs.append(Job(f"only:{lab}", write_tree(work / f"only_{lab}", filled_labs([lab])), lab))
    for mutant in MUTANTS:
        if mutant.gpu and not torch.cuda.is_available():
            continue
        student = student_tree(work / "students" / mutant.lab / mutant.name, tree, mutant)
        jobs.append(Job(f"mutant:{mutant.mutant_id}", grader_view(work / "grader" / mutant.lab / mutant.name, tree,
                                                                  student, mutant.lab), mutant.lab))
        check_view = self_check_view(work / "selfcheck" / mutant.lab / mutant.name, tree, student, mutant.lab)
        views[mutant.mutant_id] = different_code(jobs[-1].tree / PACKAGE, check_view / PACKAGE, mutant.lab)
    runs = run_all(jobs, cache, work)
    trace_data = json.loads(trace.read_text()) if trace.is_file() else {}
    yield {job.key: job for job in jobs}, runs, trace_data, views
    for folder in ("students", "grader", "selfcheck"):
        shutil.rmtree(work / folder, ignore_errors=True)


def reachable_code(package: Path, lab: str) -> dict[str, str]:
    """The package's modules with every later lab's region stubbed: the code a lab's public tests can run."""
    later = set(later_labs(lab))
    return {relpath: render(parse_regions(text, relpath), lambda r: stub_body(r) if r.lab in later else None)
            for relpath, text in package_texts(package).items()}


def different_code(grader: Path, check: Path, lab: str) -> list[str]:
    a, b = reachable_code(grader, lab), reachable_code(check, lab)
    return sorted(path for path in set(a) | set(b) if a.get(path) != b.get(path))


def usable(lab_runs, key: str):
    jobs, runs = lab_runs[:2]
    problems = problems_of(runs[key], jobs[key])
    assert not problems, "\n".join(problems)
    return runs[key]


def graded(run, lab: str | None = None) -> dict[str, dict]:
    """Tests that run on this machine (GPU tests only with CUDA), optionally one lab's."""
    return {nodeid: t for nodeid, t in run.tests.items()
            if (torch.cuda.is_available() or not t["gpu"]) and (lab is None or lab in t["labs"])}


def describe(run, nodeids: list[str]) -> str:
    return "\n".join(f"  {n}: {run.tests[n]['outcome']}: {run.tests[n]['message'][-600:]}" for n in nodeids)


def test_reference_passes_every_public_test(lab_runs):
    run = usable(lab_runs, "reference")
    tests = graded(run)
    not_passed = [n for n, t in tests.items() if t["outcome"] != "passed"]
    assert not not_passed, f"reference fails public tests:\n{describe(run, not_passed)}"
    assert {lab for t in tests.values() for lab in t["labs"]} == set(LABS)
    skipped = [n for n, t in run.tests.items() if n not in tests]
    assert all(run.tests[n]["outcome"] == "skipped" for n in skipped)


def test_every_public_test_fails_on_the_committed_stubs(lab_runs):
    run = usable(lab_runs, "stubs")
    not_failed = [n for n, t in graded(run).items() if t["outcome"] != "failed"]
    assert not not_failed, f"tests that do not fail on student_exercises/ as generated:\n{describe(run, not_failed)}"


@pytest.mark.parametrize("lab", LABS[1:])
def test_each_lab_fails_on_its_own_stubs_with_earlier_labs_filled(lab_runs, lab):
    """What a lab N student starts from: every lab N test fails (a failure, not an error)."""
    run = usable(lab_runs, f"release-stubs:{lab}")
    not_failed = [n for n, t in graded(run, lab).items() if t["outcome"] != "failed"]
    assert not not_failed, f"{lab} tests that do not fail before {lab} is written:\n{describe(run, not_failed)}"
    stubbed_by = {t["message"].split("NotImplementedError: ")[-1].split()[0] for t in graded(run, lab).values()
                  if "NotImplementedError: " in t["message"]}
    assert stubbed_by and all(region.startswith(f"{lab}.") for region in stubbed_by), stubbed_by


@pytest.mark.parametrize("lab", LABS)
def test_each_lab_passes_once_its_regions_are_written(lab_runs, lab):
    """Labs up to N filled, later labs stubbed: lab N's tests never need a later lab."""
    run = usable(lab_runs, f"filled:{lab}")
    not_passed = [n for n, t in graded(run, lab).items() if t["outcome"] != "passed"]
    assert not not_passed, f"{lab} tests that fail with labs up to {lab} written:\n{describe(run, not_passed)}"


@pytest.mark.parametrize("lab", [lab for lab in SELF_CONTAINED_LABS if lab != "lab1"])
def test_self_contained_labs_need_no_other_lab(lab_runs, lab):
    run = usable(lab_runs, f"only:{lab}")
    not_passed = [n for n, t in graded(run, lab).items() if t["outcome"] != "passed"]
    assert not not_passed, f"{lab} tests that need another lab's regions:\n{describe(run, not_passed)}"


def test_lab2_suite_runs_as_a_student_runs_it(lab_runs, tmp_path):
    """What a lab 2 student runs, as they run it: a fresh interpreter, `pytest ... -m lab2`, every test passing.

    Its wall time is printed, not asserted (a figure for docs/workflows.md: on a busy CI machine a bound
    on it would test the machine, not the suite)."""
    run = usable(lab_runs, "filled:lab2")
    tree = Path(lab_runs[0]["filled:lab2"].tree)
    env = {**os.environ, "PYTHONPATH": str(tree), "INFERLAB_CACHE": str(tmp_path / "cache")}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "student_exercises/tests", "-m", "lab2", "-q",
                           "-p", "no:cacheprovider"], cwd=tree, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{len(graded(run, 'lab2'))} passed" in proc.stdout
    print(f"pytest student_exercises/tests -m lab2: {wall:.1f} s")


@pytest.mark.parametrize("mutant_id", [m.mutant_id for m in MUTANTS])
def test_bug_zoo_mutant_is_caught(lab_runs, mutant_id):
    if next(m for m in MUTANTS if m.mutant_id == mutant_id).gpu and not torch.cuda.is_available():
        pytest.skip("a GPU-only mutant: only the gpu tests can catch it, and they need CUDA")
    run = usable(lab_runs, f"mutant:{mutant_id}")
    failed = by_outcome(run, ["failed"])
    assert failed, (f"no public test fails on mutant {mutant_id} (outcomes: {run.outcomes()}); "
                    f"pytest said:\n{run.output[-2000:]}")


def test_the_self_check_runs_the_graders_code(lab_runs):
    """The self-check reads a student's tree as the grader does: for every mutant, the copy `inferlab check`
    runs the public suite on holds the grader's code, module by module (later labs' regions aside: stand-ins
    keep them unreached), so both get the same public points without running the suite twice."""
    views = lab_runs[3]
    assert views and len(views) == sum(1 for m in MUTANTS if not m.gpu or torch.cuda.is_available())
    differing = {mutant_id: modules for mutant_id, modules in views.items() if modules}
    assert not differing, f"the self-check's copy differs from the grader's code: {differing}"


def test_the_code_comparison_sees_a_difference(tmp_path):
    """The comparison itself: a module edited outside any region, or inside the student's lab, differs."""
    tree = load_reference()
    a = write_release_code("lab2", tmp_path / "a", tree)
    b = write_release_code("lab2", tmp_path / "b", tree)
    assert different_code(a / PACKAGE, b / PACKAGE, "lab2") == []
    path = b / PACKAGE / "engine" / "block_manager.py"
    path.write_text(path.read_text() + "\nEDITED = 1\n")
    assert different_code(a / PACKAGE, b / PACKAGE, "lab2") == ["engine/block_manager.py"]


def test_every_lab_has_at_least_six_mutants():
    """Six per lab that CI can check on any machine (GPU-only mutants come on top)."""
    counts = {lab: sum(1 for m in MUTANTS if m.lab == lab and not m.gpu) for lab in LABS}
    assert all(n >= 6 for n in counts.values()), counts


def test_declared_coverage_matches_what_tests_execute(lab_runs):
    """Each test's `covers` regions run when the test runs; every region is covered by some test."""
    run = usable(lab_runs, "reference")
    executed = lab_runs[2]
    regions = {r.region_id: r.lab for r in load_reference().regions}
    problems = []
    for nodeid, test in graded(run).items():
        declared = set(test["covers"])
        if not declared:
            problems.append(f"{nodeid}: declares no covered region")
        for region_id in declared:
            if regions.get(region_id) not in test["labs"]:
                problems.append(f"{nodeid}: covers {region_id}, which is not a region of {test['labs']}")
        missing = declared - set(executed.get(nodeid, []))
        if missing:
            problems.append(f"{nodeid}: declares {sorted(missing)} but never executes them")
    declared_anywhere = {r for t in run.tests.values() for r in t["covers"]}
    problems += [f"region {r} is covered by no public test" for r in sorted(set(regions) - declared_anywhere)]
    assert not problems, "\n".join(problems)
