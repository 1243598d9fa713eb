"""A lab handout as a student reads it: `assignments/labN_*/README.md` with its shared parts included.

Some text is the same for every lab, and must say the same thing everywhere:
what of a student's code the grader runs (`WHAT_IS_GRADED`, in the course's
shared assignments folder) is written once and included where a handout has
an include line (`include_line()`: an HTML comment naming the file, relative
to the course root). The release ships the rendered
handout and puts the same text in its README; `inferlab build` renders the
handouts from here too. Before, each handout and the release README said it
in its own words, and they disagreed.
"""
from __future__ import annotations

import re
from pathlib import Path

from labkit.labs import ROOT

INCLUDE = re.compile(r"^<!-- include: (?P<path>[\w./-]+) -->$", re.M)
WHAT_IS_GRADED = Path("assignments") / "shared" / "what_is_graded.md"


def include_line(path: Path = WHAT_IS_GRADED) -> str:
    return f"<!-- include: {path.as_posix()} -->"


def render(text: str, root: Path = ROOT) -> str:
    """`text` with every include line replaced by the file it names (one level: included files include nothing)."""
    def included(match: re.Match) -> str:
        path = root / match["path"]
        if not path.is_file():
            raise FileNotFoundError(f"a handout includes {match['path']}, which does not exist under {root}")
        body = path.read_text(encoding="utf-8").rstrip("\n")
        if INCLUDE.search(body):
            raise ValueError(f"{match['path']} includes another file; included files include nothing")
        return body
    return INCLUDE.sub(included, text)


def handout_text(path: Path, root: Path = ROOT) -> str:
    """The handout at `path`, rendered."""
    return render(path.read_text(encoding="utf-8"), root)


def what_is_graded(root: Path = ROOT) -> str:
    """The shared statement of what runs of a student's code, as the handouts include it."""
    return (root / WHAT_IS_GRADED).read_text(encoding="utf-8").rstrip("\n")
