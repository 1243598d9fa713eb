"""A falsifiable explanation's criterion, evaluated on the student's own measurements.

The report template asks each prediction to end in a criterion, written as
inline code after 判据:

    判据：`results/summary.csv[seqs16].decode_step_median_ms < 4 × results/summary.csv[seqs4].decode_step_median_ms`

that is, what must hold on the data for the explanation to stand (several,
each in backquotes after 判据, must all hold). The
grader looks the cells up in the submitted CSV files and decides it, so:

- the conclusion (成立 / 被否定) must be what the criterion gives on the data;
- the bound must be derived from the data: a cell, times a factor between
  0.1 and 10 (how much the explanation allows), or a number within a factor
  of 10 of the value it bounds. A bound no measurement near the student's
  could cross (a throughput "below 100000 tok/s" on a machine that does a
  few thousand) refutes nothing, and is reported as such.

Whether the criterion tests the *explanation* (and not something beside it)
is for the TA.
"""
from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from pathlib import Path

from grading.report_files import read_csv_rows, readable

CELL = r"results/[\w.\-/]+\.csv\[[^\]]+\]\.\w+"
NUM = r"[-+]?\d+(?:\.\d+)?"
TERM = rf"(?:{NUM}\s*[×x*]\s*{CELL}|{CELL}\s*[×x*]\s*{NUM}|{CELL}|{NUM})"
OPS = {"<=": operator.le, "≤": operator.le, ">=": operator.ge, "≥": operator.ge, "<": operator.lt, ">": operator.gt}
EXPRESSION = re.compile(rf"`\s*({TERM})\s*(<=|>=|≤|≥|<|>)\s*({TERM})\s*`")
CRITERION_MARK = re.compile(r"判据\s*[:：]")
CELL_PARTS = re.compile(r"(results/[\w.\-/]+\.csv)\[([^\]]+)\]\.(\w+)")
MAX_FACTOR = 10.0


@dataclass(frozen=True)
class Term:
    text: str
    factor: float
    cell: str | None          # None: a plain number (the factor is the number)


def parse_term(text: str) -> Term:
    text = text.strip()
    cell = re.search(CELL, text)
    if cell is None:
        return Term(text, float(text), None)
    rest = (text[:cell.start()] + text[cell.end():]).strip(" ×x*")
    return Term(text, float(rest) if rest else 1.0, cell.group(0))


def cell_value(folder: Path, cell: str) -> float:
    """The number in a cited cell; ValueError says what is missing."""
    path_text, row_key, column = CELL_PARTS.fullmatch(cell).groups()
    path = folder / path_text
    if not readable(folder, path):
        raise ValueError(f"{path_text} was not submitted")
    rows = read_csv_rows(path)
    first = next(iter(rows[0]), None) if rows else None
    row = next((r for r in rows if first is not None and r[first].strip() == row_key.strip()), None)
    if row is None or column not in row:
        raise ValueError(f"{cell}: {path_text} has no " + ("such column" if row else f"row {row_key!r}"))
    try:
        return float(row[column])
    except ValueError:
        raise ValueError(f"{cell} is not a number ({row[column]!r})") from None


def value(folder: Path, term: Term) -> float:
    return term.factor if term.cell is None else term.factor * cell_value(folder, term.cell)


def derivation_problem(left: Term, right: Term, measured: float) -> str | None:
    """Why the bound is not derived from the data, or None when it is."""
    if left.cell is None and right.cell is None:
        return "compares two numbers: neither side is a measurement"
    measured_term, bound = (left, right) if left.cell is not None else (right, left)
    if bound.cell is not None:
        if not 1 / MAX_FACTOR <= abs(bound.factor) <= MAX_FACTOR:
            return f"the factor {bound.factor:g} is outside 0.1..10: it allows any measurement"
        return None
    if measured == 0:
        return None if abs(bound.factor) <= 1 else f"the bound {bound.factor:g} is far from the measured 0"
    ratio = abs(bound.factor / measured) if bound.factor else float("inf")
    if not 1 / MAX_FACTOR <= ratio <= MAX_FACTOR:
        return (f"the bound {bound.factor:g} is {max(ratio, 1 / ratio if ratio else ratio):.0f}x the measured "
                f"{measured:g}: no measurement near yours could cross it")
    return None


def verdict(conclusion: str) -> bool | None:
    """True for 成立, False for 被否定, whichever the conclusion says first; None when it says neither."""
    found = re.search(r"成立|被否定", conclusion)
    return None if found is None else found.group(0) == "成立"


def criterion_lines(prediction: str, conclusion: str, folder: Path) -> tuple[list[str], list[str]]:
    """(what holds, what is wrong) about the criteria of one explanation.

    The explanation stands (成立) when every criterion holds on the data, and
    is refuted (被否定) when any fails; the conclusion must say which.
    """
    good, bad = [], []
    mark = CRITERION_MARK.search(prediction)
    found = EXPRESSION.findall(prediction[mark.end():]) if mark else []
    if not found:
        return good, ["the prediction states no criterion (判据：`CELL < BOUND`) that the data could refute"]
    decided: list[tuple[str, bool, str]] = []
    for left_text, op, right_text in found:
        left, right = parse_term(left_text), parse_term(right_text)
        shown = f"`{left.text} {op} {right.text}`"
        try:
            a, b = value(folder, left), value(folder, right)
        except ValueError as err:
            bad.append(f"criterion {shown}: {err}")
            continue
        problem = derivation_problem(left, right, a if left.cell is not None else b)
        if problem:
            bad.append(f"criterion {shown}: {problem}")
            continue
        decided.append((shown, OPS[op](a, b), f"{a:g} {op} {b:g}"))
    if bad or not decided:
        return good, bad
    stands, said = all(holds for _, holds, _ in decided), verdict(conclusion)
    on_data = "; ".join(f"{shown}: {numbers} is {holds}" for shown, holds, numbers in decided)
    if said is not None and said != stands:
        bad.append(f"on your data {on_data}, so the explanation is {'成立' if stands else '被否定'}, "
                   "not what the conclusion says")
    else:
        good.append(f"on your data {on_data}: {'成立' if stands else '被否定'}, as the conclusion says")
    return good, bad
