"""Build tutorials/Tutorial_NN_*.ipynb from the plain-text sources in tutorials/src/.

Why sources and not notebooks: a notebook is JSON, so a review of a change to it
is a review of escaped strings. Each tutorial is therefore written as a Python
file in "percent" cell format, and this script turns it into a notebook without
outputs (what we commit). The source files also run as plain scripts
(`python tutorials/src/Tutorial_01_intro.py`), which is how the tutorials are
checked on a machine that has a GPU but no Jupyter.

Cell markers (a line on its own):

    # %% [markdown]             a markdown cell; every line starts with "# " (or is "#")
    # %%                        a code cell
    # %% [answer]               a code cell holding a 参考答案: its source starts collapsed
                                in JupyterLab, so students try the exercise first
    # %% [markdown answer]      a markdown cell of the 参考答案 (its heading, its prose)
    # %% [markdown instructor]  a note for the instructor: minutes per section, expected numbers

Cells tagged `answer` or `instructor` are left out of the student edition that
`inferlab build` renders (courseware/editions.py); the notebook keeps them all.

The header (lines before the first marker) names the tutorial as the lectures
cite it: a line `# title: 请求生命周期与PrefillDecode` becomes the notebook's
metadata `inferlab.title`, and `inferlab build` names the PDF
`Tutorial_02_请求生命周期与PrefillDecode.pdf` after it.

Usage:
    python tutorials/_make_notebooks.py            # (re)write every notebook
    python tutorials/_make_notebooks.py --check    # exit 1 if a notebook is stale
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
MARKER = "# %%"
# marker text -> (cell type, tags)
KINDS = {"": ("code", ()), "[markdown]": ("markdown", ()), "[answer]": ("code", ("answer",)),
         "[markdown answer]": ("markdown", ("answer",)), "[markdown instructor]": ("markdown", ("instructor",))}
TITLE = "# title:"


def parse_title(text: str, name: str = "<source>") -> str:
    """The `# title:` line of the header (before the first cell marker)."""
    for line in text.splitlines():
        if line.startswith(MARKER):
            break
        if line.startswith(TITLE) and line[len(TITLE):].strip():
            return line[len(TITLE):].strip()
    raise ValueError(f"{name}: no '{TITLE} ...' line before the first cell (it names the PDF)")


def parse_cells(text: str, name: str = "<source>") -> list[tuple[str, str, tuple[str, ...]]]:
    """Split a percent-format source into (cell type, source, tags); the header before the first marker is dropped."""
    cells: list[tuple[str, tuple[str, ...], list[str]]] = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.startswith(MARKER):
            tag = line[len(MARKER):].strip()
            if tag not in KINDS:
                raise ValueError(f"{name}:{lineno}: unknown cell marker {line!r} (known: {sorted(KINDS)})")
            cells.append((*KINDS[tag], []))
        elif cells:
            cells[-1][2].append(line)
    out = []
    for kind, tags, lines in cells:
        if kind == "markdown":
            stripped = []
            for line in lines:
                if line and not line.startswith("#"):
                    raise ValueError(f"{name}: markdown line does not start with '#': {line!r}")
                stripped.append(line[2:] if line.startswith("# ") else line[1:])
            lines = stripped
        source = "\n".join(lines).strip("\n")
        if source.strip():
            out.append((kind, source, tags))
    return out


def build_notebook(source_path: Path) -> nbformat.NotebookNode:
    """The notebook for one source file, with stable cell ids so regenerating changes nothing."""
    stem = source_path.stem
    nb = nbformat.v4.new_notebook()
    text = source_path.read_text(encoding="utf-8")
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "inferlab": {"title": parse_title(text, source_path.name)},
    }
    for i, (kind, source, tags) in enumerate(parse_cells(text, source_path.name)):
        cell_id = f"{stem.split('_')[1]}-{i:03d}"
        if kind == "markdown":
            cell = nbformat.v4.new_markdown_cell(source, id=cell_id)
            if tags:
                cell.metadata = {"tags": list(tags)}
        else:
            cell = nbformat.v4.new_code_cell(source, id=cell_id)
            if tags:
                cell.metadata = {"jupyter": {"source_hidden": True}, "tags": list(tags)}
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(nb: nbformat.NotebookNode) -> str:
    return nbformat.writes(nb) + "\n"


def source_files() -> list[Path]:
    return sorted(SOURCES.glob("Tutorial_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale notebooks instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for src in source_files():
        target = HERE / f"{src.stem}.ipynb"
        text = render(build_notebook(src))
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
