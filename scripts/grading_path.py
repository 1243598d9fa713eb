"""Which of the project's files a submission's grading passes through: `inferlab grade run` on one lab 2 student.

    python scripts/grading_path.py [--per-submission]

Writes one solved lab 2 submission, then runs `inferlab grade run` (grading/cli.py's
command, parsed as the CLI parses it) in this process under a profile hook
(every thread) that records the file of each function called: from the
command to the result file, or with --per-submission
only inside `grading.grade_run.grade_submission` (what each student costs,
run-wide setup aside). Module and class bodies run at import are not counted;
the graded process (another process, running grading/payload/) is not either.
docs/design.md §4 lists the files it printed, before and after the restructure.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PACKAGES = ("reference", "labkit", "courseware", "grading", "inferlab")
CO_NEWLOCALS = 0x2     # set on function code objects, not on module or class bodies

WRITE_SUBMISSION = """
import sys; from pathlib import Path
from grading.sample_submissions import solved, write_submission
from labkit.tree import load_reference
write_submission(Path(sys.argv[1]), "alice", "lab2", load_reference(), solved("lab2"))
"""


def main() -> int:
    per_submission = "--per-submission" in sys.argv
    work = Path(tempfile.mkdtemp(prefix="grading-path-"))
    subprocess.run([sys.executable, "-c", WRITE_SUBMISSION, str(work / "submitted")], cwd=ROOT, check=True)
    import argparse

    from grading.cli import add_parsers      # what `inferlab grade` dispatches to; imported before the hook
    parser = argparse.ArgumentParser(prog="inferlab")
    add_parsers(parser.add_subparsers(dest="command", required=True))

    seen: dict[str, set[str]] = {}
    inside = threading.local()

    def record(frame, event, arg):
        code = frame.f_code
        if code.co_name == "grade_submission" and event in ("call", "return"):
            inside.active = event == "call"
        if event != "call" or (per_submission and not getattr(inside, "active", False)):
            return
        path = Path(code.co_filename)
        if code.co_flags & CO_NEWLOCALS and path.is_relative_to(ROOT):
            rel = path.relative_to(ROOT).as_posix()
            if rel.split("/")[0] in PACKAGES:
                seen.setdefault(rel, set()).add(code.co_name)

    threading.setprofile(record)
    sys.setprofile(record)
    try:
        args = parser.parse_args(["grade", "run", "--lab", "lab2", "--submissions", str(work / "submitted"),
                                  "--out", str(work / "out")])
        status = args.func(args)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    result = json.loads((work / "out" / "alice.json").read_text())
    print(f"exit {status}, score {result['score']}/{result['max_score']}; "
          f"{len(seen)} files{' per submission' if per_submission else ''}:")
    for rel in sorted(seen):
        print(f"  {rel} ({len(seen[rel])} functions)")
    return status


if __name__ == "__main__":
    sys.exit(main())
