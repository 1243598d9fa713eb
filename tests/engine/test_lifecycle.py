"""The lifecycle log of the real engine: legal event order, file == memory, metrics == the engine's own record,
step stamping, determinism, aborts.

What each event carries and when (lab 1's regions, driven by lab_fakes), and the metrics of hand-written logs,
are tested in the public suite (assignments/lab1_lifecycle/public/), which CI runs on the reference. Here the
real scheduler and block manager (chunked prefill, prefix hits, preemption) produce the log.
"""
from __future__ import annotations

import json

import pytest

from reference import LLM, SamplingParams
from reference.engine.lifecycle import LifecycleLog
from reference.metrics import check_lifecycle, read_log, request_metrics, step_metrics
from courseware.oracle import random_prompts
from tests.helpers import events_of


def drive(llm: LLM, prompts, max_tokens: int = 12) -> list[int]:
    """Submit with the step API and run to completion; returns the seq ids."""
    ids = [llm.add_request(p, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
           for p in prompts]
    while not llm.is_finished():
        llm.step()
    return ids


@pytest.fixture(scope="module")
def busy_run(tiny_model_dir, device, tmp_path_factory):
    """A run with chunked prefill, prefix hits and preemption, logged to a file (run once; the tests only read it)."""
    log_path = tmp_path_factory.mktemp("busy_run") / "run.jsonl"
    llm = LLM(tiny_model_dir, device=device, dtype="float32", num_kvcache_blocks=10, max_model_len=256,
              enable_chunked_prefill=True, max_num_batched_tokens=32, lifecycle_log=str(log_path))
    system = random_prompts([20], 300, seed=1)[0]
    ids = drive(llm, random_prompts([21, 30, 45, 60, 70, 5, 90], 300, seed=2, prefix=system))
    llm.log.close()
    return llm, ids, log_path


def test_file_equals_memory(busy_run):
    llm, _, log_path = busy_run
    assert read_log(log_path) == json.loads(json.dumps(llm.log.events))


def test_events_in_legal_order(busy_run):
    llm, _, _ = busy_run
    assert check_lifecycle(llm.log.events) == []
    assert events_of(llm.log.events, "PREEMPTED"), "the workload is meant to preempt"


def test_metrics_from_log_match_engine_record(busy_run):
    llm, ids, log_path = busy_run
    metrics = request_metrics(read_log(log_path))
    for seq_id in ids:
        seq, m = llm.finished[seq_id], metrics[seq_id]
        assert m.num_output_tokens == seq.num_output_tokens == 12
        assert m.prompt_len == seq.num_prompt_tokens
        assert m.queue_time == pytest.approx(seq.first_scheduled_time - seq.arrival_time, abs=1e-9)
        assert m.ttft == pytest.approx(seq.first_token_time - seq.arrival_time, abs=1e-9)
        assert m.e2e == pytest.approx(seq.finished_time - seq.arrival_time, abs=1e-9)
        assert m.tpot == pytest.approx((seq.finished_time - seq.first_token_time) / (seq.num_output_tokens - 1),
                                       abs=1e-9)
        assert m.num_preemptions == seq.num_preemptions
        assert m.finish_reason == seq.finish_reason == "length"


def test_step_metrics_match_steps(busy_run):
    """`step_metrics` (given code) on a real log: one row per engine step, agreeing with its SCHEDULED events."""
    llm, _, _ = busy_run
    steps = step_metrics(llm.log.events)
    assert [s.step for s in steps] == list(range(llm.step_index))
    scheduled = events_of(llm.log.events, "SCHEDULED")
    for s in steps:
        in_step = [e for e in scheduled if e["step"] == s.step]
        assert s.batch_size == len(in_step)
        assert s.num_tokens == sum(e["num_new_tokens"] for e in in_step)
        assert all(e["is_prefill"] == s.is_prefill for e in in_step)
        assert 0 < s.kv_blocks_used <= s.kv_blocks_total == 10


def test_step_indexed_events_are_deterministic(tiny_model_dir, device):
    """Two runs of the same workload give the same events once times are dropped."""
    def events():
        llm = LLM(tiny_model_dir, device=device, dtype="float32", num_kvcache_blocks=10, max_model_len=256)
        drive(llm, random_prompts([21, 30, 45, 60, 70], 300, seed=3))
        return [{k: v for k, v in e.items() if k != "time"} for e in llm.log.events]
    assert events() == events()


def test_abort_waiting_and_running(tiny_model_dir, device):
    llm = LLM(tiny_model_dir, device=device, dtype="float32", max_num_seqs=1)
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    running = llm.add_request([1, 2, 3], params)
    waiting = llm.add_request([4, 5, 6], params)
    llm.step()
    llm.abort_request(waiting)
    llm.abort_request(running)
    assert llm.is_finished()
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)
    assert check_lifecycle(llm.log.events) == []
    reasons = {e["seq_id"]: e["reason"] for e in events_of(llm.log.events, "FINISHED")}
    assert reasons == {running: "abort", waiting: "abort"}
    with pytest.raises(ValueError, match="seq_id"):
        llm.abort_request(running)


def test_the_log_stamps_the_step_the_engine_is_in():
    """The log keeps the step count: emitters pass none, only `end_step` and `skip_to` move it, never back."""
    log = LifecycleLog()
    log.emit("ARRIVED", 0, now=1.5, prompt_len=3)
    log.emit("QUEUED", 0, reason="new")
    log.end_step()
    log.emit("STEP", None, batch_size=1)
    log.skip_to(5)
    log.emit("ARRIVED", 1, prompt_len=2)
    assert [(e["event"], e["step"]) for e in log.events] == [("ARRIVED", 0), ("QUEUED", 0), ("STEP", 1),
                                                             ("ARRIVED", 5)]
    assert log.events[0]["time"] == 1.5 and log.events[0]["prompt_len"] == 3
    with pytest.raises(ValueError, match="never go back"):
        log.skip_to(4)
    with pytest.raises(TypeError):
        log.emit("QUEUED", 0, 3, reason="new")           # the old signature: a step where the time goes
    with pytest.raises(TypeError, match="stamps"):
        log.emit("QUEUED", 0, step=3, reason="new")
    assert len(log.events) == 4


def test_scheduler_events_carry_the_engine_step_without_a_scheduler_field(busy_run):
    """Nobody writes a step into the scheduler; its events still land in the step they belong to."""
    llm, _, _ = busy_run
    assert not hasattr(llm.scheduler, "step")
    events = llm.log.events
    assert events_of(events, "PREEMPTED"), "the busy run should preempt"
    for i, e in enumerate(events):
        if e["event"] in ("SCHEDULED", "PREEMPTED") or (e["event"] == "QUEUED" and e["reason"] == "preempted"):
            step_event = next(x for x in events[i:] if x["event"] == "STEP")   # logged right after scheduling
            assert step_event["step"] == e["step"], e
        elif e["event"] == "QUEUED":
            assert events[i - 1]["event"] == "ARRIVED" and events[i - 1]["step"] == e["step"], e


def test_step_index_jumps_ahead_only(tiny_model_dir, device):
    """A replay may fast-forward an idle engine (Tutorial 02); its next events carry the new step."""
    llm = LLM(tiny_model_dir, device=device, dtype="float32")
    llm.step_index = 7
    seq_id = llm.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    llm.step()
    assert [(e["event"], e["step"]) for e in llm.log.events if e["seq_id"] == seq_id][:4] == [
        ("ARRIVED", 7), ("QUEUED", 7), ("SCHEDULED", 7), ("FIRST_TOKEN", 7)]
    assert llm.step_index == 8
    with pytest.raises(ValueError, match="never go back"):
        llm.step_index = 3
