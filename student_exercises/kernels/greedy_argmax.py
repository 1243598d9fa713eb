# Generated from reference/kernels/greedy_argmax.py by `inferlab exercises build`. Write your code only inside the EXERCISE regions.
"""Greedy decoding's argmax over the vocabulary, one token per row, in two small launches.

torch's reduction gives each row to a few thread blocks, and at a decode
batch of 100-256 rows of ~150k logits it reads well under the GPU's
bandwidth (docs/performance.md, session 14). Here the first kernel splits
every row into pieces of ITERS x TILE logits, so rows x pieces programs fill
the GPU; each keeps a running best per lane over its tiles (so its loads
overlap its comparisons) and reduces once, writing the piece's best (key,
column). The second kernel picks each row's best piece.

The answer must be torch.argmax's, token for token, so that greedy output
does not depend on the backend. So the comparison is on integer keys that
order like the floats and keep torch's rules: the first index wins a tie,
NaN beats everything (the first NaN wins), and -0.0 ties +0.0.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# 4 tiles of 1024 logits (4 warps) a program: the fastest, over batches of 12-256 rows, of the shapes
# swept on an H100 (docs/performance.md, session 14). A 151,936-token vocabulary is 38 pieces a row.
TILE, ITERS = 1024, 4


@triton.jit
def _float_key(x):
    """An int32 that orders like the float x (fp32), with NaN above +inf and -0.0 equal to +0.0."""
    x = tl.where(x == 0.0, 0.0, x)
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)   # negatives: larger magnitude, smaller key
    return tl.where(x != x, 2147483647, key)   # 2^31 - 1: above +inf's key, 0x7F800000


@triton.jit
def _piece_argmax_kernel(logits_ptr, keys_ptr, index_ptr, vocab, stride_row, num_pieces,
                         TILE: tl.constexpr, ITERS: tl.constexpr):
    row = tl.program_id(0)
    piece = tl.program_id(1)
    lanes = tl.arange(0, TILE)
    best_key = tl.full([TILE], -2147483648, tl.int32)   # -2^31: below -inf's key
    best_col = tl.zeros([TILE], tl.int32)
    logits_row = logits_ptr + row.to(tl.int64) * stride_row
    for i in range(ITERS):
        cols = (piece * ITERS + i) * TILE + lanes
        x = tl.load(logits_row + cols, mask=cols < vocab, other=0.0)
        key = tl.where(cols < vocab, _float_key(x.to(tl.float32)), -2147483648)
        take = key > best_key            # strictly: a lane keeps its earliest column of a tie
        best_key = tl.where(take, key, best_key)
        best_col = tl.where(take, cols, best_col)
    top = tl.max(best_key, 0)
    out = row * num_pieces + piece
    tl.store(keys_ptr + out, top)
    tl.store(index_ptr + out, tl.min(tl.where(best_key == top, best_col, 2147483647), 0))   # earliest lane's


@triton.jit
def _row_argmax_kernel(keys_ptr, index_ptr, tokens_ptr, num_pieces, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    pieces = tl.arange(0, BLOCK)
    key = tl.load(keys_ptr + row * num_pieces + pieces, mask=pieces < num_pieces, other=-2147483648)
    best = tl.argmax(key, 0, tie_break_left=True)   # pieces are in column order: the earliest best wins
    tl.store(tokens_ptr + row, tl.load(index_ptr + row * num_pieces + best).to(tl.int64))


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """torch.argmax(logits, dim=-1) for [rows, vocab] float logits on the GPU (int64 [rows])."""
    if logits.dim() != 2 or logits.stride(1) != 1 or not logits.is_floating_point():
        raise ValueError(f"greedy_argmax takes [rows, vocab] float logits with contiguous rows, got "
                         f"{logits.dtype} of shape {tuple(logits.shape)} and strides {logits.stride()}")
    rows, vocab = logits.shape
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return tokens
    if vocab == 0:
        raise ValueError("greedy_argmax needs at least one logit per row")
    num_pieces = triton.cdiv(vocab, TILE * ITERS)
    keys = torch.empty(rows, num_pieces, dtype=torch.int32, device=logits.device)
    index = torch.empty(rows, num_pieces, dtype=torch.int32, device=logits.device)
    _piece_argmax_kernel[(rows, num_pieces)](logits, keys, index, vocab, logits.stride(0), num_pieces,
                                             TILE=TILE, ITERS=ITERS, num_warps=4)
    _row_argmax_kernel[(rows,)](keys, index, tokens, num_pieces, BLOCK=triton.next_power_of_2(num_pieces),
                                num_warps=1)
    return tokens
