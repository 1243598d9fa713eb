"""The self-check's rubric table: for every item, the public part and what is not checked here (labkit/scoring.py).

Built from lab 4's rubric and a made-up run of its public tests, so that each case shows: an item whose
public tests all pass is secured; one failing test loses the whole item here (the grader may still give part
of it, and the table says so); a GPU item whose GPU tests were skipped is not secured even though its CPU
tests passed; throughput, which has no public test, is named with its points and what it needs.
"""
from __future__ import annotations

from rich.console import Console

from courseware.selfcheck import rubric_table
from labkit.rubric import load_rubric
from labkit.scoring import secured, share


def fake_tests(rubric, failing: set[str] = frozenset(), skipped_gpu: bool = True) -> dict[str, dict]:
    tests = {}
    for item in rubric.items:
        for public in item.public:
            file, name = public.split("::")
            gpu = file == "test_lab4_gpu.py"
            outcome = "skipped" if gpu and skipped_gpu else "failed" if name in failing else "passed"
            tests[public] = {"name": name, "file": f"student_exercises/tests/{file}", "points": 1, "labs": ["lab4"],
                             "stretch": False, "gpu": gpu, "covers": [], "outcome": outcome, "message": "",
                             "duration": 0.0}
    return tests


def render(rubric, tests) -> str:
    console = Console(record=True, width=250)
    console.print(rubric_table(rubric, tests))
    return console.export_text()


def row(text: str, item: str) -> str:
    return next(line for line in text.splitlines() if line.count("│") > 2 and
                line.split("│")[1].strip().split(":")[0] == item)


def test_secured_is_all_or_nothing_and_share_is_the_graders():
    assert (secured(20, 4, 4), secured(20, 3, 4), secured(20, 0, 0), secured(10, 1, 1, skipped=1)) == (20, 0, 0, 0)
    assert share(20, 3, 4) == 15


def test_every_item_is_listed_with_what_is_not_checked_here():
    rubric = load_rubric("lab4")
    text = render(rubric, fake_tests(rubric, failing={"test_decode_positions_and_slots"}))
    assert "20/20" in row(text, "prefill_inputs") and "hidden tests of the same behaviour" in row(text, "prefill_inputs")
    decode = row(text, "decode_inputs")
    assert "0/15" in decode and "1 of its public tests fail" in decode and "in proportion" in decode
    gpu = row(text, "kv_store_gpu")
    assert "0/10" in gpu and "(1 skipped)" in gpu and "GPU tests need CUDA" in gpu, gpu
    throughput = row(text, "throughput")
    assert "-/10" in throughput and "throughput" in throughput and "greedy_cpu" in throughput, throughput
    assert "55/90" in row(text, "public part")            # 20 + 20 + 15: prefill, paged decode, greedy
    assert "Not checked here: 45 points" in text
    for reason in ("items whose public tests fail 15", "GPU tests without CUDA 20", "throughput 10"):
        assert reason in text, reason


def test_with_cuda_the_gpu_items_are_secured_by_their_tests():
    rubric = load_rubric("lab4")
    text = render(rubric, fake_tests(rubric, skipped_gpu=False))
    assert "10/10" in row(text, "kv_store_gpu") and "10/10" in row(text, "cuda_graphs_gpu")
    assert "90/90" in row(text, "public part") and "Not checked here: 10 points (throughput 10)" in text
