"""Mutation testing of the modules that decide correctness: mutmut, one module at a time.

Each run mutates one module (mutmut's `only_mutate`) and runs only the test files MODULES maps it to (mutmut's test
selection; of those, each mutant runs the tests that call its function). [tool.mutmut] in pyproject.toml holds what
the runs share. mutmut works in mutants/, a copy of the tree made afresh for each module; outside it only
tests/mutation/summary.json is written. tests/mutation/equivalent.json lists the mutants no test can tell from the
original by mutmut's id (module.x_function__mutmut_N), each with its mutation (the lines it changes, which must still
match) and the reason.

  python scripts/mutmut_modules.py [MODULE ...] [--max-children N] [--only MUTANT ...]

(scripts/mutation.sh runs it with the project's venv; docs/MUTATION.md.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "sglang_lilicorr"
SUMMARY = ROOT / "tests" / "mutation" / "summary.json"
EQUIVALENT = ROOT / "tests" / "mutation" / "equivalent.json"
KILLED = {"killed", "timeout", "segfault"}  # mutmut's statuses of a mutant whose tests failed or did not finish

# module (relative to sglang_lilicorr/, no .py) -> the test files that cover it (the only ones its mutants run)
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
    "bench/metrics": ["tests/test_bench_metrics.py"],
}


def source(module: str) -> str:
    return f"{PACKAGE}/{module}.py"


def run_mutmut(module: str, max_children: int, only: list[str]) -> None:
    """`mutmut run` on one module with its test files (in a process of its own: mutmut's configuration is global)."""
    from mutmut.configuration import config

    cfg = config()
    cfg.only_mutate = [source(module)]
    cfg.pytest_add_cli_args_test_selection = list(MODULES[module])
    from mutmut.__main__ import cli

    cli(["run", "--max-children", str(max_children), *only])


def statuses(module: str) -> dict[str, str]:
    """mutmut's status of each mutant of `module` in its last run."""
    from mutmut.stats import status_by_exit_code

    meta = json.loads(Path("mutants", source(module) + ".meta").read_text())
    return {mutant: status_by_exit_code[code] for mutant, code in meta["exit_code_by_key"].items()}


def mutation(mutant: str, module: str) -> list[str]:
    """The lines a mutant removes (-) and adds (+), stripped."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    diff = get_diff_for_mutant(mutant, path=source(module)).splitlines()[2:]  # past the ---/+++ header
    return [f"{line[0]} {line[1:].strip()}" for line in diff if line[:1] in ("-", "+")]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def revision(module: str) -> dict:
    """The commit a run of `module` starts from, and the mapped files that differ from it (the run tests them as
    they are)."""
    tree = {"commit": git("rev-parse", "HEAD")}
    uncommitted = git("status", "--porcelain", "--", source(module), *MODULES[module])
    if uncommitted:
        tree["uncommitted"] = [line[3:] for line in uncommitted.splitlines()]
    return tree


def summarize(module: str, status: dict[str, str], listed: dict[str, dict], tree: dict) -> dict:
    """One module's entry of the summary; `listed` is its part of equivalent.json, `tree` its revision()."""
    killed, equivalent, surviving, killed_but_listed = 0, [], [], []
    for mutant, s in status.items():
        if s in KILLED:
            killed += 1
            if mutant in listed:
                killed_but_listed.append(mutant)
        elif mutant in listed and listed[mutant]["mutation"] == mutation(mutant, module):
            equivalent.append({"id": mutant, "reason": listed[mutant]["reason"]})
        else:
            surviving.append(mutant)
    stale = sorted(m for m in listed if m not in status or m in surviving)
    tests = MODULES[module]
    result = {
        "tests": tests,
        "generated": len(status),
        "killed": killed,
        "equivalent": len(equivalent),
        "equivalent_mutants": equivalent,
        "surviving": len(surviving),
        "surviving_mutants": surviving,
        "statuses": {s: list(status.values()).count(s) for s in sorted(set(status.values()))},
        **tree,
        "run_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if stale:  # no longer generated, or the id now names another mutation: look again, then re-key or drop
        result["stale_equivalent_ids"] = stale
    if killed_but_listed:  # a test tells them apart: the listed reason is wrong
        result["killed_but_listed_equivalent"] = killed_but_listed
    denominator = len(status) - len(equivalent)
    result["score"] = round(killed / denominator, 4) if denominator else None
    return result


def write_summary(results: dict[str, dict]) -> None:
    """Merge the modules' entries into the summary (the modules not run keep their last entry)."""
    summary = json.loads(SUMMARY.read_text()) if SUMMARY.exists() else {}
    modules = {**summary.get("modules", {}), **results}
    k = sum(r["killed"] for r in modules.values())
    d = sum(r["generated"] - r["equivalent"] for r in modules.values())
    summary = {
        "tool": {"name": "mutmut", "version": version("mutmut"), "python": sys.version.split()[0]},
        "modules": modules,
        "not_run": [m for m in MODULES if m not in modules],
        "overall_of_run_modules": {
            "killed": k,
            "generated_minus_equivalent": d,
            "score": round(k / d, 4) if d else None,
        },
    }
    SUMMARY.write_text(json.dumps(summary, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def report(module: str, r: dict, status: dict[str, str]) -> None:
    print(
        f"{module}: generated {r['generated']}, killed {r['killed']}, equivalent {r['equivalent']}, "
        f"surviving {r['surviving']}, score {r['score']}",
        flush=True,
    )
    for mutant in r["surviving_mutants"]:
        print(f"  {mutant} ({status[mutant]})")
        for line in mutation(mutant, module):
            print(f"      {line}")
    for key in ("stale_equivalent_ids", "killed_but_listed_equivalent", "uncommitted"):
        if key in r:
            print(f"  {key}: {', '.join(r[key])}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/mutation.sh", description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help=f"modules to mutate (default: all): {', '.join(MODULES)}")
    p.add_argument("--max-children", type=int, default=2, help="mutants run at once (default 2)")
    p.add_argument(
        "--only",
        nargs="+",
        default=[],
        metavar="MUTANT",
        help="run only these mutants (ids or globs, one module) and print their statuses; the summary is not written",
    )
    p.add_argument("--mutmut-run", help=argparse.SUPPRESS)  # the child process of one module
    a = p.parse_args(argv)
    os.chdir(ROOT)  # mutmut reads pyproject.toml and writes mutants/ in the working folder
    if a.mutmut_run:
        run_mutmut(a.mutmut_run, a.max_children, a.only)
        return 0
    modules = a.modules or list(MODULES)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        p.error(f"unknown module(s) {unknown}: one of {', '.join(MODULES)}")
    if a.only and len(modules) != 1:
        p.error("--only takes one module")
    equivalent = json.loads(EQUIVALENT.read_text()) if EQUIVALENT.exists() else {}
    clean = True
    for module in modules:
        shutil.rmtree("mutants", ignore_errors=True)  # every verdict from this run (mutmut keeps old ones otherwise)
        tree = revision(module)
        child = [sys.executable, __file__, "--mutmut-run", module, "--max-children", str(a.max_children)]
        if subprocess.run(child + (["--only", *a.only] if a.only else [])).returncode != 0:
            raise SystemExit(f"{module}: mutmut failed (its output is above)")
        if a.only:
            return 0
        status = statuses(module)
        r = summarize(module, status, equivalent.get(module, {}), tree)
        write_summary({module: r})  # after each module: a run cut short keeps what it finished
        report(module, r, status)
        clean = clean and r["surviving"] == 0 and not {"stale_equivalent_ids", "killed_but_listed_equivalent"} & set(r)
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
