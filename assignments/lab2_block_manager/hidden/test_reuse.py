"""Hidden lab 2 tests: freed blocks, revived hits and reuse (docs/design.md §2, edge cases 2, 3 and 4).

A freed block keeps its hash until it is handed out again; then the old hash
entry must go, or a later prompt would hit someone else's K/V.
"""
from __future__ import annotations

from _inferlab_support import Blocks, tokens


def test_freed_prefix_is_revived(observe):
    """A hit on a block in the free list takes it out of the free list and costs a free block."""
    lab = Blocks(4)
    bm = lab.manager(6)
    a = lab.seq(tokens(0, 9))
    lab.prefill(bm, a)
    bm.deallocate(a)
    observe("after free", lab.snapshot(bm, {"a": a}))
    b = lab.seq(tokens(0, 9) + [77])
    observe("cached for b", bm.num_cached_tokens(b))
    observe("can_allocate b", bm.can_allocate(b))
    bm.allocate(b)
    observe("after b", lab.snapshot(bm, {"b": b}))


def test_revived_hits_count_against_the_pool(observe):
    """can_allocate must count revived blocks: here the hits fit but the whole prompt does not."""
    lab = Blocks(4)
    bm = lab.manager(5)
    a = lab.seq(tokens(0, 13))                   # 4 blocks, 3 of them full and hashed
    lab.prefill(bm, a)
    bm.deallocate(a)
    hog = lab.seq(tokens(500, 4))
    lab.prefill(bm, hog)                         # takes the least recently freed block
    b = lab.seq(tokens(0, 12) + tokens(800, 5))  # 3 hits in the free list + 2 new blocks
    observe("free before b", bm.num_free_blocks)
    observe("cached for b", bm.num_cached_tokens(b))
    observe("can_allocate b", bm.can_allocate(b))
    c = lab.seq(tokens(0, 12) + tokens(800, 1))  # 3 revived hits + 1 new block: fits exactly
    observe("can_allocate c", bm.can_allocate(c))
    bm.allocate(c)
    observe("after c", lab.snapshot(bm, {"hog": hog, "c": c}))


def test_reused_block_loses_its_old_hash(observe):
    """Edge case 2: once a freed block is handed out for new content, the old prefix no longer hits."""
    lab = Blocks(4)
    bm = lab.manager(4)
    a = lab.seq(tokens(0, 9))
    lab.prefill(bm, a)
    bm.deallocate(a)
    b = lab.seq(tokens(300, 16))                 # takes every block, overwriting a's
    lab.prefill(bm, b)
    observe("after b", lab.snapshot(bm, {"b": b}))
    bm.deallocate(b)
    c = lab.seq(tokens(0, 9))
    observe("cached for c", bm.num_cached_tokens(c))
    lab.prefill(bm, c)
    observe("after c", lab.snapshot(bm, {"c": c}))
    d = lab.seq(tokens(300, 16))
    observe("cached for d", bm.num_cached_tokens(d))


def test_eviction_prefers_least_recently_freed(observe):
    """The most recently freed prefix stays hittable longest."""
    lab = Blocks(4)
    bm = lab.manager(6)
    old, new = lab.seq(tokens(0, 9)), lab.seq(tokens(100, 9))
    lab.prefill(bm, old)
    lab.prefill(bm, new)
    bm.deallocate(old)
    bm.deallocate(new)
    filler = lab.seq(tokens(900, 8))             # needs 2 blocks from the free list
    lab.prefill(bm, filler)
    observe("filler", lab.snapshot(bm, {"filler": filler}))
    observe("cached old", bm.num_cached_tokens(lab.seq(tokens(0, 9))))
    observe("cached new", bm.num_cached_tokens(lab.seq(tokens(100, 9))))


def test_preempted_sequence_reprefills_from_the_cache(observe):
    """Edge cases 3 and 4: preemption frees every block and forgets computed tokens; re-prefill hits the cache."""
    lab = Blocks(4)
    bm = lab.manager(8)
    seq = lab.seq(tokens(0, 10))
    lab.prefill(bm, seq)
    for t in (11, 12, 13):
        lab.decode(bm, seq, t)
    observe("before preemption", lab.snapshot(bm, {"seq": seq}))
    observe("freed", bm.deallocate(seq))
    observe("after preemption", lab.snapshot(bm, {"seq": seq}))
    observe("can_allocate again", bm.can_allocate(seq))
    bm.allocate(seq)
    observe("re-prefill", lab.snapshot(bm, {"seq": seq}))
    bm.mark_computed(seq, len(seq) - seq.num_cached_tokens)
    observe("recomputed", lab.snapshot(bm, {"seq": seq}))


def test_reuse_keeps_the_hash_entry_another_block_owns(observe):
    """Edge case 2 turned around: b's freed blocks are reused, but the prompt's hash entries point at a's
    blocks (a published last), so a later copy of the prompt still hits a's blocks."""
    lab = Blocks(4)
    bm = lab.manager(11)
    prompt = tokens(80, 9)
    a, b = lab.seq(prompt), lab.seq(prompt)
    bm.allocate(a)
    bm.allocate(b)
    bm.mark_computed(b, len(b))
    bm.mark_computed(a, len(a))
    bm.deallocate(b)
    d = lab.seq(tokens(600, 26))                     # seven blocks: the five free ones, then b's 5 and 4
    bm.allocate(d)
    c = lab.seq(prompt + [3])
    observe("cached for c", bm.num_cached_tokens(c))
    bm.allocate(c)
    observe("after c", lab.snapshot(bm, {"a": a, "c": c, "d": d}))
