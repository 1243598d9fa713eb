"""The call chain of a lab report: its functions are a traced step's, and their planes are lecture 7's.

    call_chain    the names in the section's code block are calls of a traced step, in the traced order and
                  nesting (`runs/*_calls.txt`, written by lab5_run.py), and the trace itself names only
                  functions that exist in the engine
    planes        each function of the call chain that lecture 7 places is called by the lecture's plane,
                  and only that one (courseware/lectures.py)
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

from courseware.lectures import PLANE_WORDS, lecture, lecture_plane, stated_planes
from labkit.labs import ROOT
from labkit.tree import PACKAGE, REFERENCE
from grading.report_files import BAD, GOOD, MISSING, files, line, section
from grading.report_markdown import code_blocks

QUALNAME = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)\b")
CALL_LINE = re.compile(r"^(\s*)([A-Za-z_][\w.]*)\s+\[([\w.]+)\]\s*$")


# --------------------------------------------------------------------------- call chain

RULE_CHAIN = "the call chain is copied, in order and nesting, from a submitted runs/NAME_calls.txt"


@lru_cache(maxsize=None)
def engine_functions(module: str) -> frozenset[str]:
    """The qualified names of the functions defined in an engine module (read from its source, never run).

    A trace made in a student release names the engine `student_exercises`
    (the package the release ships, every lab filled in for lab 5): the same
    modules as `reference`, read here from the course's own copy.
    """
    parts = module.split(".")
    if parts[0] == PACKAGE:
        parts[0] = REFERENCE
    if parts[0] != REFERENCE or not all(p.isidentifier() for p in parts):
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
    for number, text in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not text.strip() or text.startswith("#"):
            continue
        match = CALL_LINE.match(text.expandtabs(4))
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
    return [(indent, name) for indent, name, _ in chain_entries(block)]


def chain_entries(block: list[str]) -> list[tuple[int, str, str]]:
    """(indent, qualified name, the rest of the line) of each chain line of a code block."""
    out = []
    for text in block:
        expanded = text.expandtabs(4)
        match = QUALNAME.match(expanded.strip())
        if match:
            out.append((len(expanded) - len(expanded.lstrip()), match.group(1), expanded.strip()[match.end():]))
    return out


def _chain(body: str) -> list[tuple[int, str, str]]:
    """The longest chain of the section's code blocks: the one the report means as its call chain."""
    return max((chain_entries(block) for block in code_blocks(body)), key=len, default=[])


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
    body, out = section(text, options["sections"][0])
    if body is None:
        return out
    chain = [(indent, name) for indent, name, _ in _chain(body)]
    if len(chain) < options["min_count"]:
        return [line(MISSING, f"a call chain: {len(chain)} functions named (Class.method at the start of a code "
                              f"block line), at least {options['min_count']} expected", RULE_CHAIN)]
    names = [name for _, name in chain]
    out += [line(MISSING, f"the call chain never reaches {wanted}", "the chain runs from LLMEngine.step to attention")
            for wanted in options["must_name"] if not any(wanted in name for name in names)]
    traces = files(folder, options["evidence"])
    if not traces:
        return out + [line(MISSING, f"a trace file matching {', '.join(options['evidence'])} (lab5_run.py writes one)",
                           RULE_CHAIN)]
    for trace in traces:
        calls, trace_problems = read_call_tree(trace)
        if not trace_problems and calls and match_chain(chain, calls):
            return out + [line(GOOD, f"the call chain ({len(chain)} functions) is a chain of calls in {trace.name}")]
    return out + [line(BAD, f"the call chain ({' > '.join(names[:4])} ...) is not, in this order and nesting, "
                            f"a chain of calls in {', '.join(t.name for t in traces)}", RULE_CHAIN)] + \
        [line(BAD, p, "a trace names only functions of the engine") for t in traces for p in read_call_tree(t)[1][:3]]


# --------------------------------------------------------------------------- planes

def check_planes(text: str, folder: Path, options: dict) -> list[str]:
    """Each chain line whose function lecture 7 places names that plane, and only that one."""
    body, out = section(text, options["sections"][0])
    if body is None:
        return out
    source = lecture("L7").citation
    rule = f"a function's plane is the one {source} gives it"
    placed = 0
    for _, name, rest in _chain(body):
        settled = lecture_plane(name)
        if settled is None:
            continue
        placed += 1
        plane, why = settled
        said = stated_planes(rest)
        words = f"{PLANE_WORDS[plane][0]} / {PLANE_WORDS[plane][1]}"
        if said == {plane}:
            out.append(line(GOOD, f"{name}: {words}"))
        elif not said:
            out.append(line(MISSING, f"{name}: the line names no plane; {source} puts it on the {words} ({why})",
                            rule))
        else:
            other = "both planes" if len(said) > 1 else PLANE_WORDS[next(iter(said))][0]
            out.append(line(BAD, f"{name}: the report says {other}; {source} puts it on the {words} ({why})", rule))
    if placed < options["min_count"]:
        out.append(line(MISSING, f"{placed} functions of the call chain whose plane the lecture settles, at least "
                                 f"{options['min_count']} expected (e.g. {', '.join(options['must_name'])})", rule))
    chain_names = {name for _, name, _ in _chain(body)}
    out += [line(MISSING, f"{wanted} in the call chain, with its plane", rule)
            for wanted in options["must_name"] if wanted not in chain_names]
    return out
