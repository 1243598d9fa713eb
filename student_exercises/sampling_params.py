# Generated from reference/sampling_params.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Per-request sampling parameters, checked at the API boundary.

Stage 1 of the request lifecycle: a bad value must be refused here, with an
error that names the field, before anything reaches the queue.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# Below this temperature a request samples as greedy, as vLLM does: dividing the
# logits by a smaller number overflows fp32 to inf, and softmax of inf is NaN.
GREEDY_BELOW_TEMPERATURE = 1e-5
# torch generators take 64-bit seeds; we keep to the signed range every backend accepts.
MAX_SEED = 2**63 - 1
# The most `logprobs` a request may ask for (the top entries returned per token), as vLLM's default limit
# and OpenAI's chat API (`top_logprobs` <= 20).
MAX_LOGPROBS = 20


def _check_int(name: str, value: object, minimum: int | None = None) -> None:
    # bool is a subclass of int, but `max_tokens=True` is a bug, not a number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"SamplingParams.{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"SamplingParams.{name} must be >= {minimum}, got {value}")


def _check_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"SamplingParams.{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"SamplingParams.{name} must be a finite number, got {value}")
    return value


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature == 0 means greedy (argmax); so does any temperature below
    GREEDY_BELOW_TEMPERATURE, which is made safe rather than refused (a tiny
    temperature *means* "almost greedy"). top_k == 0 and top_p == 1.0 switch
    those filters off; a top_p so small that it rounds to zero keeps the most
    likely token (the sampler always keeps the token that crosses the
    threshold). NaN and infinite numbers are refused. `seed` makes a sampled
    request reproducible on its own, whatever else is in the batch.
    `logprobs` (None: off) asks for each output token's log-probability and
    the `logprobs` most likely alternatives (0: the sampled token's alone).

    The fields are checked on construction and again by the engine before a
    request is queued (`validate`), since a dataclass can be changed after it
    was built.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    logprobs: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check (and normalise) every field; raise naming the first bad one."""
        self.temperature = _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        _check_int("top_k", self.top_k, minimum=0)
        self.top_p = _check_number("top_p", self.top_p)
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        _check_int("max_tokens", self.max_tokens, minimum=1)
        if not isinstance(self.ignore_eos, bool):
            raise TypeError(f"SamplingParams.ignore_eos must be a bool, got {type(self.ignore_eos).__name__}")
        if not isinstance(self.stop_token_ids, (list, tuple)):
            raise TypeError("SamplingParams.stop_token_ids must be a list of ints")
        for i, token_id in enumerate(self.stop_token_ids):
            _check_int(f"stop_token_ids[{i}]", token_id, minimum=0)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0)
            if self.seed > MAX_SEED:
                raise ValueError(f"SamplingParams.seed must be <= 2**63 - 1, got {self.seed}")
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, minimum=0)
            if self.logprobs > MAX_LOGPROBS:
                raise ValueError(f"SamplingParams.logprobs must be <= {MAX_LOGPROBS}, got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE
