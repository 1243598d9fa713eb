"""Lab 5: fold repeated runs into medians, results/summary.csv, for the report's tables and citations.

    python assignments/lab5_performance/lab5_summary.py [--results results] [--runs runs]

Reads results/runs.csv (every lab5_run.py run), results/NAME_steps.csv (each
run's steps) and runs/*.json files written by `inferlab bench --out`, and
writes results/summary.csv: one row per group of runs with equal settings
(repeats; the group is named after its first run, less a trailing _N), with
the number of runs, their names, the settings and the median of each
measured column, and one row per group of repeated bench files
(named after its first file: bench_quick_1.json -> bench_quick). Run it again after every new run: the file is rewritten
whole. The lab 5 grader recomputes it from the same files the same way
(courseware/lab5_results.py), so a number cited from it is a median of
the submitted runs.
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle))


def bench_files(runs: Path) -> dict[str, dict]:
    """Every `inferlab bench` result among runs/*.json (lab5_run.py's own .json files are not bench results)."""
    found = {}
    for path in sorted(runs.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "engine" in data and "workload" in data:
            found[path.stem] = data
    return found


def main(argv: list[str] | None = None) -> Path:
    from courseware.lab5_results import SUMMARY_COLUMNS, summary_rows
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results", help="folder of runs.csv and the steps files")
    parser.add_argument("--runs", default="runs", help="folder of the bench JSON files")
    args = parser.parse_args(argv)
    results, runs = Path(args.results), Path(args.runs)
    rows = read_rows(results / "runs.csv") if (results / "runs.csv").is_file() else []
    steps = {row["name"]: read_rows(results / f"{row['name']}_steps.csv") for row in rows
             if (results / f"{row['name']}_steps.csv").is_file()}
    summary = summary_rows(rows, steps, bench_files(runs))
    out = results / "summary.csv"
    results.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=SUMMARY_COLUMNS)
        writer.writeheader()
        writer.writerows(summary)
    for row in summary:
        print(f"{row['group']}: n={row['n']}  output tok/s median {row['output_tok_per_s']}")
    print(f"written: {out}")
    return out


if __name__ == "__main__":
    main()
