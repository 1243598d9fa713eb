# Generated from reference/standins/block_manager.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Release-only stand-in for lab 2's block manager: paged blocks, no prefix caching.

Used only in a lab 1 release (whose lab 2 regions are stubbed), so that the
engine there can serve requests. It overrides every method that holds a lab 2
region with the simplest paging that is still correct: a sequence gets fresh
blocks for all its tokens from a FIFO free list (least recently freed first),
never shares one, and gives them all back, last block first, when it leaves.
That is exactly the allocator lab 1's public test double describes
(`student_exercises/tests/lab_fakes.py`), so it shows a lab 1 student nothing
that their release did not already show.

What it leaves out is what lab 2 grades: prefix caching (chained hashes,
shared blocks, reference counts above 1, reviving freed blocks, dropping
stale hashes). Its price: `enable_prefix_caching` is ignored and every prompt
is prefilled in full, so a lab 1 release never logs a cache hit
(`num_cached_tokens` stays 0 at SCHEDULED) where the course engine would.
"""
from __future__ import annotations

from student_exercises.engine.block_manager import BlockManager
from student_exercises.engine.sequence import Sequence


class PlainBlockManager(BlockManager):
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        super().__init__(num_blocks, block_size, enable_prefix_caching=False)

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        return []   # no prefix cache: nothing is ever shared

    def can_allocate(self, seq: Sequence) -> bool:
        return seq.num_blocks <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table, f"seq {seq.seq_id} already has blocks"
        seq.block_table = [self._take_free_block() for _ in range(seq.num_blocks)]
        seq.num_cached_tokens = 0

    def _take_free_block(self) -> int:
        block_id, _ = self.free_block_ids.popitem(last=False)
        self.blocks[block_id].reset()
        return block_id

    def deallocate(self, seq: Sequence) -> int:
        for block_id in reversed(seq.block_table):
            self.blocks[block_id].ref_count = 0
            self.free_block_ids[block_id] = None
        freed = len(seq.block_table)
        seq.block_table = []
        seq.num_cached_tokens = 0
        return freed

    def can_append(self, seq: Sequence) -> bool:
        return len(seq.block_table) >= seq.num_blocks or self.num_free_blocks >= 1

    def may_append(self, seq: Sequence) -> None:
        if len(seq.block_table) < seq.num_blocks:
            seq.block_table.append(self._take_free_block())

    def mark_computed(self, seq: Sequence, num_new_tokens: int) -> None:
        seq.num_cached_tokens += num_new_tokens   # nothing is published: no prefix cache
