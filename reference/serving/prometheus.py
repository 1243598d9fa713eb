"""Live Prometheus metrics, computed from the lifecycle log as it is written.

The server subscribes to the engine's lifecycle log: per-request histograms
are observed when a request's FREED event arrives, from that request's own
events through `reference.metrics` (the same code `inferlab trace` uses), so
/metrics and the offline log can never disagree about what TTFT means. The
gauges are read from the engine when Prometheus scrapes (an idle engine has
no STEP events to report that it is idle).

Names are vLLM's, with our prefix: `vllm:time_to_first_token_seconds` is
`inferlab:time_to_first_token_seconds`, and so on (docs/serving.md lists them).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from reference.metrics import request_metrics

PREFIX = "inferlab:"
# Buckets in seconds, from sub-millisecond GPU steps to slow CPU requests.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0)


class EngineMetrics:
    """A private registry (several servers in one process never collide) fed by the lifecycle log."""

    def __init__(self, model_name: str, running: Callable[[], float], waiting: Callable[[], float],
                 kv_usage: Callable[[], float]):
        self.registry = CollectorRegistry()
        labels = ["model_name"]

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, buckets=LATENCY_BUCKETS,
                             registry=self.registry).labels(model_name)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, labels, registry=self.registry).labels(model_name)

        self.ttft = histogram("time_to_first_token_seconds", "ARRIVED to FIRST_TOKEN")
        self.tpot = histogram("request_time_per_output_token_seconds",
                              "(FINISHED - FIRST_TOKEN) / (output tokens - 1), per request")
        self.itl = histogram("inter_token_latency_seconds", "gap between consecutive tokens of a request")
        self.e2e = histogram("e2e_request_latency_seconds", "ARRIVED to FINISHED")
        self.queue_time = histogram("request_queue_time_seconds", "ARRIVED to the first SCHEDULED")
        gauge("num_requests_running", "requests holding KV blocks").set_function(running)
        gauge("num_requests_waiting", "requests not yet admitted").set_function(waiting)
        gauge("kv_cache_usage_perc", "fraction of KV blocks held by requests (0-1)").set_function(kv_usage)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "prompt tokens of finished requests", labels,
                                     registry=self.registry).labels(model_name)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "output tokens of finished requests",
                                         labels, registry=self.registry).labels(model_name)
        self.success = Counter(PREFIX + "request_success", "finished requests by finish reason",
                               labels + ["finished_reason"], registry=self.registry)
        self._model_name = model_name
        self._events: dict[int, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def on_event(self, event: dict[str, Any]) -> None:
        """Lifecycle-log listener (runs in the engine thread)."""
        if event["event"] == "STEP":
            return
        with self._lock:
            events = self._events.setdefault(event["seq_id"], [])
            events.append(event)
            if event["event"] != "FREED":
                return
            del self._events[event["seq_id"]]
        self._observe(events)

    def _observe(self, events: list[dict[str, Any]]) -> None:
        m = next(iter(request_metrics(events).values()))
        for histogram, value in ((self.ttft, m.ttft), (self.tpot, m.tpot), (self.e2e, m.e2e),
                                 (self.queue_time, m.queue_time)):
            if value is not None:
                histogram.observe(value)
        for gap in m.itls:
            self.itl.observe(gap)
        self.prompt_tokens.inc(m.prompt_len or 0)
        self.generation_tokens.inc(m.num_output_tokens)
        self.success.labels(self._model_name, m.finish_reason or "unknown").inc()
