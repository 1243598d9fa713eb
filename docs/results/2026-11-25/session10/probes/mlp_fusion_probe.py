"""Probe: the gate/up GEMM with silu-and-mul in its epilogue (Triton) against cuBLAS + the compiled silu_and_mul.

Prefill-sized rows of Qwen3-0.6B's MLP (hidden 1024, intermediate 3072), bf16, one H100.
Each Triton program computes a gate tile and the matching up tile (two accumulators, one x
tile loaded for both), rounds each to bf16 as the GEMM's output would be, then stores
silu(gate) * up, rounded once (as inductor's fused silu_and_mul does in fp32).
Run (repo root): python3 docs/results/2026-11-25/session10/probes/mlp_fusion_probe.py [--rows 16384] [--out p.json]
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, ".")
sys.path.insert(0, "scripts")
import profile_prefill  # noqa: E402
from reference.models.qwen3 import ElementwiseOps  # noqa: E402


@triton.jit
def _gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    in_group = GROUP_M * num_pid_n
    first_m = (pid // in_group) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % group_m
    pid_n = (pid % in_group) // group_m
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_k = tl.arange(0, BK)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    g_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    u_ptrs = g_ptrs + N * stride_wn
    acc_g = tl.zeros((BM, BN), tl.float32)
    acc_u = tl.zeros((BM, BN), tl.float32)
    row_ok = offs_m[:, None] < M
    for _ in range(0, K, BK):
        x = tl.load(x_ptrs, mask=row_ok, other=0.0)
        acc_g = tl.dot(x, tl.load(g_ptrs), acc_g)
        acc_u = tl.dot(x, tl.load(u_ptrs), acc_u)
        x_ptrs += BK
        g_ptrs += BK
        u_ptrs += BK
    dtype = out_ptr.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)
    u = acc_u.to(dtype).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :], out.to(dtype), mask=row_ok)


@triton.jit
def _gate_up_silu_tma_kernel(x_desc, g_desc, u_desc, out_desc, M, N, K,
                             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                             NUM_SMS: tl.constexpr, FLATTEN: tl.constexpr):
    """Persistent: NUM_SMS programs walk the output tiles (grouped along M for L2); TMA loads and stores."""
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    in_group = GROUP_M * num_pid_n
    dtype = out_desc.dtype
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_SMS, flatten=FLATTEN):
        first_m = (tile // in_group) * GROUP_M
        group_m = min(num_pid_m - first_m, GROUP_M)
        om = (first_m + (tile % group_m)) * BM
        on = ((tile % in_group) // group_m) * BN
        acc_g = tl.zeros((BM, BN), tl.float32)
        acc_u = tl.zeros((BM, BN), tl.float32)
        for ki in range(k_tiles):
            x = x_desc.load([om, ki * BK])
            acc_g = tl.dot(x, g_desc.load([on, ki * BK]).T, acc_g)
            acc_u = tl.dot(x, u_desc.load([on, ki * BK]).T, acc_u)
        g = acc_g.to(dtype).to(tl.float32)
        u = acc_u.to(dtype).to(tl.float32)
        out_desc.store([om, on], (g * tl.sigmoid(g) * u).to(dtype))


def gate_up_silu_tma(x, w, cfg, flatten=True):
    from triton.tools.tensor_descriptor import TensorDescriptor
    m, k = x.shape
    n = w.shape[0] // 2
    bm, bn, bk, warps, stages = cfg
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    x_desc = TensorDescriptor(x, [m, k], [k, 1], [bm, bk])
    g_desc = TensorDescriptor(w[:n], [n, k], [k, 1], [bn, bk])
    u_desc = TensorDescriptor(w[n:], [n, k], [k, 1], [bn, bk])
    out_desc = TensorDescriptor(out, [m, n], [n, 1], [bm, bn])
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    _gate_up_silu_tma_kernel[(min(sms, tiles),)](x_desc, g_desc, u_desc, out_desc, m, n, k, BM=bm, BN=bn, BK=bk,
                                                  GROUP_M=8, NUM_SMS=sms, FLATTEN=flatten, num_warps=warps,
                                                  num_stages=stages)
    return out


def gate_up_silu(x, w, cfg):
    m, k = x.shape
    n = w.shape[0] // 2
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    bm, bn, bk, warps, stages = cfg
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _gate_up_silu_kernel[grid](x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
                               BM=bm, BN=bn, BK=bk, GROUP_M=8, num_warps=warps, num_stages=stages)
    return out


def gpu_ms(fn, repeats=20):
    """profile_prefill's median of CUDA-event timings, after one untimed call (compiles, autotunes)."""
    fn()
    return profile_prefill.gpu_ms(fn, repeats)


@torch.inference_mode()
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.manual_seed(0)
    hidden, inter = 1024, 3072
    x = torch.randn(args.rows, hidden, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(2 * inter, hidden, device="cuda") * hidden ** -0.5).to(torch.bfloat16)
    silu_and_mul = ElementwiseOps.fused().silu_and_mul
    want = silu_and_mul(F.linear(x, w))
    flops = 2 * args.rows * hidden * 2 * inter
    result = {"rows": args.rows, "device": torch.cuda.get_device_name()}
    result["cublas_gemm_ms"] = gpu_ms(lambda: F.linear(x, w))
    gu = F.linear(x, w)
    result["silu_and_mul_ms"] = gpu_ms(lambda: silu_and_mul(gu))
    result["cublas_plus_silu_ms"] = gpu_ms(lambda: silu_and_mul(F.linear(x, w)))
    print(f"rows {args.rows}: cuBLAS gate/up {result['cublas_gemm_ms']:.3f} ms "
          f"({flops / result['cublas_gemm_ms'] / 1e9:.0f} TFLOP/s), silu_and_mul {result['silu_and_mul_ms']:.3f}, "
          f"both {result['cublas_plus_silu_ms']:.3f}")
    configs = [(128, 64, 64, 8, 3), (128, 128, 64, 8, 4)]
    result["triton"] = []
    for cfg in configs:
        try:
            got = gate_up_silu(x, w, cfg)
            diff = (got.float() - want.float()).abs()
            ms = gpu_ms(lambda: gate_up_silu(x, w, cfg))
        except Exception as exc:       # a config that does not fit (shared memory, registers)
            print(f"  {cfg}: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        row = {"config": cfg, "ms": ms, "tflops": flops / ms / 1e9, "max_abs_diff": float(diff.max()),
               "differ_frac": float((diff > 0).float().mean())}
        result["triton"].append(row)
        print(f"  BM {cfg[0]} BN {cfg[1]} BK {cfg[2]} w{cfg[3]} s{cfg[4]}: {ms:.3f} ms ({row['tflops']:.0f} TFLOP/s), "
              f"max |diff| {row['max_abs_diff']:.2e}, {row['differ_frac']:.2%} of outputs differ")
    tma_configs = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (128, 64, 64, 8, 4),
                   (128, 64, 64, 4, 5), (64, 128, 64, 4, 4), (128, 128, 32, 8, 5), (128, 256, 64, 8, 3)]
    for cfg in tma_configs:
        for flatten in (True, False):
            try:
                got = gate_up_silu_tma(x, w, cfg, flatten)
                diff = (got.float() - want.float()).abs()
                ms = gpu_ms(lambda: gate_up_silu_tma(x, w, cfg, flatten))
            except Exception as exc:
                print(f"  TMA {cfg} flatten {flatten}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            row = {"config": cfg, "tma_persistent": True, "flatten": flatten, "ms": ms, "tflops": flops / ms / 1e9,
                   "max_abs_diff": float(diff.max()), "differ_frac": float((diff > 0).float().mean())}
            result["triton"].append(row)
            print(f"  TMA persistent BM {cfg[0]} BN {cfg[1]} BK {cfg[2]} w{cfg[3]} s{cfg[4]} flatten {flatten}: "
                  f"{ms:.3f} ms ({row['tflops']:.0f} TFLOP/s), max |diff| {row['max_abs_diff']:.2e}, "
                  f"{row['differ_frac']:.2%} differ")
    best = min(result["triton"], key=lambda r: r["ms"])
    print(f"best fused {best} {best['ms']:.3f} ms against cuBLAS + silu {result['cublas_plus_silu_ms']:.3f} ms: "
          f"{result['cublas_plus_silu_ms'] - best['ms']:+.3f} ms a layer saved, x28 = "
          f"{28 * (result['cublas_plus_silu_ms'] - best['ms']):+.2f} ms a step")
    if args.out:
        json.dump(result, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
