"""labkit/score_plugin.py's per-test time limit, on a throwaway test file: a loop fails its test, the rest run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = '''
import time

def test_loops_forever():
    while True:
        pass

def test_swallows_exceptions_while_it_loops():
    while True:
        try:
            time.sleep(0.01)
        except Exception:
            pass

def test_quick():
    assert 1 + 1 == 2
'''


def test_a_test_past_the_limit_fails_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_throwaway.py").write_text(TESTS)
    results = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-q", "-p", "no:cacheprovider",
                           "-p", "labkit.score_plugin", "--inferlab-results", str(results),
                           "--inferlab-test-timeout", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    tests = {nodeid.split("::")[-1]: t for nodeid, t in json.loads(results.read_text())["tests"].items()}
    assert tests["test_quick"]["outcome"] == "passed", proc.stdout
    for name in ("test_loops_forever", "test_swallows_exceptions_while_it_loops"):   # `except Exception` too
        assert tests[name]["outcome"] == "failed", (name, proc.stdout)
        assert "ran longer than 1 s" in tests[name]["message"], tests[name]["message"]
