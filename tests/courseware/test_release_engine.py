"""The engine of a lab 1, 2 and 3 release serves requests, through the student's own regions.

Each release is built into a temporary folder twice: as shipped, and with its
own lab's regions holding the reference bodies (what a correct student
writes). One child process (torch and transformers imported once) imports
each tree's `courseware.engine` in turn and runs its `LLM.generate` on the tiny
model (the student's package, with stand-ins for the later labs' parts, as
the release's commands build it): the shipped tree must stop at the student's own lab (proof that the
engine runs their regions, not a stand-in), the solved tree must give the
course engine's tokens, computed here with `reference`. The same trees must
hold no later lab's solution (`courseware.later_labs.solution_leaks`), a check
shown to fire on a tree that does.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from labkit.tree import PACKAGE, filled_labs, generate, load_reference, splice, write_package
from courseware.later_labs import solution_leaks
from labkit.labs import later_labs
from courseware.release import make_release
from reference import LLM, SamplingParams
from courseware.oracle import random_prompts

RELEASE_LABS = ("lab1", "lab2", "lab3")
CONFIG = dict(device="cpu", kvcache_block_size=4, num_kvcache_blocks=14, max_model_len=96, max_num_seqs=4,
              max_num_batched_tokens=96)
# Lab 1's test doubles script a recompute preemption (to test its PREEMPTED/QUEUED events), and the lab 1
# and 2 stand-in scheduler preempts by recompute as lab 1's handout defines it, so those releases show
# three of lab3.preempt's four lines; no other later-lab region may show at all. The release ships the
# package's files twice: as the student's, and in the pristine copy the self-check splices a tree into.
PREEMPT_STEPS = "courseware/standins/scheduler.py (3 of 4 lines)"
LAB1_FAKES = [f"{prefix}student_exercises/tests/lab_fakes.py (3 of 4 lines)" for prefix in ("", ".inferlab/pristine/")]
KNOWN = {"lab1": {"lab3.preempt": sorted([PREEMPT_STEPS, *LAB1_FAKES])},
         "lab2": {"lab3.preempt": [PREEMPT_STEPS]},
         "lab3": {}}

CHILD = textwrap.dedent("""
    import importlib, json, sys
    import torch, transformers
    transformers.logging.set_verbosity_error()
    spec = json.loads(sys.argv[1])
    results = {}
    for tree in spec["trees"]:
        for name in [m for m in sys.modules if m.split(".")[0] in ("student_exercises", "courseware", "labkit")]:
            del sys.modules[name]
        sys.path.insert(0, tree)
        package = importlib.import_module("student_exercises")
        tools = importlib.import_module("courseware.engine")
        parts = tools.engine_parts()
        result = {"origin": package.__file__, "tools": tools.__file__,
                  "parts": [f"{c.__module__}.{c.__name__}" for c in (parts.block_manager, parts.scheduler,
                                                                     parts.model_runner)]}
        try:
            llm = tools.LLM(spec["model"], **spec["config"])
            params = [package.SamplingParams(**p) for p in spec["params"]]
            outputs = llm.generate(spec["prompts"], params, use_tqdm=False)
            result["tokens"] = [o["token_ids"] for o in outputs]
            result["errors"] = [getattr(llm.finished.get(i), "error", None) for i in range(len(outputs))]
            result["reasons"] = [o["finish_reason"] for o in outputs]
        except NotImplementedError as err:
            result["not_implemented"] = str(err)
        results[tree] = result
        sys.path.remove(tree)
    print(json.dumps(results))
""")


def _requests(vocab: int) -> tuple[list[list[int]], list[dict]]:
    prompts = random_prompts([5, 17, 33, 9, 40, 3], vocab, seed=1)
    prompts += random_prompts([20, 25], vocab, seed=2, prefix=prompts[4][:18])   # prefix-cache hits in lab 2+
    params = [dict(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (12, 30, 7, 20, 16, 25, 10, 9)]
    prompts.append(prompts[1])
    params.append(dict(temperature=0.8, top_k=20, seed=5, max_tokens=15, ignore_eos=True))
    return prompts, params


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """lab -> {"shipped": release folder, "solved": the same with the lab's regions written}."""
    tree = load_reference()
    base = tmp_path_factory.mktemp("releases")
    out = {}
    for lab in RELEASE_LABS:
        shipped = make_release(lab, base / lab / "shipped")
        solved = base / lab / "solved"
        shutil.copytree(shipped, solved)
        splice(solved / PACKAGE, {r.region_id: tree.body(r.region_id) for r in tree.regions if r.lab == lab})
        out[lab] = {"shipped": shipped, "solved": solved}
    return out


@pytest.fixture(scope="module")
def served(releases, tiny_model_dir) -> tuple[dict, list[list[int]]]:
    """What each tree's engine did with the requests, and the course engine's tokens for them."""
    llm = LLM(tiny_model_dir, **CONFIG)
    prompts, params = _requests(llm.config.hf_config["vocab_size"])
    expected = [o["token_ids"] for o in llm.generate(prompts, [SamplingParams(**p) for p in params], use_tqdm=False)]
    trees = [str(t) for lab in RELEASE_LABS for t in releases[lab].values()]
    spec = {"trees": trees, "model": tiny_model_dir, "config": CONFIG, "prompts": prompts, "params": params}
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=releases[RELEASE_LABS[0]]["shipped"].parent)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), expected


@pytest.mark.slow   # the module's one child process: ~10 s on a 2-core machine, shared by the two tests below
@pytest.mark.parametrize("lab", RELEASE_LABS)
def test_release_engine_gives_the_course_tokens_once_the_lab_is_written(releases, served, lab):
    results, expected = served
    solved = results[str(releases[lab]["solved"])]
    assert Path(solved["origin"]).resolve() == (releases[lab]["solved"] / PACKAGE / "__init__.py").resolve()
    assert solved.get("not_implemented") is None, solved
    assert solved["errors"] == [None] * len(expected) and set(solved["reasons"]) == {"length"}, solved
    assert solved["tokens"] == expected
    assert Path(solved["tools"]).resolve() == (releases[lab]["solved"] / "courseware" / "engine.py").resolve()
    standins = {"lab2": "courseware.standins.block_manager.PlainBlockManager",
                "lab3": "courseware.standins.scheduler.YieldingScheduler",
                "lab4": "courseware.standins.model_runner.DenseModelRunner"}
    own = {"lab2": f"{PACKAGE}.engine.block_manager.BlockManager", "lab3": f"{PACKAGE}.engine.scheduler.Scheduler"}
    for part_lab, part in zip(("lab2", "lab3", "lab4"), solved["parts"]):
        assert part == (standins[part_lab] if part_lab in later_labs(lab) else own[part_lab])


@pytest.mark.slow
@pytest.mark.parametrize("lab", RELEASE_LABS)
def test_shipped_release_engine_stops_at_the_students_own_lab(releases, served, lab):
    """Unwritten, the engine reaches the student's regions (a stand-in never hides them)."""
    results, _ = served
    shipped = results[str(releases[lab]["shipped"])]
    assert Path(shipped["origin"]).resolve() == (releases[lab]["shipped"] / PACKAGE / "__init__.py").resolve()
    assert shipped.get("not_implemented", "").startswith(f"{lab}."), shipped


@pytest.mark.parametrize("lab", RELEASE_LABS)
def test_release_holds_no_later_labs_solution(releases, lab):
    leaks = solution_leaks(releases[lab]["shipped"], load_reference(), later_labs(lab))
    assert leaks == KNOWN[lab]


def test_solution_leaks_finds_a_later_lab_shipped_by_mistake(tmp_path):
    """The check can fail: a lab 2 package generated with lab 3 filled in shows every lab 3 region."""
    tree = load_reference()
    write_package(generate(tree, filled_labs(["lab1", "lab3"])), tmp_path / PACKAGE)
    leaks = solution_leaks(tmp_path, tree, ["lab3", "lab4"])
    assert set(leaks) == {r.region_id for r in tree.regions if r.lab == "lab3"}
