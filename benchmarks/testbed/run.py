"""The testbed's command line: `python -m testbed STEP ...` (or `python -m testbed.run STEP ...`), one module per step.

  prompts     CPU machine: held-out eval prompts -> testbed/eval_prompts.jsonl (prompts.py)
  data        training data through SGLang servers, one per GPU (`lilicorr regenerate --recipe`; data.py)
  sweep       drafter depth, then batch: short LiLiCorr runs, one per GPU, equal wall time (sweep.py)
  train       the variants in the background (torchrun; the GPUs split among them), same data, steps, seed (train.py)
  wait        until the background runs end, or --minutes pass (exit 4 while they still run; train.py)
  export      final checkpoints -> WORK/drafts/<variant>, copies to $OUT (export.py)
  evalgen     the target's own outputs on the eval prompts: T = 0, and T = 1 under seeds 0, 1, 2 (evalgen.py)
  replay      tau of every draft on those outputs (exact replay), one process per GPU (replay.py)
  speed       served speed: LILICORR vs the built-in LiLiCorr vs DFLASH vs no speculation (and the two verify
              variants; --systems picks), paired rounds (speed.py)
  startup     cold start-up, one server at a time, each with an empty Triton cache (startup.py)
  compare     issue 42's equal-budget drafts (DFlash, LiLiCorr, Domino, DSpark) served side by side: paired tokens/s,
              tau through the servers at T = 0 and T = 1 x 3 seeds (compare.py)
  tables      checkpoints/results.json fields, tables and curves (report.py)
  long-pack   (with --long) WORK0's conversations packed into long ones in WORK/data (long_pack.py, long_inputs.py)
  long-serve  (with --long) each exported long draft served at 1K / 4K / 8K input tokens: tau, tokens/s, failures
              (long_serve.py)

On the project's GPU machine they run through `bash tools/device/testbed.sh STEP ...` (the device kit's environment).
WORK defaults to /tmp/testbed, the target to /tmp/smol/model; $OUT receives small copies. Every step resumes: what a
step finished is not redone. See variants.py for sizes, variants and the sweep. One setting comes from the
environment, because a device call's wrapper sets it for every step of the call: TESTBED_DEADLINE (epoch seconds),
past which a step that would not finish exits 4 instead of starting.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from sglang_lilicorr.benchmarks.serve_speed import ALL_SYSTEMS as SPEED_SYSTEMS

from . import eval_sets, long_inputs
from .common import SERVER_ARGS, enough_time, with_backends
from .data import cmd_data
from .evalgen import cmd_evalgen
from .export import cmd_export
from .compare import SYSTEMS as COMPARE_SYSTEMS
from .long_pack import cmd_long_pack
from .long_serve import cmd_long_serve
from .prompts import cmd_prompts
from .replay import cmd_replay
from .sweep import cmd_sweep
from .train import cmd_train, cmd_wait
from .variants import PAPER_GLOBAL_BATCH, VARIANTS


def cmd_speed(args) -> int:
    from . import speed

    if args.profile_steps < 0:
        raise SystemExit(f"--profile-steps must be >= 0 (0: no profile), got {args.profile_steps}")
    systems = len(speed.systems_for(args))  # refuses a set without the four summarized systems, or a resumed other set
    cells = len(args.concurrency or speed.DEFAULT_CONCURRENCY[args.setting])
    # minutes: the servers' start-up side by side (2.5 for all six), a round of a cell (0.2 for six), the profile pass
    startup, per_round = 1.0 + 0.25 * systems, 0.2 * systems / len(speed.SYSTEMS)
    enough_time("speed", startup + per_round * args.rounds * cells + (0.5 if args.profile_steps else 0.0))
    return speed.run(args, args.server_args)


def cmd_startup(args) -> int:
    from . import startup

    if args.rounds < 1 or not args.systems:
        raise SystemExit(
            f"startup: --rounds must be >= 1 and --systems name one system at least, got {args.rounds}, {args.systems}"
        )
    return startup.run(args, args.server_args)


def cmd_compare(args) -> int:
    from . import compare

    return compare.run(args, args.server_args)


def cmd_tables(args) -> int:
    from . import report

    return report.write(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m testbed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--work", default="/tmp/testbed", help="work directory (default /tmp/testbed)")
    p.add_argument("--target", default="/tmp/smol/model", help="HF folder of the target")
    p.add_argument("--out", default=os.environ.get("OUT"), help="copy small results here (default $OUT)")
    p.add_argument("--eval-prompts", default=str(eval_sets.DEFAULT_FILE))
    p.add_argument(
        "--override", action="append", help="KEY=JSON over variants.SCALE / SCHEDULE (tests shrink the models)"
    )
    p.add_argument(
        "--long",
        action="store_true",
        help="the long-input lineage: variants.LONG over the schedule (use a --work of its own)",
    )
    p.add_argument(
        "--server-args",
        default=SERVER_ARGS,
        help="the SGLang servers' arguments (default: what the GPU "
        "machine's kit needs); the `speed` and `long-serve` steps set their pools and graphs over them",
    )
    p.add_argument(
        "--attention-backend",
        metavar="BACKEND",
        help="the target's --attention-backend in every server of every step, over --server-args' (e.g. flashinfer; "
        "the `speed` step keeps another backend's rounds in a setting folder of its own, WORK/speed/SETTING_BACKEND)",
    )
    p.add_argument(
        "--sampling-backend",
        metavar="BACKEND",
        help="the servers' --sampling-backend, over --server-args' (e.g. flashinfer)",
    )
    p.add_argument(
        "--engine",
        choices=("sglang", "transformers"),
        default="sglang",
        help="what generates for `data` and "
        "`evalgen`: SGLang servers, one per GPU, or the target in this process through transformers (CPU)",
    )
    p.add_argument(
        "--server-launch",
        metavar="CMD",
        help="tests: start each server of `speed`, `startup` and `long-serve` with CMD "
        "(a stand-in that serves $PORT) instead of SGLang",
    )
    sub = p.add_subparsers(dest="step", required=True)

    s = sub.add_parser("prompts", help="CPU machine: sample the evaluation sets into testbed/eval_prompts.jsonl")
    s.add_argument("--per-set", type=int, default=24)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-chars", type=int, default=3000, help="skip longer prompts")
    s.add_argument("--file", default=str(eval_sets.DEFAULT_FILE))
    s.set_defaults(func=cmd_prompts)

    s = sub.add_parser("data", help="training data through SGLang (resumable)")
    s.add_argument("--magpie", type=int, default=36000)
    s.add_argument("--package", type=int, default=4000)
    s.add_argument("--second-turns", type=float, default=0.3)
    s.add_argument("--heldout", type=int, default=256)
    s.add_argument("--max-new-tokens", type=int, default=512)
    s.add_argument("--concurrency", type=int, default=256, help="requests in flight per server")
    s.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="start no conversation after this many minutes; the set "
        "closes at what was generated (0: play the whole recipe)",
    )
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_data)

    s = sub.add_parser("sweep", help="depth, then batch: short runs, one per GPU (resumable by round)")
    s.add_argument("--minutes", type=float, default=1.0, help="wall time of each sweep run")
    s.set_defaults(func=cmd_sweep)

    s = sub.add_parser("train", help="start the variants in the background")
    s.add_argument("variants", nargs="+", help=f"of {sorted(VARIANTS)}")
    s.add_argument("--minutes", type=float, default=7.5, help="wall time each run is planned for")
    s.add_argument("--evals", type=int, default=8, help="held-out evaluations (curve points) per run")
    s.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="hard wall-time cap of each run (the schedule is cut there; default twice --minutes)",
    )
    s.add_argument("--init", help="start each variant from DIR/<variant>, an exported draft of the same geometry")
    s.add_argument(
        "--init-draft",
        metavar="DRAFT",
        help="start every variant from this one exported draft (issue 42's equal budget: the shipped DFlash draft)",
    )
    s.add_argument(
        "--steps", type=int, default=0, help="optimizer steps of every run (default 0: planned from --minutes)"
    )
    s.add_argument(
        "--global-batch",
        type=int,
        default=0,
        help="sequences per optimizer step, reached by gradient accumulation over the sweep's batch and the "
        f"variant's GPUs (the paper's: {PAPER_GLOBAL_BATCH}; default 0: the sweep's batch, no accumulation)",
    )
    s.set_defaults(func=cmd_train)

    s = sub.add_parser("wait", help="poll the background runs")
    s.add_argument("--minutes", type=float, default=9.0)
    s.set_defaults(func=cmd_wait)

    s = sub.add_parser("export", help="final checkpoints -> WORK/drafts/<variant>")
    s.set_defaults(func=cmd_export)

    s = sub.add_parser("evalgen", help="the target's outputs on the eval prompts (T = 0; T = 1 x 3 seeds)")
    s.add_argument("--max-new-tokens", type=int, default=256)
    s.set_defaults(func=cmd_evalgen)

    s = sub.add_parser("replay", help="tau of the exported drafts on the evaluation outputs")
    s.add_argument("--drafts", nargs="+", default=["lilicorr", "dflash", "no_dist", "margin"])
    s.add_argument("--gpu-ids", type=int, nargs="+", help="GPUs the replay processes share (default: all)")
    s.set_defaults(func=cmd_replay)

    s = sub.add_parser(
        "speed", help="served speed: the --systems' servers in paired, rotated rounds, no instrumentation (speed.py)"
    )
    s.add_argument(
        "--systems",
        nargs="+",
        choices=SPEED_SYSTEMS,
        default=None,
        help=f"the servers (default: all but lilicorr_viterbi; played in the order {' '.join(SPEED_SYSTEMS)}); "
        "base, dflash, builtin and lilicorr must be among them, and a setting's calls must all name the same",
    )
    s.add_argument(
        "--setting",
        choices=("graphs32", "graphs16"),
        default="graphs32",
        help="CUDA graphs up to batch 32, or to 16 (c = 32 then runs the eager path)",
    )
    s.add_argument("--concurrency", type=int, nargs="+", help="default: 1 4 8 16 32 (graphs32), 32 (graphs16)")
    s.add_argument("--rounds", type=int, default=5)
    s.add_argument("--max-tokens", type=int, default=256)
    s.add_argument(
        "--tau-check",
        action="store_true",
        help="after the rounds, serve every eval prompt once at c = 8 (tau through the server)",
    )
    s.add_argument(
        "--profile-steps",
        type=int,
        default=12,
        help="forward passes profiled per server at c = 1 after the rounds, in their own pass (0: no profile)",
    )
    s.set_defaults(func=cmd_speed)

    s = sub.add_parser("startup", help="cold start-up, one server at a time, a fresh Triton cache each (startup.py)")
    s.add_argument(
        "--systems", nargs="+", choices=SPEED_SYSTEMS, default=["lilicorr", "builtin"], help="default: lilicorr builtin"
    )
    s.add_argument("--rounds", type=int, default=3, help="starts per system, in rotated order")
    s.add_argument("--setting", choices=("graphs32", "graphs16"), default="graphs32", help="as the speed step's")
    s.set_defaults(func=cmd_startup)

    s = sub.add_parser(
        "compare", help="equal-budget drafts served side by side: paired tokens/s, served tau (compare.py)"
    )
    s.add_argument(
        "--systems",
        nargs="+",
        default=list(COMPARE_SYSTEMS),
        help=f"base (no speculation) and drafts in WORK/drafts (default {' '.join(COMPARE_SYSTEMS)})",
    )
    s.add_argument("--parts", nargs="+", choices=("rounds", "tau"), default=["rounds", "tau"])
    s.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32], help="of the paired rounds")
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--max-tokens", type=int, default=256)
    s.add_argument("--tau-concurrency", type=int, default=32, help="requests in flight in the served-tau runs")
    s.add_argument("--gpu", type=int, default=0, help="the GPU the servers share")
    s.set_defaults(func=cmd_compare)

    s = sub.add_parser("long-pack", help="(--long) WORK0's conversations packed into long ones in WORK/data")
    s.add_argument("--source", required=True, help="the work folder whose `data` step wrote the conversations")
    s.add_argument(
        "--min-tokens", type=int, default=3584, help="each packed conversation renders to at least this many tokens"
    )
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=cmd_long_pack)

    s = sub.add_parser(
        "long-serve", help="(--long) each exported long draft served at long inputs: tau, tokens/s, failures"
    )
    s.add_argument(
        "--variants",
        nargs="+",
        default=["lilicorr", "margin", "dflash", "base"],
        help="drafts in WORK/drafts (dflash: served by SGLang's DFLASH) and base (no speculation)",
    )
    s.add_argument("--lengths", type=int, nargs="+", default=list(long_inputs.LENGTHS))
    s.add_argument("--per-length", type=int, default=8)
    s.add_argument("--concurrency", type=int, default=4)
    s.add_argument(
        "--kv-tokens", type=int, default=None, help="each server's KV pool in tokens (default: concurrency x 8,192)"
    )
    s.set_defaults(func=cmd_long_serve)

    s = sub.add_parser("tables", help="results.json, tables and curves from what the steps wrote")
    s.add_argument("--results", default=None, help="folder holding the fetched results (default: WORK)")
    s.add_argument(
        "--after",
        nargs="+",
        metavar="DIR",
        help="result folders of the earlier runs these drafts were warm-started "
        "from, oldest first: the curves continue their steps",
    )
    s.set_defaults(func=cmd_tables)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.attention_backend or args.sampling_backend:
        args.server_args = with_backends(args.server_args, args.attention_backend, args.sampling_backend)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
