# Generated from reference/engine/collector.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Keep CPython's full garbage collections out of a running batch.

The engine's history grows as it runs: every step logs a SCHEDULED event for
every sequence in the batch, with a copy of its block table, so the lifecycle
log gains two containers the cyclic collector tracks per generated token. CPython
collects its oldest generation whenever that has grown by a quarter since the last
full collection, and a full collection walks every tracked object alive: late in a
large batch, one walk takes several decode steps' time. Under async scheduling the
CPU is only one step ahead of the GPU, so the GPU sits idle for the rest of the
pause (bench-256's figures are in docs/performance.md).

We chose to defer only the full collections, and only while a batch runs: the
young generations are still collected, so a reference cycle made and dropped
during the batch is freed as before (the engine makes none of its own). The
price: cycles that live long enough to reach the oldest generation are freed
after the batch, by the next full collection, not during it; and the setting is
the process's, so the caller's own threads see it too while the batch runs.
That is why `LLM.generate` and the benchmark use it (they hold the caller until
the batch is done) and `LLM.stream` and the server do not (they return to the
caller's code between steps; the server keeps a bounded log anyway).

Where CPython's collector is incremental (it then ignores the third threshold),
this changes nothing, and nothing needs changing: no single pause walks the heap.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

# The third threshold counts collections of the middle generation: no batch reaches this many.
NEVER = 2**31 - 1


@contextmanager
def full_collections_deferred() -> Iterator[None]:
    """Within the block, automatic collections stop short of the oldest generation; restored after."""
    young, middle, oldest = gc.get_threshold()
    gc.set_threshold(young, middle, NEVER)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, oldest)
