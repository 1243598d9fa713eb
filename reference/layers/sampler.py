"""Turn the last position's logits into the next token of each sequence."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.parallel_state import all_gather_last_dim
from reference.sampling_params import SamplingParams

# What torch.multinomial says of such a row; the engine fails the request with it.
INVALID_PROBABILITIES = "probability tensor contains either `inf`, `nan` or element < 0"


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


def sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """One sampled token of one row of logits, as a 0-d int64 tensor on the logits' device; -1 if the
    probabilities are not a distribution (NaN or inf logits).

    This is `torch.multinomial(probs, 1, generator)` written out: for one
    sample it draws Exp(1) noise q, one value per token, and takes
    argmax(probs / q) (the Gumbel-max trick). Written out, it needs no answer
    from the device: nothing waits for the GPU, so a decode step with sampled
    requests can be launched before the previous one is read back (async
    scheduling), and the token still feeds the next step on the device. On the
    CPU it is bit for bit the multinomial draw, from the same generator state.
    """
    row = filter_top_k_top_p(logits.float() / params.temperature, params.top_k, params.top_p)
    probs = torch.softmax(row, dim=-1)
    noise_device = generator.device if generator is not None else probs.device
    noise = torch.empty(probs.shape, dtype=probs.dtype, device=noise_device).exponential_(1, generator=generator)
    if noise.device != probs.device:   # a generator elsewhere: copy without waiting for the device
        noise = noise.pin_memory().to(probs.device, non_blocking=True) if noise.device.type == "cpu" else \
            noise.to(probs.device)
    valid = (probs.max() < float("inf")) & (probs.min() >= 0)
    return torch.where(valid, torch.argmax(probs / noise), -1)


def argmax_only(params: list[SamplingParams | None]) -> bool:
    """Whether every row takes the argmax and none asks for log-probabilities: then, under tensor
    parallelism, no rank needs whole rows of logits (`vocab_parallel_greedy_tokens`)."""
    return all(p is not None and p.greedy and p.logprobs is None for p in params)


# `_order_key` of -inf and +inf: a row's best logit is finite exactly when its key lies strictly between.
NEG_INF_KEY, POS_INF_KEY = -0x7F800001, 0x7F800000
_INDEX_BITS = 0xFFFFFFFF


def _order_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys that order like the fp32 values x, NaN above +inf, -0.0 equal to +0.0 (as torch.argmax ranks)."""
    x = torch.where(x == 0, torch.zeros_like(x), x)
    bits = x.view(torch.int32).to(torch.int64)
    key = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)     # negatives: larger magnitude, smaller key
    return torch.where(torch.isnan(x), 2**31 - 1, key)


def vocab_parallel_greedy_tokens(local_logits: torch.Tensor, start: int, world_size: int) -> torch.Tensor:
    """What `sample_on_device` gives greedy rows of the whole vocabulary, from this rank's slice of it.

    Under tensor parallelism each rank holds the logits of its vocabulary
    slice (columns start, start + 1, ...). Gathering whole rows to take their
    argmax moves rows x vocab values per step; here each rank takes its own
    slice's argmax and the ranks exchange one int64 per row: the best value's
    order key in the high half, the complement of its global column in the low
    half, so the largest packed value is the largest logit, and of equal ones
    the first column, as torch.argmax chooses. Every rank gets the tokens, so
    none needs to be sent them. A row whose best logit is NaN or +inf, or
    that is all -inf, gives -1, as in `sample_on_device`.
    """
    everyone = all_gather_last_dim(best_of_slice(local_logits, start).unsqueeze(0), world_size)
    return token_of_best(everyone.view(world_size, -1))


def best_of_slice(local_logits: torch.Tensor, start: int) -> torch.Tensor:
    """Per row, the slice's best logit and its global column, packed into one int64 (larger: better)."""
    local = greedy_tokens(local_logits)
    best = local_logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).float()
    return (_order_key(best) << 32) | (_INDEX_BITS - (local + start))


def token_of_best(packed: torch.Tensor) -> torch.Tensor:
    """[slices, rows] of `best_of_slice` -> each row's token, -1 where the best logit is not finite."""
    winner = packed.amax(dim=0)
    key = winner >> 32
    tokens = _INDEX_BITS - (winner & _INDEX_BITS)
    return torch.where((key > NEG_INF_KEY) & (key < POS_INF_KEY), tokens, -1)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax, in the logits' dtype (no fp32 copy of the whole batch).

    On the GPU a Triton kernel (reference/kernels/greedy_argmax.py) that gives
    torch.argmax's answer, faster at a decode batch's size (docs/performance.md).
    """
    if logits.is_cuda and logits.dim() == 2 and logits.stride(1) == 1:
        from reference.kernels.greedy_argmax import greedy_argmax
        return greedy_argmax(logits)
    return logits.argmax(dim=-1)


def sample_on_device(logits: torch.Tensor, params: list[SamplingParams],
                     generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row, left on the logits' device (int64; -1 marks a row that cannot be sampled).

    Greedy rows take the argmax; sampled rows draw with their own generator,
    so a seeded request gets the same tokens whatever else shares its batch.
    Nothing here waits for the device.

    A greedy row is refused (-1) exactly when a sampled row would be: when it
    holds a NaN or +inf, or is all -inf. torch.argmax ranks NaN above every
    number, so the row's largest value, read at the argmax, is finite only if
    none of these holds; without the check argmax would hand back the NaN's
    index (or 0 for an all -inf row) as if it were a token. The price: a gather and a compare per step, one value per row,
    instead of a second pass over the whole vocabulary.
    """
    tokens = greedy_tokens(logits)
    best = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    tokens = torch.where(torch.isfinite(best), tokens, -1)
    for i, (p, gen) in enumerate(zip(params, generators)):
        if not p.greedy:
            tokens[i] = sample_row(logits[i], p, gen)
    return tokens


def check_sampled(tokens: list[int]) -> list[int]:
    """Raise as torch.multinomial would if some row could not be sampled (`sample_row` gave -1)."""
    if any(t < 0 for t in tokens):
        raise RuntimeError(INVALID_PROBABILITIES)
    return tokens


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None]) -> list[int]:
    """One token per row, read back to the host (see `sample_on_device`)."""
    return check_sampled(sample_on_device(logits, params, generators).tolist())


@dataclass(slots=True)
class TokenLogprobs:
    """One sampled token's log-probability, and the `top` most likely tokens' (id, log-probability), best first."""
    logprob: float
    top: list[tuple[int, float]]


def token_logprobs(logits: torch.Tensor, tokens: list[int], num_top: list[int]) -> list[TokenLogprobs]:
    """Each row's log-softmax at its sampled token, and its `num_top[i]` largest entries.

    These are the model's own log-probabilities (fp32 log-softmax of the raw
    logits), before temperature, top-k and top-p reshape the distribution a
    sampled row draws from: vLLM's default (`raw_logprobs`), and what an
    evaluation that scores a text asks for. Only the rows that asked pay for
    it: the caller passes those rows alone.
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(-1, torch.tensor(tokens, device=logits.device).unsqueeze(-1)).squeeze(-1).tolist()
    k = max(num_top, default=0)
    if k == 0:
        return [TokenLogprobs(lp, []) for lp in chosen]
    values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]), dim=-1)
    values, ids = values.tolist(), ids.tolist()
    return [TokenLogprobs(lp, list(zip(row_ids[:n], row_values[:n])))
            for lp, row_ids, row_values, n in zip(chosen, ids, values, num_top)]
