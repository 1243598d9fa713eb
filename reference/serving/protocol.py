"""OpenAI request bodies (the subset we serve), and which fields are refused.

Stage 1 of the lifecycle on the HTTP path: a body is parsed and checked here
and by `LLMEngine.check_request`; anything wrong becomes a 400 whose JSON names
the field (`param`), before the engine sees the request.

A field this server does not implement is refused, never silently ignored: a
client that asks for `logit_bias` or `presence_penalty` and gets a 200 would
believe it was applied. The one exception is a value that asks for nothing
(`null`, `n: 1`, `presence_penalty: 0`, `logit_bias: {}`, ...): clients that
fill in every default send those, and refusing them would refuse the client.
The price: every new OpenAI field is refused until it is added here, and a
field that only carries metadata for OpenAI's own bookkeeping is refused
unless listed in IGNORED.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from reference.sampling_params import MAX_LOGPROBS, SamplingParams
from reference.serving.errors import RequestError

# Fields served by both endpoints ("vLLM" ones are vLLM's extensions, under vLLM's names).
COMMON_FIELDS = frozenset({"model", "max_tokens", "temperature", "top_p", "stream", "stream_options", "seed",
                           "top_k", "ignore_eos", "stop_token_ids"})
COMPLETION_FIELDS = COMMON_FIELDS | {"prompt", "logprobs", "echo"}
CHAT_FIELDS = COMMON_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}
MESSAGE_FIELDS = frozenset({"role", "content"})
# Accepted and ignored: they change nothing in the output (OpenAI's end-user id, storage flags).
IGNORED = frozenset({"user", "store", "metadata", "service_tier"})
# Unsupported fields, with the values that ask for nothing (null always does). Each value is compared
# with ==, so 0 also stands for 0.0 and False.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1,), "best_of": (1,), "frequency_penalty": (0,), "presence_penalty": (0,), "repetition_penalty": (1,),
    "logit_bias": ({},), "stop": ([], ""), "suffix": ("",), "min_p": (0,), "min_tokens": (0,),
    "tools": ([],), "functions": ([],), "tool_choice": ("none",), "parallel_tool_calls": (True, False),
    "response_format": ({"type": "text"},), "skip_special_tokens": (True,),
    # In an assistant message a client sends back as history:
    "name": (), "tool_calls": ([],), "function_call": (), "refusal": (), "audio": (), "annotations": ([],),
}
HINTS = {"n": "only n=1 is supported", "best_of": "only best_of=1 is supported",
         "stop": "stop strings are not supported; use stop_token_ids",
         "echo": "echo with logprobs needs prompt logprobs, which this server does not compute"}


def check_fields(body: dict[str, Any], served: frozenset[str], where: str = "") -> None:
    """Refuse the first field of `body` that is neither served, ignored, nor given a value that asks for nothing."""
    for name, value in body.items():
        if name in served or name in IGNORED or value is None or any(value == v for v in NEUTRAL.get(name, ())):
            continue
        hint = HINTS.get(name, "docs/serving.md lists the fields this server implements")
        raise RequestError(f"{where}{name}: not supported by this server ({hint})", param=f"{where}{name}")


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def text_of_parts(cls, content: Any) -> Any:
        """OpenAI's API also takes `content` as a list of parts (the openai SDK's typed messages send
        one). Text parts are joined with newlines, as vLLM joins them for a chat template that takes a
        string (Qwen3's); any other part, an image, is refused by its index and type."""
        if not isinstance(content, list):
            return content
        texts = []
        for i, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"part {i} is {kind!r}; this server takes text parts only "
                                 '({"type": "text", "text": "..."})')
            texts.append(part["text"])
        return "\n".join(texts)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")   # e.g. vLLM's continuous_usage_stats: refused, not ignored

    include_usage: bool = False


class _Common(BaseModel):
    """Fields both endpoints share; `None` means "the default", as OpenAI's API treats null."""
    model_config = ConfigDict(extra="ignore")   # check_fields has refused the rest already

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    seed: int | None = Field(default=None, ge=0)
    # Extensions, as vLLM names them.
    top_k: int | None = Field(default=None, ge=0)
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=1.0 if self.temperature is None else self.temperature,
                              top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k or 0,
                              max_tokens=self.max_tokens or default_max_tokens, ignore_eos=bool(self.ignore_eos),
                              stop_token_ids=list(self.stop_token_ids or []), seed=self.seed,
                              logprobs=self.num_logprobs)

    @property
    def num_logprobs(self) -> int | None:
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_Common):
    prompt: str | list[int]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = None

    @field_validator("prompt", mode="plain")
    @classmethod
    def _one_prompt(cls, value: Any) -> str | list[int]:
        """A string or a list of token ids; a batch (a list of those) is OpenAI's, not ours.

        Checked here instead of by pydantic's union: its errors name the union's
        members (`prompt.list[int].3`), and its pass over a long list holds
        the GIL in one piece, where this loop lets the event loop in.
        """
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ValueError("must be a string or a list of token ids")
        if value and isinstance(value[0], (str, list)):
            raise ValueError("a batch of prompts is not supported: send one prompt per request")
        if not all(type(t) is int for t in value):
            raise ValueError("must be a string or a list of token ids (integers)")
        return value

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        return super().sampling_params(default_max_tokens=16)   # OpenAI's default for completions

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        if self.max_tokens is None and self.max_completion_tokens is not None:
            self.max_tokens = self.max_completion_tokens
        return super().sampling_params(default_max_tokens)

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def parse_completion(body: Any) -> CompletionRequest:
    check_fields(_object(body), COMPLETION_FIELDS)
    request = _validate(CompletionRequest, body)
    if request.echo and request.logprobs is not None:
        raise RequestError(f"echo: {HINTS['echo']}", param="echo")
    return request


def parse_chat(body: Any) -> ChatCompletionRequest:
    check_fields(_object(body), CHAT_FIELDS)
    for i, message in enumerate(body.get("messages") or []):
        if isinstance(message, dict):
            check_fields(message, MESSAGE_FIELDS, where=f"messages[{i}].")
    request = _validate(ChatCompletionRequest, body)
    if request.top_logprobs is not None and not request.logprobs:
        raise RequestError("top_logprobs: needs logprobs: true", param="top_logprobs")
    return request


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        kind = {list: "an array", str: "a string"}.get(type(body), f"a {type(body).__name__}")
        raise RequestError(f"the request body must be a JSON object, not {kind}")
    return body


def _validate(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """Validate a parsed JSON body, turning pydantic's report into one RequestError naming the field."""
    try:
        return model.model_validate(body)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = param_path(first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            message = "not supported by this server"
        raise RequestError(f"{where}: {message}" if where else message, param=where or None) from None


def param_path(loc: tuple) -> str:
    """pydantic's location as OpenAI writes a param: messages[0].content."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path
