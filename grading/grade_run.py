"""`inferlab grade run`: grade a whole class, N submissions at a time, resumably.

    inferlab grade run --lab lab2 --submissions submitted/ --out grades/lab2 [-j 2] [--student ID] [--force]

Each worker thread owns one fork server and grades one submission at a time:
read the submission's tree into a private copy (`grading.tree_walk`: links,
limits, odd names), extract the region bodies, build the harness, run the
rubric's items in order, write `OUT/<student_id>.json` the moment the
submission is done. Anything that goes wrong while grading or writing one
submission becomes that submission's error result and the batch goes on (the
CLI then exits non-zero); a graded process that hangs is killed at its item's
deadline. A rerun skips every submission whose result is complete, error-free
and was made from the same files, rubric and golden outputs (unless --force),
so an interrupted run picks up where it stopped.

Results are the same for the same work: paths that differ from run to run
(the results folder, the harness's name, process ids) are written as
placeholders (`<results>`, ...) wherever a flag or message would show them.
"""
from __future__ import annotations

import hashlib
import json
import queue
import re
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from courseware.terminal import make_console
from labkit.labs import exercise_labs
from courseware.release_code import release_manifest
from grading import RESULT_FORMAT
from grading.execute import Fence, Runner, clear
from grading.golden import cuda_available, golden_sha256, grading_golden, model_dir
from grading.harness import build_harness, digest, harness_package, write_harness
from labkit.labs import ROOT
from labkit.locate import in_student_terms
from grading.items import ItemContext, grade_item
from grading.results import ItemResult, device_description, package_versions, read_result, write_json_atomic
from labkit.rubric import Rubric, load_rubric
from grading.scratch import Quota
from grading.submission import (Submission, extract, find_submissions, given_package, ignored_files,
                                missing_students, read_submission)
from grading.tree_walk import Limits, TreeReading
from grading.unfenced import check as check_fence
from labkit.tree import ReferenceTree, load_reference

WORK = ".work"
# CPython 3.11's ast/compile can fail with "AST constructor recursion depth mismatch" when threads parse at
# once; extraction and harness generation parse source, so workers take turns there (it takes milliseconds).
_PARSE_LOCK = threading.Lock()


@dataclass
class RunOptions:
    lab: str
    submissions: Path
    out: Path
    jobs: int = 1
    student: str | None = None
    force: bool = False
    spawn: str = "fork"
    landlock: bool = True
    keep_work: bool = False
    deadline_cap_s: float | None = None      # tests and dry runs: no item may run longer than this
    allow_unfenced: bool = False             # grade even where Landlock is not in force (grading.unfenced)
    limits: Limits = Limits()                # how much of one submission is read (grading.tree_walk)
    quota: Quota = Quota()                   # what one graded process may write to its scratch (grading.scratch)


MISSING = "missing.json"        # in the results folder: students with no submission for the lab, and those with one
SUBMISSION_COPY = "submission"  # in a student's work folder: the copy of the submission that is graded


@dataclass
class Shared:
    """What every submission of one run is graded against (read-only once built)."""

    options: RunOptions
    rubric: Rubric
    golden: dict[str, Any]
    tree: ReferenceTree
    fence: Fence
    cuda: bool
    reference_harness: Path | None
    environment: dict[str, Any]
    rubric_sha256: str
    golden_sha256: str
    notes: list[str] = field(default_factory=list)
    shipped: dict[str, str] | None = None     # the lab's release, path -> sha256: what the student was given
    given: dict[str, str] = field(default_factory=dict)   # its student_exercises/ modules, read against

    def redactor(self, sub: Submission) -> "Redactor":
        """Placeholders for this run's folders in what a submission's result says."""
        return Redactor({"<results>": self.options.out, "<submission>": sub.path,
                         "<submissions>": self.options.submissions, "<course>": ROOT,
                         "<model>": self.fence.model_dir})


def release_hashes(lab: str, tree: ReferenceTree) -> dict[str, str] | None:
    """path -> sha256 of the code files of the lab's release (None for a lab without a release).

    The manifest the release itself records for those files, computed in
    memory from the course (`courseware.release_code`): nothing is written,
    and nothing a submission says about its release is trusted.
    """
    return release_manifest(lab, tree).files if lab in exercise_labs() else None


@dataclass
class RunSummary:
    graded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    ungraded: list[str] = field(default_factory=list)     # no result at all (even an error one): see notes
    wall_s: float = 0.0

    @property
    def errors(self) -> list[str]:
        """Students whose result holds a grader error (the CLI exits non-zero when there is any)."""
        return sorted(sid for sid, result in self.results.items() if has_error(result))


def has_error(result: dict[str, Any]) -> bool:
    """A result the grader could not finish properly: some item ended in `error`."""
    return any(item.get("status") == "error" for item in result.get("items", []))


def printable(text: str) -> str:
    """`text` without lone surrogates (what a name that is not UTF-8 decodes to), so that it can be written."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class Redactor:
    """Writes the paths that differ from one run to the next as placeholders, so results compare equal.

    Longest path first, so that a folder inside another keeps its own name.
    The price: a TA reading a flag sees `<results>/...` and has to know the
    folder they passed to `--out`.
    """

    # Path components only: a student's own text (an edit quoted in the notes) keeps its `worker2`.
    PATTERNS = ((re.compile(r"(?<=/)harness-\d+\b"), "harness"), (re.compile(r"(?<=/)worker\d+\b"), "worker"),
                (re.compile(r"(?<=/)inferlab-fifo-\w+"), "inferlab-fifo"), (re.compile(r"/proc/\d+\b"), "/proc/<pid>"))

    def __init__(self, places: dict[str, Path]):
        pairs = {str(path): name for name, path in places.items() if str(path) not in ("", "/", ".")}
        self.pairs = sorted(pairs.items(), key=lambda pair: len(pair[0]), reverse=True)

    def __call__(self, text: str) -> str:
        for path, name in self.pairs:
            text = text.replace(path, name)
        for pattern, name in self.PATTERNS:
            text = pattern.sub(name, text)
        return printable(text)


def submission_sha256(hashes: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _regions_and_flags(copy: Submission, reading: TreeReading, shared: Shared):
    """What the copy of a submission holds, against what the lab needs (under the parse lock: it parses)."""
    notes, flags = list(reading.notes), list(reading.flags)
    flags += ignored_files(reading.hashes, shared.shipped)
    if not copy.package.is_dir():
        notes.append("no student_exercises/ folder in the submission: every region counts as missing")
    extraction = extract(copy.package, shared.tree, shared.options.lab, shared.given)
    flags += [f"ignored or suspicious: {s}" for s in extraction.suspicious]
    notes += extraction.notes
    notes += [edit.describe() for edit in extraction.outside_edits]
    return notes, flags, extraction


def grade_submission(sub: Submission, shared: Shared, runner: Runner) -> dict[str, Any]:
    """Grade one submission completely; never raises for anything the submission does.

    The submission is read once, into `work/submission/` (`grading.tree_walk`):
    everything below reads that copy, so what was graded is what was hashed.
    """
    started, clock = _now(), time.monotonic()
    work = shared.options.out / WORK / sub.student_id
    clear(work)
    reading = read_submission(sub.path, shared.options.limits, copy_to=work / SUBMISSION_COPY)
    copy = Submission(sub.student_id, sub.lab, work / SUBMISSION_COPY)
    lab = shared.options.lab
    with _PARSE_LOCK:
        notes, flags, extraction = _regions_and_flags(copy, reading, shared)
        files = harness_package(lab, shared.tree, extraction.bodies, extraction.additions)

    def fresh_harness():
        target = work / f"harness-{time.monotonic_ns()}"
        write_harness(target, lab, files)
        return target, digest(target)

    harness, harness_digest = fresh_harness()
    ctx = ItemContext(shared.rubric, shared.golden, harness, harness_digest, shared.reference_harness, copy.path,
                      work / "scratch", shared.fence, runner, shared.cuda, fresh_harness,
                      deadline_cap_s=shared.options.deadline_cap_s)
    items: list[ItemResult] = []
    sandbox = None
    for item in shared.rubric.items:
        try:
            result = grade_item(item, ctx)
        except Exception as err:  # noqa: BLE001 - the grader's own failure: say so, keep going
            result = ItemResult(item.id, item.title, item.kind, item.points, 0, "error",
                                f"grader error: {type(err).__name__}: {err}",
                                details=traceback.format_exc().splitlines()[-8:])
        ctx.done[item.id] = result
        items.append(result)
        if sandbox is None and result.measurements.get("sandbox"):
            sandbox = result.measurements.pop("sandbox")
        else:
            result.measurements.pop("sandbox", None)
    if not shared.options.keep_work:
        clear(work)
    blocked = sum(i.points for i in items if i.status == "blocked")
    score = sum(i.score for i in items)
    redact = shared.redactor(sub)
    for item in items:
        item.flags = list(dict.fromkeys(redact(flag) for flag in item.flags))   # a refusal repeated per test: one flag
        item.message = redact(in_student_terms(item.message, files, copy.package))
        item.details = [redact(in_student_terms(line, files, copy.package)) for line in item.details]
        flags += [f"{item.id}: {flag}" for flag in item.flags]
    return {
        "format": RESULT_FORMAT,
        "complete": True,
        "lab": lab,
        "student_id": sub.student_id,
        "score": score,
        "max_score": shared.rubric.total,
        "gradable_points": shared.rubric.total - blocked,
        "blocked_points": blocked,
        "items": [i.as_dict() for i in items],
        "regions": [{"region_id": r.region_id, "status": r.status, "message": redact(r.message)}
                    for r in extraction.regions],
        "flags": [redact(flag) for flag in flags],
        "notes": [redact(note) for note in notes],
        "files": reading.hashes,
        "submission_sha256": submission_sha256(reading.hashes),
        "rubric_sha256": shared.rubric_sha256,
        "golden_sha256": shared.golden_sha256,
        "environment": {**shared.environment, "sandbox": sandbox},
        "timing": {"started": started, "finished": _now(), "wall_s": round(time.monotonic() - clock, 3)},
    }


def _error_result(sub: Submission, shared: Shared, err: BaseException, during: str = "grading") -> dict[str, Any]:
    """When grading or writing a submission failed: every item an error, and the reason, still one result."""
    redact = shared.redactor(sub)
    reason = redact(f"grader error while {during}: {type(err).__name__}: {err}")
    items = [ItemResult(i.id, i.title, i.kind, i.points, 0, "error", reason) for i in shared.rubric.items]
    return {"format": RESULT_FORMAT, "complete": True, "lab": shared.options.lab, "student_id": sub.student_id,
            "score": 0, "max_score": shared.rubric.total, "gradable_points": shared.rubric.total, "blocked_points": 0,
            "items": [i.as_dict() for i in items], "regions": [], "flags": [reason],
            "notes": [redact(traceback.format_exc()[-2000:])],
            "files": {}, "submission_sha256": "", "rubric_sha256": shared.rubric_sha256,
            "golden_sha256": shared.golden_sha256, "environment": {**shared.environment, "sandbox": None},
            "timing": {"started": _now(), "finished": _now(), "wall_s": 0.0}}


def _up_to_date(path: Path, sub: Submission, shared: Shared) -> bool:
    """A finished, error-free result made from the same files (as read now), rubric and golden outputs.

    Anything that goes wrong while checking (a tree the walk cannot read)
    means "grade it again": the worker then turns any failure into that
    submission's result, instead of stopping the run before anyone is graded.
    """
    existing = read_result(path)
    if existing is None or has_error(existing):
        return False
    try:
        hashes = read_submission(sub.path, shared.options.limits).hashes
    except Exception:  # noqa: BLE001 - regrade; the worker reports what fails then
        return False
    return (existing.get("submission_sha256") == submission_sha256(hashes)
            and existing.get("rubric_sha256") == shared.rubric_sha256
            and existing.get("golden_sha256") == shared.golden_sha256)


def _grade_and_write(sub: Submission, shared: Shared, runner: Runner, summary: RunSummary,
                     lock: threading.Lock) -> dict[str, Any]:
    """Grade one submission and write its result; whatever fails becomes that submission's error result.

    One submission never stops the class: an exception while grading, or
    while writing the result (a name the file system or JSON would not
    take), is caught here and written as an error result instead. Only if
    even that cannot be written is the student left without a file; the run
    says so, and `grade report` still gives them a row (from missing.json).
    """
    path = shared.options.out / f"{sub.student_id}.json"
    try:
        result = grade_submission(sub, shared, runner)
    except Exception as err:  # noqa: BLE001 - one submission never stops the batch
        result = _error_result(sub, shared, err, "grading")
    try:
        write_json_atomic(path, result)
        return result
    except Exception as err:  # noqa: BLE001
        result = _error_result(sub, shared, err, "writing its result")
    try:
        write_json_atomic(path, result)
    except Exception as err:  # noqa: BLE001
        with lock:
            summary.ungraded.append(sub.student_id)
            summary.notes.append(f"{sub.student_id}: no result could be written ({type(err).__name__}: "
                                 f"{printable(str(err))})")
    return result


def prepare(options: RunOptions) -> Shared:
    rubric = load_rubric(options.lab)
    observed = any(item.observed for item in rubric.items)
    cuda = cuda_available()
    golden, notes = grading_golden(options.lab, cuda) if observed else ({"items": {}, "tests": {}}, [])
    tree = load_reference()
    out = options.out.resolve()
    fence = Fence.for_run(model_dir(), out, options.submissions.resolve(), landlock=options.landlock, gpu=cuda)
    reference = None
    if any(item.kind == "throughput" for item in rubric.items):
        reference = out / WORK / "reference-harness"
        clear(reference)
        build_harness(reference, options.lab, tree)
    environment = {"device": device_description(cuda), "versions": package_versions(), "spawn": options.spawn}
    return Shared(options, rubric, golden, tree, fence, cuda, reference, environment,
                  hashlib.sha256(rubric.path.read_bytes()).hexdigest(), golden_sha256(options.lab), notes,
                  release_hashes(options.lab, tree), given_package(tree, options.lab))


def grade_run(options: RunOptions, console: Console | None = None, show_progress: bool = True) -> RunSummary:
    """Grade every submission of the lab (or one student's); see the module's docstring.

    Raises `grading.unfenced.Unfenced` before grading anyone when Landlock
    would not be in force and `allow_unfenced` is off.
    """
    console = console or make_console()
    started = time.monotonic()
    unfenced = check_fence(options.landlock, options.allow_unfenced)
    options.out.mkdir(parents=True, exist_ok=True)
    options = RunOptions(**{**options.__dict__, "out": options.out.resolve(),
                            "submissions": options.submissions.resolve()})
    submissions, notes = find_submissions(options.submissions, options.lab, options.student)
    if options.student is None:
        write_json_atomic(options.out / MISSING, {"lab": options.lab,
                                                  "students": missing_students(options.submissions, options.lab),
                                                  "submitted": [sub.student_id for sub in submissions]})
    shared = prepare(options)
    summary = RunSummary(notes=notes + shared.notes)
    if unfenced:
        summary.notes.append(f"graded without Landlock ({unfenced}; --allow-unfenced): native file readers are "
                             "only partly closed (grading.unfenced)")
    todo: "queue.Queue[Submission]" = queue.Queue()
    for sub in submissions:
        path = options.out / f"{sub.student_id}.json"
        if not options.force and _up_to_date(path, sub, shared):
            summary.skipped.append(sub.student_id)
            summary.results[sub.student_id] = read_result(path)
        else:
            todo.put(sub)
    total = todo.qsize()
    lock = threading.Lock()
    stop = threading.Event()

    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=console, disable=not show_progress, transient=False) as progress:
        task = progress.add_task(f"grading {options.lab}", total=total)

        def worker(index: int) -> None:
            runner = Runner(options.out / WORK / f"worker{index}", options.spawn, options.quota)
            try:
                while not stop.is_set():
                    try:
                        sub = todo.get_nowait()
                    except queue.Empty:
                        return
                    try:
                        result = _grade_and_write(sub, shared, runner, summary, lock)
                    except Exception as err:  # noqa: BLE001 - the thread must live on to grade the others
                        with lock:
                            summary.ungraded.append(sub.student_id)
                            summary.notes.append(f"{sub.student_id}: not graded ({type(err).__name__}: "
                                                 f"{printable(str(err))})")
                        continue
                    with lock:
                        summary.graded.append(sub.student_id)
                        summary.results[sub.student_id] = result
                        progress.update(task, advance=1,
                                        description=f"grading {options.lab} (last: {sub.student_id} "
                                                    f"{result['score']}/{result['max_score']})")
            finally:
                runner.close()

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(max(1, options.jobs))]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
        except KeyboardInterrupt:
            stop.set()
            console.print("[yellow]interrupted: finished results are kept; run again to resume[/yellow]")
            for thread in threads:
                thread.join(30)
            raise
    if not options.keep_work:
        clear(options.out / WORK)
    summary.wall_s = time.monotonic() - started
    return summary
