# Generated from reference/serving/protocol.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""OpenAI request bodies (the subset we serve) and OpenAI's error format.

Stage 1 of the lifecycle on the HTTP path: a body is parsed and checked here
and by `LLMEngine.check_request`; anything wrong becomes a 400 whose JSON names
the problem, before the engine sees the request.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from student_exercises.sampling_params import SamplingParams


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    """Fields both endpoints share. Unknown fields are ignored, as OpenAI-compatible servers do."""
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = Field(default=None, ge=0)
    stop: str | list[str] | None = None
    # Extensions, as vLLM names them.
    top_k: int = Field(default=0, ge=0)
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)

    @model_validator(mode="after")
    def _supported(self):
        if self.n != 1:
            raise ValueError("n: only n=1 is supported")
        if self.stop:
            raise ValueError("stop: stop strings are not supported; use stop_token_ids")
        return self

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_tokens=self.max_tokens or default_max_tokens, ignore_eos=self.ignore_eos,
                              stop_token_ids=list(self.stop_token_ids), seed=self.seed)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Common):
    prompt: str | list[int]
    max_tokens: int | None = Field(default=16, ge=1)   # OpenAI's default for completions


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return super().sampling_params(default_max_tokens)


class RequestError(Exception):
    """A client error: becomes an OpenAI error body with this status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None, err_type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.err_type = status, param, code, err_type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.err_type, "param": self.param, "code": self.code}}


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validate a JSON body, turning pydantic's report into one readable RequestError."""
    try:
        return model.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise RequestError(f"{where}: {first['msg']}", param=where) from None
