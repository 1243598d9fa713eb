"""One JSON result per submission: what `grade run` writes and `grade report` reads.

The format is fixed by grading/schemas/result.schema.json (tests validate
every result written against it). Fields that depend on the machine's speed
or the clock (`timing`, `measurements`, each item's `wall_s` and `output_tail`)
are the only ones allowed to differ when the same work is graded twice;
`stable_view` drops them, and the determinism test compares the rest.
"""
from __future__ import annotations

import json
import os
import platform
import tempfile
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from grading import RESULT_FORMAT

STATUSES = ("passed", "failed", "timeout", "error", "blocked", "pending")
VOLATILE_TOP = ("timing", "measurements")
VOLATILE_ITEM = ("wall_s", "output_tail", "measurements")
PACKAGES = ("torch", "transformers", "tokenizers", "pytest", "numpy", "inferlab")


@dataclass
class ItemResult:
    id: str
    title: str
    kind: str
    points: int
    score: int
    status: str
    message: str
    details: list[str] = field(default_factory=list)      # the first difference, with context
    flags: list[str] = field(default_factory=list)        # attempts and anomalies seen while running it
    tests: dict[str, int] | None = None                   # {"expected": n, "passed": m}
    wall_s: float = 0.0
    output_tail: str = ""
    measurements: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"item status {self.status!r} is not one of {STATUSES}")
        if not 0 <= self.score <= self.points or (self.status == "passed" and self.score != self.points):
            raise ValueError(f"item {self.id}: score {self.score} of {self.points} does not fit status {self.status}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def device_description(cuda: bool) -> str:
    if not cuda:
        return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"
    import torch
    return f"cuda ({torch.cuda.get_device_name(0)})"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write via a temp file and rename, so a crash never leaves a half-written result behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1, ensure_ascii=False)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_result(path: Path) -> dict[str, Any] | None:
    """A result file, or None if it is missing, unreadable or not a finished result."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("format") != RESULT_FORMAT or not data.get("complete"):
        return None
    return data


def stable_view(result: dict[str, Any]) -> dict[str, Any]:
    """The result without the fields that may legitimately change between two gradings of the same work."""
    out = {k: v for k, v in result.items() if k not in VOLATILE_TOP}
    out["items"] = [{k: v for k, v in item.items() if k not in VOLATILE_ITEM} for item in result.get("items", [])]
    return out
