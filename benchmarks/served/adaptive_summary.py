"""`python -m benchmarks adaptive-summary`: what the adaptive verify width does to served speed, from the speed step's
summaries of both prompt sets (benchmarks/testbed/speed.py: WORK/speed/graphs64 for long-form writing,
WORK/speed/graphs64_eval for the six evaluation sets).

  python -m benchmarks adaptive-summary --writing DIR --eval DIR --card CARD --commit C [--out DIR]

Per set and concurrency c: tok/s per system, `adaptive_vs_base` (lilicorr, the adaptive width, over no speculation)
and `adaptive_vs_fixed` (lilicorr over lilicorr_fixed, every block verified whole) as [mean, lo, hi] (the paired 95 %
intervals of the speed summary: ratios within rounds), each system's verify width shares, its worst greedy deviation
in bf16 ulps where the rounds recorded token ids (speed --greedy-check; else null), tau and the rounds. `missed` lists
the targets a cell misses (TARGETS; the c = 1 speed-up is asked of the set where LILICORR's tau at c = 1 was
higher, `high_tau_set`: with the shipped SmolLM2 drafts the evaluation sets, 2.15 against 1.53 on an H200).
-> OUT/summary.json (with card and commit), OUT/summary.md, OUT/adaptive.png.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.served.serve_speed import ALL_SYSTEMS, LABELS

SETS = ("writing", "eval")
RATIOS = {"adaptive_vs_base": "lilicorr_vs_base", "adaptive_vs_fixed": "lilicorr_vs_lilicorr_fixed"}
# what the adaptive width must reach (paired means and the lower bound of their intervals)
TARGETS = {
    "vs_base": 0.98,  # adaptive_vs_base mean at every c and set
    "vs_base_lo": 0.95,  # its interval's lower bound
    "vs_base_c1_high_tau": 1.10,  # at c = 1 on the set of the higher tau
    "vs_fixed": 0.98,  # adaptive_vs_fixed mean at every c
    "vs_fixed_where_fixed_loses": 1.2,  # where fixed width is more than 10 % slower than no speculation
}
CONCURRENCIES = ("1", "4", "8", "16", "32", "64")  # every set's cells
MIN_ROUNDS = 5


def per_10k(checked: dict) -> float | None:
    """Tokens beyond the greedy check's tolerance per 10k checked tokens (None where none were counted)."""
    return round(1e4 * checked["tokens_beyond_tol"] / checked["tokens"], 2) if checked.get("tokens") else None


def cell(entry: dict) -> dict:
    """One concurrency of a speed summary (serve_speed.summarize, with speed --greedy-check's `greedy`) -> its cell."""
    systems = [s for s in ALL_SYSTEMS if s in entry]
    greedy = entry.get("greedy", {})
    return {
        "tok_s": {s: entry[s] for s in systems},
        **{name: entry.get(key) for name, key in RATIOS.items()},
        "fixed_vs_base": entry.get("lilicorr_fixed_vs_base"),
        "width1_vs_base": entry.get("lilicorr_w1_vs_base"),  # the adaptive width's floor, where lilicorr_w1 played
        "tiers": entry.get("tiers", {}),
        "worst_ulps": {s: greedy.get(s, {}).get("worst_ulps") for s in systems},
        "beyond_tol_per_10k": {s: per_10k(greedy.get(s, {})) for s in systems},  # tokens beyond 2 ulps
        "tau": entry.get("tau", {}),
        "rounds": entry["rounds"],
    }


def high_tau_set(sets: dict) -> str | None:
    """Of two or more sets ({name: its cells by c}), the one where LILICORR's tau at c = 1 was highest (SETS' order
    breaks a tie); None for one set or where c = 1 was not played."""
    taus = {n: cells["1"]["tau"].get("lilicorr") for n, cells in sets.items() if "1" in cells}
    if len(sets) < 2 or len(taus) < len(sets) or None in taus.values():
        return None
    return max((n for n in SETS if n in taus), key=lambda n: taus[n])


def missed(name: str, c: str, x: dict, high_tau: bool = False) -> list[str]:
    """The targets cell `x` (set `name`, concurrency c; `high_tau`: the set of the higher tau) misses, one line each."""
    out, base, fixed = [], x["adaptive_vs_base"], x["adaptive_vs_fixed"]
    if base is not None:
        if base[0] < TARGETS["vs_base"]:
            out.append(f"{name} c={c}: adaptive_vs_base {base[0]:.3f} < {TARGETS['vs_base']}")
        if base[1] < TARGETS["vs_base_lo"]:
            out.append(f"{name} c={c}: adaptive_vs_base lower bound {base[1]:.3f} < {TARGETS['vs_base_lo']}")
        if high_tau and c == "1" and base[0] <= TARGETS["vs_base_c1_high_tau"]:
            out.append(f"{name} c={c}: adaptive_vs_base {base[0]:.3f} <= {TARGETS['vs_base_c1_high_tau']}")
    if fixed is not None:
        if fixed[0] < TARGETS["vs_fixed"]:
            out.append(f"{name} c={c}: adaptive_vs_fixed {fixed[0]:.3f} < {TARGETS['vs_fixed']}")
        loses = x["fixed_vs_base"] is not None and x["fixed_vs_base"][0] < 0.9
        if loses and fixed[0] < TARGETS["vs_fixed_where_fixed_loses"]:
            out.append(
                f"{name} c={c}: fixed width {x['fixed_vs_base'][0]:.3f} of no speculation, adaptive_vs_fixed "
                f"{fixed[0]:.3f} < {TARGETS['vs_fixed_where_fixed_loses']}"
            )
    ulps = x["worst_ulps"]
    if ulps.get("lilicorr") is not None and ulps.get("base") is not None and ulps["lilicorr"] > ulps["base"]:
        out.append(f"{name} c={c}: LILICORR's worst deviation {ulps['lilicorr']:.2f} ulps > no speculation's")
    return out


def summarize(docs: dict, card: str, commit: str) -> dict:
    """{set: speed_summary.json document} -> the results file: per set its setting and cells by c, `high_tau_set`,
    `missed`, card and commit."""
    out: dict = {}
    for name, doc in docs.items():
        cells = {c: cell(e) for c, e in sorted(doc["summary"].items(), key=lambda kv: int(kv[0]))}
        out[name] = {
            "folder": doc.get("folder"),
            "graphs_to": doc.get("graphs_to"),
            "backends": doc.get("backends"),
            "cells": cells,
        }
    out["high_tau_set"] = high = high_tau_set({name: out[name]["cells"] for name in docs})
    out["missed"] = [
        line for name in docs for c, x in out[name]["cells"].items() for line in missed(name, c, x, name == high)
    ]
    out["unmeasured"] = unmeasured({name: out[name]["cells"] for name in docs})
    return {**out, "card": card, "commit": commit}


def unmeasured(sets: dict) -> list[str]:
    """The cells of SETS x CONCURRENCIES not played, or played on fewer than MIN_ROUNDS rounds, one line each."""
    out = [f"{name}: not played" for name in SETS if name not in sets]
    for name, cells in sets.items():
        out += [f"{name} c={c}: not played" for c in CONCURRENCIES if c not in cells]
        out += [f"{name} c={c}: {x['rounds']} rounds" for c, x in cells.items() if x["rounds"] < MIN_ROUNDS]
    return out


def _ratio(r) -> str:
    return "-" if r is None else f"{r[0]:.3f} [{r[1]:.3f}, {r[2]:.3f}]"


def table(result: dict) -> str:
    """summary.md: a table per set (tok/s, the two ratios, LILICORR's width shares, worst ulps), the missed targets."""
    lines = [f"# Adaptive verify width, served ({result['card']}, {result['commit']})", ""]
    for name in (s for s in SETS if s in result):
        cells = result[name]["cells"]
        systems = [s for s in ALL_SYSTEMS if any(s in x["tok_s"] for x in cells.values())]
        head = ["c", *(f"{LABELS[s]} tok/s" for s in systems), "adaptive / base", "adaptive / fixed"]
        head += ["LILICORR widths", "worst ulps " + " / ".join(systems), "beyond 2 ulps per 10k tokens", "rounds"]
        lines += [f"## {name} ({result[name]['folder']})", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for c, x in cells.items():
            widths = sorted(x["tiers"].get("lilicorr", {}).items(), key=lambda kv: int(kv[0]))
            ulps = " / ".join("-" if x["worst_ulps"].get(s) is None else f"{x['worst_ulps'][s]:.2f}" for s in systems)
            rates = x.get("beyond_tol_per_10k", {})
            rates = " / ".join("-" if rates.get(s) is None else f"{rates[s]:.1f}" for s in systems)
            row = [c, *(f"{x['tok_s'][s]:.0f}" if s in x["tok_s"] else "-" for s in systems)]
            row += [_ratio(x["adaptive_vs_base"]), _ratio(x["adaptive_vs_fixed"])]
            row += [", ".join(f"{w}: {v:.2f}" for w, v in widths) or "-", ulps, rates, str(x["rounds"])]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    lines += ["Targets missed: " + ("none" if not result["missed"] else ""), *(f"- {m}" for m in result["missed"])]
    lines += [
        "",
        "Unmeasured: " + ("none" if not result["unmeasured"] else ""),
        *(f"- {m}" for m in result["unmeasured"]),
    ]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> Path:
    """Per set: the two paired ratios against c with their intervals (top), LILICORR's width shares per c (bottom)."""
    from sglang_lilicorr.bench.plots import pyplot, save

    plt = pyplot()
    names = [s for s in SETS if s in result]
    fig, axes = plt.subplots(2, len(names), figsize=(5.5 * len(names), 7), squeeze=False)
    for k, name in enumerate(names):
        cells = result[name]["cells"]
        cs = list(cells)
        ax, bx = axes[0][k], axes[1][k]
        for i, key in enumerate(RATIOS):
            pts = [(j, cells[c][key]) for j, c in enumerate(cs) if cells[c][key] is not None]
            if pts:
                ys = [r for _, r in pts]
                ax.errorbar(
                    [j for j, _ in pts],
                    [r[0] for r in ys],
                    yerr=[[r[0] - r[1] for r in ys], [r[2] - r[0] for r in ys]],
                    fmt="-o",
                    capsize=3,
                    color=f"C{i}",
                    label=key.replace("_vs_", " / "),
                )
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xticks=range(len(cs)), xticklabels=cs, xlabel="concurrency c", ylabel="tok/s ratio (paired, 95 % CI)")
        ax.set_title(f"{name}: LILICORR, adaptive width")
        ax.legend(fontsize=8)
        widths = sorted({int(w) for c in cs for w in cells[c]["tiers"].get("lilicorr", {})})
        bottom = [0.0] * len(cs)
        for i, w in enumerate(widths):
            heights = [cells[c]["tiers"].get("lilicorr", {}).get(str(w), 0.0) for c in cs]
            bx.bar(range(len(cs)), heights, bottom=bottom, color=f"C{i}", label=f"width {w}")
            bottom = [b + h for b, h in zip(bottom, heights)]
        bx.set(
            xticks=range(len(cs)), xticklabels=cs, xlabel="concurrency c", ylabel="share of verify steps", ylim=(0, 1)
        )
        bx.set_title(f"{name}: LILICORR's verify widths")
        if widths:
            bx.legend(fontsize=8)
    return save(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks adaptive-summary", description=__doc__.split("\n\n")[0].replace("`", "")
    )
    p.add_argument("--writing", type=Path, help="the speed step's folder of the writing set (WORK/speed/graphs64)")
    p.add_argument(
        "--eval", type=Path, help="the speed step's folder of the evaluation sets (WORK/speed/graphs64_eval)"
    )
    p.add_argument("--card", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/adaptive"))
    a = p.parse_args(argv)
    folders = {name: folder for name, folder in (("writing", a.writing), ("eval", a.eval)) if folder is not None}
    if not folders:
        p.error("nothing to summarize: pass --writing, --eval or both (the speed step's folders of each prompt set)")
    docs = {}
    for name, folder in folders.items():
        path = folder / "speed_summary.json"
        if not path.is_file():
            p.error(f"--{name} {folder}: no speed_summary.json there; pass the speed step's folder of that set")
        doc = json.loads(path.read_text())
        if doc.get("prompt_set", "writing") != name:  # summaries from before --prompt-set played the writing set
            p.error(
                f"--{name} {folder}: its rounds played the {doc['prompt_set']} set; pass it as --{doc['prompt_set']}"
            )
        if not doc.get("summary"):
            p.error(f"--{name} {folder}: its summary holds no concurrency where every summarized system ran")
        docs[name] = doc
    a.out.mkdir(parents=True, exist_ok=True)
    result = summarize(docs, a.card, a.commit)
    (a.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    (a.out / "summary.md").write_text(table(result))
    plot(result, a.out / "adaptive.png")
    print(table(result) + f"-> {a.out}/summary.json, summary.md, adaptive.png")
    return 0
