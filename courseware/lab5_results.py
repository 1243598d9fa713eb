"""Lab 5's results files: what each row holds, computed from the lifecycle logs and bench files it stands for.

Three writers and one reader use this module, so a number means the same
thing wherever it appears:

- `lab5_run.py` writes a run's row of `results/runs.csv` and its
  `results/NAME_steps.csv` from the run's lifecycle log;
- `lab5_summary.py` writes `results/summary.csv` (the median of each group of
  repeated runs, and of repeated `inferlab bench` files);
- the lab 5 grader (`grading/report_runs.py`) recomputes every row of those
  files from the submitted logs and bench files, so a table or a citation
  that rests on them rests on the runs themselves.

A run's settings come from the run (a log does not record them all), its
wall time from the clock around `generate`; everything else is the log's.
"""
from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from typing import Any

from reference.metrics import request_metrics, step_metrics, summarize

# What a run was asked to do: two runs are repeats of one setting when all of these are equal.
SETTING_COLUMNS = ("requests", "seed", "shared_prefix", "max_num_seqs", "max_num_batched_tokens",
                   "num_kvcache_blocks", "block_size", "chunked_prefill", "prefix_caching", "device", "backend")
# What the log says the run did (recomputed by the grader from the log alone).
LOG_COLUMNS = ("output_tokens", "preemptions", "cached_prompt_fraction", "ttft_p50_ms", "ttft_p99_ms",
               "tpot_p50_ms", "tpot_p99_ms", "itl_p99_ms", "itl_max_ms", "e2e_p50_ms", "e2e_p99_ms")
RUN_COLUMNS = ("name", *SETTING_COLUMNS, "wall_s", "output_tok_per_s", *LOG_COLUMNS)
STEP_COLUMNS = ("step", "is_prefill", "batch_size", "num_tokens", "num_running", "num_waiting", "kv_blocks_used",
                "kv_blocks_total", "duration_ms")
# summary.csv: one row per group of repeats; the measured columns hold the median over the group.
MEDIAN_COLUMNS = ("output_tok_per_s", "hf_tok_per_s", "speedup_vs_hf", *LOG_COLUMNS[1:], "decode_step_median_ms")
SUMMARY_COLUMNS = ("group", "n", "runs", *SETTING_COLUMNS, *MEDIAN_COLUMNS)
BENCH_SETTINGS = ("workload", "seed", "device", "dtype", "attention_backend", "max_num_seqs",
                  "max_num_batched_tokens", "kvcache_block_size", "scheduling")
# How many decimals each kind of column keeps.
DECIMALS = {"wall_s": 6, "output_tok_per_s": 3, "hf_tok_per_s": 3, "speedup_vs_hf": 4, "cached_prompt_fraction": 6}
MS_DECIMALS = 4


def _round(column: str, value: float | None) -> float | None:
    if value is None:
        return None
    return round(value, DECIMALS.get(column, MS_DECIMALS))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, MS_DECIMALS)


def log_columns(events: list[dict]) -> dict[str, Any]:
    """The LOG_COLUMNS of a run, from its lifecycle log alone."""
    summary = summarize(request_metrics(events).values())
    itls = [itl for m in request_metrics(events).values() for itl in m.itls]
    prompt_tokens = sum(e["prompt_len"] for e in events if e["event"] == "ARRIVED")
    first_cached: dict[int, int] = {}
    for e in events:
        if e["event"] == "SCHEDULED":
            first_cached.setdefault(e["seq_id"], e["num_cached_tokens"])
    return {
        "output_tokens": summary["totals"]["output_tokens"], "preemptions": summary["totals"]["preemptions"],
        "cached_prompt_fraction": round(sum(first_cached.values()) / prompt_tokens, 6) if prompt_tokens else 0.0,
        "ttft_p50_ms": _ms(summary["ttft"]["p50"]), "ttft_p99_ms": _ms(summary["ttft"]["p99"]),
        "tpot_p50_ms": _ms(summary["tpot"]["p50"]), "tpot_p99_ms": _ms(summary["tpot"]["p99"]),
        "itl_p99_ms": _ms(summary["itl"]["p99"]), "itl_max_ms": _ms(max(itls, default=None)),
        "e2e_p50_ms": _ms(summary["e2e"]["p50"]), "e2e_p99_ms": _ms(summary["e2e"]["p99"]),
    }


def run_row(name: str, settings: dict[str, Any], wall_s: float, events: list[dict]) -> dict[str, Any]:
    """A run's row of results/runs.csv: its settings (SETTING_COLUMNS), its wall time and its log's numbers."""
    measured = log_columns(events)
    row = {"name": name, **{c: settings[c] for c in SETTING_COLUMNS}, "wall_s": _round("wall_s", wall_s),
           "output_tok_per_s": _round("output_tok_per_s", measured["output_tokens"] / wall_s), **measured}
    return {c: row[c] for c in RUN_COLUMNS}


def log_span_s(events: list[dict]) -> float:
    """Seconds from the first event of a log to its last: a run's wall time can be no shorter."""
    times = [e["time"] for e in events]
    return max(times) - min(times) if times else 0.0


def step_rows(events: list[dict]) -> list[dict[str, Any]]:
    """results/NAME_steps.csv: one row per STEP event; a step lasts until the next one (the last: unknown)."""
    steps = step_metrics(events)
    rows = []
    for this, following in zip(steps, steps[1:] + [None]):
        rows.append({"step": this.step, "is_prefill": this.is_prefill, "batch_size": this.batch_size,
                     "num_tokens": this.num_tokens, "num_running": this.num_running, "num_waiting": this.num_waiting,
                     "kv_blocks_used": this.kv_blocks_used, "kv_blocks_total": this.kv_blocks_total,
                     "duration_ms": None if following is None else _ms(following.time - this.time)})
    return rows


def group_label(name: str) -> str:
    """seqs16_2 -> seqs16: repeats of one setting are named NAME_1, NAME_2, ... (a name without _N is its own)."""
    return re.sub(r"_\d+$", "", name)


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _median(column: str, values: Iterable[Any]) -> float | None:
    numbers = [v for v in (_number(x) for x in values) if v is not None]
    return _round(column, statistics.median(numbers)) if numbers else None


def decode_step_median_ms(steps: list[dict[str, Any]]) -> float | None:
    """The median duration of a run's decode steps (from its steps rows; prefill steps and the last step left out)."""
    return _median("decode_step_median_ms", [s["duration_ms"] for s in steps
                                             if str(s["is_prefill"]) == "False" and s["duration_ms"] not in ("", None)])


def _labelled(groups: list[tuple[str, list]]) -> list[tuple[str, list]]:
    """Unique labels: a label two groups share gets #2, #3 on the later ones."""
    seen: dict[str, int] = {}
    out = []
    for label, members in groups:
        seen[label] = seen.get(label, 0) + 1
        out.append((label if seen[label] == 1 else f"{label}#{seen[label]}", members))
    return out


def summary_rows(runs: list[dict[str, Any]], steps: dict[str, list[dict[str, Any]]],
                 benches: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """results/summary.csv: the median of each group of runs with equal settings, then of each group of benches
    (named, like runs, after its first member less a trailing _N: bench_quick_1 -> bench_quick).

    `runs` are rows of results/runs.csv (in file order), `steps` each run's
    steps rows by run name, `benches` each `inferlab bench` JSON by file stem.
    """
    by_setting: dict[tuple, list[dict[str, Any]]] = {}
    for row in runs:
        by_setting.setdefault(tuple(str(row[c]) for c in SETTING_COLUMNS), []).append(row)
    rows = []
    for label, members in _labelled([(group_label(m[0]["name"]), m) for m in by_setting.values()]):
        row: dict[str, Any] = {"group": label, "n": len(members), "runs": " ".join(m["name"] for m in members),
                               **{c: members[0][c] for c in SETTING_COLUMNS}}
        for column in MEDIAN_COLUMNS:
            if column == "decode_step_median_ms":
                row[column] = _median(column, [decode_step_median_ms(steps[m["name"]]) for m in members
                                               if m["name"] in steps])
            else:
                row[column] = _median(column, [m.get(column) for m in members])
        rows.append(row)
    by_bench: dict[tuple, list[tuple[str, dict]]] = {}
    for name, data in benches.items():
        by_bench.setdefault(bench_setting(data), []).append((name, data))
    for label, members in _labelled([(group_label(m[0][0]), m) for m in by_bench.values()]):
        values = [bench_numbers(data) for _, data in members]
        row = {"group": label, "n": len(members), "runs": " ".join(name for name, _ in members)}
        row.update({c: _median(c, [v.get(c) for v in values]) for c in MEDIAN_COLUMNS if c in values[0]})
        rows.append(row)
    return [{c: row.get(c) for c in SUMMARY_COLUMNS} for row in rows]


def bench_setting(data: dict[str, Any]) -> tuple:
    """What an `inferlab bench` file was asked to do (repeats share it)."""
    settings = data.get("settings", {})
    return (data.get("workload"), data.get("seed"), *(str(settings.get(k)) for k in BENCH_SETTINGS[2:]),
            "hf" in data)


def bench_numbers(data: dict[str, Any]) -> dict[str, float | None]:
    """The numbers of one `inferlab bench` file, in summary.csv's columns."""
    engine, hf = data["engine"], data.get("hf")
    return {"output_tok_per_s": _round("output_tok_per_s", engine["output_tok_per_s"]),
            "hf_tok_per_s": _round("hf_tok_per_s", hf["output_tok_per_s"]) if hf else None,
            "speedup_vs_hf": _round("speedup_vs_hf", data["speedup_vs_hf"]) if hf else None,
            "ttft_p50_ms": _ms(engine["ttft_s"]["p50"]), "ttft_p99_ms": _ms(engine["ttft_s"]["p99"]),
            "tpot_p50_ms": _ms(engine["tpot_s"]["p50"]), "tpot_p99_ms": _ms(engine["tpot_s"]["p99"]),
            "preemptions": engine.get("preemptions")}
