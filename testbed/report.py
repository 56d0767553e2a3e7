"""Tables in the paper's layout from the evaluation rows (tau_eval.py), as markdown + JSON, and a
bar plot of greedy tau per set and system (when matplotlib is installed).

  main results   tau per set per system; T = 0, and T = 1 as mean ± sample std over seeds
  decode rule    the LiLiCorr checkpoint decoded by the greedy walk vs exact Viterbi, T = 0
  loss ablation  the objectives' tau per set, T = 0

tau of a cell = sum of completion tokens / sum of verify blocks over the cell's prompts; at
T = 1 it is computed per seed, then averaged. Only prompts finished by every system count. `lilicorr (argmax)` is the LiLiCorr checkpoint's
own drafter block scored on the same greedy contexts (no head), counted like tau (prefill token
included, i.e. the tau this block would have had on those contexts).
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from eval_sets import SETS
from variants import SEEDS, VARIANT_LABELS

SET_LABELS = {"gsm8k": "GSM8K", "humaneval": "HumanEval", "aime2025": "AIME 2025", "gpqa": "GPQA", "writingbench": "WritingBench"}
MAIN_COLUMNS = ("lilicorr", "dflash")
ABLATION_ROWS = (("no_dist", VARIANT_LABELS["no_dist"]), ("lilicorr", VARIANT_LABELS["lilicorr"]), ("margin", VARIANT_LABELS["margin"]))


def pooled(rows: list[dict], tokens=lambda r: r["tokens"], blocks=lambda r: r["blocks"]) -> float:
    b = sum(blocks(r) for r in rows)
    return sum(tokens(r) for r in rows) / b if b else math.nan


def complete_prompts(rows: list[dict]) -> list[dict]:
    """Rows of the prompts every system finished (a time-capped evaluation may end mid-prompt), so
    that all cells compare the same prompts."""
    jobs = defaultdict(set)
    for r in rows:
        jobs[r["prompt_id"]].add(r["key"])
    full = max((len(k) for k in jobs.values()), default=0)
    return [r for r in rows if len(jobs[r["prompt_id"]]) == full]


def cells(rows: list[dict]) -> dict:
    """{(system, T, set|"average"): {"tau", "std", "n_prompts", "seeds"}}; 'average' is the mean over sets."""
    rows = complete_prompts(rows)
    by = defaultdict(list)
    for r in rows:
        by[(r["system"], float(r["temperature"]), r["set"], int(r["seed"]))].append(r)
    # the LiLiCorr checkpoint's own argmax block on the greedy contexts
    for (system, t, s, seed), rs in list(by.items()):
        if system == "lilicorr" and t == 0:
            by[("lilicorr_argmax", t, s, seed)] = [
                {"tokens": 1 + r["draft_tokens"].get("argmax", 0), "blocks": r["draft_blocks"].get("argmax", 0)} for r in rs
            ]
    out = {}
    for system, t in {(k[0], k[1]) for k in by}:
        per_set = {}
        for s in SETS:
            seeds = sorted(seed for (sy, tt, ss, seed) in by if (sy, tt, ss) == (system, t, s))
            if not seeds:
                continue
            taus = [pooled(by[(system, t, s, seed)]) for seed in seeds]
            per_set[s] = {
                "tau": statistics.fmean(taus), "std": statistics.stdev(taus) if len(taus) > 1 else None,
                "n_prompts": len(by[(system, t, s, seeds[0])]), "seeds": seeds,
            }
            out[(system, t, s)] = per_set[s]
        if per_set:
            out[(system, t, "average")] = {"tau": statistics.fmean(c["tau"] for c in per_set.values()), "std": None,
                                           "n_prompts": sum(c["n_prompts"] for c in per_set.values()), "seeds": None}
    return out


def fmt(cell: dict | None, digits: int = 3) -> str:
    if cell is None or cell["tau"] != cell["tau"]:
        return "–"
    text = f"{cell['tau']:.{digits}f}"
    return text + (f" ± {cell['std']:.{digits}f}" if cell.get("std") is not None else "")


def bold_best(values: list[str], taus: list[float]) -> list[str]:
    finite = [t for t in taus if t == t]
    best = max(finite) if finite else None
    return [f"**{v}**" if best is not None and t == best and len(finite) > 1 else v for v, t in zip(values, taus)]


def table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def set_rows(c: dict, columns: list[str], t: float) -> list[list[str]]:
    body = []
    for s in list(SETS) + ["average"]:
        if not any((col, t, s) in c for col in columns):
            continue
        cs = [c.get((col, t, s)) for col in columns]
        body.append([SET_LABELS.get(s, "Average")] + bold_best([fmt(x) for x in cs], [x["tau"] if x else math.nan for x in cs]))
    return body


def main_table(c: dict) -> str:
    cols = list(MAIN_COLUMNS) + ["lilicorr_argmax"]
    header = ["T", "Benchmark", "LiLiCorr", "Vanilla DFlash", "LiLiCorr ckpt, argmax block"]
    body = [["0 (greedy)"] + r for r in set_rows(c, cols, 0.0)]
    seeds = next((v["seeds"] for k, v in c.items() if k[1] == 1.0 and v["seeds"]), SEEDS)
    body += [[f"1 (seeds {','.join(map(str, seeds))})"] + r + ["–"] for r in set_rows(c, list(MAIN_COLUMNS), 1.0)]
    return table(header, body)


def decode_table(c: dict) -> str:
    body = []
    for s in list(SETS) + ["average"]:
        g, v = c.get(("lilicorr", 0.0, s)), c.get(("lilicorr_viterbi", 0.0, s))
        if g is None and v is None:
            continue
        delta = f"{100 * (v['tau'] - g['tau']) / g['tau']:+.2f}%" if g and v else "–"
        body.append([SET_LABELS.get(s, "Average")] + bold_best([fmt(g), fmt(v)], [g["tau"] if g else math.nan, v["tau"] if v else math.nan]) + [delta])
    return table(["Benchmark", "Greedy walk", "Exact (Viterbi)", "Δ"], body)


def ablation_table(c: dict) -> str:
    sets = [s for s in list(SETS) + ["average"] if any((n, 0.0, s) in c for n, _ in ABLATION_ROWS)]
    body = [[label] + [fmt(c.get((n, 0.0, s))) for s in sets] for n, label in ABLATION_ROWS if any((n, 0.0, s) in c for s in sets)]
    for j in range(len(sets)):  # bold the best per column
        taus = [c[(n, 0.0, sets[j])]["tau"] if (n, 0.0, sets[j]) in c else math.nan for n, _ in ABLATION_ROWS if any((n, 0.0, s) in c for s in sets)]
        for i, v in enumerate(bold_best([r[j + 1] for r in body], taus)):
            body[i][j + 1] = v
    return table(["Objective"] + [SET_LABELS.get(s, "Average") for s in sets], body)


def plot(c: dict, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    systems = [s for s in ("dflash", "lilicorr_argmax", "no_dist", "lilicorr", "lilicorr_viterbi", "margin") if any((s, 0.0, x) in c for x in SETS)]
    sets = [s for s in SETS if any((sy, 0.0, s) in c for sy in systems)]
    fig, ax = plt.subplots(figsize=(1.6 * len(sets) + 2, 3.2))
    width = 0.8 / max(1, len(systems))
    for i, sy in enumerate(systems):
        ax.bar([k + i * width for k in range(len(sets))], [c.get((sy, 0.0, s), {"tau": 0})["tau"] for s in sets], width, label=sy)
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(sets))], [SET_LABELS[s] for s in sets])
    ax.set_ylabel("tau (greedy)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_tables(rows: list[dict], out_dir: Path, provenance: str) -> dict:
    c = cells(rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    md = "\n\n".join([
        f"tau = completion tokens / verify blocks (block-weighted); {provenance}",
        "### Main results\n\n" + main_table(c),
        "### Decode rule (same checkpoint, greedy)\n\n" + decode_table(c),
        "### Loss ablation (greedy)\n\n" + ablation_table(c),
    ]) + "\n"
    (out_dir / "tables.md").write_text(md)
    data = [{"system": k[0], "temperature": k[1], "set": k[2], **v} for k, v in sorted(c.items(), key=str)]
    (out_dir / "tables.json").write_text(json.dumps({"provenance": provenance, "cells": data}, indent=1) + "\n")
    png = plot(c, out_dir / "tau_greedy.png")
    return {"markdown": str(out_dir / "tables.md"), "plot": str(png) if png else None, "cells": len(data)}
