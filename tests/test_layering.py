"""One-way dependencies: reference <- labkit <- courseware <- grading <- inferlab (the CLI); nothing imports the CLI.

Read statically (every import statement, including those inside functions), so
a lazy import cannot hide a cycle. The project's own tests may drive the CLI
(`inferlab.cli.main`), as a user would; no shipped module may.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from labkit.labs import ROOT

LAYERS = ["reference", "labkit", "courseware", "grading", "inferlab"]
# Folders of code that students, instructors or TAs run; none of them may import the CLI package.
OTHER_CODE = ["student_exercises", "slides_code", "tutorials", "scripts", "assignments"]


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every absolute import in a module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def modules_under(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_the_layers_below_it(layer):
    above = set(LAYERS[LAYERS.index(layer) + 1:])
    wrong = {f"{path.relative_to(ROOT)} imports {name}" for path in modules_under(layer)
             for name in imported_packages(path) & above}
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("folder", OTHER_CODE)
def test_no_other_code_imports_the_cli_package(folder):
    wrong = [str(path.relative_to(ROOT)) for path in modules_under(folder) if "inferlab" in imported_packages(path)]
    assert not wrong, f"these import the CLI package `inferlab`; import from courseware/grading instead: {wrong}"


def test_the_check_sees_a_violation(tmp_path):
    """The checker itself: an upward import inside a function is found."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from grading.cli import add_parsers\n    import inferlab.cli\n")
    assert imported_packages(module) == {"grading", "inferlab"}
