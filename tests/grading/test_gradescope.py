"""The Gradescope bundle end to end: built, unzipped under a temporary root standing in for /autograder,
set up, and run on three uploads of lab 2 (the cheapest lab to grade), as Gradescope would run it.

setup.sh runs with INFERLAB_SETUP_REUSE=1 and INFERLAB_PYTHON set to this interpreter: the CI venv already
has every dependency, so the script checks that they import and skips apt and pip (what it installs
otherwise is checked by reading requirements.txt and setup.sh). Everything else is the real thing:
run_autograder is started from the root's copy, with no PYTHONPATH but the bundle's own course copy,
and each results.json is validated against grading/schemas/gradescope.schema.json.

The expected visibility of each item is read from the rubric file itself (an item with public tests is
visible at once, the others after publication), not from the code under test.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jsonschema
import pytest

from labkit.tree import PACKAGE, load_reference
from labkit.labs import lab as find_lab
from courseware.release_code import TORCH_VERSION
from courseware.tiny_model import ensure_tiny_model
from grading.bundle import build_bundle
from grading.gradescope import failure_results
from grading.paths import SCHEMAS
from grading.report import gradescope_results
from grading.upload import place_upload
from grading.sample_submissions import solved, stubs, write_submission

LAB = "lab2"
SCHEMA = json.loads((SCHEMAS / "gradescope.schema.json").read_text())


def unzip(archive: Path, dest: Path) -> None:
    """Extract keeping the file modes stored in the archive (as `unzip` does on Gradescope)."""
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            path = Path(zf.extract(info, dest))
            mode = info.external_attr >> 16 & 0o777
            if mode:
                path.chmod(mode)


def clean_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "INFERLAB_CACHE")}
    env.update({"INFERLAB_AUTOGRADER_ROOT": str(root), "INFERLAB_SETUP_REUSE": "1", "INFERLAB_PYTHON": sys.executable})
    return env


@pytest.fixture(scope="module")
def autograder(tmp_path_factory):
    """A set-up autograder root: source/ unzipped, run_autograder copied to the root, setup.sh run."""
    work = tmp_path_factory.mktemp("gradescope")
    bundle = build_bundle(LAB, work / "autograder.zip", leaderboard=True)
    root = work / "autograder"
    unzip(bundle, root / "source")
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    model = ensure_tiny_model()          # setup.sh would build the same model; a copy saves CI the time
    shutil.copytree(model, root / "cache" / model.name)
    setup = subprocess.run(["bash", str(root / "source" / "setup.sh")], cwd=root / "source", env=clean_env(root),
                           capture_output=True, text=True, timeout=300)
    assert setup.returncode == 0, setup.stdout + setup.stderr
    assert "nothing installed" in setup.stdout
    return bundle, root


def grade(root: Path, write_upload) -> tuple[dict, str]:
    """Put an upload in ROOT/submission, run ROOT/run_autograder, return results.json and the run's output."""
    for name in ("submission", "results"):
        shutil.rmtree(root / name, ignore_errors=True)
    (root / "submission").mkdir()
    write_upload(root / "submission")
    run = subprocess.run([str(root / "run_autograder")], cwd=root, env=clean_env(root), capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    jsonschema.validate(results, SCHEMA)
    return results, run.stdout + run.stderr


def test_the_bundle_holds_what_gradescope_runs_and_only_this_lab(autograder):
    bundle, root = autograder
    with zipfile.ZipFile(bundle) as zf:
        modes = {i.filename: i.external_attr >> 16 & 0o777 for i in zf.infolist()}
    assert modes["setup.sh"] & 0o111 and modes["run_autograder"] & 0o111, "Gradescope needs them executable"
    names = set(modes)
    folder = find_lab(LAB).folder.name
    assert {f"course/assignments/{folder}/golden.json", f"course/assignments/{folder}/rubric.json"} <= names
    assert any(n.startswith(f"course/assignments/{folder}/hidden/") for n in names)
    assert not [n for n in names if n.startswith("course/assignments/") and f"/{folder}/" not in n]
    assert not [n for n in names if "/bugzoo/" in n or "/private/" in n or n.startswith(f"release/{PACKAGE}")]
    assert not [n for n in names if n.startswith("release/tests/")], "public tests are not graded"
    requirements = (root / "source" / "requirements.txt").read_text().split()
    assert requirements and all("==" in r for r in requirements) and not [r for r in requirements if r.startswith("torch")]
    setup = (root / "source" / "setup.sh").read_text()
    assert setup.index(f'torch=={TORCH_VERSION}') < setup.index("requirements.txt"), "torch first, pinned"


def test_a_reference_solved_whole_tree_scores_100_with_rubric_visibility(autograder):
    _, root = autograder
    results, output = grade(root, lambda up: write_submission(up, "myrepo", "", load_reference(), solved(LAB)))
    assert results["score"] == 100.0, results["output"]
    assert str(root / "source" / "course") in output, "graded with the bundle's own course copy"
    rubric = json.loads(find_lab(LAB).rubric.read_text())
    expected = ["visible" if item.get("public") else "after_published" for item in rubric["items"]]
    assert [t["visibility"] for t in results["tests"]] == expected
    assert {"visible", "after_published"} <= set(expected)
    assert [b["name"] for b in results["leaderboard"]] == ["throughput vs reference (x)"]
    assert results["leaderboard"][0]["value"] > 0


def test_untouched_stubs_score_0(autograder):
    _, root = autograder
    results, _ = grade(root, lambda up: write_submission(up, "repo", "", load_reference(), stubs(LAB)))
    assert results["score"] == 0.0
    assert all(t["status"] == "failed" for t in results["tests"])
    assert "leaderboard" not in results, "nothing measured, nothing published"


def test_an_upload_of_only_the_edited_file_is_laid_over_the_release(autograder):
    _, root = autograder
    solved_file = write_submission(root.parent / "solved", "s", LAB, load_reference(), solved(LAB))

    def only_block_manager(upload: Path) -> None:
        shutil.copyfile(solved_file / PACKAGE / "engine" / "block_manager.py", upload / "block_manager.py")
    results, _ = grade(root, only_block_manager)
    assert results["score"] == 100.0, results["output"]
    assert f"block_manager.py graded as {PACKAGE}/engine/block_manager.py" in results["output"]


def test_a_failing_grader_still_writes_valid_results():
    jsonschema.validate(failure_results("Traceback ...\nRuntimeError: boom"), SCHEMA)


def test_gradescope_results_show_hidden_items_after_publication():
    items = [{"id": i, "title": i, "kind": "pytest", "points": 50, "score": 50, "status": "passed", "message": "ok",
              "details": [], "measurements": {}} for i in ("seen", "secret")]
    result = {"lab": LAB, "student_id": "s", "score": 100, "max_score": 100, "blocked_points": 0, "items": items,
              "submission_sha256": ""}
    out = gradescope_results(result, {"secret"}, with_leaderboard=True, notes=["placed x"])
    jsonschema.validate(out, SCHEMA)
    assert [t["visibility"] for t in out["tests"]] == ["visible", "after_published"]
    assert "leaderboard" not in out and out["output"].endswith("- placed x")


def test_uploads_are_placed_by_path_and_ambiguous_names_are_not_guessed(tmp_path):
    pristine = tmp_path / "pristine"
    for rel in ("__init__.py", "engine/__init__.py", "engine/block_manager.py", "tests/test_x.py"):
        (pristine / rel).parent.mkdir(parents=True, exist_ok=True)
        (pristine / rel).write_text(f"# pristine {rel}\n")
    upload = tmp_path / "upload"
    for rel in ("repo/student_exercises/engine/block_manager.py", "repo/student_exercises/tests/conftest.py",
                "__init__.py", "notes.py", ".git/config"):
        (upload / rel).parent.mkdir(parents=True, exist_ok=True)
        (upload / rel).write_text(f"# mine {rel}\n")
    placed = place_upload(upload, pristine, tmp_path / "dest")
    package = tmp_path / "dest" / PACKAGE
    assert (package / "engine/block_manager.py").read_text().startswith("# mine")
    assert (package / "__init__.py").read_text().startswith("# pristine"), "two package files are called that"
    assert not (package / "tests").exists()
    notes = " ".join(placed.notes)
    assert "__init__.py (matches 2 package files" in notes and "notes.py (not a file of the release)" in notes
    assert "under student_exercises/tests/ ignored" in notes
