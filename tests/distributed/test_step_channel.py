"""The step message's block tables: whole in a prefill, only the new entries in a decode step.

Rank 0 (`SentTables`) and each worker (`HeldTables`) apply one rule after
every step: a prefill step's sequences are sent whole and held; a decode step
keeps exactly its own sequences. The checks below walk one scenario (a
sequence finishes, one gains a block, one is preempted and comes back with a
new table) and compare, step by step, the worker's tables with rank 0's and
the number of entries sent with the count the scenario implies.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from reference.distributed.step_channel import HeldTables, SentTables, decode, encode
from reference.sampling_params import SamplingParams


@dataclass
class Seq:
    seq_id: int
    block_table: list[int]
    token_ids: list[int] = field(default_factory=lambda: [5] * 40)
    num_cached_tokens: int = 0
    num_scheduled_tokens: int = 40
    sampling_params: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))

    def __len__(self) -> int:
        return len(self.token_ids)


def step(seqs: list[Seq], is_prefill: bool, sent: SentTables, held: HeldTables) -> int:
    """Send one step; check the worker's tables; return how many table entries the message carried."""
    arrays = encode(seqs, is_prefill, sent)
    got = decode(arrays, is_prefill, held)
    assert [s.block_table for s in got] == [s.block_table for s in seqs]
    return len(arrays["tables"])


def test_decode_steps_carry_only_new_entries_and_a_prefill_resends_whole_tables():
    a, b, c = Seq(1, [10, 11, 12]), Seq(2, [20, 21]), Seq(3, [30])
    sent, held = SentTables(), HeldTables()
    assert step([a, b, c], True, sent, held) == 6            # prefill: whole tables
    assert step([a, b, c], False, sent, held) == 0           # decode, nothing new
    a.block_table.append(13)
    assert step([a, b], False, sent, held) == 1              # c finished; a gained a block: only it is sent
    assert set(held.held) == {1, 2} and set(sent.held) == {1, 2}
    b.block_table = [40, 41, 42]                             # b preempted, then admitted again: a new table
    assert step([b], True, sent, held) == 3
    assert step([a, b], False, sent, held) == 0
    c = Seq(3, [50, 51])                                     # an id the worker dropped comes back in a decode
    assert step([a, b, c], False, sent, held) == 2           # step (never happens in the engine): sent whole


def test_a_worker_that_lost_its_tables_fails_loudly():
    a = Seq(1, [10, 11])
    sent = SentTables()
    step([a], True, sent, HeldTables())
    with pytest.raises(RuntimeError, match="out of step with rank 0"):
        decode(encode([a], False, sent), False, HeldTables())
