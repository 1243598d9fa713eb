"""`inferlab grade nbgrader --lab labN --course DIR [--results DIR]`: nbgrader's notebook scores, next to ours.

Some parts of a lab are answered in notebooks (written questions, small
autograded cells). nbgrader 0.9.6 grades those headless (docs/design.md §4):

    nbgrader generate_assignment <a> --force     (from the course root: source/ -> release/)
    nbgrader autograde <a> --force               (submitted/<student>/<a>/ -> autograded/, gradebook.db)

with the kernel pinned (`Execute.kernel_name=python3`), and the scores are
read back with `nbgrader.api.Gradebook`. They are written to
`RESULTS/nbgrader.json`, which `grade report` merges into the same rows as
the rubric score (columns nbgrader_score, nbgrader_max_score). The result
files of `grade run` are never modified, so regrading either side never
loses the other.

nbgrader runs notebook cells in its own Jupyter kernel, outside our fence:
keep graded code in `.py` regions (graded by `grade run`) and use notebooks
for what nbgrader is good at. Without nbgrader installed the command says
how to install it and exits 2.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from courseware.terminal import make_console
from grading.results import write_json_atomic

KERNEL = "python3"
NBGRADER_FILE = "nbgrader.json"
STEP_TIMEOUT_S = 1800


def nbgrader_available() -> bool:
    try:
        import nbgrader  # noqa: F401
        from nbgrader.api import Gradebook  # noqa: F401
    except ImportError:
        return False
    return True


def nbgrader_command(action: str, assignment: str, course: Path) -> list[str]:
    return [sys.executable, "-m", "nbgrader", action, assignment, "--force",
            f"--CourseDirectory.root={course}", f"--Execute.kernel_name={KERNEL}",
            "--ExecutePreprocessor.timeout=300", "--log-level=WARN"]


def run_step(action: str, assignment: str, course: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(nbgrader_command(action, assignment, course), cwd=course, capture_output=True, text=True,
                          timeout=STEP_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader {action} {assignment} failed (exit {proc.returncode}):\n"
                           f"{(proc.stdout + proc.stderr)[-3000:]}")
    return proc


def read_scores(course: Path, assignment: str) -> dict[str, dict[str, float]]:
    """student id -> {score, max_score} from nbgrader's gradebook."""
    from nbgrader.api import Gradebook
    scores: dict[str, dict[str, float]] = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for submission in gradebook.assignment_submissions(assignment):
            scores[submission.student_id] = {"score": float(submission.score),
                                             "max_score": float(submission.max_score)}
    return scores


def merge_into(results: Path, lab: str, assignment: str, scores: dict[str, dict[str, float]]) -> Path:
    path = results / NBGRADER_FILE
    write_json_atomic(path, {"lab": lab, "assignment": assignment, "kernel": KERNEL, "scores": scores})
    return path


def load_nbgrader_scores(results: Path) -> dict[str, dict[str, float]]:
    path = results / NBGRADER_FILE
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8")).get("scores", {})


def run_nbgrader(lab: str, course: Path, results: Path | None = None, assignment: str | None = None,
                 console: Console | None = None) -> int:
    console = console or make_console()
    if not nbgrader_available():
        console.print("[bold red]nbgrader is not installed[/bold red]: pip install 'inferlab[grading]' "
                      "(nbgrader 0.9.6)")
        return 2
    assignment = assignment or lab
    course = course.resolve()
    if not (course / "source" / assignment).is_dir():
        raise FileNotFoundError(f"no {course}/source/{assignment}/ (nbgrader's source notebooks)")
    run_step("generate_assignment", assignment, course)
    run_step("autograde", assignment, course)
    scores = read_scores(course, assignment)
    table = Table(title=f"nbgrader: {assignment}")
    table.add_column("student")
    table.add_column("score", justify="right")
    for student, row in sorted(scores.items()):
        table.add_row(escape(student), f"{row['score']:g}/{row['max_score']:g}")
    console.print(table)
    if results is not None:
        path = merge_into(results, lab, assignment, scores)
        console.print(f"merged into [bold]{path}[/bold]; `inferlab grade report --results {results}` adds the columns")
    return 0
