"""pytest plugin: write every selected test's outcome, points and markers to a JSON file.

Loaded with `-p labkit.score_plugin --inferlab-results PATH`. The self-check
and the project's CI read this file instead of pytest's exit code or console
text: a test that never reported (crash, collection error) is then visibly
missing rather than silently absent, and a skip can never pass for a pass.

`--inferlab-test-timeout S` stops a test's setup or call after S seconds and
fails it, naming the line it was on: without it, an endless loop in a
student's region hung `inferlab check` with nothing on the screen (its output
is captured until the run ends), while the grader times the same code out
item by item. The limit is a SIGALRM timer, so it interrupts Python code (a
loop) but not one long native call, and it exists only where the platform
has one (not on Windows, where the tests then run unlimited).
"""
from __future__ import annotations

import importlib.util
import json
import signal
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

MESSAGE_LIMIT = 4000


class TestTimeLimit(BaseException):
    """Raised inside a test at its time limit. Not an Exception, so `except Exception` in the code under test
    does not swallow it."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--inferlab-results", default=None, help="write per-test outcomes as JSON here")
    parser.addoption("--inferlab-test-timeout", type=float, default=None,
                     help="fail a test whose setup or call runs longer than this many seconds")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--inferlab-results")
    if path:
        config.pluginmanager.register(OutcomeRecorder(Path(path)), "inferlab-results-recorder")
    limit = config.getoption("--inferlab-test-timeout")
    if limit and hasattr(signal, "setitimer"):
        config.pluginmanager.register(TimeLimit(limit), "inferlab-test-timeout")


class TimeLimit:
    """Each test's setup and call get `seconds` of wall time; past it the test fails with TestTimeLimit."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    @contextmanager
    def _limited(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():   # signals reach the main thread only
            yield
            return

        def expire(signum, frame):
            raise TestTimeLimit(f"the test ran longer than {self.seconds:g} s, the self-check's limit per test "
                                "(an endless loop? its traceback ends on the line it was running; "
                                "the grader stops slow items too)")

        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item):
        with self._limited():
            yield

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        with self._limited():
            yield


def _marker_args(item: pytest.Item, name: str) -> list[Any]:
    return [arg for mark in item.iter_markers(name) for arg in mark.args]


class OutcomeRecorder:
    """Collects what pytest selected and how each test ended."""

    def __init__(self, path: Path):
        self.path = path
        self.tests: dict[str, dict[str, Any]] = {}
        self.collection_errors: list[str] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.collection_errors.append(f"{report.nodeid}: {str(report.longrepr)[:MESSAGE_LIMIT]}")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            points = _marker_args(item, "points")
            self.tests[item.nodeid] = {
                "name": item.name,
                "file": item.location[0],
                "points": points[0] if points else 1,
                "labs": sorted({m.name for m in item.iter_markers() if m.name.startswith("lab")}),
                "stretch": item.get_closest_marker("stretch") is not None,
                "gpu": item.get_closest_marker("gpu") is not None,
                "covers": sorted(set(_marker_args(item, "covers"))),
                "outcome": None,
                "message": "",
                "duration": 0.0,
            }

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.tests.get(report.nodeid)
        if entry is None:
            return
        entry["duration"] += report.duration
        if report.when == "call":
            outcome = report.outcome
        elif report.failed:
            outcome = "error"                      # a fixture failed: the test never ran
        elif report.skipped:
            outcome = "skipped"
        else:
            return
        if entry["outcome"] in (None, "passed"):
            entry["outcome"] = outcome
            if outcome == "skipped" and isinstance(report.longrepr, tuple):
                entry["message"] = str(report.longrepr[2])
            elif outcome != "passed":
                entry["message"] = report.longreprtext[-MESSAGE_LIMIT:]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        impl = session.config.getoption("--impl", default=None)
        package = {"student": "student_exercises", "reference": "reference"}.get(impl or "")
        spec = importlib.util.find_spec(package) if package else None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({
            "exitstatus": int(exitstatus),
            "impl": impl,
            "package_origin": spec.origin if spec else None,
            "collection_errors": self.collection_errors,
            "tests": self.tests,
        }, indent=1), encoding="utf-8")
