"""The `sweep` step: drafter depth, then batch (variants.SWEEP_ROUNDS): short LiLiCorr runs, one per GPU, equal wall
time; each round's choice -> WORK/sweep/<round>.json (resumable by round)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import save_json

from .common import (
    Step,
    cli_flags,
    device_name,
    enough_time,
    gpus,
    lilicorr,
    metrics_rows,
    run_folder,
    run_options,
    scale_and_schedule,
    start,
    tail,
    to_out,
)
from .variants import SWEEP_ROUNDS, VARIANTS, choose


def cmd_sweep(args) -> int:
    root = Path(args.work) / "sweep"
    chosen: dict = {}
    for name, configs in SWEEP_ROUNDS.items():
        done = root / f"{name}.json"
        if done.is_file():
            chosen.update(json.loads(done.read_text())["choice"])
            continue
        runs = [{**chosen, **c} for c in configs]
        enough_time(f"sweep {name}", (args.minutes + 0.8) * -(-len(runs) // gpus()))
        results = []
        for wave in range(0, len(runs), gpus()):  # one run per GPU at a time
            procs = []
            for i, run in enumerate(runs[wave : wave + gpus()]):
                label = "_".join(f"{k}{v}" for k, v in sorted(run.items()))
                options = run_options(
                    args,
                    **VARIANTS["lilicorr"],
                    **run,
                    output_dir=str(root / name / label),
                    max_steps=100_000,
                    warmup_ratio=0.0005,
                    max_minutes=args.minutes,
                    eval_every=10**9,
                    save_every=10**9,
                    resume=False,
                )
                procs.append(
                    (
                        run,
                        label,
                        start(
                            lilicorr("train", *cli_flags(options)), run_folder(root / name / label) / "train.log", [i]
                        ),
                    )
                )
            for run, label, proc in procs:
                proc.wait()
                rows = metrics_rows(root / name / label)
                last = rows[-1] if rows else {}
                results.append(
                    {
                        **scale_and_schedule(args),
                        **run,
                        "label": label,
                        "returncode": proc.returncode,
                        "steps": last.get("step"),
                        "tau": last.get("eval/tau_t0/lilicorr"),
                        "tau_argmax": last.get("eval/tau_t0/argmax"),
                        "tokens_per_s": last.get("tokens_per_s"),
                        "step_ms": last.get("time/wall_ms"),
                        "eval_s": last.get("time/eval_s"),
                        "top1_draft_slot1": last.get("eval/top1_draft/slot1"),
                        "log_tail": tail(root / name / label / "train.log", 3) if proc.returncode else "",
                    }
                )
                print(
                    f"[sweep {name}] {label}: rc {proc.returncode}, {results[-1]['steps']} steps, "
                    f"tau {results[-1]['tau']}, "
                    f"{results[-1]['tokens_per_s'] or 0:.0f} tok/s",
                    flush=True,
                )
        pick = choose(results, name)
        chosen.update({k: pick[k] for k in ("draft_layers", "batch_size")})
        save_json(
            done,
            {
                "round": name,
                "minutes": args.minutes,
                "device": device_name(),
                "results": results,
                "choice": dict(chosen),
                "rule": "highest held-out tau (LiLiCorr walk, exact replay) at equal wall time among shippable depths; "
                "within 0.5 % the cheaper run",
            },
        )
        to_out(args.out, done)
    print(f"[sweep] chosen: {chosen}")
    return 0


def arguments(parser) -> None:
    parser.add_argument("--minutes", type=float, default=1.0, help="wall time of each sweep run")


STEP = Step(
    "sweep",
    "drafter depth, then batch: short LiLiCorr runs, one per GPU, equal wall time (resumable by round)",
    cmd_sweep,
    arguments,
)
