"""The import graph of our modules (every import, at module level or in a function, read from the source): no
circles, and the kernels import nothing of ours outside kernels/ (shared/notes/architecture.md)."""

from __future__ import annotations

import ast
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


def test_kernels_import_only_kernels():
    for name, imports in import_graph().items():
        if name.startswith("sglang_lilicorr.kernels"):
            assert all(m.startswith("sglang_lilicorr.kernels") for m in imports), (name, imports)


def test_serving_holds_no_instrumentation():
    """The plugin's serving path imports no timer or recorder: those live in sglang_lilicorr.instrumentation, which
    SGLang loads through an entry point of its own."""
    graph = import_graph()
    assert "sglang_lilicorr.instrumentation.stage_timer" in graph
    for name, imports in graph.items():
        if name.startswith("sglang_lilicorr.serving"):
            assert not any(m.startswith("sglang_lilicorr.instrumentation") for m in imports), (name, imports)


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


def test_baselines_are_core():
    """The Domino and DSpark heads (baselines/) sit in the core layer: train and reference import them, they import
    nothing above the core (docs/ARCHITECTURE.md)."""
    graph = import_graph()
    above = (
        "sglang_lilicorr.train",
        "sglang_lilicorr.drafter",
        "sglang_lilicorr.reference",
        "sglang_lilicorr.serving",
        "sglang_lilicorr.fast_path",
        "sglang_lilicorr.benchmarks",
        "sglang_lilicorr.cli",
    )
    assert "sglang_lilicorr.baselines.dspark" in graph["sglang_lilicorr.baselines"]
    for name, imports in graph.items():
        if name.startswith("sglang_lilicorr.baselines"):
            assert not any(m.startswith(above) for m in imports), (name, imports)
