"""The release-only stand-ins (courseware/standins/) give the course engine's tokens, in-process and fast.

Each stand-in is handed to the engine as one of its parts (`EngineParts`), the
way a release hands them in, and the run is compared with the course
engine's own on the same requests: greedy tokens, one seeded sampled request,
a tight pool (the course scheduler preempts there), a shared prefix (the
course block manager hits its cache), chunked prefill and async scheduling.
The claims their docstrings make about schedules and block tables are checked
against the course engine's lifecycle log. Releases themselves are built and
run in tests/courseware/test_release_engine.py.
"""
from __future__ import annotations

import pytest

from courseware.engine import engine_parts, standin_labs
from courseware.standins import standin_parts
from courseware.standins.block_manager import PlainBlockManager
from courseware.standins.model_runner import DenseModelRunner
from courseware.standins.scheduler import YieldingScheduler
from reference import LLM, SamplingParams
from reference.config import Config
from reference.engine.lifecycle import LifecycleLog
from reference.engine.parts import EngineParts
from reference.engine.sequence import Sequence, SequenceStatus
from reference.metrics import check_lifecycle
from courseware.oracle import random_prompts

STANDINS = {"lab2": PlainBlockManager, "lab3": YieldingScheduler, "lab4": DenseModelRunner}
RUNNER = ("lab4",)
RUNNER_SCHEDULER = ("lab3", "lab4")
ALL = ("lab2", "lab3", "lab4")
BASE = dict(device="cpu", kvcache_block_size=4, max_model_len=96, max_num_seqs=4, max_num_batched_tokens=96)
TIGHT = dict(BASE, num_kvcache_blocks=14)      # the course scheduler preempts in this pool
AMPLE = dict(BASE, num_kvcache_blocks=200)     # every request fits at full length


def _requests(vocab: int) -> tuple[list[list[int]], list[SamplingParams]]:
    prompts = random_prompts([5, 17, 33, 9, 40, 3], vocab, seed=1)
    prompts += random_prompts([20, 25], vocab, seed=2, prefix=prompts[4][:18])   # prefix-cache hits
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (12, 30, 7, 20, 16, 25, 10, 9)]
    prompts.append(prompts[1])
    params.append(SamplingParams(temperature=0.8, top_k=20, seed=5, max_tokens=15, ignore_eos=True))
    return prompts, params


def _run(model_dir: str, labs: tuple[str, ...], **config) -> tuple[list[list[int]], LLM]:
    llm = LLM(model_dir, standin_parts(labs), **config)
    for lab in labs:
        part = {"lab4": llm.model_runner, "lab3": llm.scheduler, "lab2": llm.block_manager}[lab]
        assert type(part) is STANDINS[lab]
    prompts, params = _requests(llm.config.hf_config["vocab_size"])
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert all(o["finish_reason"] == "length" for o in outputs), [o["finish_reason"] for o in outputs]
    return [o["token_ids"] for o in outputs], llm


def _events(llm: LLM, name: str) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "time"} for e in llm.log.events if e["event"] == name]


@pytest.fixture(scope="module")
def course(tiny_model_dir):
    """The course engine's tokens and log per configuration, computed once."""
    cache = {}

    def get(name: str, **config):
        if name not in cache:
            cache[name] = _run(tiny_model_dir, (), **config)
        return cache[name]
    return get


@pytest.mark.parametrize("parts", [RUNNER, RUNNER_SCHEDULER, ALL], ids=["lab3-release", "lab2-release", "lab1-release"])
def test_standins_give_the_course_engines_tokens_in_a_tight_pool(tiny_model_dir, course, parts):
    expected, reference_llm = course("tight", **TIGHT)
    assert _events(reference_llm, "PREEMPTED"), "the pool should make the course scheduler preempt"
    tokens, llm = _run(tiny_model_dir, parts, **TIGHT)
    assert tokens == expected
    if "Scheduler" in parts:
        assert _events(llm, "PREEMPTED"), "the stand-in scheduler preempts in a pool this tight too"
        assert max(e["kv_blocks_used"] for e in _events(llm, "STEP")) <= TIGHT["num_kvcache_blocks"]
        assert check_lifecycle(llm.log.events) == []


def test_the_sequence_short_of_a_block_yields(tiny_model_dir):
    """The stand-in's rule, worked out by hand: two requests of 3 tokens in 2 blocks of 4 slots fill
    their blocks at the first decode; at the second each needs a new block and none is free, so the
    older one (admitted first) yields and the newer one takes a block it freed. Lab 3's rule would
    preempt the newer one instead."""
    config = Config(model=tiny_model_dir, device="cpu", kvcache_block_size=4, num_kvcache_blocks=2,
                    max_model_len=8, max_num_batched_tokens=8)
    log = LifecycleLog()
    scheduler = YieldingScheduler(config, PlainBlockManager(2, 4), log)
    old, new = (Sequence([1, 2, 3], SamplingParams(max_tokens=5), 4) for _ in range(2))
    for seq in (old, new):
        scheduler.add(seq)
    steps = []
    for _ in range(3):
        seqs, is_prefill = scheduler.schedule()
        steps.append(([s.seq_id for s in seqs], is_prefill))
        for seq in seqs:
            scheduler.block_manager.mark_computed(seq, seq.num_scheduled_tokens)
            seq.append_token(9)
    assert steps == [([old.seq_id, new.seq_id], True), ([old.seq_id, new.seq_id], False), ([new.seq_id], False)]
    assert (old.status, old.num_preemptions, old.block_table) == (SequenceStatus.WAITING, 1, [])
    assert list(scheduler.waiting) == [old] and list(scheduler.running) == [new]
    assert [e["event"] for e in log.events if e["seq_id"] == old.seq_id][-2:] == ["PREEMPTED", "QUEUED"]


def test_dense_runner_under_the_course_scheduler_with_chunked_prefill(tiny_model_dir, course):
    """A lab 3 release: the student's scheduler may chunk prompts; the stand-in runner samples only at their end."""
    config = dict(TIGHT, enable_chunked_prefill=True, max_num_batched_tokens=16)
    expected, reference_llm = course("chunked", **config)
    assert any(e["num_new_tokens"] < 16 and e["is_prefill"] for e in _events(reference_llm, "SCHEDULED"))
    tokens, llm = _run(tiny_model_dir, RUNNER, **config)
    assert tokens == expected
    assert _events(llm, "SCHEDULED") == _events(reference_llm, "SCHEDULED")


def test_dense_runner_with_async_scheduling(tiny_model_dir, course):
    expected, _ = course("tight", **TIGHT)
    tokens, llm = _run(tiny_model_dir, RUNNER, async_scheduling=True, **TIGHT)
    assert tokens == expected
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(llm.model_runner.states) == 1, "the dense caches of finished sequences are dropped at the next step"


def test_with_an_ample_pool_the_standins_schedule_as_the_course_engine(tiny_model_dir, course):
    """The docstrings' claim: without memory pressure the stand-in scheduler's steps and block tables are
    the course scheduler's, and with prefix caching off the plain block manager's tables are the course's."""
    _, reference_llm = course("ample", **AMPLE)
    _, llm = _run(tiny_model_dir, RUNNER_SCHEDULER, **AMPLE)
    assert _events(llm, "SCHEDULED") == _events(reference_llm, "SCHEDULED")
    _, no_prefix = course("ample-no-prefix", enable_prefix_caching=False, **AMPLE)
    _, llm = _run(tiny_model_dir, ALL, **AMPLE)
    assert _events(llm, "SCHEDULED") == _events(no_prefix, "SCHEDULED")


def test_standin_errors_name_the_problem(tiny_model_dir):
    with pytest.raises(ValueError, match="prefills whole prompts"):
        _run(tiny_model_dir, RUNNER_SCHEDULER, **dict(BASE, enable_chunked_prefill=True, max_num_batched_tokens=16))
    with pytest.raises(ValueError, match="needs lab 4's model runner"):
        _run(tiny_model_dir, RUNNER, **dict(BASE, tensor_parallel_size=2))
    with pytest.raises(ValueError, match="no stand-in for lab9"):
        standin_parts(["lab9"])


def test_the_course_repository_runs_no_standin(tiny_model_dir):
    """No manifest here: an engine built through courseware.engine gets the course's own parts."""
    assert standin_labs() == [] and engine_parts() == EngineParts()
    llm = LLM(tiny_model_dir, device="cpu", num_kvcache_blocks=8)
    assert (type(llm.block_manager).__module__, type(llm.scheduler).__module__, type(llm.model_runner).__module__) == (
        "reference.engine.block_manager", "reference.engine.scheduler", "reference.engine.model_runner")
