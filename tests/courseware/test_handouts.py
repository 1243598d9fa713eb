"""The lab handouts (assignments/labN_*/README.md) and lab 5's materials agree with the code they describe.

- every exercise region a handout names exists, and each region of labs 1-4 is listed in its own lab's
  handout together with the file a student edits;
- every handout has the required sections, in order;
- point values in a handout never contradict the lab's rubric file (and none are stated without one);
- lab 5: the report template has the sections the handout promises (and any report rubric requires); the
  nbgrader source notebook is current, carries valid nbgrader metadata and runs top to bottom with its
  solutions; the experiment script runs;
- the real handouts render to HTML through `inferlab build`'s handout path.

The checks are plain functions returning a list of problems, so `test_checks_catch_broken_inputs` can show
that each of them fails on a broken handout, template or notebook.
"""
from __future__ import annotations

import copy
import csv
import importlib.util
import json
import re
from pathlib import Path

import nbformat
import pytest

from courseware.build import build_handouts, execute_notebook
from labkit.tree import PACKAGE, REFERENCE, ROOT, load_reference
from labkit.labs import all_labs, exercise_labs
from labkit.labs import lab_folder as registry_folder

LABS = tuple(lab.lab_id for lab in all_labs())
CODE_LABS = tuple(exercise_labs())

COMMON = ("目标", "背景")
CODE_LAB_SECTIONS = COMMON + ("要实现的 regions", "如何测试与自测", "评分方式", "常见错误", "时间估计")
LAB5_SECTIONS = COMMON + ("实验内容", "如何测试与自测", "评分方式", "报告模板", "常见错误", "时间估计")
REPORT_SECTIONS = ("调用链", "表格", "日志", "可否定的解释")

REGION_ID = re.compile(r"(?<![\w.])lab[1-9]\.[a-z_][a-z0-9_]*")
POINT_ROW = re.compile(r"^\|\s*`([A-Za-z0-9_.-]+)`\s*\|.*\|\s*(\d+)\s*\|\s*$")
POINTS_IN_PROSE = re.compile(r"\d+\s*(?:分(?![钟析布组类])|points?\b)")
GRADE_ID = re.compile(r"^[A-Za-z0-9_-]+$")
NOTEBOOK_LIMIT_S = 60


def lab_folder(lab: str) -> Path:
    return registry_folder(lab)


def handout(lab: str) -> str:
    return (lab_folder(lab) / "README.md").read_text(encoding="utf-8")


def rubric_items(lab: str) -> list[dict] | None:
    """The items of the lab's rubric file (rubric.json or rubric.toml), or None when there is none yet."""
    folder = lab_folder(lab)
    if (folder / "rubric.json").is_file():
        return json.loads((folder / "rubric.json").read_text(encoding="utf-8"))["items"]
    if (folder / "rubric.toml").is_file():
        import tomllib
        return tomllib.loads((folder / "rubric.toml").read_text(encoding="utf-8"))["items"]
    others = [p.name for p in folder.glob("rubric.*")]
    assert not others, f"{folder.name}: rubric file(s) {others} in a format this test cannot read"
    return None


# --------------------------------------------------------------------------- checks (text in, problems out)

def sections(markdown: str) -> dict[str, str]:
    """`## ` heading title -> the text up to the next `## ` heading (fenced code is not scanned for headings)."""
    out: dict[str, str] = {}
    title, body, fenced = None, [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            if title is not None:
                out[title] = "\n".join(body)
            title, body = line[3:].strip(), []
        elif title is not None:
            body.append(line)
    if title is not None:
        out[title] = "\n".join(body)
    return out


def section(markdown: str, name: str) -> str:
    return next((body for title, body in sections(markdown).items() if title.startswith(name)), "")


def section_problems(markdown: str, required: tuple[str, ...]) -> list[str]:
    titles = list(sections(markdown))
    found = []
    problems = []
    for name in required:
        index = next((i for i, title in enumerate(titles) if title.startswith(name)), None)
        if index is None:
            problems.append(f"no '## {name}' section")
        else:
            found.append((index, name))
    if [name for _, name in sorted(found)] != [name for _, name in found]:
        problems.append(f"sections out of order: expected {list(required)}, found {titles}")
    return problems


def unknown_region_problems(markdown: str, known: set[str]) -> list[str]:
    return [f"names region {rid}, which no EXERCISE marker in {REFERENCE}/ defines"
            for rid in sorted(set(REGION_ID.findall(markdown)) - known)]


def region_row_problems(markdown: str, regions: list[tuple[str, str]]) -> list[str]:
    """Each (region id, student file) must share a line of the '要实现的 regions' section."""
    lines = section(markdown, "要实现的 regions").splitlines()
    problems = []
    for region_id, path in regions:
        if not any(f"`{region_id}`" in line and f"`{path}`" in line for line in lines):
            problems.append(f"region {region_id} is not listed with its file {path} under '要实现的 regions'")
    return problems


def points_problems(markdown: str, items: list[dict] | None) -> list[str]:
    """Points stated in '评分方式' must be the rubric's; with no rubric, none may be stated."""
    grading = section(markdown, "评分方式")
    rows = {m[1]: int(m[2]) for m in (POINT_ROW.match(line) for line in grading.splitlines()) if m}
    if items is None:
        stated = [f"`{rid}` = {points}" for rid, points in rows.items()] + POINTS_IN_PROSE.findall(grading)
        return [f"states points ({', '.join(stated)}) but the lab has no rubric file"] if stated else []
    rubric = {item["id"]: item["points"] for item in items}
    problems = [f"item `{rid}`: {points} points in the handout, {rubric.get(rid, 'no such item')} in the rubric"
                for rid, points in rows.items() if rubric.get(rid) != points]
    if rows and set(rows) != set(rubric):
        problems.append(f"the points table lists {sorted(rows)}, the rubric has {sorted(rubric)}")
    return problems


def template_headings(template: str) -> list[str]:
    return [re.sub(r"^\d+\.\s*", "", title) for title in sections(template)]


def template_problems(template: str, lab5_handout: str, report_items: list[dict]) -> list[str]:
    headings = template_headings(template)
    problems = [f"report template has no '{name}' section" for name in REPORT_SECTIONS
                if not any(name in h for h in headings)]
    described = section(lab5_handout, "报告模板")
    problems += [f"the handout's 报告模板 section does not describe the template's section '{h}'"
                 for h in headings if h not in described]
    for item in report_items:
        for wanted in item.get("headings", []):
            if not any(wanted.lower() in h.lower() for h in headings):
                problems.append(f"rubric item {item['id']} requires a section '{wanted}' the template lacks")
    return problems


def _marker_problems(source: str, begin: str, end: str, where: str) -> list[str]:
    depth, problems = 0, []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped == begin:
            if depth:
                problems.append(f"{where}: '{begin}' inside another")
            depth = 1
        elif stripped == end:
            if not depth:
                problems.append(f"{where}: '{end}' without '{begin}'")
            depth = 0
    if depth:
        problems.append(f"{where}: '{begin}' without '{end}'")
    return problems


def nbgrader_problems(nb) -> list[str]:
    """nbgrader schema 3 cell metadata, unique grade ids, positive points, balanced solution / hidden-test markers."""
    problems, seen = [], set()
    autograded = manual = 0
    if nb.metadata.get("kernelspec", {}).get("name") != "python3":
        problems.append("kernelspec name is not python3 (nbgrader is configured with kernel python3)")
    for index, cell in enumerate(nb.cells):
        source = cell.source
        meta = cell.metadata.get("nbgrader")
        where = f"cell {index}" + (f" ({meta.get('grade_id')})" if meta else "")
        if meta is None:
            if "### BEGIN" in source or "### END" in source:
                problems.append(f"{where}: solution or hidden-test markers in a cell nbgrader does not manage")
            continue
        if meta.get("schema_version") != 3:
            problems.append(f"{where}: schema_version {meta.get('schema_version')!r}, expected 3")
        grade_id = meta.get("grade_id")
        if not isinstance(grade_id, str) or not GRADE_ID.match(grade_id):
            problems.append(f"{where}: grade_id {grade_id!r} is not a word of letters, digits, '_' or '-'")
        elif grade_id in seen:
            problems.append(f"{where}: grade_id {grade_id} used twice")
        seen.add(grade_id)
        grade, solution = meta.get("grade", False), meta.get("solution", False)
        if grade and not (isinstance(meta.get("points"), (int, float)) and meta["points"] > 0):
            problems.append(f"{where}: graded cell with points {meta.get('points')!r} (must be > 0)")
        if grade and not solution:
            autograded += 1
            if cell.cell_type != "code" or not meta.get("locked"):
                problems.append(f"{where}: an autograded test cell must be a locked code cell")
        if grade and solution:
            manual += 1
        if solution and cell.cell_type == "code" and "### BEGIN SOLUTION" not in source:
            problems.append(f"{where}: code answer cell without '### BEGIN SOLUTION'")
        if not solution and "SOLUTION" in source:
            problems.append(f"{where}: solution markers in a cell that is not a solution cell")
        if "HIDDEN TESTS" in source and not (grade and not solution):
            problems.append(f"{where}: hidden tests outside an autograded test cell")
        problems += _marker_problems(source, "### BEGIN SOLUTION", "### END SOLUTION", where)
        problems += _marker_problems(source, "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS", where)
    if not autograded:
        problems.append("no autograded test cell")
    if not manual:
        problems.append("no manually graded answer")
    return problems


def _load_script(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --------------------------------------------------------------------------- the real files

@pytest.fixture(scope="module")
def regions():
    return load_reference().regions


def test_each_lab_has_one_folder_with_a_handout():
    for lab in LABS:
        assert (lab_folder(lab) / "README.md").is_file(), f"{lab_folder(lab)}/README.md missing"


@pytest.mark.parametrize("lab", LABS)
def test_handout_has_the_required_sections(lab):
    required = LAB5_SECTIONS if lab == "lab5" else CODE_LAB_SECTIONS
    assert section_problems(handout(lab), required) == []


def test_handouts_name_only_regions_that_exist(regions):
    known = {r.region_id for r in regions}
    problems = [f"{lab}: {p}" for lab in LABS for p in unknown_region_problems(handout(lab), known)]
    assert problems == []


@pytest.mark.parametrize("lab", CODE_LABS)
def test_every_region_is_listed_in_its_labs_handout_with_its_file(lab, regions):
    own = [(r.region_id, r.path.replace(f"{REFERENCE}/", f"{PACKAGE}/", 1)) for r in regions if r.lab == lab]
    assert own, f"no regions for {lab}"
    assert region_row_problems(handout(lab), own) == []


@pytest.mark.parametrize("lab", LABS)
def test_handout_points_agree_with_the_rubric(lab):
    assert points_problems(handout(lab), rubric_items(lab)) == []


def test_lab5_report_template_matches_the_handout_and_rubric():
    folder = lab_folder("lab5")
    template = (folder / "report_template.md").read_text(encoding="utf-8")
    report_items = [item for item in rubric_items("lab5") or [] if item.get("kind") == "report"]
    assert template_problems(template, handout("lab5"), report_items) == []


def test_lab5_notebook_is_current_and_has_valid_nbgrader_metadata():
    folder = lab_folder("lab5")
    maker = _load_script(folder / "private" / "make_notebook.py", "lab5_make_notebook")
    assert maker.main(["--check"]) == 0, "run python assignments/lab5_performance/private/make_notebook.py"
    nb = nbformat.read(folder / "private" / "source" / "lab5_analysis.ipynb", as_version=4)
    nbformat.validate(nb)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    assert nbgrader_problems(nb) == []
    data = {p.name for p in (folder / "private" / "source").iterdir()}
    assert {"run_a.jsonl", "run_b.jsonl", "runs.json"} <= data, f"data files missing beside the notebook: {data}"


def test_lab5_notebook_runs_top_to_bottom_with_its_solutions():
    path = lab_folder("lab5") / "private" / "source" / "lab5_analysis.ipynb"
    nb, seconds, error = execute_notebook(path, timeout=NOTEBOOK_LIMIT_S)
    assert error is None, error[-3000:]
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "every cell ran"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    tests_run = [c for c in code if c.metadata.get("nbgrader", {}).get("grade")]
    assert tests_run and all("visible checks passed" in "".join(o.get("text", "") for o in c.outputs)
                             for c in tests_run)
    assert seconds < NOTEBOOK_LIMIT_S


def test_lab5_run_script_writes_a_checked_log(tmp_path):
    from reference.metrics import check_lifecycle, read_log
    script = _load_script(lab_folder("lab5") / "lab5_run.py", "lab5_run")
    results = tmp_path / "results"
    result = script.main(["t", "--out", str(tmp_path), "--results", str(results), "--requests", "3",
                          "--warmup", "0", "--num-kvcache-blocks", "32", "--max-num-seqs", "2"])
    events = read_log(tmp_path / "t.jsonl")
    assert check_lifecycle(events) == []
    saved = json.loads((tmp_path / "t.json").read_text(encoding="utf-8"))
    assert saved["summary"]["totals"]["finished"] == 3 and saved["output_tokens"] == result["output_tokens"] > 0
    assert saved["settings"]["max_num_seqs"] == 2 and saved["settings"]["num_kvcache_blocks"] == 32
    with (results / "runs.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["name"], int(r["output_tokens"]), r["max_num_seqs"]) for r in rows] == [("t", result["output_tokens"], "2")]
    with (results / "t_steps.csv").open(encoding="utf-8") as f:
        steps = list(csv.DictReader(f))
    assert [int(r["step"]) for r in steps] == [e["step"] for e in events if e["event"] == "STEP"]
    assert all(float(r["duration_ms"]) > 0 for r in steps[:-1]) and steps[-1]["duration_ms"] == ""


def test_handout_python_snippets_run_against_the_reference(tmp_path, monkeypatch, capsys):
    """Each ```python block of a handout runs (with `student_exercises` read as the solved `reference`)."""
    monkeypatch.chdir(tmp_path)
    ran = 0
    for lab in LABS:
        for block in re.findall(r"^```python\n(.*?)^```", handout(lab), re.S | re.M):
            code = block.replace(f"from {PACKAGE}", f"from {REFERENCE}").replace(f"import {PACKAGE}", f"import {REFERENCE}")
            exec(compile(code, f"{lab} handout snippet", "exec"), {"__name__": "__handout__"})
            ran += 1
    assert ran >= 1
    # lab 1's snippet prints what its comments promise: a legal log, then these metrics.
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[]", out
    assert all(part in out[1] for part in ("queue_time=0.25", "ttft=0.5", "tpot=0.5", "itls=[0.5, 0.5]", "e2e=1.5"))


def test_real_handouts_render_to_html(tmp_path):
    written = build_handouts(ROOT, tmp_path)
    pages = [p for p in written if p.suffix == ".html"]
    assert sorted(p.parent.name for p in pages) == sorted(lab_folder(lab).name for lab in LABS)
    assert tmp_path / "lab5_performance" / "report_template.md" in written
    for page in pages:
        text = page.read_text(encoding="utf-8")
        lab = page.parent.name.split("_", 1)[0]
        for name in (LAB5_SECTIONS if lab == "lab5" else CODE_LAB_SECTIONS):
            assert re.search(rf"<h2>{re.escape(name)}", text), f"{page.name}: no <h2> for {name}"
        assert "<table>" in text, f"{page.name}: no table rendered"
        assert not re.search(r"<p>\s*\|", text) and "| --- |" not in text, f"{page.name}: a table did not render"


# --------------------------------------------------------------------------- the checks can fail

def test_checks_catch_broken_inputs(regions):
    text = handout("lab2")
    assert section_problems(text.replace("## 常见错误", "## 其他"), CODE_LAB_SECTIONS)
    swapped = text.replace("## 目标", "## TMP").replace("## 背景", "## 目标").replace("## TMP", "## 背景")
    assert section_problems(swapped, CODE_LAB_SECTIONS)
    known = {r.region_id for r in regions}
    assert unknown_region_problems(text + "\n`lab2.free_everything`\n", known)
    own = [(r.region_id, r.path.replace(f"{REFERENCE}/", f"{PACKAGE}/", 1)) for r in regions if r.lab == "lab2"]
    assert region_row_problems(text.replace("| `lab2.deallocate` |", "| `lab2.dealloc` |"), own)
    items = [{"id": "allocation", "points": 15}, {"id": "scale", "points": 85}]
    assert points_problems("## 评分方式\n| `allocation` | x | 15 |\n| `scale` | y | 80 |\n", items)
    assert points_problems("## 评分方式\n| `allocation` | x | 15 |\n", items)
    assert points_problems("## 评分方式\n公开测试占 30 分。\n", None)
    assert not points_problems("## 评分方式\n公开测试只用于自测。\n", None)

    template = (lab_folder("lab5") / "report_template.md").read_text(encoding="utf-8")
    renamed, count = re.subn(r"^(## \d+\.\s*)日志", r"\g<1>记录", template, flags=re.M)
    assert count == 1 and template_problems(renamed, handout("lab5"), [])
    assert template_problems(template, handout("lab5"), [{"id": "report", "headings": ["附录"]}])

    nb = nbformat.read(lab_folder("lab5") / "private" / "source" / "lab5_analysis.ipynb", as_version=4)
    graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    answers = [c for c in nb.cells if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")]
    broken = copy.deepcopy(nb)
    broken.cells[nb.cells.index(graded[1])].metadata["nbgrader"]["grade_id"] = graded[0].metadata["nbgrader"]["grade_id"]
    assert any("used twice" in p for p in nbgrader_problems(broken))
    broken = copy.deepcopy(nb)
    broken.cells[nb.cells.index(graded[0])].metadata["nbgrader"]["points"] = 0
    assert any("points" in p for p in nbgrader_problems(broken))
    broken = copy.deepcopy(nb)
    cell = broken.cells[nb.cells.index(answers[0])]
    cell.source = cell.source.replace("### END SOLUTION", "")
    assert any("without '### END SOLUTION'" in p for p in nbgrader_problems(broken))
