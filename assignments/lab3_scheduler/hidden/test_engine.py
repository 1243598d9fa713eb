"""Hidden lab 3 tests: the scheduler inside the whole engine (tiny model, CPU).

Scheduling decisions and block tables after every step, greedy tokens and
the lifecycle log are compared with the reference, on fixed workloads:
a tight pool (preemption, requests that can never fit: edge case 8), and
200 requests at scale.
"""
from __future__ import annotations

from _inferlab_support import drive_engine, shared_prefix_workload, tokens

GREEDY = {"temperature": 0.0, "ignore_eos": True}


def _pressure():
    requests = [(tokens(60 * i, 5 + 2 * i), {**GREEDY, "max_tokens": 9 + i}) for i in range(5)]
    requests.insert(2, (tokens(900, 70), {**GREEDY, "max_tokens": 4}))      # longer than the pool: refused
    requests.append((tokens(950, 130), {**GREEDY, "max_tokens": 2}))         # longer than max_model_len: refused
    return requests


CONFIG = dict(kvcache_block_size=4, num_kvcache_blocks=16, max_num_seqs=3, max_num_batched_tokens=128,
              max_model_len=128)


def test_engine_schedule_under_pressure(observe):
    drive_engine(_pressure(), observe, log=False, **CONFIG)


def test_engine_log_under_pressure(observe):
    drive_engine(_pressure(), observe, blocks=False, **CONFIG)


def test_engine_chunked_prefill(observe):
    """Stretch: chunked prefill in the engine (a sampled token only when a prompt's last chunk is done)."""
    requests = [(tokens(20 * i, 9 + 7 * i), {**GREEDY, "max_tokens": 4}) for i in range(4)]
    drive_engine(requests, observe, **{**CONFIG, "max_num_batched_tokens": 12, "enable_chunked_prefill": True,
                                    "num_kvcache_blocks": 40})


def test_scale_200_requests(observe):
    requests = shared_prefix_workload(seed=17, n=200, prefixes=4, prefix_len=8, max_prompt=24, max_tokens=10)
    drive_engine(requests, observe, log=False, **{**CONFIG, "num_kvcache_blocks": 36, "max_num_seqs": 10,
                                               "max_num_batched_tokens": 96, "max_model_len": 96})
