"""Scale benchmark of the autograder: a class of 40 lab 2 submissions graded with `-j 2`.

    python scripts/grading_scale_bench.py [--out DIR] [--jobs 2] [--students 40]

The class mixes the kinds of work a TA sees: reference-solved submissions,
untouched stubs, every bug-zoo mutant, and partial work (some regions
written, the rest still stubbed). The script writes them in nbgrader's
layout, runs `inferlab grade run` and `inferlab grade report` as a TA would
(fresh processes, wall-clock timed), checks that every student got a result,
and prints the time and the score distribution. The measured figure and the
command are recorded in docs/grading.md; the target is under 10 minutes on a
2-core machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/ and the course, from any folder
from grading.sample_submissions import solved, stubs, write_submission  # noqa: E402
from courseware.bugzoo import load_mutants  # noqa: E402
from labkit.tree import load_reference  # noqa: E402
from labkit.regions import stub_body  # noqa: E402

LAB = "lab2"


def partial(written: set[str]):
    """Only the regions in `written` hold the reference body; the lab's other regions are stubs."""
    return lambda region: None if region.lab != LAB or region.region_id in written else stub_body(region)


def write_class(root: Path, students: int) -> Counter:
    tree = load_reference()
    mutants = load_mutants(lab=LAB)
    lab_regions = sorted(r.region_id for r in tree.regions if r.lab == LAB)
    kinds: Counter = Counter()
    plan = []
    plan += [("mutant", m) for m in mutants]
    plan += [("partial", set(lab_regions[:k])) for k in (2, 4, 6, 7)]
    while len(plan) < students:
        plan.append(("reference", None) if len(plan) % 3 else ("stubs", None))
    for i, (kind, what) in enumerate(plan[:students]):
        student = f"student{i:03d}"
        if kind == "mutant":
            choose = what.choice(tree)
        elif kind == "partial":
            choose = partial(what)
        else:
            choose = solved(LAB) if kind == "reference" else stubs(LAB)
        write_submission(root, student, LAB, tree, choose)
        kinds[kind] += 1
    return kinds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="working folder (default: a temp folder, removed after)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--students", type=int, default=40)
    args = parser.parse_args(argv)
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="grading-bench-"))
    submitted, results = work / "submitted", work / "results"
    shutil.rmtree(submitted, ignore_errors=True)
    shutil.rmtree(results, ignore_errors=True)
    kinds = write_class(submitted, args.students)
    print(f"class of {args.students}: {dict(kinds)} in {submitted}")
    env = {**os.environ, "COLUMNS": "120"}
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "inferlab.cli", "grade", "run", "--lab", LAB, "--submissions",
                    str(submitted), "--out", str(results), "-j", str(args.jobs)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    graded_s = time.monotonic() - started
    subprocess.run([sys.executable, "-m", "inferlab.cli", "grade", "report", "--results", str(results)], check=True,
                   env=env, stdout=subprocess.DEVNULL)
    total_s = time.monotonic() - started
    scores = sorted(json.loads(p.read_text())["score"] for p in results.glob("student*.json"))
    assert len(scores) == args.students, f"{len(scores)} results for {args.students} students"
    print(f"grade run: {graded_s:.1f} s; with grade report: {total_s:.1f} s "
          f"({graded_s / args.students:.2f} s per submission, -j {args.jobs}, {os.cpu_count()} cores)")
    print(f"scores: {dict(sorted(Counter(scores).items()))}")
    print(f"report: {results / 'report'}")
    if not args.out:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
