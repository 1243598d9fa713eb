# Generated from reference/standins/scheduler.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Release-only stand-in for lab 3's scheduling policy: FCFS, whole prompts, memory reserved up front.

Used in lab 1 and lab 2 releases (whose lab 3 regions are stubbed), so that the
engine there serves requests through the student's own code: it subclasses
the course's `Scheduler` and overrides only the two methods that hold lab 3
regions, so `add`, `_schedule`, `finish` and the lifecycle events they log
(lab 1 regions) are the release's own, and every block goes through the
block manager's public methods (lab 2's regions, in a lab 2 release).

The policy is deliberately not lab 3's:

- admission: waiting requests in arrival order while a seat is free, the
  whole prompt fits the step's token budget (a prefix-cache hit does not make
  a request cheaper here), and the free pool can hold the request at its
  longest (prompt + max_tokens, capped by max_model_len) on top of what every
  running request may still grow to. No chunked prefill.
- decode: every running sequence, one token each, in admission order. The
  reservation guarantees each one a block, so nothing is ever preempted; a
  missing block means the block manager lost blocks, and says so.

Its price, and why a release may use it anyway: it admits fewer requests than
the course scheduler when memory is tight (it waits where lab 3 admits and
later preempts), so under memory pressure its steps, block tables and logs
differ from the course engine's, and a release never shows a preemption. With
a pool large enough for every request at full length, its steps are the course
scheduler's. Greedy tokens do not depend on the schedule: they are the same.
`enable_chunked_prefill` is accepted but prompts are always prefilled whole,
so the budget must hold the longest prompt (checked at construction).
"""
from __future__ import annotations

from student_exercises.config import Config
from student_exercises.engine.block_manager import BlockManager
from student_exercises.engine.lifecycle import LifecycleLog
from student_exercises.engine.scheduler import Scheduler
from student_exercises.engine.sequence import Sequence, SequenceStatus


class ReservingScheduler(Scheduler):
    def __init__(self, config: Config, block_manager: BlockManager, log: LifecycleLog):
        if config.max_num_batched_tokens < config.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={config.max_num_batched_tokens} is below max_model_len="
                f"{config.max_model_len}: this release runs a stand-in scheduler that prefills whole prompts "
                "(chunked prefill is lab 3's); raise max_num_batched_tokens")
        super().__init__(config, block_manager, log)
        self.max_model_len = config.max_model_len

    def _longest_blocks(self, seq: Sequence) -> int:
        """Blocks `seq` can ever hold: K/V up to its last token fed back (the engine's admission rule)."""
        longest = min(seq.num_prompt_tokens + seq.sampling_params.max_tokens, self.max_model_len) - 1
        return -(-max(longest, len(seq)) // self.block_manager.block_size)

    def _reserved_blocks(self) -> int:
        """Free blocks the running sequences may still take as they grow."""
        return sum(self._longest_blocks(seq) - len(seq.block_table) for seq in self.running)

    def _schedule_prefill(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        budget = self.max_num_batched_tokens
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            room = self.block_manager.num_free_blocks - self._reserved_blocks()
            if len(seq) > budget or self._longest_blocks(seq) > room or not self.block_manager.can_allocate(seq):
                break   # first come, first served: nobody overtakes the head of the queue
            self.block_manager.allocate(seq)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._schedule(seq, seq.num_uncomputed_tokens, True, scheduled)
            budget -= len(seq)
        return scheduled

    def _schedule_decode(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        limit = min(self.max_num_seqs, self.max_num_batched_tokens)
        for seq in list(self.running)[:limit]:
            if not self.block_manager.can_append(seq):
                raise RuntimeError(
                    f"no KV block for the next token of seq {seq.seq_id} although the stand-in scheduler reserved "
                    f"its blocks at admission ({self.block_manager.num_free_blocks} free): the block manager has "
                    "lost or leaked blocks (check can_append, may_append and deallocate)")
            self.block_manager.may_append(seq)
            self._schedule(seq, 1, False, scheduled)
        return scheduled
