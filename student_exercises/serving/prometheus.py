# Generated from reference/serving/prometheus.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Live Prometheus metrics, computed from the lifecycle log as it is written.

The server subscribes to the engine's lifecycle log: per-request histograms
are observed when a request's FREED event arrives, from that request's own
events through `reference.metrics` (the same code `inferlab trace` uses), so
/metrics and the offline log can never disagree about what TTFT means.
Counters of things that happen mid-request (preemptions, prefix-cache
lookups) move when their event is written. The gauges are read from the
engine when Prometheus scrapes (an idle engine has no STEP events to report
that it is idle).

Names are vLLM's, with our prefix: `vllm:time_to_first_token_seconds` is
`inferlab:time_to_first_token_seconds`, and so on (docs/serving.md lists them).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from student_exercises.metrics import phase_times, request_metrics

PREFIX = "inferlab:"
# Buckets in seconds, from sub-millisecond GPU steps to slow CPU requests.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0)


def buckets_1_2_5(largest: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to `largest`: vLLM's buckets for token counts."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > largest:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class EngineMetrics:
    """A private registry (several servers in one process never collide) fed by the lifecycle log."""

    def __init__(self, model_name: str, max_model_len: int, running: Callable[[], float],
                 waiting: Callable[[], float], kv_usage: Callable[[], float]):
        self.registry = CollectorRegistry()
        labels = ["model_name"]

        def histogram(name: str, doc: str, buckets=LATENCY_BUCKETS) -> Histogram:
            return Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=self.registry).labels(model_name)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(PREFIX + name, doc, labels, registry=self.registry).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=self.registry).labels(model_name)

        self.ttft = histogram("time_to_first_token_seconds", "ARRIVED to FIRST_TOKEN")
        self.tpot = histogram("request_time_per_output_token_seconds",
                              "(FINISHED - FIRST_TOKEN) / (output tokens - 1), per request")
        self.itl = histogram("inter_token_latency_seconds", "gap between consecutive tokens of a request")
        self.e2e = histogram("e2e_request_latency_seconds", "ARRIVED to FINISHED")
        self.queue_time = histogram("request_queue_time_seconds", "ARRIVED to the first SCHEDULED")
        self.prefill_time = histogram("request_prefill_time_seconds", "first SCHEDULED to FIRST_TOKEN")
        self.decode_time = histogram("request_decode_time_seconds", "FIRST_TOKEN to the last token")
        self.inference_time = histogram("request_inference_time_seconds", "first SCHEDULED to the last token")
        lengths = buckets_1_2_5(max_model_len)
        self.prompt_len = histogram("request_prompt_tokens", "prompt tokens per finished request", lengths)
        self.generation_len = histogram("request_generation_tokens", "output tokens per finished request", lengths)
        gauge("num_requests_running", "requests holding KV blocks").set_function(running)
        gauge("num_requests_waiting", "requests not yet admitted").set_function(waiting)
        gauge("kv_cache_usage_perc", "fraction of KV blocks held by requests (0-1)").set_function(kv_usage)
        self.prompt_tokens = counter("prompt_tokens", "prompt tokens of finished requests")
        self.generation_tokens = counter("generation_tokens", "output tokens of finished requests")
        self.preemptions = counter("num_preemptions", "preemptions (PREEMPTED events)")
        self.prefix_queries = counter("prefix_cache_queries",
                                      "prompt tokens looked up in the prefix cache by new requests")
        self.prefix_hits = counter("prefix_cache_hits", "of those, tokens found in the cache")
        self.success = Counter(PREFIX + "request_success", "finished requests by finish reason",
                               labels + ["finished_reason"], registry=self.registry)
        self._model_name = model_name
        self._events: dict[int, list[dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def on_event(self, event: dict[str, Any]) -> None:
        """Lifecycle-log listener (runs in the engine thread)."""
        kind = event["event"]
        if kind == "STEP":
            return
        if kind == "PREEMPTED":
            self.preemptions.inc()
        with self._lock:
            events = self._events.setdefault(event["seq_id"], [])
            if kind == "SCHEDULED" and len(events) == 2:    # ARRIVED, QUEUED: its first admission
                self._prefix_lookup(events[0], event)
            events.append(event)
            if kind != "FREED":
                return
            del self._events[event["seq_id"]]
        self._observe(events)

    def _prefix_lookup(self, arrived: dict[str, Any], scheduled: dict[str, Any]) -> None:
        """A new request's admission looks its prompt up in the prefix cache (preempted ones' again are not
        counted, as in vLLM: a victim finding its own blocks would inflate the hit rate)."""
        self.prefix_queries.inc(arrived["prompt_len"])
        self.prefix_hits.inc(scheduled["num_cached_tokens"])

    def _observe(self, events: list[dict[str, Any]]) -> None:
        m = next(iter(request_metrics(events).values()))
        phases = phase_times(events)
        for histogram, value in ((self.ttft, m.ttft), (self.tpot, m.tpot), (self.e2e, m.e2e),
                                 (self.queue_time, m.queue_time), (self.prefill_time, phases.prefill),
                                 (self.decode_time, phases.decode), (self.inference_time, phases.inference)):
            if value is not None:
                histogram.observe(value)
        for gap in m.itls:
            self.itl.observe(gap)
        self.prompt_len.observe(m.prompt_len or 0)
        self.generation_len.observe(m.num_output_tokens)
        self.prompt_tokens.inc(m.prompt_len or 0)
        self.generation_tokens.inc(m.num_output_tokens)
        self.success.labels(self._model_name, m.finish_reason or "unknown").inc()
