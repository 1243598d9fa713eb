"""Attention over the paged KV cache, and the metadata every backend reads.

A step's tokens arrive flattened: all sequences' new tokens in one tensor,
with `cu_seqlens_q` marking where each sequence starts. Each attention call
first stores the new K/V into the cache slots named by `slot_mapping`, then
attends over everything the sequence has in the cache (its prefix included),
found through its row of `block_tables`.

The "torch" backend below is written for clarity, not speed: it is the oracle
the faster backends are checked against, and it runs on CPU and CUDA alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    is_prefill: bool
    slot_mapping: torch.Tensor      # [num_tokens] cache slot of each new token (-1: skip, for padding)
    block_tables: torch.Tensor      # [num_seqs, max_blocks] physical block ids, padded with 0
    context_lens: torch.Tensor      # [num_seqs] tokens in the cache after this step (= seqlen_k)
    cu_seqlens_q: torch.Tensor | None = None  # prefill: [num_seqs + 1] offsets of each sequence's new tokens
    cu_seqlens_k: torch.Tensor | None = None  # prefill: [num_seqs + 1] offsets over context lengths
    max_seqlen_q: int = 0
    max_seqlen_k: int = 0


def store_kvcache(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> None:
    """Write each new token's K/V into its slot. k, v: [num_tokens, kv_heads, head_dim]."""
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k[valid].to(k_cache.dtype))
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v[valid].to(v_cache.dtype))


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` cached tokens of one sequence: [length, kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    return cache[block_table[:num_blocks]].flatten(0, 1)[:length]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [..., Hq, Lq, D]; k, v: [..., Hkv, Lk, D]; mask: True where a query may see a key."""
    group = q.shape[-3] // k.shape[-3]          # grouped-query attention: heads share K/V
    k = k.repeat_interleave(group, dim=-3)
    v = v.repeat_interleave(group, dim=-3)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v.float()).to(q.dtype)


class TorchAttentionBackend:
    """Pure-PyTorch paged attention: per-sequence loop for prefill, padded batch for decode."""

    name = "torch"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.is_prefill:
            return self._prefill(q, k_cache, v_cache, meta, scale)
        return self._decode(q, k_cache, v_cache, meta, scale)

    def _prefill(self, q, k_cache, v_cache, meta, scale):
        out = torch.empty_like(q)
        cu_q = meta.cu_seqlens_q.tolist()
        for i, seqlen_k in enumerate(meta.context_lens.tolist()):
            start, end = cu_q[i], cu_q[i + 1]
            k = gather_kv(k_cache, meta.block_tables[i], seqlen_k)
            v = gather_kv(v_cache, meta.block_tables[i], seqlen_k)
            # Query j sits at absolute position seqlen_k - len_q + j and sees keys up to it.
            q_pos = torch.arange(seqlen_k - (end - start), seqlen_k, device=q.device)
            mask = q_pos[:, None] >= torch.arange(seqlen_k, device=q.device)[None, :]
            o = _attend(q[start:end].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), mask, scale)
            out[start:end] = o.transpose(0, 1)
        return out

    def _decode(self, q, k_cache, v_cache, meta, scale):
        # Gather every sequence's blocks into a padded batch, then mask the tail.
        batch, max_blocks = meta.block_tables.shape
        block_size = k_cache.shape[1]
        k = k_cache[meta.block_tables].flatten(1, 2)   # [B, max_blocks*block_size, Hkv, D]
        v = v_cache[meta.block_tables].flatten(1, 2)
        positions = torch.arange(max_blocks * block_size, device=q.device)
        mask = (positions[None, :] < meta.context_lens[:, None])[:, None, None, :]  # [B, 1, 1, Lk]
        o = _attend(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2), mask, scale)
        return o[:, :, 0, :]


def make_backend(name: str, device: str) -> TorchAttentionBackend:
    """Pick the attention backend. Only "torch" exists so far; "auto" resolves to it."""
    if name in ("auto", "torch"):
        return TorchAttentionBackend()
    raise ValueError(f"attention_backend={name!r} is not available in this build "
                     f"(device {device}); use 'torch' or 'auto'")
