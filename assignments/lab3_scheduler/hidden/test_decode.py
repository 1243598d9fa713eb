"""Hidden lab 3 tests: decode batches and preemption by recompute (docs/design.md §2, edge cases 3 and 4).

The newest running request gives way; it is requeued at the front with
status WAITING; a sequence with nobody left to evict preempts itself and is
not scheduled; decode order is kept from step to step.
"""
from __future__ import annotations

from _inferlab_support import SchedulerDriver, tokens


def test_decode_order_is_stable(observe):
    sim = SchedulerDriver(num_blocks=32, max_num_seqs=4)
    for i, name in enumerate("abcd"):
        sim.add(name, tokens(30 * i, 3 + i), max_tokens=4 + i)
    sim.run(observe)


def test_decode_batch_respects_the_token_budget(observe):
    """With chunked prefill a tiny token budget is legal; a decode step then takes at most that many sequences."""
    sim = SchedulerDriver(num_blocks=32, max_num_seqs=6, max_num_batched_tokens=3, chunked=True)
    for i, name in enumerate("abcde"):
        sim.add(name, tokens(30 * i, 2), max_tokens=3)
    sim.run(observe)


def test_newest_is_preempted_and_requeued_first(observe):
    """Four prompts of two blocks in a pool of nine: when b needs a third block, d (newest) gives way, not c."""
    sim = SchedulerDriver(num_blocks=9, max_num_seqs=4)
    for i, name in enumerate("abcd"):
        sim.add(name, tokens(100 * i, 5), max_tokens=8)
    sim.add("late", tokens(900, 3), max_tokens=2)
    sim.run(observe, max_steps=60)


def test_a_lone_sequence_preempts_itself(observe):
    """Edge case 3: nobody else to evict; the sequence frees its own blocks and is not scheduled this step."""
    sim = SchedulerDriver(num_blocks=3, max_num_seqs=2)
    sim.add("a", tokens(0, 7), max_tokens=3)
    sim.add("b", tokens(400, 3), max_tokens=8)
    sim.run(observe, max_steps=30)


def test_preempted_prefix_hits_on_reprefill(observe):
    """Edge case 4: after preemption the re-prefill finds its own earlier blocks in the cache."""
    sim = SchedulerDriver(num_blocks=8, max_num_seqs=3)
    sim.add("a", tokens(0, 9), max_tokens=6)
    sim.add("b", tokens(200, 9), max_tokens=6)
    sim.run(observe, max_steps=40)


def test_a_request_preempted_twice_counts_both(observe):
    """num_preemptions counts every preemption: c gives way twice (block size 2, six blocks)."""
    sim = SchedulerDriver(num_blocks=6, block_size=2, max_num_seqs=3, max_num_batched_tokens=16, max_model_len=16)
    for i, (name, max_tokens) in enumerate(zip("abcd", (3, 6, 6, 3))):
        sim.add(name, tokens(37 * i + 1, 3), max_tokens=max_tokens)
    sim.run(observe, max_steps=30)


def test_eviction_goes_on_while_the_victim_frees_no_block(observe):
    """r shares both of v's blocks and is retired (its last token in flight), so it keeps them: evicting v
    frees nothing, and a, still without a slot and with nobody left to evict, preempts itself; b decodes."""
    sim = SchedulerDriver(num_blocks=6, block_size=2, max_num_seqs=4)
    sim.add("b", tokens(300, 3), max_tokens=5)
    sim.add("a", tokens(0, 2), max_tokens=5)
    sim.add("v", tokens(100, 4), max_tokens=5)
    observe("first step", sim.step())
    sim.add("r", tokens(100, 4) + [7], max_tokens=5)
    observe("second step", sim.step())
    sim.scheduler.retire(sim.seqs["r"])
    try:
        observe("third step", sim.step())
    except Exception as err:  # noqa: BLE001 - the failure is the observation
        observe("third step", {"raised": type(err).__name__})
        return
    sim.scheduler.finish(sim.seqs["r"])
    sim.run(observe, max_steps=30)
