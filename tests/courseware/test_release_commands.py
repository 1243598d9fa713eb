"""A release's commands run the student's code, whichever `inferlab` a student types (courseware/release_root.py).

This machine has the course installed (editable), so `import courseware` or
`import student_exercises` from a folder without them finds the course's:
the situation in which `inferlab demo` used to run the course's engine. Each
command runs twice, in a lab 1 release as shipped (lab 1's regions stubbed)
and in the same release with lab 1 written, and must fail on the first at a
lab 1 region of *that release's* files and succeed on the second:

- `inferlab demo`, `inferlab bench`, `inferlab trace` and `inferlab check lab1`
  through the course's own `inferlab` (its `main`, imported the way its
  console script imports it: nothing of the working directory on sys.path),
  started in the release's root;
- `python -m courseware.student_cli demo` started in the release's
  `tutorials/` (where `courseware` resolves to the course's);
- the shipped Tutorial 01 executed in its `tutorials/` folder with no
  PYTHONPATH, the way Jupyter runs it (its first cell finds the release).

A release ships no slide scripts (slides_code/ is course material), so there is none to run.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from courseware.build import execute_notebook
from courseware.release import make_release
from labkit.tree import PACKAGE, load_reference, splice

COURSE_INFERLAB = "import sys; del sys.path[0]; from inferlab.cli import main; sys.exit(main(sys.argv[1:]))"
STUB = "NotImplementedError"


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("commands")
    shipped = make_release("lab1", base / "shipped")
    solved = base / "solved"
    shutil.copytree(shipped, solved)
    tree = load_reference()
    splice(solved / PACKAGE, {r.region_id: tree.body(r.region_id) for r in tree.regions if r.lab == "lab1"})
    assert not (shipped / "slides_code").exists() and not (solved / "slides_code").exists()
    return {"shipped": shipped, "solved": solved}


def env(cache: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return {**clean, "INFERLAB_CACHE": cache, "COLUMNS": "160", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "OMP_NUM_THREADS": "1"}


def course_inferlab(args: list[str], cwd: Path, cache: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", COURSE_INFERLAB, *args], cwd=cwd, env=env(cache),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def cache(tiny_model_dir) -> str:
    return str(Path(tiny_model_dir).parent)


@pytest.mark.slow
@pytest.mark.parametrize("args", [["demo"], ["bench"], ["check", "lab1"]], ids=["demo", "bench", "check"])
def test_course_inferlab_in_a_release_runs_the_students_code(releases, cache, args):
    stub = course_inferlab(args, releases["shipped"], cache)
    out = stub.stdout + stub.stderr
    assert stub.returncode != 0, out[-3000:]
    if args[0] == "check":
        assert "0/" in out and "lab1.emit_arrival" in out, out[-3000:]    # every test fails, naming the region
    else:
        assert "lab1.emit_" in out, out[-3000:]
    solved = course_inferlab(args, releases["solved"], cache)
    out = solved.stdout + solved.stderr
    assert solved.returncode == 0, out[-3000:]
    assert STUB not in out, out[-3000:]
    if args[0] == "demo":
        assert (releases["solved"] / "inferlab_logs" / "demo.jsonl").is_file()
    if args[0] == "bench":
        assert "output tok/s" in out and "stand-ins" in out, out
    if args[0] == "check":
        assert "public part" in out and "FAIL" not in out, out


@pytest.mark.slow
def test_trace_uses_the_releases_metrics_code(releases, cache):
    log = releases["solved"] / "inferlab_logs" / "demo.jsonl"
    if not log.is_file():
        assert course_inferlab(["demo"], releases["solved"], cache).returncode == 0
    for name in ("shipped", "solved"):
        (releases[name] / "run.jsonl").write_text(log.read_text(encoding="utf-8"), encoding="utf-8")
    stub = course_inferlab(["trace", "run.jsonl"], releases["shipped"], cache)
    assert stub.returncode != 0 and "lab1.request_metrics" in stub.stdout + stub.stderr, stub.stdout + stub.stderr
    solved = course_inferlab(["trace", "run.jsonl"], releases["solved"], cache)
    assert solved.returncode == 0 and "TTFT" in solved.stdout, solved.stdout + solved.stderr


@pytest.mark.slow
def test_the_releases_own_command_started_in_tutorials_hands_itself_over(releases, cache):
    for name, ok in (("shipped", False), ("solved", True)):
        proc = subprocess.run([sys.executable, "-m", "courseware.student_cli", "demo"],
                              cwd=releases[name] / "tutorials", env=env(cache), capture_output=True, text=True,
                              timeout=300)
        assert (proc.returncode == 0) == ok, proc.stdout[-3000:] + proc.stderr[-3000:]
        if not ok:
            assert "lab1.emit_" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_shipped_tutorial_runs_on_the_releases_code_from_its_folder(releases, cache, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("INFERLAB_CACHE", cache)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    for name in ("shipped", "solved"):
        path = releases[name] / "tutorials" / "Tutorial_01_intro.ipynb"
        executed, _, error = execute_notebook(path, timeout=300)
        error = re.sub(r"\x1b\[[0-9;]*m", "", error or "") or None      # the traceback's colours
        if name == "shipped":
            assert error is not None and f"{STUB}: lab1.emit_" in error, error
            assert str(releases["shipped"] / PACKAGE) in error, "the stub that raised is the release's own"
        else:
            assert error is None, error[-3000:]
            code = [c for c in executed.cells if c.cell_type == "code"]
            assert all(c.execution_count is not None for c in code)


def test_every_shipped_notebook_starts_by_finding_its_release(releases):
    from courseware.release_tutorials import BOOTSTRAP, BOOTSTRAP_TAG
    for path in sorted((releases["shipped"] / "tutorials").glob("*.ipynb")):
        first = nbformat.read(path, as_version=4).cells[0]
        assert first.cell_type == "code" and first.source == BOOTSTRAP and BOOTSTRAP_TAG in first.metadata["tags"]
