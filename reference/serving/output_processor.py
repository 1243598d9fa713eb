"""Stage 6 on the HTTP path: each step's tokens become text in a thread of their own.

The engine thread hands over a step's outputs as one batch. This thread
detokenizes them (`IncrementalDetokenizer`), decodes the logprobs' tokens,
and posts the results to the event loop in one callback per step, not one per
request. Neither the engine thread (whose time is every client's step time)
nor the event loop (whose time is every client's latency, and /health's)
spends time decoding. The price: one more thread hand-off per step between
a sampled token and its SSE chunk.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass

from reference.engine.llm_engine import StepOutput

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class LogprobEntry:
    """One output token's logprobs as the API shows them: decoded token texts, best alternative first."""
    token: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass(slots=True)
class Delta:
    """What one step gave one request, ready for the response: text, token ids, logprobs, the end."""
    text: str
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    logprobs: list[LogprobEntry] | None = None
    error: str | None = None     # the engine's message, when finish_reason is "error"


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="inferlab-detokenize", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def put(self, items: list[tuple[object, StepOutput, str | None]]) -> None:
        """From the engine thread: one step's (RequestStream, output, error message) triples."""
        self._queue.put(items)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Deliver what is queued, then stop."""
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while (items := self._queue.get()) is not None:
            try:
                self._deliver(items)
            except Exception:   # a bug here must not silence every later step
                logger.exception("turning a step's outputs into text failed")

    def _deliver(self, items) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for stream, out, error in items:
            text = stream.detokenizer.push(out.new_token_ids, out.finished)
            delta = Delta(text, out.new_token_ids, out.finished, out.finish_reason, self._decode_logprobs(out), error)
            by_loop.setdefault(stream.loop, []).append((stream, delta))
        for loop, deliveries in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, deliveries)
            except RuntimeError:   # that event loop is closed: nobody is listening
                pass

    def _decode_logprobs(self, out: StepOutput) -> list[LogprobEntry] | None:
        if out.logprobs is None:
            return None
        return [LogprobEntry(self._piece(token_id), entry.logprob, [(self._piece(i), lp) for i, lp in entry.top])
                for token_id, entry in zip(out.new_token_ids, out.logprobs)]

    def _piece(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])


def _put_all(deliveries: list) -> None:
    for stream, delta in deliveries:
        stream.outputs.put_nowait(delta)
