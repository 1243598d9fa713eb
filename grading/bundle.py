"""`inferlab grade package --lab labN --out autograder.zip`: a Gradescope autograder bundle for one lab.

Gradescope runs one container per submission (gradescope-autograders.readthedocs.io,
"Autograder Specifications"): it unzips the bundle into /autograder/source,
runs setup.sh once when it builds the image, then run_autograder for every
submission. The bundle holds, at its root:

    setup.sh           installs Python, then torch==TORCH_VERSION (the CPU wheel) first and the rest
                       pinned; builds the tiny model into ROOT/cache
    run_autograder     `python -m grading.gradescope`: grades ROOT/submission, writes ROOT/results/results.json
    requirements.txt   every other dependency, pinned to the version installed where the bundle was built
                       (the environment the golden outputs were checked in)
    bundle.json        the lab, the torch pin, whether to publish a leaderboard, whether to grade without Landlock
    course/            what the grader needs and nothing else: reference/, labkit/, courseware/, grading/ and the
                       lab's folder with its rubric, hidden tests and golden outputs (GPU ones too, if built)
    release/           the pristine student package of the lab's release, to lay uploads over

So grading needs nothing of the course repository: `course/` is the course
root the grader runs from (and the fence hides, as it hides the repository).
The price: a bundle is a snapshot; rebuild and re-upload it whenever the
engine, the hidden tests, the rubric or the golden outputs change.
"""
from __future__ import annotations

import importlib.metadata
import json
import re
import shutil
import tempfile
import zipfile
from pathlib import Path

from labkit.labs import ROOT, lab as find_lab
from labkit.tree import load_reference, write_package
from courseware.release_code import TORCH_VERSION, dependencies
from labkit.tree import release_package
from grading.golden import load_golden

COURSE_PACKAGES = ("reference", "labkit", "courseware", "grading")
LAB_PARTS = ("rubric.json", "hidden", "golden.json", "golden_gpu.json")
EXTRA_REQUIREMENTS = ("pytest",)                    # the graded processes run pytest
GRADER_IMPORTS = "torch, transformers, tokenizers, safetensors, xxhash, numpy, rich, pytest"
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
TEMPLATES = Path(__file__).resolve().parent / "gradescope_files"
EXECUTABLE = 0o755


class BundleError(RuntimeError):
    """The bundle cannot be built here (say, a dependency to pin is not installed)."""


def pinned_requirements(root: Path = ROOT) -> list[str]:
    """The project's dependencies but torch, plus pytest, each pinned to the version installed here."""
    pins = []
    for spec in [*dependencies(root), *EXTRA_REQUIREMENTS]:
        name = re.split(r"[ <>=!~;\[]", spec, maxsplit=1)[0]
        if name.lower() == "torch":
            continue
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError as err:
            raise BundleError(f"{name} is not installed here, so there is no version to pin; "
                              f"install the project's dependencies first") from err
    return pins


def _ignore(folder: str, names: list[str]) -> set[str]:
    return {n for n in names if n == "__pycache__" or n.endswith((".pyc", ".pyo")) or n.startswith(".")}


def write_course(dest: Path, lab: str, root: Path = ROOT) -> None:
    """The grader's own copy of the course: its packages and the lab's grading parts."""
    for package in COURSE_PACKAGES:
        shutil.copytree(root / package, dest / package, ignore=_ignore)
    folder = find_lab(lab, root).folder
    target = dest / folder.relative_to(root)
    target.mkdir(parents=True)
    for part in LAB_PARTS:
        source = folder / part
        if source.is_dir():
            shutil.copytree(source, target / part, ignore=_ignore)
        elif source.is_file():
            shutil.copyfile(source, target / part)


def write_release(dest: Path, lab: str, root: Path = ROOT) -> None:
    """The lab's release package as handed out (stubs and all), less its public tests."""
    write_package(release_package(load_reference(root), lab), dest)


def script(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8").replace("@TORCH_VERSION@", TORCH_VERSION) \
        .replace("@TORCH_INDEX@", TORCH_INDEX).replace("@GRADER_IMPORTS@", GRADER_IMPORTS)


def build_bundle(lab: str, out: Path, leaderboard: bool = False, root: Path = ROOT,
                 allow_unfenced: bool = False) -> Path:
    """Write the Gradescope bundle of `lab` to `out` (a .zip); returns its path.

    `allow_unfenced`: grade even where Gradescope's kernel (or container)
    gives no Landlock (grading.unfenced); without it such a submission gets
    the autograder's failure result, which names the risk.
    """
    folder = find_lab(lab, root)
    if not folder.rubric.is_file():
        raise BundleError(f"{lab} has no rubric.json: nothing to grade")
    golden = load_golden(lab) if folder.golden.is_file() else None
    with tempfile.TemporaryDirectory(prefix=f"bundle-{lab}-") as tmp:
        stage = Path(tmp)
        write_course(stage / "course", lab, root)
        write_release(stage / "release", lab, root)
        (stage / "requirements.txt").write_text("\n".join(pinned_requirements(root)) + "\n", encoding="utf-8")
        config = {"lab": lab, "torch": TORCH_VERSION, "leaderboard": leaderboard, "allow_unfenced": allow_unfenced,
                  "golden_fingerprint": golden["fingerprint"] if golden else None}
        (stage / "bundle.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
        for name in ("setup.sh", "run_autograder"):
            (stage / name).write_text(script(name), encoding="utf-8")
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(stage.rglob("*")):
                if path.is_file():
                    info = zipfile.ZipInfo(path.relative_to(stage).as_posix(), date_time=(2020, 1, 1, 0, 0, 0))
                    mode = EXECUTABLE if path.name in ("setup.sh", "run_autograder") else 0o644
                    info.external_attr = (0o100000 | mode) << 16
                    info.compress_type = zipfile.ZIP_DEFLATED
                    archive.writestr(info, path.read_bytes())
    return out
