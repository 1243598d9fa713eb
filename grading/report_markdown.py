"""The parts of a Markdown report the content checks read: sections, code blocks, tables, numbers.

A deliberately small reader (no Markdown library): a report is headings,
paragraphs, fenced code blocks and pipe tables, and that is all the checks
need. The price: exotic Markdown (HTML tables, indented code) is not read,
and the handout asks for the plain forms the template uses.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
# A number standing alone: not part of an identifier (`seqs16`, `P99`) or of a dotted range (`32..256`).
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?![\w]|\.\d|\.\.)(\s*%)?")


@dataclass(frozen=True)
class Number:
    """A number as written: its value, how many decimals were written, and whether a % followed it."""
    text: str
    value: float
    decimals: int
    percent: bool


def sections(text: str, wanted: str) -> list[str]:
    """The bodies of the sections whose heading contains `wanted` (case-insensitive), up to the next heading
    of the same or a higher level (subsections stay inside)."""
    lines = text.splitlines()
    found, body, level = [], None, 0
    in_code = False
    for line in lines:
        if FENCE.match(line):
            in_code = not in_code
        match = None if in_code else HEADING.match(line)
        if match and body is not None and len(match.group(1)) <= level:
            found.append("\n".join(body))
            body = None
        if match and body is None and wanted.lower() in match.group(2).lower():
            body, level = [], len(match.group(1))
            continue
        if body is not None:
            body.append(line)
    if body is not None:
        found.append("\n".join(body))
    return found


def code_blocks(text: str) -> list[list[str]]:
    """The lines of each fenced code block, in order."""
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def subsections(text: str) -> list[tuple[str, str]]:
    """(heading, body) of each heading inside `text` (a section's body), code blocks skipped."""
    out: list[tuple[str, list[str]]] = []
    in_code = False
    for line in text.splitlines():
        if FENCE.match(line):
            in_code = not in_code
        match = None if in_code else HEADING.match(line)
        if match:
            out.append((match.group(2), []))
        elif out:
            out[-1][1].append(line)
    return [(title, "\n".join(body)) for title, body in out]


@dataclass(frozen=True)
class Table:
    """A pipe table: its header cells, its body rows, and the prose lines just before it."""
    header: list[str]
    rows: list[list[str]]
    preceding: str


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(text: str) -> list[Table]:
    """Every pipe table outside code blocks, with up to three non-empty lines of text before it."""
    lines = text.splitlines()
    found: list[Table] = []
    in_code, i = False, 0
    while i < len(lines):
        line = lines[i]
        if FENCE.match(line):
            in_code = not in_code
        is_start = (not in_code and line.strip().startswith("|") and i + 1 < len(lines)
                    and re.match(r"^\s*\|?\s*:?-{3,}", lines[i + 1]))
        if not is_start:
            i += 1
            continue
        before = [b for b in lines[max(0, i - 6):i] if b.strip()][-3:]
        j = i + 2
        rows = []
        while j < len(lines) and lines[j].strip().startswith("|"):
            rows.append(_cells(lines[j]))
            j += 1
        found.append(Table(_cells(line), rows, "\n".join(before)))
        i = j
    return found


def numbers(text: str) -> list[Number]:
    """Every number written in `text` (thousands separators allowed), with its precision."""
    out = []
    for match in NUMBER.finditer(text):
        raw = match.group(0)
        percent = match.group(1) is not None
        digits = raw.rstrip("% ").replace(",", "")
        try:
            value = float(digits)
        except ValueError:
            continue
        decimals = len(digits.split(".")[1]) if "." in digits else 0
        out.append(Number(raw.strip(), value, decimals, percent))
    return out


def backs(written: Number, value: float) -> bool:
    """True when `value` (from the data), rounded as the report wrote it, gives the written number.

    A percentage may be written from a fraction (0.25 -> 25%) or from a value
    already in percent.
    """
    tolerance = 0.5 * 10 ** -written.decimals + 1e-9
    candidates = [value, value * 100] if written.percent else [value]
    return any(abs(c - written.value) <= tolerance for c in candidates)
