"""Stand-ins for the parts of labs a student has not reached: the engine of a lab 1, 2 or 3 release runs end to end.

A lab N release stubs the regions of every later lab, so without help its
engine stops at the first later-lab region it reaches (lab 4's model runner
for a lab 2 student). Each later lab's part is replaced as a whole, so that
none of these contains a later lab's solution:

- `lab2` -> `block_manager.PlainBlockManager`: paged blocks without prefix
  caching, sharing or reference counts (what lab 1's public test double
  already shows).
- `lab3` -> `scheduler.YieldingScheduler`: first come, first served, whole
  prompts, and a decode that finds no free block preempts the sequence that
  needs it (lab 3 preempts the newest one instead).
- `lab4` -> `model_runner.DenseModelRunner`: transformers' own forward pass
  with a dense per-sequence KV cache, sequences at the same position batched
  together; no paged inputs and no paged attention.

Each keeps the student's own code wherever the student's lab lives: the
stand-in scheduler subclasses `Scheduler` and still calls its lab 1 logging
methods, and the model runner and block manager hold no region of an earlier
lab, so a lab 1 student's log events, a lab 2 student's block manager and a
lab 3 student's scheduler are what the engine runs.

The engine never imports this package: whoever builds an engine in a release
hands the stand-ins in (`EngineParts`, reference/engine/parts.py), and
`courseware.engine` is where a release's commands, tutorials and public tests
get them. A release ships only the stand-ins it runs, with their `reference`
imports pointed at its `student_exercises` (courseware/release_code.py).

Why whole parts and not region bodies: a region is too small to replace
without writing its solution (a stand-in for `lab4.slot` is `lab4.slot`).
A whole part can be replaced by a different, simpler design that gives the
same tokens. Each module's docstring says what its stand-in cannot show.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterable

# lab -> (EngineParts field, module under courseware/standins/, class)
STANDINS = {
    "lab2": ("block_manager", "block_manager", "PlainBlockManager"),
    "lab3": ("scheduler", "scheduler", "YieldingScheduler"),
    "lab4": ("model_runner", "model_runner", "DenseModelRunner"),
}


def standin_modules(labs: Iterable[str]) -> list[str]:
    """Paths (under courseware/) of the stand-in modules for `labs`; ValueError for a lab that has none."""
    labs = list(labs)
    missing = [lab for lab in labs if lab not in STANDINS]
    if missing:
        raise ValueError(f"no stand-in for {', '.join(missing)}: a release before it would stop at its stubs "
                         "(add one under courseware/standins/ and to STANDINS)")
    return [f"standins/{STANDINS[lab][1]}.py" for lab in labs]


def standin_parts(labs: Iterable[str]):
    """The course's parts (`EngineParts`), with a stand-in for the part each lab in `labs` writes.

    The engine is imported here, not at the top: the release's code is listed
    (`standin_modules`, courseware/release_code.py) by the grader too, which
    never imports an engine.
    """
    from reference.engine.parts import EngineParts
    labs = list(labs)
    standin_modules(labs)      # refuses a lab without a stand-in, by name
    chosen = {}
    for lab in labs:
        field, module, name = STANDINS[lab]
        chosen[field] = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return EngineParts(**chosen)
