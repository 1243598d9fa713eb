"""y = x W^T for a decode batch (few rows, M <= 256), with split-K.

A decode step multiplies a few hundred rows of activations by each layer's
weights. With cuBLAS's large output tiles, a projection to N = 1024 features
at M = 256 has only ~16 tiles for 132 multiprocessors: most of the chip idles
while the weights stream through the few that work. This kernel takes smaller
tiles and, optionally, splits the K (input-feature) loop over SPLIT_K programs
per tile, so that tiles x splits fill the chip and every multiprocessor reads
its share of the weights at once.

Split-K needs a sum over the K slices. Each slice writes its fp32 partial tile
to a workspace; the program that finishes a tile last (an atomic arrival
counter per tile) sums the slices and writes the output, then resets the
counter to zero for the next call ("fixup" in one launch: a second reduction
kernel would cost a launch per GEMM, ~112 of them per decode step). The
counters live in one zeroed buffer per device, allocated outside any CUDA
graph capture; calls on one stream run one after another, so they can share it.

The price: the sum over K is taken in another order than cuBLAS's, so bf16
outputs differ from F.linear's by rounding (within bf16 tolerance), and
a fp32 input uses exact fp32 products ("ieee"), slower than tf32 but the same
function. Which configuration a batch gets is `GemmConfig` from a rule measured
on the GPU (reference.layers.decode_gemm_rule).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Arrival counters per device; a tile id indexes one. Large enough for any grid the rule picks.
MAX_TILES = 1 << 16
_COUNTERS: dict[torch.device, torch.Tensor] = {}


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and K split of one decode GEMM launch."""
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@triton.jit(do_not_specialize=["M"])   # one compile serves every batch bucket
def _decode_gemm_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, count_ptr, M, N, K_SPLIT, stride_xm, stride_wn, stride_ym,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SPLIT: tl.constexpr, PRECISION: tl.constexpr):
    """Program (n, m, s): output tile (m, n) over K slice s; with SPLIT, the last slice to arrive sums them."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * K_SPLIT + tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for _ in range(0, K_SPLIT, BLOCK_K):
        a = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
        b = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    mask = m_mask[:, None] & n_mask[None, :]
    y_offs = offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    if SPLIT:
        splits = tl.num_programs(2)
        tile_offs = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k * M * N + tile_offs, acc, mask=mask)
        tl.debug_barrier()   # every thread's partial is stored before the arrival is counted
        tile = pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == splits - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(0, splits):
                total += tl.load(ws_ptr + s * M * N + tile_offs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + y_offs, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(y_ptr + y_offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _counters(device: torch.device) -> torch.Tensor:
    counters = _COUNTERS.get(device)
    if counters is None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("decode_linear: the split-K counters must be allocated before a CUDA graph capture; "
                               "run the GEMM once eagerly first")
        counters = _COUNTERS[device] = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
    return counters


def check_config(config: GemmConfig, m: int, n: int, k: int) -> None:
    """Raise ValueError unless `config` can run an [m, k] x [n, k]^T product exactly."""
    if k % (config.split_k * config.block_k):
        raise ValueError(f"decode_linear: K={k} is not a multiple of split_k * block_k = "
                         f"{config.split_k} * {config.block_k}")
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    if config.split_k > 1 and tiles > MAX_TILES:
        raise ValueError(f"decode_linear: {tiles} output tiles exceed the {MAX_TILES} split-K counters")


def decode_linear(x: torch.Tensor, weight: torch.Tensor, config: GemmConfig) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T -> [M, N] in x's dtype, both with unit stride along K."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"decode_linear: shapes {tuple(x.shape)} and {tuple(weight.shape)} do not multiply")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("decode_linear: x and weight need unit stride along K")
    m, k = x.shape
    n = weight.shape[0]
    check_config(config, m, n, k)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    split = config.split_k > 1
    ws = torch.empty((config.split_k, m, n), dtype=torch.float32, device=x.device) if split else y
    counters = _counters(x.device) if split else y
    grid = (triton.cdiv(n, config.block_n), triton.cdiv(m, config.block_m), config.split_k)
    _decode_gemm_kernel[grid](x, weight, y, ws, counters, m, n, k // config.split_k, x.stride(0), weight.stride(0),
                              y.stride(0), BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                              SPLIT=split, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                              num_warps=config.num_warps, num_stages=config.num_stages)
    return y
