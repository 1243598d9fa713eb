# Generated from assignments/shared/public/conftest.py by `inferlab exercises build`: edit it there, not here.
"""Shared setup of the public lab suites: which package is under test, markers, the tiny model.

`--impl=student` (the default) tests `student_exercises`, the code you write;
`--impl=reference` runs the same tests against the instructor's `reference`
package (only in the course repository), which is how CI proves that every
test can pass.

Rule for every fixture here: never import the package under test. A fixture
that raises is reported as an *error*, not a failure, and a broken exercise
must show up as a failing test that names the region to fix. Tests import the
implementation themselves, through `impl.module(...)`.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PACKAGES = {"student": "student_exercises", "reference": "reference"}
# One marker per lab whose suite is in this folder (`test_labN_*.py`): no list of labs to keep here.
LAB_MARKERS = {path.name.split("_")[1]: f"the public tests of {path.name.split('_')[1]} ({path.name})"
               for path in sorted(Path(__file__).parent.glob("test_lab*_*.py"))}
MARKERS = {
    **LAB_MARKERS,
    "stretch": "a stretch exercise (optional part of its lab)",
    "gpu": "needs a CUDA device (skipped without one)",
    "points(n)": "how many points the self-check gives this test",
    "covers(*region_ids)": "the exercise regions this test exercises",
}


@dataclass(frozen=True)
class Impl:
    """The package under test: `impl.module("engine.block_manager")` imports its module."""

    package: str

    def module(self, name: str) -> ModuleType:
        return importlib.import_module(f"{self.package}.{name}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--impl", choices=sorted(PACKAGES), default="student",
                     help="which package the lab tests import: student (student_exercises, default) "
                          "or reference (the instructor's solution, course repository only)")


def pytest_configure(config: pytest.Config) -> None:
    for name, description in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {description}")
    package = PACKAGES[config.getoption("--impl")]
    if importlib.util.find_spec(package) is None:
        raise pytest.UsageError(f"--impl={config.getoption('--impl')}: package {package!r} is not importable "
                                "(a student release contains only student_exercises)")


def pytest_report_header(config: pytest.Config) -> str:
    return f"inferlab labs: testing package {PACKAGES[config.getoption('--impl')]}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def impl(pytestconfig: pytest.Config) -> Impl:
    return Impl(PACKAGES[pytestconfig.getoption("--impl")])


@pytest.fixture(scope="session")
def engine_parts(impl: Impl):
    """A function giving the parts an engine of the package under test is built from (`LLM(..., parts=...)`).

    None means the package's own parts. In a student release the labs after
    the release's are stubs there, so their parts are stand-ins
    (`courseware.engine`, courseware/standins/). A function, not the parts:
    building stand-ins imports the package under test, which only a test may do.
    """
    def parts():
        if impl.package == PACKAGES["reference"]:
            return None
        from courseware.engine import engine_parts as tree_parts, standin_labs
        return tree_parts() if standin_labs() else None
    return parts


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """The built-in tiny Qwen3 (random weights, offline), built once and cached (INFERLAB_CACHE)."""
    from courseware.tiny_model import ensure_tiny_model
    return str(ensure_tiny_model())


@pytest.fixture(scope="session")
def config_only_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A folder with just a config.json: enough for Config, for tests that need no weights."""
    import json
    path = tmp_path_factory.mktemp("config_only")
    (path / "config.json").write_text(json.dumps(
        {"max_position_embeddings": 4096, "vocab_size": 1000, "hidden_size": 8}))
    return str(path)
