"""Hidden lab 3 tests (stretch): chunked prefill (docs/design.md §2, edge case 9, the scheduler's part).

A prompt larger than the budget is computed in budget-sized chunks; running
prompts mid-prefill get their next chunk before anyone new is admitted; an
incomplete chunk samples nothing.
"""
from __future__ import annotations

from _inferlab_support import SchedulerDriver, tokens


def test_long_prompt_in_chunks(observe):
    sim = SchedulerDriver(num_blocks=32, max_num_batched_tokens=8, max_model_len=64, chunked=True)
    sim.add("long", tokens(0, 27), max_tokens=3)
    sim.add("short", tokens(500, 4), max_tokens=2)
    sim.run(observe)


def test_two_prompts_share_the_budget(observe):
    sim = SchedulerDriver(num_blocks=32, max_num_batched_tokens=10, max_model_len=64, chunked=True)
    sim.add("a", tokens(0, 14), max_tokens=2)
    sim.add("b", tokens(100, 13), max_tokens=2)
    sim.add("c", tokens(200, 5), max_tokens=2)
    sim.run(observe)


def test_no_zero_token_chunk_once_the_budget_is_spent(observe):
    """The first prompt spends the whole budget: nobody else is admitted with an empty chunk that step."""
    sim = SchedulerDriver(num_blocks=32, max_num_batched_tokens=8, max_model_len=64, chunked=True)
    sim.add("fills", tokens(0, 8), max_tokens=2)
    sim.add("next", tokens(100, 4), max_tokens=2)
    sim.add("long", tokens(200, 11), max_tokens=2)
    sim.run(observe)
