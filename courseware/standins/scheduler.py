"""Stand-in for lab 3's scheduling policy in a student release: FCFS, whole prompts, the sequence short of a block yields.

Used in lab 1 and lab 2 releases (whose lab 3 regions are stubbed), so that the
engine there serves requests through the student's own code: it subclasses
the course's `Scheduler` and overrides only the methods that hold lab 3
regions, so `add`, `_schedule`, `finish` and the lifecycle events they log
(lab 1 regions, the preemption events included) are the release's own, and
every block goes through the block manager's public methods (lab 2's regions,
in a lab 2 release).

The policy is deliberately not lab 3's:

- admission: waiting requests in arrival order while a seat is free, the
  whole prompt fits the step's token budget (a prefix-cache hit does not make
  a request cheaper here) and the block manager can allocate it now. No
  chunked prefill.
- decode: every running sequence, one token each, in admission order. A
  sequence whose next token finds no free block **yields itself**: it is
  preempted by recompute (all its blocks freed, back to the front of the
  waiting queue) and the sequences after it go on, taking the blocks it freed.
  Lab 3's rule is the other way round: the most recently admitted sequence
  gives way, so the oldest ones keep running.

Why preempt at all: a lab 1 student's PREEMPTED/QUEUED events and a lab 2
student's `deallocate` under pressure are part of what those labs grade, and
Tutorial 02 draws the timeline of a run with preemptions; a stand-in that
never preempted would leave them untried before submitting.

Its price: under memory pressure the victims, and so the steps, block tables
and logs, differ from the course engine's (the oldest request may be the one
that yields, and may yield again). With a pool large enough for every request
at full length nothing is preempted and its steps are the course scheduler's.
Greedy tokens do not depend on the schedule: they are the same.
`enable_chunked_prefill` is accepted but prompts are always prefilled whole,
so the budget must hold the longest prompt (checked at construction).
Progress is guaranteed: every admission prefills a prompt and samples a
token, and whoever yields leaves its blocks to the sequences after it.
"""
from __future__ import annotations

from collections import deque

from reference.config import Config
from reference.engine.block_manager import BlockManager
from reference.engine.lifecycle import LifecycleLog
from reference.engine.scheduler import Scheduler
from reference.engine.sequence import Sequence, SequenceStatus


class YieldingScheduler(Scheduler):
    def __init__(self, config: Config, block_manager: BlockManager, log: LifecycleLog):
        if config.max_num_batched_tokens < config.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={config.max_num_batched_tokens} is below max_model_len="
                f"{config.max_model_len}: this release runs a stand-in scheduler that prefills whole prompts "
                "(chunked prefill is lab 3's); raise max_num_batched_tokens")
        super().__init__(config, block_manager, log)

    def _schedule_prefill(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        budget = self.max_num_batched_tokens
        while self.waiting and len(self.running) < self.max_num_seqs:
            head = self.waiting[0]
            if len(head) > budget or not self.block_manager.can_allocate(head):
                break   # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            self.block_manager.allocate(head)
            head.status = SequenceStatus.RUNNING
            self.running.append(head)
            self._schedule(head, head.num_uncomputed_tokens, True, scheduled)
            budget -= len(head)
        return scheduled

    def _schedule_decode(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        kept: deque[Sequence] = deque()
        limit = min(self.max_num_seqs, self.max_num_batched_tokens)
        for seq in list(self.running):
            if len(scheduled) == limit:
                kept.append(seq)
            elif self.block_manager.can_append(seq):
                self.block_manager.may_append(seq)
                self._schedule(seq, 1, False, scheduled)
                kept.append(seq)
            else:
                self.preempt(seq)   # short of a block: this sequence yields, the ones after it go on
        self.running.clear()
        self.running.extend(kept)
        return scheduled

    def preempt(self, seq: Sequence) -> None:
        """Recompute preemption as lab 1's handout defines it: every block back, first in the waiting queue."""
        freed = self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)
        self._log_preemption(seq, freed)
