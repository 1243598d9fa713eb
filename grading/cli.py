"""The `inferlab golden ...` and `inferlab grade ...` subcommands (wired into inferlab/cli.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from courseware.terminal import make_console
from courseware.labs import graded_labs


def _cmd_golden(args: argparse.Namespace) -> int:
    from grading.golden import build_golden, check_golden, write_golden
    from grading.rubric import load_rubric
    console = make_console()
    labs = [args.lab] if args.lab else graded_labs()
    status = 0
    for lab in labs:
        rubric = load_rubric(lab)
        if not any(item.observed for item in rubric.items):
            console.print(f"{lab}: no observed items, no golden outputs needed")
            continue
        if args.action == "build":
            path = write_golden(lab, build_golden(lab, spawn=args.spawn, progress=lambda m: console.print(f"[dim]{m}[/dim]")))
            console.print(f"{lab}: golden outputs written to [bold]{path}[/bold] ({path.stat().st_size} bytes)")
        else:
            problems = check_golden(lab, spawn=args.spawn)
            if problems:
                status = 1
                console.print(f"[bold red]{lab}: golden outputs are stale[/bold red] (run `inferlab golden build --lab {lab}`):")
                for problem in problems[:20]:
                    console.print(f"  {escape(problem)}", soft_wrap=True)
                if len(problems) > 20:
                    console.print(f"  ... and {len(problems) - 20} more")
            else:
                console.print(f"{lab}: golden outputs are current")
    return status


def _cmd_grade_run(args: argparse.Namespace) -> int:
    from grading.report import summary_table
    from grading.grade_run import RunOptions, grade_run
    console = make_console()
    options = RunOptions(args.lab, Path(args.submissions), Path(args.out), jobs=args.jobs, student=args.student,
                         force=args.force, spawn=args.spawn, landlock=not args.no_landlock, keep_work=args.keep_work)
    summary = grade_run(options, console)
    for note in summary.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    console.print(summary_table(list(summary.results.values()), f"{args.lab}: {len(summary.graded)} graded, "
                                f"{len(summary.skipped)} already graded (skipped)"))
    console.print(f"results in [bold]{options.out}[/bold] ({summary.wall_s:.1f} s)")
    return 0


def _cmd_grade_report(args: argparse.Namespace) -> int:
    from grading.report import make_reports
    console = make_console()
    report = make_reports(Path(args.results), Path(args.out) if args.out else None, console=console)
    console.print(f"grades: [bold]{report.csv}[/bold]; feedback and Gradescope files under [bold]{report.out}[/bold]")
    return 0


def _cmd_grade_nbgrader(args: argparse.Namespace) -> int:
    from grading.nbgrader_bridge import run_nbgrader
    console = make_console()
    return run_nbgrader(args.lab, Path(args.course), Path(args.results) if args.results else None,
                        assignment=args.assignment, console=console)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    golden = sub.add_parser("golden", help="build or check the reference's golden outputs for grading")
    golden.add_argument("action", choices=["build", "check"])
    golden.add_argument("--lab", choices=graded_labs(), default=None, help="one lab (default: every lab with a rubric)")
    golden.add_argument("--spawn", choices=["fork", "fresh"], default="fork")
    golden.set_defaults(func=_cmd_golden)

    grade = sub.add_parser("grade", help="grade submissions, write reports, bridge nbgrader")
    actions = grade.add_subparsers(dest="grade_action", required=True)
    run = actions.add_parser("run", help="grade every submission of a lab (nbgrader layout DIR/<student>/<lab>/)")
    run.add_argument("--lab", required=True, choices=graded_labs())
    run.add_argument("--submissions", required=True, help="folder of <student_id>/<lab>/ submissions")
    run.add_argument("--out", required=True, help="results folder: one <student_id>.json per submission")
    run.add_argument("-j", "--jobs", type=int, default=1, help="submissions graded at once")
    run.add_argument("--student", default=None, help="grade only this student")
    run.add_argument("--force", action="store_true", help="regrade submissions that already have a current result")
    run.add_argument("--spawn", choices=["fork", "fresh"], default="fork",
                     help="fork: items forked from a process with torch imported (fast); "
                          "fresh: a new `python -I -B -m pytest` per item")
    run.add_argument("--no-landlock", action="store_true", help="do not use the kernel file-system fence")
    run.add_argument("--keep-work", action="store_true", help="keep harnesses and scratch folders (debugging)")
    run.set_defaults(func=_cmd_grade_run)
    report = actions.add_parser("report", help="grades.csv, feedback, Gradescope results.json, summary, histogram")
    report.add_argument("--results", required=True, help="the --out folder of `grade run`")
    report.add_argument("--out", default=None, help="where to write (default: RESULTS/report)")
    report.set_defaults(func=_cmd_grade_report)
    nb = actions.add_parser("nbgrader", help="autograde the lab's notebooks with nbgrader, merge into the gradebook rows")
    nb.add_argument("--lab", required=True, choices=graded_labs())
    nb.add_argument("--course", required=True, help="nbgrader course root (source/, submitted/)")
    nb.add_argument("--assignment", default=None, help="nbgrader assignment name (default: the lab)")
    nb.add_argument("--results", default=None, help="a `grade run` results folder to merge the notebook scores into")
    nb.set_defaults(func=_cmd_grade_nbgrader)
