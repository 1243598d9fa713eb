"""A probe (2 GPUs): the all-reduce of a row-parallel layer folded into the GEMM that makes its input.

Today a TP=2 decode step runs, per row-parallel layer (o_proj, down_proj),
a cuBLAS GEMM and then the one-shot all-reduce + residual + RMSNorm kernel
(reference/kernels/all_reduce.py), which, when this probe was written,
first pushed the GEMM's whole output to the other GPU, then flagged it,
then waited for the other GPU's flag (it now polls the data itself). Here
the GEMM's epilogue pushes each output tile to the other GPU as it is
written (so the push overlaps the rest of the GEMM) and flags that tile;
the kernel after it only waits for the tiles of its rows, sums, adds the
residual and normalizes. The price: a Triton GEMM in place of cuBLAS.

Timed in CUDA graphs of 36 layer pairs with distinct weights (the 8B shape's
o_proj [4096, 2048] and down_proj [4096, 6144] shards at TP=2), at decode
batches 64 and 256:
  cublas_gemms / triton_gemms        the 72 GEMMs alone (a sweep of Triton tile shapes first)
  base                               cuBLAS GEMM + one-shot all-reduce-add-norm (the engine today)
  triton_then_one_shot               the Triton GEMM + the same one-shot kernel (the GEMM's share of any change)
  fused                              the Triton GEMM pushing its tiles + the waiting sum-add-norm
Checks: the fused path's stream and normed rows equal those of the Triton GEMM followed by the one-shot
kernel, bit for bit, and equal on both ranks.

Not part of the engine: on two H200s the fused path was slower than the engine's at both batches
(docs/performance.md, "The sixth stop"): the push moved into the GEMM, but the launch, the handshake
over NVLink and the norm stay, and the Triton GEMM is slower than cuBLAS, most at batch 256.

Run (2 GPUs, repository root): OUT=/dir python3 scripts/gemm_push_probe.py   -> $OUT/gemm_push.json
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN, LAYERS = 4096, 36
SHARDS = {"o": 2048, "down": 6144}          # K of each row-parallel shard at TP=2 (N = HIDDEN)
MAX_TILES = 1024                            # tile flags per source rank
SPINS = 1 << 22                             # a wait that never ends gives up (and sets the error flag)
CONFIGS = {   # (BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, warps, stages)
    64: [(64, 32, 128, 1, 4, 4), (64, 32, 64, 1, 4, 6), (64, 16, 128, 1, 4, 4), (64, 16, 256, 1, 4, 3),
         (64, 64, 128, 2, 4, 4), (64, 64, 64, 2, 4, 5), (64, 32, 128, 2, 4, 4), (64, 64, 128, 1, 4, 4),
         (64, 32, 256, 1, 4, 3)],
    256: [(64, 64, 128, 1, 4, 4), (128, 64, 64, 1, 8, 4), (128, 32, 128, 1, 4, 4), (256, 32, 64, 1, 8, 3),
          (64, 32, 128, 1, 4, 4), (128, 64, 128, 2, 8, 3), (256, 64, 64, 1, 8, 3), (128, 128, 64, 1, 8, 3)],
}


@triton.jit
def _store_and_push(y_ptr, vals, y_offs, mask, tile, addrs_ptr, epochs_ptr, rank, flags_offset, data_offset,
                    slot_elems, max_tiles, PUSH: tl.constexpr, WORLD: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    out = vals.to(dtype)
    tl.store(y_ptr + y_offs, out, mask=mask)
    if PUSH:
        epoch = tl.load(epochs_ptr) + 1               # the call number the sum kernel after us will take
        first_slot = (epoch % 2) * WORLD
        for p in tl.static_range(WORLD):
            if p != rank:
                slot = (tl.load(addrs_ptr + p) + data_offset).to(tl.pointer_type(dtype)) \
                    + (first_slot + rank) * slot_elems
                tl.store(slot + y_offs, out, mask=mask)
        tl.debug_barrier()
        for p in tl.static_range(WORLD):
            if p != rank:
                flags = (tl.load(addrs_ptr + p) + flags_offset).to(tl.pointer_type(tl.int32))
                tl.atomic_xchg(flags + rank * max_tiles + tile, epoch, sem="release", scope="sys")


@triton.jit
def _gemm_push_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, count_ptr, M, N, K_SPLIT, stride_x, stride_w,
                      addrs_ptr, epochs_ptr, rank, flags_offset, data_offset, slot_elems, max_tiles,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr,
                      PUSH: tl.constexpr, WORLD: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * K_SPLIT + tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_x + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_w + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for _ in range(0, K_SPLIT, BLOCK_K):
        a = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
        b = tl.load(w_ptrs)
        acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    mask = m_mask[:, None] & (offs_n[None, :] < N)
    y_offs = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    tile = pid_m * tl.num_programs(0) + pid_n
    if SPLIT:
        splits = tl.num_programs(2)
        tl.store(ws_ptr + pid_k * M * N + y_offs, acc, mask=mask)
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == splits - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(0, splits):
                total += tl.load(ws_ptr + s * M * N + y_offs, mask=mask, other=0.0, cache_modifier=".cg")
            _store_and_push(y_ptr, total, y_offs, mask, tile, addrs_ptr, epochs_ptr, rank, flags_offset, data_offset,
                            slot_elems, max_tiles, PUSH, WORLD)
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")
    else:
        _store_and_push(y_ptr, acc, y_offs, mask, tile, addrs_ptr, epochs_ptr, rank, flags_offset, data_offset,
                        slot_elems, max_tiles, PUSH, WORLD)


@triton.jit
def _sum_of_flagged_parts(y_ptr, slots, idx, mask, rank, slot_elems, WORLD: tl.constexpr, BLOCK: tl.constexpr):
    """Sum over the ranks of their parts at idx, in fp32, rank 0 first, the peers' parts already flagged as
    there (the engine's kernel waits on the data itself instead, so it cannot serve here)."""
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for p in tl.static_range(WORLD):
        if p == rank:
            part = tl.load(y_ptr + idx, mask=mask, other=0.0)
        else:
            part = tl.load(slots + p * slot_elems + idx, mask=mask, other=0.0, cache_modifier=".cg")
        acc += part.to(tl.float32)
    return acc


@triton.jit
def _wait_sum_norm_kernel(y_ptr, residual_ptr, normed_ptr, weight_ptr, eps, M, addrs_ptr, epochs_ptr, error_ptr,
                          rank, flags_offset, data_offset, slot_elems, max_tiles, n_blocks, gemm_block_m,
                          HIDDEN: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr,
                          MAX_SPINS: tl.constexpr, FENCE: tl.constexpr = True):
    """residual += sum over ranks of their GEMM outputs; normed = RMSNorm(residual) * weight: a program per row."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    dtype = y_ptr.dtype.element_ty
    epoch = tl.load(epochs_ptr + pid) + 1
    tl.debug_barrier()      # every warp has read the call number before it changes (the engine's kernel says why)
    tl.store(epochs_ptr + pid, epoch)
    first_slot = (epoch % 2) * WORLD
    own = tl.load(addrs_ptr + rank)
    own_flags = (own + flags_offset).to(tl.pointer_type(tl.int32))
    slots = (own + data_offset).to(tl.pointer_type(dtype)) + first_slot * slot_elems
    cols = tl.arange(0, BLOCK)
    in_row = cols < HIDDEN
    weight = tl.load(weight_ptr + cols, mask=in_row, other=0.0).to(tl.float32)
    blocks = tl.arange(0, NB)
    in_blocks = blocks < n_blocks
    for row in range(pid, M, programs):
        m_block = row // gemm_block_m
        for p in tl.static_range(WORLD):
            if p != rank:
                ptrs = own_flags + p * max_tiles + m_block * n_blocks + blocks
                spins = tl.where(tl.atomic_add(error_ptr, 0) == 0, 0, MAX_SPINS)
                done = 0
                while (done == 0) & (spins < MAX_SPINS):
                    seen = tl.load(ptrs, mask=in_blocks, other=epoch, volatile=True)
                    done = (tl.min(seen, axis=0) >= epoch).to(tl.int32)
                    spins += 1
                if spins >= MAX_SPINS:
                    tl.atomic_xchg(error_ptr, 1)
        if FENCE:   # the relaxed polls + this fence: an acquire of every flag seen (PTX's fence-based pattern)
            tl.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.u32 $0, 0;", "=r,r", [pid], dtype=tl.int32,
                                      is_pure=False, pack=1)
        tl.debug_barrier()
        idx = row * HIDDEN + cols
        y = _sum_of_flagged_parts(y_ptr, slots, idx, in_row, rank, slot_elems, WORLD, BLOCK).to(dtype)
        stream = (y.to(tl.float32) + tl.load(residual_ptr + idx, mask=in_row, other=0.0).to(tl.float32)).to(dtype)
        tl.store(residual_ptr + idx, stream, mask=in_row)
        s = stream.to(tl.float32)
        scaled = (s * tl.rsqrt(tl.sum(s * s, axis=0) / HIDDEN + eps)).to(dtype)
        tl.store(normed_ptr + idx, (weight * scaled.to(tl.float32)).to(dtype), mask=in_row)


class PushBuffers:
    """One IPC buffer per rank: tile flags [source rank][MAX_TILES], then two parities of a slot per rank."""

    def __init__(self, rank: int, world: int, max_bytes: int, group, programs: int = 128):
        import torch.distributed as dist
        from reference.distributed.custom_all_reduce import _Driver
        self.rank, self.world, self.max_bytes = rank, world, max_bytes
        self.flags_offset = 0
        self.data_offset = 8 * MAX_TILES * 4
        self.driver = _Driver()
        torch.cuda.synchronize()
        self.own = self.driver.alloc(self.data_offset + 2 * world * max_bytes)
        everyone: list = [None] * world
        dist.all_gather_object(everyone, self.driver.export(self.own), group=group)
        self.opened = {r: self.driver.open(h) for r, h in enumerate(everyone) if r != rank}
        addrs = [self.own if r == rank else self.opened[r] for r in range(world)]
        self.addrs = torch.tensor(addrs, dtype=torch.int64, device="cuda")
        self.epochs = torch.zeros(programs, dtype=torch.int32, device="cuda")
        self.error = torch.zeros(1, dtype=torch.int32, device="cuda")
        self.counters = torch.zeros(1 << 14, dtype=torch.int32, device="cuda")
        self.ws = torch.empty(4 * 256 * HIDDEN, dtype=torch.float32, device="cuda")

    def close(self) -> None:
        torch.cuda.synchronize()
        for ptr in self.opened.values():
            self.driver.close(ptr)
        self.driver.free(self.own)


def gemm(x, w, y, config, bufs: PushBuffers, push: bool) -> None:
    bm, bn, bk, split, warps, stages = config
    m, k = x.shape
    n = w.shape[0]
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm), split)
    _gemm_push_kernel[grid](x, w, y, bufs.ws, bufs.counters, m, n, k // split, x.stride(0), w.stride(0),
                            bufs.addrs, bufs.epochs, bufs.rank, bufs.flags_offset, bufs.data_offset,
                            bufs.max_bytes // 2, MAX_TILES, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split > 1,
                            PUSH=push, WORLD=bufs.world, num_warps=warps, num_stages=stages)


def wait_sum_norm(y, residual, normed, weight, config, bufs: PushBuffers) -> None:
    m = y.shape[0]
    n_blocks = triton.cdiv(HIDDEN, config[1])
    _wait_sum_norm_kernel[(bufs.epochs.numel(),)](
        y, residual, normed, weight, 1e-6, m, bufs.addrs, bufs.epochs, bufs.error, bufs.rank, bufs.flags_offset,
        bufs.data_offset, bufs.max_bytes // 2, MAX_TILES, n_blocks, config[0], HIDDEN=HIDDEN, WORLD=bufs.world,
        BLOCK=HIDDEN, NB=triton.next_power_of_2(n_blocks), MAX_SPINS=SPINS, num_warps=16)


def graph_ms(fn, reps: int, barrier) -> float:
    """Milliseconds per replay of a graph of fn (captured here), both ranks replaying in step."""
    fn()
    torch.cuda.synchronize()
    barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    del graph
    return start.elapsed_time(end) / reps


def rank_main(rank: int, init_file: str, result_file: str) -> None:
    import torch.distributed as dist
    from reference.distributed.custom_all_reduce import OneShotAllReduce
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank))
    control = dist.new_group(backend="gloo")
    barrier = lambda: dist.barrier(group=control)
    one_shot = OneShotAllReduce(rank, 2, torch.bfloat16, 256 * HIDDEN * 2, control)
    bufs = PushBuffers(rank, 2, 256 * HIDDEN * 2, control)
    torch.manual_seed(rank)
    weights = {name: [torch.randn(HIDDEN, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
               for name, k in SHARDS.items()}
    norm_w = (torch.rand(HIDDEN, device="cuda") + 0.5).to(torch.bfloat16)
    out: dict = {"gpu": torch.cuda.get_device_name(rank)}
    for m in (64, 256):
        row: dict = {}
        xs = {name: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for name, k in SHARDS.items()}
        ys = {name: torch.empty(m, HIDDEN, device="cuda", dtype=torch.bfloat16) for name in SHARDS}
        same = torch.Generator(device="cuda").manual_seed(m)      # the same stream on both ranks (the check below)
        residual = torch.randn(m, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=same)
        normed = torch.empty_like(residual)
        # 1. the GEMMs alone: cuBLAS, then each Triton config (no push), 36 per graph per shape
        for name in SHARDS:
            x, y = xs[name], ys[name]
            row[f"cublas_{name}_us"] = graph_ms(lambda: [torch.mm(x, w.t(), out=y) for w in weights[name]], 10,
                                                barrier) * 1e3 / LAYERS
            sweep = {}
            ref = torch.mm(x, weights[name][0].t()).float()
            for config in CONFIGS[m]:
                if SHARDS[name] % (config[2] * config[3]):
                    continue
                try:
                    gemm(x, weights[name][0], y, config, bufs, False)
                    torch.cuda.synchronize()
                    err = float((y.float() - ref).abs().max() / ref.abs().max())
                    us = graph_ms(lambda: [gemm(x, w, y, config, bufs, False) for w in weights[name]], 10,
                                  barrier) * 1e3 / LAYERS
                    sweep[str(config)] = {"us": round(us, 2), "rel_err": err}
                except Exception as e:   # noqa: BLE001  (a config that does not compile is skipped)
                    sweep[str(config)] = {"error": str(e)[-300:]}
                    barrier()
            row[f"triton_{name}_sweep"] = sweep
        # the best config per shape (rank 0's choice: both ranks must run the same grid)
        best = {}
        for name in SHARDS:
            timed = [(v["us"], k) for k, v in row[f"triton_{name}_sweep"].items() if "us" in v and v["rel_err"] < 1e-2]
            best[name] = eval(min(timed)[1]) if timed else None   # noqa: S307 (our own tuple's repr)
        chosen: list = [None, None]
        dist.all_gather_object(chosen, best, group=control)
        best = chosen[0]
        row["best"] = {k: str(v) for k, v in best.items()}
        if rank == 0:
            print(f"m {m} GEMMs: {json.dumps(row)}", flush=True)
        if any(v is None for v in best.values()):
            out[m] = row
            continue

        def base():
            for i in range(LAYERS):
                for name in SHARDS:
                    torch.mm(xs[name], weights[name][i].t(), out=ys[name])
                    one_shot.add_norm(ys[name], residual, norm_w, 1e-6)

        def triton_then_one_shot():
            for i in range(LAYERS):
                for name in SHARDS:
                    gemm(xs[name], weights[name][i], ys[name], best[name], bufs, False)
                    one_shot.add_norm(ys[name], residual, norm_w, 1e-6)

        def fused():
            for i in range(LAYERS):
                for name in SHARDS:
                    gemm(xs[name], weights[name][i], ys[name], best[name], bufs, True)
                    wait_sum_norm(ys[name], residual, normed, norm_w, best[name], bufs)

        # 2. check: fused == Triton GEMM + one-shot kernel, bit for bit, and the same on both ranks
        start = residual.clone()
        for name in SHARDS:
            r1, r2 = start.clone(), start.clone()
            n2 = torch.empty_like(r2)
            gemm(xs[name], weights[name][0], ys[name], best[name], bufs, False)
            _, n1 = one_shot.add_norm(ys[name], r1, norm_w, 1e-6)
            gemm(xs[name], weights[name][0], ys[name], best[name], bufs, True)
            wait_sum_norm(ys[name], r2, n2, norm_w, best[name], bufs)
            torch.cuda.synchronize()
            row[f"{name}_fused_stream_equal"] = bool(torch.equal(r1, r2))
            row[f"{name}_fused_normed_equal"] = bool(torch.equal(n1, n2))
            peer = r2.clone()
            dist.broadcast(peer, 0)
            row[f"{name}_stream_equal_on_both_ranks"] = bool(torch.equal(peer, r2))
        row["error_flag_after_check"] = int(bufs.error.item())
        # 3. timings, alternating, three rounds
        for round_ in range(3):
            for label, fn in (("base", base), ("triton_then_one_shot", triton_then_one_shot), ("fused", fused)):
                ms = graph_ms(fn, 10, barrier)
                row.setdefault(f"{label}_us_per_pair", []).append(round(ms * 1e3 / LAYERS, 2))
        row["error_flag"] = int(bufs.error.item()) + int(one_shot.error.item())
        out[m] = row
        print(f"rank {rank} m {m}: {json.dumps(row)[:3000]}", flush=True)
    barrier()
    torch.cuda.synchronize()
    bufs.close()
    one_shot.close()
    if rank == 0:
        Path(result_file).write_text(json.dumps(out, indent=2))
    dist.destroy_process_group()


def main() -> None:
    import torch.multiprocessing as mp
    out_dir = Path(os.environ.get("OUT", "gemm_push_out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp()
    t0 = time.monotonic()
    try:
        mp.start_processes(rank_main, args=(os.path.join(tmp, "init"), str(out_dir / "gemm_push.json")), nprocs=2,
                           start_method="spawn")
    except Exception:   # noqa: BLE001
        traceback.print_exc()
    print(f"gemm_push_probe: {time.monotonic() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
