"""The block manager's code outside the lab 2 regions, with no model.

The rules students write (lab 2's regions: allocation, free order, block
boundaries, reference counts, prefix hits, stale hashes; docs/design.md §2 edge
cases 1, 2, 5 and 7) are tested in one place, the public suite
`assignments/lab2_block_manager/public/test_lab2_block_manager.py`, which CI
runs on the reference (docs/workflows.md lists each rule's home). This file
keeps what no student writes: `Block.reset` and the remembered prefix lookup
that the three admission questions share.

Sequences are built by hand and "computed" by calling `mark_computed`, exactly
as the engine's postprocess does after a forward pass; expected values are
worked out here from the rules in the module docstrings.
"""
from __future__ import annotations

from reference.engine.block_manager import BlockManager
from reference.engine.sequence import Sequence
from reference.sampling_params import SamplingParams


def make_seq(token_ids: list[int], block_size: int) -> Sequence:
    return Sequence(token_ids, SamplingParams(temperature=0.0), block_size)


def test_block_reset_clears_stale_ref_count():
    """`Block.reset` (called by lab2.take_free_block): a reused block starts at ref_count 1, whatever it held."""
    bm = BlockManager(1, 4)
    bm.blocks[0].ref_count = 5           # garbage a buggy reset would carry over
    seq = make_seq([1, 2], 4)
    bm.allocate(seq)
    assert bm.blocks[0].ref_count == 1


def test_remembered_prefix_lookup_follows_the_cache():
    """One admission looks its prefix up once; asking again after the cache changed sees the change.

    The same b (same object, same length) is asked before a's blocks are
    computed (no hit), after (two hits), and after a's freed blocks were handed
    out again to a growing d, which drops their hashes (no hit). No other
    sequence is looked up in between, so only forgetting the lookup when the
    cache changes can get these right.
    """
    bm = BlockManager(8, 4)
    a, b, d = make_seq(list(range(1, 10)), 4), make_seq(list(range(1, 10)), 4), make_seq([50, 51, 52, 53], 4)
    bm.allocate(a)                                       # blocks 0, 1, 2
    bm.allocate(d)                                       # block 3
    assert bm.num_cached_tokens(b) == 0
    bm.mark_computed(a, 9)                               # publishes blocks 0 and 1
    assert bm.num_cached_tokens(b) == 8 and bm.can_allocate(b)
    bm.deallocate(a)                                     # free list: 4 5 6 7 2 1 0; hashes kept
    assert bm.num_cached_tokens(b) == 8
    for token in range(60, 88):                          # d grows to 32 tokens: takes all 7 free blocks
        d.append_token(token)
        bm.may_append(d)
    assert bm.num_free_blocks == 0
    assert bm.num_cached_tokens(b) == 0 and not bm.can_allocate(b)
