"""Throughput items: the student's engine against the reference, in the same run, alternating.

Two graded processes run `_inferlab_throughput.py`, one on the student's
harness and one on the reference harness, each fenced like any graded
process. The grader sends both the same fresh random seed each round, in
alternating order (S R, then R S, ...), times every run itself, and checks
that both produced the same greedy tokens. The score uses the median of the
per-round ratios reference_time / student_time, so a slow moment of the
machine (another worker, the OS) affects one round, not the grade. A median
below the bar is confirmed before it fails anyone: more rounds run, up to
CONFIRM_FACTOR times the rubric's, until the median clears the bar or they
run out. A busy machine (a parallel grading job on a two-core grader slowed
two of three rounds of the reference solution itself) rarely slows most of
nine rounds; a slow engine is slow in all of them. The price: a failing
submission takes up to that many times longer to time.

While one side is timed, every process of the other side is stopped
(SIGSTOP to its whole PID namespace, confirmed by reading its state): a
submission cannot burn CPU, renice or otherwise slow the reference while the
reference is measured (a hog engine once gained the throughput points that
way), and no student process is alive-and-running at that moment. The price:
a round takes the two sides one after the other, as before, plus a few
milliseconds to stop and resume.

Only pass/fail reaches the result's stable fields; the measured ratios go to
`measurements`, which may differ from one grading to the next.
"""
from __future__ import annotations

import secrets
import statistics
import time
from contextlib import ExitStack
from pathlib import Path

from grading.execute import Fence, Runner, child_env, clear, process_fence_spec, process_flags, process_summary
from grading.scratch import Scratch
from grading.results import ItemResult
from labkit.rubric import Item

SCRIPT = "_inferlab_throughput.py"
# A failing median is confirmed over up to this many times the rubric's rounds.
CONFIRM_FACTOR = 3


def needs_more_rounds(ratios: list[float], rounds: int, min_ratio: float) -> bool:
    """Time another round? Until the rubric's rounds are done, and then while the median is below the bar
    and fewer than CONFIRM_FACTOR times those rounds have run."""
    if len(ratios) < rounds:
        return True
    return statistics.median(ratios) < min_ratio and len(ratios) < CONFIRM_FACTOR * rounds


def _expect(child, prefix: str, deadline: float) -> str | None:
    line = child.read_line(deadline)
    while line is not None and not line.startswith(prefix):
        line = child.read_line(deadline)
    return line


def run_throughput(item: Item, runner: Runner, student_harness: Path, reference_harness: Path, scratch: Path,
                   fence: Fence, deadline_s: float) -> ItemResult:
    """Time the lab's workload on both engines; passed when outputs agree and the median ratio is high enough."""
    deadline = time.monotonic() + deadline_s
    workload = item.options["workload"]
    with ExitStack() as stack:
        clear(scratch)
        spaces, children = {}, {}
        for name, harness in (("student", student_harness), ("reference", reference_harness)):
            own = scratch / name
            spaces[name] = stack.enter_context(Scratch(own, runner.quota))
            children[name] = runner.start("script", [str(harness / SCRIPT), workload], harness,
                                          child_env(fence, harness, own), with_stdin=True,
                                          fence=process_fence_spec(fence, harness, own))
            spaces[name].watch(children[name].kill)
        return _timed_rounds(item, children, spaces, deadline, deadline_s)


def _timed_rounds(item: Item, children: dict, spaces: dict[str, Scratch], deadline: float,
                  deadline_s: float) -> ItemResult:
    """The rounds, once both sides run; then the verdict (the scratch folders are still mounted)."""
    rounds, min_ratio = int(item.options["rounds"]), item.options["min_ratio"]
    times: dict[str, list[float]] = {"student": [], "reference": []}
    not_stopped = 0                      # rounds in which the side not timed could not be seen stopped
    problem = ""
    try:
        for name, child in children.items():
            if _expect(child, "READY", deadline) is None:
                problem = f"the {name} engine did not get ready (crashed, or too slow for the {deadline_s:.0f} s limit)"
                break
        r = 0
        while not problem and needs_more_rounds(_ratios(times), rounds, min_ratio):
            if r >= rounds and time.monotonic() + 2 * _longest_round(times) > deadline:
                break            # no time to confirm: judge on the rounds done (the bar's message, not a timeout)
            seed = secrets.randbelow(1 << 30)
            order = ("student", "reference") if r % 2 == 0 else ("reference", "student")
            digests = {}
            for name in order:
                child = children[name]
                other = children["reference" if name == "student" else "student"]
                child.resume()
                not_stopped += not other.pause()
                started = time.monotonic()
                child.send(f"RUN {seed}")
                line = _expect(child, "DONE", deadline)
                if line is None:
                    problem = f"the {name} engine did not finish timed round {r + 1}"
                    break
                times[name].append(time.monotonic() - started)
                digests[name] = line.split()[-1]
            if problem:
                break
            if digests["student"] != digests["reference"]:
                problem = f"on timed round {r + 1} your engine's tokens differ from the reference's"
                break
            r += 1
    finally:
        for child in children.values():
            child.resume()
            try:
                child.send("EXIT")
            except OSError:
                pass
        results = {name: child.wait(min(deadline, time.monotonic() + 10)) for name, child in children.items()}
    flags = process_flags(results["student"])
    over = spaces["student"].over()
    if over:
        flags.append(over)
    timed_out = results["student"].timed_out and not problem
    ratios = _ratios(times)
    measurements = {"student_s": times["student"], "reference_s": times["reference"], "ratios": ratios,
                    "other_side_not_stopped": not_stopped, "sandbox": {"process": process_summary(results["student"])}}
    if ratios and len(ratios) >= rounds and not problem:
        ratio = statistics.median(ratios)
        measurements["median_ratio"] = ratio
        passed = ratio >= min_ratio
        message = (f"median throughput ratio at least {min_ratio} of the reference" if passed else
                   f"median throughput ratio below {min_ratio} of the reference")
    else:
        passed = False
        message = problem or "no complete timed rounds"
    status = "passed" if passed else ("timeout" if timed_out else "failed")
    return ItemResult(item.id, item.title, item.kind, item.points, item.points if passed else 0, status, message,
                      flags=flags, wall_s=results["student"].wall_s,
                      output_tail=results["student"].output.text()[-2000:], measurements=measurements)


def _ratios(times: dict[str, list[float]]) -> list[float]:
    """reference_time / student_time of each round both sides completed."""
    return [ref / mine for ref, mine in zip(times["reference"], times["student"]) if mine > 0]


def _longest_round(times: dict[str, list[float]]) -> float:
    """The longest round so far: both sides' slowest runs."""
    return max(times["student"]) + max(times["reference"])
