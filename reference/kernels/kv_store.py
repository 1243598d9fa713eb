"""Write each new token's K and V into its paged-cache slot (one program per token).

The cache is [num_blocks, block_size, kv_heads, head_dim], so a slot's K is one
contiguous row of kv_heads * head_dim values: the kernel is a scattered row copy.
Slot -1 marks padding (CUDA-graph batches are padded) and is skipped.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, stride_k, stride_v,
                     ROW: tl.constexpr, BLOCK: tl.constexpr):
    # >>> EXERCISE lab4.kv_store_kernel: Copy token `program_id(0)`'s K and V rows into its cache slot (skip slot < 0).
    # HINT: a slot's row starts at slot * ROW in the flat cache; load and store BLOCK lanes masked to the first ROW.
    # HINT: cast the slot to int64 before multiplying: slot * ROW overflows int32 in a large cache.
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    if slot < 0:
        return
    offs = tl.arange(0, BLOCK)
    mask = offs < ROW
    k = tl.load(k_ptr + token * stride_k + offs, mask=mask)
    v = tl.load(v_ptr + token * stride_v + offs, mask=mask)
    tl.store(k_cache_ptr + slot.to(tl.int64) * ROW + offs, k, mask=mask)
    tl.store(v_cache_ptr + slot.to(tl.int64) * ROW + offs, v, mask=mask)
    # <<< EXERCISE lab4.kv_store_kernel


def store_kvcache_triton(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         slot_mapping: torch.Tensor) -> None:
    """k, v: [num_tokens, kv_heads, head_dim], each row contiguous; caches contiguous."""
    num_tokens, heads, dim = k.shape
    assert k.stride(-1) == 1 and k.stride(-2) == dim and v.stride(-1) == 1 and v.stride(-2) == dim
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    row = heads * dim
    _store_kv_kernel[(num_tokens,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
                                    ROW=row, BLOCK=triton.next_power_of_2(row))
