"""Hidden lab 2 tests: prefix caching (docs/design.md §2, edge cases 1 and 7).

Hits are full, computed blocks whose chained hash matches; never the last
token; shared blocks count every holder and go back to the pool only when the
last holder lets go.
"""
from __future__ import annotations

import pytest

from _inferlab_support import Blocks, module, tokens


@pytest.mark.parametrize("prompt_len", [7, 8, 9, 12])
def test_identical_prompts_share_full_blocks(observe, prompt_len):
    """Edge case 1: even a fully cached prompt recomputes its last token."""
    lab = Blocks(4)
    bm = lab.manager(10)
    a, b = lab.seq(tokens(40, prompt_len)), lab.seq(tokens(40, prompt_len))
    lab.prefill(bm, a)
    observe("cached for b", bm.num_cached_tokens(b))
    observe("can_allocate b", bm.can_allocate(b))
    bm.allocate(b)
    observe("after b", lab.snapshot(bm, {"a": a, "b": b}))


def test_hash_is_chained_over_the_prefix(observe):
    """The same block content after a different prefix is not a hit."""
    lab = Blocks(4)
    bm = lab.manager(12)
    a = lab.seq(tokens(0, 4) + tokens(100, 4) + tokens(200, 2))
    lab.prefill(bm, a)
    b = lab.seq(tokens(500, 4) + tokens(100, 4) + tokens(200, 2))
    c = lab.seq(tokens(0, 4) + tokens(100, 4) + tokens(900, 3))
    d = lab.seq(tokens(100, 4) + tokens(900, 2))   # starts with a's second block: a hit only without chaining
    e = lab.seq(tokens(0, 4) + tokens(0, 4) + [7])  # a's first block twice: the second is not a's second block
    observe("cached for b", bm.num_cached_tokens(b))
    observe("cached for c", bm.num_cached_tokens(c))
    observe("cached for d", bm.num_cached_tokens(d))
    observe("cached for e", bm.num_cached_tokens(e))
    bm.allocate(c)
    observe("after c", lab.snapshot(bm, {"a": a, "c": c}))


def test_only_computed_full_blocks_hit(observe):
    """Allocated but uncomputed blocks, and a partial last block, are never hits."""
    lab = Blocks(4)
    bm = lab.manager(12)
    a = lab.seq(tokens(0, 10))
    bm.allocate(a)
    observe("before compute", bm.num_cached_tokens(lab.seq(tokens(0, 10))))
    bm.mark_computed(a, 6)
    observe("after 6 computed", bm.num_cached_tokens(lab.seq(tokens(0, 10))))
    bm.mark_computed(a, 4)
    observe("after all computed", bm.num_cached_tokens(lab.seq(tokens(0, 12))))
    observe("hashed", lab.snapshot(bm, {"a": a}))


def test_decode_fills_blocks_that_become_shareable(observe):
    """A block filled by decode tokens is published once computed."""
    lab = Blocks(4)
    bm = lab.manager(10)
    a = lab.seq(tokens(0, 3))
    lab.prefill(bm, a)
    for t in (3, 4, 5, 6):
        lab.decode(bm, a, t)
    observe("a", lab.snapshot(bm, {"a": a}))
    b = lab.seq(tokens(0, 9))
    observe("cached for b", bm.num_cached_tokens(b))


def test_shared_blocks_count_every_holder(observe):
    """Edge case 7: three holders of one prefix; blocks return to the pool only with the last."""
    lab = Blocks(4)
    bm = lab.manager(12)
    prompt = tokens(60, 9)
    seqs = {name: lab.seq(prompt + [700 + i]) for i, name in enumerate("abc")}
    for s in seqs.values():
        lab.prefill(bm, s)
    observe("all three", lab.snapshot(bm, seqs))
    observe("freed by b", bm.deallocate(seqs["b"]))
    observe("freed by a", bm.deallocate(seqs["a"]))
    observe("one left", lab.snapshot(bm, seqs))
    observe("freed by c", bm.deallocate(seqs["c"]))
    observe("none left", lab.snapshot(bm, seqs))


def test_prefix_caching_off(observe):
    lab = Blocks(4)
    bm = lab.manager(10, caching=False)
    a, b = lab.seq(tokens(0, 9)), lab.seq(tokens(0, 9))
    lab.prefill(bm, a)
    observe("cached for b", bm.num_cached_tokens(b))
    lab.prefill(bm, b)
    observe("after b", lab.snapshot(bm, {"a": a, "b": b}))


def test_hash_collision_is_not_a_hit(observe, monkeypatch):
    """With every block hashing alike, only a block whose stored tokens match may hit."""
    bm_module = module("engine.block_manager")
    monkeypatch.setattr(bm_module, "chain_hash", lambda token_ids, prev_hash: 12345)
    lab = Blocks(4)
    bm = lab.manager(10)
    a = lab.seq(tokens(0, 9))
    lab.prefill(bm, a)
    b = lab.seq(tokens(400, 9))
    observe("cached for b", bm.num_cached_tokens(b))
    lab.prefill(bm, b)
    observe("after b", lab.snapshot(bm, {"a": a, "b": b}))


def test_the_latest_publication_of_a_hash_wins(observe):
    """Three sequences compute one prompt in the same step (none could hit another yet), so three blocks
    publish each hash; the cache keeps the block published last (the handout's rule)."""
    lab = Blocks(4)
    bm = lab.manager(16)
    prompt = tokens(30, 14)
    seqs = {name: lab.seq(prompt) for name in "abc"}
    for seq in seqs.values():
        bm.allocate(seq)
    for name in "bca":                               # a publishes last
        bm.mark_computed(seqs[name], len(seqs[name]))
    d = lab.seq(prompt + [5, 6])
    observe("cached for d", bm.num_cached_tokens(d))
    bm.allocate(d)
    observe("after d", lab.snapshot(bm, {**seqs, "d": d}))
