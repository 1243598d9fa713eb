"""One-way dependencies, read from every import statement (including those inside functions).

- Between packages: reference <- labkit <- courseware <- grading <- inferlab (the CLI); nothing imports the CLI.
- Inside `reference/`: each part imports only the parts below it (`REFERENCE_LAYERS`): the engine
  knows nothing of tensor parallelism's worker processes, of serving, or of the course's stand-ins.
- No cycle between modules anywhere in the project.

Read statically, so a lazy import cannot hide a cycle or an upward arrow. The project's own tests may
drive the CLI (`inferlab.cli.main`), as a user would; no shipped module may.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from labkit.labs import ROOT

LAYERS = ["reference", "labkit", "courseware", "grading", "inferlab"]
# Inside reference/, lowest first: a module or subpackage may import only those before it (or itself).
REFERENCE_LAYERS = [
    ["reference.config", "reference.sampling_params", "reference.parallel_state", "reference.metrics",
     "reference.detokenizer", "reference.kernels"],
    ["reference.layers"],
    ["reference.models"],
    ["reference.engine"],
    ["reference.distributed"],
    ["reference.llm"],
    ["reference.serving"],
    ["reference"],          # the package's __init__: the public API
]
# Folders of code that students, instructors or TAs run; none of them may import the CLI package.
OTHER_CODE = ["student_exercises", "slides_code", "tutorials", "scripts", "assignments"]


def imported_names(path: Path) -> set[str]:
    """Dotted names of every absolute import in a module (`from a.b import c` gives `a.b` and `a.b.c`)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every absolute import in a module."""
    return {name.split(".")[0] for name in imported_names(path)}


def modules_under(folder: str, root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module under `root/folder` (packages by their __init__)."""
    found = {}
    for path in sorted((root / folder).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def module_graph(root: Path = ROOT, packages: list[str] = LAYERS) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name resolved to the longest module it starts with)."""
    modules = {name: path for package in packages for name, path in modules_under(package, root).items()}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    return {name: {target for target in map(resolve, imported_names(path)) if target and target != name}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: its strongly connected components of more than one module."""
    order, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in order:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], order[target])
        if low[node] == order[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return found


def reference_layer(module: str) -> int:
    """The index in REFERENCE_LAYERS of the part `module` belongs to (its longest listed prefix)."""
    best, level = "", None
    for index, layer in enumerate(REFERENCE_LAYERS):
        for part in layer:
            if (module == part or module.startswith(part + ".")) and len(part) > len(best):
                best, level = part, index
    if level is None:
        raise AssertionError(f"{module} is in no REFERENCE_LAYERS entry: add its part to the list")
    return level


def upward_in_reference(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} imports {target}" for module, targets in graph.items() if module.startswith("reference")
                  for target in targets
                  if target.startswith("reference") and reference_layer(target) > reference_layer(module))


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_the_layers_below_it(layer):
    above = set(LAYERS[LAYERS.index(layer) + 1:])
    wrong = {f"{path.relative_to(ROOT)} imports {name}" for path in modules_under(layer).values()
             for name in imported_packages(path) & above}
    assert not wrong, sorted(wrong)


def test_inside_reference_each_part_imports_only_the_parts_below_it():
    wrong = upward_in_reference(module_graph())
    assert not wrong, wrong


def test_no_module_imports_itself_through_others():
    found = cycles(module_graph())
    assert not found, f"import cycles: {found}"


@pytest.mark.parametrize("folder", OTHER_CODE)
def test_no_other_code_imports_the_cli_package(folder):
    wrong = [str(path.relative_to(ROOT)) for path in modules_under(folder).values()
             if "inferlab" in imported_packages(path)]
    assert not wrong, f"these import the CLI package `inferlab`; import from courseware/grading instead: {wrong}"


def test_the_checks_see_violations(tmp_path):
    """The checkers themselves: an upward import inside a function, a cycle, and an upward arrow in reference/."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from grading.cli import add_parsers\n    import inferlab.cli\n")
    assert imported_packages(module) == {"grading", "inferlab"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    engine = tmp_path / "reference" / "engine"
    engine.mkdir(parents=True)
    (tmp_path / "reference" / "__init__.py").write_text("")
    (tmp_path / "reference" / "llm.py").write_text("")
    (engine / "__init__.py").write_text("")
    (engine / "llm_engine.py").write_text("def f():\n    from reference.llm import LLM\n")
    graph = module_graph(tmp_path, ["reference"])
    assert upward_in_reference(graph) == ["reference.engine.llm_engine imports reference.llm"]
