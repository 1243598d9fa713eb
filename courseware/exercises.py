"""`inferlab exercises build | check | list`: the student copy of the reference engine.

`student_exercises/` mirrors every module of `reference/` with each exercise
region's body replaced by `raise NotImplementedError("<id>")` (markers, tasks
and hints kept) and `reference.` imports renamed. It is generated, committed,
and checked for staleness in CI, so the exercises can never drift from the
engine they were cut out of.

`student_exercises/tests/` is generated too: the public suites are written
in each lab's folder (`assignments/labN_<topic>/public/`, fixtures shared by
all of them in `assignments/shared/public/`) and copied here, one flat folder
with one conftest.py, which is what a student runs.

The same generator, with some labs "filled" (their reference bodies kept),
makes the tree a student gets for a later lab (`inferlab release`), and, with
one region body patched, each bug-zoo mutant.
"""
from __future__ import annotations

import ast
from pathlib import Path

from labkit.labs import ROOT, all_labs
from labkit.tree import PACKAGE, REFERENCE, generated_paths, generate, load_reference, public_suite, write_package


def student_package(root: Path = ROOT) -> dict[str, str]:
    """The whole committed `student_exercises/`: every region stubbed, plus the public suites."""
    return generate(load_reference(root)) | public_suite(root)


def build(root: Path = ROOT) -> list[str]:
    """Regenerate `student_exercises/` with every region stubbed; returns the modules rewritten."""
    return write_package(student_package(root), root / PACKAGE)


def stale(root: Path = ROOT) -> list[str]:
    """Generated modules that differ from what `build` would write now (missing, changed, or extra)."""
    expected = student_package(root)
    package_dir = root / PACKAGE
    problems = []
    for relpath, text in expected.items():
        path = package_dir / relpath
        if not path.is_file():
            problems.append(f"{PACKAGE}/{relpath} (missing)")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{PACKAGE}/{relpath} (differs from its source: {text.split(' ', 4)[3]})")
    for relpath in sorted(generated_paths(package_dir) - set(expected)):
        problems.append(f"{PACKAGE}/{relpath} (nothing generates it any more)")
    return problems


# -- listing --------------------------------------------------------------------------------------

def _covers_of(decorators: list[ast.expr]) -> list[str]:
    """Region ids named by `pytest.mark.covers(...)` among decorator (or pytestmark) expressions."""
    ids = []
    for node in decorators:
        for call in ast.walk(node):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "covers"):
                ids += [arg.value for arg in call.args if isinstance(arg, ast.Constant)]
    return ids


def covering_tests(root: Path = ROOT) -> dict[str, list[str]]:
    """Region id -> public tests that declare they cover it (`@pytest.mark.covers`), read statically.

    CI checks these declarations against what each test really executes
    (tests/courseware/test_lab_suites.py), so the listing cannot claim coverage that is not there.
    """
    found: dict[str, list[str]] = {}
    for path in (path for lab in all_labs(root) for path in lab.public_tests()):
        module = ast.parse(path.read_text(encoding="utf-8"))
        module_marks = [node.value for node in module.body if isinstance(node, ast.Assign)
                        and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)]
        shared = _covers_of(module_marks)
        for node in module.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                for region_id in dict.fromkeys(shared + _covers_of(node.decorator_list)):
                    found.setdefault(region_id, []).append(f"{path.stem}::{node.name}")
    return found


def region_table(root: Path = ROOT):
    """A Rich table of every region: lab, id, file, lines, covering public tests."""
    from rich.table import Table
    tree = load_reference(root)
    covers = covering_tests(root)
    table = Table(title="Exercise regions")
    for header in ("lab", "region", "file", "lines", "public tests"):
        table.add_column(header, overflow="fold")
    for region in sorted(tree.regions, key=lambda r: (r.lab, r.path, r.begin_line)):
        tests = covers.get(region.region_id, [])
        table.add_row(region.lab, region.region_id, region.path, f"{region.begin_line}-{region.end_line}",
                      "\n".join(tests) if tests else "[red](none)[/red]")
    return table


def command(action: str, root: Path = ROOT, console=None) -> int:
    """`inferlab exercises build | check | list`."""
    from rich.console import Console
    from rich.markup import escape
    from courseware.terminal import make_console
    console = console or make_console()
    if action == "build":
        changed = build(root)
        console.print(f"{PACKAGE}/: {len(changed)} module(s) written or removed"
                      + (": " + ", ".join(changed) if changed else " (already up to date)"))
        return 0
    if action == "check":
        problems = stale(root)
        if problems:
            console.print(f"[bold red]{PACKAGE}/ is stale[/bold red] (run `inferlab exercises build`):")
            for problem in problems:
                console.print(f"  {escape(problem)}", soft_wrap=True)
            return 1
        console.print(f"{PACKAGE}/ matches {REFERENCE}/ ({len(load_reference(root).regions)} regions)")
        return 0
    if action == "list":
        console.print(region_table(root))
        return 0
    raise ValueError(f"unknown exercises action {action!r}")
