"""Write tutorials/Tutorial_NN_*.ipynb, the student edition, from the sources in tutorials/src/.

The sources (percent format, courseware/tutorial_source.py describes the cell
markers) hold everything: the lesson, the class exercises, the 参考答案 (cells
marked `answer`) and the instructor notes (`markdown instructor`). The notebooks
written here are what students are given or shown: the student edition
(courseware/editions.py), without outputs, so no answer and no instructor note
is in a file a student can open. `inferlab build` makes the instructor edition
from the sources themselves.

The sources also run as plain scripts (`python tutorials/_run_source.py
tutorials/src/Tutorial_01_intro.py`), which is how the tutorials are checked on
a machine that has a GPU but no Jupyter.

Usage:
    python tutorials/_make_notebooks.py            # (re)write every notebook
    python tutorials/_make_notebooks.py --check    # exit 1 if a notebook is stale
    python tutorials/_make_notebooks.py --instructor DIR   # the full notebooks, answers and notes included,
                                                           # into DIR (outside the repository) to teach from
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from courseware.editions import edition
from courseware.tutorial_source import SOURCE_DIR, build_notebook

HERE = Path(__file__).resolve().parent
SOURCES = HERE / SOURCE_DIR


def student_notebook(source_path: Path) -> nbformat.NotebookNode:
    """The committed notebook of one source: its student edition, without outputs."""
    nb = edition(build_notebook(source_path), "student")
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def source_files() -> list[Path]:
    return sorted(SOURCES.glob("Tutorial_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale notebooks instead of writing them")
    parser.add_argument("--instructor", metavar="DIR", type=Path,
                        help="write the full notebooks (answers, instructor notes) into DIR instead")
    args = parser.parse_args(argv)
    if args.instructor:
        if args.instructor.resolve().is_relative_to(HERE.parent.resolve()):
            parser.error("--instructor DIR must be outside the repository: the notebooks there are given to students")
        args.instructor.mkdir(parents=True, exist_ok=True)
        for src in source_files():
            (args.instructor / f"{src.stem}.ipynb").write_text(render(build_notebook(src)), encoding="utf-8")
            print(f"wrote {args.instructor / (src.stem + '.ipynb')}")
        return 0
    stale = []
    for src in source_files():
        target = HERE / f"{src.stem}.ipynb"
        text = render(student_notebook(src))
        if args.check:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                stale.append(target.name)
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {target.relative_to(HERE.parent)}")
    orphans = {p.stem for p in HERE.glob("Tutorial_*.ipynb")} - {s.stem for s in source_files()}
    if orphans:
        print(f"notebooks without a source: {sorted(orphans)}", file=sys.stderr)
        return 1
    if stale:
        print(f"stale notebooks (run python tutorials/_make_notebooks.py): {stale}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
