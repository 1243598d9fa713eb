# Generated from reference/engine/lifecycle.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""The lifecycle log: one JSON object per event, in the order events happen.

Each event has `event`, `seq_id`, `step` (engine step index, deterministic) and
`time` (monotonic seconds). Tests compare step-indexed event sequences exactly;
metrics such as TTFT come from the times. See docs/architecture.md for the
event list; `reference.metrics` reads it back.

The log keeps the step count itself and stamps it on every event, as it
stamps the time from its own clock. We chose this so that whoever logs an
event (the engine, the scheduler, a KV transfer) neither passes nor stores a
step: the engine alone moves the count on, with `end_step()`, when a step is
over, and reads it back as `LLMEngine.step_index`. Before, the engine wrote
its step into the scheduler's `step` field before every call so that the
scheduler's events carried it. The price: the log is not a passive sink any
more, and an event can only be stamped with the step now running (or, between
steps, the one about to run), never with another.
"""
from __future__ import annotations

import json
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, TextIO

Listener = Callable[[dict[str, Any]], None]


class LifecycleLog:
    """Collects events in memory and, if given a path, appends them to a JSONL file."""

    def __init__(self, path: str | None = None):
        self.events: list[dict[str, Any]] | deque[dict[str, Any]] = []
        self.path = path
        self.step = 0   # the engine step now running, or between steps the next one; see end_step
        self._listeners: list[Listener] = []
        self._file: TextIO | None = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "w", encoding="utf-8")

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def end_step(self) -> None:
        """The engine step is over: later events belong to the next one."""
        self.step += 1

    def skip_to(self, step: int) -> None:
        """Jump to a later step with nothing logged in between (a replay that fast-forwards an idle engine)."""
        if step < self.step:
            raise ValueError(f"the log is at step {self.step}: steps never go back (asked for {step})")
        self.step = step

    def emit(self, event: str, seq_id: int | None, *, now: float | None = None, **fields: Any) -> None:
        """Record one event, stamped with the current step and `now` (default: the clock now).

        `now` is keyword-only so that a call written for the old signature
        (`emit(event, seq_id, step, now)`) fails loudly instead of logging a
        step number as a time.
        """
        if "step" in fields or "time" in fields:
            raise TypeError("emit: the log stamps `step` and `time` itself (pass the time as now=...)")
        record = {"event": event, "seq_id": seq_id, "step": self.step,
                  "time": self.now() if now is None else now, **fields}
        self.events.append(record)
        for listener in self._listeners:
            listener(record)
        if self._file is not None:
            self._file.write(json.dumps(record, ensure_ascii=False) + "\n")

    def subscribe(self, listener: Listener) -> None:
        """Call `listener(event)` for every later event, in the engine's thread (e.g. live metrics)."""
        self._listeners.append(listener)

    def keep_last(self, n: int) -> None:
        """Keep only the newest `n` events in memory (a long-running server); the file keeps them all."""
        self.events = deque(self.events, maxlen=n)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
