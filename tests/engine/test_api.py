"""Stage 1 (API checks), streaming and sampling.

Bad input must raise an error that names the problem, queue nothing, and leave
the engine able to serve the next request correctly.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from reference import LLM, SamplingParams
from reference.layers.sampler import filter_top_k_top_p
from courseware.oracle import hf_greedy


@pytest.fixture(scope="module")
def llm(tiny_model_dir, device):
    # 8 blocks of 16 tokens: a 128-token pool, max_model_len 100.
    return LLM(tiny_model_dir, device=device, dtype="float32", num_kvcache_blocks=8, max_model_len=100)


GOOD_PROMPT = [5, 6, 7, 8, 9]
GREEDY = dict(temperature=0.0, max_tokens=8, ignore_eos=True)


def assert_still_serves(llm: LLM, model_dir: str) -> None:
    assert not llm.scheduler.waiting and not llm.scheduler.running, "a rejected request was queued"
    out = llm.generate([GOOD_PROMPT], SamplingParams(**GREEDY), use_tqdm=False)[0]
    assert out["token_ids"] == hf_greedy(model_dir, GOOD_PROMPT, 8)
    assert llm.block_manager.num_free_blocks == len(llm.block_manager.blocks)


@pytest.mark.parametrize("prompt, params, error, words", [
    ("", GREEDY, ValueError, "empty"),
    ([], GREEDY, ValueError, "empty"),
    (list(range(1, 101)), GREEDY, ValueError, "max_model_len"),
    (GOOD_PROMPT, dict(GREEDY, max_tokens=0), ValueError, "max_tokens"),
    (GOOD_PROMPT, dict(GREEDY, max_tokens=-3), ValueError, "max_tokens"),
    (GOOD_PROMPT, dict(GREEDY, temperature=-0.5), ValueError, "temperature"),
    (GOOD_PROMPT, dict(GREEDY, top_p=0.0), ValueError, "top_p"),
    (GOOD_PROMPT, dict(GREEDY, top_p=1.5), ValueError, "top_p"),
    (GOOD_PROMPT, dict(GREEDY, max_tokens="8"), TypeError, "max_tokens"),
    (GOOD_PROMPT, dict(GREEDY, temperature=None), TypeError, "temperature"),
    (GOOD_PROMPT, dict(GREEDY, top_k=-1), ValueError, "top_k"),
    (GOOD_PROMPT, dict(GREEDY, stop_token_ids=[1.5]), TypeError, "stop_token_ids"),
    (12345, GREEDY, TypeError, "prompt"),
    ([1, 2.5, 3], GREEDY, TypeError, "token ids"),
    ([1, 10**9], GREEDY, ValueError, "vocabulary"),
    ([1, True, 3], GREEDY, TypeError, "token ids must be ints, got bool"),
    ([1, np.int64(10**9)], GREEDY, ValueError, "vocabulary"),
    (np.array(GOOD_PROMPT), GREEDY, TypeError, r"got ndarray \(pass \.tolist\(\) of it\)"),
    (GOOD_PROMPT, dict(GREEDY, stop_token_ids=[3, -1]), ValueError, r"stop_token_ids\[1\] must be >= 0"),
])
def test_bad_request_is_refused_and_engine_keeps_serving(llm, tiny_model_dir, prompt, params, error, words):
    with pytest.raises(error, match=words):
        llm.generate([prompt] if not isinstance(prompt, int) else prompt, SamplingParams(**params), use_tqdm=False)
    assert_still_serves(llm, tiny_model_dir)


def test_numpy_integer_token_ids_are_served_as_ints(llm, tiny_model_dir):
    """`list(array)` gives numpy integers: the same tokens as the plain list, and plain ints in the sequence."""
    expected = hf_greedy(tiny_model_dir, GOOD_PROMPT, 8)
    for prompts in ([list(np.array(GOOD_PROMPT))], list(np.array(GOOD_PROMPT))):   # a batch of one, or one prompt
        out = llm.generate(prompts, SamplingParams(**GREEDY), use_tqdm=False)
        assert [o["token_ids"] for o in out] == [expected]
    assert all(type(t) is int for t in llm.tokenize(list(np.array(GOOD_PROMPT, dtype=np.int32))))


def test_request_larger_than_kv_pool(tiny_model_dir, device):
    # max_model_len 512 allows the request; the 8-block pool (128 tokens) can never hold it.
    llm = LLM(tiny_model_dir, device=device, dtype="float32", num_kvcache_blocks=8, max_model_len=512)
    with pytest.raises(ValueError, match="KV pool"):
        llm.generate([list(range(1, 101))], SamplingParams(temperature=0.0, max_tokens=50), use_tqdm=False)
    assert_still_serves(llm, tiny_model_dir)


def test_request_that_exactly_fills_the_pool_runs(tiny_model_dir, device):
    # 8 blocks of 16 = 128 slots; 100 prompt + 29 new = 129 tokens, of which the last is never stored.
    llm = LLM(tiny_model_dir, device=device, dtype="float32", num_kvcache_blocks=8, max_model_len=512)
    prompt = list(range(1, 101))
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=29, ignore_eos=True), use_tqdm=False)
    assert out[0]["token_ids"] == hf_greedy(tiny_model_dir, prompt, 29)
    with pytest.raises(ValueError, match="KV pool"):
        llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=30), use_tqdm=False)


def test_wrong_sampling_params_type(llm, tiny_model_dir):
    with pytest.raises(TypeError, match="sampling_params"):
        llm.generate([GOOD_PROMPT], "greedy", use_tqdm=False)
    assert_still_serves(llm, tiny_model_dir)


def test_one_bad_prompt_in_a_batch_queues_nothing(llm, tiny_model_dir):
    with pytest.raises(ValueError, match="prompt 1: .*empty"):
        llm.generate([GOOD_PROMPT, []], SamplingParams(**GREEDY), use_tqdm=False)
    assert_still_serves(llm, tiny_model_dir)


def test_bad_request_mid_run_leaves_others_running(llm, tiny_model_dir):
    first = llm.add_request(GOOD_PROMPT, SamplingParams(**GREEDY))
    llm.step()
    with pytest.raises(ValueError, match="max_model_len"):
        llm.add_request(list(range(1, 150)), SamplingParams(**GREEDY))
    while not llm.is_finished():
        llm.step()
    assert llm.finished.pop(first).output_token_ids == hf_greedy(tiny_model_dir, GOOD_PROMPT, 8)


@pytest.mark.parametrize("field, value, error", [
    ("device", "tpu", ValueError), ("kvcache_block_size", 0, ValueError), ("max_num_seqs", "8", TypeError),
    ("attention_backend", "magic", ValueError), ("num_kvcache_blocks", -1, ValueError),
    ("max_model_len", 10**6, ValueError), ("gpu_memory_utilization", 1.5, ValueError),
    ("cpu_threads", 0, ValueError),
])
def test_bad_config_names_the_field(tiny_model_dir, field, value, error):
    with pytest.raises(error, match=field):
        LLM(tiny_model_dir, **{"device": "cpu", field: value})


def test_chunking_off_needs_budget_for_longest_prompt(tiny_model_dir):
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLM(tiny_model_dir, device="cpu", max_model_len=256, max_num_batched_tokens=64)


def test_missing_model_folder(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        LLM(str(tmp_path / "nowhere"))


def test_stream_matches_generate(tiny_model_dir, device):
    llm = LLM(tiny_model_dir, device=device, dtype="float32")
    prompts = ["你好，请介绍一下 KV cache。", "What is prefill?", "decode"]
    params = SamplingParams(temperature=0.0, max_tokens=20)
    full = llm.generate(prompts, params, use_tqdm=False)
    chunks = list(llm.stream(prompts, params))
    for i, out in enumerate(full):
        mine = [c for c in chunks if c.index == i]
        assert "".join(c.text for c in mine) == out["text"]
        assert [t for c in mine for t in c.token_ids] == out["token_ids"]
        assert mine[-1].finished and sum(c.finished for c in mine) == 1
    # Streaming really interleaves: request 0 gets text before the last request finishes.
    last_finish = max(k for k, c in enumerate(chunks) if c.finished)
    assert any(c.index == 0 and c.token_ids for c in chunks[:last_finish])


def test_seeded_sampling_is_reproducible_whatever_the_batch(tiny_model_dir, device):
    llm = LLM(tiny_model_dir, device=device, dtype="float32")
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, max_tokens=16, seed=1234, ignore_eos=True)
    alone = llm.generate([[1, 2, 3]], params, use_tqdm=False)[0]["token_ids"]
    others = SamplingParams(temperature=1.0, max_tokens=16, seed=99, ignore_eos=True)
    batched = llm.generate([[7, 8], [1, 2, 3], [9] * 30], [others, params, others], use_tqdm=False)
    assert batched[1]["token_ids"] == alone
    greedy = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
                          use_tqdm=False)[0]["token_ids"]
    assert alone != greedy, "temperature 0.8 over 16 tokens should differ from greedy on a random model"


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    kept = lambda p: (filter_top_k_top_p(logits, 0, p) > float("-inf")).tolist()
    assert kept(0.6) == [True, True, False, False]    # 0.5 < 0.6: the 0.3 token crosses it and stays
    assert kept(0.45) == [True, False, False, False]  # the first token alone crosses 0.45
    assert kept(0.81) == [True, True, True, False]
    assert kept(1.0) == [True] * 4


def test_top_k_keeps_k_best():
    logits = torch.tensor([0.1, 2.0, -1.0, 3.0, 0.5])
    kept = (filter_top_k_top_p(logits, 2, 1.0) > float("-inf")).tolist()
    assert kept == [False, True, False, True, False]


def test_tiny_model_runs_single_threaded_on_cpu_unless_told(tiny_model_dir):
    before = torch.get_num_threads()
    try:
        LLM(tiny_model_dir, device="cpu")
        assert torch.get_num_threads() == 1
        LLM(tiny_model_dir, device="cpu", cpu_threads=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("path", ["generate", "stream", "add_request"])
def test_each_prompt_is_tokenized_and_checked_once(llm, monkeypatch, path):
    """A text prompt reaches the tokenizer once and `check_request` once, on every way in."""
    encoded, checked = [], []
    real_encode, real_check = llm.tokenizer.encode, llm.check_request
    monkeypatch.setattr(llm.tokenizer, "encode", lambda text, **kw: encoded.append(text) or real_encode(text, **kw))
    monkeypatch.setattr(llm, "check_request", lambda ids, p: checked.append(list(ids)) or real_check(ids, p))
    prompts, params = ["hello there", "one two three"], SamplingParams(**GREEDY)
    if path == "generate":
        llm.generate(prompts, params, use_tqdm=False)
    elif path == "stream":
        list(llm.stream(prompts, params))
    else:
        for prompt in prompts:
            llm.add_request(prompt, params)
        while not llm.is_finished():
            llm.step()
        for seq_id in list(llm.finished):
            llm.finished.pop(seq_id)
    assert encoded == prompts
    assert checked == [real_encode(p, add_special_tokens=False) for p in prompts]
