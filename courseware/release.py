"""`inferlab release --lab labN --out DIR`: the repository a student gets for one lab (docs/design.md §3).

It contains `student_exercises/` with the regions of earlier labs filled in
with their solutions (a student of lab 3 gets a working block manager) and
lab N's and later labs' regions stubbed, the later labs' parts run by stand-ins
(courseware/standins/); lab N's public tests only; the
lab folder's public parts (handout, report template, rubric; its tests only
where they run) and the tutorials of its lab and the earlier ones, runnable on the release's engine
(courseware/release_tutorials.py; student edition: no answers, no sources); a README; and a small
installable `courseware` package with just what the tests and the self-check
need (courseware/release_code.py lists the code), and `courseware/manifest.json`,
every file's hash. It never
contains `reference/`, a lab's private parts (hidden tests, golden outputs,
bug zoo, private/): the earlier labs' solutions are the only solutions in it,
by design. A lab without regions (lab 5, a report) gets the whole engine,
the measurement commands, and the student copy of its nbgrader assignment
(courseware/nbgrader_edition.py: solutions stubbed, hidden tests removed),
so nobody works in the course repository; tests/courseware/test_answer_leaks.py
builds every release and looks for each answer in it.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from labkit.labs import earlier_labs, lab as lab_entry, lab_folder, later_labs
from labkit.manifest import Manifest
from labkit.tree import PACKAGE, ROOT, TESTS_DIR, ReferenceTree, load_reference, rewrite_imports
from courseware.later_labs import engine_section
from courseware.nbgrader_edition import release_assignment
from courseware.release_code import TORCH_VERSION, release_code, write_files
from courseware.release_tutorials import copy_tutorials

NOTEBOOK_DIR = "notebook"      # in a release's lab folder: the student copy of the lab's nbgrader assignment


def _extras(handout: Path | None, tutorials: list[str], left_out: dict[str, str]) -> list[str]:
    """The README's list of what else the release holds: the handout and the tutorials."""
    extras = []
    if handout is not None:
        extras.append(f"- The handout: `{handout.as_posix()}`.")
    if tutorials:
        extras.append("- `tutorials/`: the course tutorials of this lab and the earlier ones, student edition, "
                      "running on this release's engine (their `reference` imports point at "
                      f"`{PACKAGE}`): " + ", ".join(f"`tutorials/{name}`" for name in tutorials) + ". Run them "
                      f"with `jupyter lab tutorials/` once your regions are written (`pip install jupyterlab`).")
    if left_out:
        extras.append("- Tutorials not in this release, and why:\n" + "\n".join(
            f"  - `{name}`: {why}." for name, why in left_out.items()))
    return extras


def report_readme(lab: str, tree: ReferenceTree, handout: Path | None, tutorials: list[str],
                  left_out: dict[str, str]) -> str:
    """The README of a release for a lab without exercise regions: experiments on the whole engine, a report."""
    folder = lab_folder(lab, tree.root).relative_to(tree.root).as_posix()
    notebook = (f"- `{folder}/{NOTEBOOK_DIR}/`: the analysis notebook and the data it reads.\n"
                if lab_entry(lab, tree.root).nbgrader_source.is_dir() else "")
    return f"""# InferLab {lab}: student release

This lab writes no engine code: you measure the engine and explain what you measure, in a report. `{PACKAGE}/`
is the whole engine, every earlier lab ({', '.join(earlier_labs(lab, tree.root))}) filled in, and the `inferlab`
command runs the experiments (`inferlab bench`, `inferlab trace`, `inferlab make-tiny-model`). Work here, in this
folder: the handout's commands run from its root.

## Set up

```bash
python3 -m venv .venv && . .venv/bin/activate && pip install torch=={TORCH_VERSION} && pip install -e .
```

(Any `torch>=2.4` works; installing the CPU wheel first keeps pip from pulling a large CUDA build.)

```bash
inferlab demo
```

serves a small batch through the engine on the built-in tiny model.

## What is here

- `{folder}/`: the handout, the report template, the rubric and the experiment scripts.
{notebook}{chr(10).join(_extras(handout, tutorials, left_out))}
"""


def readme(lab: str, tree: ReferenceTree, handout: Path | None, tutorials: list[str],
           left_out: dict[str, str]) -> str:
    if not any(r.lab == lab for r in tree.regions):
        return report_readme(lab, tree, handout, tutorials, left_out)
    earlier = earlier_labs(lab, tree.root)
    rows = "".join(f"| `{r.region_id}` | `{r.path.replace('reference/', PACKAGE + '/', 1)}` | {r.task} |\n"
                   for r in tree.regions if r.lab == lab)
    filled = (f"The regions of {', '.join(earlier)} are already filled in with working solutions, so the "
              "engine around your part works.") if earlier else "This is the first lab: nothing is filled in yet."
    extras = _extras(handout, tutorials, left_out)
    return f"""# InferLab {lab}: student release

You write the bodies of the `{lab}` exercise regions in `{PACKAGE}/`. Each region looks like this:

```python
        # >>> EXERCISE {lab}.some_name: the task, in one line
        # HINT: hints, if any
        raise NotImplementedError("{lab}.some_name")     # <- replace this with your code
        # <<< EXERCISE {lab}.some_name
```

Replace the `raise` line with your code; keep the marker lines. Only code inside the regions is graded:
the grader copies your region bodies into its own copy of the engine, so changes anywhere else are
not seen. {filled} Regions of later labs raise `NotImplementedError`; neither your tests nor the engine reach them.

| region | file | task |
| --- | --- | --- |
{rows}
## Set up

```bash
python3 -m venv .venv && . .venv/bin/activate && pip install torch=={TORCH_VERSION} && pip install -e .
```

(Any `torch>=2.4` works; installing the CPU wheel first keeps pip from pulling a large CUDA build.)

## Run the tests

```bash
pytest {PACKAGE}/{TESTS_DIR} -m {lab}
```

A failing test says what it expected and what your code produced, in the lab's terms (the first
differing lifecycle event, a block-table diff, the first wrong slot). Tests marked `stretch` are
optional; tests marked `gpu` run only where CUDA is available.

## Self-check

```bash
inferlab check {lab}
```

reads your tree the way the grader does (your region bodies, plus any imports, functions, classes,
constants or methods you *added* outside the regions; other edits outside the regions are listed
and not run), runs the same tests on that code, and prints a score table per test and the public
part of your grade on the rubric's points (`{lab_folder(lab).relative_to(ROOT).as_posix()}/rubric.json`).
The grader scores the same items from hidden tests of the same behaviour on other inputs.

```bash
inferlab demo
```

serves a small batch through your engine on the built-in tiny model.

{engine_section(lab)}## Also here

{chr(10).join(extras) if extras else "- Nothing else for this lab."}
"""


def _copy_handout(root: Path, lab: str, out: Path) -> Path | None:
    """The lab folder's public files (handout, report template, rubric, scripts); returns the handout's path, if any.

    Scripts (lab 5's `lab5_run.py`) get their `reference` imports pointed at
    the release's engine, as every generated module does; a lab with an
    nbgrader source gets that assignment's student copy in `notebook/`.
    """
    entry = lab_entry(lab, root)
    folder = entry.folder
    dest = out / folder.relative_to(root)
    dest.mkdir(parents=True, exist_ok=True)
    for path in entry.public_parts():
        if path.is_file() and path.suffix == ".py":
            (dest / path.name).write_text(rewrite_imports(path.read_text(encoding="utf-8")), encoding="utf-8")
        elif path.is_file():
            shutil.copy2(path, dest / path.name)
    if entry.nbgrader_source.is_dir():
        release_assignment(entry.nbgrader_source, dest / NOTEBOOK_DIR)
    handout = folder / "README.md"
    return handout.relative_to(root) if handout.is_file() else None


def make_release(lab: str, out: str | Path, root: Path = ROOT) -> Path:
    """Write the lab's student repository into `out` (which must be absent or empty), its manifest last."""
    earlier_labs(lab, root)             # an unknown lab is refused before anything is written
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not empty; choose a new folder")
    tree = load_reference(root)
    out.mkdir(parents=True, exist_ok=True)
    write_files(release_code(lab, tree, root), out)     # the engine, its tests, the tools, pyproject.toml
    handout = _copy_handout(root, lab, out)
    tutorials = copy_tutorials(root, out, lab) if (root / "tutorials").is_dir() else ([], {})
    (out / "docs").mkdir()
    shutil.copy2(root / "docs" / "design.md", out / "docs" / "design.md")   # the public tests cite it
    cited = set(re.findall(r"docs/([\w-]+\.md)", (root / handout).read_text(encoding="utf-8"))) if handout else set()
    for name in sorted(cited - {"design.md"}):          # and the handout's own references (lab 5: performance.md)
        if (root / "docs" / name).is_file():
            shutil.copy2(root / "docs" / name, out / "docs" / name)
    (out / "README.md").write_text(readme(lab, tree, handout, *tutorials), encoding="utf-8")
    (out / ".gitignore").write_text("__pycache__/\n*.egg-info/\n.venv/\n.pytest_cache/\nbuild/\n", encoding="utf-8")
    Manifest.of_folder(lab, tuple(later_labs(lab, root)), out).write(out)
    return out
