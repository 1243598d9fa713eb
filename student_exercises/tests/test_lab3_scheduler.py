# Generated from assignments/lab3_scheduler/public/test_lab3_scheduler.py by `inferlab exercises build`: edit it there, not here.
"""Lab 3: the scheduler (`engine/scheduler.py`), driven without a model.

`Sim.step` plays the engine's part after `schedule()`: it records what was
scheduled, marks the scheduled tokens computed in the block manager, appends a
fake sampled token when a sequence's scheduled tokens reach its end, and
finishes a sequence at its max_tokens. The block manager is the one from lab 2
(given to you, filled in, in the lab 3 release).

Each test's expected schedule is worked out by hand in its docstring from the
policy in the scheduler's module docstring: prefill first, first come first
served, budgets (max_num_seqs, max_num_batched_tokens, free KV blocks), and
preemption of the newest running request by recompute. Block size is 4.
A schedule line reads "prefill A:6 B:6" (sequence: tokens this step) or
"decode A B" (one token each). "Edge case N" in a docstring is docs/design.md §2's.
"""
from __future__ import annotations

import pytest

from lab_diagnostics import assert_same_list

pytestmark = pytest.mark.lab3

BS = 4


class Sim:
    """A scheduler of the implementation under test, with a real block manager and a fake model."""

    def __init__(self, impl, model_dir: str, num_blocks: int, prefix_caching: bool = True, **config):
        cfg_cls = impl.module("config").Config
        self.Sequence = impl.module("engine.sequence").Sequence
        self.SamplingParams = impl.module("sampling_params").SamplingParams
        self.status = impl.module("engine.sequence").SequenceStatus
        cfg = cfg_cls(model=model_dir, device="cpu", kvcache_block_size=BS, num_kvcache_blocks=num_blocks,
                      enable_prefix_caching=prefix_caching, **config)
        self.bm = impl.module("engine.block_manager").BlockManager(num_blocks, BS, prefix_caching)
        log = impl.module("engine.lifecycle").LifecycleLog()
        self.sched = impl.module("engine.scheduler").Scheduler(cfg, self.bm, log)
        self.names: dict[int, str] = {}
        self.trace: list[str] = []

    def add(self, name: str, prompt_len: int, max_tokens: int, first_token: int = 0, prefix: list[int] = ()):
        token_ids = list(prefix) + list(range(first_token, first_token + prompt_len - len(prefix)))
        params = self.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        seq = self.Sequence(token_ids, params, BS)
        self.names[seq.seq_id] = name
        self.sched.add(seq)
        return seq

    def describe(self, seqs: list, is_prefill: bool) -> str:
        if not seqs:
            return "nothing scheduled"
        if is_prefill:
            return "prefill " + " ".join(f"{self.names[s.seq_id]}:{s.num_scheduled_tokens}" for s in seqs)
        parts = [self.names[s.seq_id] + ("" if s.num_scheduled_tokens == 1 else f":{s.num_scheduled_tokens}")
                 for s in seqs]
        return "decode " + " ".join(parts)

    def step(self) -> list:
        seqs, is_prefill = self.sched.schedule()
        self.trace.append(self.describe(seqs, is_prefill))
        for seq in seqs:
            self.bm.mark_computed(seq, seq.num_scheduled_tokens)
            if seq.num_cached_tokens == len(seq):          # the chunk reached the end: a token is sampled
                seq.append_token(500 + len(seq) % 50)
                if seq.num_output_tokens >= seq.sampling_params.max_tokens:
                    self.sched.finish(seq)
        self.sched.log.end_step()
        return seqs

    def run(self, max_steps: int = 30) -> list[str]:
        while not self.sched.is_finished() and len(self.trace) < max_steps:
            seqs = self.step()
            if not seqs:
                break      # the real engine raises here: report the schedule so far
        return self.trace

    def queue(self, name: str) -> list[str]:
        return [self.names[s.seq_id] for s in getattr(self.sched, name)]


def check_schedule(expected: list[str], actual: list[str], what: str) -> None:
    assert_same_list(f"schedule ({what})", expected, actual, label=lambda i: f"step {i}")


# -- admission ---------------------------------------------------------------------------------

@pytest.mark.points(3)
@pytest.mark.covers("lab3.admit", "lab3.schedule_decode")
def test_admission_is_first_come_first_served_under_the_token_budget(impl, config_only_model_dir):
    """Budget 16 tokens. A, B, C have 6-token prompts, 2 output tokens each.

    step 0: A (6) and B (6) fit, C (6 > 4 left) waits;   step 1: prefill first: C alone;
    step 2: decode A B C, and all three reach max_tokens.
    """
    sim = Sim(impl, config_only_model_dir, 32, max_num_batched_tokens=16, max_model_len=16)
    for name in "ABC":
        sim.add(name, 6, 2, first_token=100 * (ord(name) - 64))
    sim.step()
    if sim.queue("running") != ["A", "B"] or sim.queue("waiting") != ["C"]:
        pytest.fail(f"after step 0: expected running [A, B] and waiting [C], got running {sim.queue('running')} "
                    f"and waiting {sim.queue('waiting')}", pytrace=False)
    check_schedule(["prefill A:6 B:6", "prefill C:6", "decode A B C"], sim.run(), "budget 16, three 6-token prompts")


@pytest.mark.points(2)
@pytest.mark.covers("lab3.admit")
def test_admitted_sequences_run_and_hold_their_blocks(impl, config_only_model_dir):
    """Admission allocates: each admitted sequence is RUNNING with ceil(len / 4) blocks."""
    sim = Sim(impl, config_only_model_dir, 32, max_num_batched_tokens=16, max_model_len=16)
    a, b = sim.add("A", 5, 2), sim.add("B", 8, 2, first_token=50)
    sim.step()
    got = {"A": (a.status.name, len(a.block_table)), "B": (b.status.name, len(b.block_table))}
    expected = {"A": ("RUNNING", 2), "B": ("RUNNING", 2)}
    if got != expected:
        pytest.fail(f"(status, number of blocks) after admission: expected {expected}, got {got}", pytrace=False)


@pytest.mark.points(2)
@pytest.mark.covers("lab3.admit", "lab3.schedule_decode")
def test_admission_respects_max_num_seqs(impl, config_only_model_dir):
    """max_num_seqs 2. A (max 2 tokens), B (max 3), C (max 1), 2-token prompts.

    step 0: A B (C waits: no seat);  step 1: decode A B, A ends;  step 2: prefill C (it ends);  step 3: decode B.
    """
    sim = Sim(impl, config_only_model_dir, 32, max_num_seqs=2, max_num_batched_tokens=16, max_model_len=16)
    sim.add("A", 2, 2, first_token=10)
    sim.add("B", 2, 3, first_token=20)
    sim.add("C", 2, 1, first_token=30)
    check_schedule(["prefill A:2 B:2", "decode A B", "prefill C:2", "decode B"], sim.run(), "max_num_seqs 2")


@pytest.mark.points(3)
@pytest.mark.covers("lab3.admit")
def test_no_overtaking_when_kv_blocks_run_short(impl, config_only_model_dir):
    """4 blocks. A: 8 tokens (2 blocks, max 3), B: 12 tokens (3 blocks), C: 2 tokens (1 block).

    step 0: A; B needs 3 blocks, 2 are free, so B waits, and C, behind B, waits too (no overtaking);
    steps 1-2: decode A (its 9th token takes the 3rd block), A ends and frees 3 blocks;
    step 3: B and C together.
    """
    sim = Sim(impl, config_only_model_dir, 4, max_num_batched_tokens=32, max_model_len=16)
    sim.add("A", 8, 3, first_token=10)
    sim.add("B", 12, 1, first_token=40)
    sim.add("C", 2, 1, first_token=80)
    check_schedule(["prefill A:8", "decode A", "decode A", "prefill B:12 C:2"], sim.run(), "4 KV blocks")


@pytest.mark.points(1)
@pytest.mark.covers("lab3.admit")
def test_a_request_waiting_for_blocks_is_still_waiting(impl, config_only_model_dir):
    """4 blocks. A: 8 tokens (2 blocks, max 3), B: 12 tokens (3 blocks): step 0 admits A; B, refused for lack of
    KV blocks, stays at the head of `waiting` with status WAITING, holding no block (rule 2: a request becomes
    RUNNING only when it is admitted). The engine reads the status: an abort, or a request's output, depends on it.
    """
    sim = Sim(impl, config_only_model_dir, 4, max_num_batched_tokens=32, max_model_len=16)
    sim.add("A", 8, 3, first_token=10)
    b = sim.add("B", 12, 1, first_token=40)
    sim.step()
    got = {"waiting": sim.queue("waiting"), "running": sim.queue("running"), "B status": b.status.name,
           "B blocks": list(b.block_table)}
    expected = {"waiting": ["B"], "running": ["A"], "B status": "WAITING", "B blocks": []}
    if got != expected:
        pytest.fail(f"after step 0 (B needs 3 blocks, 2 are free): expected {expected}, got {got}", pytrace=False)


@pytest.mark.points(2)
@pytest.mark.covers("lab3.admit")
def test_no_overtaking_when_the_token_budget_runs_short(impl, config_only_model_dir):
    """Budget 16. A: 10 tokens, B: 8, C: 4, one output token each.

    step 0: A (10); B (8) does not fit the 6 left, so B waits, and C, which would fit, waits behind B
    (first come, first served holds for the token budget as for KV blocks);  step 1: B and C together.
    """
    sim = Sim(impl, config_only_model_dir, 32, max_num_batched_tokens=16, max_model_len=16)
    sim.add("A", 10, 1, first_token=100)
    sim.add("B", 8, 1, first_token=200)
    sim.add("C", 4, 1, first_token=300)
    check_schedule(["prefill A:10", "prefill B:8 C:4"], sim.run(), "budget 16: C must not overtake B")


@pytest.mark.points(3)
@pytest.mark.covers("lab3.admit")
def test_token_budget_counts_only_uncached_tokens(impl, config_only_model_dir):
    """Budget 16. X (a shared 8-token prefix + 1) is computed first and finishes: its 2 full blocks stay cached.

    Y and Z are that prefix + 6 tokens (14 tokens). Each costs 14 - 8 = 6 of the budget, so both fit in one step.
    """
    sim = Sim(impl, config_only_model_dir, 32, max_num_batched_tokens=16, max_model_len=16)
    prefix = list(range(900, 908))
    sim.add("X", 9, 1, first_token=1, prefix=prefix)
    sim.step()
    sim.add("Y", 14, 1, first_token=100, prefix=prefix)
    sim.add("Z", 14, 1, first_token=200, prefix=prefix)
    sim.run()
    check_schedule(["prefill X:9", "prefill Y:6 Z:6"], sim.trace, "budget 16, two 14-token prompts with 8 cached")


@pytest.mark.points(2)
@pytest.mark.covers("lab3.admit")
@pytest.mark.parametrize("prompt_len, new, cached, table", [(4, 4, 0, [1]), (8, 4, 4, [0, 2]), (9, 1, 8, [0, 1, 3])])
def test_a_prompt_wholly_in_the_cache_still_computes_its_last_token(impl, config_only_model_dir, prompt_len, new,
                                                                   cached, table):
    """X computes a prompt and finishes (one output token): its full blocks stay cached in the free list.
    Y is the same prompt. Only full blocks inside Y's first len - 1 tokens hit, so Y is admitted with at least
    one token to compute, and SCHEDULED logs the table and cached count that admission gave it (allocate, then
    _schedule).

    4 tokens: X = [0]; no block lies inside Y's first 3 tokens: Y computes all 4 in fresh block 1.
    8 tokens: X = [0, 1]; block 0 hits, block 1 holds Y's last token: 4 cached, 4 computed, table [0, 2].
    9 tokens: X = [0, 1, 2]; blocks 0 and 1 hit: 8 cached, 1 computed, table [0, 1, 3].
    """
    sim = Sim(impl, config_only_model_dir, 16, max_num_batched_tokens=16, max_model_len=16)
    sim.add("X", prompt_len, 1, first_token=100)
    sim.step()
    y = sim.add("Y", prompt_len, 2, first_token=100)
    sim.step()
    check_schedule([f"prefill X:{prompt_len}", f"prefill Y:{new}"], sim.trace,
                   f"the same {prompt_len}-token prompt twice")
    logged = [(e["is_prefill"], e["num_new_tokens"], e["num_cached_tokens"], e["block_table"])
              for e in sim.sched.log.events if e["event"] == "SCHEDULED" and e["seq_id"] == y.seq_id]
    if logged != [(True, new, cached, table)]:
        pytest.fail(f"Y's SCHEDULED event (is_prefill, num_new_tokens, num_cached_tokens, block_table): expected "
                    f"{[(True, new, cached, table)]}, got {logged} (admission allocates first, so the event shows "
                    "the prefix hit)", pytrace=False)


# -- decode -------------------------------------------------------------------------------------

@pytest.mark.points(3)
@pytest.mark.covers("lab3.schedule_decode")
def test_decode_batch_is_capped_by_the_token_budget(impl, config_only_model_dir):
    """Budget 8 tokens, 10 seats. Ten 1-token prompts: 8 admitted in step 0, 2 in step 1.

    A decode step computes one token per sequence, so it takes at most 8: the first 8 in the running
    queue (A..H, which stay at the front). A..H end after 3 tokens, I and J after 2.
    """
    sim = Sim(impl, config_only_model_dir, 32, max_num_seqs=10, max_num_batched_tokens=8, max_model_len=8)
    names = "ABCDEFGHIJ"
    for i, name in enumerate(names):
        sim.add(name, 1, 3 if name < "I" else 2, first_token=10 * i)
    first8 = " ".join(names[:8])
    check_schedule(["prefill " + " ".join(f"{n}:1" for n in names[:8]), "prefill I:1 J:1",
                    f"decode {first8}", f"decode {first8}", "decode I J"], sim.run(), "budget 8, ten sequences")


# -- preemption ----------------------------------------------------------------------------------

@pytest.mark.points(2)
@pytest.mark.covers("lab3.schedule_decode")
def test_a_decode_token_that_starts_a_block_is_logged_with_it(impl, config_only_model_dir):
    """SCHEDULED logs the block table the step writes to: a decode sequence gets its new block (may_append)
    before it is scheduled (_schedule logs the table), so the logged table already holds the new token's slot.

    32 blocks. A and B: 4-token prompts (one full block each), 3 output tokens each.
    step 0: prefill A:4 B:4, tables A [0], B [1]; each samples its 5th token;
    step 1: decode A B: each 5th token starts a second block: A takes block 2, then B block 3;
    step 2: decode A B: the 6th tokens fit in those blocks, nothing new; both reach max_tokens.
    """
    sim = Sim(impl, config_only_model_dir, 32, max_num_batched_tokens=16, max_model_len=16)
    sim.add("A", 4, 3, first_token=100)
    sim.add("B", 4, 3, first_token=200)
    sim.run()
    logged = [f"step {e['step']}: {sim.names[e['seq_id']]} {e['block_table']}"
              for e in sim.sched.log.events if e["event"] == "SCHEDULED"]
    expected = ["step 0: A [0]", "step 0: B [1]", "step 1: A [0, 2]", "step 1: B [1, 3]",
                "step 2: A [0, 2]", "step 2: B [1, 3]"]
    assert_same_list("block_table of each SCHEDULED event (append the block, then _schedule)", expected, logged,
                     label=lambda i: f"SCHEDULED event {i}")


@pytest.mark.points(2)
@pytest.mark.covers("lab3.preempt")
def test_preempt_frees_blocks_and_requeues_at_the_front(impl, config_only_model_dir):
    sim = Sim(impl, config_only_model_dir, 8, max_num_batched_tokens=16, max_model_len=16)
    a = sim.add("A", 6, 4, first_token=10)
    sim.add("B", 3, 4, first_token=20)
    sim.step()
    sim.add("C", 2, 4, first_token=30)
    sim.sched.running.remove(a)        # the scheduler takes a sequence out of `running` before preempting it
    sim.sched.preempt(a)
    got = {"waiting": sim.queue("waiting"), "status": a.status.name, "block_table": a.block_table,
           "num_cached_tokens": a.num_cached_tokens, "num_preemptions": a.num_preemptions,
           "free blocks": sim.bm.num_free_blocks}
    expected = {"waiting": ["A", "C"], "status": "WAITING", "block_table": [], "num_cached_tokens": 0,
                "num_preemptions": 1, "free blocks": 8 - 1}
    bad = {k: (expected[k], got[k]) for k in expected if expected[k] != got[k]}
    if bad:
        pytest.fail("after preempt(A): " + "; ".join(f"{k}: expected {e!r}, got {g!r}" for k, (e, g) in bad.items()),
                    pytrace=False)


@pytest.mark.points(4)
@pytest.mark.covers("lab3.schedule_decode", "lab3.preempt")
def test_preemption_evicts_the_newest_and_requeues_it_first(impl, config_only_model_dir):
    """4 blocks; A, B, C, D: 4-token prompts (1 block each); A, B stop after 3 tokens, C, D after 2.

    step 0: all four (pool full).
    step 1: A's 5th token needs a block: evict D (newest); B's needs one: evict C. decode A B.
            Waiting is now C, D: C went in front of D, restoring arrival order.
    step 2: C needs 2 blocks, none free: decode A B, and both end (4 blocks free).
    step 3: C and D are recomputed from scratch: 5 tokens each.
    """
    sim = Sim(impl, config_only_model_dir, 4, max_num_batched_tokens=16, max_model_len=16)
    seqs = {name: sim.add(name, 4, 3 if name in "AB" else 2, first_token=10 * i + 1)
            for i, name in enumerate("ABCD")}
    sim.step()
    sim.step()
    if sim.queue("waiting") != ["C", "D"]:
        pytest.fail(f"after step 1: expected waiting [C, D] (D evicted first, then C in front of it), got "
                    f"{sim.queue('waiting')}; schedule so far {sim.trace}", pytrace=False)
    states = [(s.status.name, s.block_table, s.num_cached_tokens, s.num_preemptions)
              for s in (seqs["C"], seqs["D"])]
    if states != [("WAITING", [], 0, 1)] * 2:
        pytest.fail(f"preempted C and D: expected (WAITING, no blocks, 0 cached, 1 preemption) each, got {states}",
                    pytrace=False)
    check_schedule(["prefill A:4 B:4 C:4 D:4", "decode A B", "decode A B", "prefill C:5 D:5"], sim.run(),
                   "4 blocks, four 4-token prompts")


@pytest.mark.points(3)
@pytest.mark.covers("lab3.schedule_decode", "lab3.preempt")
def test_sequence_that_preempts_itself_is_not_scheduled(impl, config_only_model_dir):
    """Edge case 3. 3 blocks; A, B: 4-token prompts; A stops after 3 tokens, B after 2.

    step 0: A B (1 free block).  step 1: A takes the free block; B needs one, nobody is left to evict:
    B preempts itself and is not scheduled: decode A.  step 2: decode A (B needs 2 blocks, 1 free); A ends.
    step 3: B recomputed: 5 tokens (prefix caching is off here).
    """
    sim = Sim(impl, config_only_model_dir, 3, prefix_caching=False, max_num_batched_tokens=16, max_model_len=16)
    sim.add("A", 4, 3, first_token=10)
    b = sim.add("B", 4, 2, first_token=20)
    sim.step()
    sim.step()
    where = {"running": sim.queue("running"), "waiting": sim.queue("waiting")}
    if where != {"running": ["A"], "waiting": ["B"]} or b.block_table:
        pytest.fail(f"after step 1: expected running [A], waiting [B] and B holding no blocks, got {where} and B "
                    f"holding {b.block_table}; schedule so far {sim.trace}", pytrace=False)
    check_schedule(["prefill A:4 B:4", "decode A", "decode A", "prefill B:5"], sim.run(), "3 blocks, self-preemption")


@pytest.mark.points(3)
@pytest.mark.covers("lab3.schedule_decode", "lab3.preempt", "lab3.admit")
def test_recompute_after_preemption_hits_the_prefix_cache(impl, config_only_model_dir):
    """Edge case 4. 4 blocks; A: 4 tokens (stops after 2); B: 8 tokens (stops after 3).

    step 0: A B (3 blocks used; B's 2 full blocks are computed, hence cached).
    step 1: A takes the last block; B's 9th token needs one: B preempts itself; decode A; A ends.
    step 2: B (9 tokens) is re-admitted: its 8 computed tokens hit the cache, only 1 is recomputed.
    step 3: decode B.
    """
    sim = Sim(impl, config_only_model_dir, 4, max_num_batched_tokens=16, max_model_len=16)
    sim.add("A", 4, 2, first_token=10)
    b = sim.add("B", 8, 3, first_token=20)
    check_schedule(["prefill A:4 B:8", "decode A", "prefill B:1", "decode B"], sim.run(),
                   "preemption, then a prefix-cache hit on re-prefill")
    if b.num_preemptions != 1:
        pytest.fail(f"B.num_preemptions: expected 1, got {b.num_preemptions}", pytrace=False)


@pytest.mark.points(2)
@pytest.mark.covers("lab3.schedule_decode", "lab3.preempt")
def test_a_sequence_preempted_twice_counts_two_preemptions(impl, config_only_model_dir):
    """3 blocks, prefix caching off. A: 2-token prompt (stops after 2), B: 2 tokens (after 4), C: 4 tokens (after 4).

    step 0: A B C (pool full).  step 1: C's 5th token needs a block, nobody is left behind it: C preempts
    itself (1st time); decode A B; A ends.  step 2: C recomputed: 5 tokens.  step 3: decode B C.
    step 4: B's 5th token needs a block: C (newest) is evicted (2nd time); decode B; B ends.  step 5: C again.
    """
    sim = Sim(impl, config_only_model_dir, 3, prefix_caching=False, max_num_batched_tokens=16, max_model_len=16)
    sim.add("A", 2, 2, first_token=10)
    sim.add("B", 2, 4, first_token=20)
    c = sim.add("C", 4, 4, first_token=30)
    check_schedule(["prefill A:2 B:2 C:4", "decode A B", "prefill C:5", "decode B C", "decode B", "prefill C:7"],
                   sim.run(max_steps=6), "3 blocks, C preempted twice")
    if c.num_preemptions != 2:
        pytest.fail(f"C.num_preemptions after two preemptions: expected 2, got {c.num_preemptions} "
                    "(the counter counts every preemption)", pytrace=False)


@pytest.mark.points(2)
@pytest.mark.covers("lab3.schedule_decode", "lab3.preempt")
def test_preemption_goes_on_while_the_victim_freed_no_block(impl, config_only_model_dir):
    """4 blocks. A: 4-token prompt; V: 8 tokens; R: V's 8 tokens and one more (all stop after 4 tokens).

    step 0: A V (3 blocks).  R arrives; step 1: R hits both of V's blocks and computes 1 token (pool full).
    R is retired (as the engine does with a request whose last token is in flight): it leaves `running`
    and keeps its blocks, so V's two blocks are held by R too.
    step 2: A's 5th token needs a block. Evicting V frees none (R still holds them), so there is still no
    slot: with nobody else left, A preempts itself and nothing is scheduled.
    Then R finishes; step 3: A is recomputed, 1 token (its first block hits the cache); V waits, as it
    would need 3 of the 2 blocks A leaves.
    """
    sim = Sim(impl, config_only_model_dir, 4, max_num_batched_tokens=16, max_model_len=16)
    a = sim.add("A", 4, 4, first_token=10)
    v = sim.add("V", 8, 4, first_token=20)
    sim.step()
    r = sim.add("R", 9, 4, prefix=v.token_ids[:8], first_token=90)
    sim.step()
    sim.sched.retire(r)
    try:
        sim.step()
    except Exception as err:  # noqa: BLE001 - the mistake shows as a crash; say what the state was
        pytest.fail(f"step 2 raised {type(err).__name__}: {err}: A needs a block, the newest running request V "
                    "was evicted but freed none (R shares its blocks), so the scheduler must keep going: no one "
                    "is left, so A preempts itself", pytrace=False)
    where = {"running": sim.queue("running"), "waiting": sim.queue("waiting"), "A blocks": a.block_table,
             "free blocks": sim.bm.num_free_blocks}
    if where != {"running": [], "waiting": ["A", "V"], "A blocks": [], "free blocks": 1}:
        pytest.fail(f"after step 2: expected running [], waiting [A, V], A holding no blocks and 1 free block "
                    f"(A's), got {where}; schedule so far {sim.trace}", pytrace=False)
    sim.sched.finish(r)
    sim.sched.log.end_step()
    check_schedule(["prefill A:4 V:8", "prefill R:1", "nothing scheduled", "prefill A:1"], sim.trace + [
        sim.describe(*sim.sched.schedule())], "a victim that frees no block")


# -- chunked prefill (stretch) ---------------------------------------------------------------------

@pytest.mark.stretch
@pytest.mark.points(3)
@pytest.mark.covers("lab3.chunked_prefill", "lab3.admit")
def test_chunked_prefill_splits_a_long_prompt(impl, config_only_model_dir):
    """Chunked prefill, budget 8. A: 20-token prompt (stops after 2), B: 6 tokens (stops after 1), both waiting.

    step 0: A's first 8 (budget spent);  step 1: A's next 8;  step 2: A's last 4, and B admitted with the
    4 tokens left;  step 3: B's last 2 (A is decoding now, but prefill goes first);  step 4: decode A.
    """
    sim = Sim(impl, config_only_model_dir, 32, max_num_batched_tokens=8, max_model_len=32,
              enable_chunked_prefill=True)
    sim.add("A", 20, 2, first_token=100)
    sim.add("B", 6, 1, first_token=200)
    check_schedule(["prefill A:8", "prefill A:8", "prefill A:4 B:4", "prefill B:2", "decode A"], sim.run(),
                   "chunked prefill, budget 8")


@pytest.mark.stretch
@pytest.mark.points(2)
@pytest.mark.covers("lab3.chunked_prefill", "lab3.admit")
def test_chunked_prefill_samples_only_when_the_prompt_is_done(impl, config_only_model_dir):
    """Edge case 9: after each chunk the computed count grows by the chunk; a token appears only after the last."""
    sim = Sim(impl, config_only_model_dir, 32, max_num_batched_tokens=8, max_model_len=32,
              enable_chunked_prefill=True)
    a = sim.add("A", 19, 2, first_token=100)
    progress = []
    for _ in range(3):
        sim.step()
        progress.append((a.num_cached_tokens, a.num_output_tokens))
    assert_same_list("(computed tokens, output tokens) of a 19-token prompt after each step, budget 8",
                     [(8, 0), (16, 0), (19, 1)], progress, label=lambda i: f"step {i}")


# -- the scheduler inside the engine ----------------------------------------------------------------

@pytest.mark.points(4)
@pytest.mark.covers("lab3.admit", "lab3.schedule_decode", "lab3.preempt")
def test_engine_run_under_pressure(impl, tiny_model_dir, engine_parts):
    """Your scheduler inside the real engine: eight requests, four sequences at most, a pool small enough to
    preempt. Every STEP respects max_num_seqs and the token budget, a waiting request holds no blocks, the
    lifecycle log is legal, and each request's tokens are transformers' own greedy tokens.
    """
    from lab_oracle import hf_greedy
    llm_module, params = impl.module("llm"), impl.module("sampling_params")
    llm = llm_module.LLM(tiny_model_dir, engine_parts(), device="cpu", kvcache_block_size=4, num_kvcache_blocks=10,
                         max_num_seqs=4, max_num_batched_tokens=40, max_model_len=40, enable_prefix_caching=True)
    prompts = [list(range(7 * i, 7 * i + 5 + i % 4)) for i in range(8)]
    ids = [llm.add_request(p, params.SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)) for p in prompts]
    outputs: dict[int, list[int]] = {seq_id: [] for seq_id in ids}
    for step in range(1, 301):
        if llm.scheduler.is_finished():
            break
        for out in llm.step():
            outputs[out.seq_id] += out.new_token_ids
        holding = [seq.seq_id for seq in llm.scheduler.waiting if seq.block_table]
        if holding:
            pytest.fail(f"after engine step {step}: waiting request(s) {holding} still hold blocks "
                        "(a preempted sequence must give all its blocks back)", pytrace=False)
    else:
        pytest.fail("the engine did not finish eight short requests in 300 steps", pytrace=False)
    for event in (e for e in llm.log.events if e["event"] == "STEP"):
        if event["batch_size"] > 4 or event["num_tokens"] > 40:
            pytest.fail(f"engine step {event['step']} scheduled {event['batch_size']} sequences and "
                        f"{event['num_tokens']} tokens; the limits are max_num_seqs=4 and "
                        "max_num_batched_tokens=40", pytrace=False)
    problems = impl.module("metrics").check_lifecycle(llm.log.events)
    if problems:
        pytest.fail("the lifecycle log of the run is not legal:\n  " + "\n  ".join(problems[:5]), pytrace=False)
    if not any(e["event"] == "PREEMPTED" for e in llm.log.events):
        pytest.fail("this workload should force at least one preemption (10 blocks for four growing sequences); "
                    "none happened: does schedule_decode check can_append?", pytrace=False)
    for number, (seq_id, prompt) in enumerate(zip(ids, prompts)):
        assert_same_list(f"request {number}'s greedy tokens", hf_greedy(tiny_model_dir, prompt, 9),
                         outputs[seq_id], label=lambda i: f"output token {i}")


@pytest.mark.points(2)
@pytest.mark.covers("lab3.admit")
def test_a_prompt_exactly_filling_the_token_budget_is_admitted(impl, config_only_model_dir):
    """Budget 16. A: 6-token prompt, B: 10 tokens, C: 4 tokens, one output token each.

    step 0: A (6), then B costs exactly the 10 left: admitted too (10 <= 10), C waits;  step 1: C.
    """
    sim = Sim(impl, config_only_model_dir, 32, max_num_batched_tokens=16, max_model_len=16)
    sim.add("A", 6, 1, first_token=100)
    sim.add("B", 10, 1, first_token=200)
    sim.add("C", 4, 1, first_token=300)
    check_schedule(["prefill A:6 B:10", "prefill C:4"], sim.run(), "budget 16, B fills exactly what A leaves")


@pytest.mark.stretch
@pytest.mark.points(2)
@pytest.mark.covers("lab3.admit")
def test_chunked_prefill_admits_nobody_once_the_budget_is_spent(impl, config_only_model_dir):
    """Chunked prefill, budget 8. A: 8-token prompt, B: 4 tokens, one output token each.

    step 0: A takes the whole budget; B is not admitted with a 0-token chunk (it would hold blocks for
    nothing);  step 1: B.
    """
    sim = Sim(impl, config_only_model_dir, 32, max_num_batched_tokens=8, max_model_len=16,
              enable_chunked_prefill=True)
    sim.add("A", 8, 1, first_token=100)
    sim.add("B", 4, 1, first_token=200)
    check_schedule(["prefill A:8", "prefill B:4"], sim.run(), "chunked prefill, budget 8, first prompt fills it")
