"""Run every tutorial each release ships, on that release's engine, and print a table (docs/labs.md cites it).

Each release is built with its own lab's regions holding the reference bodies
(what a correct student writes), `reference` is made unimportable inside the
kernel, and each notebook runs top to bottom with nbclient, as `inferlab build`
runs it. CI runs two of these notebooks (tests/courseware/test_release_tutorials.py);
this runs them all, which takes minutes.

    python scripts/release_tutorials_run.py [--labs lab1 lab2 lab3 lab4]
"""
from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import nbformat

from courseware.build import execute_notebook
from labkit.tree import PACKAGE, load_reference, splice
from courseware.release import make_release
from courseware.tiny_model import ensure_tiny_model

GUARD = 'import sys\nsys.modules["reference"] = None   # a release has no reference package\n'


def run_release(lab: str, base: Path) -> list[tuple[str, float, str | None]]:
    release = make_release(lab, base / lab)
    tree = load_reference()
    splice(release / PACKAGE, {r.region_id: tree.body(r.region_id) for r in tree.regions if r.lab == lab})
    results = []
    for path in sorted((release / "tutorials").glob("Tutorial_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nb.cells.insert(0, nbformat.v4.new_code_cell(GUARD))
        guarded = path.with_name("guarded_" + path.name)
        nbformat.write(nb, guarded)
        os.environ["PYTHONPATH"] = str(release)
        _, seconds, error = execute_notebook(guarded, timeout=900)
        results.append((path.name, seconds, error))
        print(f"{lab:5} {path.name:36} {seconds:6.0f} s  {'ok' if error is None else 'FAILED'}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", nargs="+", default=["lab1", "lab2", "lab3", "lab4"])
    args = parser.parse_args()
    os.environ.setdefault("INFERLAB_MODEL", str(ensure_tiny_model()))
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for lab in args.labs:
            failed += [(lab, name, error) for name, _, error in run_release(lab, Path(tmp)) if error is not None]
    for lab, name, error in failed:
        print(f"\n{lab} {name} failed:\n{error[-2000:]}")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
