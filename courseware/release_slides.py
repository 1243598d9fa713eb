"""The slide scripts a lab's release ships, running on the release's own engine (issue 33).

Every listing the lectures show comes from a script in `slides_code/`, run
against the reference engine (slides_code/README.md). A student who reruns a
slide in a release should see their own engine do it, as with the tutorials
(courseware/release_tutorials.py): so a lab N release ships the scripts of
lab N's lectures and the earlier labs', with the same import rewrite
(`from reference import ...` -> `from courseware.engine import ...`, every
other `reference.` import -> `student_exercises`), and the shared plumbing
(`_common.py`, `observability.py`). The course's own tools for them
(`_make_listings.py`, `listings.md`) stay in the course.

A script belongs to the lab whose part it shows, or that it needs to show
what it claims: a later lab's part runs on a stand-in in the release, which
would show another design (no prefix caching before lab 2, whole prompts
before lab 3, a dense KV cache before lab 4), and tensor parallelism and KV
transfer need the course's model runner, which only lab 5's release has
(the whole engine). Each script starts by putting its release's root first
on `sys.path` (`python slides_code/X.py` and `python -m slides_code.X` from
the release's root both work), so it runs the release's code whatever else
is installed.
"""
from __future__ import annotations

import ast
from pathlib import Path

from courseware.release_tutorials import on_release_engine
from labkit.labs import lab as lab_entry

SLIDES = "slides_code"
# Imported by the scripts, not scripts themselves: shipped with the first script that needs them.
LIBRARY = ("__init__.py", "_common.py", "observability.py")
# Script -> the lab whose part it shows (docs/labs.md's lab map; slides_code/README.md's lecture table).
SLIDE_LAB = {
    "minimal_log": "lab1", "chat_template": "lab1", "request_timeline": "lab1", "observability_demo": "lab1",
    "sequence_fields": "lab2", "paged_vs_contiguous": "lab2", "prefix_caching": "lab2",
    "batching": "lab3", "chunked_prefill": "lab3",
    "call_chain": "lab4",
    "pd_disaggregation": "lab5", "tensor_parallel": "lab5",
}


def slide_scripts(root: Path) -> list[Path]:
    """The course's slide scripts (each one a lecture listing's runnable version)."""
    return sorted(p for p in (root / SLIDES).glob("*.py") if p.name not in LIBRARY and not p.stem.startswith("_"))


def slides_for(lab: str, root: Path) -> tuple[list[Path], dict[str, str]]:
    """(the scripts lab `lab`'s release ships, {script name: why it is not shipped})."""
    shipped: list[Path] = []
    absent: dict[str, str] = {}
    for path in slide_scripts(root):
        owner = SLIDE_LAB.get(path.stem)
        if owner is None:
            raise ValueError(f"{path.name}: no lab for this slide script in courseware/release_slides.py SLIDE_LAB; "
                             "add it")
        if lab_entry(owner, root).number > lab_entry(lab, root).number:
            absent[path.name] = (f"it belongs to {owner}: here it would run on a stand-in of a part this release "
                                 "does not have yet, not the design the slide shows")
        else:
            shipped.append(path)
    return shipped, absent


def release_script(text: str) -> str:
    """A slide script (or its plumbing) pointed at the release's engine instead of `reference`."""
    return on_release_engine(text)


def reference_imports(text: str) -> list[str]:
    """Lines of a script that still import or use the name `reference` (none may be left in a release:
    `import reference` becomes `import student_exercises`, so a later `reference.x` would fail)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        modules = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                   [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        found += [f"line {node.lineno}: {m}" for m in modules if m.split(".")[0] == "reference"]
        if isinstance(node, ast.Name) and node.id == "reference":
            found.append(f"line {node.lineno}: the name `reference`")
    return found


def readme(shipped: list[str], absent: dict[str, str]) -> str:
    rows = "\n".join(f"python -m {SLIDES}.{Path(name).stem}" for name in shipped)
    left = "".join(f"- `{name}`: {why}.\n" for name, why in absent.items())
    return f"""# slides_code：幻灯片代码（本 release 的版本）

The lecture slides' code listings, as scripts that run on this release's engine: your regions, the earlier
labs' solutions, and stand-ins for the later labs' parts (the README at the release's root says which). Run
them from the release's root once your regions are written:

```bash
{rows}
```

Figures go to `--out DIR` (or `$INFERLAB_SLIDES_OUT`, else a new temporary folder). The lines between
`# --- slide: <title> ---` and `# --- end slide ---` are what the slide shows.
""" + (f"\nScripts of the course not in this release, and why:\n\n{left}" if left else "")


def copy_slides(root: Path, out: Path, lab: str) -> tuple[list[str], dict[str, str]]:
    """Write lab `lab`'s slide scripts into out/slides_code/; return (names shipped, {name: why left out})."""
    shipped, absent = slides_for(lab, root)
    if not shipped:
        return [], absent
    dest = out / SLIDES
    dest.mkdir(parents=True, exist_ok=True)
    for path in [*(root / SLIDES / name for name in LIBRARY), *shipped]:
        text = release_script(path.read_text(encoding="utf-8"))
        leftover = reference_imports(text)
        if leftover:
            raise ValueError(f"{path}: imports of `reference` the release rewrite missed: {leftover}")
        (dest / path.name).write_text(text, encoding="utf-8")
    names = [p.name for p in shipped]
    (dest / "README.md").write_text(readme(names, absent), encoding="utf-8")
    return names, absent
