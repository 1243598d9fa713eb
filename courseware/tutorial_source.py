"""A tutorial's percent-format source (tutorials/src/Tutorial_NN_<topic>.py) read as a notebook.

Why sources and not notebooks: a notebook is JSON, so a review of a change to it
is a review of escaped strings. Each tutorial is therefore written as a Python
file in "percent" cell format. The source is the instructor's copy: it holds the
参考答案 and the instructor notes. The notebooks committed beside it
(tutorials/Tutorial_NN_*.ipynb, written by tutorials/_make_notebooks.py) are its
student edition, and `inferlab build` makes the instructor edition from the
source itself (courseware/build.py), so no answer sits in a file students are
given or pointed at.

Cell markers (a line on its own):

    # %% [markdown]             a markdown cell; every line starts with "# " (or is "#")
    # %%                        a code cell
    # %% [answer]               a code cell holding a 参考答案
    # %% [markdown answer]      a markdown cell of the 参考答案 (its heading, its prose)
    # %% [markdown instructor]  a note for the instructor: minutes per section, expected numbers

The header (lines before the first marker) names the tutorial as the lectures
cite it: a line `# title: 请求生命周期与PrefillDecode` becomes the notebook's
metadata `inferlab.title`, and `inferlab build` names the PDF
`Tutorial_02_请求生命周期与PrefillDecode.pdf` after it.
"""
from __future__ import annotations

from pathlib import Path

MARKER = "# %%"
# marker text -> (cell type, tags)
KINDS = {"": ("code", ()), "[markdown]": ("markdown", ()), "[answer]": ("code", ("answer",)),
         "[markdown answer]": ("markdown", ("answer",)), "[markdown instructor]": ("markdown", ("instructor",))}
TITLE = "# title:"
SOURCE_DIR = "src"


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


def source_of(notebook_path: Path) -> Path:
    """tutorials/src/Tutorial_02_lifecycle.py for tutorials/Tutorial_02_lifecycle.ipynb (it may not exist)."""
    return notebook_path.parent / SOURCE_DIR / f"{notebook_path.stem}.py"


def build_notebook(source_path: Path):
    """The full notebook (every cell, answers and notes included) for one source, with stable cell ids."""
    import nbformat
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
        else:
            cell = nbformat.v4.new_code_cell(source, id=cell_id)
        if tags:
            cell.metadata = {"tags": list(tags)}
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def instructor_notebook(notebook_path: Path):
    """What `inferlab build` executes for a committed notebook: the full notebook from its source when
    there is one (the course repository), else the notebook file itself (a release, a test's small tree)."""
    import nbformat
    source = source_of(notebook_path)
    if source.is_file():
        return build_notebook(source)
    return nbformat.read(notebook_path, as_version=4)
