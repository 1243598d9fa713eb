"""`inferlab release --lab labN --out DIR`: the repository a student gets for one lab (docs/design.md §3).

It contains `student_exercises/` with the regions of earlier labs filled in
with their solutions (a student of lab 3 gets a working block manager) and
lab N's and later labs' regions stubbed, the later labs' parts run by stand-ins
(courseware/later_labs.py, reference/standins/); lab N's public tests only; the
lab folder's public parts (handout, report template, rubric; its tests only
where they run) and the tutorials of its lab and the earlier ones, runnable on the release's engine
(courseware/release_tutorials.py; student edition: no answers, no sources); a README; and a small
installable `courseware` package with just what the tests and the self-check
need (the lab registry, the tiny model builder, `inferlab check`). It never
contains `reference/`, a lab's private parts (hidden tests, golden outputs,
bug zoo, private/): the earlier labs' solutions are the only solutions in it,
by design.
"""
from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

from labkit.tree import LABS, PACKAGE, ROOT, TESTS_DIR, ReferenceTree, filled_labs, generate, load_reference, write_package
from courseware.editions import edition
from labkit.labs import lab as lab_entry, lab_folder
from courseware.selfcheck import PRISTINE
from courseware.later_labs import engine_section, used_support, with_standins
from courseware.release_tutorials import copy_tutorials

# What a release needs from `courseware`: the tests build the tiny model, `inferlab check` scores. `labkit`
# (reading and scoring a student's tree, as the grader does) ships whole.
TOOL_MODULES = ("__init__.py", "tiny_model.py", "selfcheck.py", "terminal.py")
# The torch every install starts from, pinned (docs/design.md §5; README and .ci/run say the same, checked by
# tests/test_cli.py): an unpinned torch pulls GBs of CUDA wheels. The Gradescope bundle installs it too.
TORCH_VERSION = "2.13.0"


def earlier_labs(lab: str) -> list[str]:
    if lab not in LABS:
        raise ValueError(f"unknown lab {lab!r}; choose one of {', '.join(LABS)}")
    return list(LABS[:LABS.index(lab)])


def lab_test_files(tests_dir: Path, lab: str) -> list[Path]:
    """conftest.py, the support modules this lab's tests import, and its test modules (never another lab's)."""
    own = sorted(tests_dir.glob(f"test_{lab}_*.py"))
    if not own:
        raise FileNotFoundError(f"no public tests for {lab} in {tests_dir}")
    conftest = tests_dir / "conftest.py"
    return [conftest, *used_support(tests_dir, [conftest, *own])] + own


def release_package(tree: ReferenceTree, lab: str) -> dict[str, str]:
    """The modules of `student_exercises/` as lab `lab`'s release ships them (earlier labs filled, stand-ins on).

    What a student starts from: the grader and the self-check compare a
    student's files with it to find what was added or edited outside the regions.
    """
    return with_standins(generate(tree, filled_labs(earlier_labs(lab))), lab)


def copy_tests(root: Path, lab: str, dest_package: Path) -> list[str]:
    dest = dest_package / TESTS_DIR
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    for path in lab_test_files(root / PACKAGE / TESTS_DIR, lab):
        shutil.copy2(path, dest / path.name)
        names.append(path.name)
    return names


def dependencies(root: Path) -> list[str]:
    """The engine's runtime requirements, read from the course's pyproject (or installed metadata)."""
    try:
        import tomllib
        return list(tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"])
    except (ImportError, OSError, KeyError):
        requires = importlib.metadata.requires("inferlab") or []
        return [r for r in requires if "extra ==" not in r]


def pyproject(lab: str, dependencies: list[str]) -> str:
    deps = "".join(f'    "{d}",\n' for d in [*dependencies, "pytest>=8"])
    return f'''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "inferlab-{lab}"
version = "0.1.0"
description = "InferLab {lab}: student release"
requires-python = ">=3.10"
dependencies = [
{deps}]

[project.scripts]
inferlab = "courseware.selfcheck:main"

[tool.setuptools.packages.find]
include = ["{PACKAGE}*", "labkit*", "courseware*"]

[tool.pytest.ini_options]
testpaths = ["{PACKAGE}/{TESTS_DIR}"]
pythonpath = ["."]
addopts = "-ra"
'''


def readme(lab: str, tree: ReferenceTree, handout: Path | None, tutorials: list[str],
           left_out: dict[str, str]) -> str:
    earlier = earlier_labs(lab)
    rows = "".join(f"| `{r.region_id}` | `{r.path.replace('reference/', PACKAGE + '/', 1)}` | {r.task} |\n"
                   for r in tree.regions if r.lab == lab)
    filled = (f"The regions of {', '.join(earlier)} are already filled in with working solutions, so the "
              "engine around your part works.") if earlier else "This is the first lab: nothing is filled in yet."
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
    """The lab folder's public files (handout, report template, rubric, scripts); returns the handout's path, if any."""
    entry = lab_entry(lab, root)
    folder = entry.folder
    dest = out / folder.relative_to(root)
    dest.mkdir(parents=True, exist_ok=True)
    for path in entry.public_parts():
        if path.is_file():
            shutil.copy2(path, dest / path.name)
    handout = folder / "README.md"
    return handout.relative_to(root) if handout.is_file() else None


def make_release(lab: str, out: str | Path, root: Path = ROOT) -> Path:
    """Write the lab's student repository into `out` (which must be absent or empty)."""
    earlier = earlier_labs(lab)
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not empty; choose a new folder")
    tree = load_reference(root)
    out.mkdir(parents=True, exist_ok=True)
    write_package(release_package(tree, lab), out / PACKAGE)   # the engine runs, with stand-ins for later labs
    copy_tests(root, lab, out / PACKAGE)
    # What the student starts from, kept aside: the self-check reads their tree against it, as the grader does.
    shutil.copytree(out / PACKAGE, out / PRISTINE / PACKAGE)
    tools = out / "courseware"
    tools.mkdir()
    for name in TOOL_MODULES:
        shutil.copy2(root / "courseware" / name, tools / name)
    shutil.copytree(root / "labkit", out / "labkit", ignore=shutil.ignore_patterns("__pycache__"))
    handout = _copy_handout(root, lab, out)
    tutorials = copy_tutorials(root, out, lab) if (root / "tutorials").is_dir() else ([], {})
    (out / "docs").mkdir()
    shutil.copy2(root / "docs" / "design.md", out / "docs" / "design.md")   # the public tests cite it
    (out / "pyproject.toml").write_text(pyproject(lab, dependencies(root)), encoding="utf-8")
    (out / "README.md").write_text(readme(lab, tree, handout, *tutorials), encoding="utf-8")
    (out / ".gitignore").write_text("__pycache__/\n*.egg-info/\n.venv/\n.pytest_cache/\nbuild/\n", encoding="utf-8")
    return out
