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
from dataclasses import dataclass, field

import torch
from transformers import AutoTokenizer

from student_exercises.config import Config
from student_exercises.distributed.tp_runner import TensorParallelRunner
from student_exercises.engine.block_manager import BlockManager
from student_exercises.engine.lifecycle import LifecycleLog
from student_exercises.engine.model_runner import InFlightStep, ModelRunner
from student_exercises.engine.scheduler import Scheduler
from student_exercises.engine.sequence import PENDING_TOKEN, Sequence
from student_exercises.sampling_params import SamplingParams


@dataclass(slots=True)
class StepOutput:
    """What one step produced for one sequence: its new token and whether it finished."""
    seq_id: int
    new_token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None


class LLMEngine:
    def __init__(self, model: str, **config_fields):
        self.config = Config(model=model, **config_fields)
        self.tokenizer = AutoTokenizer.from_pretrained(self.config.model)
        self.eos_token_id = self._eos_token_id()
        runner = ModelRunner if self.config.tensor_parallel_size == 1 else TensorParallelRunner
        self.model_runner = runner(self.config)
        self.log = LifecycleLog(self.config.lifecycle_log)
        self.block_manager = BlockManager(self.model_runner.num_kvcache_blocks, self.config.kvcache_block_size,
                                          self.config.enable_prefix_caching)
        self.scheduler = Scheduler(self.config, self.block_manager, self.log)
        self.sequences: dict[int, Sequence] = {}   # every sequence not yet finished
        self.finished: dict[int, Sequence] = {}    # finished, until the caller collects them
        self.step_index = 0
        self._in_flight: InFlightStep | None = None   # async scheduling: a decode step not yet read back
        self._seq_ids = itertools.count()
        self._rng = torch.Generator().manual_seed(self.config.seed)

    def _eos_token_id(self) -> int | None:
        eos = self.config.hf_config.get("eos_token_id", self.tokenizer.eos_token_id)
        return eos[0] if isinstance(eos, list) else eos

    # -- stage 1-3: admission ------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        """Token ids of a prompt: a string is tokenized as is, a list is checked."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        if isinstance(prompt, (list, tuple)):
            vocab = self.config.hf_config["vocab_size"]
            for t in prompt:
                if isinstance(t, bool) or not isinstance(t, int):
                    raise TypeError(f"prompt token ids must be ints, got {type(t).__name__}")
                if not 0 <= t < vocab:
                    raise ValueError(f"prompt token id {t} is outside the vocabulary [0, {vocab})")
            return list(prompt)
        raise TypeError(f"prompt must be a str or a list of token ids, got {type(prompt).__name__}")

    def check_request(self, token_ids: list[int], params: SamplingParams) -> None:
        """Refuse, with a reason, any request that could never be served."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {type(params).__name__}")
        if not token_ids:
            raise ValueError("prompt is empty: a request needs at least one token")
        max_len = self.config.max_model_len
        if len(token_ids) >= max_len:
            raise ValueError(f"prompt has {len(token_ids)} tokens but max_model_len is {max_len}: "
                             f"no room to generate")
        # The last sampled token is never fed back, so its K/V never need a slot.
        stored_len = min(len(token_ids) + params.max_tokens, max_len) - 1
        block_size = self.config.kvcache_block_size
        blocks_needed = (stored_len + block_size - 1) // block_size
        pool = len(self.block_manager.blocks)
        if blocks_needed > pool:
            raise ValueError(
                f"request needs {blocks_needed} KV blocks ({stored_len} tokens) but the whole KV pool has "
                f"{pool} blocks: it could never run; lower max_tokens")

    def add_request(self, prompt: str | list[int], sampling_params: SamplingParams) -> int:
        """Check, tokenize and queue one request; returns its seq_id. Raises on bad input, queuing nothing."""
        token_ids = self.tokenize(prompt)
        self.check_request(token_ids, sampling_params)
        now = self.log.now()
        seq = Sequence(token_ids, sampling_params, self.config.kvcache_block_size, arrival_time=now,
                       seq_id=next(self._seq_ids))
        if not sampling_params.greedy:
            seed = sampling_params.seed
            if seed is None:
                seed = int(torch.randint(0, 2**62, (1,), generator=self._rng))
            seq.generator = torch.Generator().manual_seed(seed)
        self.sequences[seq.seq_id] = seq
        # >>> EXERCISE lab1.emit_arrival: Log ARRIVED, then queue the request with the scheduler (which logs QUEUED).
        # HINT: ARRIVED carries prompt_len and uses `now`, the arrival time the Sequence recorded.
        # HINT: the scheduler stamps its events with scheduler.step: set it to this engine step first.
        raise NotImplementedError("lab1.emit_arrival")
        # <<< EXERCISE lab1.emit_arrival
        return seq.seq_id

    def abort_request(self, seq_id: int) -> None:
        """Stop a request wherever it is and give its blocks back."""
        seq = self.sequences.get(seq_id)
        if seq is None:
            raise ValueError(f"no unfinished request with seq_id {seq_id}")
        self._finish(seq, "abort", self.log.now())

    # -- stage 3-5: one step ---------------------------------------------------
    def is_finished(self) -> bool:
        return self.scheduler.is_finished() and self._in_flight is None

    def step(self) -> list[StepOutput]:
        """Schedule one batch, run it, and postprocess; returns what each sequence got."""
        earlier: list[StepOutput] = []
        if self.config.async_scheduling:
            earlier, done = self._step_overlapped()
            if done:
                return earlier
        self.scheduler.step = self.step_index
        seqs, is_prefill = self.scheduler.schedule()
        if not seqs:
            raise RuntimeError(f"scheduler made no progress with {len(self.scheduler.waiting)} waiting and "
                               f"{len(self.scheduler.running)} running: a request cannot fit")
        self._log_step(seqs, is_prefill)
        token_ids = self.model_runner.run(seqs, is_prefill)
        outputs = self.postprocess(seqs, token_ids)
        self.step_index += 1
        self.log.flush()
        return earlier + outputs

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

        It overlaps only plain decode: with requests waiting (a prefill may
        come), a possible preemption, or a sampled (non-greedy) request, the
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
            if not self.scheduler.running:   # all of them end with the tokens in flight
                self._in_flight = None
                return self._resolve(previous), True
        self.scheduler.step = self.step_index
        seqs, is_prefill = self.scheduler.schedule()
        if is_prefill or not seqs:
            raise RuntimeError("async scheduling expected a decode step (an engine bug, not a user error)")
        self._log_step(seqs, is_prefill)
        self._in_flight = self.model_runner.launch_decode(seqs, previous)
        if previous is not None:
            outputs += self._resolve(previous)
        self.step_index += 1
        self.log.flush()
        return outputs, True

    def _can_overlap(self) -> bool:
        """May the next step be scheduled before the tokens in flight are known?

        Only if it is sure to be a decode step of greedy sequences that needs
        no preemption: nobody waiting, nobody mid-prefill, and a free block for
        every running sequence.
        """
        running = self.scheduler.running
        return (bool(running) and not self.scheduler.waiting
                and self.block_manager.num_free_blocks >= len(running)
                and all(seq.sampling_params.greedy and not seq.in_prefill for seq in running))

    def _read_back(self, in_flight: InFlightStep) -> list[StepOutput]:
        """Wait for a step in flight and postprocess it as a synchronous step would."""
        live = [(seq, token) for seq, token in zip(in_flight.seqs, in_flight.tokens()) if not seq.is_finished]
        return self.postprocess([seq for seq, _ in live], [token for _, token in live])

    def _advance(self, in_flight: InFlightStep) -> None:
        """Book a step in flight as done before its tokens are known.

        Its K/V count as computed (the GPU writes them before any later step
        reads them: one stream), and each sampled token is a PENDING_TOKEN
        placeholder until `_resolve`. A sequence that this token takes to its
        length limit leaves the running queue now, so it is not scheduled again.
        """
        for seq in in_flight.seqs:
            if seq.is_finished:
                continue  # it sampled a stop token (or was aborted) a step ago: this token is thrown away
            self.block_manager.mark_computed(seq, seq.num_scheduled_tokens)
            seq.append_token(PENDING_TOKEN)
            if self._reaches_length_limit(seq):
                self.scheduler.running.remove(seq)

    def _resolve(self, in_flight: InFlightStep) -> list[StepOutput]:
        """Put the real tokens of a step in flight in place of its placeholders, log them, stop."""
        now = self.log.now()
        outputs = []
        for seq, token in zip(in_flight.seqs, in_flight.tokens()):
            if seq.is_finished:
                continue
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
            self.block_manager.mark_computed(seq, seq.num_scheduled_tokens)
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
        reason = self._stop_reason(seq, token)
        if reason is not None:
            self._finish(seq, reason, now)
            out.finished, out.finish_reason = True, reason

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.sampling_params
        if (token == self.eos_token_id and not params.ignore_eos) or token in params.stop_token_ids:
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
        del self.sequences[seq.seq_id]
        # >>> EXERCISE lab1.emit_finish: Log that the request finished, then that its blocks went back to the pool.
        # HINT: FINISHED carries reason and num_output_tokens; FREED carries blocks_freed; both at time `now`.
        raise NotImplementedError("lab1.emit_finish")
        # <<< EXERCISE lab1.emit_finish
        self.finished[seq.seq_id] = seq
