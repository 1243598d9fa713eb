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

from dataclasses import dataclass, replace

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
    has_cached_prefix: bool = False  # prefill: does any sequence attend to K/V computed in earlier steps?
    num_context_tokens: int = 0      # prefill: sum of context_lens (sizes the gathered K/V)
    decode_order: torch.Tensor | None = None  # decode: rows in the order a kernel should run them (backend.plan)
    context_slots: torch.Tensor | None = None  # prefill over a cached prefix: each context token's slot (backend.plan)


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


def _into(out: torch.Tensor | None, o: torch.Tensor) -> torch.Tensor:
    """o, or o copied into `out` when the caller gave a fixed home for it (a CUDA graph's buffer)."""
    if out is None:
        return o
    out.copy_(o)
    return out


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

    def plan(self, meta: AttentionMetadata) -> AttentionMetadata:
        """Work done once per decode step for all layers (see TritonAttentionBackend.plan); none here."""
        return meta

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """Store the new K/V, attend: [tokens, heads, head_dim], written into `out` if given (every backend)."""
        store_kvcache(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.is_prefill:
            return _into(out, self._prefill(q, k_cache, v_cache, meta, scale))
        return _into(out, self._decode(q, k_cache, v_cache, meta, scale))

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
        # >>> EXERCISE lab4.paged_decode: Attend each sequence's one query over its context_lens cached tokens.
        # HINT: k_cache[block_tables] gathers every sequence's blocks: [batch, max_blocks, block_size, heads, dim].
        # HINT: mask out positions >= context_lens (padding blocks, unused slots); _attend does GQA and softmax.
        # Gather every sequence's blocks into a padded batch, then mask the tail.
        batch, max_blocks = meta.block_tables.shape
        block_size = k_cache.shape[1]
        k = k_cache[meta.block_tables].flatten(1, 2)   # [B, max_blocks*block_size, Hkv, D]
        v = v_cache[meta.block_tables].flatten(1, 2)
        positions = torch.arange(max_blocks * block_size, device=q.device)
        mask = (positions[None, :] < meta.context_lens[:, None])[:, None, None, :]  # [B, 1, 1, Lk]
        o = _attend(q[:, :, None, :], k.transpose(1, 2), v.transpose(1, 2), mask, scale)
        return o[:, :, 0, :]
        # <<< EXERCISE lab4.paged_decode


class TritonAttentionBackend:
    """GPU backend: Triton KV store, paged decode and varlen causal prefill.

    Prefill over a cached prefix first gathers each sequence's whole context
    out of the paged cache into one contiguous varlen batch. The prefill
    kernel (`reference/kernels/prefill_attention.py`) replaced PyTorch's
    FlashAttention-2 here because it was faster on the bench's prefill step
    (docs/performance.md); it takes fp32 too, with exact dot products, so fp32
    runs compare the whole Triton path token for token with the oracle. Head
    sizes it cannot tile (not a power of two) go to FlashAttention-2, or in
    fp32 (which that does not take) to the torch prefill.
    """

    name = "triton"

    def __init__(self, block_size: int):
        from reference.kernels.kv_store import store_kvcache_triton
        from reference.kernels.paged_decode import longest_first, paged_decode_attention
        from reference.kernels.prefill_attention import prefill_attention, tiles_head_dim
        self.store = store_kvcache_triton
        self.decode = paged_decode_attention
        self.longest_first = longest_first
        self.prefill = prefill_attention
        self.prefill_tiles = tiles_head_dim
        self.block_size = block_size

    def plan(self, meta: AttentionMetadata) -> AttentionMetadata:
        """Work every layer's kernel needs, done once per step instead of once per layer.

        Decode: sort the rows longest context first. The model runner calls
        this inside each CUDA graph it captures, so the sort is replayed with
        the graph on every step's context lengths. Prefill over a cached
        prefix: the cache slot of every context token (about ten small
        kernels, which each of the model's layers used to launch again).
        """
        if not meta.is_prefill:
            return replace(meta, decode_order=self.longest_first(meta.context_lens))
        if meta.has_cached_prefix and meta.context_slots is None:
            return replace(meta, context_slots=context_slots(meta, self.block_size))
        return meta

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                out: torch.Tensor | None = None) -> torch.Tensor:
        self.store(k, v, k_cache, v_cache, meta.slot_mapping)
        if not meta.is_prefill:
            return _into(out, self.decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale,
                                          order=meta.decode_order))
        tileable = self.prefill_tiles(q.shape[-1])
        if not tileable and q.dtype == torch.float32:
            return _into(out, TorchAttentionBackend()._prefill(q, k_cache, v_cache, meta, scale))
        if meta.has_cached_prefix:
            slots = context_slots(meta, k_cache.shape[1]) if meta.context_slots is None else meta.context_slots
            k = k_cache.flatten(0, 1)[slots]
            v = v_cache.flatten(0, 1)[slots]
        if not tileable:
            return _into(out, flash_varlen(q, k, v, meta, scale))
        return self._prefill_kernel(q, k, v, meta, scale, out)

    def _prefill_kernel(self, q, k, v, meta: AttentionMetadata, scale: float,
                        out: torch.Tensor | None = None) -> torch.Tensor:
        """The Triton prefill with its tiles: 64 query rows (every head of a KV group, when the group
        divides 64) x 32 keys, 4 warps, 3 stages, the fastest of the configurations swept on an H100
        (scripts/prefill_attention_bench.py; docs/performance.md)."""
        cu_k = meta.cu_seqlens_k if meta.has_cached_prefix else meta.cu_seqlens_q
        group = q.shape[1] // k.shape[1]
        return self.prefill(q, k, v, meta.cu_seqlens_q, cu_k, meta.max_seqlen_q, scale, block_m=64, block_n=32,
                            num_warps=4, num_stages=3, group_heads=64 % group == 0, out=out)


def context_slots(meta: AttentionMetadata, block_size: int) -> torch.Tensor:
    """Cache slot of every context token of every sequence, in varlen (cu_seqlens_k) order."""
    device = meta.context_lens.device
    seq_index = torch.repeat_interleave(torch.arange(len(meta.context_lens), device=device), meta.context_lens,
                                        output_size=meta.num_context_tokens)
    position = torch.arange(meta.num_context_tokens, device=device) - meta.cu_seqlens_k[seq_index]
    return meta.block_tables[seq_index, position // block_size] * block_size + position % block_size


def flash_varlen(q, k, v, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """PyTorch's built-in FlashAttention-2 over variable-length sequences, causal.

    With fewer queries than keys the causal mask is aligned to the end (query j
    of n sees keys up to seqlen_k - n + j), which is what a chunk needs.
    """
    cu_k = meta.cu_seqlens_k if meta.has_cached_prefix else meta.cu_seqlens_q
    max_k = meta.max_seqlen_k if meta.has_cached_prefix else meta.max_seqlen_q
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, meta.cu_seqlens_q.int(), cu_k.int(), meta.max_seqlen_q, max_k, 0.0, True, False, scale=scale)
    return out[0]


class FlashAttnBackend:
    """The flash-attn package: paged decode and prefill read the cache through the block table directly.

    flash-attn's paged kernels need a KV block size that is a multiple of 256.
    """

    name = "flash-attn"

    def __init__(self):
        import flash_attn
        from reference.kernels.kv_store import store_kvcache_triton
        self.flash_attn = flash_attn
        self.store = store_kvcache_triton

    def plan(self, meta: AttentionMetadata) -> AttentionMetadata:
        return meta

    def forward(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float,
                out: torch.Tensor | None = None) -> torch.Tensor:
        self.store(k, v, k_cache, v_cache, meta.slot_mapping)
        if not meta.is_prefill:
            o = self.flash_attn.flash_attn_with_kvcache(
                q.unsqueeze(1), k_cache, v_cache, cache_seqlens=meta.context_lens.int(),
                block_table=meta.block_tables.int(), softmax_scale=scale, causal=True)
            return _into(out, o.squeeze(1))
        if meta.has_cached_prefix:
            return _into(out, self.flash_attn.flash_attn_varlen_func(
                q, k_cache, v_cache, meta.cu_seqlens_q.int(), meta.cu_seqlens_k.int(), meta.max_seqlen_q,
                meta.max_seqlen_k, softmax_scale=scale, causal=True, block_table=meta.block_tables.int()))
        return _into(out, self.flash_attn.flash_attn_varlen_func(
            q, k, v, meta.cu_seqlens_q.int(), meta.cu_seqlens_q.int(), meta.max_seqlen_q, meta.max_seqlen_q,
            softmax_scale=scale, causal=True))


def _importable(module: str) -> bool:
    try:
        __import__(module)
        return True
    except Exception:  # a broken CUDA extension raises more than ImportError
        return False


def make_backend(name: str, device: str, block_size: int):
    """Resolve `attention_backend`. "auto": flash-attn, then triton, then torch on CUDA; torch on the CPU."""
    if name == "auto":
        if device != "cuda":
            name = "torch"
        elif _importable("flash_attn") and block_size % 256 == 0:
            name = "flash-attn"
        else:
            name = "triton" if _importable("triton") else "torch"
    if name == "torch":
        return TorchAttentionBackend()
    if device != "cuda":
        raise ValueError(f"attention_backend={name!r} needs device='cuda' (got {device!r}); use 'torch'")
    if name == "triton":
        if not _importable("triton"):
            raise ValueError("attention_backend='triton' but the triton package is not installed")
        return TritonAttentionBackend(block_size)
    if not _importable("flash_attn"):
        raise ValueError("attention_backend='flash-attn' but the flash_attn package does not import "
                         "(pip install inferlab[flash] on a CUDA machine)")
    if block_size % 256 != 0:
        raise ValueError(f"attention_backend='flash-attn' needs kvcache_block_size to be a multiple of 256, "
                         f"got {block_size}")
    return FlashAttnBackend()
