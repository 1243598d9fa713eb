"""Split-K sweep for the paged decode kernel (GPU; the measurement behind `num_splits`).

For each batch size and context length of the Qwen3-0.6B attention shape (16 query
heads, 8 KV heads, head dim 128, bf16, pages of 16), times one layer's decode
kernel with 1, 2, 4, ... 32 splits (`triton.testing.do_bench`, median, L2 flushed
between runs) and prints, per batch, the split count with the least total time over
the context lengths: the rule `reference.kernels.paged_decode.SPLITS_BY_BATCH` encodes.
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
    blocks = (context + page - 1) // page
    k = torch.randn(batch * blocks, page, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    tables = torch.randperm(batch * blocks, device="cuda").view(batch, blocks)   # scattered pages
    lens = torch.full((batch,), context, device="cuda")
    q = torch.randn(batch, q_heads, dim, device="cuda", dtype=torch.bfloat16)
    return q, k, v, tables, lens


def main() -> None:
    from triton.testing import do_bench
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = []
    print(f"{'batch':>5} {'context':>7} " + " ".join(f"{'s=' + str(s):>8}" for s in SPLITS) + "   best  GB/s(best)")
    for batch in BATCHES:
        for context in CONTEXTS:
            q, k, v, tables, lens = case(batch, context)
            times = {}
            for s in SPLITS:
                times[s] = do_bench(lambda: paged_decode_attention(q, k, v, tables, lens, 128 ** -0.5, splits=s),
                                    warmup=10, rep=60, return_mode="median") * 1e3   # us
            best = min(times, key=times.get)
            gbps = 2 * k.numel() * k.element_size() / (times[best] * 1e-6) / 1e9
            rows.append({"batch": batch, "context": context, "us": times, "best": best})
            print(f"{batch:5d} {context:7d} " + " ".join(f"{times[s]:8.1f}" for s in SPLITS)
                  + f"   {best:4d}  {gbps:8.0f}")
            del q, k, v, tables, lens
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
