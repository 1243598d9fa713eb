"""The reference tree and the packages generated from it: the one place regions become code.

`load_reference` parses every module of `reference/` and its exercise
regions; `generate` renders them into a `student_exercises` package, each
region given the body a `BodyChoice` picks (the stub, the reference's, a
student's, a mutant's) and `reference.` imports renamed, so a generated
package never runs the solution by accident. The committed
`student_exercises/` (`inferlab exercises build`), a lab's release, the
grader's harness, the self-check's copy and every bug-zoo mutant are all
made here, which is why they cannot disagree about what a region is.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from labkit.regions import (
    Region,
    RegionError,
    SourceFile,
    check_inside_functions,
    parse_regions,
    render,
    stub_body,
)

from labkit.labs import ROOT, all_labs, earlier_labs, exercise_labs, shared_public

REFERENCE = "reference"
PACKAGE = "student_exercises"
TESTS_DIR = "tests"   # inside PACKAGE: the public suites, copied from the lab folders
LABS = tuple(exercise_labs(ROOT))   # from the registry (labkit/labs.py)

_IMPORT_RE = re.compile(rf"^(?P<lead>[ \t]*(?:from|import)[ \t]+){REFERENCE}(?=[.\s])", re.M)


def header(relpath: str) -> str:
    """First line of every generated module: where it came from and what students may change."""
    return (f"# Generated from {REFERENCE}/{relpath} by `inferlab exercises build`. "
            "Write your code only inside the EXERCISE regions.\n")


def test_header(source: str) -> str:
    """First line of every generated public test module: where to edit it instead."""
    return f"# Generated from {source} by `inferlab exercises build`: edit it there, not here.\n"


def public_suite(root: Path = ROOT) -> dict[str, str]:
    """`tests/<name>` -> text: the shared fixtures and every lab's public tests, as the student runs them."""
    out: dict[str, str] = {}
    sources = [*shared_public(root), *(path for lab in all_labs(root) for path in sorted(lab.public.glob("*.py")))]
    for path in sources:
        name = f"{TESTS_DIR}/{path.name}"
        rel = path.relative_to(root).as_posix()
        if name in out:
            raise ValueError(f"{rel}: another public module is also called {path.name}; public file names are "
                             "unique across labs (they land in one folder)")
        out[name] = test_header(rel) + path.read_text(encoding="utf-8")
    return out


def rewrite_imports(text: str, package: str = PACKAGE) -> str:
    """Point `from reference.x import y` at the student package, so it never runs the solution."""
    return _IMPORT_RE.sub(lambda m: m["lead"] + package, text)


@dataclass
class ReferenceTree:
    """Every module of `reference/`, parsed, keyed by its path relative to `reference/`."""

    root: Path
    files: dict[str, SourceFile]
    texts: dict[str, str]

    @property
    def regions(self) -> list[Region]:
        return [region for source in self.files.values() for region in source.regions]

    def region(self, region_id: str) -> tuple[str, Region]:
        """(relative path, region) for an id; KeyError names the known ids."""
        for relpath, source in self.files.items():
            for region in source.regions:
                if region.region_id == region_id:
                    return relpath, region
        raise KeyError(f"no exercise region {region_id!r} in {REFERENCE}/ "
                       f"(known: {', '.join(r.region_id for r in self.regions)})")

    def body(self, region_id: str) -> str:
        relpath, region = self.region(region_id)
        return self.files[relpath].body(region)


def load_reference(root: Path = ROOT) -> ReferenceTree:
    """Parse and validate every region in `reference/`: ids unique, regions inside functions."""
    base = root / REFERENCE
    if not base.is_dir():
        raise FileNotFoundError(f"no {REFERENCE}/ package under {root}: the generator runs in the course repository")
    files: dict[str, SourceFile] = {}
    texts: dict[str, str] = {}
    seen: dict[str, str] = {}
    for path in sorted(base.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        relpath = path.relative_to(base).as_posix()
        text = path.read_text(encoding="utf-8")
        source = parse_regions(text, f"{REFERENCE}/{relpath}")
        check_inside_functions(text, source)
        for region in source.regions:
            if region.region_id in seen:
                raise RegionError(f"{source.path}:{region.begin_line}: region id {region.region_id} is also "
                                  f"used in {seen[region.region_id]}")
            seen[region.region_id] = source.path
        files[relpath], texts[relpath] = source, text
    return ReferenceTree(root, files, texts)


BodyChoice = Callable[[Region], str | None]


def filled_labs(labs: Iterable[str]) -> BodyChoice:
    """Keep the reference bodies of `labs`, stub every other region."""
    keep = set(labs)
    return lambda region: None if region.lab in keep else stub_body(region)


def generate(tree: ReferenceTree, choose: BodyChoice | None = None,
             package: str = PACKAGE) -> dict[str, str]:
    """Module path inside the package -> generated text.

    `choose(region)` gives the body to write (None keeps the reference body);
    by default every region is stubbed. Each output is parsed once more, so a
    generator bug can never ship a module that does not import.
    """
    choose = choose or filled_labs(())
    out: dict[str, str] = {}
    for relpath, source in tree.files.items():
        text = rewrite_imports(render(source, choose), package)
        try:
            ast.parse(text, filename=f"{package}/{relpath}")
        except SyntaxError as err:
            raise RegionError(f"{package}/{relpath}: generated module does not parse ({err.msg}, line "
                              f"{err.lineno}); check the regions of {source.path}") from err
        out[relpath] = header(relpath) + text
    return out


def generated_paths(package_dir: Path) -> set[str]:
    """Module paths under a generated package (all of it is generated)."""
    if not package_dir.is_dir():
        return set()
    return {path.relative_to(package_dir).as_posix() for path in package_dir.rglob("*.py")
            if "__pycache__" not in path.parts}


def write_package(files: Mapping[str, str], package_dir: Path) -> list[str]:
    """Write generated modules; delete generated modules that no longer exist. Returns what changed."""
    changed = []
    for relpath, text in files.items():
        path = package_dir / relpath
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(relpath)
    for relpath in sorted(generated_paths(package_dir) - set(files)):
        (package_dir / relpath).unlink()
        changed.append(relpath)
    for folder in sorted((p for p in package_dir.rglob("*") if p.is_dir()), reverse=True):
        if folder.name == "__pycache__":
            continue
        if not any(folder.iterdir()):
            folder.rmdir()
    return changed


def write_tree(dest: Path, choose: BodyChoice | None = None, root: Path = ROOT) -> Path:
    """A self-contained copy of the student package under `dest`, with the public tests.

    Used for the trees CI tests (all stubbed, some labs filled, one mutant):
    `dest/student_exercises/` is importable once `dest` is on sys.path.
    """
    write_package(generate(load_reference(root), choose) | public_suite(root), dest / PACKAGE)
    return dest


def splice(package_dir: Path, bodies: Mapping[str, str], package: str = PACKAGE) -> list[str]:
    """Replace the bodies of the regions named in `bodies` inside a generated package, in place.

    This is how a filled-in copy is made from a student's tree (and how the
    grader will put a student's regions into its own copy): regions are found
    by id, whatever the line numbers. Returns the ids spliced; raises KeyError
    for an id the package does not have.
    """
    done: list[str] = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir)
        if rel.parts[0] == TESTS_DIR:
            continue
        source = parse_regions(path.read_text(encoding="utf-8"), str(path))
        ids = [r.region_id for r in source.regions if r.region_id in bodies]
        if ids:
            text = render(source, lambda region: bodies.get(region.region_id))
            path.write_text(rewrite_imports(text, package), encoding="utf-8")
            done += ids
    missing = sorted(set(bodies) - set(done))
    if missing:
        raise KeyError(f"no region(s) {', '.join(missing)} under {package_dir}")
    return done


# -- what a lab's release gives the student --------------------------------------------------------

def release_package(tree: ReferenceTree, lab: str, choose: BodyChoice | None = None) -> dict[str, str]:
    """The modules of `student_exercises/` as lab `lab`'s release ships them (earlier labs filled in).

    What a student starts from: the grader and the self-check compare a
    student's files with it to find what was added or edited outside the regions.
    """
    return generate(tree, choose or filled_labs(earlier_labs(lab, tree.root)))


def lab_test_files(tests_dir: Path, lab: str) -> list[Path]:
    """conftest.py, the support modules this lab's tests import, and its test modules (never another lab's)."""
    own = sorted(tests_dir.glob(f"test_{lab}_*.py"))
    if not own:
        raise FileNotFoundError(f"no public tests for {lab} in {tests_dir}")
    conftest = tests_dir / "conftest.py"
    return [conftest, *used_support(tests_dir, [conftest, *own])] + own


def used_support(tests_dir: Path, tests: list[Path]) -> list[Path]:
    """The `lab_*.py` support modules that `tests` import, directly or through each other.

    A release gets only the support modules its own tests import, which keeps a
    later lab's steps out of it (lab 1's test doubles script a recompute
    preemption, which is part of lab 3).
    """
    support = {path.stem: path for path in tests_dir.glob("lab_*.py")}
    wanted: set[str] = set()
    queue = list(tests)
    while queue:
        text = queue.pop().read_text(encoding="utf-8")
        for name, path in support.items():
            if name not in wanted and re.search(rf"^\s*(from|import)\s+{name}\b", text, re.M):
                wanted.add(name)
                queue.append(path)
    return [support[name] for name in sorted(wanted)]
