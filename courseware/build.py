"""`inferlab build`: execute the tutorials and render them, and the lab handouts, to HTML.

Instructors project the tutorials in class or hand them out; the HTML must show
what the code really printed and plotted, so every notebook is executed first
(nbclient, in a fresh kernel, from the `tutorials/` folder) and only then
converted (nbconvert). A notebook that fails is still rendered, with its error,
and the command exits non-zero.

Lab handouts (`assignments/*/README.md`) are plain Markdown; they become
standalone HTML pages through mistune, the Markdown parser nbconvert already
depends on, so no extra package is needed.

Layout written under OUT (default `build/`, git-ignored):

    OUT/index.html                      links to everything below
    OUT/tutorials/Tutorial_NN_*.html    executed notebooks
    OUT/handouts/<lab folder>.html      one page per assignments/<lab>/README.md
"""
from __future__ import annotations

import html
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

MISSING_PACKAGES_HINT = "inferlab build needs the notebook packages: pip install -e '.[notebooks]'"
DEFAULT_TIMEOUT = 600


@dataclass
class NotebookResult:
    """What building one tutorial produced."""
    source: Path
    html: Path
    seconds: float
    error: str | None = None
    executed: bool = True


@dataclass
class BuildReport:
    out: Path
    notebooks: list[NotebookResult] = field(default_factory=list)
    handouts: list[Path] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.error is None for r in self.notebooks)


def _require(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as err:
        raise RuntimeError(f"{MISSING_PACKAGES_HINT} ({err})") from None


# --------------------------------------------------------------------------- notebooks


def find_tutorials(root: Path, only: list[str] | None = None) -> list[Path]:
    """Tutorial notebooks under root/tutorials, optionally only those whose name contains one of `only`."""
    notebooks = sorted((root / "tutorials").glob("Tutorial_*.ipynb"))
    if only:
        notebooks = [nb for nb in notebooks if any(pattern in nb.stem for pattern in only)]
    return notebooks


def _kernel_env() -> dict[str, str]:
    env = dict(os.environ)
    # A backend forced from outside (e.g. MPLBACKEND=Agg in CI) would stop the
    # kernel from capturing figures, and the HTML would have no plots.
    env.pop("MPLBACKEND", None)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def execute_notebook(path: Path, timeout: int = DEFAULT_TIMEOUT):
    """Run a notebook top to bottom in a fresh kernel started with this interpreter.

    Returns (notebook with outputs, seconds, error text or None). The kernel
    runs in the notebook's own folder, as it would in Jupyter.
    """
    nbformat = _require("nbformat")
    nbclient = _require("nbclient")
    manager_module = _require("jupyter_client.manager")
    nb = nbformat.read(path, as_version=4)
    km = manager_module.KernelManager(kernel_name="python3")
    # Pin the kernel to this interpreter: a user-level "python3" kernelspec may
    # point at another Python that does not have inferlab installed.
    km.kernel_spec.argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    socket_dir = None
    if os.name == "posix":
        # Local sockets instead of TCP ports (no ports to collide, no plain-text TCP warning).
        # The path must be absolute: the kernel runs in the notebook's folder.
        socket_dir = tempfile.mkdtemp(prefix="inferlab-kernel-")
        km.transport = "ipc"
        km.ip = os.path.join(socket_dir, "kernel")
    client = nbclient.NotebookClient(nb, km=km, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
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


def notebook_to_html(nb) -> str:
    nbconvert = _require("nbconvert")
    body, _ = nbconvert.HTMLExporter(template_name="lab").from_notebook_node(nb)
    return body


def build_tutorial(path: Path, out_dir: Path, execute: bool = True, timeout: int = DEFAULT_TIMEOUT):
    """Execute (unless told not to) and render one tutorial; returns (NotebookResult, notebook)."""
    if execute:
        nb, seconds, error = execute_notebook(path, timeout)
    else:
        nb, seconds, error = _require("nbformat").read(path, as_version=4), 0.0, None
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{path.stem}.html"
    target.write_text(notebook_to_html(nb), encoding="utf-8")
    return NotebookResult(path, target, seconds, error, execute), nb


# --------------------------------------------------------------------------- handouts

_PAGE = """<!DOCTYPE html>
<html lang="zh-CN">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
body {{ max-width: 52em; margin: 2em auto; padding: 0 1em; line-height: 1.6;
       font-family: -apple-system, "Segoe UI", "PingFang SC", "Noto Sans CJK SC", "Microsoft YaHei", sans-serif; }}
pre, code {{ font-family: "SFMono-Regular", Menlo, Consolas, monospace; font-size: 0.92em; }}
pre {{ background: #f6f8fa; padding: 0.8em; overflow-x: auto; }}
code {{ background: #f6f8fa; padding: 0.1em 0.3em; }}
pre code {{ background: none; padding: 0; }}
table {{ border-collapse: collapse; }}
th, td {{ border: 1px solid #d0d7de; padding: 0.3em 0.7em; }}
th {{ background: #f6f8fa; }}
</style>
</head>
<body>
{body}
</body>
</html>
"""


def markdown_to_html(text: str, title: str) -> str:
    """A standalone HTML page for a Markdown document (tables, fenced code, strikethrough)."""
    mistune = _require("mistune")
    render = mistune.create_markdown(escape=False, plugins=["table", "strikethrough", "url"])
    return _PAGE.format(title=html.escape(title), body=render(text))


def _title_of(markdown: str, fallback: str) -> str:
    for line in markdown.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return fallback


def build_handouts(root: Path, out_dir: Path) -> list[Path]:
    written = []
    for readme in sorted((root / "assignments").glob("*/README.md")):
        text = readme.read_text(encoding="utf-8")
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / f"{readme.parent.name}.html"
        target.write_text(markdown_to_html(text, _title_of(text, readme.parent.name)), encoding="utf-8")
        written.append(target)
    return written


# --------------------------------------------------------------------------- everything


def _index(report: BuildReport) -> str:
    items = []
    if report.notebooks:
        items.append("<h2>Tutorials</h2><ul>")
        for r in report.notebooks:
            status = "" if r.error is None else " <strong>(failed)</strong>"
            note = f" ({r.seconds:.1f} s)" if r.executed else " (not executed)"
            items.append(f'<li><a href="tutorials/{r.html.name}">{html.escape(r.source.stem)}</a>{note}{status}</li>')
        items.append("</ul>")
    if report.handouts:
        items.append("<h2>Handouts</h2><ul>")
        items += [f'<li><a href="handouts/{p.name}">{html.escape(p.stem)}</a></li>' for p in report.handouts]
        items.append("</ul>")
    return _PAGE.format(title="InferLab", body="<h1>InferLab</h1>\n" + "\n".join(items))


def build(root: str | os.PathLike[str] = ".", out: str | os.PathLike[str] = "build", only: list[str] | None = None,
          execute: bool = True, handouts: bool = True, timeout: int = DEFAULT_TIMEOUT, progress=None) -> BuildReport:
    """Render the tutorials (executed) and the handouts under `out`; see the module docstring."""
    root, out = Path(root), Path(out)
    if not (root / "tutorials").is_dir():
        raise FileNotFoundError(f"no tutorials/ folder in {root.resolve()}: run from the repository root or pass --root")
    notebooks = find_tutorials(root, only)
    if only and not notebooks:
        raise ValueError(f"no tutorial matches {only}")
    report = BuildReport(out)
    for path in notebooks:
        if progress:
            progress(f"{'executing' if execute else 'rendering'} {path.name}")
        result, _ = build_tutorial(path, out / "tutorials", execute, timeout)
        report.notebooks.append(result)
    if handouts:
        report.handouts = build_handouts(root, out / "handouts")
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.html").write_text(_index(report), encoding="utf-8")
    (out / "build.json").write_text(json.dumps({
        "notebooks": [{"name": r.source.name, "html": str(r.html), "seconds": round(r.seconds, 2),
                       "executed": r.executed, "error": r.error} for r in report.notebooks],
        "handouts": [str(p) for p in report.handouts],
    }, indent=2, ensure_ascii=False), encoding="utf-8")
    return report
