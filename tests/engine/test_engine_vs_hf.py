"""Greedy tokens from our engine must equal transformers' own `generate` on the same weights.

Each configuration exercises a different path through the scheduler and block
manager (prefix caching, shared prefixes, chunked prefill, preemption); none
of them may change a single token. The oracle runs each prompt alone in
transformers, so it shares no code with the engine.
"""
from __future__ import annotations

import json

import pytest

from reference import LLM, SamplingParams
from courseware.oracle import hf_greedy, random_prompts
from tests.helpers import events_of

MAX_NEW = 24
# Around the block size 16: below, at and above boundaries, plus long and tiny prompts.
LENGTHS = [1, 5, 15, 16, 17, 31, 33, 64, 100]


def vocab_size(model_dir: str) -> int:
    with open(f"{model_dir}/config.json") as f:
        return json.load(f)["vocab_size"]


def engine_tokens(model_dir: str, device: str, prompts: list[list[int]], **config) -> tuple[list[list[int]], LLM]:
    llm = LLM(model_dir, device=device, dtype="float32", **config)
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True),
                        use_tqdm=False)
    return [o["token_ids"] for o in outs], llm


def assert_same_tokens(model_dir: str, prompts: list[list[int]], got: list[list[int]]) -> None:
    for i, (prompt, tokens) in enumerate(zip(prompts, got)):
        expected = hf_greedy(model_dir, prompt, MAX_NEW)
        first_diff = next((j for j, (a, b) in enumerate(zip(tokens, expected)) if a != b), None)
        assert tokens == expected, (f"prompt {i} (len {len(prompt)}): first difference at output token "
                                    f"{first_diff}: engine {tokens} vs transformers {expected}")


def assert_all_blocks_free(llm: LLM) -> None:
    bm = llm.block_manager
    assert bm.num_free_blocks == len(bm.blocks), f"{bm.num_used_blocks} blocks still in use after all requests"
    assert all(b.ref_count == 0 for b in bm.blocks)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_batch_of_mixed_lengths(tiny_model_dir, device, prefix_caching):
    prompts = random_prompts(LENGTHS, vocab_size(tiny_model_dir), seed=1)
    got, llm = engine_tokens(tiny_model_dir, device, prompts, enable_prefix_caching=prefix_caching)
    assert_same_tokens(tiny_model_dir, prompts, got)
    assert_all_blocks_free(llm)


def test_shared_prefixes_hit_the_cache(tiny_model_dir, device):
    vocab = vocab_size(tiny_model_dir)
    system = random_prompts([40], vocab, seed=2)[0]
    prompts = random_prompts([41, 48, 56, 64, 70, 75, 80, 90], vocab, seed=3, prefix=system)
    llm = LLM(tiny_model_dir, device=device, dtype="float32", enable_prefix_caching=True)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    first = [o["token_ids"] for o in llm.generate(prompts[:1], params, use_tqdm=False)]
    rest = [o["token_ids"] for o in llm.generate(prompts[1:], params, use_tqdm=False)]
    assert_same_tokens(tiny_model_dir, prompts, first + rest)
    # The later prompts reuse the first prompt's two full blocks of the shared 40 tokens.
    block_size = llm.config.kvcache_block_size
    later = [e for e in events_of(llm.log.events, "SCHEDULED") if e["seq_id"] >= 1 and e["is_prefill"]]
    assert later and all(e["num_cached_tokens"] >= (40 // block_size) * block_size for e in later), later
    assert_all_blocks_free(llm)


def test_chunked_prefill_small_budget(tiny_model_dir, device):
    prompts = random_prompts(LENGTHS, vocab_size(tiny_model_dir), seed=4)
    budget = 24
    got, llm = engine_tokens(tiny_model_dir, device, prompts, enable_chunked_prefill=True,
                          max_num_batched_tokens=budget, max_model_len=512)
    assert_same_tokens(tiny_model_dir, prompts, got)
    # The 100-token prompt (index 8) needs ceil(100 / 24) prefill chunks, each within the budget.
    chunks = [e for e in events_of(llm.log.events, "SCHEDULED", seq_id=8) if e["is_prefill"]]
    assert len(chunks) >= -(-100 // budget), chunks
    for step in events_of(llm.log.events, "STEP"):
        assert step["num_tokens"] <= budget
    assert_all_blocks_free(llm)


def test_preemption_keeps_outputs(tiny_model_dir, device):
    prompts = random_prompts(LENGTHS, vocab_size(tiny_model_dir), seed=5)
    # Room for the longest request alone (100 + 24 tokens = 8 blocks of 16) and a little more.
    got, llm = engine_tokens(tiny_model_dir, device, prompts, num_kvcache_blocks=12, max_model_len=512)
    assert_same_tokens(tiny_model_dir, prompts, got)
    preempted = events_of(llm.log.events, "PREEMPTED")
    assert preempted, "a 12-block pool for these prompts must force preemption"
    for e in preempted:
        requeued = [q for q in events_of(llm.log.events, "QUEUED", e["seq_id"]) if q["reason"] == "preempted"]
        assert requeued, f"seq {e['seq_id']} preempted but never requeued"
    assert_all_blocks_free(llm)


def test_preemption_with_chunked_prefill_and_prefix_cache(tiny_model_dir, device):
    vocab = vocab_size(tiny_model_dir)
    system = random_prompts([32], vocab, seed=6)[0]
    prompts = random_prompts([33, 40, 50, 60, 70, 80, 90, 99], vocab, seed=7, prefix=system)
    got, llm = engine_tokens(tiny_model_dir, device, prompts, num_kvcache_blocks=14, max_model_len=512,
                          enable_chunked_prefill=True, max_num_batched_tokens=32, enable_prefix_caching=True)
    assert_same_tokens(tiny_model_dir, prompts, got)
    assert events_of(llm.log.events, "PREEMPTED")
    assert_all_blocks_free(llm)


def test_stop_token_ends_request_like_truncated_oracle(tiny_model_dir, device):
    prompt = random_prompts([20], vocab_size(tiny_model_dir), seed=8)[0]
    expected = hf_greedy(tiny_model_dir, prompt, MAX_NEW)
    stop = expected[5]
    cut = expected.index(stop) + 1        # the first time the stop token appears, inclusive
    llm = LLM(tiny_model_dir, device=device, dtype="float32")
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=MAX_NEW, stop_token_ids=[stop]),
                       use_tqdm=False)[0]
    assert out["token_ids"] == expected[:cut]
    assert out["finish_reason"] == "stop"


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_any_tiny_model_seed_matches_transformers(tmp_path, device, seed):
    from courseware.tiny_model import make_tiny_model
    model_dir = str(make_tiny_model(tmp_path / f"m{seed}", seed=seed))
    prompts = random_prompts([3, 17, 40], vocab_size(model_dir), seed=seed)
    got, _ = engine_tokens(model_dir, device, prompts)
    assert_same_tokens(model_dir, prompts, got)


def test_untied_sharded_checkpoint_loads(tmp_path, device):
    """A checkpoint like Qwen3-8B's: separate lm_head, weights split over several safetensors files."""
    import torch
    import transformers
    from courseware.tiny_model import make_tiny_model
    src = make_tiny_model(tmp_path / "tied", seed=3)
    tok = transformers.AutoTokenizer.from_pretrained(src)
    cfg = transformers.AutoConfig.from_pretrained(src)
    cfg.tie_word_embeddings = False
    torch.manual_seed(11)
    model = transformers.Qwen3ForCausalLM(cfg)
    out = tmp_path / "untied"
    model.save_pretrained(out, max_shard_size="100KB")
    tok.save_pretrained(out)
    assert len(list(out.glob("*.safetensors"))) > 1, "the checkpoint should be sharded for this test"
    prompts = random_prompts([9, 30], cfg.vocab_size, seed=9)
    got, _ = engine_tokens(str(out), device, prompts)
    assert_same_tokens(str(out), prompts, got)


# Qwen3 shapes other than the tiny model's (config fields over its own), each taken as transformers takes it.
OTHER_SHAPES = {
    "mha": lambda cfg: {"num_key_value_heads": cfg["num_attention_heads"]},
    "mqa": lambda cfg: {"num_key_value_heads": 1},
    "head_wider_than_hidden_over_heads": lambda cfg: {"head_dim": 2 * cfg["hidden_size"] // cfg["num_attention_heads"]},
    "head_dim_96_three_layers_odd_mlp": lambda cfg: {"head_dim": 96, "num_hidden_layers": 3, "intermediate_size": 100},
    "larger_vocab": lambda cfg: {"vocab_size": cfg["vocab_size"] + 37},
    "attention_bias": lambda cfg: {"attention_bias": True},
}


@pytest.mark.parametrize("shape", OTHER_SHAPES)
def test_other_qwen3_shapes_match_transformers(tmp_path, shape):
    """The engine reads every dimension from config.json: no head count, head size or layer count is assumed."""
    import torch
    import transformers
    from courseware.tiny_model import make_tiny_model
    src = make_tiny_model(tmp_path / "tiny", seed=0)
    fields = transformers.AutoConfig.from_pretrained(src).to_dict()
    fields.update(OTHER_SHAPES[shape](fields))
    fields.pop("layer_types", None)          # recomputed from num_hidden_layers
    cfg = transformers.Qwen3Config(**{k: v for k, v in fields.items()
                                      if k not in ("model_type", "transformers_version")})
    torch.manual_seed(5)
    out = tmp_path / shape
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(src).save_pretrained(out)
    prompts = random_prompts([1, 16, 17, 40], vocab_size(src), seed=5)
    got, _ = engine_tokens(str(out), "cpu", prompts)
    assert len({tuple(t) for t in got}) > 1, "the prompts should give different outputs, or the check says little"
    assert_same_tokens(str(out), prompts, got)
