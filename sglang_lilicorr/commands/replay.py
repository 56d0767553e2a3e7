"""`lilicorr replay`: tau of several drafts on the target's own outputs (`reference.replay`).

  lilicorr replay --target DIR --outputs T0.jsonl T1_s0.jsonl ... --draft lilicorr=D1 --draft dflash=D2 --out REPORT

Outputs are `lilicorr regenerate` files. A LiLiCorr draft reports as NAME (greedy walk, as served), NAME_viterbi and
NAME_argmax (its drafter's argmax block); a Domino or DSpark draft as NAME (its head's block) and NAME_argmax. Writes
REPORT/replay.jsonl (a row per turn and system) and REPORT/tau.json + tau.md: tau per (system, set, temperature), per
seed, mean and std over seeds; the set `average` is the mean of the sets'."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ..cli_args import add_command, one_level_down, path_arg, with_help
from ..errors import UsageError
from ..jsonl import DataError
from ..ownership import claim_report_folder, write_atomic

REPLAY_HELP = {  # the --help texts of `lilicorr replay`
    "target": "local Hugging Face folder of the target model",
    "draft": "a draft folder to replay (from `lilicorr export`) and the name it reports under (repeatable)",
    "dtype": "the target's dtype on a GPU (CPU: fp32)",
    "outputs": "`lilicorr regenerate` output files (jsonl rows with `turns` of prompt and output token ids)",
    "out": "report folder: replay.jsonl, tau.json, tau.md (new or a report's)",
}


def register(subparsers) -> None:
    summary = "tau of drafts on the target's own outputs (exact replay, no decoding)"
    p = add_command(subparsers, "replay", summary, __doc__)
    model = p.add_argument_group("model")
    model.add_argument("--target", type=path_arg, required=True)
    model.add_argument("--draft", action="append", required=True, metavar="NAME=DIR")
    model.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument_group("data").add_argument("--outputs", type=path_arg, nargs="+", required=True)
    p.add_argument_group("output").add_argument("--out", type=path_arg, required=True)
    with_help(p, REPLAY_HELP)
    p.set_defaults(func=run_replay)


def system_names(label: str, draft_names) -> dict[str, str]:
    """Draft name -> the system it reports as: the served proposal as `label`, the others suffixed."""
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
                fix=one_level_down(path, "pass a folder written by `lilicorr export`"),
            )
        drafts[name] = path
    return drafts


def read_turn_rows(paths: list[Path]) -> list[tuple[Path, dict]]:
    """Every row of the regenerate files, checked; a missing file is a usage error, a bad row a DataError."""
    from ..jsonl import read_jsonl

    rows = [(path, row) for path in paths for _, row in read_jsonl(path)]
    for path, row in rows:
        if not row.get("turns"):
            raise DataError(
                f"row {row.get('id')!r} has no `turns`",
                where=str(path),
                fix="replay needs `lilicorr regenerate` output",
            )
        ids = [t.get(k) if isinstance(t, dict) else None for t in row["turns"] for k in ("prompt_ids", "output_ids")]
        if not all(isinstance(v, list) and v and all(isinstance(i, int) for i in v) for v in ids):
            raise DataError(
                f"row {row.get('id')!r}: every turn needs non-empty `prompt_ids` and `output_ids` lists of token ids",
                where=str(path),
                fix="replay needs `lilicorr regenerate` output",
            )
    return rows


def run_replay(args: argparse.Namespace) -> int:
    """Checks every argument and reads every input first; the report folder is claimed only to write results."""
    import torch
    from transformers import AutoModelForCausalLM
    from tqdm.auto import tqdm

    from ..frozen_target import FrozenTarget, loading_target, local_model_dir
    from ..reference.propose import BlockProposer
    from ..reference.replay import Replayer
    from ..train.heads import load_exported_draft

    drafts = parse_drafts(args.draft)
    local_model_dir(args.target)
    out = claim_report_folder(args.out, create=False)  # before anything loads
    rows = read_turn_rows(args.outputs)
    loaded = {name: load_exported_draft(path) for name, path in drafts.items()}
    layers = {d.config.target_layer_ids for d, _ in loaded.values()}
    if len(layers) > 1:
        raise UsageError(
            f"the drafts capture different target layers {sorted(layers)}",
            where="--draft",
            fix="replay them in separate calls",
        )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if args.dtype == "bfloat16" and device.type == "cuda" else torch.float32
    with loading_target(args.target):
        model = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype).to(device).eval()
    target = FrozenTarget(model, layers.pop())
    proposers, names = {}, {}
    for name, (drafter, head) in loaded.items():
        proposers[name] = BlockProposer(
            target, drafter.to(device), None if head is None else head.to(device).eval(), ("greedy", "viterbi")
        )
        names[name] = system_names(name, proposers[name].draft_names)
    replayer = Replayer(target, proposers)
    records = []
    for path, row in tqdm(rows, desc="replay", dynamic_ncols=True):
        about = {"id": row.get("id"), "set": row.get("set", Path(path).stem)}
        about.update(temperature=row.get("temperature", 0.0), seed=row.get("seed", 0))
        for t, turn in enumerate(row["turns"]):
            for label, result in replayer.turn(turn["prompt_ids"], turn["output_ids"]).items():
                for draft, accepted in result.accepted.items():
                    found = {"system": names[label][draft], "completion_tokens": result.completion_tokens}
                    records.append({**about, "turn": t, **found, "accepted": accepted})
    claim_report_folder(out)
    write_atomic(out / "replay.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    cells = tau_cells(records)
    summary = {
        "target": str(args.target),
        "drafts": drafts,
        "outputs": [str(p) for p in args.outputs],
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "cells": cells,
    }
    write_atomic(out / "tau.json", json.dumps(summary, indent=1) + "\n")
    write_atomic(out / "tau.md", tau_table(cells))
    print(tau_table(cells))
    return 0


def tau_cells(records: list[dict]) -> list[dict]:
    """(system, set, temperature) -> tau per seed (pooled over turns), mean and std; plus the set `average`."""
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
        mean, std = statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None
        cells.append(dict(system=system, set=group, temperature=temperature, tau_per_seed=taus, tau=mean, tau_std=std))
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
                std = "" if c is None or c["tau_std"] is None else f" ± {c['tau_std']:.3f}"
                row.append("--" if c is None else f"{c['tau']:.3f}{std}")
            lines.append(f"| {group} | " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)
