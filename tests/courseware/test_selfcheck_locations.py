"""`inferlab check` names the student's own file and line for an exception raised inside a region.

The self-check runs the student's region bodies in a pristine copy of the
release in a temporary folder, so pytest's traceback names a line of that copy;
the failure notes must map it back (labkit/locate.py, the grader's mapping
too) to the student's file, line and region.
"""
from __future__ import annotations

import re

from rich.console import Console

from labkit.tree import PACKAGE, load_reference, splice
from courseware.release import make_release
from courseware.selfcheck import check

PATH = "engine/block_manager.py"


def test_a_crash_in_a_region_names_the_students_file_and_line(tmp_path):
    release = make_release("lab2", tmp_path / "release")
    tree = load_reference()
    splice(release / PACKAGE, {r.region_id: tree.body(r.region_id) for r in tree.regions if r.lab == "lab2"})
    student_file = release / PACKAGE / PATH
    text = student_file.read_text()
    body = tree.body("lab2.can_append").strip().splitlines()[-1].strip()
    assert text.count(body) == 1, body
    # four blank lines on top (the student's numbering differs from the copy's) and a body that fails
    student_file.write_text("\n\n\n\n" + text.replace(body, "x = 1\n        return x / 0", 1))
    line = next(i for i, row in enumerate(student_file.read_text().splitlines(), 1) if "return x / 0" in row)

    console = Console(record=True, width=200, force_terminal=False)
    status = check("lab2", console=console, project=release, extra=("-k", "can_append"))
    out = console.export_text()
    assert status == 1, out
    assert "ZeroDivisionError" in out, out
    assert f"{PACKAGE}/{PATH}:{line} (your line, in region lab2.can_append)" in out, out
    assert not re.search(r"inferlab-selfcheck-\w+", out), "the temporary copy's path leaked into the notes:\n" + out
