"""`inferlab trace LOG`: render an engine lifecycle log as Rich tables.

The tables show what reference.metrics computes, so a student can look at a
run and see which requests waited, which were preempted, and how full the KV
cache was at each step, without writing any analysis code first.
"""
from __future__ import annotations

import os
from collections.abc import Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from courseware.terminal import make_console
from reference.metrics import (
    PERCENTILES,
    RequestMetrics,
    StepMetrics,
    check_lifecycle,
    read_log,
    request_metrics,
    step_metrics,
    summarize,
)

STEPS_SHOWN_AT_EACH_END = 10


def _ms(seconds: float | None) -> str:
    """Seconds as milliseconds for display; '-' where the metric is undefined."""
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def request_table(requests: Iterable[RequestMetrics]) -> Table:
    """One row per request, in arrival order."""
    table = Table(title="Requests")
    for header in ("seq", "prompt", "output", "queue ms", "TTFT ms", "TPOT ms", "e2e ms", "preempt", "reason"):
        table.add_column(header, justify="left" if header == "reason" else "right")
    for r in requests:
        table.add_row(
            str(r.seq_id),
            "-" if r.prompt_len is None else str(r.prompt_len),
            str(r.num_output_tokens),
            _ms(r.queue_time),
            _ms(r.ttft),
            _ms(r.tpot),
            _ms(r.e2e),
            str(r.num_preemptions),
            escape(r.finish_reason or "(running)"),
        )
    return table


def _summary_table(requests: Iterable[RequestMetrics]) -> Table:
    """Percentiles of each latency metric, with the run's totals as a caption."""
    summary = summarize(requests)
    totals = summary["totals"]
    table = Table(
        title="Summary",
        caption=(
            f"{totals['requests']} requests ({totals['finished']} finished), "
            f"{totals['output_tokens']} output tokens, {totals['preemptions']} preemptions"
        ),
    )
    table.add_column("metric")
    table.add_column("n", justify="right")
    for header in ["mean"] + [f"p{p}" for p in PERCENTILES]:
        table.add_column(f"{header} ms", justify="right")
    for name in ("queue_time", "ttft", "tpot", "itl", "e2e"):
        stats = summary[name]
        row = [_ms(stats["mean"])] + [_ms(stats[f"p{p}"]) for p in PERCENTILES]
        table.add_row(name, str(stats["count"]), *row)
    return table


def _add_step_row(table: Table, s: StepMetrics) -> None:
    table.add_row(
        str(s.step),
        "prefill" if s.is_prefill else "decode",
        str(s.batch_size),
        str(s.num_tokens),
        str(s.num_running),
        str(s.num_waiting),
        f"{s.kv_blocks_used}/{s.kv_blocks_total} ({s.kv_usage:.0%})",
    )


def _step_table(steps: list[StepMetrics]) -> Table:
    """Per-step table; long runs show only both ends so the table stays readable."""
    table = Table(title="Steps")
    for header in ("step", "phase", "batch", "tokens", "running", "waiting", "KV blocks"):
        table.add_column(header, justify="left" if header == "phase" else "right")
    edge = STEPS_SHOWN_AT_EACH_END
    if len(steps) <= 2 * edge:
        for s in steps:
            _add_step_row(table, s)
        return table
    for s in steps[:edge]:
        _add_step_row(table, s)
    table.add_row("...", f"{len(steps) - 2 * edge} steps elided", *[""] * 5, style="dim")
    for s in steps[-edge:]:
        _add_step_row(table, s)
    return table


def render_trace(path: str | os.PathLike[str], console: Console | None = None) -> None:
    """Print the request, summary and step tables of a lifecycle log, then any lifecycle problems."""
    console = console or make_console()
    events = read_log(path)
    if not events:
        console.print(f"{escape(os.fspath(path))}: no events")
        return
    requests = list(request_metrics(events).values())
    console.print(request_table(requests))
    console.print(_summary_table(requests))
    console.print(_step_table(step_metrics(events)))
    problems = check_lifecycle(events)
    if problems:
        console.print(Text(f"{len(problems)} lifecycle problem(s):", style="bold red"))
        for problem in problems:
            console.print(Text(f"  {problem}", style="red"))
    else:
        console.print(Text("lifecycle: OK", style="green"))
