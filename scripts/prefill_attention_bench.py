"""The Triton prefill attention kernel against PyTorch's FlashAttention-2 on the bench's prefill (GPU).

Builds bench-256's second prefill step the way the scheduler does (prompts in
order while their running total stays within 16,384 tokens; the first such
batch is step 1, the next step 2: 29 sequences, 15,965 tokens) and times, at
Qwen3-0.6B's attention shape (16 query heads, 8 KV heads, head_dim 128, bf16,
causal, random q/k/v):

- aten's FlashAttention-2 varlen forward, the call `flash_varlen` makes;
- `reference.kernels.prefill_attention` over a sweep of tile sizes, warps,
  pipeline stages and `group_heads` (`sweep_configs`; those past the sweep's
  time budget are recorded as skipped); configurations that fail to compile are
  recorded with their error, and each output is checked against FA2's
  (relative error under 1.6e-2, the bf16 bound of tests/engine/test_kernels.py);
- the best correct configuration and FA2 again with a cached prefix (the first
  quarter of every sequence cached: n_q = L - L // 4 queries against L keys),
  and with v as a strided view of one packed qkv tensor (as the model passes it).

Each timing is the median over repeats of 28 back-to-back calls (one per layer)
between two CUDA events, divided by 28: a single call's events would also
count Triton's launch overhead while the GPU waits. TFLOP/s counts exact causal
FLOPs: 4 * head_dim * q_heads per visible (query, key) pair, n_q * (n_k - n_q)
+ n_q^2 / 2 pairs a sequence (L^2 / 2 for a plain prefill).
Run: python scripts/prefill_attention_bench.py --out prefill_attn.json
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from courseware.bench import make_workload  # noqa: E402

Q_HEADS, KV_HEADS, HEAD_DIM, LAYERS, STEP_TOKENS = 16, 8, 128, 28, 16384
REL_BOUND = 1.6e-2
SWEEP = dict(block_m=(64, 128), block_n=(32, 64, 128), num_warps=(4, 8), num_stages=(2, 3),
             group_heads=(False, True))
SWEEP_SECONDS = 150     # the sweep stops here (skipped configs are recorded) so the run stays within ~3 minutes


def sweep_configs() -> list[dict]:
    """SWEEP's product, less 4 warps on tiles of 8192+ scores: those spill registers (an sm_90 compile's
    resource usage) and would only spend the time budget."""
    configs = [dict(zip(SWEEP, values)) for values in itertools.product(*SWEEP.values())]
    return [c for c in configs if c["num_warps"] == 8 or c["block_m"] * c["block_n"] < 8192]


def second_prefill_step() -> list[int]:
    """Prompt lengths of bench-256's second prefill batch (greedy, in order, within STEP_TOKENS)."""
    lens = [len(r.prompt) for r in make_workload("bench-256", 151936)]
    steps, i = [], 0
    for _ in range(2):
        step, total = [], 0
        while i < len(lens) and total + lens[i] <= STEP_TOKENS:
            total += lens[i]
            step.append(lens[i])
            i += 1
        steps.append(step)
    assert (len(steps[1]), sum(steps[1])) == (29, 15965), (len(steps[1]), sum(steps[1]))
    return steps[1]


def causal_flops(new: list[int], ctx: list[int]) -> float:
    pairs = sum(nq * (nk - nq) + nq * nq / 2 for nq, nk in zip(new, ctx))
    return 4 * HEAD_DIM * Q_HEADS * pairs


def per_layer_ms(fn, repeats: int) -> float:
    """Median over repeats of LAYERS back-to-back calls between two events, per call."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(LAYERS):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / LAYERS)
    return statistics.median(times)


def make_case(new: list[int], cached: list[int], packed_v: bool = False):
    ctx = [c + n for c, n in zip(cached, new)]
    q = torch.randn(sum(new), Q_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(ctx), KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    if packed_v:   # v as the model leaves it: a view into [tokens, (q + 2 kv) heads x dim]
        qkv = torch.randn(sum(ctx), (Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        v = qkv[:, (Q_HEADS + KV_HEADS) * HEAD_DIM:].view(sum(ctx), KV_HEADS, HEAD_DIM)
    else:
        v = torch.randn(sum(ctx), KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    cu_q = torch.tensor([0, *itertools.accumulate(new)], device="cuda", dtype=torch.int32)
    cu_k = torch.tensor([0, *itertools.accumulate(ctx)], device="cuda", dtype=torch.int32)
    return dict(q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, max_q=max(new), max_k=max(ctx),
                flops=causal_flops(new, ctx), scale=HEAD_DIM ** -0.5)


def fa2(case) -> torch.Tensor:
    return torch.ops.aten._flash_attention_forward(
        case["q"], case["k"], case["v"], case["cu_q"], case["cu_k"], case["max_q"], case["max_k"], 0.0, True, False,
        scale=case["scale"])[0]


def triton_call(case, config: dict):
    from reference.kernels.prefill_attention import prefill_attention
    return lambda: prefill_attention(case["q"], case["k"], case["v"], case["cu_q"], case["cu_k"], case["max_q"],
                                     case["scale"], **config)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def measure(name: str, fn, case, want: torch.Tensor | None, repeats: int) -> dict:
    """One row: compile/warm up, check against `want`, time. Errors are recorded, not raised."""
    row = dict(name=name)
    try:
        out = fn()
        torch.cuda.synchronize()
    except Exception as exc:   # noqa: BLE001 - a config that does not compile is a result of the sweep
        return dict(row, ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    row["rel_err_vs_fa2"] = None if want is None else rel_err(out, want)
    row["ok"] = want is None or row["rel_err_vs_fa2"] < REL_BOUND
    for _ in range(3):
        fn()
    ms = per_layer_ms(fn, repeats)
    return dict(row, ms=ms, ms_x28=ms * LAYERS, tflops=case["flops"] / ms / 1e9)


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n{title}")
    print(f"{'config':<44} {'ms/layer':>9} {'x28 ms':>8} {'TFLOP/s':>8} {'rel err':>9}  ok")
    for r in sorted(rows, key=lambda r: r.get("ms", float("inf"))):
        if "ms" not in r:
            print(f"{r['name']:<44} {'-':>9} {'-':>8} {'-':>8} {'-':>9}  {r['error'][:60]}")
            continue
        err = "-" if r.get("rel_err_vs_fa2") is None else f"{r['rel_err_vs_fa2']:.2e}"
        print(f"{r['name']:<44} {r['ms']:9.4f} {r['ms_x28']:8.2f} {r['tflops']:8.1f} {err:>9}  "
              f"{'yes' if r['ok'] else 'NO'}")


def config_name(config: dict) -> str:
    return (f"triton m{config['block_m']} n{config['block_n']} w{config['num_warps']} s{config['num_stages']}"
            f"{' grouped' if config['group_heads'] else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file for every row, the step's shape and the versions")
    parser.add_argument("--repeats", type=int, default=20, help="timed repeats of 28 calls each (median)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    import triton
    t0 = time.time()
    torch.manual_seed(0)
    new = second_prefill_step()
    case = make_case(new, [0] * len(new))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"{len(new)} sequences, {sum(new)} tokens, {case['flops'] / 1e12:.3f} TFLOP a layer")
    want = fa2(case)
    rows = [measure("aten FlashAttention-2", lambda: fa2(case), case, None, args.repeats)]
    for config in sweep_configs():
        if time.time() - t0 > SWEEP_SECONDS:
            rows.append(dict(name=config_name(config), config=config, ok=False, error="skipped: out of time"))
            continue
        rows.append(dict(measure(config_name(config), triton_call(case, config), case, want, args.repeats),
                         config=config))
        print(f"  {rows[-1]['name']}: {rows[-1].get('ms', rows[-1].get('error'))}", flush=True)
    print_table("plain prefill (n_q = n_k = L)", rows)

    good = [r for r in rows[1:] if r["ok"]]
    extra = []
    if good:
        best = min(good, key=lambda r: r["ms"])
        cached = [n // 4 for n in new]
        prefix = make_case([n - c for n, c in zip(new, cached)], cached)
        want_prefix = fa2(prefix)
        extra.append(measure("aten FlashAttention-2, cached prefix", lambda: fa2(prefix), prefix, None,
                             args.repeats))
        extra.append(measure(best["name"] + ", cached prefix", triton_call(prefix, best["config"]), prefix,
                             want_prefix, args.repeats))
        packed = make_case(new, [0] * len(new), packed_v=True)
        want_packed = fa2(packed)
        extra.append(measure("aten FlashAttention-2, strided v", lambda: fa2(packed), packed, None, args.repeats))
        extra.append(measure(best["name"] + ", strided v", triton_call(packed, best["config"]), packed,
                             want_packed, args.repeats))
        print_table("best config: cached prefix (first L // 4 keys cached) and strided v", extra)
        print(f"\nbest: {best['name']}, {best['ms']:.4f} ms against FA2's {rows[0]['ms']:.4f} ms "
              f"({rows[0]['ms'] / best['ms']:.2f}x)")
    else:
        print("\nno Triton configuration compiled and matched FA2")
    print(f"took {time.time() - t0:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                           lengths=new, tokens=sum(new), shape=dict(q_heads=Q_HEADS, kv_heads=KV_HEADS,
                                                                    head_dim=HEAD_DIM, dtype="bfloat16"),
                           layers=LAYERS, repeats=args.repeats, plain=rows, best_extra=extra), f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
