"""Fuzz the engine against transformers for longer than CI does.

    python scripts/fuzz_engine.py --seconds 600 [--first-seed 1000]

Each seed is one random case (model shape, engine settings, prompts, stops,
streams or an abort; see courseware/engine_fuzz.py). A failing seed is printed with
its description; rerun it alone with --first-seed N --cases 1.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from courseware.tiny_model import ensure_tiny_model  # noqa: E402
from courseware.engine_fuzz import run_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--cases", type=int, default=None, help="stop after this many cases")
    parser.add_argument("--first-seed", type=int, default=100)
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    tokenizer_dir = str(ensure_tiny_model())
    deadline = time.monotonic() + args.seconds
    seed, failures, done = args.first_seed, 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        while time.monotonic() < deadline and (args.cases is None or done < args.cases):
            try:
                run_case(seed, Path(tmp), tokenizer_dir)
            except AssertionError as err:
                failures += 1
                print(f"FAIL {err}", flush=True)
            seed, done = seed + 1, done + 1
    print(f"{done} cases, {failures} failed (seeds {args.first_seed}..{seed - 1})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
