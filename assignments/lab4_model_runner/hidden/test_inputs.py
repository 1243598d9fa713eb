"""Hidden lab 4 tests: the model runner's inputs (docs/design.md §2, edge cases 5, 6 and 9).

Sequences with hand-made, non-contiguous block tables go through
prepare_prefill and prepare_decode of the runner under test; every tensor it
builds is observed: flat input ids, positions, slot mapping, block tables,
context lengths (seqlen_k: the end of a chunk), cu_seqlens.
"""
from __future__ import annotations

import pytest

from _inferlab_support import model_dir, module, tokens

BS = 4


def runner():
    config = module("config").Config(model=model_dir(), device="cpu", kvcache_block_size=BS, num_kvcache_blocks=32,
                                     max_num_seqs=8, max_num_batched_tokens=256, max_model_len=128,
                                     enforce_eager=True, attention_backend="torch")
    return module("engine.model_runner").ModelRunner(config)


def seq(token_ids, table, cached=0, scheduled=None):
    s = module("engine.sequence").Sequence(list(token_ids), module("sampling_params").SamplingParams(temperature=0.0),
                                           BS, seq_id=0)
    s.block_table = list(table)
    s.num_cached_tokens = cached
    s.num_scheduled_tokens = len(s) - cached if scheduled is None else scheduled
    return s


def meta_fields(meta) -> dict:
    out = {}
    for name in ("is_prefill", "slot_mapping", "block_tables", "context_lens", "cu_seqlens_q", "cu_seqlens_k",
                 "max_seqlen_q", "max_seqlen_k", "has_cached_prefix", "num_context_tokens"):
        value = getattr(meta, name, None)
        out[name] = value.tolist() if hasattr(value, "tolist") else value
    return out


PREFILL_CASES = {
    "one_sequence_block_boundaries": [(tokens(0, 9), [7, 2, 5], 0, None)],
    "exact_block_and_one_over": [(tokens(10, 8), [3, 1], 0, None), (tokens(30, 5), [0, 6], 0, None)],
    "cached_prefix": [(tokens(50, 11), [4, 9, 2], 8, None)],
    "chunk_in_the_middle": [(tokens(70, 14), [1, 8, 3, 10], 4, 6)],
    "chunk_starting_inside_a_block": [(tokens(150, 12), [6, 12, 3], 6, 4), (tokens(170, 7), [9, 2], 3, 3)],
    "mixed_batch": [(tokens(90, 3), [12], 0, None), (tokens(110, 13), [5, 0, 11, 14], 4, 5),
                    (tokens(130, 6), [13, 15], 0, 4)],
}


@pytest.mark.parametrize("case", sorted(PREFILL_CASES))
def test_prepare_prefill(observe, case):
    seqs = [seq(*spec) for spec in PREFILL_CASES[case]]
    input_ids, positions, meta = runner().prepare_prefill(seqs)
    observe("input_ids", input_ids.tolist())
    observe("positions", positions.tolist())
    observe("meta", meta_fields(meta))


DECODE_CASES = {
    "newest_token_in_a_fresh_block": [(tokens(0, 9), [3, 1, 7])],
    "newest_token_fills_a_block": [(tokens(20, 8), [2, 5])],
    "ragged_batch": [(tokens(40, 5), [9, 4]), (tokens(60, 12), [0, 6, 8]), (tokens(80, 2), [11])],
}


@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_prepare_decode(observe, case):
    """Edge case 6: the decode position is len - 1, its slot in the block holding that position."""
    seqs = [seq(ids, table, cached=len(ids) - 1, scheduled=1) for ids, table in DECODE_CASES[case]]
    input_ids, positions, meta = runner().prepare_decode(seqs)
    observe("input_ids", input_ids.tolist())
    observe("positions", positions.tolist())
    observe("meta", meta_fields(meta))
