"""Hidden lab 1 tests: request metrics computed from hand-written logs with fixed times.

Each log is a small story (a normal request, one token, a preemption, an
abort while waiting, an unfinished request); the metrics are observed, and
the grader compares them with the reference's within a tight tolerance.
"""
from __future__ import annotations

import dataclasses

import pytest

from _inferlab_support import module


def ev(event: str, seq_id: int, step: int, time: float, **fields):
    return {"event": event, "seq_id": seq_id, "step": step, "time": time, **fields}


STORIES = {
    "normal": [ev("ARRIVED", 0, 0, 1.0, prompt_len=5), ev("QUEUED", 0, 0, 1.0, reason="new"),
               ev("SCHEDULED", 0, 1, 1.5, is_prefill=True), ev("FIRST_TOKEN", 0, 1, 2.0, index=0),
               ev("SCHEDULED", 0, 2, 2.1, is_prefill=False), ev("TOKEN", 0, 2, 2.25, index=1),
               ev("SCHEDULED", 0, 3, 2.3, is_prefill=False), ev("TOKEN", 0, 3, 2.75, index=2),
               ev("FINISHED", 0, 3, 2.75, reason="length", num_output_tokens=3), ev("FREED", 0, 3, 2.75)],
    "one_token": [ev("ARRIVED", 1, 0, 0.5, prompt_len=3), ev("QUEUED", 1, 0, 0.5, reason="new"),
                  ev("SCHEDULED", 1, 0, 0.75, is_prefill=True), ev("FIRST_TOKEN", 1, 0, 1.25, index=0),
                  ev("FINISHED", 1, 0, 1.25, reason="length", num_output_tokens=1), ev("FREED", 1, 0, 1.25)],
    "preempted": [ev("ARRIVED", 2, 0, 0.0, prompt_len=4), ev("QUEUED", 2, 0, 0.0, reason="new"),
                  ev("SCHEDULED", 2, 0, 0.25, is_prefill=True), ev("FIRST_TOKEN", 2, 0, 0.5, index=0),
                  ev("SCHEDULED", 2, 1, 0.6, is_prefill=False), ev("TOKEN", 2, 1, 0.75, index=1),
                  ev("PREEMPTED", 2, 2, 0.8, blocks_freed=2), ev("QUEUED", 2, 2, 0.8, reason="preempted"),
                  ev("SCHEDULED", 2, 4, 1.5, is_prefill=True), ev("TOKEN", 2, 4, 2.0, index=2),
                  ev("SCHEDULED", 2, 5, 2.1, is_prefill=False), ev("TOKEN", 2, 5, 2.5, index=3),
                  ev("FINISHED", 2, 5, 2.5, reason="stop", num_output_tokens=4), ev("FREED", 2, 5, 2.5)],
    "aborted_while_waiting": [ev("ARRIVED", 3, 0, 3.0, prompt_len=9), ev("QUEUED", 3, 0, 3.0, reason="new"),
                              ev("FINISHED", 3, 2, 4.0, reason="abort", num_output_tokens=0),
                              ev("FREED", 3, 2, 4.0, blocks_freed=0)],
    "still_running": [ev("ARRIVED", 4, 0, 1.0, prompt_len=2), ev("QUEUED", 4, 0, 1.0, reason="new"),
                      ev("SCHEDULED", 4, 1, 1.2, is_prefill=True), ev("FIRST_TOKEN", 4, 1, 1.7, index=0),
                      ev("SCHEDULED", 4, 2, 1.8, is_prefill=False), ev("TOKEN", 4, 2, 2.0, index=1)],
}


@pytest.mark.parametrize("story", sorted(STORIES))
def test_request_metrics_of_one_story(observe, story):
    metrics = module("metrics").request_metrics(STORIES[story])
    observe("metrics", {str(k): dataclasses.asdict(v) for k, v in metrics.items()})


def test_request_metrics_of_interleaved_requests(observe):
    """Several requests' events interleaved, plus STEP events that belong to no request."""
    events = []
    stories = [STORIES[name] for name in sorted(STORIES)]
    for i in range(max(map(len, stories))):
        for story in stories:
            if i < len(story):
                events.append(story[i])
        events.append({"event": "STEP", "seq_id": None, "step": i, "time": 0.1 * i, "is_prefill": False,
                       "batch_size": 1, "num_tokens": 1, "num_running": 1, "num_waiting": 0,
                       "kv_blocks_used": 1, "kv_blocks_total": 8})
    metrics = module("metrics").request_metrics(events)
    observe("seq order", [str(k) for k in metrics])
    observe("metrics", {str(k): dataclasses.asdict(v) for k, v in metrics.items()})


EDGE_STORIES = {
    # exactly two output tokens: one gap, so TPOT is defined
    "two_tokens": [ev("ARRIVED", 5, 0, 0.0, prompt_len=3), ev("QUEUED", 5, 0, 0.0, reason="new"),
                   ev("SCHEDULED", 5, 0, 0.25, is_prefill=True), ev("FIRST_TOKEN", 5, 0, 0.5, index=0),
                   ev("SCHEDULED", 5, 1, 0.6, is_prefill=False), ev("TOKEN", 5, 1, 1.0, index=1),
                   ev("FINISHED", 5, 1, 1.0, reason="length", num_output_tokens=2), ev("FREED", 5, 1, 1.0)],
    # queued a while after arriving: queue time and TTFT still start at ARRIVED
    "queued_after_arrival": [ev("ARRIVED", 6, 0, 1.0, prompt_len=4), ev("QUEUED", 6, 0, 1.25, reason="new"),
                             ev("SCHEDULED", 6, 1, 1.75, is_prefill=True), ev("FIRST_TOKEN", 6, 1, 2.0, index=0),
                             ev("SCHEDULED", 6, 2, 2.1, is_prefill=False), ev("TOKEN", 6, 2, 2.5, index=1),
                             ev("SCHEDULED", 6, 3, 2.6, is_prefill=False), ev("TOKEN", 6, 3, 3.0, index=2),
                             ev("FINISHED", 6, 3, 3.0, reason="length", num_output_tokens=3), ev("FREED", 6, 3, 3.0)],
    # aborted mid-decode after two tokens: TPOT still ends at FINISHED (the abort), not at the last token
    "aborted_after_two_tokens": [ev("ARRIVED", 7, 0, 2.0, prompt_len=5), ev("QUEUED", 7, 0, 2.0, reason="new"),
                                 ev("SCHEDULED", 7, 0, 2.25, is_prefill=True), ev("FIRST_TOKEN", 7, 0, 2.5, index=0),
                                 ev("SCHEDULED", 7, 1, 2.6, is_prefill=False), ev("TOKEN", 7, 1, 3.0, index=1),
                                 ev("FINISHED", 7, 4, 4.5, reason="abort", num_output_tokens=2),
                                 ev("FREED", 7, 4, 4.5)],
}


@pytest.mark.parametrize("story", sorted(EDGE_STORIES))
def test_request_metrics_at_the_edges(observe, story):
    metrics = module("metrics").request_metrics(EDGE_STORIES[story])
    observe("metrics", {str(k): dataclasses.asdict(v) for k, v in metrics.items()})
