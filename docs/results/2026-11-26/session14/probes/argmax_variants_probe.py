"""Session 14: variants of the greedy argmax's first kernel, against torch.argmax (one H100).

"one tile" is the kernel as first written (one 4096-logit piece per program, 8 warps, reduced
by tl.argmax; kept below). "looped" is the form reference/kernels/greedy_argmax.py took, its
`_piece_argmax_kernel` at other TILE, ITERS and warps: a running best (key, column) per lane
over ITERS tiles of TILE logits, reduced once at the end, so a program's loads overlap its
comparisons and there are fewer, longer programs. Each variant is checked token for token
against torch.argmax first, then timed as the small-kernels probe times: 20 launches in one
CUDA graph, median of 15 replays.

    python3 docs/results/2026-11-26/session14/probes/argmax_variants_probe.py out.json
"""
from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl

from reference.kernels.greedy_argmax import _float_key, _piece_argmax_kernel, _row_argmax_kernel
from small_kernels_probe import graph_us   # this folder's other probe: 20 launches a graph, median of 15


@triton.jit
def _one_tile_kernel(logits_ptr, keys_ptr, index_ptr, vocab, stride_row, num_chunks, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    cols = chunk * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=cols < vocab, other=0.0)
    key = tl.where(cols < vocab, _float_key(x.to(tl.float32)), -2147483648)
    best = tl.argmax(key, 0, tie_break_left=True)
    out = row * num_chunks + chunk
    tl.store(keys_ptr + out, tl.max(key, 0))
    tl.store(index_ptr + out, chunk * CHUNK + best)


def two_stage(logits, chunk, first_kernel, **shape):
    """Launch a first-stage kernel over rows x pieces of `chunk` logits, then the reference's second stage."""
    rows, vocab = logits.shape
    num_chunks = triton.cdiv(vocab, chunk)
    keys = torch.empty(rows, num_chunks, dtype=torch.int32, device=logits.device)
    index = torch.empty(rows, num_chunks, dtype=torch.int32, device=logits.device)
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    first_kernel[(rows, num_chunks)](logits, keys, index, vocab, logits.stride(0), num_chunks, **shape)
    _row_argmax_kernel[(rows,)](keys, index, tokens, num_chunks, BLOCK=triton.next_power_of_2(num_chunks),
                                num_warps=1)
    return tokens


def one_tile_argmax(logits, chunk=4096, warps=8):
    return two_stage(logits, chunk, _one_tile_kernel, CHUNK=chunk, num_warps=warps)


def looped_argmax(logits, tile, iters, warps):
    return two_stage(logits, tile * iters, _piece_argmax_kernel, TILE=tile, ITERS=iters, num_warps=warps)


def main(out_path: str) -> None:
    torch.manual_seed(0)
    variants = {"torch": lambda x: x.argmax(-1), "one tile 4096x8w": one_tile_argmax}
    for tile in (1024, 2048, 4096):
        for iters in (2, 4, 8, 16):
            for warps in (4, 8):
                if tile * iters <= 32768:
                    variants[f"looped {tile}x{iters} {warps}w"] = (
                        lambda x, t=tile, i=iters, w=warps: looped_argmax(x, t, i, w))
    result = {"device": torch.cuda.get_device_name(), "rows": []}
    for batch in (256, 168, 104, 40, 12):
        logits = torch.randn(batch, 151936, device="cuda").to(torch.bfloat16)
        logits[:, 5000] = logits[:, 90000] = 9.0                  # ties across pieces: the first must win
        want = logits.argmax(-1)
        row = {"batch": batch}
        for name, fn in variants.items():
            assert torch.equal(fn(logits), want), name
            row[name] = round(graph_us(lambda: fn(logits)), 2)
        best = min((v, k) for k, v in row.items() if k not in ("batch", "torch"))
        print(batch, "torch", row["torch"], "one tile", row["one tile 4096x8w"], "best", best, flush=True)
        result["rows"].append(row)
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "argmax_variants.json")
