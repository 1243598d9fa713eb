"""Test doubles that let lab 1 drive the real engine loop without labs 2-4.

Lab 1 is about *when* the engine logs what. To test that before the block
manager (lab 2), scheduler (lab 3) and model runner (lab 4) exist, the engine
runs with:

- `FakeModelRunner`: no model; "samples" token 40 + seq_id for each sequence
  whose scheduled tokens reach its end (exactly when the real runner samples).
- `FakeBlockManager`: hands out block ids from a plain free list (lowest id
  first, freed blocks to the back, last block first), no sharing, no prefix cache.
- `scripted_scheduler(...)`: a subclass of the Scheduler under test whose
  `schedule()` follows a fixed script instead of lab 3's policy, but calls the
  scheduler's own `_schedule` and `_log_preemption` (lab 1 regions), so those
  events come from the code under test.

Nothing here is copied from the engine: the fakes implement the contracts
stated in docs/architecture.md, in the simplest way that can be checked by hand.
"""
from __future__ import annotations

from typing import Any

FAKE_TOKEN_BASE = 40
NUM_BLOCKS = 16


def fake_token(seq: Any) -> int:
    return FAKE_TOKEN_BASE + seq.seq_id


class FakeModelRunner:
    """Stands in for lab 4's ModelRunner."""

    def __init__(self, config: Any):
        self.num_kvcache_blocks = config.num_kvcache_blocks or NUM_BLOCKS

    def run(self, seqs: list[Any], is_prefill: bool) -> list[int | None]:
        return [fake_token(seq) if seq.num_cached_tokens + seq.num_scheduled_tokens == len(seq) else None
                for seq in seqs]


class FakeBlockManager:
    """Stands in for lab 2's BlockManager: `blocks`, `num_used_blocks`, allocate/may_append/deallocate/mark_computed."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.block_size = block_size
        self.blocks = list(range(num_blocks))
        self.free = list(range(num_blocks))

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self.free)

    def _needed(self, seq: Any) -> int:
        return -(-len(seq) // self.block_size)

    def allocate(self, seq: Any) -> None:
        seq.block_table = [self.free.pop(0) for _ in range(self._needed(seq))]
        seq.num_cached_tokens = 0

    def may_append(self, seq: Any) -> None:
        while len(seq.block_table) < self._needed(seq):
            seq.block_table.append(self.free.pop(0))

    def deallocate(self, seq: Any) -> int:
        freed = len(seq.block_table)
        self.free.extend(reversed(seq.block_table))
        seq.block_table = []
        seq.num_cached_tokens = 0
        return freed

    def mark_computed(self, seq: Any, num_new_tokens: int) -> None:
        seq.num_cached_tokens += num_new_tokens


def scripted_scheduler(scheduler_module: Any, script: dict[int, list[tuple]]) -> type:
    """A Scheduler subclass (of the implementation under test) that follows `script`.

    script[step] is a list of actions, done in order:
      ("prefill", seq_id, num_tokens)  admit seq if waiting, then schedule a prefill chunk
      ("decode", seq_id)               make room for the newest token, then schedule it
      ("preempt", seq_id)              free its blocks and requeue it at the front
    """
    base = scheduler_module.Scheduler
    status = scheduler_module.SequenceStatus

    class ScriptedScheduler(base):
        def _find(self, seq_id: int, queue: Any) -> Any:
            return next(seq for seq in queue if seq.seq_id == seq_id)

        def schedule(self) -> tuple[list[Any], bool]:
            scheduled: list[Any] = []
            is_prefill = True
            for action in script[self.log.step]:
                kind, seq_id = action[0], action[1]
                if kind == "preempt":
                    seq = self._find(seq_id, self.running)
                    self.running.remove(seq)
                    blocks_freed = self.block_manager.deallocate(seq)
                    seq.status = status.WAITING
                    seq.num_preemptions += 1
                    self.waiting.appendleft(seq)
                    self._log_preemption(seq, blocks_freed)
                elif kind == "prefill":
                    if any(seq.seq_id == seq_id for seq in self.waiting):
                        seq = self._find(seq_id, self.waiting)
                        self.waiting.remove(seq)
                        self.block_manager.allocate(seq)
                        seq.status = status.RUNNING
                        self.running.append(seq)
                    seq = self._find(seq_id, self.running)
                    self._schedule(seq, action[2], True, scheduled)
                else:
                    seq = self._find(seq_id, self.running)
                    self.block_manager.may_append(seq)
                    self._schedule(seq, 1, False, scheduled)
                    is_prefill = False
            return scheduled, is_prefill

    return ScriptedScheduler


def fake_engine(impl: Any, model_dir: str, script: dict[int, list[tuple]], **config: Any) -> Any:
    """An LLMEngine of the implementation under test, built from the fakes above (handed in as its parts)."""
    parts = impl.module("engine.parts").EngineParts(
        model_runner=FakeModelRunner, block_manager=FakeBlockManager,
        scheduler=scripted_scheduler(impl.module("engine.scheduler"), script))
    return impl.module("engine.llm_engine").LLMEngine(model_dir, parts, device="cpu", kvcache_block_size=4,
                                                      num_kvcache_blocks=NUM_BLOCKS, max_model_len=64, **config)
