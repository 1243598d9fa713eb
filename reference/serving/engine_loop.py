"""One engine, many HTTP clients: the engine runs in its own thread.

The HTTP server (asyncio) never touches the engine's queues directly. Handlers
put commands (add a request, abort one) on a thread-safe queue; the engine
thread applies them *between* steps, so requests from different clients join
and leave the running batch exactly as continuous batching says, and the
scheduler never sees a queue change in the middle of `schedule()`. Each step's
outputs go back to the asyncio loop with `call_soon_threadsafe`, one
`asyncio.Queue` per request.

Price: a request waits for the step in progress to end before it can be
admitted (at most one step, a few milliseconds on a GPU), and tokenization
happens in the handler, on the event loop's thread.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass, field

from reference.engine.llm_engine import LLMEngine, StepOutput
from reference.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """The waiting queue is at its limit; the client should retry later (HTTP 503)."""


@dataclass(eq=False)
class RequestStream:
    """One request's outputs, delivered to the asyncio loop that asked for it."""
    loop: asyncio.AbstractEventLoop
    prompt_len: int
    outputs: asyncio.Queue = field(default_factory=asyncio.Queue)
    seq_id: int | None = None      # set by the engine thread once queued
    cancelled: bool = False

    def deliver(self, out: StepOutput) -> None:
        try:
            self.loop.call_soon_threadsafe(self.outputs.put_nowait, out)
        except RuntimeError:       # the event loop is gone (shutdown): nobody is listening
            pass


class EngineLoop:
    """Owns an LLMEngine and steps it in a daemon thread until `shutdown`."""

    def __init__(self, engine: LLMEngine, max_waiting: int = 256):
        self.engine = engine
        self.max_waiting = max_waiting
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[int, RequestStream] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="inferlab-engine", daemon=True)

    # -- called from the HTTP side ------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping.is_set()

    def num_waiting(self) -> int:
        """Requests not yet admitted: the scheduler's waiting queue plus commands not yet applied."""
        return self.engine.num_waiting + self._commands.qsize()

    def submit(self, token_ids: list[int], params: SamplingParams, arrival_time: float) -> RequestStream:
        """Queue an already checked request; its outputs arrive on the returned stream."""
        if self._stopping.is_set():
            raise QueueFull("the server is shutting down")
        if self.num_waiting() >= self.max_waiting:
            raise QueueFull(f"{self.max_waiting} requests are already waiting")
        stream = RequestStream(asyncio.get_running_loop(), len(token_ids))
        self._commands.put(("add", stream, token_ids, params, arrival_time))
        self._wake.set()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Abort a request whose client went away; its blocks are freed between steps."""
        stream.cancelled = True
        self._commands.put(("abort", stream))
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
            if self.engine.is_finished():
                self._wake.wait(0.05)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception:   # an engine bug: fail what is running rather than hang every client
                logger.exception("engine step failed")
                self._fail_all()
                continue
            for out in outputs:
                self._deliver(out)
        self._fail_all(reason="abort")

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                self.engine.log.flush()   # an abort on an idle engine must reach the log file too
                return
            if command[0] == "add":
                _, stream, token_ids, params, arrival_time = command
                if stream.cancelled:
                    continue
                stream.seq_id = self.engine.enqueue(token_ids, params, arrival_time)
                self._streams[stream.seq_id] = stream
            else:
                stream = command[1]
                if stream.seq_id in self.engine.sequences:
                    self.engine.abort_request(stream.seq_id)
                    self._deliver(StepOutput(stream.seq_id, finished=True, finish_reason="abort"))

    def _deliver(self, out: StepOutput) -> None:
        stream = self._streams.get(out.seq_id)
        if out.finished:
            self._streams.pop(out.seq_id, None)
            self.engine.finished.pop(out.seq_id, None)   # the client has its tokens: keep nothing
        if stream is not None:
            stream.deliver(out)

    def _fail_all(self, reason: str = "error") -> None:
        for seq_id in list(self._streams):
            if seq_id in self.engine.sequences:
                self.engine.abort_request(seq_id)
            self._deliver(StepOutput(seq_id, finished=True, finish_reason=reason))
        self.engine.settle()
