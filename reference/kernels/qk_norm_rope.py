"""Qwen3's q/k RMSNorm and RoPE in one kernel launch (one program per token).

torch.compile turns `qwen3.qk_norm_rope` into two kernels, one for q and one
for k, each a looped reduction that reads the rotated half through a `cat`.
In a decode step each launch costs about what its work does, so this kernel
does both in one: a program loads its token's q heads and k heads as
[heads, head_dim / 2] tiles, one per half, so the rotation needs no gather.

The arithmetic follows `qwen3.rms_norm` then `qwen3.apply_rope`: the norm in
fp32, rounded to the input dtype before the weight multiplies it (as
transformers does), the rest in fp32 and rounded once when stored.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _norm_rope_heads(x_ptr, stride_t, stride_h, w_ptr, out_ptr, token, cos1, cos2, sin1, sin2, eps,
                     NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr,
                     BLOCK_HALF: tl.constexpr):
    """One token's NUM_HEADS heads of x: RMSNorm over the head, then rotate each (first, second) half pair."""
    heads = tl.arange(0, BLOCK_HEADS)
    offs = tl.arange(0, BLOCK_HALF)
    mask = (heads[:, None] < NUM_HEADS) & (offs[None, :] < HALF)
    row = x_ptr + token.to(tl.int64) * stride_t + heads[:, None] * stride_h + offs[None, :]
    x1 = tl.load(row, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + HALF, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)
    dtype = out_ptr.dtype.element_ty
    w1 = tl.load(w_ptr + offs, mask=offs < HALF, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + HALF + offs, mask=offs < HALF, other=0.0).to(tl.float32)
    y1 = w1[None, :] * (x1 * inv_rms[:, None]).to(dtype).to(tl.float32)
    y2 = w2[None, :] * (x2 * inv_rms[:, None]).to(dtype).to(tl.float32)
    out = out_ptr + token.to(tl.int64) * NUM_HEADS * 2 * HALF + heads[:, None] * 2 * HALF + offs[None, :]
    tl.store(out, (y1 * cos1[None, :] - y2 * sin1[None, :]).to(dtype), mask=mask)
    tl.store(out + HALF, (y2 * cos2[None, :] + y1 * sin2[None, :]).to(dtype), mask=mask)


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, q_weight_ptr, k_weight_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_ct, stride_st, eps,
                         Q_HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr,
                         BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_HALF: tl.constexpr):
    token = tl.program_id(0)
    offs = tl.arange(0, BLOCK_HALF)
    in_half = offs < HALF
    cos_row = cos_ptr + token.to(tl.int64) * stride_ct
    sin_row = sin_ptr + token.to(tl.int64) * stride_st
    cos1 = tl.load(cos_row + offs, mask=in_half, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_row + HALF + offs, mask=in_half, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_row + offs, mask=in_half, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_row + HALF + offs, mask=in_half, other=0.0).to(tl.float32)
    _norm_rope_heads(q_ptr, stride_qt, stride_qh, q_weight_ptr, q_out_ptr, token, cos1, cos2, sin1, sin2, eps,
                     Q_HEADS, HALF, BLOCK_Q, BLOCK_HALF)
    _norm_rope_heads(k_ptr, stride_kt, stride_kh, k_weight_ptr, k_out_ptr, token, cos1, cos2, sin1, sin2, eps,
                     KV_HEADS, HALF, BLOCK_K, BLOCK_HALF)


def qk_norm_rope_triton(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                        eps: float, cos: torch.Tensor, sin: torch.Tensor,
                        out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`qwen3.qk_norm_rope` for q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim].

    q and k may be views into one qkv row (any token and head strides); each
    head's values must be contiguous, and so must each row of cos and sin.
    Returns new contiguous tensors, or `out` (q_out, k_out: contiguous, q's and k's shapes) written.
    """
    tokens, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if head_dim % 2 or q.stride(2) != 1 or k.stride(2) != 1 or cos.stride(1) != 1 or sin.stride(1) != 1:
        raise ValueError("qk_norm_rope_triton needs an even head_dim and contiguous heads, cos and sin rows")
    if out is None:
        q_out = torch.empty(tokens, q_heads, head_dim, dtype=q.dtype, device=q.device)
        k_out = torch.empty(tokens, kv_heads, head_dim, dtype=k.dtype, device=k.device)
    else:
        q_out, k_out = out
        if q_out.shape != q.shape or k_out.shape != k.shape or not (q_out.is_contiguous() and k_out.is_contiguous()):
            raise ValueError(f"out must be contiguous tensors of q's and k's shapes {tuple(q.shape)}, "
                             f"{tuple(k.shape)}, got {tuple(q_out.shape)}, {tuple(k_out.shape)}")
    if tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    _qk_norm_rope_kernel[(tokens,)](
        q, k, q_weight, k_weight, cos, sin, q_out, k_out, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        cos.stride(0), sin.stride(0), eps, Q_HEADS=q_heads, KV_HEADS=kv_heads, HALF=half,
        BLOCK_Q=triton.next_power_of_2(q_heads), BLOCK_K=triton.next_power_of_2(kv_heads),
        BLOCK_HALF=triton.next_power_of_2(half), num_warps=4)
    return q_out, k_out
