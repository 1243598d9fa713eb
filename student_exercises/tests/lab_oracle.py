# Generated from assignments/shared/public/lab_oracle.py by `inferlab exercises build`: edit it there, not here.
"""The independent oracle of the engine-level public tests: Hugging Face transformers' own greedy decoding.

One prompt at a time, no paging, no batching, no prefix cache: nothing of the
engine under test, so agreeing with it means the engine computed the right
thing, not merely the same thing twice.
"""
from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=2)
def hf_model(model_dir: str):
    import transformers
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(model_dir: str, prompt: list[int], new_tokens: int) -> list[int]:
    """Greedy continuation of `prompt` by `new_tokens` tokens, never stopping early (the engine's ignore_eos).

    transformers 5 reads `eos_token_id=None` inside a GenerationConfig as "not
    set" (and stops at the model's EOS anyway); only the keyword turns it off.
    """
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf_model(model_dir).generate(ids, do_sample=False, max_new_tokens=new_tokens, pad_token_id=0,
                                           attention_mask=torch.ones_like(ids), eos_token_id=None)
    return out[0, len(prompt):].tolist()
