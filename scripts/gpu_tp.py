"""Tensor parallelism and prefill/decode disaggregation on a 2-GPU machine: correctness and figures.

Run by scripts/gpu_tp.sh; every part is independent (a failure is recorded and
the next part runs) and the whole run keeps to a time budget. Writes
$OUT/gpu_tp.json and prints a table at the end.

Parts:
  fp32_equality   TP=2 vs TP=1 greedy tokens, fp32, Qwen3-0.6B shape (random weights)
  bf16_agreement  the same in bf16: first-token agreement and common-prefix lengths
  tp_bench        TP=1 vs TP=2 throughput, Qwen3-8B shape, bf16, sync scheduling, one workload
  allreduce       all-reduce time of one decode step's activations (2 per layer), 2 GPUs, NCCL
  pd              colocated engine vs prefill GPU + decode GPU: TTFT, TPOT, throughput, KV transfer
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from courseware.bench import QWEN3_0_6B, make_random_model, make_workload, random_model_dir, run_engine  # noqa: E402

QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
BUDGET_S = float(os.environ.get("GPU_TP_BUDGET_S", 500))
START = time.monotonic()
OUT = Path(os.environ.get("OUT", "gpu_tp_out"))
RESULTS: dict = {"environment": {"torch": torch.__version__, "gpus": [torch.cuda.get_device_name(i)
                                                                      for i in range(torch.cuda.device_count())]}}


def free_gpu() -> None:
    """Engines of earlier parts must give their memory back before the next one sizes its KV pool."""
    gc.collect()
    torch.cuda.empty_cache()


def part(name: str, min_left_s: float):
    def wrap(fn):
        def run():
            left = BUDGET_S - (time.monotonic() - START)
            if left < min_left_s:
                RESULTS[name] = {"skipped": f"{left:.0f} s of the budget left, needs {min_left_s:.0f}"}
                return
            t0 = time.monotonic()
            try:
                RESULTS[name] = fn()
            except Exception:
                RESULTS[name] = {"error": traceback.format_exc()[-3000:]}
            RESULTS[name]["part_seconds"] = round(time.monotonic() - t0, 1)
            print(f"== {name}: {json.dumps(RESULTS[name])[:1500]}", flush=True)
            free_gpu()
            (OUT / "gpu_tp.json").write_text(json.dumps(RESULTS, indent=2))
        run.__name__ = name
        return run
    return wrap


def greedy(model_dir: str, prompts, max_tokens: int, **config) -> list[list[int]]:
    from reference import LLM, SamplingParams
    llm = LLM(model_dir, device="cuda", max_model_len=512, **config)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        return [o["token_ids"] for o in llm.generate(prompts, params, use_tqdm=False)]
    finally:
        if hasattr(llm.model_runner, "close"):
            llm.model_runner.close()
        del llm
        free_gpu()


def tp_pair(dtype: str, max_tokens: int = 32) -> tuple[list, list]:
    model = str(make_random_model(random_model_dir("qwen3-0.6b", dtype), shape=QWEN3_0_6B,
                                  dtype=getattr(torch, dtype)))
    prompts = [r.prompt[:200] for r in make_workload("quick", QWEN3_0_6B["vocab_size"], seed=1)[:16]]
    # Eager (no CUDA graphs, no compiled elementwise ops): the comparison is about the split alone;
    # tp_bench runs TP=2 with graphs.
    one = greedy(model, prompts, max_tokens, dtype=dtype, tensor_parallel_size=1, enforce_eager=True)
    two = greedy(model, prompts, max_tokens, dtype=dtype, tensor_parallel_size=2, enforce_eager=True)
    return one, two


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@part("fp32_equality", 60)
def fp32_equality() -> dict:
    one, two = tp_pair("float32")
    prefixes = [common_prefix(a, b) for a, b in zip(one, two)]
    return {"equal": one == two, "prompts": len(one), "prompts_equal": sum(a == b for a, b in zip(one, two)),
            "common_prefix": prefixes}


@part("bf16_agreement", 60)
def bf16_agreement() -> dict:
    one, two = tp_pair("bfloat16")
    prefixes = [common_prefix(a, b) for a, b in zip(one, two)]
    first_equal = sum(a[0] == b[0] for a, b in zip(one, two)) / len(one)
    return {"first_token_agreement": first_equal, "within_tolerance": first_equal >= 0.9,
            "tolerance": "first generated token equal for >= 90% of prompts", "common_prefix": prefixes,
            "prompts_equal": sum(a == b for a, b in zip(one, two)), "prompts": len(one)}


def model_8b() -> str:
    return str(make_random_model(random_model_dir("qwen3-8b", "bfloat16"), shape=QWEN3_8B, dtype=torch.bfloat16,
                                 device="cuda"))


def model_0_6b() -> str:
    return str(make_random_model(random_model_dir("qwen3-0.6b", "bfloat16"), shape=QWEN3_0_6B,
                                 dtype=torch.bfloat16))


BENCH_CONFIG = dict(device="cuda", dtype="bfloat16", max_num_seqs=64, max_num_batched_tokens=8192,
                    async_scheduling=False)


@part("tp_bench", 200)
def tp_bench() -> dict:
    t0 = time.monotonic()
    model = model_8b()
    print(f"tp_bench: 8B model ready in {time.monotonic() - t0:.0f} s", flush=True)
    requests = make_workload("quick", QWEN3_8B["vocab_size"], seed=0)
    out = {"workload": "quick (64 requests, prompt and output 32..256)", "model": "Qwen3-8B shape, random bf16"}
    for tp in (1, 2):
        r = None
        try:
            r = run_engine(model, requests, tensor_parallel_size=tp, **BENCH_CONFIG)
        except Exception:
            out[f"tp{tp}_graphs_error"] = traceback.format_exc()[-1500:]
        if r is None:   # outside the except block, so the failed engine's frames are gone and it can be freed
            free_gpu()
            r = run_engine(model, requests, tensor_parallel_size=tp, enforce_eager=True, **BENCH_CONFIG)
        free_gpu()
        print(f"tp_bench: TP={tp} {r['output_tok_per_s']:.0f} out tok/s ({time.monotonic() - t0:.0f} s)", flush=True)
        out[f"tp{tp}"] = {k: r[k] for k in ("output_tok_per_s", "total_tok_per_s", "elapsed_s", "steps", "ttft_s",
                                            "tpot_s", "cuda_graphs", "attention_backend", "num_kvcache_blocks")}
    out["tp2_over_tp1"] = out["tp2"]["output_tok_per_s"] / out["tp1"]["output_tok_per_s"]
    return out


def _allreduce_rank(rank: int, init_file: str, result_file: str) -> None:
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank))
    rows = {}
    for tokens in (1, 16, 64, 256, 2048):
        x = torch.randn(tokens, QWEN3_8B["hidden_size"], dtype=torch.bfloat16, device="cuda")
        for _ in range(10):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(100):
            dist.all_reduce(x)
        end.record()
        torch.cuda.synchronize()
        per_call_ms = start.elapsed_time(end) / 100
        rows[tokens] = {"per_call_us": per_call_ms * 1000,
                        "per_step_ms": per_call_ms * 2 * QWEN3_8B["num_hidden_layers"],
                        "bytes": x.numel() * x.element_size()}
    if rank == 0:
        Path(result_file).write_text(json.dumps(rows))
    dist.destroy_process_group()


@part("allreduce", 40)
def allreduce() -> dict:
    import tempfile
    import torch.multiprocessing as mp
    tmp = tempfile.mkdtemp()
    result = os.path.join(tmp, "allreduce.json")
    mp.start_processes(_allreduce_rank, args=(os.path.join(tmp, "init"), result), nprocs=2, start_method="spawn")
    return {"note": "one all-reduce per row-parallel layer (o_proj, down_proj): 2 per layer, 36 layers; "
                    "per_step_ms = 2 * 36 * per_call; tokens = decode batch size (or prefill tokens)",
            "by_tokens": json.loads(Path(result).read_text())}


def _summary(ttfts, tpots, tokens, elapsed) -> dict:
    pct = lambda xs, q: sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else None
    return {"ttft_p50_ms": pct(ttfts, 0.5) * 1e3, "ttft_p99_ms": pct(ttfts, 0.99) * 1e3,
            "tpot_p50_ms": pct(tpots, 0.5) * 1e3 if tpots else None,
            "tpot_p99_ms": pct(tpots, 0.99) * 1e3 if tpots else None,
            "output_tok_per_s": tokens / elapsed, "elapsed_s": elapsed}


@part("pd", 150)
def pd() -> dict:
    from reference import LLM, SamplingParams
    from reference.distributed.disaggregation import DisaggregatedLLM
    from reference.metrics import request_metrics
    left = BUDGET_S - (time.monotonic() - START)
    shape = "Qwen3-8B" if left > 280 else "Qwen3-0.6B"   # the smaller shape when the budget is short
    model = model_8b() if shape == "Qwen3-8B" else model_0_6b()
    requests = make_workload("quick", QWEN3_8B["vocab_size"], seed=0)
    params = [SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True) for r in requests]
    prompts = [r.prompt for r in requests]
    config = dict(device="cuda", dtype="bfloat16", max_num_seqs=64, max_num_batched_tokens=8192, max_model_len=1024)
    out = {"workload": "quick (64 requests submitted at once)", "model": f"{shape} shape, random bf16"}

    llm = LLM(model, **config)
    llm.generate(prompts[:4], params[:4], use_tqdm=False)    # warm-up
    first = len(llm.log.events)
    t0 = time.perf_counter()
    colocated = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    m = list(request_metrics(llm.log.events[first:]).values())
    out["colocated"] = _summary([x.ttft for x in m], [x.tpot for x in m if x.tpot is not None],
                                sum(len(o["token_ids"]) for o in colocated), elapsed)
    del llm
    free_gpu()

    pd_llm = DisaggregatedLLM(model, **config)
    try:
        pd_llm.generate(prompts[:4], params[:4])                  # warm-up
        t0 = time.perf_counter()
        results = pd_llm.generate(prompts, params)
        elapsed = time.perf_counter() - t0
    finally:
        pd_llm.close()
    ttfts = [r["first_token_time"] - r["arrival_time"] for r in results]
    tpots = [(r["finished_time"] - r["first_token_time"]) / (len(r["token_ids"]) - 1)
             for r in results if len(r["token_ids"]) > 1]
    out["disaggregated"] = _summary(ttfts, tpots, sum(len(r["token_ids"]) for r in results), elapsed)
    out["tokens_equal_colocated"] = [r["token_ids"] for r in results] == [o["token_ids"] for o in colocated]
    transfers = sorted((r["kv_bytes"], r["kv_transfer_s"]) for r in results if r["kv_bytes"])
    out["kv_transfer"] = {
        "requests": len(transfers),
        "total_bytes": sum(b for b, _ in transfers), "total_s": sum(s for _, s in transfers),
        "GB_per_s_overall": sum(b for b, _ in transfers) / max(1e-9, sum(s for _, s in transfers)) / 1e9,
        "smallest": {"bytes": transfers[0][0], "ms": transfers[0][1] * 1e3},
        "median": {"bytes": transfers[len(transfers) // 2][0], "ms": transfers[len(transfers) // 2][1] * 1e3},
        "largest": {"bytes": transfers[-1][0], "ms": transfers[-1][1] * 1e3},
        "all_bytes_ms": [(b, round(s * 1e3, 3)) for b, s in transfers],
    }
    return out


def table() -> None:
    print("\n==================== gpu_tp summary ====================")
    for name in ("fp32_equality", "bf16_agreement", "allreduce", "tp_bench", "pd"):
        r = RESULTS.get(name)
        if r is None:
            continue
        if "error" in r or "skipped" in r:
            print(f"{name:16s} {'ERROR' if 'error' in r else 'SKIPPED'}: {(r.get('error') or r.get('skipped'))[-300:]}")
            continue
        if name == "fp32_equality":
            print(f"{name:16s} equal={r['equal']} ({r['prompts_equal']}/{r['prompts']} prompts) prefixes={r['common_prefix']}")
        elif name == "bf16_agreement":
            print(f"{name:16s} first-token agreement {r['first_token_agreement']:.2f} (tolerance >= 0.90: "
                  f"{r['within_tolerance']}); prompts equal {r['prompts_equal']}/{r['prompts']}")
        elif name == "tp_bench":
            for tp in ("tp1", "tp2"):
                e = r[tp]
                print(f"{name:16s} {tp}: {e['output_tok_per_s']:,.0f} out tok/s, {e['elapsed_s']:.2f} s, "
                      f"TPOT p50 {e['tpot_s']['p50'] * 1e3:.1f} ms, graphs {e['cuda_graphs']}")
            print(f"{name:16s} TP2/TP1 = {r['tp2_over_tp1']:.2f}")
            ar = RESULTS.get("allreduce", {}).get("by_tokens", {}).get("64")
            if ar:
                print(f"{name:16s} all-reduce at batch 64: {ar['per_step_ms']:.2f} ms of TP2's TPOT p50 "
                      f"{r['tp2']['tpot_s']['p50'] * 1e3:.1f} ms")
        elif name == "allreduce":
            for tokens, row in r["by_tokens"].items():
                print(f"{name:16s} {tokens:>5} tokens: {row['per_call_us']:.1f} us/call, {row['per_step_ms']:.2f} ms/step")
        elif name == "pd":
            for kind in ("colocated", "disaggregated"):
                e = r[kind]
                print(f"{name:16s} {kind:13s} TTFT p50 {e['ttft_p50_ms']:.1f} ms, TPOT p50 {e['tpot_p50_ms']:.1f} ms, "
                      f"{e['output_tok_per_s']:,.0f} out tok/s")
            k = r["kv_transfer"]
            print(f"{name:16s} tokens equal: {r['tokens_equal_colocated']}; KV {k['total_bytes'] / 2**20:.0f} MiB in "
                  f"{k['total_s'] * 1e3:.0f} ms ({k['GB_per_s_overall']:.1f} GB/s); median {k['median']}")
    print(f"total {time.monotonic() - START:.0f} s; JSON in {OUT / 'gpu_tp.json'}")


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    if torch.cuda.device_count() < 2:
        RESULTS["error"] = f"needs 2 GPUs, found {torch.cuda.device_count()}"
    else:
        wanted = os.environ.get("GPU_TP_PARTS")   # e.g. "tp_bench,pd": run only these parts
        for run in (fp32_equality, bf16_agreement, allreduce, tp_bench, pd):
            if wanted is None or run.__name__ in wanted.split(","):
                run()
    (OUT / "gpu_tp.json").write_text(json.dumps(RESULTS, indent=2))
    table()
