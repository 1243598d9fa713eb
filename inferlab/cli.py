"""The `inferlab` command: one entry point for students, TAs and instructors."""
from __future__ import annotations

import argparse
import sys

from courseware.measure_cli import BACKENDS, DEVICES, DTYPES, ENGINE_DEFAULT  # noqa: F401 (the engine flags' choices)
from courseware.measure_cli import add_parsers as add_measure_parsers
from courseware.measure_cli import engine_settings
from courseware.release_root import RELEASE_COMMANDS, hand_over
from courseware.terminal import make_console, print_error


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

    add_measure_parsers(sub)      # make-tiny-model, trace, bench (offline and serve), serve: courseware/measure_cli.py

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

    from grading.cli import add_parsers as add_grading_parsers   # `inferlab golden ...`, `inferlab grade ...`
    add_grading_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in RELEASE_COMMANDS:
        hand_over(argv)    # inside a student release: becomes its own tools' command, on the student's code
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError, ConnectionError) as err:   # bad input, no server
        print_error(err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
