"""One statement of what runs of a student's code, included by every handout and every release README.

assignments/shared/what_is_graded.md is the statement (labkit/handout.py). Checked here:

- each lab with exercise regions includes it in its handout's 评分方式 section, and says nothing of its
  own there about code outside the regions (before, three texts said three different things);
- the statement says what the code does: each row of its table names an example, and the same change,
  made to the lab 2 release's block manager, is read by `labkit.student_code` (the grader's and the
  self-check's reading) as the row says: carried, not run, or ignored with the release's code running;
- its example of a name clash is reported naming both definitions.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable

import pytest

from courseware.release_code import release_package
from labkit.handout import INCLUDE, WHAT_IS_GRADED, include_line, render, what_is_graded
from labkit.labs import exercise_labs, lab_folder
from labkit.manifest import PRISTINE
from labkit.student_code import read_student_code
from labkit.tree import PACKAGE, load_reference, write_package

BM = "engine/block_manager.py"
# row of the statement's table (found by this example) -> the change a student makes to the lab 2 release
CASES: dict[str, Callable[[dict[str, str]], None]] = {
    "`import math`": lambda files: _edit(files, BM, "import numpy as np\n", "import numpy as np\nimport math\n"),
    "`def ceil_div(a, b)`": lambda files: _edit(
        files, BM, "\n\nclass BlockManager", "\n\ndef ceil_div(a, b):\n    return -(-a // b)\n\n\nclass BlockManager"),
    "`MAX_HITS = 8`": lambda files: _edit(files, BM, "\n\nclass BlockManager", "\n\nMAX_HITS = 8\n\n\nclass BlockManager"),
    "`def _blocks_needed(self, seq)`": lambda files: _edit(
        files, BM, "    @property\n    def num_free_blocks(self)",
        "    def _blocks_needed(self, seq):\n        return -(-len(seq) // self.block_size)\n\n"
        "    @property\n    def num_free_blocks(self)"),
    "改了 `def num_free_blocks` 的 body": lambda files: _edit(
        files, BM, "    def num_free_blocks(self) -> int:\n", "    def num_free_blocks(self) -> int:\n        pass\n"),
    "删了 `def num_free_blocks`": lambda files: _drop_method(files, BM, "num_free_blocks"),
    "`math.isclose = lambda *a, **k: True`": lambda files: _edit(
        files, BM, "import numpy as np\n", "import numpy as np\nimport math\nmath.isclose = lambda *a, **k: True\n"),
    "自己新建的 `helpers.py`": lambda files: files.__setitem__(
        "engine/helpers.py", "def ceil_div(a, b):\n    return -(-a // b)\n"),
}
VERDICTS = {"带上": "carried", "不运行": "not run", "忽略": "ignored"}


def _edit(files: dict[str, str], path: str, old: str, new: str) -> None:
    assert files[path].count(old) == 1, f"{old!r} is not once in {path}: update the case"
    files[path] = files[path].replace(old, new)


def _drop_method(files: dict[str, str], path: str, name: str) -> None:
    """`name` deleted from its class, decorators and all."""
    lines = files[path].splitlines(keepends=True)
    method = next(node for node in ast.walk(ast.parse(files[path]))
                  if isinstance(node, ast.FunctionDef) and node.name == name)
    first = min([method.lineno, *(d.lineno for d in method.decorator_list)])
    files[path] = "".join(lines[:first - 1] + lines[method.end_lineno:])


@pytest.fixture(scope="module")
def given():
    return release_package(load_reference(), "lab2")


def verdict(given: dict[str, str], change: Callable, tmp_path) -> str:
    """How the grader's reading treats one change: carried, not run, or ignored (the release's code runs)."""
    files = dict(given)
    change(files)
    write_package(files, tmp_path / PACKAGE)
    out = read_student_code(tmp_path / PACKAGE, given, "lab2")
    carried = [a for added in out.additions.values() for a in added]
    assert len(carried) + len(out.outside_edits) >= 1, "the change was not seen at all"
    if out.outside_edits:
        runs = {edit.runs.split(":")[0] for edit in out.outside_edits}
        assert len(runs) == 1, out.outside_edits
        return runs.pop()
    return "carried"


def table_rows(statement: str) -> list[str]:
    return [line for line in statement.splitlines() if line.startswith("| ") and "---" not in line][1:]


@pytest.mark.parametrize("example", sorted(CASES))
def test_each_row_of_the_statement_is_what_the_grader_does(given, tmp_path, example):
    rows = [row for row in table_rows(what_is_graded()) if example in row]
    assert len(rows) == 1, f"no single row of {WHAT_IS_GRADED} shows {example}"
    said = rows[0].rstrip(" |").rsplit("|", 1)[1].strip()
    stated = next((meaning for word, meaning in VERDICTS.items() if said.startswith(word)), None)
    assert stated is not None, f"{example}: the verdict {said!r} starts with none of {sorted(VERDICTS)}"
    assert verdict(given, CASES[example], tmp_path) == stated, f"{example}: the statement says {said!r}"


def test_every_row_of_the_statement_is_checked():
    examples = [row for row in table_rows(what_is_graded())]
    unchecked = [row for row in examples if not any(example in row for example in CASES)]
    assert not unchecked, f"rows with no case here: {unchecked}"


def test_the_name_clash_the_statement_describes_is_reported_naming_both(given, tmp_path):
    assert "`_lookup`" in what_is_graded() and "self._lookup = None" in what_is_graded()
    files = dict(given)
    _edit(files, BM, "    @property\n    def num_free_blocks(self)",
          "    def _lookup(self, seq):\n        return []\n\n    @property\n    def num_free_blocks(self)")
    write_package(files, tmp_path / PACKAGE)
    out = read_student_code(tmp_path / PACKAGE, given, "lab2")
    assert [a.name for a in out.additions[BM]] == ["def BlockManager._lookup"], "still carried"
    clash = [note for note in out.notes if "_lookup" in note]
    assert len(clash) == 1 and "BlockManager.__init__" in clash[0] and "self._lookup" in clash[0], out.notes
    line = next(i for i, text in enumerate(files[BM].splitlines(), 1) if "def _lookup" in text)
    assert clash[0].startswith(f"{PACKAGE}/{BM}:{line}: "), clash[0]


def test_a_module_level_helper_that_rebinds_an_import_is_reported(given, tmp_path):
    files = dict(given)
    _edit(files, BM, "\n\nclass BlockManager", "\n\ndef OrderedDict():\n    return {}\n\n\nclass BlockManager")
    write_package(files, tmp_path / PACKAGE)
    out = read_student_code(tmp_path / PACKAGE, given, "lab2")
    clash = [note for note in out.notes if "OrderedDict" in note]
    assert len(clash) == 1 and "from collections import OrderedDict" in clash[0], out.notes


def test_a_helper_with_a_fresh_name_is_no_clash(given, tmp_path):
    files = dict(given)
    CASES["`def _blocks_needed(self, seq)`"](files)
    write_package(files, tmp_path / PACKAGE)
    assert read_student_code(tmp_path / PACKAGE, given, "lab2").notes == []


@pytest.mark.parametrize("lab", exercise_labs())
def test_each_handout_includes_the_statement_and_says_nothing_else_about_it(lab):
    raw = (lab_folder(lab) / "README.md").read_text(encoding="utf-8")
    grading = raw.split("\n## 评分方式", 1)[1].split("\n## ", 1)[0]
    assert include_line() in grading, f"{lab}: the 评分方式 section does not include {WHAT_IS_GRADED}"
    assert [m["path"] for m in INCLUDE.finditer(raw)] == [WHAT_IS_GRADED.as_posix()]
    own = grading.replace(include_line(), "")
    stale = re.findall(r"[^。\n]*(?:region ?之?外|不存在|not seen)[^。\n]*", own)
    assert not stale, f"{lab}: the handout speaks about code outside the regions itself: {stale}"
    assert what_is_graded() in render(raw)


def test_a_release_carries_the_statement_in_its_handout_and_readme(tmp_path):
    from courseware.release import make_release
    release = make_release("lab3", tmp_path / "release")
    handout = (release / "assignments" / "lab3_scheduler" / "README.md").read_text(encoding="utf-8")
    readme = (release / "README.md").read_text(encoding="utf-8")
    assert what_is_graded() in handout and not INCLUDE.search(handout)
    assert what_is_graded() in readme
    assert (release / PRISTINE / PACKAGE).is_dir(), "the statement cites the release's pristine copy"


def test_a_tree_made_from_an_older_release_is_told_only_of_its_own_edits(given, tmp_path):
    """The statement's last paragraph: a student's release that differs from the grader's outside the regions
    (an older one: here it lacked `num_used_blocks` and had `num_free_blocks` otherwise) gets notes about the
    student's own edits only, and nothing the release's code runs for is called "not run"."""
    older = dict(given)
    _drop_method(older, BM, "num_used_blocks")
    _edit(older, BM, "        return len(self.free_block_ids)\n", "        return len(list(self.free_block_ids))\n")
    student = dict(older)
    CASES["`math.isclose = lambda *a, **k: True`"](student)          # the student's own edit outside the regions
    write_package(student, tmp_path / PACKAGE)
    write_package(older, tmp_path / PRISTINE / PACKAGE)               # the release the student was given
    out = read_student_code(tmp_path / PACKAGE, given, "lab2")
    assert [e.what for e in out.outside_edits] == ["added `math.isclose = ...`"], out.outside_edits
    drift = [note for note in out.notes if "older" in note]
    assert len(drift) == 1 and "num_used_blocks" in drift[0] and "num_free_blocks" in drift[0], out.notes

    (tmp_path / PRISTINE).rename(tmp_path / "elsewhere")             # without it: compared with the current release
    out = read_student_code(tmp_path / PACKAGE, given, "lab2")
    said = {e.what: e.describe() for e in out.outside_edits}
    removed = next(text for what, text in said.items() if "num_used_blocks" in what)
    assert "removed" in removed and "not run" not in removed and "still runs" in removed, removed
    assert "not run" in said["added `math.isclose = ...`"]
