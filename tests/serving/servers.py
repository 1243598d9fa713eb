"""Real `inferlab serve` processes on 127.0.0.1 for the serving tests, and small clients of them.

A server is a subprocess (its own signals, its own event loop, its exit code),
started on a free port and waited for within a deadline; `stop` sends SIGINT
and fails the test if it does not exit in time. Every loop here is bounded.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

MODEL = "tiny"
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    log: Path
    proc: subprocess.Popen
    output: Path

    def stop(self, sig: int = signal.SIGINT, timeout: float = STOP_TIMEOUT_S) -> float:
        """Signal the server and wait for it to exit; returns the seconds it took."""
        start = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"the server did not exit within {timeout} s of signal {sig}")
        return time.monotonic() - start

    def text(self) -> str:
        """Everything the server wrote to stdout and stderr so far."""
        return self.output.read_text(errors="replace")

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def metric(self, name: str, **labels: str) -> float:
        """One sample of /metrics (`inferlab:NAME`), summed over label values not given."""
        from prometheus_client.parser import text_string_to_metric_families
        total, found = 0.0, False
        for family in text_string_to_metric_families(httpx.get(f"{self.url}/metrics").text):
            for sample in family.samples:
                if sample.name == f"inferlab:{name}" and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total, found = total + sample.value, True
        assert found, f"inferlab:{name} {labels or ''} not in /metrics"
        return total

    def wait_idle(self, timeout: float = 20) -> None:
        """Until nothing runs, waits or holds a KV block; fails the test after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.metric("num_requests_running") or self.metric("num_requests_waiting") \
                or self.metric("kv_cache_usage_perc"):
            assert time.monotonic() < deadline, "the server still runs requests or holds KV blocks"
            time.sleep(0.1)


def start_server(model_dir: str, tmp_path: Path, *flags: str, wait: bool = True) -> Server:
    """`inferlab serve` on a free port, its lifecycle log and output under tmp_path; waits for /health."""
    port = free_port()
    log, output = tmp_path / f"lifecycle-{port}.jsonl", tmp_path / f"server-{port}.out"
    with open(output, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "inferlab.cli", "serve", model_dir, "--port", str(port),
                                 "--served-model-name", MODEL, "--lifecycle-log", str(log), *flags],
                                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    server = Server(f"http://127.0.0.1:{port}", log, proc, output)
    deadline = time.monotonic() + START_TIMEOUT_S
    while wait:
        try:
            if httpx.get(f"{server.url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"server did not start:\n{server.text()}")
        time.sleep(0.3)
    return server
