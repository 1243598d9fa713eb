"""The flash-attn backend against flash-attn's documented contract (tests/engine/fake_flash_attn.py).

The real `flash_attn` package has no wheel for our machines, so it has never
run here; these tests check what can be checked without it: that "auto" picks
the backend when the package imports, and that the backend's calls (layouts,
int32 metadata, paged block tables, bottom-right causal masks) give the torch
oracle's result under the contract the package documents. The KV store runs in
Triton's interpreter on the CPU (compiled on a GPU machine).
"""
from __future__ import annotations

import os
import sys

import pytest
import torch

pytest.importorskip("triton", reason="triton comes with the kernels extra (Linux x86-64): pip install -e '.[kernels]'")

from reference.layers import attention  # noqa: E402
from reference.layers.attention import AttentionMetadata, TorchAttentionBackend  # noqa: E402
from tests.engine import fake_flash_attn  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PAGE = 256   # flash-attn's paged kernels need a multiple of 256


@pytest.fixture
def flash(monkeypatch):
    """FlashAttnBackend over the stand-in package."""
    if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the Triton KV store needs the interpreter on a CPU-only machine")
    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn)
    fake_flash_attn.calls.clear()
    return attention.FlashAttnBackend()


def paged_case(cached: list[int], new: list[int], kv_heads: int, q_heads: int, dim: int, seed: int):
    """Random q/k/v for `new` tokens per sequence after `cached` ones, over shuffled pages of 256."""
    gen = torch.Generator().manual_seed(seed)
    ctx = [c + n for c, n in zip(cached, new)]
    blocks = [(n + PAGE - 1) // PAGE for n in ctx]
    order = torch.randperm(sum(blocks) + 2, generator=gen).tolist()
    tables, slots, used = [], [], 0
    for c, n, b in zip(cached, ctx, blocks):
        row = order[used:used + b]
        used += b
        tables.append(row + [0] * (max(blocks) - b))
        slots += [row[p // PAGE] * PAGE + p % PAGE for p in range(c, n)]
    cache_k = torch.randn(len(order), PAGE, kv_heads, dim, generator=gen)
    cache_v = torch.randn(len(order), PAGE, kv_heads, dim, generator=gen)
    total = sum(new)
    q = torch.randn(total, q_heads, dim, generator=gen)
    k = torch.randn(total, kv_heads, dim, generator=gen)
    v = torch.randn(total, kv_heads, dim, generator=gen)
    cu_q = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()])
    cu_k = torch.tensor([0, *torch.tensor(ctx).cumsum(0).tolist()])
    is_prefill = not all(n == 1 for n in new) or not any(cached)
    meta = AttentionMetadata(is_prefill, torch.tensor(slots), torch.tensor(tables), torch.tensor(ctx),
                             cu_q if is_prefill else None, cu_k if is_prefill else None, max(new), max(ctx),
                             has_cached_prefix=any(cached), num_context_tokens=sum(ctx))
    to = lambda t: t.to(DEVICE) if isinstance(t, torch.Tensor) else t
    meta = AttentionMetadata(**{f: to(getattr(meta, f)) for f in meta.__dataclass_fields__})
    return [to(t) for t in (q, k, v, cache_k, cache_v)], meta


def both_backends(flash, tensors, meta, scale):
    q, k, v, cache_k, cache_v = tensors
    want_k, want_v = cache_k.clone(), cache_v.clone()
    want = TorchAttentionBackend().forward(q, k, v, want_k, want_v, meta, scale)
    got = flash.forward(q, k, v, cache_k, cache_v, meta, scale)
    assert torch.equal(cache_k, want_k) and torch.equal(cache_v, want_v), "the new K/V went to other slots"
    return got, want


@pytest.mark.parametrize("cached, new, route", [
    ([0, 0, 0], [37, 256, 300], "varlen"),             # fresh prompts: keys are the new tokens
    ([256, 0, 512], [40, 90, 7], "varlen_paged"),      # chunks after a cached prefix: keys from the paged cache
    ([255, 300, 600, 1], [1, 1, 1, 1], "kvcache"),     # decode: one query per sequence over its whole cache
])
def test_backend_matches_the_torch_oracle(flash, cached, new, route):
    for seed in range(2):
        tensors, meta = paged_case(cached, new, kv_heads=2, q_heads=8, dim=32, seed=seed)
        fake_flash_attn.calls.clear()
        got, want = both_backends(flash, tensors, meta, 32 ** -0.5)
        assert fake_flash_attn.calls == [route]
        assert float((got - want).norm() / want.norm()) < 1e-5, f"seed {seed}"


def test_decode_padding_rows_are_zero(flash):
    """CUDA-graph padding rows have context length 0 and slot -1: zero output, no cache write."""
    tensors, meta = paged_case([40, 10], [1, 1], kv_heads=2, q_heads=4, dim=16, seed=3)
    meta.context_lens[1] = 0
    meta.slot_mapping[1] = -1
    q, k, v, cache_k, cache_v = tensors
    before = cache_k.clone()
    out = flash.forward(q, k, v, cache_k, cache_v, meta, 0.25)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    changed = (cache_k != before).flatten(2).any(-1).flatten().nonzero().flatten()
    assert changed.tolist() == [int(meta.slot_mapping[0])]


def test_auto_picks_flash_attn_only_with_pages_of_256(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn)
    assert attention.make_backend("auto", "cuda", 256).name == "flash-attn"
    assert attention.make_backend("auto", "cuda", 16).name in ("triton", "torch")
    assert attention.make_backend("auto", "cpu", 256).name == "torch"
    with pytest.raises(ValueError, match="multiple of 256"):
        attention.make_backend("flash-attn", "cuda", 16)


def test_asking_for_flash_attn_without_the_package_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)   # import fails
    with pytest.raises(ValueError, match="flash_attn package does not import"):
        attention.make_backend("flash-attn", "cuda", 256)
    assert attention.make_backend("auto", "cuda", 256).name in ("triton", "torch")
