"""Running the public lab suites in child processes, many at once, for the project's CI.

Every run gets its own tree (a directory holding a `student_exercises/`
package: all stubbed, some labs filled, or one bug-zoo mutant) and its own
pytest process, forked from the grader's fork server (`grading.spawn.ForkServer`,
which has imported torch and transformers and nothing of the course), so
nothing a run imports from the engine can leak into another. Outcomes are
read from `labkit.score_plugin`'s JSON file, never from exit codes, and each
run also records which `student_exercises` it imported (`package_origin`), so
a run can never silently test the wrong tree.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from labkit.labs import exercise_labs
from courseware.selfcheck import TESTS, SuiteRun, pytest_command
from grading.spawn import ForkServer

ROOT = Path(__file__).resolve().parents[2]
LABS = tuple(exercise_labs())
ALL_LABS = " or ".join(LABS)
RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Job:
    key: str
    tree: Path                 # holds student_exercises/ (ROOT for the committed package and for reference)
    marker: str                # pytest -m expression
    impl: str = "student"
    extra: tuple[str, ...] = field(default=())


def run_env(cache: Path) -> dict[str, str]:
    """Environment of the runs: one thread each (they run side by side), offline, a shared model cache."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env.update(INFERLAB_CACHE=str(cache), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1", TOKENIZERS_PARALLELISM="false",
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")   # only the plugins we name with -p (docs/design.md §4)
    return env


def run_all(jobs: Iterable[Job], cache: Path, workdir: Path, workers: int | None = None) -> dict[str, SuiteRun]:
    """Run every job, `workers` at a time (default: one per CPU core), as children of one fork server."""
    jobs = list(jobs)
    env = run_env(cache)
    server = ForkServer()

    def run(index_job: tuple[int, Job]) -> tuple[str, SuiteRun]:
        i, job = index_job
        results = workdir / f"run{i}.json"
        argv = pytest_command(job.tree / TESTS, job.marker, results, job.impl, job.extra)[3:]
        child = server.start("pytest", argv, job.tree, env, path=[str(job.tree), str(ROOT)])
        done = child.wait(time.monotonic() + RUN_TIMEOUT_S)
        output = done.output.text()
        (workdir / f"run{i}.log").write_text(output, encoding="utf-8")
        data = json.loads(results.read_text(encoding="utf-8")) if results.is_file() else {}
        status = -1 if done.status is None or done.timed_out else done.status
        return job.key, SuiteRun(status, done.wall_s, output, data)

    try:
        with ThreadPoolExecutor(workers or max(1, os.cpu_count() or 1)) as pool:
            return dict(pool.map(run, enumerate(jobs)))
    finally:
        server.close()


def expected_origin(job: Job) -> Path:
    package = "reference" if job.impl == "reference" else "student_exercises"
    base = ROOT if job.impl == "reference" else job.tree
    return (base / package / "__init__.py").resolve()


def problems_of(run: SuiteRun, job: Job) -> list[str]:
    """What makes a run unusable as evidence: no results, collection errors, the wrong package imported."""
    if not run.results:
        return [f"{job.key}: no results file (pytest exit {run.returncode}):\n{run.output[-3000:]}"]
    problems = [f"{job.key}: collection error: {e[:2000]}" for e in run.results.get("collection_errors", [])]
    origin = run.results.get("package_origin")
    if origin is None or Path(origin).resolve() != expected_origin(job):
        problems.append(f"{job.key}: imported {origin}, expected {expected_origin(job)}")
    if not run.tests:
        problems.append(f"{job.key}: no tests selected by -m {job.marker!r}")
    return problems


def by_outcome(run: SuiteRun, outcomes: Sequence[str]) -> list[str]:
    return [nodeid for nodeid, outcome in run.outcomes().items() if outcome in outcomes]
