"""Mutation testing of the modules that decide correctness (issue 45): a small self-contained runner.

For each listed module it plants one classic one-line bug at a time (an arithmetic or comparison operator
swapped, `and`/`or` swapped, a `not` dropped, a number or boolean constant changed, a subscript index moved),
runs only the test files mapped to that module (MODULES below) against the mutated copy, and counts the
mutant killed when they fail (or time out). The copy lives in a temporary folder placed first on PYTHONPATH,
so the working tree is never modified. Equivalent mutants (no test can tell them apart) are listed in
tests/mutation/equivalent.json with the reason, keyed by module and mutant id.

  python scripts/mutation.py [MODULE ...] [--list] [--summary tests/mutation/summary.json]

(scripts/mutation.sh runs it with the project's venv; docs/MUTATION.md.)
"""
from __future__ import annotations

import argparse
import ast
import copy
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "sglang_lilicorr"
TOOL = "scripts/mutation.py"
TOOL_VERSION = "1"
EQUIVALENT = ROOT / "tests" / "mutation" / "equivalent.json"

# module (relative to sglang_lilicorr/, no .py) -> the test files that cover it (the only ones a mutant runs)
MODULES: dict[str, list[str]] = {
    "losses": ["tests/test_losses.py"],
    "walk": ["tests/test_walk.py"],
    "oracle": ["tests/test_losses.py"],
    "checkpoint": ["tests/test_checkpoint.py"],
    "train/export": ["tests/test_export_safety.py"],
    "train/state": ["tests/test_train_state.py", "tests/test_export_safety.py"],
    "serving/verification": ["tests/test_verification.py"],
    "serving/server_args": ["tests/test_server_args.py", "tests/test_plugin.py"],
    "serving/kv_rows": ["tests/test_kv_rows.py"],
    "serving/vocab_parallel": ["tests/test_vocab_parallel_served.py"],
    "reference/check": ["tests/test_reference_check.py", "tests/test_reference.py"],
    "reference/sampled_check": ["tests/test_sampled_check.py"],
    "benchmarks/metrics": ["tests/test_bench_metrics.py"],
    "benchmarks/paired": ["tests/test_paired.py"],
}

_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Mult,
          ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult, ast.BitAnd: ast.BitOr, ast.BitOr: ast.BitAnd}
_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
        ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
_BOOL = {ast.And: ast.Or, ast.Or: ast.And}


def _docstring_ids(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _skipped(tree: ast.AST) -> set[int]:
    """Nodes never mutated: docstrings, f-string parts, annotations, and the arguments of `raise`/`print`
    messages are text; type annotations are not executed."""
    skip = _docstring_ids(tree)
    for node in ast.walk(tree):
        roots = []
        if isinstance(node, ast.JoinedStr):
            roots.append(node)
        if isinstance(node, (ast.arg, ast.AnnAssign)) and node.annotation is not None:
            roots.append(node.annotation)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            roots.append(node.returns)
        for r in roots:
            skip.update(id(n) for n in ast.walk(r))
    return skip


def mutation_sites(tree: ast.AST):
    """Yield (node, description, apply) for every mutation; apply(node) changes the node in place."""
    skip = _skipped(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BINOP:
            new = _BINOP[type(node.op)]
            yield node, f"{type(node.op).__name__} -> {new.__name__}", lambda n, new=new: setattr(n, "op", new())
        elif isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _CMP:
                    new = _CMP[type(op)]

                    def apply(n, i=i, new=new):
                        n.ops[i] = new()
                    yield node, f"{type(op).__name__} -> {new.__name__}", apply
        elif isinstance(node, ast.BoolOp):
            new = _BOOL[type(node.op)]
            yield node, f"{type(node.op).__name__} -> {new.__name__}", lambda n, new=new: setattr(n, "op", new())
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "drop not", None  # handled by the transformer below (replaces the node)
        elif isinstance(node, ast.Constant) and not isinstance(node.value, str):
            v = node.value
            if isinstance(v, bool):
                yield node, f"{v} -> {not v}", lambda n: setattr(n, "value", not n.value)
            elif isinstance(v, int):
                new_v = v + 1 if v != 1 else 0
                yield node, f"{v} -> {new_v}", lambda n, new_v=new_v: setattr(n, "value", new_v)
            elif isinstance(v, float):
                new_v = v * 1.5 + 1.0 if v == 0 else v * 1.5
                yield node, f"{v!r} -> {new_v!r}", lambda n, new_v=new_v: setattr(n, "value", new_v)


def mutants(source: str):
    """[(id, line, description, mutated source)] for one module's source, in a stable order."""
    tree = ast.parse(source)
    base = ast.unparse(tree)
    out = []
    sites = list(mutation_sites(tree))
    lines = source.splitlines()
    nots = [n for n in ast.walk(tree) if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)]
    for k, (node, desc, apply) in enumerate(sites):
        line = getattr(node, "lineno", 0)
        if line and "pragma: no mutate" in lines[line - 1]:
            continue
        if apply is None:  # drop not: index among the Not nodes in ast.walk order, then rewrite a copy
            index = next(i for i, n in enumerate(nots) if n is node)
            t2 = copy.deepcopy(tree)
            nots2 = [n for n in ast.walk(t2) if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)]
            nots2[index]._chosen = True

            class _Drop(ast.NodeTransformer):
                def visit_UnaryOp(self, n):
                    self.generic_visit(n)
                    return n.operand if getattr(n, "_chosen", False) else n
            mutated = ast.unparse(ast.fix_missing_locations(_Drop().visit(t2)))
        else:
            t2 = copy.deepcopy(tree)
            node2 = [n for n in ast.walk(t2)][[n for n in ast.walk(tree)].index(node)]
            apply(node2)
            mutated = ast.unparse(t2)
        if mutated == base:
            continue
        out.append((f"L{line}:{desc}", line, desc, mutated))
    # ids must be unique: number repeats on one line
    seen: dict[str, int] = {}
    result = []
    for mid, line, desc, src in out:
        seen[mid] = seen.get(mid, 0) + 1
        result.append((mid if seen[mid] == 1 else f"{mid}#{seen[mid]}", line, desc, src))
    return result


def run_tests(shadow: Path, tests: list[str], timeout: float) -> tuple[bool, float]:
    """(passed, seconds) of the mapped test files with the shadow package first on the path."""
    env = dict(os.environ, PYTHONPATH=str(shadow), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, cwd=shadow, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=timeout)
        return r.returncode == 0, time.monotonic() - t0
    except subprocess.TimeoutExpired:
        return False, time.monotonic() - t0


def run_module(module: str, shadow: Path, equivalent: dict, only: set[str] | None, log) -> dict:
    rel = Path(PACKAGE) / f"{module}.py"
    original = (ROOT / rel).read_text()
    tests = MODULES[module]
    target = shadow / rel
    for pyc in (target.parent / "__pycache__").glob(f"{target.stem}.*.pyc"):
        pyc.unlink()
    ok, base_s = run_tests(shadow, tests, timeout=600)
    if not ok:
        raise SystemExit(f"{module}: the mapped tests {tests} fail without a mutation: fix them first")
    timeout = max(30.0, 3 * base_s + 10)
    equiv = equivalent.get(module, {})
    killed, survived, skipped_equiv = [], [], []
    all_mutants = mutants(original)
    log(f"{module}: {len(all_mutants)} mutants, tests {' '.join(tests)} ({base_s:.1f}s unmutated)")
    try:
        for mid, line, desc, src in all_mutants:
            if only and mid not in only:
                continue
            if mid in equiv:
                skipped_equiv.append({"id": mid, "reason": equiv[mid]})
                continue
            target.write_text(src)
            passed, _ = run_tests(shadow, tests, timeout)
            (survived if passed else killed).append(mid)
            if passed:
                log(f"  SURVIVED {mid}: {(ROOT / rel).read_text().splitlines()[line - 1].strip()[:100]}")
    finally:
        target.write_text(original)
    stale = sorted(set(equiv) - {m[0] for m in all_mutants})
    return {
        "tests": tests,
        "generated": len(all_mutants),
        "killed": len(killed),
        "equivalent": len(skipped_equiv),
        "equivalent_mutants": skipped_equiv,
        "surviving": len(survived),
        "surviving_mutants": survived,
        "stale_equivalent_ids": stale,
    }


def merge_summary(path: Path, results: dict) -> None:
    """Merge {module: result} into the summary JSON at `path` (modules not in `results` keep their last run), under
    an exclusive lock so that two runs may share one file."""
    import fcntl

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    lock_path = Path(tempfile.gettempdir()) / f"lilicorr-mutation-{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        summary = json.loads(path.read_text()) if path.exists() else {}
        summary.setdefault("modules", {})
        for m, r in results.items():
            r.setdefault("commit", commit)
            r.setdefault("run_at", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
            summary["modules"][m] = r
        summary["tool"] = {"name": TOOL, "version": TOOL_VERSION, "python": sys.version.split()[0]}
        summary["not_run"] = [m for m in MODULES if m not in summary["modules"]]
        for m, r in summary["modules"].items():
            denom = r["generated"] - r["equivalent"]
            r["score"] = round(r["killed"] / denom, 4) if denom else None
        done = summary["modules"].values()
        k = sum(r["killed"] for r in done)
        d = sum(r["generated"] - r["equivalent"] for r in done)
        summary["overall_of_run_modules"] = {"killed": k, "generated_minus_equivalent": d,
                                             "score": round(k / d, 4) if d else None}
        path.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")


def recheck(path: Path, modules: list[str], equivalent: dict) -> int:
    """Rerun the surviving mutants of `modules` that the summary at `path` lists; update it."""
    summary = json.loads(path.read_text())
    left = 0
    with tempfile.TemporaryDirectory(prefix="lilicorr-mutation-") as tmp:
        shadow = make_shadow(Path(tmp))
        for m in modules:
            old = summary["modules"][m]
            equiv = equivalent.get(m, {})
            now_equiv = [i for i in old["surviving_mutants"] if i in equiv]
            ids = [i for i in old["surviving_mutants"] if i not in equiv]
            r = run_module(m, shadow, equivalent, set(ids), lambda s: print(s, flush=True)) if ids else None
            still = r["surviving_mutants"] if r else []
            new = dict(old, surviving_mutants=still, surviving=len(still),
                       killed=old["killed"] + len(ids) - len(still),
                       equivalent=old["equivalent"] + len(now_equiv),
                       equivalent_mutants=old["equivalent_mutants"] + [{"id": i, "reason": equiv[i]} for i in now_equiv])
            new.setdefault("rechecks", []).append({
                "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip(),
                "rerun": ids, "now_equivalent": now_equiv, "still_surviving": still})
            print(f"{m}: rechecked {len(ids)} survivors, {len(still)} still survive; {len(now_equiv)} now listed equivalent")
            left += len(still)
            summary["modules"][m] = new
            merge_summary(path, {m: new})
    return 0 if left == 0 else 1


def make_shadow(shadow: Path) -> Path:
    """The shadow tree: a copy of the package, every other top-level entry a link to the working tree; the tests run
    from it (python -m puts the current folder first on sys.path, so its package is the one imported)."""
    shutil.copytree(ROOT / PACKAGE, shadow / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    for entry in ROOT.iterdir():
        if entry.name not in (PACKAGE, ".git"):
            (shadow / entry.name).symlink_to(entry)
    where = subprocess.run([sys.executable, "-c", f"import {PACKAGE}; print({PACKAGE}.__file__)"], cwd=shadow,
                           capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(shadow))).stdout
    if not where.startswith(str(shadow)):
        raise SystemExit(f"the shadow package is not the one imported ({where.strip()}): check PYTHONPATH")
    return shadow


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/mutation.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help=f"modules to mutate (default: all): {', '.join(MODULES)}")
    p.add_argument("--list", action="store_true", help="list each module's mutants and exit")
    p.add_argument("--only", nargs="*", help="run only these mutant ids (one module)")
    p.add_argument("--summary", help="merge the results into this JSON file (e.g. tests/mutation/summary.json)")
    p.add_argument("--recheck", action="store_true",
                   help="with --summary: rerun only the mutants the summary lists as surviving (after new tests or "
                        "equivalence entries) and update their counts; the other mutants keep their last verdict")
    a = p.parse_args(argv)
    modules = a.modules or list(MODULES)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        p.error(f"unknown module(s) {unknown}: one of {', '.join(MODULES)}")
    if a.list:
        for m in modules:
            for mid, line, desc, _ in mutants((ROOT / PACKAGE / f"{m}.py").read_text()):
                print(f"{m} {mid}")
        return 0
    equivalent = json.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    if a.recheck:
        return recheck(Path(a.summary), modules, equivalent)
    results = {}
    with tempfile.TemporaryDirectory(prefix="lilicorr-mutation-") as tmp:
        shadow = make_shadow(Path(tmp))
        for m in modules:
            results[m] = run_module(m, shadow, equivalent, set(a.only) if a.only else None,
                                    lambda s: print(s, flush=True))
            r = results[m]
            denom = r["generated"] - r["equivalent"]
            print(f"{m}: generated {r['generated']}, killed {r['killed']}, equivalent {r['equivalent']}, "
                  f"surviving {r['surviving']}, score {r['killed'] / denom if denom else 1:.3f}", flush=True)
            if a.summary and not a.only:  # after each module: a run cut short keeps what it finished
                merge_summary(Path(a.summary), {m: r})
    return 0 if all(r["surviving"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
