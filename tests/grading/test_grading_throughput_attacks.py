"""Throughput cannot be skewed: a hog that burns CPU while the reference is timed gains nothing.

A slow control (correct tokens, a busy wait in `can_append`) and the same
engine plus a hog (a thread that burns CPU outside the GIL from the first
call on, and tries to renice every process of its user) are each timed
against the reference with lab 2's throughput item. The control shows that
the slowness alone fails the item; the hog must fail it too, and the grader
must have seen every process of the side not being timed stopped in every
round (grading.throughput_check pauses it). The item is run directly, without
the correctness items, to keep CI time low.
"""
from __future__ import annotations

import pytest

from labkit.tree import load_reference
from grading.execute import Fence, Runner
from grading.golden import model_dir
from grading.harness import build_harness
from labkit.rubric import load_rubric
from grading.submission import extract
from grading.throughput_check import run_throughput
from grading.sample_submissions import searchable_folder, with_bodies, write_submission

pytestmark = pytest.mark.slow

SPIN = '''import time
_until = time.perf_counter() + 0.0025
while time.perf_counter() < _until:
    pass
'''
CAN_APPEND = "return len(seq.block_table) >= seq.num_blocks or self.num_free_blocks >= 1\n"
HOG = '''import hashlib, os, threading
if not getattr(type(self), "_hog", False):
    type(self)._hog = True

    def burn():
        for who in (os.PRIO_USER, os.PRIO_PGRP):
            try:
                os.setpriority(who, 0, 19)
            except OSError:
                pass
        while True:
            hashlib.sha256(bytes(1 << 24)).digest()      # releases the GIL: a second core's worth of load

    threading.Thread(target=burn, daemon=True).start()
'''
BODIES = {"slow_control": SPIN + CAN_APPEND, "hog": HOG + SPIN + CAN_APPEND}


@pytest.fixture(scope="module")
def timed():
    with searchable_folder("inferlab-throughput-") as work:
        yield _time_both(work)


def _time_both(work):
    tree = load_reference()
    item = next(i for i in load_rubric("lab2").items if i.kind == "throughput")
    reference = build_harness(work / "reference", "lab2", tree)
    fence = Fence.for_run(model_dir(), work)
    runner = Runner(work / "run")
    results = {}
    try:
        for name, body in BODIES.items():
            folder = write_submission(work / "submitted", name, "lab2", tree,
                                      with_bodies({"lab2.can_append": body}, tree))
            bodies = extract(folder / "student_exercises", tree, "lab2").bodies
            harness = build_harness(work / name, "lab2", tree, bodies)
            results[name] = run_throughput(item, runner, harness, reference, work / "scratch" / name, fence,
                                           item.deadline_s)
    finally:
        runner.close()
    return item, results


def test_the_slow_control_fails_the_throughput_item(timed):
    item, results = timed
    control = results["slow_control"]
    assert control.status == "failed", (control.message, control.measurements)
    assert control.measurements["median_ratio"] < item.options["min_ratio"]


def test_a_hog_gains_nothing_and_the_reference_is_timed_alone(timed):
    item, results = timed
    hog, control = results["hog"], results["slow_control"]
    assert hog.status == "failed", (hog.message, hog.measurements)
    assert hog.measurements["median_ratio"] < item.options["min_ratio"]
    for result in (hog, control):
        assert result.measurements["other_side_not_stopped"] == 0, result.measurements
        process = result.measurements["sandbox"]["process"]
        assert process["pid_namespace"] is True, process
        assert process["uid"] == 65534, process          # wherever Python sits (process_fence.expose)
