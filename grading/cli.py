"""The `inferlab golden ...` and `inferlab grade ...` subcommands (wired into inferlab/cli.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from courseware.terminal import make_console
from labkit.labs import graded_labs


def _cmd_golden(args: argparse.Namespace) -> int:
    from grading.golden import cuda_available, gpu_items, load_golden, load_gpu_golden
    from grading.paths import golden_path
    from labkit.rubric import load_rubric
    console = make_console()
    labs = [args.lab] if args.lab else graded_labs()
    status = 0
    cuda = cuda_available()
    for lab in labs:
        rubric = load_rubric(lab)
        if not any(item.observed for item in rubric.items):
            console.print(f"{lab}: no observed items, no golden outputs needed")
            continue
        for gpu in _golden_parts(args.part, bool(gpu_items(rubric)), cuda):
            status = max(status, _golden_one(console, args, lab, gpu))
        if gpu_items(rubric) and not cuda and args.part != "cpu":
            _, why = load_gpu_golden(lab, load_golden(lab)) if golden_path(lab).is_file() else (None, "")
            console.print(f"[yellow]{lab}: GPU golden outputs not {'built' if args.action == 'build' else 'checked'}: "
                          f"torch sees no CUDA here"
                          f"[/yellow]" + (f" ({escape(why)})" if why else " (the stored file matches the CPU one)"))
            if args.part == "gpu":
                status = max(status, 2)
    return status


def _golden_parts(part: str, has_gpu_items: bool, cuda: bool) -> list[bool]:
    """Which golden files to handle (False: CPU, True: GPU); GPU only where CUDA exists and asked for."""
    parts = [] if part == "gpu" else [False]
    if part != "cpu" and has_gpu_items and cuda:
        parts.append(True)
    return parts


def _golden_one(console: Console, args: argparse.Namespace, lab: str, gpu: bool) -> int:
    from grading.golden import build_golden, check_golden, write_golden
    name = f"{lab} ({'GPU' if gpu else 'CPU'})"
    if args.action == "build":
        data = build_golden(lab, spawn=args.spawn, gpu=gpu, progress=lambda m: console.print(f"[dim]{m}[/dim]"))
        path = write_golden(lab, data)
        console.print(f"{name}: golden outputs written to [bold]{path}[/bold] ({path.stat().st_size} bytes)")
        return 0
    problems = check_golden(lab, spawn=args.spawn, gpu=gpu)
    if not problems:
        console.print(f"{name}: golden outputs are current")
        return 0
    part = " --part gpu" if gpu else ""
    console.print(f"[bold red]{name}: golden outputs are stale[/bold red] (run `inferlab golden build --lab {lab}{part}`):")
    for problem in problems[:20]:
        console.print(f"  {escape(problem)}", soft_wrap=True)
    if len(problems) > 20:
        console.print(f"  ... and {len(problems) - 20} more")
    return 1


def _cmd_grade_run(args: argparse.Namespace) -> int:
    """Exit 0 when every submission got a result without a grader error, 1 otherwise, 2 when refused to start."""
    from grading.report import summary_table
    from grading.grade_run import RunOptions, grade_run
    from grading.scratch import Quota
    from grading.unfenced import Unfenced
    console = make_console()
    options = RunOptions(args.lab, Path(args.submissions), Path(args.out), jobs=args.jobs, student=args.student,
                         force=args.force, spawn=args.spawn, landlock=not args.no_landlock, keep_work=args.keep_work,
                         allow_unfenced=args.allow_unfenced,
                         quota=Quota(bytes=args.scratch_quota << 20) if args.scratch_quota else Quota())
    try:
        summary = grade_run(options, console)
    except Unfenced as err:
        console.print(f"[bold red]not grading:[/bold red] {escape(str(err))}", soft_wrap=True)
        return 2
    for note in summary.notes:
        console.print(f"[yellow]note:[/yellow] {escape(note)}")
    console.print(summary_table(list(summary.results.values()), f"{args.lab}: {len(summary.graded)} graded, "
                                f"{len(summary.skipped)} already graded (skipped)"))
    console.print(f"results in [bold]{options.out}[/bold] ({summary.wall_s:.1f} s)")
    failed = summary.errors + summary.ungraded
    if failed:
        console.print(f"[bold red]{len(failed)} submission(s) hit a grader error[/bold red] (their results say what; "
                      f"a rerun grades them again): {escape(', '.join(failed[:20]))}")
        return 1
    return 0


def _cmd_grade_report(args: argparse.Namespace) -> int:
    from grading.report import make_reports
    console = make_console()
    report = make_reports(Path(args.results), Path(args.out) if args.out else None, console=console)
    console.print(f"grades: [bold]{report.csv}[/bold]; feedback and Gradescope files under [bold]{report.out}[/bold]")
    return 0


def _cmd_grade_ta_sheet(args: argparse.Namespace) -> int:
    from labkit.rubric import load_rubric
    from grading.report import load_results
    from grading.ta_marks import TA_FILE, write_sheet
    results_dir = Path(args.results)
    results = load_results(results_dir)
    if not results:
        raise FileNotFoundError(f"no finished results (*.json) in {results_dir}")
    out = Path(args.out) if args.out else results_dir / TA_FILE
    if out.exists():
        raise ValueError(f"{out} exists: it may hold marks; move it or name another --out")
    write_sheet(results, out, load_rubric(results[0]["lab"]))
    make_console().print(f"TA sheet: [bold]{out}[/bold]: fill in points (one of each row's anchors) and a comment; "
                         "`grade report` merges it")
    return 0


def _cmd_grade_nbgrader(args: argparse.Namespace) -> int:
    from grading.nbgrader_bridge import run_nbgrader
    console = make_console()
    return run_nbgrader(args.lab, Path(args.course), Path(args.results) if args.results else None,
                        assignment=args.assignment, console=console)


def _cmd_grade_package(args: argparse.Namespace) -> int:
    from grading.bundle import BundleError, build_bundle
    console = Console()
    try:
        out = build_bundle(args.lab, Path(args.out), leaderboard=args.leaderboard, allow_unfenced=args.allow_unfenced)
    except (BundleError, FileNotFoundError, ValueError) as err:
        console.print(f"[bold red]cannot build the {args.lab} bundle:[/bold red] {escape(str(err))}")
        return 2
    console.print(f"Gradescope autograder for {args.lab}: [bold]{out}[/bold] ({out.stat().st_size // 1024} KB); "
                  "upload it as the assignment's autograder (docs/grading.md, Gradescope)")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    golden = sub.add_parser("golden", help="build or check the reference's golden outputs for grading")
    golden.add_argument("action", choices=["build", "check"])
    golden.add_argument("--lab", choices=graded_labs(), default=None, help="one lab (default: every lab with a rubric)")
    golden.add_argument("--spawn", choices=["fork", "fresh"], default="fork")
    golden.add_argument("--part", choices=["all", "cpu", "gpu"], default="all",
                        help="cpu: golden.json; gpu: golden_gpu.json (needs CUDA); all: both where CUDA exists")
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
    run.add_argument("--no-landlock", action="store_true", help="do not use the kernel file-system fence "
                     "(refused without --allow-unfenced)")
    run.add_argument("--allow-unfenced", action="store_true",
                     help="grade even where Landlock is not in force, accepting the risk it prints")
    run.add_argument("--scratch-quota", type=int, default=None, metavar="MIB",
                     help="what one graded process may write to its scratch folder, in MiB "
                          "(default: grading.scratch.Quota, docs/grading.md)")
    run.add_argument("--keep-work", action="store_true", help="keep harnesses and scratch folders (debugging)")
    run.set_defaults(func=_cmd_grade_run)
    report = actions.add_parser("report", help="grades.csv, feedback, Gradescope results.json, summary, histogram")
    report.add_argument("--results", required=True, help="the --out folder of `grade run`")
    report.add_argument("--out", default=None, help="where to write (default: RESULTS/report)")
    report.set_defaults(func=_cmd_grade_report)
    sheet = actions.add_parser("ta-sheet", help="a marks sheet for the rubric items a TA marks (kind ta)")
    sheet.add_argument("--results", required=True, help="the --out folder of `grade run`")
    sheet.add_argument("--out", default=None, help="where to write (default: RESULTS/ta_marks.csv, which report reads)")
    sheet.set_defaults(func=_cmd_grade_ta_sheet)
    package = actions.add_parser("package", help="a Gradescope autograder bundle (setup.sh, run_autograder, ...)")
    package.add_argument("--lab", required=True, choices=graded_labs())
    package.add_argument("--out", default="autograder.zip", help="the .zip to write (default: autograder.zip)")
    package.add_argument("--leaderboard", action="store_true",
                         help="publish the measured throughput ratio on Gradescope's leaderboard")
    package.add_argument("--allow-unfenced", action="store_true",
                         help="grade even where Gradescope's kernel gives no Landlock (docs/grading.md: the risk)")
    package.set_defaults(func=_cmd_grade_package)
    nb = actions.add_parser("nbgrader", help="autograde the lab's notebooks with nbgrader, merge into the gradebook rows")
    nb.add_argument("--lab", required=True, choices=graded_labs())
    nb.add_argument("--course", required=True, help="nbgrader course root (source/, submitted/)")
    nb.add_argument("--assignment", default=None, help="nbgrader assignment name (default: the lab)")
    nb.add_argument("--results", default=None, help="a `grade run` results folder to merge the notebook scores into")
    nb.set_defaults(func=_cmd_grade_nbgrader)
