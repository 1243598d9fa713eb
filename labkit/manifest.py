"""A release's manifest: which lab it is for, which labs' parts it runs on stand-ins, and every file's sha256.

`inferlab release` writes it as `courseware/manifest.json`, inside the
package of the release's tools, so it travels with them however the release
is installed (editable, or copied into site-packages by pip). Three readers,
one file:

- the release's own tools: `courseware.engine` learns which later labs'
  parts run on stand-ins (a release holds only its own lab's folder, so it
  could not work that out from the lab registry);
- the self-check: which files the student changed since they were given;
- the grader: a file the release shipped unchanged (its tests' conftest.py,
  its pyproject.toml) is not the student's doing, so it is never flagged.

The grader never trusts a manifest found in a submission for anything that
runs: it computes the manifest of the lab's release from the course itself
(`courseware.release_code`), the same function the release wrote this file from.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

MANIFEST = Path("courseware") / "manifest.json"
PRISTINE = Path(".inferlab") / "pristine"      # in a release: its student_exercises/ exactly as shipped
FORMAT = 1


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Manifest:
    lab: str
    standin_labs: tuple[str, ...]  # the later labs, whose parts run on stand-ins (courseware/standins/)
    files: dict[str, str]          # path relative to the release root -> sha256 of its bytes

    @classmethod
    def of_texts(cls, lab: str, standin_labs: tuple[str, ...], texts: dict[str, str]) -> "Manifest":
        """The manifest of files given as text (UTF-8, as a release writes them)."""
        return cls(lab, tuple(standin_labs), {path: sha256_text(text) for path, text in sorted(texts.items())})

    @classmethod
    def of_folder(cls, lab: str, standin_labs: tuple[str, ...], root: Path) -> "Manifest":
        """The manifest of every file under `root` as it is on disk (caches and the manifest itself aside)."""
        files = {p.relative_to(root).as_posix(): sha256_file(p)
                 for p in sorted(root.rglob("*"))
                 if p.is_file() and "__pycache__" not in p.parts and p != root / MANIFEST}
        return cls(lab, tuple(standin_labs), files)

    def write(self, root: Path) -> Path:
        path = root / MANIFEST
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"format": FORMAT, "lab": self.lab, "standin_labs": list(self.standin_labs), "files": self.files}
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        return path


def read_manifest(root: Path) -> Manifest | None:
    """The manifest of the release rooted at `root`; None where there is none (the course repository).

    A manifest that cannot be read is an error, not an absence: a release
    whose manifest is damaged would otherwise run as if it were the course.
    """
    path = root / MANIFEST
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Manifest(str(data["lab"]), tuple(map(str, data["standin_labs"])), dict(data["files"]))
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is damaged ({type(err).__name__}: {err}); download the release again") from err
