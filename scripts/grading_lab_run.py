"""Grade one lab's reference solution, untouched stubs and every bug-zoo mutant, and print who lost what.

    python scripts/grading_lab_run.py --lab lab4 [--jobs 8] [--out DIR] [--summary FILE.json]

Made for the GPU run of lab 4 (docs/grading.md): on a machine with CUDA the
GPU items are graded against the lab's golden_gpu.json, so the reference must
score 100, the stubs 0, and each mutant loses the items that catch it (a
`GPU = True` mutant only GPU items can see). The script writes the class in
nbgrader's layout, runs the same `grade_run` a TA runs, prints the summary
table, and writes a JSON summary (per student: score, blocked points, each
item's status and message, the throughput ratios measured) for the record.
It exits 1 when the reference misses a gradable point or the stubs earn one.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/ and the course, from any folder
from courseware.bugzoo import load_mutants  # noqa: E402
from labkit.tree import load_reference  # noqa: E402
from grading.grade_run import RunOptions, grade_run  # noqa: E402
from grading.report import summary_table  # noqa: E402
from grading.sample_submissions import solved, stubs, write_submission  # noqa: E402


def write_class(root: Path, lab: str) -> dict[str, bool]:
    """reference, stubs and one student per mutant; returns student -> whether only a GPU item can catch it."""
    tree = load_reference()
    write_submission(root, "reference", lab, tree, solved(lab))
    write_submission(root, "stubs", lab, tree, stubs(lab))
    gpu = {"reference": False, "stubs": False}
    for mutant in load_mutants(lab=lab):
        write_submission(root, f"mut_{mutant.name}", lab, tree, mutant.choice(tree))
        gpu[f"mut_{mutant.name}"] = mutant.grader_needs_gpu
    return gpu


def summarize(results: dict[str, dict], gpu: dict[str, bool]) -> dict[str, dict]:
    return {sid: {"score": r["score"], "blocked_points": r["blocked_points"], "gpu_mutant": gpu.get(sid, False),
                  "device": r["environment"]["device"], "sandbox": r["environment"].get("sandbox"),
                  "flags": r["flags"],
                  "lost": [i["id"] for i in r["items"] if i["status"] not in ("passed", "blocked")],
                  "items": {i["id"]: {"status": i["status"], "message": i["message"], "details": i["details"][:6],
                                      "measurements": i["measurements"]} for i in r["items"]}}
            for sid, r in sorted(results.items())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default="lab4")
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument("--out", default=None, help="working folder (default: a temp folder)")
    parser.add_argument("--summary", default=None, help="write the JSON summary here")
    args = parser.parse_args(argv)
    work = Path(args.out or tempfile.mkdtemp(prefix=f"grade-{args.lab}-"))
    gpu = write_class(work / "submitted", args.lab)
    console = Console(width=200)
    run = grade_run(RunOptions(args.lab, work / "submitted", work / "results", jobs=args.jobs, force=True),
                    console, show_progress=False)
    for note in run.notes:
        console.print(f"note: {note}")
    console.print(summary_table(list(run.results.values()), f"{args.lab}: {len(run.results)} submissions, "
                                f"{run.wall_s:.1f} s, -j {args.jobs}"))
    summary = summarize(run.results, gpu)
    for sid, row in summary.items():
        console.print(f"{sid}: {row['score']} (blocked {row['blocked_points']}), lost {row['lost']}")
    if args.summary:
        Path(args.summary).write_text(json.dumps({"lab": args.lab, "wall_s": round(run.wall_s, 1), "jobs": args.jobs,
                                                  "notes": run.notes, "students": summary}, indent=1))
    ref, stub = run.results["reference"], run.results["stubs"]
    return 0 if ref["score"] == ref["gradable_points"] and stub["score"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
