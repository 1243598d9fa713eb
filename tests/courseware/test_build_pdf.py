"""`inferlab build`'s PDFs, editions and experiments folder.

The PDF checks read the printed file back (poppler's pdftotext / pdffonts), so
a missing CJK font (boxes instead of characters) or a clipped page fails here.
They need the Debian packages `chromium`, `fonts-noto-cjk` and `poppler-utils`
and skip without them; .ci/run installs them and checks they are there, so in
CI these tests run.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest

from courseware import pdf
from courseware.codewrap import MARK
from courseware.build import build_assignment, build_tutorial, find_tutorials
from courseware.editions import edition
from courseware.tutorial_source import build_notebook, source_of
from labkit.labs import all_labs, release_labs
from courseware.release_tutorials import TUTORIAL_LAB, tutorial_number, tutorials_for

ROOT = Path(__file__).resolve().parents[2]
NAMED_BY_LECTURES = {"Tutorial_02_lifecycle": "Tutorial_02_请求生命周期与PrefillDecode",
                     "Tutorial_06_architecture": "Tutorial_06_推理系统架构"}

needs_pdf_tools = pytest.mark.skipif(
    not (any(shutil.which(b) for b in pdf.BROWSERS) and pdf.cjk_fonts() and shutil.which("pdftotext")),
    reason="needs chromium, fonts-noto-cjk and poppler-utils (apt-get install; .ci/run installs them)")


def _tutorial(stem: str) -> Path:
    return next(p for p in find_tutorials(ROOT) if p.stem == stem)


@needs_pdf_tools
@pytest.mark.slow
@pytest.mark.parametrize("stem", sorted(NAMED_BY_LECTURES))
def test_named_pdfs_hold_chinese_text_on_a4_with_embedded_fonts(stem, tmp_path):
    """Rendered without executing (the execution is test_tutorials' job): the layout and the fonts are checked here."""
    result, nb = build_tutorial(_tutorial(stem), tmp_path, execute=False, pdf=True)
    student, instructor = result.pdfs["student"], result.pdfs["instructor"]
    assert student == tmp_path / "tutorials" / f"{NAMED_BY_LECTURES[stem]}.pdf"
    assert instructor == tmp_path / "instructor" / "tutorials" / f"{NAMED_BY_LECTURES[stem]}.pdf"
    first_page = pdf.pdf_text(student, 1, 1)
    heading = next(c.source for c in nb.cells if c.cell_type == "markdown").splitlines()[0].lstrip("# ")
    chinese = re.findall(r"[\u4e00-\u9fff]+", heading)          # e.g. 请求生命周期, 推理系统架构
    assert chinese and all(run in first_page for run in chinese), (chinese, first_page[:300])
    fonts = pdf.pdf_fonts(student)
    assert fonts and all(f["emb"] == "yes" for f in fonts), fonts
    info = pdf.subprocess.run(["pdfinfo", str(student)], capture_output=True, text=True).stdout
    assert "(A4)" in info
    # The answers are in the instructor's PDF only.
    assert "参考答案" not in pdf.pdf_text(student) and "参考答案" in pdf.pdf_text(instructor)


def _printed(tmp_path, cells, execute=False) -> Path:
    """The student PDF of a one-off notebook of these cells."""
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    path = tmp_path / "Tutorial_98_check.ipynb"
    nbformat.write(nb, path)
    result, _ = build_tutorial(path, tmp_path / "out", execute=execute, pdf=True, editions=("student",))
    assert result.error is None, result.error
    return result.pdfs["student"]


@needs_pdf_tools
def test_long_code_lines_wrap_at_token_boundaries_with_a_mark(tmp_path):
    marker = "".join(f"w{i:03d}" for i in range(60))     # 240 characters, no spaces: must be cut inside
    call = "result = engine_factory(" + ", ".join(f"max_num_batched_tokens_{i}=value_{i}" for i in range(6)) + ")"
    printed = _printed(tmp_path, [nbformat.v4.new_markdown_cell("# 标题"),
                                  nbformat.v4.new_code_cell(f"x = '{marker}'\n{call}")])
    lines = pdf.pdf_text(printed).splitlines()
    text = "".join("".join(lines).replace(MARK, "").split())
    assert marker in text and "".join(call.split()) in text     # every character printed, none clipped
    call_lines = [line for line in lines if "max_num_batched_tokens" in line or "value_" in line]
    assert len(call_lines) >= 2 and all(line.rstrip().endswith(MARK) for line in call_lines[:-1])
    names = set(re.findall(r"\w+", call))
    for line in call_lines:             # a broken line ends, and its continuation starts, on a whole name
        words = re.findall(r"\w+", line.replace(MARK, ""))
        assert words[0] in names and words[-1] in names, line


@needs_pdf_tools
def test_mixed_chinese_english_lines_read_back_as_written(tmp_path):
    """pdftotext gives each mixed line as in the source: no Type 3 font splits it (courseware/fonts.py)."""
    lines = ["推理系统架构：control plane 与 data plane",
             "把 TTFT 拆成三段：queue（排队）+ schedule（调度开销）+ prefill",
             'print(f"请求 {seq_id}: 排队 {queue * 1e3:.2f} ms")  # tiny model：单线程更快']
    printed = _printed(tmp_path, [nbformat.v4.new_markdown_cell(f"## {lines[0]}\n\n{lines[1]}"),
                                  nbformat.v4.new_code_cell(lines[2])])
    prose = [" ".join(line.split()) for line in pdf.pdf_text(printed).splitlines()]
    code = [" ".join(line.split()) for line in pdf.pdf_text(printed, layout=True).splitlines()]
    for line, extracted in zip(lines, (prose, prose, code)):
        assert " ".join(line.split()) in extracted, (line, extracted)
    types = {f["type"] for f in pdf.pdf_fonts(printed)}
    assert types == {"CID TrueType"}, types


@needs_pdf_tools
def test_figure_labels_print_at_the_size_the_figure_sets(tmp_path):
    """A figure no wider than the column prints its labels at their size; a wider one shrinks them, which is
    why the tutorials' figures are at most 7 inches wide (test_tutorials checks each at 8 pt or more)."""
    code = ("import matplotlib.pyplot as plt\n"
            "fig, ax = plt.subplots(figsize=(4, 2))\n"
            "ax.set_xlabel('eightpoint', fontsize=8)\nax.set_title('sixpoint', fontsize=6)\nplt.show()\n"
            "fig, ax = plt.subplots(figsize=(14, 2))\nax.set_xlabel('widelabel', fontsize=10)\nplt.show()")
    printed = _printed(tmp_path, [nbformat.v4.new_markdown_cell("# 图"), nbformat.v4.new_code_cell(code)],
                       execute=True)
    sizes = dict(pdf.figure_text(printed))
    assert sizes["eightpoint"] == 8 and sizes["sixpoint"] == 6, sizes
    assert sizes["widelabel"] < 8, sizes           # 10 pt in a 14-inch figure, shrunk to the column


@needs_pdf_tools
def test_formulas_are_typeset_not_printed_as_tex(tmp_path):
    source = "TTFT 的分解：$T_{\\text{queue}} + T_{\\text{prefill}}$，以及\n\n$$\\frac{B}{b} \\cdot 2$$\n\n`$PATH` 是代码"
    printed = _printed(tmp_path, [nbformat.v4.new_markdown_cell(source)])
    page = printed.with_suffix(".html").read_text(encoding="utf-8")
    assert page.count('class="katex"') == 2 and "katex-display" in page
    text = pdf.pdf_text(printed)
    assert "\\frac" not in text and "\\text" not in text and "$PATH" in text
    assert text.count("$") == 1, text                  # only the code span keeps its dollar sign


def test_missing_browser_names_the_package(monkeypatch):
    monkeypatch.setenv("INFERLAB_CHROMIUM", "no-such-browser-here")
    with pytest.raises(pdf.PdfToolMissing, match="apt-get install .*chromium"):
        pdf.find_browser()


def test_missing_cjk_font_names_the_package(monkeypatch, tmp_path):
    if shutil.which("fc-list") is None:
        pytest.skip("no fontconfig: cjk_fonts() is empty anyway")
    config = tmp_path / "fonts.conf"        # a fontconfig that knows no font directory
    config.write_text(f'<?xml version="1.0"?><fontconfig><cachedir>{tmp_path}</cachedir></fontconfig>')
    monkeypatch.setenv("FONTCONFIG_FILE", str(config))
    with pytest.raises(pdf.PdfToolMissing, match="fonts-noto-cjk"):
        pdf.require_cjk_font()


def test_student_edition_drops_answers_and_instructor_notes():
    nb = build_notebook(source_of(_tutorial("Tutorial_02_lifecycle")))
    tagged = [c for c in nb.cells if {"answer", "instructor"} & set(c.metadata.get("tags", []))]
    student, instructor = edition(nb, "student"), edition(nb, "instructor")
    assert tagged and len(student.cells) == len(nb.cells) - len(tagged)
    assert not any("参考答案" in c.source for c in student.cells)
    assert len(instructor.cells) == len(nb.cells)
    assert not any(c.metadata.get("jupyter", {}).get("source_hidden") for c in instructor.cells)
    with pytest.raises(ValueError, match="unknown edition"):
        edition(nb, "teacher")


def test_assignment_package_is_per_term_and_public_only(tmp_path):
    target = build_assignment(ROOT, tmp_path, term="fall-2026")
    assert target == tmp_path / "assignment_fall-2026"
    labs = sorted(p.name for p in target.iterdir())
    assert labs == sorted(p.name for p in (ROOT / "assignments").glob("lab*_*") if p.is_dir())
    assert (target / "lab1_lifecycle" / "README.md").is_file()
    lab5 = target / "lab5_performance" / "assignments" / "lab5_performance"      # lab 5's is a release too
    assert (lab5 / "report_template.md").is_file()
    assert (lab5 / "lab5_run.py").is_file()     # the handout's commands need it
    private = {"hidden", "golden.json", "bugzoo", "private", "reference", "src"}
    assert not [p for p in target.rglob("*") if p.name in private]
    notebooks = []
    for lab in all_labs(ROOT):                          # each release ships the tutorials its lab may run
        shipped = sorted(p.name for p in (target / lab.folder.name / "tutorials").glob("Tutorial_*.ipynb"))
        expected = sorted(p.name for p in tutorials_for(lab.lab_id, ROOT)[0]) if lab.lab_id in release_labs() else []
        assert shipped == expected, lab.lab_id
        notebooks += sorted((target / lab.folder.name / "tutorials").glob("Tutorial_*.ipynb"))
    owners_with_releases = {p.name for p in find_tutorials(ROOT) if TUTORIAL_LAB[tutorial_number(p)] in release_labs()}
    assert {p.name for p in notebooks} == owners_with_releases, "every tutorial reaches its students"
    for path in notebooks:                              # the student cut: exercises, no answers
        nb = nbformat.read(path, as_version=4)
        text = "".join(c.source for c in nb.cells)
        assert "课堂练习" in text and "参考答案" not in text and "教师注释" not in text, path.name
