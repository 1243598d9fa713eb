"""Content checks of a performance report: each claim of the report is compared with the files it rests on.

Every check reads one section of the report and the submitted evidence, and
answers with xv6-style lines (grading/report_files.py): GOOD for what holds,
BAD or MISSING, naming the rule, for what costs the item its points:

    call_chain    the call chain is a traced step's (grading/report_chain.py)
    planes        each function of the call chain that lecture 7 places is called by the lecture's plane
                  (grading/report_chain.py, courseware/lectures.py)
    log_excerpts  every JSON line of the section's code blocks is an event of one submitted lifecycle log,
                  each block's lines in that log's order, and one block shows a whole preemption
    tables        every number in a table row is backed by one row of a CSV the text before the table names
                  (in sections listed under `logged`, only the files the runs check recomputes from the logs),
                  with a table in each subsection listed under `per_subsection`
    explanations  each explanation has its five parts, its test cites a CSV cell whose value it states, and
                  its criterion, decided on that data, gives the conclusion it states (grading/report_criteria.py)
    figures       every figure the report embeds is a plot (grading/report_png.py) of submitted CSV files
    runs          the measurement files are what their logs say, and every experiment was run
                  (grading/report_runs.py)

What no file can settle (is the explanation *right*, is the comparison fair)
stays with the TA (rubric items of kind `ta`); what a file can settle is no
longer a matter of opinion.
"""
from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

from grading.report_chain import check_call_chain, check_planes
from grading.report_criteria import criterion_lines
from grading.report_files import BAD, GOOD, MISSING, files, line, read_csv_rows, read_events, readable, section
from grading.report_markdown import Number, backs, code_blocks, numbers, subsections, tables
from grading.report_png import PngError, read_png
from grading.report_runs import check_runs

CITATION = re.compile(r"`?(results/[\w.\-/]+\.csv)\[([^\]]+)\]\.(\w+)\s*=\s*([-+]?\d[\d,]*(?:\.\d+)?\s*%?)`?")
FIELDS = ("现象", "解释", "可否定的预测", "检验", "结论")
MIN_FIGURE = (320, 200)          # pixels: smaller is not a figure a reader can read
MIN_DRAWN = 0.005                # the share of pixels that must differ from the background


# --------------------------------------------------------------------------- log excerpts

RULE_LOG = "every quoted event is a line of one submitted runs/*.jsonl, each code block in that log's order"


def _in_order(excerpt: list[dict], events: list[dict]) -> bool:
    position = 0
    for wanted in excerpt:
        while position < len(events) and events[position] != wanted:
            position += 1
        if position == len(events):
            return False
        position += 1
    return True


def whole_preemption(excerpt: list[dict]) -> bool:
    """A block shows a preemption end to end: PREEMPTED, then that request's QUEUED (preempted) and SCHEDULED."""
    for i, event in enumerate(excerpt):
        if event.get("event") != "PREEMPTED":
            continue
        later = [e for e in excerpt[i + 1:] if e.get("seq_id") == event.get("seq_id")]
        queued = next((k for k, e in enumerate(later) if e.get("event") == "QUEUED"
                       and e.get("reason") == "preempted"), None)
        if queued is not None and any(e.get("event") == "SCHEDULED" for e in later[queued + 1:]):
            return True
    return False


def check_log_excerpts(text: str, folder: Path, options: dict) -> list[str]:
    body, out = section(text, options["sections"][0])
    if body is None:
        return out
    logs = {p.name: read_events(p) for p in files(folder, options["evidence"])}
    if not logs:
        return [line(MISSING, f"a log matching {', '.join(options['evidence'])}", RULE_LOG)]
    quoted: list[dict] = []
    whole = False
    for number, block in enumerate(code_blocks(body), start=1):
        excerpt = []
        for text_line in block:
            if text_line.strip().startswith("{"):
                try:
                    excerpt.append(json.loads(text_line))
                except json.JSONDecodeError:
                    out.append(line(BAD, f"code block {number}: not a JSON event: {text_line.strip()[:80]}", RULE_LOG))
        if not excerpt:
            continue
        source = next((name for name, events in logs.items() if _in_order(excerpt, events)), None)
        if source is None:
            missing = next((e for e in excerpt if not any(e in events for events in logs.values())), None)
            out.append(line(BAD, f"code block {number}: " + (
                f"this event is in no submitted log: {json.dumps(missing, ensure_ascii=False)[:120]}" if missing
                else "its events are not, in this order, events of one submitted log"), RULE_LOG))
        else:
            out.append(line(GOOD, f"code block {number}: {len(excerpt)} events of runs/{source}, in its order"))
            whole = whole or whole_preemption(excerpt)
        quoted += excerpt
    if len(quoted) < options["min_count"]:
        out.append(line(MISSING, f"{len(quoted)} log lines quoted (JSON events in code blocks), "
                                 f"at least {options['min_count']} expected", RULE_LOG))
    kinds = {e.get("event") for e in quoted}
    out += [line(MISSING, f"a {kind} event among the quoted lines", "the template asks for a preemption and STEP events")
            for kind in options["must_name"] if kind not in kinds]
    if "PREEMPTED" in options["must_name"] and "PREEMPTED" in kinds and not whole:
        out.append(line(MISSING, "a whole preemption in one block: PREEMPTED, then that request's QUEUED "
                                 "(reason preempted) and its next SCHEDULED", "the template asks for the whole of one"))
    return out


# --------------------------------------------------------------------------- tables

RULE_TABLE = "every number of a table row is in one row of the CSV file named in the three lines before the table"


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


def _table_lines(name: str, title: str, body: str, folder: Path, available: dict[str, Path],
                 logged: list[str] | None) -> tuple[list[str], int]:
    """Feedback on the tables of one (sub)section, and how many tables with numbers it has."""
    out, checked = [], 0
    for number, table in enumerate(tables(body), start=1):
        if not any(numbers(cell) for row in table.rows for cell in row):
            continue                                          # an empty template table
        checked += 1
        named = sorted(set(re.findall(r"results/[\w.\-/]+\.csv", table.preceding)))
        where = f"'{title}' table {number} ({' | '.join(table.header)[:60]})"
        if not named:
            out.append(line(MISSING, f"{where}: the text before it names no results/*.csv file", RULE_TABLE))
            continue
        if logged is not None:
            foreign = [n for n in named if not any(fnmatch.fnmatch(n, pattern) for pattern in logged)]
            if foreign:
                out.append(line(BAD, f"{where}: {', '.join(foreign)} is not a file the logs back "
                                     f"({', '.join(logged)})", f"tables in '{name}' rest on the runs themselves"))
                continue
        absent = [n for n in named if n not in available]
        if absent:
            out.append(line(MISSING, f"{where}: {', '.join(absent)}, which was not submitted", RULE_TABLE))
            continue
        data = [_row_values(row) for n in named for row in read_csv_rows(available[n])]
        bad = 0
        for row in table.rows:
            unbacked = _row_backed(row, data)
            if unbacked is not None:
                bad += 1
                out.append(line(BAD, f"{where}: no row of {', '.join(named)} holds all of "
                                     f"{', '.join(n.text for n in unbacked)} (row: {' | '.join(row)[:80]})", RULE_TABLE))
        if not bad:
            out.append(line(GOOD, f"{where}: every row is a row of {', '.join(named)}"))
    return out, checked


def check_tables(text: str, folder: Path, options: dict) -> list[str]:
    out, checked = [], 0
    available = {p.relative_to(folder).as_posix(): p for p in files(folder, options["evidence"])}
    for name in options["sections"]:
        body, missing = section(text, name)
        if body is None:
            out += missing
            continue
        logged = options.get("logged", {}).get(name)
        lines, count = _table_lines(name, name, body, folder, available, logged)
        out += lines
        checked += count
        for wanted in options.get("per_subsection", {}).get(name, []):
            parts = [(title, sub) for title, sub in subsections(body) if title.strip().startswith(wanted)]
            if not parts or not any(_table_lines(name, title, sub, folder, available, logged)[1] for title, sub in parts):
                out.append(line(MISSING, f"a table with numbers under '{name}' {wanted}",
                                "each experiment of the handout has its table"))
    if checked < options["min_count"]:
        out.append(line(MISSING, f"{checked} tables with numbers, at least {options['min_count']} expected", RULE_TABLE))
    return out


# --------------------------------------------------------------------------- explanations

RULE_EXPLAIN = "each explanation has 现象, 解释, 可否定的预测 (with its 判据), 检验 (citing cells) and 结论"


def _fields(body: str) -> dict[str, str]:
    """The text after each `**name**` label of an explanation (label lines of the template's form)."""
    found: dict[str, str] = {}
    current = None
    for text_line in body.splitlines():
        match = re.match(r"^\s*[-*]?\s*\*\*(.+?)\*\*\s*(?:[（(][^）)]*[）)])?\s*[:：]?\s*(.*)$", text_line)
        if match and match.group(1) in FIELDS:
            current = match.group(1)
            found[current] = match.group(2).strip()
        elif current and text_line.strip():
            found[current] += "\n" + text_line.strip()
    return found


def citation_problems(text: str, folder: Path) -> tuple[int, list[str]]:
    """How many `results/F.csv[ROW].COLUMN = VALUE` citations in `text` hold, and what is wrong with the others.

    ROW is the value of the file's first column (a run's name, a step number).
    """
    good, problems = 0, []
    for path_text, row_key, column, value_text in CITATION.findall(text):
        cite = f"{path_text}[{row_key}].{column}"
        path = folder / path_text
        if not readable(folder, path):
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
    body, out = section(text, options["sections"][0])
    if body is None:
        return out
    explanations = [(title, _fields(sub)) for title, sub in subsections(body)]
    explanations = [(title, fields) for title, fields in explanations if fields]
    for title, fields in explanations:
        missing = [f for f in FIELDS if not fields.get(f, "").strip()]
        if missing:
            out.append(line(MISSING, f"'{title}': {', '.join(missing)}", RULE_EXPLAIN))
            continue
        if not re.search(r"成立|被否定", fields["结论"]):
            out.append(line(BAD, f"'{title}': the conclusion says neither 成立 nor 被否定", RULE_EXPLAIN))
        good, bad = citation_problems(fields["检验"], folder)
        out += [line(BAD, f"'{title}': {p}", "a cited cell holds the value written") for p in bad]
        if not good and not bad:
            out.append(line(MISSING, f"'{title}': a measurement cited in the test (results/F.csv[ROW].COLUMN = VALUE)",
                            RULE_EXPLAIN))
        holds, wrong = criterion_lines(fields["可否定的预测"], fields["结论"], folder)
        out += [line(GOOD, f"'{title}': {h}") for h in holds]
        out += [line(BAD, f"'{title}': {w}", "the criterion's bound comes from your data, and decides the conclusion")
                for w in wrong]
    if len(explanations) < options["min_count"]:
        out.append(line(MISSING, f"{len(explanations)} explanations, at least {options['min_count']} expected",
                        RULE_EXPLAIN))
    return out


# --------------------------------------------------------------------------- figures

RULE_FIGURE = ("a figure is a PNG plot of submitted data: at least 320x200 pixels, something drawn on it, and "
               "savefig(..., metadata={'Source': 'results/NAME.csv'}) naming the CSV it plots")


def check_figures(text: str, folder: Path, options: dict) -> list[str]:
    embedded = re.findall(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?\s*\)", text)
    out = []
    if len(embedded) < options["min_count"]:
        out.append(line(MISSING, f"{len(embedded)} figures embedded (![...](figures/NAME.png)), "
                                 f"at least {options['min_count']} expected", RULE_FIGURE))
    for target in embedded:
        path = folder / target
        if not readable(folder, path):
            out.append(line(MISSING, f"{target}, which the report embeds, in the submission", RULE_FIGURE))
            continue
        try:
            png = read_png(path)
        except (PngError, OSError, ValueError) as err:
            out.append(line(BAD, f"{target} is not a PNG the grader can read ({err})", RULE_FIGURE))
            continue
        sources = re.findall(r"results/[\w.\-/]+\.csv", png.text.get("Source", ""))
        if png.width < MIN_FIGURE[0] or png.height < MIN_FIGURE[1]:
            out.append(line(BAD, f"{target} is {png.width}x{png.height} pixels: no plot", RULE_FIGURE))
        elif png.drawn_fraction() < MIN_DRAWN:
            out.append(line(BAD, f"{target} is blank ({png.drawn_fraction():.1%} of it differs from the background)",
                            RULE_FIGURE))
        elif not sources:
            out.append(line(MISSING, f"{target}: the CSV it plots (its PNG 'Source' text names none)", RULE_FIGURE))
        elif any(not readable(folder, folder / s) for s in sources):
            out.append(line(BAD, f"{target} plots {', '.join(sources)}, not all of which were submitted", RULE_FIGURE))
        else:
            out.append(line(GOOD, f"{target}: {png.width}x{png.height}, a plot of {', '.join(sources)}"))
    return out


CHECKS = {"call_chain": check_call_chain, "planes": check_planes, "log_excerpts": check_log_excerpts,
          "tables": check_tables, "explanations": check_explanations, "figures": check_figures, "runs": check_runs}
