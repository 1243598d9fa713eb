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

from labkit.handout import handout_text, what_is_graded
from labkit.labs import earlier_labs, lab as lab_entry, lab_folder, later_labs
from labkit.manifest import Manifest
from labkit.tree import PACKAGE, ROOT, TESTS_DIR, ReferenceTree, load_reference, rewrite_imports
from courseware.later_labs import engine_section
from courseware.nbgrader_edition import release_assignment
from courseware.release_code import TORCH_VERSION, TRITON_LABS, release_code, write_files
from courseware.release_refs import docs_closure, not_shipped_docs, release_texts
from courseware.release_slides import SLIDES, copy_slides
from courseware.release_tutorials import copy_tutorials

NOTEBOOK_DIR = "notebook"      # in a release's lab folder: the student copy of the lab's nbgrader assignment


def _extras(handout: Path | None, tutorials: list[str], left_out: dict[str, str],
            slides: list[str] = ()) -> list[str]:
    """The README's list of what else the release holds: the handout, the tutorials and the slide scripts."""
    extras = []
    if handout is not None:
        extras.append(f"- The handout: `{handout.as_posix()}`.")
    if tutorials:
        extras.append("- `tutorials/`: the course tutorials of this lab and the earlier ones, student edition, "
                      "running on this release's engine (their `reference` imports point at "
                      f"`{PACKAGE}`): " + ", ".join(f"`tutorials/{name}`" for name in tutorials) + ". Run them "
                      f"with `jupyter lab tutorials/` once your regions are written (`pip install -e '.[notebooks]'` installs "
                      "Jupyter and what the tutorials import).")
    if left_out:
        extras.append("- Tutorials not in this release, and why:\n" + "\n".join(
            f"  - `{name}`: {why}." for name, why in left_out.items()))
    if slides:
        extras.append(f"- `{SLIDES}/`: the lecture slides' code listings, running on this release's engine "
                      f"(`python -m {SLIDES}.NAME` from this folder, after `pip install -e '.[notebooks]'`; its README "
                      "lists them): "
                      + ", ".join(f"`{name}`" for name in slides) + ".")
    return extras


def report_readme(lab: str, tree: ReferenceTree, handout: Path | None, tutorials: list[str],
                  left_out: dict[str, str], slides: list[str] = ()) -> str:
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
python3 -m venv .venv && . .venv/bin/activate && pip install torch=={TORCH_VERSION} && pip install -e ".[notebooks]"
```

(Any `torch>=2.4` works; installing the CPU wheel first keeps pip from pulling a large CUDA build. The
`notebooks` extra brings Jupyter and matplotlib, which the analysis notebook and the tutorials use.)

```bash
inferlab demo
```

serves a small batch through the engine on the built-in tiny model.

## What is here

- `{folder}/`: the handout, the report template, the rubric and the experiment scripts.
{notebook}{chr(10).join(_extras(handout, tutorials, left_out, slides))}
"""


def readme(lab: str, tree: ReferenceTree, handout: Path | None, tutorials: list[str],
           left_out: dict[str, str], slides: list[str] = ()) -> str:
    if not any(r.lab == lab for r in tree.regions):
        return report_readme(lab, tree, handout, tutorials, left_out, slides)
    earlier = earlier_labs(lab, tree.root)
    rows = "".join(f"| `{r.region_id}` | `{r.path.replace('reference/', PACKAGE + '/', 1)}` | {r.task} |\n"
                   for r in tree.regions if r.lab == lab)
    filled = (f"The regions of {', '.join(earlier)} are already filled in with working solutions, so the "
              "engine around your part works.") if earlier else "This is the first lab: nothing is filled in yet."
    extras = _extras(handout, tutorials, left_out, slides)
    return f"""# InferLab {lab}: student release

You write the bodies of the `{lab}` exercise regions in `{PACKAGE}/`. Each region looks like this:

```python
        # >>> EXERCISE {lab}.some_name: the task, in one line
        # HINT: hints, if any
        raise NotImplementedError("{lab}.some_name")     # <- replace this with your code
        # <<< EXERCISE {lab}.some_name
```

Replace the `raise` line with your code; keep the marker lines. {filled} Regions of later labs raise
`NotImplementedError`; neither your tests nor the engine reach them.

| region | file | task |
| --- | --- | --- |
{rows}
## What is graded

What of your code runs when you are graded (the handout includes the same text):

{what_is_graded(tree.root)}

## Set up

```bash
python3 -m venv .venv && . .venv/bin/activate && pip install torch=={TORCH_VERSION} && pip install -e .
```

(Any `torch>=2.4` works; installing the CPU wheel first keeps pip from pulling a large CUDA build.)
{triton_note(lab)}

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

reads your tree the way the grader does ("What is graded" above), runs the same tests on that code,
and prints a score table per test and, for every rubric item (`{lab_folder(lab).relative_to(ROOT).as_posix()}/rubric.json`),
the public part of your grade and the points it cannot check here (hidden tests on other inputs,
throughput, GPU items without CUDA).

```bash
inferlab demo                 # serves a small batch through your engine on the built-in tiny model
inferlab trace                # the demo's lifecycle log as tables, computed by this release's metrics code
inferlab bench                # times your engine on a fixed workload (not the grader's throughput ratio)
```

Each runs your code (your regions, the earlier labs' solutions, the later labs' stand-ins) whichever
`inferlab` is first on your PATH: started inside this folder, the command hands itself over to this
release's own tools.

{engine_section(lab)}## Also here

{chr(10).join(extras) if extras else "- Nothing else for this lab."}
"""


def triton_note(lab: str) -> str:
    """What the release says about Triton (courseware/release_code.py TRITON_LABS decides)."""
    if lab in TRITON_LABS:
        return ("`pip install -e .` also installs Triton (about 290 MB; Linux x86-64 only, where its wheels exist): "
                "your KV-store kernel is checked in Triton's interpreter on a CPU. Elsewhere that test is skipped, "
                "and the handout says what the interpreter cannot do.\n")
    return ("Triton is not needed here: this lab's code never imports it on a CPU "
            "(`pip install -e '.[kernels]'` adds it for a GPU).\n")


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
        if path.name == "README.md":
            (dest / path.name).write_text(handout_text(path, root), encoding="utf-8")   # shared parts included
        elif path.is_file() and path.suffix == ".py":
            (dest / path.name).write_text(rewrite_imports(path.read_text(encoding="utf-8")), encoding="utf-8")
        elif path.is_file():
            shutil.copy2(path, dest / path.name)
    if entry.nbgrader_source.is_dir():
        release_assignment(entry.nbgrader_source, dest / NOTEBOOK_DIR)
    handout = folder / "README.md"
    return handout.relative_to(root) if handout.is_file() else None


def copy_docs(root: Path, out: Path) -> list[str]:
    """The course docs the release's files cite, and those they cite in turn (courseware/release_refs.py);
    the README says which staff docs are cited but not shipped. Returns the docs shipped."""
    names, staff = docs_closure([text for _, text in release_texts(out)], root / "docs")
    (out / "docs").mkdir(exist_ok=True)
    for name in names:
        shutil.copy2(root / "docs" / name, out / "docs" / name)
    if staff:
        readme = out / "README.md"
        readme.write_text(readme.read_text(encoding="utf-8").rstrip("\n") + "\n- Course documents cited here but "
                          "not in this release, and why:\n" + not_shipped_docs(staff) + "\n", encoding="utf-8")
    return names


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
    slides, _ = copy_slides(root, out, lab) if (root / SLIDES).is_dir() else ([], {})
    (out / "README.md").write_text(readme(lab, tree, handout, *tutorials, slides), encoding="utf-8")
    copy_docs(root, out)
    (out / ".gitignore").write_text("__pycache__/\n*.egg-info/\n.venv/\n.pytest_cache/\nbuild/\n", encoding="utf-8")
    Manifest.of_folder(lab, tuple(later_labs(lab, root)), out).write(out)
    return out
