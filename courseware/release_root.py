"""Which tree's code a release's commands run: always the release they were started in.

A student release holds packages called `student_exercises`, `courseware` and
`labkit`, names the course repository uses too. In a Python environment where
the course is also installed (the course's own venv, or a second release
installed earlier), `import courseware` may find the other tree: the
editable-install finders are consulted after `sys.path`, in an order no
student controls. `inferlab demo` then ran the course's engine, and a notebook
opened in a release's `tutorials/` ran the course repository's stubs.

So the release's commands make sure of it themselves: a command started inside
a release (the folder holding `courseware/manifest.json`, found from the
working directory upwards) whose own `courseware` is not that release's hands
the command over to a fresh interpreter with the release's root first on
`sys.path` (`hand_over`). The course's `inferlab` does the same for the
commands a release has (`demo`, `check`, `bench`, `trace`, `serve`), so whichever
`inferlab` is on PATH, inside a release it runs the release's code. A release's
notebooks do it in their first cell (courseware/release_tutorials.py), and
`courseware.engine` refuses to build an engine from two trees at once
(`same_tree`).

Only the standard library here: this runs before anything of the release may
be imported.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

MANIFEST = Path("courseware") / "manifest.json"      # labkit.manifest.MANIFEST; not imported, see above
# The `inferlab` subcommands a release has (courseware/student_cli.py): each runs the release's engine, so the
# course's `inferlab` hands them over inside a release (`serve` runs only in lab 5's, which has the whole engine).
RELEASE_COMMANDS = ("check", "demo", "bench", "trace", "serve")


def release_root(start: Path | None = None) -> Path | None:
    """The release folder `start` (default: the working directory) is in, or None outside every release."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / MANIFEST).is_file():
            return folder
    return None


def tools_root() -> Path:
    """The folder whose `courseware/` this process imported: a release's root, the course's, or site-packages."""
    return Path(__file__).resolve().parents[1]


def hand_over(argv: list[str], start: Path | None = None) -> None:
    """Become `inferlab argv` run by the tools of the release around `start`, if that is not this process's tree.

    The process is replaced (exec), so the command's exit status, output and
    signals are the release's command's own; it returns (None) only when this
    process already runs the right tree, or is outside every release, and
    should go on itself.
    """
    root = release_root(start)
    if root is None or root == tools_root():
        return None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "courseware.student_cli", *argv], env)


def same_tree(package_file: str, tools_file: str) -> None:
    """Refuse an engine whose package and tools come from two trees (a release and the course, say)."""
    package_root, root = Path(package_file).resolve().parents[1], Path(tools_file).resolve().parents[1]
    if package_root != root:
        raise ImportError(
            f"this process mixes two trees: the engine package from {package_root}, the course tools from {root}. "
            f"Run commands from inside your release folder with its own `inferlab` (or `python -m "
            f"courseware.student_cli`), and start notebooks from the release's tutorials/ folder.")
