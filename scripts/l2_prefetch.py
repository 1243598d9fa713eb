"""A probe's kernel: start pulling a weight into the GPU's L2 cache, so the GEMM that reads it next finds part of it there.

Not part of the engine: measured on 2 H200s it made a TP=2 decode step slower, not faster
(docs/performance.md, the fourth stop's calls 1-6: "Prefetching the next GEMM's weight into L2").
The idea, for the record:

Why: under tensor parallelism a decode step all-reduces twice per layer,
and while the one-shot all-reduce runs (reference/kernels/all_reduce.py:
~10 µs at batch 64, mostly waiting for NVLink and for the other GPU) the
GPU's memory bandwidth sits idle. The GEMM after it is bound by that very
bandwidth: it streams its weight from HBM once. Prefetching the weight's
first bytes during the all-reduce moves part of that stream into time
that was idle, and the GEMM then reads those bytes from L2 (50 MB on an
H100). One GPU has no such idle time to fill, so only TP uses this.

The prefetch is a hint: `cp.async.bulk.prefetch.L2` (Hopper's bulk copy
engine) asks for a range to be brought into L2 and does not wait for it;
nothing reads the result, and a line evicted before the GEMM reaches it
costs only the bandwidth it took. Correctness never depends on it.

Modes, measured against each other by scripts/gpu_tp.py's `allreduce` part:
"bulk" (the bulk prefetch, one instruction per 16 KiB), "line"
(`prefetch.global.L2::evict_last` per 128-byte line) and "load" (plain
loads with an evict-last hint, the result discarded).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 16 * 1024       # bytes per bulk prefetch instruction
LANES = 32              # chunk starts a program takes per round (one warp)


@triton.jit
def _bulk_prefetch_kernel(base, nbytes, CHUNK: tl.constexpr, LANES: tl.constexpr):
    """Prefetch [base, base + nbytes) into L2, CHUNK bytes per instruction; nbytes is a multiple of CHUNK."""
    lanes = tl.arange(0, LANES).to(tl.int64)
    for start in range(tl.program_id(0) * LANES * CHUNK, nbytes, tl.num_programs(0) * LANES * CHUNK):
        offs = tl.minimum(start + lanes * CHUNK, nbytes - CHUNK)   # lanes past the end repeat the last chunk
        tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                                  [base + offs, tl.full([LANES], CHUNK, tl.int32)], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _line_prefetch_kernel(base, nbytes, LANES: tl.constexpr):
    """Prefetch [base, base + nbytes) into L2, one 128-byte line per instruction, marked evict-last."""
    lanes = tl.arange(0, LANES).to(tl.int64)
    for start in range(tl.program_id(0) * LANES * 128, nbytes, tl.num_programs(0) * LANES * 128):
        offs = tl.minimum(start + lanes * 128, nbytes - 128)
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l",
                                  [base + offs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _load_prefetch_kernel(w_ptr, n, sink_ptr, BLOCK: tl.constexpr):
    """Load w[0:n] with an evict-last hint; the sum is stored only if it is NaN-free and exactly -0.5e-30
    (never, in practice), which keeps the loads from being optimized away."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    lanes = tl.arange(0, BLOCK)
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        acc += tl.load(w_ptr + start + lanes, mask=start + lanes < n, other=0.0,
                       eviction_policy="evict_last").to(tl.float32)
    total = tl.sum(acc, axis=0)
    tl.store(sink_ptr + tl.program_id(0), total, mask=total == -0.5e-30)


def prefetch_to_l2(weight: torch.Tensor, nbytes: int, mode: str = "bulk", programs: int = 32) -> None:
    """Ask for weight's first `nbytes` bytes (rounded down to whole chunks, at most all of it) to be in L2.

    `weight` must be contiguous on a CUDA device; nothing is returned and nothing waits.
    """
    if not (weight.is_cuda and weight.is_contiguous()):
        raise ValueError("prefetch_to_l2: needs a contiguous CUDA tensor")
    total = weight.numel() * weight.element_size()
    if mode == "bulk":
        size = min(nbytes, total) // CHUNK * CHUNK
        if size:
            _bulk_prefetch_kernel[(programs,)](weight.data_ptr(), size, CHUNK=CHUNK, LANES=LANES, num_warps=1)
    elif mode == "line":
        size = min(nbytes, total) // 128 * 128
        if size:
            _line_prefetch_kernel[(programs,)](weight.data_ptr(), size, LANES=128, num_warps=4)
    elif mode == "load":
        n = min(nbytes, total) // weight.element_size()
        if n:
            sink = torch.empty(programs, dtype=torch.float32, device=weight.device)
            _load_prefetch_kernel[(programs,)](weight.view(-1), n, sink, BLOCK=1024, num_warps=4)
    else:
        raise ValueError(f"prefetch_to_l2: unknown mode {mode!r} (bulk, line or load)")
