"""References a release's files make to documents, tutorials and numbered rules, and whether each resolves there.

A student has only the release: a test docstring that cites `docs/architecture.md`,
a handout that sends them to "T06 §4", or a rubric line about "Edge cases 1 and 8"
must point at something in it. The kinds of reference, and what resolves each:

- `docs/NAME.md` (optionally `§N`): the file is in the release's docs/ (and has a
  `## N.` heading). `docs_closure` is how a release decides which docs to ship:
  every doc its files cite, and every doc those cite, so this always holds;
  except the staff's docs (`STAFF_DOCS`: the grader's inside, which names hidden
  tests), which the README lists as not shipped, with why.
- a path under `assignments/`, `tutorials/` or `slides_code/`, or a module run
  with `python -m` (`python -m slides_code.call_chain`): the file is in the release.
- a tutorial, `T05`, `Tutorial 05` (optionally `§N` or `第 N 节`): the notebook is
  shipped (and has a `## N.` heading); or, outside the lab's handout, the
  release README says why it is not shipped (a later lab's tutorial, which a
  notebook or a doc of the course may mention). A handout sends its student to
  shipped tutorials only.
- a numbered rule, `Edge case N` / `Edge cases 1 and 8` (docs/design.md §2):
  the shipped design doc states it. `DESIGN N` was the old, unresolvable name
  for the same thing and is refused.

Paths of the course repository's files in a shipped course doc (docs/*.md:
`reference/`, `tests/`, `assignments/shared/...`) are out of scope: the docs
describe the course, and name where it keeps a file, not something the student
is asked to open in the release.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from labkit.manifest import MANIFEST, PRISTINE

DOC = re.compile(r"(?<![\w/.-])docs/(?P<name>[A-Za-z0-9_-]+\.md)(?:\s*§\s*(?P<section>\d+))?")
PATH = re.compile(r"(?<![\w/.-])(?P<path>(?:assignments|tutorials|slides_code)/[\w./-]*[\w-]\.(?:md|json|ipynb|py))")
# A module run by name: `python -m slides_code.call_chain` (a slide script), `python -m courseware.student_cli`.
MODULE = re.compile(r"\bpython3? -m (?P<module>(?:slides_code|courseware|student_exercises|labkit)(?:\.\w+)+)")
TUTORIAL = re.compile(r"(?<![\w-])(?:T|Tutorial[ _])(?P<number>\d\d)(?![\w-])(?:\*\*)?"
                      r"(?:\s*(?:§\s*(?P<section>\d+)|的?\s*第\s*(?P<section_zh>\d+)\s*节))?")
EDGE_CASES = re.compile(r"\b[Ee]dge cases? (?P<numbers>\d+(?:(?:,\s*|\s+and\s+|\s*、\s*)\d+)*)")
OLD_RULES = re.compile(r"\bDESIGN \d+\b")
TEXT_SUFFIXES = (".md", ".py", ".json", ".ipynb", ".toml", ".txt")


@dataclass(frozen=True)
class Reference:
    path: str           # the file that makes it, relative to the release
    line: int
    text: str           # as written
    problem: str        # why it does not resolve ("" when it does)


def _headings(markdown: str) -> set[str]:
    """The section numbers of `## N. Title` headings."""
    return {m[1] for m in re.finditer(r"^##\s+(\d+)[a-z]?\.", markdown, re.M)}


def _notebook_markdown(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "\n".join("".join(c["source"]) if isinstance(c["source"], list) else c["source"]
                     for c in nb["cells"] if c.get("cell_type") == "markdown")


def release_texts(release: Path) -> Iterator[tuple[str, str]]:
    """(path relative to the release, text) of every text file a student reads; the pristine copy aside."""
    for path in sorted(release.rglob("*")):
        rel = path.relative_to(release)
        if (not path.is_file() or path.suffix not in TEXT_SUFFIXES or "__pycache__" in rel.parts
                or rel.parts[:2] == PRISTINE.parts or rel == MANIFEST or any(p.startswith(".") for p in rel.parts)
                or "egg-info" in str(rel)):
            continue
        yield rel.as_posix(), path.read_text(encoding="utf-8")


def cited_docs(text: str) -> set[str]:
    return {m["name"] for m in DOC.finditer(text)}


# The course's documents for its staff, never shipped: how the grader works inside, which hidden tests grade
# what, the mutant audits, TA recipes (tests/courseware/test_answer_leaks.py finds hidden test names in them).
# A release that cites one says so in its README (`not_shipped_docs`), which is how such a reference resolves.
STAFF_DOCS = {"grading.md": "how the grader works inside, for the course's staff",
              "labs.md": "how the labs, their tests and the bug zoo are made, for the course's staff",
              "workflows.md": "the teaching assistants' recipes"}


def docs_closure(texts: list[str], docs: Path) -> tuple[list[str], list[str]]:
    """(docs to ship, staff docs cited): those `texts` cite, directly or through the shipped docs they cite."""
    wanted: set[str] = set()
    staff: set[str] = set()
    queue = [name for text in texts for name in cited_docs(text)]
    while queue:
        name = queue.pop()
        if name in STAFF_DOCS:
            staff.add(name)
            continue
        if name in wanted or not (docs / name).is_file():
            continue
        wanted.add(name)
        queue += cited_docs((docs / name).read_text(encoding="utf-8"))
    return sorted(wanted), sorted(staff)


def not_shipped_docs(names: list[str]) -> str:
    """The README's list of cited course docs a release does not ship, each with why."""
    return "\n".join(f"  - `docs/{name}`: {STAFF_DOCS[name]}." for name in names)


def _explained_docs(release: Path) -> set[str]:
    """Course docs the release README lists as cited but not shipped, with a reason."""
    readme = release / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    return {m[1] for m in re.finditer(r"^\s*- `docs/([\w-]+\.md)`: \S", text, re.M)}


def _explained_tutorials(release: Path) -> set[str]:
    """Tutorial numbers the release README lists as not shipped, with a reason."""
    readme = release / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    return {m[1] for m in re.finditer(r"^\s*- `Tutorial_(\d\d)_[\w]+\.ipynb`: \S", text, re.M)}


def _placeholder(name: str) -> bool:
    """`slides_code/X.py`, `python -m slides_code.NAME`: a name to fill in, not a file."""
    return name.isupper()


def references(release: Path) -> list[Reference]:
    """Every reference the release's files make, each with why it does not resolve ('' when it does)."""
    shipped = {p.name.split("_")[1]: p for p in (release / "tutorials").glob("Tutorial_*.ipynb")}
    explained, staff = _explained_tutorials(release), _explained_docs(release)
    design = release / "docs" / "design.md"
    edge_cases = set(re.findall(r"Edge case (\d+) —", design.read_text(encoding="utf-8"))) if design.is_file() else set()
    found: list[Reference] = []
    for rel, text in release_texts(release):
        handout = rel.startswith("assignments/") and rel.endswith("/README.md")
        for number, line in enumerate(text.splitlines(), 1):
            for m in DOC.finditer(line):
                target = release / "docs" / m["name"]
                problem = "" if target.is_file() or m["name"] in staff else f"docs/{m['name']} is not in the release"
                if (not problem and target.is_file() and m["section"]
                        and m["section"] not in _headings(target.read_text(encoding="utf-8"))):
                    problem = f"docs/{m['name']} has no section {m['section']}"
                found.append(Reference(rel, number, m[0], problem))
            for m in PATH.finditer(line) if not rel.startswith("docs/") else ():
                if _placeholder(Path(m["path"]).stem):
                    continue
                found.append(Reference(rel, number, m[0], "" if (release / m["path"]).exists()
                                       else f"{m['path']} is not in the release"))
            for m in MODULE.finditer(line) if not rel.startswith("docs/") else ():
                if _placeholder(m["module"].rsplit(".", 1)[-1]):
                    continue
                module = Path(*m["module"].split("."))
                shipped_module = (release / module.with_suffix(".py")).is_file() or (release / module).is_dir()
                found.append(Reference(rel, number, m[0], "" if shipped_module
                                       else f"module {m['module']} is not in the release"))
            for m in TUTORIAL.finditer(line):
                section = m["section"] or m["section_zh"]
                problem = ""
                if m["number"] in shipped:
                    if section and section not in _headings(_notebook_markdown(shipped[m["number"]])):
                        problem = f"{shipped[m['number']].name} has no section {section}"
                elif handout:
                    problem = f"the handout cites tutorial {m['number']}, which this release does not ship"
                elif m["number"] not in explained:
                    problem = f"tutorial {m['number']} is neither shipped nor explained in the README"
                found.append(Reference(rel, number, m[0], problem))
            for m in EDGE_CASES.finditer(line):
                missing = [n for n in re.findall(r"\d+", m["numbers"]) if n not in edge_cases]
                found.append(Reference(rel, number, m[0], f"docs/design.md states no edge case {', '.join(missing)}"
                                       if missing else ""))
            for m in OLD_RULES.finditer(line):
                found.append(Reference(rel, number, m[0], "no rule is called DESIGN N: write `Edge case N` "
                                                          "(docs/design.md §2)"))
    return found


def unresolved(release: Path) -> list[str]:
    return [f"{r.path}:{r.line}: {r.text!r}: {r.problem}" for r in references(release) if r.problem]
