"""From request body to checked token ids, in a worker thread: the event loop never waits on a prompt.

Parsing JSON, validating it, applying the chat template and tokenizing all
grow with the request. On the event loop, one 10 MB prompt kept every other
client (and /health) waiting for seconds. Here they run in one worker thread;
the Rust tokenizer releases the GIL while it encodes, so the event loop goes
on. One thread, not more: requests are prepared one at a time, so a huge one
delays the next one's admission by its own preparation time. That is the
price; the prompt-length bound below keeps it short, and concurrent encodes
on one Hugging Face tokenizer can fail ("Already borrowed") when its padding
or truncation settings change.

The prompt's length is bounded before it is tokenized: no token of the
vocabulary stands for more than `max_token_bytes` bytes of text (measured
once, from the decoding of every token), so a prompt of B bytes (after the
tokenizer's normalizer) has at least B / max_token_bytes tokens. A prompt
whose bound already reaches max_model_len is refused without tokenizing it.
Prompts below the bound are tokenized and then checked exactly
(`LLMEngine.check_request`).
"""
from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from reference.engine.llm_engine import LLMEngine
from reference.sampling_params import SamplingParams
from reference.serving.errors import RequestError
from reference.serving.protocol import ChatCompletionRequest, CompletionRequest, parse_chat, parse_completion


@dataclass
class Prepared:
    """A request that passed every check: what the engine runs and what the response needs."""
    request: CompletionRequest | ChatCompletionRequest
    token_ids: list[int]
    params: SamplingParams
    echo: str = ""      # the prompt's text, for completions with `echo`


class Preprocessor:
    def __init__(self, engine: LLMEngine, model_name: str):
        self.engine = engine
        self.model_name = model_name
        self.max_model_len = engine.config.max_model_len
        tokenizer = engine.tokenizer
        pieces = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
        self.max_token_bytes = max(1, max(len(piece.encode("utf-8")) for piece in pieces))
        self._normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferlab-prepare")

    async def prepare(self, raw: bytes, chat: bool) -> Prepared:
        """Parse, check and tokenize a body off the event loop; raises RequestError naming the problem."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._prepare, raw, chat)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _prepare(self, raw: bytes, chat: bool) -> Prepared:
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RequestError(f"the request body is not valid JSON: {err}") from None
        except RecursionError:
            raise RequestError("the request body is not valid JSON: it is nested too deeply") from None
        request = parse_chat(body) if chat else parse_completion(body)
        if request.model != self.model_name:
            raise RequestError(f"the model `{request.model}` does not exist; this server serves `{self.model_name}`",
                               param="model", code="model_not_found")
        param = "messages" if chat else "prompt"
        prompt = self._chat_prompt(request) if chat else request.prompt
        if isinstance(prompt, str):
            self._check_length_bound(prompt, param)
        elif len(prompt) >= self.max_model_len:   # before `tokenize` checks each id against the vocabulary
            raise RequestError(f"prompt: {len(prompt)} token ids but max_model_len is {self.max_model_len}",
                               param="prompt")
        try:
            token_ids = self.engine.tokenize(prompt)
            params = request.sampling_params(default_max_tokens=max(1, self.max_model_len - len(token_ids)))
            self.engine.check_request(token_ids, params)
        except (ValueError, TypeError) as err:
            raise RequestError(str(err), param=_param_of(str(err), param)) from None
        echo = ""
        if not chat and request.echo:
            echo = prompt if isinstance(prompt, str) else self.engine.tokenizer.decode(prompt)
        return Prepared(request, token_ids, params, echo)

    def _chat_prompt(self, request: ChatCompletionRequest) -> str:
        """The chat template, applied on the server (the model folder's own template)."""
        messages = [m.model_dump() for m in request.messages]
        try:
            return self.engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as err:   # a template that rejects these messages
            raise RequestError(f"messages: the chat template failed: {err}", param="messages") from None

    def _check_length_bound(self, text: str, param: str) -> None:
        if len(text) * 4 < self.max_model_len * self.max_token_bytes:
            return   # even at 4 bytes a character it could fit: leave it to the exact check
        normalized = self._normalizer.normalize_str(text) if self._normalizer is not None else text
        num_bytes = len(normalized.encode("utf-8"))
        at_least = num_bytes // self.max_token_bytes
        if at_least >= self.max_model_len:
            raise RequestError(
                f"{param}: the prompt has at least {at_least} tokens ({num_bytes} bytes of text, and no token "
                f"stands for more than {self.max_token_bytes}) but max_model_len is {self.max_model_len}",
                param=param)


def _param_of(message: str, prompt_param: str) -> str:
    """The request field an engine error is about: `SamplingParams.X ...` names it; anything else is about
    the prompt (a pool too small for a request cannot happen here: `check_kv_pool` refused it at startup)."""
    if message.startswith("SamplingParams."):
        return message.removeprefix("SamplingParams.").split(" ", 1)[0].split(":", 1)[0].removesuffix("[]")
    return prompt_param
