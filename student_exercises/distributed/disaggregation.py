# Generated from reference/distributed/disaggregation.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Prefill/decode disaggregation: a prefill engine and a decode engine, each in its own process.

    caller (DisaggregatedLLM) --requests--> prefill process (rank 0, GPU 0)
                                               | prefill, sample the first token,
                                               | then hand the request off (kv_transfer)
                                               v
                                            decode process (rank 1, GPU 1) --results--> caller

Both are ordinary LLMEngines: the prefill engine stops each request after its
first token, the decode engine takes requests in mid-flight with their K/V.
The two processes form a 2-rank torch.distributed group for the K/V (NCCL when
there are two GPUs; gloo otherwise, staging through host memory). The caller's
process joins no group, so it can also run a colocated engine for comparison.

Metrics: every result carries TTFT (prefill engine's clock: arrival to first
token), the time and bytes of its KV transfer, and its finish time on the
decode engine. Both processes stamp times with time.perf_counter, a
system-wide monotonic clock on Linux, so times from the two compare directly.
"""
from __future__ import annotations

import itertools
import os
import shutil
import sys
import tempfile
import traceback
import weakref
from collections import deque
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from student_exercises.distributed.kv_transfer import accept, drain_received, drain_sent, offer
from student_exercises.distributed.processes import exit_with_parent, start_daemons, stop_processes
from student_exercises.sampling_params import SamplingParams

PREFILL_RANK, DECODE_RANK = 0, 1
IDLE_POLL_S = 0.005


def _devices(device: str) -> tuple[str, str, str]:
    """(prefill device, decode device, KV backend): separate GPUs with NCCL where there are two."""
    if device == "cuda" and torch.cuda.device_count() >= 2:
        return "cuda:0", "cuda:1", "nccl"
    return device, device, "gloo"


def _stop(procs: list, init_dir: str) -> None:
    stop_processes(procs)
    shutil.rmtree(init_dir, ignore_errors=True)


class DisaggregatedLLM:
    """`generate` over a prefill process and a decode process; the same results as `LLM.generate`, plus metrics."""

    def __init__(self, model: str, **config):
        device = config.get("device", "auto")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        init_dir = tempfile.mkdtemp(prefix="inferlab-pd-")
        ctx = mp.get_context("spawn")
        handoff_p, handoff_d = ctx.Pipe()
        self._pipes, child_ends, specs = {}, {}, []
        for role in ("prefill", "decode"):
            self._pipes[role], child_ends[role] = ctx.Pipe()
            args = (role, model, {**config, "device": device}, os.path.join(init_dir, "rendezvous"),
                    child_ends[role], handoff_p if role == "prefill" else handoff_d, os.getpid())
            specs.append((_engine_main, args, f"inferlab-{role}"))
        self.procs = start_daemons(ctx, specs)
        self._finalizer = weakref.finalize(self, _stop, self.procs, init_dir)
        try:
            for role in ("prefill", "decode"):
                self._expect(role, "ready")
        except BaseException:
            self.close()
            raise
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop both processes (also done on garbage collection and at exit)."""
        self._finalizer()

    def _expect(self, role: str, kind: str):
        message = self._pipes[role].recv()
        if message[0] == "error":
            self.close()
            raise RuntimeError(f"the {role} engine failed:\n{message[1]}")
        assert message[0] == kind, message
        return message

    def generate(self, prompts: list[list[int]], sampling_params: SamplingParams | list[SamplingParams]) -> list[dict]:
        """Token-id prompts in, results in input order: token_ids, finish_reason and per-request metrics."""
        ids = [next(self._ids) for _ in prompts]
        params = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        for request_id, prompt, p in zip(ids, prompts, params):
            self._pipes["prefill"].send(("add", request_id, list(prompt), p))
        results: dict[int, dict] = {}
        pipes = {conn: role for role, conn in self._pipes.items()}
        while len(results) < len(ids):
            dead = [p for p in self.procs if not p.is_alive()]
            if dead:
                self.close()
                raise RuntimeError(f"{dead[0].name} exited (code {dead[0].exitcode}); the engine is stopped")
            for conn in wait(list(pipes), timeout=1.0):
                message = conn.recv()
                if message[0] == "error":
                    self.close()
                    raise RuntimeError(f"the {pipes[conn]} engine failed:\n{message[1]}")
                _, request_id, result = message
                results[request_id] = result
        return [results[i] for i in ids]

    def logs(self) -> dict[str, list[dict]]:
        """Both engines' lifecycle logs: the prefill log ends a request with KV_SENT, the decode log starts it with KV_RECEIVED."""
        out = {}
        for role, conn in self._pipes.items():
            conn.send(("log",))
            out[role] = self._expect(role, "log")[1]
        return out


def _engine_main(role: str, model: str, config: dict, init_file: str, control, handoff, parent_pid: int) -> None:
    exit_with_parent(parent_pid)
    try:
        prefill_device, decode_device, backend = _devices(config["device"])
        device = prefill_device if role == "prefill" else decode_device
        if torch.device(device).index is not None:     # "cuda:1" on two GPUs; plain "cuda" (one GPU, shared) as is
            torch.cuda.set_device(torch.device(device))
        rank = PREFILL_RANK if role == "prefill" else DECODE_RANK
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=2)
        from student_exercises.engine.llm_engine import LLMEngine
        engine = LLMEngine(model, **{**config, "device": device.split(":")[0]})
        staging = engine.model_runner.kv_cache.device if backend == "nccl" else torch.device("cpu")
        control.send(("ready",))
        loop = _prefill_loop if role == "prefill" else _decode_loop
        loop(engine, control, handoff, staging)
    except KeyboardInterrupt:
        os._exit(0)
    except BaseException:
        try:
            control.send(("error", traceback.format_exc()))
        finally:
            traceback.print_exc(file=sys.stderr)
            os._exit(1)


def _serve_control(engine, control, request_of: dict, block: bool) -> None:
    """Take requests and log queries from the caller; wait a little when there is nothing else to do."""
    while control.poll(IDLE_POLL_S if block else 0):
        message = control.recv()
        if message[0] == "add":
            _, request_id, prompt, params = message
            try:
                request_of[engine.add_request(prompt, params)] = request_id
            except (ValueError, TypeError) as err:   # a bad request is refused; the engine keeps serving
                control.send(("done", request_id, {"token_ids": [], "finish_reason": None, "error": str(err)}))
        elif message[0] == "log":
            control.send(("log", list(engine.log.events)))
        block = False


def _result(seq, extra: dict) -> dict:
    return {"token_ids": seq.output_token_ids, "finish_reason": seq.finish_reason,
            "arrival_time": seq.arrival_time, "first_token_time": seq.first_token_time,
            "finished_time": seq.finished_time, **extra}


def _prefill_loop(engine, control, handoff, staging) -> None:
    """Prefill, then offer the requests that have their first token; finished ones go straight back.

    The K/V sends are posted and left to run (on their own NCCL stream on
    two GPUs) while this engine steps on; each is logged once complete.
    """
    request_of: dict[int, int] = {}
    sending: deque = deque()
    while True:
        drain_sent(engine, sending)
        _serve_control(engine, control, request_of, block=engine.is_finished() and not sending)
        if engine.is_finished():
            continue
        for out in engine.step():
            if out.finished:   # stopped at its first token: nothing to hand off
                seq = engine.finished.pop(out.seq_id)
                control.send(("done", request_of.pop(out.seq_id), _result(seq, {"kv_bytes": 0, "kv_transfer_s": 0.0})))
        ready = [s for s in engine.sequences.values() if s.num_output_tokens >= 1]
        if ready:
            sending.extend(offer(engine, ready, request_of, handoff, DECODE_RANK, staging))


def _decode_loop(engine, control, handoff, staging) -> None:
    """Take handed-off requests between decode steps; each joins the batch once its K/V have arrived."""
    request_of: dict[int, int] = {}
    transfer: dict[int, dict] = {}
    receiving: deque = deque()
    while True:
        _serve_control(engine, control, {}, block=False)
        idle = engine.is_finished()
        while handoff.poll((IDLE_POLL_S if not receiving else IDLE_POLL_S / 10) if idle else 0):
            posted = accept(engine, handoff.recv(), handoff, PREFILL_RANK, staging)
            if posted is not None:
                receiving.append(posted)
            idle = False
        for t in drain_received(engine, receiving):
            request_of[t.seq.seq_id] = t.extra["request_id"]
            transfer[t.seq.seq_id] = {"kv_bytes": t.nbytes, "kv_transfer_s": t.extra["seconds"]}
        if engine.is_finished():
            continue
        for out in engine.step():
            if out.finished:
                seq = engine.finished.pop(out.seq_id)
                control.send(("done", request_of.pop(out.seq_id), _result(seq, transfer.pop(out.seq_id))))
