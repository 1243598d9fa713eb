"""Run many pytest sessions as forks of one process that has already imported torch and transformers.

    python tests/lab_zygote.py JOBS.json

Each of the CI's ~60 suite runs would otherwise spend most of its time
importing torch and transformers (several seconds each on a 2-core machine).
This process imports those third-party libraries once, then forks one child
per job; each child changes to its job's tree, puts the tree first on
sys.path and runs `pytest.main` there, so it imports its own
`student_exercises` (or `reference`) fresh and shares nothing with its
siblings but the already-imported libraries. The engine packages are never
imported here before forking.

JOBS.json: {"workers": N, "timeout": S, "jobs": [{"key", "cwd", "args", "log"}]}.
Writes, next to JOBS.json, `<name>.done.json`: key -> {"returncode", "wall_s"}.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path


def _preload() -> None:
    import numpy  # noqa: F401
    import pytest  # noqa: F401
    import rich.console  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    import transformers
    import xxhash  # noqa: F401
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM  # noqa: F401
    transformers.logging.set_verbosity_error()


def _child(job: dict) -> None:
    """In the forked child: run one pytest session and exit with its status (never return)."""
    code = 3
    try:
        log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir(job["cwd"])
        sys.path.insert(0, job["cwd"])
        import pytest
        code = int(pytest.main(job["args"]))
    except BaseException as err:  # noqa: BLE001 - report anything, then leave
        print(f"zygote child failed: {err!r}", flush=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    here = str(Path(__file__).resolve().parent)
    sys.path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    _preload()
    pending = list(spec["jobs"])
    running: dict[int, tuple[dict, float]] = {}
    done: dict[str, dict] = {}
    while pending or running:
        while pending and len(running) < spec["workers"]:
            job = pending.pop(0)
            pid = os.fork()
            if pid == 0:
                _child(job)
            running[pid] = (job, time.perf_counter())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            now = time.perf_counter()
            for child, (job, started) in list(running.items()):
                if now - started > spec["timeout"]:
                    os.kill(child, signal.SIGKILL)
            time.sleep(0.05)
            continue
        job, started = running.pop(pid)
        returncode = os.waitstatus_to_exitcode(status)
        done[job["key"]] = {"returncode": returncode, "wall_s": time.perf_counter() - started}
    Path(spec_path).with_suffix(".done.json").write_text(json.dumps(done, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
