"""Plumbing shared by the slide scripts: the model, the output folder, the CPU thread count.

Each script's listing sits between `# --- slide: <title> ---` and `# --- end slide ---`;
everything outside those markers is harness (argument parsing, checks, figures) and
is not meant for the slide. `listings(path)` returns the marked regions.
"""
from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path

OUT_ENV = "INFERLAB_SLIDES_OUT"
MODEL_ENV = "INFERLAB_MODEL"
_REGION = re.compile(r"^[ \t]*# --- slide: (?P<title>.+?) ---\n(?P<body>.*?)^[ \t]*# --- end slide ---", re.M | re.S)


def parse_args(argv: list[str] | None, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=None,
                        help=f"folder for figures and files (default: ${OUT_ENV}, else a new temporary folder)")
    return parser.parse_args(argv)


def out_dir(args: argparse.Namespace) -> Path:
    """Where a script writes figures: --out, then $INFERLAB_SLIDES_OUT, else a fresh temp folder (never the repo)."""
    chosen = args.out or os.environ.get(OUT_ENV)
    path = Path(chosen) if chosen else Path(tempfile.mkdtemp(prefix="inferlab-slides-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def model_dir() -> str:
    """$INFERLAB_MODEL (any Hugging Face Qwen3 folder), else the built-in tiny model."""
    if os.environ.get(MODEL_ENV):
        return os.environ[MODEL_ENV]
    from courseware.tiny_model import ensure_tiny_model
    return str(ensure_tiny_model())


def setup_torch() -> None:
    """On the CPU the tiny model runs faster on one thread: its matmuls take microseconds."""
    import torch
    if not torch.cuda.is_available():
        torch.set_num_threads(1)


def figure_path(out: Path, name: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")  # scripts write files; they never open windows
    return out / name


def listings(path: str | os.PathLike[str]) -> dict[str, str]:
    """{title: code} of every slide region in a script, dedented as it would appear on a slide."""
    import textwrap
    text = Path(path).read_text(encoding="utf-8")
    return {m["title"]: textwrap.dedent(m["body"]).rstrip() + "\n" for m in _REGION.finditer(text)}
