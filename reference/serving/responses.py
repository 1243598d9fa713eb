"""OpenAI's response bodies and SSE chunks, built from the Deltas a request received.

Two formats each: `text_completion` (legacy completions: `logprobs` as
parallel lists `tokens` / `token_logprobs` / `top_logprobs` / `text_offset`)
and `chat.completion` (`logprobs.content`, one object per token with its
`top_logprobs`). A token's text is its own decoding, so a token that is part
of a multi-byte character shows as U+FFFD (its `bytes` are those of that
text), and `text_offset` counts the characters of the tokens before it, as
vLLM does.
"""
from __future__ import annotations

from typing import Any

from reference.serving.output_processor import LogprobEntry


class ResponseBuilder:
    """Bodies for one request (`chat`: a chat completion, else a legacy completion); `ids` are its id, created
    time and model; `num_top` is the logprobs it asked for (None: none)."""

    def __init__(self, chat: bool, ids: dict[str, Any], num_top: int | None, prompt_len: int):
        self.chat = chat
        self.ids = ids
        self.num_top = num_top
        self.prompt_len = prompt_len
        self.text_offset = 0
        self.object = "chat.completion" if chat else "text_completion"

    def usage(self, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_len, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_len + completion_tokens}

    def full(self, text: str, token_ids: list[int], logprobs: list[LogprobEntry] | None,
             reason: str | None) -> dict[str, Any]:
        """The non-streaming body."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": self.logprobs(logprobs), "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": self.logprobs(logprobs), "finish_reason": reason,
                      "token_ids": token_ids}
        return {**self.ids, "object": self.object, "choices": [choice], "usage": self.usage(len(token_ids))}

    def chunk(self, text: str, token_ids: list[int], logprobs: list[LogprobEntry] | None, reason: str | None,
              first: bool) -> dict[str, Any]:
        """One SSE chunk."""
        if self.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": self.logprobs(logprobs), "finish_reason": reason}
            return {**self.ids, "object": "chat.completion.chunk", "choices": [choice]}
        choice = {"index": 0, "text": text, "logprobs": self.logprobs(logprobs), "finish_reason": reason,
                  "token_ids": token_ids}
        return {**self.ids, "object": "text_completion", "choices": [choice]}

    def usage_chunk(self, completion_tokens: int) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self.ids, "object": kind, "choices": [], "usage": self.usage(completion_tokens)}

    def logprobs(self, entries: list[LogprobEntry] | None) -> dict[str, Any] | None:
        """The `logprobs` object of a choice, or None if the request did not ask for them."""
        if self.num_top is None:
            return None
        entries = entries or []
        if self.chat:
            return {"content": [{"token": e.token, "logprob": e.logprob, "bytes": list(e.token.encode("utf-8")),
                                 "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}
                                                  for t, lp in e.top]} for e in entries]}
        offsets = []
        for e in entries:
            offsets.append(self.text_offset)
            self.text_offset += len(e.token)
        # The legacy format maps token text to logprob: the top entries plus the sampled token.
        top = [{**dict(e.top), e.token: e.logprob} for e in entries]
        return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": top, "text_offset": offsets}
