"""A one-shot all-reduce for small messages: every rank reads every other rank's buffer over NVLink.

NCCL's all-reduce is built for bandwidth: a ring or tree of steps, each a
handshake between neighbours. A decode step all-reduces a few hundred KiB
twice per layer, where what counts is latency, not bandwidth. With every GPU
able to read every other GPU's memory (CUDA IPC, peer access), one kernel
does it in one round (as vLLM's custom all-reduce does):

    1. copy my x into my shared buffer                      (local writes)
    2. tell every peer "my data for call e is there"          (a flag in the peer's memory)
    3. wait until every peer told me the same                 (spin on my own flags)
    4. out = sum over ranks 0..N-1 of their buffers, in fp32  (remote reads)

Each rank sums in the same order (rank 0 first), so all ranks get the same
bits, which tensor parallelism needs: each continues from its own copy.

The handshake must work inside a CUDA graph, where a kernel's arguments are
frozen: the call number e lives in device memory (`epochs`, one counter per
program, bumped by the kernel itself). Flags only grow, so nothing is ever
reset. Two buffers alternate (by e's parity): a rank may start call e+1
while a slow peer still reads its buffer of call e; by call e+2 that peer
has finished call e (it has started e+1, and one stream runs one kernel
after the other). That argument needs each program to touch the same
elements in every call, so the grid is fixed (`programs`), whatever the size.

A peer that never comes (it died) would hang the GPU: each wait gives up
after `MAX_SPINS` polls and raises `error[0]`, and once it is raised no call
waits again (a graph holds dozens of these calls); the results are then
garbage, and the host finds the dead worker before the next step.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096            # elements per program per iteration: 16 per thread at 8 warps
MAX_SPINS = 1 << 24     # polls of one flag before giving up (seconds: far beyond any live peer's lag)


@triton.jit
def _one_shot_all_reduce_kernel(x_ptr, n, addrs_ptr, epochs_ptr, error_ptr, rank, flag_bytes, buffer_elems,
                                WORLD: tl.constexpr, BLOCK: tl.constexpr, MAX_SPINS: tl.constexpr):
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    dtype = x_ptr.dtype.element_ty
    epoch = tl.load(epochs_ptr + pid) + 1
    tl.store(epochs_ptr + pid, epoch)
    parity = epoch % 2
    own = tl.load(addrs_ptr + rank)
    own_data = (own + flag_bytes).to(tl.pointer_type(dtype)) + parity * buffer_elems
    lanes = tl.arange(0, BLOCK)
    for start in range(pid * BLOCK, n, programs * BLOCK):          # 1. my x into my buffer
        idx = start + lanes
        tl.store(own_data + idx, tl.load(x_ptr + idx, mask=idx < n), mask=idx < n)
    tl.debug_barrier()
    for p in tl.static_range(WORLD):                                # 2. my flag in each peer's memory
        if p != rank:
            peer_flags = tl.load(addrs_ptr + p).to(tl.pointer_type(tl.int32))
            tl.atomic_xchg(peer_flags + rank * programs + pid, epoch, sem="release", scope="sys")
    own_flags = own.to(tl.pointer_type(tl.int32))
    for p in tl.static_range(WORLD):                                # 3. every peer's flag in mine
        if p != rank:
            spins = tl.where(tl.atomic_add(error_ptr, 0) == 0, 0, MAX_SPINS)   # given up before: do not wait
            while (tl.atomic_add(own_flags + p * programs + pid, 0, sem="acquire", scope="sys") < epoch) \
                    & (spins < MAX_SPINS):
                spins += 1
            if spins >= MAX_SPINS:
                tl.atomic_xchg(error_ptr, 1)
    tl.debug_barrier()
    for start in range(pid * BLOCK, n, programs * BLOCK):          # 4. the sum, rank 0 first
        idx = start + lanes
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for p in tl.static_range(WORLD):
            data = (tl.load(addrs_ptr + p) + flag_bytes).to(tl.pointer_type(dtype)) + parity * buffer_elems
            acc += tl.load(data + idx, mask=idx < n, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(x_ptr + idx, acc.to(dtype), mask=idx < n)


def one_shot_all_reduce(x: torch.Tensor, addrs: torch.Tensor, epochs: torch.Tensor, error: torch.Tensor,
                        rank: int, world: int, flag_bytes: int, buffer_bytes: int, max_spins: int = MAX_SPINS) -> None:
    """Sum x over the ranks, in place. `addrs[r]`: rank r's shared buffer (flags, then two data halves)."""
    programs = epochs.numel()
    _one_shot_all_reduce_kernel[(programs,)](x, x.numel(), addrs, epochs, error, rank, flag_bytes,
                                             buffer_bytes // x.element_size(), WORLD=world, BLOCK=BLOCK,
                                             MAX_SPINS=max_spins, num_warps=8)
