"""Release-only stand-ins: the engine runs end to end in a student release of lab 1, 2 or 3.

A lab N release stubs the regions of every later lab, so without help its
engine stops at the first later-lab region it reaches (lab 4's model runner
for a lab 2 student). Here are replacements for the later labs' parts, at the
level of the whole part, so that none of them contains a later lab's solution:

- `lab2` -> `block_manager.PlainBlockManager`: paged blocks without prefix
  caching, sharing or reference counts (what lab 1's public test double
  already shows).
- `lab3` -> `scheduler.YieldingScheduler`: first come, first served, whole
  prompts, and a decode that finds no free block preempts the sequence that
  needs it (lab 3 preempts the newest one instead).
- `lab4` -> `model_runner.DenseModelRunner`: transformers' own forward pass
  with a dense per-sequence KV cache, sequences at the same position batched
  together; no paged inputs and no paged attention.

Each keeps the course's own code wherever the student's lab lives: the
stand-in scheduler subclasses `Scheduler` and still calls its lab 1 logging
methods, and the model runner and block manager hold no region of an earlier
lab, so a lab 1 student's log events, a lab 2 student's block manager and a
lab 3 student's scheduler are what the engine runs. `choice` picks the classes; `labs` names
the labs to replace and is empty in the course repository (the reference
engine and the generated `student_exercises/` never use a stand-in); `inferlab
release` rewrites it, and ships only the stand-ins the release runs.

Why whole parts and not region bodies: a region is too small to replace
without writing its solution (a stand-in for `lab4.slot` is `lab4.slot`).
A whole part can be replaced by a different, simpler design that gives the
same tokens. Each module's docstring says what its stand-in cannot show.
"""
