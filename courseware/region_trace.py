"""pytest plugin: record which exercise regions each test really executes (instructor tooling).

Loaded with `-p courseware.region_trace --inferlab-trace-regions PATH` while the
public suites run against `reference`. The project's CI compares the result
with each test's `@pytest.mark.covers(...)` declaration, so the region ->
tests table of `inferlab exercises list` cannot claim coverage that is not
there. Only lines inside region bodies of `reference/` are traced; everything
else costs one dictionary lookup per Python call.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--inferlab-trace-regions", default=None, help="write test -> executed regions as JSON here")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--inferlab-trace-regions")
    if path:
        config.pluginmanager.register(RegionTracer(Path(path)), "inferlab-region-tracer")


class RegionTracer:
    def __init__(self, path: Path):
        from labkit.tree import ROOT, load_reference
        self.path = path
        self.lines: dict[str, dict[int, str]] = {}
        tree = load_reference(ROOT)
        for relpath, source in tree.files.items():
            filename = str((ROOT / "reference" / relpath).resolve())
            for region in source.regions:
                first, last = region.body_lines
                for line in range(first, last + 1):
                    self.lines.setdefault(filename, {})[line] = region.region_id
        self.executed: dict[str, list[str]] = {}
        self._current: set[str] = set()

    def _local(self, frame: FrameType, event: str, arg: Any):
        if event == "line":
            region_id = self.lines[frame.f_code.co_filename].get(frame.f_lineno)
            if region_id is not None:
                self._current.add(region_id)
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any):
        if event == "call" and frame.f_code.co_filename in self.lines:
            return self._local
        return None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        self._current = set()
        previous = sys.gettrace()
        sys.settrace(self._global)
        try:
            yield
        finally:
            sys.settrace(previous)
            self.executed[item.nodeid] = sorted(self._current)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.executed, indent=1), encoding="utf-8")
