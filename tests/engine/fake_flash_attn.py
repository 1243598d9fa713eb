"""A stand-in for the `flash_attn` package, written from its documented contract, for CPU tests.

The real package has no wheels for our CI or GPU machines, so the
FlashAttnBackend is checked against this instead: the two functions it calls,
with the argument layouts, dtypes and masking rules flash-attn's docstrings
state (flash_attn_interface.py), computed slowly and plainly per sequence.

- `flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
  max_seqlen_k, ..., softmax_scale, causal, block_table)`: q is
  (total_q, nheads, d); k, v are (total_k, nheads_k, d), or the paged cache
  (num_blocks, page_block_size, nheads_k, d) when block_table is given;
  cu_seqlens_* and block_table are int32.
- `flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table,
  softmax_scale, causal)`: q is (batch, seqlen, nheads, d); cache_seqlens and
  block_table are int32.
- Paged caches need page_block_size to be a multiple of 256.
- Query head h reads KV head h // (nheads // nheads_k).
- causal=True aligns the mask to the bottom-right corner: query i of a sequence
  with seqlen_q queries and seqlen_k keys sees keys j <= i + seqlen_k - seqlen_q.
  A query that sees no key gets a zero output.
"""
from __future__ import annotations

import torch

calls: list[str] = []   # which entry points ran, for tests that check the routing


def _require_int32(name: str, tensor: torch.Tensor) -> None:
    if tensor.dtype != torch.int32:
        raise RuntimeError(f"{name} must have dtype torch.int32, got {tensor.dtype}")


def _paged_keys(cache: torch.Tensor, table_row: torch.Tensor, length: int) -> torch.Tensor:
    page = cache.shape[1]
    if page % 256 != 0:
        raise RuntimeError(f"Paged KV cache block size must be divisible by 256, got {page}")
    rows = [cache[int(table_row[pos // page]), pos % page] for pos in range(length)]
    return torch.stack(rows) if rows else cache.new_zeros((0, *cache.shape[2:]))


def _one_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """q: (seqlen_q, nheads, d); k, v: (seqlen_k, nheads_k, d) -> (seqlen_q, nheads, d)."""
    seqlen_q, nheads, _ = q.shape
    seqlen_k, nheads_k, _ = k.shape
    if nheads % nheads_k != 0:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    out = torch.zeros_like(q, dtype=torch.float64)
    for h in range(nheads):
        kv = h // (nheads // nheads_k)
        scores = (q[:, h].double() @ k[:, kv].double().T) * scale          # (seqlen_q, seqlen_k)
        for i in range(seqlen_q):
            visible = seqlen_k if not causal else min(seqlen_k, i + seqlen_k - seqlen_q + 1)
            if visible <= 0:
                continue   # fully masked row: zero output
            weights = torch.softmax(scores[i, :visible], dim=0)
            out[i, h] = weights @ v[:visible, kv].double()
    return out.to(q.dtype)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, softcap=0.0, block_table=None):
    calls.append("varlen" + ("_paged" if block_table is not None else ""))
    _require_int32("cu_seqlens_q", cu_seqlens_q)
    _require_int32("cu_seqlens_k", cu_seqlens_k)
    if block_table is not None:
        _require_int32("block_table", block_table)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    out = torch.empty_like(q)
    for b in range(len(cu_q) - 1):
        seqlen_q, seqlen_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        if seqlen_q > max_seqlen_q or seqlen_k > max_seqlen_k:
            raise RuntimeError("a sequence is longer than max_seqlen_q / max_seqlen_k")
        if block_table is None:
            keys, values = k[cu_k[b]:cu_k[b + 1]], v[cu_k[b]:cu_k[b + 1]]
        else:
            keys, values = _paged_keys(k, block_table[b], seqlen_k), _paged_keys(v, block_table[b], seqlen_k)
        out[cu_q[b]:cu_q[b + 1]] = _one_sequence(q[cu_q[b]:cu_q[b + 1]], keys, values, scale, causal)
    return out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, softcap=0.0):
    calls.append("kvcache")
    if k is not None or v is not None or cache_batch_idx is not None or cache_leftpad is not None:
        raise NotImplementedError("the stand-in covers reading the cache only")
    if q.dim() != 4:
        raise RuntimeError(f"q must be (batch_size, seqlen, nheads, headdim), got shape {tuple(q.shape)}")
    _require_int32("cache_seqlens", cache_seqlens)
    _require_int32("block_table", block_table)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    out = torch.empty_like(q)
    for b, length in enumerate(cache_seqlens.tolist()):
        keys = _paged_keys(k_cache, block_table[b], length)
        values = _paged_keys(v_cache, block_table[b], length)
        out[b] = _one_sequence(q[b], keys, values, scale, causal)
    return out
