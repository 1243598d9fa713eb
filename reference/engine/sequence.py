"""`Sequence`: the one object that carries a request through every stage.

The scheduler moves it between queues (`status`), the block manager fills its
`block_table`, the model runner reads its tokens and `num_cached_tokens`, and
postprocessing appends sampled tokens. Timestamps kept here are the engine's
own record of the request; the lifecycle log must agree with them.
"""
from __future__ import annotations

import itertools
from enum import Enum, auto

import torch

from reference.sampling_params import SamplingParams

# Stands in for a token sampled on the GPU but not yet read back (async scheduling only).
# It lives inside one engine step: between steps every token id is real.
PENDING_TOKEN = -1


class SequenceStatus(Enum):
    WAITING = auto()   # in the waiting queue (new, or preempted)
    RUNNING = auto()   # holds KV blocks and is scheduled every step
    FINISHED = auto()  # done; its blocks have been returned


class Sequence:
    """A request's tokens (prompt + output so far) and its KV-cache bookkeeping.

    `num_cached_tokens` counts the leading tokens whose K/V are already in the
    paged cache, whether they came from a prefix-cache hit, an earlier chunk of
    a chunked prefill, or an earlier decode step. The next step computes K/V
    for tokens `num_cached_tokens ..` (a prefill chunk, or the one newest token).
    """

    _ids = itertools.count()

    def __init__(self, token_ids: list[int], sampling_params: SamplingParams, block_size: int,
                 arrival_time: float = 0.0, seq_id: int | None = None):
        # The engine numbers its own requests from 0, so logs of equal runs are equal.
        self.seq_id = next(Sequence._ids) if seq_id is None else seq_id
        self.status = SequenceStatus.WAITING
        self.token_ids: list[int] = list(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.sampling_params = sampling_params
        self.block_size = block_size
        self.block_table: list[int] = []
        self.num_cached_tokens = 0
        self.num_scheduled_tokens = 0      # set by the scheduler for the current step
        self.finish_reason: str | None = None
        self.error: str | None = None      # the message, when finish_reason is "error"
        self.num_preemptions = 0
        self.generator: torch.Generator | None = None   # for sampled (non-greedy) requests
        # One entry per output token when sampling_params.logprobs is set (the model runner appends them).
        self.logprobs: list = []
        # The engine's own timestamps (metrics are checked against the log).
        self.arrival_time = arrival_time
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens whose K/V still have to be computed before the next sample."""
        return len(self.token_ids) - self.num_cached_tokens

    @property
    def in_prefill(self) -> bool:
        """True until every prompt token (and any token kept through preemption) has K/V."""
        return self.num_uncomputed_tokens > 1 or self.num_output_tokens == 0

    @property
    def num_blocks(self) -> int:
        """Blocks needed to hold K/V for every token in the sequence."""
        return (len(self.token_ids) + self.block_size - 1) // self.block_size

    @property
    def last_block_num_tokens(self) -> int:
        """Tokens stored in the last block: 1..block_size."""
        return len(self.token_ids) - (self.num_blocks - 1) * self.block_size

    def block(self, i: int) -> list[int]:
        """Token ids of logical block i."""
        return self.token_ids[i * self.block_size:(i + 1) * self.block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, status={self.status.name}, len={len(self)}, "
                f"cached={self.num_cached_tokens}, blocks={self.block_table})")
