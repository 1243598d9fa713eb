"""The `inferlab` command of a student release: `check`, `demo`, `bench`, `trace` (and lab 5's `serve`), each on the
student's code.

Every command builds its engine through `courseware.engine` (the student's
package, the earlier labs' solutions, the later labs' stand-ins), so the demo's
table, the bench's numbers and the trace's metrics come from the student's
regions, never from the course's engine. Started inside a release whose
tools are not the ones this process imported (the course, or another release,
installed in the same environment), it hands the command over to that
release's own tools first (courseware/release_root.py). The course's
`inferlab` does the same for these four commands, so either one is right.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from courseware.release_root import RELEASE_COMMANDS, hand_over
from courseware.terminal import make_console, print_error

DEMO_LOG = "inferlab_logs/demo.jsonl"
BENCH_WORKLOAD = "quick"


def demo() -> int:
    """The course's demo (courseware/demo.py) on this tree's engine, on the CPU: your regions serve a batch."""
    from courseware.demo import run_demo
    outputs = run_demo(None, DEMO_LOG, device="cpu")
    return 1 if any(out.get("error") for out in outputs) else 0


def bench(workload: str = BENCH_WORKLOAD) -> int:
    """Output throughput of this tree's engine on the tiny model (CPU), with what that number is not."""
    import json

    from courseware.bench import make_workload, run_engine
    from courseware.engine import standin_labs
    from courseware.tiny_model import ensure_tiny_model
    console = make_console()
    model = ensure_tiny_model()
    vocab = json.loads((model / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    requests = make_workload(workload, vocab)
    console.print(f"[bold]{workload}[/bold]: {len(requests)} requests on the tiny model, CPU, float32")
    result = run_engine(str(model), requests, device="cpu", dtype="float32")
    console.print(f"your engine: [bold]{result['output_tok_per_s']:,.0f}[/bold] output tok/s "
                  f"({result['output_tokens']} tokens, {result['steps']} steps, {result['elapsed_s']:.2f} s, "
                  f"{result['preemptions']} preemptions)")
    standins = standin_labs()
    console.print("The grader's throughput item is another measurement: your regions in the course's engine, "
                  "timed against the reference solution on the grading machine, alternating rounds"
                  + (f"; here {', '.join(standins)} run on stand-ins, so this number is not that ratio"
                     if standins else "") + ". Use it to compare your own versions.")
    return 0


def trace(log: str) -> int:
    from courseware.trace import render_trace
    render_trace(log)
    return 0


def measures() -> bool:
    """Does this release ship lab 5's measurement commands? Looked for beside this file, not by import: an
    editable install of the course would offer its own measure_cli."""
    return Path(__file__).with_name("measure_cli.py").is_file()


NO_SERVER = ("`inferlab serve` serves the whole engine over HTTP: it comes with lab 5's release, where every lab is "
             "written. Here, `inferlab demo` serves a batch through your engine.")


def parser() -> argparse.ArgumentParser:
    """check and demo; then lab 5's measurement commands where its release ships them, else bench and trace."""
    parser = argparse.ArgumentParser(prog="inferlab", description="InferLab lab tools (student release).")
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("check", help="run a lab's public tests and print your score")
    cmd.add_argument("lab", help="a lab whose public tests this tree has (student_exercises/tests/test_labN_*.py)")
    sub.add_parser("demo", help="serve a small batch through your engine on the tiny model")
    if measures():                                  # a lab that measures the engine (lab 5)
        from courseware.measure_cli import add_parsers
        add_parsers(sub)           # bench (every option, bench serve), serve, trace, make-tiny-model: the course's own
    else:
        cmd = sub.add_parser("bench", help="time your engine on a fixed workload on the tiny model")
        cmd.add_argument("--workload", choices=["quick", "bench-256"], default=BENCH_WORKLOAD)
        cmd = sub.add_parser("trace", help="per-request and per-step metrics of a lifecycle log (your metrics code)")
        cmd.add_argument("log", nargs="?", default=DEMO_LOG)
        sub.add_parser("serve", help="not in this release: the HTTP server comes with lab 5's, the whole engine")
    assert set(RELEASE_COMMANDS) <= set(sub.choices)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    hand_over(argv)        # inside another tree's release: becomes that release's command, never returns
    if argv[:1] == ["serve"] and not measures():
        print_error(NO_SERVER)          # whatever options follow: they are the course's server's
        return 2
    args = parser().parse_args(argv)
    try:
        if hasattr(args, "func"):                  # lab 5's measurement commands (courseware/measure_cli.py)
            return args.func(args)
        if args.command == "check":
            from courseware.selfcheck import check
            return check(args.lab)
        if args.command == "demo":
            return demo()
        if args.command == "bench":
            return bench(args.workload)
        return trace(args.log)
    except (ValueError, FileNotFoundError, ConnectionError) as err:   # bad input, no server (`bench serve`)
        print_error(err)
        return 2
    except NotImplementedError as err:
        print_error(f"region {err} raises NotImplementedError: write it, then run `inferlab {args.command}` again",
                    heading="not written yet")
        return 1


if __name__ == "__main__":
    sys.exit(main())
