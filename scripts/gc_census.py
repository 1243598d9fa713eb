"""What CPython's cyclic collector walks during a bench-256 run, and what its collections cost (CPU).

Runs bench-256's requests (or the first `--requests`) through the tiny model on the CPU the way
`courseware.bench.run_engine` does (warm-up, `gc.freeze()`, then every request at once), with a
`gc.callbacks` hook that times each collection by generation. `--defer` holds full collections
off during the run (`reference.engine.collector.full_collections_deferred`, as the bench does now).
At the end it counts the tracked objects that are not frozen, by type: what a full collection walks.
Run: python scripts/gc_census.py [--requests 256] [--defer]
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import Counter, defaultdict
from contextlib import nullcontext

sys.path.insert(0, ".")
from courseware.bench import make_workload  # noqa: E402
from courseware.tiny_model import default_model_dir, make_tiny_model  # noqa: E402
from reference import LLM, SamplingParams  # noqa: E402
from reference.engine.collector import full_collections_deferred  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--defer", action="store_true")
    args = parser.parse_args()
    model_dir = default_model_dir()
    model = str(model_dir if (model_dir / "config.json").exists() else make_tiny_model(model_dir))
    with open(f"{model}/config.json") as f:
        vocab = json.load(f)["vocab_size"]
    requests = make_workload("bench-256", vocab)[:args.requests]
    max_len = max(len(r.prompt) + r.output_len for r in requests)
    llm = LLM(model, device="cpu", max_model_len=max_len, max_num_seqs=256, max_num_batched_tokens=16384,
              kvcache_block_size=16)
    warm = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 4
    llm.generate([r.prompt[:64][::-1] for r in requests[:4]], warm, use_tqdm=False)
    gc.collect()
    gc.freeze()
    stats: dict[int, list] = defaultdict(lambda: [0, 0.0, 0])   # collections, seconds, objects freed
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            return
        s = stats[info["generation"]]
        s[0] += 1
        s[1] += time.perf_counter() - started[0]
        s[2] += info["collected"]
    gc.callbacks.append(on_gc)
    t = time.perf_counter()
    with full_collections_deferred() if args.defer else nullcontext():
        for r in requests:
            llm.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True))
        while not llm.is_finished():
            llm.step()
    elapsed = time.perf_counter() - t
    gc.callbacks.remove(on_gc)
    tracked = Counter(type(o).__name__ for o in gc.get_objects())
    gc.unfreeze()
    print(f"{len(requests)} requests, {elapsed:.1f} s on the CPU, full collections deferred: {args.defer}")
    for generation, (n, seconds, freed) in sorted(stats.items()):
        print(f"  generation {generation}: {n} collections, {seconds * 1e3:.1f} ms in all, {freed} objects freed")
    print(f"  tracked objects alive at the end, not frozen: {sum(tracked.values())}, most common: "
          + ", ".join(f"{name} {count}" for name, count in tracked.most_common(4)))


if __name__ == "__main__":
    main()
