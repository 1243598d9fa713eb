"""Probe (docs/performance.md, session 12): would decode GEMMs gain from weights already in L2, and can the attention kernel
put them there while it streams the KV cache?

Synthetic decode step at the Qwen3-0.6B shape (28 layers, bf16), batch B with contexts like bench-256's
128-255 band; per layer: attention, then o (addmm_), gate_up, down (addmm_), next qkv. All captured in one
CUDA graph; median of rounds. Variants:
  gemms_cold   the 4 GEMMs of 28 distinct layers (weights from DRAM)
  gemms_hot    the 4 GEMMs of layer 0, 28 times (weights in L2)
  base         attention (main's kernel) + GEMMs
  ef           attention with KV loads evict_first + GEMMs
  pf_end/pf_start  attention with evict_first KV loads and extra programs (at the end / start of the grid)
               that load layer l's o/gate_up/down and layer l+1's qkv with evict_last; then the GEMMs
"""
from __future__ import annotations

import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, ".")
from reference.kernels.online_softmax import LOG2_E, online_softmax_step  # noqa: E402
from reference.kernels.paged_decode import longest_first, paged_decode_attention  # noqa: E402

OUT = os.environ.get("OUT", ".")
H, I, QH, KVH, D, L, PAGE = 1024, 3072, 16, 8, 128, 28, 16


@triton.jit
def _prefetch(ptr, n, pid, nprog, CHUNK: tl.constexpr):
    acc = tl.zeros([CHUNK], tl.float32)
    for start in range(pid * CHUNK, n, nprog * CHUNK):
        offs = start + tl.arange(0, CHUNK)
        acc += tl.load(ptr + offs, mask=offs < n, other=0.0, eviction_policy="evict_last").to(tl.float32)
    return tl.sum(acc, 0)


@triton.jit
def _decode_pf_kernel(q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, order_ptr, out_ptr,
                      pf0_ptr, pf0_n, pf1_ptr, pf1_n, sink_ptr, n_attn, n_pf,
                      qk_scale, stride_qt, stride_qh, stride_cb, stride_cs, stride_ch, stride_bt,
                      stride_ot, stride_oh,
                      GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr,
                      PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, KV_HEADS: tl.constexpr,
                      EVICT: tl.constexpr, PF_FIRST: tl.constexpr, CHUNK: tl.constexpr):
    pid = tl.program_id(0)
    if PF_FIRST:
        is_pf = pid < n_pf
        apid = pid - n_pf
        ppid = pid
    else:
        is_pf = pid >= n_attn
        apid = pid
        ppid = pid - n_attn
    if is_pf:
        s = _prefetch(pf0_ptr, pf0_n, ppid, n_pf, CHUNK) + _prefetch(pf1_ptr, pf1_n, ppid, n_pf, CHUNK)
        tl.store(sink_ptr + ppid, s)
        return
    rank = apid // KV_HEADS
    kv_head = apid % KV_HEADS
    seq = tl.load(order_ptr + rank)
    context_len = tl.load(context_lens_ptr + seq)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_n = tl.arange(0, BLOCK_N)
    head_mask = offs_h < GROUP
    heads = kv_head * GROUP + offs_h
    q = tl.load(q_ptr + seq * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=head_mask[:, None], other=0.0)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for start in range(0, context_len, BLOCK_N):
        tokens = start + offs_n
        valid = tokens < context_len
        pages = tl.load(block_tables_ptr + seq * stride_bt + tokens // PAGE_SIZE, mask=valid, other=0)
        rows = pages.to(tl.int64) * stride_cb + (tokens % PAGE_SIZE) * stride_cs + kv_head * stride_ch
        k = tl.load(k_cache_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0,
                    eviction_policy=EVICT)
        s = tl.dot(q, tl.trans(k), input_precision="tf32") * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        v = tl.load(v_cache_ptr + rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0,
                    eviction_policy=EVICT)
        acc, m, l = online_softmax_step(acc, m, l, s, v, "tf32")
    out = acc / tl.maximum(l, 1e-30)[:, None]
    tl.store(out_ptr + seq * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=head_mask[:, None])


def decode_pf(q, kc, vc, bt, lens, order, scale, pf, sink, evict, n_pf, pf_first, chunk=4096):
    batch = q.shape[0]
    out = torch.empty_like(q)
    n_attn = batch * KVH
    (p0, p1) = pf if pf is not None else (sink, sink)
    n0, n1 = (p0.numel(), p1.numel()) if pf is not None else (0, 0)
    _decode_pf_kernel[(n_attn + n_pf,)](
        q, kc, vc, bt, lens, order, out, p0, n0, p1, n1, sink, n_attn, n_pf, scale * LOG2_E,
        q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), bt.stride(0), out.stride(0), out.stride(1),
        GROUP=QH // KVH, BLOCK_H=16, HEAD_DIM=D, PAGE_SIZE=PAGE, BLOCK_N=128, KV_HEADS=KVH, EVICT=evict,
        PF_FIRST=pf_first, CHUNK=chunk, num_warps=4, num_stages=2)
    return out


def timed(fn, rounds=7, reps=5):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    ts = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / reps)
    del g
    return sorted(ts)[len(ts) // 2]


@torch.inference_mode()
def main():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    results = {}
    for batch, lo, hi in [(168, 500, 1400), (232, 400, 1100), (104, 700, 1700)]:
        lens_list = torch.randint(lo, hi, (batch,)).tolist()
        blocks = [(n + PAGE - 1) // PAGE for n in lens_list]
        nblocks = sum(blocks)
        max_blocks = max(blocks)
        perm = torch.randperm(nblocks)
        bt = torch.zeros(batch, max_blocks, dtype=torch.int64)
        at = 0
        for i, nb in enumerate(blocks):
            bt[i, :nb] = perm[at:at + nb]; at += nb
        bt = bt.to(dev)
        lens = torch.tensor(lens_list, device=dev)
        order = longest_first(lens)
        kv = torch.randn(2, L, nblocks, PAGE, KVH, D, device=dev, dtype=dt)
        # weights: per layer one buffer [o | gate_up | down | qkv] so the prefetch ranges are contiguous
        per = H * QH * D + 2 * I * H + H * I + (QH + 2 * KVH) * D * H
        wbuf = torch.randn(L + 1, per, device=dev, dtype=dt) * 0.02
        def W(l):
            b, at = wbuf[l], 0
            out = []
            for n, k in ((H, QH * D), (2 * I, H), (H, I), ((QH + 2 * KVH) * D, H)):
                out.append(b[at:at + n * k].view(n, k)); at += n * k
            return out  # o [H, 2048], gate_up [6144, H], down [H, I], qkv [4096, H]
        Ws = [W(l) for l in range(L + 1)]
        pf_ranges = [(wbuf[l][: per - (QH + 2 * KVH) * D * H], wbuf[l + 1][per - (QH + 2 * KVH) * D * H:])
                     for l in range(L)]
        q = torch.randn(batch, QH, D, device=dev, dtype=dt)
        attn_out = torch.randn(batch, QH * D, device=dev, dtype=dt)
        x = torch.randn(batch, H, device=dev, dtype=dt)
        act = torch.randn(batch, I, device=dev, dtype=dt)
        sink = torch.zeros(4096, device=dev, dtype=torch.float32)
        res = {"batch": batch, "kv_ms_at_3TBps": sum(lens_list) * 114688 / 3e9}

        def gemms(l):
            o, gu, dn, qkv = Ws[l]
            x.addmm_(attn_out, o.t())
            torch.mm(x, gu.t())
            x.addmm_(act, dn.t())
            torch.mm(x, qkv.t())

        res["gemms_cold"] = timed(lambda: [gemms(l) for l in range(L)])
        res["gemms_hot"] = timed(lambda: [gemms(0) for l in range(L)])
        res["attn_main"] = timed(lambda: [paged_decode_attention(q, kv[0, l], kv[1, l], bt, lens, D ** -0.5, order=order)
                                          for l in range(L)])
        res["base"] = timed(lambda: [(paged_decode_attention(q, kv[0, l], kv[1, l], bt, lens, D ** -0.5, order=order),
                                      gemms(l)) for l in range(L)])
        for name, evict, n_pf, first in [("probe_noef", "", 0, False), ("ef", "evict_first", 0, False),
                                         ("pf_end132", "evict_first", 132, False), ("pf_start132", "evict_first", 132, True),
                                         ("pf_end264", "evict_first", 264, False), ("pf_end132_noef", "", 132, False),
                                         ("pf_start66", "evict_first", 66, True)]:
            def step(evict=evict, n_pf=n_pf, first=first):
                for l in range(L):
                    decode_pf(q, kv[0, l], kv[1, l], bt, lens, order, D ** -0.5, pf_ranges[l] if n_pf else None, sink,
                              evict, n_pf, first)
                    gemms(l)
            def attn_only(evict=evict, n_pf=n_pf, first=first):
                for l in range(L):
                    decode_pf(q, kv[0, l], kv[1, l], bt, lens, order, D ** -0.5, pf_ranges[l] if n_pf else None, sink,
                              evict, n_pf, first)
            try:
                res[name] = timed(step)
                res[name + "_attn_only"] = timed(attn_only)
            except Exception as err:  # noqa: BLE001
                res[name] = repr(err)[:300]
        results[str(batch)] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in res.items()}
        print(json.dumps(results[str(batch)]), flush=True)
        del kv, wbuf, Ws, pf_ranges
        torch.cuda.empty_cache()
    json.dump(results, open(os.path.join(OUT, "s12_l2.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
