"""`inferlab build`: execute the tutorials and render them, and the lab handouts, to HTML and PDF.

Instructors project the tutorials in class or hand them out; the pages must show
what the code really printed and plotted, so every notebook is executed first
(nbclient, in a fresh kernel, from the `tutorials/` folder) and only then
converted (nbconvert, courseware/templates/inferlab: the lab page without its
CDN scripts). A notebook that fails is still rendered, with its error, and the
command exits non-zero.

What is executed is the instructor's notebook, built from the tutorial's
source (tutorials/src/, courseware/tutorial_source.py): the committed
`.ipynb` files are the student edition and hold no answers. The executed
notebook is cut into two editions (courseware/editions.py), so the
instructor's numbers and the students' pages come from one run, and each
edition is printed to PDF by headless Chromium (courseware/pdf.py). The PDF
names are the ones the lectures cite, `Tutorial_NN_<title>.pdf`, the title
coming from the source's `# title:` line.

Lab handouts (`assignments/*/README.md`) are plain Markdown; they become
standalone HTML pages through mistune, the Markdown parser nbconvert already
depends on, and are printed the same way.

Layout written under OUT (default `build/`, git-ignored):

    OUT/index.html
    OUT/tutorials/Tutorial_NN_<title>.{html,pdf}             student edition (no answers)
    OUT/instructor/tutorials/Tutorial_NN_<title>.{html,pdf}  instructor edition
    OUT/experiments/<lab folder>/README.{html,pdf}           handout (+ report_template.md)
    OUT/experiments/assignment_<term>/<lab folder>/          what students get for each lab
"""
from __future__ import annotations

import copy
import html
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from courseware.editions import EDITIONS, edition
from labkit.labs import all_labs

MISSING_PACKAGES_HINT = "inferlab build needs the notebook packages: pip install -e '.[notebooks]'"
DEFAULT_TIMEOUT = 600
DEFAULT_TERM = "spring-2026"
TEMPLATES = Path(__file__).resolve().parent / "templates"
# Figures are SVG: printed at the size the figure sets (a PNG was stretched to the column width, and a
# 13-inch figure's 8 pt labels printed at 4 pt), their labels text (courseware/templates/matplotlibrc).
FIGURE_FORMAT = "svg"
EDITION_DIRS = {"student": Path("tutorials"), "instructor": Path("instructor") / "tutorials"}


@dataclass
class NotebookResult:
    """What building one tutorial produced: one HTML page per edition, and PDFs when asked."""
    source: Path
    html: Path
    seconds: float
    error: str | None = None
    executed: bool = True
    pages: dict[str, Path] = field(default_factory=dict)     # edition -> HTML
    pdfs: dict[str, Path] = field(default_factory=dict)      # edition -> PDF


@dataclass
class BuildReport:
    out: Path
    notebooks: list[NotebookResult] = field(default_factory=list)
    handouts: list[Path] = field(default_factory=list)
    assignment: Path | None = None

    @property
    def ok(self) -> bool:
        return all(r.error is None for r in self.notebooks)


def _require(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as err:
        raise RuntimeError(f"{MISSING_PACKAGES_HINT} ({err})") from None


def page_css() -> str:
    return (TEMPLATES / "print.css").read_text(encoding="utf-8")


# --------------------------------------------------------------------------- notebooks


def find_tutorials(root: Path, only: list[str] | None = None) -> list[Path]:
    """Tutorial notebooks under root/tutorials, optionally only those whose name contains one of `only`."""
    notebooks = sorted((root / "tutorials").glob("Tutorial_*.ipynb"))
    if only:
        notebooks = [nb for nb in notebooks if any(pattern in nb.stem for pattern in only)]
    return notebooks


def output_stem(path: Path, nb) -> str:
    """`Tutorial_NN_<title>` from the notebook's metadata; the file's own stem when it names no title."""
    title = nb.metadata.get("inferlab", {}).get("title")
    if not title:
        return path.stem
    return f"Tutorial_{path.stem.split('_')[1]}_{title}"


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    # A backend forced from outside (e.g. MPLBACKEND=Agg in CI) would stop the
    # kernel from capturing figures, and the HTML would have no plots.
    env.pop("MPLBACKEND", None)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["MATPLOTLIBRC"] = str(TEMPLATES / "matplotlibrc")     # figures as SVG with text, for print
    return env


def execute_notebook(notebook, folder: Path | None = None, timeout: int = DEFAULT_TIMEOUT):
    """Run a notebook (a path, or a notebook node run in place) top to bottom in a fresh kernel
    started with this interpreter.

    Returns (notebook with outputs, seconds, error text or None). The kernel
    runs in `folder`, by default the notebook file's own folder, as it would in Jupyter.
    """
    nbclient = _require("nbclient")
    manager_module = _require("jupyter_client.manager")
    if isinstance(notebook, (str, os.PathLike)):
        path = Path(notebook)
        nb, folder = _require("nbformat").read(path, as_version=4), folder or path.parent
    else:
        nb = notebook
        if folder is None:
            raise ValueError("execute_notebook: a notebook node needs the folder to run in")
    km = manager_module.KernelManager(kernel_name="python3")
    # Pin the kernel to this interpreter: a user-level "python3" kernelspec may
    # point at another Python that does not have inferlab installed.
    km.kernel_spec.argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}",
                           f"--InlineBackend.figure_formats={FIGURE_FORMAT}"]
    socket_dir = None
    if os.name == "posix":
        # Local sockets instead of TCP ports (no ports to collide, no plain-text TCP warning).
        # The path must be absolute: the kernel runs in the notebook's folder.
        socket_dir = tempfile.mkdtemp(prefix="inferlab-kernel-")
        km.transport = "ipc"
        km.ip = os.path.join(socket_dir, "kernel")
    client = nbclient.NotebookClient(nb, km=km, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(folder)}})
    started = time.perf_counter()
    error = None
    try:
        client.execute(env=_kernel_env())
    except nbclient.exceptions.CellTimeoutError as err:
        error = f"timed out after {timeout} s in one cell: {err}"
    except nbclient.exceptions.CellExecutionError as err:
        error = str(err)
    finally:
        # nbclient leaves a kernel manager it was given running; each kernel holds torch in memory.
        if km.has_kernel:
            km.shutdown_kernel(now=True)
        if socket_dir is not None:
            shutil.rmtree(socket_dir, ignore_errors=True)
    return nb, time.perf_counter() - started, error


def finish_page(page: str, formulas: list[tuple[str, bool]], embed_fonts: bool = False) -> str:
    """A rendered page with its formulas typeset (KaTeX, courseware/formulas.py) and, for a page that will be
    printed, its Chinese font embedded as TrueType (courseware/fonts.py; a few seconds a page, and only the
    PDF's text layer needs it)."""
    from courseware.fonts import font_faces
    from courseware.formulas import put_back, stylesheet, typeset
    from courseware.pdf import cjk_fonts
    page = put_back(page, typeset(formulas))
    css = stylesheet() if formulas else ""
    if embed_fonts and cjk_fonts():
        css += "\n" + font_faces(page)
    return page.replace("</head>", f"<style>\n{css}\n</style>\n</head>", 1)


def notebook_to_html(nb, embed_fonts: bool = False) -> str:
    """One edition as a self-contained page: code wrapped at token boundaries for print
    (courseware/codewrap.py), formulas typeset, fonts embedded."""
    from courseware.codewrap import wrap_notebook
    from courseware.formulas import cut_math
    nbconvert = _require("nbconvert")
    nb = wrap_notebook(copy.deepcopy(nb))
    formulas: list[tuple[str, bool]] = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = cut_math(cell.source, formulas)
    # lang zh: Chromium picks the Chinese glyphs of the CJK font for Han characters.
    exporter = nbconvert.HTMLExporter(template_name="inferlab", extra_template_basedirs=[str(TEMPLATES)],
                                      language_code="zh")
    body, _ = exporter.from_notebook_node(nb, resources={"inferlab_css": page_css()})
    return finish_page(body, formulas, embed_fonts)


def build_tutorial(path: Path, out_dir: Path, execute: bool = True, timeout: int = DEFAULT_TIMEOUT,
                   pdf: bool | tuple[str, ...] = False, editions: tuple[str, ...] = EDITIONS):
    """Execute (unless told not to) and render one tutorial in each edition; returns (NotebookResult, notebook).

    `out_dir` is the build's root: each edition goes to its folder under it (EDITION_DIRS).
    `pdf`: print every edition (True), none (False), or those named.
    """
    printed = editions if pdf is True else tuple(pdf or ())
    from courseware.pdf import html_to_pdf
    from courseware.tutorial_source import instructor_notebook
    nb = instructor_notebook(path)
    if execute:
        nb, seconds, error = execute_notebook(nb, path.parent, timeout)
    else:
        seconds, error = 0.0, None
    stem = output_stem(path, nb)
    result = NotebookResult(path, out_dir / EDITION_DIRS[editions[0]] / f"{stem}.html", seconds, error, execute)
    for which in editions:
        target = out_dir / EDITION_DIRS[which] / f"{stem}.html"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(notebook_to_html(edition(nb, which), embed_fonts=which in printed), encoding="utf-8")
        result.pages[which] = target
        if which in printed:
            result.pdfs[which] = html_to_pdf(target, target.with_suffix(".pdf"))
    return result, nb


# --------------------------------------------------------------------------- handouts

_PAGE = """<!DOCTYPE html>
<html lang="zh-CN">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ max-width: 52em; margin: 2em auto; padding: 0 1em; line-height: 1.6; }}
pre, code {{ font-size: 0.92em; }}
pre {{ background: #f6f8fa; padding: 0.8em; }}
code {{ background: #f6f8fa; padding: 0.1em 0.3em; }}
pre code {{ background: none; padding: 0; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #d0d7de; padding: 0.3em 0.7em; }}
th {{ background: #f6f8fa; }}
{css}
</style>
</head>
<body>
{body}
</body>
</html>
"""


def markdown_to_html(text: str, title: str, embed_fonts: bool = False) -> str:
    """A standalone HTML page for a Markdown document (tables, fenced code, strikethrough, formulas)."""
    from courseware.formulas import cut_math
    mistune = _require("mistune")
    render = mistune.create_markdown(escape=False, plugins=["table", "strikethrough", "url"])
    formulas: list[tuple[str, bool]] = []
    body = render(cut_math(text, formulas))
    return finish_page(_PAGE.format(title=html.escape(title), body=body, css=page_css()), formulas, embed_fonts)


def _title_of(markdown: str, fallback: str) -> str:
    for line in markdown.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return fallback


def build_handouts(root: Path, out_dir: Path, pdf: bool = False) -> list[Path]:
    """<out_dir>/<lab folder>/README.html (and .pdf), with the lab's report template beside it."""
    from courseware.pdf import html_to_pdf
    written = []
    for readme in sorted((root / "assignments").glob("*/README.md")):
        text = readme.read_text(encoding="utf-8")
        folder = out_dir / readme.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / "README.html"
        target.write_text(markdown_to_html(text, _title_of(text, readme.parent.name), embed_fonts=pdf),
                          encoding="utf-8")
        written.append(target)
        if pdf:
            written.append(html_to_pdf(target, target.with_suffix(".pdf")))
        template = readme.parent / "report_template.md"
        if template.is_file():
            shutil.copy2(template, folder / template.name)
            written.append(folder / template.name)
    return written


def build_assignment(root: Path, out_dir: Path, term: str = DEFAULT_TERM) -> Path:
    """<out_dir>/assignment_<term>/<lab folder>/: each lab's student repository (`inferlab release`; lab 5's
    too, with the whole engine), or the lab folder's public parts for a lab with neither exercises nor a rubric."""
    from labkit.labs import release_labs
    from courseware.release import make_release
    target = out_dir / f"assignment_{term}"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for lab in all_labs(root):
        dest = target / lab.folder.name
        if lab.lab_id in release_labs(root):
            make_release(lab.lab_id, dest, root=root)
            continue
        dest.mkdir()
        for source in lab.public_parts():
            if source.is_dir():
                shutil.copytree(source, dest / source.name)
            else:
                shutil.copy2(source, dest / source.name)
    return target


# --------------------------------------------------------------------------- everything


def _link(report: BuildReport, path: Path, label: str) -> str:
    return f'<a href="{path.relative_to(report.out).as_posix()}">{html.escape(label)}</a>'


def _index(report: BuildReport) -> str:
    items = []
    if report.notebooks:
        items.append("<h2>Tutorials</h2><ul>")
        for r in report.notebooks:
            status = "" if r.error is None else " <strong>(failed)</strong>"
            note = f" ({r.seconds:.1f} s)" if r.executed else " (not executed)"
            links = [_link(report, p, f"{which} HTML") for which, p in r.pages.items()]
            links += [_link(report, p, f"{which} PDF") for which, p in r.pdfs.items()]
            items.append(f"<li>{html.escape(r.html.stem)}: {' · '.join(links)}{note}{status}</li>")
        items.append("</ul>")
    if report.handouts:
        items.append("<h2>Experiments</h2><ul>")
        items += [f"<li>{_link(report, p, p.relative_to(report.out).as_posix())}</li>" for p in report.handouts]
        if report.assignment is not None:
            items.append(f"<li>{html.escape(report.assignment.relative_to(report.out).as_posix())}/</li>")
        items.append("</ul>")
    return _PAGE.format(title="InferLab", body="<h1>InferLab</h1>\n" + "\n".join(items), css=page_css())


def check_pdf_tools() -> None:
    """Fail before executing anything when the PDFs could not be printed (PdfToolMissing names the package)."""
    from courseware.pdf import find_browser, require_cjk_font
    find_browser()
    require_cjk_font()


def _write_manifest(report: BuildReport) -> None:
    (report.out / "build.json").write_text(json.dumps({
        "notebooks": [{"name": r.source.name, "html": {k: str(v) for k, v in r.pages.items()},
                       "pdf": {k: str(v) for k, v in r.pdfs.items()}, "seconds": round(r.seconds, 2),
                       "executed": r.executed, "error": r.error} for r in report.notebooks],
        "handouts": [str(p) for p in report.handouts],
        "assignment": str(report.assignment) if report.assignment else None,
    }, indent=2, ensure_ascii=False), encoding="utf-8")


def build(root: str | os.PathLike[str] = ".", out: str | os.PathLike[str] = "build", only: list[str] | None = None,
          execute: bool = True, handouts: bool = True, timeout: int = DEFAULT_TIMEOUT, progress=None,
          pdf: bool = True, term: str = DEFAULT_TERM, assignment: bool = True) -> BuildReport:
    """Render the tutorials (executed) and the handouts under `out`; see the module docstring."""
    root, out = Path(root), Path(out)
    if not (root / "tutorials").is_dir():
        raise FileNotFoundError(f"no tutorials/ folder in {root.resolve()}: run from the repository root or pass --root")
    notebooks = find_tutorials(root, only)
    if only and not notebooks:
        raise ValueError(f"no tutorial matches {only}")
    if pdf:
        check_pdf_tools()
    report = BuildReport(out)
    for path in notebooks:
        if progress:
            progress(f"{'executing' if execute else 'rendering'} {path.name}")
        result, _ = build_tutorial(path, out, execute, timeout, pdf=pdf)
        report.notebooks.append(result)
    if handouts:
        report.handouts = build_handouts(root, out / "experiments", pdf=pdf)
        if assignment:
            report.assignment = build_assignment(root, out / "experiments", term)
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(_index(report), encoding="utf-8")
    _write_manifest(report)
    return report
