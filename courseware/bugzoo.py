"""The bug zoo: realistic wrong solutions that each lab's public tests must catch.

Each mutant is one file, `assignments/<lab>_<topic>/bugzoo/<name>.py`, holding data only:

    \"\"\"One line: the mistake, as a student would make it.\"\"\"
    GPU = True        # optional: only a `gpu` test can catch it (CI without CUDA skips it, visibly)
    GRADED_ON_GPU = True   # optional: its public tests catch it on a CPU, but only the grader's GPU items
                           # grade its region, so a grader without CUDA (those items blocked) cannot
    EDITS = {
        "lab2.deallocate": [("block.ref_count -= 1\\n", "")],
    }

Every (old, new) pair replaces text inside that region's *reference* body,
and `old` must occur there exactly once. Writing mutants as edits of the
reference (rather than whole copies of a body) keeps each one short and makes
drift loud: when the reference changes under a mutant, loading it fails and
names the mutant, instead of the mutant silently testing old code.

The files are parsed with `ast` and never imported or executed.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from labkit.tree import ROOT, BodyChoice, ReferenceTree
from labkit.labs import all_labs
from labkit.regions import Region



class MutantError(ValueError):
    """A bug-zoo file that is malformed or no longer applies to the reference."""


@dataclass(frozen=True)
class Mutant:
    lab: str
    name: str
    description: str
    edits: dict[str, tuple[tuple[str, str], ...]]
    path: Path
    gpu: bool = False
    graded_on_gpu: bool = False

    @property
    def mutant_id(self) -> str:
        return f"{self.lab}/{self.name}"

    @property
    def grader_needs_gpu(self) -> bool:
        """Only the grader's GPU items can catch it: without CUDA they are blocked, and it loses nothing."""
        return self.gpu or self.graded_on_gpu

    def bodies(self, tree: ReferenceTree) -> dict[str, str]:
        """Region id -> the mutated body; raises MutantError if an edit no longer applies."""
        out: dict[str, str] = {}
        for region_id, edits in self.edits.items():
            try:
                body = tree.body(region_id)
            except KeyError as err:
                raise MutantError(f"{self.path}: {err.args[0]}") from None
            for old, new in edits:
                count = body.count(old)
                if count != 1:
                    raise MutantError(f"{self.path}: in {region_id}, {old!r} occurs {count} times in the reference "
                                      "body (expected exactly once): update the mutant to the current reference")
                body = body.replace(old, new)
            if body == tree.body(region_id):
                raise MutantError(f"{self.path}: edits leave {region_id} unchanged")
            out[region_id] = body
        return out

    def choice(self, tree: ReferenceTree) -> BodyChoice:
        """Every region keeps its reference body except the mutated ones."""
        bodies = self.bodies(tree)
        return lambda region: bodies.get(region.region_id)


def _literal_edits(path: Path, node: ast.expr) -> dict[str, tuple[tuple[str, str], ...]]:
    try:
        value = ast.literal_eval(node)
    except ValueError as err:
        raise MutantError(f"{path}: EDITS must be a literal dict") from err
    if not isinstance(value, dict) or not value:
        raise MutantError(f"{path}: EDITS must be a non-empty dict of region id -> [(old, new), ...]")
    edits = {}
    for region_id, pairs in value.items():
        if not isinstance(pairs, (list, tuple)) or not pairs or not all(
                isinstance(p, tuple) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in pairs):
            raise MutantError(f"{path}: EDITS[{region_id!r}] must be a non-empty list of (old, new) string pairs")
        edits[region_id] = tuple(pairs)
    return edits


def load_mutant(path: Path) -> Mutant:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    description = ast.get_docstring(tree)
    if not description or "\n" in description.strip():
        raise MutantError(f"{path}: needs a one-line docstring describing the mistake")
    edits, flags = None, {"GPU": False, "GRADED_ON_GPU": False}
    for node in tree.body:
        names = [getattr(t, "id", None) for t in node.targets] if isinstance(node, ast.Assign) else []
        if names == ["EDITS"]:
            edits = _literal_edits(path, node.value)
        elif len(names) == 1 and names[0] in flags:
            flags[names[0]] = ast.literal_eval(node.value)
            if not isinstance(flags[names[0]], bool):
                raise MutantError(f"{path}: {names[0]} must be True or False")
    if edits is None:
        raise MutantError(f"{path}: no EDITS = {{...}} assignment")
    lab = path.parent.parent.name.split("_", 1)[0]      # assignments/labN_<topic>/bugzoo/<name>.py
    for region_id in edits:
        if not region_id.startswith(f"{lab}."):
            raise MutantError(f"{path}: a {lab} mutant may only edit {lab} regions, not {region_id}")
    return Mutant(lab, path.stem, description.strip(), edits, path, flags["GPU"], flags["GRADED_ON_GPU"])


def load_mutants(root: Path = ROOT, lab: str | None = None) -> list[Mutant]:
    """All mutants, sorted by lab and name (optionally one lab's)."""
    paths = [path for each in all_labs(root) if lab in (None, each.lab_id) for path in sorted(each.bugzoo.glob("*.py"))]
    return [load_mutant(p) for p in paths]


def regions_of(mutant: Mutant, tree: ReferenceTree) -> list[Region]:
    return [tree.region(region_id)[1] for region_id in mutant.edits]
