# Generated from reference/kernels/prefill_attention.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Causal attention over packed variable-length sequences (prefill), with GQA.

The same contract as FlashAttention-2's varlen forward with `causal=True`:
q [total_q, q_heads, head_dim] and k, v [total_k, kv_heads, head_dim] hold
the sequences back to back, `cu_seqlens_q` / `cu_seqlens_k` their running
sums; with fewer queries than keys (a chunk after a cached prefix) the mask is
aligned to the end, query j of n_q seeing keys 0 .. n_k - n_q + j.

One program takes one tile of BLOCK_M rows of one sequence: BLOCK_M query
tokens of one query head, or, with `group_heads`, BLOCK_M // group tokens of
all `group` query heads that share one KV head (token-major rows, so each
token's heads are one contiguous load). Either way a K/V tile loaded feeds a
BLOCK_M x BLOCK_N product, so loads per FLOP are the same; the grouped tile
covers group times fewer tokens, a finer cut along the causal diagonal (less
work wasted above it), where the ungrouped one relies on the group's heads
running side by side for its K/V reads to meet in L2. Which wins is measured
(scripts/prefill_attention_bench.py), not assumed.

It walks the keys in tiles of BLOCK_N with an online softmax in fp32, exp2
with log2(e) folded into the scale. The walk stops at the causal limit of the
tile's last row and is split in two loops: the tiles every row of the tile
sees whole, loaded and scored without a mask, then the few tiles across the
diagonal (and the ragged end of the keys), which pay for the mask. Rows past
the sequence's end (its last tile) compute on zero queries and are not stored.

Grid order: program_id(2) counts M tiles from the last (of the longest
sequence), program_id(0) the heads. The GPU starts programs in grid order, and
a tile's keys grow with its position, so the tiles with the most keys start
first and the one-key-tile programs fill the gaps at the end
(longest-processing-time first, as in `paged_decode`); the programs of one
tile's heads run side by side. Tiles past a shorter sequence's end exit at
once; that costs a launch slot each, which is cheap against a tail of long
programs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from student_exercises.kernels.online_softmax import LOG2_E, online_softmax_step


@triton.jit
def _attend_tiles(acc, m, l, q, k_ptr, v_ptr, k_row0, k_col, v_col, stride_kt, stride_vt, tokens, causal_end,
                  n_k, lo, hi, qk_scale,
                  BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """Fold keys [lo, hi) into the online softmax (acc, m, l); MASKED applies causality and the keys' end.

    `tokens` [BLOCK_M]: each row's query index in its sequence; `causal_end`: n_k - n_q, the
    shift that aligns the mask to the end. Scores are in log2 units (qk_scale holds log2(e)).
    """
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_N):
        keys = start + offs_n
        rows = (k_row0 + keys).to(tl.int64)
        k_ptrs = k_ptr + rows[:, None] * stride_kt + k_col + offs_d[None, :]
        v_ptrs = v_ptr + rows[:, None] * stride_vt + v_col + offs_d[None, :]
        if MASKED:
            in_range = keys < n_k
            k = tl.load(k_ptrs, mask=in_range[:, None], other=0.0)
        else:
            k = tl.load(k_ptrs)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if MASKED:
            visible = (keys[None, :] <= causal_end + tokens[:, None]) & in_range[None, :]
            s = tl.where(visible, s, float("-inf"))
            v = tl.load(v_ptrs, mask=in_range[:, None], other=0.0)
        else:
            v = tl.load(v_ptrs)
        acc, m, l = online_softmax_step(acc, m, l, s, v, PRECISION)
    return acc, m, l


@triton.jit
def _prefill_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, cu_q_ptr, cu_k_ptr, qk_scale,
                              stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
                              stride_ot, stride_oh,
                              GROUP: tl.constexpr, HEADS_PER_PROGRAM: tl.constexpr, TOKENS: tl.constexpr,
                              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              PRECISION: tl.constexpr):
    """Program (head slot, sequence, M tile from the last): BLOCK_M rows = TOKENS tokens x HEADS_PER_PROGRAM."""
    seq = tl.program_id(1)
    m_tile = tl.num_programs(2) - 1 - tl.program_id(2)
    q_start = tl.load(cu_q_ptr + seq).to(tl.int32)
    n_q = tl.load(cu_q_ptr + seq + 1).to(tl.int32) - q_start
    m_lo = m_tile * TOKENS
    if m_lo >= n_q:
        return
    k_start = tl.load(cu_k_ptr + seq).to(tl.int32)
    n_k = tl.load(cu_k_ptr + seq + 1).to(tl.int32) - k_start
    causal_end = n_k - n_q

    offs_r = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    tokens = m_lo + offs_r // HEADS_PER_PROGRAM
    heads = tl.program_id(0) * HEADS_PER_PROGRAM + offs_r % HEADS_PER_PROGRAM
    kv_head = (tl.program_id(0) * HEADS_PER_PROGRAM) // GROUP
    row_valid = tokens < n_q
    q_rows = (q_start + tokens).to(tl.int64)
    q = tl.load(q_ptr + q_rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=row_valid[:, None], other=0.0)

    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    # Keys [0, full_end) are visible to every row of the tile (the first row sees causal_end + m_lo);
    # the walk ends at the last row's limit (the keys' end for a sequence's last tile).
    full_end = (causal_end + m_lo + 1) // BLOCK_N * BLOCK_N
    end = tl.minimum(causal_end + m_lo + TOKENS, n_k)
    k_col = kv_head * stride_kh
    v_col = kv_head * stride_vh
    acc, m, l = _attend_tiles(acc, m, l, q, k_ptr, v_ptr, k_start, k_col, v_col, stride_kt, stride_vt, tokens,
                              causal_end, n_k, 0, full_end, qk_scale, BLOCK_N, HEAD_DIM, False, PRECISION)
    acc, m, l = _attend_tiles(acc, m, l, q, k_ptr, v_ptr, k_start, k_col, v_col, stride_kt, stride_vt, tokens,
                              causal_end, n_k, full_end, end, qk_scale, BLOCK_N, HEAD_DIM, True, PRECISION)
    out = acc / l[:, None]                     # every stored row saw key 0 at least: l > 0
    o_rows = (q_start + tokens).to(tl.int64)
    tl.store(out_ptr + o_rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


def tiles_head_dim(head_dim: int) -> bool:
    """Can the kernel take this head size? Its tiles need a power of two, at least 16 (tl.dot's minimum)."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
           cu_seqlens_k: torch.Tensor, block_m: int, block_n: int, group_heads: bool) -> None:
    """Shapes, dtypes and tile sizes the kernel can take; a ValueError naming what is off otherwise."""
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [tokens, heads, head_dim], got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"k and v must share one shape and q its head_dim, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    head_dim, q_heads, kv_heads = q.shape[2], q.shape[1], k.shape[1]
    if not tiles_head_dim(head_dim):
        raise ValueError(f"head_dim must be a power of two >= 16 (the kernel's tiles), got {head_dim}")
    if kv_heads == 0 or q_heads % kv_heads:
        raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one of float16/bfloat16/float32, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1:
        raise ValueError("each head of q, k, v must be contiguous (stride 1 in the last dim)")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dim() != 1 or cu.dtype not in (torch.int32, torch.int64) or cu.device != q.device:
            raise ValueError(f"{name} must be a 1-D int32/int64 tensor on {q.device}, got {cu.dim()}-D "
                             f"{cu.dtype} on {cu.device}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape or len(cu_seqlens_q) < 1:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both hold num_seqs + 1 sums, got "
                         f"{len(cu_seqlens_q)} and {len(cu_seqlens_k)}")
    for name, size in (("block_m", block_m), ("block_n", block_n)):
        if size < 16 or size & (size - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {size}")
    group = q_heads // kv_heads
    if group_heads and block_m % group:
        raise ValueError(f"group_heads needs block_m ({block_m}) to be a multiple of the group ({group})")


def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, max_seqlen_q: int, scale: float, *, block_m: int = 128,
                      block_n: int = 64, num_warps: int = 8, num_stages: int = 2,
                      group_heads: bool = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal varlen attention, end-aligned: FlashAttention-2's varlen forward with causal=True.

    q [total_q, q_heads, head_dim]; k, v [total_k, kv_heads, head_dim] (views with any token and
    head strides, e.g. slices of one qkv tensor; each head contiguous); cu_seqlens_q / _k
    [num_seqs + 1] int32 or int64 running sums from 0, with n_k >= n_q for every sequence and
    `max_seqlen_q` at least the longest n_q (it sizes the grid; it is not checked, since reading
    the sums would wait for the GPU). Query head h reads KV head h // (q_heads // kv_heads).
    Returns [total_q, q_heads, head_dim] in q's dtype; rows that no sequence covers (past
    cu_seqlens_q[-1]) are left unwritten. `group_heads`: one program takes every query head of
    one KV head (block_m rows = block_m // group tokens x group heads). `out`: a contiguous
    tensor of q's shape and dtype to write into (and return) instead of a new one.
    """
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k, block_m, block_n, group_heads)
    total_q, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = q_heads // kv_heads
    if out is None:
        out = torch.empty(total_q, q_heads, head_dim, dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {q.dtype} tensor of q's shape {tuple(q.shape)} on {q.device}, "
                         f"got {out.dtype} {tuple(out.shape)} on {out.device}")
    num_seqs = len(cu_seqlens_q) - 1
    heads_per_program = group if group_heads else 1
    tokens_per_program = block_m // heads_per_program
    if num_seqs == 0 or max_seqlen_q <= 0 or total_q == 0:
        return out
    # fp32 uses exact (IEEE) dot products so the kernel can be checked against an fp32 oracle.
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    grid = (q_heads // heads_per_program, num_seqs, triton.cdiv(max_seqlen_q, tokens_per_program))
    _prefill_attention_kernel[grid](
        q, k, v, out, cu_seqlens_q, cu_seqlens_k, scale * LOG2_E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        GROUP=group, HEADS_PER_PROGRAM=heads_per_program, TOKENS=tokens_per_program, HEAD_DIM=head_dim,
        BLOCK_M=block_m, BLOCK_N=block_n, PRECISION=precision, num_warps=num_warps, num_stages=num_stages)
    return out
