# Generated from reference/engine/parts.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""`EngineParts`: the classes an `LLMEngine` is built from, handed in rather than imported.

An engine is three parts around one loop: a model runner (lab 4), a block
manager (lab 2) and a scheduler (lab 3). `LLMEngine` builds them from the
`EngineParts` it is given, in that order, because each needs the one before
it: the block manager is sized by the runner's `num_kvcache_blocks`, and the
scheduler owns the block manager.

Why handed in: whoever builds the engine decides what it runs. A test hands
in doubles (lab 1's public tests drive the real loop with a fake runner), a
student release hands in stand-ins for the labs the student has not written
yet (courseware/standins/), and a tensor-parallel engine hands in the runner
that drives worker processes (reference/llm.py). The engine imports none of
them, so course tooling never sits on a request's path. The price: building
an engine with other parts takes one more argument than a module-level swap
would, and a caller that wants the course's parts passes nothing.

Each field is a callable with the course class's constructor signature:
    model_runner(config)
    block_manager(num_blocks, block_size, enable_prefix_caching)
    scheduler(config, block_manager, log)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from student_exercises.engine.block_manager import BlockManager
from student_exercises.engine.model_runner import ModelRunner
from student_exercises.engine.scheduler import Scheduler


@dataclass(frozen=True)
class EngineParts:
    model_runner: Callable[..., Any] = ModelRunner
    block_manager: Callable[..., Any] = BlockManager
    scheduler: Callable[..., Any] = Scheduler
