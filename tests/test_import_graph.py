"""The import graph of our modules (every import, at module level or in a function, read from the source): no
circles; every import of the product goes to a layer docs/ARCHITECTURE.md's table allows (PACKAGE_LAYERS, ALLOWED
below); the product never imports the lab; and what `pip install` ships is the product alone, and small."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"sglang_lilicorr": ROOT / "sglang_lilicorr", "benchmarks": ROOT / "benchmarks"}  # the product, the lab
# lines of Python that `pip install` ships: 15.2k (the goal is 15,000); raise it on purpose only, never for a module of
# the lab
MAX_PRODUCT_LINES = 15_000


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


def guarded(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a `try` that catches ImportError (an older tree's name, tried on purpose)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
            isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError") for h in node.handlers
        ):
            found |= {id(n) for n in ast.walk(node)}
    return found


def test_every_import_of_ours_names_a_module_that_exists():
    """An import of sglang_lilicorr or benchmarks names a module of this tree (in `from M import N`, M is one), so
    nothing of ours resolves to a copy elsewhere on the path (an older install of the package, say)."""
    mods = modules()
    missing = []
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        skip = guarded(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
                targets = [".".join(p for p in (base, node.module) if p)]
            else:
                continue
            missing += [(name, t) for t in targets if t.split(".")[0] in PACKAGES and t not in mods]
    assert missing == []


def product(name: str) -> bool:
    return name.split(".")[0] == "sglang_lilicorr"


def test_the_product_never_imports_the_lab():
    """No module of sglang_lilicorr imports benchmarks/ (micro-benchmarks, studies, the testbed, the instrumentation
    plugin with its timer and recorder) nor anything else of the checkout that pip does not install; the lab imports
    the product."""
    graph = import_graph()
    assert "sglang_lilicorr.serving.worker" in graph["benchmarks.instrumentation.plugin"]
    assert [
        (name, target) for name, imports in graph.items() if product(name) for target in imports if not product(target)
    ] == []
    checkout = {p.stem for p in ROOT.iterdir() if p.is_dir() or p.suffix == ".py"} - {"sglang_lilicorr"}
    roots = {name: third_party_roots(path) for name, path in modules().items() if product(name)}
    assert {(name, r) for name, found in roots.items() for r in found & checkout} == set()


def shipped() -> tuple[list[str], dict]:
    """setup.py's packages (its find_packages(include=...) call, run here) and its entry points."""
    from setuptools import find_packages

    calls = {
        n.func.id: n
        for n in ast.walk(ast.parse((ROOT / "setup.py").read_text()))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    packages = find_packages(str(ROOT), **{k.arg: ast.literal_eval(k.value) for k in calls["find_packages"].keywords})
    (entry_points,) = [k.value for k in calls["setup"].keywords if k.arg == "entry_points"]
    return packages, ast.literal_eval(entry_points)


def test_pip_installs_the_product_alone():
    """setup.py ships sglang_lilicorr and its subpackages, nothing of the lab, in at most MAX_PRODUCT_LINES lines of
    Python, and its entry points name only what it ships: the lab's instrumentation plugin registers itself
    (benchmarks/instrumentation/entry_point)."""
    packages, entry_points = shipped()
    assert "sglang_lilicorr.serving" in packages and all(product(p) for p in packages)
    lines = sum(len(f.read_text().splitlines()) for p in packages for f in (ROOT / p.replace(".", "/")).glob("*.py"))
    assert lines <= MAX_PRODUCT_LINES, f"the installed package holds {lines} lines of Python"
    targets = {entry.split("=")[1].split(":")[0].strip() for group in entry_points.values() for entry in group}
    assert targets == {"sglang_lilicorr.cli", "sglang_lilicorr.serving.plugin"}


def test_the_static_graph_is_the_runtime_graph():
    """No module of the product imports another by a computed name (importlib), so the graph read from the source is
    the one the interpreter follows; the one exception, the kernels package's lazy Triton modules, stays inside
    kernels/. And the CLI is built from a leaf module: no job module imports the `lilicorr` entry module back."""
    for name, path in modules().items():
        if not product(name):  # the lab's entry point imports the step it runs by name
            continue
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
    assert [name for name, imports in graph.items() if product(name) and "sglang_lilicorr.cli" in imports] == []


# docs/ARCHITECTURE.md's layers of the product: a module's layer is its subpackage's; every other module of the top
# level (and baselines/) is the core, and cli, commands/ and bench/ are the commands. The lab may import any of them.
PACKAGE_LAYERS = {
    "kernels": "kernels",
    "fast_path": "fast path",
    "drafter": "drafter",
    "reference": "reference",
    "train": "train",
    "serving": "serving",
    "cli": "commands",
    "commands": "commands",
    "bench": "commands",
}
ALLOWED = {  # layer -> the layers it may import (its own included)
    "kernels": {"kernels"},
    "core": {"core", "kernels"},
    "fast path": {"fast path", "core", "kernels"},
    "drafter": {"drafter", "core", "kernels"},
    "reference": {"reference", "fast path", "drafter", "core", "kernels"},  # the proposal pipeline
    "train": {"train", "reference", "fast path", "drafter", "core", "kernels"},
    "serving": {"serving", "fast path", "drafter", "core", "kernels"},
}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
SGLANG_LAYERS = {"serving", "commands"}  # the only layers of the product that import SGLang


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
        if product(name) and layer(name) in ALLOWED and layer(target) not in ALLOWED[layer(name)]
    ]
    assert wrong == []


def test_only_the_serving_side_imports_sglang():
    """SGLang is imported by the plugin (serving/) and the commands that drive it; the kernels, the core, the fast
    path, the drafter, the reference decoder and training run without it, and the kernels import nothing but the
    standard library, torch and triton."""
    roots = {name: third_party_roots(path) for name, path in modules().items() if product(name)}
    importers = {name for name, found in roots.items() if "sglang" in found}
    assert "sglang_lilicorr.serving.worker" in importers
    assert {name for name in importers if layer(name) not in SGLANG_LAYERS} == set()
    assert all(found <= STDLIB | {"torch", "triton"} for name, found in roots.items() if layer(name) == "kernels")
