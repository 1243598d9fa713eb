"""The vocabulary-parallel argmax: slices' best logits, packed and compared, give the whole row's greedy token.

Under tensor parallelism each rank holds the logits of one slice of the
vocabulary. `best_of_slice` packs a slice's best (value, global column) per
row into one int64 and `token_of_best` picks the largest; the answer must be
what `sample_on_device` gives a greedy row of the whole row, token for token:
torch.argmax's first index on ties (also across a slice boundary), and -1
where the row holds NaN or +inf or is all -inf.
"""
from __future__ import annotations

import pytest
import torch

from reference import SamplingParams
from reference.layers.sampler import best_of_slice, sample_on_device, token_of_best

ROWS, VOCAB = 6, 37


def cases(dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    plain = torch.randn(ROWS, VOCAB, generator=gen)
    ties = (plain * 2).round().clamp(-2, 2)                  # many equal maxima, in every slice
    across = torch.full((ROWS, VOCAB), -1.0)
    across[:, 12] = across[:, 30] = 3.0                       # the same best in two slices: the first column wins
    nan_plus_inf = plain.clone()
    nan_plus_inf[1, 30] = float("nan")                        # NaN in a later slice than the row's best
    nan_plus_inf[2, 3] = float("inf")
    nan_plus_inf[3] = float("-inf")
    zeros = torch.full((ROWS, VOCAB), -1.0)
    zeros[:, 5] = -0.0                                        # -0.0 ties +0.0: the first wins
    zeros[:, 33] = 0.0
    found = dict(plain=plain, ties=ties, across=across, nan_plus_inf=nan_plus_inf, signed_zeros=zeros)
    return {name: x.to(dtype) for name, x in found.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bounds", [(0, 19, VOCAB), (0, 12, 13, 31, VOCAB), (0, VOCAB)])
def test_slices_give_the_whole_rows_greedy_token(dtype, bounds):
    greedy = [SamplingParams(temperature=0.0)] * ROWS
    for name, logits in cases(dtype).items():
        packed = torch.stack([best_of_slice(logits[:, a:b], a) for a, b in zip(bounds, bounds[1:])])
        expected = sample_on_device(logits, greedy, [None] * ROWS)
        assert torch.equal(token_of_best(packed), expected), f"{name}, slices at {bounds}"
    assert (token_of_best(torch.stack([best_of_slice(cases(dtype)["nan_plus_inf"][:, a:b], a)
                                       for a, b in zip(bounds, bounds[1:])]))[1:4] == -1).all()


@pytest.mark.parametrize("rank, start, width", [(0, 0, 4), (1, 4, 3)])
def test_the_lm_heads_padding_is_never_a_candidate(monkeypatch, rank, start, width):
    """A vocabulary of 7 over 2 ranks: slices of 4 rows, the last one padded with a zero row. A zero logit
    would beat every negative one, so the last rank's slice must stop at the vocabulary's end."""
    import reference.layers.linear as linear
    import reference.parallel_state as parallel_state
    monkeypatch.setattr(parallel_state._STATE, "rank", rank)
    monkeypatch.setattr(parallel_state._STATE, "world_size", 2)
    head = linear.ParallelLMHead(7, 3)
    seen = {}
    monkeypatch.setattr(linear, "vocab_parallel_greedy_tokens",
                        lambda local, first, world: seen.update(width=local.shape[1], start=first, world=world))
    head.greedy_tokens(torch.zeros(2, 3))
    assert seen == {"width": width, "start": start, "world": 2}
