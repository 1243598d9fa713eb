"""Hidden lab 4 tests: torch paged-attention decode over the paged cache, seeded random inputs.

Outputs are floats: they are compared with the reference's within a relative
tolerance of 1e-4, enough for any sound order of summation in fp32.
"""
from __future__ import annotations

import pytest
import torch

from _inferlab_support import approx, module


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (4, 2)])
@pytest.mark.parametrize("lens", [[1], [4, 9, 2], [16, 3]])
def test_paged_decode(observe, heads, kv_heads, lens):
    attention = module("layers.attention")
    g = torch.Generator().manual_seed(sum(lens) * 10 + heads + kv_heads)
    block_size, dim, num_blocks = 4, 8, 16
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    order = torch.randperm(num_blocks, generator=g).tolist()
    tables, used = [], 0
    for n in lens:
        need = -(-n // block_size)
        tables.append(order[used:used + need])
        used += need
    width = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    meta = attention.AttentionMetadata(is_prefill=False, slot_mapping=torch.full((len(lens),), -1),
                                       block_tables=block_tables, context_lens=torch.tensor(lens),
                                       max_seqlen_q=1, max_seqlen_k=max(lens))
    q = torch.randn(len(lens), heads, dim, generator=g)
    out = attention.TorchAttentionBackend()._decode(q, k_cache, v_cache, meta, dim ** -0.5)
    observe("shape", list(out.shape))
    observe("output", approx(out.flatten().tolist(), 1e-4))
