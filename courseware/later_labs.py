"""What a lab N release does about the labs after N: their stand-ins run, their solutions stay out.

A lab N release stubs the regions of every later lab; its engine still
serves requests because its tools build the engine with stand-ins for the
later labs' parts (courseware/standins/, handed in by courseware/engine.py),
and it ships only those stand-ins: a lab 2 student has no use for a
simplified block manager. The design and its price are in docs/labs.md
("Stand-ins in a release").

`solution_leaks` is the check that a release shows no later lab's solution:
it looks for the lines of their region bodies in every file of the release.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from labkit.labs import later_labs
from labkit.tree import PACKAGE, ReferenceTree, generate

# Body lines shorter than this (`return hits`, `freed = 0`) say nothing about a solution.
DISTINCTIVE_CHARS = 24
TEXT_SUFFIXES = (".py", ".md", ".txt", ".toml", ".json", ".cfg", ".ini")
_INLINE_COMMENT = re.compile(r"\s+#.*$")


def engine_section(lab: str) -> str:
    """The release README's section on running the engine (and, before lab 4, on its stand-ins)."""
    later = later_labs(lab)
    standins = (f"\nThe engine's parts from {', '.join(later)} are stand-ins, not solutions: "
                "`courseware/standins/` says what each one does and what it cannot show (the greedy tokens are "
                "the course engine's; schedules differ only when memory is tight). `courseware.engine.LLM` "
                f"builds your engine with them; `{PACKAGE}.LLM` alone would stop at the later labs' "
                "stubs.\n") if later else ""
    return f"""## Run the engine

Once your regions are written, the whole engine serves requests on the tiny model (CPU):

```bash
python -c "
from courseware.tiny_model import ensure_tiny_model
from courseware.engine import LLM, SamplingParams
llm = LLM(str(ensure_tiny_model()), device='cpu', max_num_seqs=4)
outs = llm.generate(['Hello', 'What is a KV cache?'], SamplingParams(temperature=0.0, max_tokens=16))
print([o['token_ids'] for o in outs])
"
```
{standins}
"""


def _code(line: str) -> str:
    return _INLINE_COMMENT.sub("", line.strip()) if not line.strip().startswith("#") else ""


def distinctive_lines(tree: ReferenceTree, labs: Iterable[str]) -> dict[str, str]:
    """Code line (stripped, no comment) -> region id, for the labs' body lines found nowhere outside bodies."""
    wanted = set(labs)
    outside = {_code(line) for text in generate(tree).values() for line in text.splitlines()}
    found: dict[str, str] = {}
    for region in tree.regions:
        if region.lab in wanted:
            for line in tree.body(region.region_id).splitlines():
                code = _code(line)
                if len(code) >= DISTINCTIVE_CHARS and code not in outside:
                    found.setdefault(code, region.region_id)
    return found


def _texts(root: Path):
    for path in sorted(root.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        if path.suffix == ".ipynb":
            cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
            yield path, "\n".join("".join(cell.get("source", [])) for cell in cells)
        elif path.suffix in TEXT_SUFFIXES:
            yield path, path.read_text(encoding="utf-8", errors="replace")


def solution_leaks(release: Path, tree: ReferenceTree, labs: Iterable[str]) -> dict[str, list[str]]:
    """Region id -> `file (k of n lines)` for each release file holding over half of a region's distinctive lines.

    Half, not one: a stand-in must call the same public methods as the
    solution it replaces (`self.block_manager.allocate(seq)`), and that line
    alone reveals nothing; most of a body's own lines, or all of it, would.
    """
    by_region: dict[str, set[str]] = {}
    for code, region_id in distinctive_lines(tree, labs).items():
        by_region.setdefault(region_id, set()).add(code)
    leaks: dict[str, list[str]] = {}
    for path, text in _texts(release):
        present = {_code(line) for line in text.splitlines()}
        for region_id, lines in by_region.items():
            shown = len(lines & present)
            if 2 * shown > len(lines):
                leaks.setdefault(region_id, []).append(
                    f"{path.relative_to(release).as_posix()} ({shown} of {len(lines)} lines)")
    return leaks
