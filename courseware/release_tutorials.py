"""The tutorials a lab's release ships, in a form that runs on the release's own engine.

The course's tutorials import the reference engine (`from reference import
LLM`). A release has no `reference/`: its engine is `student_exercises/`
(earlier labs' solutions, the student's regions) with stand-ins for the later
labs' parts, which `courseware.engine` hands in. So a release ships the
student edition of each tutorial of its lab and the earlier labs, with the
code cells' `from reference import ...` pointed at `courseware.engine` and
every other `reference.` import at `student_exercises`, by the rewrite that
makes `student_exercises/` itself (`labkit.tree.rewrite_imports`).

We chose rewriting at release time over a shim module that tutorials import
through: the course's notebooks keep the plain imports the lectures show, and
nothing in a release can fall back to a solution. A release's notebooks
also start with one cell of their own (BOOTSTRAP) that puts the release's
root first on `sys.path`: a kernel started in `tutorials/` would otherwise
import whichever `student_exercises` the environment offers (the course's, in
the course's venv). The price: a release's
notebooks differ from the course's in their import lines, and a tutorial may
name the package `reference` only in import statements (anything else is
listed by `leftover_references` and fails tests/courseware/test_release_tutorials.py).

A later lab's tutorial is not shipped, since it teaches a part the release
runs on a stand-in, and the release README says so; every tutorial of the
lab and the earlier ones runs on the release's engine (the stand-ins preempt
and batch decodes as the course engine does, so Tutorial 02's timeline and
step-time measurements work from lab 1 on).
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from courseware.editions import edition
from labkit.labs import lab as lab_entry
from labkit.tree import rewrite_imports

# Tutorial number -> the lab whose lecture it belongs to (docs/labs.md, the lab map; lab5's are in no release).
TUTORIAL_LAB = {"01": "lab1", "02": "lab1", "03": "lab3", "04": "lab2", "05": "lab2", "06": "lab4",
                "07": "lab4", "08": "lab5", "09": "lab5"}


def tutorial_number(path: Path) -> str:
    """"04" for tutorials/Tutorial_04_paged_kv.ipynb."""
    return path.stem.split("_")[1]


def tutorials_for(lab: str, root: Path) -> tuple[list[Path], dict[str, str]]:
    """(the notebooks lab `lab`'s release ships, {notebook name: why it is not shipped}) for every tutorial."""
    shipped: list[Path] = []
    absent: dict[str, str] = {}
    for path in sorted((root / "tutorials").glob("Tutorial_*.ipynb")):
        number = tutorial_number(path)
        if number not in TUTORIAL_LAB:
            raise ValueError(f"{path.name}: no lab for tutorial {number} in courseware/release_tutorials.py "
                             "TUTORIAL_LAB; add it")
        owner = TUTORIAL_LAB[number]
        if lab_entry(owner, root).number > lab_entry(lab, root).number:
            absent[path.name] = f"it belongs to {owner}, a later lab"
        else:
            shipped.append(path)
    return shipped, absent


def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


_ENGINE_IMPORT = re.compile(r"^(?P<lead>[ \t]*from[ \t]+)reference(?=[ \t]+import\b)", re.M)


def on_release_engine(source: str) -> str:
    """Course code pointed at a release: `from reference import ...` -> `from courseware.engine import ...`
    (the student's engine with the later labs' stand-ins), every other `reference.` import -> `student_exercises`."""
    return rewrite_imports(_ENGINE_IMPORT.sub(lambda m: m["lead"] + "courseware.engine", source))


# The first cell of every notebook a release ships: the release's root first on sys.path, found from the kernel's
# working directory (Jupyter starts a kernel in its notebook's folder). Only the standard library: nothing of the
# release may be imported before it runs (courseware/release_root.py says why).
BOOTSTRAP = """\
# This notebook runs this release's code (your student_exercises/, wherever Jupyter was started and whatever else
# is installed): the release folder, the one holding courseware/manifest.json, goes first on sys.path.
import pathlib, sys
_here = pathlib.Path.cwd().resolve()
_root = next((p for p in (_here, *_here.parents) if (p / "courseware" / "manifest.json").is_file()), None)
if _root is None:
    raise RuntimeError(f"{_here} is not inside a release: open the notebook from its release's tutorials/ folder")
sys.path.insert(0, str(_root))"""
BOOTSTRAP_TAG = "release-bootstrap"
# A cell that runs `inferlab` in a child process (Tutorial 08: `python -m inferlab.cli serve ...`) runs the release's
# command instead: a release has no `inferlab` package, and the course's would serve the course's engine.
COURSE_CLI, RELEASE_CLI = '"inferlab.cli"', '"courseware.student_cli"'


def release_notebook(path: Path) -> dict:
    """The student edition of a tutorial, running on the release's engine instead of `reference`.

    `from reference import LLM, ...` becomes `from courseware.engine import ...`,
    which builds the student's engine with the stand-ins of the labs after
    the release's; every other `reference.` import points at `student_exercises`;
    a first cell (BOOTSTRAP) makes those imports find the release's own packages.
    """
    nb = edition(json.loads(path.read_text(encoding="utf-8")), "student")
    for cell in nb["cells"]:
        if cell.get("cell_type") == "code":
            cell["source"] = on_release_engine(_source(cell)).replace(COURSE_CLI, RELEASE_CLI)
    nb["cells"].insert(0, {"cell_type": "code", "execution_count": None, "id": BOOTSTRAP_TAG,
                           "metadata": {"tags": [BOOTSTRAP_TAG]}, "outputs": [], "source": BOOTSTRAP})
    return nb


def leftover_references(nb: dict) -> list[str]:
    """Code lines that still use the name `reference` (outside strings and comments) after the rewrite."""
    found = []
    for index, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        source = _source(cell)
        python = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
        for node in ast.walk(ast.parse(python)):
            named = (isinstance(node, ast.Name) and node.id == "reference") or (
                isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                    (alias.name.split(".")[0] == "reference") for alias in getattr(node, "names", []))) or (
                isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "reference")
            if named:
                found.append(f"cell {index}, line {node.lineno}: {python.splitlines()[node.lineno - 1].strip()}")
    return found


def copy_tutorials(root: Path, out: Path, lab: str) -> tuple[list[str], dict[str, str]]:
    """Write lab `lab`'s tutorials into out/tutorials/; return (names shipped, {name: why left out})."""
    shipped, absent = tutorials_for(lab, root)
    for path in shipped:
        dest = out / "tutorials" / path.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(release_notebook(path), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return [p.name for p in shipped], absent
