"""Lab 4 (CPU part): the model runner's inputs and the torch paged-attention decode.

Sequences are built by hand with deliberately scattered block tables (block
size 4), so a slot computed from the wrong block, a position off by one or a
context length that forgets the cached prefix all show up. Expected inputs are
written out here as literal lists, worked out from the definitions in
docs/architecture.md; the attention oracle is a plain per-sequence softmax
written in this file; the end-to-end oracle is Hugging Face transformers
running the same tiny model. "Edge case N" in a docstring is docs/design.md §2's.
"""
from __future__ import annotations

import random

import pytest
import torch

from lab_diagnostics import assert_close, assert_same_list, assert_token_aligned
from lab_oracle import hf_greedy

pytestmark = pytest.mark.lab4

BS = 4


def make_runner(impl, model_dir: str, num_blocks: int = 64):
    config = impl.module("config").Config(model=model_dir, device="cpu", dtype="float32", kvcache_block_size=BS,
                                          num_kvcache_blocks=num_blocks, max_model_len=128, enforce_eager=True)
    return impl.module("engine.model_runner").ModelRunner(config)


def make_seq(impl, token_ids: list[int], table: list[int], cached: int = 0, scheduled: int | None = None):
    sampling = impl.module("sampling_params").SamplingParams(temperature=0.0, max_tokens=64)
    seq = impl.module("engine.sequence").Sequence(token_ids, sampling, BS)
    seq.block_table = list(table)
    seq.num_cached_tokens = cached
    seq.num_scheduled_tokens = len(token_ids) - cached if scheduled is None else scheduled
    return seq


def ints(tensor: torch.Tensor) -> list:
    return tensor.tolist()


# -- prefill inputs --------------------------------------------------------------------------------

PREFILL = {
    # name: (tokens, block table, cached tokens, scheduled tokens)
    "S0": (list(range(100, 110)), [7, 2, 5], 0, 10),        # a whole 10-token prompt
    "S1": (list(range(200, 209)), [3, 9, 11], 4, 5),        # prefix hit: first block cached
    "S2": (list(range(300, 312)), [1, 4, 6], 4, 4),         # middle chunk of a chunked prefill
    "S3": (list(range(400, 403)), [13], 0, 3),              # short prompt: its table row is padded
}
PREFILL_OWNERS = ([("S0", p) for p in range(10)] + [("S1", p) for p in range(4, 9)]
                  + [("S2", p) for p in range(4, 8)] + [("S3", p) for p in range(3)])


def prefill_inputs(impl, model_dir):
    runner = make_runner(impl, model_dir)
    seqs = [make_seq(impl, t, table, cached, sched) for t, table, cached, sched in PREFILL.values()]
    return runner.prepare_prefill(seqs)


@pytest.mark.points(3)
@pytest.mark.covers("lab4.prepare_prefill", "lab4.slot")
def test_prefill_slot_mapping(impl, tiny_model_dir):
    _, _, meta = prefill_inputs(impl, tiny_model_dir)
    expected = ([28, 29, 30, 31, 8, 9, 10, 11, 20, 21]      # S0: blocks 7, 2, 5
                + [36, 37, 38, 39, 44]                      # S1 positions 4-8: blocks 9, 11
                + [16, 17, 18, 19]                          # S2 positions 4-7: block 4
                + [52, 53, 54])                             # S3: block 13
    assert_token_aligned("slot_mapping", expected, ints(meta.slot_mapping), PREFILL_OWNERS,
                         explain=lambda slot: f"physical block {slot // BS}, offset {slot % BS}")


@pytest.mark.points(2)
@pytest.mark.covers("lab4.prepare_prefill", "lab4.slot")
def test_prefill_chunk_starting_inside_a_block(impl, tiny_model_dir):
    """Edge case 9: a chunk starts wherever the last one's token budget ran out, here 2 tokens into logical
    block 1, and runs on into logical block 2, which is not the next block in the pool."""
    runner = make_runner(impl, tiny_model_dir)
    seq = make_seq(impl, list(range(500, 512)), [8, 14, 10], cached=6, scheduled=4)
    input_ids, positions, meta = runner.prepare_prefill([seq])
    owners = [("S", p) for p in range(6, 10)]
    assert_token_aligned("slot_mapping (positions 6, 7 in block 14; 8, 9 in block 10)", [58, 59, 40, 41],
                         ints(meta.slot_mapping), owners,
                         explain=lambda slot: f"physical block {slot // BS}, offset {slot % BS}")
    assert_token_aligned("positions", [6, 7, 8, 9], ints(positions), owners)
    assert_token_aligned("input_ids", [506, 507, 508, 509], ints(input_ids), owners)


@pytest.mark.points(3)
@pytest.mark.covers("lab4.prepare_prefill")
def test_prefill_input_ids_and_positions(impl, tiny_model_dir):
    input_ids, positions, _ = prefill_inputs(impl, tiny_model_dir)
    expected_ids = list(range(100, 110)) + list(range(204, 209)) + list(range(304, 308)) + [400, 401, 402]
    expected_pos = list(range(10)) + list(range(4, 9)) + list(range(4, 8)) + list(range(3))
    assert_token_aligned("positions (a cached prefix or an earlier chunk moves the start)", expected_pos,
                         ints(positions), PREFILL_OWNERS)
    assert_token_aligned("input_ids (only the tokens computed in this step)", expected_ids, ints(input_ids),
                         PREFILL_OWNERS)


@pytest.mark.points(3)
@pytest.mark.covers("lab4.prepare_prefill")
def test_prefill_cu_seqlens_and_context_lens(impl, tiny_model_dir):
    _, _, meta = prefill_inputs(impl, tiny_model_dir)
    label = lambda i: f"entry {i}"  # noqa: E731
    assert_same_list("cu_seqlens_q (running sum of new tokens: 10, 5, 4, 3)", [0, 10, 15, 19, 22],
                     ints(meta.cu_seqlens_q), label=label)
    assert_same_list("context_lens (seqlen_k = where each chunk ends)", [10, 9, 8, 3], ints(meta.context_lens),
                     label=lambda i: f"S{i}")
    assert_same_list("cu_seqlens_k (running sum of context lengths)", [0, 10, 19, 27, 30],
                     ints(meta.cu_seqlens_k), label=label)
    if (meta.max_seqlen_q, meta.max_seqlen_k, meta.is_prefill) != (10, 10, True):
        pytest.fail(f"(max_seqlen_q, max_seqlen_k, is_prefill): expected (10, 10, True), got "
                    f"{(meta.max_seqlen_q, meta.max_seqlen_k, meta.is_prefill)}", pytrace=False)


@pytest.mark.points(2)
@pytest.mark.covers("lab4.block_tables", "lab4.prepare_prefill")
def test_prefill_block_tables_are_padded_with_zero(impl, tiny_model_dir):
    _, _, meta = prefill_inputs(impl, tiny_model_dir)
    expected = [[7, 2, 5], [3, 9, 11], [1, 4, 6], [13, 0, 0]]
    assert_same_list("block_tables rows", expected, ints(meta.block_tables), label=lambda i: f"S{i}")


# -- decode inputs --------------------------------------------------------------------------------

DECODE = {
    "D0": (list(range(100, 109)), [7, 2, 5]),              # 9 tokens: the newest starts block 5
    "D1": (list(range(200, 204)), [3]),                    # 4 tokens: the newest fills block 3
    "D2": (list(range(300, 313)), [1, 4, 6, 10]),          # 13 tokens: the newest starts block 10
}


def decode_inputs(impl, model_dir):
    runner = make_runner(impl, model_dir)
    seqs = [make_seq(impl, t, table, cached=len(t) - 1, scheduled=1) for t, table in DECODE.values()]
    return runner.prepare_decode(seqs)


@pytest.mark.points(3)
@pytest.mark.covers("lab4.prepare_decode", "lab4.slot")
def test_decode_positions_and_slots(impl, tiny_model_dir):
    """Edge case 6: the decode position is len - 1, and the new token's K/V go to that position's slot."""
    input_ids, positions, meta = decode_inputs(impl, tiny_model_dir)
    owners = [("D0", 8), ("D1", 3), ("D2", 12)]
    assert_token_aligned("positions (len - 1)", [8, 3, 12], ints(positions), owners)
    assert_token_aligned("slot_mapping", [20, 15, 40], ints(meta.slot_mapping), owners,
                         explain=lambda slot: f"physical block {slot // BS}, offset {slot % BS}")
    assert_token_aligned("input_ids (each sequence's last token)", [108, 203, 312], ints(input_ids), owners)


@pytest.mark.points(2)
@pytest.mark.covers("lab4.prepare_decode", "lab4.block_tables")
def test_decode_context_lens_and_block_tables(impl, tiny_model_dir):
    _, _, meta = decode_inputs(impl, tiny_model_dir)
    assert_same_list("context_lens (the cached tokens plus the new one)", [9, 4, 13], ints(meta.context_lens),
                     label=lambda i: f"D{i}")
    assert_same_list("block_tables rows", [[7, 2, 5, 0], [3, 0, 0, 0], [1, 4, 6, 10]], ints(meta.block_tables),
                     label=lambda i: f"D{i}")
    if meta.is_prefill or meta.max_seqlen_k != 13:
        pytest.fail(f"is_prefill False and max_seqlen_k 13 expected, got {meta.is_prefill} and {meta.max_seqlen_k}",
                    pytrace=False)


# -- paged decode attention -------------------------------------------------------------------------

def dense_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """One query per head over one sequence's keys: q [Hq, D], keys/values [L, Hkv, D] -> [Hq, D]."""
    group = q.shape[0] // keys.shape[1]
    out = torch.empty_like(q)
    for h in range(q.shape[0]):
        k, v = keys[:, h // group, :], values[:, h // group, :]
        weights = torch.softmax((k @ q[h]) * scale, dim=0)
        out[h] = weights @ v
    return out


@pytest.mark.points(4)
@pytest.mark.covers("lab4.paged_decode")
@pytest.mark.parametrize("lengths", [[9, 4, 13, 1], [16, 5]])
def test_paged_decode_attention_matches_dense_attention(impl, lengths):
    """Random caches full of garbage; each sequence must see exactly its own context_lens tokens."""
    attention = impl.module("layers.attention")
    gen = torch.Generator().manual_seed(sum(lengths))
    num_blocks, kv_heads, q_heads, dim, scale = 32, 2, 4, 8, 0.3
    k_cache = torch.randn(num_blocks, BS, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, BS, kv_heads, dim, generator=gen)
    free = list(range(num_blocks))
    random.Random(len(lengths)).shuffle(free)
    tables, keys, values, slots = [], [], [], []
    for length in lengths:
        table = [free.pop() for _ in range(-(-length // BS))]
        k = torch.randn(length, kv_heads, dim, generator=gen)
        v = torch.randn(length, kv_heads, dim, generator=gen)
        for pos in range(length - 1):                     # the prefix is already in the cache
            k_cache[table[pos // BS], pos % BS] = k[pos]
            v_cache[table[pos // BS], pos % BS] = v[pos]
        tables.append(table)
        keys.append(k)
        values.append(v)
        slots.append(table[(length - 1) // BS] * BS + (length - 1) % BS)
    width = max(len(t) for t in tables)
    meta = attention.AttentionMetadata(
        is_prefill=False, slot_mapping=torch.tensor(slots),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        context_lens=torch.tensor(lengths), max_seqlen_q=1, max_seqlen_k=max(lengths))
    q = torch.randn(len(lengths), q_heads, dim, generator=gen)
    new_k = torch.stack([k[-1] for k in keys])
    new_v = torch.stack([v[-1] for v in values])
    out = attention.TorchAttentionBackend().forward(q, new_k, new_v, k_cache, v_cache, meta, scale)
    expected = torch.stack([dense_attention(q[i], keys[i], values[i], scale) for i in range(len(lengths))])
    assert_close(f"decode attention output [sequence, head, dim] (context lengths {lengths})", expected, out,
                 atol=1e-5, rtol=1e-4)


# -- the runner end to end ----------------------------------------------------------------------------

class Pool:
    """Hands out physical blocks in a scrambled order, so a runner that assumes contiguity fails."""

    def __init__(self, num_blocks: int, seed: int):
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def grow(self, seq) -> None:
        while len(seq.block_table) * BS < len(seq):
            seq.block_table.append(self.free.pop())


def decode_steps(runner, pool: Pool, named: dict[str, object], steps: int, outputs: dict) -> None:
    seqs = list(named.values())
    for _ in range(steps):
        for seq in seqs:
            pool.grow(seq)
            seq.num_cached_tokens, seq.num_scheduled_tokens = len(seq) - 1, 1
        for name, token in zip(named, runner.run(seqs, False)):
            named[name].append_token(token)
            outputs[name].append(token)


@pytest.mark.points(5)
@pytest.mark.covers("lab4.prepare_prefill", "lab4.prepare_decode", "lab4.slot", "lab4.block_tables",
                    "lab4.paged_decode")
def test_runner_generates_what_transformers_generates(impl, tiny_model_dir):
    """Greedy tokens through prefill and decode, with scattered blocks, a shared cached prefix and a chunked prompt.

    A: 11-token prompt.  B: shares A's first 8 tokens, so it reuses A's first two blocks (cached, not
    recomputed).  C: 14-token prompt computed in two chunks (6 then 8 tokens; the first chunk samples nothing).
    Then 6 decode steps for all three. Every token must equal transformers' own greedy continuation.
    """
    runner = make_runner(impl, tiny_model_dir)
    rng = random.Random(5)
    prompt_a = [rng.randrange(1000) for _ in range(11)]
    prompt_b = prompt_a[:8] + [rng.randrange(1000) for _ in range(5)]
    prompt_c = [rng.randrange(1000) for _ in range(14)]
    pool = Pool(64, seed=1)
    a, b, c = (make_seq(impl, p, []) for p in (prompt_a, prompt_b, prompt_c))
    outputs: dict[str, list[int]] = {"A": [], "B": [], "C": []}

    pool.grow(a)
    pool.grow(c)
    c.num_scheduled_tokens = 6                                  # first chunk of C
    first = runner.run([a, c], True)
    if first[1] is not None:
        pytest.fail(f"a prefill chunk that stops short of the prompt's end must sample nothing; got {first[1]}",
                    pytrace=False)
    a.append_token(first[0])
    outputs["A"].append(first[0])

    b.block_table = a.block_table[:2]                          # B's first 8 tokens: A's computed blocks
    pool.grow(b)
    b.num_cached_tokens, b.num_scheduled_tokens = 8, len(b) - 8
    c.num_cached_tokens, c.num_scheduled_tokens = 6, len(c) - 6
    second = runner.run([b, c], True)
    for name, seq, token in zip("BC", (b, c), second):
        seq.append_token(token)
        outputs[name].append(token)

    decode_steps(runner, pool, {"A": a, "B": b, "C": c}, 6, outputs)
    for name, prompt in (("A", prompt_a), ("B", prompt_b), ("C", prompt_c)):
        expected = hf_greedy(tiny_model_dir, prompt, len(outputs[name]))
        assert_same_list(f"sequence {name}'s greedy tokens (prompt of {len(prompt)})", expected, outputs[name],
                         label=lambda i: f"output token {i}")
