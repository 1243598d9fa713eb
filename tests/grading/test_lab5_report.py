"""Lab 5 is graded on content: the wrong report of issue 34 scores below 40, an honest one from real runs
scores high, and each kind of wrong claim costs exactly the item that checks it, with feedback that says why.

The submissions are made by tests/grading/lab5_fixtures.py from real runs of the lab's own scripts; the
expected verdicts come from that data (read with csv/json there), not from the grader's parsers.
"""
from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from grading.grade_run import RunOptions, grade_run
from grading.report import make_reports
from grading.report_check import check_report
from grading.report_chain import match_chain
from grading.report_criteria import criterion_lines
from grading.report_png import PngError, read_png
from grading.ta_marks import MarksError, read_marks, write_sheet
from labkit.rubric import load_rubric
from tests.grading.lab5_fixtures import FIXTURES, honest_submission, one_pixel_png, rows, run_all, wrong_submission

RUBRIC = load_rubric("lab5")
AUTO = sum(item.points for item in RUBRIC.items if item.kind != "ta")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return run_all(tmp_path_factory.mktemp("lab5_runs"))


@pytest.fixture(scope="module")
def graded(runs, tmp_path_factory) -> dict:
    """The honest, the wrong and an empty submission, graded by `grade run`, reported by `grade report` with the
    TA's marks (tests/grading/fixtures/lab5/ta_marks.csv)."""
    root = tmp_path_factory.mktemp("lab5_graded")
    submitted = root / "submitted"
    honest_submission(runs, submitted / "honest" / "lab5")
    wrong_submission(submitted / "wrong" / "lab5")
    (submitted / "empty" / "lab5").mkdir(parents=True)
    summary = grade_run(RunOptions("lab5", submitted, root / "results"), show_progress=False)
    before = {sid: r["score"] for sid, r in summary.results.items()}
    shutil.copy(FIXTURES / "ta_marks.csv", root / "results" / "ta_marks.csv")
    paths = make_reports(root / "results")
    after = {r["student_id"]: int(r["score"]) for r in csv.DictReader(paths.csv.open(encoding="utf-8"))}
    return {"results": summary.results, "before": before, "after": after, "paths": paths, "root": root}


def _lost(result: dict) -> set[str]:
    return {item["id"] for item in result["items"] if item["score"] < item["points"] and item["kind"] != "ta"}


def test_the_wrong_report_scores_below_40(graded):
    wrong = graded["results"]["wrong"]
    assert graded["before"]["wrong"] < 40 and graded["after"]["wrong"] < 40, (graded["before"], graded["after"])
    # What the issue lists, each caught by its own item; what it got right (a traced chain, real log lines) still counts.
    assert _lost(wrong) == {"runs", "planes", "tables", "explanations", "figures"}
    details = {item["id"]: "\n".join(item["details"]) for item in wrong["items"]}
    assert re.search(r"^BAD\s+ModelRunner\.run: the report says control plane; 第 7 讲《推理系统架构》 puts it on "
                     r"the data plane.*\(rule: ", details["planes"], re.M), details["planes"]
    assert "100000 is" in details["explanations"] and "no measurement near yours" in details["explanations"]
    assert re.search(r"figures/tput\.png is 1x1 pixels", details["figures"])
    assert re.search(r"^MISSING\s+实验 3 KV 容量与 preemption .*: 200: 0 run\(s\)", details["runs"], re.M)
    assert re.search(r"^MISSING\s+a table with numbers under 'Results' 3\.2", details["tables"], re.M)


def test_the_honest_report_scores_high(graded):
    honest = graded["results"]["honest"]
    assert _lost(honest) == set(), [i["details"][:4] for i in honest["items"] if i["id"] in _lost(honest)]
    assert graded["before"]["honest"] == AUTO                       # TA items pending: neither earned nor lost yet
    assert graded["after"]["honest"] >= 90
    assert graded["before"]["empty"] == 0


def test_results_with_pending_and_marked_ta_items_fit_the_schemas(graded):
    import jsonschema
    from grading.report import gradescope_results
    schemas = Path(__file__).resolve().parents[2] / "grading" / "schemas"
    result_schema = json.loads((schemas / "result.schema.json").read_text(encoding="utf-8"))
    gradescope_schema = json.loads((schemas / "gradescope.schema.json").read_text(encoding="utf-8"))
    for result in graded["results"].values():
        jsonschema.validate(result, result_schema)
        assert {i["status"] for i in result["items"] if i["kind"] == "ta"} == {"pending"}
    for path in (graded["paths"].gradescope).glob("*/results.json"):
        jsonschema.validate(json.loads(path.read_text(encoding="utf-8")), gradescope_schema)
    jsonschema.validate(gradescope_results(graded["results"]["wrong"]), gradescope_schema)


def test_feedback_comes_from_the_checks_and_the_ta(graded):
    feedback = (graded["paths"].feedback / "wrong.md").read_text(encoding="utf-8")
    assert "## Marked by a TA" in feedback and "CPU fan" in feedback
    assert re.search(r"^BAD\s+ModelRunner\.run", feedback, re.M)
    assert re.search(r"^BAD\s+the explanations invoke what no log", feedback, re.M)      # the anchor's own words
    honest = (graded["paths"].feedback / "honest.md").read_text(encoding="utf-8")
    assert "What to look at" not in honest and "## Marked by a TA" in honest
    sheet = write_sheet(list(graded["results"].values()), graded["root"] / "sheet.csv", RUBRIC)
    pending = [r for r in csv.DictReader(sheet.open(encoding="utf-8"))]
    assert {(r["student_id"], r["item"]) for r in pending} == {
        (sid, item.id) for sid in ("empty", "honest", "wrong") for item in RUBRIC.items if item.kind == "ta"}
    assert all(r["points"] == "" and "0:" in r["anchors"] for r in pending)


# --------------------------------------------------------------------------- each invention costs its item

def _one_item(folder: Path, item_id: str) -> bool:
    return check_report(folder, RUBRIC.item(item_id)).status == "passed"


def _verdicts(folder: Path) -> set[str]:
    return {item.id for item in RUBRIC.items if item.kind == "report" and not _one_item(folder, item.id)}


def _edit(folder: Path, old: str, new: str, count: int = 1) -> None:
    report = folder / "report.md"
    text = report.read_text(encoding="utf-8")
    assert text.count(old) >= count, old
    report.write_text(text.replace(old, new, count), encoding="utf-8")


def _rewrite_csv(path: Path, row_key: str, column: str, value: str) -> None:
    data = rows(path)
    for row in data:
        if next(iter(row.values())) == row_key:
            row[column] = value
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(data[0]))
        writer.writeheader()
        writer.writerows(data)


def _summary(folder: Path) -> dict[str, dict[str, str]]:
    return {r["group"]: r for r in rows(folder / "results" / "summary.csv")}


def _invent(kind: str, folder: Path) -> None:
    summary = _summary(folder)
    if kind == "invented_chain":
        _edit(folder, "ModelRunner.prepare_decode", "ModelRunner.capture_cudagraph")
    elif kind == "reordered_chain":
        _edit(folder, "    Scheduler.schedule", "    @@")
        _edit(folder, "    ModelRunner.run", "    Scheduler.schedule")
        _edit(folder, "    @@", "    ModelRunner.run")
    elif kind == "wrong_plane":
        _edit(folder, "阶段 5 decode；data plane", "阶段 5 decode；control plane")
    elif kind == "forged_log":
        text = (folder / "report.md").read_text(encoding="utf-8")
        event = next(line for line in text.splitlines() if '"PREEMPTED"' in line)
        forged = json.dumps({**json.loads(event), "blocks_freed": json.loads(event)["blocks_freed"] + 1})
        _edit(folder, event, forged)
    elif kind == "invented_number":
        tok = f"{float(summary['seqs16']['output_tok_per_s']):.1f}"
        _edit(folder, f"| 16 | {tok} |", f"| 16 | {float(tok) * 1.5:.1f} |")
    elif kind == "table_from_own_csv":
        shutil.copy(folder / "results" / "summary.csv", folder / "results" / "mine.csv")
        _edit(folder, "只改 `--num-kvcache-blocks`（`max_num_seqs` 8），每个设置 3 次；数据：`results/summary.csv`",
              "只改 `--num-kvcache-blocks`（`max_num_seqs` 8），每个设置 3 次；数据：`results/mine.csv`")
    elif kind == "wrong_citation":
        value = summary["seqs16"]["decode_step_median_ms"]
        _edit(folder, f"decode_step_median_ms = {value}`", f"decode_step_median_ms = 9{value}`")
    elif kind == "loose_threshold":
        _edit(folder, "`results/summary.csv[chunk64].itl_max_ms < results/summary.csv[nochunk].itl_max_ms`",
              "`results/summary.csv[chunk64].itl_max_ms < 100000`")
    elif kind == "verdict_flipped":
        _edit(folder, "- **结论**：成立", "- **结论**：被否定")
    elif kind == "tiny_figure":
        (folder / "figures" / "decode_step_ms.png").write_bytes(one_pixel_png())
    elif kind == "unsourced_figure":
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([1, 2, 3], [3, 1, 2])
        fig.savefig(folder / "figures" / "decode_step_ms.png", dpi=100)
        plt.close(fig)
    elif kind == "log_number_edited":
        _rewrite_csv(folder / "results" / "runs.csv", "kv48_2", "ttft_p99_ms", "0.5")
    elif kind == "experiment_dropped":
        kept = [r for r in rows(folder / "results" / "runs.csv") if not r["name"].startswith("kv48_")]
        with (folder / "results" / "runs.csv").open("w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(kept[0]))
            writer.writeheader()
            writer.writerows(kept)
    elif kind == "bench_missing":
        for path in (folder / "runs").glob("bench_quick_*.json"):
            path.unlink()
    else:
        raise AssertionError(kind)


INVENTIONS = {
    # Swapping two names leaves each line's note where it was: the planes beside them are then wrong too.
    "invented_chain": {"call_chain"}, "reordered_chain": {"call_chain", "planes"}, "wrong_plane": {"planes"},
    "forged_log": {"log_excerpts"}, "invented_number": {"tables"}, "table_from_own_csv": {"tables"},
    "wrong_citation": {"explanations"}, "loose_threshold": {"explanations"}, "verdict_flipped": {"explanations"},
    "tiny_figure": {"figures"}, "unsourced_figure": {"figures"}, "log_number_edited": {"runs"},
    "experiment_dropped": {"runs"}, "bench_missing": {"runs"},
}


@pytest.mark.parametrize("kind", sorted(INVENTIONS))
def test_each_invention_costs_the_item_that_checks_it(runs, tmp_path, kind):
    folder = honest_submission(runs, tmp_path / "sub")
    _invent(kind, folder)
    assert _verdicts(folder) == INVENTIONS[kind]


# --------------------------------------------------------------------------- the parts, on small cases

def test_chain_matching_respects_order_and_nesting():
    calls = [(0, "A.step"), (1, "B.run"), (2, "C.fwd"), (3, "D.attn"), (1, "E.post")]
    assert match_chain([(0, "A.step"), (4, "C.fwd"), (8, "D.attn")], calls)      # a skipped level is fine
    assert match_chain([(0, "A.step"), (4, "B.run"), (4, "E.post")], calls)
    assert not match_chain([(0, "A.step"), (4, "E.post"), (4, "B.run")], calls)    # order
    assert not match_chain([(0, "A.step"), (4, "B.run"), (4, "C.fwd")], calls)     # C is B's callee, not sibling
    assert not match_chain([(0, "A.step"), (4, "X.made_up")], calls)


def test_criteria_decide_the_conclusion_and_need_bounds_from_the_data(tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "s.csv").write_text("group,ms,tok\na,2.0,5000\nb,3.0,4000\n", encoding="utf-8")
    cite = "results/s.csv[{}].{}"

    def run(criterion: str, conclusion: str):
        return criterion_lines(f"判据：`{criterion}`", conclusion, tmp_path)
    assert run(f"{cite.format('b', 'ms')} < 4 × {cite.format('a', 'ms')}", "成立") == (
        ["on your data `results/s.csv[b].ms < 4 × results/s.csv[a].ms`: 3 < 8 is True: 成立, as the conclusion says"], [])
    assert run(f"{cite.format('b', 'ms')} < {cite.format('a', 'ms')}", "成立")[1]          # false on the data
    assert not run(f"{cite.format('b', 'ms')} < {cite.format('a', 'ms')}", "被否定")[1]
    assert "no measurement near yours" in run(f"{cite.format('a', 'tok')} < 100000", "成立")[1][0]
    assert not run(f"{cite.format('a', 'tok')} < 20000", "成立")[1]                        # 4x: derived
    assert "outside 0.1..10" in run(f"{cite.format('a', 'ms')} < 50 × {cite.format('b', 'ms')}", "成立")[1][0]
    assert "has no row" in run(f"{cite.format('z', 'ms')} < 3", "成立")[1][0]
    assert "states no criterion" in criterion_lines("如果超过 100000 就被否定", "成立", tmp_path)[1][0]
    both = criterion_lines(f"判据：`{cite.format('a', 'ms')} < 3` 且 `{cite.format('b', 'ms')} < 3`", "成立", tmp_path)
    assert both[1] and "被否定" in both[1][0]                                              # the second fails


def test_the_png_reader_tells_plots_from_placeholders(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    (tmp_path / "one.png").write_bytes(one_pixel_png())
    assert (read_png(tmp_path / "one.png").width, read_png(tmp_path / "one.png").height) == (1, 1)
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.axis("off")
    fig.savefig(tmp_path / "blank.png", dpi=100)
    ax.axis("on")
    ax.plot([0, 1], [0, 1])
    fig.savefig(tmp_path / "plot.png", dpi=100, metadata={"Source": "results/x.csv"})
    plt.close(fig)
    blank, drawn = read_png(tmp_path / "blank.png"), read_png(tmp_path / "plot.png")
    assert (drawn.width, drawn.height) == (400, 300) and drawn.text["Source"] == "results/x.csv"
    assert blank.drawn_fraction() == 0 and drawn.drawn_fraction() > 0.01
    (tmp_path / "bad.png").write_bytes(one_pixel_png()[:30])
    with pytest.raises(PngError):
        read_png(tmp_path / "bad.png")


def test_ta_marks_must_be_anchors(tmp_path):
    path = tmp_path / "marks.csv"
    path.write_text("student_id,item,points,comment\na,ta_mechanism,7,\n", encoding="utf-8")
    with pytest.raises(MarksError, match="not an anchor of ta_mechanism"):
        read_marks(path, RUBRIC)
    path.write_text("student_id,item,points,comment\na,runs,15,\n", encoding="utf-8")
    with pytest.raises(MarksError, match="not a TA item"):
        read_marks(path, RUBRIC)
    path.write_text("student_id,item,points,comment\na,ta_method,3,ok\na,ta_reading,,\n", encoding="utf-8")
    assert {k: {i: m.points for i, m in v.items()} for k, v in read_marks(path, RUBRIC).items()} == {"a": {"ta_method": 3}}


def test_a_rubric_item_without_its_inputs_is_refused():
    from labkit.rubric import RubricError, parse_rubric
    base = {"id": "x", "title": "x", "points": 100, "kind": "report", "files": ["report.md"]}
    for extra, message in (({"check": "vibes"}, "check must be one of"),
                           ({"check": "tables", "evidence": ["results/*.csv"]}, "names the report sections"),
                           ({"check": "call_chain", "sections": ["调用链"]}, "names its evidence files")):
        with pytest.raises(RubricError, match=message):
            parse_rubric({"lab": "lab9", "items": [{**base, **extra}]}, Path("rubric.json"))
    ta = {"id": "t", "title": "t", "points": 100, "kind": "ta"}
    for anchors in (None, [{"points": 100, "means": "all"}], [{"points": 0, "means": "x"}, {"points": 50, "means": "y"}]):
        with pytest.raises(RubricError, match="anchors"):
            parse_rubric({"lab": "lab9", "items": [{**ta, "anchors": anchors}]}, Path("rubric.json"))


def test_evidence_outside_the_submission_is_not_read(tmp_path):
    from grading.report_content import check_figures, citation_problems
    outside, folder = tmp_path / "outside", tmp_path / "sub"
    (outside / "results").mkdir(parents=True)
    (outside / "results" / "x.csv").write_text("name,v\na,1\n")
    (outside / "f.png").write_bytes(one_pixel_png())
    (folder / "results").mkdir(parents=True)
    (folder / "results" / "x.csv").write_text("name,v\na,1\n")
    (folder / "figures").symlink_to(outside)
    assert citation_problems("`results/x.csv[a].v = 1`", folder) == (1, [])
    good, problems = citation_problems("`results/../../outside/results/x.csv[a].v = 1`", folder)
    assert good == 0 and "was not submitted" in problems[0]
    assert check_figures("![f](figures/f.png)", folder, {"min_count": 1})[0].startswith("MISSING figures/f.png")
