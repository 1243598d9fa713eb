"""The streaming detokenizer's deltas add up to the whole decode, and never show a half character."""
from __future__ import annotations

import random

from transformers import AutoTokenizer

from reference.detokenizer import REPLACEMENT_CHARACTER, IncrementalDetokenizer


def test_deltas_join_to_the_full_decode_and_hold_back_split_characters(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    texts = ["你好，世界！KV cache 与 PagedAttention。", "plain ascii text, with spaces  and\nnewlines",
             "混合 mixed 文本 🙂 emoji"]
    rng = random.Random(0)
    cases = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    cases += [[rng.randrange(1021) for _ in range(60)] for _ in range(20)]   # arbitrary ids, split bytes too
    for ids in cases:
        detok = IncrementalDetokenizer(tokenizer)
        deltas, i = [], 0
        while i < len(ids):
            step = rng.randint(1, 3)
            deltas.append(detok.push(ids[i:i + step], finished=i + step >= len(ids)))
            i += step
        full = tokenizer.decode(ids, skip_special_tokens=True)
        assert "".join(deltas) == full
        if full.count(REPLACEMENT_CHARACTER) == 0:
            assert all(REPLACEMENT_CHARACTER not in d for d in deltas)
