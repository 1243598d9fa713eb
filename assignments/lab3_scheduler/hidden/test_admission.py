"""Hidden lab 3 tests: admission (prefill first, first come first served, seats, token budget, KV blocks).

Schedules are observed step by step with the reference block manager and a
fake model; docs/design.md §2, edge cases 1 and 8 at the scheduler's level.
"""
from __future__ import annotations

from _inferlab_support import SchedulerDriver, tokens


def test_seats_limit_admission(observe):
    sim = SchedulerDriver(num_blocks=32, max_num_seqs=2)
    for i, name in enumerate("abcd"):
        sim.add(name, tokens(50 * i, 5), max_tokens=3)
    sim.run(observe)


def test_token_budget_and_no_overtaking(observe):
    """c would fit the budget left, but b is first in line and does not: nobody overtakes b."""
    sim = SchedulerDriver(num_blocks=32, max_num_batched_tokens=20, max_model_len=20)
    sim.add("a", tokens(0, 12), max_tokens=2)
    sim.add("b", tokens(100, 10), max_tokens=2)
    sim.add("c", tokens(200, 3), max_tokens=2)
    sim.add("d", tokens(300, 6), max_tokens=2)
    sim.run(observe)


def test_kv_blocks_limit_admission(observe):
    """Seats and budget to spare, but the pool holds only two of the prompts at once."""
    sim = SchedulerDriver(num_blocks=6, max_num_seqs=8)
    for i, name in enumerate("abc"):
        sim.add(name, tokens(40 * i, 9), max_tokens=2)
    sim.run(observe)


def test_cache_hits_lower_the_cost(observe):
    """A prompt mostly in the prefix cache costs only its uncached tokens against the budget."""
    sim = SchedulerDriver(num_blocks=32, max_num_batched_tokens=20, max_model_len=20)
    sim.add("warm", tokens(0, 17), max_tokens=1)
    sim.run(observe)
    sim.add("a", tokens(500, 10), max_tokens=2)
    sim.add("b", tokens(0, 16) + [999], max_tokens=2)      # 16 tokens cached: costs 1 + ... not 17
    sim.run(observe)


def test_fully_cached_prompt_still_computes_a_token(observe):
    """Edge case 1: the same prompt again hits the cache, yet its prefill computes at least one token."""
    sim = SchedulerDriver(num_blocks=16)
    sim.add("first", tokens(0, 8), max_tokens=1)
    sim.run(observe)
    sim.add("again", tokens(0, 8), max_tokens=2)
    sim.run(observe)


def test_prompt_exactly_filling_the_budget_is_admitted(observe):
    """A prompt costing exactly the budget left fits (<=, not <): six tokens, then ten of the 16 left."""
    sim = SchedulerDriver(num_blocks=32, max_num_batched_tokens=16, max_model_len=16)
    sim.add("six", tokens(0, 6), max_tokens=2)
    sim.add("ten", tokens(100, 10), max_tokens=2)
    sim.add("rest", tokens(200, 4), max_tokens=2)
    sim.run(observe)
