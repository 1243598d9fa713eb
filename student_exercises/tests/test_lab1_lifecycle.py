# Generated from assignments/lab1_lifecycle/public/test_lab1_lifecycle.py by `inferlab exercises build`: edit it there, not here.
"""Lab 1, part 1: the engine logs each lifecycle event at the right point, with the right fields.

The engine loop (`LLMEngine.add_request / step / postprocess`) runs for real,
but with the test doubles of `lab_fakes` in place of labs 2-4, following this
script (block size 4, 16 KV blocks):

    A = seq 0: 4-token prompt, max_tokens 3      B = seq 1: 3-token prompt, max_tokens 2
    step 0: prefill A (4 tokens) and B (3)       -> both sample their first token
    C = seq 2 arrives: 2-token prompt, stops at its first token (a stop token id)
    step 1: decode A and B                       -> A's token 5 starts a new block; B finishes
    step 2: preempt A, re-prefill A (6 tokens), prefill C -> A and C finish

The expected log below was written by hand from the event table in
docs/architecture.md; the fakes make every block id predictable.
"""
from __future__ import annotations

import pytest

from lab_diagnostics import assert_same_events
from lab_fakes import fake_engine

pytestmark = pytest.mark.lab1

SCRIPT = {
    0: [("prefill", 0, 4), ("prefill", 1, 3)],
    1: [("decode", 0), ("decode", 1)],
    2: [("preempt", 0), ("prefill", 0, 6), ("prefill", 2, 2)],
}


def e(name: str, seq_id: int | None, step: int, **fields) -> dict:
    return {"event": name, "seq_id": seq_id, "step": step, **fields}


def step_ev(step: int, is_prefill: bool, batch: int, tokens: int, running: int, waiting: int, used: int) -> dict:
    return e("STEP", None, step, is_prefill=is_prefill, batch_size=batch, num_tokens=tokens, num_running=running,
             num_waiting=waiting, kv_blocks_used=used, kv_blocks_total=16)


def sched(seq_id: int, step: int, is_prefill: bool, new: int, cached: int, table: list[int]) -> dict:
    return e("SCHEDULED", seq_id, step, is_prefill=is_prefill, num_new_tokens=new, num_cached_tokens=cached,
             block_table=table)


EXPECTED = [
    e("ARRIVED", 0, 0, prompt_len=4), e("QUEUED", 0, 0, reason="new"),
    e("ARRIVED", 1, 0, prompt_len=3), e("QUEUED", 1, 0, reason="new"),
    # step 0: both prompts; fresh blocks 0 and 1
    sched(0, 0, True, 4, 0, [0]), sched(1, 0, True, 3, 0, [1]),
    step_ev(0, True, batch=2, tokens=7, running=2, waiting=0, used=2),
    e("FIRST_TOKEN", 0, 0, index=0, token_id=40), e("FIRST_TOKEN", 1, 0, index=0, token_id=41),
    # C arrives between steps: stamped with the next step
    e("ARRIVED", 2, 1, prompt_len=2), e("QUEUED", 2, 1, reason="new"),
    # step 1: A's 5th token needs block 2; B ends at max_tokens
    sched(0, 1, False, 1, 4, [0, 2]), sched(1, 1, False, 1, 3, [1]),
    step_ev(1, False, batch=2, tokens=2, running=2, waiting=1, used=3),
    e("TOKEN", 0, 1, index=1, token_id=40), e("TOKEN", 1, 1, index=1, token_id=41),
    e("FINISHED", 1, 1, reason="length", num_output_tokens=2), e("FREED", 1, 1, blocks_freed=1),
    # step 2: free list is now 3..15, 1, 2, 0 (freed blocks go to the back, last block first)
    e("PREEMPTED", 0, 2, blocks_freed=2), e("QUEUED", 0, 2, reason="preempted"),
    sched(0, 2, True, 6, 0, [3, 4]), sched(2, 2, True, 2, 0, [5]),
    step_ev(2, True, batch=2, tokens=8, running=2, waiting=0, used=3),
    e("TOKEN", 0, 2, index=2, token_id=40),
    e("FINISHED", 0, 2, reason="length", num_output_tokens=3), e("FREED", 0, 2, blocks_freed=2),
    e("FIRST_TOKEN", 2, 2, index=0, token_id=42),
    e("FINISHED", 2, 2, reason="stop", num_output_tokens=1), e("FREED", 2, 2, blocks_freed=1),
]


def run_script(impl, model_dir: str):
    """Run the scripted workload; returns (events, finished sequences by id).

    Every test runs it afresh (it takes a fraction of a second), so each test
    really executes the regions it checks.
    """
    params = impl.module("sampling_params").SamplingParams
    engine = fake_engine(impl, model_dir, SCRIPT)
    engine.add_request([11, 12, 13, 14], params(temperature=0.0, max_tokens=3, ignore_eos=True))
    engine.add_request([21, 22, 23], params(temperature=0.0, max_tokens=2, ignore_eos=True))
    engine.step()
    engine.add_request([31, 32], params(temperature=0.0, max_tokens=5, ignore_eos=True, stop_token_ids=[42]))
    while not engine.is_finished():
        if engine.step_index > max(SCRIPT):
            pytest.fail("the scripted run did not finish after step 2 (a request never stopped)", pytrace=False)
        engine.step()
    return engine.log.events, dict(engine.finished)


def only(events: list[dict], *names: str) -> list[dict]:
    return [ev for ev in events if ev["event"] in names]


@pytest.mark.points(2)
@pytest.mark.covers("lab1.emit_arrival", "lab1.emit_queued")
def test_arrival_and_queued_events(impl, tiny_model_dir):
    events, _ = run_script(impl, tiny_model_dir)
    expected = [ev for ev in only(EXPECTED, "ARRIVED", "QUEUED") if ev.get("reason") != "preempted"]
    actual = [ev for ev in only(events, "ARRIVED", "QUEUED") if ev.get("reason") != "preempted"]
    assert_same_events(expected, actual, "ARRIVED and QUEUED (new requests)")


@pytest.mark.points(3)
@pytest.mark.covers("lab1.emit_scheduled")
def test_scheduled_events(impl, tiny_model_dir):
    """SCHEDULED shows the block table as it was in that step (a later append must not change it)."""
    events, _ = run_script(impl, tiny_model_dir)
    assert_same_events(only(EXPECTED, "SCHEDULED"), only(events, "SCHEDULED"), "SCHEDULED events")


@pytest.mark.points(2)
@pytest.mark.covers("lab1.emit_step")
def test_step_events(impl, tiny_model_dir):
    events, _ = run_script(impl, tiny_model_dir)
    assert_same_events(only(EXPECTED, "STEP"), only(events, "STEP"), "STEP events")


@pytest.mark.points(3)
@pytest.mark.covers("lab1.emit_token")
def test_token_events(impl, tiny_model_dir):
    events, _ = run_script(impl, tiny_model_dir)
    assert_same_events(only(EXPECTED, "FIRST_TOKEN", "TOKEN"), only(events, "FIRST_TOKEN", "TOKEN"),
                       "FIRST_TOKEN and TOKEN events")


@pytest.mark.points(2)
@pytest.mark.covers("lab1.emit_preemption")
def test_preemption_events(impl, tiny_model_dir):
    events, _ = run_script(impl, tiny_model_dir)
    expected = [ev for ev in only(EXPECTED, "PREEMPTED", "QUEUED") if ev.get("reason") != "new"]
    actual = [ev for ev in only(events, "PREEMPTED", "QUEUED") if ev.get("reason") != "new"]
    assert_same_events(expected, actual, "PREEMPTED and the QUEUED that follows it")


@pytest.mark.points(2)
@pytest.mark.covers("lab1.emit_finish")
def test_finish_events(impl, tiny_model_dir):
    events, _ = run_script(impl, tiny_model_dir)
    assert_same_events(only(EXPECTED, "FINISHED", "FREED"), only(events, "FINISHED", "FREED"),
                       "FINISHED and FREED events")


@pytest.mark.points(3)
@pytest.mark.covers("lab1.emit_arrival", "lab1.emit_queued", "lab1.emit_scheduled", "lab1.emit_step",
                    "lab1.emit_token", "lab1.emit_preemption", "lab1.emit_finish")
def test_whole_log_in_order(impl, tiny_model_dir):
    """Each event at its point: e.g. STEP after the step's SCHEDULED events and before its tokens."""
    events, _ = run_script(impl, tiny_model_dir)
    assert_same_events(EXPECTED, events, "the whole run")


@pytest.mark.points(3)
@pytest.mark.covers("lab1.emit_arrival", "lab1.emit_scheduled", "lab1.emit_token", "lab1.emit_finish")
def test_event_times_match_engine_record(impl, tiny_model_dir):
    """The log's times agree with the Sequence's own timestamps, and never go backwards."""
    events, finished = run_script(impl, tiny_model_dir)
    problems = []
    for prev, ev in zip(events, events[1:]):
        if ev["time"] < prev["time"]:
            problems.append(f"time goes backwards: {prev['event']} (seq {prev['seq_id']}) at {prev['time']!r} "
                            f"then {ev['event']} (seq {ev['seq_id']}) at {ev['time']!r}")
    for seq_id, seq in sorted(finished.items()):
        def first(name: str) -> dict | None:
            return next((ev for ev in events if ev["event"] == name and ev["seq_id"] == seq_id), None)
        checks = [("ARRIVED", seq.arrival_time, "seq.arrival_time (the `now` of add_request)"),
                  ("SCHEDULED", seq.first_scheduled_time, "seq.first_scheduled_time (its first SCHEDULED)"),
                  ("FIRST_TOKEN", seq.first_token_time, "seq.first_token_time"),
                  ("FINISHED", seq.finished_time, "seq.finished_time"),
                  ("FREED", seq.finished_time, "seq.finished_time (freed in the same instant)")]
        for name, recorded, what in checks:
            ev = first(name)
            if ev is None or recorded is None or ev["time"] != recorded:
                problems.append(f"seq {seq_id}: first {name} time is {None if ev is None else ev['time']!r} "
                                f"but {what} is {recorded!r}")
    if problems:
        pytest.fail("event times disagree with the engine's record:\n  " + "\n  ".join(problems), pytrace=False)


@pytest.mark.points(1)
@pytest.mark.covers("lab1.emit_arrival", "lab1.emit_token", "lab1.emit_finish")
def test_log_passes_lifecycle_checker(impl, tiny_model_dir):
    """`metrics.check_lifecycle` (given code) finds nothing wrong with the log."""
    events, _ = run_script(impl, tiny_model_dir)
    problems = impl.module("metrics").check_lifecycle(events)
    if problems:
        pytest.fail("check_lifecycle found problems:\n  " + "\n  ".join(problems), pytrace=False)


# Step 1 prefills B while A, running since step 0, waits for its decode: one sequence scheduled, two running.
UNEVEN_SCRIPT = {
    0: [("prefill", 0, 4)],
    1: [("prefill", 1, 3)],
    2: [("decode", 0), ("decode", 1)],
}


@pytest.mark.points(1)
@pytest.mark.covers("lab1.emit_step")
def test_step_batch_size_counts_the_scheduled_sequences_not_the_running_ones(impl, tiny_model_dir):
    params = impl.module("sampling_params").SamplingParams
    engine = fake_engine(impl, tiny_model_dir, UNEVEN_SCRIPT)
    engine.add_request([11, 12, 13, 14], params(temperature=0.0, max_tokens=2, ignore_eos=True))
    engine.add_request([21, 22, 23], params(temperature=0.0, max_tokens=2, ignore_eos=True))
    for _ in UNEVEN_SCRIPT:
        engine.step()
    steps = only(engine.log.events, "STEP")
    # batch_size: the script's actions in that step; num_running: A alone, then A and B, then both.
    expected = [(step, len(actions), running) for (step, actions), running in zip(UNEVEN_SCRIPT.items(), (1, 2, 2))]
    got = [(s["step"], s.get("batch_size"), s.get("num_running")) for s in steps]
    if got != expected:
        pytest.fail(f"STEP (step, batch_size, num_running): expected {expected}, got {got}; batch_size counts the "
                    f"sequences scheduled in the step (step 1 schedules only B), not every running one",
                    pytrace=False)
