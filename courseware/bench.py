"""`inferlab bench`: output throughput of the engine, and of Hugging Face `generate`, on one workload.

bench-256 (docs/design.md §6): 256 requests, prompt and output lengths uniform in
100..1024 (seeded), random token ids, ignore_eos. Throughput counts output
tokens over wall time including prefill. `--compare hf` runs transformers'
`generate` on the same requests in the same process: batched, left-padded,
greedy, each batch running until its longest request is done, counting only
the tokens each request asked for -- what static batching costs. It runs at its
best setting that fits (`run_hf_best`: the largest batch that does not run out
of memory, with the allocator's expandable segments), and the result says which.
"""
from __future__ import annotations

import gc
import json
import platform
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from courseware.terminal import make_console

QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                  rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True)
WORKLOADS = {"bench-256": dict(num_requests=256, low=100, high=1024),
             "quick": dict(num_requests=64, low=32, high=256)}
# The bench's own engine settings, where it departs from Config's defaults: a prefill step of up to 16,384
# tokens admits bench-256's prompts in a few large steps (the GPU's best shape for them; docs/performance.md).
BENCH_ENGINE = dict(max_num_batched_tokens=16384)


@dataclass
class Request:
    prompt: list[int]
    output_len: int


def make_workload(name: str, vocab_size: int, seed: int = 0) -> list[Request]:
    spec = WORKLOADS[name]
    rng = random.Random(seed)
    return [Request([rng.randrange(vocab_size) for _ in range(rng.randint(spec["low"], spec["high"]))],
                    rng.randint(spec["low"], spec["high"])) for _ in range(spec["num_requests"])]


def make_random_model(out_dir: str | Path, shape: dict = QWEN3_0_6B, seed: int = 0,
                      dtype: torch.dtype = torch.bfloat16, device: str = "cpu") -> Path:
    """A Hugging Face folder with random weights of the given Qwen3 shape (no download).

    Weights are drawn directly as tensors (normal, std 0.02; norms at 1), which
    takes seconds where building the transformers module would take minutes.
    `device="cuda"` draws them on the GPU (an 8B shape: seconds instead of a
    minute); the weights then differ from the CPU's for the same seed.
    """
    import transformers
    from safetensors.torch import save_file
    from courseware.tiny_model import ensure_tiny_model

    out = Path(out_dir)
    if (out / "model.safetensors").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = transformers.Qwen3Config(**shape, dtype=str(dtype).replace("torch.", ""))
    config.save_pretrained(out)
    gen = torch.Generator(device).manual_seed(seed)
    h, i, d = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"]
    q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d

    def rand(*size):
        return (torch.randn(*size, generator=gen, device=device) * 0.02).to(dtype).cpu()

    tensors = {"model.embed_tokens.weight": rand(shape["vocab_size"], h), "model.norm.weight": torch.ones(h, dtype=dtype)}
    for layer in range(shape["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors.update({
            p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
            p + "self_attn.q_norm.weight": torch.ones(d, dtype=dtype), p + "self_attn.k_norm.weight": torch.ones(d, dtype=dtype),
            p + "mlp.gate_proj.weight": rand(i, h), p + "mlp.up_proj.weight": rand(i, h), p + "mlp.down_proj.weight": rand(h, i),
            p + "input_layernorm.weight": torch.ones(h, dtype=dtype),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=dtype)})
    if not shape.get("tie_word_embeddings", False):
        tensors["lm_head.weight"] = rand(shape["vocab_size"], h)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    # The tokenizer only has to load: the workload is token ids.
    transformers.AutoTokenizer.from_pretrained(ensure_tiny_model()).save_pretrained(out)
    return out


def random_model_dir(shape_name: str = "qwen3-0.6b", dtype_name: str = "bfloat16") -> Path:
    """Where `make_random_model` caches a shape: beside the tiny model, under INFERLAB_CACHE."""
    from courseware.tiny_model import default_model_dir
    return default_model_dir().parent / f"random-{shape_name}-{dtype_name}"


def percentiles(values: list[float]) -> dict[str, float | None]:
    import numpy as np
    if not values:
        return {"p50": None, "p90": None, "p99": None}
    return {f"p{p}": float(np.percentile(values, p)) for p in (50, 90, 99)}


BATCH_BANDS = ((1, 15), (16, 63), (64, 127), (128, 255), (256, None))


def time_by_batch(events: list[dict], end_time: float) -> list[dict]:
    """Wall time between consecutive STEP events, summed by step kind and decode batch size.

    It shows where a run's time goes: a long tail of small decode batches
    costs steps that move few tokens each.
    """
    steps = [e for e in events if e["event"] == "STEP"]
    bands = {("prefill", None): [0, 0.0, 0]}
    bands.update({("decode", band): [0, 0.0, 0] for band in BATCH_BANDS})
    for step, nxt in zip(steps, steps[1:] + [None]):
        duration = (nxt["time"] if nxt else end_time) - step["time"]
        if step["is_prefill"]:
            key = ("prefill", None)
        else:
            key = ("decode", next(b for b in BATCH_BANDS if step["batch_size"] >= b[0]
                                  and (b[1] is None or step["batch_size"] <= b[1])))
        bands[key][0] += 1
        bands[key][1] += duration
        bands[key][2] += step["num_tokens"]
    rows = []
    for (kind, band), (n, seconds, tokens) in bands.items():
        label = kind if band is None else f"decode batch {band[0]}" + (f"-{band[1]}" if band[1] else "+")
        rows.append({"steps": label, "count": n, "seconds": seconds, "tokens": tokens})
    return rows


def run_engine(model_dir: str, requests: list[Request], **config) -> dict:
    """Submit every request at once, step to completion; throughput and latency from the engine."""
    from courseware.engine import LLM, SamplingParams     # in a release: the student's engine (courseware/engine.py)
    from reference.engine.collector import full_collections_deferred
    from reference.metrics import check_lifecycle, request_metrics

    max_len = max(len(r.prompt) + r.output_len for r in requests)
    llm = LLM(model_dir, max_model_len=max(max_len, 128), **config)
    warm = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 4
    # Compilation and caches out of the timing; reversed, so the warm-up leaves no prefix-cache hits behind.
    llm.generate([r.prompt[:64][::-1] for r in requests[:4]], warm, use_tqdm=False)
    first_event = len(llm.log.events)
    sync = torch.cuda.synchronize if llm.config.device == "cuda" else (lambda: None)
    # What a serving engine does after start-up (vLLM freezes its heap too): the objects alive now (the
    # model, compiled code and graphs, tens of thousands) leave the collector's sight. Without this,
    # full collections scanning them were a large share of a synchronous decode step at batch 256
    # (scripts/step_gap.py; docs/performance.md). During the run, full collections wait as in LLM.generate.
    gc.collect()
    gc.freeze()
    sync()
    with full_collections_deferred():
        start = time.perf_counter()
        for r in requests:
            llm.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True))
        steps = 0
        while not llm.is_finished():
            llm.step()
            steps += 1
        sync()
        end = time.perf_counter()
    gc.unfreeze()
    failed = sorted({seq.error for seq in llm.finished.values() if getattr(seq, "error", None)})
    if failed:
        raise RuntimeError(f"requests failed during the benchmark run: {'; '.join(failed)[:500]}")
    elapsed = end - start
    events = llm.log.events[first_event:]
    problems = check_lifecycle(events, async_scheduling=llm.config.async_scheduling)
    if problems:
        raise RuntimeError(f"the benchmark run left an illegal lifecycle log: {problems[:3]}")
    metrics = request_metrics(events).values()
    output_tokens = sum(m.num_output_tokens for m in metrics)
    result = {
        "elapsed_s": elapsed, "steps": steps, "output_tokens": output_tokens,
        "output_tok_per_s": output_tokens / elapsed,
        "total_tok_per_s": (output_tokens + sum(len(r.prompt) for r in requests)) / elapsed,
        "ttft_s": percentiles([m.ttft for m in metrics if m.ttft is not None]),
        "tpot_s": percentiles([m.tpot for m in metrics if m.tpot is not None]),
        "preemptions": sum(m.num_preemptions for m in metrics),
        "time_by_batch": time_by_batch(events, end),
        # A release's stand-in runner (courseware/standins/) has neither an attention backend nor graphs.
        "attention_backend": getattr(getattr(llm.model_runner, "backend", None), "name", type(llm.model_runner).__name__),
        "cuda_graphs": bool(getattr(llm.model_runner, "graphs", None)),
        "async_scheduling": llm.config.async_scheduling,
        "num_kvcache_blocks": llm.model_runner.num_kvcache_blocks, "dtype": str(llm.config.torch_dtype),
        "tensor_parallel_size": llm.config.tensor_parallel_size,
    }
    if hasattr(llm.model_runner, "close"):
        llm.model_runner.close()   # TP workers: stop them before the next engine starts its own
    del llm
    return result


HF_ALLOCATOR = "expandable_segments:True"


def hf_batch_sizes(largest: int, num_requests: int) -> list[int]:
    """Batch sizes to try for transformers, largest first: `largest` (at most every request at once),
    then halving down to 1."""
    size = max(1, min(largest, num_requests))
    sizes = [size]
    while size > 1:
        size //= 2
        sizes.append(size)
    return sizes


def run_hf_best(model_dir: str, requests: list[Request], device: str, dtype: torch.dtype, largest: int,
                log=print) -> dict:
    """transformers at its best setting that fits: the largest batch that runs without running out of memory.

    Each try runs in a fresh Python process with PYTORCH_CUDA_ALLOC_CONF set to
    `HF_ALLOCATOR` (the allocator reads it when CUDA starts, so it cannot be
    changed in this process, whose engine already started CUDA): transformers'
    KV cache grows by concatenation, and without expandable segments it
    fragments memory and runs out at batch 256 on an 80 GB GPU. The result
    says which setting ran and what the failed tries were.
    """
    import os
    import subprocess
    import sys
    import tempfile

    attempts = []
    for batch_size in hf_batch_sizes(largest, len(requests)):
        with tempfile.TemporaryDirectory() as tmp:
            spec, out = Path(tmp) / "spec.json", Path(tmp) / "out.json"
            spec.write_text(json.dumps({"model_dir": model_dir, "device": device, "dtype": str(dtype).split(".")[-1],
                                        "batch_size": batch_size, "requests": [asdict(r) for r in requests]}))
            env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": HF_ALLOCATOR}
            log(f"transformers generate, batch {batch_size}, PYTORCH_CUDA_ALLOC_CONF={HF_ALLOCATOR}")
            proc = subprocess.run([sys.executable, "-c", "import sys; from courseware.bench import _hf_child; "
                                   "_hf_child(sys.argv[1], sys.argv[2])", str(spec), str(out)], env=env,
                                  capture_output=True, text=True)
            result = json.loads(out.read_text()) if out.is_file() else None
        if result is not None and not result.get("out_of_memory"):
            result.update(allocator=HF_ALLOCATOR, attempts=attempts)
            return result
        reason = "out of memory" if result is not None else f"exit code {proc.returncode}: {proc.stderr[-2000:]}"
        attempts.append({"batch_size": batch_size, "allocator": HF_ALLOCATOR, "failed": reason})
        if result is None:   # not a memory failure: a smaller batch would fail the same way
            raise RuntimeError(f"transformers generate failed at batch {batch_size} ({reason})")
    raise RuntimeError(f"transformers generate ran out of memory at every batch size: {attempts}")


def _hf_child(spec_path: str, out_path: str) -> None:
    """One `run_hf` in this (fresh) process; writes its result, or {"out_of_memory": true}."""
    spec = json.loads(Path(spec_path).read_text())
    requests = [Request(**r) for r in spec["requests"]]
    try:
        result = run_hf(spec["model_dir"], requests, spec["device"], getattr(torch, spec["dtype"]),
                        spec["batch_size"])
    except torch.OutOfMemoryError:
        result = {"out_of_memory": True, "batch_size": spec["batch_size"]}
    Path(out_path).write_text(json.dumps(result))


def run_hf(model_dir: str, requests: list[Request], device: str, dtype: torch.dtype, batch_size: int) -> dict:
    """transformers `generate` with static batches, left-padded, greedy, no early stop."""
    import transformers

    free_at_start = torch.cuda.mem_get_info()[0] if device == "cuda" else None
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    pad = 0
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for b in range(0, len(requests), batch_size):
        batch = requests[b:b + batch_size]
        width = max(len(r.prompt) for r in batch)
        ids = torch.tensor([[pad] * (width - len(r.prompt)) + r.prompt for r in batch], device=device)
        mask = torch.tensor([[0] * (width - len(r.prompt)) + [1] * len(r.prompt) for r in batch], device=device)
        new = max(r.output_len for r in batch)
        config = transformers.GenerationConfig(do_sample=False, max_new_tokens=new, min_new_tokens=new,
                                               pad_token_id=pad, eos_token_id=None)
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, generation_config=config)
    sync()
    elapsed = time.perf_counter() - start
    asked = sum(r.output_len for r in requests)
    del model
    memory = {} if device != "cuda" else {"gpu_free_at_start_bytes": free_at_start,
                                           "gpu_peak_allocated_bytes": torch.cuda.max_memory_allocated()}
    return {"elapsed_s": elapsed, "output_tokens": asked, "output_tok_per_s": asked / elapsed,
            "batch_size": batch_size, **memory}


# What `bandwidth_ceiling` reads from a model's config.json.
CEILING_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim")
# Device-to-device copy bandwidth measured on an H100 of this course's machines (docs/performance.md).
COPY_BANDWIDTH = 3.0e12


def bandwidth_ceiling(requests: list[Request], shape: dict, dtype_bytes: int, bandwidth: float = COPY_BANDWIDTH,
                      num_parameters: int | None = None) -> dict:
    """Output tok/s if decode did nothing but read its bytes at `bandwidth`: every cached K/V once per
    generated token, and the weights once per decode step (the longest request's output - 1 steps).
    Prefill and everything else count as free, so no engine reaches it."""
    per_token = 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * dtype_bytes
    kv_tokens = sum((r.output_len - 1) * len(r.prompt) + (r.output_len - 1) * r.output_len / 2 for r in requests)
    if num_parameters is None:
        h, i, d = shape["hidden_size"], shape["intermediate_size"], shape["head_dim"]
        q, kv = shape["num_attention_heads"] * d, shape["num_key_value_heads"] * d
        num_parameters = shape["vocab_size"] * h + shape["num_hidden_layers"] * (h * (q + 2 * kv) + q * h + 3 * h * i)
    steps = max(r.output_len for r in requests) - 1
    seconds = (per_token * kv_tokens + num_parameters * dtype_bytes * steps) / bandwidth
    output = sum(r.output_len for r in requests)
    return {"bandwidth_bytes_per_s": bandwidth, "kv_bytes": per_token * kv_tokens, "decode_steps": steps,
            "seconds": seconds, "output_tok_per_s": output / seconds}


def environment(device: str) -> dict:
    import transformers
    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": device}
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        try:
            import triton
            env["triton"] = triton.__version__
        except ImportError:
            pass
    return env


def run_bench(args, console: Console | None = None) -> dict:
    console = console or make_console()
    tensor_parallel_size = getattr(args, "tensor_parallel_size", None) or 1
    device = args.device if args.device not in (None, "auto") else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    if args.model:
        model_dir = args.model
    else:
        if device == "cpu":      # the bench's shape is a GPU workload: on a laptop it runs for many minutes
            console.print(f"[yellow]note:[/yellow] {args.shape} on the CPU takes many minutes; for a quick run, "
                          "bench the tiny model: `inferlab make-tiny-model DIR`, then `--model DIR --dtype float32`")
        model_dir = str(make_random_model(random_model_dir(args.shape, args.dtype), dtype=dtype))
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    requests = make_workload(args.workload, vocab, seed=args.seed)
    console.print(f"[bold]{args.workload}[/bold]: {len(requests)} requests, "
                  f"{sum(len(r.prompt) for r in requests)} prompt / {sum(r.output_len for r in requests)} "
                  f"output tokens; model {model_dir}; {device} {args.dtype}")
    chosen = dict(attention_backend=args.backend, max_num_seqs=args.max_num_seqs, kvcache_block_size=args.block_size,
                  max_num_batched_tokens=args.max_num_batched_tokens, tensor_parallel_size=tensor_parallel_size)
    # The engine's own defaults, less the bench's departures, less what the command line chose.
    config = dict(device=device, dtype=args.dtype, enforce_eager=args.enforce_eager,
                  **{**BENCH_ENGINE, **{k: v for k, v in chosen.items() if v is not None}})
    modes = ["sync", "async"] if args.scheduling == "both" else [args.scheduling]
    result = {"workload": args.workload, "seed": args.seed, "model": model_dir,
              "settings": {**config, "scheduling": args.scheduling}, "environment": environment(device),
              "engines": {}}
    for mode in modes:   # "both": sync first, so async is not helped by a warmer machine
        result["engines"][mode] = run_engine(model_dir, requests, async_scheduling=(mode == "async"), **config)
        if device == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
    result["engine"] = result["engines"][modes[-1]]
    if len(modes) == 2:
        result["async_over_sync"] = (result["engines"]["async"]["output_tok_per_s"]
                                     / result["engines"]["sync"]["output_tok_per_s"])
    if device == "cuda":
        shape = json.loads((Path(model_dir) / "config.json").read_text())
        if all(k in shape for k in CEILING_KEYS):
            ceiling = bandwidth_ceiling(requests, shape, torch.finfo(dtype).bits // 8)
            ceiling["engine_fraction"] = result["engine"]["output_tok_per_s"] / ceiling["output_tok_per_s"]
            result["ceiling"] = ceiling
    if args.compare == "hf":
        if device == "cuda":
            torch.cuda.synchronize()
            gc.collect()               # an engine caught in a reference cycle still holds its KV cache
            torch.cuda.empty_cache()   # the child process needs the memory the engines left cached
        result["hf"] = run_hf_best(model_dir, requests, device, dtype, args.hf_batch_size,
                                   log=lambda m: console.print(m))
        result["speedup_vs_hf"] = result["engine"]["output_tok_per_s"] / result["hf"]["output_tok_per_s"]
        if "ceiling" in result:
            result["ceiling"]["hf_fraction"] = result["hf"]["output_tok_per_s"] / result["ceiling"]["output_tok_per_s"]
    print_result(result, console)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        console.print(f"results written to {args.out}")
    return result


def print_result(result: dict, console: Console) -> None:
    table = Table(title=f"{result['workload']} on {result['environment'].get('gpu', result['environment']['device'])}")
    for col in ("system", "output tok/s", "total tok/s", "wall s", "TTFT p50/p99 ms", "TPOT p50/p99 ms"):
        table.add_column(col, justify="right")
    ms = lambda d, k: "-" if d[k] is None else f"{d[k] * 1000:.1f}"
    for mode, e in result["engines"].items():
        table.add_row(f"inferlab {mode} ({e['attention_backend']}, graphs {'on' if e['cuda_graphs'] else 'off'})",
                      f"{e['output_tok_per_s']:,.0f}", f"{e['total_tok_per_s']:,.0f}", f"{e['elapsed_s']:.2f}",
                      f"{ms(e['ttft_s'], 'p50')}/{ms(e['ttft_s'], 'p99')}",
                      f"{ms(e['tpot_s'], 'p50')}/{ms(e['tpot_s'], 'p99')}")
    if "hf" in result:
        h = result["hf"]
        table.add_row(f"transformers generate (batch {h['batch_size']})", f"{h['output_tok_per_s']:,.0f}", "-",
                      f"{h['elapsed_s']:.2f}", "-", "-")
    console.print(table)
    if "async_over_sync" in result:
        console.print(f"async / sync scheduling: [bold]{result['async_over_sync']:.2f}x[/bold]")
    if "ceiling" in result:
        c = result["ceiling"]
        console.print(f"KV-bandwidth ceiling ({c['bandwidth_bytes_per_s'] / 1e12:.1f} TB/s): "
                      f"{c['output_tok_per_s']:,.0f} output tok/s; engine at [bold]{c['engine_fraction']:.1%}[/bold]"
                      + (f", transformers at {c['hf_fraction']:.1%}" if "hf_fraction" in c else ""))
    if "speedup_vs_hf" in result:
        h = result["hf"]
        console.print(f"engine / transformers: [bold]{result['speedup_vs_hf']:.2f}x[/bold] (transformers at batch "
                      f"{h['batch_size']}, PYTORCH_CUDA_ALLOC_CONF={h.get('allocator', 'default')}"
                      + (f"; failed first: {[a['batch_size'] for a in h['attempts']]}" if h.get("attempts") else "")
                      + ")")
