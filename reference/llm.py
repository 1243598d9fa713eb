"""`LLM`: the user-facing entry point (stage 1: the API).

`generate` checks every prompt before queuing any, so one bad request in a
batch raises without leaving the others half-submitted; `stream` yields text
as it is produced (stage 6, streaming return).
"""
from __future__ import annotations

import numbers
from collections import deque
from dataclasses import dataclass
from typing import Iterator, Sequence as Seq

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from reference.detokenizer import IncrementalDetokenizer
from reference.distributed.tp_runner import TensorParallelRunner
from reference.engine.collector import full_collections_deferred
from reference.engine.llm_engine import LLMEngine, StepOutput
from reference.engine.parts import EngineParts
from reference.sampling_params import SamplingParams

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
        if prompts and all(isinstance(p, numbers.Integral) and not isinstance(p, bool) for p in prompts):
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


def default_parts(tensor_parallel_size: object = 1) -> EngineParts:
    """The course's parts; with tensor parallelism, the runner that drives the worker processes.

    `tensor_parallel_size` is read before Config validates it: anything but
    an int above 1 keeps the one-process runner, and Config names a bad value.
    """
    tp = tensor_parallel_size
    if isinstance(tp, int) and not isinstance(tp, bool) and tp > 1:
        return EngineParts(model_runner=TensorParallelRunner)
    return EngineParts()


class LLM(LLMEngine):
    """The offline API: `generate` runs prompts to completion, `stream` yields text as it comes.

    Several callers can share one LLM: two streams interleaved, or `generate`
    inside a stream loop. Each caller owns its requests: whichever caller
    drives `step()` (each caller calls it directly, as the lecture's call chain
    draws), every output is put in its owner's inbox, so nobody's
    tokens are lost or taken. A caller that goes away (a stream closed,
    abandoned or garbage-collected) aborts what it still owns, and a caller
    always collects its finished results, so `self.finished` does not grow.
    """

    def __init__(self, model: str, parts: EngineParts | None = None, **config_fields):
        super().__init__(model, parts or default_parts(config_fields.get("tensor_parallel_size", 1)), **config_fields)
        self._inboxes: dict[int, deque[StepOutput]] = {}
        self._deferred_aborts: list[int] = []

    def _submit(self, prompts, sampling_params) -> list[int]:
        """Tokenize and check every prompt, then queue them all; a bad one queues nothing."""
        prompt_list = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompt_list))
        tokenized = []
        for i, (prompt, p) in enumerate(zip(prompt_list, params)):
            try:
                ids = self.tokenize(prompt)
                self.check_request(ids, p)
            except (ValueError, TypeError) as err:
                raise type(err)(f"prompt {i}: {err}") from None
            tokenized.append(ids)
        seq_ids = [self.enqueue(ids, p) for ids, p in zip(tokenized, params)]
        for seq_id in seq_ids:
            self._inboxes[seq_id] = deque()
        return seq_ids

    def _buffered(self, owned: set[int]) -> list[StepOutput]:
        """Outputs of the requests in `owned` that some step already produced; steps nothing."""
        got = [out for seq_id in owned for out in _drain(self._inboxes[seq_id])]
        if not got and self.is_finished():
            raise RuntimeError(f"requests {sorted(owned)} are neither running nor finished (an engine bug)")
        return got

    def _route(self, outputs: list[StepOutput]) -> None:
        """Put each output of a step in its owner's inbox (outputs nobody owns are dropped)."""
        for out in outputs:
            inbox = self._inboxes.get(out.seq_id)
            if inbox is not None:
                inbox.append(out)
        deferred, self._deferred_aborts = self._deferred_aborts, []
        self._release(deferred)

    def abort_request(self, seq_id: int) -> None:
        super().abort_request(seq_id)
        inbox = self._inboxes.get(seq_id)
        if inbox is not None:
            inbox.append(StepOutput(seq_id, finished=True, finish_reason="abort"))

    def _release(self, seq_ids: list[int]) -> None:
        """Forget requests whose caller went away: abort the unfinished, drop results nobody will collect.

        A stream can be garbage-collected while another caller is inside
        `step()`; its aborts then wait until that step is over.
        """
        if self.in_step:
            self._deferred_aborts.extend(seq_ids)
            return
        for seq_id in seq_ids:
            if seq_id in self.sequences:
                LLMEngine.abort_request(self, seq_id)
            self.finished.pop(seq_id, None)
            self._inboxes.pop(seq_id, None)
        self.settle()

    def generate(self, prompts, sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[dict]:
        """Run prompts to completion; results in input order as {text, token_ids, finish_reason}.

        A request that failed inside a step has finish_reason "error" and its
        message under "error"; the others are unaffected. Full garbage
        collections wait until the batch is done (`full_collections_deferred`).
        """
        seq_ids = self._submit(prompts, sampling_params)
        pending = set(seq_ids)
        try:
            with full_collections_deferred(), \
                    Progress(TextColumn("generating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             disable=not use_tqdm, transient=True) as progress:
                task = progress.add_task("generate", total=len(seq_ids))
                while pending:
                    outputs = self._buffered(pending)
                    if not outputs:
                        self._route(self.step())
                    for out in outputs:
                        if out.finished:
                            pending.discard(out.seq_id)
                            progress.advance(task)
            return [self._result(self.finished[i]) for i in seq_ids]
        finally:
            self._release(seq_ids)

    def _result(self, seq) -> dict:
        ids = seq.output_token_ids
        result = {"text": self.tokenizer.decode(ids, skip_special_tokens=True), "token_ids": ids,
                  "finish_reason": seq.finish_reason}
        if seq.error is not None:
            result["error"] = seq.error
        if seq.sampling_params.logprobs is not None:
            result["logprobs"] = seq.logprobs   # TokenLogprobs, one per output token
        return result

    def stream(self, prompts, sampling_params: SamplingParams | Seq[SamplingParams] | None = None
               ) -> Iterator[StreamChunk]:
        """Yield each request's new text as soon as its tokens are sampled.

        Byte-level tokens can split a multi-byte character; text that decodes to
        a trailing U+FFFD is held back until the rest of the character arrives.
        Closing the iterator early (break, close(), garbage collection) aborts
        the requests it still owns and frees their blocks.
        """
        seq_ids = self._submit(prompts, sampling_params)
        index = {seq_id: i for i, seq_id in enumerate(seq_ids)}
        detokenizers = {seq_id: IncrementalDetokenizer(self.tokenizer) for seq_id in seq_ids}
        pending = set(seq_ids)
        try:
            while pending:
                outputs = self._buffered(pending)
                if not outputs:
                    self._route(self.step())
                for out in outputs:
                    delta = detokenizers[out.seq_id].push(out.new_token_ids, out.finished)
                    if out.finished:
                        pending.discard(out.seq_id)
                    if delta or out.new_token_ids or out.finished:
                        yield StreamChunk(index[out.seq_id], delta, out.new_token_ids, out.finished,
                                          out.finish_reason)
        finally:
            self._release(seq_ids)


def _drain(queue: deque) -> list:
    items = list(queue)
    queue.clear()
    return items
