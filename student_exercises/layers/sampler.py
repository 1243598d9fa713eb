# Generated from reference/layers/sampler.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Turn the last position's logits into the next token of each sequence."""
from __future__ import annotations

import torch

from student_exercises.sampling_params import SamplingParams


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) every token outside the top-k and outside the top-p nucleus.

    The nucleus keeps the smallest set of most likely tokens whose probability
    reaches top_p, including the token that crosses the threshold.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[..., -1, None]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs   # mass of strictly more likely tokens
        drop_sorted = mass_before >= top_p
        drop_sorted[..., 0] = False   # the most likely token always stays, even if top_p rounds to 0
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """One token per row. Greedy rows take the argmax; sampled rows draw with their own generator.

    Sampling runs on the CPU with a per-request generator, so a seeded request
    gets the same tokens whatever else shares its batch.
    """
    tokens = logits.argmax(dim=-1).tolist()   # in the model's dtype: no fp32 copy of the whole batch
    for i, (p, gen) in enumerate(zip(params, generators)):
        if p.greedy:
            continue
        row = filter_top_k_top_p(logits[i].float().cpu() / p.temperature, p.top_k, p.top_p)
        tokens[i] = int(torch.multinomial(torch.softmax(row, dim=-1), 1, generator=gen))
    return tokens
