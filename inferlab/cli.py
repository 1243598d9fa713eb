"""The `inferlab` command: one entry point for students, TAs and instructors."""
from __future__ import annotations

import argparse
import sys

from rich.console import Console


def _cmd_demo(args: argparse.Namespace) -> int:
    from inferlab.demo import run_demo
    run_demo(args.model, args.device, args.log)
    return 0


def _cmd_make_tiny_model(args: argparse.Namespace) -> int:
    from inferlab.tiny_model import make_tiny_model
    path = make_tiny_model(args.dir, seed=args.seed)
    Console().print(f"tiny Qwen3 model (seed {args.seed}) written to [bold]{path}[/bold]")
    return 0


def _cmd_trace(args: argparse.Namespace) -> int:
    from inferlab.trace import render_trace
    render_trace(args.log)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferlab", description="InferLab: a teaching LLM inference engine.")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a batch of chat prompts through the reference engine")
    demo.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    demo.add_argument("--model", default=None, help="Hugging Face model folder (default: the built-in tiny model)")
    demo.add_argument("--log", default="inferlab_logs/demo.jsonl", help="where to write the lifecycle log")
    demo.set_defaults(func=_cmd_demo)

    tiny = sub.add_parser("make-tiny-model", help="write the built-in tiny Qwen3 model to a folder")
    tiny.add_argument("dir")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(func=_cmd_make_tiny_model)

    trace = sub.add_parser("trace", help="print per-request and per-step metrics of a lifecycle log")
    trace.add_argument("log")
    trace.set_defaults(func=_cmd_trace)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as err:
        Console(stderr=True).print(f"[bold red]error:[/bold red] {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
