# Generated from reference/engine/model_runner.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""The model runner: turns a scheduled batch into tensors, runs the model, samples.

`prepare_prefill` / `prepare_decode` build the flat inputs the lecture names
(input_ids, positions, cu_seqlens_q/k, slot_mapping, block_tables,
context_lens); `run` does one forward pass and returns one sampled token per
sequence that completes its prompt (or decodes) in this step.

On CUDA, decode steps replay CUDA graphs captured once per batch-size bucket:
a decode step is hundreds of small kernels, and launching them one by one from
Python costs more than running them. Prefill steps replay graphs too, captured
per token bucket and cut at each attention call, which runs eagerly between
them (reference/engine/prefill_graphs.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from student_exercises.config import Config
from student_exercises.parallel_state import agree_on_min, layout_for, tp_rank
from student_exercises.engine.prefill_graphs import PrefillGraphs, no_gc_while_capturing
from student_exercises.engine.sequence import Sequence
from student_exercises.layers.attention import AttentionMetadata, make_backend
from student_exercises.layers.sampler import argmax_only, check_sampled, sample, sample_on_device, token_logprobs
from student_exercises.models.loader import load_weights
from student_exercises.models.qwen3 import ElementwiseOps, Qwen3Attention, Qwen3ForCausalLM
from student_exercises.sampling_params import SamplingParams


class EngineDeadError(RuntimeError):
    """The model runner cannot run any step again (a tensor-parallel worker died).

    Unlike a failure of one batch, which fails only that batch's requests
    (`LLMEngine.step`), this is raised to the caller: no request can be served.
    """


@dataclass
class InFlightStep:
    """A step launched without waiting for it (async scheduling).

    Its sampled ids stay on the device, where the next step reads them as
    inputs (`row_of` says which row belongs to which sequence); a copy to
    pinned host memory is queued behind them, and `tokens()` waits for that
    copy only: not for any step launched later. `seqs` sample one token each
    (a row each); `batch` is every sequence whose K/V the step computes: the
    same list for a decode step, and for a prefill step also the chunks that
    stop short of their prompt's end and sample nothing.
    """
    seqs: list[Sequence]
    device_tokens: torch.Tensor
    host_tokens: torch.Tensor
    copied: torch.cuda.Event | None
    row_of: dict[int, int]
    batch: list[Sequence]

    @classmethod
    def start(cls, seqs: list[Sequence], device_tokens: torch.Tensor,
              batch: list[Sequence] | None = None) -> "InFlightStep":
        row_of = {seq.seq_id: row for row, seq in enumerate(seqs)}
        batch = seqs if batch is None else batch
        if device_tokens.device.type != "cuda":
            return cls(seqs, device_tokens, device_tokens, None, row_of, batch)
        host = torch.empty(device_tokens.shape, dtype=device_tokens.dtype, pin_memory=True)
        host.copy_(device_tokens, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()
        return cls(seqs, device_tokens, host, copied, row_of, batch)

    def token_of(self, tokens: list[int], seq: Sequence) -> int | None:
        """seq's token among `tokens()`, or None if seq sampled nothing in this step."""
        row = self.row_of.get(seq.seq_id)
        return None if row is None else tokens[row]

    def tokens(self) -> list[int]:
        """The sampled ids; raises if a sampled row had no valid distribution (NaN logits)."""
        if self.copied is not None:
            self.copied.synchronize()
        return check_sampled(self.host_tokens.tolist())


def sampling_rows(seqs: list[Sequence]) -> list[int]:
    """Which of a step's sequences sample a token: those whose scheduled tokens reach their end.

    A prefill chunk that stops short of the prompt's end samples nothing: its
    last position is not the sequence's last token.
    """
    return [i for i, seq in enumerate(seqs) if seq.num_cached_tokens + seq.num_scheduled_tokens == len(seq)]


# On the CPU the KV pool gets as many bytes as the weights, and at least this much.
CPU_MIN_KV_BYTES = 128 * 2**20
# Below this many bytes of weights the CPU runs single-threaded by default (see set_cpu_threads).
TINY_MODEL_BYTES = 64 * 2**20


def set_cpu_threads(model: torch.nn.Module, requested: int | None) -> None:
    """One intra-op thread for tiny models: on small matrices thread hand-offs cost more
    than the math, and on a busy laptop spinning worker threads made the tiny model 14x
    slower (3.8 s vs 0.27 s measured). Process-wide: torch has no per-model setting.
    A module function so that every runner (and a release's stand-in) follows one rule."""
    threads = requested
    if threads is None:
        weights = sum(p.numel() * p.element_size() for p in model.parameters())
        threads = 1 if weights < TINY_MODEL_BYTES else None
    if threads is not None:
        torch.set_num_threads(threads)


class ModelRunner:
    # launch_decode samples sampled requests on the device too (the engine may overlap them).
    samples_in_flight = True
    # launch_prefill exists: the engine may launch a prefill step while the previous step is in flight.
    prefills_in_flight = True

    def __init__(self, config: Config):
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = config.torch_dtype
        self.block_size = config.kvcache_block_size
        self.tp_size = config.tensor_parallel_size
        with torch.device(self.device), layout_for(self.tp_size):
            self.rank = tp_rank()
            self.model = Qwen3ForCausalLM(config.hf_config).to(self.dtype)
        load_weights(self.model, config.model)
        self.model.eval()
        if self.device.type == "cpu":
            set_cpu_threads(self.model, config.cpu_threads)
        if self.device.type == "cuda" and not config.enforce_eager:
            self.model.use_ops(ElementwiseOps.fused())
        self.backend = make_backend(config.attention_backend, config.device, self.block_size)
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Qwen3Attention)]
        for attn in self.attention_layers:
            attn.backend = self.backend
        graphs = self.device.type == "cuda" and not config.enforce_eager and self.backend.name != "torch"
        self._prepare_collectives()   # before any capture: a graph replays the all-reduce it captured
        # Before the KV cache is sized: the graphs' memory pool is then already counted as in use.
        self.prefill_graphs: PrefillGraphs | None = None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        if graphs:
            self.prefill_graphs = PrefillGraphs(self.model.model, config.max_num_batched_tokens)
            self.prefill_graphs.capture()
        # Under TP every rank sizes its pool; all take the smallest, so one block table fits all.
        self.num_kvcache_blocks = agree_on_min(config.num_kvcache_blocks or self._blocks_that_fit(), self.device,
                                               self.tp_size)
        self.kv_cache = self._allocate_kv_cache(self.num_kvcache_blocks)
        if graphs:
            self._capture_decode_graphs()
        if self.device.type == "cuda":
            self._warm_up_logits()

    def _prepare_collectives(self) -> None:
        """Set up what this rank's all-reduces need before graphs capture them (tensor parallelism only).

        A no-op here; the tensor-parallel runners (reference/distributed/tp_runner.py)
        set up the one-shot all-reduce, a collective every rank reaches after
        loading its shard.
        """

    def graph_sets(self) -> list[dict]:
        """The dicts holding this runner's CUDA graphs, decode and prefill, as far as it got building them.

        Under tensor parallelism a graph may have captured an NCCL collective,
        and NCCL will not leave the group while such a graph exists: whoever
        tears the group down empties these first (tp_runner.py).
        """
        prefill = getattr(self, "prefill_graphs", None)
        sets = [getattr(self, "graphs", None), prefill.graphs if prefill is not None else None]
        return [graphs for graphs in sets if graphs is not None]

    # -- KV cache ------------------------------------------------------------
    def _bytes_per_block(self) -> int:
        layer = self.attention_layers[0]
        per_token = 2 * len(self.attention_layers) * layer.num_kv_heads * layer.head_dim
        return per_token * self.block_size * torch.finfo(self.dtype).bits // 8

    def _blocks_that_fit(self) -> int:
        """Default pool size: every sequence at full length, if memory allows."""
        wanted = self.config.max_num_seqs * self.config.max_model_len // self.block_size
        if self.device.type == "cpu":
            weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
            return max(1, min(wanted, max(CPU_MIN_KV_BYTES, weights) // self._bytes_per_block()))
        return min(wanted, self._blocks_in_free_gpu_memory())

    def _blocks_in_free_gpu_memory(self) -> int:
        """Run the largest prefill step once, then give the KV cache what the budget leaves.

        budget = total * gpu_memory_utilization - memory in use now - the
        activation peak the warm-up measured (it returns to the allocator).
        """
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self._warmup_prefill()
        free, total = torch.cuda.mem_get_info(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        current = torch.cuda.memory_allocated(self.device)
        budget = total * self.config.gpu_memory_utilization - (total - free) - (peak - current)
        blocks = int(budget // self._bytes_per_block())
        if blocks < 1:
            raise RuntimeError(f"no GPU memory left for a KV cache ({free / 2**30:.1f} GiB free of "
                               f"{total / 2**30:.1f}); raise gpu_memory_utilization or shorten max_model_len")
        return blocks

    @torch.inference_mode()
    def _warmup_prefill(self) -> None:
        """A dummy prefill of max_num_batched_tokens tokens through a temporary cache."""
        max_len = self.config.max_model_len
        num_tokens = min(self.config.max_num_batched_tokens, self.config.max_num_seqs * max_len)
        lengths = [max_len] * (num_tokens // max_len) + ([num_tokens % max_len] if num_tokens % max_len else [])
        blocks_per_seq = (max_len + self.block_size - 1) // self.block_size
        cache = self._allocate_kv_cache(blocks_per_seq * len(lengths))
        seqs = []
        for i, n in enumerate(lengths):
            seq = Sequence([0] * n, None, self.block_size, seq_id=-1)
            seq.block_table = list(range(i * blocks_per_seq, i * blocks_per_seq + (n + self.block_size - 1) // self.block_size))
            seq.num_scheduled_tokens = n
            seqs.append(seq)
        input_ids, positions, meta = self.prepare_prefill(seqs)
        hidden = self._prefill_forward(input_ids, positions, meta)   # the path real steps take
        self.model.compute_logits(hidden[meta.cu_seqlens_q[1:] - 1])
        del cache, hidden
        torch.cuda.synchronize(self.device)

    @torch.inference_mode()
    def _warm_up_logits(self) -> None:
        """Run the LM head and the sampler once at every row count a step can sample (1..max_num_seqs).

        A kernel's first launch in a process loads its module (CUDA loads
        modules lazily), and that waits until the GPU has drained. cuBLAS
        picks different kernels for different row counts, so the first steps
        that sampled a new number of rows stopped the pipeline for a whole
        step (docs/performance.md). The argmax is the engine's own
        (`sample_on_device`, and under TP the slice-wise `greedy_tokens`):
        its Triton kernels compile at their first call, and when that was a
        served request's first step, the first requests after start-up waited
        about a second for their first token (docs/performance.md, the sixth
        stop). One sampled row loads the sampling kernels too; it draws from a
        generator of its own, so the global random state is left as it was.
        Under TP every rank runs this in its own constructor, so each rank
        joins each all-gather of the LM head and of the slice-wise argmax.
        """
        hidden = torch.zeros(self.config.max_num_seqs, self.config.hf_config["hidden_size"], dtype=self.dtype,
                             device=self.device)
        greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, top_k=50, top_p=0.9)
        for rows in range(1, self.config.max_num_seqs + 1):
            logits = self.model.compute_logits(hidden[:rows])
            sample_on_device(logits, [greedy] * rows, [None] * rows)
            if self.tp_size > 1:
                self.model.greedy_tokens(hidden[:rows])
        sample_on_device(logits[:1], [sampled], [torch.Generator(device=self.device).manual_seed(0)])
        torch.cuda.synchronize(self.device)

    def _allocate_kv_cache(self, num_blocks: int) -> torch.Tensor:
        """One tensor [2, layers, blocks, block_size, kv_heads, head_dim]; each layer gets views of it."""
        layer = self.attention_layers[0]
        shape = (2, len(self.attention_layers), num_blocks, self.block_size, layer.num_kv_heads, layer.head_dim)
        # Zeros, not empty: padded decode reads unwritten slots (masked, but NaN * 0 is NaN).
        kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        for i, attn in enumerate(self.attention_layers):
            attn.k_cache, attn.v_cache = kv_cache[0, i], kv_cache[1, i]
        return kv_cache

    # -- inputs --------------------------------------------------------------
    def _slot(self, seq: Sequence, position: int) -> int:
        # >>> EXERCISE lab4.slot: Return the KV-cache slot of token `position` of seq (its physical block and offset).
        # HINT: position // block_size is the logical block; seq.block_table maps it to a physical block.
        raise NotImplementedError("lab4.slot")
        # <<< EXERCISE lab4.slot

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        """[num_seqs, longest table] block ids, rows padded with 0 (never read: context_lens stop there)."""
        # >>> EXERCISE lab4.block_tables: Stack the sequences' block tables into one tensor, padding short rows with 0.
        raise NotImplementedError("lab4.block_tables")
        # <<< EXERCISE lab4.block_tables

    def _tensor(self, data) -> torch.Tensor:
        # Through numpy: torch.tensor reads a long list of ints several times slower.
        tensor = torch.from_numpy(data if isinstance(data, np.ndarray) else np.asarray(data, dtype=np.int64))
        if self.device.type == "cuda":
            tensor = tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor

    def prepare_prefill(self, seqs: list[Sequence]):
        """Each sequence contributes tokens [num_cached, num_cached + num_scheduled)."""
        # >>> EXERCISE lab4.prepare_prefill: Build the flat prefill inputs of this step's chunk of every sequence.
        # HINT: a sequence's new tokens are positions num_cached_tokens .. num_cached_tokens + num_scheduled_tokens.
        # HINT: context_lens (seqlen_k) is where the chunk ends: cached prefix + new tokens.
        # HINT: cu_seqlens_q / cu_seqlens_k are running sums (from 0) of new tokens / of context lengths.
        raise NotImplementedError("lab4.prepare_prefill")
        # <<< EXERCISE lab4.prepare_prefill
        meta = AttentionMetadata(
            is_prefill=True, slot_mapping=self._tensor(slot_mapping), block_tables=self._block_tables(seqs),
            context_lens=self._tensor(context_lens), cu_seqlens_q=self._tensor(cu_seqlens_q),
            cu_seqlens_k=self._tensor(cu_seqlens_k),
            max_seqlen_q=max(b - a for a, b in zip(cu_seqlens_q, cu_seqlens_q[1:])), max_seqlen_k=max(context_lens),
            has_cached_prefix=any(seq.num_cached_tokens > 0 for seq in seqs), num_context_tokens=cu_seqlens_k[-1])
        return self._tensor(input_ids), self._tensor(positions), meta

    def prepare_decode(self, seqs: list[Sequence]):
        """One token per sequence: the newest one, at position len - 1."""
        # >>> EXERCISE lab4.prepare_decode: Build the decode inputs: each sequence's newest token, its slot and context.
        # HINT: the newest token is not in the cache yet: this step writes its K/V, then attends over all len(seq).
        raise NotImplementedError("lab4.prepare_decode")
        # <<< EXERCISE lab4.prepare_decode
        # One host-to-device copy for the four per-sequence rows: each copy has a fixed cost.
        ids_t, positions_t, slots_t, lens_t = self._tensor([input_ids, positions, slot_mapping, context_lens])
        meta = AttentionMetadata(is_prefill=False, slot_mapping=slots_t, block_tables=self._block_tables(seqs),
                                 context_lens=lens_t, max_seqlen_q=1, max_seqlen_k=max(context_lens))
        return ids_t, positions_t, meta

    # -- CUDA graphs -----------------------------------------------------------
    def _graph_batch_sizes(self) -> list[int]:
        largest = self.config.max_num_seqs
        return sorted({b for b in [1, 2, 4, 8, *range(16, largest + 1, 16)] if b <= largest} | {largest})

    @torch.inference_mode()
    def _capture_decode_graphs(self) -> None:
        """Capture one decode graph per batch-size bucket, largest first, sharing one memory pool.

        Graphs replay fixed addresses, so every input lives in a static buffer
        that `_replay_decode_graph` fills before each replay.
        """
        largest = self.config.max_num_seqs
        max_blocks = (self.config.max_model_len + self.block_size - 1) // self.block_size
        hidden_size = self.config.hf_config["hidden_size"]
        self.static = {
            "input_ids": torch.zeros(largest, dtype=torch.int64, device=self.device),
            "positions": torch.zeros(largest, dtype=torch.int64, device=self.device),
            "slot_mapping": torch.full((largest,), -1, dtype=torch.int64, device=self.device),
            "context_lens": torch.zeros(largest, dtype=torch.int64, device=self.device),
            "block_tables": torch.zeros(largest, max_blocks, dtype=torch.int64, device=self.device),
            "hidden": torch.zeros(largest, hidden_size, dtype=self.dtype, device=self.device),
        }
        with no_gc_while_capturing():
            self._capture_each_bucket()
        torch.cuda.synchronize(self.device)

    def _capture_each_bucket(self) -> None:
        s, pool = self.static, None
        for batch in reversed(self._graph_batch_sizes()):
            meta = AttentionMetadata(is_prefill=False, slot_mapping=s["slot_mapping"][:batch],
                                     block_tables=s["block_tables"][:batch], context_lens=s["context_lens"][:batch],
                                     max_seqlen_q=1, max_seqlen_k=self.config.max_model_len)
            # plan() inside the capture: its per-step work (e.g. sorting rows) replays with the graph.
            s["hidden"][:batch] = self.model(s["input_ids"][:batch], s["positions"][:batch],
                                             self.backend.plan(meta))  # warm-up
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool):
                s["hidden"][:batch] = self.model(s["input_ids"][:batch], s["positions"][:batch],
                                                 self.backend.plan(meta))
            pool = graph.pool() if pool is None else pool
            self.graphs[batch] = graph

    def _replay_decode_graph(self, input_ids: torch.Tensor, positions: torch.Tensor,
                             meta: AttentionMetadata) -> torch.Tensor:
        """Copy this step's inputs into the smallest captured bucket that fits, replay, return hidden states.

        Padding rows get slot -1 (no KV write) and context length 0 (no reads).
        """
        # >>> EXERCISE lab4.graph_replay: Fill the static buffers of the smallest captured batch that fits, then replay.
        # HINT: a graph reads only self.static; rows past this batch are padding: slot -1 and context length 0,
        # HINT: or they would write and read K/V of whatever an earlier, larger batch left there.
        raise NotImplementedError("lab4.graph_replay")
        # <<< EXERCISE lab4.graph_replay

    # -- one step --------------------------------------------------------------
    @torch.inference_mode()
    def launch_decode(self, seqs: list[Sequence], previous: InFlightStep | None) -> InFlightStep:
        """Queue a decode step on the device and return without waiting for it.

        Sequences that were in `previous` carry a PENDING_TOKEN placeholder as
        their newest token; their input id is taken from `previous`'s sampled
        ids on the device, so the host never needs to know it. Greedy rows
        take the argmax, sampled rows draw on the device (`sample_on_device`).
        """
        input_ids, positions, meta = self.prepare_decode(seqs)
        if previous is not None and previous.row_of:
            rows = [previous.row_of.get(seq.seq_id, -1) for seq in seqs]
            source = self._tensor(np.asarray(rows, dtype=np.int64))
            # A row that could not be sampled holds -1: it fails when `previous` is read back, but this
            # step runs first, and an embedding lookup at -1 is a device-side assert on CUDA (the
            # context is lost): it gets token 0 instead, whose output is thrown away with the request.
            from_previous = previous.device_tokens[source.clamp(min=0)].clamp(min=0)
            input_ids = torch.where(source >= 0, from_previous, input_ids)
        hidden = self._decode_forward(input_ids, positions, meta)
        return InFlightStep.start(seqs, self._tokens_in_flight(hidden, seqs))

    @torch.inference_mode()
    def launch_prefill(self, seqs: list[Sequence]) -> InFlightStep:
        """Queue a prefill step on the device and return without waiting for it.

        Sequences whose chunk reaches the end of their prompt sample on the
        device, as `launch_decode`'s do; the rest sample nothing.
        """
        input_ids, positions, meta = self.prepare_prefill(seqs)
        hidden = self._prefill_forward(input_ids, positions, meta)
        rows = sampling_rows(seqs)
        sampling = [seqs[i] for i in rows]
        if not rows:
            return InFlightStep.start([], torch.empty(0, dtype=torch.int64, device=self.device), batch=seqs)
        last = (meta.cu_seqlens_q[1:] - 1)[self._tensor(rows)]
        return InFlightStep.start(sampling, self._tokens_in_flight(hidden[last], sampling), batch=seqs)

    def _tokens_in_flight(self, hidden: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """The next token of each row of `hidden` (one per sequence of `seqs`), left on the device.

        Under tensor parallelism, when every row takes the argmax
        (`argmax_only`), each rank takes it slice by slice (`greedy_tokens`):
        every rank computes the same tokens, and no rank gathers whole rows of
        logits or is sent the result. Otherwise the logits are gathered and
        rank 0 samples (`_sample_in_flight`). Every rank must choose alike, or
        they wait in different collectives: the choice is made on the rows
        that sample (`seqs`), and a worker's sequences carry what rank 0 chose
        (tp_runner.py).
        """
        if self._argmax_by_slice([seq.sampling_params for seq in seqs]):
            return self.model.greedy_tokens(hidden)
        return self._sample_in_flight(self.model.compute_logits(hidden), seqs)

    def _argmax_by_slice(self, params: list) -> bool:
        """Whether the rows with these sampling params get their tokens slice by slice (tensor parallelism only)."""
        return self.tp_size > 1 and argmax_only(params)

    def _sample_in_flight(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """One token per row of `logits`, left on the device (`sample_on_device`).

        Under tensor parallelism rank 0 samples and sends the tokens to the
        workers, which take them as the next step's inputs (tp_runner.py).
        """
        return sample_on_device(logits, [seq.sampling_params for seq in seqs], [seq.generator for seq in seqs])

    def _prefill_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                         meta: AttentionMetadata) -> torch.Tensor:
        """A prefill step through its bucket's graphs when one fits, else eagerly; plan() once for all layers."""
        meta = self.backend.plan(meta)
        if self.prefill_graphs is not None and self.prefill_graphs.fits(input_ids.shape[0]):
            return self.prefill_graphs.forward(input_ids, positions, meta)
        return self.model(input_ids, positions, meta)

    def _decode_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                        meta: AttentionMetadata) -> torch.Tensor:
        """A decode batch through its captured graph when one fits, else eagerly."""
        if self.graphs and input_ids.shape[0] <= max(self.graphs):
            return self._replay_decode_graph(input_ids, positions, meta)
        return self.model(input_ids, positions, self.backend.plan(meta))

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int | None]:
        """Forward the batch; sample for sequences whose scheduled tokens reach their end.

        A prefill chunk that stops short of the end samples nothing (None): its
        last position is not the sequence's last token.
        """
        if is_prefill:
            input_ids, positions, meta = self.prepare_prefill(seqs)
            hidden = self._prefill_forward(input_ids, positions, meta)
            last = meta.cu_seqlens_q[1:] - 1
        else:
            input_ids, positions, meta = self.prepare_decode(seqs)
            hidden = self._decode_forward(input_ids, positions, meta)
            last = None  # one row per sequence already
        rows = sampling_rows(seqs)
        tokens: list[int | None] = [None] * len(seqs)
        if not rows:
            return tokens
        if last is not None:
            hidden = hidden[last]
        if len(rows) < len(seqs):
            hidden = hidden[torch.tensor(rows, device=hidden.device)]
        params = [seqs[i].sampling_params for i in rows]
        if self._argmax_by_slice(params):     # as in `_tokens_in_flight`: no whole rows needed
            greedy = self.model.greedy_tokens(hidden)
            if self.rank != 0:
                return tokens
            for i, token in zip(rows, check_sampled(greedy.tolist())):
                tokens[i] = token
            return tokens
        logits = self.model.compute_logits(hidden)   # under TP: every rank joins the all-gather
        if self.rank != 0:
            return tokens                            # only rank 0 samples
        sampled = sample(logits, params, [seqs[i].generator for i in rows])
        for i, token in zip(rows, sampled):
            tokens[i] = token
        self._record_logprobs(logits, [seqs[i] for i in rows], sampled)
        return tokens

    @staticmethod
    def _record_logprobs(logits: torch.Tensor, seqs: list[Sequence], sampled: list[int]) -> None:
        """Append each sampled token's log-probabilities to the sequences that asked for them.

        Here because only the runner holds the logits; the engine passes them
        on with the token (`StepOutput.logprobs`). Only the synchronous step
        computes them: the engine does not overlap steps while a request
        that wants them is unfinished (`LLMEngine._can_overlap`).
        """
        rows = [j for j, seq in enumerate(seqs) if seq.sampling_params.logprobs is not None]
        if not rows:
            return
        entries = token_logprobs(logits[rows], [sampled[j] for j in rows],
                                 [seqs[j].sampling_params.logprobs for j in rows])
        for j, entry in zip(rows, entries):
            seqs[j].logprobs.append(entry)

