"""The code a lab's release ships, as text, and its manifest: one definition for the release, the grader and CI.

A lab N release's code is:

- `student_exercises/`: the engine generated from `reference/`, the labs
  before N filled in with their solutions and N and later labs stubbed, plus
  lab N's public tests (`tests/`: its conftest, the support modules they
  import, its `test_labN_*.py`);
  (a lab without exercises, lab 5, gets every lab filled in and no tests);
- `.inferlab/pristine/student_exercises/`: the same package exactly as
  shipped, which the self-check reads the student's tree against;
- `courseware/`: the tools the tests and `inferlab` use, and the stand-ins of
  the later labs' parts, their `reference` imports pointed at
  `student_exercises` as in every generated module;
- `labkit/`, whole;
- `pyproject.toml`.

`courseware.release.make_release` writes this and adds the handout, the
tutorials and a README, then the manifest of everything. The grader hashes
the same texts (`release_manifest`) to know which files a student was
given, without writing a release. CI writes a student's tree from it with
other region bodies (`choose`), so the trees it tests are releases too.
"""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

from labkit.labs import exercise_labs, later_labs
from labkit.manifest import PRISTINE, Manifest
from labkit.tree import PACKAGE, ROOT, TESTS_DIR, BodyChoice, ReferenceTree, lab_test_files, load_reference, \
    release_package, rewrite_imports
from courseware.standins import standin_modules

# What a release needs of `courseware`: the engine it runs (`engine`), the self-check and demo
# (`selfcheck`, `terminal`), the tiny model and the oracle the tests use; and the later labs' stand-ins.
TOOL_MODULES = ("__init__.py", "engine.py", "oracle.py", "selfcheck.py", "terminal.py", "tiny_model.py",
                "standins/__init__.py")
# A lab without exercises measures the whole engine (lab 5): its release also ships the measurement commands
# (`inferlab bench`, `trace`, `make-tiny-model`) and the lab 5 results files' definitions its scripts write with.
MEASUREMENT_MODULES = ("measure_cli.py", "bench.py", "trace.py", "lab5_results.py")
# The torch every install starts from, pinned (docs/design.md §5; README and .ci/run say the same, checked by
# tests/test_cli.py): an unpinned torch pulls GBs of CUDA wheels. The Gradescope bundle installs it too.
TORCH_VERSION = "2.13.0"


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

[tool.setuptools.package-data]
courseware = ["manifest.json"]

[tool.pytest.ini_options]
testpaths = ["{PACKAGE}/{TESTS_DIR}"]
pythonpath = ["."]
addopts = "-ra"
'''


def _folder_texts(folder: Path, prefix: str) -> dict[str, str]:
    return {f"{prefix}/{p.relative_to(folder).as_posix()}": p.read_text(encoding="utf-8")
            for p in sorted(folder.rglob("*.py")) if "__pycache__" not in p.parts}


def release_code(lab: str, tree: ReferenceTree | None = None, root: Path = ROOT,
                 choose: BodyChoice | None = None) -> dict[str, str]:
    """Path (relative to the release root) -> text, of every code file of lab `lab`'s release.

    `choose` gives other region bodies for `student_exercises/` (a student's
    work, a mutant); the pristine copy is always what the release ships.
    """
    tree = tree or load_reference(root)
    tests_dir = root / PACKAGE / TESTS_DIR
    exercises = lab in exercise_labs(root)
    tests = {f"{TESTS_DIR}/{p.name}": p.read_text(encoding="utf-8")
             for p in (lab_test_files(tests_dir, lab) if exercises else [])}
    given = release_package(tree, lab) | tests
    package = (release_package(tree, lab, choose) | tests) if choose else given
    tools = [*TOOL_MODULES, *standin_modules(later_labs(lab, root)), *(() if exercises else MEASUREMENT_MODULES)]
    files = {f"{PACKAGE}/{path}": text for path, text in package.items()}
    files |= {f"{PRISTINE.as_posix()}/{PACKAGE}/{path}": text for path, text in given.items()}
    files |= {f"courseware/{name}": rewrite_imports((root / "courseware" / name).read_text(encoding="utf-8"))
              for name in tools}
    files |= _folder_texts(root / "labkit", "labkit")
    files["pyproject.toml"] = pyproject(lab, dependencies(root))
    return files


def release_manifest(lab: str, tree: ReferenceTree | None = None, root: Path = ROOT) -> Manifest:
    """The manifest of the release's code, as `make_release` records it (its handout and tutorials aside)."""
    return Manifest.of_texts(lab, tuple(later_labs(lab, root)), release_code(lab, tree, root))


def write_files(files: dict[str, str], dest: Path) -> None:
    for path, text in files.items():
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def write_release_code(lab: str, dest: Path, tree: ReferenceTree | None = None, root: Path = ROOT,
                       choose: BodyChoice | None = None) -> Path:
    """The release's code under `dest`, with its manifest: a tree that runs as the student's does."""
    files = release_code(lab, tree, root, choose)
    write_files(files, dest)
    Manifest.of_texts(lab, tuple(later_labs(lab, root)), files).write(dest)
    return dest
