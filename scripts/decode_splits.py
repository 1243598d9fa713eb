"""Split-K sweep for the paged decode kernel (GPU; the measurement behind `num_splits`).

For each batch size and context length of the Qwen3-0.6B attention shape (16 query
heads, 8 KV heads, head dim 128, bf16, pages of 16), times the decode kernel with
1, 2, 4, ... 32 splits as the engine runs it: inside a CUDA graph (as decode steps
replay), one call per layer over layers' own caches (up to 28, enough that together
they exceed the 50 MB L2, as a model's layers do), median of `triton.testing.do_bench`
over graph replays, divided by the calls. Timing single eager calls instead measures
Triton's launch overhead (two kernels for a split), not the GPU.
Prints, per batch, the split count with the least total time over the context
lengths: the rule `reference.kernels.paged_decode.SPLITS_BY_BATCH` encodes.
Run: python scripts/decode_splits.py [--out splits.json]
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

sys.path.insert(0, ".")
from reference.kernels.paged_decode import num_splits, paged_decode_attention  # noqa: E402

BATCHES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)
CONTEXTS = (256, 1024, 2048)
SPLITS = (1, 2, 4, 8, 16, 32)


def case(batch: int, context: int, page: int = 16, kv_heads: int = 8, q_heads: int = 16, dim: int = 128):
    """Per-layer caches (as many layers as make 256 MB, at most 28), one block table, one query."""
    blocks = (context + page - 1) // page
    layer_bytes = 2 * batch * blocks * page * kv_heads * dim * 2
    layers = max(1, min(28, -(-256 * 2**20 // layer_bytes)))
    caches = [(torch.randn(batch * blocks, page, kv_heads, dim, device="cuda", dtype=torch.bfloat16),
               torch.randn(batch * blocks, page, kv_heads, dim, device="cuda", dtype=torch.bfloat16))
              for _ in range(layers)]
    tables = torch.randperm(batch * blocks, device="cuda").view(batch, blocks)   # scattered pages
    lens = torch.full((batch,), context, device="cuda")
    q = torch.randn(batch, q_heads, dim, device="cuda", dtype=torch.bfloat16)
    return q, caches, tables, lens, layer_bytes


def graph_time_us(call, caches) -> float:
    """Per-call GPU time of `call(k_cache, v_cache)` (the decode kernel or kernels of one layer),
    from replays of a graph of one call per layer's caches."""
    from triton.testing import do_bench
    run = lambda: [call(k, v) for k, v in caches]
    run()   # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    ms = do_bench(graph.replay, warmup=10, rep=80, return_mode="median")
    return ms * 1e3 / len(caches)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = []
    print(f"{'batch':>5} {'context':>7} " + " ".join(f"{'s=' + str(s):>8}" for s in SPLITS) + "   best  GB/s(best)")
    for batch in BATCHES:
        for context in CONTEXTS:
            q, caches, tables, lens, layer_bytes = case(batch, context)
            times = {s: graph_time_us(lambda k, v, s=s: paged_decode_attention(q, k, v, tables, lens, 128 ** -0.5,
                                                                              splits=s), caches)
                     for s in SPLITS}
            best = min(times, key=times.get)
            gbps = layer_bytes / (times[best] * 1e-6) / 1e9
            rows.append({"batch": batch, "context": context, "us": times, "best": best, "layers": len(caches)})
            print(f"{batch:5d} {context:7d} " + " ".join(f"{times[s]:8.1f}" for s in SPLITS)
                  + f"   {best:4d}  {gbps:8.0f}")
            del q, caches, tables, lens
            torch.cuda.empty_cache()
    print("\nper batch: splits with the least summed time over the contexts (rule now in code)")
    rule = []
    for batch in BATCHES:
        mine = [r for r in rows if r["batch"] == batch]
        total = {s: sum(r["us"][s] for r in mine) for s in SPLITS}
        best = min(total, key=total.get)
        rule.append({"batch": batch, "best": best, "in_code": num_splits(batch, 8),
                     "gain_vs_1": total[1] / total[best], "in_code_vs_best": total[num_splits(batch, 8)] / total[best]})
        print(f"  batch {batch:4d}: best {best:2d} ({total[1] / total[best]:.2f}x over no split); "
              f"code picks {num_splits(batch, 8):2d} ({total[num_splits(batch, 8)] / total[best]:.3f}x of best)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "rule": rule, "gpu": torch.cuda.get_device_name()}, f, indent=1)


if __name__ == "__main__":
    main()
