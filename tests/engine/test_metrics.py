"""Tests for the given code of reference.metrics (`check_lifecycle`, `step_metrics`, `summarize`,
`read_log`) and courseware.trace, on hand-built lifecycle logs. `request_metrics` is lab 1's region:
its rules are tested in assignments/lab1_lifecycle/public/test_lab1_metrics.py.

Each log is written out event by event with chosen times, and each expected
value is computed here from those same times, so a reader can check the
arithmetic without running anything.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from courseware.trace import render_trace
from reference.metrics import (
    RequestMetrics,
    check_lifecycle,
    read_log,
    request_metrics,
    step_metrics,
    summarize,
)


class Log:
    """Builds a lifecycle log in the order the engine would write it."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def add(self, name: str, seq_id: int | None, step: int, time: float, **fields) -> Log:
        self.events.append({"event": name, "seq_id": seq_id, "step": step, "time": time, **fields})
        return self

    def arrive(self, seq: int, step: int, t: float, prompt_len: int) -> Log:
        self.add("ARRIVED", seq, step, t, prompt_len=prompt_len)
        return self.add("QUEUED", seq, step, t, reason="new")

    def schedule(self, seq: int, step: int, t: float, prefill: bool, new: int = 1, cached: int = 0) -> Log:
        return self.add("SCHEDULED", seq, step, t, is_prefill=prefill, num_new_tokens=new,
                        num_cached_tokens=cached, block_table=[0, 1])

    def token(self, seq: int, step: int, t: float, index: int) -> Log:
        name = "FIRST_TOKEN" if index == 0 else "TOKEN"
        return self.add(name, seq, step, t, index=index, token_id=100 + index)

    def finish(self, seq: int, step: int, t: float, reason: str, num_tokens: int, blocks: int = 2) -> Log:
        self.add("FINISHED", seq, step, t, reason=reason, num_output_tokens=num_tokens)
        return self.add("FREED", seq, step, t, blocks_freed=blocks)

    def step(self, step: int, t: float, prefill: bool, batch: int, tokens: int,
             running: int, waiting: int, used: int, total: int = 64) -> Log:
        return self.add("STEP", None, step, t, is_prefill=prefill, batch_size=batch, num_tokens=tokens,
                        num_running=running, num_waiting=waiting, kv_blocks_used=used, kv_blocks_total=total)


# Times of the "normal" request used by several tests: 5-token prompt, 3 output tokens.
T_ARRIVE, T_PREFILL, T_FIRST = 0.000, 0.010, 0.050
T_DECODE1, T_TOKEN1, T_DECODE2, T_TOKEN2 = 0.060, 0.080, 0.090, 0.125


def normal_request(seq: int = 1) -> Log:
    log = Log().arrive(seq, 0, T_ARRIVE, prompt_len=5)
    log.schedule(seq, 0, T_PREFILL, prefill=True, new=5).token(seq, 0, T_FIRST, 0)
    log.schedule(seq, 1, T_DECODE1, prefill=False).token(seq, 1, T_TOKEN1, 1)
    log.schedule(seq, 2, T_DECODE2, prefill=False).token(seq, 2, T_TOKEN2, 2)
    return log.finish(seq, 2, T_TOKEN2, "length", 3)


def single_token_request() -> Log:
    log = Log().arrive(7, 3, 1.0, prompt_len=4).schedule(7, 3, 1.5, prefill=True, new=4)
    return log.token(7, 3, 1.75, 0).finish(7, 3, 1.75, "stop", 1)


def preempted_request() -> Log:
    """Two tokens, preempted, recomputed (prompt + 2 tokens), two more tokens."""
    log = Log().arrive(2, 0, 0.0, prompt_len=6)
    log.schedule(2, 0, 0.1, prefill=True, new=6).token(2, 0, 0.2, 0)
    log.schedule(2, 1, 0.3, prefill=False).token(2, 1, 0.4, 1)
    log.add("PREEMPTED", 2, 2, 0.5, blocks_freed=2)
    log.add("QUEUED", 2, 2, 0.5, reason="preempted")
    log.schedule(2, 5, 0.9, prefill=True, new=6 + 2).token(2, 5, 1.1, 2)
    log.schedule(2, 6, 1.2, prefill=False).token(2, 6, 1.3, 3)
    return log.finish(2, 6, 1.3, "stop", 4)


def chunked_request() -> Log:
    """A 10-token prompt in three prefill chunks; only the last one samples."""
    log = Log().arrive(3, 0, 0.0, prompt_len=10)
    for step, (t, new, cached) in enumerate(zip([0.1, 0.2, 0.3], [4, 4, 2], [0, 4, 8])):
        log.schedule(3, step, t, prefill=True, new=new, cached=cached)
    return log.token(3, 2, 0.35, 0).finish(3, 2, 0.35, "stop", 1)


def aborted_while_waiting() -> Log:
    return Log().arrive(4, 0, 2.0, prompt_len=3).finish(4, 1, 2.5, "abort", 0, blocks=0)


def still_running() -> Log:
    """A log may end with requests in flight: two tokens, no FINISHED yet."""
    log = Log().arrive(5, 0, 0.0, prompt_len=3).schedule(5, 0, 0.1, prefill=True).token(5, 0, 0.2, 0)
    return log.schedule(5, 1, 0.3, prefill=False).token(5, 1, 0.4, 1)


# The metrics of these logs (queue time, TTFT, TPOT, ITLs, e2e: lab 1's `lab1.request_metrics`) are tested
# in the public suite, assignments/lab1_lifecycle/public/test_lab1_metrics.py, which CI runs on the reference.
LEGAL_STORIES = {"normal": normal_request, "single_token": single_token_request, "preempted": preempted_request,
                 "chunked_prefill": chunked_request, "aborted_while_waiting": aborted_while_waiting,
                 "still_running": still_running}


@pytest.mark.parametrize("story", sorted(LEGAL_STORIES))
def test_check_lifecycle_accepts_every_legal_story(story) -> None:
    assert check_lifecycle(LEGAL_STORIES[story]().events) == []


# --------------------------------------------------------------------------- step metrics and summary


def test_step_metrics() -> None:
    log = normal_request()
    log.step(0, 0.05, prefill=True, batch=1, tokens=5, running=1, waiting=0, used=1)
    log.step(1, 0.08, prefill=False, batch=2, tokens=2, running=2, waiting=3, used=16, total=32)
    steps = step_metrics(log.events)
    assert [s.step for s in steps] == [0, 1]
    assert steps[0].is_prefill and not steps[1].is_prefill
    assert (steps[1].batch_size, steps[1].num_tokens, steps[1].num_running, steps[1].num_waiting) == (2, 2, 2, 3)
    assert steps[1].kv_blocks_used == 16 and steps[1].kv_usage == pytest.approx(16 / 32)
    assert steps[1].time == pytest.approx(0.08)


def _metrics(seq_id: int, ttft: float, tpot: float | None, itls: list[float], preempt: int = 0) -> RequestMetrics:
    """A finished request whose queue time is half its TTFT, to give summarize distinct values."""
    return RequestMetrics(seq_id=seq_id, prompt_len=4, num_output_tokens=len(itls) + 1, queue_time=ttft / 2,
                          ttft=ttft, tpot=tpot, itls=itls, e2e=ttft + sum(itls), num_preemptions=preempt,
                          finish_reason="stop")


def test_summarize_matches_numpy_percentiles() -> None:
    requests = [
        _metrics(1, 0.10, 0.02, [0.01, 0.03]),
        _metrics(2, 0.40, None, [], preempt=2),  # single token: no TPOT, no ITL
        _metrics(3, 0.25, 0.05, [0.05, 0.04, 0.06]),
        _metrics(4, 0.90, 0.01, [0.02]),
    ]
    summary = summarize(requests)
    ttfts = [0.10, 0.40, 0.25, 0.90]
    for p in (50, 90, 99):
        assert summary["ttft"][f"p{p}"] == pytest.approx(np.percentile(ttfts, p))
        assert summary["tpot"][f"p{p}"] == pytest.approx(np.percentile([0.02, 0.05, 0.01], p))
        assert summary["itl"][f"p{p}"] == pytest.approx(np.percentile([0.01, 0.03, 0.05, 0.04, 0.06, 0.02], p))
    assert summary["ttft"]["mean"] == pytest.approx(sum(ttfts) / len(ttfts))
    assert summary["tpot"]["count"] == 3
    assert summary["queue_time"]["p50"] == pytest.approx(np.percentile([t / 2 for t in ttfts], 50))
    assert summary["e2e"]["count"] == 4
    assert summary["totals"]["requests"] == 4
    assert summary["totals"]["output_tokens"] == 3 + 1 + 4 + 2
    assert summary["totals"]["preemptions"] == 2


def test_summarize_empty() -> None:
    summary = summarize([])
    assert summary["ttft"]["count"] == 0 and summary["ttft"]["p99"] is None
    assert summary["totals"]["requests"] == 0


# --------------------------------------------------------------------------- reading


def test_read_log_round_trip(tmp_path: Path) -> None:
    events = normal_request().events
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert read_log(path) == events


def test_read_log_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(normal_request().events[0]) + "\n" + '{"event": "QUEUED", "seq_\n')
    with pytest.raises(ValueError, match=r"broken\.jsonl, line 2"):
        read_log(path)


def test_read_log_rejects_non_event_line(tmp_path: Path) -> None:
    path = tmp_path / "list.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match=r"list\.jsonl, line 1"):
        read_log(path)


# --------------------------------------------------------------------------- lifecycle checking


def _drop(name: str):
    """Remove the first event called `name` from the normal request."""
    def mutate(events: list[dict]) -> None:
        events.remove(next(e for e in events if e["event"] == name))
    return mutate


def _index(events: list[dict], name: str, nth: int = 0) -> int:
    return [i for i, e in enumerate(events) if e["event"] == name][nth]


def _scheduled_before_queued(events: list[dict]) -> None:
    _drop("QUEUED")(events)


def _token_before_first_token(events: list[dict]) -> None:
    events[_index(events, "FIRST_TOKEN")]["event"] = "TOKEN"


def _second_first_token(events: list[dict]) -> None:
    events[_index(events, "TOKEN", 1)]["event"] = "FIRST_TOKEN"


def _token_index_gap(events: list[dict]) -> None:
    events[_index(events, "TOKEN", 1)]["index"] = 3


def _preempted_while_waiting(events: list[dict]) -> None:
    i = _index(events, "QUEUED")
    events.insert(i + 1, {"event": "PREEMPTED", "seq_id": 1, "step": 0, "time": T_ARRIVE, "blocks_freed": 0})


def _preempted_not_requeued(events: list[dict]) -> None:
    i = _index(events, "TOKEN", 0)
    events.insert(i + 1, {"event": "PREEMPTED", "seq_id": 1, "step": 1, "time": T_TOKEN1, "blocks_freed": 2})


def _finished_twice(events: list[dict]) -> None:
    i = _index(events, "FINISHED")
    events.insert(i + 1, dict(events[i]))


def _event_after_freed(events: list[dict]) -> None:
    events.append({"event": "TOKEN", "seq_id": 1, "step": 3, "time": 1.0, "index": 3, "token_id": 9})


def _freed_missing(events: list[dict]) -> None:
    _drop("FREED")(events)


def _arrived_not_first(events: list[dict]) -> None:
    events.insert(0, events.pop(_index(events, "QUEUED")))


def _step_backwards(events: list[dict]) -> None:
    events[_index(events, "TOKEN", 1)]["step"] = 0


def _time_backwards(events: list[dict]) -> None:
    events[_index(events, "TOKEN", 0)]["time"] = T_FIRST - 0.001


def _wrong_token_count(events: list[dict]) -> None:
    events[_index(events, "FINISHED")]["num_output_tokens"] = 2


def _wrong_queued_reason(events: list[dict]) -> None:
    events[_index(events, "QUEUED")]["reason"] = "preempted"


ILLEGAL_ORDERS = [
    (_scheduled_before_queued, "SCHEDULED after ARRIVED: illegal order"),
    (_token_before_first_token, "TOKEN before any FIRST_TOKEN"),
    (_second_first_token, "FIRST_TOKEN after 2 token event(s)"),
    (_token_index_gap, "token index 3, expected 2"),
    (_preempted_while_waiting, "PREEMPTED after QUEUED: illegal order"),
    (_preempted_not_requeued, "SCHEDULED after PREEMPTED: illegal order"),
    (_finished_twice, "FINISHED after FINISHED: illegal order"),
    (_event_after_freed, "TOKEN after FREED: illegal order (allowed next: nothing)"),
    (_freed_missing, "never followed by FREED"),
    (_arrived_not_first, "QUEUED after (start): illegal order"),
    (_step_backwards, "step goes backwards (2 -> 0)"),
    (_time_backwards, "time goes backwards"),
    (_wrong_token_count, "num_output_tokens is 2 but 3 token events"),
    (_wrong_queued_reason, "QUEUED reason is 'preempted', expected 'new'"),
]


@pytest.mark.parametrize(("mutate", "expected"), ILLEGAL_ORDERS, ids=[m.__name__.strip("_") for m, _ in ILLEGAL_ORDERS])
def test_check_lifecycle_catches_illegal_order(mutate, expected: str) -> None:
    events = normal_request().events
    mutate(events)
    problems = check_lifecycle(events)
    assert any(expected in p for p in problems), problems
    assert all(p.startswith("seq 1, step ") for p in problems), problems


def test_check_lifecycle_problem_names_seq_step_event_and_predecessor() -> None:
    events = normal_request(seq=9).events
    events.remove(next(e for e in events if e["event"] == "QUEUED"))
    problems = check_lifecycle(events)
    assert problems[0].startswith("seq 9, step 0: SCHEDULED after ARRIVED: illegal order")


def test_check_lifecycle_step_events_must_increase() -> None:
    log = normal_request()
    log.step(0, 0.05, prefill=True, batch=1, tokens=5, running=1, waiting=0, used=1)
    log.step(0, 0.08, prefill=False, batch=1, tokens=1, running=1, waiting=0, used=1)
    problems = check_lifecycle(log.events)
    assert problems == ["seq None, step 0: STEP after STEP: step number 0 does not increase"]


def test_check_lifecycle_accepts_interleaved_requests() -> None:
    log = Log()
    for event in sorted(normal_request(1).events + preempted_request().events, key=lambda e: (e["step"], e["time"])):
        log.events.append(event)
    assert check_lifecycle(log.events) == []
    assert set(request_metrics(log.events)) == {1, 2}


# --------------------------------------------------------------------------- trace rendering


def async_request(extra_token: bool = False, partial_chunk: bool = False) -> Log:
    """An async-scheduling log: decode step k is scheduled before the token of step k-1 is logged."""
    log = Log().arrive(4, 0, 0.0, prompt_len=5)
    if partial_chunk:
        log.schedule(4, 0, 0.01, prefill=True, new=3)            # samples nothing: 3 of 5 prompt tokens
    else:
        log.schedule(4, 0, 0.01, prefill=True, new=5)
    log.token(4, 0, 0.02, 0)
    log.schedule(4, 1, 0.03, prefill=False)                       # computes token 1
    log.schedule(4, 2, 0.04, prefill=False).token(4, 2, 0.05, 1)  # token 1 is logged while step 2 computes
    log.token(4, 3, 0.06, 2)                                      # the last token follows a token: legal here
    if extra_token:
        log.token(4, 3, 0.07, 3)                                  # no step computed this one
    return log.finish(4, 3, 0.07, "length", 4 if extra_token else 3)


def test_check_lifecycle_async_log() -> None:
    assert check_lifecycle(async_request().events, async_scheduling=True) == []
    # The same log breaks the synchronous engine's rule (a token right after a token).
    assert any("TOKEN after TOKEN" in p for p in check_lifecycle(async_request().events))


@pytest.mark.parametrize("kind, first_bad", [("extra_token", "token 3 "), ("partial_chunk", "token 0 ")])
def test_check_lifecycle_async_token_needs_its_own_step(kind, first_bad) -> None:
    problems = check_lifecycle(async_request(**{kind: True}).events, async_scheduling=True)
    assert problems and first_bad + "has no SCHEDULED step that sampled it" in problems[0], problems


def test_render_trace_prints_tables(tmp_path: Path) -> None:
    log = normal_request(seq=4242)
    log.events += preempted_request().events
    for step in range(25):
        log.step(step, 2.0 + step, prefill=step == 0, batch=1, tokens=1, running=1, waiting=0, used=step)
    log.add("TOKEN", 4242, 30, 40.0, index=7, token_id=1)  # after FREED: a lifecycle problem
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in log.events))
    console = Console(record=True, width=200)
    render_trace(path, console=console)
    text = console.export_text()
    seq_cells = re.findall(r"^│\s+(\d+)\s+│\s+\d+\s+│", text, flags=re.MULTILINE)
    assert {"4242", "2"} <= set(seq_cells), seq_cells
    assert "5 steps elided" in text
    assert "seq 4242, step 30: TOKEN after FREED" in text
    for header in ("TTFT ms", "p99 ms", "KV blocks"):
        assert header in text
