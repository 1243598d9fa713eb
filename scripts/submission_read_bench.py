"""How long and how much memory reading one submission takes when a module sits just under the module limit.

    python scripts/submission_read_bench.py [--kib N]

Writes a solved lab 2 submission whose engine/block_manager.py is padded with
small added functions (code, not comments: extraction compares and checks
every added definition) up to N KiB (default: `grading.tree_walk.Limits`'s
module limit), then reads it as the grader does (`read_submission` into a
copy, `extract`) under tracemalloc. docs/grading.md quotes its output for the
chosen limit.
"""
from __future__ import annotations

import argparse
import tempfile
import time
import tracemalloc
from pathlib import Path

from grading.sample_submissions import solved, write_submission
from grading.submission import extract, read_submission
from grading.tree_walk import Limits
from labkit.tree import PACKAGE, load_reference

HELPER = "\n\ndef _helper_{i}(x):\n    y = [x + k for k in range(10)]\n    return sum(y) * 2 - len(y)\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", type=int, default=Limits().module_bytes >> 10)
    args = parser.parse_args()
    tree = load_reference()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_submission(Path(tmp), "s", "lab2", tree, solved("lab2"))
        module = folder / PACKAGE / "engine" / "block_manager.py"
        text, extra, i = module.read_text(), [], 0
        while len(text) + sum(map(len, extra)) < (args.kib << 10) - 200:
            extra.append(HELPER.format(i=i))
            i += 1
        module.write_text(text + "".join(extra))
        size = module.stat().st_size
        tracemalloc.start()
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as copy:
            read_submission(folder, copy_to=Path(copy))
            extraction = extract(Path(copy) / PACKAGE, tree, "lab2")
        seconds = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
    print(f"module {size} bytes ({i} added functions, {len(extraction.bodies)} region bodies): "
          f"read and extracted in {seconds:.2f} s, Python memory peak {peak / (1 << 20):.0f} MiB")


if __name__ == "__main__":
    main()
