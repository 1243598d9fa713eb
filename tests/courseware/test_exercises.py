"""The exercise generator, bug zoo, release builder and self-check, tested in-process (fast).

The suites themselves (pass on reference, fail on stubs, catch the bug zoo)
are run in tests/courseware/test_lab_suites.py; installing a release, in tests/courseware/test_release.py.
"""
from __future__ import annotations

import importlib
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from courseware.bugzoo import MutantError, load_mutant, load_mutants
from inferlab.cli import main
from labkit.tree import LABS, PACKAGE, ROOT, filled_labs, generate, load_reference, rewrite_imports, splice, write_tree
from courseware.exercises import command, stale
from labkit.labs import all_labs
from labkit.regions import RegionError, parse_regions, render, stub_body
from courseware.release import make_release
from courseware.selfcheck import SuiteRun, score, score_table

SAMPLE = '''"""A module."""
from reference.engine.sequence import Sequence


def area(w, h):
    """Docstring stays."""
    # >>> EXERCISE lab9.area: Multiply the two sides.
    # HINT: one line.
    result = w * h
    return result
    # <<< EXERCISE lab9.area
'''


def test_exercises_check_passes_on_the_committed_tree(capsys):
    assert main(["exercises", "check"]) == 0, capsys.readouterr().out


def test_stub_keeps_markers_task_and_hints_and_raises_the_id():
    source = parse_regions(SAMPLE, "sample.py")
    [region] = source.regions
    assert (region.region_id, region.lab, region.task, region.hints) == ("lab9.area", "lab9", "Multiply the two sides.",
                                                                          ("one line.",))
    assert source.body(region) == "    result = w * h\n    return result\n"
    stubbed = rewrite_imports(render(source, stub_body))
    assert stubbed.splitlines()[6:10] == ["    # >>> EXERCISE lab9.area: Multiply the two sides.",
                                          "    # HINT: one line.",
                                          '    raise NotImplementedError("lab9.area")',
                                          "    # <<< EXERCISE lab9.area"]
    assert "from student_exercises.engine.sequence import Sequence" in stubbed
    namespace: dict = {}
    exec(compile(stubbed.replace("from student_exercises.engine.sequence import Sequence", ""), "s", "exec"),
         namespace)
    with pytest.raises(NotImplementedError, match="lab9.area"):
        namespace["area"](2, 3)
    assert parse_regions(stubbed).regions[0].region_id == "lab9.area"


@pytest.mark.parametrize("text, message", [
    ("def f():\n    # >>> EXERCISE lab1.x: t\n    return 1\n", "never closed"),
    ("def f():\n    # >>> EXERCISE lab1.x: t\n    # >>> EXERCISE lab1.y: t\n    return 1\n"
     "    # <<< EXERCISE lab1.y\n    # <<< EXERCISE lab1.x\n", "cannot nest"),
    ("def f():\n    # >>> EXERCISE lab1.x: t\n    return 1\n    # <<< EXERCISE lab1.z\n", "is open"),
    ("def f():\n    # >>> EXERCISE labX.x: t\n    return 1\n    # <<< EXERCISE labX.x\n", "malformed begin"),
    ("def f():\n    # >>> EXERCISE lab1.x: t\n    # HINT: h\n    # <<< EXERCISE lab1.x\n", "no code"),
    ("# >>> EXERCISE lab1.x: t\nX = 1\n# <<< EXERCISE lab1.x\n", "module level"),
    ("def f():\n    # >>> EXERCISE lab1.x: t\n  return 1\n    # <<< EXERCISE lab1.x\n", "indented less"),
    ("def f():\n    # <<< EXERCISE lab1.x\n", "without a begin"),
    ("def f():\n    # >>> EXERCISE lab1.x: t\n    return 1\n    # <<< EXERCISE lab1.x\n"
     "def g():\n    # >>> EXERCISE lab1.x: t\n    return 2\n    # <<< EXERCISE lab1.x\n", "already used"),
])
def test_malformed_markers_are_refused_with_file_and_line(text, message):
    with pytest.raises(RegionError, match=message) as info:
        parse_regions(text, "bad.py")
    assert "bad.py:" in str(info.value)


def test_reference_regions_cover_every_lab_and_sit_in_functions():
    tree = load_reference()
    labs = {r.lab for r in tree.regions}
    assert labs == set(LABS)
    assert len({r.region_id for r in tree.regions}) == len(tree.regions)


def test_stubbed_package_imports_wherever_the_reference_does():
    """Every module importable from reference/ is importable from the all-stubbed student_exercises/."""
    modules = [p.with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
               for p in (Path(rel) for rel in load_reference().files)]
    broken = []
    for module in modules:
        try:
            importlib.import_module(f"reference.{module}" if module != "__init__" else "reference")
        except ImportError:
            continue                       # e.g. Triton kernels on a machine without triton
        try:
            importlib.import_module(f"{PACKAGE}.{module}" if module != "__init__" else PACKAGE)
        except Exception as err:           # noqa: BLE001 - report any import failure
            broken.append(f"{module}: {err!r}")
    assert not broken, broken


def test_stale_detects_edits_removals_and_additions_and_build_fixes_them(tmp_path):
    root = tmp_path / "repo"
    for folder in ("reference", PACKAGE, "assignments"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    assert stale(root) == []
    (root / PACKAGE / "tests" / "test_lab9_extra.py").write_text("def test_x():\n    pass\n")
    metrics = root / "reference" / "metrics.py"
    metrics.write_text(metrics.read_text() + "\n# an edit\n")
    (root / "reference" / "extra_module.py").write_text("X = 1\n")
    (root / "reference" / "sampling_params.py").unlink()
    public = root / "assignments" / "lab2_block_manager" / "public" / "test_lab2_block_manager.py"
    public.write_text(public.read_text() + "\n# a new public test would go here\n")
    problems = stale(root)
    assert any("metrics.py (differs" in p for p in problems), problems
    assert any("extra_module.py (missing)" in p for p in problems), problems
    assert any("sampling_params.py (nothing generates" in p for p in problems), problems
    assert any("test_lab9_extra.py (nothing generates" in p for p in problems), problems
    assert any(f"test_lab2_block_manager.py (differs from its source: {public.relative_to(root).as_posix()})" in p
               for p in problems), problems
    assert command("check", root, Console(file=io.StringIO())) == 1
    command("build", root, Console(file=io.StringIO()))
    assert stale(root) == []
    assert not (root / PACKAGE / "sampling_params.py").exists()
    assert not (root / PACKAGE / "tests" / "test_lab9_extra.py").exists(), "the tests folder is generated whole"
    assert "a new public test would go here" in (root / PACKAGE / "tests" / "test_lab2_block_manager.py").read_text()


def test_splice_fills_regions_by_id(tmp_path):
    tree = load_reference()
    write_tree(tmp_path, filled_labs([]))
    package = tmp_path / PACKAGE
    lab2 = {r.region_id: tree.body(r.region_id) for r in tree.regions if r.lab == "lab2"}
    assert sorted(splice(package, lab2)) == sorted(lab2)
    expected = generate(tree, filled_labs(["lab2"]))
    for relpath, text in expected.items():
        assert (package / relpath).read_text() == text, relpath
    with pytest.raises(KeyError, match="lab7.nothing"):
        splice(package, {"lab7.nothing": "    pass\n"})


def test_list_names_every_region_and_its_tests():
    console = Console(record=True, width=400)
    assert command("list", ROOT, console) == 0
    text = console.export_text()
    for region in load_reference().regions:
        assert region.region_id in text
    assert "(none)" not in text


def test_every_mutant_loads_and_changes_its_regions():
    tree = load_reference()
    mutants = load_mutants()
    assert {m.lab for m in mutants} == set(LABS)
    for mutant in mutants:
        bodies = mutant.bodies(tree)
        assert bodies and all(body != tree.body(rid) for rid, body in bodies.items()), mutant.mutant_id
        generate(tree, mutant.choice(tree))          # still parses


@pytest.mark.parametrize("content, message", [
    ('"""x."""\nEDITS = {"lab2.deallocate": [("no such text", "y")]}\n', "occurs 0 times"),
    ('"""x."""\nEDITS = {"lab1.request_metrics": [("tpot", "y")]}\n', "may only edit lab2"),
    ('"""x."""\nEDITS = {"lab2.nothing": [("a", "b")]}\n', "no exercise region"),
    ('EDITS = {"lab2.deallocate": [("a", "b")]}\n', "one-line docstring"),
    ('"""x."""\nEDITS = dict(a=1)\n', "literal dict"),
])
def test_malformed_mutants_are_refused(tmp_path, content, message):
    path = tmp_path / "lab2_block_manager" / "bugzoo" / "m.py"
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(MutantError, match=message):
        load_mutant(path).bodies(load_reference())


def _bodies(path: Path) -> dict[str, str]:
    source = parse_regions(path.read_text(), str(path))
    return {r.region_id: source.body(r) for r in source.regions}


def test_release_holds_earlier_solutions_only_and_this_labs_tests(tmp_path):
    out = make_release("lab3", tmp_path / "rel")
    assert not (out / "reference").exists() and not (out / "bugzoo").exists()
    folder = out / "assignments" / "lab3_scheduler"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "rubric.json"], "only the public parts"
    assert not (out / "assignments" / "lab2_block_manager").exists()
    tests = sorted(p.name for p in (out / PACKAGE / "tests").glob("test_*.py"))
    assert tests and all(name.startswith("test_lab3_") for name in tests), tests
    tree = load_reference()
    bodies = {}
    for path in (out / PACKAGE).rglob("*.py"):
        if "tests" not in path.relative_to(out / PACKAGE).parts:
            bodies.update(_bodies(path))
    assert set(bodies) == {r.region_id for r in tree.regions}
    for region in tree.regions:
        want = tree.body(region.region_id) if region.lab in ("lab1", "lab2") else stub_body(region)
        assert rewrite_imports(bodies[region.region_id]) == rewrite_imports(want), region.region_id
    readme = (out / "README.md").read_text()
    assert "pytest student_exercises/tests -m lab3" in readme and "inferlab check lab3" in readme
    assert 'inferlab = "courseware.selfcheck:main"' in (out / "pyproject.toml").read_text()
    shipped = sorted(p.relative_to(out / "courseware").as_posix() for p in (out / "courseware").rglob("*.py"))
    assert shipped == sorted(["__init__.py", "engine.py", "oracle.py", "tiny_model.py", "selfcheck.py", "terminal.py",
                              "standins/__init__.py", "standins/model_runner.py"])   # lab 4's part only: a lab 3 release
    assert sorted(p.name for p in (out / "labkit").glob("*.py")) == sorted(p.name for p in (ROOT / "labkit").glob("*.py"))
    handout = (out / "assignments" / "lab3_scheduler" / "README.md").read_text()
    linked = set(re.findall(r"`((?:assignments|docs|student_exercises)/[\w./-]+\.(?:md|json|py))`", handout))
    assert linked and not [path for path in linked if not (out / path).is_file()], \
        f"the handout links files the release lacks: {sorted(p for p in linked if not (out / p).is_file())}"
    with pytest.raises(ValueError, match="not empty"):
        make_release("lab3", out)


def test_release_cli_and_unknown_lab(tmp_path, capsys):
    assert main(["release", "--lab", "lab1", "--out", str(tmp_path / "r1")]) == 0
    assert (tmp_path / "r1" / PACKAGE / "tests" / "test_lab1_metrics.py").is_file()
    with pytest.raises(SystemExit):
        main(["release", "--lab", "lab7", "--out", str(tmp_path / "r7")])


def _fake_run(outcomes: dict[str, tuple[str, int, bool]]) -> SuiteRun:
    tests = {f"t.py::{name}": {"name": name, "file": "t.py", "points": points, "labs": ["lab2"], "stretch": False,
                               "gpu": gpu, "covers": [], "outcome": outcome, "message": "needs CUDA", "duration": 0}
             for name, (outcome, points, gpu) in outcomes.items()}
    return SuiteRun(1, 0.0, "", {"tests": tests})


def test_score_never_counts_a_skip_or_a_missing_report_as_passed():
    run = _fake_run({"a": ("passed", 3, False), "b": ("failed", 2, False), "c": ("skipped", 4, True),
                     "d": (None, 1, False), "e": ("error", 5, False)})
    assert score(run) == (3, 11, 4)
    console = Console(record=True, width=200)
    console.print(score_table(run, "lab2", PACKAGE))
    text = console.export_text()
    assert "3/11" in text and "MISSING" in text and "SKIP (needs CUDA)" in text and "not graded here" in text


def test_check_command_scores_the_reference_fully():
    """`inferlab check lab2 --impl reference` in the course repository: every test passes."""
    proc = subprocess.run([sys.executable, "-m", "inferlab.cli", "check", "lab2", "--impl", "reference"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    total = [line for line in proc.stdout.splitlines() if "total" in line]
    assert total, proc.stdout
    earned, possible = total[0].split("│")[2].strip().split("/")
    assert earned == possible and int(possible) > 0, total


def test_lab_map_names_every_region_and_test_file():
    """docs/labs.md is the lab map: it must not fall behind the regions and suites it describes."""
    text = (ROOT / "docs" / "labs.md").read_text()
    missing = [r.region_id for r in load_reference().regions if f"`{r.region_id}`" not in text]
    missing += [p.name for lab in all_labs() for p in lab.public_tests() if p.name not in text]
    assert not missing, f"docs/labs.md does not mention {missing}"
