"""Stand-in for lab 2's block manager in a student release: paged blocks, no prefix caching.

Used only in a lab 1 release (whose lab 2 regions are stubbed), so that the
engine there can serve requests. It is the allocator lab 1's public test
double already describes (`student_exercises/tests/lab_fakes.py`): a sequence
gets fresh blocks for all its tokens from a FIFO free list (lowest id first,
freed blocks join the back, last block first), never shares one, and gives
them all back when it leaves. Without prefix hits its block tables are the
course block manager's. It stands alone (it does not subclass the stubbed
`BlockManager`), offering the methods and counters the engine and the
schedulers call.

What it leaves out is what lab 2 grades: prefix caching (chained hashes,
shared blocks, reference counts above 1, reviving freed blocks, dropping
stale hashes). Its price: `enable_prefix_caching` is ignored and every prompt
is prefilled in full, so a lab 1 release never logs a cache hit
(`num_cached_tokens` stays 0 at SCHEDULED) where the course engine would.
"""
from __future__ import annotations

from collections import deque

from reference.engine.block_manager import Block
from reference.engine.sequence import Sequence


class PlainBlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.enable_prefix_caching = False   # asked for or not: there is no prefix cache here
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self.free)

    def _needed(self, seq: Sequence) -> int:
        return -(-len(seq) // self.block_size)

    def num_cached_tokens(self, seq: Sequence) -> int:
        return 0   # no prefix cache: a new request never starts with cached tokens

    def can_allocate(self, seq: Sequence) -> bool:
        return self._needed(seq) <= len(self.free)

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table, f"seq {seq.seq_id} already has blocks"
        self._grow(seq)
        seq.num_cached_tokens = 0

    def deallocate(self, seq: Sequence) -> int:
        freed = len(seq.block_table)
        self.free.extend(reversed(seq.block_table))   # last block first, as lab 1's test double does
        for block_id in seq.block_table:
            self.blocks[block_id].ref_count = 0
        seq.block_table = []
        seq.num_cached_tokens = 0
        return freed

    def can_append(self, seq: Sequence) -> bool:
        return bool(self.free) or len(seq.block_table) >= self._needed(seq)

    def may_append(self, seq: Sequence) -> None:
        self._grow(seq)

    def mark_computed(self, seq: Sequence, num_new_tokens: int) -> None:
        seq.num_cached_tokens += num_new_tokens   # nothing is published: no prefix cache

    def _grow(self, seq: Sequence) -> None:
        """Fresh blocks from the front of the free list until every token of seq has a slot."""
        while len(seq.block_table) < self._needed(seq):
            block = self.blocks[self.free.popleft()]
            block.ref_count = 1
            seq.block_table.append(block.block_id)
