"""Lab 5's release carries what the handout's experiments need: nobody works in the course repository.

The release is built, and its own scripts and commands are run from it with the course's packages
(`reference`, `grading`, `inferlab`) made unimportable: one run of `lab5_run.py`, `lab5_summary.py`, and
the release's `inferlab trace` and `inferlab bench --help`. The trace the run writes names the release's
engine (`student_exercises`), and the grader reads it as a trace of the engine.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from courseware.release import make_release
from grading.report_chain import read_call_tree

BLOCKED = ("reference", "grading", "inferlab")


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    root = tmp_path_factory.mktemp("lab5_release")
    out = make_release("lab5", root / "release")
    blocker = root / "blocker"
    blocker.mkdir()
    for name in BLOCKED:
        (blocker / f"{name}.py").write_text(f"raise ImportError('{name} is not in a student release')\n")
    env = {**os.environ, "PYTHONPATH": f"{blocker}{os.pathsep}{out}", "PYTHONDONTWRITEBYTECODE": "1"}
    return out, env


def _run(release: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], cwd=release, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_the_experiments_run_in_the_release_alone(release):
    out, env = release
    script = "assignments/lab5_performance/"
    blocked = subprocess.run([sys.executable, "-c", "import reference"], cwd=out, env=env, capture_output=True)
    assert blocked.returncode != 0, "the course's engine is importable: the test would prove nothing"
    _run(out, env, script + "lab5_run.py", "t_1", "--requests", "4", "--warmup", "0", "--num-kvcache-blocks", "40")
    _run(out, env, script + "lab5_summary.py")
    with (out / "results" / "summary.csv").open(encoding="utf-8") as handle:
        assert [(r["group"], r["n"]) for r in csv.DictReader(handle)] == [("t", "1")]
    trace = _run(out, env, "-m", "courseware.selfcheck", "trace", "runs/t_1.jsonl")
    assert "lifecycle: OK" in trace.stdout
    assert "--compare" in _run(out, env, "-m", "courseware.selfcheck", "bench", "--help").stdout
    calls, problems = read_call_tree(out / "runs" / "t_1_calls.txt")
    assert problems == [] and calls[0] == (0, "LLMEngine.step")
    assert "[student_exercises.engine.llm_engine]" in (out / "runs" / "t_1_calls.txt").read_text(encoding="utf-8")


def test_the_handout_speaks_of_the_release_not_the_course_repository(release):
    out, _ = release
    handout = (out / "assignments" / "lab5_performance" / "README.md").read_text(encoding="utf-8")
    assert "课程仓库" not in handout and "lab 5 release" in handout
    assert (out / "docs" / "performance.md").is_file(), "the handout cites docs/performance.md"
