"""`inferlab bench`: output throughput of the engine, and of Hugging Face `generate`, on one workload.

bench-256 (docs/design.md §6): 256 requests, prompt and output lengths uniform in
100..1024 (seeded), random token ids, ignore_eos. Throughput counts output
tokens over wall time including prefill. `--compare hf` runs transformers'
`generate` on the same requests in the same process: batched, left-padded,
greedy, each batch running until its longest request is done, counting only
the tokens each request asked for -- what static batching costs.
"""
from __future__ import annotations

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
    from reference import LLM, SamplingParams
    from reference.metrics import check_lifecycle, request_metrics

    max_len = max(len(r.prompt) + r.output_len for r in requests)
    llm = LLM(model_dir, max_model_len=max(max_len, 128), **config)
    warm = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)] * 4
    # Compilation and caches out of the timing; reversed, so the warm-up leaves no prefix-cache hits behind.
    llm.generate([r.prompt[:64][::-1] for r in requests[:4]], warm, use_tqdm=False)
    first_event = len(llm.log.events)
    sync = torch.cuda.synchronize if llm.config.device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for r in requests:
        llm.add_request(r.prompt, SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True))
    steps = 0
    while not llm.is_finished():
        llm.step()
        steps += 1
    sync()
    end = time.perf_counter()
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
        "attention_backend": llm.model_runner.backend.name, "cuda_graphs": bool(llm.model_runner.graphs),
        "async_scheduling": llm.config.async_scheduling,
        "num_kvcache_blocks": llm.model_runner.num_kvcache_blocks, "dtype": str(llm.config.torch_dtype),
        "tensor_parallel_size": llm.config.tensor_parallel_size,
    }
    if hasattr(llm.model_runner, "close"):
        llm.model_runner.close()   # TP workers: stop them before the next engine starts its own
    del llm
    return result


def run_hf(model_dir: str, requests: list[Request], device: str, dtype: torch.dtype, batch_size: int) -> dict:
    """transformers `generate` with static batches, left-padded, greedy, no early stop."""
    import transformers

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
    return {"elapsed_s": elapsed, "output_tokens": asked, "output_tok_per_s": asked / elapsed,
            "batch_size": batch_size}


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
    tensor_parallel_size = getattr(args, "tensor_parallel_size", 1)
    if tensor_parallel_size > 1 and args.scheduling != "sync":
        raise SystemExit("--tensor-parallel-size > 1 needs --scheduling sync (async scheduling is single-GPU only)")
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[args.dtype]
    if args.model:
        model_dir = args.model
    else:
        model_dir = str(make_random_model(random_model_dir(args.shape, args.dtype), dtype=dtype))
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    requests = make_workload(args.workload, vocab, seed=args.seed)
    console.print(f"[bold]{args.workload}[/bold]: {len(requests)} requests, "
                  f"{sum(len(r.prompt) for r in requests)} prompt / {sum(r.output_len for r in requests)} "
                  f"output tokens; model {model_dir}; {device} {args.dtype}")
    config = dict(device=device, dtype=args.dtype, attention_backend=args.backend, enforce_eager=args.enforce_eager,
                  max_num_seqs=args.max_num_seqs, kvcache_block_size=args.block_size,
                  max_num_batched_tokens=args.max_num_batched_tokens,
                  tensor_parallel_size=tensor_parallel_size)
    modes = ["sync", "async"] if args.scheduling == "both" else [args.scheduling]
    result = {"workload": args.workload, "seed": args.seed, "model": model_dir,
              "settings": {**config, "scheduling": args.scheduling}, "environment": environment(device),
              "engines": {}}
    for mode in modes:   # "both": sync first, so async is not helped by a warmer machine
        result["engines"][mode] = run_engine(model_dir, requests, async_scheduling=(mode == "async"), **config)
        if device == "cuda":
            torch.cuda.empty_cache()
    result["engine"] = result["engines"][modes[-1]]
    if len(modes) == 2:
        result["async_over_sync"] = (result["engines"]["async"]["output_tok_per_s"]
                                     / result["engines"]["sync"]["output_tok_per_s"])
    if args.compare == "hf":
        result["hf"] = run_hf(model_dir, requests, device, dtype, args.hf_batch_size)
        result["speedup_vs_hf"] = result["engine"]["output_tok_per_s"] / result["hf"]["output_tok_per_s"]
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
    if "speedup_vs_hf" in result:
        console.print(f"engine / transformers: [bold]{result['speedup_vs_hf']:.2f}x[/bold]")
