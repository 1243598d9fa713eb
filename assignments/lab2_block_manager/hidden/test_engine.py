"""Hidden lab 2 tests: the block manager inside the whole engine (tiny model, CPU).

Block tables after every step, scheduling decisions, greedy tokens and the
lifecycle log (times dropped) are observed and compared step by step with the
reference. The workloads are fixed; the KV pools are tight enough to force
preemption, prefix hits after preemption (docs/design.md §2, edge case 4) and a
refused request (edge case 8).
"""
from __future__ import annotations

from _inferlab_support import drive_engine, shared_prefix_workload, tokens

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def _preemption_workload():
    """Four requests sharing an 8-token prefix, long outputs, a pool too small for all of them at once."""
    prefix = tokens(100, 8)
    requests = [(prefix + tokens(200 + 10 * i, 3 + i), {**GREEDY, "max_tokens": 10 + 2 * i}) for i in range(4)]
    requests.append((tokens(600, 90), {**GREEDY, "max_tokens": 4}))   # needs more than the whole pool: refused
    requests.append((prefix + tokens(700, 1), {**GREEDY, "max_tokens": 3}))
    return requests


def test_engine_block_tables_with_preemption(observe):
    drive_engine(_preemption_workload(), observe, log=False, kvcache_block_size=4, num_kvcache_blocks=14,
               max_num_seqs=4, max_num_batched_tokens=256, max_model_len=128)


def test_engine_lifecycle_log(observe):
    drive_engine(_preemption_workload(), observe, blocks=False, kvcache_block_size=4, num_kvcache_blocks=14,
               max_num_seqs=4, max_num_batched_tokens=256, max_model_len=128)


def test_engine_prefix_sharing_without_pressure(observe):
    """Plenty of blocks: every shared prefix is computed once and then hit."""
    requests = shared_prefix_workload(seed=5, n=16, prefixes=2, prefix_len=9, max_prompt=7, max_tokens=5)
    drive_engine(requests, observe, log=False, kvcache_block_size=4, num_kvcache_blocks=64, max_num_seqs=6,
               max_num_batched_tokens=256, max_model_len=128)


def test_scale_200_requests_tight_pool(observe):
    """200 requests of mixed lengths with shared prefixes against a tight KV pool."""
    requests = shared_prefix_workload(seed=11, n=200, prefixes=4, prefix_len=12, max_prompt=28, max_tokens=12)
    drive_engine(requests, observe, log=False, kvcache_block_size=4, num_kvcache_blocks=40, max_num_seqs=12,
               max_num_batched_tokens=256, max_model_len=128)
