"""How far is a bench-256 prefill step from its GEMM floor? (GPU; used for docs/performance.md)

Admits bench-256's prompts into the bench's engine, runs the first prefill step
(torch.compile's dynamic kernels and the flash kernel warm up), then takes the
second scheduled prefill batch and measures it:

- the CPU's `prepare_prefill` (median of repeats), against a vectorised variant
  that builds the same tensors with numpy (checked equal first);
- the forward pass plus the logits of each sequence's last token, as the engine
  runs it (through the prefill CUDA graphs when captured), timed with CUDA
  events (median of repeats), and its kernels by group with torch.profiler; the
  eager forward on the same inputs, and the CPU time to launch each;
- the GEMM floor: every projection of the model (28 layers x qkv, o, gate_up,
  down) alone, one after another at the rows the forward computes (the step's
  token count, or its graph bucket's), with the model's own weights (cuBLAS, as
  F.linear calls it), timed the same way, in rounds alternating with the
  step's (`--rounds`). The profiled kernels are also set against the step's own
  GEMM kernels, which have run faster inside the step than alone.

Re-running the step's forward rewrites the same KV slots with the same values,
so the measurement leaves the engine's state as it found it.
`--all-dynamic` compiles the elementwise ops the way the engine did before
session 6 (`use_all_dynamic_ops`), and `--flash-prefill` runs prefill attention
through PyTorch's FlashAttention-2 as before session 7 (`use_flash_prefill`),
each for an A/B in separate processes.
Run: python scripts/profile_prefill.py [--repeats 10] [--rounds 5] [--all-dynamic] [--flash-prefill] [--out prefill.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from courseware.bench import make_random_model, make_workload, random_model_dir  # noqa: E402
from reference import LLM, SamplingParams  # noqa: E402
from reference.models import qwen3  # noqa: E402
from profile_decode import kernel_group as decode_kernel_group  # noqa: E402
from reference.layers.linear import ColumnParallelLinear, RowParallelLinear  # noqa: E402


def kernel_group(name: str) -> str:
    """profile_decode's groups, with the elementwise kernels (compiled, and the q/k kernel) apart from copies."""
    if name.startswith("triton_") or "qk_norm_rope" in name:
        return "elementwise (norms, rope, silu, adds)"
    return decode_kernel_group(name)


def use_all_dynamic_ops() -> None:
    """Compile the elementwise ops as the engine did before session 6: every size dynamic, q/k by inductor.

    Call before building an engine (gpu_perf.sh's `ops_ab` does, for the bench).
    """
    fns = (qwen3.rms_norm, qwen3.qk_norm_rope, qwen3.silu_and_mul)   # the set as it is now (no add_rms_norm)
    qwen3._FUSED_OPS = qwen3.ElementwiseOps(*(torch.compile(fn, dynamic=True) for fn in fns))


def use_flash_prefill() -> None:
    """Route the Triton backend's prefill attention to FlashAttention-2, as before session 7."""
    from reference.layers import attention
    attention.TritonAttentionBackend._prefill_kernel = \
        lambda self, q, k, v, meta, scale, out=None: attention._into(out, attention.flash_varlen(q, k, v, meta, scale))


def gpu_ms(fn, repeats: int) -> float:
    """Median milliseconds of fn() on the GPU, each run between two events."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def cpu_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def launch_ms(fn, repeats: int) -> float:
    """Median CPU milliseconds to queue fn()'s GPU work (from an idle GPU, not waiting for it)."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def prepare_prefill_numpy(runner, seqs):
    """The flat prefill inputs of `prepare_prefill`, built with numpy instead of per-token Python lists."""
    bs = runner.block_size
    starts = np.array([s.num_cached_tokens for s in seqs], dtype=np.int64)
    ends = starts + np.array([s.num_scheduled_tokens for s in seqs], dtype=np.int64)
    counts = ends - starts
    input_ids = np.concatenate([np.asarray(s.token_ids[a:b], dtype=np.int64) for s, a, b in zip(seqs, starts, ends)])
    row = np.repeat(np.arange(len(seqs)), counts)
    positions = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts) + np.repeat(starts, counts)
    width = max(len(s.block_table) for s in seqs)
    tables = np.zeros((len(seqs), width), dtype=np.int64)
    for table_row, s in zip(tables, seqs):
        table_row[:len(s.block_table)] = s.block_table
    slots = tables[row, positions // bs] * bs + positions % bs
    return runner._tensor(input_ids), runner._tensor(positions), runner._tensor(slots)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--all-dynamic", action="store_true")
    parser.add_argument("--flash-prefill", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.all_dynamic:
        use_all_dynamic_ops()
    if args.flash_prefill:
        use_flash_prefill()
    model = make_random_model(random_model_dir())
    requests = make_workload("bench-256", 151936)
    max_len = max(len(r.prompt) + r.output_len for r in requests)
    llm = LLM(str(model), device="cuda", dtype="bfloat16", max_model_len=max_len, max_num_seqs=256,
              max_num_batched_tokens=16384, kvcache_block_size=16)
    for r in requests:
        llm.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True))
    llm.step()                                   # the first prefill step: warm-up
    runner = llm.model_runner
    seqs, is_prefill = llm.scheduler.schedule()
    assert is_prefill, "the second step of bench-256 should be a prefill"
    tokens = sum(s.num_scheduled_tokens for s in seqs)
    result: dict = {"sequences": len(seqs), "tokens": tokens, "all_dynamic": args.all_dynamic,
                    "flash_prefill": args.flash_prefill}

    ids, positions, meta = runner.prepare_prefill(seqs)
    np_ids, np_pos, np_slots = prepare_prefill_numpy(runner, seqs)
    assert torch.equal(np_ids, ids) and torch.equal(np_pos, positions) and torch.equal(np_slots, meta.slot_mapping)
    result["prepare_prefill_ms"] = cpu_ms(lambda: runner.prepare_prefill(seqs), args.repeats)
    result["prepare_prefill_numpy_ms"] = cpu_ms(lambda: prepare_prefill_numpy(runner, seqs), args.repeats)

    last = meta.cu_seqlens_q[1:] - 1
    # The engine's path (the step's CUDA graph pieces with attention between them, when captured), and
    # the eager forward on the same inputs, in the same process.
    step = lambda: runner.model.compute_logits(runner._prefill_forward(ids, positions, meta)[last])
    eager = lambda: runner.model.compute_logits(runner.model(ids, positions, runner.backend.plan(meta))[last])
    step()
    eager()
    result["prefill_graphs"] = runner.prefill_graphs is not None and runner.prefill_graphs.fits(tokens)
    linears = [m for m in runner.model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    # The floor at the rows the forward computes: with prefill graphs, the step's bucket (padding included).
    graphs = runner.prefill_graphs
    rows = next(b for b in graphs.buckets if b >= tokens) if result["prefill_graphs"] else tokens
    result["gemm_rows"] = rows
    inputs = {m.weight.shape[1]: torch.randn(rows, m.weight.shape[1], device="cuda", dtype=torch.bfloat16)
              for m in linears}
    floor = lambda: [F.linear(inputs[m.weight.shape[1]], m.weight) for m in linears]
    floor()
    # The step and the floor in alternating rounds, so a slower stretch of the GPU's clock or power
    # weighs on both; each figure is the median over rounds of each round's median.
    rounds = [(gpu_ms(step, args.repeats), gpu_ms(floor, args.repeats)) for _ in range(args.rounds)]
    result["rounds_ms"] = [{"step": a, "floor": b, "ratio": a / b} for a, b in rounds]
    result["forward_and_logits_ms"] = statistics.median(a for a, _ in rounds)
    result["gemm_floor_ms"] = statistics.median(b for _, b in rounds)
    result["eager_forward_and_logits_ms"] = gpu_ms(eager, args.repeats)
    result["eager_launch_cpu_ms"] = launch_ms(eager, args.repeats)
    result["launch_cpu_ms"] = launch_ms(step, args.repeats)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    groups: dict[str, float] = defaultdict(float)
    kernels = []
    for evt in prof.key_averages():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            ms = evt.self_device_time_total / 3 / 1e3
            groups[kernel_group(evt.key)] += ms
            kernels.append((ms, evt.count // 3, evt.key[:90]))
    result["profile_ms"] = dict(sorted(groups.items(), key=lambda kv: -kv[1]))
    result["top_kernels"] = [{"ms": ms, "calls": n, "name": k} for ms, n, k in sorted(kernels, reverse=True)[:20]]

    flops = sum(2 * rows * m.weight.numel() for m in linears)
    result["gemm_tflops"] = flops / result["gemm_floor_ms"] / 1e9
    result["forward_over_floor"] = result["forward_and_logits_ms"] / result["gemm_floor_ms"]
    result["profiled_over_floor"] = sum(groups.values()) / result["gemm_floor_ms"]
    result["profiled_over_gemm_kernels"] = sum(groups.values()) / groups["GEMM"]

    print(f"prefill step: {len(seqs)} sequences, {tokens} tokens")
    print(f"  prepare_prefill (CPU): {result['prepare_prefill_ms']:.2f} ms "
          f"(numpy variant {result['prepare_prefill_numpy_ms']:.2f} ms)")
    print(f"  forward + last-token logits (GPU events): {result['forward_and_logits_ms']:.2f} ms "
          f"(prefill graphs: {result['prefill_graphs']}; eager forward {result['eager_forward_and_logits_ms']:.2f} ms)")
    print(f"  launching it (CPU, no wait): {result['launch_cpu_ms']:.2f} ms (eager {result['eager_launch_cpu_ms']:.2f} ms)")
    print(f"  GEMM floor ({len(linears)} projections alone at {rows} rows, cuBLAS): {result['gemm_floor_ms']:.2f} ms "
          f"({result['gemm_tflops']:.0f} TFLOP/s); forward / floor {result['forward_over_floor']:.2f}x")
    total = sum(groups.values())
    ratios = [r["ratio"] for r in result["rounds_ms"]]
    print(f"  forward / floor by round ({args.rounds} rounds, alternating): {min(ratios):.2f}x to {max(ratios):.2f}x")
    print(f"  kernels by group (profiler, {total:.2f} ms; {result['profiled_over_floor']:.2f}x the floor, "
          f"{result['profiled_over_gemm_kernels']:.2f}x its own GEMM kernels):")
    for name, ms in result["profile_ms"].items():
        print(f"    {name:48s} {ms:7.2f} ms  {ms / total:5.1%}")
    print("  top kernels:")
    for k in result["top_kernels"]:
        print(f"    {k['ms']:7.3f} ms  x{k['calls']:<4d} {k['name']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
