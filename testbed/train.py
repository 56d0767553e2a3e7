"""The `train` step: the variants in the background (torchrun; the GPUs split among them), same data, steps and seed,
planned from the sweep's measured step time; and `wait`, which polls them until they end or --minutes pass."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from sglang_lilicorr.jsonl import save_json

from .common import (
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
)
from .variants import VARIANTS

RATE_MARGIN = 0.92  # planned steps = this share of what the sweep's step time allows (DDP, eval and logging overheads)


def sweep_choice(args) -> tuple[dict, dict]:
    path = Path(args.work) / "sweep" / "batch.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no sweep result; run the `sweep` step first.")
    doc = json.loads(path.read_text())
    pick = next(r for r in doc["results"] if all(r[k] == v for k, v in doc["choice"].items()))
    return doc["choice"], pick


def cmd_train(args) -> int:
    names = args.variants
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}: choose from {sorted(VARIANTS)}.")
    choice, pick = sweep_choice(args)
    frozen = Path(args.work) / "train_config.json"
    if frozen.is_file():
        plan = json.loads(frozen.read_text())
    else:  # steps from the sweep's measured step time, less the evaluations, for --minutes per run
        per_gpu = max(1, gpus() // len(names))
        share = min(1.0, gpus() / len(names))  # fewer GPUs than variants: they share, each at about that share of a GPU
        seconds = 60 * args.minutes - args.evals * (pick.get("eval_s") or 0.0)
        steps = max(args.evals, int(RATE_MARGIN * share * seconds * 1000 / pick["step_ms"]))
        plan = {
            "options": {
                **scale_and_schedule(args),
                **choice,
                "max_steps": steps,
                "eval_every": max(1, steps // args.evals),
                "save_every": max(1, steps // 4),
                "max_minutes": args.max_minutes or round(args.minutes * 2, 2),
            },
            "gpus_per_variant": per_gpu,
            "gpus": gpus(),
            "variants": names,
            "minutes": args.minutes,
            "sweep_pick": pick,
            "device": device_name(),
            "init": args.init and {n: str(Path(args.init) / n) for n in names},
        }
        save_json(frozen, plan)
    per_gpu = plan["gpus_per_variant"]
    for i, name in enumerate(plan["variants"]):
        run_dir = Path(args.work) / "runs" / name
        launch = run_dir / "launch.json"
        if launch.is_file() and alive(json.loads(launch.read_text())["pid"]):
            print(f"[train] {name}: already running")
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
        proc = start(cmd, run_folder(run_dir) / "train.log", ids)
        save_json(launch, {"pid": proc.pid, "cmd": cmd, "gpus": ids, "started": time.time()})
        print(f"[train] {name}: {plan['options']['max_steps']} steps on {per_gpu} GPU(s), pid {proc.pid}")
    to_out(args.out, frozen)
    return 0


def cmd_wait(args) -> int:
    """Poll the background runs until they end or --minutes pass."""
    plan = json.loads((Path(args.work) / "train_config.json").read_text())
    end = time.time() + 60 * args.minutes
    while True:
        status = {}
        for name in plan["variants"]:
            run_dir = Path(args.work) / "runs" / name
            launch = json.loads((run_dir / "launch.json").read_text())
            rows = metrics_rows(run_dir)
            status[name] = {
                "running": alive(launch["pid"]),
                "step": rows[-1]["step"] if rows else 0,
                "total": rows[-1].get("total_steps") if rows else plan["options"]["max_steps"],
                "tau": (rows[-1].get("eval/tau_t0/lilicorr") or rows[-1].get("eval/tau_t0/argmax")) if rows else None,
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
        time.sleep(min(30, max(1, end - time.time())))
