"""The harness: a temp copy of the instructor's engine with one student's lab regions spliced in.

    <harness>/
        student_exercises/      generated from reference/: the student's bodies for the lab's regions
                                (by id), the reference bodies everywhere else
        hidden/<lab>/           the lab's hidden tests (observation only), from assignments/<lab>_*/hidden/
        conftest.py             ours: fence, then record observations
        _inferlab_*.py          the fence, the recorder, the hidden tests' drivers, the throughput runner
        pytest.ini              ours

The files of the last two rows are stored in grading/payload/ under exactly
these names, so the names the graded process imports are the files' names.

Nothing from the submission is copied but region bodies, so a student's
conftest.py, sitecustomize.py or edits outside the regions never run. The
package is named `student_exercises` (not `reference`) so that no installed
copy of the instructor's package can shadow it. `digest()` fingerprints the
tree, so the grader can tell when a graded process changed it.
"""
from __future__ import annotations

import functools
import io
import tokenize
import hashlib
import shutil
from collections.abc import Mapping
from pathlib import Path

from grading.paths import PAYLOAD, hidden_dir
from labkit.additions import Addition, apply
from labkit.tree import PACKAGE, ReferenceTree, generate, write_package
from labkit.regions import stub_body

PYTEST_INI = """[pytest]
# Written by the InferLab grader. The graded process reads only this file.
pythonpath = .
testpaths = hidden
python_files = test_*.py
console_output_style = classic
filterwarnings = ignore
markers =
    gpu: needs a CUDA device
    slow: takes more than a few seconds on a 2-core CPU
"""


@functools.lru_cache(maxsize=None)
def hidden_tests(lab: str) -> tuple[Path, ...]:
    """The lab's hidden test files: looked up once per process, not once per harness."""
    return tuple(sorted(hidden_dir(lab).glob("*.py")))


@functools.lru_cache(maxsize=None)
def payload_files() -> tuple[Path, ...]:
    """The modules every harness gets, by the names they run as (grading/payload/, less its __init__)."""
    return tuple(sorted(p for p in PAYLOAD.glob("*.py") if p.name != "__init__.py"))


def build_harness(dest: Path, lab: str, tree: ReferenceTree, bodies: Mapping[str, str] | None = None,
                  additions: Mapping[str, list[Addition]] | None = None) -> Path:
    """Write a harness for `lab` into `dest` (created; must not exist).

    `bodies` maps region id -> body to splice; a lab region missing from it
    gets the stub (a region the student did not write fails, visibly). With
    `bodies=None` every region keeps its reference body: the golden harness.
    `additions` (module path -> definitions the student added outside the
    regions) are inserted into those modules, as the student placed them.
    """
    return write_harness(dest, lab, harness_package(lab, tree, bodies, additions))


def write_harness(dest: Path, lab: str, package: Mapping[str, str]) -> Path:
    """Write a harness whose `student_exercises/` holds `package` (from `harness_package`) into `dest`."""
    dest.mkdir(parents=True)
    write_package(package, dest / PACKAGE)
    for path in payload_files():
        shutil.copyfile(path, dest / path.name)
    tests = dest / "hidden" / lab
    tests.mkdir(parents=True)
    for path in hidden_tests(lab):
        shutil.copyfile(path, tests / path.name)
    (dest / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
    return dest


def harness_package(lab: str, tree: ReferenceTree, bodies: Mapping[str, str] | None = None,
                    additions: Mapping[str, list[Addition]] | None = None) -> dict[str, str]:
    """The modules of the harness's `student_exercises/`: the engine with the student's code for `lab` in it."""
    if bodies is None:
        choose = None
    else:
        foreign = [rid for rid in bodies if not rid.startswith(f"{lab}.")]
        if foreign:
            raise ValueError(f"only {lab} regions may be spliced into a {lab} harness, not {foreign}")
        given = dict(bodies)

        def choose(region):
            if region.lab != lab:
                return None
            return given.get(region.region_id, stub_body(region))
    files = generate(tree, choose or (lambda region: None))
    for relpath, added in (additions or {}).items():
        files[relpath] = apply(files[relpath], added)
    return files


def digest(root: Path) -> str:
    """sha256 over every file's path and bytes (caches excluded): equal digests, unchanged harness."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or not path.is_file():
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def code_only(source: str) -> str:
    """A module's code without its comments and blank lines: what the golden outputs can depend on.

    Editing a hint or a region's task line (comments) changes no output. Not
    `ast.dump`: its text differs between Python versions, so golden outputs
    built on a GPU machine's Python would never match the CPU ones. Comment
    tokens are the same in every version this project supports.
    """
    lines = source.splitlines()
    inside_strings: set[int] = set()          # rows a multi-line string continues on: their text is code
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
        elif token.end[0] > token.start[0]:
            inside_strings.update(range(token.start[0] + 1, token.end[0] + 1))
    return "\n".join(line if row in inside_strings else line.rstrip()
                     for row, line in enumerate(lines, 1) if row in inside_strings or line.strip())


def source_fingerprint(lab: str, tree: ReferenceTree, extra: bytes = b"") -> str:
    """What the golden outputs of `lab` depend on: the engine, the hidden tests, the harness files.

    The release-only stand-ins are not part of it: they live in courseware/,
    not in the engine the harness copies, so editing one changes no output and
    cannot make a GPU golden file stale (only a GPU machine can rebuild one).
    """
    h = hashlib.sha256()
    for relpath in sorted(tree.texts):
        h.update(relpath.encode() + b"\0" + code_only(tree.texts[relpath]).encode())
    for path in [*hidden_tests(lab), *payload_files()]:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(PYTEST_INI.encode() + extra)
    return h.hexdigest()
