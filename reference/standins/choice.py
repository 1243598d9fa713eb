"""The classes `LLMEngine` builds its parts from: the course's own, or a release's stand-ins.

`LLMEngine` imports its block manager, scheduler and model runner classes
from here, by the same names as the course's classes, so the lab 1 public
tests can still patch `llm_engine.BlockManager` and friends with their test
doubles. A stand-in replaces a part only for the labs named in
`labs.STANDIN_LABS`, which is empty everywhere but in a student release.
"""
from __future__ import annotations

from reference.distributed.tp_runner import TensorParallelRunner
from reference.engine.block_manager import BlockManager
from reference.engine.model_runner import ModelRunner
from reference.engine.scheduler import Scheduler
from reference.standins.labs import STANDIN_LABS

__all__ = ["BlockManager", "ModelRunner", "Scheduler", "TensorParallelRunner"]

if "lab2" in STANDIN_LABS:
    from reference.standins.block_manager import PlainBlockManager as BlockManager  # noqa: F811
if "lab3" in STANDIN_LABS:
    from reference.standins.scheduler import YieldingScheduler as Scheduler  # noqa: F811
if "lab4" in STANDIN_LABS:
    from reference.standins.model_runner import DenseModelRunner as ModelRunner  # noqa: F811
    from reference.standins.model_runner import no_tensor_parallelism as TensorParallelRunner  # noqa: F811
