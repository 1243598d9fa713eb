"""The independent oracle: transformers' own model, one prompt at a time, set against the engine.

No paging, no batching, no prefix cache: nothing of the engine under test, so
agreeing with it means the engine computed the right thing, not merely the
same thing twice. The project's tests, the public lab suites (through
`lab_oracle.py`), the engine fuzzer and the GPU probes all compare against
this one copy, so they cannot disagree about what "right" is.
"""
from __future__ import annotations

import random
from functools import lru_cache

import torch
import transformers


@lru_cache(maxsize=4)
def hf_model(model_dir: str) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(model_dir: str, prompt: list[int], max_new_tokens: int, stop_at_eos: bool = False) -> list[int]:
    """Greedy tokens from transformers itself, one prompt at a time (no padding).

    stop_at_eos=False never stops early (the engine's `ignore_eos=True`).
    stop_at_eos=True stops where transformers' own rules stop: the model's
    generation config, i.e. generation_config.json's `eos_token_id` (one id or
    a list) when the folder has one, else config.json's.

    Under transformers 5, `eos_token_id=None` inside a GenerationConfig object
    means "not set" and is filled from the model's generation config, so EOS
    still stops generation; only the keyword argument switches it off.
    """
    kwargs = {} if stop_at_eos else {"eos_token_id": None}
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf_model(model_dir).generate(ids, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=0,
                                           attention_mask=torch.ones_like(ids), **kwargs)
    return out[0, len(prompt):].tolist()


def hf_last_logits(model_dir: str, prompts: list[list[int]], dtype: torch.dtype, device: str) -> torch.Tensor:
    """transformers' logits at each prompt's last position, one prompt at a time, in `dtype` on `device`."""
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    rows = []
    with torch.no_grad():
        for p in prompts:
            rows.append(model(torch.tensor([p], device=device)).logits[0, -1].float().cpu())
    return torch.stack(rows)


def engine_last_logits(llm, prompts: list[list[int]]) -> torch.Tensor:
    """The engine's logits at each prompt's last position, from one batched prefill through its own path."""
    from reference import SamplingParams
    for p in prompts:
        llm.add_request(p, SamplingParams(temperature=0.0, max_tokens=1))
    seqs, is_prefill = llm.scheduler.schedule()
    assert is_prefill and len(seqs) == len(prompts)
    runner = llm.model_runner
    with torch.inference_mode():
        input_ids, positions, meta = runner.prepare_prefill(seqs)
        hidden = runner.model(input_ids, positions, meta)
        return runner.model.compute_logits(hidden[meta.cu_seqlens_q[1:] - 1]).float().cpu()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||: how far the engine's numbers are from the oracle's, as one figure."""
    return float((a - b).norm() / b.norm())


def random_prompts(lengths: list[int], vocab_size: int, seed: int, prefix: list[int] | None = None) -> list[list[int]]:
    """Random token-id prompts of the given lengths, optionally all starting with `prefix`.

    Ids avoid the last 3 (special tokens of the tiny model's tokenizer).
    """
    rng = random.Random(seed)
    prefix = prefix or []
    return [prefix + [rng.randrange(vocab_size - 3) for _ in range(n - len(prefix))] for n in lengths]
