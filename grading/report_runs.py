"""The `runs` check of a lab report: every measurement file is what its logs say, and every experiment was run.

A report's tables and citations rest on results/*.csv; this check makes
those files rest on the runs:

- each row of results/runs.csv is recomputed from its lifecycle log,
  runs/NAME.jsonl (a legal log, with the settings the row claims where a
  log can show them: the KV pool, the batch limit, the request count; the
  throughput can be no higher than the log's own duration allows);
- results/NAME_steps.csv, where submitted, is its log's STEP events;
- results/summary.csv, where submitted, is the medians of those verified
  rows and of the submitted `inferlab bench` files (courseware/lab5_results.py
  computes both sides);
- each experiment of the rubric (`experiments`) was run: every setting it
  asks for at least `min_repeats` times, all else equal (one variable at a time).

What a file cannot show (whether the runs alternated, whether warm-up was
done) is for the TA items.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from courseware.lab5_results import (
    LOG_COLUMNS,
    SETTING_COLUMNS,
    STEP_COLUMNS,
    SUMMARY_COLUMNS,
    bench_setting,
    log_columns,
    log_span_s,
    step_rows,
    summary_rows,
)
from grading.report_files import BAD, GOOD, MISSING, files, line, read_csv_rows, read_events, read_json, readable
from reference.metrics import check_lifecycle

RULE_LOG = "each row of results/runs.csv is its run's log, runs/NAME.jsonl, as lab5_run.py computed it"
RULE_SUMMARY = "results/summary.csv holds the medians of the submitted runs (lab5_summary.py writes it)"
RULE_COVERAGE = "each experiment runs every setting it asks for, at least {n} times, changing only that setting"


def _same(written: Any, expected: Any) -> bool:
    """A CSV cell against a recomputed value (both as lab5_results rounds them)."""
    if expected is None or written in ("", None):
        return (expected is None or expected == "") and written in ("", None)
    try:
        return math.isclose(float(written), float(expected), rel_tol=1e-6, abs_tol=1e-4)
    except (TypeError, ValueError):
        return str(written) == str(expected)


def _run_lines(folder: Path, row: dict[str, str]) -> tuple[list[str], bool]:
    """Feedback on one row of runs.csv, and whether its log backs it."""
    name = row.get("name", "")
    log = folder / "runs" / f"{name}.jsonl"
    if not readable(folder, log):
        return [line(MISSING, f"runs/{name}.jsonl, the log of row {name!r} of results/runs.csv", RULE_LOG)], False
    events = read_events(log)
    out = [line(BAD, f"runs/{name}.jsonl is not a legal lifecycle log: {p}", RULE_LOG)
           for p in check_lifecycle(events)[:2]]
    if out or not events:
        return out or [line(BAD, f"runs/{name}.jsonl has no events", RULE_LOG)], False
    expected = log_columns(events)
    out += [line(BAD, f"results/runs.csv[{name}].{c} = {row.get(c)}, but its log gives {expected[c]}", RULE_LOG)
            for c in LOG_COLUMNS if not _same(row.get(c), expected[c])]
    steps = [e for e in events if e["event"] == "STEP"]
    claims = {"num_kvcache_blocks": steps[0]["kv_blocks_total"],
              "requests": sum(1 for e in events if e["event"] == "ARRIVED")}
    out += [line(BAD, f"results/runs.csv[{name}].{c} = {row.get(c)}, but its log shows {v}", RULE_LOG)
            for c, v in claims.items() if not _same(row.get(c), v)]
    biggest = max(s["batch_size"] for s in steps)
    try:
        if biggest > int(row.get("max_num_seqs", "")):
            out.append(line(BAD, f"results/runs.csv[{name}].max_num_seqs = {row['max_num_seqs']}, but its log "
                                 f"runs a batch of {biggest}", RULE_LOG))
        wall, tokens, rate = float(row["wall_s"]), float(row["output_tokens"]), float(row["output_tok_per_s"])
        if wall < 0.999 * log_span_s(events):
            out.append(line(BAD, f"results/runs.csv[{name}].wall_s = {wall}, shorter than its log "
                                 f"({log_span_s(events):.6f} s)", RULE_LOG))
        if not math.isclose(rate, tokens / wall, rel_tol=1e-4):
            out.append(line(BAD, f"results/runs.csv[{name}].output_tok_per_s = {rate}, but output_tokens / wall_s "
                                 f"= {tokens / wall:.3f}", RULE_LOG))
    except (KeyError, ValueError, ZeroDivisionError):
        out.append(line(BAD, f"results/runs.csv[{name}]: max_num_seqs, wall_s, output_tokens or output_tok_per_s "
                             "is not a number", RULE_LOG))
    steps_csv = folder / "results" / f"{name}_steps.csv"
    if readable(folder, steps_csv):
        written, logged = read_csv_rows(steps_csv), step_rows(events)
        wrong = next((i for i, (w, e) in enumerate(zip(written, logged))
                      if not all(_same(w.get(c), e[c]) for c in STEP_COLUMNS)), None)
        if len(written) != len(logged) or wrong is not None:
            at = f"row {wrong + 1}" if wrong is not None else f"{len(written)} rows for {len(logged)} steps"
            out.append(line(BAD, f"results/{name}_steps.csv is not its log's steps ({at})", RULE_LOG))
    if not out:
        out.append(line(GOOD, f"results/runs.csv[{name}] is its log runs/{name}.jsonl"))
    return out, not any(not entry.startswith(GOOD) for entry in out)


def bench_files(folder: Path) -> dict[str, dict]:
    """The `inferlab bench` results among the submitted runs/*.json, by file stem."""
    found = {}
    for path in files(folder, ["runs/*.json"]):
        data = read_json(path)
        if isinstance(data, dict) and "engine" in data and "workload" in data:
            found[path.stem] = data
    return found


def _bench_lines(benches: dict[str, dict]) -> list[str]:
    out = []
    for name, data in benches.items():
        try:
            engine, hf = data["engine"]["output_tok_per_s"], data.get("hf", {}).get("output_tok_per_s")
            if hf is not None and not math.isclose(data["speedup_vs_hf"], engine / hf, rel_tol=1e-6):
                out.append(line(BAD, f"runs/{name}.json: speedup_vs_hf is not engine / hf output tok/s",
                                "a bench file is what `inferlab bench --out` wrote"))
        except (KeyError, TypeError, ZeroDivisionError, AttributeError):
            out.append(line(BAD, f"runs/{name}.json is not an `inferlab bench --out` file",
                            "a bench file is what `inferlab bench --out` wrote"))
    return out


def _summary_lines(folder: Path, rows: list[dict[str, str]], benches: dict[str, dict]) -> list[str]:
    path = folder / "results" / "summary.csv"
    if not readable(folder, path):
        return []
    steps = {r["name"]: read_csv_rows(folder / "results" / f"{r['name']}_steps.csv") for r in rows
             if readable(folder, folder / "results" / f"{r['name']}_steps.csv")}
    expected = {r["group"]: r for r in summary_rows(rows, steps, benches)}
    out = []
    for row in read_csv_rows(path):
        group = row.get("group", "")
        want = expected.get(group)
        if want is None:
            out.append(line(BAD, f"results/summary.csv[{group}] is no group of the submitted runs", RULE_SUMMARY))
            continue
        wrong = [c for c in SUMMARY_COLUMNS[1:] if c != "runs" and not _same(row.get(c), want[c])]
        out += [line(BAD, f"results/summary.csv[{group}].{c} = {row.get(c)}, the submitted runs give {want[c]}",
                     RULE_SUMMARY) for c in wrong[:3]]
        if not wrong:
            out.append(line(GOOD, f"results/summary.csv[{group}] is the median of {want['n']} run(s)"))
    return out


def _matches(row: dict[str, str], vary: list[str], value: list[Any]) -> bool:
    return all(v is None or str(row.get(c)) == str(v) for c, v in zip(vary, value))


def _experiment_lines(rows: list[dict[str, str]], experiment: dict, repeats: int) -> list[str]:
    rule = RULE_COVERAGE.format(n=repeats)
    name, vary, values = experiment["name"], experiment["vary"], experiment["values"]
    fixed = experiment.get("fixed", {})
    chosen = [r for r in rows if all(str(r.get(c)) == str(v) for c, v in fixed.items())]
    contexts: dict[tuple, list[dict[str, str]]] = {}
    for row in chosen:
        contexts.setdefault(tuple(row.get(c) for c in SETTING_COLUMNS if c not in vary), []).append(row)
    best: tuple[int, list[str]] | None = None
    for members in contexts.values():
        counts = [sum(_matches(r, vary, value) for r in members) for value in values]
        short = [f"{'/'.join('any' if v is None else str(v) for v in value)}: {n} run(s)"
                 for value, n in zip(values, counts) if n < repeats]
        preempts = not experiment.get("preempts") or any(
            _matches(r, vary, value) and float(r.get("preemptions") or 0) > 0 for r in members for value in values)
        if not short and preempts:
            return [line(GOOD, f"{name}: {', '.join(vary)} over {len(values)} settings, {repeats}+ runs each")]
        if not preempts:
            short.append("no run preempts (the pool is never tight)")
        if best is None or len(short) < best[0]:
            best = (len(short), short)
    detail = "; ".join(best[1]) if best else "no run"
    fixed_text = "".join(f", {c} = {v}" for c, v in fixed.items())
    return [line(MISSING, f"{name} ({', '.join(vary)}{fixed_text}): {detail}", rule)]


def _bench_experiment_lines(benches: dict[str, dict], experiment: dict, repeats: int) -> list[str]:
    groups: dict[tuple, int] = {}
    for data in benches.values():
        if "hf" in data or not experiment.get("compare_hf"):
            groups[bench_setting(data)] = groups.get(bench_setting(data), 0) + 1
    most = max(groups.values(), default=0)
    if most >= repeats:
        return [line(GOOD, f"{experiment['name']}: {most} `inferlab bench` runs of one setting")]
    what = "`inferlab bench --compare hf` files" if experiment.get("compare_hf") else "`inferlab bench` files"
    return [line(MISSING, f"{experiment['name']}: {most} {what} of one setting in runs/",
                 RULE_COVERAGE.format(n=repeats))]


def check_runs(text: str, folder: Path, options: dict) -> list[str]:
    runs_csv = folder / "results" / "runs.csv"
    if not readable(folder, runs_csv):
        return [line(MISSING, "results/runs.csv (lab5_run.py writes it)", RULE_LOG)]
    out, verified = [], []
    for row in read_csv_rows(runs_csv):
        lines, ok = _run_lines(folder, row)
        out += lines
        if ok:
            verified.append(row)
    benches = bench_files(folder)
    out += _bench_lines(benches)
    out += _summary_lines(folder, verified, benches)
    repeats = int(options.get("min_repeats", 1))
    for experiment in options.get("experiments", []):
        out += (_bench_experiment_lines(benches, experiment, repeats) if experiment.get("bench")
                else _experiment_lines(verified, experiment, repeats))
    return out
