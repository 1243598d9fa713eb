"""The measurement commands, `make-tiny-model`, `trace` and `bench`, defined once for two command lines.

The course's `inferlab` (inferlab/cli.py) and a lab 5 student release's
`inferlab` (courseware/selfcheck.py) both offer them: lab 5's experiments
run in the release, never in the course repository, with the same options
and the same output files the handout describes. The course's command adds
`bench serve` (an online load against a server) on top of the parser made here.
"""
from __future__ import annotations

import argparse

# Engine flags give no default of their own: a flag left out is not passed on, and the engine's Config
# default applies (one definition of each setting, reference/config.py). The choices are Config's too,
# spelled here so that building a parser imports no engine (tests/test_cli.py checks they agree).
ENGINE_DEFAULT = "default: the engine's own (reference/config.py)"
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
BACKENDS = ("auto", "torch", "triton", "flash-attn")


def _cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from courseware.terminal import make_console
    from courseware.tiny_model import make_tiny_model
    path = make_tiny_model(args.dir, seed=args.seed)
    make_console().print(f"tiny Qwen3 model (seed {args.seed}) written to [bold]{path}[/bold]")
    return 0


def _cmd_trace(args: argparse.Namespace) -> int:
    from courseware.trace import render_trace
    render_trace(args.log)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from courseware.bench import run_bench
    run_bench(args)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the three commands to `sub`; returns the `bench` parser (offline options only)."""
    tiny = sub.add_parser("make-tiny-model", help="write the built-in tiny Qwen3 model to a folder")
    tiny.add_argument("dir")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_cmd_make_tiny_model)

    trace = sub.add_parser("trace", help="print per-request and per-step metrics of a lifecycle log")
    trace.add_argument("log")
    trace.set_defaults(func=_cmd_trace)

    bench = sub.add_parser("bench", help="measure output throughput offline, or load a server (`bench serve`)")
    bench.add_argument("--workload", choices=["bench-256", "quick"], default="quick")
    bench.add_argument("--shape", choices=["qwen3-0.6b"], default="qwen3-0.6b",
                       help="random-weight model of this shape (no download)")
    bench.add_argument("--model", default=None, help="a real Hugging Face checkpoint folder instead of --shape")
    bench.add_argument("--compare", choices=["hf", "none"], default="none")
    bench.add_argument("--hf-batch-size", type=int, default=256,
                       help="the largest transformers batch tried with --compare hf (halved on out-of-memory)")
    bench.add_argument("--device", choices=DEVICES, default=None, help=ENGINE_DEFAULT)
    bench.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    bench.add_argument("--backend", choices=BACKENDS, default=None, help=ENGINE_DEFAULT)
    bench.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    bench.add_argument("--scheduling", choices=["async", "sync", "both"], default="async",
                       help="async: schedule step k+1 while step k computes; both: run sync, then async")
    bench.add_argument("--max-num-seqs", type=int, default=None, help=ENGINE_DEFAULT)
    bench.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="default: the bench's own setting (courseware/bench.py BENCH_ENGINE says which and why)")
    bench.add_argument("--block-size", type=int, default=None, help=ENGINE_DEFAULT)
    bench.add_argument("--seed", type=int, default=0, help="the workload's seed (prompts and lengths)")
    bench.add_argument("--tensor-parallel-size", type=int, default=None,
                       help="split the model over N GPUs (NCCL), or N processes on the CPU (gloo)")
    bench.add_argument("--out", default=None, help="write the results as JSON here")
    bench.set_defaults(func=_cmd_bench)
    return bench
