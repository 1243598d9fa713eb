"""Root conftest of a grading harness (written by the grader, never by a student).

Order matters, and is why this file exists: first the hidden tests are read
and compiled (`_inferlab_hidden`), then `_inferlab_boot.fence()`
(load what the engine needs, then fence the process: from there on nothing can
read the golden outputs or the instructor's sources, write outside scratch,
start a process or signal one, nor read the hidden tests' sources); then the
hidden test modules run (their imports, fenced), then the observation
recorder. Only after that do the hidden tests import `student_exercises`, the
harness's copy of the engine with the student's region bodies spliced in.
"""
from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

import _inferlab_boot
import _inferlab_hidden

HERE = os.path.dirname(os.path.abspath(__file__))
_COMPILED = _inferlab_hidden.compile_all(HERE)
SANDBOX = _inferlab_boot.fence()
_inferlab_hidden.execute(_COMPILED)
_spec = importlib.util.find_spec("student_exercises")
if _spec is None or not os.path.abspath(_spec.origin or "").startswith(HERE + os.sep):
    # An installed copy elsewhere must never stand in for the harness's package.
    raise pytest.UsageError(f"student_exercises resolves to {getattr(_spec, 'origin', None)}, not this harness")

pytest_plugins = ["_inferlab_observe"]


def pytest_sessionstart(session) -> None:
    """First line of the observations file: which fences were in force (informational only)."""
    path = os.environ.get("INFERLAB_OBSERVATIONS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"sandbox": SANDBOX}) + "\n")


def pytest_collection_modifyitems(config, items) -> None:
    """GPU tests cannot run without CUDA (the grader reports such items as blocked before running them)."""
    if torch.cuda.is_available():
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="needs CUDA"))
