"""A release's tutorials run on the release's own engine (courseware/release_tutorials.py).

- every tutorial a lab's handout names (T01..T09) is in its release or listed in the release README with
  the reason it is left out, and the README's tutorial paths exist;
- no shipped notebook uses the name `reference` any more, and every import its code cells make resolves
  inside the release, with `reference` made unimportable (this machine has the course installed, so a
  notebook that still reached for the solution would otherwise pass);
- in a lab 1 release with lab 1 written, Tutorial 02 (the lifecycle, lab 1's tutorial, on all three
  stand-ins), and in a lab 2 release with lab 2 written, Tutorial 05 (prefix caching), run top to bottom
  on the release's engine, the way `inferlab build` runs a notebook (their asserts check their claims).
  The other notebooks were run the same way once by hand (docs/labs.md has the command); executing all of
  them here would take minutes.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from courseware.build import execute_notebook
from labkit.tree import LABS, PACKAGE, load_reference, splice
from labkit.labs import ROOT, lab_folder, release_labs
from courseware.release import make_release
from courseware.release_tutorials import leftover_references, tutorial_number

GUARD = ('import sys\nsys.modules["reference"] = None   # a release has no reference package: importing it fails\n'
         'import {package}\nassert {package}.__file__.startswith({root!r}), {package}.__file__\n')


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """Every lab's release, as shipped (tutorials need no region written to be checked statically)."""
    base = tmp_path_factory.mktemp("releases")
    return {lab: make_release(lab, base / lab) for lab in release_labs()}


def shipped(release: Path) -> list[Path]:
    return sorted((release / "tutorials").glob("Tutorial_*.ipynb"))


def code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("lab", release_labs())
def test_every_tutorial_the_handout_names_is_shipped_or_explained(releases, lab):
    release = releases[lab]
    readme = (release / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"\bT(\d\d)\b", (lab_folder(lab) / "README.md").read_text(encoding="utf-8")))
    numbers = {tutorial_number(p): p.name for p in sorted((ROOT / "tutorials").glob("Tutorial_*.ipynb"))}
    here = {tutorial_number(p) for p in shipped(release)}
    for number in sorted(named):
        name = numbers[number]
        if number in here:
            assert f"`tutorials/{name}`" in readme, f"{lab}: the README does not list {name}"
        else:
            assert re.search(rf"`{re.escape(name)}`: \S.+", readme), f"{lab}: {name} is neither shipped nor explained"
    for path in re.findall(r"`(tutorials/[\w.]+\.ipynb)`", readme):
        assert (release / path).is_file(), f"{lab}: the README links {path}, which the release lacks"
    assert "Tutorial_01_intro.ipynb" in {p.name for p in shipped(release)}, "every release has the intro"


@pytest.mark.parametrize("lab", release_labs())
def test_shipped_tutorials_import_only_what_the_release_has(releases, lab, tmp_path):
    release = releases[lab]
    imports: list[str] = []
    for path in shipped(release):
        nb = json.loads(path.read_text(encoding="utf-8"))
        assert not leftover_references(nb), f"{path.name}: {leftover_references(nb)}"
        for source in code_cells(path):
            tree = ast.parse("\n".join("" if line.lstrip().startswith(("%", "!")) else line
                                       for line in source.splitlines()))
            imports += [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert any(PACKAGE in line for line in imports), imports
    script = tmp_path / "imports.py"
    script.write_text(GUARD.format(package=PACKAGE, root=str(release)) + "\n".join(dict.fromkeys(imports)) + "\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=release / "tutorials", capture_output=True, text=True,
                          env={"PYTHONPATH": str(release), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("lab, notebook", [("lab1", "Tutorial_02_lifecycle.ipynb"),
                                           ("lab2", "Tutorial_05_prefix_caching.ipynb")])
def test_release_runs_its_labs_tutorial(tmp_path, monkeypatch, tiny_model_dir, lab, notebook):
    """Tutorial 02 needs preemptions (its timeline, the recompute exercise) and batched decode steps (its
    step time against batch size), so in a lab 1 release it runs only if the stand-ins preempt and batch."""
    release = make_release(lab, tmp_path / "release")
    tree = load_reference()
    splice(release / PACKAGE, {r.region_id: tree.body(r.region_id) for r in tree.regions if r.lab == lab})
    path = release / "tutorials" / notebook
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(GUARD.format(package=PACKAGE, root=str(release))))
    guarded = path.with_name("guarded_" + path.name)          # same folder: the kernel runs where the notebook is
    nbformat.write(nb, guarded)
    monkeypatch.setenv("PYTHONPATH", str(release))
    monkeypatch.setenv("INFERLAB_MODEL", tiny_model_dir)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    executed, seconds, error = execute_notebook(guarded, timeout=300)
    assert error is None, error[-3000:]
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "every cell ran"
    print(f"{path.name} in a {lab} release: {seconds:.0f} s")
