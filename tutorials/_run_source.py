"""Run a tutorial source (tutorials/src/Tutorial_*.py) as a plain script; save its figures.

For machines without Jupyter (the course's GPU box): `plt.show()` writes
OUT/<stem>_figN.png instead of opening a window.

    python tutorials/_run_source.py tutorials/src/Tutorial_07_model_runner.py [OUT]
"""
from __future__ import annotations

import os
import runpy
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    source = Path(argv[0]).resolve()
    out = Path(argv[1]).resolve() if len(argv) > 1 else Path(tempfile.mkdtemp(prefix="inferlab-tutorial-"))
    out.mkdir(parents=True, exist_ok=True)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    count = 0

    def save(*args, **kwargs):
        nonlocal count
        count += 1
        plt.savefig(out / f"{source.stem}_fig{count}.png", dpi=100)
        plt.close("all")

    plt.show = save
    started = time.perf_counter()
    os.chdir(source.parent.parent)        # the notebooks run in tutorials/
    runpy.run_path(str(source), run_name="__main__")
    print(f"[run_source] {source.name}: {time.perf_counter() - started:.1f} s, {count} figure(s) in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
