"""Hidden test modules compiled before the fence, so graded code cannot read their sources (copied as `_inferlab_hidden.py`).

Standard library only. The harness's conftest calls `compile_all` before the
fence goes up and `execute` right after it:

- `compile_all` reads and compiles every hidden test file, and puts a
  placeholder for each into `linecache` (comment lines, as many as the file
  has), so that tracebacks, pytest's included, never need the file again;
- the fence then refuses every read beneath the harness's `hidden/` folder
  (audit hook and Landlock: `_inferlab_sandbox.Policy.secret`), while pytest
  may still list it to collect;
- `execute` runs each module's code (after the fence, like every import that
  can reach student code) and registers it in `sys.modules` under the name
  pytest's default import mode gives a test file in a folder without
  `__init__.py` (its stem, `__file__` the file), so pytest's collection finds
  it imported already instead of reading the file.

The price: the code objects are still in the graded process's memory (a
submission can walk up its stack to the calling test's bytecode); what is
gone is the source text, its comments and the tests it does not run.
"""
from __future__ import annotations

import linecache
import os
import sys
import types

PLACEHOLDER = "# (hidden test source: not available while grading)\n"


def compile_all(harness: str) -> list[tuple[str, str, types.CodeType]]:
    """(module name, path, code) of every hidden test file, read now, before the fence."""
    found = []
    root = os.path.join(harness, "hidden")
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if not (name.startswith("test_") and name.endswith(".py")):
                continue
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                source = handle.read()
            code = compile(source, path, "exec", dont_inherit=True)
            lines = source.count(b"\n") + 1
            linecache.cache[path] = (len(source), None, [PLACEHOLDER] * lines, path)
            found.append((name[:-3], path, code))
    return found


def execute(compiled: list[tuple[str, str, types.CodeType]]) -> None:
    """Run each module's code and register it where pytest's import will find it."""
    for name, path, code in compiled:
        module = types.ModuleType(name)
        module.__file__ = path
        module.__builtins__ = __builtins__
        sys.modules[name] = module
        exec(code, module.__dict__)
