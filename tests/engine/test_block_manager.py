"""Unit tests for `reference.engine.block_manager`, with no model.

Sequences are built by hand and "computed" by calling `mark_computed`, exactly
as the engine's postprocess does after a forward pass. Expected block counts,
orders and reference counts are worked out here from the rules in the module
docstrings (ceil arithmetic, least-recently-freed first), never read back from
the code under test. Numbers in docstrings refer to docs/design.md §2, "Edge cases".
"""
from __future__ import annotations

import copy
import random

import pytest

from reference.engine.block_manager import BlockManager, chain_hash
from reference.engine.sequence import Sequence
from reference.sampling_params import SamplingParams


def make_seq(token_ids: list[int], block_size: int) -> Sequence:
    return Sequence(token_ids, SamplingParams(temperature=0.0), block_size)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def prefill(bm: BlockManager, seq: Sequence) -> None:
    """Allocate and compute every uncomputed token, as one whole prefill step would."""
    bm.allocate(seq)
    bm.mark_computed(seq, len(seq) - seq.num_cached_tokens)


def held_counts(bm: BlockManager, holders: list[Sequence]) -> list[int]:
    """How many of `holders` hold each physical block (the ref_count each block should have)."""
    counts = [0] * len(bm.blocks)
    for seq in holders:
        for block_id in seq.block_table:
            counts[block_id] += 1
    return counts


# -- 1. whole prompt hits the prefix cache ------------------------------------------

@pytest.mark.parametrize("block_size, extra", [(1, 0), (4, 0), (4, 1), (4, 3), (16, 0), (16, 5)])
def test_whole_prompt_cached_still_computes_at_least_one_token(block_size, extra):
    """DESIGN 1: an identical second prompt never gets zero tokens to compute.

    extra == 0: the prompt is block-aligned; otherwise it ends in a partial block.
    """
    n_full = 3
    prompt = [100 + i for i in range(n_full * block_size + extra)]
    bm = BlockManager(32, block_size)
    first = make_seq(prompt, block_size)
    prefill(bm, first)

    second = make_seq(prompt, block_size)
    bm.allocate(second)
    assert second.num_cached_tokens < len(second)
    assert len(second) - second.num_cached_tokens >= 1
    if extra == 0:
        # Block-aligned: the last full block is recomputed in a block of its own.
        assert second.num_cached_tokens == (n_full - 1) * block_size
        assert second.block_table[:n_full - 1] == first.block_table[:n_full - 1]
        assert second.block_table[-1] != first.block_table[-1]
        assert bm.blocks[second.block_table[-1]].ref_count == 1
        assert bm.blocks[first.block_table[-1]].ref_count == 1
    else:
        # Every full block is shared; only the partial tail is computed.
        assert second.num_cached_tokens == n_full * block_size
        assert len(second) - second.num_cached_tokens == extra
        assert second.block_table[:n_full] == first.block_table[:n_full]
        assert second.block_table[-1] != first.block_table[-1]
    assert len(second.block_table) == ceil_div(len(prompt), block_size)


def test_prompt_of_exactly_one_block_gets_no_hit():
    """DESIGN 1: a one-block prompt that is fully cached is recomputed entirely."""
    bm = BlockManager(4, 4)
    prefill(bm, make_seq([1, 2, 3, 4], 4))
    again = make_seq([1, 2, 3, 4], 4)
    assert bm.num_cached_tokens(again) == 0
    bm.allocate(again)
    assert again.num_cached_tokens == 0


# -- 2. stale hashes after reuse ----------------------------------------------------

def test_freed_block_keeps_hash_and_can_be_revived():
    """DESIGN 2 (first half): a freed, not yet reused block is still a prefix hit."""
    bm = BlockManager(6, 4)
    prompt = list(range(1, 10))             # 9 tokens: two full blocks and one token
    a = make_seq(prompt, 4)
    prefill(bm, a)
    old_table = list(a.block_table)
    bm.deallocate(a)
    assert bm.num_free_blocks == 6

    again = make_seq(prompt, 4)
    bm.allocate(again)
    assert again.num_cached_tokens == 8
    assert again.block_table[:2] == old_table[:2]
    for block_id in old_table[:2]:
        assert block_id not in bm.free_block_ids      # revived: out of the free list
        assert bm.blocks[block_id].ref_count == 1
    assert bm.num_free_blocks == 6 - 3


def test_reused_block_loses_old_hash_no_stale_hit():
    """DESIGN 2: a freed block handed out for new content must not be hit for its old content.

    The new owner writes *the same tokens* into the reused block but after a
    different first block, so the block's tokens match the old ones while its
    K/V (which depend on the whole prefix) do not. Only the dropped hash entry
    prevents a wrong hit.
    """
    bm = BlockManager(3, 4)
    a_prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    a = make_seq(a_prompt, 4)
    prefill(bm, a)
    assert a.block_table == [0, 1, 2]        # a fresh pool hands out ids in order
    h0 = chain_hash([1, 2, 3, 4], None)
    h1 = chain_hash([5, 6, 7, 8], h0)
    assert bm.hash_to_block.get(h0) == 0 and bm.hash_to_block.get(h1) == 1
    bm.deallocate(a)                         # frees 2, then 1, then 0

    c = make_seq([11, 12, 13, 14, 5, 6, 7, 8], 4)
    prefill(bm, c)
    # Least recently freed first: c gets block 2 then block 1; block 0 stays cached.
    assert c.block_table == [2, 1]
    assert bm.blocks[1].token_ids == [5, 6, 7, 8]
    assert bm.hash_to_block.get(h1) != 1     # the old entry for block 1 is gone
    assert bm.hash_to_block.get(h0) == 0     # block 0 was never reused

    again = make_seq(a_prompt, 4)
    assert bm.num_cached_tokens(again) == 4  # block 0 only; block 1 now holds c's K/V
    bm.deallocate(c)                         # block 1 free again, still with c's content
    assert bm.num_cached_tokens(again) == 4
    bm.allocate(again)
    assert again.num_cached_tokens == 4
    assert again.block_table[0] == 0
    assert bm.blocks[again.block_table[1]].hash is None   # freshly taken, to be recomputed


def test_reused_block_hash_dropped_even_when_never_refilled():
    """DESIGN 2: taking a cached block out of the free list drops its hash entry at once."""
    bm = BlockManager(2, 2)
    a = make_seq([1, 2, 3], 2)
    prefill(bm, a)
    h0 = chain_hash([1, 2], None)
    assert bm.hash_to_block.get(h0) == a.block_table[0]
    cached_block = a.block_table[0]
    bm.deallocate(a)
    # Both blocks must go to a new, different prompt.
    b = make_seq([7, 8, 9], 2)
    bm.allocate(b)
    assert cached_block in b.block_table
    assert h0 not in bm.hash_to_block
    assert bm.blocks[cached_block].hash is None


# -- 5. block boundaries ---------------------------------------------------------

@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("offset", [-1, 0, 1])
def test_block_boundaries_allocate_and_may_append(block_size, offset):
    """DESIGN 5: prompt length kB-1, kB, kB+1; a block is added exactly when a token starts one."""
    k = 3
    length = k * block_size + offset
    bm = BlockManager(64, block_size, enable_prefix_caching=False)
    seq = make_seq(list(range(length)), block_size)
    bm.allocate(seq)
    assert len(seq.block_table) == ceil_div(length, block_size)
    tail = length % block_size
    assert seq.last_block_num_tokens == (tail if tail else block_size)
    bm.mark_computed(seq, length)

    # Decode 2*B+1 tokens so that every offset inside a block is crossed.
    for step in range(2 * block_size + 1):
        seq.append_token(999)
        new_pos = len(seq) - 1                       # the token this decode step computes
        before = len(seq.block_table)
        assert bm.can_append(seq)
        bm.may_append(seq)
        starts_block = new_pos % block_size == 0
        assert len(seq.block_table) == before + (1 if starts_block else 0), (step, new_pos)
        assert len(seq.block_table) == new_pos // block_size + 1
        tail = len(seq) % block_size
        assert seq.last_block_num_tokens == (tail if tail else block_size)
        bm.mark_computed(seq, 1)
        assert seq.num_cached_tokens == len(seq)


def test_can_append_needs_a_free_block_only_at_block_start():
    """DESIGN 5: with no free block, decode can continue until the last block is full."""
    bm = BlockManager(2, 4, enable_prefix_caching=False)
    seq = make_seq([1, 2, 3, 4, 5], 4)      # 2 blocks, the second holds 1 token
    prefill(bm, seq)
    assert bm.num_free_blocks == 0
    for _ in range(3):                       # positions 5, 6, 7 fit in block 1
        seq.append_token(0)
        assert bm.can_append(seq)
        bm.may_append(seq)
        bm.mark_computed(seq, 1)
    seq.append_token(0)                      # position 8 starts block 2
    assert not bm.can_append(seq)


# -- 7. reference counts and free order ----------------------------------------------

def test_allocate_sets_ref_count_one():
    """DESIGN 7: a fresh allocation holds every block exactly once."""
    bm = BlockManager(8, 4)
    seq = make_seq(list(range(10)), 4)
    bm.allocate(seq)
    assert len(seq.block_table) == 3
    for block_id in seq.block_table:
        assert bm.blocks[block_id].ref_count == 1
    assert bm.num_free_blocks == 8 - 3


def test_block_reset_clears_stale_ref_count():
    """DESIGN 7: a reused block starts at ref_count 1, whatever it held before."""
    bm = BlockManager(1, 4)
    bm.blocks[0].ref_count = 5           # garbage a buggy reset would carry over
    seq = make_seq([1, 2], 4)
    bm.allocate(seq)
    assert bm.blocks[0].ref_count == 1


def test_shared_prefix_counts_every_holder():
    """DESIGN 7: N sequences sharing prefix blocks give those blocks ref_count N."""
    bm = BlockManager(16, 4)
    prefix = list(range(1, 9))           # two full blocks
    first = make_seq(prefix + [50], 4)
    prefill(bm, first)
    others = [make_seq(prefix + [60 + i, 61 + i], 4) for i in range(3)]
    for seq in others:
        bm.allocate(seq)
        assert seq.num_cached_tokens == 8
    holders = [first] + others
    shared = first.block_table[:2]
    for block_id in shared:
        assert bm.blocks[block_id].ref_count == len(holders)
    for seq in holders:
        assert bm.blocks[seq.block_table[2]].ref_count == 1
    # Release one holder at a time: the count follows, and shared blocks free last.
    for released, seq in enumerate(holders, start=1):
        bm.deallocate(seq)
        for block_id in shared:
            assert bm.blocks[block_id].ref_count == len(holders) - released
            assert (block_id in bm.free_block_ids) == (released == len(holders))
    assert bm.num_free_blocks == 16


def test_deallocate_returns_number_freed():
    """DESIGN 7: deallocate reports only blocks whose count reached zero."""
    bm = BlockManager(16, 4)
    a = make_seq(list(range(1, 10)), 4)    # 3 blocks
    prefill(bm, a)
    b = make_seq(list(range(1, 9)) + [77, 78], 4)   # shares 2, owns 1
    bm.allocate(b)
    assert bm.deallocate(a) == 1
    assert bm.deallocate(b) == 3
    assert a.block_table == [] and b.block_table == []
    assert a.num_cached_tokens == 0 and b.num_cached_tokens == 0


def test_deallocate_frees_in_reverse_and_least_recently_freed_is_reused_first():
    """DESIGN 7: the last logical block is freed first, so it is handed out first."""
    bm = BlockManager(6, 4, enable_prefix_caching=False)
    a = make_seq(list(range(12)), 4)         # 3 blocks: 0, 1, 2
    bm.allocate(a)
    assert a.block_table == [0, 1, 2]
    bm.deallocate(a)
    # Free list now: the never-used 3, 4, 5, then a's blocks last-first: 2, 1, 0.
    assert list(bm.free_block_ids) == [3, 4, 5, 2, 1, 0]
    b = make_seq(list(range(100, 124)), 4)   # 6 blocks, different content
    bm.allocate(b)
    assert b.block_table == [3, 4, 5, 2, 1, 0]


def test_recently_freed_prefix_survives_longest():
    """DESIGN 7: eviction order keeps the most recently freed cached blocks hittable."""
    bm = BlockManager(4, 2)
    old = make_seq([1, 2, 3], 2)             # blocks 0, 1 (block 0 hashed)
    prefill(bm, old)
    new = make_seq([5, 6, 7], 2)             # blocks 2, 3 (block 2 hashed)
    prefill(bm, new)
    bm.deallocate(old)                       # free list: 1, 0
    bm.deallocate(new)                       # free list: 1, 0, 3, 2
    filler = make_seq([9, 9, 9], 2)          # takes 1 and 0: evicts old's cached block
    bm.allocate(filler)
    assert filler.block_table == [1, 0]
    assert bm.num_cached_tokens(make_seq([1, 2, 3], 2)) == 0
    assert bm.num_cached_tokens(make_seq([5, 6, 7], 2)) == 2


# -- can_allocate ---------------------------------------------------------------------

def test_can_allocate_counts_revived_cached_blocks():
    """can_allocate: a hit on a freed (cached) block still consumes a free block."""
    bm = BlockManager(4, 4)
    a = make_seq(list(range(1, 10)), 4)     # 3 blocks, first two hashed
    prefill(bm, a)
    bm.deallocate(a)                         # all 4 free; 2 of them cached
    fits = make_seq(list(range(1, 9)) + list(range(20, 28)), 4)       # 16 tokens: 4 blocks, 2 hits
    too_big = make_seq(list(range(1, 9)) + list(range(20, 29)), 4)    # 17 tokens: 5 blocks, 2 hits
    assert bm.num_cached_tokens(fits) == 8 and bm.num_cached_tokens(too_big) == 8
    assert bm.can_allocate(fits)
    assert not bm.can_allocate(too_big)      # 3 new + 2 revived > 4 free
    bm.allocate(fits)
    assert bm.num_free_blocks == 0


def test_can_allocate_with_hits_held_by_a_running_sequence():
    """can_allocate: a hit on a block another sequence holds costs no free block."""
    bm = BlockManager(4, 4)
    a = make_seq(list(range(1, 10)), 4)     # holds 3 blocks; 1 free
    prefill(bm, a)
    assert bm.num_free_blocks == 1
    one_new = make_seq(list(range(1, 9)) + [40, 41], 4)          # 3 blocks, 2 shared
    two_new = make_seq(list(range(1, 9)) + list(range(40, 45)), 4)  # 4 blocks, 2 shared
    assert bm.can_allocate(one_new)
    assert not bm.can_allocate(two_new)
    no_hit = make_seq([90, 91], 4)           # 1 block, no hit
    assert bm.can_allocate(no_hit)
    bm.allocate(no_hit)
    assert not bm.can_allocate(one_new)      # now 0 free


@pytest.mark.parametrize("seed", range(5))
def test_can_allocate_agrees_with_allocate(seed):
    """can_allocate is True exactly when allocate would find enough free blocks.

    The oracle: run `allocate` on a deep copy and see whether it runs out of
    free blocks (popping an empty free list raises KeyError).
    """
    rng = random.Random(seed)
    block_size = 4
    bm = BlockManager(12, block_size)
    prefixes = [[rng.randrange(50) for _ in range(8)] for _ in range(3)]
    live: list[Sequence] = []
    checked = {True: 0, False: 0}
    for _ in range(300):
        tokens = rng.choice(prefixes)[:rng.randrange(9)] + [rng.randrange(50) for _ in range(rng.randrange(1, 20))]
        seq = make_seq(tokens, block_size)
        trial = copy.deepcopy(bm)
        trial_seq = copy.deepcopy(seq)
        try:
            trial.allocate(trial_seq)
            would_fit = True
        except KeyError:
            would_fit = False
        predicted = bm.can_allocate(seq)
        assert predicted == would_fit, (tokens, bm.num_free_blocks)
        checked[predicted] += 1
        if predicted:
            prefill(bm, seq)
            live.append(seq)
        if live and (not predicted or rng.random() < 0.4):
            bm.deallocate(live.pop(rng.randrange(len(live))))
        # Reference counts always equal the number of holders.
        assert [b.ref_count for b in bm.blocks] == held_counts(bm, live)
        assert set(bm.free_block_ids) == {i for i, n in enumerate(held_counts(bm, live)) if n == 0}
    assert checked[True] > 0 and checked[False] > 0


# -- mark_computed --------------------------------------------------------------------

def test_only_computed_full_blocks_are_hashed():
    """A block becomes hittable only when full and computed, chunk by chunk."""
    bm = BlockManager(8, 4)
    seq = make_seq(list(range(1, 12)), 4)   # 11 tokens: 3 blocks
    bm.allocate(seq)
    bm.mark_computed(seq, 3)                  # block 0 not yet full
    assert all(bm.blocks[b].hash is None for b in seq.block_table)
    assert bm.num_cached_tokens(make_seq(list(range(1, 12)), 4)) == 0
    bm.mark_computed(seq, 3)                  # 6 computed: block 0 full
    assert bm.blocks[seq.block_table[0]].hash == chain_hash([1, 2, 3, 4], None)
    assert bm.blocks[seq.block_table[1]].hash is None
    assert bm.num_cached_tokens(make_seq(list(range(1, 12)), 4)) == 4
    bm.mark_computed(seq, 5)                  # 11 computed: block 1 full, block 2 partial
    h0 = chain_hash([1, 2, 3, 4], None)
    assert bm.blocks[seq.block_table[1]].hash == chain_hash([5, 6, 7, 8], h0)
    assert bm.blocks[seq.block_table[2]].hash is None
    assert bm.num_cached_tokens(make_seq(list(range(1, 12)), 4)) == 8


def test_hash_collision_is_not_a_hit(monkeypatch):
    """A hash entry whose block holds other tokens (a collision) is not a prefix hit."""
    import reference.engine.block_manager as bm_module
    monkeypatch.setattr(bm_module, "chain_hash", lambda tokens, prev_hash: 42)   # everything collides
    bm = BlockManager(8, 4)
    prefill(bm, make_seq([1, 2, 3, 4, 0], 4))
    assert bm.num_cached_tokens(make_seq([5, 6, 7, 8, 0], 4)) == 0
    assert bm.num_cached_tokens(make_seq([1, 2, 3, 4, 0], 4)) == 4


def test_chain_hash_depends_on_prefix():
    """Equal block contents after different prefixes are different cache entries."""
    bm = BlockManager(8, 2)
    prefill(bm, make_seq([1, 2, 3, 4, 0], 2))
    assert bm.num_cached_tokens(make_seq([9, 9, 3, 4, 0], 2)) == 0
    assert bm.num_cached_tokens(make_seq([1, 2, 3, 4, 0], 2)) == 4


def test_prefix_caching_off_never_hits():
    bm = BlockManager(8, 2, enable_prefix_caching=False)
    prefill(bm, make_seq([1, 2, 3, 4, 0], 2))
    again = make_seq([1, 2, 3, 4, 0], 2)
    assert bm.num_cached_tokens(again) == 0
    bm.allocate(again)
    assert again.num_cached_tokens == 0
    assert bm.hash_to_block == {}


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
