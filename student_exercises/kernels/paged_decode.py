# Generated from reference/kernels/paged_decode.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Paged-attention decode: one query token per sequence against its cached K/V.

One program handles one (sequence, KV head) pair and all the query heads that
share that KV head (GQA), so each cached K/V row is read from memory once per
step: decode is bound by that read, and this is the read. It walks the
sequence's context in tiles of BLOCK_N tokens, finding each token's physical
slot through the block table, and keeps a running (online) softmax in fp32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, out_ptr, scale,
                         stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt, stride_ot, stride_oh,
                         GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                         PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    context_len = tl.load(context_lens_ptr + seq)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    head_mask = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=head_mask[:, None], other=0.0)

    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for start in range(0, context_len, BLOCK_N):
        tokens = start + offs_n
        valid = tokens < context_len
        pages = tl.load(block_tables_ptr + seq * stride_bt + tokens // PAGE_SIZE, mask=valid, other=0)
        rows = pages.to(tl.int64) * stride_cb + (tokens % PAGE_SIZE) * stride_cs + kv_head * stride_ch
        k = tl.load(k_cache_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        v = tl.load(v_cache_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        l = l * alpha + tl.sum(p, 1)
        m = m_new
    out = acc / tl.maximum(l, 1e-30)[:, None]   # context_len 0 (graph padding) gives zeros, not NaN
    tl.store(out_ptr + seq * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None])


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           block_n: int = 128, num_warps: int = 4, num_stages: int = 2) -> torch.Tensor:
    """q: [batch, q_heads, head_dim]; caches: [num_blocks, page_size, kv_heads, head_dim].

    block_n 128 / 4 warps / 2 stages: the fastest of ten configurations swept on an
    H100 at batch 256 (scripts/profile_decode.py; docs/performance.md).
    """
    batch, q_heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    group = q_heads // kv_heads
    out = torch.empty_like(q)
    # fp32 uses exact (IEEE) dot products so the kernel can be checked token for token.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _paged_decode_kernel[(batch, kv_heads)](
        q, k_cache, v_cache, block_tables, context_lens, out, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE_SIZE=page_size, BLOCK_N=block_n, PRECISION=precision, num_warps=num_warps, num_stages=num_stages)
    return out
