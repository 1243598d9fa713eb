"""A tensor-parallel worker's own clock, for scripts/gpu_tp.py: its slow steps and its garbage collections.

Workers are spawned without the parent's script (reference/distributed/processes.py
hides it), so the benchmark hands the engine `traced_worker_main` in place of
`worker_main`; spawn finds this module by name on the sys.path the parent
passes down. Each worker appends one JSON line to
$GPU_TP_WORKER_TRACE_DIR/worker_<pid>.jsonl when it stops. Times are
time.monotonic(), one clock for every process of the machine, so a worker's
stall can be matched with rank 0's.
"""
from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path

SLOW_STEP_MS = 3.0     # a worker's host work for one step (message in hand -> launched) above this is logged


class Pauses:
    """This process's garbage collections (gc.callbacks): count, total and longest ms, by generation."""

    def __init__(self):
        self.by_generation: dict[int, list] = {}
        self.started: float | None = None
        self.long: list[tuple[float, int, float]] = []    # (monotonic time, generation, ms) of pauses over 2 ms

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.started = time.perf_counter()
        elif self.started is not None:
            ms = (time.perf_counter() - self.started) * 1e3
            entry = self.by_generation.setdefault(info["generation"], [0, 0.0, 0.0])
            entry[0], entry[1], entry[2] = entry[0] + 1, entry[1] + ms, max(entry[2], ms)
            if ms > 2.0 and len(self.long) < 50:
                self.long.append((round(time.monotonic(), 4), info["generation"], round(ms, 2)))

    def summary(self) -> dict:
        return {str(g): {"count": n, "total_ms": round(t, 2), "max_ms": round(m, 2)}
                for g, (n, t, m) in sorted(self.by_generation.items())}


def _traced_serve(plain_serve):
    def serve(self, channel):
        pauses, slow, steps = Pauses(), [], [0]
        gc.callbacks.append(pauses)
        plain_receive = channel.receive
        received = [time.perf_counter()]

        def receive():
            now = time.perf_counter()
            work_ms = (now - received[0]) * 1e3          # the previous step: message in hand -> launched
            if steps[0] > 1 and work_ms > SLOW_STEP_MS and len(slow) < 80:
                slow.append((steps[0], round(time.monotonic(), 4), round(work_ms, 2)))
            message = plain_receive()
            received[0] = time.perf_counter()
            steps[0] += 1
            return message
        channel.receive = receive
        try:
            return plain_serve(self, channel)
        finally:
            gc.callbacks.remove(pauses)
            path = Path(os.environ.get("GPU_TP_WORKER_TRACE_DIR", ".")) / f"worker_{os.getpid()}.jsonl"
            with open(path, "a") as f:
                f.write(json.dumps({"messages": steps[0], "slow_steps_index_time_host_ms": slow,
                                    "gc": pauses.summary(), "gc_pauses_over_2ms": pauses.long}) + "\n")
    return serve


def traced_worker_main(*args) -> None:
    """worker_main, with WorkerRunner.serve timing each step's host work and the garbage collections."""
    from reference.distributed import tp_runner
    tp_runner.WorkerRunner.serve = _traced_serve(tp_runner.WorkerRunner.serve)
    tp_runner.worker_main(*args)


def install(trace_dir: Path) -> None:
    """In the benchmark's process: engines built from now on start traced workers writing to trace_dir."""
    from reference.distributed import tp_runner
    os.environ["GPU_TP_WORKER_TRACE_DIR"] = str(trace_dir)
    tp_runner.worker_main = traced_worker_main


def read(trace_dir: Path, pids: list[int]) -> list[dict]:
    found = []
    for pid in pids:
        path = trace_dir / f"worker_{pid}.jsonl"
        if path.exists():
            found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found
