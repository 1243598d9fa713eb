"""The model runner: turns a scheduled batch into tensors, runs the model, samples.

`prepare_prefill` / `prepare_decode` build the flat inputs the lecture names
(input_ids, positions, cu_seqlens_q/k, slot_mapping, block_tables,
context_lens); `run` does one forward pass and returns one sampled token per
sequence that completes its prompt (or decodes) in this step.
"""
from __future__ import annotations

import torch

from reference.config import Config
from reference.engine.sequence import Sequence
from reference.layers.attention import AttentionMetadata, make_backend
from reference.layers.sampler import sample
from reference.models.loader import load_weights
from reference.models.qwen3 import Qwen3Attention, Qwen3ForCausalLM

# On the CPU the KV pool gets as many bytes as the weights, and at least this much.
CPU_MIN_KV_BYTES = 128 * 2**20


class ModelRunner:
    def __init__(self, config: Config):
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = config.torch_dtype
        self.block_size = config.kvcache_block_size
        cfg = config.hf_config
        with torch.device(self.device):
            self.model = Qwen3ForCausalLM(cfg).to(self.dtype)
        load_weights(self.model, config.model)
        self.model.eval()
        self.backend = make_backend(config.attention_backend, config.device)
        self.attention_layers = [m for m in self.model.modules() if isinstance(m, Qwen3Attention)]
        self.num_kvcache_blocks = config.num_kvcache_blocks or self._blocks_that_fit()
        self._allocate_kv_cache()

    # -- KV cache ------------------------------------------------------------
    def _bytes_per_block(self) -> int:
        layer = self.attention_layers[0]
        per_token = 2 * len(self.attention_layers) * layer.num_kv_heads * layer.head_dim
        return per_token * self.block_size * torch.finfo(self.dtype).bits // 8

    def _blocks_that_fit(self) -> int:
        """Default pool size: enough for every sequence at full length, within memory."""
        wanted = self.config.max_num_seqs * self.config.max_model_len // self.block_size
        if self.device.type == "cpu":
            weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
            return max(1, min(wanted, max(CPU_MIN_KV_BYTES, weights) // self._bytes_per_block()))
        free, total = torch.cuda.mem_get_info(self.device)
        # Leave room for activations of the largest step (a rough bound; refined by the GPU fast path).
        hidden = self.config.hf_config["hidden_size"]
        vocab = self.config.hf_config["vocab_size"]
        activations = self.config.max_num_batched_tokens * (16 * hidden + vocab) * 4
        usable = free - total * (1 - self.config.gpu_memory_utilization) - activations
        if usable < self._bytes_per_block():
            raise RuntimeError(f"not enough GPU memory for a KV cache: {free / 2**30:.1f} GiB free")
        return int(min(wanted, usable // self._bytes_per_block()))

    def _allocate_kv_cache(self) -> None:
        layer = self.attention_layers[0]
        shape = (2, len(self.attention_layers), self.num_kvcache_blocks, self.block_size,
                 layer.num_kv_heads, layer.head_dim)
        # Zeros, not empty: padded decode reads unwritten slots (masked, but NaN * 0 is NaN).
        self.kv_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        for i, attn in enumerate(self.attention_layers):
            attn.k_cache, attn.v_cache = self.kv_cache[0, i], self.kv_cache[1, i]
            attn.backend = self.backend

    # -- inputs --------------------------------------------------------------
    def _slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        width = max(len(seq.block_table) for seq in seqs)
        rows = [seq.block_table + [0] * (width - len(seq.block_table)) for seq in seqs]
        return self._tensor(rows)

    def _tensor(self, data) -> torch.Tensor:
        return torch.tensor(data, dtype=torch.int64).to(self.device, non_blocking=True)

    def prepare_prefill(self, seqs: list[Sequence]):
        """Each sequence contributes tokens [num_cached, num_cached + num_scheduled)."""
        input_ids, positions, slot_mapping, context_lens = [], [], [], []
        cu_seqlens_q, cu_seqlens_k = [0], [0]
        for seq in seqs:
            start, end = seq.num_cached_tokens, seq.num_cached_tokens + seq.num_scheduled_tokens
            input_ids += seq.token_ids[start:end]
            positions += range(start, end)
            slot_mapping += [self._slot(seq, p) for p in range(start, end)]
            context_lens.append(end)                       # seqlen_k: the end of this chunk
            cu_seqlens_q.append(cu_seqlens_q[-1] + end - start)
            cu_seqlens_k.append(cu_seqlens_k[-1] + end)
        meta = AttentionMetadata(
            is_prefill=True, slot_mapping=self._tensor(slot_mapping), block_tables=self._block_tables(seqs),
            context_lens=self._tensor(context_lens), cu_seqlens_q=self._tensor(cu_seqlens_q),
            cu_seqlens_k=self._tensor(cu_seqlens_k),
            max_seqlen_q=max(b - a for a, b in zip(cu_seqlens_q, cu_seqlens_q[1:])), max_seqlen_k=max(context_lens))
        return self._tensor(input_ids), self._tensor(positions), meta

    def prepare_decode(self, seqs: list[Sequence]):
        """One token per sequence: the newest one, at position len - 1."""
        input_ids = [seq.last_token for seq in seqs]
        positions = [len(seq) - 1 for seq in seqs]
        slot_mapping = [self._slot(seq, len(seq) - 1) for seq in seqs]
        context_lens = [len(seq) for seq in seqs]
        meta = AttentionMetadata(
            is_prefill=False, slot_mapping=self._tensor(slot_mapping), block_tables=self._block_tables(seqs),
            context_lens=self._tensor(context_lens), max_seqlen_q=1, max_seqlen_k=max(context_lens))
        return self._tensor(input_ids), self._tensor(positions), meta

    # -- one step --------------------------------------------------------------
    @torch.inference_mode()
    def run(self, seqs: list[Sequence], is_prefill: bool) -> list[int | None]:
        """Forward the batch; sample for sequences whose scheduled tokens reach their end.

        A prefill chunk that stops short of the end samples nothing (None): its
        last position is not the sequence's last token.
        """
        prepare = self.prepare_prefill if is_prefill else self.prepare_decode
        input_ids, positions, meta = prepare(seqs)
        hidden = self.model(input_ids, positions, meta)
        last_index = (meta.cu_seqlens_q[1:] - 1) if is_prefill else torch.arange(len(seqs), device=self.device)
        completes = [seq.num_cached_tokens + seq.num_scheduled_tokens == len(seq) for seq in seqs]
        rows = [i for i, done in enumerate(completes) if done]
        tokens: list[int | None] = [None] * len(seqs)
        if rows:
            logits = self.model.compute_logits(hidden[last_index[rows]]).float()
            sampled = sample(logits, [seqs[i].sampling_params for i in rows], [seqs[i].generator for i in rows])
            for i, token in zip(rows, sampled):
                tokens[i] = token
        return tokens
