"""Unit tests for `reference.engine.scheduler`, driven without a model.

`run_step` plays the engine's part: schedule, then for each scheduled sequence
record its computed K/V (`mark_computed`), append a fake token when its
scheduled tokens reached its end, and finish it at `max_tokens`. Optionally it
also keeps a fake paged KV cache (`kv`: slot -> the prefix that token's K/V
stand for) and checks that every position a sequence attends to holds its own
prefix: a wrong block table, a stale prefix hit or a block overwritten while
shared all show up there.

Expected schedules are worked out by hand in each test from the policy in the
scheduler's docstring (prefill first, FCFS, newest request preempted).
Numbers in docstrings refer to docs/design.md §2, "Edge cases".
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


def summary(seqs: list[Sequence]) -> list[tuple[int, int]]:
    return [(s.seq_id, s.num_scheduled_tokens) for s in seqs]


def events(sched: Scheduler, name: str, seq: Sequence) -> list[dict]:
    return [e for e in sched.log.events if e["event"] == name and e["seq_id"] == seq.seq_id]


# -- 1. whole prompt hits the prefix cache ------------------------------------------

@pytest.mark.parametrize("prompt_len, expected_new", [(8, 4), (9, 1), (4, 4)])
def test_fully_cached_prompt_is_scheduled_with_tokens(model_dir, prompt_len, expected_new):
    """DESIGN 1: a second identical prompt is scheduled with >= 1 token, and samples.

    Block size 4: a block-aligned prompt of 8 recomputes its last block (4
    tokens); a prompt of 9 recomputes its single trailing token; a one-block
    prompt hits nothing.
    """
    sched = make_scheduler(model_dir, num_blocks=16)
    prompt = list(range(1, prompt_len + 1))
    first = add(sched, prompt, max_tokens=3)
    run_step(sched)
    second = add(sched, prompt, max_tokens=3)
    seqs, is_prefill = run_step(sched)
    assert is_prefill and seqs == [second]
    assert second.num_scheduled_tokens == expected_new
    assert second.num_output_tokens == 1                # it sampled its first token
    scheduled = events(sched, "SCHEDULED", second)[0]
    assert scheduled["num_new_tokens"] == expected_new
    assert scheduled["num_cached_tokens"] == prompt_len - expected_new
    if prompt_len % 4 == 0:
        assert second.block_table[-1] != first.block_table[-1]


# -- 3. preemption by recompute ---------------------------------------------------

def test_preemption_evicts_newest_and_requeues_it_at_front(model_dir):
    """DESIGN 3: decode out of blocks preempts the most recently admitted sequence.

    Block size 4, 5 blocks, max 4 running. A, B and D have one-block prompts,
    C a 2-token prompt; they take blocks 0-3 and each sample a token. In the
    decode step A (length 5: its new token starts a block) takes the last free
    block; B needs one too and none is free, so D (admitted last; C is older)
    gives its block back and B takes it. C needs no new block. E waits behind D.
    """
    sched = make_scheduler(model_dir, num_blocks=5, max_num_seqs=4)
    a = add(sched, [1, 2, 3, 4])
    b = add(sched, [5, 6, 7, 8])
    c = add(sched, [9, 10])
    d = add(sched, [13, 14, 15, 16])
    e = add(sched, [17, 18, 19, 20])
    seqs, is_prefill = run_step(sched)
    assert is_prefill and seqs == [a, b, c, d]
    assert list(sched.waiting) == [e]

    seqs, is_prefill = run_step(sched)
    assert not is_prefill and summary(seqs) == [(a.seq_id, 1), (b.seq_id, 1), (c.seq_id, 1)]
    assert list(sched.running) == [a, b, c]
    assert list(sched.waiting) == [d, e]                  # the victim goes first
    assert d.status == SequenceStatus.WAITING
    assert d.block_table == [] and d.num_cached_tokens == 0
    assert d.num_preemptions == 1
    assert d.num_output_tokens == 1                       # its token is kept, to be recomputed
    assert a.num_preemptions == b.num_preemptions == c.num_preemptions == 0
    bm = sched.block_manager
    assert bm.num_free_blocks == 0
    assert sorted(a.block_table + b.block_table + c.block_table) == [0, 1, 2, 3, 4]

    preempted = events(sched, "PREEMPTED", d)
    assert len(preempted) == 1 and preempted[0]["blocks_freed"] == 1 and preempted[0]["step"] == 1
    queued = events(sched, "QUEUED", d)
    assert [q["reason"] for q in queued] == ["new", "preempted"]
    assert queued[1]["step"] == 1
    names = [ev["event"] for ev in sched.log.events if ev["seq_id"] == d.seq_id]
    assert names.index("PREEMPTED") + 1 == names.index("QUEUED", 1)


def test_capped_decode_keeps_running_in_admission_order(model_dir):
    """DESIGN 3/8: a decode batch capped by the token budget leaves `running` in admission
    order, so "the newest gives way" still means the most recently admitted.

    Chunked prefill, budget 2, four one-token prompts: decode steps take 2 sequences.
    """
    sched = make_scheduler(model_dir, num_blocks=16, max_num_seqs=4, enable_chunked_prefill=True,
                           max_num_batched_tokens=2)
    s = [add(sched, [i + 1], max_tokens=4) for i in range(4)]
    run_step(sched)                                   # prefill s0, s1
    run_step(sched)                                   # prefill s2, s3
    seqs, is_prefill = run_step(sched)
    assert not is_prefill and len(seqs) == 2
    assert list(sched.running) == s


def test_sequence_that_preempts_itself_leaves_running(model_dir):
    """DESIGN 3: the last running sequence that cannot grow preempts itself and is not kept.

    Block size 4, 3 blocks. A and B (one block each) decode: A takes the free
    block, B finds none and nobody else is running, so B preempts itself.
    """
    sched = make_scheduler(model_dir, num_blocks=3)
    a = add(sched, [1, 2, 3, 4], max_tokens=3)
    b = add(sched, [5, 6, 7, 8], max_tokens=3)
    run_step(sched)
    seqs, is_prefill = run_step(sched)
    assert not is_prefill and seqs == [a]
    assert list(sched.running) == [a]
    assert list(sched.waiting) == [b]
    assert b.status == SequenceStatus.WAITING and b.block_table == []
    assert len(events(sched, "PREEMPTED", b)) == 1
    # Both still finish, each with exactly max_tokens outputs, and every block comes back.
    for _ in range(20):
        if sched.is_finished():
            break
        run_step(sched)
    assert sched.is_finished()
    assert a.num_output_tokens == 3 and b.num_output_tokens == 3
    assert sched.block_manager.num_free_blocks == 3


def test_sequence_outgrowing_whole_pool_gives_empty_schedule(model_dir):
    """DESIGN 3/8: if decode preempts everyone and nothing can be readmitted, schedule()
    returns no sequences (the engine turns that into an error) instead of spinning.

    The engine refuses such a request at admission; here the scheduler is fed
    one directly. Block size 2, 1 block: a 2-token prompt fits, but its first
    sampled token needs a second block.
    """
    sched = make_scheduler(model_dir, num_blocks=1, block_size=2)
    a = add(sched, [1, 2], max_tokens=4)
    seqs, is_prefill = run_step(sched)
    assert is_prefill and seqs == [a] and len(a) == 3
    seqs, is_prefill = sched.schedule()
    assert seqs == []
    assert list(sched.waiting) == [a] and not sched.running
    assert a.block_table == [] and a.status == SequenceStatus.WAITING
    assert sched.block_manager.num_free_blocks == 1
    assert sched.block_manager.blocks[0].ref_count == 0


# -- 4. preemption, then a prefix hit on re-prefill -----------------------------------

@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preempted_sequence_hits_its_own_cached_prefix(model_dir, prefix_caching):
    """DESIGN 4: the victim's freed blocks stay cached, and its re-prefill hits them.

    Block size 4, 5 blocks. A=[0], B=[1], C=[2, 3] (8 tokens), block 4 free.
    Decode: A takes 4; B needs one, so C is preempted: it frees 3 then 2 and B
    takes 3 (least recently freed), evicting C's second block. A and B finish
    (max_tokens 2). C (now 9 tokens) is readmitted: its first block, still in
    the free list, is a hit; it recomputes tokens 4..8.
    """
    sched = make_scheduler(model_dir, num_blocks=5, prefix_caching=prefix_caching)
    a = add(sched, [1, 2, 3, 4], max_tokens=2)
    b = add(sched, [5, 6, 7, 8], max_tokens=2)
    c = add(sched, [9, 10, 11, 12, 13, 14, 15, 16], max_tokens=3)
    kv: dict = {}
    run_step(sched, kv)
    assert c.block_table == [2, 3]
    seqs, is_prefill = run_step(sched, kv)
    assert not is_prefill and seqs == [a, b]
    assert events(sched, "SCHEDULED", a)[-1]["block_table"] == [0, 4]
    assert events(sched, "SCHEDULED", b)[-1]["block_table"] == [1, 3]
    assert c.status == SequenceStatus.WAITING and c.block_table == []
    assert a.is_finished and b.is_finished
    assert len(c) == 9

    seqs, is_prefill = run_step(sched, kv)
    assert is_prefill and seqs == [c]
    expected_cached = 4 if prefix_caching else 0
    assert c.num_scheduled_tokens == 9 - expected_cached
    assert events(sched, "SCHEDULED", c)[-1]["num_cached_tokens"] == expected_cached
    if prefix_caching:
        assert c.block_table[0] == 2                     # the same physical block as before
    assert c.num_output_tokens == 2                      # the re-prefill sampled its second token
    while not sched.is_finished():
        run_step(sched, kv)
    assert c.num_output_tokens == 3


# -- 6. decode position --------------------------------------------------------------

def _bare_model_runner(block_size: int):
    """A ModelRunner with no model: enough for its input preparation, which needs only these."""
    import torch

    from reference.engine.model_runner import ModelRunner
    runner = object.__new__(ModelRunner)
    runner.block_size = block_size
    runner.device = torch.device("cpu")
    return runner


def test_decode_input_is_at_position_len_minus_one(model_dir):
    """DESIGN 6: a decode step feeds the newest token at position len - 1, into its slot."""
    sched = make_scheduler(model_dir, num_blocks=8)
    seq = add(sched, list(range(1, 10)), max_tokens=5)   # 9 tokens
    run_step(sched)                                       # prefill, samples token 10
    run_step(sched)                                       # decode, samples token 11
    seqs, is_prefill = sched.schedule()                   # decode of token 11 (position 10)
    assert not is_prefill and seqs == [seq]
    assert len(seq) == 11 and seq.num_cached_tokens == len(seq) - 1

    runner = _bare_model_runner(4)
    input_ids, positions, meta = runner.prepare_decode([seq])
    every_slot = [b * 4 + o for b in seq.block_table for o in range(4)]   # slot of each position
    assert input_ids.tolist() == [seq.token_ids[-1]]
    assert positions.tolist() == [len(seq) - 1]
    assert meta.slot_mapping.tolist() == [every_slot[len(seq) - 1]]
    assert meta.context_lens.tolist() == [len(seq)]


def test_prefill_chunk_inputs_end_at_chunk(model_dir):
    """DESIGN 9: a chunk's query covers [cached, cached + scheduled) and seqlen_k is the chunk's end."""
    sched = make_scheduler(model_dir, num_blocks=16, enable_chunked_prefill=True, max_num_batched_tokens=6)
    long = add(sched, list(range(1, 12)), max_tokens=2)   # 11 tokens
    run_step(sched)                                       # first chunk: tokens 0..5
    short = add(sched, [40, 41, 42], max_tokens=2)
    seqs, is_prefill = sched.schedule()
    # The unfinished prefill goes first (5 tokens), then the new prompt gets the last 1 of budget 6.
    assert is_prefill and summary(seqs) == [(long.seq_id, 5), (short.seq_id, 1)]

    runner = _bare_model_runner(4)
    input_ids, positions, meta = runner.prepare_prefill(seqs)
    slots_long = [b * 4 + o for b in long.block_table for o in range(4)]
    slots_short = [b * 4 + o for b in short.block_table for o in range(4)]
    assert input_ids.tolist() == long.token_ids[6:11] + short.token_ids[0:1]
    assert positions.tolist() == [6, 7, 8, 9, 10, 0]
    assert meta.slot_mapping.tolist() == slots_long[6:11] + slots_short[0:1]
    assert meta.context_lens.tolist() == [11, 1]
    assert meta.cu_seqlens_q.tolist() == [0, 5, 6]
    assert meta.cu_seqlens_k.tolist() == [0, 11, 12]


# -- 8. continuous batching limits ------------------------------------------------------

def test_token_budget_is_first_come_first_served(model_dir):
    """DESIGN 8 (scheduler part): a prompt over the remaining budget waits, and so do later ones.

    Budget 16. A (10) is admitted; B (10) would exceed the remaining 6, so it
    waits, and C (3), though it would fit, does not jump ahead of B.
    """
    sched = make_scheduler(model_dir, num_blocks=32, max_num_batched_tokens=16, max_model_len=16)
    a = add(sched, list(range(1, 11)), max_tokens=4)
    b = add(sched, list(range(21, 31)), max_tokens=4)
    c = add(sched, [41, 42, 43], max_tokens=4)
    seqs, is_prefill = run_step(sched)
    assert is_prefill and summary(seqs) == [(a.seq_id, 10)]
    assert list(sched.waiting) == [b, c]
    seqs, is_prefill = run_step(sched)                 # prefill first: a's decode waits
    assert is_prefill and summary(seqs) == [(b.seq_id, 10), (c.seq_id, 3)]
    seqs, is_prefill = run_step(sched)                 # decode: one token for every running seq
    assert not is_prefill and summary(seqs) == [(a.seq_id, 1), (b.seq_id, 1), (c.seq_id, 1)]
    assert [s.num_output_tokens for s in (a, b, c)] == [2, 2, 2]


def test_token_budget_counts_only_uncached_tokens(model_dir):
    """DESIGN 8: a prompt whose prefix is cached needs budget only for its new tokens.

    Budget 16. X (10 new tokens) leaves 6; Y is 12 tokens long but 8 are
    cached, so it needs 4 and joins the same step.
    """
    sched = make_scheduler(model_dir, num_blocks=32, max_num_batched_tokens=16, max_model_len=16)
    base = add(sched, list(range(1, 13)), max_tokens=1)
    run_step(sched)
    assert base.is_finished
    x = add(sched, list(range(50, 60)), max_tokens=1)
    y = add(sched, list(range(1, 9)) + [90, 91, 92, 93], max_tokens=1)
    seqs, _ = run_step(sched)
    assert summary(seqs) == [(x.seq_id, 10), (y.seq_id, 4)]


def test_max_num_seqs_and_continuous_batching(model_dir):
    """DESIGN 8: at most max_num_seqs run; a finished one's place is taken at the next step."""
    sched = make_scheduler(model_dir, num_blocks=32, max_num_seqs=2)
    s = [add(sched, [10 * i + 1, 10 * i + 2, 10 * i + 3], max_tokens=2) for i in range(5)]
    expected = [
        (True, [s[0], s[1]]),      # prefill: 2 admitted, 3 wait
        (False, [s[0], s[1]]),     # decode; both reach max_tokens and leave
        (True, [s[2], s[3]]),
        (False, [s[2], s[3]]),
        (True, [s[4]]),
        (False, [s[4]]),
    ]
    for want_prefill, want_seqs in expected:
        seqs, is_prefill = run_step(sched)
        assert (is_prefill, seqs) == (want_prefill, want_seqs)
        assert len(sched.running) <= 2
        if not is_prefill:
            assert all(q.num_scheduled_tokens == 1 for q in seqs)
    assert sched.is_finished()
    assert all(q.num_output_tokens == 2 and q.is_finished for q in s)


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


# -- 9. chunked prefill -----------------------------------------------------------------

def test_chunked_prefill_splits_long_prompt(model_dir):
    """DESIGN 9: chunks fit the budget, only the last one samples, decode waits for it.

    Budget 4. A (2 tokens) and B (10) arrive together: step 0 gives A 2 and B
    the remaining 2; then B gets 4, then its last 4 (which sample); then both decode.
    """
    sched = make_scheduler(model_dir, num_blocks=16, enable_chunked_prefill=True, max_num_batched_tokens=4)
    a = add(sched, [1, 2], max_tokens=3)
    b = add(sched, list(range(10, 20)), max_tokens=3)
    kv: dict = {}
    expected = [
        (True, [(a.seq_id, 2), (b.seq_id, 2)], [1, 0]),
        (True, [(b.seq_id, 4)], [1, 0]),
        (True, [(b.seq_id, 4)], [1, 1]),
        (False, [(a.seq_id, 1), (b.seq_id, 1)], [2, 2]),
    ]
    for want_prefill, want_summary, want_outputs in expected:
        seqs, is_prefill = run_step(sched, kv)
        assert (is_prefill, summary(seqs)) == (want_prefill, want_summary)
        assert [a.num_output_tokens, b.num_output_tokens] == want_outputs
    assert b.num_cached_tokens == len(b) - 1


def test_chunked_prefill_respects_budget_and_never_decodes_early(model_dir):
    """DESIGN 9: over a longer run, every chunk fits, ends within the sequence, and
    no sequence is decoded before its prompt is fully computed."""
    rng = random.Random(7)
    budget = 5
    sched = make_scheduler(model_dir, num_blocks=64, enable_chunked_prefill=True, max_num_batched_tokens=budget)
    seqs_all = [add(sched, [rng.randrange(1, 900) for _ in range(rng.randrange(1, 23))], max_tokens=3)
                for _ in range(8)]
    kv: dict = {}
    for _ in range(200):
        if sched.is_finished():
            break
        before = {s.seq_id: (s.num_cached_tokens, len(s), s.num_output_tokens) for s in seqs_all}
        seqs, is_prefill = run_step(sched, kv)
        assert sum(s.num_scheduled_tokens for s in seqs) <= budget
        for s in seqs:
            cached, length, outputs = before[s.seq_id]
            if not is_prefill:
                assert cached == length - 1 and outputs >= 1      # prompt fully computed first
            if s.num_output_tokens == outputs:                     # an intermediate chunk
                assert s.num_cached_tokens < len(s)
    assert sched.is_finished()
    assert all(s.num_output_tokens == 3 for s in seqs_all)


# -- 10. randomized workload ---------------------------------------------------------------

@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("prefix_caching", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_workload_returns_every_block(model_dir, chunked, prefix_caching, seed):
    """DESIGN 10: a tight pool, shared prefixes and staggered arrivals; run to completion.

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
