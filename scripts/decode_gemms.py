"""Decode GEMMs of Qwen3-0.6B's shape: cuBLAS, cuBLASLt and a split-K Triton GEMM (GPU; docs/performance.md).

`--part sweep`: for each projection (qkv 1024->4096, o 2048->1024, gate_up
1024->6144, down 3072->1024) and batch M, times 28 products over 28 distinct
weight matrices (one per layer, 0.88 GB in all: no weight stays in L2 between
layers) captured in one CUDA graph, as a decode step runs them, in
microseconds per product against the weight-read time at 3.0 TB/s. The Triton
kernel below is swept over tile shapes and K splits; the best configuration
per (projection, M) is then timed in a whole step's worth of GEMMs (28 layers
x 4 projections) against cuBLAS. lm_head (eager in the engine) is timed with
cuBLAS and cuBLASLt.

`--part probes --best sweep.json`: what the per-GEMM floor is made of. The
step's GEMMs again (cuBLAS and cuBLASLt three times each, for the spread),
the Triton kernel with and without programmatic dependent launch (PDL), a
graph of 112 empty kernels (the launch floor), and silu-and-mul folded into
the down projection's operand load against torch.compile'd silu_and_mul
followed by cuBLAS.

The kernel is a candidate, not part of the engine: docs/performance.md
(session 5) says why it was not landed.
Run: python scripts/decode_gemms.py --part sweep --out sweep.json
     python scripts/decode_gemms.py --part probes --best sweep.json --out probes.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


# Split-K: each K slice writes an fp32 partial tile; the program that finishes a tile last
# (an atomic arrival counter per tile) sums the slices, writes the output and resets the
# counter for the next call, so a split GEMM is one launch. Counters are allocated outside
# any graph capture; calls on one stream run one after another and share them.
# Arrival counters per device; a tile id indexes one. Large enough for any grid the sweep makes.
MAX_TILES = 1 << 16
_COUNTERS: dict[torch.device, torch.Tensor] = {}


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and K split of one decode GEMM launch."""
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@triton.jit(do_not_specialize=["M"])   # one compile serves every batch bucket
def _decode_gemm_kernel(x_ptr, w_ptr, y_ptr, ws_ptr, count_ptr, M, N, K_SPLIT, stride_xm, stride_wn, stride_ym,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        SPLIT: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr = False,
                        SILU: tl.constexpr = False, K_UP: tl.constexpr = 0):
    """Program (n, m, s): output tile (m, n) over K slice s; with SPLIT, the last slice to arrive sums them.

    PDL (a probe): let the next kernel launch at once, and wait for the previous one's
    output only after this program's first weight tile is loaded. SILU (a probe): x is
    gate_up [M, 2 * K_UP] and the A operand is silu(gate) * up, computed on the fly.
    """
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = pid_k * K_SPLIT + tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        first = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
        acc += tl.sum(first.to(tl.float32), 1)[None, :] * 0.0   # keeps the load: weights need no predecessor
        tl.extra.cuda.gdc_wait()
    for _ in range(0, K_SPLIT, BLOCK_K):
        if SILU:
            g = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0).to(tl.float32)
            u = tl.load(x_ptrs + K_UP, mask=m_mask[:, None], other=0.0).to(tl.float32)
            a = (g * tl.sigmoid(g) * u).to(w_ptr.dtype.element_ty)
        else:
            a = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
        b = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    mask = m_mask[:, None] & n_mask[None, :]
    y_offs = offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    if SPLIT:
        splits = tl.num_programs(2)
        tile_offs = offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k * M * N + tile_offs, acc, mask=mask)
        tl.debug_barrier()   # every thread's partial is stored before the arrival is counted
        tile = pid_m * tl.num_programs(0) + pid_n
        arrived = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == splits - 1:
            total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(0, splits):
                total += tl.load(ws_ptr + s * M * N + tile_offs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + y_offs, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")
    else:
        tl.store(y_ptr + y_offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def _counters(device: torch.device) -> torch.Tensor:
    counters = _COUNTERS.get(device)
    if counters is None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("decode_linear: the split-K counters must be allocated before a CUDA graph capture; "
                               "run the GEMM once eagerly first")
        counters = _COUNTERS[device] = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
    return counters


def check_config(config: GemmConfig, m: int, n: int, k: int) -> None:
    """Raise ValueError unless `config` can run an [m, k] x [n, k]^T product exactly."""
    if k % (config.split_k * config.block_k):
        raise ValueError(f"decode_linear: K={k} is not a multiple of split_k * block_k = "
                         f"{config.split_k} * {config.block_k}")
    tiles = triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n)
    if config.split_k > 1 and tiles > MAX_TILES:
        raise ValueError(f"decode_linear: {tiles} output tiles exceed the {MAX_TILES} split-K counters")


def decode_linear(x: torch.Tensor, weight: torch.Tensor, config: GemmConfig, pdl: bool = False,
                  silu: bool = False) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T -> [M, N] in x's dtype, both with unit stride along K.

    silu: x is [M, 2K] (gate, up) and the product is silu(gate) * up @ weight^T.
    """
    k_up = weight.shape[1] if silu else 0
    if silu:
        if x.shape[1] != 2 * k_up:
            raise ValueError(f"decode_linear: silu needs x of width 2 * {k_up}, got {tuple(x.shape)}")
    elif x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"decode_linear: shapes {tuple(x.shape)} and {tuple(weight.shape)} do not multiply")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("decode_linear: x and weight need unit stride along K")
    m, k = x.shape[0], weight.shape[1]
    n = weight.shape[0]
    check_config(config, m, n, k)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    split = config.split_k > 1
    ws = torch.empty((config.split_k, m, n), dtype=torch.float32, device=x.device) if split else y
    counters = _counters(x.device) if split else y
    grid = (triton.cdiv(n, config.block_n), triton.cdiv(m, config.block_m), config.split_k)
    _decode_gemm_kernel[grid](x, weight, y, ws, counters, m, n, k // config.split_k, x.stride(0), weight.stride(0),
                              y.stride(0), BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                              SPLIT=split, PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                              PDL=pdl, SILU=silu, K_UP=k_up, num_warps=config.num_warps,
                              num_stages=config.num_stages, **({"launch_pdl": True} if pdl else {}))
    return y


SHAPES = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}
LAYERS = 28
HIDDEN = 1024
VOCAB = 151936      # lm_head rows (one rank's share under TP)
# (N, K) per projection, layers, hidden size and lm_head rows, per model and tensor-parallel rank (its shard).
MODELS = {
    "0.6b": (SHAPES, 28, 1024, 151936),
    "8b-tp1": ({"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}, 36, 4096,
               151936),
    "8b-tp2": ({"qkv": (3072, 4096), "o": (4096, 2048), "gate_up": (12288, 4096), "down": (4096, 6144)}, 36, 4096,
               151936 // 2),
}
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


def layer_weights() -> dict[str, list[torch.Tensor]]:
    """LAYERS random weight matrices per projection (a random model of the chosen GEMM shapes)."""
    torch.manual_seed(0)
    return {name: [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(LAYERS)]
            for name, (n, k) in SHAPES.items()}


def sweep(args, weights) -> None:
    ms = [int(v) for v in args.ms.split(",")]
    t0 = time.time()
    dev = "cuda"
    results = {"rows": [], "steps": [], "lm_head": [], "device": torch.cuda.get_device_name()}
    best: dict[tuple[str, int], tuple[float, GemmConfig]] = {}

    def save():
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=lambda c: c.__dict__)

    # --transposed: every weight also stored [K, N], copied once for the per-GEMM rows and the steps
    kn = {name: [w.t().contiguous() for w in ws] for name, ws in weights.items()} if args.transposed else None
    for m in ms:
        for name, (n, k) in SHAPES.items():
            ws = weights[name]
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            floor_us = n * k * 2 / BANDWIDTH * 1e6
            row = {"shape": name, "M": m, "N": n, "K": k, "floor_us": floor_us}
            for lib in ("cublas", "cublaslt"):
                row[lib] = graph_us(with_library(lib, lambda: [F.linear(x, w) for w in ws]), LAYERS)
            if kn:   # the weight stored [K, N]: x @ W, another kernel choice
                for lib in ("cublas", "cublaslt"):
                    row[f"{lib}_kn"] = graph_us(with_library(lib, lambda: [torch.mm(x, wt) for wt in kn[name]]), LAYERS)
            ref = F.linear(x.float(), ws[0].float())
            sweep = []
            for cfg in (configs_for(m, k) if args.triton and name in args.triton_shapes.split(",") else []):
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
                  f"lt {row['cublaslt']:6.1f} kn {row.get('cublas_kn', float('nan')):6.1f} "
                  f"lt_kn {row.get('cublaslt_kn', float('nan')):6.1f} triton {tri:6.1f} {row.get('triton_cfg')} "
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
        if kn:   # the step with every weight stored [K, N]
            kn_step = step_fn(kn, xs, lambda name, x, wt: torch.mm(x, wt))
            for lib in ("cublas", "cublaslt"):
                srow[f"{lib}_kn_ms"] = graph_us(with_library(lib, kn_step), 1) / 1e3
        results["steps"].append(srow)
        save()
        print(f"STEP M={m:4d}: floor {floor:.3f} ms | cublas {srow['cublas_ms']:.3f} lt {srow['cublaslt_ms']:.3f} "
              f"triton {srow['triton_ms']:.3f} kn {srow.get('cublas_kn_ms', float('nan')):.3f} "
              f"lt_kn {srow.get('cublaslt_kn_ms', float('nan')):.3f}", flush=True)
    lm = torch.randn(VOCAB, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.02
    for m in (1, 64, 128, 256):
        x = torch.randn(m, HIDDEN, device=dev, dtype=torch.bfloat16)
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


def step_fn(weights, xs, gemm):
    """LAYERS layers x 4 projections, each through gemm(name, x, weight)."""
    def run():
        for layer in range(LAYERS):
            for name in SHAPES:
                gemm(name, xs[name], weights[name][layer])
    return run


@triton.jit
def _empty_kernel(ptr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    tl.store(ptr + tl.program_id(0), 1)


def probes(args, weights) -> None:
    with open(args.best) as f:
        rows = json.load(f)["rows"]
    best = {(r["shape"], r["M"]): GemmConfig(**r["triton_cfg"]) for r in rows if "triton_cfg" in r}
    results = {"steps": [], "launch": {}, "silu_down": []}

    def save():
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    flag = torch.zeros(132, dtype=torch.int32, device="cuda")
    for pdl in (False, True):
        try:
            results["launch"][f"empty_pdl{int(pdl)}_us"] = graph_us(
                lambda: [_empty_kernel[(132,)](flag, PDL=pdl, **({"launch_pdl": True} if pdl else {}))
                         for _ in range(112)], 112)
        except Exception as exc:
            results["launch"][f"empty_pdl{int(pdl)}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    print("launch floor:", results["launch"], flush=True)
    save()
    for m in [int(v) for v in args.ms.split(",")]:
        xs = {name: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for name, (n, k) in SHAPES.items()}
        blas = step_fn(weights, xs, lambda name, x, w: F.linear(x, w))
        row = {"M": m, "cublas_ms": [], "cublaslt_ms": []}
        for _ in range(3):
            row["cublas_ms"].append(graph_us(blas, 1) / 1e3)
            row["cublaslt_ms"].append(graph_us(with_library("cublaslt", blas), 1) / 1e3)
        for pdl in (False, True):
            try:
                fn = step_fn(weights, xs, lambda name, x, w: decode_linear(x, w, best[(name, m)], pdl=pdl))
                row[f"triton_pdl{int(pdl)}_ms"] = [graph_us(fn, 1) / 1e3 for _ in range(2)]
            except Exception as exc:
                row[f"triton_pdl{int(pdl)}_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        results["steps"].append(row)
        save()
        print(f"STEP M={m}: " + " ".join(f"{k} {v}" for k, v in row.items() if k != "M"), flush=True)
    silu_and_mul = torch.compile(lambda gu: F.silu(gu[:, :3072]) * gu[:, 3072:], dynamic=True)
    downs = weights["down"]
    for m in [int(v) for v in args.ms.split(",")]:
        gu = torch.randn(m, 6144, device="cuda", dtype=torch.bfloat16)
        cfg = best[("down", m)]
        ref = F.linear(silu_and_mul(gu).float(), downs[0].float())
        fused = decode_linear(gu, downs[0], cfg, silu=True)
        err = float((fused.float() - ref).norm() / ref.norm())
        row = {"M": m, "cfg": cfg.__dict__, "rel_err": err,
               "compiled_silu_plus_cublas_us": [graph_us(lambda: [F.linear(silu_and_mul(gu), w) for w in downs],
                                                         LAYERS) for _ in range(2)],
               "triton_down_us": [graph_us(lambda: [decode_linear(silu_and_mul(gu), w, cfg) for w in downs],
                                           LAYERS) for _ in range(2)],
               "fused_silu_down_us": [graph_us(lambda: [decode_linear(gu, w, cfg, silu=True) for w in downs],
                                               LAYERS) for _ in range(2)]}
        results["silu_down"].append(row)
        save()
        print(f"SILU+DOWN M={m}: " + " ".join(f"{k} {v}" for k, v in row.items() if k != "M"), flush=True)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=["sweep", "probes"], default="sweep")
    parser.add_argument("--out", default="decode_gemms.json")
    parser.add_argument("--best", help="a sweep's JSON: the Triton configurations the probes use")
    parser.add_argument("--ms", default="256,128,192,64,32,16,8,1")
    parser.add_argument("--budget-s", type=float, default=330.0, help="stop sweeping after this long")
    parser.add_argument("--model", choices=sorted(MODELS), default="0.6b",
                        help="the GEMM shapes: Qwen3-0.6B, or one rank's shard of Qwen3-8B at TP=1 or TP=2")
    parser.add_argument("--no-triton", dest="triton", action="store_false", help="time cuBLAS only")
    parser.add_argument("--transposed", action="store_true", help="also time weights stored [K, N] (x @ W)")
    parser.add_argument("--triton-shapes", default="qkv,o,gate_up,down", help="the projections the Triton sweep tries")
    args = parser.parse_args()
    global SHAPES, LAYERS, HIDDEN, VOCAB
    SHAPES, LAYERS, HIDDEN, VOCAB = MODELS[args.model]
    if args.part == "probes" and not args.best:
        parser.error("--part probes needs --best SWEEP_JSON")
    weights = layer_weights()
    (sweep if args.part == "sweep" else probes)(args, weights)


if __name__ == "__main__":
    main()
