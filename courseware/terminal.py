"""One Console for every command: readable on a terminal and when piped into a file or `less`.

Rich sizes tables to the terminal; with no terminal it assumes 80 columns and
folds every test name into slivers. Piped output gets a fixed wide width and
no colour codes instead, so `inferlab check lab2 > out.txt` reads like the screen.
"""
from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape

PIPED_WIDTH = 160


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=PIPED_WIDTH, no_color=True, highlight=False)


def print_error(message: object, heading: str = "error") -> None:
    """Print one error to stderr as a single unfolded line.

    Errors name a file and a line; folding them at the console width split
    "line 1" across two lines on long paths, so a grep or a test for the
    message failed. The message is escaped: a bracket in bad input is text, not markup.
    """
    make_console(stderr=True).print(f"[bold red]{heading}:[/bold red] {escape(str(message))}", soft_wrap=True)
