"""A one-shot all-reduce for small messages: every rank writes its part into every other rank's memory.

NCCL's all-reduce is built for bandwidth: a ring or tree of steps, each a
handshake between neighbours. A decode step all-reduces a few hundred KiB
twice per layer, where what counts is latency, not bandwidth. With every GPU
able to reach every other GPU's memory (CUDA IPC, peer access over NVLink),
one kernel does it in one round (as vLLM's custom all-reduce does):

    1. write my x into my slot of every peer's buffer           (remote stores)
    2. tell every peer "my data for call e is there"             (a flag in the peer's memory)
    3. wait until every peer told me the same                    (spin on my own flags)
    4. out = sum over ranks 0..N-1 of their parts, in fp32       (local reads only)
       (+ the residual stream, when given: the add that ends a transformer block)
       (+ the RMSNorm that follows that add, in `one_shot_all_reduce_norm`: a program per row)

Push, not pull: a remote store is posted and forgotten, where a remote load
waits a round trip over NVLink; a first version that read the peers' buffers
ran at about 40 GB/s (docs/performance.md). Each rank sums in the same order
(rank 0 first), so all ranks get the same bits, which tensor parallelism
needs: each continues from its own copy. With a residual the sum is rounded
to the dtype first and then added in fp32 and rounded again, which is what
`residual + all_reduce(x)` computes, bit for bit.

The handshake must work inside a CUDA graph, where a kernel's arguments are
frozen: the call number e lives in device memory (`epochs`, one counter per
program, bumped by the kernel itself). Flags only grow, so nothing is ever
reset. Two sets of slots alternate (by e's parity): a rank may write call
e+1 while a slow peer still reads call e; by call e+2 that peer has finished
call e (it has started e+1, and one stream runs one kernel after the other,
so all of its call e is done). Flags and call numbers are kept per program,
and program p of one rank waits only for program p of the others: so every
call, of either kernel, runs the same grid (`programs`), whatever the size;
how a call shares its elements among the programs may differ (chunks of
BLOCK, or rows when it normalizes them).

Why a flag, when the data could be its own flag (an empty slot holds -0.0
and a reader polls the elements until none is -0.0, TensorRT-LLM's
"Lamport" all-reduce, one trip over NVLink instead of about three): measured,
that kernel took 4.4 against 7.2 us at 64 tokens, but in the engine both
ranks sometimes waited at the same warm-up call for parts that never came,
and the cause was not found (docs/performance.md, the seventh stop). A
wrong all-reduce is worse than a slow one.

Fusing the norm saves a launch and a pass over the stream per all-reduce
(73 of each per decode step of Qwen3-8B). Its price: the norm's sum of
squares is reduced in another order than the compiled norm's, so in bf16 a
normed value may differ from the unfused path's by a rounding.

A peer that never comes (it died) would hang the GPU: each wait gives up
after `WAIT_S` seconds by the GPU's clock and raises `error[0]`, and once it
is raised no call waits again (a graph holds dozens of these calls); the
results are then garbage, and the host finds the dead worker before the next
step. The limit is in seconds, not in polls, because a poll's cost varies
with the GPU and the kernel. Under the Triton interpreter, which cannot run
inline PTX, a wait counts polls instead.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# The plain kernel's launch: 8 warps of 8 elements per thread. At a decode step of 256 tokens each program
# loops over several chunks, waiting for memory in turn, and 8 warps keep more loads in flight than 4; at
# 64 tokens 8 are as fast or faster (the sweep in scripts/gpu_tp.py; figures in docs/performance.md).
BLOCK, WARPS = 2048, 8
WAIT_S = 30.0    # a wait gives up after this long: far beyond a live peer's lag (it may be compiling a kernel)
_PTX = os.environ.get("TRITON_INTERPRET") != "1"      # inline PTX runs (read as triton.jit reads it: at import)


@triton.jit
def _clock(PTX: tl.constexpr):
    """The GPU's global timer in ns; 0 where inline PTX cannot run (the interpreter)."""
    if PTX:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    else:
        return tl.zeros([], dtype=tl.int64)


@triton.jit
def _buffer(addrs_ptr, r, flag_bytes, dtype: tl.constexpr):
    """Rank r's slots, as a pointer to dtype, said to be 16-byte aligned (a driver allocation and the flags'
    256-byte area are): loads and stores through it then move 16 bytes at a time, as they do through a tensor
    argument, instead of one element (2 bytes in bf16) at a time."""
    return tl.multiple_of((tl.load(addrs_ptr + r) + flag_bytes).to(tl.pointer_type(dtype)), 16)


@triton.jit
def _push_and_wait(x_ptr, n, addrs_ptr, epochs_ptr, error_ptr, rank, flag_bytes, slot_elems, WIDTH: tl.constexpr,
                   WORLD: tl.constexpr, BLOCK: tl.constexpr, LIMIT: tl.constexpr, PTX: tl.constexpr):
    """Steps 1-3 for this program's share of x; returns the base of this call's slots in my own buffer.

    The share: x's pieces of WIDTH elements (WIDTH <= BLOCK) number pid, pid + programs, ...:
    chunks of BLOCK for the plain all-reduce, rows for the one that normalizes rows.
    """
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    dtype = x_ptr.dtype.element_ty
    epoch = tl.load(epochs_ptr + pid) + 1
    tl.store(epochs_ptr + pid, epoch)
    first_slot = (epoch % 2) * WORLD          # this call's set of slots: [parity][source rank]
    lanes = tl.arange(0, BLOCK)
    for p in tl.static_range(WORLD):                                # 1. my x into my slot of each peer
        if p != rank:
            peer_slot = _buffer(addrs_ptr, p, flag_bytes, dtype) + (first_slot + rank) * slot_elems
            for start in range(pid * WIDTH, n, programs * WIDTH):
                idx = start + lanes
                mask = (idx < n) & (lanes < WIDTH)
                tl.store(peer_slot + idx, tl.load(x_ptr + idx, mask=mask), mask=mask)
    tl.debug_barrier()
    for p in tl.static_range(WORLD):                                # 2. my flag in each peer's memory
        if p != rank:
            peer_flags = tl.load(addrs_ptr + p).to(tl.pointer_type(tl.int32))
            tl.atomic_xchg(peer_flags + rank * programs + pid, epoch, sem="release", scope="sys")
    own = tl.load(addrs_ptr + rank)
    own_flags = own.to(tl.pointer_type(tl.int32))
    for p in tl.static_range(WORLD):                                # 3. every peer's flag in mine
        if p != rank:
            start = _clock(PTX)
            waited = tl.where(tl.atomic_add(error_ptr, 0) == 0, 0, LIMIT).to(tl.int64)   # given up before: no wait
            while (tl.atomic_add(own_flags + p * programs + pid, 0, sem="acquire", scope="sys") < epoch) \
                    & (waited < LIMIT):
                if PTX:
                    waited = _clock(PTX) - start
                else:
                    waited += 1
            if waited >= LIMIT:
                tl.atomic_xchg(error_ptr, 1)
    tl.debug_barrier()
    return _buffer(addrs_ptr, rank, flag_bytes, dtype) + first_slot * slot_elems


@triton.jit
def _sum_of_parts(x_ptr, slots, idx, mask, rank, slot_elems, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """Sum over the ranks of their parts at idx, in fp32, rank 0 first (every rank adds in the same order)."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(WORLD):
        if p == rank:
            part = tl.load(x_ptr + idx, mask=mask, other=0.0)
        else:
            part = tl.load(slots + p * slot_elems + idx, mask=mask, other=0.0, cache_modifier=".cg")
        acc += part.to(tl.float32)
    return acc


@triton.jit
def _one_shot_all_reduce_kernel(x_ptr, residual_ptr, out_ptr, n, addrs_ptr, epochs_ptr, error_ptr, rank, flag_bytes,
                                slot_elems, WORLD: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
                                LIMIT: tl.constexpr, PTX: tl.constexpr):
    slots = _push_and_wait(x_ptr, n, addrs_ptr, epochs_ptr, error_ptr, rank, flag_bytes, slot_elems, BLOCK, WORLD, BLOCK,
                           LIMIT, PTX)
    dtype = x_ptr.dtype.element_ty
    lanes = tl.arange(0, BLOCK)
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):   # 4. the sum, all local
        idx = start + lanes
        y = _sum_of_parts(x_ptr, slots, idx, idx < n, rank, slot_elems, WORLD, BLOCK).to(dtype)
        if HAS_RESIDUAL:
            y = (y.to(tl.float32) + tl.load(residual_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)).to(dtype)
        tl.store(out_ptr + idx, y, mask=idx < n)


@triton.jit
def _one_shot_all_reduce_norm_kernel(x_ptr, residual_ptr, normed_ptr, weight_ptr, eps, n, addrs_ptr, epochs_ptr,
                                     error_ptr, rank, flag_bytes, slot_elems, HIDDEN: tl.constexpr,
                                     WORLD: tl.constexpr, BLOCK: tl.constexpr, LIMIT: tl.constexpr, PTX: tl.constexpr):
    """residual += sum of x over the ranks; normed = RMSNorm(residual) * weight: a program per row."""
    slots = _push_and_wait(x_ptr, n, addrs_ptr, epochs_ptr, error_ptr, rank, flag_bytes, slot_elems, HIDDEN, WORLD,
                           BLOCK, LIMIT, PTX)
    dtype = x_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    in_row = cols < HIDDEN
    weight = tl.load(weight_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    for start in range(tl.program_id(0) * HIDDEN, n, tl.num_programs(0) * HIDDEN):   # 4. per row, all local
        idx = start + cols
        y = _sum_of_parts(x_ptr, slots, idx, in_row, rank, slot_elems, WORLD, BLOCK).to(dtype)
        stream = (y.to(tl.float32) + tl.load(residual_ptr + idx, mask=in_row, other=0.0).to(tl.float32)).to(dtype)
        tl.store(residual_ptr + idx, stream, mask=in_row)
        s = stream.to(tl.float32)                  # RMSNorm as reference.models.qwen3.rms_norm orders it:
        scaled = (s * tl.rsqrt(tl.sum(s * s, axis=0) / HIDDEN + eps)).to(dtype)   # normalize in fp32, round,
        tl.store(normed_ptr + idx, (weight * scaled.to(tl.float32)).to(dtype), mask=in_row)   # then scale


def _wait_limit(wait_s: float) -> dict:
    """The kernels' LIMIT and PTX for a wait of wait_s: ns by the GPU's clock, or under the Triton interpreter
    (no clock) one poll per millisecond."""
    return {"LIMIT": round(wait_s * 1e9), "PTX": True} if _PTX else {"LIMIT": max(1, round(wait_s * 1e3)),
                                                                         "PTX": False}


def buffer_bytes(world: int, max_bytes: int, flag_bytes: int) -> int:
    """One rank's buffer: the flags, then two sets (by parity) of one slot per rank."""
    return flag_bytes + 2 * world * max_bytes


def one_shot_all_reduce(x: torch.Tensor, addrs: torch.Tensor, epochs: torch.Tensor, error: torch.Tensor,
                        rank: int, world: int, flag_bytes: int, max_bytes: int, residual: torch.Tensor | None = None,
                        wait_s: float = WAIT_S, shape: tuple[int, int] | None = None) -> torch.Tensor:
    """Sum of x over the ranks (+ residual), written into residual if given, else into x; returns it.

    `addrs[r]`: rank r's buffer (`buffer_bytes`); each slot holds `max_bytes`.
    `shape`: (BLOCK, num_warps), by default (BLOCK, WARPS) (a probe may try others).
    """
    out = x if residual is None else residual
    programs = epochs.numel()
    block, warps = shape or (BLOCK, WARPS)
    _one_shot_all_reduce_kernel[(programs,)](x, out, out, x.numel(), addrs, epochs, error, rank, flag_bytes,
                                             max_bytes // x.element_size(), WORLD=world,
                                             HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=warps,
                                             **_wait_limit(wait_s))
    return out


def one_shot_all_reduce_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                             addrs: torch.Tensor, epochs: torch.Tensor, error: torch.Tensor, rank: int, world: int,
                             flag_bytes: int, max_bytes: int, wait_s: float = WAIT_S,
                             warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(stream, normed): stream = residual + sum of x over the ranks (written into residual),
    normed = rms_norm(stream) * weight, for x and residual of [rows, hidden].

    `warps`: by default ~8 values of a row per thread, 4 to 16 warps (a probe may try others).
    """
    hidden = x.shape[-1]
    block = triton.next_power_of_2(hidden)
    normed = torch.empty_like(x)
    _one_shot_all_reduce_norm_kernel[(epochs.numel(),)](
        x, residual, normed, weight, eps, x.numel(), addrs, epochs, error, rank, flag_bytes,
        max_bytes // x.element_size(), HIDDEN=hidden, WORLD=world, BLOCK=block,
        num_warps=warps or max(4, min(16, block // 256)), **_wait_limit(wait_s))
    return residual, normed
