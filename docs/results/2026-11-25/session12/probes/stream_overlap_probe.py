"""Probe (docs/performance.md, session 12): does running a decode batch as two (or four) slices on parallel streams of one
CUDA graph hide the per-kernel floor of the small GEMMs behind the other slice's attention?

Runs bench-256's engine (async) until the batch falls to each target, then on that batch's real block
tables times (CUDA events, median of rounds) the engine's own graph against graphs captured with the
batch split across streams, for a few decode-kernel configurations.
"""
from __future__ import annotations

import functools
import gc
import json
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, ".")
from courseware.bench import make_random_model, make_workload, random_model_dir  # noqa: E402
from reference import LLM, SamplingParams  # noqa: E402
from reference.engine.collector import full_collections_deferred  # noqa: E402
from reference.kernels.paged_decode import paged_decode_attention  # noqa: E402

TARGETS = [int(x) for x in os.environ.get("TARGETS", "232,168,104,56").split(",")]
OUT = os.environ.get("OUT", ".")
VARIANTS = [("engine", 1, None), ("unsplit", 1, (32, 4, 4)), ("split2", 2, None), ("split2", 2, (32, 4, 4)),
            ("split2", 2, (64, 4, 2)), ("split2", 2, (64, 2, 3)), ("split4", 4, (32, 4, 4)), ("split4", 4, None)]


def time_graph(g: torch.cuda.CUDAGraph, rounds: int = 5, reps: int = 10) -> float:
    g.replay(); torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / reps)
    return sorted(times)[len(times) // 2]


def capture_split(runner, ids, pos, meta, bucket: int, parts: int):
    """A graph running rows [i*bucket/parts, (i+1)*bucket/parts) of the padded batch on stream i."""
    dev = ids.device
    batch = ids.shape[0]
    st = {"ids": torch.zeros(bucket, dtype=torch.int64, device=dev), "pos": torch.zeros(bucket, dtype=torch.int64, device=dev),
          "slots": torch.full((bucket,), -1, dtype=torch.int64, device=dev),
          "lens": torch.zeros(bucket, dtype=torch.int64, device=dev),
          "bt": torch.zeros(bucket, meta.block_tables.shape[1], dtype=torch.int64, device=dev),
          "hidden": torch.zeros(bucket, runner.static["hidden"].shape[1], dtype=runner.dtype, device=dev)}
    st["ids"][:batch] = ids; st["pos"][:batch] = pos; st["slots"][:batch] = meta.slot_mapping
    st["lens"][:batch] = meta.context_lens; st["bt"][:batch] = meta.block_tables
    bounds = [bucket * i // parts for i in range(parts + 1)]
    streams = [torch.cuda.Stream() for _ in range(parts)]

    def forward_all():
        cur = torch.cuda.current_stream()
        for s in streams:
            s.wait_stream(cur)
        for s, lo, hi in zip(streams, bounds, bounds[1:]):
            with torch.cuda.stream(s):
                m = replace(meta, slot_mapping=st["slots"][lo:hi], block_tables=st["bt"][lo:hi],
                            context_lens=st["lens"][lo:hi], decode_order=None)
                st["hidden"][lo:hi] = runner.model(st["ids"][lo:hi], st["pos"][lo:hi], runner.backend.plan(m))
        for s in streams:
            cur.wait_stream(s)

    forward_all(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        forward_all()
    return g, st


def measure(llm) -> dict:
    runner = llm.model_runner
    torch.cuda.synchronize()
    seqs = list(llm.scheduler.running)
    ids, pos, meta = runner.prepare_decode(seqs)
    ids = torch.zeros_like(ids)
    batch = len(seqs)
    bucket = min(b for b in runner.graphs if b >= batch)
    ctx = int(meta.context_lens.sum())
    res = {"batch": batch, "bucket": bucket, "sum_context": ctx, "kv_ms_at_3TBps": ctx * 114688 / 3e9}
    runner._replay_decode_graph(ids, pos, meta)
    ref = runner.static["hidden"][:batch].clone()
    default_decode = runner.backend.decode
    for name, parts, cfg in VARIANTS:
        key = name + ("" if cfg is None else "_%dx%dw%ds" % cfg)
        try:
            if cfg is not None:
                runner.backend.decode = functools.partial(paged_decode_attention, block_n=cfg[0], num_warps=cfg[1],
                                                          num_stages=cfg[2])
            if name == "engine":
                runner._replay_decode_graph(ids, pos, meta)
                g = runner.graphs[bucket]
                out = runner.static["hidden"][:batch]
            else:
                g, st = capture_split(runner, ids, pos, meta, bucket, parts)
                out = st["hidden"][:batch]
            ms = time_graph(g)
            diff = (out.float() - ref.float()).abs().max().item()
            res[key] = {"ms": round(ms, 4), "max_abs_diff_vs_engine": diff}
            if name != "engine":
                del g, st
        except Exception as err:  # noqa: BLE001
            res[key] = repr(err)[:300]
        finally:
            runner.backend.decode = default_decode
        print(key, res[key], flush=True)
    return res


@torch.inference_mode()
def main() -> None:
    model = str(make_random_model(random_model_dir()))
    requests = make_workload("bench-256", 151936)
    max_len = max(len(r.prompt) + r.output_len for r in requests)
    llm = LLM(model, max_model_len=max_len, device="cuda", dtype="bfloat16", max_num_seqs=256,
              max_num_batched_tokens=16384, kvcache_block_size=16, async_scheduling=True)
    warm = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 4
    llm.generate([r.prompt[:64][::-1] for r in requests[:4]], warm, use_tqdm=False)
    gc.collect(); gc.freeze()
    results = []
    pending = list(TARGETS)
    with full_collections_deferred():
        for r in requests:
            llm.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True))
        decode_steps = 0
        while not llm.is_finished() and pending:
            prefilling = any(s.in_prefill for s in llm.sequences.values())
            if not prefilling and decode_steps > 20 and len(llm.scheduler.running) <= pending[0]:
                while pending and len(llm.scheduler.running) <= pending[0]:
                    pending.pop(0)
                print("=== batch", len(llm.scheduler.running), flush=True)
                results.append(measure(llm))
                json.dump(results, open(os.path.join(OUT, "s12_overlap.json"), "w"), indent=1)
            llm.step()
            if not prefilling:
                decode_steps += 1


if __name__ == "__main__":
    main()
