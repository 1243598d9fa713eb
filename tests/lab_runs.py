"""Running the public lab suites in child processes, many at once, for the project's CI.

Every run gets its own tree (a directory holding a `student_exercises/`
package: all stubbed, some labs filled, or one bug-zoo mutant) and its own
pytest process, forked from tests/lab_zygote.py after torch and transformers
are imported, so nothing a run imports from the engine can leak into another. Outcomes are
read from `inferlab.score_plugin`'s JSON file, never from exit codes, and each
run also records which `student_exercises` it imported (`package_origin`), so
a run can never silently test the wrong tree.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from inferlab.labs import exercise_labs
from inferlab.selfcheck import TESTS, SuiteRun, pytest_command

ROOT = Path(__file__).resolve().parents[1]
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


def zygote_env(cache: Path) -> dict[str, str]:
    """Environment of the runs: one thread each (they run side by side), offline, a shared model cache."""
    env = dict(os.environ)
    env.update(INFERLAB_CACHE=str(cache), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1", TOKENIZERS_PARALLELISM="false",
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")   # only the plugins we name with -p (docs/design.md §4)
    return env


def run_all(jobs: Iterable[Job], cache: Path, workdir: Path, workers: int | None = None) -> dict[str, SuiteRun]:
    """Run every job, `workers` at a time (default: one per CPU core), as forks of tests/lab_zygote.py."""
    jobs = list(jobs)
    specs = []
    for i, job in enumerate(jobs):
        results = workdir / f"run{i}.json"
        command = pytest_command(job.tree / TESTS, job.marker, results, job.impl, job.extra)
        specs.append({"key": job.key, "cwd": str(job.tree), "args": command[3:], "log": str(workdir / f"run{i}.log"),
                      "results": str(results)})
    spec_path = workdir / "jobs.json"
    spec_path.write_text(json.dumps({"workers": workers or max(1, os.cpu_count() or 1), "timeout": RUN_TIMEOUT_S,
                                     "jobs": specs}))
    subprocess.run([sys.executable, str(Path(__file__).with_name("lab_zygote.py")), str(spec_path)],
                   env=zygote_env(cache), check=True)
    done = json.loads(spec_path.with_suffix(".done.json").read_text())
    runs = {}
    for spec in specs:
        results, status = Path(spec["results"]), done.get(spec["key"], {"returncode": -1, "wall_s": 0.0})
        data = json.loads(results.read_text(encoding="utf-8")) if results.is_file() else {}
        output = Path(spec["log"]).read_text(encoding="utf-8", errors="replace")
        runs[spec["key"]] = SuiteRun(status["returncode"], status["wall_s"], output, data)
    return runs


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
