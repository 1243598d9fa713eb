"""Running hidden tests in a graded process and reading back what it observed (never what it concluded).

Shared by `golden build` (on the reference harness) and `grade run` (on each
student's harness), so golden outputs and student outputs are produced by the
very same path.
"""
from __future__ import annotations

import atexit
import importlib.util
import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grading.paths import hidden_roots, private_modules, python_roots
from grading.spawn import ChildResult, ForkServer, FreshSpawner, base_env

OBSERVATIONS = "observations.jsonl"
MAX_OBSERVATION_BYTES = 32 << 20


@dataclass(frozen=True)
class Fence:
    """What graded processes may see: their harness, the model and Python (read), nothing of the hidden roots.

    The hidden roots are the whole course repository plus the run's own
    folders (submissions, results): deny by default, so a folder added to
    the repository is hidden without anyone listing it.
    """

    model_dir: Path
    hidden: tuple[str, ...]
    landlock: bool = True
    programs: tuple[str, ...] = ()       # executables a graded process may start (GPU machines only)
    devices: tuple[str, ...] = ()        # device files it may open read-write (GPU machines only)

    @classmethod
    def for_run(cls, model_dir: Path, *extra_hidden: Path, landlock: bool = True, gpu: bool = False) -> "Fence":
        hidden = [str(p.resolve()) for p in [*hidden_roots(), *map(Path, extra_hidden)]]
        programs, devices = (gpu_programs(), gpu_devices()) if gpu else ((), ())
        return cls(Path(model_dir).resolve(), tuple(dict.fromkeys(hidden)), landlock, programs, devices)

    def readable(self, harness: Path) -> list[str]:
        """Roots a graded process may read even inside a hidden one: its harness, the model, Python."""
        return [str(harness), str(self.model_dir), *map(str, python_roots())]


def gpu_programs() -> tuple[str, ...]:
    """What Triton and torch.compile start when they compile on a GPU: Triton's ptxas (and tools), C/C++ compilers.

    The price: a graded process on a GPU machine may run these compilers
    (under Landlock they inherit the fence: they read only the allowed roots
    and write only to scratch). Without them no Triton kernel, the student's
    or the engine's, could be compiled once the fence is up.
    """
    found: list[str] = []
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin:
        tools = Path(spec.origin).parent / "backends" / "nvidia" / "bin"
        found += [str(p) for p in sorted(tools.glob("*")) if p.is_file()]
    found += [path for path in (shutil.which(name) for name in ("cc", "gcc", "clang", "c++", "g++", "clang++")) if path]
    return tuple(dict.fromkeys(found))


def gpu_devices() -> tuple[str, ...]:
    """The NVIDIA device files a CUDA context opens (read-write, with ioctls)."""
    return tuple(str(p) for p in sorted(Path("/dev").glob("nvidia*")) if not p.is_dir())


def child_env(fence: Fence, harness: Path, scratch: Path, gpu: bool = False) -> dict[str, str]:
    """A graded process's whole environment: offline, one thread, caches and temp files in scratch.

    Only a GPU item's process (`gpu`) sees the GPU and gets the fence's GPU
    allowances; every other one runs with CUDA_VISIBLE_DEVICES empty, so on a
    GPU machine a CPU item neither pays for a CUDA context nor touches the GPU,
    and runs exactly as it does on a CPU machine.
    """
    for name in ("home", "tmp", "cache"):
        (scratch / name).mkdir(parents=True, exist_ok=True)
    env = base_env()
    env.update({
        "HOME": str(scratch / "home"),
        "TMPDIR": str(scratch / "tmp"),
        "XDG_CACHE_HOME": str(scratch / "cache"),
        "HF_HOME": str(scratch / "cache" / "hf"),
        "MPLCONFIGDIR": str(scratch / "cache" / "mpl"),
        "TRITON_CACHE_DIR": str(scratch / "cache" / "triton"),
        "INFERLAB_GRADING_MODEL": str(fence.model_dir),
        "INFERLAB_OBSERVATIONS": str(scratch / OBSERVATIONS),
        "INFERLAB_LANDLOCK": json.dumps(fence.landlock),
        "INFERLAB_SANDBOX": json.dumps({"scratch": str(scratch), "readable": fence.readable(harness),
                                        "hidden": list(fence.hidden), "modules": private_modules(),
                                        "programs": list(fence.programs) if gpu else [],
                                        "devices": list(fence.devices) if gpu else []}),
    })
    if gpu:
        # torch.compile (the engine's CUDA-graph path) would start a pool of compile workers: one process
        # compiles in-process instead, caching in scratch.
        env.update({"TORCHINDUCTOR_COMPILE_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(scratch / "cache" / "inductor")})
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def pytest_argv(harness: Path, scratch: Path, select: list[str] | tuple[str, ...]) -> list[str]:
    """The arguments after `python -I -B -m pytest`: our ini, our rootdir, no cache, no capture."""
    # Hidden tests never assert, so no assertion rewriting; unraisableexception's gc.collect() at exit
    # costs a quarter of a second with torch loaded and tells us nothing the observations do not.
    return ["-c", str(harness / "pytest.ini"), "--rootdir", str(harness), "-p", "no:cacheprovider",
            "-p", "no:unraisableexception", "-p", "no:threadexception", "--assert=plain",
            "-q", "--capture=no", "--tb=short", "--no-header", "-rN", "--basetemp", str(scratch / "pytest"),
            *select]


@dataclass
class Observed:
    """One graded process's run: the observations it wrote, and how the process ended."""

    child: ChildResult
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    sandbox: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)


def read_observations(path: Path) -> tuple[dict[str, dict[str, Any]], list[str], dict | None, list[str]]:
    """Parse an observations file defensively: it was written by untrusted code.

    Returns (records by test id, test ids in order, sandbox summary, problems).
    Malformed lines are skipped and named; a test reported twice keeps neither
    report (so a forged second line cannot replace a failing first one).
    """
    records: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    problems: list[str] = []
    sandbox = None
    twice: set[str] = set()
    if not path.is_file():
        return records, order, sandbox, problems
    size = path.stat().st_size
    if size > MAX_OBSERVATION_BYTES:
        problems.append(f"observations file is {size} bytes (limit {MAX_OBSERVATION_BYTES}): only the start is read")
    with open(path, "rb") as handle:
        data = handle.read(MAX_OBSERVATION_BYTES)
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            problems.append(f"observations line {number} is not JSON")
            continue
        if not isinstance(record, dict):
            problems.append(f"observations line {number} is not an object")
            continue
        if "sandbox" in record and "test" not in record:
            sandbox = record["sandbox"] if sandbox is None else sandbox
            continue
        test = record.get("test")
        if not isinstance(test, str) or not isinstance(record.get("obs"), list):
            problems.append(f"observations line {number} has no test id or observation list")
            continue
        if test in records or test in twice:
            twice.add(test)
            records.pop(test, None)
            problems.append(f"test {test} was reported more than once: neither report counts")
            continue
        records[test] = record
        order.append(test)
    return records, [t for t in order if t in records], sandbox, problems


_IDLE_SERVERS: list[ForkServer] = []
_IDLE_LOCK = threading.Lock()


def _close_idle_servers() -> None:
    with _IDLE_LOCK:
        while _IDLE_SERVERS:
            _IDLE_SERVERS.pop().close()


atexit.register(_close_idle_servers)


class Runner:
    """Starts graded processes for one worker: a fork server (default) or fresh interpreters.

    A fork server holds nothing of any run (it has imported third-party
    libraries, nothing else), so a finished worker hands it back for the next
    run in the same process instead of paying its start-up again.
    """

    def __init__(self, workdir: Path, spawn: str = "fork"):
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.spawn = spawn
        self._server = None

    def _spawner(self):
        if self.spawn == "fresh":
            return FreshSpawner(self.workdir)
        if self._server is None or not self._server.alive():
            with _IDLE_LOCK:
                while _IDLE_SERVERS and self._server is None:
                    candidate = _IDLE_SERVERS.pop()
                    if candidate.alive():
                        self._server = candidate
                    else:
                        candidate.close()
            if self._server is None or not self._server.alive():
                self._server = ForkServer()
        return self._server

    def start(self, mode: str, argv: list[str], cwd: Path, env: dict[str, str], with_stdin: bool = False):
        return self._spawner().start(mode, argv, cwd, env, with_stdin)

    def observe(self, harness: Path, scratch: Path, select, deadline_s: float, fence: Fence,
                gpu: bool = False) -> Observed:
        """Run the selected hidden tests in one graded process (seeing the GPU only with `gpu`); read its observations."""
        import time
        if scratch.exists():
            shutil.rmtree(scratch)
        scratch.mkdir(parents=True)
        child = self.start("pytest", pytest_argv(harness, scratch, select), harness, child_env(fence, harness, scratch, gpu))
        result = child.wait(time.monotonic() + deadline_s)
        records, order, sandbox, problems = read_observations(scratch / OBSERVATIONS)
        return Observed(result, records, order, sandbox, problems)

    def close(self) -> None:
        if self._server is not None:
            if self._server.alive():
                with _IDLE_LOCK:
                    _IDLE_SERVERS.append(self._server)
            else:
                self._server.close()
            self._server = None


def clear(path: Path) -> None:
    """Remove a scratch folder, including anything a graded process made read-only."""
    def unlock(func, target, _exc):
        try:
            os.chmod(target, 0o700)
            func(target)
        except OSError:
            pass
    if path.exists():
        shutil.rmtree(path, onerror=unlock)
