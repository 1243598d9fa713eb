# Generated from reference/llm.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""`LLM`: the user-facing entry point (stage 1: the API).

`generate` checks every prompt before queuing any, so one bad request in a
batch raises without leaving the others half-submitted; `stream` yields text
as it is produced (stage 6, streaming return).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence as Seq

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from student_exercises.engine.llm_engine import LLMEngine
from student_exercises.sampling_params import SamplingParams

Prompt = str | list[int]


@dataclass
class StreamChunk:
    """New text for one request. `index` is the prompt's position in the input list."""
    index: int
    text: str
    token_ids: list[int]
    finished: bool
    finish_reason: str | None = None


def _as_prompt_list(prompts) -> list[Prompt]:
    # A flat list of ints is one tokenized prompt; any other list is a batch.
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (list, tuple)):
        if prompts and all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
            return [list(prompts)]
        return list(prompts)
    raise TypeError(f"prompts must be a str, a list of str, or lists of token ids; got {type(prompts).__name__}")


def _as_params_list(params, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams() for _ in range(n)]
    if isinstance(params, SamplingParams):
        return [params] * n
    if isinstance(params, (list, tuple)):
        if len(params) != n:
            raise ValueError(f"got {len(params)} SamplingParams for {n} prompts")
        return list(params)
    raise TypeError(f"sampling_params must be a SamplingParams or a list of them, got {type(params).__name__}")


class LLM(LLMEngine):
    def _submit(self, prompts, sampling_params) -> list[int]:
        prompt_list = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompt_list))
        tokenized = [self.tokenize(p) for p in prompt_list]
        for i, (ids, p) in enumerate(zip(tokenized, params)):
            try:
                self.check_request(ids, p)
            except (ValueError, TypeError) as err:
                raise type(err)(f"prompt {i}: {err}") from None
        return [self.add_request(ids, p) for ids, p in zip(tokenized, params)]

    def generate(self, prompts, sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[dict]:
        """Run prompts to completion; results in input order as {text, token_ids, finish_reason}."""
        seq_ids = self._submit(prompts, sampling_params)
        pending = set(seq_ids)
        with Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      disable=not use_tqdm, transient=True) as progress:
            task = progress.add_task("generate", total=len(seq_ids))
            while pending:
                for out in self.step():
                    if out.finished and out.seq_id in pending:
                        pending.discard(out.seq_id)
                        progress.advance(task)
        return [self._result(self.finished.pop(i)) for i in seq_ids]

    def _result(self, seq) -> dict:
        ids = seq.output_token_ids
        return {"text": self.tokenizer.decode(ids, skip_special_tokens=True), "token_ids": ids,
                "finish_reason": seq.finish_reason}

    def stream(self, prompts, sampling_params: SamplingParams | Seq[SamplingParams] | None = None
               ) -> Iterator[StreamChunk]:
        """Yield each request's new text as soon as its tokens are sampled.

        Byte-level tokens can split a multi-byte character; text that decodes to
        a trailing U+FFFD is held back until the rest of the character arrives.
        """
        seq_ids = self._submit(prompts, sampling_params)
        index = {seq_id: i for i, seq_id in enumerate(seq_ids)}
        sent_text = {seq_id: "" for seq_id in seq_ids}
        pending = set(seq_ids)
        while pending:
            for out in self.step():
                if out.seq_id not in pending:
                    continue
                seq = self.finished.get(out.seq_id) or self.sequences[out.seq_id]
                text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=True)
                if text.endswith("\ufffd") and not out.finished:
                    text = sent_text[out.seq_id]  # wait for the rest of the character
                delta = text[len(sent_text[out.seq_id]):]
                sent_text[out.seq_id] = text
                if out.finished:
                    pending.discard(out.seq_id)
                    self.finished.pop(out.seq_id)
                if delta or out.new_token_ids or out.finished:
                    yield StreamChunk(index[out.seq_id], delta, out.new_token_ids, out.finished, out.finish_reason)
