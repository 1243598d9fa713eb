"""Tile-shape sweep for the paged decode kernel over bench-256's own decode steps (GPU).

Session 1 chose the decode kernel's tiles (BLOCK_N 128, 4 warps, 2 stages) on one
uniform batch. bench-256's decode steps differ: the batch shrinks from 256 to 1 while
the contexts grow, and with BLOCK_N 128 and two stages a program's K/V buffers take
128 KB of shared memory, so one program fits on a multiprocessor and nothing hides the
latency of its first loads (row order, context length, block table, then K). This times
the kernel as the engine runs it (inside a CUDA graph, rows longest first, the split rule
of `num_splits`) on snapshots of the run: decode step t holds every request whose output
is longer than t + 1 tokens, each at context prompt + t + 1, all 256 having started
together after the prefills (max_num_seqs 256). Each configuration's time is summed over
the snapshots, each standing for the steps until the next one, x 28 layers: an estimate of
the run's decode-attention seconds.
Run: python scripts/decode_tiles.py [--every 64] [--out tiles.json]
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

sys.path.insert(0, ".")
sys.path.insert(0, "scripts")
from courseware.bench import make_workload  # noqa: E402
from decode_splits import graph_time_us  # noqa: E402
from reference.kernels.paged_decode import longest_first, paged_decode_attention  # noqa: E402

# (BLOCK_N, warps, stages); the first is the engine's.
CONFIGS = ((128, 4, 2), (128, 4, 1), (64, 4, 1), (64, 4, 2), (64, 2, 2), (32, 4, 2), (32, 4, 3), (32, 2, 3),
           (128, 8, 1), (64, 8, 2))
PAGE, KV_HEADS, Q_HEADS, DIM, LAYERS = 16, 8, 16, 128, 28


def snapshots(every: int) -> list[tuple[int, list[int], int]]:
    """(step, contexts of the rows, steps it stands for) every `every` decode steps of bench-256."""
    requests = make_workload("bench-256", 151936)
    last = max(r.output_len for r in requests) - 1
    steps = list(range(0, last, every))
    out = []
    for i, t in enumerate(steps):
        lens = [len(r.prompt) + t + 1 for r in requests if r.output_len > t + 1]
        span = (steps[i + 1] if i + 1 < len(steps) else last) - t
        if lens:
            out.append((t, lens, span))
    return out


def case(lens: list[int]):
    """Per-layer caches (enough layers to exceed the L2), scattered pages, one query."""
    blocks = [(n + PAGE - 1) // PAGE for n in lens]
    total = sum(blocks)
    layer_bytes = 2 * sum(lens) * KV_HEADS * DIM * 2
    layers = max(2, min(LAYERS, -(-256 * 2**20 // layer_bytes)))
    caches = [(torch.randn(total, PAGE, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16),
               torch.randn(total, PAGE, KV_HEADS, DIM, device="cuda", dtype=torch.bfloat16))
              for _ in range(layers)]
    pages = torch.randperm(total, device="cuda")
    tables = torch.zeros(len(lens), max(blocks), dtype=torch.int64, device="cuda")
    start = 0
    for row, n in enumerate(blocks):
        tables[row, :n] = pages[start:start + n]
        start += n
    context = torch.tensor(lens, device="cuda")
    q = torch.randn(len(lens), Q_HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    return q, caches, tables, context, layer_bytes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--every", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args()
    rows, totals = [], {c: 0.0 for c in CONFIGS}
    names = [f"{n}/{w}w/{s}s" for n, w, s in CONFIGS]
    print(f"{'step':>5} {'batch':>5} {'mean ctx':>8} " + " ".join(f"{n:>10}" for n in names) + "   (us a layer; GB/s of the first)")
    for step, lens, span in snapshots(args.every):
        q, caches, tables, context, layer_bytes = case(lens)
        order = longest_first(context)
        us = {c: graph_time_us(lambda k, v, c=c: paged_decode_attention(
            q, k, v, tables, context, DIM ** -0.5, block_n=c[0], num_warps=c[1], num_stages=c[2], order=order), caches)
            for c in CONFIGS}
        for c in CONFIGS:
            totals[c] += us[c] * 1e-6 * LAYERS * span
        rows.append({"step": step, "batch": len(lens), "mean_context": sum(lens) / len(lens), "span": span,
                     "layer_bytes": layer_bytes, "us": {n: us[c] for n, c in zip(names, CONFIGS)}})
        print(f"{step:5d} {len(lens):5d} {sum(lens) / len(lens):8.0f} " + " ".join(f"{us[c]:10.1f}" for c in CONFIGS)
              + f"   {layer_bytes / (us[CONFIGS[0]] * 1e-6) / 1e9:6.0f}")
        del q, caches, tables, context
        torch.cuda.empty_cache()
    print("\nestimated decode-attention seconds over the run (snapshot x steps it stands for x 28 layers):")
    for n, c in sorted(zip(names, CONFIGS), key=lambda nc: totals[nc[1]]):
        print(f"  {n:>10}: {totals[c]:.3f} s  ({totals[c] / totals[CONFIGS[0]]:.3f}x the engine's)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "totals": {n: totals[c] for n, c in zip(names, CONFIGS)},
                       "gpu": torch.cuda.get_device_name()}, f, indent=1)


if __name__ == "__main__":
    main()
