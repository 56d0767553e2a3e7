"""The import graph of our modules (every import, at module level or in a function, read from the source): no
circles, and every import goes to a layer docs/ARCHITECTURE.md's table allows (PACKAGE_LAYERS, ALLOWED below)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"sglang_lilicorr": ROOT / "sglang_lilicorr"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if "results" not in parts:
                found[".".join([package] + [p for p in parts if p != "__init__"])] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of ours it imports (a package's __init__ only where it is imported by name)."""
    mods = modules()
    graph = {name: set() for name in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
                module = ".".join(p for p in (base, node.module) if p)
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, found = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    graph = import_graph()
    assert (
        "sglang_lilicorr.fast_path.plan" in graph
        and "sglang_lilicorr.kernels.tuning" in graph["sglang_lilicorr.fast_path.plan"]
    )
    assert circles(graph) == []
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_serving_holds_no_instrumentation():
    """The plugin's serving path imports no timer or recorder: those live in benchmarks.instrumentation, which
    SGLang loads through an entry point of its own."""
    graph = import_graph()
    assert "benchmarks.instrumentation.stage_timer" in graph
    for name, imports in graph.items():
        if name.startswith("sglang_lilicorr.serving"):
            assert not any(m.startswith("benchmarks.instrumentation") for m in imports), (name, imports)


def test_the_static_graph_is_the_runtime_graph():
    """No module of ours imports another by a computed name (importlib), so the graph read from the source is the one
    the interpreter follows; the one exception, the kernels package's lazy Triton modules, stays inside kernels/. And
    the CLI is built from a leaf module: no job module imports the `lilicorr` entry module back."""
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "import_module"
            ):
                assert name == "sglang_lilicorr.kernels", (name, node.lineno)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "__import__":
                raise AssertionError((name, node.lineno))
    graph = import_graph()
    assert graph["sglang_lilicorr.cli_args"] <= {"sglang_lilicorr.errors"}
    assert [name for name, imports in graph.items() if "sglang_lilicorr.cli" in imports] == []


# docs/ARCHITECTURE.md's layers: a module's layer is its subpackage's; every other module of the top level (and
# baselines/) is the core, and cli, commands/ and benchmarks/ are the commands.
PACKAGE_LAYERS = {
    "kernels": "kernels",
    "fast_path": "fast path",
    "drafter": "drafter",
    "reference": "reference",
    "train": "train",
    "serving": "serving",
    "instrumentation": "instrumentation",
    "cli": "commands",
    "commands": "commands",
    "benchmarks": "commands",
}
ALLOWED = {  # layer -> the layers it may import (its own included)
    "kernels": {"kernels"},
    "core": {"core", "kernels"},
    "fast path": {"fast path", "core", "kernels"},
    "drafter": {"drafter", "core", "kernels"},
    "reference": {"reference", "fast path", "drafter", "core", "kernels"},  # the proposal pipeline
    "train": {"train", "reference", "fast path", "drafter", "core", "kernels"},
    "serving": {"serving", "fast path", "drafter", "core", "kernels"},
    "instrumentation": {"instrumentation", "serving", "fast path", "drafter", "core", "kernels"},
}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
SGLANG_LAYERS = {"serving", "instrumentation", "commands"}  # the only layers that import SGLang


def layer(module: str) -> str:
    parts = module.split(".")
    return PACKAGE_LAYERS.get(parts[1], "core") if len(parts) > 1 else "core"


def third_party_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def test_every_import_goes_down_the_layers():
    """Each module imports only its own layer and those ALLOWED below it (the commands layer: any); the sets are
    docs/ARCHITECTURE.md's table, so a new module lands in a layer by where it is put."""
    graph = import_graph()
    assert (
        layer("sglang_lilicorr.baselines.dspark") == "core" and layer("sglang_lilicorr.commands.replay") == "commands"
    )
    assert layer("sglang_lilicorr.train.heads") not in ALLOWED["reference"]  # a replay command lives in commands/
    wrong = [
        (name, target)
        for name, imports in graph.items()
        for target in imports
        if layer(name) in ALLOWED and layer(target) not in ALLOWED[layer(name)]
    ]
    assert wrong == []


def test_only_the_serving_side_imports_sglang():
    """SGLang is imported by the plugin (serving/, instrumentation/) and the commands that drive or time it; the
    kernels, the core, the fast path, the drafter, the reference decoder and training run without it, and the kernels
    import nothing but the standard library, torch and triton."""
    roots = {name: third_party_roots(path) for name, path in modules().items()}
    importers = {name for name, found in roots.items() if "sglang" in found}
    assert "sglang_lilicorr.serving.worker" in importers
    assert {name for name in importers if layer(name) not in SGLANG_LAYERS} == set()
    assert all(found <= STDLIB | {"torch", "triton"} for name, found in roots.items() if layer(name) == "kernels")
