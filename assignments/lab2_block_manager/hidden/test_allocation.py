"""Hidden lab 2 tests: allocation, free-list order and block boundaries (docs/design.md §2, edge cases 3, 5, 7).

Observation only: the grader compares what these record with the reference's record.
"""
from __future__ import annotations

import pytest

from _inferlab_support import Blocks, tokens


@pytest.mark.parametrize("block_size", [3, 4])
@pytest.mark.parametrize("prompt_len", [1, 2, 5, 6, 7, 11, 12, 13])
def test_fresh_allocation(observe, block_size, prompt_len):
    """Edge cases 5 and 7: ceil(len / B) blocks in pool order, ref_count 1, nothing cached."""
    lab = Blocks(block_size)
    bm = lab.manager(6)
    seq = lab.seq(tokens(300, prompt_len))
    observe("can_allocate", bm.can_allocate(seq))
    if bm.can_allocate(seq):
        bm.allocate(seq)
    observe("after allocate", lab.snapshot(bm, {"seq": seq}))


@pytest.mark.parametrize("free_blocks", [1, 2, 3])
def test_can_allocate_at_the_edge(observe, free_blocks):
    """Edge case 5: a prompt needing exactly the free blocks fits; one token more does not."""
    lab = Blocks(4)
    bm = lab.manager(5, caching=False)
    holders = []
    for i in range(5 - free_blocks):
        holder = lab.seq(tokens(800 + 10 * i, 4))
        bm.allocate(holder)
        holders.append(holder)
    answers = [bool(bm.can_allocate(lab.seq(tokens(0, n)))) for n in range(4 * free_blocks - 1, 4 * free_blocks + 3)]
    observe("answers", answers)


def test_free_list_order(observe):
    """Edge case 7: sequences free last block first; the least recently freed block is reused first."""
    lab = Blocks(4)
    bm = lab.manager(9, caching=False)
    a, b, c = lab.seq(tokens(0, 9)), lab.seq(tokens(100, 5)), lab.seq(tokens(200, 4))
    for s in (a, b, c):
        bm.allocate(s)
    observe("allocated", lab.snapshot(bm, {"a": a, "b": b, "c": c}))
    observe("freed by b", bm.deallocate(b))
    observe("freed by a", bm.deallocate(a))
    observe("after frees", lab.snapshot(bm, {"a": a, "b": b, "c": c}))
    d = lab.seq(tokens(400, 17))
    observe("can_allocate d", bm.can_allocate(d))
    bm.allocate(d)
    observe("after d", lab.snapshot(bm, {"c": c, "d": d}))


def test_deallocate_resets_the_sequence(observe):
    """Edge case 3 (the block manager's part): after deallocate nothing of the sequence is held or computed."""
    lab = Blocks(4)
    bm = lab.manager(6)
    seq = lab.seq(tokens(50, 6))
    lab.prefill(bm, seq)
    for t in (7, 8, 9):
        lab.decode(bm, seq, t)
    observe("before", lab.snapshot(bm, {"seq": seq}))
    observe("freed", bm.deallocate(seq))
    observe("after", lab.snapshot(bm, {"seq": seq}))


def test_allocate_fills_the_pool_exactly(observe):
    """Every block handed out once, and the pool refuses the next prompt."""
    lab = Blocks(2)
    bm = lab.manager(7, caching=False)
    seqs = {}
    for i, n in enumerate([3, 4, 1, 5]):
        s = lab.seq(tokens(20 * i, n))
        observe(f"can_allocate {i}", bm.can_allocate(s))
        if bm.can_allocate(s):
            bm.allocate(s)
            seqs[str(i)] = s
    observe("full", lab.snapshot(bm, seqs))
