"""pytest plugin: write every selected test's outcome, points and markers to a JSON file.

Loaded with `-p labkit.score_plugin --inferlab-results PATH`. The self-check
and the project's CI read this file instead of pytest's exit code or console
text: a test that never reported (crash, collection error) is then visibly
missing rather than silently absent, and a skip can never pass for a pass.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

MESSAGE_LIMIT = 4000


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--inferlab-results", default=None, help="write per-test outcomes as JSON here")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--inferlab-results")
    if path:
        config.pluginmanager.register(OutcomeRecorder(Path(path)), "inferlab-results-recorder")


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
