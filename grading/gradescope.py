"""What `run_autograder` runs inside a Gradescope container: grade one upload, write results.json.

    python -m grading.gradescope [--root /autograder]

Gradescope's layout (gradescope-autograders.readthedocs.io, "Autograder
Specifications"): the bundle is unzipped into ROOT/source, the student's
upload is in ROOT/submission, Gradescope's submission_metadata.json in ROOT,
and ROOT/results/results.json is what Gradescope reads back. The root comes
from --root, else the INFERLAB_AUTOGRADER_ROOT environment variable, else
/autograder, so CI can stand a temporary folder in for it.

The upload is laid over the pristine release (`grading.upload`) into
ROOT/work/submitted/<id>/<lab>/ and graded by `grade_run` with that one
student, exactly as `inferlab grade run` grades a class; the result is
converted by `grading.report.gradescope_results` (items no public test backs
shown once grades are published). Whatever goes wrong, a results.json is
written: a grader failure gives score 0 and says so, rather than leaving
Gradescope with no result at all.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT_ENV = "INFERLAB_AUTOGRADER_ROOT"
DEFAULT_ROOT = "/autograder"
CONFIG = "bundle.json"
RELEASE = "release"          # inside ROOT/source: the pristine student package the uploads are laid over


def autograder_root(arg: str | None = None) -> Path:
    return Path(arg or os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


def submission_id(root: Path) -> str:
    """Gradescope's submission id (from submission_metadata.json) as a student id; 'submission' without one."""
    try:
        meta = json.loads((root / "submission_metadata.json").read_text(encoding="utf-8"))
        return f"gs{int(meta['id'])}"
    except (OSError, ValueError, KeyError, TypeError):
        return "submission"


def failure_results(message: str) -> dict[str, Any]:
    """results.json when the grader itself failed: no points, and the reason for the course staff."""
    return {"score": 0.0, "output": f"The autograder failed before it could grade this submission; the course staff "
                                    f"will look at it.\n\n{message[-4000:]}", "visibility": "visible",
            "stdout_visibility": "hidden",
            "tests": [{"name": "autograder", "score": 0.0, "max_score": 0.0, "status": "failed",
                       "output": message[-4000:], "visibility": "visible"}]}


def grade(root: Path) -> dict[str, Any]:
    """Grade ROOT/submission with the bundle's lab; returns Gradescope's results.json content."""
    from rich.console import Console

    from grading.grade_run import RunOptions, grade_run
    from grading.report import gradescope_results, hidden_items
    from grading.scratch import clear
    from grading.tree_walk import read_tree
    from labkit.rubric import load_rubric
    from grading.upload import place_upload

    source = root / "source"
    config = json.loads((source / CONFIG).read_text(encoding="utf-8"))
    lab, student = config["lab"], submission_id(root)
    work = root / "work"
    clear(work)
    folder = work / "submitted" / student / lab
    reports = any(item.kind == "report" for item in load_rubric(lab).items)
    # The upload is read as a submission is (links, limits, odd names: grading.tree_walk) before it is placed.
    upload = read_tree(root / "submission", copy_to=work / "upload", first=())
    placement = place_upload(work / "upload", source / RELEASE, folder, copy_other_files=reports)
    console = Console(stderr=True)
    console.print(f"inferlab grading {lab} for {student} (course root {Path(__file__).resolve().parents[1]})")
    summary = grade_run(RunOptions(lab, work / "submitted", work / "results", jobs=1, force=True,
                                   allow_unfenced=bool(config.get("allow_unfenced"))), console, show_progress=False)
    result = summary.results[student]
    return gradescope_results(result, hidden_items(lab), with_leaderboard=bool(config.get("leaderboard")),
                              notes=upload.notes + placement.notes + summary.notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Grade ROOT/submission; write ROOT/results/results.json.")
    parser.add_argument("--root", default=None, help=f"autograder root (default: ${ROOT_ENV} or {DEFAULT_ROOT})")
    args = parser.parse_args(argv)
    root = autograder_root(args.root)
    started = time.monotonic()
    try:
        results = grade(root)
    except Exception:  # noqa: BLE001 - Gradescope must get a results.json whatever happened
        results = failure_results(traceback.format_exc())
        print(traceback.format_exc())          # stdout: Gradescope shows it to the course staff
    results["execution_time"] = round(time.monotonic() - started, 1)
    out = root / "results" / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, ensure_ascii=False), encoding="utf-8")
    print(f"{out}: score {results['score']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
