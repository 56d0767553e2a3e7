"""The `compare` step: the equal-budget systems (docs/BASELINES.md) through their servers. The exported drafts of
--systems (default: no speculation and variants.EQUAL_BUDGET) start side by side on one GPU (--gpu), each as stock
SGLang or this plugin serves it (common.speculation_args: DFLASH for dflash and domino, DSPARK for dspark, LILICORR for
lilicorr), with the speed step's pools and graphs (speed.server_args: CUDA graphs to batch 32, --sleep-on-idle), then
two parts:
  rounds  paired, rotated throughput rounds (benchmarks/paired.py) on the speed step's long-form prompts, greedy,
          --max-tokens new tokens -> DIR/round<r>.jsonl; `bench report` (paired ratios to DFLASH and to no
          speculation with 95 % intervals) -> DIR/report/
  tau     every evaluation prompt through each speculative server at T = 0, and at T = 1 under seeds 0, 1, 2
          (`bench run`, --tau-concurrency requests in flight) -> DIR/tau_served.jsonl; `bench report`
          -> DIR/tau_served/ (tau per set, system and temperature, seeds averaged)
DIR is WORK/compare/<the parts, joined by _>, so the two parts can run at once on two GPUs. DIR/budget.json records
each draft's testbed.json (its steps, start and global batch). SGLang verifies T = 1 by rejection sampling only where
flashinfer is installed (the headers-only package: benchmarks/device/README.md); without it the LILICORR server answers
T > 0 with HTTP 400, listed as failed. Both parts resume (runs already played are kept) and stop before
$TESTBED_DEADLINE: call the step again to go on. The bundle compare_<parts>.tar.gz goes to $OUT.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import tarfile
from pathlib import Path

from .common import Step
from .variants import EQUAL_BUDGET

PORT0 = 32100
SYSTEMS = ("base", *EQUAL_BUDGET)
PARTS = ("rounds", "tau")
TAU_RUNS = {0.0: (0,), 1.0: (0, 1, 2)}  # temperature -> seeds: the replay's evaluation outputs (evalgen.EVAL_RUNS)
RESERVE_S = 60.0  # after the last round or tau run: the reports, stopping the servers, the bundle


def check_systems(systems: list[str], drafts: Path) -> None:
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        raise SystemExit(f"--systems {unknown}: choose from {list(SYSTEMS)}.")
    if len(set(systems)) != len(systems) or "dflash" not in systems:
        raise SystemExit(f"--systems {systems}: name each system once, dflash among them (the paired reference).")
    missing = [s for s in systems if s != "base" and not (drafts / s / "config.json").is_file()]
    if missing:
        raise SystemExit(f"{drafts}: no exported draft for {missing}; run `export` first.")


def budget(systems: list[str], drafts: Path) -> dict:
    """{system: its draft's testbed.json} (what `export` recorded: steps, init, global batch); {} where there is
    none."""
    return {
        s: json.loads((drafts / s / "testbed.json").read_text()) if (drafts / s / "testbed.json").is_file() else {}
        for s in systems
        if s != "base"
    }


def run(args, base_server_args: str) -> int:
    from . import eval_sets, speed
    from .common import bench, enough_time, served_tau, to_out

    from benchmarks.served import paired

    from sglang_lilicorr.bench import prompt_file
    from benchmarks import save_json
    from sglang_lilicorr.train.engine import SGLangServers, ServerSpec

    parts = "_".join(p for p in PARTS if p in args.parts)
    work, drafts = Path(args.work) / "compare" / parts, Path(args.work) / "drafts"
    systems = list(args.systems)
    check_systems(systems, drafts)
    if args.rounds < 1 or args.tau_concurrency < 1 or any(c < 1 for c in args.concurrency):
        raise SystemExit("--rounds, --concurrency and --tau-concurrency take integers >= 1.")
    if args.gpu < 0:
        raise SystemExit(f"--gpu {args.gpu}: pass a GPU index >= 0.")
    enough_time("compare", 4.0)  # start-up of the servers and one round
    rows = speed.speed_prompts(eval_sets.read(Path(args.eval_prompts)))
    work.mkdir(parents=True, exist_ok=True)
    save_json(work / "budget.json", budget(systems, drafts))
    (work / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    every = prompt_file.load(work / "prompts.jsonl")
    prompts = {c: every[: speed.prompts_for(c)] for c in args.concurrency}
    deadline = paired.Deadline(float(os.environ["TESTBED_DEADLINE"])) if os.environ.get("TESTBED_DEADLINE") else None
    specs = [
        ServerSpec(
            args.target,
            PORT0 + i,
            str(args.gpu),
            speed.server_args(base_server_args, s, drafts, speed.SETTINGS["graphs32"]),
            {"TRITON_CACHE_DIR": str(work / "triton_cache" / s)},
            s,
        )
        for i, s in enumerate(systems)
    ]
    urls = {s: f"http://127.0.0.1:{PORT0 + i}" for i, s in enumerate(systems)}
    failed, launcher = [], shlex.split(args.server_launch or "")  # tests: stand-ins that serve $PORT
    with contextlib.ExitStack() as stack:
        stack.enter_context(SGLangServers.start(specs, work / "logs", launcher=launcher, warm_first=True))
        if "rounds" in args.parts:
            plan = paired.RoundPlan("compare", args.max_tokens, rounds=args.rounds, reserve_s=RESERVE_S)
            failed += paired.play_rounds(
                urls, prompts, plan, work, deadline=deadline, log=lambda line: print(line, flush=True)
            )
        if "tau" in args.parts:
            failed += served_tau(
                urls,
                TAU_RUNS,
                eval_prompts=Path(args.eval_prompts),
                results=work / "tau_served.jsonl",
                concurrency=args.tau_concurrency,
                max_tokens=args.max_tokens,
                deadline=deadline,
                reserve_s=RESERVE_S,
            )
    rc = 0
    played = {int(p.name.split("_")[0][1:]) for p in (work / "runs").glob("c*_r*_*.jsonl")}
    rounds = paired.merge_rounds(work, systems, {c: every[: speed.prompts_for(c)] for c in sorted(played)}, args.rounds)
    baseline = ("--baseline", "base") if "base" in systems else ()
    if rounds:
        rc |= bench(
            "report", *map(str, rounds), *baseline, "--block-ref", "dflash", "--out", str(work / "report"), cwd=work
        )
    if (work / "tau_served.jsonl").is_file():
        rc |= bench(
            "report",
            str(work / "tau_served.jsonl"),
            "--block-ref",
            "dflash",
            "--no-plots",
            "--out",
            str(work / "tau_served"),
            cwd=work,
        )
    save_json(
        work / "compare_run.json",
        {
            "systems": systems,
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "max_tokens": args.max_tokens,
            "tau_concurrency": args.tau_concurrency,
            "parts": parts,
            "gpu": args.gpu,
            "failed": failed,
            "server_args": {spec.name: " ".join(spec.args) for spec in specs},
        },
    )
    bundle = work / f"compare_{parts}.tar.gz"
    with tarfile.open(bundle, "w:gz") as t:
        for name in (
            "round*.jsonl",
            "report",
            "tau_served.jsonl",
            "tau_served",
            "budget.json",
            "compare_run.json",
            "logs",
        ):
            for p in sorted(work.glob(name)):
                t.add(p, arcname=str(p.relative_to(work)))
    to_out(args.out, bundle)
    print("\n".join(failed) or "[compare] every run finished")
    return 1 if failed or rc else 0


def cmd_compare(args) -> int:
    return run(args, args.server_args)


def arguments(parser) -> None:
    parser.add_argument(
        "--systems",
        nargs="+",
        default=list(SYSTEMS),
        help=f"base (no speculation) and drafts in WORK/drafts (default {' '.join(SYSTEMS)})",
    )
    parser.add_argument("--parts", nargs="+", choices=("rounds", "tau"), default=["rounds", "tau"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="of the paired rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--tau-concurrency", type=int, default=32, help="requests in flight in the served-tau runs")
    parser.add_argument("--gpu", type=int, default=0, help="the GPU the servers share")


STEP = Step(
    "compare",
    "the equal-budget drafts (DFlash, LiLiCorr, Domino, DSpark) side by side: paired tokens/s, served tau",
    cmd_compare,
    arguments,
)
