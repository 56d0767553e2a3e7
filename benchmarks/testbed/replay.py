"""The `replay` step: tau of every exported draft on the evaluation outputs (exact replay), one process per GPU ->
WORK/replay/tau.json, tau.md."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import save_json

from .common import Step, device_name, gpus, lilicorr, run_folder, start, tail, to_out


def cmd_replay(args) -> int:
    from sglang_lilicorr.commands.replay import tau_cells, tau_table

    drafts = Path(args.work) / "drafts"
    names = [n for n in args.drafts if (drafts / n / "config.json").is_file()]
    if not names:
        raise SystemExit(f"{drafts}: no exported draft among {args.drafts}; run `export` first.")
    outputs = sorted((Path(args.work) / "eval").glob(args.outputs))
    if not outputs:
        raise SystemExit(f"{Path(args.work) / 'eval'}: no evaluation outputs; run `evalgen` first.")
    root = Path(args.work) / "replay"
    jobs = []
    for i, path in enumerate(outputs):
        report = root / path.stem
        if (report / "replay.jsonl").is_file():
            continue
        argv = ["replay", "--target", args.target, "--outputs", str(path), "--out", str(report)]
        for n in names:
            argv += ["--draft", f"{n}={drafts / n}"]
        gpu_ids = args.gpu_ids or list(range(gpus()))
        jobs.append(
            (
                path.stem,
                start(lilicorr(*argv), run_folder(report, "report") / "replay.log", [gpu_ids[i % len(gpu_ids)]]),
            )
        )
    for stem, proc in jobs:
        if proc.wait():
            print(f"[replay] {stem}: exit {proc.returncode}\n{tail(root / stem / 'replay.log', 8)}")
    records = [json.loads(line) for f in sorted(root.glob("*/replay.jsonl")) for line in f.read_text().splitlines()]
    cells = tau_cells(records)
    save_json(
        root / "tau.json",
        {"device": device_name(), "drafts": names, "outputs": [p.name for p in outputs], "cells": cells},
    )
    (root / "tau.md").write_text(tau_table(cells))
    print(tau_table(cells))
    to_out(args.out, root / "tau.json")
    return 0 if len(list(root.glob("*/replay.jsonl"))) == len(outputs) else 1


def arguments(parser) -> None:
    parser.add_argument("--drafts", nargs="+", default=["lilicorr", "dflash", "no_dist", "margin"])
    parser.add_argument("--gpu-ids", type=int, nargs="+", help="GPUs the replay processes share (default: all)")
    parser.add_argument(
        "--outputs",
        default="outputs_*.jsonl",
        help="which evaluation outputs of WORK/eval to replay, a glob (default: all; outputs_T0_s0.jsonl: T = 0 only)",
    )


STEP = Step(
    "replay", "tau of every exported draft on those outputs (exact replay), one process per GPU", cmd_replay, arguments
)
