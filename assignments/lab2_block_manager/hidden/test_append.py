"""Hidden lab 2 tests: decode appends at block boundaries (docs/design.md §2, edge case 5).

A new block is needed exactly when the next token starts a block.
"""
from __future__ import annotations

import pytest

from _inferlab_support import Blocks, tokens


@pytest.mark.parametrize("block_size", [2, 4])
@pytest.mark.parametrize("prompt_len", [3, 4, 5, 8])
def test_decode_across_block_boundaries(observe, block_size, prompt_len):
    lab = Blocks(block_size)
    bm = lab.manager(8)
    seq = lab.seq(tokens(70, prompt_len))
    lab.prefill(bm, seq)
    steps = []
    for t in range(2 * block_size + 1):
        room = lab.decode(bm, seq, 500 + t)
        steps.append([len(seq), room, list(seq.block_table), bm.num_free_blocks])
    observe("decode steps", steps)


def test_can_append_when_the_pool_is_empty(observe):
    """No free block: a token that fits in the last block may still be appended; one that starts a block may not."""
    lab = Blocks(4)
    bm = lab.manager(2, caching=False)
    seq = lab.seq(tokens(10, 6))
    bm.allocate(seq)
    bm.mark_computed(seq, 6)
    answers = []
    for t in range(4):
        seq.append_token(900 + t)
        ok = bool(bm.can_append(seq))
        answers.append([len(seq), ok])
        if not ok:
            break
        bm.may_append(seq)
        bm.mark_computed(seq, 1)
    observe("answers", answers)
    observe("table", list(seq.block_table))


def test_may_append_only_adds_at_a_boundary(observe):
    """Calling may_append for every decode token adds exactly ceil(len / B) - blocks held blocks."""
    lab = Blocks(3)
    bm = lab.manager(10, caching=False)
    seq = lab.seq(tokens(0, 1))
    lab.prefill(bm, seq)
    lengths = []
    for t in range(10):
        seq.append_token(t)
        bm.may_append(seq)
        bm.mark_computed(seq, 1)
        lengths.append(len(seq.block_table))
    observe("blocks held after each token", lengths)
    observe("free", bm.num_free_blocks)


def test_decode_at_block_size_one(observe):
    """Edge case 5 at its extreme: at block size 1 every token starts a block, until the pool runs out."""
    lab = Blocks(1)
    bm = lab.manager(10)
    seq = lab.seq(tokens(40, 3))
    lab.prefill(bm, seq)
    steps = []
    for t in range(9):
        room = lab.decode(bm, seq, 600 + t)
        steps.append([len(seq), room, list(seq.block_table), bm.num_free_blocks])
        if not room:
            break
    observe("decode steps", steps)
