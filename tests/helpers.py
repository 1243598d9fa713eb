"""Shared test helpers: an independent oracle (Hugging Face `generate`) and prompt builders."""
from __future__ import annotations

import random
from functools import lru_cache

import torch
import transformers


@lru_cache(maxsize=4)
def hf_model(model_dir: str) -> transformers.PreTrainedModel:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval()


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


def random_prompts(lengths: list[int], vocab_size: int, seed: int, prefix: list[int] | None = None) -> list[list[int]]:
    """Random token-id prompts of the given lengths, optionally all starting with `prefix`.

    Ids avoid the last 3 (special tokens of the tiny model's tokenizer).
    """
    rng = random.Random(seed)
    prefix = prefix or []
    return [prefix + [rng.randrange(vocab_size - 3) for _ in range(n - len(prefix))] for n in lengths]


def events_of(events: list[dict], name: str, seq_id: int | None = None) -> list[dict]:
    return [e for e in events if e["event"] == name and (seq_id is None or e["seq_id"] == seq_id)]
