"""Prefill/decode disaggregation on the CPU: two processes, K/V sent over gloo, the single engine's tokens.

One DisaggregatedLLM serves every check (starting its two processes costs seconds).
"""
from __future__ import annotations

import json
import multiprocessing

import pytest
import torch

from reference import LLM, SamplingParams
from reference.distributed.disaggregation import DisaggregatedLLM
from courseware.oracle import random_prompts

CONFIG = dict(device="cpu", dtype="float32", kvcache_block_size=16, num_kvcache_blocks=64, max_model_len=256,
              max_num_batched_tokens=256)
PARAMS = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def pd(tiny_model_dir):
    engine = DisaggregatedLLM(tiny_model_dir, **CONFIG)
    yield engine
    engine.close()


def test_tokens_equal_the_single_engine_and_kv_moves_once(pd, tiny_model_dir):
    vocab = json.loads(open(f"{tiny_model_dir}/config.json").read())["vocab_size"]
    shared = random_prompts([40], vocab, seed=1)[0]
    first = random_prompts([5, 17, 32], vocab, seed=2) + [shared + [7, 8, 9]]
    # the first 2 blocks of each are on the decode engine already; of first[2] (32 tokens), all of them
    second = [shared + [11, 12, 13, 14], first[2]]
    got = pd.generate(first, PARAMS) + pd.generate(second, PARAMS)
    single = LLM(tiny_model_dir, **CONFIG).generate(first + second, PARAMS, use_tqdm=False)
    assert [r["token_ids"] for r in got] == [o["token_ids"] for o in single]

    logs = pd.logs()
    sent = [e for e in logs["prefill"] if e["event"] == "KV_SENT"]
    received = [e for e in logs["decode"] if e["event"] == "KV_RECEIVED"]
    assert len(sent) == len(received) == 6
    assert [e["bytes"] for e in sent] == [e["bytes"] for e in received] == [r["kv_bytes"] for r in got]
    assert [e["seq_id"] for e in sent] == [e["seq_id"] for e in received], "the two logs join on seq_id"
    for e in received:   # the decode log continues where the prefill log stopped: the next token index is 1
        after = [x for x in logs["decode"] if x["seq_id"] == e["seq_id"] and x["event"] == "TOKEN"]
        assert after[0]["index"] == 1
    # bytes per block, from the model's shape: K and V, every layer, every KV head
    cfg = json.loads(open(f"{tiny_model_dir}/config.json").read())
    per_block = 2 * cfg["num_hidden_layers"] * 16 * cfg["num_key_value_heads"] * cfg["head_dim"] * 4
    prompt_blocks = [-(-len(p) // 16) for p in first]
    assert [e["blocks"] for e in sent[:4]] == prompt_blocks
    assert sent[0]["bytes"] == prompt_blocks[0] * per_block
    # the shared 32-token prefix (2 full blocks) was found in the decode engine's prefix cache
    assert received[4]["cached_blocks"] == 2 and sent[4]["blocks"] == -(-len(second[0]) // 16) - 2
    assert received[5]["cached_blocks"] == 2 and sent[5]["blocks"] == 0 and got[5]["kv_bytes"] == 0
    assert all(r["kv_transfer_s"] > 0 for r in got[:5])
    assert all(r["first_token_time"] >= r["arrival_time"] for r in got)


def test_a_request_that_stops_at_its_first_token_never_leaves_the_prefill_engine(pd):
    got = pd.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True))
    assert len(got[0]["token_ids"]) == 1 and got[0]["kv_bytes"] == 0


def test_close_leaves_no_process(tiny_model_dir):
    engine = DisaggregatedLLM(tiny_model_dir, **CONFIG)
    procs = list(engine.procs)
    del engine
    import gc
    gc.collect()
    assert not any(p.is_alive() for p in procs)


def test_a_bad_request_is_refused_and_the_engines_keep_serving(pd):
    bad, good = pd.generate([[10**9], [1, 2, 3]], PARAMS)
    assert "outside the vocabulary" in bad["error"] and len(good["token_ids"]) == 10


def test_no_process_left_behind_after_module(pd):
    pd.close()
    assert multiprocessing.active_children() == []


@pytest.mark.gpu
def test_both_engines_on_one_gpu_give_the_single_engines_tokens(tiny_model_dir):
    """One GPU: prefill and decode share it and send K/V through the CPU (gloo), as Tutorial 09 runs there.

    Both processes used to call torch.cuda.set_device("cuda"), which torch refuses without an index.
    """
    config = {**CONFIG, "device": "cuda"}
    prompts = [[5, 6, 7] * 4, list(range(100, 140))]
    single = LLM(tiny_model_dir, **config).generate(prompts, PARAMS, use_tqdm=False)
    engine = DisaggregatedLLM(tiny_model_dir, **config)
    try:
        got = engine.generate(prompts, PARAMS)
    finally:
        engine.close()
    assert [r["token_ids"] for r in got] == [o["token_ids"] for o in single]


@pytest.mark.parametrize("dtype,head_dim,words", [(torch.bfloat16, 8, True), (torch.float32, 8, True),
                                                  (torch.bfloat16, 6, False), (torch.float64, 8, False)])
def test_the_handoff_copies_blocks_as_words_bit_for_bit(dtype, head_dim, words):
    """The gather and scatter of a handoff (kv_transfer.as_words) move exactly the blocks' bytes, in any dtype."""
    from reference.distributed.kv_transfer import as_words
    cache = torch.randn(2, 3, 12, 4, 2, head_dim).to(dtype)
    ids = torch.tensor([9, 2, 5])
    payload = as_words(cache)[:, :, ids].contiguous()
    assert (payload.dtype == torch.int64) == words
    assert payload.numel() * payload.element_size() == cache[:, :, ids].numel() * cache.element_size()
    received = torch.zeros_like(cache)
    as_words(received)[:, :, ids] = payload
    assert torch.equal(received[:, :, ids].view(torch.uint8), cache[:, :, ids].view(torch.uint8))
    untouched = [b for b in range(12) if b not in ids.tolist()]
    assert not received[:, :, untouched].any()
