"""Decode GEMMs of Qwen3-0.6B's shape: cuBLAS, cuBLASLt and the split-K Triton kernel (GPU; docs/performance.md).

For each projection (qkv 1024->4096, o 2048->1024, gate_up 1024->6144,
down 3072->1024) and batch M, times 28 products over 28 distinct weight
matrices (one per layer, 0.88 GB in all: no weight stays in L2 between
layers) captured in one CUDA graph, as a decode step runs them; reports
microseconds per product against the weight-read time at 3.0 TB/s. The
Triton kernel (reference.kernels.decode_gemm) is swept over tile shapes and
K splits; the best configuration per (projection, M) is then timed in a
whole step's worth of GEMMs (28 layers x 4 projections) against cuBLAS.
lm_head (1024->151936, eager in the engine) is timed with cuBLAS and cuBLASLt.
Run: python scripts/decode_gemms.py [--out gemms.json] [--ms 1,16,64,256] [--quick]
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from reference.kernels.decode_gemm import GemmConfig, decode_linear  # noqa: E402

SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
LAYERS = 28
BANDWIDTH = 3.0e12   # bytes/s, a device-to-device copy on the H100 (docs/performance.md)


def graph_us(fn, calls: int, reps: int = 5, rounds: int = 5) -> float:
    """Median microseconds of one of `calls` launches that `fn` makes, replayed in a CUDA graph."""
    fn()   # warm-up: compile, allocate counters
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps / calls)
    del graph
    return sorted(times)[len(times) // 2]


def configs_for(m: int, k: int):
    """The swept configurations: tiles no taller than the batch needs, K splits that divide K."""
    tall = max(16, 1 << (m - 1).bit_length())
    for bm, bn, bk, split in itertools.product([16, 32, 64, 128], [32, 64, 128], [128], [1, 2, 4, 8]):
        if bm > tall or k % (split * bk):
            continue
        stage_bytes = (bm + bn) * bk * 2
        stages = max(2, min(4, 180_000 // stage_bytes))
        warps = 8 if bm * bn >= 128 * 128 else 4
        yield GemmConfig(bm, bn, bk, split, warps, stages)


def blas(library: str):
    def run(x, weights, out):
        for i, w in enumerate(weights):
            out[i] = F.linear(x, w)
    return run, library


def with_library(library: str, fn):
    def wrapped():
        torch.backends.cuda.preferred_blas_library(library)
        try:
            fn()
        finally:
            torch.backends.cuda.preferred_blas_library("cublas")
    return wrapped


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="decode_gemms.json")
    parser.add_argument("--ms", default="256,128,192,64,32,16,8,1")
    parser.add_argument("--budget-s", type=float, default=330.0, help="stop sweeping after this long")
    args = parser.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    t0 = time.time()
    torch.manual_seed(0)
    dev = "cuda"
    weights = {name: [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
               for name, (n, k) in SHAPES.items()}
    results = {"rows": [], "steps": [], "lm_head": [], "device": torch.cuda.get_device_name()}
    best: dict[tuple[str, int], tuple[float, GemmConfig]] = {}

    def save():
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=lambda c: c.__dict__)

    for m in ms:
        for name, (n, k) in SHAPES.items():
            ws = weights[name]
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            floor_us = n * k * 2 / BANDWIDTH * 1e6
            row = {"shape": name, "M": m, "N": n, "K": k, "floor_us": floor_us}
            for lib in ("cublas", "cublaslt"):
                row[lib] = graph_us(with_library(lib, lambda: [F.linear(x, w) for w in ws]), LAYERS)
            ref = F.linear(x.float(), ws[0].float())
            sweep = []
            for cfg in configs_for(m, k):
                if time.time() - t0 > args.budget_s:
                    break
                try:
                    y = decode_linear(x, ws[0], cfg)
                    err = float((y.float() - ref).norm() / ref.norm())
                    if not err < 1e-2:
                        sweep.append((float("inf"), cfg, err))
                        continue
                    us = graph_us(lambda: [decode_linear(x, w, cfg) for w in ws], LAYERS)
                    y = decode_linear(x, ws[0], cfg)   # after the replays: the split-K counters were reset
                    err = max(err, float((y.float() - ref).norm() / ref.norm()))
                    sweep.append((us if err < 1e-2 else float("inf"), cfg, err))
                except Exception as exc:   # a config that does not compile (e.g. shared memory) is skipped
                    print(f"  skip {cfg}: {type(exc).__name__}: {str(exc)[:80]}")
            sweep.sort(key=lambda t: t[0])
            if sweep:
                best[(name, m)] = (sweep[0][0], sweep[0][1])
                row["triton"], row["triton_cfg"], row["triton_err"] = sweep[0]
                row["top5"] = [(us, cfg) for us, cfg, _ in sweep[:5]]
                no_split = [t for t in sweep if t[1].split_k == 1]
                if no_split:
                    row["triton_nosplit"], row["triton_nosplit_cfg"] = no_split[0][0], no_split[0][1]
            results["rows"].append(row)
            save()
            tri = row.get("triton", float("nan"))
            print(f"M={m:4d} {name:8s} floor {floor_us:6.1f} us | cublas {row['cublas']:6.1f} "
                  f"lt {row['cublaslt']:6.1f} triton {tri:6.1f} {row.get('triton_cfg')} "
                  f"[{time.time() - t0:.0f}s]", flush=True)
        # A whole step's layer GEMMs: 28 x (qkv, o, gate_up, down), each with its own input width.
        xs = {name: torch.randn(m, k, device=dev, dtype=torch.bfloat16) for name, (n, k) in SHAPES.items()}

        def step(use_triton: bool):
            def run():
                for layer in range(LAYERS):
                    for name in SHAPES:
                        if use_triton and (name, m) in best:
                            decode_linear(xs[name], weights[name][layer], best[(name, m)][1])
                        else:
                            F.linear(xs[name], weights[name][layer])
            return run
        floor = sum(n * k * 2 for n, k in SHAPES.values()) * LAYERS / BANDWIDTH * 1e3
        srow = {"M": m, "floor_ms": floor,
                "cublas_ms": graph_us(step(False), 1) / 1e3,
                "cublaslt_ms": graph_us(with_library("cublaslt", step(False)), 1) / 1e3,
                "triton_ms": graph_us(step(True), 1) / 1e3}
        results["steps"].append(srow)
        save()
        print(f"STEP M={m:4d}: floor {floor:.3f} ms | cublas {srow['cublas_ms']:.3f} lt {srow['cublaslt_ms']:.3f} "
              f"triton {srow['triton_ms']:.3f}", flush=True)
    lm = torch.randn(151936, 1024, device=dev, dtype=torch.bfloat16) * 0.02
    for m in (1, 64, 128, 256):
        x = torch.randn(m, 1024, device=dev, dtype=torch.bfloat16)
        row = {"M": m, "floor_us": lm.numel() * 2 / BANDWIDTH * 1e6}
        for lib in ("cublas", "cublaslt"):
            row[lib] = graph_us(with_library(lib, lambda: F.linear(x, lm)), 1)
        results["lm_head"].append(row)
    save()

    print("\n| M | GEMM | weight read us | cuBLAS us | cuBLASLt us | Triton us (config) | Triton/read |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results["rows"]:
        cfg = r.get("triton_cfg")
        desc = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} s{cfg.split_k} w{cfg.num_warps}" if cfg else "-"
        tri = r.get("triton", float("nan"))
        print(f"| {r['M']} | {r['shape']} | {r['floor_us']:.1f} | {r['cublas']:.1f} | {r['cublaslt']:.1f} | "
              f"{tri:.1f} ({desc}) | {tri / r['floor_us']:.2f}x |")
    print("\n| M | step floor ms | cuBLAS ms | cuBLASLt ms | Triton best ms |")
    print("| --- | --- | --- | --- | --- |")
    for s in results["steps"]:
        print(f"| {s['M']} | {s['floor_ms']:.3f} | {s['cublas_ms']:.3f} | {s['cublaslt_ms']:.3f} | {s['triton_ms']:.3f} |")
    print("\n| M | lm_head read us | cuBLAS us | cuBLASLt us |")
    for r in results["lm_head"]:
        print(f"| {r['M']} | {r['floor_us']:.1f} | {r['cublas']:.1f} | {r['cublaslt']:.1f} |")


if __name__ == "__main__":
    main()
