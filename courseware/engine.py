"""The engine this tree runs: the course's own, or in a student release the student's, with stand-ins.

In the course repository `reference` is the engine and every part is the
course's. A student release ships this module with its imports pointed at
`student_exercises` (as it ships every generated module), and its manifest
(`courseware/manifest.json`, beside this module) names the release's lab: the parts of the labs
after it run on stand-ins (courseware/standins/), because their regions are
stubs there. The release's commands (`inferlab demo`, `inferlab bench`,
`inferlab check`), its tutorials and its public tests build engines through
this module, so each of them runs the student's code wherever there is some,
and the course's engine nowhere: in a release it refuses to load when the
package it found is not the release's own (courseware/release_root.py).
"""
from __future__ import annotations

from pathlib import Path

import reference as _package
from courseware.release_root import same_tree
from labkit.manifest import read_manifest
from reference import Config, SamplingParams, StreamChunk
from reference.engine.parts import EngineParts
from reference.llm import LLM as _LLM, default_parts

# What `from reference import ...` offers, so a tutorial's engine import can point here in a release.
__all__ = ["LLM", "SamplingParams", "Config", "StreamChunk", "engine_parts", "standin_labs"]

ROOT = Path(__file__).resolve().parents[1]     # where `courseware/` is: a release's root, or site-packages
if read_manifest(ROOT) is not None:
    same_tree(_package.__file__, __file__)    # a release's engine is its own package, never another tree's


def standin_labs(root: Path = ROOT) -> list[str]:
    """The labs whose parts run on stand-ins here: those after the release's lab (none in the course repository)."""
    manifest = read_manifest(root)
    return list(manifest.standin_labs) if manifest is not None else []


def engine_parts(tensor_parallel_size: object = 1, root: Path = ROOT) -> EngineParts:
    """The parts an engine of this tree is built from."""
    labs = standin_labs(root)
    if labs:
        from courseware.standins import standin_parts     # shipped only in a release that runs them
        return standin_parts(labs)
    return default_parts(tensor_parallel_size)


class LLM(_LLM):
    """The engine's `LLM`, built from this tree's parts unless `parts` says otherwise."""

    def __init__(self, model: str, parts: EngineParts | None = None, **config_fields):
        super().__init__(model, parts or engine_parts(config_fields.get("tensor_parallel_size", 1)), **config_fields)
