"""Probe (docs/performance.md, session 12): how far is the decode kernel from what the GPU can read, and would a head-major
page layout ([blocks, kv_heads, page, head_dim]: each (block, KV head) one contiguous 4 KB) read faster
than the engine's token-major one ([blocks, page, kv_heads, head_dim]: 16 rows of 256 B)?

The engine's kernel takes the cache's strides, so a permuted view of a head-major tensor runs it unchanged.
28 layers in one CUDA graph, median of rounds.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, ".")
from reference.kernels.paged_decode import longest_first, paged_decode_attention  # noqa: E402

OUT = os.environ.get("OUT", ".")
QH, KVH, D, L, PAGE = 16, 8, 128, 28, 16


@triton.jit
def _read_kernel(x_ptr, n, sink_ptr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(sink_ptr + pid, tl.sum(acc, 0))


def timed(fn, rounds=7, reps=5):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / reps)
    del g
    return sorted(ts)[len(ts) // 2]


@torch.inference_mode()
def main():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    results = {}
    x = torch.randn(1536 * 1024**2, device=dev, dtype=dt)   # 3.2 GB
    sink = torch.zeros(132 * 64, device=dev)
    for progs, block, warps in [(132 * 4, 4096, 8), (132 * 8, 2048, 4), (132 * 16, 2048, 4), (132 * 32, 1024, 4)]:
        ms = timed(lambda: _read_kernel[(progs,)](x, x.numel(), sink, BLOCK=block, num_warps=warps))
        results[f"read_{progs}p_{block}"] = round(x.numel() * 2 / ms / 1e6)
    y = torch.empty_like(x)
    ms = timed(lambda: y.copy_(x))
    results["copy_GBps"] = round(2 * x.numel() * 2 / ms / 1e6)
    del x, y
    print(json.dumps(results), flush=True)
    if "--bandwidth-only" in sys.argv:
        return
    for batch, lo, hi in [(168, 500, 1400), (232, 400, 1100), (104, 700, 1700), (40, 900, 2000)]:
        lens_list = torch.randint(lo, hi, (batch,)).tolist()
        blocks = [(n + PAGE - 1) // PAGE for n in lens_list]
        nblocks = sum(blocks)
        perm = torch.randperm(nblocks)
        bt = torch.zeros(batch, max(blocks), dtype=torch.int64)
        at = 0
        for i, nb in enumerate(blocks):
            bt[i, :nb] = perm[at:at + nb]; at += nb
        bt = bt.to(dev)
        lens = torch.tensor(lens_list, device=dev)
        order = longest_first(lens)
        q = torch.randn(batch, QH, D, device=dev, dtype=dt)
        nbytes = sum(lens_list) * 114688
        res = {"batch": batch, "kv_GB": nbytes / 1e9}
        tm = torch.randn(2, L, nblocks, PAGE, KVH, D, device=dev, dtype=dt)
        ref = paged_decode_attention(q, tm[0, 0], tm[1, 0], bt, lens, D ** -0.5, order=order)
        hm = tm.permute(0, 1, 2, 4, 3, 5).contiguous()   # [2, L, blocks, kv_heads, page, D]
        del tm
        hv = hm.permute(0, 1, 2, 4, 3, 5)                # a token-major view of head-major storage
        out = paged_decode_attention(q, hv[0, 0], hv[1, 0], bt, lens, D ** -0.5, order=order)
        res["same_output"] = bool(torch.equal(out, ref))
        for name, cache in (("hm", hv),):
            for bn, w, st in [(128, 4, 2), (64, 4, 2), (64, 4, 3), (32, 4, 4), (128, 4, 3), (16, 4, 4), (32, 4, 3)]:
                ms = timed(lambda: [paged_decode_attention(q, cache[0, l], cache[1, l], bt, lens, D ** -0.5,
                                                           block_n=bn, num_warps=w, num_stages=st, order=order)
                                    for l in range(L)])
                res[f"{name}_{bn}x{w}w{st}s"] = [round(ms, 4), round(nbytes / ms / 1e6)]
        del hm, hv
        tm = torch.randn(2, L, nblocks, PAGE, KVH, D, device=dev, dtype=dt)
        for bn, w, st in [(128, 4, 2), (64, 4, 2), (32, 4, 4)]:
            ms = timed(lambda: [paged_decode_attention(q, tm[0, l], tm[1, l], bt, lens, D ** -0.5,
                                                       block_n=bn, num_warps=w, num_stages=st, order=order)
                                for l in range(L)])
            res[f"tm_{bn}x{w}w{st}s"] = [round(ms, 4), round(nbytes / ms / 1e6)]
        del tm
        torch.cuda.empty_cache()
        results[str(batch)] = res
        print(json.dumps(res), flush=True)
    json.dump(results, open(os.path.join(OUT, "s12_layout.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
