"""No answer reaches a student: every lab's release is built and searched for each answer and solution marker.

What counts as an answer, each family read from the course itself (so a new notebook, hidden test or
private file is covered without editing this list):

- nbgrader markers (### BEGIN SOLUTION, ### BEGIN HIDDEN TESTS, ...) anywhere;
- the lines inside the solution and hidden-test regions of every lab's nbgrader source notebook;
- the tutorials' answer cells and instructor notes (cells tagged `answer` / `instructor`), read from the
  tutorials' sources (tutorials/src/), the only place they live: the committed notebooks are the student
  edition (tests/courseware/test_tutorial_answer_leaks.py searches those and the student build);
- the hidden tests: their lines, and their test names anywhere but the rubric (rubric.json says, by design,
  which hidden tests grade which item; never what they run or expect);
- every file under a lab's private/ (the instructor's notebook builder, the source notebook), except the
  data files nbgrader itself releases beside the notebook;
- golden outputs (their files and their fingerprints), bug-zoo mutants, hidden/ folders, `reference/`,
  the tutorials' percent-format sources.

A line counts only when it is distinctive: at least 24 characters, and in none of the files students are
meant to have (the engine, the public tests, the handouts, the student cells of the tutorials). The
search must be able to fail: `test_the_search_finds_planted_leaks` plants one leak of each family in a
real release and expects each to be found.
"""
from __future__ import annotations

import json
import re
import shutil
from functools import lru_cache
from pathlib import Path

import pytest

from courseware.editions import HIDDEN_FROM_STUDENTS, edition
from courseware.tutorial_source import build_notebook, source_of
from courseware.nbgrader_edition import BEGIN_HIDDEN, BEGIN_SOLUTION, END_HIDDEN, END_SOLUTION, student_notebook
from courseware.release import make_release
from labkit.labs import ROOT, all_labs, release_labs

MIN_CHARS = 24
MARKERS = (BEGIN_SOLUTION, END_SOLUTION, BEGIN_HIDDEN, END_HIDDEN)
TEXT_SUFFIXES = (".py", ".md", ".txt", ".toml", ".json", ".jsonl", ".cfg", ".ini", ".ipynb", ".csv", ".html")
# Paths that must not exist in a release at all.
FORBIDDEN_PATHS = re.compile(r"(^|/)(reference|hidden|bugzoo|private)(/|$)|(^|/)golden[^/]*\.json$|^tutorials/src/")


def _cell_source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def text_lines(path: Path) -> list[str]:
    """The lines a reader sees in a file: a notebook's cell sources and text outputs, any other file's text."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".ipynb":
        return text.splitlines()
    try:
        cells = json.loads(text).get("cells", [])
    except (json.JSONDecodeError, AttributeError):
        return text.splitlines()
    lines = []
    for cell in cells:
        lines += _cell_source(cell).splitlines()
        for output in cell.get("outputs", []):
            body = output.get("text") or output.get("data", {}).get("text/plain", "")
            lines += ("".join(body) if isinstance(body, list) else str(body)).splitlines()
    return lines


def _distinctive(lines, public: frozenset[str]) -> set[str]:
    return {s for s in (line.strip() for line in lines) if len(s) >= MIN_CHARS and s not in public}


def _region_lines(source: str, begin: str, end: str) -> list[str]:
    out, inside = [], False
    for line in source.splitlines():
        if line.strip() == begin:
            inside = True
        elif line.strip() == end:
            inside = False
        elif inside:
            out.append(line)
    return out


@lru_cache(maxsize=1)
def public_lines() -> frozenset[str]:
    """Every line students are meant to have: engine, tools, public tests, handouts, student cells, docs."""
    lines: set[str] = set()
    globs = ["reference/**/*.py", "student_exercises/**/*.py", "courseware/**/*.py", "labkit/**/*.py",
             "assignments/shared/public/*.py", "assignments/*/public/*.py", "assignments/*/*.md",
             "assignments/*/*.py", "assignments/*/rubric.json", "docs/*.md"]
    for pattern in globs:
        for path in ROOT.glob(pattern):
            lines.update(line.strip() for line in text_lines(path))
    for path in (ROOT / "tutorials").glob("Tutorial_*.ipynb"):
        nb = edition(json.loads(path.read_text(encoding="utf-8")), "student")
        lines.update(line.strip() for cell in nb["cells"] for line in _cell_source(cell).splitlines())
    for lab in all_labs():
        for path in sorted(lab.nbgrader_source.iterdir()) if lab.nbgrader_source.is_dir() else []:
            if path.suffix == ".ipynb":                         # what nbgrader releases of the notebook
                nb = student_notebook(json.loads(path.read_text(encoding="utf-8")))
                lines.update(line.strip() for cell in nb["cells"] for line in _cell_source(cell).splitlines())
            elif path.is_file():                                # and the data files beside it, whole
                lines.update(line.strip() for line in text_lines(path))
    return frozenset(lines)


@lru_cache(maxsize=1)
def answers() -> dict[str, set[str]]:
    """Family -> the distinctive lines of that family of answers, read from the course."""
    public = public_lines()
    found: dict[str, set[str]] = {"nbgrader solutions": set(), "tutorial answers": set(), "hidden tests": set(),
                                  "private files": set()}
    for lab in all_labs():
        source = lab.nbgrader_source
        for path in sorted(source.glob("*.ipynb")) if source.is_dir() else []:
            for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
                text = _cell_source(cell)
                meta = cell.get("metadata", {}).get("nbgrader", {})
                lines = _region_lines(text, BEGIN_SOLUTION, END_SOLUTION) + _region_lines(text, BEGIN_HIDDEN, END_HIDDEN)
                if meta.get("solution") and BEGIN_SOLUTION not in text:
                    lines += text.splitlines()                      # a written answer, whole
                found["nbgrader solutions"] |= _distinctive(lines, public)
        for path in sorted(lab.hidden.rglob("*.py")) if lab.hidden.is_dir() else []:
            found["hidden tests"] |= _distinctive(path.read_text(encoding="utf-8").splitlines(), public)
        if lab.private.is_dir():
            data = {p.name for p in source.iterdir() if p.is_file() and p.suffix != ".ipynb"} if source.is_dir() else set()
            for path in sorted(lab.private.rglob("*")):
                if path.is_file() and not (path.parent == source and path.name in data):
                    found["private files"] |= _distinctive(text_lines(path), public)
    for path in sorted((ROOT / "tutorials").glob("Tutorial_*.ipynb")):
        for cell in build_notebook(source_of(path)).cells:
            if set(cell.get("metadata", {}).get("tags", [])) & HIDDEN_FROM_STUDENTS:
                found["tutorial answers"] |= _distinctive(_cell_source(cell).splitlines(), public)
    return found


@lru_cache(maxsize=1)
def hidden_test_names() -> frozenset[str]:
    """Names of hidden test functions that no public test shares."""
    public = set(re.findall(r"def (test_\w+)", "\n".join(
        p.read_text(encoding="utf-8") for p in ROOT.glob("assignments/*/public/*.py"))))
    names = {name for lab in all_labs() for p in lab.hidden.rglob("*.py") if lab.hidden.is_dir()
             for name in re.findall(r"def (test_\w+)", p.read_text(encoding="utf-8"))}
    return frozenset(names - public)


@lru_cache(maxsize=1)
def golden_fingerprints() -> frozenset[str]:
    prints = set()
    for lab in all_labs():
        for path in (lab.golden, lab.golden_gpu):
            if path.is_file():
                fingerprint = json.loads(path.read_text(encoding="utf-8")).get("fingerprint")
                if isinstance(fingerprint, str) and len(fingerprint) >= 16:
                    prints.add(fingerprint)
    return frozenset(prints)


def leaks(release: Path) -> list[str]:
    """Every answer found in a release: `path: family: what`."""
    found = []
    families = answers()
    names = hidden_test_names()
    names_re = re.compile(r"\b(" + "|".join(sorted(map(re.escape, names))) + r")\b") if names else None
    for path in sorted(release.rglob("*")):
        relative = path.relative_to(release).as_posix()
        if FORBIDDEN_PATHS.search(relative):
            found.append(f"{relative}: a path no release may hold")
            continue
        if not path.is_file() or path.suffix not in TEXT_SUFFIXES or "__pycache__" in path.parts:
            continue
        raw = path.read_text(encoding="utf-8", errors="replace")
        found += [f"{relative}: nbgrader marker {m!r}" for m in MARKERS if m in raw]
        found += [f"{relative}: golden fingerprint" for f in golden_fingerprints() if f in raw]
        lines = {line.strip() for line in text_lines(path)}
        for family, forbidden in families.items():
            hits = sorted(lines & forbidden)
            found += [f"{relative}: {family}: {hit[:80]}" for hit in hits[:3]]
        if names_re is not None and path.name != "rubric.json":
            found += [f"{relative}: hidden test name {m}" for m in sorted(set(names_re.findall(raw)))[:3]]
    return found


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("releases")
    return {lab: make_release(lab, root / lab) for lab in release_labs()}


def test_every_family_of_answers_is_read_from_the_course():
    """The search has something to search for in each family (an empty family would pass vacuously)."""
    assert all(answers()[family] for family in answers()), {k: len(v) for k, v in answers().items()}
    assert hidden_test_names() and golden_fingerprints()


@pytest.mark.parametrize("lab", release_labs())
def test_no_answer_in_a_release(releases, lab):
    assert leaks(releases[lab]) == []


def test_lab5_release_carries_the_student_notebook_and_its_data(releases):
    notebook = releases["lab5"] / "assignments" / "lab5_performance" / "notebook"
    assert sorted(p.name for p in notebook.iterdir()) == ["lab5_analysis.ipynb", "run_a.jsonl", "run_b.jsonl",
                                                         "runs.json"]
    nb = json.loads((notebook / "lab5_analysis.ipynb").read_text(encoding="utf-8"))
    assert any("raise NotImplementedError()" in _cell_source(c) for c in nb["cells"])
    assert not (releases["lab5"] / "reference").exists()


def test_the_student_notebook_is_what_nbgrader_releases():
    """Our stripper against nbgrader's own preprocessors (an independent route), where nbgrader is installed."""
    nbformat = pytest.importorskip("nbformat")
    preprocessors = pytest.importorskip("nbgrader.preprocessors")
    for lab in all_labs():
        for path in sorted(lab.nbgrader_source.glob("*.ipynb")) if lab.nbgrader_source.is_dir() else []:
            theirs, resources = preprocessors.ClearSolutions().preprocess(nbformat.read(path, as_version=4), {})
            theirs, _ = preprocessors.ClearHiddenTests().preprocess(theirs, resources)
            ours = student_notebook(json.loads(path.read_text(encoding="utf-8")))
            assert [c.source for c in theirs.cells] == [_cell_source(c) for c in ours["cells"]]


PLANTS = {
    "nbgrader marker": lambda rel, src: (rel / "notes.md").write_text(f"x\n{BEGIN_SOLUTION}\n"),
    "nbgrader solutions": lambda rel, src: (rel / "copied.py").write_text(sorted(answers()["nbgrader solutions"])[0]),
    "tutorial answers": lambda rel, src: (rel / "tutorials" / "extra.md").write_text(
        sorted(answers()["tutorial answers"])[0] + "\n"),
    "hidden tests": lambda rel, src: (rel / "student_exercises" / "sneak.py").write_text(
        "    " + sorted(answers()["hidden tests"])[0] + "\n"),
    "hidden test name": lambda rel, src: (rel / "README.md").write_text(
        (rel / "README.md").read_text() + f"\nsee {sorted(hidden_test_names())[0]}\n"),
    "private files": lambda rel, src: shutil.copy(
        ROOT / "assignments" / "lab5_performance" / "private" / "make_notebook.py", rel / "tools.py"),
    "source notebook": lambda rel, src: shutil.copy(
        ROOT / "assignments" / "lab5_performance" / "private" / "source" / "lab5_analysis.ipynb",
        rel / "assignments" / "lab5_performance" / "notebook" / "lab5_analysis.ipynb"),
    "golden file": lambda rel, src: shutil.copy(
        ROOT / "assignments" / "lab2_block_manager" / "golden.json", rel / "golden.json"),
    "hidden folder": lambda rel, src: shutil.copytree(
        ROOT / "assignments" / "lab2_block_manager" / "hidden", rel / "assignments" / "hidden"),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_the_search_finds_planted_leaks(releases, tmp_path, plant):
    release = tmp_path / "release"
    shutil.copytree(releases["lab5"], release)
    assert leaks(release) == []
    PLANTS[plant](release, ROOT)
    assert leaks(release), f"a planted {plant} was not found"
