"""The online-softmax step both attention kernels fold their key tiles with.

Attention over a long context cannot hold all its scores at once, so the
kernels walk the keys in tiles and keep, per query row, the running maximum m
of the scores seen so far, the running sum l of exp(score - m), and the
unnormalised output acc; a tile with a larger maximum rescales what came
before by exp(m_old - m_new) (FlashAttention's recurrence). The paged decode
kernel (keys found through a block table) and the prefill kernel (packed
rows, causal) differ in how they load a tile and mask it, not in this step,
so it is written once, here.

Scores are in log2 units (the kernels fold log2(e) into the softmax scale),
so the step uses exp2, the instruction the GPU has; exp would be exp2 after
a multiply.
"""
from __future__ import annotations

import math

import triton
import triton.language as tl

LOG2_E = 1.0 / math.log(2.0)


@triton.jit
def online_softmax_step(acc, m, l, s, v, PRECISION: tl.constexpr):
    """Fold one tile into (acc, m, l) and return them.

    s [rows, keys]: the tile's scores in log2 units, -inf where a key is
    masked; v [keys, head_dim]: its values. Every row must see at least one
    key in its first tile, or exp2(-inf - -inf) would be NaN.
    """
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m - m_new)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    l = l * alpha + tl.sum(p, 1)
    return acc, m_new, l
