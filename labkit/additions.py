"""What a student wrote outside the exercise regions: helpers that are carried, edits that are not.

Students write region bodies, but real solutions also add an `import math` at
the top of the file, a helper function, a constant, or a helper method on the
class they work in. Those are *additions*: new top-level imports, functions,
classes and assignments, and new methods or class attributes of existing
classes. They are carried into whatever runs the student's code (the grader's
harness and the self-check's copy), at the same place relative to the code
around them, so a correct solution written that way scores as it should.

Anything else changed outside the regions (an existing function or method
edited, a statement removed, a new top-level statement that is not a
definition) is an *edit outside the regions*: listed with its file, line and a
short diff, and never applied, because it would change the code the tests were
written against: what the student wrote instead is not run, and the release's
own statement (edited or removed) runs as shipped. The choice costs a little: a helper that needs a changed
line elsewhere in the file does not work. The price buys a rule a student can
state in one sentence (docs/labs.md): add what you like, change nothing.

Comparison is on the syntax tree with every region body blanked out, so
comments, blank lines, hints and the regions themselves never count.
"""
from __future__ import annotations

import ast
import difflib
from collections import defaultdict
from dataclasses import dataclass

from labkit.regions import parse_regions, render

_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign,
                ast.AnnAssign)


@dataclass(frozen=True)
class Addition:
    """One definition the student added; `owner` is the class it belongs to (None: the module)."""

    path: str
    line: int                     # in the student's file
    name: str                     # for messages: "import math", "def _helper", "Class.method"
    owner: str | None
    anchor: tuple | None          # the key of the statement it follows (None: first in its owner)
    text: str                     # its source, dedented


NOT_RUN = "not run: only region bodies and added definitions are"
KEPT = "ignored: the release's version of it still runs"
REPLACED = "not run: the release's version of it runs instead"


@dataclass(frozen=True)
class OutsideEdit:
    """A change outside the regions, and what runs in its place (`runs`, said in the student's terms).

    A removed statement is not "not run": the release's statement is still
    there and runs; only what the student wrote instead of it, or beside it,
    does not.
    """

    path: str
    line: int
    what: str
    diff: str
    runs: str = NOT_RUN

    def describe(self) -> str:
        return f"{self.path}:{self.line}: {self.what} ({self.runs})"


def _key(node: ast.stmt) -> tuple:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return ("import", ast.dump(node))
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return ("def", node.name)
    if isinstance(node, ast.Assign):
        return ("assign", tuple(ast.dump(t) for t in node.targets))
    if isinstance(node, ast.AnnAssign):
        return ("assign", (ast.dump(node.target),))
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
        return ("docstring",)
    return ("stmt", ast.dump(node))


def _same_code(mine: ast.AST, theirs: ast.AST) -> bool:
    """Equal syntax trees, docstrings aside: rewording a docstring changes no behaviour.

    Almost every statement a student leaves alone compares equal as it is, so
    the docstring-free dumps (a deep copy each, most of the grader's time
    reading a submission when done for every statement) are made only when
    the plain dumps differ.
    """
    return ast.dump(mine) == ast.dump(theirs) or _dump_without_docstrings(mine) == _dump_without_docstrings(theirs)


def _dump_without_docstrings(node: ast.AST) -> str:
    import copy
    node = copy.deepcopy(node)
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if (isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)) and body
                and _key(body[0]) == ("docstring",)):
            inner.body = body[1:] or [ast.Pass()]
    return ast.dump(node)


def _defines_new_names_only(node: ast.stmt) -> bool:
    """An assignment is carried only when it binds plain names: `math.isclose = ...` patches, it does not add."""
    if isinstance(node, ast.Assign):
        return all(isinstance(target, ast.Name) for target in node.targets)
    if isinstance(node, ast.AnnAssign):
        return isinstance(node.target, ast.Name)
    return True


def _label(node: ast.stmt, owner: str | None) -> str:
    prefix = f"{owner}." if owner else ""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return ast.unparse(node)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        kind = "class" if isinstance(node, ast.ClassDef) else "def"
        return f"{kind} {prefix}{node.name}"
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return prefix + ", ".join(ast.unparse(t) for t in targets) + " = ..."
    return ast.unparse(node).splitlines()[0][:60]


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _source(lines: list[str], node: ast.stmt) -> str:
    import textwrap
    return textwrap.dedent("".join(lines[_first_line(node) - 1:node.end_lineno]))


def blank_regions(text: str, path: str) -> str:
    """The file with every region body replaced by `pass`: what the comparison looks at."""
    return render(parse_regions(text, path), lambda region: f"{region.indent}pass\n")


def _short_diff(old: str, new: str) -> str:
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), lineterm="", n=0)
    kept = [line for line in lines if not line.startswith(("---", "+++", "@@"))]
    return "\n".join(kept[:6]) + ("\n..." if len(kept) > 6 else "")


def _pairs(body: list[ast.stmt]) -> dict[tuple, list[ast.stmt]]:
    by_key: dict[tuple, list[ast.stmt]] = defaultdict(list)
    for node in body:
        by_key[_key(node)].append(node)
    return by_key


def _compare_body(path: str, mine: list[ast.stmt], theirs: list[ast.stmt], my_lines: list[str],
                  their_lines: list[str], owner: str | None, additions: list[Addition],
                  edits: list[OutsideEdit]) -> None:
    """Compare one body (the module's, or one class's) statement by statement."""
    pristine = _pairs(theirs)
    used: dict[tuple, int] = defaultdict(int)
    anchor: tuple | None = None
    for node in mine:
        key = _key(node)
        if used[key] < len(pristine.get(key, [])):
            original = pristine[key][used[key]]
            used[key] += 1
            _compare_matched(path, node, original, my_lines, their_lines, owner, additions, edits)
            anchor = key
        elif isinstance(node, _DEFINITIONS) and _defines_new_names_only(node):
            additions.append(Addition(path, node.lineno, _label(node, owner), owner, anchor,
                                      _source(my_lines, node)))
        else:
            edits.append(OutsideEdit(path, node.lineno, f"added `{_label(node, owner)}`", _source(my_lines, node)))
    for key, nodes in pristine.items():
        for node in nodes[used[key]:]:
            if _still_imported(node, mine):
                continue          # an import line the student extended: its names still come in, nothing to say
            edits.append(OutsideEdit(path, node.lineno, f"removed `{_label(node, owner)}`",
                                     _short_diff(_source(their_lines, node), ""), KEPT))


def _still_imported(node: ast.stmt, mine: list[ast.stmt]) -> bool:
    """Does some import of the student's bring in every name that the pristine import `node` did?

    `from collections import OrderedDict` turned into `from collections import
    OrderedDict, deque` is not a removal: the new line is carried as an
    addition and the old names stay bound.
    """
    def names(stmt: ast.stmt) -> set[tuple]:
        source = (stmt.module, stmt.level) if isinstance(stmt, ast.ImportFrom) else None
        return {(source, alias.name, alias.asname) for alias in stmt.names}
    if not isinstance(node, (ast.Import, ast.ImportFrom)):
        return False
    theirs = names(node)
    mine_names = set().union(*(names(stmt) for stmt in mine if isinstance(stmt, (ast.Import, ast.ImportFrom))))
    return theirs <= mine_names


def _compare_matched(path: str, mine: ast.stmt, theirs: ast.stmt, my_lines: list[str], their_lines: list[str],
                     owner: str | None, additions: list[Addition], edits: list[OutsideEdit]) -> None:
    if isinstance(mine, ast.ClassDef) and isinstance(theirs, ast.ClassDef) and owner is None:
        header_mine = ast.dump(ast.ClassDef(mine.name, mine.bases, mine.keywords, [], mine.decorator_list))
        header_theirs = ast.dump(ast.ClassDef(theirs.name, theirs.bases, theirs.keywords, [], theirs.decorator_list))
        if header_mine != header_theirs:
            edits.append(OutsideEdit(path, mine.lineno, f"changed the header of `class {mine.name}`",
                                     _short_diff(their_lines[theirs.lineno - 1], my_lines[mine.lineno - 1]),
                                     REPLACED))
        _compare_body(path, mine.body, theirs.body, my_lines, their_lines, mine.name, additions, edits)
        return
    if not _same_code(mine, theirs) and _key(mine) != ("docstring",):
        edits.append(OutsideEdit(path, mine.lineno, f"changed `{_label(mine, owner)}`",
                                 _short_diff(_source(their_lines, theirs), _source(my_lines, mine)), REPLACED))


def compare(student_text: str, pristine_text: str, path: str) -> tuple[list[Addition], list[OutsideEdit]]:
    """The student's additions and edits outside the regions of one file, against what they started from.

    Raises SyntaxError (with the student's line) when the student's file does
    not parse even with the region bodies blanked out: the error is then
    outside the regions.
    """
    mine_text, theirs_text = blank_regions(student_text, path), blank_regions(pristine_text, path)
    if mine_text == theirs_text:
        return [], []       # the usual file: nothing outside its regions changed, so nothing to parse
    mine, theirs = ast.parse(mine_text, filename=path), ast.parse(theirs_text, filename=path)
    additions: list[Addition] = []
    edits: list[OutsideEdit] = []
    _compare_body(path, mine.body, theirs.body, mine_text.splitlines(keepends=True),
                  theirs_text.splitlines(keepends=True), None, additions, edits)
    return additions, edits


def _insertion_line(body: list[ast.stmt], anchor: tuple | None) -> int | None:
    """0-based line index after which an addition goes: after its anchor, else after docstring and __future__."""
    if anchor is not None:
        for node in body:
            if _key(node) == anchor:
                return node.end_lineno
    after = None
    for node in body:
        is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if _key(node) == ("docstring",) or is_future:
            after = node.end_lineno
        else:
            break
    return after if after is not None else _first_line(body[0]) - 1 if body else None


def _past_trailing_comments(lines: list[str], at: int, indent: int) -> int:
    """`at` moved past the comments indented deeper than `indent` that follow it (blank lines between allowed).

    The syntax tree ends a function at its last statement, but the comments
    after it still belong to its body: above all a region's end marker
    (`# <<< EXERCISE ...`) when the region closes the function. An addition
    inserted before that marker would land inside the region.
    """
    end, probe = at, at
    while probe < len(lines):
        stripped = lines[probe].strip()
        if stripped and not (stripped.startswith("#") and len(lines[probe]) - len(lines[probe].lstrip()) > indent):
            break
        probe += 1
        if stripped:
            end = probe
    return end


def apply(text: str, additions: list[Addition]) -> str:
    """`text` (a module the regions were spliced into) with the additions inserted where they belong."""
    if not additions:
        return text
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    inserts: list[tuple[int, int, str]] = []
    for order, addition in enumerate(additions):
        if addition.owner is None:
            at, indent = _insertion_line(tree.body, addition.anchor), ""
        else:
            owner = classes.get(addition.owner)
            if owner is None:
                raise ValueError(f"{addition.path}: class {addition.owner} is not in the file any more")
            at = _insertion_line(owner.body, addition.anchor)
            indent = " " * owner.body[0].col_offset
        if at is not None and addition.anchor is not None:
            at = _past_trailing_comments(lines, at, len(indent))
        block = "".join(indent + line if line.strip() else "\n" for line in addition.text.splitlines(keepends=True))
        inserts.append((at or 0, order, "\n" + block.rstrip("\n") + "\n"))
    for at, _, block in sorted(inserts, key=lambda item: (-item[0], -item[1])):
        lines.insert(at, block)
    return "".join(lines)


def _bound_names(node: ast.stmt) -> list[str]:
    """The names a module- or class-level statement binds (imports, definitions, plain assignments)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(alias.asname or alias.name).split(".")[0] for alias in node.names]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [t.id for t in targets if isinstance(t, ast.Name)]


def _instance_assignments(cls: ast.ClassDef) -> dict[str, tuple[str, int, str]]:
    """attribute -> (method, line, source) of the first `self.<attribute> = ...` in any method of `cls`."""
    found: dict[str, tuple[str, int, str]] = {}
    for method in cls.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)) or not method.args.args:
            continue
        this = method.args.args[0].arg
        for node in ast.walk(method):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
            for target in targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == this and target.attr not in found):
                    found[target.attr] = (method.name, node.lineno, ast.unparse(node).splitlines()[0][:80])
    return found


def clashes(student_text: str, additions: list[Addition], path: str) -> list[str]:
    """Messages for added definitions that the file's own code hides or replaces, naming both.

    A helper method `_lookup` added to a class whose `__init__` sets
    `self._lookup = None` is carried and compiles, yet every call reaches the
    instance attribute (`TypeError: 'NoneType' object is not callable`); a
    module-level helper named like something the file imports or defines
    replaces it for the whole module. Carrying either is right (it is what the
    student wrote); saying so is what turns a baffling error into a rename.
    """
    if not additions:
        return []
    try:
        tree = ast.parse(student_text, filename=path)          # region bodies too: they may set the name
    except SyntaxError:
        tree = ast.parse(blank_regions(student_text, path), filename=path)
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    added_lines = {a.line for a in additions}
    module_names: dict[str, tuple[int, str]] = {}
    for node in tree.body:
        if node.lineno in added_lines:
            continue
        for name in _bound_names(node):
            module_names.setdefault(name, (node.lineno, _label(node, None)))
    messages = []
    for addition in additions:
        if addition.owner is not None:
            cls = classes.get(addition.owner)
            assigned = _instance_assignments(cls) if cls is not None else {}
            for name in _added_names(addition):
                if name in assigned:
                    method, line, source = assigned[name]
                    messages.append(f"{path}:{addition.line}: your added `{addition.owner}.{name}` is hidden by "
                                    f"`{source}` in `{addition.owner}.{method}` (line {line}): every "
                                    f"{addition.owner} gets an instance attribute of that name, which wins over "
                                    f"your definition, so `self.{name}` never reaches it; give yours another name")
            continue
        for name in _added_names(addition):
            if name in module_names:
                line, label = module_names[name]
                messages.append(f"{path}:{addition.line}: your added `{addition.name}` binds `{name}`, which "
                                f"`{label}` (line {line}) binds too: whichever comes later in the file replaces "
                                f"the other for the whole module; give yours another name")
    return messages


def _added_names(addition: Addition) -> list[str]:
    node = ast.parse(addition.text).body[0]
    return [] if isinstance(node, (ast.Import, ast.ImportFrom)) else _bound_names(node)
