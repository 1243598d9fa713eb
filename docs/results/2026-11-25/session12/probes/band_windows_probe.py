"""Probe (docs/performance.md, session 12): where a bench-256 async run's decode steps spend GPU time, band by band.

Runs the bench's engine (async, graphs) step by step as run_engine does; when the running batch first
falls to each threshold, profiles WINDOW steps with torch.profiler (GPU activity only) and reports per
step: GPU span, busy (union of kernels/copies), idle, and kernel time by group and by name; then,
between steps, times the decode attention kernel alone on that batch's real block tables over a few
configurations, and a device copy for the machine's bandwidth.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
from collections import defaultdict

import torch

sys.path.insert(0, ".")
from courseware.bench import make_random_model, make_workload, random_model_dir  # noqa: E402
from reference import LLM, SamplingParams  # noqa: E402
from reference.engine.collector import full_collections_deferred  # noqa: E402
from reference.kernels.paged_decode import longest_first, paged_decode_attention  # noqa: E402

WINDOW = 6
THRESHOLDS = [256, 232, 200, 168, 136, 104, 72, 40, 12]
CONFIGS = [(128, 4, 2), (64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 3), (128, 8, 2), (128, 8, 3),
           (256, 8, 2), (32, 4, 4), (64, 8, 3)]
OUT = os.environ.get("OUT", ".")


def group(name: str) -> str:
    n = name.lower()
    if "paged_decode" in n or "merge_splits" in n:
        return "attention"
    if "store_kv" in n:
        return "kv store"
    if any(s in n for s in ("gemm", "cutlass", "nvjet", "sm90", "cublas", "matmul")):
        return "GEMM"
    if "memcpy" in n or "memset" in n:
        return "copy/set"
    if "qk_norm" in n:
        return "qk_norm_rope"
    return "other"


def analyse(trace_path: str, steps: int) -> dict:
    events = json.load(open(trace_path))["traceEvents"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    gpu.sort(key=lambda e: e["ts"])
    if not gpu:
        return {}
    span = gpu[-1]["ts"] + gpu[-1]["dur"] - gpu[0]["ts"]
    busy, end, gaps = 0.0, gpu[0]["ts"], []
    for i, e in enumerate(gpu):
        s, t = e["ts"], e["ts"] + e["dur"]
        if s > end:
            gaps.append((s - end, gpu[i - 1]["name"][:40], e["name"][:40]))
        busy += max(0.0, t - max(s, end))
        end = max(end, t)
    by_group, by_name, count = defaultdict(float), defaultdict(float), defaultdict(int)
    for e in gpu:
        by_group[group(e["name"])] += e["dur"] / steps
        by_name[e["name"][:70]] += e["dur"] / steps
        count[e["name"][:70]] += 1
    gaps.sort(reverse=True)
    small = sum(g for g, *_ in gaps if g < 5)
    return {"span_us_per_step": span / steps, "busy_us_per_step": busy / steps,
            "idle_us_per_step": (span - busy) / steps, "idle_in_small_gaps_us_per_step": small / steps,
            "kernels_per_step": len(gpu) / steps,
            "by_group_us": dict(sorted(by_group.items(), key=lambda kv: -kv[1])),
            "top_names_us": {k: [round(v, 1), count[k] / steps] for k, v in
                             sorted(by_name.items(), key=lambda kv: -kv[1])[:25]},
            "largest_gaps": [[round(g, 1), a, b] for g, a, b in gaps[:8]]}


def attention_sweep(llm, seqs) -> dict:
    runner = llm.model_runner
    _, _, meta = runner.prepare_decode(seqs)
    attn = runner.attention_layers[0]
    batch = len(seqs)
    q = torch.randn(batch, attn.num_heads, attn.head_dim, device="cuda", dtype=torch.bfloat16)
    order = longest_first(meta.context_lens)
    layer_bytes = int(meta.context_lens.sum()) * 2 * attn.num_kv_heads * attn.head_dim * 2
    res = {"batch": batch, "layer_MB": layer_bytes / 1e6}
    layers = runner.attention_layers
    for bn, w, st in CONFIGS:
        for ordered in (True,):
            def fn():
                for a in layers:
                    paged_decode_attention(q, a.k_cache, a.v_cache, meta.block_tables, meta.context_lens, a.scale,
                                           block_n=bn, num_warps=w, num_stages=st, order=order if ordered else None)
            try:
                fn()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    fn()
                g.replay()
                torch.cuda.synchronize()
                times = []
                for _ in range(5):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record(); g.replay(); b.record(); torch.cuda.synchronize()
                    times.append(a.elapsed_time(b))
                ms = sorted(times)[2]
                res[f"{bn}x{w}w{st}s"] = {"step_ms": round(ms, 4), "GBps": round(layer_bytes * len(layers) / ms / 1e6)}
                del g
            except Exception as err:  # noqa: BLE001
                res[f"{bn}x{w}w{st}s"] = repr(err)[:120]
    return res


def copy_bandwidth() -> float:
    x = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(10):
        y.copy_(x)
    b.record(); torch.cuda.synchronize()
    ms = a.elapsed_time(b) / 10
    del x, y
    return 2 * 2 * 1024**3 / ms / 1e6


@torch.inference_mode()
def main() -> None:
    sweep = "--no-sweep" not in sys.argv
    model = str(make_random_model(random_model_dir()))
    requests = make_workload("bench-256", 151936)
    max_len = max(len(r.prompt) + r.output_len for r in requests)
    llm = LLM(model, max_model_len=max_len, device="cuda", dtype="bfloat16", max_num_seqs=256,
              max_num_batched_tokens=16384, kvcache_block_size=16, async_scheduling=True)
    warm = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 4
    llm.generate([r.prompt[:64][::-1] for r in requests[:4]], warm, use_tqdm=False)
    gc.collect(); gc.freeze(); torch.cuda.synchronize()
    results = {"copy_GBps": copy_bandwidth(), "windows": []}
    print("device copy", round(results["copy_GBps"]), "GB/s", flush=True)
    pending = list(THRESHOLDS)
    step_times = []
    with full_collections_deferred():
        for r in requests:
            llm.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True))
        steps = 0
        decode_steps = 0
        while not llm.is_finished():
            running = list(llm.scheduler.running)
            batch = len(running)
            prefilling = any(s.in_prefill for s in llm.sequences.values())
            if not prefilling and pending and batch <= pending[0] and decode_steps > 20:
                while pending and batch <= pending[0]:
                    pending.pop(0)
                ctx = sum(len(s) for s in running)
                trace = tempfile.mktemp(suffix=".json")
                prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
                torch.cuda.synchronize()
                prof.start()
                t0 = time.perf_counter()
                for _ in range(WINDOW):
                    llm.step(); steps += 1; decode_steps += 1
                torch.cuda.synchronize()
                wall = (time.perf_counter() - t0) / WINDOW
                prof.stop()
                prof.export_chrome_trace(trace)
                w = analyse(trace, WINDOW)
                os.unlink(trace)
                kv_ms = ctx * 114688 / 3.0e12 * 1e3
                w.update({"batch": batch, "sum_context": ctx, "wall_ms_per_step_profiled": wall * 1e3,
                          "kv_read_ms_at_3TBps": kv_ms, "step": steps})
                if sweep:
                    torch.cuda.synchronize()
                    w["attention_sweep"] = attention_sweep(llm, list(llm.scheduler.running))
                results["windows"].append(w)
                print(json.dumps({k: v for k, v in w.items() if k not in ("top_names_us",)}), flush=True)
                continue
            t0 = time.perf_counter()
            llm.step(); steps += 1
            if not prefilling:
                decode_steps += 1
            step_times.append((batch, time.perf_counter() - t0))
    results["unprofiled_step_ms_by_batch"] = {}
    for lo, hi in ((256, 256), (128, 255), (64, 127), (16, 63), (1, 15)):
        ts = [t for b, t in step_times if lo <= b <= hi]
        if ts:
            results["unprofiled_step_ms_by_batch"][f"{lo}-{hi}"] = [len(ts), 1e3 * sum(ts) / len(ts)]
    print(json.dumps(results["unprofiled_step_ms_by_batch"]))
    json.dump(results, open(os.path.join(OUT, "s12_windows.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
