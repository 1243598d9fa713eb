"""Session 14: the decode kernel's tile per CUDA-graph bucket, on bench-256's own block tables (one H100).

Runs bench-256's engine (async, graphs) step by step; each time the running batch first falls to a
multiple of 8 (256 down to 16), times the decode kernel over all 28 layers' caches as the engine's
graph runs it: rows padded to the batch's bucket (context 0, slot -1), ordered longest first, for a
few (BLOCK_N, warps, stages) shapes. 28 layers in one CUDA graph, median of 7 replays; outputs
compared with the engine's shape (bf16, so within rounding).

    python3 docs/results/2026-11-26/session14/probes/decode_tiles_by_bucket_probe.py out.json
"""
from __future__ import annotations

import gc
import json
import sys

import torch

sys.path.insert(0, ".")
from courseware.bench import make_random_model, make_workload, random_model_dir  # noqa: E402
from reference import LLM, SamplingParams  # noqa: E402
from reference.engine.collector import full_collections_deferred  # noqa: E402
from reference.kernels.paged_decode import longest_first, paged_decode_attention  # noqa: E402

SHAPES = [(128, 4, 2), (64, 4, 2), (64, 4, 3), (32, 4, 4)]


def padded(meta, bucket: int):
    """The graph's view: `bucket` rows, the real ones first, the rest context 0."""
    batch = meta.context_lens.shape[0]
    lens = torch.zeros(bucket, dtype=meta.context_lens.dtype, device="cuda")
    lens[:batch] = meta.context_lens
    tables = torch.zeros(bucket, meta.block_tables.shape[1], dtype=meta.block_tables.dtype, device="cuda")
    tables[:batch] = meta.block_tables
    return tables, lens


def time_shapes(llm, seqs) -> dict:
    runner = llm.model_runner
    _, _, meta = runner.prepare_decode(seqs)
    batch = len(seqs)
    bucket = min(b for b in runner.graphs if b >= batch)
    tables, lens = padded(meta, bucket)
    order = longest_first(lens)
    layers = runner.attention_layers
    q = torch.randn(bucket, layers[0].num_heads, layers[0].head_dim, device="cuda", dtype=torch.bfloat16)
    kv_bytes = int(lens.sum()) * 2 * layers[0].num_kv_heads * layers[0].head_dim * 2 * len(layers)
    row = {"batch": batch, "bucket": bucket, "sum_context": int(lens.sum())}
    reference = None
    for block_n, warps, stages in SHAPES:
        def step():
            return [paged_decode_attention(q, a.k_cache, a.v_cache, tables, lens, a.scale, block_n=block_n,
                                           num_warps=warps, num_stages=stages, order=order) for a in layers]
        outs = step()
        if reference is None:
            reference = outs[0][:batch].float()
        err = float((outs[0][:batch].float() - reference).norm() / reference.norm())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        times = []
        for _ in range(7):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); graph.replay(); b.record(); b.synchronize()
            times.append(a.elapsed_time(b))
        ms = sorted(times)[3]
        row[f"{block_n}x{warps}w{stages}s"] = {"ms": round(ms, 4), "GBps": round(kv_bytes / ms / 1e6),
                                               "rel_err_vs_first": err}
        del graph
    return row


@torch.inference_mode()
def main(out_path: str) -> None:
    model = str(make_random_model(random_model_dir()))
    requests = make_workload("bench-256", 151936)
    max_len = max(len(r.prompt) + r.output_len for r in requests)
    llm = LLM(model, max_model_len=max_len, device="cuda", dtype="bfloat16", max_num_seqs=256,
              max_num_batched_tokens=16384, kvcache_block_size=16, async_scheduling=True)
    warm = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 4
    llm.generate([r.prompt[:64][::-1] for r in requests[:4]], warm, use_tqdm=False)
    gc.collect(); gc.freeze(); torch.cuda.synchronize()
    pending = list(range(256, 15, -8))
    rows = []
    with full_collections_deferred():
        for r in requests:
            llm.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True))
        decode_steps = 0
        while not llm.is_finished():
            batch = len(llm.scheduler.running)
            prefilling = any(s.in_prefill for s in llm.sequences.values())
            if not prefilling and pending and batch <= pending[0] and decode_steps > 20:
                while pending and batch <= pending[0]:
                    pending.pop(0)
                torch.cuda.synchronize()
                row = time_shapes(llm, list(llm.scheduler.running))
                rows.append(row)
                print(json.dumps({k: (v["ms"] if isinstance(v, dict) else v) for k, v in row.items()}), flush=True)
            llm.step()
            if not prefilling:
                decode_steps += 1
    json.dump({"device": torch.cuda.get_device_name(), "shapes": SHAPES, "rows": rows}, open(out_path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "decode_tiles_by_bucket.json")
