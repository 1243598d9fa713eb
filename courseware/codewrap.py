"""Code lines too long for the printed page, broken between two tokens and marked as continued.

A browser that wraps `pre` text on its own either runs long lines off the page
or, told to break anywhere, breaks inside a name (`max_to|kens`) and gives no
sign that the next line is the same statement. So before a page is rendered,
each line of code and of plain-text output wider than the page is broken here:
never between two characters of one name or number, preferably at a space,
with MARK at the end of every broken piece and the rest indented under it.
Only a single token longer than a whole line is cut inside it.

COLUMNS is what fits the A4 text column in the print style sheet's code font
(courseware/templates/print.css: 8.5 pt Noto Sans Mono CJK, half-width glyphs
of 0.5 em, in 182 mm less the cells' padding); CJK characters count two columns.
"""
from __future__ import annotations

import unicodedata

COLUMNS = 104
MARK = "⏎"
CONTINUATION_INDENT = 4


def width(text: str) -> int:
    """Columns `text` takes in a monospaced CJK font: wide and full-width characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _joins(a: str, b: str) -> bool:
    """Are a and b two characters of one name or number (no line break allowed between them)?"""
    def word(c: str) -> bool:
        return (c.isascii() and c.isalnum()) or c == "_"
    return word(a) and word(b)


def _cut(line: str, limit: int, floor: int) -> int:
    """Where to break `line` so the first piece takes at most `limit` columns (index > floor when possible)."""
    fits = 0
    while fits < len(line) and width(line[:fits + 1]) <= limit:
        fits += 1
    spaces = [i for i in range(floor + 1, fits + 1) if line[i - 1] == " " and line[i:i + 1] != " "]
    if spaces and spaces[-1] > floor + (fits - floor) // 2:
        return spaces[-1]
    bounds = [i for i in range(floor + 1, fits + 1) if i < len(line) and not _joins(line[i - 1], line[i])]
    return bounds[-1] if bounds else max(fits, floor + 1)


def wrap_line(line: str, columns: int = COLUMNS) -> list[str]:
    """The printed lines of one source line: all but the last end with MARK."""
    if width(line) <= columns:
        return [line]
    indent = " " * min(len(line) - len(line.lstrip(" ")) + CONTINUATION_INDENT, columns // 2)
    pieces, rest, floor = [], line, len(line) - len(line.lstrip(" "))
    while width(rest) > columns:
        cut = _cut(rest, columns - 2, floor)             # two columns for " " + MARK
        pieces.append(rest[:cut].rstrip(" ") + " " + MARK)
        rest = indent + rest[cut:].lstrip(" ")
        floor = len(indent)
    return pieces + [rest]


def wrap_text(text: str, columns: int = COLUMNS) -> str:
    """Every line of `text` wrapped by wrap_line."""
    return "\n".join(piece for line in text.split("\n") for piece in wrap_line(line, columns))


def wrap_notebook(nb, columns: int = COLUMNS):
    """The notebook (changed in place) with its code and plain-text outputs wrapped for print."""
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        cell["source"] = wrap_text(_text(cell["source"]), columns)
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                output["text"] = wrap_text(_text(output["text"]), columns)
            elif "text/plain" in output.get("data", {}):
                output["data"]["text/plain"] = wrap_text(_text(output["data"]["text/plain"]), columns)
    return nb


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else value
