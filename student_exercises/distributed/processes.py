# Generated from reference/distributed/processes.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Starting and stopping the engine's helper processes, so that none is ever left behind.

Start: spawn (CUDA cannot be used in a forked child), daemon (the
multiprocessing exit hook terminates daemons), and without re-running the
caller's script: spawn normally imports the parent's `__main__` file in the
child, so a script or notebook source that builds an engine at top level
(no `if __name__ == "__main__"` guard) would build another engine in every
worker. The targets live in reference.*, so the child needs nothing from
`__main__`; we hide its file for the moment of `start()`.

Stop: terminate, join with a timeout, kill what is left. Force, not a
message: a worker may be blocked inside a collective where no message reaches
it. Each worker also runs `exit_with_parent`, so a `kill -9` of the caller
does not orphan it.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

JOIN_TIMEOUT_S = 5.0


@contextlib.contextmanager
def _main_file_hidden():
    main = sys.modules.get("__main__")
    saved = getattr(main, "__file__", None)
    if saved is None or getattr(main, "__spec__", None) is not None:
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        main.__file__ = saved


def start_daemons(ctx, specs: list[tuple]) -> list:
    """Start one daemon process per (target, args, name); returns them in order."""
    procs = [ctx.Process(target=target, args=args, name=name, daemon=True) for target, args, name in specs]
    with _main_file_hidden():
        for proc in procs:
            proc.start()
    return procs


def stop_processes(procs: list) -> None:
    """Terminate, join with a shared timeout, then kill and reap whatever is still alive."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(JOIN_TIMEOUT_S)


def _watch_parent(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(0.5)
    os._exit(1)


def exit_with_parent(parent_pid: int) -> None:
    """In a worker: exit when the process that started it is gone (it would wait in a collective forever)."""
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()
