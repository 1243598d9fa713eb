"""Every reference in a release resolves inside the release (courseware/release_refs.py; issue 33).

Checked on a fresh release of each lab: documents (`docs/architecture.md`, `docs/design.md §2`), paths under
assignments/, tutorials/ and slides_code/, modules run with `python -m` (lab 5's handout runs
`python -m slides_code.call_chain`, which its release did not ship), tutorials (`T02`, `Tutorial 05`, `T04 第 2 节`: shipped, and for a later lab's
tutorial outside the handout, explained in the README) and numbered rules (`Edge cases 1 and 8`). The checker
is shown to fire on each kind of dangling reference, so a clean release is not a checker that sees nothing.
"""
from __future__ import annotations

import json
import shutil

import pytest

from courseware.release import make_release
from courseware.release_refs import references, unresolved
from labkit.labs import all_labs

RELEASED = [lab.lab_id for lab in all_labs()]      # every lab has a release (lab 5's: the whole engine, no regions)


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    base = tmp_path_factory.mktemp("references")
    return {lab: make_release(lab, base / lab) for lab in RELEASED}


@pytest.mark.parametrize("lab", RELEASED)
def test_every_reference_in_a_release_resolves_there(releases, lab):
    assert unresolved(releases[lab]) == []
    found = {r.text for r in references(releases[lab])}
    assert any(text.startswith("docs/design.md") for text in found), "the release's files cite the design doc"
    assert any(text.startswith("T0") for text in found), "the handout's tutorials are references too"


def test_lab5s_handout_runs_a_slide_script_its_release_ships(releases):
    cited = {r.text for r in references(releases["lab5"]) if r.path.endswith("lab5_performance/README.md")}
    assert "python -m slides_code.call_chain" in cited
    assert (releases["lab5"] / "slides_code" / "call_chain.py").is_file()


def test_the_public_tests_cite_documents_the_release_ships(releases):
    cited = {r.text for r in references(releases["lab1"]) if r.path.startswith("student_exercises/tests/")}
    assert "docs/architecture.md" in cited, "lab_fakes.py writes its doubles from docs/architecture.md"
    assert (releases["lab1"] / "docs" / "architecture.md").is_file()
    rubric = {r.text for r in references(releases["lab3"]) if r.path.endswith("rubric.json")}
    assert any(text.startswith("Edge case") for text in rubric), rubric


def test_the_checker_finds_each_kind_of_dangling_reference(releases, tmp_path):
    release = tmp_path / "release"
    shutil.copytree(releases["lab1"], release)
    handout = release / "assignments" / "lab1_lifecycle" / "README.md"
    handout.write_text(handout.read_text(encoding="utf-8") + "\n见 **T06** 的第 4 节、T02 第 9 节和 docs/nowhere.md；"
                       "再跑 `python -m slides_code.tensor_parallel` 和 `slides_code/call_chain.py`。\n",
                       encoding="utf-8")
    test = release / "student_exercises" / "tests" / "test_lab1_metrics.py"
    test.write_text(test.read_text(encoding="utf-8")
                    + '\n"""DESIGN 3; Edge cases 1 and 12; docs/design.md §9; tutorials/Tutorial_99_x.ipynb."""\n',
                    encoding="utf-8")
    readme = release / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8").replace("  - `Tutorial_07_model_runner.ipynb`", "  - gone"),
                      encoding="utf-8")
    notebook = release / "tutorials" / "Tutorial_01_intro.ipynb"
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    nb["cells"].append({"cell_type": "markdown", "id": "extra", "metadata": {}, "source": "Tutorial 07 shows more."})
    notebook.write_text(json.dumps(nb), encoding="utf-8")
    problems = "\n".join(unresolved(release))
    for expected in ("cites tutorial 06", "Tutorial_02_lifecycle.ipynb has no section 9", "docs/nowhere.md is not",
                     "no rule is called DESIGN N", "no edge case 12", "docs/design.md has no section 9",
                     "tutorials/Tutorial_99_x.ipynb is not", "tutorial 07 is neither shipped nor explained",
                     "module slides_code.tensor_parallel is not in the release", "slides_code/call_chain.py is not"):
        assert expected in problems, f"{expected!r} not reported:\n{problems}"
