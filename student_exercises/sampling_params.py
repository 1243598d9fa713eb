# Generated from reference/sampling_params.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Per-request sampling parameters, checked at the API boundary.

Stage 1 of the request lifecycle: a bad value must be refused here, with an
error that names the field, before anything reaches the queue.
"""
from __future__ import annotations

from dataclasses import dataclass, field


def _check_int(name: str, value: object, minimum: int | None = None) -> None:
    # bool is a subclass of int, but `max_tokens=True` is a bug, not a number.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"SamplingParams.{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"SamplingParams.{name} must be >= {minimum}, got {value}")


def _check_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"SamplingParams.{name} must be a number, got {type(value).__name__}")
    return float(value)


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature == 0 means greedy (argmax); top_k == 0 and top_p == 1.0 switch
    those filters off. `seed` makes a sampled request reproducible on its own,
    whatever else is in the batch.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 64
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
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
        for token_id in self.stop_token_ids:
            _check_int("stop_token_ids[]", token_id, minimum=0)
        self.stop_token_ids = list(self.stop_token_ids)
        if self.seed is not None:
            _check_int("seed", self.seed, minimum=0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
