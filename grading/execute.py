"""Running hidden tests in a graded process and reading back what it observed (never what it concluded).

Shared by `golden build` (on the reference harness) and `grade run` (on each
student's harness), so golden outputs and student outputs are produced by the
very same path.
"""
from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grading import process_fence
from grading.paths import hidden_roots, private_modules, python_roots
from grading.scratch import Quota, Scratch, clear  # noqa: F401  (clear: callers import it from here)
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
        return cls(shared_model(Path(model_dir).resolve()), tuple(dict.fromkeys(hidden)), landlock, programs,
                   devices)

    def readable(self, harness: Path) -> list[str]:
        """Roots a graded process may read even inside a hidden one: its harness, the model, Python."""
        return [str(harness), str(self.model_dir), *map(str, python_roots())]


def shared_model(model_dir: Path) -> Path:
    """The model where the graded processes' unprivileged user can read it.

    The tiny model lives in root's cache (under a 0700 home), which uid 65534
    cannot reach; a grader running as root then reads it from a copy in the
    system's temp folder, root-owned and read-only to others, one per content
    (its name carries a digest of the files' names and bytes). The price:
    one copy of a small model per content, never cleaned up by the grader.
    """
    if os.geteuid() != 0 or process_fence.reachable_by_others(str(model_dir)):
        return model_dir
    h = hashlib.sha256()
    files = sorted(p for p in model_dir.rglob("*") if p.is_file())
    for path in files:
        h.update(path.relative_to(model_dir).as_posix().encode() + b"\0" + path.read_bytes())
    target = Path(tempfile.gettempdir()) / f"inferlab-model-{h.hexdigest()[:16]}"
    if not target.is_dir():
        staging = Path(tempfile.mkdtemp(prefix="inferlab-model-"))
        shutil.copytree(model_dir, staging / "model")
        for path in [staging / "model", *(staging / "model").rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        try:
            os.rename(staging / "model", target)
        except OSError:
            pass                                   # another worker made it first
        shutil.rmtree(staging, ignore_errors=True)
    trusted = _owned_by_us_only(target)         # /tmp is everyone's: a folder someone else made there is not used
    return target if trusted and process_fence.reachable_by_others(str(target)) else model_dir


def _owned_by_us_only(folder: Path) -> bool:
    """Every entry owned by this user and writable by nobody else."""
    for path in [folder, *folder.rglob("*")]:
        info = path.lstat()
        if info.st_uid != os.geteuid() or info.st_mode & 0o022 or path.is_symlink():
            return False
    return True


def gpu_programs() -> tuple[str, ...]:
    """What Triton and torch.compile start when they compile on a GPU: Triton's and torch's ptxas, C/C++ compilers.

    nvcc too where it is installed: inductor runs `nvcc --version` for the
    comment of every graph it compiles (where nvcc is missing it carries on).

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
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.origin:          # inductor points Triton at the ptxas torch ships, where it has one
        found += [str(p) for p in sorted((Path(spec.origin).parent / "bin").glob("ptxas*")) if p.is_file()]
    found += [path for path in (shutil.which(name) for name in ("cc", "gcc", "clang", "c++", "g++", "clang++", "nvcc"))
              if path]
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
                                        "secret": [str(harness / "hidden")],
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


SANDBOX_UID = 65534


def process_fence_spec(fence: Fence, harness: Path, scratch: Path, gpu: bool = False) -> dict:
    """What the zygote needs to fence a graded process: its user, what it reads and writes, what it must not see.

    A GPU item's process also needs the NVIDIA device files read-write: where
    uid 65534 may not open them, it stays uid 0 without capabilities instead.
    """
    return {"uid": SANDBOX_UID, "read": [str(harness), str(fence.model_dir)], "write": [str(scratch)],
            "hidden": list(fence.hidden), "devices": list(fence.devices) if gpu else []}


def process_summary(child: ChildResult) -> dict:
    """The process fence an item ran in, as the grader knows it (not what the graded process says)."""
    if child.fence is None:
        return {"pid_namespace": None, "missing": "no process fence (the fence never reported)"}
    summary = {k: v for k, v in child.fence.items() if k != "init"}
    summary["pid_namespace"] = bool(summary.get("pid_namespace"))     # the inode differs every run: stable fields only
    return summary


def process_flags(child: ChildResult) -> list[str]:
    """What the kernel's side of the fence saw: a refused process start, processes left behind."""
    flags = [f"sandbox refused: {d}" for d in child.output.denials]
    flags += [f"used a native file reader: {n}" for n in child.output.notices]
    if child.status == -signal.SIGSYS:
        flags.append("sandbox refused: the kernel killed the graded process for starting a process (seccomp)")
    if child.survivors:
        flags.append(f"{child.survivors} process(es) of this item were still alive after it ended (killed)")
    return flags


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
    scratch: str | None = None            # the scratch quota it hit, if it did (grading.scratch)


class Malformed(ValueError):
    """An observations line the grader refuses (the submission's fault, named in its result)."""


MAX_LINE_BYTES = 2 << 20         # one test's line (the recorder caps a line at 1,000,000 characters)
MAX_DEPTH = 64                   # nesting of one line (the recorder flattens values deeper than 50)
MAX_INT_DIGITS = 40              # |n| < 10**40: far beyond any count, id or token the engine produces
MAX_SANDBOX_BYTES = 4096
MAX_PROBLEMS = 20


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise Malformed(f"an integer of {len(text)} digits")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise Malformed(f"the number {text[:40]} is out of range")
    return value


def _constant(name: str):
    raise Malformed(f"{name} is not a JSON number")


def _check_value(value: Any) -> None:
    """Depth and string encoding of a parsed line, walked without recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise Malformed(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                raise Malformed("a string with an unpaired surrogate escape") from None
        elif isinstance(node, dict):
            stack += [(k, depth + 1) for k in node] + [(v, depth + 1) for v in node.values()]
        elif isinstance(node, list):
            stack += [(v, depth + 1) for v in node]


def parse_line(raw: bytes) -> Any:
    """One observations line as JSON, or Malformed naming what is wrong with it."""
    if len(raw) > MAX_LINE_BYTES:
        raise Malformed(f"{len(raw)} bytes long (limit {MAX_LINE_BYTES})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("not UTF-8") from None
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except RecursionError:
        raise Malformed(f"nested deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError:
        raise Malformed("not JSON") from None
    except ValueError as err:                                 # from the hooks above (Malformed is one)
        raise Malformed(str(err)) from None
    _check_value(value)
    return value


def _record_shape(record: Any) -> str | None:
    """What is wrong with a test record's fields, or None."""
    if not isinstance(record, dict):
        return "not an object"
    test, obs = record.get("test"), record.get("obs")
    if not isinstance(test, str) or not isinstance(obs, list):
        return "has no test id or observation list"
    if len(test) > 1000:
        return "has a test id over 1000 characters"
    if not all(isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str) for pair in obs):
        return "has an observation that is not a [key, value] pair"
    if not isinstance(record.get("complete", False), bool) or not isinstance(record.get("error"), (str, type(None))):
        return "has a malformed 'complete' or 'error' field"
    return None


def read_observations(path: Path) -> tuple[dict[str, dict[str, Any]], list[str], dict | None, list[str]]:
    """Parse an observations file defensively: it was written by untrusted code.

    Returns (records by test id, test ids in order, sandbox summary, problems).
    Malformed lines (too long, not UTF-8, not JSON, nested too deeply, numbers
    out of range, the wrong fields) are skipped and named as the submission's
    problems, never raised; a test reported twice keeps neither report (so a
    forged second line cannot replace a failing first one).
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
            record = parse_line(raw)
        except Malformed as err:
            problems.append(f"observations line {number} refused: {err}")
            continue
        if isinstance(record, dict) and "sandbox" in record and "test" not in record:
            fits = isinstance(record["sandbox"], dict) and len(json.dumps(record["sandbox"])) <= MAX_SANDBOX_BYTES
            if sandbox is None and fits:
                sandbox = record["sandbox"]
            continue
        shape = _record_shape(record)
        if shape is not None:
            problems.append(f"observations line {number} {shape}")
            continue
        test = record["test"]
        if test in records or test in twice:
            twice.add(test)
            records.pop(test, None)
            problems.append(f"test {test[:200]} was reported more than once: neither report counts")
            continue
        records[test] = record
        order.append(test)
    if len(problems) > MAX_PROBLEMS:
        problems[MAX_PROBLEMS:] = [f"... and {len(problems) - MAX_PROBLEMS} more observations problem(s)"]
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

    def __init__(self, workdir: Path, spawn: str = "fork", quota: Quota | None = None):
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.spawn = spawn
        self.quota = quota or Quota()
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

    def start(self, mode: str, argv: list[str], cwd: Path, env: dict[str, str], with_stdin: bool = False,
              fence: dict | None = None):
        return self._spawner().start(mode, argv, cwd, env, with_stdin, fence=fence)

    def observe(self, harness: Path, scratch: Path, select, deadline_s: float, fence: Fence,
                gpu: bool = False) -> Observed:
        """Run the selected hidden tests in one graded process (seeing the GPU only with `gpu`); read its observations.

        Its scratch folder is under the runner's quota (`grading.scratch`) and gone when this returns.
        """
        import time
        with Scratch(scratch, self.quota, executable=gpu) as space:
            child = self.start("pytest", pytest_argv(harness, scratch, select), harness,
                               child_env(fence, harness, scratch, gpu),
                               fence=process_fence_spec(fence, harness, scratch, gpu))
            space.watch(child.kill)
            result = child.wait(time.monotonic() + deadline_s)
            records, order, sandbox, problems = read_observations(scratch / OBSERVATIONS)
            over = space.over()
        return Observed(result, records, order, sandbox, problems, over)

    def close(self) -> None:
        if self._server is not None:
            if self._server.alive():
                with _IDLE_LOCK:
                    _IDLE_SERVERS.append(self._server)
            else:
                self._server.close()
            self._server = None
