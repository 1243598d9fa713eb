"""Drivers shared by the hidden tests (copied into every harness as `_inferlab_support.py`).

Hidden tests never assert: they drive the harness's `student_exercises`
package (the instructor's engine with one student's regions spliced in) and
`observe` what it does. The grader compares those observations with the
reference's (the golden outputs) in its own process. So every helper here
returns plain data (lists, dicts, ints, strings) and never a verdict.
"""
from __future__ import annotations

import importlib
import os
import random
from typing import Any

PACKAGE = "student_exercises"
MODEL_ENV = "INFERLAB_GRADING_MODEL"
VOCAB = 1000                    # token ids below the tiny model's special tokens
MAX_STEPS = 2000                # an engine that stops making progress is cut off here


def module(name: str):
    """A module of the package under test, e.g. module("engine.block_manager")."""
    return importlib.import_module(f"{PACKAGE}.{name}")


def model_dir() -> str:
    return os.environ[MODEL_ENV]


def tokens(start: int, n: int) -> list[int]:
    return [(start + i) % VOCAB for i in range(n)]


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


# -- lab 2: the block manager without a model ---------------------------------------------------

class Blocks:
    """The block manager and Sequence of the package under test, with the engine's calling pattern."""

    def __init__(self, block_size: int = 4):
        self.BlockManager = module("engine.block_manager").BlockManager
        self.Sequence = module("engine.sequence").Sequence
        self.SamplingParams = module("sampling_params").SamplingParams
        self.block_size = block_size

    def manager(self, num_blocks: int, caching: bool = True):
        return self.BlockManager(num_blocks, self.block_size, caching)

    def seq(self, token_ids: list[int]):
        return self.Sequence(list(token_ids), self.SamplingParams(temperature=0.0), self.block_size, seq_id=0)

    @staticmethod
    def prefill(bm, seq) -> None:
        """What one whole prefill step does: allocate, then mark every uncomputed token computed."""
        bm.allocate(seq)
        bm.mark_computed(seq, len(seq) - seq.num_cached_tokens)

    @staticmethod
    def decode(bm, seq, token: int) -> bool:
        """One decode step; returns can_append's answer (the token is only computed when it said yes)."""
        seq.append_token(token)
        room = bool(bm.can_append(seq))
        if room:
            bm.may_append(seq)
            bm.mark_computed(seq, 1)
        return room

    @staticmethod
    def snapshot(bm, seqs: dict[str, Any]) -> dict[str, Any]:
        """Everything observable about the pool: tables, computed counts, ref counts, free order, hashed blocks."""
        return {
            "tables": {name: list(s.block_table) for name, s in seqs.items()},
            "cached": {name: s.num_cached_tokens for name, s in seqs.items()},
            "ref_counts": [b.ref_count for b in bm.blocks],
            "free_order": list(bm.free_block_ids),
            "num_free": bm.num_free_blocks,
            "hashed": [b.block_id for b in bm.blocks if b.hash is not None],
            "hash_entries": len(bm.hash_to_block),
        }


# -- engine workloads (tiny model) --------------------------------------------------------------

def log_line(event: dict[str, Any]) -> str:
    """One lifecycle event as a line with the time dropped: what step-indexed comparison compares."""
    fields = " ".join(f"{k}={event[k]}" for k in sorted(event) if k not in ("event", "seq_id", "step", "time"))
    return f"step={event.get('step')} {event.get('event')} seq={event.get('seq_id')} {fields}".rstrip()


def drive_engine(requests: list[tuple[list[int], dict[str, Any]]], observe, *, blocks: bool = True,
               log: bool = True, tokens_key: str = "tokens", aborts: dict[int, list[int]] | None = None,
               **config: Any):
    """Run a fixed workload through the engine under test, one step at a time, observing as it goes.

    Observed: which requests were refused at admission; per step the scheduled
    batch and (with `blocks`) the block tables that changed and the free-block
    count; the greedy tokens of each request; (with `log`) the lifecycle log
    with times dropped and the per-step STEP metrics.
    """
    engine_module = module("engine.llm_engine")
    params_cls = module("sampling_params").SamplingParams
    engine = engine_module.LLMEngine(model_dir(), **{"device": "cpu", **config})     # GPU tests pass device="cuda"
    refused, ids = [], []
    names: dict[int, str] = {}            # engine seq_id -> "r<i>", the i-th request of the test's workload
    for index, (prompt, params) in enumerate(requests):
        try:
            ids.append(engine.add_request(list(prompt), params_cls(**params)))
            names[ids[-1]] = f"r{index}"
        except (ValueError, TypeError) as err:
            refused.append([index, type(err).__name__])
    observe("refused at admission", refused)
    previous: dict[int, list[int]] = {}
    events = engine.log.events
    seen = 0
    for step in range(MAX_STEPS):
        if engine.is_finished():
            break
        for index in (aborts or {}).get(step, []):
            try:
                engine.abort_request(ids[index])
            except Exception as err:  # noqa: BLE001 - the failure is the observation
                observe(f"abort {index}", {"raised": type(err).__name__})
        if engine.is_finished():
            break
        try:
            engine.step()
        except Exception as err:  # noqa: BLE001 - the failure is the observation
            observe(f"step {step}", {"raised": type(err).__name__})
            break
        new = events[seen:]
        seen = len(events)
        scheduled = [f"{names.get(e['seq_id'], e['seq_id'])}:{'P' if e['is_prefill'] else 'D'}{e['num_new_tokens']}"
                     f"+{e['num_cached_tokens']}" for e in new if e.get("event") == "SCHEDULED"]
        record: dict[str, Any] = {"scheduled": scheduled}
        if blocks:
            tables = {sid: list(seq.block_table) for sid, seq in engine.sequences.items()}
            record["changed"] = {names.get(sid, str(sid)): t for sid, t in sorted(tables.items())
                                 if previous.get(sid) != t}
            record["finished"] = [names.get(sid, str(sid)) for sid in sorted(previous) if sid not in tables]
            record["free"] = engine.block_manager.num_free_blocks
            previous = tables
        observe(f"step {step}", record)
    else:
        observe("stopped", f"still running after {MAX_STEPS} steps")
    done = {sid: seq.output_token_ids for sid, seq in engine.finished.items()}
    observe(tokens_key, [done.get(sid) for sid in ids])
    if log:
        observe("log", [log_line(e) for e in events])
        observe("step metrics", [[e["step"], e["batch_size"], e["num_tokens"], e["num_running"], e["num_waiting"],
                                  e["kv_blocks_used"]] for e in events if e.get("event") == "STEP"])
    return engine, ids


def timestamps_agree(engine, ids: list[int]) -> list[list[bool]]:
    """Per request: do the log's ARRIVED, first SCHEDULED, FIRST_TOKEN and FINISHED times equal the engine's own?

    Times differ from run to run, so the log comparison drops them; whether
    the log and the Sequence agree on them does not.
    """
    firsts: dict[tuple[int, str], float] = {}
    for e in engine.log.events:
        firsts.setdefault((e.get("seq_id"), e.get("event")), e.get("time"))
    rows = []
    for sid in ids:
        seq = engine.finished.get(sid)
        if seq is None:
            rows.append([False] * 4)
            continue
        rows.append([firsts.get((sid, "ARRIVED")) == seq.arrival_time,
                     firsts.get((sid, "SCHEDULED")) == seq.first_scheduled_time,
                     firsts.get((sid, "FIRST_TOKEN")) == seq.first_token_time,
                     firsts.get((sid, "FINISHED")) == seq.finished_time])
    return rows


def times_never_go_back(events: list[dict[str, Any]]) -> bool:
    times = [e.get("time") for e in events]
    return all(isinstance(t, float) for t in times) and all(a <= b for a, b in zip(times, times[1:]))


# -- lab 3: the scheduler with a fake model ----------------------------------------------------

class SchedulerDriver:
    """The scheduler under test with the reference block manager and a fake model.

    After each `schedule()` it does what the engine does: marks the scheduled
    tokens computed, appends a token (600 + length % 50) when a sequence's
    scheduled tokens reach its end, and finishes it at max_tokens. Each step
    is recorded as "P a:6 b:4" or "D a b", with both queues after the step.
    """

    def __init__(self, num_blocks: int, block_size: int = 4, max_num_seqs: int = 8, max_num_batched_tokens: int = 64,
                 max_model_len: int = 64, chunked: bool = False, caching: bool = True):
        config = module("config").Config(model=model_dir(), device="cpu", kvcache_block_size=block_size,
                                         num_kvcache_blocks=num_blocks, max_num_seqs=max_num_seqs,
                                         max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
                                         enable_chunked_prefill=chunked, enable_prefix_caching=caching)
        self.Sequence = module("engine.sequence").Sequence
        self.SamplingParams = module("sampling_params").SamplingParams
        self.block_size = block_size
        self.bm = module("engine.block_manager").BlockManager(num_blocks, block_size, caching)
        self.log = module("engine.lifecycle").LifecycleLog()
        self.scheduler = module("engine.scheduler").Scheduler(config, self.bm, self.log)
        self.names: dict[int, str] = {}
        self.seqs: dict[str, Any] = {}
        self.finished: list[str] = []

    def add(self, name: str, token_ids: list[int], max_tokens: int):
        params = self.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        seq = self.Sequence(list(token_ids), params, self.block_size, seq_id=len(self.names))
        self.names[seq.seq_id] = name
        self.seqs[name] = seq
        self.scheduler.add(seq)
        return seq

    def _queue(self, which: str) -> list[str]:
        return [self.names.get(s.seq_id, "?") for s in getattr(self.scheduler, which)]

    def step(self) -> dict[str, Any]:
        seqs, is_prefill = self.scheduler.schedule()
        if is_prefill:
            batch = "P " + " ".join(f"{self.names[s.seq_id]}:{s.num_scheduled_tokens}" for s in seqs)
        else:
            batch = "D " + " ".join(self.names[s.seq_id] + ("" if s.num_scheduled_tokens == 1 else
                                                            f":{s.num_scheduled_tokens}") for s in seqs)
        for seq in seqs:
            self.bm.mark_computed(seq, seq.num_scheduled_tokens)
            if seq.num_cached_tokens == len(seq):
                seq.append_token(600 + len(seq) % 50)
                if seq.num_output_tokens >= seq.sampling_params.max_tokens:
                    self.scheduler.finish(seq)
                    self.finished.append(self.names[seq.seq_id])
        self.log.end_step()
        return {"batch": batch.strip(), "waiting": self._queue("waiting"), "running": self._queue("running"),
                "waiting status": [s.status.name for s in self.scheduler.waiting], "free": self.bm.num_free_blocks}

    def run(self, observe, max_steps: int = 40) -> None:
        """Step until every request finished (or nothing was scheduled), observing each step."""
        for step in range(max_steps):
            if self.scheduler.is_finished():
                break
            try:
                record = self.step()
            except Exception as err:  # noqa: BLE001 - the failure is the observation
                observe(f"step {step}", {"raised": type(err).__name__})
                break
            observe(f"step {step}", record)
            if record["batch"] in ("P", "D"):
                break                            # nothing scheduled: the real engine would stop here
        observe("finished", list(self.finished))
        observe("status", {name: [s.status.name, s.num_preemptions, len(s.token_ids)] for name, s in self.seqs.items()})
        observe("log", [log_line(e) for e in self.log.events])


def shared_prefix_workload(seed: int, n: int, prefixes: int, prefix_len: int, max_prompt: int,
                           max_tokens: int) -> list[tuple[list[int], dict[str, Any]]]:
    """`n` requests of mixed lengths; about two thirds start with one of `prefixes` shared prefixes."""
    rng = random.Random(seed)
    shared = [random_tokens(rng, prefix_len) for _ in range(prefixes)]
    requests = []
    for i in range(n):
        head = list(shared[i % prefixes]) if i % 3 else []
        prompt = head + random_tokens(rng, rng.randint(1, max_prompt))
        requests.append((prompt, {"temperature": 0.0, "max_tokens": rng.randint(1, max_tokens), "ignore_eos": True}))
    return requests


def approx(value: Any, rel_tol: float) -> dict[str, Any]:
    """A float result compared with tolerance `rel_tol` (the grader takes the tolerance from the golden side)."""
    return {"__rtol__": rel_tol, "value": value}
