"""Lab 5: run one seeded offline workload through the engine and keep everything needed to report on it.

    python assignments/lab5_performance/lab5_run.py NAME [settings...]

writes runs/NAME.jsonl (the lifecycle log; inspect it with `inferlab trace runs/NAME.jsonl`),
runs/NAME.json (the settings, the environment, and the headline numbers) and runs/NAME_calls.txt
(the call tree of one decode step, traced with sys.setprofile); appends one
row to results/runs.csv (every run so far, one line each) and writes results/NAME_steps.csv
(one line per engine step: phase, batch size, tokens, queue lengths, KV blocks, duration).
Two runs are comparable when they differ only in the settings you changed: the workload
depends on --requests, --seed and --shared-prefix alone.

Examples (see the handout, assignments/lab5_performance/README.md):
    python assignments/lab5_performance/lab5_run.py base --max-num-seqs 8
    python assignments/lab5_performance/lab5_run.py tight --max-num-seqs 8 --num-kvcache-blocks 40
    python assignments/lab5_performance/lab5_run.py chunk64 --max-num-seqs 8 --chunked-prefill --max-num-batched-tokens 64
    python assignments/lab5_performance/lab5_run.py shared --shared-prefix 256 --no-prefix-caching
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import time
from pathlib import Path


def workload(requests: int, seed: int, shared_prefix: int, vocab: int = 1000):
    """Token-id prompts of 16..128 tokens (after an optional shared prefix), outputs of 8..64 tokens, ignore_eos."""
    import numpy as np
    from reference import SamplingParams
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, vocab, size=shared_prefix).tolist()
    prompts = [prefix + rng.integers(0, vocab, size=int(rng.integers(16, 129))).tolist() for _ in range(requests)]
    outputs = rng.integers(8, 65, size=requests).tolist()
    return prompts, [SamplingParams(temperature=0.0, max_tokens=int(n), ignore_eos=True) for n in outputs]


def write_csvs(folder: Path, name: str, result: dict, events: list[dict]) -> None:
    """results/runs.csv gains this run's row; results/NAME_steps.csv gets one row per step.

    The rows are computed by courseware/lab5_results.py, which the grader
    also uses to recompute them from the submitted log.
    """
    from courseware.lab5_results import RUN_COLUMNS, STEP_COLUMNS, run_row, step_rows
    folder.mkdir(parents=True, exist_ok=True)
    settings = result["settings"]
    columns = {"requests": result["workload"]["requests"], "seed": result["workload"]["seed"],
               "shared_prefix": result["workload"]["shared_prefix"], "max_num_seqs": settings["max_num_seqs"],
               "max_num_batched_tokens": settings["max_num_batched_tokens"],
               "num_kvcache_blocks": settings["num_kvcache_blocks"], "block_size": settings["kvcache_block_size"],
               "chunked_prefill": settings["enable_chunked_prefill"],
               "prefix_caching": settings["enable_prefix_caching"], "device": settings["device"],
               "backend": settings["attention_backend"]}
    runs = folder / "runs.csv"
    new_file = not runs.is_file()
    with runs.open("a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=RUN_COLUMNS)
        if new_file:
            writer.writeheader()
        writer.writerow(run_row(name, columns, result["wall_s"], events))
    with (folder / f"{name}_steps.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=STEP_COLUMNS)
        writer.writeheader()
        writer.writerows(step_rows(events))


CALLS_HEADER = "# call tree of one decode step (sys.setprofile), one call per line: indented qualified name  [module]"


def trace_decode_step(model: str, settings: dict, prompt: list[int], path: Path) -> list[tuple[int, str, str]]:
    """Trace the second step (a decode) of a one-request engine; write `path`, return [(depth, module, qualname)].

    A separate engine after the measured run, so the profiler's cost (every
    Python call reports) never enters the timings. The lab 5 grader checks the
    report's call chain against this file, so the chain is the traced one.
    """
    import os
    import sys
    from reference import LLM, SamplingParams
    llm = LLM(model, **settings)
    llm.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    llm.step()                                               # the prefill
    # The engine package's folder (`reference`, or `student_exercises` in a student release).
    package = os.path.dirname(sys.modules[LLM.__module__.split(".")[0]].__file__)
    calls: list[tuple[int, str, str]] = []
    stack: list = []

    def profiler(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(package):
            name = code.co_qualname
            if not name.split(".")[-1].startswith("<"):       # no comprehensions or lambdas
                calls.append((len(stack), frame.f_globals.get("__name__", "?"), name))
                stack.append(frame)
        elif event == "return" and stack and stack[-1] is frame:
            stack.pop()

    sys.setprofile(profiler)
    try:
        llm.step()                                           # a decode step
    finally:
        sys.setprofile(None)
    lines = [CALLS_HEADER] + [f"{'    ' * depth}{name}    [{module}]" for depth, module, name in calls]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return calls


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="run name: writes runs/NAME.jsonl and runs/NAME.json")
    parser.add_argument("--out", default="runs", help="folder for the log and the JSON (default: runs)")
    parser.add_argument("--results", default="results", help="folder for the CSV files (default: results)")
    parser.add_argument("--model", help="Hugging Face model folder (default: the built-in tiny model)")
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shared-prefix", type=int, default=0, help="tokens every prompt starts with")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--num-kvcache-blocks", type=int, default=None, help="KV pool size (default: from memory)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--chunked-prefill", action="store_true")
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (GPU only)")
    parser.add_argument("--warmup", type=int, default=4, help="requests run first, on a separate engine, untimed")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import torch
    from courseware.tiny_model import ensure_tiny_model
    from reference import LLM
    from reference.metrics import read_log, request_metrics, summarize

    model = args.model or str(ensure_tiny_model())
    settings = dict(device=args.device, max_num_seqs=args.max_num_seqs, kvcache_block_size=args.block_size,
                    enable_chunked_prefill=args.chunked_prefill, enable_prefix_caching=not args.no_prefix_caching,
                    enforce_eager=args.enforce_eager)
    if args.max_num_batched_tokens is not None:
        settings["max_num_batched_tokens"] = args.max_num_batched_tokens
    if args.num_kvcache_blocks is not None:
        settings["num_kvcache_blocks"] = args.num_kvcache_blocks
    prompts, params = workload(args.requests, args.seed, args.shared_prefix)
    if args.warmup:
        # One-time costs of the process (allocator, kernels, graph capture) stay out of the measured run.
        LLM(model, **settings).generate(prompts[:args.warmup], params[:args.warmup], use_tqdm=False)
    out = Path(args.out)
    log_path = out / f"{args.name}.jsonl"
    llm = LLM(model, lifecycle_log=str(log_path), **settings)
    start = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    llm.log.close()

    summary = summarize(request_metrics(read_log(log_path)).values())
    tokens = summary["totals"]["output_tokens"]
    result = {
        "name": args.name, "log": str(log_path), "command": vars(args),
        "workload": {"requests": args.requests, "seed": args.seed, "shared_prefix": args.shared_prefix,
                     "prompt_tokens": sum(len(p) for p in prompts)},
        "settings": {**settings, "num_kvcache_blocks": llm.model_runner.num_kvcache_blocks,
                     "max_num_batched_tokens": llm.config.max_num_batched_tokens,
                     "attention_backend": llm.model_runner.backend.name, "dtype": str(llm.config.torch_dtype)},
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "machine": platform.machine(), "processor": platform.processor(),
                        "torch_threads": torch.get_num_threads(),
                        "gpu": torch.cuda.get_device_name() if llm.config.device == "cuda" else None},
        "wall_s": wall, "output_tokens": tokens, "output_tok_per_s": tokens / wall,
        "summary": summary,
    }
    (out / f"{args.name}.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    write_csvs(Path(args.results), args.name, result, read_log(log_path))
    trace_decode_step(model, settings, prompts[0], out / f"{args.name}_calls.txt")
    ms = lambda d, k: "-" if d[k] is None else f"{d[k] * 1e3:.1f}"
    print(f"{args.name}: {tokens} output tokens in {wall:.2f} s = {tokens / wall:,.0f} tok/s; "
          f"TTFT p50/p99 {ms(summary['ttft'], 'p50')}/{ms(summary['ttft'], 'p99')} ms; "
          f"TPOT p50/p99 {ms(summary['tpot'], 'p50')}/{ms(summary['tpot'], 'p99')} ms; "
          f"preemptions {summary['totals']['preemptions']}")
    print(f"log: {log_path}  (inferlab trace {log_path}); call tree: {out / (args.name + '_calls.txt')}; CSV: {args.results}/runs.csv, {args.results}/{args.name}_steps.csv")
    return result


if __name__ == "__main__":
    main()
