# Generated from reference/engine/scheduler.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""The scheduler: which sequences run in the next step, and how many tokens each.

Policy: **prefill first**, as in nano-vllm. Each step is either a prefill step
(new prompts, or further chunks of a long prompt) or a decode step (one token
for every running sequence), and `schedule()` says which with `is_prefill`.
We chose this over vLLM V1's decode-first mixed batches because it keeps the
lecture's two phases visible in every step and the model runner's inputs
simple; its price is that running decodes pause while a prefill runs (an
inter-token latency spike), which chunked prefill bounds by capping the tokens
of a prefill step at `max_num_batched_tokens`.

Continuous batching: a new request joins at the next step, a finished one
leaves at once; no batch waits for its slowest member.

Preemption by recompute: when a decode step needs a block and none is free,
the most recently admitted running sequence gives all its blocks back and goes
to the front of the waiting queue; it is prefilled again later (its prefix may
then hit the cache). A request that could never fit is refused at admission by
the engine, so the scheduler never waits for memory that cannot come.
"""
from __future__ import annotations

from collections import deque

from student_exercises.config import Config
from student_exercises.engine.block_manager import BlockManager
from student_exercises.engine.lifecycle import LifecycleLog
from student_exercises.engine.sequence import Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: Config, block_manager: BlockManager, log: LifecycleLog):
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.chunked_prefill = config.enable_chunked_prefill
        self.block_manager = block_manager
        self.log = log
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)
        # >>> EXERCISE lab1.emit_queued: Log that a new request entered the waiting queue.
        # HINT: QUEUED's reason tells a new request from a preempted one coming back.
        raise NotImplementedError("lab1.emit_queued")
        # <<< EXERCISE lab1.emit_queued

    def reserve(self, seq: Sequence) -> bool:
        """Allocate blocks for a sequence prefilled by another engine; False (nothing taken) if they do not fit now.

        Prefill/decode disaggregation: the decode engine takes the blocks
        before the K/V arrive, so it can say which of them a prefix-cache hit
        already holds (`seq.num_cached_tokens`) and need not be sent.
        """
        if not self.block_manager.can_allocate(seq):
            return False
        self.block_manager.allocate(seq)
        return True

    def add_running(self, seq: Sequence, num_computed_tokens: int) -> None:
        """Queue a `reserve`d sequence whose first `num_computed_tokens` K/V arrived, straight into `running`.

        It skips the waiting queue (and the QUEUED and SCHEDULED-prefill
        events: the prefill engine logged those) and decodes next.
        """
        self.block_manager.mark_computed(seq, max(0, num_computed_tokens - seq.num_cached_tokens))
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def is_finished(self) -> bool:
        return not self.waiting and not self.running

    def mark_computed(self, seq: Sequence) -> None:
        """The K/V of seq's scheduled tokens are computed: the block manager counts (and may share) them."""
        self.block_manager.mark_computed(seq, seq.num_scheduled_tokens)

    def may_preempt(self) -> bool:
        """Could the next decode step preempt? Not while every running sequence can have a free block.

        Async scheduling asks before it books a step ahead: a preempted
        sequence must not be holding a placeholder token.
        """
        return self.block_manager.num_free_blocks < len(self.running)

    def schedule(self) -> tuple[list[Sequence], bool]:
        """Pick the next batch. Returns (sequences, is_prefill).

        Each returned sequence has `num_scheduled_tokens` set: the tokens whose
        K/V this step computes (a prompt chunk, or 1 for decode).
        """
        seqs = self._schedule_prefill()
        if seqs:
            return seqs, True
        seqs = self._schedule_decode()
        if seqs:
            return seqs, False
        # Decode preempted every running sequence: their blocks are free again.
        return self._schedule_prefill(), True

    def _schedule_prefill(self) -> list[Sequence]:
        scheduled: list[Sequence] = []
        budget = self.max_num_batched_tokens
        if self.chunked_prefill:
            budget = self._continue_chunked_prefills(scheduled, budget)
        # >>> EXERCISE lab3.admit: Admit waiting requests in arrival order while seats, token budget and KV blocks last.
        # HINT: stop at the first request that does not fit (first come, first served): nobody overtakes it.
        # HINT: a request costs len(seq) minus the tokens a prefix-cache hit would cover (block_manager).
        # HINT: admitting means allocate, move from waiting to running (status RUNNING), then self._schedule.
        # HINT: with chunked prefill a prompt larger than the budget is admitted with a budget-sized first chunk.
        raise NotImplementedError("lab3.admit")
        # <<< EXERCISE lab3.admit
        return scheduled

    def _continue_chunked_prefills(self, scheduled: list[Sequence], budget: int) -> int:
        """Schedule the next chunk of every running prompt still mid-prefill; return the budget left.

        They go before any new admission because they already hold their
        blocks. Without chunked prefill no running sequence is ever mid-prefill
        (a prompt is computed in one step), so this runs only with it.
        """
        # >>> EXERCISE lab3.chunked_prefill: (stretch) Give each running sequence that is mid-prefill its next chunk.
        # HINT: seq.in_prefill tells a prompt still being computed; seq.num_uncomputed_tokens is what it still needs.
        # HINT: a chunk never exceeds the budget left; spend it in running-queue order.
        raise NotImplementedError("lab3.chunked_prefill")
        # <<< EXERCISE lab3.chunked_prefill

    def _schedule_decode(self) -> list[Sequence]:
        # >>> EXERCISE lab3.schedule_decode: Batch one decode token per running sequence; preempt when blocks run out.
        # HINT: at most min(max_num_seqs, max_num_batched_tokens) sequences, taken from the front of `running`.
        # HINT: before scheduling one, make sure its next token has a slot (can_append), else preempt the newest
        # HINT: running request; if none is left, the sequence preempts itself and is not scheduled.
        # HINT: scheduled sequences go back to the front of `running`, in their order.
        raise NotImplementedError("lab3.schedule_decode")
        # <<< EXERCISE lab3.schedule_decode

    def _schedule(self, seq: Sequence, num_tokens: int, is_prefill: bool, scheduled: list[Sequence]) -> None:
        seq.num_scheduled_tokens = num_tokens
        scheduled.append(seq)
        # >>> EXERCISE lab1.emit_scheduled: Record when seq was first scheduled, and log SCHEDULED for this step.
        # HINT: SCHEDULED carries is_prefill, num_new_tokens, num_cached_tokens and block_table.
        # HINT: log a copy of the block table: the sequence's own list keeps changing after this step.
        raise NotImplementedError("lab1.emit_scheduled")
        # <<< EXERCISE lab1.emit_scheduled

    def preempt(self, seq: Sequence) -> None:
        """Recompute preemption: free every block and requeue at the front."""
        # >>> EXERCISE lab3.preempt: Preempt seq by recompute: free all its blocks and requeue it at the front.
        # HINT: the block manager frees the blocks (and forgets the computed tokens); keep the count it returns.
        # HINT: the sequence is WAITING again, and seq.num_preemptions counts how often this happened.
        raise NotImplementedError("lab3.preempt")
        # <<< EXERCISE lab3.preempt
        self._log_preemption(seq, blocks_freed)

    def _log_preemption(self, seq: Sequence, blocks_freed: int) -> None:
        """The two events a recompute preemption leaves in the log."""
        # >>> EXERCISE lab1.emit_preemption: Log that seq lost its blocks, then that it re-entered the waiting queue.
        # HINT: PREEMPTED carries blocks_freed; the QUEUED that follows says why it is queued again.
        raise NotImplementedError("lab1.emit_preemption")
        # <<< EXERCISE lab1.emit_preemption

    def retire(self, seq: Sequence) -> None:
        """Stop scheduling a running sequence that will finish once its token in flight is read back.

        Async scheduling books a step as done before its tokens are known; a
        sequence that this step takes to its length limit must not be scheduled
        for another token, yet cannot be finished until that token is read back
        and logged. It leaves `running` here and keeps its blocks and status
        until `finish`. A method rather than the engine editing `running`
        itself, so that the scheduler's queues change only through the
        scheduler.
        """
        self.running.remove(seq)

    def finish(self, seq: Sequence) -> int:
        """Take a finished (or aborted) sequence out of its queue; return blocks freed.

        A sequence that `retire` took out of `running` is in neither queue.
        """
        for queue in (self.running, self.waiting):
            if seq in queue:
                queue.remove(seq)
                break
        seq.status = SequenceStatus.FINISHED
        return self.block_manager.deallocate(seq)
