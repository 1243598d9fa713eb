"""`SamplingParams.logprobs`: each output token's log-probability and the top alternatives.

The oracle is transformers' own forward pass over prompt + output on the same
weights: the log-softmax of its logits at each position that predicted an
output token. The engine returns the model's raw distribution (before
temperature), so a sampled request is checked against the same log-softmax.
"""
from __future__ import annotations

import pytest
import torch

from courseware.oracle import hf_model, random_prompts
from reference import LLM, SamplingParams

VOCAB = 1024
TOP = 5


def reference_logprobs(model_dir: str, prompt: list[int], output: list[int]) -> torch.Tensor:
    """[len(output), vocab] log-softmax of transformers' logits at the positions that predicted `output`."""
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = hf_model(model_dir)(ids).logits[0].float()
    return torch.log_softmax(logits[len(prompt) - 1:len(prompt) - 1 + len(output)], dim=-1)


def assert_matches(entries, expected: torch.Tensor, output: list[int], top: int) -> None:
    assert len(entries) == len(output)
    for entry, row, token in zip(entries, expected, output):
        assert entry.logprob == pytest.approx(row[token].item(), abs=1e-4)
        ids = [i for i, _ in entry.top]
        values = torch.tensor([v for _, v in entry.top])
        assert len(ids) == top
        assert torch.allclose(values, row.topk(top).values, atol=1e-4)
        assert torch.allclose(row[ids], values, atol=1e-4)   # each id has the value given (ties in any order)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_logprobs_are_the_log_softmax_of_the_model(tiny_model_dir, device, async_scheduling):
    llm = LLM(tiny_model_dir, device=device, dtype="float32", max_model_len=256, num_kvcache_blocks=64,
              async_scheduling=async_scheduling)
    prompts = random_prompts([7, 19], VOCAB, seed=3)
    params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=TOP),
              SamplingParams(temperature=0.9, seed=5, max_tokens=6, ignore_eos=True, logprobs=TOP)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        expected = reference_logprobs(tiny_model_dir, prompt, out["token_ids"])
        assert_matches(out["logprobs"], expected, out["token_ids"], TOP)
    greedy = outs[0]
    assert [e.top[0][0] for e in greedy["logprobs"]] == greedy["token_ids"]   # greedy takes the best


def test_logprobs_zero_gives_the_sampled_token_only_and_none_are_kept_unasked(tiny_model_dir, device):
    llm = LLM(tiny_model_dir, device=device, dtype="float32", max_model_len=256, num_kvcache_blocks=64)
    prompt = random_prompts([11], VOCAB, seed=4)[0]
    asked, unasked = llm.generate([prompt, prompt], [
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=0),
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)], use_tqdm=False)
    assert all(e.top == [] for e in asked["logprobs"]) and len(asked["logprobs"]) == 4
    assert "logprobs" not in unasked and asked["token_ids"] == unasked["token_ids"]


@pytest.mark.parametrize("value, error", [(-1, ValueError), (21, ValueError), (2.0, TypeError), (True, TypeError)])
def test_bad_logprobs_are_refused(value, error):
    with pytest.raises(error, match="logprobs"):
        SamplingParams(logprobs=value)
