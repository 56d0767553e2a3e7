"""`lilicorr replay`: tau of several drafts on the target's own outputs (`reference.replay`).

  lilicorr replay --target DIR --outputs T0.jsonl T1_s0.jsonl ... --draft lilicorr=D1 --draft dflash=D2 --out REPORT

Outputs are `lilicorr regenerate` files (rows with `turns` of prompt/output ids, `set`,
`temperature`, `seed`). Every draft is replayed on every turn; a LiLiCorr draft yields three
systems: NAME (greedy walk, as served), NAME_viterbi (the exact path maximiser) and NAME_argmax
(the same drafter's argmax block); a Domino or DSpark draft two: NAME (its head's greedy slot-by-slot
correction, the block its server proposes at T = 0) and NAME_argmax. Writes REPORT/replay.jsonl (one row per turn
and system) and REPORT/tau.json + tau.md: tau = completion tokens / verify blocks per (system, set, temperature),
per seed and its mean and sample std over seeds; the set `average` is the mean of the sets' tau.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


from ..errors import UsageError
from ..jsonl import DataError
from ..ownership import claim_report_folder, write_atomic


def register(subparsers) -> None:
    p = subparsers.add_parser("replay", help="tau of drafts on the target's own outputs (exact replay, no decoding)")
    p.add_argument("--target", required=True, help="HF model directory of the target")
    p.add_argument("--outputs", nargs="+", required=True, help="`lilicorr regenerate` output files (rows with turns)")
    p.add_argument(
        "--draft", action="append", required=True, metavar="NAME=DIR", help="a draft directory to replay, named"
    )
    p.add_argument("--out", required=True, help="report directory")
    p.add_argument(
        "--dtype", choices=("bfloat16", "float32"), default="bfloat16", help="target dtype on the GPU (CPU: float32)"
    )
    p.set_defaults(func=run_replay)


def system_names(label: str, draft_names) -> dict[str, str]:
    """Draft name of a proposer (propose.BlockProposer.draft_names) -> the system it reports as: the head's served
    proposal (LiLiCorr's greedy walk, a corrector's own block; the argmax block without a head) as `label`, the
    others suffixed (`label`_argmax, `label`_viterbi)."""
    if len(draft_names) == 1:
        return {draft_names[0]: label}
    served, *others = draft_names[1:]
    return {"argmax": f"{label}_argmax", served: label, **{n: f"{label}_{n.rpartition('_')[2]}" for n in others}}


def parse_drafts(items: list[str]) -> dict[str, str]:
    drafts = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise UsageError(
                f"--draft {item!r} is not NAME=DIR",
                where="--draft",
                fix="e.g. --draft lilicorr=checkpoints/smollm2-lilicorr",
            )
        if name in drafts:
            raise UsageError(f"--draft {name} is given twice", where="--draft", fix="name each draft once")
        if not (Path(path) / "config.json").is_file():
            raise UsageError(
                f"{path!r} is not a draft folder (no config.json)",
                where=f"--draft {name}",
                fix="pass a folder written by `lilicorr export`",
            )
        drafts[name] = path
    return drafts


def run_replay(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoModelForCausalLM
    from tqdm.auto import tqdm

    from ..frozen_target import FrozenTarget
    from ..jsonl import read_jsonl
    from ..reference.propose import BlockProposer
    from ..reference.replay import Replayer

    from ..frozen_target import loading_target, local_model_dir
    from ..train.heads import load_exported_draft

    drafts = parse_drafts(args.draft)
    local_model_dir(args.target)
    out = claim_report_folder(args.out, create=False)  # before anything loads
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if args.dtype == "bfloat16" and device.type == "cuda" else torch.float32
    with loading_target(args.target):
        model = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
    loaded = {name: load_exported_draft(path) for name, path in drafts.items()}
    layers = {d.config.target_layer_ids for d, _ in loaded.values()}
    if len(layers) > 1:
        raise UsageError(
            f"the drafts capture different target layers {sorted(layers)}",
            where="--draft",
            fix="replay them in separate calls",
        )
    target = FrozenTarget(model, layers.pop())
    proposers, names = {}, {}
    for name, (drafter, head) in loaded.items():
        proposers[name] = BlockProposer(
            target, drafter.to(device), None if head is None else head.to(device).eval(), ("greedy", "viterbi")
        )
        names[name] = system_names(name, proposers[name].draft_names)
    replayer = Replayer(target, proposers)
    claim_report_folder(out)
    records = []
    rows = [(path, row) for path in args.outputs for _, row in read_jsonl(path)]
    for path, row in tqdm(rows, desc="replay", dynamic_ncols=True):
        if not row.get("turns"):
            raise DataError(
                f"row {row.get('id')!r} has no `turns`",
                where=str(path),
                fix="replay needs `lilicorr regenerate` output",
            )
        if not all(
            isinstance(t, dict)
            and all(
                isinstance(t.get(k), list) and t[k] and all(isinstance(i, int) for i in t[k])
                for k in ("prompt_ids", "output_ids")
            )
            for t in row["turns"]
        ):
            raise DataError(
                f"row {row.get('id')!r}: every turn needs non-empty `prompt_ids` and `output_ids` lists of token ids",
                where=str(path),
                fix="replay needs `lilicorr regenerate` output",
            )
        for t, turn in enumerate(row["turns"]):
            for label, result in replayer.turn(turn["prompt_ids"], turn["output_ids"]).items():
                for draft, accepted in result.accepted.items():
                    records.append(
                        {
                            "id": row["id"],
                            "set": row.get("set", Path(path).stem),
                            "temperature": row.get("temperature", 0.0),
                            "seed": row.get("seed", 0),
                            "turn": t,
                            "system": names[label][draft],
                            "completion_tokens": result.completion_tokens,
                            "accepted": accepted,
                        }
                    )
    write_atomic(out / "replay.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    cells = tau_cells(records)
    write_atomic(
        out / "tau.json",
        json.dumps(
            {
                "target": args.target,
                "drafts": drafts,
                "outputs": args.outputs,
                "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                "cells": cells,
            },
            indent=1,
        )
        + "\n",
    )
    write_atomic(out / "tau.md", tau_table(cells))
    print(tau_table(cells))
    return 0


def tau_cells(records: list[dict]) -> list[dict]:
    """(system, set, temperature) -> tau per seed (pooled over turns), mean and std over seeds; plus
    the set `average` (mean over sets, per seed)."""
    pooled: dict[tuple, list[int]] = {}
    for r in records:
        key = (r["system"], r["set"], r["temperature"], r["seed"])
        tokens, blocks = pooled.get(key, [0, 0])
        pooled[key] = [tokens + r["completion_tokens"], blocks + len(r["accepted"])]
    per_seed: dict[tuple, dict[int, float]] = {}
    for (system, group, temperature, seed), (tokens, blocks) in pooled.items():
        if blocks:
            per_seed.setdefault((system, group, temperature), {})[seed] = tokens / blocks
    for system, temperature in {(k[0], k[2]) for k in per_seed}:
        sets = [v for k, v in per_seed.items() if k[0] == system and k[2] == temperature]
        seeds = set.intersection(*(set(v) for v in sets))
        per_seed[(system, "average", temperature)] = {s: statistics.fmean(v[s] for v in sets) for s in sorted(seeds)}
    cells = []
    for (system, group, temperature), taus in sorted(
        per_seed.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1] == "average", kv[0][1])
    ):
        values = list(taus.values())
        cells.append(
            {
                "system": system,
                "set": group,
                "temperature": temperature,
                "tau_per_seed": taus,
                "tau": statistics.fmean(values),
                "tau_std": statistics.stdev(values) if len(values) > 1 else None,
            }
        )
    return cells


def tau_table(cells: list[dict]) -> str:
    systems = sorted({c["system"] for c in cells})
    lines = []
    for temperature in sorted({c["temperature"] for c in cells}):
        sets = sorted({c["set"] for c in cells if c["temperature"] == temperature}, key=lambda s: (s == "average", s))
        by = {(c["system"], c["set"]): c for c in cells if c["temperature"] == temperature}
        lines += [
            f"T = {temperature:g} (tau = completion tokens / verify blocks; mean ± std over seeds)",
            "",
            "| set | " + " | ".join(systems) + " |",
            "|---|" + "---|" * len(systems),
        ]
        for group in sets:
            row = []
            for system in systems:
                c = by.get((system, group))
                row.append(
                    "--"
                    if c is None
                    else f"{c['tau']:.3f}" + (f" ± {c['tau_std']:.3f}" if c["tau_std"] is not None else "")
                )
            lines.append(f"| {group} | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)
