"""Paged KV-cache bookkeeping: blocks, reference counts and prefix caching.

The KV cache is a pool of fixed-size blocks; a sequence's `block_table` maps
its logical blocks (tokens [i*B, (i+1)*B)) to physical block ids. The block
manager owns no tensors: it only decides which physical slot each token's K/V
goes to, so it can be tested without a model.

Prefix caching: once a block is full *and its K/V have been computed*, it gets
a hash chained over every token before it (`hash(prev_hash, tokens)`), so equal
hashes mean equal prefixes. A later sequence whose prompt starts with the same
blocks shares them (ref_count > 1) instead of recomputing. A freed block keeps
its hash and content in the free list, so it can still be hit until it is
handed out again; then its old hash entry is dropped, or a stale entry would
point a future prompt at someone else's K/V.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import xxhash

from reference.engine.sequence import Sequence


def chain_hash(token_ids: list[int], prev_hash: int | None) -> int:
    """Hash of one full block, chained to the hash of the block before it."""
    h = xxhash.xxh64()
    if prev_hash is not None:
        h.update(prev_hash.to_bytes(8, "little"))
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.intdigest()


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None        # set only when full and computed
        self.token_ids: list[int] = []       # the tokens behind `hash` (guards against collisions)

    def reset(self) -> None:
        self.ref_count = 1
        self.hash = None
        self.token_ids = []


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block: dict[int, int] = {}
        # Free blocks in eviction order: the least recently freed is handed out first,
        # so recently freed prefixes stay hittable longest.
        self.free_block_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._lookup: tuple[Sequence, int, list[int]] | None = None   # see _prefix_hits

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self.free_block_ids)

    # -- prefix lookup -----------------------------------------------------
    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Physical ids of the leading blocks of `seq` already in the cache, looked up once per admission.

        Admitting a request asks three questions about its prefix hits: what
        they save (`num_cached_tokens`, for the token budget), whether the pool
        can cover the rest (`can_allocate`), then `allocate`. We keep those
        three questions, each answerable and testable on its own (lab 2), and
        remember the last lookup instead of hashing the prompt three times: it
        stays valid until the cache changes, and every method that changes it
        (`allocate`, `_take_free_block`, `deallocate`, `mark_computed`) forgets
        it. The price: one remembered lookup (the sequence, its length, its
        hits) whose validity rests on that rule; a head of the queue that waits
        for memory is still looked up again each step, since a step changes
        the cache.
        """
        if self._lookup is None or self._lookup[0] is not seq or self._lookup[1] != len(seq):
            self._lookup = (seq, len(seq), self._find_prefix_hits(seq))
        return list(self._lookup[2])   # a copy: a caller may build a block table from it

    def _forget_lookup(self) -> None:
        """The cache is about to change: the remembered prefix lookup may be wrong from now on."""
        self._lookup = None

    def _find_prefix_hits(self, seq: Sequence) -> list[int]:
        """Walk the hash chain of `seq`'s full blocks; the ids of the leading ones already in the cache.

        Only blocks wholly inside the first len-1 tokens count: the last token
        must always be computed, or the step would have no query to sample from.
        """
        # >>> EXERCISE lab2.prefix_hits: Find the leading full blocks of seq whose K/V are already cached.
        # HINT: walk the blocks in order, hashing each with chain_hash(tokens, hash of the block before).
        # HINT: stop at the first block whose hash is unknown, or whose cached token_ids differ (a collision).
        # HINT: only blocks wholly inside the first len(seq) - 1 tokens may hit; none with prefix caching off.
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        prev_hash = None
        for i in range((len(seq) - 1) // self.block_size):
            tokens = seq.block(i)
            h = chain_hash(tokens, prev_hash)
            block_id = self.hash_to_block.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            hits.append(block_id)
            prev_hash = h
        return hits
        # <<< EXERCISE lab2.prefix_hits

    def num_cached_tokens(self, seq: Sequence) -> int:
        """How many leading tokens of `seq` a prefix-cache hit would cover now."""
        return len(self._prefix_hits(seq)) * self.block_size

    # -- prefill -----------------------------------------------------------
    def can_allocate(self, seq: Sequence) -> bool:
        # >>> EXERCISE lab2.can_allocate: Say whether the free list can cover every block seq needs now.
        # HINT: blocks that hit the cache need no new block, unless the hit sits in the free list (ref_count 0):
        # HINT: reviving it takes it out of the free list too.
        hits = self._prefix_hits(seq)
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return (seq.num_blocks - len(hits)) + revived <= self.num_free_blocks
        # <<< EXERCISE lab2.can_allocate

    def allocate(self, seq: Sequence) -> None:
        """Give `seq` blocks for all its tokens, sharing cached prefix blocks."""
        assert not seq.block_table, f"seq {seq.seq_id} already has blocks"
        # >>> EXERCISE lab2.allocate: Build seq's block table: shared cache hits first, then fresh blocks.
        # HINT: a hit gains one more holder (ref_count); a hit with no holder left must leave the free list.
        # HINT: fresh blocks come from self._take_free_block(); num_cached_tokens counts the tokens the hits cover.
        hits = self._prefix_hits(seq)
        for block_id in hits:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_block_ids[block_id]
            block.ref_count += 1
        seq.block_table = hits + [self._take_free_block() for _ in range(seq.num_blocks - len(hits))]
        seq.num_cached_tokens = len(hits) * self.block_size
        # <<< EXERCISE lab2.allocate
        self._forget_lookup()

    def _take_free_block(self) -> int:
        self._forget_lookup()
        # >>> EXERCISE lab2.take_free_block: Take the least recently freed block and make it fresh for a new holder.
        # HINT: free_block_ids is ordered oldest-freed first; a block leaves it when handed out.
        # HINT: if hash_to_block still points at this block, drop that entry: its K/V are about to be overwritten.
        # HINT: Block.reset() clears the hash and sets ref_count to 1.
        block_id, _ = self.free_block_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
            del self.hash_to_block[block.hash]   # reused: the old content is gone
        block.reset()
        return block_id
        # <<< EXERCISE lab2.take_free_block

    def deallocate(self, seq: Sequence) -> int:
        """Drop `seq`'s hold on its blocks (last block first); return how many became free."""
        self._forget_lookup()
        # >>> EXERCISE lab2.deallocate: Release seq's hold on each of its blocks, last block first.
        # HINT: a block returns to the free list only when its last holder lets go (ref_count reaches 0).
        # HINT: freeing the tail first makes the prefix blocks the last to be reused, so they stay hittable longest.
        # HINT: afterwards seq holds no blocks and has no computed tokens.
        freed = 0
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_ids[block_id] = None
                freed += 1
        seq.block_table = []
        seq.num_cached_tokens = 0
        return freed
        # <<< EXERCISE lab2.deallocate

    # -- decode ------------------------------------------------------------
    def can_append(self, seq: Sequence) -> bool:
        """Is there room for the K/V of the token this decode step computes?"""
        # >>> EXERCISE lab2.can_append: Say whether the newest token of seq has a slot, or a free block to start one.
        # HINT: seq.num_blocks counts the blocks its tokens (the newest included) need.
        return len(seq.block_table) >= seq.num_blocks or self.num_free_blocks >= 1
        # <<< EXERCISE lab2.can_append

    def may_append(self, seq: Sequence) -> None:
        """Add a block when the newest token starts a new one."""
        # >>> EXERCISE lab2.may_append: Give seq one more block exactly when its newest token starts a new block.
        if len(seq.block_table) < seq.num_blocks:
            seq.block_table.append(self._take_free_block())
        # <<< EXERCISE lab2.may_append

    # -- after the forward pass ---------------------------------------------
    def mark_computed(self, seq: Sequence, num_new_tokens: int) -> None:
        """Record that K/V for `num_new_tokens` more tokens are now in the cache.

        Blocks that this fills become hashable: only now may other sequences
        reuse them, because only now do they hold real K/V.
        """
        self._forget_lookup()
        # >>> EXERCISE lab2.mark_computed: Count the newly computed tokens and publish the blocks they filled.
        # HINT: only blocks that became full in this call get a hash; a block shared from the cache has one.
        # HINT: chain each hash to the hash of the block before it; remember the tokens and map hash -> block.
        first_new_full = seq.num_cached_tokens // self.block_size
        seq.num_cached_tokens += num_new_tokens
        last_full = seq.num_cached_tokens // self.block_size
        if not self.enable_prefix_caching or last_full == first_new_full:
            return  # no block filled up (the common decode step)
        for i in range(first_new_full, last_full):
            block = self.blocks[seq.block_table[i]]
            if block.hash is not None:
                continue  # shared from the cache already
            prev_hash = self.blocks[seq.block_table[i - 1]].hash if i > 0 else None
            block.token_ids = seq.block(i)
            block.hash = chain_hash(block.token_ids, prev_hash)
            self.hash_to_block[block.hash] = block.block_id
        # <<< EXERCISE lab2.mark_computed
