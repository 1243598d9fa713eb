"""Fork server for graded processes: import torch and transformers once, fork one child per item.

    python -I -B grading/zygote.py        (started by grading.spawn, one per worker)

Why: a fresh `python -I -B -m pytest ...` spends ~5 s of a 2-core machine
importing torch and transformers before the first test runs; a class of 40
submissions times ~10 items would spend most of the grading time there. This
process imports those third-party libraries (never `reference`, `grading`, or
anything a student wrote, and it holds no golden data) and then forks. Each
child is exactly what the fresh command would have been: the same interpreter
flags (-I -B, inherited), a clean environment given per request, its own
session and process group, resource limits, its own cwd, stdin, stdout and
stderr, and `pytest.main(argv)` (or a script) as its whole life.

It is run as a script, not `-m grading.zygote`, so that not even the
`grading` package is imported into what the children inherit.

Protocol, one JSON object per line. Requests on stdin:
    {"id", "mode": "pytest" | "script", "argv", "cwd", "env", "stdout", "stdin", "fsize", "memory", "path",
     "fence"}
(`stdout`/`stdin` are FIFO paths made by the grader; `stdin` may be null; `path`, optional, lists
folders put first on the child's sys.path: the project's CI runs the public suites this way, one
tree per child. The grader passes none: its harness's pytest.ini says `pythonpath = .`.)
`fence`, optional, is {"uid", "read": [folders], "write": [folders], "hidden": [folders], "devices": [files]}:
the child then runs in its own PID and mount namespaces as an unprivileged user
(grading/process_fence.py).
Replies on stdout: {"id", "event": "started", "pid"} and {"id", "event": "exited", "status"},
`status` being the exit code, or minus the signal number; with `fence`, also
{"id", "event": "fence", "init", "pid_namespace", "uid", ...} from the graded process itself (before
any graded code runs), `init` being its pid as the grader sees it.
"""
from __future__ import annotations

import json
import os
import resource
import select
import signal
import sys


def preload() -> None:
    import numpy  # noqa: F401
    import pytest  # noqa: F401
    import safetensors.torch  # noqa: F401
    import torch  # noqa: F401
    import transformers
    import xxhash  # noqa: F401
    import rich.console  # noqa: F401  (rich.markup alone costs ~0.15 s: the engine's progress bar imports it)
    import rich.progress  # noqa: F401
    import transformers.configuration_utils  # noqa: F401
    import transformers.tokenization_utils_base  # noqa: F401
    from transformers import AutoConfig, AutoTokenizer  # noqa: F401
    transformers.logging.set_verbosity_error()


def _process_fence():
    """grading/process_fence.py, loaded by path (this process must not import the `grading` package)."""
    import importlib.util
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "process_fence.py")
    spec = importlib.util.spec_from_file_location("_inferlab_process_fence", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fence(request: dict) -> dict:
    """Put this child in its own PID and mount namespaces, as PID 1, unprivileged (see process_fence).

    This process (C) forks the graded process (G) into the new namespace and
    only waits for it; G returns from here with a summary of the fence.
    """
    pf = _process_fence()
    error = pf.enter()
    if error is not None:
        return {"pid_namespace": None, "init": os.getpid(), "missing": f"no PID namespace ({error})"}
    pid = os.fork()
    if pid != 0:
        pf.supervise(pid)
    try:
        return pf.become_init(request["fence"])
    except BaseException as err:  # noqa: BLE001 - never run graded code half-fenced
        print(f"inferlab zygote: process fence failed: {err!r}", file=sys.stderr, flush=True)
        os._exit(72)


def child(request: dict) -> None:
    """In the forked child: become the graded process. Never returns."""
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # oversized writes fail with EFBIG instead of killing
        limit = int(request.get("fsize") or 64 << 20)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if request.get("memory"):
            resource.setrlimit(resource.RLIMIT_AS, (int(request["memory"]), int(request["memory"])))
        out = os.open(request["stdout"], os.O_WRONLY)     # before the fence: the FIFOs are the grader's, mode 0600
        inp = os.open(request["stdin"], os.O_RDONLY) if request.get("stdin") else os.open(os.devnull, os.O_RDONLY)
        os.dup2(out, 2)                                   # a failing fence says why in the item's output
        if request.get("fence") is not None:
            reply({"id": request["id"], "event": "fence", **fence(request)})
        os.dup2(inp, 0)
        os.dup2(out, 1)
        os.closerange(3, 65536)
        sys.stdin = os.fdopen(0, "r", closefd=False)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        os.chdir(request["cwd"])
        sys.path[:0] = list(request.get("path") or [])
        os.environ.clear()
        os.environ.update(request["env"])
        reread_import_time_settings()
        import tempfile
        tempfile.tempdir = None          # the zygote's cached /tmp would outlive its environment: use TMPDIR (scratch)
        if request["mode"] == "pytest":
            import pytest
            sys.argv = ["pytest", *request["argv"]]
            code = int(pytest.main(request["argv"]))
        else:
            import runpy
            sys.argv = list(request["argv"])
            runpy.run_path(request["argv"][0], run_name="__main__")
            code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else 1
    except BaseException as err:  # noqa: BLE001 - report anything, then leave
        try:
            print(f"inferlab zygote: child failed: {err!r}", file=sys.stderr, flush=True)
        except Exception:  # noqa: BLE001
            pass
        code = 71
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        os._exit(code)


def reread_import_time_settings() -> None:
    """Settings a library read once, at import, from the zygote's environment: read them from the child's.

    torch's inductor decides its number of compile workers when its config is
    imported. If that happened in the zygote, a GPU item's
    `TORCHINDUCTOR_COMPILE_THREADS=1` (grading.execute.child_env) would be
    ignored, inductor would start its worker pool, and the fence would refuse
    it: the item fails although a fresh process would pass.
    """
    config = sys.modules.get("torch._inductor.config")
    threads = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
    if config is not None and threads is not None:
        config.compile_threads = int(threads)


def reply(message: dict) -> None:
    sys.__stdout__.write(json.dumps(message) + "\n")
    sys.__stdout__.flush()


def reap(children: dict[int, str]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        reply({"id": children.pop(pid, "?"), "event": "exited", "status": code})


def main() -> int:
    preload()
    import gc
    gc.collect()
    gc.freeze()            # the preloaded heap is shared and never collected again: children start with little to scan
    reply({"id": None, "event": "ready", "pid": os.getpid()})
    children: dict[int, str] = {}
    buffer = b""
    # A child's exit wakes the loop at once (SIGCHLD through a self-pipe), so its status is reported without delay.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    while True:
        ready, _, _ = select.select([0, wake_r], [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        reap(children)
        if 0 not in ready:
            continue
        chunk = os.read(0, 65536)
        if not chunk:
            break
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if not line.strip():
                continue
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                child(request)
            children[pid] = request["id"]
            reply({"id": request["id"], "event": "started", "pid": pid})
    for pid in list(children):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    while children:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        children.pop(pid, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
