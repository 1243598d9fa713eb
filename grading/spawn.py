"""Starting graded processes, bounding their output, and killing them at their deadline.

Two ways to start the same process:

- `ForkServer` (default): a child forked from `grading/zygote.py`, which has
  torch and transformers imported already (about 5 s saved per item on a
  2-core machine);
- `FreshSpawner`: `python -I -B -m pytest ...` (or a script) started from
  scratch, the literal command of docs/design.md §4, used with `--spawn fresh`.

Either way the child has its own session and process group, a clean
environment, RLIMIT_FSIZE, and stdout+stderr going to a pipe that a grader
thread drains continuously: megabytes of output cost the grader nothing but
a byte count, and only a bounded head and tail are kept. At the deadline the
whole process group (and the child itself, in case it left the group) gets
SIGKILL. The exit status is recorded but never trusted for a verdict.

A child asked for a `fence` also runs in its own PID namespace as an
unprivileged user (grading/process_fence.py): killing it kills everything it
started, wherever that went, and `Child.wait` checks that nothing is left.
"""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from grading import process_fence
from grading.payload._inferlab_sandbox import DENIED_TAG, NOTED_TAG

ZYGOTE = Path(__file__).with_name("zygote.py")
PROCESS_FENCE = Path(__file__).with_name("process_fence.py")
KEEP_BYTES = 16_384              # head and tail of a child's output kept for messages
MAX_DENIALS = 50
FSIZE_LIMIT = 64 << 20           # bytes any one file the child writes may reach


def memory_limit() -> int | None:
    """Address-space cap of a graded process: 6 GiB, or none where CUDA is present.

    A CUDA context reserves far more virtual memory than it uses, so the cap
    would break GPU items; on CPU it turns a runaway allocation into a
    MemoryError in the graded process instead of the machine's OOM killer
    taking out a neighbour.
    """
    if os.environ.get("INFERLAB_GRADING_NO_MEMORY_LIMIT"):
        return None
    try:
        import torch
        if torch.cuda.is_available():
            return None
    except ImportError:
        pass
    return 6 << 30
BASE_ENV = {
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONHASHSEED": "0",
    "LC_ALL": "C.UTF-8",
}


def base_env() -> dict[str, str]:
    """The environment every graded process starts from: nothing inherited but PATH."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **BASE_ENV}


@dataclass
class Output:
    """What a child printed: a bounded head and tail, the total size, sandbox refusals and notices."""

    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total: int = 0
    denials: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    _line: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = KEEP_BYTES - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk_rest = chunk[room:]
        else:
            chunk_rest = chunk
        if chunk_rest:
            self.tail += chunk_rest
            if len(self.tail) > KEEP_BYTES:
                del self.tail[:len(self.tail) - KEEP_BYTES]
        self._scan(chunk)

    def _scan(self, chunk: bytes) -> None:
        """Collect sandbox refusal and notice lines wherever they are in the stream (bounded work per byte)."""
        data = self._line + chunk
        lines = data.split(b"\n")
        self._line = bytearray(lines.pop()[-4096:])
        for line in lines:
            for tag, found in ((DENIED_TAG.encode(), self.denials), (NOTED_TAG.encode(), self.notices)):
                if len(found) < MAX_DENIALS and tag in line:
                    found.append(line[line.index(tag) + len(tag):].decode("utf-8", "replace").strip()[:400])

    def text(self) -> str:
        head = self.head.decode("utf-8", "replace")
        if self.total <= len(self.head) + len(self.tail):
            return head + self.tail.decode("utf-8", "replace")
        skipped = self.total - len(self.head) - len(self.tail)
        return f"{head}\n[... {skipped} bytes not kept ...]\n{self.tail.decode('utf-8', 'replace')}"


@dataclass
class ChildResult:
    status: int | None          # exit code, or -signal; None if it never started
    timed_out: bool
    wall_s: float
    output: Output
    fence: dict | None = None   # the process fence in force (grading.process_fence), None when there was none
    survivors: int = 0          # processes of the item found alive after it ended (killed then)


def _drain(fd: int, output: Output, stop: threading.Event) -> None:
    """Read until EOF, or until `stop` is set and nothing more is waiting (FIFOs we hold open never EOF)."""
    import select
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], 0.01)
            if not ready:
                if stop.is_set():
                    return
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return
            output.feed(chunk)
    except OSError:
        return
    finally:
        os.close(fd)


def _kill_group(pid: int) -> None:
    for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            kill()
        except (ProcessLookupError, PermissionError, OSError):
            pass


class Child:
    """A running graded process: write to its stdin (if it has one), wait for it, or kill it."""

    def __init__(self, pid: int, output: Output, reader: threading.Thread, started: float,
                 exited: threading.Event, status_box: list, stdin_fd: int | None, stop: threading.Event,
                 fence: dict | None = None):
        self.pid = pid
        self.fence = fence
        self.init = (fence or {}).get("init") or pid
        self._namespace, self._namespace_fd = None, None
        if (fence or {}).get("pid_namespace"):
            # Held until the item is over: the namespace's inode number cannot be reused by another item's
            # namespace meanwhile, so looking processes up by it never finds (and kills) someone else's.
            # If the first process is gone already, so is everything else of its namespace.
            try:
                self._namespace_fd = os.open(f"/proc/{self.init}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
                if os.fstat(self._namespace_fd).st_ino == fence["pid_namespace"]:
                    self._namespace = fence["pid_namespace"]
            except OSError:
                pass
        self._stop = stop
        self.output = output
        self._reader = reader
        self._started = started
        self._exited = exited
        self._status = status_box
        self._stdin_fd = stdin_fd

    def send(self, line: str) -> None:
        if self._stdin_fd is None:
            raise RuntimeError("this child has no stdin")
        os.write(self._stdin_fd, line.encode() + b"\n")

    def read_line(self, deadline: float) -> str | None:
        """Next complete stdout line of a server-style child (throughput), or None at the deadline or exit."""
        while time.monotonic() < deadline:
            text = self.output.text()
            lines = text.split("\n")
            consumed = getattr(self, "_consumed", 0)
            if len(lines) - 1 > consumed:
                self._consumed = consumed + 1
                return lines[consumed]
            if self._exited.is_set():
                return None
            time.sleep(0.002)
        return None

    def members(self) -> list[int]:
        """Every process of this item (its PID namespace's, or just the graded process without one)."""
        return process_fence.members(self._namespace) if self._namespace else [self.init]

    def pause(self) -> bool:
        """Stop every process of the item (SIGSTOP); True once all of them are seen stopped."""
        pids = self.members()
        process_fence.signal_all(pids, signal.SIGSTOP)
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            if all(process_fence.stopped(pid) for pid in pids):
                return True
            time.sleep(0.001)
        return False

    def resume(self) -> None:
        process_fence.signal_all(self.members(), signal.SIGCONT)

    def kill(self) -> None:
        """Kill every process of the item now (its scratch quota's watcher does, once the item is over it)."""
        process_fence.signal_all(self.members(), signal.SIGKILL)
        _kill_group(self.init)
        _kill_group(self.pid)

    def _leftovers(self, grace_s: float = 5.0) -> list[int]:
        """Processes still in the namespace once its first process is gone and the kernel had `grace_s` to end them."""
        if not self._namespace:
            return []
        until = time.monotonic() + grace_s
        left = self.members()
        while left and time.monotonic() < until:
            time.sleep(0.01)
            left = self.members()
        return left

    def wait(self, deadline: float) -> ChildResult:
        """Wait until the child exits or `deadline` (time.monotonic) passes; kill it in the latter case.

        Killing the namespace's first process makes the kernel kill the rest of
        it; whatever is still found in the namespace afterwards is killed and
        counted as a survivor (there should never be any).
        """
        timed_out = not self._exited.wait(max(0.0, deadline - time.monotonic()))
        if timed_out:
            _kill_group(self.init)
            _kill_group(self.pid)
            self._exited.wait(10)
        _kill_group(self.init)
        _kill_group(self.pid)                    # anything it left behind in its group
        survivors = self._leftovers()
        process_fence.signal_all(survivors, signal.SIGKILL)
        if self._namespace_fd is not None:
            os.close(self._namespace_fd)
            self._namespace_fd = None
        self._stop.set()
        self._reader.join(5)
        if self._stdin_fd is not None:
            try:
                os.close(self._stdin_fd)
            except OSError:
                pass
            self._stdin_fd = None
        return ChildResult(self._status[0], timed_out, time.monotonic() - self._started, self.output, self.fence,
                           len(survivors))


def _fifo_pair(workdir: Path, key: str, want_stdin: bool) -> tuple[str, str | None]:
    out = workdir / f"{key}.out"
    os.mkfifo(out, 0o600)
    inp = None
    if want_stdin:
        inp = workdir / f"{key}.in"
        os.mkfifo(inp, 0o600)
    return str(out), (str(inp) if inp else None)


class ForkServer:
    """One zygote process; children are forked from it on request (see grading/zygote.py)."""

    _ids = itertools.count()

    def __init__(self, workdir: Path | None = None):
        # FIFOs live in a private temp folder (not the run's work folder) so one server can serve many runs.
        self.workdir = Path(tempfile.mkdtemp(prefix="inferlab-fifo-"))
        self._lock = threading.Lock()
        self._waiters: dict[str, tuple[threading.Event, list]] = {}
        self._started: dict[str, threading.Event] = {}
        self._pids: dict[str, int] = {}
        self._fences: dict[str, dict] = {}
        self._fenced: dict[str, threading.Event] = {}
        self._send = threading.Lock()            # one request line at a time, whichever thread starts a child
        self.memory = memory_limit()
        self.proc = subprocess.Popen([sys.executable, "-I", "-B", str(ZYGOTE)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=base_env(), cwd="/", start_new_session=True)
        first = self.proc.stdout.readline()
        if not first:
            raise RuntimeError("the grading zygote did not start (is torch importable?)")
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        for raw in self.proc.stdout:
            message = json.loads(raw)
            key = message["id"]
            with self._lock:
                if message["event"] == "started":
                    self._pids[key] = message["pid"]
                    self._started[key].set()
                elif message["event"] == "fence" and key in self._fenced:
                    self._fences[key] = {k: v for k, v in message.items() if k not in ("id", "event")}
                    self._fenced.pop(key).set()
                elif message["event"] == "exited" and key in self._waiters:
                    event, box = self._waiters.pop(key)
                    box[0] = message["status"]
                    event.set()
        with self._lock:                          # the zygote died: nothing will report any more
            for event, box in self._waiters.values():
                event.set()
            for event in [*self._started.values(), *self._fenced.values()]:
                event.set()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, mode: str, argv: list[str], cwd: Path, env: dict[str, str], with_stdin: bool = False,
              path: list[str] | None = None, fence: dict | None = None) -> Child:
        """Fork a child; with `fence` ({"uid", "read", "write"}), inside its own process fence (zygote.fence)."""
        key = f"c{next(self._ids)}"
        out_path, in_path = _fifo_pair(self.workdir, key, with_stdin)
        # O_RDWR: opening never blocks, and the child's open for writing (or reading) does not either.
        read_fd = os.open(out_path, os.O_RDWR)
        stdin_fd = os.open(in_path, os.O_RDWR) if in_path else None
        exited, box, started_evt, fenced = threading.Event(), [None], threading.Event(), threading.Event()
        with self._lock:
            self._waiters[key] = (exited, box)
            self._started[key] = started_evt
            if fence is not None:
                self._fenced[key] = fenced
        request = {"id": key, "mode": mode, "argv": argv, "cwd": str(cwd), "env": env, "stdout": out_path,
                   "stdin": in_path, "fsize": FSIZE_LIMIT, "memory": self.memory, "path": path or [],
                   "fence": fence}
        started = time.monotonic()
        with self._send:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        started_evt.wait(30)
        pid = self._pids.get(key)
        if pid is None:
            raise RuntimeError("the grading zygote did not start a child")
        output, stop = Output(), threading.Event()
        reader = threading.Thread(target=_drain, args=(read_fd, output, stop), daemon=True)
        reader.start()
        summary = None
        if fence is not None:
            while not fenced.wait(0.05) and not exited.is_set() and time.monotonic() < started + 30:
                pass
            with self._lock:
                self._fenced.pop(key, None)
                summary = self._fences.pop(key, None)
        return Child(pid, output, reader, started, exited, box, stdin_fd, stop, summary)

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(10)
        except (OSError, subprocess.TimeoutExpired):
            _kill_group(self.proc.pid)
        import shutil
        shutil.rmtree(self.workdir, ignore_errors=True)


class FreshSpawner:
    """`python -I -B -m pytest ...` from scratch for every item (slow, but the literal command)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir

    def alive(self) -> bool:
        return True

    def start(self, mode: str, argv: list[str], cwd: Path, env: dict[str, str], with_stdin: bool = False,
              fence: dict | None = None) -> Child:
        """Start the literal command; with `fence`, through grading/process_fence.py run as a launcher."""
        command = [sys.executable, "-I", "-B", *(["-m", "pytest"] if mode == "pytest" else []), *argv]
        report_r = report_w = None
        if fence is not None:
            report_r, report_w = os.pipe()
            command = [sys.executable, "-I", "-B", str(PROCESS_FENCE), json.dumps(fence), str(report_w), "--",
                       *command]
        memory = memory_limit()

        def limits() -> None:
            import resource
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if memory:
                resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

        started = time.monotonic()
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=limits, pass_fds=() if report_w is None else (report_w,))
        summary = None
        if report_w is not None:
            os.close(report_w)
            summary = _read_summary(report_r)
        output, stop = Output(), threading.Event()
        read_fd = os.dup(proc.stdout.fileno())
        proc.stdout.close()
        reader = threading.Thread(target=_drain, args=(read_fd, output, stop), daemon=True)
        reader.start()
        exited, box = threading.Event(), [None]

        def waiter() -> None:
            box[0] = proc.wait()
            exited.set()

        threading.Thread(target=waiter, daemon=True).start()
        stdin_fd = os.dup(proc.stdin.fileno()) if with_stdin else None
        if with_stdin:
            proc.stdin.close()
        return Child(proc.pid, output, reader, started, exited, box, stdin_fd, stop, summary)

    def close(self) -> None:
        pass


def _read_summary(fd: int, timeout_s: float = 30.0) -> dict | None:
    """The launcher's fence summary (None when it failed before writing one)."""
    import select
    data = b""
    until = time.monotonic() + timeout_s
    try:
        while time.monotonic() < until:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                data += chunk
    finally:
        os.close(fd)
    try:
        return json.loads(data) if data else None
    except ValueError:
        return None
