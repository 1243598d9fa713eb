"""Stand-in for lab 4's model runner in a student release: transformers' own forward over dense per-sequence caches.

Used in lab 1, 2 and 3 releases (whose lab 4 regions are stubbed), so that the
engine there serves requests. It answers the engine's questions as the course
runner does (`num_kvcache_blocks`, `run`, `launch_decode`) but never builds
the paged inputs (slot mapping, block tables, cu_seqlens) or attends over a
paged cache, which is what lab 4 is: the tokens come from the model as
transformers implements it (`AutoModelForCausalLM`), the same independent
route the public tests already check the course engine against.

Each sequence keeps its own dense K/V (one tensor pair per layer), keyed by
the sequence, holding the K/V of the tokens it has already fed in. A step
feeds only what that cache lacks and samples with the course's own sampler,
so greedy tokens are the course engine's, and a sampled request draws from
its own generator as it does there.

Sequences that feed equally many new tokens (every sequence of a decode
step) run as one batch: their caches are padded on the left to the longest,
stacked into one `DynamicCache` for the forward with the padding masked out,
and split again after it. We chose this over one forward per sequence so
that a step costs about one forward whatever the batch and however far each
sequence has got, as in the course engine: Tutorial 02 measures decode step
time against batch size, and Tutorial 03 compares continuous batching (fewer
steps) with static batching on time. Its price: each step copies the caches
to stack them, and the padded rows' attention runs over masked slots, so a
row's arithmetic is not exactly that of its own unbatched forward (greedy
tokens are still the course engine's, checked in tests/courseware/test_standins.py).

Its other price: block tables are bookkeeping only (the K/V do not live in the
blocks the block manager handed out), so a block manager that gives two live
sequences the same block still produces the right tokens here, while the
course engine would mix their K/V; the lab 2 public tests check block tables
directly for that reason. Prefix-cache hits save no compute, a prefill chunk
that does not finish its prompt is computed later with the rest, the KV pool
is sized as if every sequence could reach max_model_len (no memory
measurement), and there are no CUDA graphs, no tensor parallelism and no KV
transfer (tensor_parallel_size above 1 is refused): on a GPU it is far slower
than the course engine.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, DynamicCache

from reference.config import Config
from reference.engine.model_runner import InFlightStep, set_cpu_threads
from reference.engine.sequence import PENDING_TOKEN, Sequence
from reference.layers.sampler import sample

LAB4_NEEDED = "this release runs a stand-in model runner (transformers' forward; lab 4 writes the real one)"


# One sequence's K/V: (keys, values) per layer, each [1, kv_heads, tokens, head_dim].
LayerKV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class DenseState:
    """One sequence's dense KV cache and the tokens whose K/V it holds."""
    seq: Sequence
    token_ids: list[int] = field(default_factory=list)
    kv: LayerKV = field(default_factory=list)


class DenseModelRunner:
    def __init__(self, config: Config):
        if config.tensor_parallel_size > 1:
            # Tensor parallelism splits lab 4's runner across processes, which a release before lab 4 lacks.
            raise ValueError(f"tensor_parallel_size={config.tensor_parallel_size} needs lab 4's model runner; "
                             f"{LAB4_NEEDED}")
        self.config = config
        self.device = torch.device(config.device)
        self.block_size = config.kvcache_block_size
        self.model = AutoModelForCausalLM.from_pretrained(config.model, dtype=config.torch_dtype).to(self.device)
        self.model.eval()
        if self.device.type == "cpu":
            set_cpu_threads(self.model, config.cpu_threads)
        per_seq = -(-config.max_model_len // self.block_size)
        self.num_kvcache_blocks = config.num_kvcache_blocks or config.max_num_seqs * per_seq
        self.states: dict[int, DenseState] = {}
        # transformers 5.x renames `past_key_values` to `cache` (the old name goes in a later release).
        forward_arguments = inspect.signature(self.model.forward).parameters
        self.cache_argument = "cache" if "cache" in forward_arguments else "past_key_values"

    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int | None]:
        """One token for each sequence whose scheduled tokens reach its end; None for the others."""
        self._forget_finished()
        tokens: list[int | None] = [None] * len(seqs)
        rows = [i for i, seq in enumerate(seqs) if seq.num_cached_tokens + seq.num_scheduled_tokens == len(seq)]
        if not rows:
            return tokens
        logits = self._last_logits([(seqs[i], seqs[i].token_ids) for i in rows])
        sampled = sample(logits, [seqs[i].sampling_params for i in rows], [seqs[i].generator for i in rows])
        for i, token in zip(rows, sampled):
            tokens[i] = token
        return tokens

    @torch.inference_mode()
    def launch_decode(self, seqs: list[Sequence], previous: InFlightStep | None) -> InFlightStep:
        """Async scheduling's decode step, computed at once (greedy only, as the engine guarantees)."""
        self._forget_finished()
        earlier = previous.tokens() if previous is not None else []
        wanted = []
        for seq in seqs:
            token_ids = seq.token_ids
            if token_ids[-1] == PENDING_TOKEN:
                token_ids = token_ids[:-1] + [earlier[previous.row_of[seq.seq_id]]]
            wanted.append((seq, token_ids))
        return InFlightStep.start(seqs, self._last_logits(wanted).argmax(dim=-1).to(torch.int64))

    def _last_logits(self, wanted: list[tuple[Sequence, list[int]]]) -> torch.Tensor:
        """Logits after each sequence's `token_ids`, one row each, feeding only what its cache lacks."""
        states = [self._state(seq, token_ids) for seq, token_ids in wanted]
        groups: dict[int, list[int]] = {}     # tokens to feed -> rows: one forward each
        for row, (state, (_, token_ids)) in enumerate(zip(states, wanted)):
            groups.setdefault(len(token_ids) - len(state.token_ids), []).append(row)
        logits: list[torch.Tensor | None] = [None] * len(wanted)
        for rows in groups.values():
            starts = [len(states[r].token_ids) for r in rows]
            group_logits, kvs = self._forward([wanted[r][1][start:] for r, start in zip(rows, starts)], starts,
                                              [states[r].kv for r in rows])
            for k, row in enumerate(rows):
                states[row].kv, states[row].token_ids = kvs[k], list(wanted[row][1])
                logits[row] = group_logits[k]
        return torch.stack(logits)

    def _state(self, seq: Sequence, token_ids: list[int]) -> DenseState:
        """`seq`'s cache, started over when it holds anything but a strict prefix of `token_ids`."""
        state = self.states.get(seq.seq_id)
        if state is None or state.seq is not seq or not self._extends(state.token_ids, token_ids):
            state = self.states[seq.seq_id] = DenseState(seq)
        return state

    def _forward(self, new_tokens: list[list[int]], starts: list[int],
                 kvs: list[LayerKV]) -> tuple[torch.Tensor, list[LayerKV]]:
        """One forward for rows that feed equally many new tokens after `starts[i]` cached ones.

        Shorter caches are padded on the left to the longest and the padding
        is masked out (`attention_mask`), as batched generation with left
        padding does; each row keeps its own positions, so it attends to
        exactly its own tokens.
        """
        longest = max(starts)
        cache = DynamicCache()
        if longest:
            for layer in range(len(kvs[0])):
                keys, values = (torch.cat([F.pad(kv[layer][part], (0, 0, longest - start, 0))
                                           for kv, start in zip(kvs, starts)]) for part in (0, 1))
                cache.update(keys, values, layer)
        input_ids = torch.tensor(new_tokens, device=self.device)
        width = input_ids.shape[1]
        positions = torch.tensor([[start + i for i in range(width)] for start in starts], device=self.device)
        mask = None
        if min(starts) < longest:
            mask = torch.ones(len(starts), longest + width, dtype=torch.long, device=self.device)
            for row, start in enumerate(starts):
                mask[row, :longest - start] = 0
        out = self.model(input_ids=input_ids, position_ids=positions, attention_mask=mask, use_cache=True,
                         logits_to_keep=1, **{self.cache_argument: cache})
        split = [[(layer.keys[b:b + 1, :, longest - start:], layer.values[b:b + 1, :, longest - start:])
                  for layer in cache.layers] for b, start in enumerate(starts)]
        return out.logits[:, -1], split

    @staticmethod
    def _extends(cached: list[int], token_ids: list[int]) -> bool:
        """Is `cached` a strict prefix of `token_ids` (so its K/V can be kept)?"""
        return len(cached) < len(token_ids) and token_ids[:len(cached)] == cached

    def _forget_finished(self) -> None:
        """Drop the caches of sequences that finished (a preempted one keeps its cache: same tokens)."""
        for seq_id in [i for i, state in self.states.items() if state.seq.is_finished]:
            del self.states[seq_id]
