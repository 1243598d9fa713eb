"""Lab 5's rubric grades content: a report built from a real small run scores 100, and each kind of invention
(a call chain not traced, a log line not logged, a table number not measured, a claim citing nothing that
holds) costs exactly the item that checks it.

The good report is assembled from the files `lab5_run.py` writes (its calls file, its lifecycle log, its
CSV), by reading them here, so the expected verdicts come from the data, not from the grader's own parser.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from labkit.labs import lab_folder
from grading.grade_run import RunOptions, grade_run
from grading.report_content import match_chain
from labkit.rubric import load_rubric

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
CHAIN = ["LLMEngine.step", "Scheduler.schedule", "ModelRunner.run", "Qwen3ForCausalLM.forward",
         "Qwen3DecoderLayer.forward", "Qwen3Attention.forward", "TorchAttentionBackend.forward"]


def _script():
    spec = importlib.util.spec_from_file_location("lab5_run_for_report", lab_folder("lab5") / "lab5_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """One small real run with preemptions: runs/t.jsonl, runs/t_calls.txt, results/runs.csv."""
    folder = tmp_path_factory.mktemp("lab5_run")
    _script().main(["t", "--out", str(folder / "runs"), "--results", str(folder / "results"), "--requests", "6",
                    "--warmup", "0", "--num-kvcache-blocks", "24", "--max-num-seqs", "4"])
    return folder


def _chain_block(calls_file: Path) -> list[str]:
    """The first occurrence of each CHAIN name, copied from the calls file with its indentation, in order."""
    lines, wanted = [], list(CHAIN)
    for line in calls_file.read_text(encoding="utf-8").splitlines():
        if wanted and line.strip().split(" ")[0] == wanted[0]:
            lines.append(line.split("    [")[0] + "    # " + wanted.pop(0))
    assert not wanted, f"the trace lacks {wanted}"
    return lines


def _log_block(log: Path) -> list[str]:
    """A preemption and the two events after it, the next STEP event, and the victim's next SCHEDULED, as logged."""
    lines = log.read_text(encoding="utf-8").splitlines()
    events = [json.loads(line) for line in lines]
    start = next(i for i, e in enumerate(events) if e["event"] == "PREEMPTED")
    step = next(i for i in range(start, len(events)) if events[i]["event"] == "STEP")
    back = next(i for i in range(step, len(events))
                if events[i]["event"] == "SCHEDULED" and events[i]["seq_id"] == events[start]["seq_id"])
    return lines[start:start + 3] + [lines[step], lines[back]]


def good_report(run: Path) -> dict[str, str]:
    row = next(csv.DictReader((run / "results" / "runs.csv").open(encoding="utf-8")))
    tok_s, ttft50, ttft99 = float(row["output_tok_per_s"]), float(row["ttft_p50_ms"]), float(row["ttft_p99_ms"])
    table = (f"数据：`results/runs.csv`。\n\n| run | preemptions | output tok/s | TTFT P50 / P99 |\n| --- | --- | --- | --- |\n"
             f"| t | {row['preemptions']} | {tok_s:.1f} | {ttft50:.2f} / {ttft99:.2f} |\n")
    steps = list(csv.DictReader((run / "results" / "t_steps.csv").open(encoding="utf-8")))[:3]
    for title in ("3.2 prefill 步", "3.3 decode 步"):
        table += (f"\n### {title}\n\n数据：`results/t_steps.csv`。\n\n| step | batch | tokens | ms |\n| --- | --- | --- | --- |\n"
                  + "".join(f"| {s['step']} | {s['batch_size']} | {s['num_tokens']} | {float(s['duration_ms']):.3f} |\n"
                            for s in steps))
    explanation = "\n".join(
        f"### 解释 {n}\n\n- **现象**：吞吐 {tok_s:.0f} tok/s。\n- **解释**：固定开销为主。\n"
        f"- **可否定的预测**：如果吞吐低于 {tok_s / 2:.0f} tok/s，解释就被否定。\n"
        f"- **检验**：`results/runs.csv[t].output_tok_per_s = {tok_s:.2f}`\n- **结论**：成立\n" for n in (1, 2, 3))
    chain = "\n".join(_chain_block(run / "runs" / "t_calls.txt"))
    log = "\n".join(_log_block(run / "runs" / "t.jsonl"))
    parts = {
        "setup": "## 0. 实验环境（Setup）\n\n| 项 | 值 |\n| --- | --- |\n| Python | 3.11 |\n",
        "method": "## 1. 测量方法（Method）\n\n```bash\npython lab5_run.py t\n```\n",
        "chain": f"## 2. 调用链\n\n```\n{chain}\n```\n",
        "results": f"## 3. 表格（Results）\n\n{table}\n![tput](figures/tput.png)\n",
        "log": f"## 4. 日志\n\n```\n(runs/t.jsonl)\n{log}\n```\n",
        "analysis": f"## 5. 可否定的解释（Analysis）\n\n{explanation}\n",
        "limits": "## 6. 结论与局限（Limitations）\n\ntiny model。\n",
    }
    return parts


def _submit(root: Path, student: str, run: Path, parts: dict[str, str]) -> None:
    folder = root / student / "lab5"
    shutil.copytree(run, folder)
    (folder / "figures").mkdir()
    (folder / "figures" / "tput.png").write_bytes(PNG)
    (folder / "report.md").write_text("# Lab 5\n\n" + "\n".join(parts.values()), encoding="utf-8")


def _lost(result: dict) -> set[str]:
    return {item["id"] for item in result["items"] if item["score"] < item["points"]}


def test_real_report_scores_full_and_each_invention_loses_its_item(run, tmp_path):
    good = good_report(run)
    chain = good["chain"]
    invented_chain = chain.replace("ModelRunner.run", "ModelRunner.capture_cudagraph")
    swapped_chain = chain.replace("Scheduler.schedule", "@@").replace("ModelRunner.run", "Scheduler.schedule") \
        .replace("@@", "ModelRunner.run")
    first_event = good["log"].split("\n")[4]
    forged = json.dumps({**json.loads(first_event), "blocks_freed": json.loads(first_event)["blocks_freed"] + 1})
    row = next(csv.DictReader((run / "results" / "runs.csv").open(encoding="utf-8")))
    tok = f"{float(row['output_tok_per_s']):.1f}"
    invented_number = good["results"].replace(f"| {tok} |", f"| {float(tok) * 1.5:.1f} |")
    cited = f"output_tok_per_s = {float(row['output_tok_per_s']):.2f}"
    cases = {
        "good": (good, set()),
        "invented_chain": ({**good, "chain": invented_chain}, {"call_chain"}),
        "reordered_chain": ({**good, "chain": swapped_chain}, {"call_chain"}),
        "forged_log": ({**good, "log": good["log"].replace(first_event, forged)}, {"log_excerpts"}),
        "invented_number": ({**good, "results": invented_number}, {"tables"}),
        "wrong_citation": ({**good, "analysis": good["analysis"].replace(cited, cited.replace("= ", "= 9"), 1)},
                           {"explanations"}),
        "no_citation": ({**good, "analysis": good["analysis"].replace(f"`results/runs.csv[t].{cited}`", "见上表", 1)},
                        {"explanations"}),
        "no_figure": ({**good, "results": good["results"].replace("![tput](figures/tput.png)", "")}, {"figures"}),
    }
    assert invented_chain != chain and swapped_chain != chain and invented_number != good["results"]
    submitted = tmp_path / "submitted"
    for student, (parts, _) in cases.items():
        _submit(submitted, student, run, parts)
    (submitted / "empty" / "lab5").mkdir(parents=True)
    summary = grade_run(RunOptions("lab5", submitted, tmp_path / "results"), show_progress=False)
    points = {item.id: item.points for item in load_rubric("lab5").items}
    for student, (_, lost) in cases.items():
        result = summary.results[student]
        assert _lost(result) == lost, (student, [i["details"] for i in result["items"] if i["id"] in _lost(result)])
        assert result["score"] == 100 - sum(points[i] for i in lost)
    assert summary.results["empty"]["score"] == 0


def test_chain_matching_respects_order_and_nesting():
    calls = [(0, "A.step"), (1, "B.run"), (2, "C.fwd"), (3, "D.attn"), (1, "E.post")]
    assert match_chain([(0, "A.step"), (4, "C.fwd"), (8, "D.attn")], calls)      # a skipped level is fine
    assert match_chain([(0, "A.step"), (4, "B.run"), (4, "E.post")], calls)
    assert not match_chain([(0, "A.step"), (4, "E.post"), (4, "B.run")], calls)    # order
    assert not match_chain([(0, "A.step"), (4, "B.run"), (4, "C.fwd")], calls)     # C is B's callee, not sibling
    assert not match_chain([(0, "A.step"), (4, "X.made_up")], calls)


def test_a_content_check_without_its_inputs_is_refused():
    from labkit.rubric import RubricError, parse_rubric
    base = {"id": "x", "title": "x", "points": 100, "kind": "report", "files": ["report.md"]}
    for extra, message in (({"check": "vibes"}, "check must be one of"),
                           ({"check": "tables", "evidence": ["results/*.csv"]}, "names the report sections"),
                           ({"check": "call_chain", "sections": ["调用链"]}, "names its evidence files")):
        with pytest.raises(RubricError, match=message):
            parse_rubric({"lab": "lab9", "items": [{**base, **extra}]}, Path("rubric.json"))


def test_evidence_outside_the_submission_is_not_read(tmp_path):
    from grading.report_content import check_figures, citation_problems
    outside, folder = tmp_path / "outside", tmp_path / "sub"
    (outside / "results").mkdir(parents=True)
    (outside / "results" / "x.csv").write_text("name,v\na,1\n")
    (outside / "f.png").write_bytes(PNG)
    (folder / "results").mkdir(parents=True)
    (folder / "results" / "x.csv").write_text("name,v\na,1\n")
    (folder / "figures").symlink_to(outside)
    assert citation_problems("`results/x.csv[a].v = 1`", folder) == (1, [])
    good, problems = citation_problems("`results/../../outside/results/x.csv[a].v = 1`", folder)
    assert good == 0 and "was not submitted" in problems[0]
    assert "not a PNG file of the submission" in check_figures("![f](figures/f.png)", folder, {"min_count": 1})[0]
