"""Hidden lab 1 tests: the lifecycle log of the real engine (tiny model), compared step by step.

Times are dropped from the compared lines; whether the log's times agree with
the engine's own timestamps (Sequence.arrival_time and friends) and never go
backwards is observed separately, as booleans, because those do not change
from run to run.
"""
from __future__ import annotations

from _inferlab_support import log_line, drive_engine, shared_prefix_workload, timestamps_agree, times_never_go_back
from _inferlab_support import tokens

GREEDY = {"temperature": 0.0, "ignore_eos": True}
ROOMY = dict(kvcache_block_size=4, num_kvcache_blocks=64, max_num_seqs=4, max_num_batched_tokens=256,
             max_model_len=128)
TIGHT = dict(kvcache_block_size=4, num_kvcache_blocks=12, max_num_seqs=4, max_num_batched_tokens=256,
             max_model_len=128)


def _mixed():
    """Six requests: one output token, several, a shared prefix, more requests than seats."""
    prefix = tokens(300, 8)
    return [(prefix + tokens(10 * i, 2 + i), {**GREEDY, "max_tokens": [1, 4, 2, 6, 3, 1][i]}) for i in range(6)]


def test_log_of_a_mixed_batch(observe):
    engine, ids = drive_engine(_mixed(), observe, blocks=False, **ROOMY)
    observe("times agree with the engine", timestamps_agree(engine, ids))
    observe("times never go back", times_never_go_back(engine.log.events))


def test_log_with_preemption_and_aborts(observe):
    """A pool too small for all four: preemption (PREEMPTED, QUEUED again); one abort while waiting, one running."""
    requests = [(tokens(40 * i, 6 + i), {**GREEDY, "max_tokens": 12}) for i in range(4)]
    requests += [(tokens(700, 5), {**GREEDY, "max_tokens": 8}), (tokens(800, 3), {**GREEDY, "max_tokens": 8})]
    engine, ids = drive_engine(requests, observe, blocks=False, aborts={2: [5], 6: [0]}, **TIGHT)
    observe("times agree with the engine", timestamps_agree(engine, [i for k, i in enumerate(ids) if k not in (0, 5)]))
    observe("times never go back", times_never_go_back(engine.log.events))


def test_step_events(observe):
    """Only the STEP events of a busier run: batch size, tokens computed, queue lengths, KV blocks in use."""
    requests = shared_prefix_workload(seed=3, n=20, prefixes=2, prefix_len=8, max_prompt=12, max_tokens=6)
    engine, _ = drive_engine(requests, observe, blocks=False, log=False, **TIGHT)
    observe("STEP lines", [log_line(e) for e in engine.log.events if e.get("event") == "STEP"])


def test_scale_log_50_requests(observe):
    requests = shared_prefix_workload(seed=21, n=50, prefixes=3, prefix_len=8, max_prompt=10, max_tokens=4)
    engine, ids = drive_engine(requests, observe, blocks=False,
                             **{**TIGHT, "num_kvcache_blocks": 24, "max_num_seqs": 8})
    observe("times agree with the engine", timestamps_agree(engine, ids))
