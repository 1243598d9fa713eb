"""Logits with no distribution (NaN, +inf, all -inf) fail a greedy request as they fail a sampled one.

torch.argmax ranks NaN above every number, so without a check a greedy row
would return the NaN's index (or 0 for an all -inf row) as a token.
"""
from __future__ import annotations

import pytest
import torch

from courseware.oracle import random_prompts
from reference import LLM, SamplingParams
from reference.layers.sampler import INVALID_PROBABILITIES, sample, sample_on_device


@pytest.mark.parametrize("broken", ["nan", "plus_inf", "all_minus_inf"])
def test_a_greedy_row_without_a_distribution_is_refused_like_a_sampled_row(broken):
    logits = torch.randn(4, 100, generator=torch.Generator().manual_seed(0))
    if broken == "nan":
        logits[1, 7] = float("nan")
        logits[3, 7] = float("nan")
    elif broken == "plus_inf":
        logits[1, 7] = logits[3, 7] = float("inf")
    else:
        logits[1] = logits[3] = float("-inf")
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=1)]
    generators = [None, None, None, torch.Generator().manual_seed(1)]
    tokens = sample_on_device(logits, params, generators).tolist()
    assert tokens[1] == -1 and tokens[3] == -1            # the greedy row as the sampled row
    assert tokens[0] == int(logits[0].argmax()) and tokens[2] == int(logits[2].argmax())
    with pytest.raises(RuntimeError, match="inf"):
        sample(logits, params, generators)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_nan_row_fails_the_request_and_the_engine_goes_on(tiny_model_dir, device, temperature, async_scheduling):
    """Under async scheduling the next step is launched with the row's -1 before the failure is read back:
    it must run (on CUDA an embedding lookup at -1 would lose the context) and the request fail as it
    fails without overlap."""
    llm = LLM(tiny_model_dir, device=device, dtype="float32", max_model_len=256, num_kvcache_blocks=64,
              async_scheduling=async_scheduling)
    model = llm.model_runner.model
    real, calls = model.compute_logits, [0]

    def nan_once(hidden):
        logits = real(hidden)
        calls[0] += 1
        if calls[0] == 3:
            logits[0, 5] = float("nan")
        return logits
    model.compute_logits = nan_once
    prompt = random_prompts([12], 1024, seed=2)[0]
    params = SamplingParams(temperature=temperature, seed=3, max_tokens=8, ignore_eos=True)
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    assert out["finish_reason"] == "error" and INVALID_PROBABILITIES in out["error"]
    assert len(out["token_ids"]) == 2                        # the two steps before the NaN
    model.compute_logits = real
    (again,) = llm.generate([prompt], params, use_tqdm=False)
    assert again["finish_reason"] == "length" and again["token_ids"][:2] == out["token_ids"]
