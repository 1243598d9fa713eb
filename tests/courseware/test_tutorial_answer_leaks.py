"""No tutorial 参考答案 and no instructor note reaches a student (issue 34, deliverable 2).

The answers and the instructor notes live only in the tutorials' sources
(tutorials/src/); tests/courseware/test_answer_leaks.py searches every release
for them (and for the labs' answers). This test takes every cell the sources mark `answer` or
`instructor`, cuts its text into fragments that no student-visible cell also
contains, and looks for each fragment in everything a student is given or
shown: the committed notebooks, the notebooks a release ships, and the student
edition that `inferlab build` renders. The same fragments must be found in the
instructor edition, so the search is shown to work on rendered pages and a
missing fragment means a missing answer, not a failed match.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import nbformat
import pytest

from courseware.build import build_tutorial, find_tutorials
from courseware.codewrap import MARK
from courseware.editions import HIDDEN_FROM_STUDENTS, tags
from courseware.release_tutorials import release_notebook
from courseware.tutorial_source import build_notebook, source_of

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = find_tutorials(ROOT)
MARKERS = ("参考答案", "教师注释", "celltag_answer", "celltag_instructor")
# What markdown, HTML or syntax highlighting may put between two characters of a source line.
SPLIT = re.compile(r"[\n`*#|<>\[\]&\\]+")
CJK = re.compile(r"[\u4e00-\u9fff]")
LIST_ITEM = re.compile(r"^(?:[-+]|\d+\.)\s+")


def _normal(text: str) -> str:
    """Text without whitespace or the print's line-continuation marks: a rendered page breaks long code lines
    (courseware/codewrap.py) and markdown reflows prose, so only the characters themselves are compared."""
    return "".join(text.replace(MARK, "").split())


def without_styles(page: str) -> str:
    """An HTML page less its scripts and style sheets (the shared CSS names the instructor class)."""
    return re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)


def page_text(page: str) -> str:
    """The visible text of an HTML page, whitespace collapsed."""
    return _normal(html.unescape(re.sub(r"<[^>]+>", "", without_styles(page))))


def notebook_text(nb) -> str:
    return _normal("\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                             for c in nb["cells"]))


def fingerprints(full) -> list[str]:
    """Fragments of the answer and instructor cells that no student-visible cell contains."""
    visible = "\n".join(c.source for c in full.cells if not tags(c) & HIDDEN_FROM_STUDENTS)
    # the student-visible text as markdown renders it: markup dropped, or turned into a space
    public = _normal(SPLIT.sub("", visible))
    found = []
    for cell in full.cells:
        if not tags(cell) & HIDDEN_FROM_STUDENTS:
            continue
        for line in cell.source.splitlines():
            for fragment in SPLIT.split(LIST_ITEM.sub("", line.strip())):
                fragment = _normal(fragment)
                long_enough = len(fragment) >= 20 or (len(fragment) >= 8 and CJK.search(fragment))
                if long_enough and fragment not in public:
                    found.append(fragment)
    return found


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """Each tutorial rendered (not executed) in both editions: {notebook stem: {edition: page text}}."""
    out = tmp_path_factory.mktemp("leaks")
    pages = {}
    for path in TUTORIALS:
        result, _ = build_tutorial(path, out, execute=False)
        pages[path.stem] = {which: page.read_text(encoding="utf-8") for which, page in result.pages.items()}
    return pages


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.stem)
def test_no_answer_or_note_in_what_students_get(path, rendered):
    full = build_notebook(source_of(path))
    prints = fingerprints(full)
    assert len(prints) >= 5, f"{path.name}: too few answer fragments to search for ({prints})"
    instructor = page_text(rendered[path.stem]["instructor"])
    unmatched = [p for p in prints if p not in instructor]
    assert not unmatched, f"the search misses fragments even in the instructor edition: {unmatched[:5]}"

    committed = nbformat.read(path, as_version=4)
    shipped = release_notebook(path)
    student_page = rendered[path.stem]["student"]
    places = {"committed notebook": notebook_text(committed), "release notebook": notebook_text(shipped),
              "student build": page_text(student_page)}
    for place, text in places.items():
        leaked = [p for p in prints if p in text]
        assert not leaked, f"{path.name}: {place} holds answer or note text: {leaked[:3]}"
    raw = {"committed notebook": json.dumps(committed, ensure_ascii=False),
           "release notebook": json.dumps(shipped, ensure_ascii=False), "student build": without_styles(student_page)}
    for place, text in raw.items():
        assert not [m for m in MARKERS if m in text], f"{path.name}: {place} holds a marker"
    assert "参考答案" in instructor and "celltag_instructor" in without_styles(rendered[path.stem]["instructor"])


def test_fingerprints_catch_a_leak():
    """A student notebook that kept one answer line is caught: the check above can fail."""
    full = build_notebook(source_of(TUTORIALS[1]))
    answer = next(c for c in full.cells if "answer" in tags(c) and c.cell_type == "code")
    line = max(answer.source.splitlines(), key=len)
    leaky = {"cells": [*[c for c in full.cells if not tags(c) & HIDDEN_FROM_STUDENTS],
                       nbformat.v4.new_code_cell(line)]}
    assert [p for p in fingerprints(full) if p in notebook_text(leaky)]
