"""Cold start-up, one server at a time (the `startup` step; the start-up target of PERF_NOTES.md): for each round and
system (rotated order), the server starts alone on GPU 0 with an empty Triton cache of its own, so it compiles
everything it needs itself and no other start-up competes for the host's cores; it is up once it answers /health, then
stops.

Per start WORK/startup/starts.jsonl gets one line (a finished start is not redone: the step resumes): the system,
the round, `ready_s` (launch to /health: what an operator waits, Python imports included) and its log's start-up
lines (serve_speed.capture_seconds: graph capture per graph set and their total, the scheduler's whole start-up, its
weight loading, LILICORR's concurrent compiles of the select's kernels before capture).
WORK/startup/startup.json and startup.md: per system the median of each over the rounds, and each system's medians
over the built-in head's (the target: LILICORR's scheduler start-up <= 1.5x the built-in's).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import time
from pathlib import Path

from benchmarks.served.paired import Deadline, rotation
from benchmarks.served.serve_speed import ALL_SYSTEMS as SPEED_SYSTEMS

from .common import Step
from .speed import PORT0, SETTINGS, server_args

DEFAULT_SYSTEMS = ("lilicorr", "builtin")
MEASURES = ("scheduler_e2e", "total", "precompile", "load_weight", "ready_s")  # "total": the graph captures' sum
REFERENCE = "builtin"
FIRST_START_S = 150.0  # what a start is assumed to take before one has been timed (a cold LILICORR start: ~70 s)


def start_once(spec, work: Path, launcher: list[str]) -> dict:
    """One cold start of `spec` (its log: WORK/startup/logs/server-<name>.log) -> {"ready_s", and the log's
    capture_seconds}; its Triton cache is removed after."""
    from benchmarks.served.serve_speed import capture_seconds
    from sglang_lilicorr.train.engine import SGLangServers

    t0 = time.time()
    with SGLangServers.start([spec], work / "logs", launcher=launcher):
        ready = time.time() - t0
    shutil.rmtree(spec.env["TRITON_CACHE_DIR"], ignore_errors=True)
    log = work / "logs" / f"server-{spec.name}.log"
    return {"ready_s": round(ready, 2), **capture_seconds(log.read_text(errors="replace"))}


def summarize(starts: list[dict]) -> dict:
    """starts.jsonl's lines -> {"median": {system: {measure: s}}, "over_builtin": {system: {measure: ratio}},
    "starts": {system: n}}."""
    by = {}
    for s in starts:
        by.setdefault(s["system"], []).append(s)
    median = {
        system: {
            m: round(statistics.median(r[m] for r in rows if m in r), 2) for m in MEASURES if any(m in r for r in rows)
        }
        for system, rows in by.items()
    }
    ref = median.get(REFERENCE, {})
    over = {
        system: {m: round(v / ref[m], 3) for m, v in values.items() if ref.get(m)}
        for system, values in median.items()
        if system != REFERENCE
    }
    return {"median": median, "over_builtin": over, "starts": {system: len(rows) for system, rows in by.items()}}


def table(summary: dict) -> str:
    rows = [
        "| system | starts | scheduler s | graph capture s | select precompile s | weights s | ready s "
        "| scheduler / built-in |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for system, m in summary["median"].items():
        ratio = summary["over_builtin"].get(system, {}).get("scheduler_e2e")
        cells = [m.get(k, "-") for k in ("scheduler_e2e", "total", "precompile", "load_weight", "ready_s")]
        rows.append(
            f"| {system} | {summary['starts'][system]} | {' | '.join(map(str, cells))} | "
            f"{ratio if ratio is not None else '-'} |"
        )
    return "\n".join(rows) + "\n"


def run(args, base_server_args: str) -> int:
    from .common import to_out, variant_env

    from benchmarks import save_json
    from sglang_lilicorr.train.engine import ServerSpec

    work = Path(args.work) / "startup"
    drafts = Path(args.work) / "drafts"
    missing = [s for s in ("dflash", "lilicorr") if not (drafts / s / "config.json").is_file()]
    if missing:
        raise SystemExit(f"{drafts}: no exported draft for {missing}; run `export` first.")
    (work / "logs").mkdir(parents=True, exist_ok=True)
    record = work / "starts.jsonl"
    starts = [json.loads(line) for line in record.read_text().splitlines() if line.strip()] if record.is_file() else []
    done = {(s["system"], s["round"]) for s in starts}
    launcher = shlex.split(args.server_launch or "")  # tests: stand-ins that serve $PORT
    deadline = Deadline(float(os.environ["TESTBED_DEADLINE"]) if os.environ.get("TESTBED_DEADLINE") else None)
    timed, left_out = [], 0  # ready_s of this call's starts; starts the deadline left out
    for r in range(1, args.rounds + 1):
        for system in rotation(list(args.systems), r):
            if (system, r) in done:
                continue
            if not deadline.allows(max(timed, default=FIRST_START_S) + 30):  # + stopping it
                left_out += 1
                continue
            cache = work / "triton_cache" / f"{system}_r{r}"
            shutil.rmtree(cache, ignore_errors=True)
            spec = ServerSpec(
                args.target,
                PORT0,
                "0",
                server_args(base_server_args, system, drafts, SETTINGS[args.setting]),
                {**variant_env(system), "TRITON_CACHE_DIR": str(cache)},
                f"{system}_r{r}",
            )
            line = {"system": system, "round": r, **start_once(spec, work, launcher)}
            timed.append(line["ready_s"])
            print(f"[startup] round {r} {system}: {line}", flush=True)
            with record.open("a") as f:
                f.write(json.dumps(line) + "\n")
            starts.append(line)
    summary = {"setting": args.setting, **summarize(starts)}
    save_json(work / "startup.json", summary)
    (work / "startup.md").write_text(table(summary))
    print((work / "startup.md").read_text())
    to_out(args.out, work / "startup.json", work / "startup.md", record)
    if left_out:
        print(f"[startup] {left_out} start(s) left for lack of time in this call: run the step again (it resumes).")
        return 4
    return 0


def cmd_startup(args) -> int:
    if args.rounds < 1 or not args.systems:
        raise SystemExit(
            f"startup: --rounds must be >= 1 and --systems name one system at least, got {args.rounds}, {args.systems}"
        )
    return run(args, args.server_args)


def arguments(parser) -> None:
    parser.add_argument(
        "--systems", nargs="+", choices=SPEED_SYSTEMS, default=["lilicorr", "builtin"], help="default: lilicorr builtin"
    )
    parser.add_argument("--rounds", type=int, default=3, help="starts per system, in rotated order")
    parser.add_argument("--setting", choices=("graphs32", "graphs16"), default="graphs32", help="as the speed step's")


STEP = Step("startup", "cold start-up, one server at a time, each with an empty Triton cache", cmd_startup, arguments)
