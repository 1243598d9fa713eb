"""Is bench-256's prefill band paced by the GPU or by the CPU? Per-step CUDA events (GPU).

Runs the bench's engine once (`courseware.bench.run_engine`, async scheduling) with
`ModelRunner.launch_prefill` wrapped: a CUDA event before and after each launch, the
launch's CPU time, and the caching host allocator's count of pinned allocations at each
launch. Prints, per prefill launch (the warm-up's first): the GPU time between its two
events, the GPU gap before the next one (time the GPU had nothing queued), the wall time
of the launch on the CPU, and how much of it this thread ran (`time.thread_time`: less
than the wall time means it waited, on the GIL or in a blocking call). A launch whose CPU time equals its GPU time waited for the GPU inside
the launch; with a gap of 0 the GPU was never starved. `--delay` adds a CPU sleep before
each launch: the band grows only if the CPU paces it. Run in a fresh process each time:
first-use costs are per process.
Run: python scripts/prefill_step_events.py [--delay-ms 5]
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

sys.path.insert(0, ".")
from courseware import bench  # noqa: E402
from reference.engine.model_runner import ModelRunner  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    launches: list[tuple[torch.cuda.Event, torch.cuda.Event, float, float, int]] = []
    original = ModelRunner.launch_prefill

    def timed(self, seqs):
        if args.delay_ms:
            time.sleep(args.delay_ms / 1e3)
        host_allocs = torch.cuda.host_memory_stats().get("num_host_alloc", -1)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t, ran = time.perf_counter(), time.thread_time()
        out = original(self, seqs)
        wall, ran = time.perf_counter() - t, time.thread_time() - ran
        end.record()
        launches.append((start, end, wall, ran, host_allocs))
        return out

    ModelRunner.launch_prefill = timed
    model = str(bench.make_random_model(bench.random_model_dir()))
    requests = bench.make_workload("bench-256", 151936)
    result = bench.run_engine(model, requests, device="cuda", dtype="bfloat16", max_num_seqs=256,
                              max_num_batched_tokens=16384, kvcache_block_size=16, async_scheduling=True)
    torch.cuda.synchronize()
    band = next(b["seconds"] for b in result["time_by_batch"] if b["steps"] == "prefill")
    print(f"{result['output_tok_per_s']:,.0f} output tok/s, prefill band {band:.3f} s")
    import threading
    print("Python threads:", [t.name for t in threading.enumerate()])
    print(f"{'launch':>6} {'GPU ms':>7} {'gap after ms':>12} {'CPU wall ms':>11} {'thread ran ms':>13} "
          f"{'pinned allocs so far':>21}")
    for i, (start, end, wall, ran, host_allocs) in enumerate(launches):
        gap = end.elapsed_time(launches[i + 1][0]) if i + 1 < len(launches) else float("nan")
        name = "warm" if i == 0 else str(i)
        print(f"{name:>6} {start.elapsed_time(end):7.1f} {gap:12.2f} {wall * 1e3:11.1f} {ran * 1e3:13.1f} "
              f"{host_allocs:21d}")


if __name__ == "__main__":
    main()
