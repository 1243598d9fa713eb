"""Why does a TP=2 decode graph cost the host 8x a TP=1 one to launch? (docs/performance.md, issue 35 call 9)

    python3 scripts/graph_launch_probe.py          # on a 2-GPU machine; prints one JSON line per rank 0 result

Two processes set up the one-shot all-reduce, then capture CUDA graphs of 72 calls each of: an in-place
add (a PyTorch kernel), a trivial Triton kernel, the plain one-shot all-reduce, and the one with the norm
fused in. For each graph, rank 0's host time of `replay()`: with the GPU idle (after a synchronize), and
back to back (the host ahead of the GPU, as under async scheduling). If only the all-reduce graphs launch
slowly, the kernel (not the graph's size) is what the driver pays for.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CALLS, REPLAYS = 72, 50


@triton.jit
def _copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + idx, tl.load(x_ptr + idx, mask=idx < n), mask=idx < n)


def host_us(graph: torch.cuda.CUDAGraph) -> dict:
    idle = []
    for _ in range(REPLAYS):
        torch.cuda.synchronize()
        t = time.perf_counter()
        graph.replay()
        idle.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    t = time.perf_counter()
    ahead = []
    for _ in range(REPLAYS):
        s = time.perf_counter()
        graph.replay()
        ahead.append(time.perf_counter() - s)
    torch.cuda.synchronize()
    gpu_us = (time.perf_counter() - t) / REPLAYS * 1e6
    return {"idle_launch_us": round(statistics.median(idle) * 1e6, 1),
            "ahead_launch_us": round(statistics.median(ahead) * 1e6, 1),
            "period_us": round(gpu_us, 1)}


def rank_main(rank: int, init_file: str, out_file: str) -> None:
    import torch.distributed as dist
    from reference.distributed.custom_all_reduce import OneShotAllReduce
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank))
    control = dist.new_group(backend="gloo")
    ar = OneShotAllReduce(rank, 2, torch.bfloat16, 256 * 4096 * 2, control)
    x = torch.randn(64, 4096, dtype=torch.bfloat16, device="cuda")
    y, residual = torch.empty_like(x), torch.randn_like(x)
    weight = torch.ones(4096, dtype=torch.bfloat16, device="cuda")
    ops = {"torch_add": lambda: x.add_(0),
           "triton_copy": lambda: _copy_kernel[(x.numel() // 2048,)](x, y, x.numel(), BLOCK=2048, num_warps=8),
           "one_shot_all_reduce": lambda: ar(x),
           "one_shot_all_reduce_norm": lambda: ar.add_norm(x, residual, weight, 1e-6)}
    results = {}
    for name, op in ops.items():
        op()
        torch.cuda.synchronize()
        dist.barrier(group=control)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(CALLS):
                op()
        dist.barrier(group=control)
        results[name] = host_us(graph)
        dist.barrier(group=control)
        del graph
    torch.cuda.synchronize()
    ar.close()
    dist.destroy_process_group()
    if rank == 0:
        Path(out_file).write_text(json.dumps(results))


def main() -> None:
    import torch.multiprocessing as mp
    tmp = tempfile.mkdtemp()
    out = os.path.join(tmp, "out.json")
    mp.start_processes(rank_main, args=(os.path.join(tmp, "init"), out), nprocs=2, start_method="spawn")
    result = json.loads(Path(out).read_text())
    for name, r in result.items():
        print(json.dumps({"graph_of_72": name, **r}))


if __name__ == "__main__":
    main()
