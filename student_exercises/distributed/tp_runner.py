# Generated from reference/distributed/tp_runner.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""The tensor-parallel model runner: rank 0 in the engine's process, ranks 1..N-1 in worker processes.

The scheduler and block manager exist once, in the engine (rank 0). Every
step, rank 0 broadcasts the scheduled batch (a light copy of each Sequence:
token ids, positions, block table) over a gloo group; each worker builds the
same input tensors from it and runs its shard of the model, meeting the other
ranks in the all-reduces. Only rank 0 samples. Each rank owns a full-size KV
pool of its own KV heads, indexed by the same block ids, so one block table
serves every rank.

Shutdown (reference.distributed.processes) is by force, not by message: a
worker may be blocked inside a collective (rank 0 failed halfway through a
step). It runs when the runner is garbage-collected, at interpreter exit, or
when `close()` is called; a worker also exits by itself when its parent dies.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import traceback
import weakref
from dataclasses import dataclass

import torch.distributed as dist
import torch.multiprocessing as mp

from student_exercises.config import Config
import student_exercises.parallel_state as parallel_state
from student_exercises.distributed.processes import exit_with_parent, start_daemons, stop_processes
from student_exercises.engine.model_runner import EngineDeadError, ModelRunner
from student_exercises.engine.sequence import Sequence


@dataclass
class StepSequence:
    """What a worker needs of a scheduled Sequence to build the same inputs as rank 0.

    A decode step sends one token id, not the whole history; a prefill sends
    the tokens up to the end of its chunk.
    """
    seq_id: int
    token_ids: list[int]
    length: int
    num_cached_tokens: int
    num_scheduled_tokens: int
    block_table: list[int]
    sampling_params: None = None   # workers never sample

    @classmethod
    def of(cls, seq: Sequence, is_prefill: bool) -> "StepSequence":
        end = seq.num_cached_tokens + seq.num_scheduled_tokens
        tokens = seq.token_ids[:end] if is_prefill else [seq.last_token]
        return cls(seq.seq_id, tokens, len(seq), seq.num_cached_tokens, seq.num_scheduled_tokens,
                   list(seq.block_table))

    def __len__(self) -> int:
        return self.length

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]


def shutdown_workers(workers: list, init_dir: str) -> None:
    """Stop the workers (see processes.stop_processes), then leave the process group."""
    stop_processes(workers)
    try:
        parallel_state.destroy_tensor_parallel()
    finally:
        shutil.rmtree(init_dir, ignore_errors=True)


class TensorParallelRunner(ModelRunner):
    """Rank 0's ModelRunner, which also starts the workers and sends them every step."""

    def __init__(self, config: Config):
        world = config.tensor_parallel_size
        if parallel_state.tp_world_size() > 1 or dist.is_initialized():
            raise RuntimeError("this process already runs a tensor-parallel engine: close it first "
                               "(llm.model_runner.close(), or drop every reference to it)")
        init_dir = tempfile.mkdtemp(prefix="inferlab-tp-")
        init_file = os.path.join(init_dir, "rendezvous")
        ctx = mp.get_context("spawn")
        self.workers = start_daemons(ctx, [(worker_main, (config, rank, init_file, os.getpid()), f"inferlab-tp-rank{rank}")
                                           for rank in range(1, world)])
        self._finalizer = weakref.finalize(self, shutdown_workers, self.workers, init_dir)
        try:
            parallel_state.init_tensor_parallel(0, world, config.device, init_file)
            super().__init__(config)
        except BaseException:
            self._finalizer()
            raise

    def close(self) -> None:
        """Stop the workers now (also done on garbage collection and at exit)."""
        self._finalizer()

    def _broadcast(self, message: tuple) -> None:
        dead = [p for p in self.workers if not p.is_alive()]
        if dead:
            self.close()
            raise EngineDeadError(f"tensor-parallel worker {dead[0].name} exited (code {dead[0].exitcode}); "
                               "the engine is stopped")
        dist.broadcast_object_list([message], src=0, group=parallel_state.control_group())

    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int | None]:
        """Send the batch, then run rank 0's share.

        A failure after the broadcast (Ctrl-C included) leaves the workers inside
        a collective that rank 0 will never join: the engine cannot go on, so it
        stops the workers and re-raises rather than hang on the next step.
        """
        self._broadcast(("run", [StepSequence.of(seq, is_prefill) for seq in seqs], is_prefill))
        try:
            return super().run(seqs, is_prefill)
        except BaseException:
            self.close()
            raise

    # Config refuses async scheduling with tensor parallelism: a step launched on rank 0 alone would
    # leave the workers waiting for a broadcast. These say so if that check is ever bypassed.
    def launch_prefill(self, seqs):
        raise NotImplementedError("async scheduling is not supported with tensor parallelism")

    def launch_decode(self, seqs, previous):
        raise NotImplementedError("async scheduling is not supported with tensor parallelism")


def worker_main(config: Config, rank: int, init_file: str, parent_pid: int) -> None:
    """Rank `rank`: build this rank's shard, then run whatever rank 0 broadcasts, until stopped."""
    exit_with_parent(parent_pid)
    try:
        parallel_state.init_tensor_parallel(rank, config.tensor_parallel_size, config.device, init_file)
        runner = ModelRunner(config)
        while True:
            message = [None]
            dist.broadcast_object_list(message, src=0, group=parallel_state.control_group())
            method, *args = message[0]
            getattr(runner, method)(*args)
    except KeyboardInterrupt:
        os._exit(0)
    except BaseException:
        traceback.print_exc(file=sys.stderr)
        os._exit(1)

