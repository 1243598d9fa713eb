"""Content checks of a performance report: each claim of the report is compared with the files it rests on.

Every check reads one section of the report and the submitted evidence, and
answers with the problems it found (empty: the item passes):

    call_chain    the names in the section's code block are calls of a traced step, in the traced order and
                  nesting (`runs/*_calls.txt`, written by lab5_run.py), and the trace itself names only
                  functions that exist in the engine
    log_excerpts  every JSON line of the section's code blocks is an event of one submitted lifecycle log,
                  each block's lines in that log's order
    tables        every number in a table row is backed by one row of a CSV the text before the table names
    explanations  each explanation has its five parts, and its test cites a CSV cell whose value it states
    figures       every figure the report embeds is a PNG file of the submission

What no file can settle (is the explanation *right*, is the comparison fair)
stays with the TA; what a file can settle is no longer a matter of opinion.
"""
from __future__ import annotations

import ast
import csv
import json
import re
from functools import lru_cache
from pathlib import Path

from labkit.labs import ROOT
from grading.report_markdown import Number, backs, code_blocks, numbers, sections, subsections, tables

MAX_EVIDENCE_BYTES = 20 << 20
QUALNAME = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)\b")
CALL_LINE = re.compile(r"^(\s*)([A-Za-z_][\w.]*)\s+\[([\w.]+)\]\s*$")
CITATION = re.compile(r"`?(results/[\w.\-/]+\.csv)\[([^\]]+)\]\.(\w+)\s*=\s*([-+]?\d[\d,]*(?:\.\d+)?\s*%?)`?")
FIELDS = ("现象", "解释", "可否定的预测", "检验", "结论")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _readable(folder: Path, path: Path) -> bool:
    """A plain file of the submission itself (no link out of it, nothing above it), small enough to read."""
    try:
        inside = path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False
    return inside and path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_EVIDENCE_BYTES


def _files(folder: Path, patterns: list[str]) -> list[Path]:
    return sorted({p for pattern in patterns for p in folder.glob(pattern) if _readable(folder, p)})


def _section(text: str, name: str) -> tuple[str | None, list[str]]:
    found = sections(text, name)
    return ("\n\n".join(found), []) if found else (None, [f"no section headed '{name}'"])


# --------------------------------------------------------------------------- call chain

@lru_cache(maxsize=None)
def engine_functions(module: str) -> frozenset[str]:
    """The qualified names of the functions defined in an engine module (read from its source, never run)."""
    parts = module.split(".")
    if parts[0] != "reference" or not all(p.isidentifier() for p in parts):
        return frozenset()
    source = ROOT.joinpath(*parts).with_suffix(".py")
    if not source.is_file():
        source = ROOT.joinpath(*parts, "__init__.py")
    if not source.is_file():
        return frozenset()
    names: set[str] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(prefix + child.name)
                visit(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
    visit(ast.parse(source.read_text(encoding="utf-8")), "")
    return frozenset(names)


def read_call_tree(path: Path) -> tuple[list[tuple[int, str]], list[str]]:
    """[(depth, qualname)] of a calls file, and its problems (a line that is not a call of an engine function)."""
    calls, problems = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        match = CALL_LINE.match(line.expandtabs(4))
        if not match:
            problems.append(f"{path.name} line {number} is not `<indent>Class.method    [module]`")
            continue
        indent, name, module = match.groups()
        if name not in engine_functions(module):
            problems.append(f"{path.name} line {number}: {module} defines no function {name}")
        calls.append((len(indent) // 4, name))
    return calls, problems


def chain_lines(block: list[str]) -> list[tuple[int, str]]:
    """(indent, qualified name) of each line of a code block that starts with one (`Class.method ...`)."""
    out = []
    for line in block:
        expanded = line.expandtabs(4)
        match = QUALNAME.match(expanded.strip())
        if match:
            out.append((len(expanded) - len(expanded.lstrip()), match.group(1)))
    return out


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def match_chain(chain: list[tuple[int, str]], calls: list[tuple[int, str]]) -> bool:
    """True when the chain's names occur in `calls` in order, and each step of the chain goes deeper, stays or
    comes back up exactly when the trace does (levels may be skipped, nesting may not be invented)."""
    memo: dict[tuple[int, int], bool] = {}

    def fits(i: int, previous: int) -> bool:          # chain[i:] matched after calls[previous]
        if i == len(chain):
            return True
        key = (i, previous)
        if key not in memo:
            memo[key] = any(
                calls[j][1] == chain[i][1]
                and (i == 0 or _sign(chain[i][0] - chain[i - 1][0]) == _sign(calls[j][0] - calls[previous][0]))
                and fits(i + 1, j)
                for j in range(previous + 1, len(calls)))
        return memo[key]
    return fits(0, -1)


def check_call_chain(text: str, folder: Path, options: dict) -> list[str]:
    body, problems = _section(text, options["sections"][0])
    if body is None:
        return problems
    chain = max((chain_lines(block) for block in code_blocks(body)), key=len, default=[])
    if len(chain) < options["min_count"]:
        return [f"the call chain names {len(chain)} functions (Class.method at the start of a code block line), "
                f"at least {options['min_count']} expected"]
    names = [name for _, name in chain]
    problems += [f"the call chain never reaches {wanted}" for wanted in options["must_name"]
                 if not any(wanted in name for name in names)]
    traces = _files(folder, options["evidence"])
    if not traces:
        return problems + [f"no trace file matching {', '.join(options['evidence'])} (lab5_run.py writes one)"]
    for trace in traces:
        calls, trace_problems = read_call_tree(trace)
        if not trace_problems and calls and match_chain(chain, calls):
            return problems
    return problems + [f"the call chain ({' > '.join(names[:4])} ...) is not, in this order and nesting, "
                       f"a chain of calls in {', '.join(t.name for t in traces)}"] + \
        [p for t in traces for p in read_call_tree(t)[1][:3]]


# --------------------------------------------------------------------------- log excerpts

def _log_events(path: Path) -> list[dict]:
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def _in_order(excerpt: list[dict], events: list[dict]) -> bool:
    position = 0
    for wanted in excerpt:
        while position < len(events) and events[position] != wanted:
            position += 1
        if position == len(events):
            return False
        position += 1
    return True


def check_log_excerpts(text: str, folder: Path, options: dict) -> list[str]:
    body, problems = _section(text, options["sections"][0])
    if body is None:
        return problems
    logs = {p.name: _log_events(p) for p in _files(folder, options["evidence"])}
    if not logs:
        return [f"no log matching {', '.join(options['evidence'])}"]
    quoted: list[dict] = []
    for number, block in enumerate(code_blocks(body), start=1):
        excerpt = []
        for line in block:
            if line.strip().startswith("{"):
                try:
                    excerpt.append(json.loads(line))
                except json.JSONDecodeError:
                    problems.append(f"code block {number}: not a JSON event: {line.strip()[:80]}")
        if excerpt and not any(_in_order(excerpt, events) for events in logs.values()):
            missing = next((e for e in excerpt if not any(e in events for events in logs.values())), None)
            problems.append(f"code block {number}: " + (
                f"this event is in no submitted log: {json.dumps(missing, ensure_ascii=False)[:120]}" if missing
                else "its events are not, in this order, events of one submitted log"))
        quoted += excerpt
    if len(quoted) < options["min_count"]:
        problems.append(f"{len(quoted)} log lines quoted (JSON events in code blocks), "
                        f"at least {options['min_count']} expected")
    kinds = {e.get("event") for e in quoted}
    problems += [f"no {kind} event quoted" for kind in options["must_name"] if kind not in kinds]
    return problems


# --------------------------------------------------------------------------- tables

def read_csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", errors="replace", newline="") as handle:
        return list(csv.DictReader(handle))


def _row_values(row: dict[str, str]) -> list[float]:
    values = []
    for cell in row.values():
        try:
            values.append(float(str(cell).replace(",", "")))
        except ValueError:
            continue
    return values


def _row_backed(cells: list[str], data: list[list[float]]) -> list[Number] | None:
    """None when one data row backs every number of the table row; else the numbers of the row."""
    written = [n for cell in cells for n in numbers(cell)]
    if not written or any(all(any(backs(n, v) for v in values) for n in written) for values in data):
        return None
    return written


def check_tables(text: str, folder: Path, options: dict) -> list[str]:
    problems, checked = [], 0
    available = {p.relative_to(folder).as_posix(): p for p in _files(folder, options["evidence"])}
    for name in options["sections"]:
        body, missing = _section(text, name)
        if body is None:
            problems += missing
            continue
        for number, table in enumerate(tables(body), start=1):
            if not any(numbers(cell) for row in table.rows for cell in row):
                continue                                          # an empty template table
            checked += 1
            named = sorted(set(re.findall(r"results/[\w.\-/]+\.csv", table.preceding)))
            where = f"'{name}' table {number} ({' | '.join(table.header)[:60]})"
            if not named:
                problems.append(f"{where}: the text before it names no results/*.csv file")
                continue
            absent = [n for n in named if n not in available]
            if absent:
                problems.append(f"{where}: {', '.join(absent)} was not submitted")
                continue
            data = [_row_values(row) for n in named for row in read_csv_rows(available[n])]
            for row in table.rows:
                unbacked = _row_backed(row, data)
                if unbacked is not None:
                    problems.append(f"{where}: no row of {', '.join(named)} holds all of "
                                    f"{', '.join(n.text for n in unbacked)} (row: {' | '.join(row)[:80]})")
    if checked < options["min_count"]:
        problems.append(f"{checked} tables with numbers, at least {options['min_count']} expected")
    return problems


# --------------------------------------------------------------------------- explanations

def _fields(body: str) -> dict[str, str]:
    """The text after each `**name**` label of an explanation (label lines of the template's form)."""
    found: dict[str, str] = {}
    current = None
    for line in body.splitlines():
        match = re.match(r"^\s*[-*]?\s*\*\*(.+?)\*\*\s*(?:[（(][^）)]*[）)])?\s*[:：]?\s*(.*)$", line)
        if match and match.group(1) in FIELDS:
            current = match.group(1)
            found[current] = match.group(2).strip()
        elif current and line.strip():
            found[current] += "\n" + line.strip()
    return found


def citation_problems(text: str, folder: Path) -> tuple[int, list[str]]:
    """How many `results/F.csv[ROW].COLUMN = VALUE` citations in `text` hold, and what is wrong with the others.

    ROW is the value of the file's first column (a run's name, a step number).
    """
    good, problems = 0, []
    for path_text, row_key, column, value_text in CITATION.findall(text):
        cite = f"{path_text}[{row_key}].{column}"
        path = folder / path_text
        if not _readable(folder, path):
            problems.append(f"{cite}: {path_text} was not submitted")
            continue
        rows = read_csv_rows(path)
        first = next(iter(rows[0]), None) if rows else None
        row = next((r for r in rows if first is not None and r[first].strip() == row_key.strip()), None)
        if row is None or column not in row:
            problems.append(f"{cite}: {path_text} has no " + ("such column" if row else f"row {row_key!r}"))
            continue
        written = numbers(value_text)
        try:
            actual = float(row[column])
        except ValueError:
            problems.append(f"{cite}: the cell is not a number ({row[column]!r})")
            continue
        if not written or not backs(written[0], actual):
            problems.append(f"{cite} is {row[column]}, not {value_text.strip()}")
            continue
        good += 1
    return good, problems


def check_explanations(text: str, folder: Path, options: dict) -> list[str]:
    body, problems = _section(text, options["sections"][0])
    if body is None:
        return problems
    explanations = [(title, _fields(sub)) for title, sub in subsections(body)]
    explanations = [(title, fields) for title, fields in explanations if fields]
    for title, fields in explanations:
        missing = [f for f in FIELDS if not fields.get(f, "").strip()]
        if missing:
            problems.append(f"'{title}': {', '.join(missing)} left empty")
            continue
        if not numbers(fields["可否定的预测"]):
            problems.append(f"'{title}': the prediction names no number that would refute it")
        if not re.search(r"成立|被否定", fields["结论"]):
            problems.append(f"'{title}': the conclusion says neither 成立 nor 被否定")
        good, bad = citation_problems(fields["检验"], folder)
        problems += [f"'{title}': {p}" for p in bad]
        if not good and not bad:
            problems.append(f"'{title}': the test cites no measurement (results/F.csv[ROW].COLUMN = VALUE)")
    if len(explanations) < options["min_count"]:
        problems.append(f"{len(explanations)} explanations, at least {options['min_count']} expected")
    return problems


# --------------------------------------------------------------------------- figures

def check_figures(text: str, folder: Path, options: dict) -> list[str]:
    embedded = re.findall(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?\s*\)", text)
    problems = []
    if len(embedded) < options["min_count"]:
        problems.append(f"{len(embedded)} figures embedded (![...](figures/NAME.png)), "
                        f"at least {options['min_count']} expected")
    for target in embedded:
        path = folder / target
        if not _readable(folder, path) or path.read_bytes()[:8] != PNG_MAGIC:
            problems.append(f"the report embeds {target}, which is not a PNG file of the submission")
    return problems


CHECKS = {"call_chain": check_call_chain, "log_excerpts": check_log_excerpts, "tables": check_tables,
          "explanations": check_explanations, "figures": check_figures}
