"""One engine, many HTTP clients: the engine runs in its own thread.

The HTTP server (asyncio) never touches the engine's queues directly. Handlers
put commands (add a request, abort one) on a thread-safe queue; the engine
thread applies them *between* steps, so requests from different clients join
and leave the running batch exactly as continuous batching says, and the
scheduler never sees a queue change in the middle of `schedule()`. Each step's
outputs go, as one batch, to a sink (the server's OutputProcessor thread),
which turns them into text and hands them to each request's `asyncio.Queue`.

Price: a request waits for the step in progress to end before it can be
admitted or aborted (at most one step, a few milliseconds on a GPU).

Draining (a server asked to stop): no new request is admitted, running ones go
on until the drain deadline, and whatever is left then is aborted, so each of
its clients gets a last output (finish reason "abort") rather than a cut
connection.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from reference.engine.llm_engine import LLMEngine, StepOutput
from reference.sampling_params import SamplingParams
from reference.serving import defaults

logger = logging.getLogger(__name__)

# (stream, output, error message) for each request a step touched.
Sink = Callable[[list[tuple["RequestStream", StepOutput, str | None]]], None]
IDLE_WAIT_S = 0.05


class QueueFull(Exception):
    """The waiting queue is at its limit, or the server is draining; the client should retry (HTTP 503)."""


@dataclass(eq=False)
class RequestStream:
    """One request's outputs, delivered to the asyncio loop that asked for it."""
    loop: asyncio.AbstractEventLoop
    prompt_len: int
    detokenizer: Any = None
    outputs: asyncio.Queue = field(default_factory=asyncio.Queue)
    seq_id: int | None = None      # set by the engine thread once queued
    cancelled: bool = False        # the HTTP side asked for an abort
    done: bool = False             # the HTTP side has read the last output


class EngineLoop:
    """Owns an LLMEngine and steps it in a daemon thread until `shutdown`."""

    def __init__(self, engine: LLMEngine, max_waiting: int = defaults.MAX_WAITING_REQUESTS, sink: Sink | None = None):
        self.engine = engine
        self.max_waiting = max_waiting
        self._sink = sink or (lambda items: None)
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[int, RequestStream] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._drain_deadline: float | None = None
        self._thread = threading.Thread(target=self._run, name="inferlab-engine", daemon=True)

    # -- called from the HTTP side ------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    @property
    def draining(self) -> bool:
        return self._drain_deadline is not None

    def num_waiting(self) -> int:
        """Requests not yet admitted: the scheduler's waiting queue plus commands not yet applied."""
        return self.engine.num_waiting + self._commands.qsize()

    def submit(self, token_ids: list[int], params: SamplingParams, arrival_time: float,
               detokenizer: Any = None) -> RequestStream:
        """Queue an already checked request; its outputs arrive on the returned stream."""
        if self.draining or self._stopping.is_set():
            raise QueueFull("the server is shutting down")
        if self.num_waiting() >= self.max_waiting:
            raise QueueFull(f"{self.max_waiting} requests are already waiting")
        stream = RequestStream(asyncio.get_running_loop(), len(token_ids), detokenizer)
        self._commands.put(("add", stream, token_ids, params, arrival_time))
        self._wake.set()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Abort a request whose client went away; its blocks are freed at the next step boundary."""
        stream.cancelled = True
        self._commands.put(("abort", stream))
        self._wake.set()

    def drain(self, timeout: float) -> None:
        """Admit nothing more; abort whatever still runs `timeout` seconds from now."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + timeout
        self._wake.set()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop after the current step, aborting whatever is still running, and join the thread."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the engine thread ----------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            self._apply_commands()
            if self._drain_deadline is not None and time.monotonic() >= self._drain_deadline and self._streams:
                self._end_all("abort")
            if self.engine.is_finished():
                self._wake.wait(IDLE_WAIT_S)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception:   # an engine bug: fail what is running rather than hang every client
                logger.exception("engine step failed")
                self._end_all("error")
                continue
            self._deliver(outputs)
        self._end_all("abort")

    def _apply_commands(self) -> None:
        aborted: list[StepOutput] = []
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            stream = command[1]
            if command[0] == "add":
                _, _, token_ids, params, arrival_time = command
                stream.seq_id = self.engine.enqueue(token_ids, params, arrival_time)
                self._streams[stream.seq_id] = stream
                if not stream.cancelled:
                    continue   # a client gone before admission is still logged: ARRIVED, then its abort
            if stream.seq_id in self.engine.sequences:
                self.engine.abort_request(stream.seq_id)
                aborted.append(StepOutput(stream.seq_id, finished=True, finish_reason="abort"))
        self._deliver(aborted)
        self.engine.log.flush()   # an abort on an idle engine must reach the log file too

    def _deliver(self, outputs: list[StepOutput]) -> None:
        items = []
        for out in outputs:
            stream = self._streams.get(out.seq_id)
            error = None
            if out.finished:
                self._streams.pop(out.seq_id, None)
                seq = self.engine.finished.pop(out.seq_id, None)   # the client has its tokens: keep nothing
                error = seq.error if seq is not None else None
            if stream is not None:
                items.append((stream, out, error))
        if items:
            self._sink(items)

    def _end_all(self, reason: str) -> None:
        """Finish every request this loop serves with `reason` (drain deadline, shutdown, engine failure)."""
        outputs = []
        for seq_id in list(self._streams):
            if seq_id in self.engine.sequences:
                self.engine.abort_request(seq_id)
            outputs.append(StepOutput(seq_id, finished=True, finish_reason=reason))
        self._deliver(outputs)
        self.engine.settle()
        self.engine.log.flush()
