"""Prefill CUDA graphs (reference.engine.prefill_graphs): the buckets, the cut at attention, the padding.

CPU: the pieces run eagerly, each standing in for its graph's replay, so the
plumbing (the cut at each attention call, the buffers that cross a cut, the
padding rows of a bucket) is checked against the model's own forward without
a GPU. GPU (`gpu` marker): the captured graphs inside the engine, each prefill
step checked against the eager forward on the same inputs.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from reference import LLM, SamplingParams
from reference.engine.prefill_graphs import (BUCKET_STEP, MAX_GRAPH_TOKENS, SMALLEST_BUCKET, PrefillGraphs,
                                             prefill_buckets)
from reference.engine.sequence import Sequence
from courseware.oracle import random_prompts


@pytest.mark.parametrize("max_tokens", [1, 16, 100, 2048, 2049, 16384, 16385])
def test_buckets_cover_every_step_size_with_bounded_padding(max_tokens):
    buckets = prefill_buckets(max_tokens)
    assert buckets == sorted(set(buckets)) and buckets[-1] == max_tokens
    for n in range(1, max_tokens + 1, max(1, max_tokens // 997)):
        bucket = next(b for b in buckets if b >= n)
        # A small step pads to at most twice itself (or the smallest bucket); a large one by less than a step.
        assert bucket - n < max(n, SMALLEST_BUCKET, 1) if n <= BUCKET_STEP else bucket - n < BUCKET_STEP


def test_steps_above_the_largest_graph_run_eagerly(tiny_model_dir):
    """The buckets stop at MAX_GRAPH_TOKENS whatever max_num_batched_tokens is; a larger step does not fit."""
    llm = LLM(tiny_model_dir, device="cpu", dtype="float32", num_kvcache_blocks=8, max_model_len=256)
    graphs = PrefillGraphs(llm.model_runner.model.model, max_tokens=4 * MAX_GRAPH_TOKENS)
    assert graphs.buckets == prefill_buckets(MAX_GRAPH_TOKENS)
    assert graphs.fits(MAX_GRAPH_TOKENS) and not graphs.fits(MAX_GRAPH_TOKENS + 1)
    assert graphs.hidden.shape[0] == MAX_GRAPH_TOKENS


def eager_pieces(graphs: PrefillGraphs) -> None:
    """Stand each bucket's graphs in with its pieces, run eagerly on replay (what a capture records)."""
    for bucket in graphs.buckets:
        graphs.graphs[bucket] = [SimpleNamespace(replay=piece) for piece in graphs._pieces(bucket)]


def prefill_seqs(prompts: list[list[int]], cached: list[int], block_size: int) -> list[Sequence]:
    """Sequences whose first `cached` tokens are in the cache and whose rest is this step's chunk."""
    seqs, next_block = [], 0
    for i, (prompt, n_cached) in enumerate(zip(prompts, cached)):
        seq = Sequence(prompt, SamplingParams(max_tokens=1), block_size, seq_id=i)
        blocks = (len(prompt) + block_size - 1) // block_size
        seq.block_table = list(range(next_block, next_block + blocks))
        next_block += blocks
        seq.num_cached_tokens, seq.num_scheduled_tokens = n_cached, len(prompt) - n_cached
        seqs.append(seq)
    return seqs


def test_pieces_with_attention_between_them_are_the_model_forward(tiny_model_dir):
    llm = LLM(tiny_model_dir, device="cpu", dtype="float32", num_kvcache_blocks=64, max_model_len=256)
    runner = llm.model_runner
    graphs = PrefillGraphs(runner.model.model, max_tokens=200)
    eager_pieces(graphs)
    vocab = runner.model.model.embed_tokens.weight.shape[0]
    # Two steps through the same bucket (64), the second shorter: its padding rows hold the first step's
    # values. Then a step over a cached prefix (the prefix's K/V written by the first steps).
    prompts = random_prompts([30, 23, 9], vocab, seed=3)
    steps = [([prompts[0], prompts[1]], [0, 0]), ([prompts[2]], [0]), ([prompts[0], prompts[1]], [16, 8])]
    with torch.inference_mode():
        for step_prompts, cached in steps:
            seqs = prefill_seqs(step_prompts, cached, runner.block_size)
            input_ids, positions, meta = runner.prepare_prefill(seqs)
            meta = runner.backend.plan(meta)
            got = graphs.forward(input_ids, positions, meta).clone()
            want = runner.model(input_ids, positions, meta)
            assert got.shape == want.shape == (input_ids.shape[0], want.shape[1])
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_prefill_graphs_match_the_eager_forward_in_the_engine(tiny_model_dir):
    """Every prefill step of a chunked, prefix-cached run: the graph path against the eager forward, fp32."""
    llm = LLM(tiny_model_dir, device="cuda", dtype="float32", max_num_seqs=8, max_num_batched_tokens=160,
              max_model_len=512, enable_prefix_caching=True, enable_chunked_prefill=True)
    runner = llm.model_runner
    assert runner.prefill_graphs is not None and runner.prefill_graphs.buckets == prefill_buckets(160)
    original = runner._prefill_forward
    seen = []

    def checked(input_ids, positions, meta):
        got = original(input_ids, positions, meta).clone()
        want = runner.model(input_ids, positions, runner.backend.plan(meta))
        err = float((got - want).norm() / want.norm())
        seen.append((input_ids.shape[0], meta.has_cached_prefix, err))
        return got
    runner._prefill_forward = checked
    vocab = runner.model.model.embed_tokens.weight.shape[0]
    shared = random_prompts([40], vocab, seed=1)[0]
    prompts = random_prompts([300, 7, 100, 55], vocab, seed=2) + random_prompts([90, 61], vocab, seed=4, prefix=shared)
    llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert any(cached for _, cached, _ in seen), "some step must attend over a cached prefix (a chunk or a hit)"
    assert any(n not in runner.prefill_graphs.buckets for n, _, _ in seen), "some step must be padded"
    assert all(err < 1e-5 for _, _, err in seen), seen
