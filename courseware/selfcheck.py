"""`inferlab check labN`: run a lab's public tests the way the grader runs the student's code.

It runs in the course repository and in a student release (`inferlab check`,
courseware/student_cli.py). It reads the student's tree exactly as the grader
does (`labkit.student_code`: the lab's region bodies by id, definitions
added outside the regions carried, any other edit outside them listed and not
run), splices that into a pristine copy of the release, and runs the lab's
public suite there, in a child pytest process with `labkit.score_plugin`.
Scores come from the outcome file that plugin writes, never from the exit code
or the console text, and are reported twice: per test, and per rubric item on
the rubric's points (`labkit.scoring`). A skipped test (a GPU test on
a machine without CUDA) earns nothing and is listed as not graded here, so a
skip can never look like a pass.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from courseware.terminal import make_console
from labkit.additions import apply
from labkit.tree import PACKAGE, splice, write_package
from labkit.labs import exercise_labs, lab as registry_lab
from labkit.locate import region_locations
from labkit.manifest import MANIFEST, PRISTINE, read_manifest, sha256_file
from labkit.rubric import Rubric, load_rubric
from labkit.scoring import item_part, unchecked_item
from labkit.student_code import Extraction, read_student_code

TESTS = Path("student_exercises") / "tests"
MESSAGE_LINES = 8


@dataclass
class SuiteRun:
    """One pytest run of a lab's public suite: per-test results plus how the process ended."""

    returncode: int
    wall_s: float
    output: str
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def tests(self) -> dict[str, dict[str, Any]]:
        return self.results.get("tests", {})

    def outcomes(self) -> dict[str, str]:
        """nodeid -> passed / failed / error / skipped / missing (never reported)."""
        return {nodeid: t["outcome"] or "missing" for nodeid, t in self.tests.items()}


def find_project(start: Path | None = None) -> Path:
    """The folder holding student_exercises/tests (the release root, or the course repository)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / TESTS / "conftest.py").is_file():
            return folder
        manifest = read_manifest(folder)
        if manifest is not None:        # a release without public tests: a lab that writes no engine code (lab 5)
            raise FileNotFoundError(f"{manifest.lab}'s release has no public tests: {manifest.lab} is graded from "
                                    "what you hand in (its handout's 评分方式 says how), so there is nothing to "
                                    "self-check here")
    raise FileNotFoundError(f"no {TESTS}/ here or above {here}: run this from your lab folder")


# Seconds a public test's setup or call may run (labkit/score_plugin.py): the grader's shortest item deadline,
# far above what the reference's public tests take (docs/labs.md, "The self-check's time limit").
TEST_TIME_LIMIT_S = 60


def pytest_command(tests_dir: Path, lab: str, results: Path, impl: str = "student",
                   extra: Sequence[str] = ()) -> list[str]:
    return [sys.executable, "-m", "pytest", str(tests_dir), "-m", lab, "--impl", impl, "-q",
            "-p", "no:cacheprovider", "-p", "labkit.score_plugin", "--inferlab-results", str(results),
            "--inferlab-test-timeout", str(TEST_TIME_LIMIT_S), *extra]


def run_suite(project: Path, lab: str, impl: str = "student", extra: Sequence[str] = (),
              env: dict[str, str] | None = None, timeout: float | None = None) -> SuiteRun:
    """Run `lab`'s public tests under `project` in a child process and read back every outcome."""
    if env is None:
        # Third-party pytest plugins are not loaded: they can slow a run down by seconds, or change it.
        env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    with tempfile.TemporaryDirectory(prefix="inferlab-check-") as tmp:
        results = Path(tmp) / "results.json"
        started = time.perf_counter()
        try:
            proc = subprocess.run(pytest_command(project / TESTS, lab, results, impl, extra), cwd=project,
                                  env=env, capture_output=True, text=True, timeout=timeout)
            returncode, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as err:
            returncode = -1
            output = f"timed out after {timeout} s\n{(err.stdout or b'')!r}"
        wall = time.perf_counter() - started
        data = json.loads(results.read_text(encoding="utf-8")) if results.is_file() else {}
    return SuiteRun(returncode, wall, output, data)


RESULT_STYLE = {"passed": ("PASS", "green"), "failed": ("FAIL", "red"), "error": ("ERROR", "red"),
                "missing": ("MISSING", "red"), "skipped": ("SKIP", "yellow")}


def score(run: SuiteRun) -> tuple[int, int, int]:
    """(earned, possible, not graded here): skipped tests are not graded, never earned."""
    earned = possible = ungraded = 0
    for test in run.tests.values():
        outcome = test["outcome"] or "missing"
        if outcome == "skipped":
            ungraded += test["points"]
            continue
        possible += test["points"]
        earned += test["points"] if outcome == "passed" else 0
    return earned, possible, ungraded


def score_table(run: SuiteRun, lab: str, package: str) -> Table:
    earned, possible, ungraded = score(run)
    table = Table(title=f"{lab} self-check ({package})", caption_justify="left")
    table.add_column("test", overflow="fold")
    table.add_column("points", justify="right", no_wrap=True)
    table.add_column("result", no_wrap=True)
    for test in sorted(run.tests.values(), key=lambda t: (t["file"], t["stretch"])):
        outcome = test["outcome"] or "missing"
        label, style = RESULT_STYLE.get(outcome, (outcome.upper(), "red"))
        if outcome == "skipped":
            label = f"SKIP ({test['message'] or 'skipped'})"
        tags = [tag for tag in ("stretch", "gpu") if test[tag]]
        name = escape(test["name"]) + (f" [dim]({', '.join(tags)})[/dim]" if tags else "")
        got = test["points"] if outcome == "passed" else 0
        table.add_row(name, f"{got}/{test['points']}", f"[{style}]{escape(label)}[/{style}]")
    table.add_section()
    table.add_row("[bold]total[/bold]", f"[bold]{earned}/{possible}[/bold]", "")
    if ungraded:
        table.caption = f"{ungraded} points of skipped tests (e.g. GPU tests without CUDA) are not graded here."
    return table


def _gist(message: str) -> str:
    """The part of a failure report a student needs first: pytest's `E` lines, else the message itself."""
    lines = [line.rstrip() for line in message.splitlines() if line.strip()]
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    chosen = errors or lines or ["(no report: the test never ran to the end)"]
    return "\n    ".join(chosen[:MESSAGE_LINES])


def _failure_notes(run: SuiteRun, locate: Callable[[str], list[str]] | None = None) -> list[str]:
    """One note per distinct failure, naming every test that failed that way.

    `locate` maps a report's frames to the student's own lines (`labkit.locate`): a failure raised inside a
    region then says where, in the student's file, rather than in the temporary copy that ran.
    """
    groups: dict[str, list[str]] = {}
    for test in run.tests.values():
        if (test["outcome"] or "missing") in ("failed", "error", "missing"):
            gist = _gist(test["message"])
            places = locate(test["message"]) if locate else []
            if places:
                gist += f"\n    at {places[-1]}"      # the innermost frame in a region: where it was raised
            groups.setdefault(gist, []).append(test["name"])
    notes = []
    for gist, names in groups.items():
        who = names[0] if len(names) == 1 else f"{names[0]} and {len(names) - 1} more"
        notes.append(f"{who}:\n    {gist}")
    return notes


def package_texts(package: Path) -> dict[str, str]:
    """Module path (inside the package) -> text, of every module of a package folder."""
    return {p.relative_to(package).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(package.rglob("*.py")) if "__pycache__" not in p.parts}


def given_package(project: Path, lab: str) -> dict[str, str]:
    """What the student started from: the release's pristine copy, or (course repository) the release generated."""
    pristine = project / PRISTINE / PACKAGE
    if pristine.is_dir():
        return package_texts(pristine)
    if (project / "reference").is_dir():
        from labkit.tree import load_reference, public_suite, release_package
        return release_package(load_reference(project), lab) | public_suite(project)
    raise FileNotFoundError(f"no pristine copy of the release ({PRISTINE}/) under {project}: "
                            "it ships with the release; download the release again")


RELEASE_TOOLS = ("courseware", "labkit")    # the release's own packages besides the engine


def copy_tools(project: Path, dest: Path) -> list[str]:
    """The release's tools (with its manifest) beside the spliced package; which of them differ from the release.

    The public tests build their engines through `courseware.engine`, which in
    a release must come from the same tree as the package it runs
    (courseware/release_root.py), so the copy carries the tools too. The
    grader runs none of a student's tools, so a changed one is worth a note.
    """
    manifest = read_manifest(project)
    if manifest is None:
        return []           # the course repository: its tools are installed, nothing to copy
    changed = []
    for name in RELEASE_TOOLS:
        for path in sorted((project / name).rglob("*")):
            rel = path.relative_to(project).as_posix()
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            if rel != MANIFEST.as_posix() and manifest.files.get(rel) != sha256_file(path):
                changed.append(rel)
    return changed


def spliced_copy(project: Path, lab: str, dest: Path) -> Extraction:
    """A pristine copy of the release under `dest` holding the student's code, read as the grader reads it."""
    given = given_package(project, lab)
    code = read_student_code(project / PACKAGE, given, lab)
    code.notes += [f"{rel} differs from the release you were given: the self-check runs your version, "
                   "the grader never runs it" for rel in copy_tools(project, dest)]
    package = dest / PACKAGE
    write_package(given, package)
    if code.bodies:
        splice(package, code.bodies)
    for relpath, added in code.additions.items():
        path = package / relpath
        path.write_text(apply(path.read_text(encoding="utf-8"), added), encoding="utf-8")
    return code


def region_notes(code: Extraction) -> list[str]:
    """What the student should know about how their tree was read, in the grader's words."""
    notes = [f"{r.region_id}: {r.status}" + (f" ({r.message})" if r.message else "")
             for r in code.regions if r.status in ("missing", "broken")]
    notes += [edit.describe() + (f"\n      {edit.diff.replace(chr(10), chr(10) + '      ')}" if edit.diff else "")
              for edit in code.outside_edits]
    return notes + code.notes


def rubric_table(rubric: Rubric, tests: dict[str, dict[str, Any]]) -> Table:
    """Every rubric item: its public tests, the points they secure here, and what only the grader checks."""
    table = Table(title=f"{rubric.lab}: the public part of the grade, and what is not checked here",
                  caption_justify="left")
    table.add_column("rubric item", overflow="fold")
    table.add_column("public tests passed", justify="right", no_wrap=True)
    table.add_column("secured here", justify="right", no_wrap=True)
    table.add_column("not checked here", overflow="fold")
    secured = possible = 0
    unchecked: dict[str, int] = {}
    for item in rubric.items:
        part = item_part(item, tests)
        name = f"{item.id}: {escape(item.title)}"
        if part is None:
            why = unchecked_item(item)
            table.add_row(name, "-", f"-/{item.points}", f"{item.points} points: {escape(why)}")
            unchecked[why.split(":")[0]] = unchecked.get(why.split(":")[0], 0) + item.points
            continue
        ran = f"{part.passed}/{part.total}" + (f" ({part.skipped} skipped)" if part.skipped else "")
        possible += item.points
        secured += part.earned
        if part.earned:
            why = "hidden tests of the same behaviour, on other inputs"
        else:
            why = f"{item.points} points: {part.not_checked}"
            reason = "GPU tests without CUDA" if part.gpu and part.skipped else "items whose public tests fail"
            unchecked[reason] = unchecked.get(reason, 0) + item.points
        table.add_row(name, ran, f"{part.earned}/{item.points}", escape(why))
    table.add_section()
    table.add_row("[bold]public part[/bold]", "", f"[bold]{secured}/{possible}[/bold]", "")
    at_stake = sum(unchecked.values())
    table.caption = (
        f"Secured here: the points of every item whose public tests all pass ({secured} of {rubric.total} points). "
        f"Not checked here: {at_stake} points"
        + (" (" + ", ".join(f"{why} {points}" for why, points in unchecked.items()) + ")" if unchecked else "")
        + ". The grader scores every item again from hidden tests of the same behaviour on other inputs, and "
          "gives an item part of its points in proportion to its hidden tests passed.")
    return table


def check(lab: str, impl: str = "student", console: Console | None = None, project: Path | None = None,
          extra: Sequence[str] = ()) -> int:
    """Run and score one lab; exit status 0 only when every graded test passed.

    `extra`: more pytest arguments (the project's own tests select a few tests with `-k`; the score is then
    that of the selected tests only).
    """
    project = project or find_project()
    labs = exercise_labs(project)
    if lab not in labs:
        raise ValueError(f"unknown lab {lab!r}; this tree has public tests for: {', '.join(labs) or 'none'}")
    console = console or make_console()
    package = "reference" if impl == "reference" else "student_exercises"
    notes: list[str] = []
    locate = None
    with tempfile.TemporaryDirectory(prefix="inferlab-selfcheck-") as tmp:
        if impl == "reference":
            run = run_suite(project, lab, impl, extra)
        else:
            notes = region_notes(spliced_copy(project, lab, Path(tmp)))
            run = run_suite(Path(tmp), lab, impl, extra)
            ran = package_texts(Path(tmp) / PACKAGE)

            def locate(text: str) -> list[str]:
                return region_locations(text, ran, project / PACKAGE)
    if notes:
        console.print(f"[bold]How your tree was read[/bold] (as the grader reads it):")
        for note in notes:
            console.print("  " + escape(note), soft_wrap=True)
    errors = run.results.get("collection_errors") or []
    if not run.results or errors or not run.tests:
        console.print(f"[bold red]the {lab} tests could not be collected[/bold red] (pytest exit {run.returncode}):")
        console.print(escape("\n".join(errors) or run.output[-3000:]))
        return 1
    console.print(score_table(run, lab, package))
    rubric_file = registry_lab(lab, project).rubric
    if rubric_file.is_file():
        console.print(rubric_table(load_rubric(lab, rubric_file), run.tests))
    notes = _failure_notes(run, locate)
    if notes:
        console.print(f"\n[bold]What went wrong[/bold] (details: pytest {TESTS.as_posix()} -m {lab}):")
        for note in notes:
            console.print(escape(note))
    earned, possible, _ = score(run)
    return 0 if earned == possible else 1
