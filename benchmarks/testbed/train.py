"""The `train` step: the variants in the background (torchrun; the GPUs split among them), same data, steps and seed,
planned from the sweep's measured step time (or --steps, or --epochs over the data), at the sweep's batch (or
--batch-size) or --global-batch sequences per optimizer step (gradient accumulation), each from its own draft (--init)
or all from one (--init-draft), evaluated --evals times or every --eval-tokens training tokens (the learning curves:
held-out tau against tokens, the same points for every variant); and `wait`, which polls them until they end or
--minutes pass.

The plan is frozen in WORK/train_config.json at the first call. A later call starts again each run whose process has
ended before its last step: `lilicorr train` resumes it from its newest checkpoint (its log goes on), so a run cut
by --max-minutes or a lost process goes on where it stopped; a finished run is left as it is."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

from benchmarks import save_json

from .common import (
    Step,
    alive,
    cli_flags,
    data_files,
    device_name,
    free_port,
    gpus,
    metrics_rows,
    run_folder,
    scale_and_schedule,
    start,
    tail,
    to_out,
    training_examples,
)
from .variants import PAPER_GLOBAL_BATCH, VARIANTS

# the held-out tau `wait` shows: the head's own proposal, else the drafter's argmax block (dflash)
TAU_KEYS = ("eval/tau_t0/lilicorr", "eval/tau_t0/domino", "eval/tau_t0/dspark", "eval/tau_t0/argmax")
STATUS_S = 30  # between `wait`'s status lines
RATE_MARGIN = 0.92  # planned steps = this share of what the sweep's step time allows (DDP, eval and logging overheads)


def sweep_choice(args) -> tuple[dict, dict]:
    path = Path(args.work) / "sweep" / "batch.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no sweep result; run the `sweep` step first.")
    doc = json.loads(path.read_text())
    pick = next(r for r in doc["results"] if all(r[k] == v for k, v in doc["choice"].items()))
    return doc["choice"], pick


def grad_accum_for(global_batch: int, batch_size: int, ranks: int) -> int:
    """Micro-steps per optimizer step so that batch_size x micro-steps x ranks = global_batch (0: 1, no
    accumulation)."""
    if not global_batch:
        return 1
    if global_batch < 1 or global_batch % (batch_size * ranks):
        raise SystemExit(
            f"--global-batch {global_batch} is not a positive multiple of the batch size {batch_size} x {ranks} "
            f"rank(s) per variant: pass a multiple of {batch_size * ranks} (or 0: no accumulation)."
        )
    return global_batch // (batch_size * ranks)


def init_drafts(args, names: list[str]) -> dict | None:
    """{variant: the exported draft it starts from}: DIR/<variant> of --init, or --init-draft for every variant."""
    if args.init and args.init_draft:
        raise SystemExit("--init and --init-draft both given: pass one (a folder of drafts per variant, or one draft).")
    if args.init_draft and not (Path(args.init_draft) / "config.json").is_file():
        raise SystemExit(
            f"--init-draft {args.init_draft}: no config.json there; pass a folder `lilicorr export` wrote."
        )
    if args.init or args.init_draft:
        return {n: str(Path(args.init) / n) if args.init else str(args.init_draft) for n in names}
    return None


def by_data(args) -> bool:
    """The plan counts in the data's sequences or tokens (--epochs, --eval-tokens): it reads the data first."""
    return bool(args.epochs or args.eval_tokens)


def cmd_train(args) -> int:
    names = args.variants
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}: choose from {sorted(VARIANTS)}.")
    for flag in ("steps", "epochs", "eval_tokens", "batch_size"):
        if getattr(args, flag) < 0:
            raise SystemExit(f"--{flag.replace('_', '-')} {getattr(args, flag)}: pass a number >= 0 (see --help).")
    choice, pick = sweep_choice(args)
    frozen = Path(args.work) / "train_config.json"
    if frozen.is_file():
        plan = json.loads(frozen.read_text())
    else:  # steps from --steps, --epochs, or the sweep's measured step time less the evaluations, for --minutes
        per_gpu = max(1, gpus() // len(names))
        share = min(1.0, gpus() / len(names))  # fewer GPUs than variants: they share, each at about that share of a GPU
        options = {**scale_and_schedule(args), **choice, **({"batch_size": args.batch_size} if args.batch_size else {})}
        accum = grad_accum_for(args.global_batch, options["batch_size"], per_gpu)
        global_batch = options["batch_size"] * accum * per_gpu
        # the data as training reads it, where the plan counts in its sequences or tokens
        examples = training_examples(args, data_files(args)[0], options["max_length"]) if by_data(args) else []
        tokens_per_step = global_batch * sum(len(e.input_ids) for e in examples) / max(1, len(examples))
        seconds = 60 * args.minutes - args.evals * (pick.get("eval_s") or 0.0)
        planned = int(RATE_MARGIN * share * seconds * 1000 / (pick["step_ms"] * accum))
        by_epochs = max(1, round(args.epochs * len(examples) / global_batch)) if args.epochs else 0
        steps = args.steps or by_epochs or max(args.evals, planned)
        eval_every = (
            max(1, round(args.eval_tokens / tokens_per_step)) if args.eval_tokens else max(1, steps // args.evals)
        )
        plan = {
            "options": {
                **options,
                "grad_accum": accum,
                "max_steps": steps,
                "eval_every": eval_every,
                # with --eval-tokens every curve point is a checkpoint too: a run cut anywhere resumes from its last
                "save_every": eval_every if args.eval_tokens else max(1, steps // 4),
                "max_minutes": args.max_minutes or round(args.minutes * 2, 2),
            },
            "tokens_per_step": round(tokens_per_step) if examples else None,
            "train_sequences": len(examples) if examples else None,
            "epochs": round(steps * global_batch / len(examples), 2) if examples else None,
            "gpus_per_variant": per_gpu,
            "gpus": gpus(),
            "variants": names,
            "minutes": args.minutes,
            "sweep_pick": pick,
            "device": device_name(),
            "init": init_drafts(args, names),
            "global_batch": global_batch,
            # the data the runs read (baselines_summary: the budgets compared on the same data)
            "data_sha256": hashlib.sha256(data_files(args)[0].read_bytes()).hexdigest(),
        }
        save_json(frozen, plan)
    per_gpu = plan["gpus_per_variant"]
    for i, name in enumerate(plan["variants"]):
        run_dir = Path(args.work) / "runs" / name
        launch = run_dir / "launch.json"
        if launch.is_file() and alive(json.loads(launch.read_text())["pid"]):
            print(f"[train] {name}: already running")
            continue
        rows = metrics_rows(run_dir)
        if rows and rows[-1]["step"] >= plan["options"]["max_steps"]:
            print(f"[train] {name}: finished at step {rows[-1]['step']}")
            continue
        train, held = data_files(args)
        options = {
            "target": args.target,
            "data": str(train),
            "eval_data": str(held),
            "exclude": args.eval_prompts,
            "output_dir": str(run_dir),
            **plan["options"],
            **VARIANTS[name],
            "init_from": (plan.get("init") or {}).get(name),
        }
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(per_gpu),
            "--master-port",
            str(free_port()),
            "-m",
            "sglang_lilicorr.cli",
            "train",
            *cli_flags(options),
        ]
        ids = [
            (i * per_gpu + k) % max(1, plan.get("gpus", gpus())) for k in range(per_gpu)
        ]  # shared round-robin when short
        proc = start(cmd, run_folder(run_dir) / "train.log", ids, append=launch.is_file())
        save_json(launch, {"pid": proc.pid, "cmd": cmd, "gpus": ids, "started": time.time()})
        resumed = f", resuming after step {rows[-1]['step']}" if rows else ""
        print(f"[train] {name}: {plan['options']['max_steps']} steps on {per_gpu} GPU(s), pid {proc.pid}{resumed}")
    to_out(args.out, frozen)
    return 0


def cmd_wait(args) -> int:
    """Poll the background runs until they end (noticed within a second) or --minutes pass; a status line every
    STATUS_S seconds."""
    plan = json.loads((Path(args.work) / "train_config.json").read_text())
    end = time.time() + 60 * args.minutes
    while True:
        status, pids = {}, []
        for name in plan["variants"]:
            run_dir = Path(args.work) / "runs" / name
            launch = json.loads((run_dir / "launch.json").read_text())
            rows = metrics_rows(run_dir)
            pids.append(launch["pid"])
            status[name] = {
                "running": alive(launch["pid"]),
                "step": rows[-1]["step"] if rows else 0,
                "total": rows[-1].get("total_steps") if rows else plan["options"]["max_steps"],
                "tau": next((rows[-1][k] for k in TAU_KEYS if rows[-1].get(k) is not None), None) if rows else None,
                "minutes": round((time.time() - launch["started"]) / 60, 1),
            }
        print(
            f"[wait {time.strftime('%H:%M:%S')}] "
            + "; ".join(
                f"{n}: step {s['step']}/{s['total']}, tau {s['tau']}, "
                f"{s['minutes']} min{'' if s['running'] else ' (ended)'}"
                for n, s in status.items()
            ),
            flush=True,
        )
        if not any(s["running"] for s in status.values()):
            for name in plan["variants"]:
                print(f"--- {name}: {tail(Path(args.work) / 'runs' / name / 'train.log', 2)}")
            return 0
        if time.time() > end:
            return 4
        next_line = time.time() + min(STATUS_S, max(1, end - time.time()))
        while time.time() < next_line and any(alive(pid) for pid in pids):
            time.sleep(1)


def train_arguments(parser) -> None:
    parser.add_argument("variants", nargs="+", help=f"of {sorted(VARIANTS)}")
    parser.add_argument("--minutes", type=float, default=7.5, help="wall time each run is planned for")
    parser.add_argument("--evals", type=int, default=8, help="held-out evaluations (curve points) per run")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=0.0,
        help="hard wall-time cap of each run (the schedule is cut there; default twice --minutes)",
    )
    parser.add_argument("--init", help="start each variant from DIR/<variant>, an exported draft of the same geometry")
    parser.add_argument(
        "--init-draft",
        metavar="DRAFT",
        help="start every variant from this one exported draft (the equal budget of docs/BASELINES.md: the shipped "
        "DFlash draft)",
    )
    parser.add_argument(
        "--steps", type=int, default=0, help="optimizer steps of every run (default 0: planned from --minutes)"
    )
    parser.add_argument(
        "--epochs",
        type=float,
        default=0.0,
        help="passes over the training conversations, as optimizer steps at the global batch (default 0: --steps or "
        "--minutes decide)",
    )
    parser.add_argument(
        "--eval-tokens",
        type=float,
        default=0.0,
        help="evaluate (held-out tau by exact replay) and checkpoint every this many training tokens, the same steps "
        "for every variant (default 0: --evals points)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=0,
        help="sequences per GPU and micro-step (default 0: the sweep's); --global-batch accumulates over it",
    )
    parser.add_argument(
        "--global-batch",
        type=int,
        default=0,
        help="sequences per optimizer step, reached by gradient accumulation over the sweep's batch and the "
        f"variant's GPUs (the paper's: {PAPER_GLOBAL_BATCH}; default 0: the sweep's batch, no accumulation)",
    )


TRAIN = Step(
    "train",
    "the variants in the background (torchrun; the GPUs split among them), same data, steps, seed",
    cmd_train,
    train_arguments,
)


def wait_arguments(parser) -> None:
    parser.add_argument("--minutes", type=float, default=9.0)


WAIT = Step(
    "wait", "until the background runs end, or --minutes pass (exit 4 while they still run)", cmd_wait, wait_arguments
)
