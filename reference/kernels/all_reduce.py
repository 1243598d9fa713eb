"""A one-shot all-reduce for small messages: every rank writes its part into every other rank's memory.

NCCL's all-reduce is built for bandwidth: a ring or tree of steps, each a
handshake between neighbours. A decode step all-reduces a few hundred KiB
twice per layer, where what counts is latency, not bandwidth. With every GPU
able to reach every other GPU's memory (CUDA IPC, peer access over NVLink),
one kernel does it in one round (as vLLM's custom all-reduce does):

    1. write my x into my slot of every peer's buffer           (remote stores)
    2. wait until every peer's part is in my buffer              (polling the data itself; see below)
    3. out = sum over ranks 0..N-1 of their parts, in fp32       (local reads only)
       (+ the residual stream, when given: the add that ends a transformer block)
       (+ the RMSNorm that follows that add, in `one_shot_all_reduce_norm`: a program per row)
    4. reset what I read to "empty", for the call after next    (local stores)

Push, not pull: a remote store is posted and forgotten, where a remote load
waits a round trip over NVLink (a first version that read the peers' buffers
was several times slower: docs/performance.md). Each rank sums in the same
order (rank 0 first), so all ranks get the same bits, which tensor
parallelism needs: each continues from its own copy. With a residual the sum
is rounded to the dtype first and then added in fp32 and rounded again,
which is what `residual + all_reduce(x)` computes, bit for bit.

The data is its own flag (the "Lamport" scheme of TensorRT-LLM's
all-reduce): an empty slot holds a value no part ever has, -0.0 (the sign
bit alone), and a reader polls each element until it is no longer that.
Parts are sent with -0.0 made +0.0, which changes no sum (the fp32
accumulator starts at +0.0, and +0.0 + -0.0 is +0.0). The earlier version
wrote the data, then a flag, and the reader spun on the flag; to be sure
the data had landed before the flag, the writer had to wait for its stores
to be acknowledged (a release fence over the system), so a call paid about
three trips over NVLink where this pays one. The price: every element is
read until it has come, and written back to "empty" after use.

The handshake must work inside a CUDA graph, where a kernel's arguments are
frozen: the call number e lives in device memory (`epochs`, one counter per
program, bumped by the kernel itself). Two sets of slots alternate (by e's
parity): a peer may write call e+1 while I still read call e. It cannot
write call e+2 (into the set I am reading) before it has my part of call
e+1, which I send only after my call e, reset included, has finished (one
stream runs one kernel after the other). Every call, of either kernel, runs
the same grid (`programs`), so that the programs' call numbers stay equal;
how a call shares its elements among the programs may differ (chunks of
BLOCK, or rows when it normalizes them), since a reader waits for data, not
for a particular writer.

Every warp of a program must see the same call number, so the bump waits
at a barrier between the read and the write. Without it a warp that started
late read the number its program had already bumped, and pushed and polled
the other parity's slots: its peer waited for a part that had gone to the
wrong set, and both ranks gave up at once. It happened rarely, in the
engine's eager warm-up, never in the tests that replayed graphs
(docs/performance.md, the eighth stop). The flag version raced the same way.

Fusing the norm saves a launch and a pass over the stream per all-reduce
(73 of each per decode step of Qwen3-8B). Its price: the norm's sum of
squares is reduced in another order than the compiled norm's, so in bf16 a
normed value may differ from the unfused path's by a rounding.

A peer that never comes (it died) would hang the GPU: each wait gives up
after `WAIT_S` seconds by the GPU's clock and raises `error[0]`, and once it
is raised no call waits again (a graph holds dozens of these calls); the
results are then garbage, and the host finds the dead worker before the next
step. The limit is in seconds, not in polls, because a poll's cost varies
with the chunk and the GPU. Under the Triton interpreter, which cannot read
the GPU's clock, a wait counts polls instead.
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
_PTX = os.environ.get("TRITON_INTERPRET") != "1"      # read as triton.jit reads it: once, at import
_BITS = {2: tl.int16, 4: tl.int32}      # an element's bits, by its size in bytes


def empty_value(element_size: int) -> int:
    """An empty slot's element, as an integer of the element's width: the sign bit alone (-0.0)."""
    return -(1 << (8 * element_size - 1))


@triton.jit
def _buffer(addrs_ptr, r, BITS: tl.constexpr):
    """Rank r's buffer, as a pointer to elements of BITS, said to be 16-byte aligned (a driver allocation is):
    loads and stores from it then go 16 bytes at a time, as they do from a tensor argument."""
    return tl.multiple_of(tl.load(addrs_ptr + r).to(tl.pointer_type(BITS)), 16)


@triton.jit
def _push(x_ptr, n, addrs_ptr, rank, first_slot, slot_elems, BITS: tl.constexpr, EMPTY: tl.constexpr,
          WIDTH: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """Step 1 for this program's share of x: pieces of WIDTH elements (WIDTH <= BLOCK) numbered pid,
    pid + programs, ...: chunks of BLOCK for the plain all-reduce, rows for the one that normalizes rows."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    for p in tl.static_range(WORLD):
        if p != rank:
            peer_slot = _buffer(addrs_ptr, p, BITS) + (first_slot + rank) * slot_elems
            for start in range(pid * WIDTH, n, programs * WIDTH):
                idx = start + lanes
                mask = (idx < n) & (lanes < WIDTH)
                bits = tl.load(x_ptr + idx, mask=mask).to(BITS, bitcast=True)
                tl.store(peer_slot + idx, tl.where(bits == EMPTY, 0, bits), mask=mask)   # -0.0 goes as +0.0


@triton.jit
def _clock(PTX: tl.constexpr):
    """The GPU's global timer in ns; 0 where inline PTX cannot run (the interpreter)."""
    if PTX:
        return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    else:
        return tl.zeros([], dtype=tl.int64)


@triton.jit
def _arrived(ptr, mask, error_ptr, EMPTY: tl.constexpr, LIMIT: tl.constexpr, PTX: tl.constexpr):
    """The elements at ptr once none is empty (masked lanes read as 0). Gives up after LIMIT: ns by the GPU's
    clock, or polls where there is no clock.

    Every thread reads the clock (and the error flag) for itself, so whether to stop goes through the same
    block-wide max as whether anything is pending: each thread offers pending + 2 * stop, and the loop goes
    on while the max is 1 (something pending, nobody told to stop). All warps then leave at the same poll;
    a warp that left one poll early would meet the others' next barrier at a different one.
    """
    bits = tl.load(ptr, mask=mask, other=0, volatile=True)
    state = tl.max((bits == EMPTY).to(tl.int32), axis=0)
    if state > 0:
        start = _clock(PTX)
        stop = (tl.load(error_ptr, volatile=True) != 0).to(tl.int32)     # given up before: no wait
        state = tl.max((bits == EMPTY).to(tl.int32) + 2 * stop, axis=0)
        polls = 0
        while state == 1:
            bits = tl.load(ptr, mask=mask, other=0, volatile=True)
            polls += 1
            if PTX:
                stop = (_clock(PTX) - start >= LIMIT).to(tl.int32)
            else:
                stop = (polls >= LIMIT).to(tl.int32)
            state = tl.max((bits == EMPTY).to(tl.int32) + 2 * stop, axis=0)
        if state > 1:        # told to stop: an error if anything is still missing
            if tl.max((bits == EMPTY).to(tl.int32), axis=0) > 0:
                tl.atomic_xchg(error_ptr, 1)
    return bits


@triton.jit
def _sum_of_parts(x_ptr, slots, idx, mask, error_ptr, rank, slot_elems, EMPTY: tl.constexpr, WORLD: tl.constexpr,
                  BLOCK: tl.constexpr, LIMIT: tl.constexpr, PTX: tl.constexpr):
    """Steps 2-4 at idx: sum over the ranks of their parts, in fp32, rank 0 first (every rank adds in the same
    order), each peer's part waited for, then its slot emptied."""
    dtype = x_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(WORLD):
        if p == rank:
            part = tl.load(x_ptr + idx, mask=mask, other=0.0)
        else:
            part = _arrived(slots + p * slot_elems + idx, mask, error_ptr, EMPTY, LIMIT, PTX).to(dtype, bitcast=True)
            tl.store(slots + p * slot_elems + idx, tl.full([BLOCK], EMPTY, slots.dtype.element_ty), mask=mask)
        acc += part.to(tl.float32)
    return acc


@triton.jit
def _next_call(epochs_ptr, addrs_ptr, rank, slot_elems, BITS: tl.constexpr, WORLD: tl.constexpr):
    """This program's call number bumped; returns (the first slot of this call's set, my buffer's slots)."""
    pid = tl.program_id(0)
    epoch = tl.load(epochs_ptr + pid) + 1
    tl.debug_barrier()      # every warp has read the old number before it changes (else a late warp sees e+1)
    tl.store(epochs_ptr + pid, epoch)
    first_slot = (epoch % 2) * WORLD          # this call's set of slots: [parity][source rank]
    return first_slot, _buffer(addrs_ptr, rank, BITS) + first_slot * slot_elems


@triton.jit
def _one_shot_all_reduce_kernel(x_ptr, residual_ptr, out_ptr, n, addrs_ptr, epochs_ptr, error_ptr, rank, slot_elems,
                                BITS: tl.constexpr, EMPTY: tl.constexpr, WORLD: tl.constexpr,
                                HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, LIMIT: tl.constexpr, PTX: tl.constexpr):
    first_slot, slots = _next_call(epochs_ptr, addrs_ptr, rank, slot_elems, BITS, WORLD)
    _push(x_ptr, n, addrs_ptr, rank, first_slot, slot_elems, BITS, EMPTY, BLOCK, WORLD, BLOCK)
    dtype = x_ptr.dtype.element_ty
    lanes = tl.arange(0, BLOCK)
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        idx = start + lanes
        y = _sum_of_parts(x_ptr, slots, idx, idx < n, error_ptr, rank, slot_elems, EMPTY, WORLD, BLOCK,
                          LIMIT, PTX).to(dtype)
        if HAS_RESIDUAL:
            y = (y.to(tl.float32) + tl.load(residual_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)).to(dtype)
        tl.store(out_ptr + idx, y, mask=idx < n)


@triton.jit
def _one_shot_all_reduce_norm_kernel(x_ptr, residual_ptr, normed_ptr, weight_ptr, eps, n, addrs_ptr, epochs_ptr,
                                     error_ptr, rank, slot_elems, BITS: tl.constexpr, EMPTY: tl.constexpr,
                                     HIDDEN: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr,
                                     LIMIT: tl.constexpr, PTX: tl.constexpr):
    """residual += sum of x over the ranks; normed = RMSNorm(residual) * weight: a program per row."""
    first_slot, slots = _next_call(epochs_ptr, addrs_ptr, rank, slot_elems, BITS, WORLD)
    _push(x_ptr, n, addrs_ptr, rank, first_slot, slot_elems, BITS, EMPTY, HIDDEN, WORLD, BLOCK)
    dtype = x_ptr.dtype.element_ty
    cols = tl.arange(0, BLOCK)
    in_row = cols < HIDDEN
    weight = tl.load(weight_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    for start in range(tl.program_id(0) * HIDDEN, n, tl.num_programs(0) * HIDDEN):   # per row, all local
        idx = start + cols
        y = _sum_of_parts(x_ptr, slots, idx, in_row, error_ptr, rank, slot_elems, EMPTY, WORLD, BLOCK,
                          LIMIT, PTX).to(dtype)
        stream = (y.to(tl.float32) + tl.load(residual_ptr + idx, mask=in_row, other=0.0).to(tl.float32)).to(dtype)
        tl.store(residual_ptr + idx, stream, mask=in_row)
        s = stream.to(tl.float32)                  # RMSNorm as reference.models.qwen3.rms_norm orders it:
        scaled = (s * tl.rsqrt(tl.sum(s * s, axis=0) / HIDDEN + eps)).to(dtype)   # normalize in fp32, round,
        tl.store(normed_ptr + idx, (weight * scaled.to(tl.float32)).to(dtype), mask=in_row)   # then scale


def _wait_limit(wait_s: float) -> dict:
    """The kernels' LIMIT and PTX for a wait of wait_s: ns by the GPU's clock, or under the Triton interpreter
    (no clock) one poll per millisecond."""
    if not _PTX:
        return {"LIMIT": max(1, round(wait_s * 1e3)), "PTX": 0}
    return {"LIMIT": round(wait_s * 1e9), "PTX": 1}


def buffer_bytes(world: int, max_bytes: int) -> int:
    """One rank's buffer: two sets (by parity) of one slot per rank, each of max_bytes, all empty at the start
    (every element `empty_value`)."""
    return 2 * world * max_bytes


def one_shot_all_reduce(x: torch.Tensor, addrs: torch.Tensor, epochs: torch.Tensor, error: torch.Tensor,
                        rank: int, world: int, max_bytes: int, residual: torch.Tensor | None = None,
                        wait_s: float = WAIT_S, shape: tuple[int, int] | None = None) -> torch.Tensor:
    """Sum of x over the ranks (+ residual), written into residual if given, else into x; returns it.

    `addrs[r]`: rank r's buffer (`buffer_bytes`); each slot holds `max_bytes`.
    `shape`: (BLOCK, num_warps), by default (BLOCK, WARPS) (a probe may try others).
    """
    out = x if residual is None else residual
    programs = epochs.numel()
    block, warps = shape or (BLOCK, WARPS)
    size = x.element_size()
    _one_shot_all_reduce_kernel[(programs,)](x, out, out, x.numel(), addrs, epochs, error, rank, max_bytes // size,
                                             BITS=_BITS[size], EMPTY=empty_value(size), WORLD=world,
                                             HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=warps,
                                             **_wait_limit(wait_s))
    return out


def one_shot_all_reduce_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                             addrs: torch.Tensor, epochs: torch.Tensor, error: torch.Tensor, rank: int, world: int,
                             max_bytes: int, wait_s: float = WAIT_S,
                             warps: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(stream, normed): stream = residual + sum of x over the ranks (written into residual),
    normed = rms_norm(stream) * weight, for x and residual of [rows, hidden].

    `warps`: by default ~8 values of a row per thread, 4 to 16 warps (a probe may try others).
    """
    hidden = x.shape[-1]
    block = triton.next_power_of_2(hidden)
    normed = torch.empty_like(x)
    size = x.element_size()
    _one_shot_all_reduce_norm_kernel[(epochs.numel(),)](
        x, residual, normed, weight, eps, x.numel(), addrs, epochs, error, rank, max_bytes // size,
        BITS=_BITS[size], EMPTY=empty_value(size), HIDDEN=hidden, WORLD=world, BLOCK=block,
        num_warps=warps or max(4, min(16, block // 256)), **_wait_limit(wait_s))
    return residual, normed
