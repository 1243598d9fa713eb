"""Where a bench-256 engine step's wall time goes, phase by phase, in the benchmark itself (GPU).

A synchronous decode step at batch 256 took longer in `inferlab bench` than in
scripts/profile_decode.py (docs/performance.md). This runs the bench's engine the way
`courseware.bench.run_engine` does, with wall-clock timers around the engine's phases
(schedule, prepare_decode, the forward launch, sampling with its read-back wait,
postprocess) and around Python's garbage collections (a collection's time also counts
in the phase that triggered it), and prints milliseconds per step by decode-batch band.
Each mode is one engine: sync or async scheduling, with or without `gc.freeze()` after
the warm-up, and with or without full collections deferred during the run
(`-defer`; `run_engine` does both now: async-freeze-defer).
Run: python scripts/step_gap.py [--modes sync,sync-freeze,async-freeze,async-freeze-defer] [--out gap.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import defaultdict
from contextlib import nullcontext

import torch

sys.path.insert(0, ".")
import reference.engine.model_runner as model_runner_module  # noqa: E402
from courseware.bench import BATCH_BANDS, make_random_model, make_workload, random_model_dir  # noqa: E402
from reference import LLM, SamplingParams  # noqa: E402
from reference.engine.collector import full_collections_deferred  # noqa: E402


def band_of(batch: int, is_prefill: bool) -> str:
    if is_prefill:
        return "prefill"
    lo, hi = next(b for b in BATCH_BANDS if batch >= b[0] and (b[1] is None or batch <= b[1]))
    return f"decode {lo}-{hi}" if hi else f"decode {lo}+"


def run(scheduling: str, freeze: bool, defer: bool) -> dict:
    model = str(make_random_model(random_model_dir()))
    requests = make_workload("bench-256", 151936)
    max_len = max(len(r.prompt) + r.output_len for r in requests)
    llm = LLM(model, device="cuda", dtype="bfloat16", max_model_len=max_len, max_num_seqs=256,
              max_num_batched_tokens=16384, kvcache_block_size=16, async_scheduling=scheduling == "async")
    warm = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 4
    llm.generate([r.prompt[:64][::-1] for r in requests[:4]], warm, use_tqdm=False)
    if freeze:
        gc.collect()
        gc.freeze()
    else:
        gc.unfreeze()   # run_engine freezes: undo it here, to see what collections cost without
    current: dict[str, float] = defaultdict(float)

    def timed(obj, name: str, label: str) -> None:
        original = getattr(obj, name)

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                current[label] += time.perf_counter() - t
        setattr(obj, name, wrapper)

    runner = llm.model_runner
    timed(llm.scheduler, "schedule", "schedule")
    timed(runner, "prepare_decode", "prepare_decode")
    timed(runner, "prepare_prefill", "prepare_prefill")
    timed(runner, "_decode_forward", "forward launch (graph replay)")
    timed(runner.model, "compute_logits", "logits launch")
    timed(model_runner_module, "sample", "sample + wait for the GPU")
    timed(llm, "postprocess", "postprocess")
    timed(llm, "_resolve", "resolve (async)")
    gc_start = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            current[f"gc gen{info['generation']}"] += time.perf_counter() - gc_start[0]
    gc.callbacks.append(on_gc)
    torch.cuda.synchronize()
    for r in requests:
        llm.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True))
    bands: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counts: dict[str, int] = defaultdict(int)
    start = time.perf_counter()
    with full_collections_deferred() if defer else nullcontext():
        while not llm.is_finished():
            current.clear()
            first = len(llm.log.events)
            t = time.perf_counter()
            llm.step()
            wall = time.perf_counter() - t
            step = next((e for e in llm.log.events[first:] if e["event"] == "STEP"), None)
            band = "read-back only" if step is None else band_of(step["batch_size"], step["is_prefill"])
            counts[band] += 1
            bands[band]["step wall"] += wall
            for k, v in current.items():
                bands[band][k] += v
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    gc.callbacks.remove(on_gc)
    if freeze:
        gc.unfreeze()
    out = sum(r.output_len for r in requests)
    result = {"scheduling": scheduling, "gc_freeze": freeze, "full_collections_deferred": defer,
              "elapsed_s": elapsed, "output_tok_per_s": out / elapsed,
              "bands": {b: {"steps": counts[b], **{k: v / counts[b] * 1e3 for k, v in d.items()}}
                        for b, d in bands.items()}}
    del llm, runner, timed
    gc.collect()   # the timers make reference cycles: free this engine's GPU memory before the next one
    torch.cuda.empty_cache()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="sync,sync-freeze,async-freeze,async-freeze-defer")
    parser.add_argument("--out")
    args = parser.parse_args()
    results = [run(mode.split("-")[0], "-freeze" in mode, mode.endswith("-defer")) for mode in args.modes.split(",")]
    for r in results:
        print(f"\n{r['scheduling']}, gc.freeze {r['gc_freeze']}, full collections deferred "
              f"{r['full_collections_deferred']}: {r['output_tok_per_s']:,.0f} output tok/s, "
              f"{r['elapsed_s']:.2f} s   (ms per step)")
        for band, d in sorted(r["bands"].items()):
            print(f"  {band:16s} steps {d['steps']:4d}: " + ", ".join(f"{k} {v:.2f}" for k, v in d.items()
                                                                      if k != "steps"))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
