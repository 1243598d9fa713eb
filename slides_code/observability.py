"""The observability interface the slides use, backed by real code.

    logger.info(stage, request_id, batch_size)     # log: what happened (stdlib logging)
    metrics.observe("ttft_ms", value)               # metrics: how fast, how many (p50/p99)
    with trace.annotate("ModelRunner.run"): ...     # trace: where the time goes (Chrome trace JSON)

`attach(llm)` connects all three to an engine without changing it: every
lifecycle event the engine emits is also logged and measured, and the main
methods of one step are wrapped in trace spans. The engine's lifecycle log stays
the source of truth; `reference.metrics` computes the same numbers offline.
"""
from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np


class StageLogger:
    """`info(stage, request_id, batch_size, **fields)` as one key=value line on a stdlib logger."""

    def __init__(self, name: str = "inferlab.serving"):
        self.logger = logging.getLogger(name)

    def info(self, stage: str, request_id: int | None = None, batch_size: int | None = None, **fields) -> None:
        parts = [f"stage={stage}"]
        if request_id is not None:
            parts.append(f"request_id={request_id}")
        if batch_size is not None:
            parts.append(f"batch_size={batch_size}")
        parts += [f"{k}={v}" for k, v in fields.items()]
        self.logger.info(" ".join(parts))


class Metrics:
    """Samples by name; `summary` gives count, mean, p50, p99 (numpy's linear interpolation)."""

    def __init__(self):
        self.samples: dict[str, list[float]] = defaultdict(list)

    def observe(self, name: str, value: float) -> None:
        self.samples[name].append(float(value))

    def summary(self, name: str) -> dict[str, float]:
        values = np.asarray(self.samples[name], dtype=float)
        if not len(values):
            return {"count": 0}
        return {"count": len(values), "mean": float(values.mean()),
                "p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}


class Trace:
    """Spans recorded by `annotate`; `write_chrome_trace` saves them for Perfetto / chrome://tracing."""

    def __init__(self):
        self.spans: list[dict] = []

    @contextmanager
    def annotate(self, name: str, **args):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.spans.append({"name": name, "start": start, "end": time.perf_counter(), "args": args})

    def wrap(self, obj, attr: str, name: str | None = None) -> None:
        """Put every call of obj.attr inside a span (the instance attribute shadows the method)."""
        original = getattr(obj, attr)

        def wrapper(*a, **kw):
            with self.annotate(name or attr):
                return original(*a, **kw)

        setattr(obj, attr, wrapper)

    def write_chrome_trace(self, path: str | Path) -> Path:
        origin = min((s["start"] for s in self.spans), default=0.0)
        events = [{"name": s["name"], "ph": "X", "pid": 0, "tid": 0, "ts": (s["start"] - origin) * 1e6,
                   "dur": (s["end"] - s["start"]) * 1e6, "args": s["args"]} for s in self.spans]
        path = Path(path)
        path.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
        return path


logger = StageLogger()
metrics = Metrics()
trace = Trace()


def attach(llm, logger: StageLogger = logger, metrics: Metrics = metrics, trace: Trace = trace) -> None:
    """Log and measure every lifecycle event of `llm`, and trace its step, schedule and model run."""
    arrival: dict[int, float] = {}
    first_token: dict[int, float] = {}

    def on_event(e: dict) -> None:
        event, seq_id, step = e["event"], e["seq_id"], e["step"]
        if event == "ARRIVED":
            arrival[seq_id] = e["time"]
            logger.info("arrived", seq_id, prompt_len=e["prompt_len"])
        elif event == "STEP":
            stage = "prefill" if e["is_prefill"] else "decode"
            logger.info(stage, None, e["batch_size"], step=step, num_tokens=e["num_tokens"],
                        waiting=e["num_waiting"], kv_blocks_used=e["kv_blocks_used"])
            metrics.observe("batch_size", e["batch_size"])
            metrics.observe("kv_usage", e["kv_blocks_used"] / e["kv_blocks_total"])
        elif event == "PREEMPTED":
            logger.info("preempted", seq_id, blocks_freed=e["blocks_freed"])
        elif event == "FIRST_TOKEN":
            first_token[seq_id] = e["time"]
            metrics.observe("ttft_ms", (e["time"] - arrival[seq_id]) * 1e3)
        elif event == "FINISHED":
            logger.info("finished", seq_id, reason=e["reason"], output_tokens=e["num_output_tokens"])
            if e["num_output_tokens"] > 1:
                tpot = (e["time"] - first_token[seq_id]) / (e["num_output_tokens"] - 1)
                metrics.observe("tpot_ms", tpot * 1e3)
            metrics.observe("e2e_ms", (e["time"] - arrival[seq_id]) * 1e3)

    llm.log.subscribe(on_event)   # the scheduler holds the same log object, so its events come here too
    trace.wrap(llm, "step", "LLMEngine.step")
    trace.wrap(llm.scheduler, "schedule", "Scheduler.schedule")
    trace.wrap(llm.model_runner, "run", "ModelRunner.run")
    trace.wrap(llm, "postprocess", "LLMEngine.postprocess")
