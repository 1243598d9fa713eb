"""The lifecycle log: one JSON object per event, in the order events happen.

Each event has `event`, `seq_id`, `step` (engine step index, deterministic) and
`time` (monotonic seconds). Tests compare step-indexed event sequences exactly;
metrics such as TTFT come from the times. See docs/architecture.md for the
event list; `reference.metrics` reads it back.
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
        self._listeners: list[Listener] = []
        self._file: TextIO | None = None
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "w", encoding="utf-8")

    @staticmethod
    def now() -> float:
        return time.perf_counter()

    def emit(self, event: str, seq_id: int | None, step: int, now: float | None = None, **fields: Any) -> None:
        record = {"event": event, "seq_id": seq_id, "step": step,
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
