"""Golden outputs: what the reference observes on each lab's hidden tests, stored in each lab's folder as golden.json.

    inferlab golden build [--lab labN]     run the hidden tests on the reference harness, write labN.json
    inferlab golden check [--lab labN]     rebuild in a temp folder and compare; non-zero when stale

The reference runs through exactly the path a submission takes (harness,
fence, graded process, observation file), so a golden output is what a
correct submission produces, and the fence is proven not to get in the way of
correct code. A lab's file holds, per rubric item, the test ids the item
expects, and per test its observations (logs without times, block tables
after every step, scheduling decisions, greedy tokens, metrics).

GPU items' golden outputs are built on a GPU machine and stored beside the
CPU ones, in the lab folder's golden_gpu.json (`inferlab golden build --lab
lab4 --part gpu`); the CPU file never holds them, so building or checking it
gives the same bytes with or without CUDA. The grader uses the GPU file only
where CUDA exists and only while it was built from the same sources as the CPU
file (equal fingerprints); otherwise GPU items are `blocked` with the reason.
The price of that rule: any change to the engine, hidden tests or harness
files makes the GPU file stale until someone rebuilds it on a GPU.
"""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

from grading.execute import Fence, Runner
from grading.harness import build_harness, source_fingerprint
from grading.judge import same
from grading.paths import golden_gpu_path, golden_path
from labkit.rubric import Rubric, load_rubric
from labkit.tree import load_reference

FORMAT = 1


class GoldenError(RuntimeError):
    """The reference does not produce clean observations: fix the hidden tests or the reference first."""


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def model_dir() -> Path:
    from courseware.tiny_model import ensure_tiny_model
    return ensure_tiny_model()


def gpu_items(rubric: Rubric) -> list[str]:
    """Observed items that need CUDA: their golden outputs live in the GPU file."""
    return [item.id for item in rubric.items if item.observed and item.gpu]


def build_golden(lab: str, workdir: Path | None = None, spawn: str = "fork", rubric: Rubric | None = None,
                 progress=None, gpu: bool = False) -> dict[str, Any]:
    """Run the lab's observed CPU items (or, with `gpu`, its GPU items) on the reference; return the golden data."""
    rubric = rubric or load_rubric(lab)
    tree = load_reference()
    cuda = cuda_available()
    if gpu and not cuda:
        raise GoldenError(f"{lab}: GPU golden outputs are built on a machine with CUDA; torch sees none here")
    with tempfile.TemporaryDirectory(prefix=f"golden-{lab}-", dir=workdir) as tmp:
        root = Path(tmp)
        root.chmod(0o755)            # so that the graded processes' unprivileged user can reach the harness
        harness = build_harness(root / "harness", lab, tree)
        fence = Fence.for_run(model_dir(), root, gpu=cuda)
        runner = Runner(root / "run", spawn)
        items: dict[str, list[str]] = {}
        tests: dict[str, list] = {}
        try:
            for item in rubric.items:
                if not item.observed or item.gpu != gpu:
                    continue
                if progress:
                    progress(f"{lab}: {item.id}")
                run = runner.observe(harness, root / "scratch" / item.id, list(item.select), item.deadline_s, fence,
                                     gpu=item.gpu)
                problems = list(run.problems)
                if run.child.timed_out:
                    problems.append(f"timed out after {item.deadline_s} s")
                if not run.order:
                    problems.append("no test reported anything")
                for test in run.order:
                    record = run.records[test]
                    if not record.get("complete"):
                        problems.append(f"{test} did not finish: {(record.get('error') or '')[-1500:]}")
                    if test in tests and tests[test] != record["obs"]:
                        problems.append(f"{test} observed differently in two items")
                if problems:
                    raise GoldenError(f"{lab} item {item.id}: the reference does not pass cleanly:\n  "
                                      + "\n  ".join(problems) + f"\noutput:\n{run.child.output.text()[-3000:]}")
                items[item.id] = list(run.order)
                for test in run.order:
                    tests[test] = run.records[test]["obs"]
        finally:
            runner.close()
    data = {"format": FORMAT, "lab": lab, "fingerprint": source_fingerprint(lab, tree, selections(rubric)),
            "cuda": gpu, "items": items, "tests": tests}
    if gpu:
        import torch
        data["device"] = torch.cuda.get_device_name()
    return data


def selections(rubric: Rubric) -> bytes:
    """The part of a rubric the golden outputs depend on: which tests each observed item runs (not points)."""
    return json.dumps([[i.id, i.kind, list(i.select), i.gpu] for i in rubric.items if i.observed]).encode()


def dumps(data: dict[str, Any]) -> str:
    """Compact JSON with one test per line: small files, readable diffs."""
    head = {k: v for k, v in data.items() if k not in ("items", "tests")}
    lines = ["{"]
    lines += [f"{json.dumps(k)}: {json.dumps(v)}," for k, v in sorted(head.items())]
    lines.append('"items": {')
    items = sorted(data["items"].items())
    lines += [f"  {json.dumps(k)}: {json.dumps(v)}{',' if i < len(items) - 1 else ''}" for i, (k, v) in
              enumerate(items)]
    lines.append("},")
    lines.append('"tests": {')
    tests = sorted(data["tests"].items())
    lines += [f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}{',' if i < len(tests) - 1 else ''}"
              for i, (k, v) in enumerate(tests)]
    lines.append("}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def write_golden(lab: str, data: dict[str, Any], path: Path | None = None) -> Path:
    path = path or (golden_gpu_path(lab) if data.get("cuda") else golden_path(lab))
    path.parent.mkdir(parents=True, exist_ok=True)
    text = dumps(data)
    assert json.loads(text) == data, "golden serialisation is not lossless"
    path.write_text(text, encoding="utf-8")
    return path


def load_golden(lab: str, path: Path | None = None) -> dict[str, Any]:
    path = path or golden_path(lab)
    if not path.is_file():
        raise FileNotFoundError(f"no golden outputs for {lab} ({path}); run `inferlab golden build --lab {lab}`")
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != FORMAT or data.get("lab") != lab:
        raise ValueError(f"{path} is not {lab}'s golden file in format {FORMAT}")
    return data


def load_gpu_golden(lab: str, cpu: dict[str, Any], path: Path | None = None) -> tuple[dict[str, Any] | None, str]:
    """The lab's GPU golden data if it may be used with `cpu` (same sources), else None and why not."""
    path = path or golden_gpu_path(lab)
    if not path.is_file():
        return None, (f"{lab}: no GPU golden outputs ({path.name}); GPU items stay blocked until "
                      f"`inferlab golden build --lab {lab} --part gpu` runs on a GPU machine")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        return None, f"{lab}: {path.name} is not valid JSON ({err}); GPU items stay blocked"
    if data.get("format") != FORMAT or data.get("lab") != lab or not data.get("cuda"):
        return None, f"{lab}: {path.name} is not {lab}'s GPU golden file in format {FORMAT}; GPU items stay blocked"
    if data.get("fingerprint") != cpu.get("fingerprint"):
        return None, (f"{lab}: {path.name} was built from other sources than {golden_path(lab).name} (stale); "
                      f"GPU items stay blocked until `inferlab golden build --lab {lab} --part gpu` runs on a GPU")
    return data, ""


def grading_golden(lab: str, cuda: bool) -> tuple[dict[str, Any], list[str]]:
    """What a grading run judges against: the CPU golden data, plus the GPU file's items where CUDA exists."""
    golden = load_golden(lab)
    if not cuda or not gpu_items(load_rubric(lab)):
        return golden, []
    gpu, why = load_gpu_golden(lab, golden)
    if gpu is None:
        return golden, [why]
    return {**golden, "items": {**golden["items"], **gpu["items"]}, "tests": {**golden["tests"], **gpu["tests"]},
            "gpu_device": gpu.get("device")}, []


def golden_sha256(lab: str) -> str:
    """Digest of the golden files a grading run may use (the GPU file's too, where there is one)."""
    paths = [p for p in (golden_path(lab), golden_gpu_path(lab)) if p.is_file()]
    if not paths:
        return ""
    h = hashlib.sha256()
    for path in paths:
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest() if len(paths) > 1 else hashlib.sha256(paths[0].read_bytes()).hexdigest()


def compare_golden(stored: dict[str, Any], fresh: dict[str, Any]) -> list[str]:
    """Differences between stored golden data and a fresh build (empty: the stored data is current).

    The fingerprint is compared too, so a change to the engine, hidden tests or
    rubric selections that happens not to change any output is still reported,
    asking for a rebuild that makes the file match its sources. Observations
    are compared as grading compares them (`judge.same`, floats within the
    golden file's tolerance): another torch version may round a float in the
    last bits, which grades the same and is no reason to rebuild.
    """
    lab = fresh["lab"]
    problems = []
    if stored.get("fingerprint") != fresh["fingerprint"]:
        problems.append(f"{lab}: the engine, hidden tests or rubric selections changed since the golden outputs "
                        "were built")
    if stored.get("cuda") != fresh["cuda"]:
        problems.append(f"{lab}: built {'with' if stored.get('cuda') else 'without'} CUDA, checked "
                        f"{'with' if fresh['cuda'] else 'without'}: GPU items are compared only where both had it")
    stored_items, stored_tests = stored.get("items", {}), stored.get("tests", {})
    for item in sorted(set(stored_items) | set(fresh["items"])):
        if stored_items.get(item) != fresh["items"].get(item):
            problems.append(f"{lab}: item {item} expects different tests now")
    for test in sorted(set(stored_tests) | set(fresh["tests"])):
        if test not in stored_tests or test not in fresh["tests"] or not same(stored_tests[test], fresh["tests"][test]):
            problems.append(f"{lab}: {test} observes something different now (beyond the tolerance grading uses)")
    return problems


def check_golden(lab: str, workdir: Path | None = None, spawn: str = "fork", path: Path | None = None,
                 gpu: bool = False) -> list[str]:
    """Why the stored golden outputs of `lab` (the GPU file's, with `gpu`) are stale (empty when current).

    Rebuilds them, the only honest test, unless the stored file cannot even be read.
    """
    try:
        stored = load_golden(lab, path or (golden_gpu_path(lab) if gpu else None))
    except (FileNotFoundError, ValueError, json.JSONDecodeError) as err:
        return [str(err)]
    return compare_golden(stored, build_golden(lab, workdir, spawn, gpu=gpu))
