"""A release's commands, notebooks and slide scripts run the student's code, whichever `inferlab` or Jupyter
starts them (courseware/release_root.py; issue 33).

This machine has the course installed (editable), so `import courseware` or `import student_exercises`
from a folder without them finds the course's: the situation in which `inferlab demo` used to run the
course's engine. Every lab's release is made twice, and each command runs in both:

- a lab with regions: as shipped (its own regions stubbed) and with them written (the reference bodies).
  As shipped it must fail at one of *its own lab's* regions, written it must succeed; the course's
  engine would succeed in both, and the course's `student_exercises` (every region a stub) fail in both;
- lab 5, which has no regions: as shipped, and with an edit of the student's own (lab 1's
  `emit_arrival` raising a marker). Shipped it must succeed, edited fail with the marker, which
  exists in no other tree.

What runs:

- `inferlab demo`, `inferlab bench`, `inferlab check labN` (labs with public tests), `inferlab trace`
  (lab 1's metrics code) through the course's own `inferlab` (its `main`, imported the way its console
  script imports it: nothing of the working directory on sys.path), started in the release's root;
- `python -m courseware.student_cli demo` started in the release's `tutorials/` (where `courseware`
  resolves to the course's);
- one shipped tutorial of the lab, executed with no PYTHONPATH the way Jupyter runs it: the failing
  release's from the release's root (a kernel started anywhere in the release finds it), the working
  one's from its `tutorials/` folder, whole (test_release_tutorials.py runs Tutorials 02 and 05 as well,
  scripts/release_tutorials_run.py every notebook of every release);
- one shipped slide script of the lab (`python -m slides_code.NAME` from the release's root), and every
  slide script in the first release that ships it (test_every_slide_script_runs_in_the_first_release_that_ships_it).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from courseware.build import execute_notebook
from courseware.release import make_release
from courseware.release_slides import SLIDE_LAB
from courseware.release_tutorials import TUTORIAL_LAB
from labkit.labs import all_labs, exercise_labs
from labkit.tree import PACKAGE, load_reference, splice

COURSE_INFERLAB = "import sys; del sys.path[0]; from inferlab.cli import main; sys.exit(main(sys.argv[1:]))"
STUB = "NotImplementedError"
LABS = [lab.lab_id for lab in all_labs()]
EXERCISE_LABS = exercise_labs()
MARKER = "edited-by-the-student-in-this-release"
# Per lab: the tutorial and the slide script run in both of its releases (the lab's own, the fastest).
TUTORIAL = {"lab1": "Tutorial_01_intro.ipynb", "lab2": "Tutorial_05_prefix_caching.ipynb",
            "lab3": "Tutorial_03_batching.ipynb", "lab4": "Tutorial_07_model_runner.ipynb",
            "lab5": "Tutorial_08_benchmarking.ipynb"}     # lab 5's: it serves the release's engine and loads it
SLIDE = {"lab1": "minimal_log", "lab2": "sequence_fields", "lab3": "batching", "lab4": "call_chain",
         "lab5": "call_chain"}


@dataclass(frozen=True)
class Pair:
    """A lab's release twice: where the student's code raises, and where it works."""

    lab: str
    failing: Path
    working: Path

    def failed_here(self, out: str) -> bool:
        """Did the failing release fail at the student's code of *this* release?"""
        if self.lab in EXERCISE_LABS:
            return STUB in out and re.search(rf"\b{self.lab}\.\w+", out) is not None
        return MARKER in out


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, Pair]:
    base = tmp_path_factory.mktemp("commands")
    tree = load_reference()
    made = {}
    for lab in LABS:
        shipped = make_release(lab, base / lab / "shipped")
        changed = base / lab / "changed"
        shutil.copytree(shipped, changed)
        own = {r.region_id: tree.body(r.region_id) for r in tree.regions if r.lab == lab}
        if own:
            splice(changed / PACKAGE, own)
            made[lab] = Pair(lab, failing=shipped, working=changed)
        else:
            _, region = tree.region("lab1.emit_arrival")
            splice(changed / PACKAGE, {"lab1.emit_arrival": f'{region.indent}raise RuntimeError("{MARKER}")\n'})
            made[lab] = Pair(lab, failing=changed, working=shipped)
    return made


def env(cache: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    return {**clean, "INFERLAB_CACHE": cache, "COLUMNS": "160", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def run(argv: list[str], cwd: Path, cache: str) -> tuple[int, str]:
    proc = subprocess.run(argv, cwd=cwd, env=env(cache), capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def course_inferlab(args: list[str], cwd: Path, cache: str) -> tuple[int, str]:
    return run([sys.executable, "-c", COURSE_INFERLAB, *args], cwd, cache)


@pytest.fixture(scope="module")
def cache(tiny_model_dir) -> str:
    return str(Path(tiny_model_dir).parent)


def command(lab: str, name: str, cache: str) -> list[str]:
    if name == "check":
        return ["check", lab]
    if name == "bench" and lab not in EXERCISE_LABS:     # lab 5's bench: the course's, on the tiny model here
        return ["bench", "--model", str(Path(cache) / "tiny-qwen3-seed0"), "--device", "cpu", "--dtype", "float32"]
    return [name]


CASES = [(lab, name) for lab in LABS for name in ("demo", "bench", "check") if name != "check" or lab in EXERCISE_LABS]


@pytest.mark.slow
@pytest.mark.parametrize("lab, name", CASES, ids=[f"{lab}-{name}" for lab, name in CASES])
def test_course_inferlab_in_a_release_runs_the_students_code(pairs, cache, lab, name):
    pair = pairs[lab]
    code, out = course_inferlab(command(lab, name, cache), pair.failing, cache)
    assert code != 0 and pair.failed_here(out), out[-3000:]
    if name == "check":
        assert "public part" in out and " 0/" in out, out[-3000:]       # every test fails, naming the region
    code, out = course_inferlab(command(lab, name, cache), pair.working, cache)
    assert code == 0, out[-3000:]
    assert STUB not in out and MARKER not in out, out[-3000:]
    if name == "demo":
        assert (pair.working / "inferlab_logs" / "demo.jsonl").is_file()
    if name == "bench":
        assert "tok/s" in out, out
    if name == "check":
        assert "public part" in out and "FAIL" not in out, out


def test_lab5s_release_has_nothing_to_self_check_and_says_so(pairs, cache):
    code, out = course_inferlab(["check", "lab5"], pairs["lab5"].working, cache)
    assert code == 2 and "lab5's release has no public tests" in out, out


@pytest.mark.slow
def test_trace_uses_the_releases_metrics_code(pairs, cache):
    pair = pairs["lab1"]
    log = pair.working / "inferlab_logs" / "demo.jsonl"
    if not log.is_file():
        assert course_inferlab(["demo"], pair.working, cache)[0] == 0
    for release in (pair.failing, pair.working):
        (release / "run.jsonl").write_text(log.read_text(encoding="utf-8"), encoding="utf-8")
    code, out = course_inferlab(["trace", "run.jsonl"], pair.failing, cache)
    assert code != 0 and "lab1.request_metrics" in out, out
    code, out = course_inferlab(["trace", "run.jsonl"], pair.working, cache)
    assert code == 0 and "TTFT" in out, out


def test_serve_is_lab5s_and_another_release_says_where_it_is(pairs, cache):
    """Lab 5's release has `serve` (Tutorial 08 runs it, test_a_shipped_tutorial_runs_on_the_releases_code[lab5]);
    in another release the course's `inferlab serve` is handed over and says where it is, instead of serving
    the course's engine."""
    code, out = course_inferlab(["serve", "--help"], pairs["lab5"].working, cache)
    assert code == 0 and "--max-waiting-requests" in out, out
    code, out = course_inferlab(["serve", "--port", "8123"], pairs["lab2"].working, cache)
    assert code == 2 and "lab 5's release" in out, out


@pytest.mark.slow
@pytest.mark.parametrize("lab", [LABS[0], LABS[-1]])     # the hand-over is the same code in every release: the
def test_the_releases_own_command_started_in_tutorials_hands_itself_over(pairs, cache, lab):   # two ends
    pair = pairs[lab]
    code, out = run([sys.executable, "-m", "courseware.student_cli", "demo"], pair.failing / "tutorials", cache)
    assert code != 0 and pair.failed_here(out), out[-3000:]
    code, out = run([sys.executable, "-m", "courseware.student_cli", "demo"], pair.working / "tutorials", cache)
    assert code == 0 and STUB not in out, out[-3000:]


def notebook_text(executed: nbformat.NotebookNode, error: str | None) -> str:
    """Everything a run printed, cell outputs and the error, without the terminal's colours."""
    parts = []
    for cell in executed.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", "") if output.get("output_type") == "stream"
                         else "\n".join(output.get("traceback", [])))
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(parts) + "\n" + (error or ""))


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_a_shipped_tutorial_runs_on_the_releases_code(pairs, cache, lab, monkeypatch):
    """The failing release's notebook from the release's root (as a kernel started there runs it), the working
    one's from its tutorials/ folder, top to bottom, with no PYTHONPATH."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setenv("INFERLAB_CACHE", cache)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    pair, name = pairs[lab], TUTORIAL[lab]
    assert TUTORIAL_LAB[name.split("_")[1]] == lab
    executed, _, error = execute_notebook(pair.failing / "tutorials" / name, folder=pair.failing, timeout=300)
    text = notebook_text(executed, error)
    assert error is not None and pair.failed_here(text), text[-3000:]
    # The traceback names the release's own file; or the engine caught the region's error and failed the step
    # (the model runner's regions: "step 0 failed for requests [0]: NotImplementedError: lab4.prepare_prefill").
    assert str(pair.failing / PACKAGE) in text or "failed for requests" in text, text[-3000:]
    executed, _, error = execute_notebook(pair.working / "tutorials" / name, timeout=300)
    assert error is None, re.sub(r"\x1b\[[0-9;]*m", "", error)[-3000:]
    assert all(c.execution_count is not None for c in executed.cells if c.cell_type == "code")


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_a_shipped_slide_script_runs_on_the_releases_code(pairs, cache, lab, tmp_path):
    pair, script = pairs[lab], SLIDE[lab]
    argv = [sys.executable, "-m", f"slides_code.{script}", "--out", str(tmp_path)]
    code, out = run(argv, pair.failing, cache)
    assert pair.failed_here(out), out[-3000:]        # the engine may report a failed step and go on (call_chain)
    assert str(pair.failing / PACKAGE) in out or "step 0 failed" in out, out[-3000:]
    code, out = run(argv, pair.working, cache)
    assert code == 0 and STUB not in out and "failed" not in out, out[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS)
def test_every_slide_script_runs_in_the_first_release_that_ships_it(pairs, cache, lab, tmp_path):
    """Each of the lab's own slide scripts, in one interpreter, in the working release (later releases fill more)."""
    names = sorted(name for name, owner in SLIDE_LAB.items() if owner == lab)
    shipped = {p.stem for p in (pairs[lab].working / "slides_code").glob("*.py")}
    assert set(names) <= shipped, f"{lab}'s release lacks its slide scripts {set(names) - shipped}"
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    module = importlib.import_module('slides_code.' + name)\n"
            "    assert module.__file__.startswith(sys.argv[1]), module.__file__\n"
            "    module.main(['--out', sys.argv[2]])\n"
            "    print('ran', name, flush=True)\n")
    status, out = run([sys.executable, "-c", code, str(pairs[lab].working), str(tmp_path)], pairs[lab].working, cache)
    assert status == 0 and all(f"ran {name}" in out for name in names), out[-3000:]
    assert STUB not in out, out[-3000:]


def test_every_shipped_notebook_starts_by_finding_its_release(pairs):
    from courseware.release_tutorials import BOOTSTRAP, BOOTSTRAP_TAG, COURSE_CLI
    for lab in LABS:
        for path in sorted((pairs[lab].working / "tutorials").glob("*.ipynb")):
            nb = nbformat.read(path, as_version=4)
            first = nb.cells[0]
            assert first.cell_type == "code" and first.source == BOOTSTRAP and BOOTSTRAP_TAG in first.metadata["tags"]
            assert not any(COURSE_CLI in c.source for c in nb.cells if c.cell_type == "code"), (
                f"{path.name} runs the course's `inferlab.cli`, which a release does not have")


def test_a_slide_script_left_naming_reference_is_refused():
    """`import reference` becomes `import student_exercises`, so a later `reference.x` would fail in the release:
    the release refuses to ship such a script (call_chain.py did this before it named the engine's folder otherwise)."""
    from courseware.release_slides import reference_imports, release_script
    assert reference_imports(release_script("from reference import LLM\nimport reference.metrics\n")) == []
    assert reference_imports(release_script("import reference\nprint(reference.__file__)\n")) == [
        "line 2: the name `reference`"]
