# Generated from reference/kernels/paged_decode.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Paged-attention decode: one query token per sequence against its cached K/V.

One program handles one (sequence, KV head) pair and all the query heads that
share that KV head (GQA), so each cached K/V row is read from memory once per
step: decode is bound by that read, and this is the read. It walks the
sequence's context in tiles of BLOCK_N tokens, finding each token's physical
slot through the block table, and keeps a running (online) softmax in fp32
(`reference/kernels/online_softmax.py`, the step it shares with prefill).

Split-K ("flash-decoding"): with few sequences the grid of batch x KV heads
programs leaves most of the GPU's multiprocessors idle, each program walking a
long context alone. Then every (sequence, KV head) pair gets NUM_SPLITS
programs, each over one contiguous slice of the context, writing an
unnormalised partial output with its running max and sum; a second small
kernel merges the slices (rescaling each by 2^(m_s - max_s m_s): scores are in
log2 units, as `online_softmax_step` keeps them). How many splits a batch gets
is `num_splits`, a rule measured on the GPU.

Longest first: without splits, a program's work is its sequence's context,
which in a running batch spans 100 to 2,000+ tokens. The GPU starts programs
in grid order as earlier ones finish, so a long context that starts late runs
on while most multiprocessors idle (a tail). Given `order`, the rows sorted by
context length (`longest_first`, once per step), program p takes row
order[p // kv_heads] and KV head p % kv_heads: the longest rows start first,
all their heads together, and the short ones fill the gaps at the end, the
classic longest-processing-time rule of list scheduling.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from student_exercises.kernels.online_softmax import LOG2_E, online_softmax_step


@triton.jit
def _attend_range(q, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq, kv_head, lo, hi, qk_scale,
                  stride_cb, stride_cs, stride_ch, stride_bt,
                  BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                  PRECISION: tl.constexpr):
    """Online softmax of q against context tokens [lo, hi): (unnormalised acc, running max m, sum l).

    qk_scale is the softmax scale times log2(e): scores and m are in log2 units.
    """
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        tokens = start + offs_n
        valid = tokens < hi
        pages = tl.load(block_tables_ptr + seq * stride_bt + tokens // PAGE_SIZE, mask=valid, other=0)
        rows = pages.to(tl.int64) * stride_cb + (tokens % PAGE_SIZE) * stride_cs + kv_head * stride_ch
        k = tl.load(k_cache_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        v = tl.load(v_cache_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        acc, m, l = online_softmax_step(acc, m, l, s, v, PRECISION)
    return acc, m, l


@triton.jit
def _paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, order_ptr, out_ptr,
                         qk_scale, stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt,
                         stride_ot, stride_oh,
                         GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                         PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                         KV_HEADS: tl.constexpr, ORDERED: tl.constexpr):
    """Program p: KV head p % KV_HEADS of row p // KV_HEADS, or of row order[p // KV_HEADS] if ORDERED."""
    rank = tl.program_id(0) // KV_HEADS
    kv_head = tl.program_id(0) % KV_HEADS
    if ORDERED:
        seq = tl.load(order_ptr + rank)
    else:
        seq = rank
    context_len = tl.load(context_lens_ptr + seq)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    head_mask = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=head_mask[:, None], other=0.0)
    acc, m, l = _attend_range(q, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq, kv_head, 0, context_len, qk_scale,
                              stride_cb, stride_cs, stride_ch, stride_bt, BLOCK_H, HEAD_DIM, PAGE_SIZE, BLOCK_N,
                              PRECISION)
    out = acc / tl.maximum(l, 1e-30)[:, None]   # context_len 0 (graph padding) gives zeros, not NaN
    tl.store(out_ptr + seq * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None])


@triton.jit
def _paged_decode_split_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
                               part_acc_ptr, part_ml_ptr, qk_scale,
                               stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt,
                               GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                               PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                               NUM_SPLITS: tl.constexpr):
    """Program (seq, kv_head, split): the split-th of NUM_SPLITS slices of the context, in whole tiles.

    Partial results: part_acc [batch, q_heads, NUM_SPLITS, HEAD_DIM] (unnormalised),
    part_ml [batch, q_heads, NUM_SPLITS, 2] (running max, sum). A slice past the end of
    a short context is empty: max -inf, sum 0, and the merge gives it weight 0.
    """
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    slice_len = tl.cdiv(tl.cdiv(context_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * slice_len
    hi = tl.minimum(lo + slice_len, context_len)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    head_mask = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=head_mask[:, None], other=0.0)
    acc, m, l = _attend_range(q, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq, kv_head, lo, hi, qk_scale,
                              stride_cb, stride_cs, stride_ch, stride_bt, BLOCK_H, HEAD_DIM, PAGE_SIZE, BLOCK_N,
                              PRECISION)
    q_heads = tl.num_programs(1) * GROUP
    row = (seq * q_heads + heads) * NUM_SPLITS + split              # [BLOCK_H] index of (seq, head, split)
    tl.store(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=head_mask[:, None])
    tl.store(part_ml_ptr + row * 2, m, mask=head_mask)
    tl.store(part_ml_ptr + row * 2 + 1, l, mask=head_mask)


@triton.jit
def _merge_splits_kernel(part_acc_ptr, part_ml_ptr, out_ptr, stride_ot, stride_oh,
                         HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """Program (seq, head): out = sum_s w_s acc_s / sum_s w_s l_s with w_s = exp2(m_s - max m) (log2 units)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS)
    offs_d = tl.arange(0, HEAD_DIM)
    row = (seq * tl.num_programs(1) + head) * NUM_SPLITS + offs_s
    m = tl.load(part_ml_ptr + row * 2)
    l = tl.load(part_ml_ptr + row * 2 + 1)
    m_max = tl.max(m, 0)
    w = tl.where(m > float("-inf"), tl.math.exp2(m - m_max), 0.0)        # empty slices (and all-empty rows) weigh 0
    acc = tl.load(part_acc_ptr + row[:, None] * HEAD_DIM + offs_d[None, :])
    out = tl.sum(acc * w[:, None], 0) / tl.maximum(tl.sum(w * l, 0), 1e-30)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))


# Split-K rule: (largest batch, splits) pairs, first match wins; batches above the last use no split.
# Each pair is the split count with the least time summed over contexts of 256, 1024 and 2048
# tokens, for that batch, in the sweep of scripts/decode_splits.py on an H100 (docs/performance.md,
# "Split-K"); from batch 32 on, no split was fastest.
SPLITS_BY_BATCH = ((2, 16), (4, 8), (8, 4), (16, 2))


def num_splits(batch: int, kv_heads: int) -> int:
    """How many slices of the context each (sequence, KV head) gets: 1 (no split) for large batches.

    Decided by the batch alone, so that one CUDA graph per batch bucket fits
    every context length; a context shorter than the slices leaves the late
    ones empty, which costs a program that exits at once.
    """
    for largest, splits in SPLITS_BY_BATCH:
        if batch <= largest:
            return splits
    return 1


@triton.jit
def _longest_first_kernel(lens_ptr, order_ptr, n, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr):
    """Row i goes to place rank(i): the number of rows longer than it, or as long with a smaller index."""
    i = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    len_i = tl.load(lens_ptr + i, mask=i < n, other=0)
    rank = tl.zeros([BLOCK_I], tl.int32)
    for start in range(0, n, BLOCK_J):
        j = start + tl.arange(0, BLOCK_J)
        len_j = tl.load(lens_ptr + j, mask=j < n, other=0)
        ahead = (len_j[None, :] > len_i[:, None]) | ((len_j[None, :] == len_i[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((ahead & (j[None, :] < n)).to(tl.int32), 1)
    tl.store(order_ptr + rank, i.to(tl.int64), mask=i < n)


def longest_first(context_lens: torch.Tensor) -> torch.Tensor:
    """Row indices by context length, longest first (ties in row order): the `order` for
    `paged_decode_attention`.

    One ordering per decode step, shared by every layer (the backend's `plan`),
    because one per layer would cost about what the ordering saves. Counted,
    not sorted: each row's place is the number of rows ahead of it, n^2
    comparisons in one small launch, where torch.argsort runs a radix sort
    built for millions of keys (docs/performance.md, session 14).
    """
    n = context_lens.shape[0]
    order = torch.empty(n, dtype=torch.int64, device=context_lens.device)
    if n:
        _longest_first_kernel[(triton.cdiv(n, 32),)](context_lens, order, n, BLOCK_I=32, BLOCK_J=64)
    return order


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float,
                           block_n: int = 128, num_warps: int = 4, num_stages: int = 2,
                           splits: int | None = None, order: torch.Tensor | None = None) -> torch.Tensor:
    """q: [batch, q_heads, head_dim]; caches: [num_blocks, page_size, kv_heads, head_dim].

    block_n 128 / 4 warps / 2 stages: the fastest of ten configurations swept on an
    H100 at batch 256 (scripts/profile_decode.py; docs/performance.md).
    `splits`: slices of the context per (sequence, KV head), a power of two;
    None picks `num_splits(batch, kv_heads)`.
    `order`: a permutation of the rows (`longest_first`) in which the unsplit
    kernel schedules them; the output is in row order either way. Split
    batches ignore it (their slices already even out the work).
    """
    batch, q_heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_cache.shape
    group = q_heads // kv_heads
    splits = num_splits(batch, kv_heads) if splits is None else splits
    if splits & (splits - 1):
        raise ValueError(f"splits must be a power of two, got {splits}")
    out = torch.empty_like(q)
    qk_scale = scale * LOG2_E   # scores in log2 units: online_softmax_step works in exp2
    # fp32 uses exact (IEEE) dot products so the kernel can be checked token for token.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    shape = dict(GROUP=group, BLOCK_H=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
                 PAGE_SIZE=page_size, BLOCK_N=block_n, PRECISION=precision, num_warps=num_warps,
                 num_stages=num_stages)
    if splits == 1:
        if order is not None and order.shape != (batch,):
            raise ValueError(f"order must hold one index per row ({batch}), got shape {tuple(order.shape)}")
        _paged_decode_kernel[(batch * kv_heads,)](
            q, k_cache, v_cache, block_tables, context_lens, context_lens if order is None else order, out, qk_scale,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            block_tables.stride(0), out.stride(0), out.stride(1), KV_HEADS=kv_heads, ORDERED=order is not None,
            **shape)
        return out
    part_acc = torch.empty(batch, q_heads, splits, head_dim, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(batch, q_heads, splits, 2, dtype=torch.float32, device=q.device)
    _paged_decode_split_kernel[(batch, kv_heads, splits)](
        q, k_cache, v_cache, block_tables, context_lens, part_acc, part_ml, qk_scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), NUM_SPLITS=splits, **shape)
    _merge_splits_kernel[(batch, q_heads)](part_acc, part_ml, out, out.stride(0), out.stride(1),
                                           HEAD_DIM=head_dim, NUM_SPLITS=splits, num_warps=4)
    return out
