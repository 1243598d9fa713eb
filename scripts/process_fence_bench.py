"""What the process fence costs per item: a trivial script item forked with and without it.

    python scripts/process_fence_bench.py [--items 30]

Forks the same one-line script from one fork server, alternating an item
without a fence and one with it (PID and mount namespaces, private /proc,
unprivileged user, the grader's leftover check), and prints the median wall
time of each from the request to the exit. The figure and the command are
recorded in docs/grading.md. Needs root (without it both kinds run unfenced).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from grading.execute import SANDBOX_UID
from grading.spawn import ForkServer, base_env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=30)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="inferlab-fence-bench-"))
    os.chmod(work, 0o755)
    (work / "item.py").write_text("print('done')\n")
    (work / "scratch").mkdir()
    fence = {"uid": SANDBOX_UID, "read": [str(work)], "write": [str(work / "scratch")]}
    server = ForkServer()
    times: dict[str, list[float]] = {"without": [], "with": []}
    try:
        for _ in range(args.items):
            for kind in times:
                started = time.monotonic()
                child = server.start("script", [str(work / "item.py")], work, base_env(),
                                     fence=fence if kind == "with" else None)
                child.wait(time.monotonic() + 60)
                times[kind].append(time.monotonic() - started)
    finally:
        server.close()
        shutil.rmtree(work, ignore_errors=True)
    for kind, values in times.items():
        print(f"{kind} the process fence: median {statistics.median(values) * 1000:.0f} ms over {len(values)} items")


if __name__ == "__main__":
    main()
