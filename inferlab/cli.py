"""The `inferlab` command: one entry point for students, TAs and instructors."""
from __future__ import annotations

import argparse
import sys

from courseware.measure_cli import BACKENDS, DEVICES, DTYPES, ENGINE_DEFAULT  # noqa: F401 (the engine flags' choices)
from courseware.measure_cli import add_parsers as add_measure_parsers
from courseware.terminal import make_console, print_error

SERVER_DEFAULT = "default: the server's own (reference/serving/defaults.py)"


def engine_settings(args: argparse.Namespace, names: dict[str, str]) -> dict:
    """{Config field: value} for the engine flags given on the command line (`names`: flag dest -> field)."""
    return {field: getattr(args, dest) for dest, field in names.items() if getattr(args, dest, None) not in (None, False)}


def _cmd_demo(args: argparse.Namespace) -> int:
    from courseware.demo import run_demo
    run_demo(args.model, args.log, **engine_settings(args, {"device": "device",
                                                            "tensor_parallel_size": "tensor_parallel_size"}))
    return 0


def _cmd_exercises(args: argparse.Namespace) -> int:
    from courseware.exercises import command
    return command(args.action)


def _cmd_release(args: argparse.Namespace) -> int:
    from courseware.release import make_release
    out = make_release(args.lab, args.out)
    make_console().print(f"{args.lab} student release written to [bold]{out}[/bold] (see its README.md)")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from courseware.selfcheck import check
    return check(args.lab, args.impl)


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.mode == "serve":
        from courseware.bench_serve import run_bench_serve_cli
        return run_bench_serve_cli(args)
    from courseware.bench import run_bench
    run_bench(args)
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
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


def _cmd_build(args: argparse.Namespace) -> int:
    from courseware.build import build
    console = make_console()
    try:
        report = build(args.root, args.out, only=args.only, execute=not args.no_execute,
                       handouts=not args.no_handouts, timeout=args.timeout, pdf=not args.no_pdf,
                       term=args.term, assignment=not args.no_assignment,
                       progress=lambda msg: console.print(f"[dim]{msg}[/dim]"))
    except RuntimeError as err:  # the notebook packages, Chromium or the CJK font are missing
        print_error(err)
        return 2
    for r in report.notebooks:
        status = "[green]ok[/green]" if r.error is None else "[bold red]FAILED[/bold red]"
        console.print(f"{status} {r.html} ({r.seconds:.1f} s)")
        for pdf in r.pdfs.values():
            console.print(f"   {pdf}")
        if r.error is not None:
            console.print(r.error[-2000:], markup=False, highlight=False)
    for path in report.handouts:
        console.print(f"[green]ok[/green] {path}")
    if report.assignment is not None:
        console.print(f"[green]ok[/green] {report.assignment}/")
    console.print(f"index: [bold]{report.out / 'index.html'}[/bold]")
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferlab", description="InferLab: a teaching LLM inference engine.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a batch of chat prompts through the reference engine")
    demo.add_argument("--device", choices=DEVICES, default=None, help=ENGINE_DEFAULT)
    demo.add_argument("--model", default=None, help="Hugging Face model folder (default: the built-in tiny model)")
    demo.add_argument("--log", default="inferlab_logs/demo.jsonl", help="where to write the lifecycle log")
    demo.add_argument("--tensor-parallel-size", type=int, default=None,
                      help="split the model over N processes (N GPUs on CUDA; gloo on the CPU)")
    demo.set_defaults(func=_cmd_demo)

    bench = add_measure_parsers(sub)      # make-tiny-model, trace, bench (offline): courseware/measure_cli.py

    from labkit.labs import exercise_labs, release_labs
    labs = exercise_labs()
    exercises = sub.add_parser("exercises", help="build, check or list student_exercises/ (cut from reference/)")
    exercises.add_argument("action", choices=["build", "check", "list"])
    exercises.set_defaults(func=_cmd_exercises)
    release = sub.add_parser("release", help="make the repository a student gets for one lab")
    release.add_argument("--lab", required=True, choices=release_labs())
    release.add_argument("--out", required=True, help="folder to create (absent or empty)")
    release.set_defaults(func=_cmd_release)
    check = sub.add_parser("check", help="run a lab's public tests and print the score table")
    check.add_argument("lab", choices=labs)
    check.add_argument("--impl", choices=["student", "reference"], default="student",
                       help="package under test (reference: the solution, to see a full score)")
    check.set_defaults(func=_cmd_check)

    build = sub.add_parser("build", help="execute the tutorials and render them and the lab handouts to HTML and PDF")
    build.add_argument("--root", default=".", help="repository root (holds tutorials/ and assignments/)")
    build.add_argument("--out", default="build", help="output folder (default: build/)")
    build.add_argument("--only", nargs="+", default=None, metavar="NAME",
                       help="only tutorials whose file name contains one of these (e.g. 01 Tutorial_03)")
    build.add_argument("--no-execute", action="store_true", help="render the notebooks as they are, without running")
    build.add_argument("--no-handouts", action="store_true", help="skip build/experiments/ (handouts, assignment)")
    build.add_argument("--no-pdf", action="store_true", help="HTML only (no Chromium needed)")
    build.add_argument("--term", default="spring-2026",
                       help="term of the assignment package build/experiments/assignment_<term>/ (default: spring-2026)")
    build.add_argument("--no-assignment", action="store_true", help="skip build/experiments/assignment_<term>/")
    build.add_argument("--timeout", type=int, default=600, help="seconds allowed per notebook cell")
    build.set_defaults(func=_cmd_build)
    serve = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (SSE, /metrics)")
    serve.add_argument("model", nargs="?", default=None, help="Hugging Face model folder (default: the tiny model)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default=None, help="the `model` clients send (default: folder name)")
    serve.add_argument("--max-waiting-requests", type=int, default=None,
                       help=f"past this many requests waiting, answer 503 with Retry-After; {SERVER_DEFAULT}")
    serve.add_argument("--max-request-bytes", type=int, default=None,
                       help=f"answer 413 to a request body larger than this many bytes; {SERVER_DEFAULT}")
    serve.add_argument("--drain-timeout", type=float, default=None,
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
    serve_load.add_argument("--request-rate", type=float, nargs="+", default=[float("inf")],
                            help="requests/s (Poisson); several values sweep; inf sends all at once")
    serve_load.add_argument("--burstiness", type=float, default=1.0,
                            help="gamma shape of the arrival gaps: 1 is Poisson, <1 burstier, >1 more regular")
    serve_load.add_argument("--num-prompts", type=int, default=64)
    serve_load.add_argument("--dataset", choices=["random", "sharegpt"], default="random")
    serve_load.add_argument("--dataset-path", default=None, help="ShareGPT-format JSON file")
    serve_load.add_argument("--random-input-len", type=int, default=128)
    serve_load.add_argument("--random-output-len", type=int, default=64)
    serve_load.add_argument("--random-range-ratio", type=float, default=0.0,
                            help="lengths uniform in [len*(1-r), len*(1+r)]")
    serve_load.add_argument("--goodput", nargs="*", default=[], metavar="KEY:MS",
                            help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:5000 (milliseconds)")
    serve_load.add_argument("--max-concurrency", type=int, default=None)
    serve_load.add_argument("--disconnect", type=int, default=0, metavar="N",
                            help="also send N requests per rate whose clients leave after their first token")
    serve_load.add_argument("--compare-tokens", default=None, metavar="REPORT",
                            help="check every request's token ids against an earlier --out report")
    serve_load.add_argument("--plot", default=None, help="write a latency/goodput-vs-rate PNG here")
    bench.set_defaults(func=_cmd_bench)

    from grading.cli import add_parsers as add_grading_parsers   # `inferlab golden ...`, `inferlab grade ...`
    add_grading_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as err:
        print_error(err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
