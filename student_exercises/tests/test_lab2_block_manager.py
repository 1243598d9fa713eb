# Generated from assignments/lab2_block_manager/public/test_lab2_block_manager.py by `inferlab exercises build`: edit it there, not here.
"""Lab 2: the paged KV block manager (`engine/block_manager.py`), with no model.

Sequences are built by hand and "computed" with `mark_computed`, as the
engine's postprocess does after each forward pass. Every expected block table,
reference count and free-list order is worked out here from the rules in the
module docstring:

- a fresh pool hands out block 0, 1, 2, ...; a freed block goes to the back of
  the free list, and a sequence frees its blocks last block first;
- a block gets a hash only when it is full and computed, chained to the hash
  of the block before it; a cached block is shared (ref_count counts holders);
- a prefix hit never covers the last token of a sequence.

Numbers in docstrings refer to docs/design.md §2, "Edge cases".
"""
from __future__ import annotations

import random

import pytest

from lab_diagnostics import assert_block_tables, assert_same_list

pytestmark = pytest.mark.lab2

BS = 4  # block size used throughout, unless a test says otherwise


class Lab:
    """The lab 2 classes of the implementation under test, and small drivers around them."""

    def __init__(self, impl, block_size: int = BS):
        self.BlockManager = impl.module("engine.block_manager").BlockManager
        self.Sequence = impl.module("engine.sequence").Sequence
        self.SamplingParams = impl.module("sampling_params").SamplingParams
        self.block_size = block_size

    def manager(self, num_blocks: int, prefix_caching: bool = True):
        return self.BlockManager(num_blocks, self.block_size, prefix_caching)

    def seq(self, token_ids: list[int]):
        return self.Sequence(token_ids, self.SamplingParams(temperature=0.0), self.block_size)


def prefill(bm, seq) -> None:
    """Allocate and compute every uncomputed token, as one whole prefill step does."""
    bm.allocate(seq)
    bm.mark_computed(seq, len(seq) - seq.num_cached_tokens)


def decode(bm, seq, token: int) -> None:
    """One decode step: the sampled token joins the sequence, gets a slot, and its K/V are computed."""
    seq.append_token(token)
    if not bm.can_append(seq):
        pytest.fail(f"can_append said no room for token {len(seq) - 1} with {bm.num_free_blocks} free blocks",
                    pytrace=False)
    bm.may_append(seq)
    bm.mark_computed(seq, 1)


def tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def check_ref_counts(bm, holders: dict[str, object]) -> None:
    """Each block's ref_count equals the number of holders whose table lists it; free == ref_count 0."""
    expected = [0] * len(bm.blocks)
    for seq in holders.values():
        for block_id in seq.block_table:
            expected[block_id] += 1
    actual = [block.ref_count for block in bm.blocks]
    tables = ", ".join(f"{name}={seq.block_table}" for name, seq in holders.items())
    assert_same_list(f"ref_count per block (holders: {tables})", expected, actual, label=lambda i: f"block {i}")
    free = sorted(bm.free_block_ids)
    assert_same_list("free blocks (exactly those with ref_count 0)",
                     [i for i, n in enumerate(expected) if n == 0], free)


# -- allocation ------------------------------------------------------------------------------

@pytest.mark.points(3)
@pytest.mark.covers("lab2.allocate", "lab2.take_free_block", "lab2.can_allocate")
@pytest.mark.parametrize("prompt_len", [1, 3, 4, 5, 8, 9])
def test_allocate_gives_ceil_blocks_in_order_with_ref_count_one(impl, prompt_len):
    """Edge cases 5 and 7: ceil(len / block_size) blocks, handed out 0, 1, 2...; ref_count 1 each."""
    lab = Lab(impl)
    bm = lab.manager(8)
    seq = lab.seq(tokens(100, prompt_len))
    if not bm.can_allocate(seq):
        pytest.fail(f"can_allocate: a {prompt_len}-token prompt needs {ceil_div(prompt_len, BS)} of 8 free blocks "
                    "but was refused", pytrace=False)
    bm.allocate(seq)
    n = ceil_div(prompt_len, BS)
    assert_block_tables({"seq": list(range(n))}, {"seq": seq.block_table}, f"after allocating {prompt_len} tokens")
    check_ref_counts(bm, {"seq": seq})
    if seq.num_cached_tokens != 0:
        pytest.fail(f"num_cached_tokens: expected 0 on an empty cache, got {seq.num_cached_tokens}", pytrace=False)
    if bm.num_free_blocks != 8 - n:
        pytest.fail(f"num_free_blocks: expected {8 - n}, got {bm.num_free_blocks}", pytrace=False)


@pytest.mark.points(2)
@pytest.mark.covers("lab2.can_allocate")
def test_can_allocate_counts_free_blocks(impl):
    lab = Lab(impl)
    bm = lab.manager(4)
    exactly = lab.seq(tokens(0, 4 * BS))
    too_big = lab.seq(tokens(0, 4 * BS + 1))
    answers = [bm.can_allocate(exactly), bm.can_allocate(too_big)]
    assert_same_list("can_allocate for 16 and 17 tokens with 4 free blocks of 4", [True, False], answers)
    bm.allocate(lab.seq(tokens(500, 2 * BS)))
    answers = [bm.can_allocate(lab.seq(tokens(0, 2 * BS))), bm.can_allocate(lab.seq(tokens(0, 2 * BS + 1)))]
    assert_same_list("can_allocate for 8 and 9 tokens with 2 free blocks left", [True, False], answers)


@pytest.mark.points(3)
@pytest.mark.covers("lab2.deallocate")
def test_deallocate_frees_last_block_first_and_resets_the_sequence(impl):
    """Edge case 7: freed blocks go to the back of the free list, tail first; reused least recently freed first."""
    lab = Lab(impl)
    bm = lab.manager(6, prefix_caching=False)
    x, y = lab.seq(tokens(0, 2 * BS)), lab.seq(tokens(50, 2 * BS))
    bm.allocate(x)
    bm.allocate(y)                      # x = [0, 1], y = [2, 3]; free: 4, 5
    freed = [bm.deallocate(x), bm.deallocate(y)]
    assert_same_list("blocks freed by deallocate(x), deallocate(y)", [2, 2], freed)
    leftovers = {"x.block_table": x.block_table, "y.block_table": y.block_table}
    assert_block_tables({"x.block_table": [], "y.block_table": []}, leftovers, "after deallocate")
    if x.num_cached_tokens != 0:
        pytest.fail(f"x.num_cached_tokens: expected 0 after deallocate, got {x.num_cached_tokens}", pytrace=False)
    # free list is now 4, 5, 1, 0, 3, 2: a 6-block sequence takes them in that order
    z = lab.seq(tokens(90, 6 * BS))
    bm.allocate(z)
    assert_block_tables({"z": [4, 5, 1, 0, 3, 2]}, {"z": z.block_table},
                        "of a sequence allocated after x then y were freed (least recently freed first)")


@pytest.mark.points(2)
@pytest.mark.covers("lab2.deallocate", "lab2.mark_computed")
def test_preempted_sequence_forgets_its_computed_tokens(impl):
    """Edge case 3: after deallocate (what preemption does) nothing of the sequence counts as computed."""
    lab = Lab(impl)
    bm = lab.manager(8)
    seq = lab.seq(tokens(0, 6))
    prefill(bm, seq)
    decode(bm, seq, 77)
    if seq.num_cached_tokens != 7:
        pytest.fail(f"num_cached_tokens after a 6-token prefill and one decode: expected 7, got "
                    f"{seq.num_cached_tokens}", pytrace=False)
    bm.deallocate(seq)
    if seq.num_cached_tokens != 0 or seq.block_table:
        pytest.fail(f"after deallocate: expected num_cached_tokens 0 and no blocks, got {seq.num_cached_tokens} "
                    f"and {seq.block_table}", pytrace=False)


@pytest.mark.points(3)
@pytest.mark.covers("lab2.deallocate", "lab2.prefix_hits", "lab2.allocate", "lab2.mark_computed", "lab2.may_append")
def test_preempted_sequence_comes_back_with_its_decode_tokens(impl):
    """Edge cases 3 and 4, what the engine does on a preemption: the sequence is freed whole, then prefilled again
    later with its prompt *and* the tokens it has decoded since, and the blocks its decode tokens filled are
    cached like prompt blocks.

    6-token prompt: blocks [0, 1]. Decoding tokens 6, 7, 8: token 7 fills block 1 (published once computed),
    token 8 starts block 2. Preempted: free list 3, 4, 2, 1, 0. Back with 9 tokens: blocks 0 and 1 lie inside
    its first 8 tokens, so both hit (8 cached tokens, revived) and one fresh block (3) holds token 8.
    """
    lab = Lab(impl)
    bm = lab.manager(5)
    seq = lab.seq(tokens(0, 6))
    prefill(bm, seq)
    for token in (900, 901, 902):
        decode(bm, seq, token)
    other = lab.seq(seq.token_ids[:2 * BS] + [5])
    if bm.num_cached_tokens(other) != 2 * BS:
        pytest.fail(f"a prompt equal to seq's first 8 tokens (+1) should hit {2 * BS} tokens: block 1 was filled by "
                    f"decode tokens and computed, so it is published like a prompt block; got "
                    f"{bm.num_cached_tokens(other)}", pytrace=False)
    freed = bm.deallocate(seq)
    room = bm.can_allocate(seq)
    cached = bm.num_cached_tokens(seq)
    bm.allocate(seq)
    got = {"freed": freed, "can_allocate": room, "cached before allocate": cached, "block_table": seq.block_table,
           "num_cached_tokens": seq.num_cached_tokens}
    expected = {"freed": 3, "can_allocate": True, "cached before allocate": 2 * BS, "block_table": [0, 1, 3],
                "num_cached_tokens": 2 * BS}
    bad = {k: (expected[k], got[k]) for k in expected if expected[k] != got[k]}
    if bad:
        pytest.fail(f"the preempted 9-token sequence (6 prompt + 3 decoded) prefilled again: " + "; ".join(
            f"{k}: expected {e!r}, got {g!r}" for k, (e, g) in bad.items()) + " (it is allocated for len(seq) "
            "tokens, not its prompt, and hits every full block inside its first len(seq) - 1 tokens)",
            pytrace=False)
    bm.mark_computed(seq, len(seq) - seq.num_cached_tokens)
    check_ref_counts(bm, {"seq": seq})


@pytest.mark.points(2)
@pytest.mark.covers("lab2.can_allocate", "lab2.allocate")
def test_can_allocate_counts_a_preempted_sequences_decode_tokens(impl):
    """A preempted sequence needs blocks for all len(seq) tokens, not just its prompt (no prefix caching here).

    4 blocks. seq: 4-token prompt [0], then 5 decode tokens [0, 1, 2]; preempted: free list 3, 2, 1, 0.
    A 2-block hog takes 3 and 2: seq's 9 tokens need 3 blocks, 2 are free: False. The hog ends (free list
    1, 0, 2, 3): True, and seq gets [1, 0, 2].
    """
    lab = Lab(impl)
    bm = lab.manager(4, prefix_caching=False)
    seq = lab.seq(tokens(0, 4))
    prefill(bm, seq)
    for token in range(5):
        decode(bm, seq, 900 + token)
    bm.deallocate(seq)
    hog = lab.seq(tokens(300, 2 * BS))
    prefill(bm, hog)
    squeezed = bm.can_allocate(seq)
    bm.deallocate(hog)
    roomy = bm.can_allocate(seq)
    assert_same_list("can_allocate for the preempted 9-token sequence (4 prompt + 5 decoded) with 2 free blocks, "
                     "then with 4", [False, True], [squeezed, roomy])
    bm.allocate(seq)
    assert_block_tables({"seq": [1, 0, 2]}, {"seq": seq.block_table}, "of the preempted sequence prefilled again")


# -- decode ----------------------------------------------------------------------------------

@pytest.mark.points(3)
@pytest.mark.covers("lab2.can_append", "lab2.may_append")
@pytest.mark.parametrize("prompt_len", [3, 4, 5, 7])
def test_new_block_exactly_when_a_token_starts_one(impl, prompt_len):
    """Edge case 5: after each decode token the table has ceil(len / block_size) blocks, no more, no fewer."""
    lab = Lab(impl)
    bm = lab.manager(16)
    seq = lab.seq(tokens(0, prompt_len))
    prefill(bm, seq)
    expected, actual = [], []
    for i in range(2 * BS + 1):
        decode(bm, seq, 900 + i)
        expected.append(ceil_div(len(seq), BS))
        actual.append(len(seq.block_table))
    assert_same_list(f"number of blocks after each decode token (prompt of {prompt_len}, block size {BS})",
                     expected, actual, label=lambda i: f"len {prompt_len + i + 1}")
    assert_same_list("block ids (fresh ones, in order)", list(range(expected[-1])), seq.block_table)


@pytest.mark.points(2)
@pytest.mark.covers("lab2.can_append")
def test_can_append_needs_a_free_block_only_at_a_block_start(impl):
    lab = Lab(impl)
    bm = lab.manager(2)
    seq = lab.seq(tokens(0, 7))
    prefill(bm, seq)                     # 2 blocks, pool now empty
    seq.append_token(1)                  # token 7 fits in block 1
    fits = bm.can_append(seq)
    bm.may_append(seq)
    bm.mark_computed(seq, 1)
    seq.append_token(2)                  # token 8 starts block 2: no free block
    starts_new = bm.can_append(seq)
    assert_same_list("can_append for token 7 (fits its block) and token 8 (needs a block; none free)",
                     [True, False], [fits, starts_new])


@pytest.mark.points(2)
@pytest.mark.covers("lab2.can_append", "lab2.may_append")
@pytest.mark.parametrize("block_size, prompt_len, num_blocks", [(4, 8, 3), (1, 3, 4)])
def test_can_append_with_exactly_one_free_block(impl, block_size, prompt_len, num_blocks):
    """One free block is enough to start a block; after it is taken, the next block start finds none.

    Block size 4: an 8-token prompt fills blocks 0 and 1 of 3; token 8 starts block 2 (one free: yes), tokens
    9-11 fit in it, token 12 needs a fourth (none: no). Block size 1: every token starts a block.
    """
    lab = Lab(impl, block_size=block_size)
    bm = lab.manager(num_blocks)
    seq = lab.seq(tokens(0, prompt_len))
    prefill(bm, seq)
    answers = []
    while True:
        seq.append_token(7)
        answers.append(bool(bm.can_append(seq)))
        if not answers[-1] or len(answers) > 8:
            break
        bm.may_append(seq)
        bm.mark_computed(seq, 1)
    grows = num_blocks * block_size - prompt_len          # tokens that still find a slot
    assert_same_list(f"can_append for each decode token (block size {block_size}, {prompt_len}-token prompt, "
                     f"{num_blocks} blocks)", [True] * grows + [False], answers,
                     label=lambda i: f"token {prompt_len + i}")


# -- prefix caching --------------------------------------------------------------------------

@pytest.mark.points(3)
@pytest.mark.covers("lab2.prefix_hits", "lab2.allocate", "lab2.mark_computed")
def test_shared_prefix_is_reused_and_counts_every_holder(impl):
    """Edge case 7: two holders of a cached prefix block give it ref_count 2; each frees only its hold."""
    lab = Lab(impl)
    bm = lab.manager(10)
    system = tokens(1000, 2 * BS)
    a = lab.seq(system + tokens(1, 3))
    prefill(bm, a)                      # a = [0, 1, 2]; blocks 0 and 1 full and computed
    b = lab.seq(system + tokens(500, 5))
    bm.allocate(b)
    assert_block_tables({"a": [0, 1, 2], "b": [0, 1, 3, 4]}, {"a": a.block_table, "b": b.block_table},
                        "after b's prompt hit a's two full blocks")
    if b.num_cached_tokens != 2 * BS:
        pytest.fail(f"b.num_cached_tokens: expected {2 * BS} (two blocks hit), got {b.num_cached_tokens}",
                    pytrace=False)
    check_ref_counts(bm, {"a": a, "b": b})
    freed_a = bm.deallocate(a)
    check_ref_counts(bm, {"b": b})
    freed_b = bm.deallocate(b)
    assert_same_list("blocks freed by deallocate(a) then deallocate(b) (shared blocks free with the last holder)",
                     [1, 4], [freed_a, freed_b])


@pytest.mark.points(2)
@pytest.mark.covers("lab2.prefix_hits", "lab2.mark_computed")
def test_no_hit_before_the_blocks_are_computed(impl):
    """A block is shareable only once its K/V exist, i.e. after mark_computed filled it."""
    lab = Lab(impl)
    bm = lab.manager(10)
    prompt = tokens(0, 2 * BS + 1)
    a = lab.seq(prompt)
    bm.allocate(a)
    hits_before = bm.num_cached_tokens(lab.seq(prompt))
    bm.mark_computed(a, BS + 2)          # a chunk: block 0 full, block 1 half
    hits_chunk = bm.num_cached_tokens(lab.seq(prompt))
    bm.mark_computed(a, len(a) - a.num_cached_tokens)
    hits_after = bm.num_cached_tokens(lab.seq(prompt))
    assert_same_list("tokens a second identical prompt could reuse: before any compute, after a 6-token chunk, "
                     "after the rest", [0, BS, 2 * BS], [hits_before, hits_chunk, hits_after])


@pytest.mark.points(3)
@pytest.mark.covers("lab2.prefix_hits")
@pytest.mark.parametrize("prompt_len, cached", [(4, 0), (5, 4), (8, 4), (9, 8), (12, 8)])
def test_whole_prompt_hit_still_computes_the_last_token(impl, prompt_len, cached):
    """Edge case 1: an identical prompt reuses only blocks inside its first len - 1 tokens."""
    lab = Lab(impl)
    bm = lab.manager(10)
    prefill(bm, lab.seq(tokens(0, prompt_len)))
    again = lab.seq(tokens(0, prompt_len))
    bm.allocate(again)
    if again.num_cached_tokens != cached:
        pytest.fail(f"identical {prompt_len}-token prompt: expected {cached} cached tokens (full blocks inside the "
                    f"first {prompt_len - 1} tokens), got {again.num_cached_tokens}", pytrace=False)


@pytest.mark.points(3)
@pytest.mark.covers("lab2.prefix_hits", "lab2.mark_computed")
def test_hashes_are_chained_over_the_whole_prefix(impl):
    """Equal block tokens after a different prefix are different K/V: no hit.

    a = P X X', b = Q X X' (b's block 1 equals a's block 1, after another block 0).
    c = P X X' c asks for a's blocks, and must get a's, never b's.
    """
    lab = Lab(impl)
    bm = lab.manager(12)
    p, q, x, x2 = tokens(0, BS), tokens(100, BS), tokens(200, BS), tokens(300, BS)
    a, b = lab.seq(p + x + x2), lab.seq(q + x + x2)
    prefill(bm, a)                      # [0, 1, 2]
    prefill(bm, b)                      # no hit (block 0 differs): [3, 4, 5]
    c = lab.seq(p + x + x2 + [7])
    bm.allocate(c)
    assert_block_tables({"a": [0, 1, 2], "b": [3, 4, 5], "c": [0, 1, 2, 6]},
                        {"a": a.block_table, "b": b.block_table, "c": c.block_table},
                        "(c must hit a's blocks: its prefix is a's)")


@pytest.mark.points(2)
@pytest.mark.covers("lab2.allocate", "lab2.prefix_hits")
def test_freed_blocks_stay_hittable_and_revive(impl):
    """A freed, computed block is still in the cache: a hit takes it back out of the free list."""
    lab = Lab(impl)
    bm = lab.manager(6)
    prompt = tokens(0, 2 * BS + 1)
    a = lab.seq(prompt)
    prefill(bm, a)
    bm.deallocate(a)                    # free list: 3, 4, 5, 2, 1, 0
    b = lab.seq(prompt + [5, 6])
    bm.allocate(b)
    assert_block_tables({"b": [0, 1, 3]}, {"b": b.block_table}, "(b revives a's two cached blocks, then takes 3)")
    check_ref_counts(bm, {"b": b})
    if b.num_cached_tokens != 2 * BS:
        pytest.fail(f"b.num_cached_tokens: expected {2 * BS}, got {b.num_cached_tokens}", pytrace=False)


@pytest.mark.points(2)
@pytest.mark.covers("lab2.can_allocate")
def test_can_allocate_counts_revived_blocks(impl):
    """Reviving a cached block from the free list uses up a free block too, one each: b needs one block more than
    is free, c exactly as many as are free."""
    lab = Lab(impl)
    bm = lab.manager(4)
    prompt = tokens(0, 2 * BS + 1)
    a = lab.seq(prompt)
    prefill(bm, a)                      # a = [0, 1, 2]
    bm.deallocate(a)                    # all 4 free; 0 and 1 still cached
    d = lab.seq(tokens(700, 1))
    bm.allocate(d)                      # d takes block 3: 3 free left (2, 1, 0)
    b = lab.seq(prompt[:2 * BS] + tokens(800, 2 * BS))   # 4 blocks: 2 cached hits + 2 new
    answer = bm.can_allocate(b)
    if answer is not False:
        pytest.fail("can_allocate: b needs 4 blocks (2 revived cache hits still sitting in the free list + 2 new) "
                    f"but only 3 are free; expected False, got {answer!r}", pytrace=False)
    c = lab.seq(prompt[:2 * BS] + tokens(900, BS))       # 3 blocks: the same 2 cached hits + 1 new
    answer = bm.can_allocate(c)
    if answer is not True:
        pytest.fail("can_allocate: c needs 3 blocks (2 revived cache hits, one free block each, + 1 new) and 3 are "
                    f"free; expected True, got {answer!r}", pytrace=False)


@pytest.mark.points(3)
@pytest.mark.covers("lab2.take_free_block")
def test_reused_block_loses_its_old_hash(impl):
    """Edge case 2: once a freed block is handed out again, its old hash must not hit any more.

    a = P X (computed, freed). b = Q X P takes all three blocks back, in the
    order the free list gives them, so a's old P block now holds b's P *after
    Q X*: same tokens, different K/V. A new prompt P X ... must not hit it.
    """
    lab = Lab(impl)
    bm = lab.manager(3)
    p, q, x = tokens(0, BS), tokens(100, BS), tokens(200, BS)
    a = lab.seq(p + x + [1])
    prefill(bm, a)                      # a = [0, 1, 2]
    bm.deallocate(a)                    # free list: 2, 1, 0
    b = lab.seq(q + x + p)
    prefill(bm, b)                      # b = [2, 1, 0]: block 0 now holds P after Q X
    bm.deallocate(b)
    entries, hashed = len(bm.hash_to_block), [blk.block_id for blk in bm.blocks if blk.hash is not None]
    if (entries, hashed) != (3, [0, 1, 2]):
        pytest.fail(f"after b computed Q X P in a's old blocks: expected 3 entries in hash_to_block (b's three "
                    f"blocks) and blocks [0, 1, 2] hashed, got {entries} entries and hashed blocks {hashed}: when a "
                    "block is handed out again, the hash_to_block entry still pointing at it must go",
                    pytrace=False)
    c = lab.seq(p + x + [9])
    bm.allocate(c)
    if c.num_cached_tokens != 0:
        pytest.fail(f"c = P X ... hit {c.num_cached_tokens} cached tokens (table {c.block_table}), but every block "
                    "that held a's P X was handed to b and overwritten: its old hash entry was kept (stale hash)",
                    pytrace=False)


@pytest.mark.points(2)
@pytest.mark.covers("lab2.take_free_block", "lab2.mark_computed", "lab2.prefix_hits")
def test_a_reused_block_is_published_with_its_new_content(impl):
    """Edge case 2: a block handed out again is a fresh block (`reset()`: no hash), so when its new content
    is computed it is published like any other.

    a = P X (computed, freed); b = Q X P takes all three blocks back, [2, 1, 0]. A prompt Q X ... must hit b's
    Q X blocks, two of a's old blocks, which now hold b's content (8 tokens).
    """
    lab = Lab(impl)
    bm = lab.manager(3)
    p, q, x = tokens(0, BS), tokens(100, BS), tokens(200, BS)
    a = lab.seq(p + x + [1])
    prefill(bm, a)                      # a = [0, 1, 2]
    bm.deallocate(a)                    # free list: 2, 1, 0
    b = lab.seq(q + x + p)
    prefill(bm, b)                      # b = [2, 1, 0]: a's blocks, b's content
    bm.deallocate(b)
    reuse = bm.num_cached_tokens(lab.seq(q + x + [5]))
    if reuse != 2 * BS:
        pytest.fail(f"a prompt Q X ... should hit b's two reused, recomputed blocks ({2 * BS} tokens), got {reuse}: "
                    "a block handed out again must be published with its new content (reset() clears the old "
                    "hash; a block that keeps it looks published and is skipped)", pytrace=False)


@pytest.mark.points(1)
@pytest.mark.covers("lab2.prefix_hits")
def test_prefix_caching_off_never_hits(impl):
    lab = Lab(impl)
    bm = lab.manager(10, prefix_caching=False)
    prompt = tokens(0, 3 * BS)
    prefill(bm, lab.seq(prompt))
    again = lab.seq(prompt)
    bm.allocate(again)
    assert_block_tables({"again": [3, 4, 5]}, {"again": again.block_table}, "with prefix caching disabled")
    hashed = [blk.block_id for blk in bm.blocks if blk.hash is not None]
    if bm.hash_to_block or hashed:
        pytest.fail(f"with prefix caching disabled nothing is published: expected an empty hash_to_block and no "
                    f"hashed block, got {len(bm.hash_to_block)} entries and hashed blocks {hashed}", pytrace=False)


@pytest.mark.points(3)
@pytest.mark.covers("lab2.allocate", "lab2.deallocate", "lab2.may_append", "lab2.mark_computed",
                    "lab2.take_free_block", "lab2.prefix_hits")
def test_random_workload_keeps_reference_counts_and_contents(impl):
    """Random prefills, decodes and frees over shared prefixes; after every step:

    - ref_count of each block == number of live sequences holding it, and the
      free list is exactly the blocks nobody holds;
    - every computed token of every live sequence sits in a block whose
      recorded content (what wrote it, and after which prefix) is that token.
    """
    lab = Lab(impl)
    rng = random.Random(0)
    bm = lab.manager(24)
    prefixes = [tokens(1000 * (i + 1), rng.randrange(1, 3 * BS)) for i in range(3)]
    content: dict[int, tuple] = {}      # slot -> the prefix (token ids) whose K/V it holds
    live: dict[str, object] = {}
    for step in range(120):
        if live and (rng.random() < 0.3 or bm.num_free_blocks < 4):
            name = rng.choice(sorted(live))
            bm.deallocate(live.pop(name))
        elif live and rng.random() < 0.5:            # at least 4 blocks are free here
            seq = live[rng.choice(sorted(live))]
            start = seq.num_cached_tokens
            decode(bm, seq, rng.randrange(5000))
            _write(content, seq, start, BS)
        else:
            seq = lab.seq(rng.choice(prefixes) + tokens(rng.randrange(100, 900), rng.randrange(1, 2 * BS)))
            if bm.can_allocate(seq):
                bm.allocate(seq)
                start = seq.num_cached_tokens
                bm.mark_computed(seq, len(seq) - start)
                _write(content, seq, start, BS)
                live[f"s{step}"] = seq
        check_ref_counts(bm, live)
        for name, seq in live.items():
            for pos in range(seq.num_cached_tokens):
                slot = seq.block_table[pos // BS] * BS + pos % BS
                if content.get(slot) != tuple(seq.token_ids[:pos + 1]):
                    pytest.fail(f"step {step}: {name} position {pos} reads block {seq.block_table[pos // BS]}, "
                                "which holds K/V written for other tokens (a wrong prefix hit, or a block "
                                "handed out while still in use)", pytrace=False)


def _write(content: dict[int, tuple], seq, start: int, block_size: int) -> None:
    """Record that positions start.. of seq were computed into their slots."""
    for pos in range(start, seq.num_cached_tokens):
        slot = seq.block_table[pos // block_size] * block_size + pos % block_size
        content[slot] = tuple(seq.token_ids[:pos + 1])


# -- the cache's three rules no other test states -------------------------------------------------

@pytest.mark.points(3)
@pytest.mark.covers("lab2.prefix_hits", "lab2.mark_computed")
def test_a_hash_collision_is_not_a_hit(impl, monkeypatch):
    """Equal hashes are not proof: a hit must also have the same tokens (the collision guard).

    chain_hash is replaced by one that gives every block the same hash, as a
    real hash would for two unlucky blocks. b's first block then "matches"
    a's by hash alone; its tokens differ, so it must not be shared.
    """
    module = impl.module("engine.block_manager")
    monkeypatch.setattr(module, "chain_hash", lambda token_ids, prev_hash: 42)
    lab = Lab(impl)
    bm = lab.manager(8)
    a = lab.seq(tokens(0, BS) + [1])
    prefill(bm, a)                      # a = [0, 1]; block 0 published under hash 42
    b = lab.seq(tokens(100, BS) + [1])
    cached = bm.num_cached_tokens(b)
    bm.allocate(b)
    if cached or b.num_cached_tokens:
        pytest.fail(f"b's first block has a's hash (42) but other tokens ({tokens(100, BS)} vs {tokens(0, BS)}); "
                    f"it was counted as {max(cached, b.num_cached_tokens)} cached tokens (table {b.block_table}): "
                    "compare the cached block's token_ids before calling it a hit", pytrace=False)
    assert_block_tables({"a": [0, 1], "b": [2, 3]}, {"a": a.block_table, "b": b.block_table},
                        "(a collision is a miss: b gets fresh blocks)")


@pytest.mark.points(3)
@pytest.mark.covers("lab2.mark_computed", "lab2.prefix_hits")
def test_duplicate_publication_the_latest_block_wins(impl):
    """Two sequences admitted in the same step with the same prompt both compute it (neither could hit the
    other yet), so two blocks publish one hash. The rule: the latest publication wins, and hash_to_block
    points at the block computed last. A later prompt hits that one. A block is published once, when it
    fills: a's later decode steps publish only the block they fill, never a's earlier blocks again.
    """
    lab = Lab(impl)
    bm = lab.manager(10)
    prompt = tokens(0, 2 * BS + 1)
    a, b = lab.seq(prompt), lab.seq(prompt)
    bm.allocate(a)                      # a = [0, 1, 2]: nothing computed yet, so no hit for b either
    bm.allocate(b)                      # b = [3, 4, 5]
    bm.mark_computed(a, len(a))
    bm.mark_computed(b, len(b))         # b publishes the same two hashes last
    for token in (70, 71, 72):
        decode(bm, a, token)            # a's token 11 fills block 2: published; blocks 0 and 1 are not again
    c = lab.seq(prompt + [7])
    bm.allocate(c)
    assert_block_tables({"a": [0, 1, 2], "b": [3, 4, 5], "c": [3, 4, 6]},
                        {"a": a.block_table, "b": b.block_table, "c": c.block_table},
                        "(c must hit b's blocks: the latest block to publish a hash is the one the cache keeps, "
                        "and a's decode steps publish only the block they fill)")


@pytest.mark.points(3)
@pytest.mark.covers("lab2.take_free_block", "lab2.mark_computed")
def test_reusing_a_block_keeps_another_blocks_hash_entry(impl):
    """Edge case 3 turned around: a reused block drops the hash entry only if that entry still points at it.

    a and b computed the same prompt; b published last, so the cache maps the
    prompt's hashes to b's blocks. a's old blocks, freed and handed to d,
    still carry those hashes: deleting the entries for them would throw away
    b's cached prefix, which is still valid.
    """
    lab = Lab(impl)
    bm = lab.manager(9)
    prompt = tokens(0, 2 * BS + 1)
    a, b = lab.seq(prompt), lab.seq(prompt)
    bm.allocate(a)                      # a = [0, 1, 2]
    bm.allocate(b)                      # b = [3, 4, 5]
    bm.mark_computed(a, len(a))
    bm.mark_computed(b, len(b))         # the cache now maps the prompt's two hashes to 3 and 4
    bm.deallocate(a)                    # free list: 6, 7, 8, 2, 1, 0
    d = lab.seq(tokens(500, 5 * BS + 1))
    bm.allocate(d)                      # d takes 6, 7, 8, 2, 1, 0: a's old blocks 1 and 0 are reused
    c = lab.seq(prompt + [9])
    cached = bm.num_cached_tokens(c)
    if cached != 2 * BS:
        pytest.fail(f"c = a's prompt + [9] should still hit b's two cached blocks ({2 * BS} tokens), got {cached}: "
                    "reusing a's old block deleted a hash entry that belongs to b's block", pytrace=False)


@pytest.mark.points(2)
@pytest.mark.covers("lab2.prefix_hits", "lab2.take_free_block")
def test_a_prefix_hit_stops_at_the_first_miss(impl):
    """Hits are the *leading* cached blocks: after the first miss nothing counts, even a later block whose
    chained hash is still in the cache (its K/V would sit after a block the sequence must recompute).

    a = P X 1 and b = P 5 computed in the same step: a = [0, 1, 2], b = [3, 4]; b published P last, so the
    cache maps P -> 3 and P X -> 1. Both freed: free list 4, 3, 2, 1, 0. d takes 4 and 3: reusing 3 drops
    the P entry. c = P X 9: its first block misses, so c hits nothing, even though P X -> 1 is still there,
    and gets fresh blocks 2, 1, 0.
    """
    lab = Lab(impl)
    bm = lab.manager(5)
    p, x = tokens(0, BS), tokens(100, BS)
    a, b = lab.seq(p + x + [1]), lab.seq(p + [5])
    bm.allocate(a)
    bm.allocate(b)
    bm.mark_computed(a, len(a))
    bm.mark_computed(b, len(b))
    bm.deallocate(b)
    bm.deallocate(a)
    prefill(bm, lab.seq(tokens(500, 2 * BS)))
    c = lab.seq(p + x + [9])
    cached = bm.num_cached_tokens(c)
    bm.allocate(c)
    if cached or c.num_cached_tokens:
        pytest.fail(f"c = P X 9: its first block P is no longer cached (block 3 was reused), so it hits nothing; "
                    f"got {max(cached, c.num_cached_tokens)} cached tokens (table {c.block_table}): stop the walk "
                    "at the first block that misses", pytrace=False)
    assert_block_tables({"c": [2, 1, 0]}, {"c": c.block_table}, "(a miss on the first block: all fresh blocks)")


# -- the block manager inside the engine ------------------------------------------------------------

def _check_holders(llm, step: int) -> None:
    """ref_count of each block == how many live sequences hold it; the free list == the blocks nobody holds."""
    bm = llm.block_manager
    live = [*llm.scheduler.running, *llm.scheduler.waiting]
    expected = [0] * len(bm.blocks)
    for seq in live:
        for block_id in seq.block_table:
            expected[block_id] += 1
    actual = [block.ref_count for block in bm.blocks]
    tables = ", ".join(f"request {seq.seq_id}={seq.block_table}" for seq in live)
    assert_same_list(f"after engine step {step}: ref_count per block (holders: {tables})", expected, actual,
                     label=lambda i: f"block {i}")
    assert_same_list(f"after engine step {step}: free blocks (exactly those nobody holds)",
                     [i for i, n in enumerate(expected) if n == 0], sorted(bm.free_block_ids))


@pytest.mark.points(4)
@pytest.mark.covers("lab2.prefix_hits", "lab2.can_allocate", "lab2.allocate", "lab2.take_free_block",
                    "lab2.deallocate", "lab2.can_append", "lab2.may_append", "lab2.mark_computed")
def test_engine_run_with_shared_prefixes_and_preemption(impl, tiny_model_dir, engine_parts):
    """Your block manager inside the real engine: six requests sharing a prefix, in a pool small enough to
    preempt. After every step the blocks are accounted for; at the end the lifecycle log is legal, every
    block is back in the free list, and each request's tokens are transformers' own greedy tokens.
    """
    from lab_oracle import hf_greedy
    llm_module, params = impl.module("llm"), impl.module("sampling_params")
    llm = llm_module.LLM(tiny_model_dir, engine_parts(), device="cpu", kvcache_block_size=BS, num_kvcache_blocks=12,
                         max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64,
                         enable_prefix_caching=True)
    shared = tokens(10, 2 * BS)
    prompts = [shared + tokens(100 + 10 * i, 3 + i % 3) for i in range(6)]
    ids = [llm.add_request(p, params.SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
           for p in prompts]
    outputs: dict[int, list[int]] = {seq_id: [] for seq_id in ids}
    step = 0
    while not llm.scheduler.is_finished():
        for out in llm.step():
            outputs[out.seq_id] += out.new_token_ids
        step += 1
        _check_holders(llm, step)
        if step > 200:
            pytest.fail("the engine did not finish six short requests in 200 steps", pytrace=False)
    problems = impl.module("metrics").check_lifecycle(llm.log.events)
    if problems:
        pytest.fail("the lifecycle log of the run is not legal:\n  " + "\n  ".join(problems[:5]), pytrace=False)
    if llm.block_manager.num_free_blocks != 12:
        pytest.fail(f"{12 - llm.block_manager.num_free_blocks} block(s) still held after every request finished "
                    "(a leak: deallocate must free each block whose last holder lets go)", pytrace=False)
    for number, (seq_id, prompt) in enumerate(zip(ids, prompts)):
        assert_same_list(f"request {number}'s greedy tokens", hf_greedy(tiny_model_dir, prompt, 6),
                         outputs[seq_id], label=lambda i: f"output token {i}")


@pytest.mark.points(2)
@pytest.mark.covers("lab2.can_allocate")
def test_can_allocate_needs_no_free_block_for_hits_another_sequence_holds(impl):
    """A hit on a block a running sequence still holds shares it: only the prompt's new blocks need to be free."""
    lab = Lab(impl)
    bm = lab.manager(5)
    system = tokens(1000, 2 * BS)
    a = lab.seq(system + tokens(1, 1))
    prefill(bm, a)                      # a = [0, 1, 2]: blocks 0 and 1 full, computed, cached; 2 blocks free
    b = lab.seq(system + tokens(500, 2 * BS))   # 4 blocks: 2 hits (held by a) + 2 new
    answer = bm.can_allocate(b)
    if answer is not True:
        pytest.fail("can_allocate: b needs 4 blocks, 2 of them cache hits that a still holds (shared, not taken "
                    f"from the free list) and 2 new ones; 2 are free, so expected True, got {answer!r}",
                    pytrace=False)


@pytest.mark.points(2)
@pytest.mark.covers("lab2.can_append", "lab2.may_append")
def test_every_token_starts_a_block_at_block_size_one(impl):
    """Block size 1: each decode token needs a block of its own (len % 1 is always 0: no remainder trick)."""
    lab = Lab(impl, block_size=1)
    bm = lab.manager(8)
    seq = lab.seq(tokens(0, 3))
    prefill(bm, seq)
    counts = []
    for i in range(4):
        decode(bm, seq, 900 + i)
        counts.append(len(seq.block_table))
    assert_same_list("number of blocks after each decode token at block size 1 (one per token)",
                     [4, 5, 6, 7], counts, label=lambda i: f"len {4 + i}")
