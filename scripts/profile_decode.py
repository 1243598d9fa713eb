"""Where does a decode step's time go at 256 running sequences? (GPU; used for docs/performance.md)

Admits bench-256's prompts, runs the prefills, then times decode steps phase by
phase (schedule, input preparation, GPU forward + sampling, postprocess) and
profiles the GPU kernels of a few steps with torch.profiler, grouped into
attention, GEMM, KV store and the rest.
Run: python scripts/profile_decode.py [--steps 30] [--no-log]
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, ".")
from courseware.bench import make_random_model, make_workload, random_model_dir  # noqa: E402
from reference import LLM, SamplingParams  # noqa: E402


def kernel_group(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("paged_decode", "prefill_attention", "flash", "fmha")):
        return "attention"
    if "store_kv" in n:
        return "kv store"
    if any(s in n for s in ("gemm", "cutlass", "nvjet", "sm90", "cublas", "matmul")):
        return "GEMM"
    return "other (norms, rope, silu, adds, copies)"


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    model = make_random_model(random_model_dir())
    requests = make_workload("bench-256", 151936)
    llm = LLM(str(model), device="cuda", dtype="bfloat16", max_model_len=2048, max_num_seqs=256,
              max_num_batched_tokens=16384, kvcache_block_size=args.block_size)
    for r in requests:
        llm.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True))
    while any(s.in_prefill for s in llm.sequences.values()):
        llm.step()
    runner, sched = llm.model_runner, llm.scheduler

    def timed_steps(n: int, profiler: cProfile.Profile | None = None) -> dict[str, float]:
        phases = defaultdict(float)
        for _ in range(n):
            t0 = time.perf_counter()
            seqs, is_prefill = sched.schedule()
            t1 = time.perf_counter()
            runner.prepare_decode(seqs)
            t2 = time.perf_counter()
            tokens = runner.run(seqs, is_prefill)   # prepares again, replays the graph, samples (syncs)
            t3 = time.perf_counter()
            if profiler:
                profiler.enable()
            llm.postprocess(seqs, tokens)
            if profiler:
                profiler.disable()
            llm.step_index += 1
            t4 = time.perf_counter()
            phases["schedule (+SCHEDULED events)"] += (t1 - t0) / n
            phases["prepare_decode"] += (t2 - t1) / n
            phases["run: prepare + graph replay + logits + sample"] += (t3 - t2) / n
            phases["postprocess (+token events)"] += (t4 - t3) / n
        return phases

    torch.cuda.synchronize()
    for label, collect in (("gc on", True), ("gc off", False)):
        (gc.enable if collect else gc.disable)()
        phases = timed_steps(args.steps)
        seqs = list(sched.running)
        print(f"[{label}] decode at batch {len(seqs)}, mean context {sum(map(len, seqs)) / len(seqs):.0f}, "
              f"{args.steps} steps")
        for name, seconds in phases.items():
            print(f"  {name:48s} {seconds * 1e3:7.2f} ms/step")
    gc.enable()
    prof = cProfile.Profile()
    timed_steps(10, prof)
    pstats.Stats(prof).sort_stats("tottime").print_stats(8)

    seqs, _ = sched.schedule()   # fresh batch: every sequence has the block its next token needs
    batch = len(seqs)
    # GPU-side: graph replay alone, timed with events.
    ids, pos, meta = runner.prepare_decode(seqs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    runner._replay_decode_graph(ids, pos, meta)
    start.record()
    for _ in range(10):
        runner._replay_decode_graph(ids, pos, meta)
    end.record()
    torch.cuda.synchronize()
    replay_ms = start.elapsed_time(end) / 10
    kv_bytes = sum(len(s) - 1 for s in seqs) * runner._bytes_per_block() / runner.block_size
    weight_bytes = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    print(f"  graph replay alone: {replay_ms:.2f} ms; KV read {kv_bytes / 1e9:.2f} GB + weights "
          f"{weight_bytes / 1e9:.2f} GB -> {(kv_bytes + weight_bytes) / replay_ms / 1e6:.0f} GB/s effective")

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            runner._replay_decode_graph(ids, pos, meta)
            logits = runner.model.compute_logits(runner.static["hidden"][:batch])
            logits.argmax(-1).tolist()
    groups = defaultdict(float)
    for evt in prof.key_averages():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            groups[kernel_group(evt.key)] += evt.self_device_time_total / 5 / 1e3
    total = sum(groups.values())
    print(f"  GPU kernel time per step (profiler): {total:.2f} ms")
    for name, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"    {name:40s} {ms:7.2f} ms  {ms / total:5.1%}")

    # The decode kernel alone, one layer, over tile configurations.
    from reference.kernels.paged_decode import paged_decode_attention
    from triton.testing import do_bench
    attn = runner.attention_layers[0]
    q = torch.randn(batch, attn.num_heads, attn.head_dim, device="cuda", dtype=torch.bfloat16)
    layer_bytes = kv_bytes / len(runner.attention_layers)
    print(f"  decode kernel, one layer, batch {batch}: {layer_bytes / 1e6:.0f} MB of K/V")
    for block_n, warps, stages in [(64, 4, 2), (32, 4, 2), (128, 4, 2), (64, 8, 2), (128, 8, 2), (64, 4, 3),
                                   (128, 4, 3), (64, 2, 2), (32, 2, 3), (128, 8, 3)]:
        fn = lambda: paged_decode_attention(q, attn.k_cache, attn.v_cache, meta.block_tables, meta.context_lens,
                                            attn.scale, block_n=block_n, num_warps=warps, num_stages=stages)
        ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
        print(f"    BLOCK_N {block_n:3d} warps {warps} stages {stages}: {ms * 1e3:7.1f} us "
              f"{layer_bytes / ms / 1e6:6.0f} GB/s")


if __name__ == "__main__":
    main()
