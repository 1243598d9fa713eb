# Generated from reference/distributed/tp_runner.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""The tensor-parallel model runner: rank 0 in the engine's process, ranks 1..N-1 in worker processes.

The scheduler and block manager exist once, in the engine (rank 0). Every
step, rank 0 sends the scheduled batch to the workers through shared memory
(`step_channel`: token ids, lengths, block tables as flat arrays), then runs
its own share; each worker rebuilds the same input tensors from it and runs
its shard of the model, meeting the other ranks in the all-reduces. Only rank
0 samples. Each rank owns a full-size KV pool of its own KV heads, indexed by
the same block ids, so one block table serves every rank.

Async scheduling works as on one GPU: rank 0 launches step k+1 before it
reads step k's tokens, whose ids the next step takes straight from the
device. When every row that samples in a step takes the argmax, each rank
takes it over its own vocabulary slice and the ranks exchange one value per
row, so every rank holds the step's tokens (`ModelRunner._tokens_in_flight`);
otherwise a worker has no sampler, and rank 0 broadcasts each step's sampled
ids (one small collective, queued on the GPU like the rest: nobody waits for
it on the host). Either way the worker feeds them to its next step exactly as
rank 0 does.

Shutdown (`_Teardown`) runs on `close()`, on garbage collection and at
interpreter exit. In order: the workers are asked to stop (a message through
the channel) and exit on their own; what has not exited is killed; this
rank's CUDA graphs are dropped; then the process group is left. The order
matters: NCCL will not destroy a communicator while a CUDA graph that
captured one of its collectives exists (a prefill graph's pieces all-reduce
through NCCL), so leaving the group with graphs alive hung the process at
exit (issue 35). When a worker died, or rank 0 failed in the middle of a step
(Ctrl-C included), a worker may sit inside a collective forever: then the
workers are killed without a message and the group is aborted instead of
destroyed. Workers ignore Ctrl-C (a terminal
sends it to the whole process group): rank 0 decides, and a worker also exits
by itself when its parent disappears.
"""
from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
import tempfile
import traceback
import weakref

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import student_exercises.parallel_state as parallel_state
from student_exercises.config import Config
from student_exercises.distributed import custom_all_reduce
from student_exercises.distributed.processes import exit_with_parent, start_daemons, stop_processes
from student_exercises.distributed.step_channel import HeldTables, SentTables, StepChannel, StepSequence, decode, encode, slot_bytes
from student_exercises.engine.model_runner import EngineDeadError, InFlightStep, ModelRunner, sampling_rows
from student_exercises.layers.sampler import argmax_only
from student_exercises.engine.sequence import Sequence

__all__ = ["StepSequence", "TensorParallelRunner", "worker_main"]

# A worker that has not freed a slot of the channel for this long is stuck (inside a collective).
SEND_TIMEOUT_S = parallel_state.COLLECTIVE_TIMEOUT.total_seconds()
# How long workers asked to stop may take to leave the group and exit before they are killed.
STOP_TIMEOUT_S = 15.0


class _TensorParallelShare:
    """What rank 0 and the workers do alike: set up the one-shot all-reduce, and drop graphs before leaving."""

    def _prepare_collectives(self) -> None:
        if self.device.type != "cuda":
            return
        hidden = self.config.hf_config["hidden_size"]
        max_bytes = self.config.max_num_seqs * hidden * torch.finfo(self.dtype).bits // 8
        parallel_state.set_fast_all_reduce(custom_all_reduce.set_up(
            self.rank, self.tp_size, self.dtype, max_bytes, parallel_state.control_group()))


class _Teardown:
    """Stops the workers and leaves the group; holds no reference to the runner, so it can run from its finalizer."""

    def __init__(self, workers: list, channel: StepChannel, init_dir: str, device: str):
        self.workers, self.channel, self.init_dir, self.device = workers, channel, init_dir, device
        self.graph_sets: list[dict] = []    # the runner's CUDA graphs (`ModelRunner.graph_sets`)
        self.broken = False     # a step failed halfway: workers may be inside a collective
        self.done = False

    def __call__(self) -> None:
        graceful = not self.broken and all(p.is_alive() for p in self.workers)
        if graceful:
            graceful = self.channel.send("stop", timeout=1.0)
        if graceful:
            for proc in self.workers:
                proc.join(STOP_TIMEOUT_S)
            graceful = all(proc.exitcode == 0 for proc in self.workers)
        stop_processes(self.workers)
        for graphs in self.graph_sets:   # before the group: NCCL waits for graphs that captured its collectives
            graphs.clear()
        try:
            if graceful and self.device == "cuda":
                torch.cuda.synchronize()
            parallel_state.destroy_tensor_parallel(abort=not graceful)
        finally:
            self.channel.close()
            shutil.rmtree(self.init_dir, ignore_errors=True)
            self.done = True


class TensorParallelRunner(_TensorParallelShare, ModelRunner):
    """Rank 0's ModelRunner, which also starts the workers and sends them every step."""

    def __init__(self, config: Config):
        world = config.tensor_parallel_size
        if parallel_state.tp_world_size() > 1 or dist.is_initialized():
            raise RuntimeError("this process already runs a tensor-parallel engine: close it first "
                               "(llm.model_runner.close(), or drop every reference to it)")
        init_dir = tempfile.mkdtemp(prefix="inferlab-tp-")
        init_file = os.path.join(init_dir, "rendezvous")
        ctx = mp.get_context("spawn")
        self.channel = StepChannel(ctx, world - 1, slot_bytes(config.max_num_seqs, config.max_num_batched_tokens,
                                                              config.max_model_len, config.kvcache_block_size))
        self.workers = start_daemons(ctx, [(worker_main, (config, rank, init_file, os.getpid(), self.channel),
                                            f"inferlab-tp-rank{rank}") for rank in range(1, world)])
        self._sent_tables = SentTables()
        self._teardown = _Teardown(self.workers, self.channel, init_dir, config.device)
        self._finalizer = weakref.finalize(self, self._teardown)
        try:
            parallel_state.init_tensor_parallel(0, world, config.device, init_file)
            super().__init__(config)
            self._teardown.graph_sets = self.graph_sets()
        except BaseException:
            self._teardown.broken = True
            self._teardown.graph_sets = self.graph_sets()
            self._finalizer()
            raise

    def close(self) -> None:
        """Stop the workers now (also done on garbage collection and at exit)."""
        self._finalizer()

    def _send(self, method: str, seqs: list[Sequence], is_prefill: bool, has_previous: bool = False) -> None:
        if self._teardown.done:
            raise EngineDeadError("the tensor-parallel engine is closed")
        dead = [p for p in self.workers if not p.is_alive()]
        if dead:
            self.close()
            raise EngineDeadError(f"tensor-parallel worker {dead[0].name} exited (code {dead[0].exitcode}); "
                                  "the engine is stopped")
        # The rows that sample decide how every rank gets the tokens (ModelRunner._tokens_in_flight, run).
        greedy = argmax_only([seqs[i].sampling_params for i in sampling_rows(seqs)])
        flags = (is_prefill, has_previous, greedy)
        if not self.channel.send(method, flags, encode(seqs, is_prefill, self._sent_tables), timeout=SEND_TIMEOUT_S):
            self._teardown.broken = True
            self.close()
            raise EngineDeadError(f"a tensor-parallel worker took no step for {SEND_TIMEOUT_S:.0f} s; the engine is stopped")

    def _guarded(self, step, *args):
        """Run rank 0's share of a step that the workers were sent.

        A failure here (Ctrl-C included) leaves the workers inside a collective
        that rank 0 will never join: the engine cannot go on, so it stops the
        workers and re-raises rather than hang on the next step.
        """
        try:
            return step(*args)
        except BaseException:
            self._teardown.broken = True
            self.close()
            raise

    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int | None]:
        """Send the batch, then run rank 0's share; synchronous (the tokens come back to the host)."""
        self._send("run", seqs, is_prefill)
        return self._guarded(super().run, seqs, is_prefill)

    def launch_decode(self, seqs: list[Sequence], previous: InFlightStep | None) -> InFlightStep:
        self._send("launch_decode", seqs, False, has_previous=previous is not None)
        return self._guarded(super().launch_decode, seqs, previous)

    def launch_prefill(self, seqs: list[Sequence]) -> InFlightStep:
        self._send("launch_prefill", seqs, True)
        return self._guarded(super().launch_prefill, seqs)

    def _sample_in_flight(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """Sample here, and send the ids to the workers: their next step reads them as inputs.
        (A step whose rows all take the argmax never comes here: every rank takes it, `_tokens_in_flight`.)"""
        tokens = super()._sample_in_flight(logits, seqs)
        dist.broadcast(tokens, src=0)
        return tokens


class WorkerRunner(_TensorParallelShare, ModelRunner):
    """A worker's ModelRunner: runs whatever rank 0 sends, and takes sampled ids from rank 0."""

    def serve(self, channel: StepChannel) -> None:
        """Run steps until rank 0 says stop."""
        last: InFlightStep | None = None     # the step this worker launched last (async scheduling)
        tables = HeldTables()
        while True:
            method, flags, arrays = channel.receive()
            if method == "stop":
                return
            is_prefill, has_previous, greedy = flags
            seqs = decode(arrays, is_prefill, tables, greedy)
            if method == "run":
                self.run(seqs, is_prefill)
                last = None
            elif method == "launch_decode":
                if has_previous and last is None:
                    raise RuntimeError("rank 0 continued a step this worker never launched")
                last = self.launch_decode(seqs, last if has_previous else None)
            elif method == "launch_prefill":
                last = self.launch_prefill(seqs)
            else:
                raise RuntimeError(f"unknown step message {method!r}")

    def _sample_in_flight(self, logits: torch.Tensor, seqs: list) -> torch.Tensor:
        tokens = torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device)
        dist.broadcast(tokens, src=0)
        return tokens

    def leave(self) -> None:
        """Drop the graphs, then leave the group (the order NCCL needs)."""
        for graphs in self.graph_sets():
            graphs.clear()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        parallel_state.destroy_tensor_parallel()


def worker_main(config: Config, rank: int, init_file: str, parent_pid: int, channel: StepChannel) -> None:
    """Rank `rank`: build this rank's shard, then run whatever rank 0 sends, until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent(parent_pid)
    try:
        channel.attach(rank - 1)
        parallel_state.init_tensor_parallel(rank, config.tensor_parallel_size, config.device, init_file)
        runner = WorkerRunner(config)
        # The worker's heap is now what it keeps for good (the model, its graphs): a full collection need
        # not walk it again. Each step's objects die young; unfrozen, a full collection walking the whole
        # heap would stall this rank, and every rank waits for it at the next collective.
        gc.freeze()
        runner.serve(channel)
        runner.leave()
        channel.close()
    except BaseException:
        traceback.print_exc(file=sys.stderr)
        os._exit(1)
    os._exit(0)
