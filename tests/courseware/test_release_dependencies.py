"""A release installs what its code imports (issue 33: lab 4's `kv_store.py` imports Triton, and the release did not list it).

For each lab's fresh release, every third-party module that a shipped file imports (its Python files, the
code cells of its notebooks) must come from a distribution that `pip install -e '.[EXTRAS]'` of the
release's own pyproject.toml brings in, directly or as a dependency of one: `dependencies` for the engine,
the tests and the commands; the `notebooks` extra for the tutorials and slide scripts; lab 4's Triton by
default (its public tests run the kernel in Triton's interpreter). Which distribution provides a module
and what each requires are read from this environment's installed metadata, so the check is as good as
the environment is complete; a module nothing here provides must be required under its own name.
"""
from __future__ import annotations

import ast
import importlib.metadata
import json
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from courseware.release import make_release
from courseware.release_code import TRITON_LABS
from labkit.labs import all_labs

LABS = [lab.lab_id for lab in all_labs()]
# Imported only where present, each behind a guard that falls back (and never by code a CPU run reaches).
OPTIONAL = {"flash_attn": "the flash-attn backend, used on a GPU when installed (the engine's README says how)"}


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("dependencies")
    return {lab: make_release(lab, base / lab) for lab in LABS}


def imported_modules(release: Path) -> dict[str, set[str]]:
    """Top-level module -> the files (relative to the release) that import it, absolute imports only."""
    sources: list[tuple[str, str]] = []
    for path in release.rglob("*.py"):
        if ".inferlab" not in path.parts:
            sources.append((path.relative_to(release).as_posix(), path.read_text(encoding="utf-8")))
    for path in release.rglob("*.ipynb"):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
                source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
                sources.append((path.relative_to(release).as_posix(), source))
    found: dict[str, set[str]] = {}
    for where, source in sources:
        for node in ast.walk(ast.parse(source)):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(where)
    return found


def local_modules(release: Path) -> set[str]:
    """Names the release itself provides: its packages and every module beside a test or a script."""
    return {p.stem for p in release.rglob("*.py")} | {p.name for p in release.rglob("*") if p.is_dir()}


def installed_closure(requirements: list[str], extras: set[str]) -> set[str]:
    """Canonical names of the distributions `requirements` bring in, following installed metadata."""
    seen: set[str] = set()
    queue = [(r, extras) for r in requirements]
    while queue:
        text, active = queue.pop()
        req = Requirement(text)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (active or {""})):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        queue += [(r, set(req.extras)) for r in requires]
    return seen


def test_the_closure_follows_extras_and_markers():
    """The helper itself: transformers brings tokenizers; an extra's requirement only when that extra is asked."""
    closure = installed_closure(["transformers>=5.0"], set())
    assert {"transformers", "tokenizers", "huggingface-hub"} <= closure
    assert "pytest-xdist" not in installed_closure(["inferlab"], set())
    if importlib.metadata.requires("inferlab"):        # an editable install of the course: its dev extra
        assert "pytest-xdist" in installed_closure(["inferlab[dev]"], set())


@pytest.mark.parametrize("lab", LABS)
def test_a_release_installs_what_its_files_import(releases, lab):
    release = releases[lab]
    project = tomllib.loads((release / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project.get("optional-dependencies", {})
    assert "notebooks" in extras, "the tutorials and slide scripts import matplotlib: the release must offer it"
    closure = installed_closure([*project["dependencies"], *(r for reqs in extras.values() for r in reqs)], set())
    providers = importlib.metadata.packages_distributions()
    local = local_modules(release)
    missing = []
    for module, files in sorted(imported_modules(release).items()):
        if module in sys.stdlib_module_names or module in local or module in OPTIONAL or module == "__future__":
            continue
        # Where this environment lacks the module (triton without the kernels extra), a requirement of its name.
        dists = {canonicalize_name(d) for d in providers.get(module, [])} or {canonicalize_name(module)}
        if not dists & closure:
            missing.append(f"{module} (from {sorted(dists) or 'no installed distribution'}), imported by "
                           f"{', '.join(sorted(files)[:3])}")
    assert not missing, f"{lab}'s release does not install:\n" + "\n".join(missing)


@pytest.mark.parametrize("lab", LABS)
def test_triton_is_installed_by_default_only_where_graded_code_imports_it_on_a_cpu(releases, lab):
    project = tomllib.loads((releases[lab] / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    default = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert ("triton" in default) == (lab in TRITON_LABS), default
    if lab in TRITON_LABS:
        assert "student_exercises/kernels/kv_store.py" in imported_modules(releases[lab])["triton"]
