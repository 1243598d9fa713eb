# Generated from reference/engine/llm_engine.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""`LLMEngine`: the request lifecycle, one `step()` at a time.

    add_request  -> checks, tokenizes, builds a Sequence, queues it   (stages 1-3)
    step         -> Scheduler.schedule, ModelRunner.run               (stages 3-5)
    postprocess  -> appends tokens, checks stop conditions, frees KV  (stage 6)

Every transition is written to the lifecycle log, so a run can be replayed,
measured and compared with the reference step by step.

With `async_scheduling=True` a decode step is scheduled and launched while the
GPU still computes the one before it; see `_step_overlapped`.
"""
from __future__ import annotations

import itertools
import logging
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig

from student_exercises.config import Config
from student_exercises.engine.lifecycle import LifecycleLog
from student_exercises.engine.model_runner import EngineDeadError, InFlightStep, ModelRunner
from student_exercises.engine.parts import EngineParts
from student_exercises.engine.sequence import PENDING_TOKEN, Sequence
from student_exercises.layers.sampler import TokenLogprobs
from student_exercises.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# Files a Hugging Face tokenizer is built from; a folder with none of them is not a model folder.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


@dataclass(slots=True)
class StepOutput:
    """What one step produced for one sequence: its new token and whether it finished."""
    seq_id: int
    new_token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None   # "stop" | "length" | "abort" | "error"
    logprobs: list[TokenLogprobs] | None = None   # one per new token, when the request asked for them


class LLMEngine:
    """One engine: a model runner, a scheduler that owns the block manager, and the loop around them.

    `parts` says which classes to build them from (reference/engine/parts.py):
    the course's own by default; a test or a student release hands in others.
    """

    def __init__(self, model: str, parts: EngineParts | None = None, **config_fields):
        parts = parts or EngineParts()
        self.config = Config(model=model, **config_fields)
        if self.config.tensor_parallel_size > 1 and parts.model_runner is ModelRunner:
            raise ValueError(f"tensor_parallel_size={self.config.tensor_parallel_size} needs a runner that drives "
                             "worker processes: build the engine with reference.LLM, which brings one, or pass "
                             "parts=EngineParts(model_runner=TensorParallelRunner)")
        self.tokenizer = load_tokenizer(self.config.model)
        self.eos_token_ids = stop_token_ids_of(self.config.model, self.config.hf_config, self.tokenizer)
        self.model_runner = parts.model_runner(self.config)
        self.log = LifecycleLog(self.config.lifecycle_log)
        block_manager = parts.block_manager(self.model_runner.num_kvcache_blocks, self.config.kvcache_block_size,
                                            self.config.enable_prefix_caching)
        self.scheduler = parts.scheduler(self.config, block_manager, self.log)
        self.sequences: dict[int, Sequence] = {}   # every sequence not yet finished
        self.finished: dict[int, Sequence] = {}    # finished, until the caller collects them
        self._in_flight: InFlightStep | None = None   # async scheduling: a decode step not yet read back
        self._held_outputs: list[StepOutput] = []     # read back while an interrupt escaped step(): returned next
        self._num_want_logprobs = 0                   # unfinished requests whose SamplingParams.logprobs is set
        self.in_step = False   # True while step() runs: a garbage-collected stream must not abort mid-step
        self._seq_ids = itertools.count()
        self._rng = torch.Generator().manual_seed(self.config.seed)

    @property
    def block_manager(self):
        """The scheduler's block manager, for reading its counters (the STEP event, tutorials, tests).

        The scheduler owns it: the engine changes blocks only through the scheduler.
        """
        return self.scheduler.block_manager

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_kvcache_blocks(self) -> int:
        """The KV pool's size in blocks (the runner sized it; the block manager was built with it)."""
        return self.model_runner.num_kvcache_blocks

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of the KV pool's blocks held by requests (0-1): what a server's gauge reports."""
        return self.block_manager.num_used_blocks / self.num_kvcache_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """KV blocks a request holds at its end with `num_tokens` tokens (prompt + output).

        The last sampled token is never fed back, so its K/V never need a slot.
        """
        block_size = self.config.kvcache_block_size
        return (max(num_tokens - 1, 0) + block_size - 1) // block_size

    @property
    def step_index(self) -> int:
        """The step now running, or between steps the next one to run.

        The lifecycle log keeps this count, since it stamps every event with
        it (see reference/engine/lifecycle.py); `step()` ends each step with
        `self.log.end_step()`. Setting it jumps ahead (an idle engine in a
        replay whose arrivals are given in steps); it never goes back.
        """
        return self.log.step

    @step_index.setter
    def step_index(self, step: int) -> None:
        self.log.skip_to(step)

    # -- stage 1-3: admission ------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a prompt: a string is tokenized as is, a list is checked and made plain ints.

        Any integer type is taken (`list(np_array)` gives numpy integers), a
        bool is not (`True` as a token id is a bug). An array or tensor itself
        is refused with the call that makes it a list, rather than iterated.
        """
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        if isinstance(prompt, (list, tuple)):
            vocab = self.config.hf_config["vocab_size"]
            ids = []
            for t in prompt:
                if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                    raise TypeError(f"prompt token ids must be ints, got {type(t).__name__}")
                if not 0 <= t < vocab:
                    raise ValueError(f"prompt token id {t} is outside the vocabulary [0, {vocab})")
                ids.append(int(t))
            return ids
        hint = " (pass .tolist() of it)" if hasattr(prompt, "tolist") else ""
        raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}{hint}")

    def check_request(self, token_ids: list[int], params: SamplingParams) -> None:
        """Refuse, with a reason, any request that could never be served."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        params.validate()   # fields may have been changed since the object was built
        vocab = self.config.hf_config["vocab_size"]
        for token_id in params.stop_token_ids:
            if token_id >= vocab:
                raise ValueError(f"SamplingParams.stop_token_ids: {token_id} is outside the vocabulary [0, {vocab})")
        if not token_ids:
            raise ValueError("prompt is empty: a request needs at least one token")
        max_len = self.config.max_model_len
        if len(token_ids) >= max_len:
            raise ValueError(f"prompt has {len(token_ids)} tokens but max_model_len is {max_len}: "
                             f"no room to generate")
        total_len = min(len(token_ids) + params.max_tokens, max_len)
        blocks_needed = self.blocks_for(total_len)
        pool = self.num_kvcache_blocks
        if blocks_needed > pool:
            raise ValueError(
                f"request needs {blocks_needed} KV blocks ({total_len - 1} tokens) but the whole KV pool has "
                f"{pool} blocks: it could never run; lower max_tokens")

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams,
                    arrival_time: float | None = None) -> int:
        """Check, tokenize and queue one request; returns its seq_id. Raises on bad input, queuing nothing."""
        token_ids = self.tokenize(prompt)
        self.check_request(token_ids, sampling_params)
        return self.enqueue(token_ids, sampling_params, arrival_time)

    def enqueue(self, token_ids: list[int], sampling_params: SamplingParams, arrival_time: float | None = None) -> int:
        """Queue a request that `tokenize` and `check_request` already accepted; returns its seq_id.

        Split from `add_request` so that a batch is tokenized and checked once,
        all of it before any of it is queued (`LLM.generate`). `arrival_time`
        lets a front end (the HTTP server) stamp ARRIVED when the request
        reached it rather than when it reached the engine.
        """
        now = self.log.now() if arrival_time is None else arrival_time
        seq = Sequence(token_ids, sampling_params, self.config.kvcache_block_size, arrival_time=now,
                       seq_id=next(self._seq_ids))
        if not sampling_params.greedy:
            seed = sampling_params.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._rng))
            # On the model's device: the noise a draw needs (one value per vocabulary entry) is
            # made where the logits are, and a decode step can sample without waiting for the host.
            seq.generator = torch.Generator(device=self.config.device).manual_seed(seed)
        self._count_logprobs(seq, +1)
        self.sequences[seq.seq_id] = seq
        # >>> EXERCISE lab1.emit_arrival: Log ARRIVED, then queue the request with the scheduler (which logs QUEUED).
        # HINT: ARRIVED carries prompt_len and uses `now`, the arrival time the Sequence recorded.
        # HINT: the log stamps each event with the current engine step itself.
        raise NotImplementedError("lab1.emit_arrival")
        # <<< EXERCISE lab1.emit_arrival
        return seq.seq_id

    def abort_request(self, seq_id: int) -> None:
        """Stop a request wherever it is and give its blocks back."""
        seq = self.sequences.get(seq_id)
        if seq is None:
            raise ValueError(f"no unfinished request with seq_id {seq_id}")
        self._finish(seq, "abort", self.log.now())

    def hand_off(self, seq: Sequence) -> None:
        """Drop a sequence another engine now serves (its K/V were sent): blocks back, no FINISHED here."""
        self.scheduler.finish(seq)
        self._count_logprobs(seq, -1)
        del self.sequences[seq.seq_id]

    def adopt(self, seq: Sequence, num_computed_tokens: int) -> None:
        """Serve a sequence prefilled elsewhere, whose blocks `scheduler.reserve` took and whose K/V arrived."""
        self.scheduler.add_running(seq, num_computed_tokens)
        self._count_logprobs(seq, +1)
        self.sequences[seq.seq_id] = seq

    def _count_logprobs(self, seq: Sequence, change: int) -> None:
        """Keep count of unfinished requests that want logprobs: only a synchronous step computes them."""
        if seq.sampling_params.logprobs is not None:
            self._num_want_logprobs += change

    def settle(self) -> None:
        """Read back a step still in flight whose sequences have all finished, so the engine is idle.

        Under async scheduling the last request can end on a stop token while
        a step that would have given it one more token is already launched;
        that token is thrown away, but the step must still be waited for.
        """
        if self._in_flight is not None and self.scheduler.is_finished():
            in_flight, self._in_flight = self._in_flight, None
            self._read_back(in_flight)

    # -- stage 3-5: one step ---------------------------------------------------
    def is_finished(self) -> bool:
        return self.scheduler.is_finished() and self._in_flight is None

    def step(self) -> list[StepOutput]:
        """Schedule one batch, run it, and postprocess; returns what each sequence got.

        If running the batch fails (a kernel error, a sampler that cannot
        sample), the requests of that batch, and of a step in flight, finish
        with reason "error" and give their blocks back; every other request
        and the engine itself go on. A failure before anything was scheduled
        is an engine bug, and an `EngineDeadError` (no step can ever run
        again) concerns every request: both are raised. An interrupt
        (KeyboardInterrupt) that escapes leaves the engine able to go on
        (`_after_interrupt`).
        """
        held, self._held_outputs = self._held_outputs, []
        self._batch: list[Sequence] = []
        in_flight = self._in_flight
        self.in_step = True
        try:
            earlier: list[StepOutput] = held
            if self.config.async_scheduling:
                overlapped, done = self._step_overlapped()
                earlier = earlier + overlapped
                if done:
                    return earlier
            seqs, is_prefill = self.scheduler.schedule()
            if not seqs:
                raise RuntimeError(f"scheduler made no progress with {len(self.scheduler.waiting)} waiting and "
                                   f"{len(self.scheduler.running)} running: a request cannot fit")
            self._batch = seqs
            self._log_step(seqs, is_prefill)
            token_ids = self.model_runner.run(seqs, is_prefill)
            outputs = self.postprocess(seqs, token_ids)
            self.log.end_step()
            self.log.flush()
            return earlier + outputs
        except Exception as err:
            return held + self._recover(err, in_flight)
        except BaseException:
            self._held_outputs = held + self._after_interrupt(in_flight)
            raise
        finally:
            self.in_step = False

    def _after_interrupt(self, in_flight: InFlightStep | None) -> list[StepOutput]:
        """Make the engine consistent after an interrupt escaped a step; returns the outputs it read back.

        Ctrl-C in a notebook, then the next call: the caller aborts its
        requests, other requests go on, and the log must stay true. So a step
        whose STEP event was written is ended (the next step gets a new
        number), and tokens that async scheduling had booked as placeholders
        (`_advance`) are read back and logged now, as `_resolve` would have
        (FINISHED then counts only real tokens). Sequences of a step that was
        cut short before anything of it was recorded compute it again; a
        prompt among them goes back to the waiting queue as a preemption by
        recompute (PREEMPTED, QUEUED), since without chunked prefill the
        scheduler never resumes a prompt half-way. The outputs read back are
        returned by the next `step()`. The price: the interrupt waits for the
        step in flight (one step) on the device.
        """
        launched = self._in_flight is not None and self._in_flight is not in_flight
        outputs: list[StepOutput] = []
        if in_flight is not None and any(seq.token_ids[-1] == PENDING_TOKEN for seq in in_flight.seqs):
            if self._in_flight is in_flight:
                self._in_flight = None
            outputs = self._resolve(in_flight)
        if not launched and not self.config.enable_chunked_prefill:
            for seq in reversed(self._batch):
                if not seq.is_finished and seq.in_prefill:
                    self.scheduler.retire(seq)      # out of `running` ...
                    self.scheduler.preempt(seq)     # ... blocks back, to the front of `waiting`
        if self._batch or outputs:
            self.log.end_step()
        self.log.flush()
        return outputs

    def _recover(self, err: Exception, in_flight: InFlightStep | None) -> list[StepOutput]:
        """Fail the requests of the batch (and of a step in flight) that raised; re-raise if there were none."""
        victims = [seq for seq in dict.fromkeys(self._batch + (in_flight.batch if in_flight else []))
                   if not seq.is_finished]
        if not victims or isinstance(err, EngineDeadError):
            raise err
        self._in_flight = None
        outputs = self._fail(victims, err)
        self.log.end_step()
        self.log.flush()
        return outputs

    def _fail(self, seqs: list[Sequence], err: Exception) -> list[StepOutput]:
        """Finish `seqs` with reason "error", keeping the message on each sequence."""
        message = f"{type(err).__name__}: {err}"
        logger.error("step %d failed for requests %s: %s", self.step_index, [s.seq_id for s in seqs], message)
        now = self.log.now()
        outputs = []
        for seq in seqs:
            if seq.token_ids and seq.token_ids[-1] == PENDING_TOKEN:
                seq.token_ids.pop()   # a placeholder whose real token will never be read
            seq.error = message
            self._finish(seq, "error", now)
            outputs.append(StepOutput(seq.seq_id, finished=True, finish_reason="error"))
        return outputs

    def _log_step(self, seqs: list[Sequence], is_prefill: bool) -> None:
        # >>> EXERCISE lab1.emit_step: Log one STEP event (seq_id None) describing the batch just scheduled.
        # HINT: fields: is_prefill, batch_size, num_tokens (K/V computed this step), num_running, num_waiting,
        # HINT: kv_blocks_used and kv_blocks_total, all read after scheduling and before the forward pass.
        raise NotImplementedError("lab1.emit_step")
        # <<< EXERCISE lab1.emit_step

    # -- async scheduling: overlap the CPU's work with the GPU's -----------------
    def _step_overlapped(self) -> tuple[list[StepOutput], bool]:
        """One step with the CPU one step ahead of the GPU; returns (outputs, done).

        A synchronous decode step makes the GPU wait while the CPU reads the
        sampled tokens back, postprocesses them, schedules and prepares the next
        step: at 256 running sequences that is ~2.4 ms of every ~10 ms step.
        Here the next decode step is launched first, its input tokens taken
        straight from the previous step's output on the GPU, and only then are
        the previous step's tokens read back and postprocessed, while the GPU
        computes. The price is one step of lag: a token is logged (TOKEN,
        FINISHED) at the step after the one that computed it, and a sequence
        that samples a stop token has already been scheduled for one more
        token, which is thrown away. Greedy tokens are the same as without it.

        Sampled requests (temperature, top-k, top-p) overlap too: the runner
        samples on the device (`sample_on_device`), each request drawing from
        its own generator once per token, as a synchronous step would, so
        seeded requests get the same tokens as without overlap.

        Prefill steps overlap too, if the runner can launch them
        (`prefills_in_flight`): a prefill needs nothing from the step in
        flight, so the next batch of prompts is scheduled and prepared while
        the GPU computes the previous one, and a prompt's first token is
        logged a step late like any other. With a possible preemption, the
        step in flight is read back first and `done` is False: the caller runs
        an ordinary synchronous step.
        """
        outputs: list[StepOutput] = []
        previous = self._in_flight
        if previous is not None and not self._can_overlap():
            self._in_flight = None
            outputs = self._read_back(previous)
            previous = None
            if self.scheduler.is_finished():
                return outputs, True
        if previous is None and not self._can_overlap():
            return outputs, False
        if previous is not None:
            self._advance(previous)
            if self.scheduler.is_finished():   # all of them end with the tokens in flight
                self._in_flight = None
                return self._resolve(previous), True
        seqs, is_prefill = self.scheduler.schedule()
        if not seqs:
            if previous is None:
                raise RuntimeError(f"scheduler made no progress with {len(self.scheduler.waiting)} waiting: "
                                   f"a request cannot fit")
            # Blocks a request waits for come back when the tokens in flight finish their sequences.
            self._in_flight = None
            return self._resolve(previous), True
        if is_prefill and not getattr(self.model_runner, "prefills_in_flight", False):
            raise RuntimeError("async scheduling expected a decode step (an engine bug, not a user error)")
        self._batch = seqs
        self._log_step(seqs, is_prefill)
        if is_prefill:
            self._in_flight = self.model_runner.launch_prefill(seqs)
        else:
            self._in_flight = self.model_runner.launch_decode(seqs, previous)
        if previous is not None:
            outputs += self._resolve(previous)
        self.log.end_step()
        self.log.flush()
        return outputs, True

    def _can_overlap(self) -> bool:
        """May the next step be scheduled before the tokens in flight are known?

        Only if it needs no preemption (a free block for every running
        sequence: a preempted sequence must not hold a placeholder token), and
        only if it is sure to be a decode step (nobody waiting, nobody
        mid-prefill) unless the runner launches prefills too
        (`prefills_in_flight`). Sampled sequences too, if the runner samples
        on the device (`samples_in_flight`); a runner without it overlaps
        greedy ones only. Never while a request that wants logprobs is
        unfinished: only the synchronous step computes them (its price: such
        a request runs its whole batch without overlap).
        """
        running, waiting = self.scheduler.running, self.scheduler.waiting
        sampled_ok = getattr(self.model_runner, "samples_in_flight", False)
        prefill_ok = getattr(self.model_runner, "prefills_in_flight", False)
        return ((bool(running) or (prefill_ok and bool(waiting)))
                and (prefill_ok or not waiting)
                and not self.scheduler.may_preempt()
                and not self._num_want_logprobs
                and all((sampled_ok or seq.sampling_params.greedy) and (prefill_ok or not seq.in_prefill)
                        for seq in running))

    def _read_back(self, in_flight: InFlightStep) -> list[StepOutput]:
        """Wait for a step in flight and postprocess it as a synchronous step would."""
        tokens = in_flight.tokens()
        live = [seq for seq in in_flight.batch if not seq.is_finished]
        return self.postprocess(live, [in_flight.token_of(tokens, seq) for seq in live])

    def _advance(self, in_flight: InFlightStep) -> None:
        """Book a step in flight as done before its tokens are known.

        Its K/V count as computed (the GPU writes them before any later step
        reads them: one stream), and each sampled token is a PENDING_TOKEN
        placeholder until `_resolve`. A sequence that this token takes to its
        length limit is retired now (`Scheduler.retire`), so it is not scheduled again.
        """
        for seq in in_flight.batch:
            if seq.is_finished:
                continue  # it sampled a stop token (or was aborted) a step ago: this token is thrown away
            self.scheduler.mark_computed(seq)
            if seq.seq_id not in in_flight.row_of:
                continue  # a prefill chunk short of the prompt's end: nothing sampled
            seq.append_token(PENDING_TOKEN)
            if self._reaches_length_limit(seq):
                self.scheduler.retire(seq)

    def _resolve(self, in_flight: InFlightStep) -> list[StepOutput]:
        """Put the real tokens of a step in flight in place of its placeholders, log them, stop."""
        now = self.log.now()
        outputs = []
        for seq, token in zip(in_flight.seqs, in_flight.tokens()):
            if seq.is_finished or seq.token_ids[-1] != PENDING_TOKEN:
                continue   # finished a step ago, or not booked (`_advance` was cut short by an interrupt)
            seq.token_ids[-1] = token
            out = StepOutput(seq.seq_id)
            outputs.append(out)
            self._record_token(seq, token, now, out)
        return outputs

    # -- stage 6: results and reclamation ------------------------------------
    def postprocess(self, seqs: list[Sequence], token_ids: list[int | None]) -> list[StepOutput]:
        """Account for computed K/V, append sampled tokens, stop and free finished sequences."""
        now = self.log.now()
        outputs = []
        for seq, token in zip(seqs, token_ids):
            self.scheduler.mark_computed(seq)
            out = StepOutput(seq.seq_id)
            outputs.append(out)
            if token is None:
                continue  # an unfinished prefill chunk: nothing sampled yet
            seq.append_token(token)
            self._record_token(seq, token, now, out)
        return outputs

    def _record_token(self, seq: Sequence, token: int, now: float, out: StepOutput) -> None:
        """Log a token already appended to seq, and finish seq if it stops here."""
        out.new_token_ids.append(token)
        # >>> EXERCISE lab1.emit_token: Log the new token: FIRST_TOKEN for the first output token, TOKEN after it.
        # HINT: `index` counts output tokens from 0 (the token is already appended); both events carry token_id.
        # HINT: the first token also sets seq.first_token_time, the engine's own record of TTFT.
        raise NotImplementedError("lab1.emit_token")
        # <<< EXERCISE lab1.emit_token
        if seq.sampling_params.logprobs is not None and seq.num_output_tokens <= len(seq.logprobs):
            out.logprobs = (out.logprobs or []) + [seq.logprobs[seq.num_output_tokens - 1]]
        reason = self._stop_reason(seq, token)
        if reason is not None:
            self._finish(seq, reason, now)
            out.finished, out.finish_reason = True, reason

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.sampling_params
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return "stop"
        if self._reaches_length_limit(seq):
            return "length"
        return None

    def _reaches_length_limit(self, seq: Sequence) -> bool:
        return (len(seq) - seq.num_prompt_tokens >= seq.sampling_params.max_tokens
                or len(seq) >= self.config.max_model_len)

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        seq.finish_reason = reason
        seq.finished_time = now
        blocks_freed = self.scheduler.finish(seq)
        self._count_logprobs(seq, -1)
        del self.sequences[seq.seq_id]
        # >>> EXERCISE lab1.emit_finish: Log that the request finished, then that its blocks went back to the pool.
        # HINT: FINISHED carries reason and num_output_tokens; FREED carries blocks_freed; both at time `now`.
        raise NotImplementedError("lab1.emit_finish")
        # <<< EXERCISE lab1.emit_finish
        self.finished[seq.seq_id] = seq


def load_tokenizer(folder: str):
    """The folder's Hugging Face tokenizer; refuse a folder that has none.

    Without this check `AutoTokenizer` can build a tokenizer with an almost
    empty vocabulary from a folder that holds only weights, and every prompt
    would silently become unknown tokens.
    """
    present = [name for name in TOKENIZER_FILES if (Path(folder) / name).is_file()]
    if not present:
        raise ValueError(f"{folder!r} has no tokenizer files (expected one of {', '.join(TOKENIZER_FILES)})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
    except Exception as err:
        raise ValueError(f"cannot load the tokenizer from {folder!r} ({', '.join(present)}): "
                         f"{type(err).__name__}: {err}") from err
    if len(tokenizer) < 2:
        raise ValueError(f"the tokenizer in {folder!r} ({', '.join(present)}) has {len(tokenizer)} token(s): "
                         "it is not a usable vocabulary")
    return tokenizer


def stop_token_ids_of(folder: str, hf_config: dict, tokenizer) -> frozenset[int]:
    """The ids that end a request (unless `ignore_eos`), chosen as transformers' `generate` chooses them.

    `generation_config.json`, when the folder has one, decides (real Qwen3
    checkpoints list two ids there); otherwise config.json's `eos_token_id`;
    otherwise the tokenizer's. Each may be one id or a list, and every id in
    the list stops. The stop token itself is kept in the output, as
    transformers keeps it.
    """
    eos = None
    if (Path(folder) / "generation_config.json").is_file():
        try:
            eos = GenerationConfig.from_pretrained(folder).eos_token_id
        except Exception as err:
            raise ValueError(f"{Path(folder) / 'generation_config.json'}: {type(err).__name__}: {err}") from err
    if eos is None:
        eos = hf_config.get("eos_token_id", tokenizer.eos_token_id)
    if eos is None:
        return frozenset()
    return frozenset(eos if isinstance(eos, (list, tuple)) else [eos])
