"""Rubrics name only hidden tests that exist; golden outputs are current, and stale ones are caught.

The hidden tests are collected by pytest itself on a reference harness (the
route a grading run takes), independently of the golden files, and each
rubric's selections are checked against that collection.
"""
from __future__ import annotations

import ast
import copy
import json
import re
import shutil
import time

import pytest

from grading.execute import Fence, Runner, child_env, pytest_argv
from grading.golden import build_golden, compare_golden, gpu_items, load_golden, load_gpu_golden, selections, write_golden
from grading.harness import build_harness, source_fingerprint
from grading.judge import judge_item
from labkit.labs import all_labs, graded_labs
from labkit.rubric import load_rubric
from labkit.tree import load_reference
from courseware.release import make_release
from courseware.tiny_model import ensure_tiny_model

LABS = graded_labs()
OBSERVED_LABS = [lab for lab in LABS if any(i.observed for i in load_rubric(lab).items)]


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """lab -> every hidden test id pytest collects on that lab's reference harness."""
    work = tmp_path_factory.mktemp("collect")
    tree = load_reference()
    fence = Fence.for_run(ensure_tiny_model(), work)
    runner = Runner(work / "run")
    found = {}
    try:
        for lab in OBSERVED_LABS:
            harness = build_harness(work / lab, lab, tree)
            scratch = work / f"scratch-{lab}"
            scratch.mkdir()
            argv = pytest_argv(harness, scratch, [f"hidden/{lab}"]) + ["--collect-only"]
            child = runner.start("pytest", argv, harness, child_env(fence, harness, scratch))
            output = child.wait(time.monotonic() + 120).output.text()
            found[lab] = set(re.findall(r"^(hidden/\S+::\S+)$", output, re.M))
            assert found[lab], output[-2000:]
    finally:
        runner.close()
    return found


@pytest.mark.parametrize("lab", OBSERVED_LABS)
def test_rubric_selects_only_tests_that_exist(collected, lab):
    for item in load_rubric(lab).items:
        for select in item.select:
            matches = [t for t in collected[lab] if t == select or t.startswith(select + "::")
                       or t.startswith(select + "[")]
            assert matches, f"{lab} item {item.id}: {select} selects no hidden test"


@pytest.mark.parametrize("lab", OBSERVED_LABS)
def test_every_hidden_test_is_graded_by_some_item(collected, lab):
    golden = load_golden(lab)
    graded = {t for tests in golden["items"].values() for t in tests}
    expected = set(collected[lab])
    gpu_golden, _ = load_gpu_golden(lab, golden)
    if gpu_golden is not None:        # GPU items' tests, built on a GPU machine, live in golden_gpu.json
        graded |= {t for tests in gpu_golden["items"].values() for t in tests}
    else:
        gpu = [s for item in load_rubric(lab).items if item.gpu for s in item.select]
        expected = {t for t in expected if not any(t == s or t.startswith(s + "[") for s in gpu)}
    assert not golden["cuda"] and not set(golden["items"]) & set(gpu_items(load_rubric(lab))), "GPU items stay out"
    assert graded == expected, sorted(expected ^ graded)


def test_gpu_golden_outputs_are_used_only_where_cuda_is_and_only_when_current(tmp_path, monkeypatch):
    """golden_gpu.json joins the CPU golden data on a CUDA machine, unless built from other sources."""
    from grading import golden as golden_module
    cpu = load_golden("lab4")
    gpu_file = tmp_path / "golden_gpu.json"
    monkeypatch.setattr(golden_module, "golden_gpu_path", lambda lab: gpu_file)
    merged, notes = golden_module.grading_golden("lab4", cuda=True)
    assert merged["items"] == cpu["items"] and "no GPU golden outputs" in notes[0]
    gpu = {"format": cpu["format"], "lab": "lab4", "fingerprint": cpu["fingerprint"], "cuda": True,
           "device": "a GPU", "items": {"kv_store_gpu": ["t::gpu"]}, "tests": {"t::gpu": [["k", 1]]}}
    write_golden("lab4", gpu, gpu_file)
    merged, notes = golden_module.grading_golden("lab4", cuda=True)
    assert notes == [] and merged["items"]["kv_store_gpu"] == ["t::gpu"] and merged["tests"]["t::gpu"] == [["k", 1]]
    assert set(cpu["items"]) < set(merged["items"])
    assert golden_module.grading_golden("lab4", cuda=False) == (cpu, [])
    write_golden("lab4", {**gpu, "fingerprint": "0" * 64}, gpu_file)
    merged, notes = golden_module.grading_golden("lab4", cuda=True)
    assert "kv_store_gpu" not in merged["items"] and "stale" in notes[0]


def test_a_gpu_item_without_gpu_golden_outputs_is_blocked_not_failed():
    from grading.items import ItemContext, run_observed
    rubric = load_rubric("lab4")
    ctx = ItemContext(rubric, load_golden("lab4"), None, "", None, None, None, None, None, cuda=True)
    result = run_observed(rubric.item("kv_store_gpu"), ctx)
    assert result.status == "blocked" and result.score == 0 and "golden build --lab lab4 --part gpu" in result.message


@pytest.mark.parametrize("lab", OBSERVED_LABS)
def test_golden_fingerprints_are_current(lab):
    """Cheap staleness check for every lab: the sources the golden outputs were built from are unchanged."""
    golden = load_golden(lab)
    rubric = load_rubric(lab)
    assert golden["fingerprint"] == source_fingerprint(lab, load_reference(), selections(rubric)), (
        f"golden outputs of {lab} are stale: run `inferlab golden build --lab {lab}`")


def test_fingerprint_follows_the_engines_code_but_not_its_comments():
    """A comment (a hint, a region's task line) changes no output and keeps every golden file current;
    a line of code in any engine module does not."""
    tree = load_reference()
    before = source_fingerprint("lab2", tree)
    for relpath, added, edited in (("engine/block_manager.py", "\n# a new hint\n", False),
                                   ("engine/block_manager.py", "\nEDITED = 1\n", True),
                                   ("engine/parts.py", "\nEDITED = 1\n", True)):
        changed = copy.copy(tree)
        changed.texts = {**tree.texts, relpath: tree.texts[relpath] + added}
        assert (source_fingerprint("lab2", changed) != before) == edited, (relpath, added)


@pytest.fixture(scope="module")
def fresh_lab2(tmp_path_factory):
    return build_golden("lab2", tmp_path_factory.mktemp("golden"))


def test_lab2_golden_outputs_match_a_fresh_build(fresh_lab2):
    assert compare_golden(load_golden("lab2"), fresh_lab2) == []


def test_a_stale_golden_file_is_reported(fresh_lab2, tmp_path):
    stale = json.loads(json.dumps(fresh_lab2))
    test = sorted(stale["tests"])[0]
    stale["tests"][test][0][1] = "something else"
    stale["fingerprint"] = "0" * 64
    problems = compare_golden(stale, fresh_lab2)
    assert any(test in p for p in problems) and any("changed since" in p for p in problems)
    path = write_golden("lab2", stale, tmp_path / "lab2.json")
    assert load_golden("lab2", path)["tests"][test][0][1] == "something else"


def test_golden_check_accepts_rounding_that_grading_accepts():
    """A float that another torch version rounds in its last bits grades the same (judge.same), so it is no
    staleness; a difference grading would reject is reported, for plain floats and toleranced outputs."""
    def data(mean: float, output: float) -> dict:
        return {"lab": "labX", "fingerprint": "f", "cuda": False, "items": {},
                "tests": {"t.py::test": [["mean", mean], ["output", {"__rtol__": 1e-4, "value": [output, 2.0]}]]}}
    stored = data(0.5, 1.0)
    assert compare_golden(stored, data(0.5 * (1 + 1e-9), 1.0 * (1 + 1e-6))) == []
    assert compare_golden(stored, data(0.5 * (1 + 1e-3), 1.0)) == [
        "labX: t.py::test observes something different now (beyond the tolerance grading uses)"]
    assert len(compare_golden(stored, data(0.5, 1.001))) == 1


def test_golden_check_command_fails_on_an_unreadable_file(tmp_path, monkeypatch):
    from grading import golden
    from inferlab.cli import main
    broken = tmp_path / "lab2.json"
    broken.write_text("{ not json")
    monkeypatch.setattr(golden, "golden_path", lambda lab: broken)
    assert main(["golden", "check", "--lab", "lab2"]) == 1


def test_golden_files_are_small():
    for path in (lab.golden for lab in all_labs() if lab.golden.is_file()):
        assert path.stat().st_size < 256_000, f"{path.name} is {path.stat().st_size} bytes"


def test_fresh_interpreter_spawn_gives_the_same_verdict(tmp_path):
    """`--spawn fresh` runs the literal `python -I -B -m pytest ...`; its observations pass the same judge."""
    tree = load_reference()
    harness = build_harness(tmp_path / "harness", "lab2", tree)
    runner = Runner(tmp_path / "run", spawn="fresh")
    item = load_rubric("lab2").item("append")
    run = runner.observe(harness, tmp_path / "scratch", list(item.select), 120,
                         Fence.for_run(ensure_tiny_model(), tmp_path))
    golden = load_golden("lab2")
    verdict = judge_item(item.kind, golden["items"][item.id], golden["tests"], run.records)
    assert verdict.passed, (verdict.message, run.child.output.text()[-2000:])
    assert run.sandbox and run.sandbox["audit_hook"]


def test_hidden_tests_and_golden_outputs_never_reach_a_student_release(tmp_path):
    out = make_release("lab2", tmp_path / "release")
    names = [p.relative_to(out).as_posix() for p in out.rglob("*")]
    assert not [n for n in names if "grading" in n or "golden" in n or "hidden" in n or "bugzoo" in n
                or "private" in n], names
    assert "assignments/lab2_block_manager/rubric.json" in names, "the rubric is public: the handout links it"
    texts = "".join(p.read_text(errors="replace") for p in out.rglob("*.py"))
    assert "test_scale_200_requests_tight_pool" not in texts
    shutil.rmtree(out)


def test_the_fingerprint_reads_code_not_comments_and_not_a_version_specific_dump():
    """Golden outputs built on a GPU machine's Python must match the CPU ones: the fingerprint hashes the code
    text without comments (the same in every Python), not ast.dump (whose text changes between versions)."""
    from grading.harness import code_only
    source = 'x = 1  # a hint\n\n# >>> EXERCISE lab9.r: task\ndef f(a):\n    return a + "#not a comment"\n'
    edited = source.replace("a hint", "another hint").replace("task", "a reworded task")
    assert code_only(source) == code_only(edited) == 'x = 1\ndef f(a):\n    return a + "#not a comment"'
    assert code_only(source) != code_only(source.replace("a + ", "a * "))
    for relpath, text in load_reference().texts.items():          # removing comments changes no code
        assert ast.dump(ast.parse(code_only(text))) == ast.dump(ast.parse(text)), relpath
