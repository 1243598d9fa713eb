"""One rubric item of one submission, start to verdict.

Order of precedence, so the same work always gets the same status:
1. GPU item with no CUDA, or no current GPU golden outputs -> blocked (its points are neither
   earned nor lost here);
2. throughput item whose required items did not pass (blocked ones aside) -> failed ("not scored");
3. otherwise run it: observed kinds in a graded process judged against the
   golden outputs (points in proportion to the hidden tests passed), throughput
   against the reference, reports by reading files.

No item gates another (labkit/rubric.py says why).

Anything the graded process did that deserves a TA's attention becomes a flag
on the item: sandbox refusals, a deadline kill, exiting before reporting,
huge output, forged or duplicated reports, a modified harness.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grading.execute import Fence, Observed, Runner, clear, process_flags, process_summary
from grading.harness import digest
from grading.judge import judge_item
from grading.report_check import check_report
from grading.results import ItemResult
from labkit.rubric import Item, Rubric
from labkit.scoring import share
from grading.throughput_check import run_throughput

OUTPUT_FLAG_BYTES = 1 << 20


@dataclass
class ItemContext:
    """Everything an item needs about one submission's grading."""

    rubric: Rubric
    golden: dict[str, Any]
    harness: Path
    harness_digest: str
    reference_harness: Path | None
    submission_dir: Path
    scratch_root: Path
    fence: Fence
    runner: Runner
    cuda: bool
    rebuild_harness: Any = None            # callable returning a fresh harness path if this one was modified
    deadline_cap_s: float | None = None
    done: dict[str, ItemResult] = field(default_factory=dict)

    def deadline(self, item: Item) -> float:
        return min(item.deadline_s, self.deadline_cap_s or item.deadline_s)


def _skip(item: Item, status: str, message: str) -> ItemResult:
    return ItemResult(item.id, item.title, item.kind, item.points, 0, status, message)


def observed_flags(run: Observed, expected: list[str], deadline_s: float) -> list[str]:
    flags = process_flags(run.child)
    if run.child.timed_out:
        flags.append(f"killed at the {deadline_s:.0f} s deadline")
    missing = [t for t in expected if t not in run.records]
    if missing and not run.child.timed_out:
        flags.append(f"the graded process exited (status {run.child.status}) before reporting "
                     f"{len(missing)} of {len(expected)} test(s)")
    if run.child.output.total > OUTPUT_FLAG_BYTES:
        flags.append(f"printed {run.child.output.total / 1e6:.1f} MB (only the first and last 16 KB kept)")
    if any("MemoryError" in (record.get("error") or "") for record in run.records.values()):
        flags.append("ran into its memory limit (MemoryError)")
    unexpected = sorted(set(run.records) - set(expected))
    if unexpected:
        flags.append(f"reported {len(unexpected)} test id(s) the item does not run (ignored): {unexpected[0]}")
    flags += run.problems
    if run.scratch:
        flags.append(run.scratch)
    return flags


def rule_lines(item: Item, lab: str) -> list[str]:
    """Which rule a failing item checks, and where the student can see expected values: its public tests.

    Feedback never shows a hidden test's expected values (grading.judge); the
    public tests the rubric names for the item check the same rule, and
    `inferlab check` shows their expected values beside the student's.
    """
    lines = [f"rule: {item.title}"]
    if item.public:
        shown = ", ".join(item.public[:4]) + (f" and {len(item.public) - 4} more" if len(item.public) > 4 else "")
        lines.append(f"the public tests of this rule show expected values (run `inferlab check {lab}`): {shown}")
    return lines


def run_observed(item: Item, ctx: ItemContext) -> ItemResult:
    expected = ctx.golden["items"].get(item.id)
    if expected is None and item.gpu:
        return _skip(item, "blocked", f"no current GPU golden outputs for this item: they are built on a GPU "
                                      f"machine (`inferlab golden build --lab {ctx.rubric.lab} --part gpu`)")
    if expected is None:
        return _skip(item, "error", "no golden outputs for this item: run `inferlab golden build`")
    scratch = ctx.scratch_root / item.id
    deadline_s = ctx.deadline(item)
    run = ctx.runner.observe(ctx.harness, scratch, list(item.select), deadline_s, ctx.fence, gpu=item.gpu)
    clear(scratch)
    verdict = judge_item(item.kind, expected, ctx.golden["tests"], run.records)
    flags = observed_flags(run, expected, deadline_s)
    if digest(ctx.harness) != ctx.harness_digest:
        flags.append("the harness was modified while this item ran (rebuilt for the next item)")
        if ctx.rebuild_harness is not None:
            ctx.harness, ctx.harness_digest = ctx.rebuild_harness()
    if verdict.passed:
        status = "passed"
    elif run.child.timed_out:
        status = "timeout"
    elif run.child.status is None:
        status = "error"
    else:
        status = "failed"
    message = verdict.message
    if status == "timeout":
        message = f"killed after {deadline_s:.0f} s; " + message
    details: list[str] = []
    for failure in verdict.failures[:3]:
        details.append(f"{failure.test}:")
        details += [f"    {line}" for line in failure.explanation]
    if len(verdict.failures) > 3:
        details.append(f"... and {len(verdict.failures) - 3} more failing test(s)")
    if verdict.failures:
        details += rule_lines(item, ctx.rubric.lab)
    # A process that never started ("error") ran no test: nothing to share out.
    earned = item.points if verdict.passed else share(item.points, verdict.tests_passed,
                                                       0 if status == "error" else verdict.tests_expected)
    return ItemResult(item.id, item.title, item.kind, item.points, earned, status,
                      message, details=details, flags=flags,
                      tests={"expected": verdict.tests_expected, "passed": verdict.tests_passed},
                      wall_s=round(run.child.wall_s, 3), output_tail=run.child.output.text()[-2000:],
                      measurements={"sandbox": {**(run.sandbox or {}), "process": process_summary(run.child)}})


def grade_item(item: Item, ctx: ItemContext) -> ItemResult:
    if item.gpu and not ctx.cuda:
        return _skip(item, "blocked", "needs a CUDA GPU; none on this grading machine")
    if item.kind == "throughput":
        required = [ctx.rubric.item(i) for i in item.options["requires"]]
        failing = [i.id for i in required if ctx.done[i.id].status not in ("passed", "blocked")]
        if failing:
            return _skip(item, "failed", f"not scored: it times an engine whose {', '.join(failing)} item(s) did "
                                         "not pass, and the speed of a wrong engine means nothing")
        if ctx.reference_harness is None:
            return _skip(item, "error", "no reference harness to compare with")
        return run_throughput(item, ctx.runner, ctx.harness, ctx.reference_harness, ctx.scratch_root / item.id,
                              ctx.fence, ctx.deadline(item))
    if item.kind == "report":
        return check_report(ctx.submission_dir, item)
    if item.kind == "ta":
        return _skip(item, "pending", "marked by a TA against the rubric's anchors (grade report merges the marks)")
    return run_observed(item, ctx)
