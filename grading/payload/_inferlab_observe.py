"""pytest plugin of the graded process: record what the code under test did, never judge it.

Copied into every harness as `_inferlab_observe.py`; standard library and
pytest only.

A hidden test drives the submission and calls `observe(key, value)` for each
thing worth checking (a block table, a return value, the exception type a call
raised, a lifecycle log with its times dropped). At the end of each test one
JSON line goes to the observations file:

    {"test": nodeid, "obs": [[key, value], ...], "complete": bool, "error": str | null}

That file is the only thing the grader reads from this process, and it does
not decide anything: a separate process that never imports student code
compares it with the reference's observations of the same tests (the golden
outputs, which never reach this process). Forging a passing file therefore
means knowing the reference's outputs, i.e. solving the exercise.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

import pytest

ENV = "INFERLAB_OBSERVATIONS"
PACKAGE = "student_exercises"
VALUE_LIMIT = 1_000_000      # characters of one test's JSON line


def plain(value: Any, depth: int = 0) -> Any:
    """A JSON value for `value`: containers become lists and dicts, numbers stay numbers.

    Student code may return tuples, numpy integers or tensors where the
    reference returns lists; those compare equal once plain. Anything else is
    recorded by type name, which never matches a reference value by accident.
    """
    if depth > 50:
        return "<too deep>"
    if value is None:
        return None
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return float(value)
    if isinstance(value, dict):
        return {str(k): plain(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, depth + 1) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):          # numpy / torch scalars and arrays
        try:
            return plain(value.tolist(), depth + 1)
        except Exception:  # noqa: BLE001 - record the type instead
            pass
    if hasattr(value, "keys") and hasattr(value, "__getitem__"):     # OrderedDict-like mappings
        try:
            return {str(k): plain(value[k], depth + 1) for k in value.keys()}
        except Exception:  # noqa: BLE001
            pass
    return f"<{type(value).__name__}>"


class Observer:
    """The `observe` fixture: `observe(key, value)`, and `observe.call(key, fn, *args)` for calls that may raise."""

    def __init__(self) -> None:
        self.items: list[list[Any]] = []

    def __call__(self, key: str, value: Any) -> None:
        self.items.append([str(key), plain(value)])

    def call(self, key: str, fn, *args: Any, **kwargs: Any) -> Any:
        """Record fn's return value, or the type of what it raised; returns the value (None if it raised)."""
        try:
            result = fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the exception type is the observation
            self.items.append([str(key), {"raised": type(err).__name__}])
            return None
        self.items.append([str(key), {"returned": plain(result)}])
        return result


def error_text(call: pytest.CallInfo) -> str:
    """What went wrong, without any line of the hidden test: the frames in the engine, then the exception.

    Never pytest's report text: that quotes the hidden test's source, and the
    error reaches the result and the student's feedback.
    """
    info = call.excinfo
    if info is None:
        return "failed"
    frames = []
    for entry in info.traceback:
        path = str(entry.path)
        marker = os.sep + PACKAGE + os.sep
        if marker in path:
            frames.append(f"  {PACKAGE}/{path.split(marker, 1)[1]}:{entry.lineno + 1} in {entry.name}")
    try:
        message = str(info.value).strip().splitlines()
    except Exception:  # noqa: BLE001 - a student's exception whose __str__ fails
        message = ["<unprintable>"]
    return "\n".join([*frames[-8:], f"E   {info.typename}: {message[0][:500] if message else ''}"])


class ObservationRecorder:
    """Writes one line per test when the test is over (setup, call and teardown all done)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.current: dict[str, Observer] = {}
        self.errors: dict[str, str] = {}
        self.passed: dict[str, bool] = {}

    def observer_for(self, nodeid: str) -> Observer:
        return self.current.setdefault(nodeid, Observer())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        outcome = yield
        report = outcome.get_result()
        if report.failed and item.nodeid not in self.errors:
            self.errors[item.nodeid] = f"{report.when}: {error_text(call)}"
        if report.when == "call":
            self.passed[item.nodeid] = report.passed

    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        observer = self.current.pop(nodeid, Observer())
        record = {"test": nodeid, "obs": observer.items,
                  "complete": bool(self.passed.get(nodeid)) and nodeid not in self.errors,
                  "error": self.errors.get(nodeid)}
        line = json.dumps(record, ensure_ascii=True)
        if len(line) > VALUE_LIMIT:
            record = {"test": nodeid, "obs": [], "complete": False,
                      "error": f"observations too large ({len(line)} characters)"}
            line = json.dumps(record)
        with open(self.path, "a", encoding="utf-8") as out:
            out.write(line + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(ENV)
    if path:
        config.pluginmanager.register(ObservationRecorder(path), "inferlab-observations")


@pytest.fixture
def observe(request: pytest.FixtureRequest) -> Observer:
    recorder: ObservationRecorder | None = request.config.pluginmanager.get_plugin("inferlab-observations")
    if recorder is None:
        return Observer()                 # run outside the grader (debugging a hidden test by hand)
    return recorder.observer_for(request.node.nodeid)
