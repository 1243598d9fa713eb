"""`inferlab check` names the student's own file and line for an exception raised inside a region.

The self-check runs the student's region bodies in a pristine copy of the
release in a temporary folder, so pytest's traceback names a line of that copy;
the failure notes must map it back (labkit/locate.py, the grader's mapping
too) to the student's file, line and region.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from labkit.tree import PACKAGE, load_reference, splice
from courseware.release import make_release
from courseware.selfcheck import check

PATH = "engine/block_manager.py"
ROOT = Path(__file__).resolve().parents[2]


def release_with_body(tmp_path, replacement: str) -> tuple[Path, int]:
    """A lab 2 release with the reference's bodies, the last line of lab2.can_append replaced, four blank lines
    on top (the student's numbering differs from the copy's); returns it and the replacement's first line."""
    release = make_release("lab2", tmp_path / "release")
    tree = load_reference()
    splice(release / PACKAGE, {r.region_id: tree.body(r.region_id) for r in tree.regions if r.lab == "lab2"})
    student_file = release / PACKAGE / PATH
    text = student_file.read_text()
    body = tree.body("lab2.can_append").strip().splitlines()[-1].strip()
    assert text.count(body) == 1, body
    student_file.write_text("\n\n\n\n" + text.replace(body, replacement, 1))
    first = replacement.splitlines()[0]
    line = next(i for i, row in enumerate(student_file.read_text().splitlines(), 1) if row.strip() == first)
    return release, line


def test_a_crash_in_a_region_names_the_students_file_and_line(tmp_path):
    release, _ = release_with_body(tmp_path, "x = 1\n        return x / 0")
    line = next(i for i, row in enumerate((release / PACKAGE / PATH).read_text().splitlines(), 1)
                if "return x / 0" in row)

    console = Console(record=True, width=200, force_terminal=False)
    status = check("lab2", console=console, project=release, extra=("-k", "can_append"))
    out = console.export_text()
    assert status == 1, out
    assert "ZeroDivisionError" in out, out
    assert f"{PACKAGE}/{PATH}:{line} (your line, in region lab2.can_append)" in out, out
    assert not re.search(r"inferlab-selfcheck-\w+", out), "the temporary copy's path leaked into the notes:\n" + out


def test_an_endless_loop_in_a_region_fails_its_test_instead_of_hanging_the_check(tmp_path):
    """Before the per-test limit, `inferlab check` waited forever and showed nothing (its output is captured)."""
    release, line = release_with_body(tmp_path, "while True:\n            pass")
    script = ("import sys; from pathlib import Path; import courseware.selfcheck as s; s.TEST_TIME_LIMIT_S = 2; "
              f"sys.exit(s.check('lab2', project=Path({str(release)!r}), extra=('-k', 'can_append')))")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("inferlab check hung on a region that loops forever")
    assert proc.returncode == 1, out
    assert "ran longer than 2 s, the self-check's limit per test" in out, out
    at = re.search(rf"{PACKAGE}/{PATH}:(\d+) \(your line, in region lab2.can_append\)", out)
    assert at and int(at.group(1)) in (line, line + 1), out     # interrupted on the `while` or on its `pass`
