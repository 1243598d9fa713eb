"""docs/workflows.md's "One home for each rule" names tests that exist.

The table is where a TA looks up which test holds a rule once the project's copies are gone; a test renamed
or dropped would leave it pointing at nothing. `labN::name` is a test function of
`assignments/labN_*/public/` (a `*` in the name matches at least one), `tests/...py::name` one of that file,
and a bare `tests/...py` a file.
"""
from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

from labkit.labs import all_labs

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### One home for each rule"


def _table() -> str:
    """The rows of the section's table (its prose names folders, not tests)."""
    text = (ROOT / "docs" / "workflows.md").read_text(encoding="utf-8")
    assert HEADING in text, f"docs/workflows.md has no section {HEADING!r}"
    section = text.split(HEADING, 1)[1]
    section = re.split(r"\n#{1,3} ", section, maxsplit=1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def _functions(path: Path) -> set[str]:
    return {node.name for node in ast.parse(path.read_text(encoding="utf-8")).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def references(table: str) -> list[str]:
    return [ref for span in re.findall(r"`([^`]+)`", table) for ref in [span.strip()]
            if re.match(r"lab\d+::", ref) or ref.startswith("tests/")]


def missing(refs: list[str]) -> list[str]:
    public = {lab.lab_id: set().union(*(_functions(f) for f in lab.public_tests())) for lab in all_labs()
              if lab.public_tests()}
    problems = []
    for ref in refs:
        where, _, name = ref.partition("::")
        if where in public:
            if not fnmatch.filter(public[where], name):
                problems.append(f"{ref}: no such test in assignments/{where}_*/public/")
        elif not (ROOT / where).is_file():
            problems.append(f"{ref}: no file {where}")
        elif name and name not in _functions(ROOT / where):
            problems.append(f"{ref}: {where} defines no {name}")
    return problems


def test_every_test_the_table_names_exists():
    refs = references(_table())
    assert len(refs) >= 30, f"the table names only {len(refs)} tests: was it read right? {refs}"
    assert {ref.split("::")[0] for ref in refs if ref.startswith("lab")} >= {"lab1", "lab2", "lab3", "lab4"}
    problems = missing(refs)
    assert not problems, "docs/workflows.md names tests that do not exist:\n  " + "\n  ".join(problems)


def test_the_check_finds_a_name_that_is_wrong():
    """The check above can fail: a misspelt public test, project test or file is reported."""
    assert missing(["lab2::test_reused_block_loses_its_old_hash", "lab3::test_admission_*"]) == []
    assert len(missing(["lab2::test_no_such_rule", "lab3::test_nothing_*",
                        "tests/engine/test_block_manager.py::test_no_such_rule",
                        "tests/engine/test_no_such_file.py"])) == 4
