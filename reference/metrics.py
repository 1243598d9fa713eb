"""Metrics computed from the engine's lifecycle log, and a checker for that log.

Everything here reads only the JSON Lines log written by the engine, never the
engine itself: a metric that can be recomputed from the log by anyone is a
metric that can be trusted, compared between runs, and taught. The definitions
follow vLLM's metrics design:

    queue time   = first SCHEDULED - ARRIVED
    TTFT         = FIRST_TOKEN - ARRIVED
    TPOT         = (FINISHED - FIRST_TOKEN) / (output tokens - 1)
    ITLs         = gaps between consecutive token events (FIRST_TOKEN, TOKEN...)
    end-to-end   = FINISHED - ARRIVED

All times are seconds. A metric whose events are missing (an unfinished or
aborted request, a single-token output for TPOT) is None rather than a guess.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

Event = dict[str, Any]

TOKEN_EVENTS = ("FIRST_TOKEN", "TOKEN")
PERCENTILES = (50, 90, 99)
REQUIRED_FIELDS = ("event", "seq_id", "step", "time")

# The request state machine: for each event, the events that may follow it.
# `None` stands for "nothing seen yet". The engine emits at most one token per
# request per step, so every token event directly follows a SCHEDULED and
# TOKEN -> TOKEN is illegal. (Async scheduling logs a token one step late, so
# there TOKEN may follow a token event: see check_lifecycle.)
ALLOWED_NEXT: dict[str | None, frozenset[str]] = {
    None: frozenset({"ARRIVED"}),
    "ARRIVED": frozenset({"QUEUED"}),
    "QUEUED": frozenset({"SCHEDULED", "FINISHED"}),  # FINISHED: aborted while waiting
    "SCHEDULED": frozenset({"SCHEDULED", "FIRST_TOKEN", "TOKEN", "PREEMPTED", "FINISHED"}),
    "FIRST_TOKEN": frozenset({"SCHEDULED", "PREEMPTED", "FINISHED"}),
    "TOKEN": frozenset({"SCHEDULED", "PREEMPTED", "FINISHED"}),
    "PREEMPTED": frozenset({"QUEUED"}),
    "FINISHED": frozenset({"FREED"}),
    "FREED": frozenset(),
}


# --------------------------------------------------------------------------- reading


def read_log(path: str | os.PathLike[str]) -> list[Event]:
    """Read a JSON Lines lifecycle log; blank lines are skipped.

    A bad line raises ValueError with the file and line number, because a log
    cut off mid-write is common and "Expecting value: line 1 column 1" alone
    does not say which of thousands of lines is broken.
    """
    events: list[Event] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{os.fspath(path)}, line {lineno}: malformed JSON ({exc.msg})") from exc
            if not isinstance(event, dict) or "event" not in event:
                raise ValueError(f"{os.fspath(path)}, line {lineno}: expected a JSON object with an 'event' key")
            events.append(event)
    return events


def group_by_request(events: Iterable[Event]) -> dict[int, list[Event]]:
    """Split the log into one event list per seq_id, keeping log order.

    STEP events belong to the engine, not to a request, so they are left out.
    """
    groups: dict[int, list[Event]] = {}
    for event in events:
        if event["event"] != "STEP":
            groups.setdefault(event.get("seq_id"), []).append(event)
    return groups


# --------------------------------------------------------------------------- per request


@dataclass
class RequestMetrics:
    """Latency metrics of one request, in seconds (None when undefined)."""

    seq_id: int
    prompt_len: int | None
    num_output_tokens: int
    queue_time: float | None
    ttft: float | None
    tpot: float | None
    itls: list[float]
    e2e: float | None
    num_preemptions: int
    finish_reason: str | None


def _first(events: list[Event], name: str) -> Event | None:
    """The first event called `name`, or None: metrics start at first occurrences."""
    return next((e for e in events if e["event"] == name), None)


def _elapsed(start: Event | None, end: Event | None) -> float | None:
    """Seconds from `start` to `end`, or None if either event never happened."""
    if start is None or end is None:
        return None
    return end["time"] - start["time"]


def _request_metrics(seq_id: int, events: list[Event]) -> RequestMetrics:
    """Compute the metrics of one request from its own events."""
    # >>> EXERCISE lab1.request_metrics: Compute one request's queue time, TTFT, TPOT, ITLs and end-to-end latency.
    # HINT: each metric starts and ends at the *first* event of its kind (_first); if one is missing, it is None.
    # HINT: queue time ends at SCHEDULED, TTFT at FIRST_TOKEN, end-to-end at FINISHED; all start at ARRIVED.
    # HINT: TPOT = (FINISHED - FIRST_TOKEN) / (output tokens - 1), and None with fewer than two tokens.
    # HINT: the ITLs are the gaps between consecutive token events (FIRST_TOKEN, then each TOKEN).
    arrived = _first(events, "ARRIVED")
    first_token = _first(events, "FIRST_TOKEN")
    finished = _first(events, "FINISHED")
    token_times = [e["time"] for e in events if e["event"] in TOKEN_EVENTS]
    num_tokens = len(token_times)

    tpot = None
    if num_tokens >= 2:
        decode_time = _elapsed(first_token, finished)
        tpot = None if decode_time is None else decode_time / (num_tokens - 1)

    return RequestMetrics(
        seq_id=seq_id,
        prompt_len=arrived.get("prompt_len") if arrived else None,
        num_output_tokens=num_tokens,
        queue_time=_elapsed(arrived, _first(events, "SCHEDULED")),
        ttft=_elapsed(arrived, first_token),
        tpot=tpot,
        # Across a preemption this gap includes the wait and the re-prefill:
        # that is what the user saw, so it is kept.
        itls=[later - earlier for earlier, later in zip(token_times, token_times[1:])],
        e2e=_elapsed(arrived, finished),
        num_preemptions=sum(1 for e in events if e["event"] == "PREEMPTED"),
        finish_reason=finished.get("reason") if finished else None,
    )
    # <<< EXERCISE lab1.request_metrics


@dataclass
class PhaseTimes:
    """Where a request's time on the engine went, in seconds (None when undefined), as vLLM splits it."""

    prefill: float | None     # first SCHEDULED -> FIRST_TOKEN
    decode: float | None      # FIRST_TOKEN -> the last token event
    inference: float | None   # first SCHEDULED -> the last token event


def phase_times(events: list[Event]) -> PhaseTimes:
    """The prefill, decode and inference time of one request, from its own events.

    A preemption's wait and re-prefill fall into whichever phase it
    interrupted, as in vLLM, which counts from the first scheduling.
    """
    scheduled = _first(events, "SCHEDULED")
    first_token = _first(events, "FIRST_TOKEN")
    last_token = next((e for e in reversed(events) if e["event"] in TOKEN_EVENTS), None)
    return PhaseTimes(_elapsed(scheduled, first_token), _elapsed(first_token, last_token),
                      _elapsed(scheduled, last_token))


def request_metrics(events: Iterable[Event]) -> dict[int, RequestMetrics]:
    """Metrics of every request in the log, keyed by seq_id, in arrival order.

    `num_output_tokens` counts token events, so it is right for requests that
    are still running when the log ends; check_lifecycle verifies it against
    FINISHED's own count.
    """
    return {seq_id: _request_metrics(seq_id, evs) for seq_id, evs in group_by_request(events).items()}


# --------------------------------------------------------------------------- per step


@dataclass
class StepMetrics:
    """What the engine did in one step, as reported by its STEP event."""

    step: int
    time: float
    is_prefill: bool
    batch_size: int
    num_tokens: int
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV cache in use: the number that predicts preemption."""
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


def step_metrics(events: Iterable[Event]) -> list[StepMetrics]:
    """One StepMetrics per STEP event, in log order."""
    return [
        StepMetrics(
            step=e["step"],
            time=e["time"],
            is_prefill=e["is_prefill"],
            batch_size=e["batch_size"],
            num_tokens=e["num_tokens"],
            num_running=e["num_running"],
            num_waiting=e["num_waiting"],
            kv_blocks_used=e["kv_blocks_used"],
            kv_blocks_total=e["kv_blocks_total"],
        )
        for e in events
        if e["event"] == "STEP"
    ]


# --------------------------------------------------------------------------- summary


def distribution(values: Iterable[float]) -> dict[str, float | None]:
    """count, mean and p50/p90/p99 of `values` (None entries when empty).

    Percentiles use linear interpolation between the two nearest ranks, which
    is numpy.percentile's default: for sorted values v[0..n-1], the p-th
    percentile sits at position (n - 1) * p / 100 and is interpolated between
    the values on either side of that position.
    """
    data = np.asarray(list(values), dtype=float)
    stats: dict[str, float | None] = {"count": len(data)}
    stats["mean"] = float(data.mean()) if len(data) else None
    for p in PERCENTILES:
        stats[f"p{p}"] = float(np.percentile(data, p)) if len(data) else None
    return stats


def summarize(metrics: Iterable[RequestMetrics]) -> dict[str, dict[str, float | None]]:
    """Distributions of ttft, tpot, e2e, queue_time and itl, plus totals.

    Requests where a metric is None (not finished, aborted, one token) are left
    out of that metric's distribution instead of being counted as zero.
    """
    requests = list(metrics)

    def defined(name: str) -> list[float]:
        return [v for r in requests if (v := getattr(r, name)) is not None]

    summary: dict[str, dict[str, float | None]] = {
        name: distribution(defined(name)) for name in ("ttft", "tpot", "e2e", "queue_time")
    }
    summary["itl"] = distribution(itl for r in requests for itl in r.itls)
    summary["totals"] = {
        "requests": len(requests),
        "finished": sum(1 for r in requests if r.finish_reason is not None),
        "output_tokens": sum(r.num_output_tokens for r in requests),
        "preemptions": sum(r.num_preemptions for r in requests),
    }
    return summary


# --------------------------------------------------------------------------- checking


def _describe(seq_id: Any, event: Event, prev: Event | None, reason: str) -> str:
    """One problem line naming the request, step, event and its predecessor."""
    prev_name = prev["event"] if prev else "(start)"
    return f"seq {seq_id}, step {event.get('step')}: {event.get('event')} after {prev_name}: {reason}"


def _order_problems(event: Event, prev: Event | None, token_may_follow_token: bool = False) -> list[str]:
    """Is `event` allowed to follow `prev` by the state machine, step and clock?

    `token_may_follow_token`: the log comes from an async-scheduling engine,
    whose tokens are logged a step late (check_lifecycle counts them instead).
    """
    name, prev_name = event["event"], (prev["event"] if prev else None)
    if name not in ALLOWED_NEXT:
        return [f"unknown event type {name!r}"]
    reasons = []
    allowed = ALLOWED_NEXT[prev_name]
    if token_may_follow_token and name == "TOKEN" and prev_name in TOKEN_EVENTS:
        allowed = allowed | {"TOKEN"}
    if name not in allowed:
        reasons.append(f"illegal order (allowed next: {', '.join(sorted(allowed)) or 'nothing'})")
    if prev is not None and event["step"] < prev["step"]:
        reasons.append(f"step goes backwards ({prev['step']} -> {event['step']})")
    if prev is not None and event["time"] < prev["time"]:
        reasons.append(f"time goes backwards ({prev['time']} -> {event['time']})")
    if name == "QUEUED":
        expected = "preempted" if prev_name == "PREEMPTED" else "new"
        if event.get("reason") != expected:
            reasons.append(f"QUEUED reason is {event.get('reason')!r}, expected {expected!r}")
    return reasons


def _token_problems(event: Event, tokens_before: int) -> list[str]:
    """Token bookkeeping: one FIRST_TOKEN, consecutive indexes, a matching FINISHED count."""
    name, reasons = event["event"], []
    if name == "FIRST_TOKEN" and tokens_before > 0:
        reasons.append(f"FIRST_TOKEN after {tokens_before} token event(s); it must come once, first")
    if name == "TOKEN" and tokens_before == 0:
        reasons.append("TOKEN before any FIRST_TOKEN")
    if name in TOKEN_EVENTS and event.get("index") != tokens_before:
        reasons.append(f"token index {event.get('index')}, expected {tokens_before}")
    if name == "FINISHED" and event.get("num_output_tokens") != tokens_before:
        claimed = event.get("num_output_tokens")
        reasons.append(f"num_output_tokens is {claimed} but {tokens_before} token events were logged")
    return reasons


def _samples(event: Event, prompt_len: int, tokens_before: int) -> bool:
    """Does this SCHEDULED step end with a sampled token (a decode, or a prefill reaching the end)?"""
    if not event.get("is_prefill", False):
        return True
    return event.get("num_cached_tokens", 0) + event.get("num_new_tokens", 0) >= prompt_len + tokens_before


def _check_request(seq_id: Any, events: list[Event], async_scheduling: bool = False) -> list[str]:
    """All problems in one request's event sequence.

    In an async-scheduling log a token need not directly follow a SCHEDULED,
    but each one must have its own earlier SCHEDULED step that sampled it.
    """
    problems: list[str] = []
    prev: Event | None = None
    tokens_before = 0
    sampling_steps = 0
    prompt_len = 0
    for event in events:
        missing = [f for f in REQUIRED_FIELDS if f not in event]
        if missing:
            problems.append(_describe(seq_id, event, prev, f"missing field(s) {', '.join(missing)}"))
            continue
        reasons = _order_problems(event, prev, async_scheduling) + _token_problems(event, tokens_before)
        name = event["event"]
        if name == "ARRIVED":
            prompt_len = event.get("prompt_len", 0)
        elif name == "SCHEDULED":
            sampling_steps += _samples(event, prompt_len, tokens_before)
        elif name in TOKEN_EVENTS and async_scheduling and tokens_before >= sampling_steps:
            reasons.append(f"token {tokens_before} has no SCHEDULED step that sampled it "
                           f"({sampling_steps} so far)")
        for reason in reasons:
            problems.append(_describe(seq_id, event, prev, reason))
        tokens_before += name in TOKEN_EVENTS
        prev = event
    if prev is not None and prev["event"] == "FINISHED":
        end_of_log = {"event": "end of log", "step": prev["step"]}
        problems.append(_describe(seq_id, end_of_log, prev, "FINISHED was never followed by FREED (blocks leaked?)"))
    return problems


def _check_steps(events: Iterable[Event]) -> list[str]:
    """STEP events must have strictly increasing step numbers and a non-decreasing clock."""
    problems: list[str] = []
    prev: Event | None = None
    for event in (e for e in events if e["event"] == "STEP"):
        if prev is not None and event.get("step", -1) <= prev.get("step", -1):
            problems.append(_describe(None, event, prev, f"step number {event.get('step')} does not increase"))
        if prev is not None and event.get("time", 0.0) < prev.get("time", 0.0):
            problems.append(_describe(None, event, prev, "time goes backwards"))
        prev = event
    return problems


def check_lifecycle(events: Iterable[Event], async_scheduling: bool = False) -> list[str]:
    """Every way the log breaks the request lifecycle, as readable lines.

    An empty list means the log is legal. A request still in flight when the
    log ends is legal (the log may simply stop); one that FINISHED but was
    never FREED is not, since that is how a block leak shows up.

    `async_scheduling=True` checks a log of an engine run with that setting:
    its tokens are logged a step after the step that computed them, so a
    TOKEN may follow another token event, as long as every token has its own
    earlier SCHEDULED step that sampled it.
    """
    events = list(events)
    problems = _check_steps(events)
    for seq_id, request_events in group_by_request(events).items():
        problems += _check_request(seq_id, request_events, async_scheduling)
    return problems
