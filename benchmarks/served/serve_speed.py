"""Served speed as a user gets it: the summary of paired, rotated throughput rounds of four servers (no speculation,
SGLang's DFLASH, SGLang's built-in LiLiCorr head on our draft, and LILICORR on the same draft) and, where they ran, the
two verify-attention variants (VERIFY_SYSTEMS), at each concurrency and in two CUDA-graph settings (graphs up to the
largest concurrency; graphs to 16, so c = 32 runs the eager path).

  summarize(rounds) -> {c: {system: tok/s, "<a>_vs_<b>": [mean, lo, hi], "tau": {system: tau},
                            "tiers": {system: {width: share of verify steps}}}}
  table(summary) -> markdown;  plot(summary, path)
  python -m benchmarks serve-speed [--graphs DIR] [--eager DIR] --card CARD --commit C --out OUT
      the speed step's folders of either setting or both (WORK/speed/graphs32, graphs16) -> OUT/summary.json (per c,
      "eager": graphs to 16 at c = 32, "startup_s": graph capture per system, from graphs32), OUT/table.md,
      OUT/speed.png; --keep-from EARLIER keeps the cells this run lacks, --startup startup.json adds "startup_alone_s"
      (the startup step)

`rounds` holds, per round, the records of every system at every c (benchmarks/testbed/speed.py writes them:
WORK/round<r>.jsonl).
Tokens/s of a run is output tokens per busy second of its requests (metrics.output_tps); a ratio is taken within each
round and its mean comes with the two-sided 95 % t interval over the rounds (metrics.mean_ci95), so what moves a whole
round (the machine, the order of the servers) cancels. tau is the block-weighted accepted length over all rounds.

Servers that are up but idle must not disturb the one being measured: they run with SGLang's --sleep-on-idle, and
`process_tree_cpu_s` lets the driver record the CPU seconds each idle server spent while another one played.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from sglang_lilicorr.bench.metrics import block_ms, mean_ci95, output_tps, summed_histogram, tau, tier_shares

SYSTEMS = ("base", "dflash", "builtin", "lilicorr")  # the speed step's default four
REQUIRED = ("base", "lilicorr")  # every summarized cell has these (the ratios of the others where they ran)
# The target verify's attention swapped (serving/verify_attention.py, LILICORR_VERIFY_ATTENTION): SGLang's DFLASH on
# SGLang's split-KV verify kernel, LILICORR on SGLang's prefill kernel (the kernel the other two run).
VERIFY_SYSTEMS = ("dflash_splitkv", "lilicorr_extend")
# LILICORR committing each block by the exact Viterbi path instead of the greedy walk (LILICORR_WALK=viterbi).
WALK_SYSTEMS = ("lilicorr_viterbi",)
# LILICORR verifying every block whole (LILICORR_VERIFY_WIDTH=16), and every step at width 1 (a chain of plain decode
# forwards through the speculative path: the adaptive width's floor), beside `lilicorr` on its default adaptive width.
WIDTH_SYSTEMS = ("lilicorr_fixed", "lilicorr_w1")
ALL_SYSTEMS = (*SYSTEMS, *VERIFY_SYSTEMS, *WALK_SYSTEMS, *WIDTH_SYSTEMS)
RATIOS = (
    ("lilicorr", "builtin"),
    ("lilicorr", "dflash"),
    ("builtin", "dflash"),
    ("lilicorr", "base"),
    ("dflash", "base"),
    ("dflash_splitkv", "dflash"),
    ("lilicorr", "lilicorr_extend"),
    ("lilicorr_extend", "builtin"),
    ("lilicorr", "dflash_splitkv"),
    ("lilicorr", "lilicorr_viterbi"),
    ("lilicorr", "lilicorr_fixed"),
    ("lilicorr_fixed", "base"),
    ("lilicorr_w1", "base"),
)
LABELS = {
    "base": "no speculation",
    "dflash": "DFLASH",
    "builtin": "built-in LiLiCorr",
    "lilicorr": "LILICORR",
    "dflash_splitkv": "DFLASH split-KV verify",
    "lilicorr_extend": "LILICORR prefill-kernel verify",
    "lilicorr_fixed": "LILICORR, width 16",
    "lilicorr_w1": "LILICORR, width 1",
    "lilicorr_viterbi": "LILICORR Viterbi walk",
}


def _interval(values: Sequence[float]) -> list:
    ci = mean_ci95(values)
    return [round(ci["mean"], 4), round(ci["lo"], 4), round(ci["hi"], 4)]


def summarize(rounds: Sequence[Iterable[dict]]) -> dict:
    """Per concurrency (str keys) where all of REQUIRED ran: mean tok/s of each system that ran (of ALL_SYSTEMS) over
    the rounds all of them played, the paired ratios of RATIOS (those whose systems both ran) as
    [mean, lo, hi], tau per speculative system, each verify width's share of the verify steps per system whose records
    hold the servers' width histograms (LILICORR's; "tiers"), and the rounds counted."""
    per = defaultdict(lambda: defaultdict(dict))  # c -> system -> round -> records
    for r, records in enumerate(rounds):
        for rec in records:
            per[int(rec["concurrency"])][rec["system"]].setdefault(r, []).append(rec)
    out = {}
    for c in sorted(per):
        cell = per[c]
        systems = [s for s in ALL_SYSTEMS if s in cell]
        runs = sorted(set.intersection(*(set(cell[s]) for s in systems))) if set(REQUIRED) <= set(systems) else []
        if not runs:
            continue
        tps = {s: {r: output_tps(cell[s][r]) for r in runs} for s in systems}
        entry = {s: round(sum(tps[s].values()) / len(runs), 1) for s in systems}
        for a, b in RATIOS:
            if a in tps and b in tps:
                entry[f"{a}_vs_{b}"] = _interval([tps[a][r] / tps[b][r] for r in runs])
        pooled = {s: [rec for r in runs for rec in cell[s][r]] for s in systems}
        entry["tau"] = {s: round(t, 3) for s in systems if (t := tau(pooled[s])) is not None}
        widths = {s: tier_shares(summed_histogram(pooled[s], "cap_lens_histogram")) for s in systems}
        entry["tiers"] = {s: {w: round(x, 4) for w, x in shares.items()} for s, shares in widths.items() if shares}
        step = decode_step_ms(pooled.get("base", []))
        entry["decode_step_ms"] = None if step is None else round(step, 3)
        entry["block_over_decode"] = {
            s: round(ms / step, 3) for s in systems if step and (ms := block_ms(pooled[s])) is not None
        }
        entry["tok_s_per_round"] = {s: [round(tps[s][r], 1) for r in runs] for s in systems}
        entry["rounds"] = len(runs)
        out[str(c)] = entry
    return out


def decode_step_ms(records: Iterable[dict]) -> float | None:
    """ms per decode step without speculation: request latency over completion tokens (one token per step)."""
    turns = [t for r in records for t in r["turns"]]
    tokens = sum(t["completion_tokens"] for t in turns)
    return 1000 * sum(t["end"] - t["start"] for t in turns) / tokens if tokens else None


def systems_in(summary: Mapping[str, dict]) -> list[str]:
    """The systems of ALL_SYSTEMS that ran in some cell of a summary."""
    return [s for s in ALL_SYSTEMS if any(s in e for e in summary.values())]


def table(summary: Mapping[str, dict], title: str = "") -> str:
    """A markdown table of one setting's summary: tok/s per system, the paired ratios with their intervals, tau, the
    width use (width: share of verify steps) of each system that reported it."""
    systems = systems_in(summary)
    ratios = [f"{a}_vs_{b}" for a, b in RATIOS if any(f"{a}_vs_{b}" in e for e in summary.values())]
    tiered = [s for s in systems if any(s in e.get("tiers", {}) for e in summary.values())]
    head = [
        "c",
        *(f"{LABELS[s]} tok/s" for s in systems),
        *(r.replace("_vs_", " / ") for r in ratios),
        "tau D / B / L",
        "block / decode step D / B / L",
        *(f"{LABELS[s]} widths" for s in tiered),
        "rounds",
    ]
    lines = ([f"**{title}**", ""] if title else []) + ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c, e in summary.items():
        cells = [c, *(f"{e.get(s, float('nan')):.0f}" for s in systems)]
        cells += [f"{e[r][0]:.3f} [{e[r][1]:.3f}, {e[r][2]:.3f}]" if r in e else "-" for r in ratios]
        for key in ("tau", "block_over_decode"):
            cells.append(" / ".join(f"{e[key].get(s, float('nan')):.2f}" for s in ("dflash", "builtin", "lilicorr")))
        for s in tiered:
            shares = e.get("tiers", {}).get(s, {})
            cells.append(", ".join(f"{w}: {x:.2f}" for w, x in sorted(shares.items(), key=lambda i: int(i[0]))) or "-")
        cells.append(str(e["rounds"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(settings: Mapping[str, Mapping[str, dict]], path: Path) -> Path:
    """Tokens/s by concurrency per system (left) and LILICORR's paired ratios with their intervals (right), one line
    style per setting."""
    from sglang_lilicorr.bench.plots import pyplot, save

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4))
    for style, (setting, summary) in zip(("-o", "--s", ":^"), settings.items()):
        cs = [int(c) for c in summary]
        for i, s in enumerate(ALL_SYSTEMS):
            if s in systems_in(summary):
                ax.plot(
                    cs,
                    [summary[str(c)].get(s, float("nan")) for c in cs],
                    style,
                    color=f"C{i}",
                    label=f"{LABELS[s]} ({setting})",
                )
        for i, key in enumerate(("lilicorr_vs_builtin", "lilicorr_vs_dflash", "lilicorr_extend_vs_builtin")):
            if not all(key in summary[str(c)] for c in cs):
                continue
            ys = [summary[str(c)][key] for c in cs]
            bx.errorbar(
                cs,
                [y[0] for y in ys],
                yerr=[[y[0] - y[1] for y in ys], [y[2] - y[0] for y in ys]],
                fmt=style,
                color=f"C{i + len(ALL_SYSTEMS)}",
                capsize=3,
                label=f"{key.replace('_vs_', ' / ')} ({setting})",
            )
    ax.set(xscale="log", xlabel="concurrency", ylabel="output tokens/s", title="served throughput")
    bx.axhline(1.0, color="grey", lw=0.8)
    bx.set(xscale="log", xlabel="concurrency", ylabel="ratio (paired, 95 % CI)", title="LILICORR against")
    ax.legend(fontsize=7)
    bx.legend(fontsize=7)
    return save(fig, path)


CAPTURE_LINE = re.compile(r"Capture (\w+ \w+) CUDA graph end\..*?elapsed=([0-9.]+) s")
SCHEDULER_LINE = re.compile(r"Engine startup timings \(s\):.*?scheduler_e2e=([0-9.]+)")
LOAD_LINE = re.compile(r"Engine startup timings \(s\): load_weight=([0-9.]+)")
PRECOMPILE_LINE = re.compile(r"Triton kernels compiled concurrently .*? in ([0-9.]+) s")  # fast_path/precompile.py
LATE_COMPILE_LINE = re.compile(r"Triton kernel '(\w+)' took [0-9.]+ s to compile after serving started")  # SGLang's


def capture_seconds(log_text: str) -> dict:
    """Start-up seconds a server's log reports: graph capture by SGLang's name of the graph set ("target decode", "draft
    verify", ...), their sum under "total", the scheduler's whole start-up ("scheduler_e2e": weights, pools, graphs
    and LILICORR's proposal warm-up), its weight loading ("load_weight") and LILICORR's concurrent compiles of the
    select's kernels before capture ("precompile", summed over its passes)."""
    out = {}
    for m in CAPTURE_LINE.finditer(log_text):
        out[m.group(1)] = round(out.get(m.group(1), 0.0) + float(m.group(2)), 2)
    if out:
        out["total"] = round(sum(out.values()), 2)
    for key, line in (("scheduler_e2e", SCHEDULER_LINE), ("load_weight", LOAD_LINE)):
        if found := line.search(log_text):
            out[key] = float(found.group(1))
    if passes := PRECOMPILE_LINE.findall(log_text):
        out["precompile"] = round(sum(map(float, passes)), 2)
    return out


def late_compiles(log_text: str) -> dict:
    """Triton kernels a server compiled after it started serving, by kernel name: how many times SGLang's warning
    (srt/utils/triton_load_watch.py, compiles of a second or more) names each. Empty: none."""
    return dict(Counter(LATE_COMPILE_LINE.findall(log_text)))


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) spent so far by `pid` and every process below it (Linux /proc; 0 elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    children = defaultdict(list)
    stats = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(d.name)] = fields
        children[int(fields[1])].append(int(d.name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += int(stats[p][11]) + int(stats[p][12])  # utime, stime (fields 14, 15 of stat)
        todo += children.get(p, [])
    return total / tick


def report(graphs: dict | None, eager: dict | None, card: str, commit: str) -> dict:
    """The results file: graphs' summary per c and `startup_s` (graph capture seconds and the scheduler's whole
    start-up per system, in the setting's first call, and only where every server of it started on an empty Triton
    cache: its `cold_cache`, recorded by the speed step; a call before that record had a cold cache), `eager` (the
    eager setting at c = 32), `backends` (the servers' attention and sampling backends, where the speed step recorded
    them), card and commit; a setting not given adds none of its cells."""
    keep = (*ALL_SYSTEMS, *(f"{a}_vs_{b}" for a, b in RATIOS), "tau", "block_over_decode", "tiers", "greedy", "rounds")
    out = {}
    if graphs:
        out = {c: {k: e[k] for k in keep if k in e} for c, e in graphs["summary"].items()}
        first = next(iter(graphs.get("capture_s", {}).values()), {})
        if not all(m.get("cold_cache", True) for m in first.values()):
            first = {}  # a warm start-up is not one: the cell is left to --keep-from
        out["startup_s"] = {
            s: {"graph_capture": first[s].get("total"), "scheduler": first[s].get("scheduler_e2e")}
            for s in ALL_SYSTEMS
            if s in first
        }
    if eager and "32" in eager["summary"]:
        out["eager"] = {k: eager["summary"]["32"][k] for k in keep if k in eager["summary"]["32"]}
    backends = [doc["backends"] for doc in (graphs, eager) if doc and doc.get("backends")]
    if backends:  # the speed step records them since 171a5be (the kit's Triton and PyTorch before)
        out["backends"] = backends[0]
    return {**out, "card": card, "commit": commit}


NAMED_CELLS = ("eager", "startup_s", "startup_alone_s")


def keep_unmeasured(result: dict, earlier: dict) -> dict:
    """`result` with the cells it lacks (a concurrency, `eager`, `startup_s`, `startup_alone_s`) taken from
    `earlier`, an older results file; `measured` names the card and commit of every cell."""
    cells = [k for k in earlier if k.isdigit() or k in NAMED_CELLS]
    before = earlier.get("measured", {})
    measured = {k: f"{result['card']}, {result['commit']}" for k in result if k.isdigit() or k in NAMED_CELLS}
    kept = {k: earlier[k] for k in cells if k not in result or (k == "startup_s" and not result[k])}
    measured |= {k: before.get(k, f"{earlier['card']}, {earlier['commit']}") for k in kept}
    order = sorted(measured, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else k))
    return {**result, **kept, "measured": {k: measured[k] for k in order}}


def with_startup_alone(result: dict, startup: dict, measured: str) -> dict:
    """`result` with `startup_alone_s`: the testbed's startup step (benchmarks/testbed/startup.py: each server started
    alone, cold) per system, the medians of graph capture, the scheduler's whole start-up and launch to /health, and how
    many starts; `measured` ("CARD, COMMIT") names where it ran."""
    alone = {
        s: {"graph_capture": m["total"], "scheduler": m["scheduler_e2e"], "ready": m["ready_s"]}
        | {"starts": startup["starts"][s]}
        for s, m in startup["median"].items()
    }
    return {**result, "startup_alone_s": alone, "measured": {**result.get("measured", {}), "startup_alone_s": measured}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Served-speed results of the testbed's speed step (module docstring).")
    p.add_argument("--graphs", type=Path, help="the graphs32 setting's folder (its speed_summary.json)")
    p.add_argument("--eager", type=Path, help="the graphs16 setting's folder")
    p.add_argument("--card", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--keep-from",
        type=Path,
        help="an earlier summary.json: the cells this run did not measure are kept from it (`measured` names each "
        "cell's card and commit)",
    )
    p.add_argument("--startup", type=Path, help="the startup step's startup.json (servers started alone, cold)")
    p.add_argument("--startup-measured", metavar="'CARD, COMMIT'", help="where --startup's starts ran")
    a = p.parse_args(argv)
    if a.graphs is None and a.eager is None:
        p.error("nothing to summarize: pass --graphs (the graphs32 setting's folder), --eager (graphs16's) or both")
    if a.startup is not None and not (a.startup.is_file() and a.startup_measured):
        p.error(f"--startup {a.startup}: pass the startup step's startup.json and --startup-measured 'CARD, COMMIT'")
    if a.keep_from is not None and not a.keep_from.is_file():
        p.error(f"--keep-from {a.keep_from}: no such file; pass an earlier run's summary.json")
    docs = {}
    for name, folder in (("graphs", a.graphs), ("eager", a.eager)):
        if folder is not None:
            path = folder / "speed_summary.json"
            if not path.is_file():
                p.error(f"--{name} {folder}: no speed_summary.json there; pass the speed step's folder of that setting")
            docs[name] = json.loads(path.read_text())
    a.out.mkdir(parents=True, exist_ok=True)
    result = report(docs.get("graphs"), docs.get("eager"), a.card, a.commit)
    if a.keep_from is not None:
        result = keep_unmeasured(result, json.loads(a.keep_from.read_text()))
    if a.startup is not None:
        result = with_startup_alone(result, json.loads(a.startup.read_text()), a.startup_measured)
    (a.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    settings = {doc["setting"]: doc["summary"] for doc in docs.values()}
    text = "".join(table(summary, f"{setting} ({a.card}, {a.commit})") + "\n" for setting, summary in settings.items())
    (a.out / "table.md").write_text(text)
    plot(settings, a.out / "speed.png")
    print(text + f"-> {a.out}/summary.json, table.md, speed.png")
    return 0
