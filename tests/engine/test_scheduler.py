"""The scheduler's code outside the lab 3 regions, and the scheduler and block manager together, without a model.

The policy students write (lab 3's regions: admission, budgets, decode
batches, preemption, chunked prefill; docs/design.md §2 edge cases 1, 3, 4, 8
and 9 at the scheduler's level) is tested in one place, the public suite
`assignments/lab3_scheduler/public/test_lab3_scheduler.py`, which CI runs on
the reference (docs/workflows.md lists each rule's home). This file keeps
`finish` and `retire` (given code), the prefix lookup an admission shares with
the block manager, and a randomized run of the two parts together.

`run_step` plays the engine's part: schedule, then for each scheduled sequence
record its computed K/V (`mark_computed`), append a fake token when its
scheduled tokens reached its end, and finish it at `max_tokens`. Optionally it
also keeps a fake paged KV cache (`kv`: slot -> the prefix that token's K/V
stand for) and checks that every position a sequence attends to holds its own
prefix: a wrong block table, a stale prefix hit or a block overwritten while
shared all show up there.
"""
from __future__ import annotations

import json
import random

import pytest

from reference.config import Config
from reference.engine.block_manager import BlockManager
from reference.engine.lifecycle import LifecycleLog
from reference.engine.scheduler import Scheduler
from reference.engine.sequence import Sequence, SequenceStatus
from reference.sampling_params import SamplingParams


@pytest.fixture
def model_dir(tmp_path) -> str:
    (tmp_path / "config.json").write_text(json.dumps(
        {"max_position_embeddings": 4096, "vocab_size": 1000, "hidden_size": 8}))
    return str(tmp_path)


def make_scheduler(model_dir: str, num_blocks: int, block_size: int = 4, prefix_caching: bool = True,
                   **config) -> Scheduler:
    cfg = Config(model=model_dir, device="cpu", kvcache_block_size=block_size, num_kvcache_blocks=num_blocks,
                 enable_prefix_caching=prefix_caching, **config)
    return Scheduler(cfg, BlockManager(num_blocks, block_size, prefix_caching), LifecycleLog())


def add(sched: Scheduler, token_ids: list[int], max_tokens: int = 64) -> Sequence:
    seq = Sequence(token_ids, SamplingParams(temperature=0.0, max_tokens=max_tokens),
                   sched.block_manager.block_size)
    sched.add(seq)
    return seq


def fake_token(seq: Sequence) -> int:
    return 500 + len(seq) % 50


def fake_attention(kv: dict[int, tuple], seq: Sequence, start: int, end: int, block_size: int) -> None:
    """Write K/V for positions [start, end), then check every position < end holds its own prefix."""
    def slot(p: int) -> int:
        return seq.block_table[p // block_size] * block_size + p % block_size
    for p in range(start, end):
        kv[slot(p)] = tuple(seq.token_ids[:p + 1])
    for p in range(end):
        assert kv.get(slot(p)) == tuple(seq.token_ids[:p + 1]), f"seq {seq.seq_id} reads wrong K/V at {p}"


def run_step(sched: Scheduler, kv: dict | None = None) -> tuple[list[Sequence], bool]:
    """One engine step without a model; returns what `schedule()` returned."""
    bm = sched.block_manager
    seqs, is_prefill = sched.schedule()
    for seq in seqs:
        start, end = seq.num_cached_tokens, seq.num_cached_tokens + seq.num_scheduled_tokens
        assert 1 <= seq.num_scheduled_tokens and end <= len(seq), seq
        if kv is not None:
            fake_attention(kv, seq, start, end, bm.block_size)
        bm.mark_computed(seq, seq.num_scheduled_tokens)
        if seq.num_cached_tokens == len(seq):       # reached the end: a token is sampled
            seq.append_token(fake_token(seq))
            if seq.num_output_tokens >= seq.sampling_params.max_tokens:
                sched.finish(seq)
    sched.log.end_step()
    return seqs, is_prefill


def events(sched: Scheduler, name: str, seq: Sequence) -> list[dict]:
    return [e for e in sched.log.events if e["event"] == name and e["seq_id"] == seq.seq_id]


def test_finish_removes_from_either_queue(model_dir):
    """Finishing (or aborting) works for a running and for a waiting sequence."""
    sched = make_scheduler(model_dir, num_blocks=8, max_num_seqs=1)
    a = add(sched, [1, 2, 3])
    b = add(sched, [4, 5, 6])
    run_step(sched)
    assert list(sched.running) == [a] and list(sched.waiting) == [b]
    assert sched.finish(b) == 0                       # waiting: holds no blocks
    assert sched.finish(a) == 1
    assert sched.is_finished()
    assert a.status == b.status == SequenceStatus.FINISHED
    assert sched.block_manager.num_free_blocks == 8


def test_retire_stops_scheduling_a_sequence_until_it_finishes(model_dir):
    """Async scheduling's length limit: the sequence leaves `running` but keeps its blocks until `finish`."""
    sched = make_scheduler(model_dir, num_blocks=8)
    a, b = add(sched, [1, 2, 3]), add(sched, [4, 5, 6])
    run_step(sched)                                   # prefill both: 4 tokens each, one block each
    sched.retire(a)
    assert list(sched.running) == [b] and not sched.waiting
    assert a.status == SequenceStatus.RUNNING and len(a.block_table) == 1
    seqs, is_prefill = run_step(sched)
    assert seqs == [b] and not is_prefill             # a is not scheduled again
    assert sched.finish(a) == 1 and a.status == SequenceStatus.FINISHED


def test_an_admission_looks_its_prefix_up_once(model_dir, monkeypatch):
    """Budget, room and allocation all need the prompt's prefix hits: its blocks are hashed once, not three times."""
    import reference.engine.block_manager as bm_module
    sched = make_scheduler(model_dir, num_blocks=16)
    add(sched, list(range(1, 14)), max_tokens=1)      # 13 tokens: its 3 full blocks get published, then freed
    run_step(sched)
    assert sched.is_finished()
    hashed = []
    real_hash = bm_module.chain_hash
    monkeypatch.setattr(bm_module, "chain_hash", lambda tokens, prev: hashed.append(tokens) or real_hash(tokens, prev))
    again = add(sched, list(range(1, 14)) + [90, 91, 92])   # 16 tokens: blocks 0-2 may hit, block 3 holds the last
    seqs, is_prefill = sched.schedule()
    assert seqs == [again] and is_prefill and again.num_cached_tokens == 12
    assert hashed == [list(range(1, 5)), list(range(5, 9)), list(range(9, 13))]


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_workload_returns_every_block(model_dir, chunked, prefix_caching, seed):
    """The scheduler and block manager together: a tight pool, shared prefixes and staggered arrivals.

    Every step: reference counts equal the number of holders, the free list is
    exactly the unheld blocks, limits hold, and every sequence reads its own
    K/V. At the end: every block free with ref_count 0, and every sequence
    produced exactly max_tokens.
    """
    rng = random.Random(seed)
    block_size, num_blocks, max_seqs = 4, 16, 6
    budget = 8 if chunked else 64
    sched = make_scheduler(model_dir, num_blocks=num_blocks, block_size=block_size, prefix_caching=prefix_caching,
                           max_num_seqs=max_seqs, max_num_batched_tokens=budget, max_model_len=64,
                           enable_chunked_prefill=chunked)
    bm = sched.block_manager
    bases = [[rng.randrange(1, 900) for _ in range(24)] for _ in range(3)]
    plan = []   # (arrival step, prompt, max_tokens)
    for _ in range(50):
        prompt = rng.choice(bases)[:rng.randrange(25)] + [rng.randrange(1, 900) for _ in range(rng.randrange(1, 17))]
        max_tokens = rng.randrange(1, 21)
        assert -(-(len(prompt) + max_tokens) // block_size) <= num_blocks   # each fits the pool alone
        plan.append((rng.randrange(60), prompt, max_tokens))
    plan.sort(key=lambda p: p[0])

    all_seqs: list[Sequence] = []
    kv: dict = {}
    hits = 0
    for step in range(5000):
        while plan and plan[0][0] <= step:
            _, prompt, max_tokens = plan.pop(0)
            all_seqs.append(add(sched, prompt, max_tokens))
        if not plan and sched.is_finished():
            break
        had_work = not sched.is_finished()
        before = {id(s): (s.num_cached_tokens, len(s)) for s in all_seqs}
        waiting_before = {id(s) for s in sched.waiting}
        seqs, is_prefill = run_step(sched, kv)
        assert bool(seqs) == had_work                 # never an empty step with work queued
        assert len(sched.running) <= max_seqs
        if is_prefill:
            assert sum(s.num_scheduled_tokens for s in seqs) <= budget
        else:
            assert len(seqs) <= min(max_seqs, budget)
            for s in seqs:
                assert before[id(s)][0] == before[id(s)][1] - 1
        for s in seqs:
            if id(s) in waiting_before:      # admitted this step: its cached tokens are prefix hits
                hits += events(sched, "SCHEDULED", s)[-1]["num_cached_tokens"] > 0
        holders = [0] * num_blocks
        for s in all_seqs:
            if s.status != SequenceStatus.RUNNING:
                assert s.block_table == []
            for block_id in s.block_table:
                holders[block_id] += 1
        assert [b.ref_count for b in bm.blocks] == holders
        assert set(bm.free_block_ids) == {i for i, n in enumerate(holders) if n == 0}
    else:
        pytest.fail("workload did not finish in 5000 steps")

    assert len(all_seqs) == 50
    assert bm.num_free_blocks == num_blocks
    assert all(b.ref_count == 0 for b in bm.blocks)
    for s in all_seqs:
        assert s.is_finished and s.block_table == []
        assert s.num_output_tokens == s.sampling_params.max_tokens
    # The workload exercised what it is meant to.
    assert any(s.num_preemptions > 0 for s in all_seqs)
    assert (hits > 0) == prefix_caching
