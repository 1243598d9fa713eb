"""The measurement commands, `make-tiny-model`, `trace`, `bench` (offline, and `bench serve` against a
server) and `serve`, defined once for two command lines.

The course's `inferlab` (inferlab/cli.py) and a lab 5 student release's
`inferlab` (courseware/student_cli.py) both offer them: lab 5's experiments
and its tutorials (Tutorial 08 serves the engine and loads it with `bench serve`)
run in the release, never in the course repository, with the same options
and the same output files the handout describes.
"""
from __future__ import annotations

import argparse
import math
from typing import Callable

# Engine flags give no default of their own: a flag left out is not passed on, and the engine's Config
# default applies (one definition of each setting, reference/config.py). The choices are Config's too,
# spelled here so that building a parser imports no engine (tests/test_cli.py checks they agree).
ENGINE_DEFAULT = "default: the engine's own (reference/config.py)"
DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("auto", "float32", "float16", "bfloat16")
BACKENDS = ("auto", "torch", "triton", "flash-attn")
SERVER_DEFAULT = "default: the server's own (reference/serving/defaults.py)"


def _checked(name: str, convert: Callable[[str], float], ok: Callable[[float], bool], requirement: str):
    """An argparse type: `convert` the text, then refuse a value that is not `ok`, saying what it must be.

    argparse names a type by its function's name when conversion fails ("invalid count value: 'abc'").
    """
    def parse(text: str):
        value = convert(text)
        if not ok(value):                  # written as "not ok" so that nan fails every range
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value
    parse.__name__ = name
    return parse


count = _checked("count", int, lambda v: v >= 1, "at least 1")          # prompts, tokens, connections, bytes
non_negative = _checked("non_negative", int, lambda v: v >= 0, "0 or more")
port = _checked("port", int, lambda v: 0 <= v <= 65535, "a TCP port (0 to 65535)")
request_rate = _checked("request_rate", float, lambda v: v > 0, "above 0 (or inf)")   # inf: all at once
positive_number = _checked("positive_number", float, lambda v: 0 < v < math.inf, "a finite number above 0")
seconds = _checked("seconds", float, lambda v: 0 <= v < math.inf, "a finite number of seconds, 0 or more")
fraction = _checked("fraction", float, lambda v: 0 <= v < 1, "at least 0 and below 1")


def engine_settings(args: argparse.Namespace, names: dict[str, str]) -> dict:
    """{Config field: value} for the engine flags given on the command line (`names`: flag dest -> field)."""
    return {field: getattr(args, dest) for dest, field in names.items() if getattr(args, dest, None) not in (None, False)}


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
    if args.mode == "serve":
        from courseware.bench_serve import run_bench_serve_cli
        return run_bench_serve_cli(args)
    from courseware.bench import run_bench
    run_bench(args)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from courseware.terminal import make_console
    from courseware.tiny_model import ensure_tiny_model
    from reference.serving.api_server import serve
    model = args.model or str(ensure_tiny_model())
    engine = engine_settings(args, {
        "device": "device", "dtype": "dtype", "max_num_seqs": "max_num_seqs",
        "max_num_batched_tokens": "max_num_batched_tokens", "block_size": "kvcache_block_size",
        "num_kvcache_blocks": "num_kvcache_blocks", "max_model_len": "max_model_len",
        "enable_chunked_prefill": "enable_chunked_prefill", "async_scheduling": "async_scheduling",
        "enforce_eager": "enforce_eager", "lifecycle_log": "lifecycle_log",
        "tensor_parallel_size": "tensor_parallel_size"})
    given = {"max_waiting": args.max_waiting_requests, "max_request_bytes": args.max_request_bytes,
             "drain_timeout": args.drain_timeout}   # 0 is a value here (no drain), so not engine_settings
    server = {name: value for name, value in given.items() if value is not None}
    make_console(stderr=True).print(f"serving [bold]{model}[/bold] on http://{args.host}:{args.port}/v1")
    serve(model, args.host, args.port, args.served_model_name, **server, **engine)
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the four commands to `sub`; returns the `bench` parser."""
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
    bench.add_argument("--hf-batch-size", type=count, default=256,
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
    serve = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (SSE, /metrics)")
    serve.add_argument("model", nargs="?", default=None, help="Hugging Face model folder (default: the tiny model)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=port, default=8000)
    serve.add_argument("--served-model-name", default=None, help="the `model` clients send (default: folder name)")
    serve.add_argument("--max-waiting-requests", type=count, default=None,
                       help=f"past this many requests waiting, answer 503 with Retry-After; {SERVER_DEFAULT}")
    serve.add_argument("--max-request-bytes", type=count, default=None,
                       help=f"answer 413 to a request body larger than this many bytes; {SERVER_DEFAULT}")
    serve.add_argument("--drain-timeout", type=seconds, default=None,
                       help=f"on SIGINT/SIGTERM, seconds running requests may go on before they are ended; "
                            f"{SERVER_DEFAULT}")
    serve.add_argument("--device", choices=DEVICES, default=None, help=ENGINE_DEFAULT)
    serve.add_argument("--dtype", choices=DTYPES, default=None, help=ENGINE_DEFAULT)
    serve.add_argument("--max-num-seqs", type=int, default=None, help=ENGINE_DEFAULT)
    serve.add_argument("--max-num-batched-tokens", type=int, default=None, help=ENGINE_DEFAULT)
    serve.add_argument("--max-model-len", type=int, default=None, help=ENGINE_DEFAULT)
    serve.add_argument("--block-size", type=int, default=None, help=ENGINE_DEFAULT)
    serve.add_argument("--num-kvcache-blocks", type=int, default=None, help=ENGINE_DEFAULT)
    serve.add_argument("--enable-chunked-prefill", action="store_true")
    serve.add_argument("--async-scheduling", action="store_true")
    serve.add_argument("--enforce-eager", action="store_true")
    serve.add_argument("--tensor-parallel-size", type=int, default=None,
                       help="split the model over N processes (N GPUs with NCCL; gloo on the CPU); " + ENGINE_DEFAULT)
    serve.add_argument("--lifecycle-log", default=None, help="write the lifecycle log (JSONL) here")
    serve.set_defaults(func=_cmd_serve)

    bench.add_argument("mode", nargs="?", choices=["offline", "serve"], default="offline",
                       help="offline: the engine in this process; serve: an HTTP server at --url")
    serve_load = bench.add_argument_group("bench serve (an online load against --url)")
    serve_load.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    serve_load.add_argument("--served-model-name", default=None, help="default: the server's first model")
    serve_load.add_argument("--request-rate", type=request_rate, nargs="+", default=[float("inf")],
                            help="requests/s (Poisson); several values sweep; inf sends all at once")
    serve_load.add_argument("--burstiness", type=positive_number, default=1.0,
                            help="gamma shape of the arrival gaps: 1 is Poisson, <1 burstier, >1 more regular")
    serve_load.add_argument("--num-prompts", type=count, default=64)
    serve_load.add_argument("--dataset", choices=["random", "sharegpt"], default="random")
    serve_load.add_argument("--dataset-path", default=None, help="ShareGPT-format JSON file")
    serve_load.add_argument("--random-input-len", type=count, default=128)
    serve_load.add_argument("--random-output-len", type=count, default=64)
    serve_load.add_argument("--random-range-ratio", type=fraction, default=0.0,
                            help="lengths uniform in [len*(1-r), len*(1+r)]")
    serve_load.add_argument("--goodput", nargs="*", default=[], metavar="KEY:MS",
                            help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:5000 (milliseconds)")
    serve_load.add_argument("--max-concurrency", type=count, default=None)
    serve_load.add_argument("--disconnect", type=non_negative, default=0, metavar="N",
                            help="also send N requests per rate whose clients leave after their first token")
    serve_load.add_argument("--compare-tokens", default=None, metavar="REPORT",
                            help="check every request's token ids against an earlier --out report")
    serve_load.add_argument("--plot", default=None, help="write a latency/goodput-vs-rate PNG here")
    bench.set_defaults(func=_cmd_bench)
    return bench
