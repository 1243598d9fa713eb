"""A lab 2 student release builds, installs, fails on its stubs and passes once lab 2 is written.

The release is installed with pip (no dependencies: the engine's are already
here) into a target folder, and its tests are run against that *installed*
copy from outside the release folder, so a packaging mistake (a module left
out of the wheel, a wrong package list) fails here. Then lab 2's regions are
filled with the reference bodies, the release is installed again, and every
lab 2 test must pass; `inferlab check lab2`, run the way a student runs it,
must then report a full score.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.tree import PACKAGE, load_reference, splice
from courseware.release import make_release
from courseware.tiny_model import ensure_tiny_model


def _pip_install(release: Path, target: Path) -> None:
    """pip install the release into `target`; without build isolation when setuptools can build wheels alone."""
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(release)]
    try:
        major, minor = (int(x) for x in importlib.metadata.version("setuptools").split(".")[:2])
        if (major, minor) >= (70, 1):      # bdist_wheel is built in from 70.1: no download needed
            command.insert(4, "--no-build-isolation")
    except importlib.metadata.PackageNotFoundError:
        pass
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _env(site: Path, cache: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(site), "INFERLAB_CACHE": str(cache), "PYTHONDONTWRITEBYTECODE": "1",
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def _run_installed_tests(release: Path, site: Path, cache: Path, elsewhere: Path) -> dict:
    """Run the release's lab 2 tests against the installed package, from a folder outside the release.

    The tests are copied out first: inside the release they sit under the
    `student_exercises` package folder, and pytest imports that folder's
    `__init__.py` (a Package node), which would shadow the installed copy.
    """
    tests = elsewhere / "tests"
    shutil.rmtree(tests, ignore_errors=True)
    shutil.copytree(release / PACKAGE / "tests", tests)
    (elsewhere / "pytest.ini").write_text("[pytest]\n")
    results = elsewhere / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(tests), "-m", "lab2", "-q", "-p", "no:cacheprovider",
         "-p", "labkit.score_plugin", "--inferlab-results", str(results)],
        cwd=elsewhere, env=_env(site, cache), capture_output=True, text=True, timeout=300)
    assert results.is_file(), proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(results.read_text())
    assert not data["collection_errors"], data["collection_errors"]
    assert Path(data["package_origin"]).resolve().is_relative_to(site.resolve()), data["package_origin"]
    return data


@pytest.mark.slow
def test_lab2_release_installs_fails_on_stubs_and_passes_when_filled(tmp_path):
    cache = tmp_path / "cache"
    ensure_tiny_model(cache / "tiny-qwen3-seed0")
    release = make_release("lab2", tmp_path / "release")
    assert "docs/design.md" in (release / "student_exercises/tests/test_lab2_block_manager.py").read_text()
    assert (release / "docs/design.md").is_file(), "the public tests cite docs/design.md: the release must ship it"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    _pip_install(release, tmp_path / "site_stubs")
    stubs = _run_installed_tests(release, tmp_path / "site_stubs", cache, elsewhere)
    outcomes = {t["name"]: t["outcome"] for t in stubs["tests"].values()}
    assert outcomes and set(outcomes.values()) == {"failed"}, outcomes
    assert all("NotImplementedError: lab2." in t["message"] for t in stubs["tests"].values())

    tree = load_reference()
    splice(release / PACKAGE, {r.region_id: tree.body(r.region_id) for r in tree.regions if r.lab == "lab2"})
    _pip_install(release, tmp_path / "site_filled")
    filled = _run_installed_tests(release, tmp_path / "site_filled", cache, elsewhere)
    outcomes = {t["name"]: t["outcome"] for t in filled["tests"].values()}
    assert len(outcomes) == len(stubs["tests"]) and set(outcomes.values()) == {"passed"}, outcomes

    # The self-check as a student runs it: the installed `inferlab` command, in the release folder.
    script = tmp_path / "site_filled" / "bin" / "inferlab"
    assert script.is_file(), sorted(p.name for p in (tmp_path / "site_filled").iterdir())
    proc = subprocess.run([sys.executable, str(script), "check", "lab2"], cwd=release,
                          env=_env(tmp_path / "site_filled", cache), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    points = sum(t["points"] for t in filled["tests"].values())
    assert f"{points}/{points}" in proc.stdout, proc.stdout
    assert "90/90" in proc.stdout and "public part" in proc.stdout, proc.stdout

    # Helpers outside the regions are carried, an edit of existing code is listed (and not run): as the grader does.
    from tests.grading.test_grading_lab2 import edit_outside, with_helpers
    path = release / PACKAGE / "engine" / "block_manager.py"
    path.write_text(edit_outside(with_helpers(path.read_text())))
    proc = subprocess.run([sys.executable, str(script), "check", "lab2"], cwd=release,
                          env={**_env(tmp_path / "site_filled", cache), "COLUMNS": "200"}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{points}/{points}" in proc.stdout and "90/90" in proc.stdout, proc.stdout
    assert "block_manager.py" in proc.stdout and "num_free_blocks" in proc.stdout and "not run" in proc.stdout
