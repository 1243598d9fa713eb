"""`inferlab grade report --results DIR`: everything a TA hands out, made from the result files alone.

Writes, under DIR/report/ (or --out):
    grades.csv                      one row per student: score, blocked points, each item's points, flags
    feedback/<student>.md           what passed, what failed, and the first difference with context
    gradescope/<student>/results.json   Gradescope's autograder results format
    histogram.png                   the score distribution
and prints a Rich summary table. The result files are the only input, so a
report can be rebuilt at any time (e.g. after merging nbgrader scores)
without grading anything again.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from grading.results import read_result, write_json_atomic

STATUS_STYLE = {"passed": "green", "failed": "red", "timeout": "magenta", "error": "bold red", "blocked": "yellow",
                "pending": "cyan"}
STATUS_MARK = {"passed": "PASS", "failed": "FAIL", "timeout": "TIME", "error": "ERR", "blocked": "GPU", "pending": "TA"}
CSV_FIXED = ["student_id", "lab", "status", "score", "max_score", "gradable_points", "blocked_points"]
MAX_NOTES = 30                  # of a result's notes shown in Gradescope's output


@dataclass
class ReportPaths:
    out: Path
    csv: Path
    feedback: Path
    gradescope: Path
    histogram: Path


def load_results(results_dir: Path) -> list[dict[str, Any]]:
    """Every finished result in the folder, sorted by student id (half-written or foreign files are skipped)."""
    results = [r for r in (read_result(p) for p in sorted(results_dir.glob("*.json"))) if r is not None]
    return sorted(results, key=lambda r: r["student_id"])


def missing_rows(results_dir: Path, results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One grades.csv row per student who has no result: nothing submitted, or no result written.

    `grade run` lists both in missing.json (`students`: no submission for the
    lab; `submitted`: every submission it found), so that grades.csv has a
    row for every student even when a result could not be written.
    """
    path = results_dir / "missing.json"
    if not path.is_file():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    graded = {r["student_id"] for r in results}
    max_score = results[0]["max_score"] if results else 100
    rows = []
    for status, students in (("missing", data.get("students", [])), ("error", data.get("submitted", []))):
        rows += [{"student_id": sid, "lab": data["lab"], "status": status, "score": 0, "max_score": max_score,
                  "gradable_points": 0, "blocked_points": 0, "items": []}
                 for sid in students if sid not in graded]
    return rows


def row_status(result: dict[str, Any]) -> str:
    """graded; error when the grader could not finish some item (a TA looks, a rerun grades it again)."""
    if "status" in result:
        return result["status"]
    return "error" if any(item.get("status") == "error" for item in result["items"]) else "graded"


def item_ids(results: list[dict[str, Any]]) -> list[str]:
    ids: list[str] = []
    for result in results:
        for item in result["items"]:
            if item["id"] not in ids:
                ids.append(item["id"])
    return ids


def summary_table(results: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    table.add_column("student", overflow="fold")
    table.add_column("score", justify="right")
    ids = item_ids(results)
    for item_id in ids:
        table.add_column(item_id, justify="center")
    table.add_column("flags", justify="right")
    for result in sorted(results, key=lambda r: r["student_id"]):
        cells = {item["id"]: item for item in result["items"]}
        row = [escape(result["student_id"]), f"{result['score']}/{result['max_score']}"]
        for item_id in ids:
            item = cells.get(item_id)
            if item is None:
                row.append("")
                continue
            style = STATUS_STYLE.get(item["status"], "red")
            row.append(f"[{style}]{STATUS_MARK.get(item['status'], item['status'])}[/{style}]")
        row.append(str(len(result["flags"])) if result["flags"] else "")
        table.add_row(*row)
    return table


def csv_rows(results: list[dict[str, Any]], notebook: dict[str, dict[str, float]] | None = None
             ) -> tuple[list[str], list[dict[str, Any]]]:
    """Header and rows of grades.csv; nbgrader's scores (if merged) become two more columns of the same rows."""
    ids = item_ids(results)
    header = CSV_FIXED + [f"item:{i}" for i in ids] + ["flags"]
    if notebook:
        header += ["nbgrader_score", "nbgrader_max_score"]
    rows = []
    for result in results:
        if not result["items"]:                                  # no result at all (missing_rows)
            rows.append({**{k: result[k] for k in CSV_FIXED}, **{f"item:{i}": "" for i in ids}, "flags": 0,
                         **({"nbgrader_score": "", "nbgrader_max_score": ""} if notebook else {})})
            continue
        row: dict[str, Any] = {k: result.get(k) for k in CSV_FIXED}
        row["status"] = row_status(result)
        scores = {item["id"]: item for item in result["items"]}
        for item_id in ids:
            item = scores.get(item_id)
            row[f"item:{item_id}"] = "" if item is None else item["score"]
        row["flags"] = len(result["flags"])
        if notebook:
            nb = notebook.get(result["student_id"])
            row["nbgrader_score"] = "" if nb is None else nb["score"]
            row["nbgrader_max_score"] = "" if nb is None else nb["max_score"]
        rows.append(row)
    return header, rows


def write_csv(results: list[dict[str, Any]], path: Path,
              notebook: dict[str, dict[str, float]] | None = None) -> Path:
    header, rows = csv_rows(results, notebook)
    with open(path, "w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return path


LEGEND = """## How to read the differences

- The graded tests are hidden: the feedback shows what your engine did where it first differs from the
  reference, and which rule that is, never the reference's value there. Each item names the public tests of
  the same rule: `inferlab check` runs them and shows their expected values beside yours.
- `GOOD` lines are where your engine and the reference agree (the context before a difference);
  `BAD` is what your engine did where the reference did something else; `MISSING` means your log or
  your observations stop where the reference's go on.
- A step of an engine run is shown as `step N: {scheduled, changed, finished, free}`:
  - `scheduled`: one entry per sequence the step ran, `r<i>:P<n>+<c>` or `r<i>:D<n>+<c>`: request `r<i>`
    (the i-th request of the test's workload, counting from 0) got a prefill (`P`) or decode (`D`) chunk
    of `n` new tokens, with `c` tokens already computed before it;
  - `changed`: each request whose block table changed in that step, with its new table (physical block ids);
  - `finished`: requests whose blocks were released in that step;
  - `free`: how many KV blocks were free after the step.
- `yours is ...` is your value at the first place it differs (`key[...]` says where).
"""


def feedback_markdown(result: dict[str, Any]) -> str:
    """Per-student feedback: the score, each item, and for each failed item the first difference."""
    lines = [f"# {result['lab']} feedback: {result['student_id']}", "",
             f"**Score: {result['score']} / {result['max_score']}**"]
    if result["blocked_points"]:
        lines.append(f"({result['blocked_points']} points of GPU items could not be graded on this machine "
                     "and are neither earned nor lost here.)")
    lines += ["", "| item | points | result | summary |", "| --- | --- | --- | --- |"]
    for item in result["items"]:
        summary = item["message"].replace("|", "\\|")
        lines.append(f"| {item['title']} | {item['score']}/{item['points']} | {item['status']} | {summary} |")
    pending = sum(item["points"] for item in result["items"] if item["status"] == "pending")
    if pending:
        lines.append(f"({pending} points are marked by a TA and not yet in this score.)")
    failed = [item for item in result["items"] if item["status"] not in ("passed", "blocked", "pending")]
    if failed:
        lines += ["", "## What to look at", ""]
        for item in failed:
            lines.append(f"### {item['title']} ({item['score']}/{item['points']}, {item['status']})")
            lines += ["", item["message"], ""]
            if item["details"]:
                lines += ["```", *item["details"], "```", ""]
        if any(item["kind"] != "report" and item["kind"] != "ta" for item in failed):
            lines += [LEGEND]
    marked = [item for item in result["items"] if item["kind"] == "ta" and item["status"] in ("passed", "failed")]
    if marked:
        lines += ["", "## Marked by a TA", ""]
        for item in marked:
            lines += [f"### {item['title']} ({item['score']}/{item['points']})", "", "```", *item["details"], "```", ""]
    if result["regions"]:
        lines += ["", "## Your exercise regions", "", "| region | status | note |", "| --- | --- | --- |"]
    for region in result["regions"]:
        lines.append(f"| `{region['region_id']}` | {region['status']} | {region['message']} |")
    if result["notes"] or result["flags"]:
        lines += ["", "## Notes from the grader", ""]
        lines += [f"- {note}" for note in result["notes"]]
        lines += [f"- flagged for review: {flag}" for flag in result["flags"]]
    if result["regions"]:
        lines += ["", "What runs of your files: the bodies of the exercise regions, plus the definitions you added "
                  "outside them (imports, functions, classes, constants, new methods); other changes outside the "
                  "regions are not run (the notes above list any). The grader puts that code into its own copy of the engine "
                  "and compares what it does with the reference, step by step.", ""]
    return "\n".join(lines)


def hidden_items(lab: str) -> set[str]:
    """Items no public test backs: Gradescope shows their results once grades are published, not at once.

    A student can already run the public tests behind the other items, so
    showing those verdicts at once gives nothing of the hidden tests away.
    """
    from labkit.rubric import load_rubric
    return {item.id for item in load_rubric(lab).items if not item.public}


def leaderboard(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Gradescope leaderboard entries: the measured throughput ratio (reference time / yours), when measured."""
    ratios = [item["measurements"]["median_ratio"] for item in result["items"]
              if item["kind"] == "throughput" and "median_ratio" in item.get("measurements", {})]
    return [{"name": "throughput vs reference (x)", "value": round(ratios[0], 3), "order": "desc"}] if ratios else []


def gradescope_results(result: dict[str, Any], hidden: set[str] | frozenset[str] = frozenset(),
                       with_leaderboard: bool = False, notes: list[str] | None = None) -> dict[str, Any]:
    """Gradescope's autograder `results.json` for one student (statuses other than passed count as failed).

    Items in `hidden` are shown `after_published`; `notes` (e.g. how an upload
    was placed) go at the end of the submission-wide output.
    """
    tests = []
    for number, item in enumerate(result["items"], start=1):
        body = item["message"]
        if item["details"]:
            body += "\n\n" + "\n".join(item["details"])
        tests.append({"name": item["title"], "number": str(number), "score": float(item["score"]),
                      "max_score": float(item["points"]), "status": "passed" if item["status"] == "passed" else "failed",
                      "output": body, "tags": [item["kind"], item["status"]],
                      "visibility": "after_published" if item["id"] in hidden else "visible"})
    output = f"{result['lab']}: {result['score']}/{result['max_score']}"
    if result["blocked_points"]:
        output += f" ({result['blocked_points']} GPU points not graded here)"
    graders = result.get("notes") or []
    if graders:                    # what of the submission was not read or not run, and why (the student's to fix)
        output += "\n\nNotes from the grader:\n" + "\n".join(f"- {note}" for note in graders[:MAX_NOTES])
        if len(graders) > MAX_NOTES:
            output += f"\n- ... and {len(graders) - MAX_NOTES} more"
    if notes:
        output += "\n\n" + "\n".join(f"- {note}" for note in notes)
    out = {"score": float(result["score"]), "output": output, "visibility": "visible",
           "stdout_visibility": "hidden", "tests": tests,
           "extra_data": {"lab": result["lab"], "student_id": result["student_id"],
                          "submission_sha256": result["submission_sha256"]}}
    board = leaderboard(result) if with_leaderboard else []
    if board:
        out["leaderboard"] = board
    return out


def histogram(results: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    scores = [r["score"] for r in results]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(scores, bins=range(0, 102, 5), color="#4477aa", edgecolor="white")
    lab = results[0]["lab"] if results else ""
    ax.set_title(f"{lab} scores (n={len(scores)})")
    ax.set_xlabel("score")
    ax.set_ylabel("students")
    ax.set_xlim(0, 101)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def make_reports(results_dir: Path, out: Path | None = None, console: Console | None = None) -> ReportPaths:
    results = load_results(results_dir)
    if not results:
        raise FileNotFoundError(f"no finished results (*.json) in {results_dir}")
    from labkit.rubric import load_rubric
    from grading.ta_marks import merge_all
    results = merge_all(results, results_dir, load_rubric(results[0]["lab"]))
    out = out or results_dir / "report"
    paths = ReportPaths(out, out / "grades.csv", out / "feedback", out / "gradescope", out / "histogram.png")
    paths.feedback.mkdir(parents=True, exist_ok=True)
    paths.gradescope.mkdir(parents=True, exist_ok=True)
    from grading.nbgrader_bridge import load_nbgrader_scores
    write_csv(results + missing_rows(results_dir, results), paths.csv, load_nbgrader_scores(results_dir))
    hidden = hidden_items(results[0]["lab"])
    for result in results:
        sid = result["student_id"]
        try:
            (paths.feedback / f"{sid}.md").write_text(feedback_markdown(result), encoding="utf-8")
            write_json_atomic(paths.gradescope / sid / "results.json", gradescope_results(result, hidden))
        except Exception as err:  # noqa: BLE001 - one student's files never stop the others'
            if console is not None:
                console.print(f"[red]{escape(sid)}: feedback not written ({type(err).__name__}: {escape(str(err))})[/red]")
    histogram(results, paths.histogram)
    if console is not None:
        console.print(summary_table(results, f"{results[0]['lab']}: {len(results)} result(s)"))
    return paths
