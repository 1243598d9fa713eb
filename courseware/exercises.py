"""`inferlab exercises build | check | list`: the student copy of the reference engine.

`student_exercises/` mirrors every module of `reference/` with each exercise
region's body replaced by `raise NotImplementedError("<id>")` (markers, tasks
and hints kept) and `reference.` imports renamed. It is generated, committed,
and checked for staleness in CI, so the exercises can never drift from the
engine they were cut out of.

`student_exercises/tests/` is generated too: the public suites are written
in each lab's folder (`assignments/labN_<topic>/public/`, fixtures shared by
all of them in `assignments/shared/public/`) and copied here, one flat folder
with one conftest.py, which is what a student runs.

The same generator, with some labs "filled" (their reference bodies kept),
makes the tree a student gets for a later lab (`inferlab release`), and, with
one region body patched, each bug-zoo mutant.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from courseware.regions import (
    Region,
    RegionError,
    SourceFile,
    check_inside_functions,
    parse_regions,
    render,
    stub_body,
)

from courseware.labs import ROOT, all_labs, exercise_labs, shared_public  # noqa: E402

REFERENCE = "reference"
PACKAGE = "student_exercises"
TESTS_DIR = "tests"   # inside PACKAGE: the public suites, copied from the lab folders
LABS = tuple(exercise_labs(ROOT))   # from the registry (courseware/labs.py)

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


def _generated_paths(package_dir: Path) -> set[str]:
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
    for relpath in sorted(_generated_paths(package_dir) - set(files)):
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


def student_package(root: Path = ROOT) -> dict[str, str]:
    """The whole committed `student_exercises/`: every region stubbed, plus the public suites."""
    return generate(load_reference(root)) | public_suite(root)


def build(root: Path = ROOT) -> list[str]:
    """Regenerate `student_exercises/` with every region stubbed; returns the modules rewritten."""
    return write_package(student_package(root), root / PACKAGE)


def stale(root: Path = ROOT) -> list[str]:
    """Generated modules that differ from what `build` would write now (missing, changed, or extra)."""
    expected = student_package(root)
    package_dir = root / PACKAGE
    problems = []
    for relpath, text in expected.items():
        path = package_dir / relpath
        if not path.is_file():
            problems.append(f"{PACKAGE}/{relpath} (missing)")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{PACKAGE}/{relpath} (differs from its source: {text.split(' ', 4)[3]})")
    for relpath in sorted(_generated_paths(package_dir) - set(expected)):
        problems.append(f"{PACKAGE}/{relpath} (nothing generates it any more)")
    return problems


# -- listing --------------------------------------------------------------------------------------

def _covers_of(decorators: list[ast.expr]) -> list[str]:
    """Region ids named by `pytest.mark.covers(...)` among decorator (or pytestmark) expressions."""
    ids = []
    for node in decorators:
        for call in ast.walk(node):
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "covers"):
                ids += [arg.value for arg in call.args if isinstance(arg, ast.Constant)]
    return ids


def covering_tests(root: Path = ROOT) -> dict[str, list[str]]:
    """Region id -> public tests that declare they cover it (`@pytest.mark.covers`), read statically.

    CI checks these declarations against what each test really executes
    (tests/test_lab_suites.py), so the listing cannot claim coverage that is not there.
    """
    found: dict[str, list[str]] = {}
    for path in (path for lab in all_labs(root) for path in lab.public_tests()):
        module = ast.parse(path.read_text(encoding="utf-8"))
        module_marks = [node.value for node in module.body if isinstance(node, ast.Assign)
                        and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)]
        shared = _covers_of(module_marks)
        for node in module.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                for region_id in dict.fromkeys(shared + _covers_of(node.decorator_list)):
                    found.setdefault(region_id, []).append(f"{path.stem}::{node.name}")
    return found


def region_table(root: Path = ROOT):
    """A Rich table of every region: lab, id, file, lines, covering public tests."""
    from rich.table import Table
    tree = load_reference(root)
    covers = covering_tests(root)
    table = Table(title="Exercise regions")
    for header in ("lab", "region", "file", "lines", "public tests"):
        table.add_column(header, overflow="fold")
    for region in sorted(tree.regions, key=lambda r: (r.lab, r.path, r.begin_line)):
        tests = covers.get(region.region_id, [])
        table.add_row(region.lab, region.region_id, region.path, f"{region.begin_line}-{region.end_line}",
                      "\n".join(tests) if tests else "[red](none)[/red]")
    return table


def command(action: str, root: Path = ROOT, console=None) -> int:
    """`inferlab exercises build | check | list`."""
    from rich.console import Console
    from rich.markup import escape
    from courseware.terminal import make_console
    console = console or make_console()
    if action == "build":
        changed = build(root)
        console.print(f"{PACKAGE}/: {len(changed)} module(s) written or removed"
                      + (": " + ", ".join(changed) if changed else " (already up to date)"))
        return 0
    if action == "check":
        problems = stale(root)
        if problems:
            console.print(f"[bold red]{PACKAGE}/ is stale[/bold red] (run `inferlab exercises build`):")
            for problem in problems:
                console.print(f"  {escape(problem)}", soft_wrap=True)
            return 1
        console.print(f"{PACKAGE}/ matches {REFERENCE}/ ({len(load_reference(root).regions)} regions)")
        return 0
    if action == "list":
        console.print(region_table(root))
        return 0
    raise ValueError(f"unknown exercises action {action!r}")
