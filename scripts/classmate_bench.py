"""Does an attacker in the class change an honest classmate's score or grading time?

    python scripts/classmate_bench.py [--rounds 2] [--jobs 2]

Grades lab 2 classes in a temporary folder, alternating (a b a b ...):
  a: the classmate (the reference solution) beside another honest copy of it;
  b: the classmate beside issue 32's attacks (a linked engine/, 2,001 files, a
     name that is not UTF-8, a folder 1,100 deep, a 24 MB module, a disk filler,
     a module just under the module limit made of added functions).
Prints the classmate's score and `timing.wall_s` for each class. Run as root
(the scratch quota's tmpfs, the process fence). docs/grading.md quotes it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

from grading.grade_run import RunOptions, grade_run
from grading.sample_submissions import solved, stubs, with_bodies, write_submission
from grading.scratch import clear
from grading.tree_walk import Limits
from labkit.tree import PACKAGE, load_reference

LAB = "lab2"
DISK_FILL = '''import os, tempfile
block = b"0" * (1 << 20)
for i in range(40):
    try:
        with open(os.path.join(tempfile.gettempdir(), f"fill{i}.bin"), "wb") as out:
            for _ in range(64):
                out.write(block)
    except OSError:
        break
raise NotImplementedError("lab2.allocate")
'''
HELPER = "\n\ndef _helper_{i}(x):\n    y = [x + k for k in range(10)]\n    return sum(y) * 2 - len(y)\n"


def attackers(root: Path, tree) -> None:
    folder = write_submission(root, "att_link_engine", LAB, tree, solved(LAB))
    clear(folder / PACKAGE / "engine")
    (folder / PACKAGE / "engine").symlink_to(root / "classmate" / LAB / PACKAGE / "engine")
    folder = write_submission(root, "att_many_files", LAB, tree, solved(LAB))
    (folder / "aaa").mkdir()
    for i in range(2001):
        (folder / "aaa" / f"{i:04d}.txt").write_text("x")
    folder = write_submission(root, "att_bad_name", LAB, tree, solved(LAB))
    with open(os.fsencode(folder / PACKAGE) + b"/notes\xff.py", "w") as handle:
        handle.write("#\n")
    folder = write_submission(root, "att_deep", LAB, tree, solved(LAB))
    fd = os.open(folder, os.O_RDONLY)
    for _ in range(1100):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    folder = write_submission(root, "att_big_module", LAB, tree, solved(LAB))
    module = folder / PACKAGE / "engine" / "block_manager.py"
    module.write_text(module.read_text() + ("# padding " * 100 + "\n") * 24_000)
    folder = write_submission(root, "att_near_limit", LAB, tree, solved(LAB))
    module = folder / PACKAGE / "engine" / "block_manager.py"
    text, extra, i = module.read_text(), [], 0
    while len(text) + sum(map(len, extra)) < Limits().module_bytes - 200:
        extra.append(HELPER.format(i=i))
        i += 1
    module.write_text(text + "".join(extra))
    fill = stubs(LAB)
    patch = with_bodies({"lab2.allocate": DISK_FILL}, tree)
    write_submission(root, "att_disk", LAB, tree, lambda r: patch(r) if r.region_id == "lab2.allocate" else fill(r))


def one_class(with_attackers: bool, jobs: int) -> tuple[int, float]:
    tree = load_reference()
    work = Path(tempfile.mkdtemp(prefix="inferlab-classmate-"))
    os.chmod(work, 0o755)
    try:
        write_submission(work / "submitted", "classmate", LAB, tree, solved(LAB))
        if with_attackers:
            attackers(work / "submitted", tree)
        else:
            write_submission(work / "submitted", "honest2", LAB, tree, solved(LAB))
        grade_run(RunOptions(LAB, work / "submitted", work / "results", jobs=jobs), show_progress=False)
        result = json.loads((work / "results" / "classmate.json").read_text())
        return result["score"], result["timing"]["wall_s"]
    finally:
        subprocess.run(["rm", "-rf", str(work)], check=False)   # a folder 1,100 deep: shutil.rmtree recurses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for attacked in (False, True):
            score, wall = one_class(attacked, args.jobs)
            times[attacked].append(wall)
            print(f"{'with' if attacked else 'without'} attackers: classmate {score}/100 in {wall:.1f} s", flush=True)
    for attacked, walls in times.items():
        print(f"{'with' if attacked else 'without'} attackers: median {statistics.median(walls):.1f} s over {walls}")


if __name__ == "__main__":
    main()
