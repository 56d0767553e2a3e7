"""The Qwen3-8B-scale results (benchmarks/scale.py) on the CPU machine: the phases' bundles -> OUT/

  python -m benchmarks scale-report scale_graph.tar.gz scale_correctors.tar.gz scale_base.tar.gz \
      scale_eager.tar.gz [scale_tput.tar.gz] --out DIR [--corrector-bench corrector_bench.json] \
      [--baselines-summary benchmarks/results/baselines/summary.json]

  summary.json  per system (lilicorr, dflash, builtin, domino, dspark) and concurrency ("1", "4", "16", "32"):
                per_block_ms (graph-captured per-block wall, stage timer), head_ms (top-K/LSE + head +
                walk; 0 for dflash, whose argmax is no head), decode_step_ms (the plain target's decode
                step at the same batch), tok_s (mean over the paired rounds); then the eager figures, the
                stages, throughput ratios with 95 % intervals, the projected speedup, memory, the targets;
                `block_vs_dflash`: the block over DFLASH's measured in the same phase (graph: LILICORR, the
                built-in; correctors: Domino, DSpark), and `tok_s_vs_dflash` the paired ratio of that phase's rounds;
                `tok_s_1024`: the tput phase's 1,024-token rounds (LILICORR and the built-in), which the throughput
                target reads where present
  cost.md       the five systems side by side (block, paired tok/s ratio to DFLASH, head), the paper's Table cost
                per concurrency, throughput, memory, prefill forwards, targets
  cost.png      the stage bars, one panel per concurrency

Projected speedup over no speculation = tau x decode_step_ms / per_block_ms at the paper's tau (PAPER_TAU,
Qwen3-8B, T = 0, mean of the nine benchmarks; the built-in head has LiLiCorr's): a projection from measured
times, not a measured speedup (random weights accept nothing; the blocks were forced to commit 7 tokens).
Largest batch at --mem-fraction-static f, for requests of L tokens: SGLang sizes the KV pool as
f x (free memory before loading) - weights, so pool tokens = (f x free - target - draft) / KV bytes per token
(the pool's measured GiB over its tokens), and the batch = pool tokens // (L + block size).
`--baselines-summary` merges the cost keys into the baselines' summary (baselines_summary.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from sglang_lilicorr.bench import metrics, runner
from sglang_lilicorr.bench.plots import pyplot, save
from sglang_lilicorr.errors import UsageError
from benchmarks import save_json

from . import baselines_summary, stages
from .scale import BLOCK_SIZE, CONCURRENCY, SYSTEMS

PHASE_OF = {"lilicorr": "graph", "dflash": "graph", "builtin": "graph", "domino": "correctors", "dspark": "correctors"}
PAPER_TAU = {
    "lilicorr": 6.48,
    "builtin": 6.48,
    "dflash": 5.64,
}  # the paper's Qwen3-8B T = 0 means (none for the baselines)
GIB = float(1 << 30)
COLUMNS = (
    ("dflash", "graph"),
    ("lilicorr", "eager"),
    ("lilicorr", "graph"),
    ("builtin", "eager"),
    ("builtin", "graph"),
    ("domino", "eager"),
    ("domino", "graph"),
    ("dspark", "eager"),
    ("dspark", "graph"),
)


def phase_folders(inputs: Sequence[Path], scratch: Path) -> dict[str, Path]:
    """{phase name: folder} from scale_<phase>.tar.gz bundles (unpacked into scratch) or phase folders."""
    found: dict[str, Path] = {}
    for path in map(Path, inputs):
        if path.is_file() and path.name.endswith(".tar.gz"):
            with tarfile.open(path) as t:
                t.extractall(scratch / path.name, filter="data")
            folders = [p.parent for p in (scratch / path.name).glob("*/phase.json")]
        else:
            folders = [path] if (path / "phase.json").is_file() else [p.parent for p in path.glob("*/phase.json")]
        if not folders:
            raise UsageError(
                f"{path} holds no phase folder (one with phase.json)",
                fix="pass the scale_<phase>.tar.gz bundles `scale run` wrote, or their unpacked folders",
            )
        for folder in folders:
            name = json.loads((folder / "phase.json").read_text())["phase"]["name"]
            if name in found:
                raise UsageError(
                    f"phase {name!r} given twice ({found[name]}, {folder})", fix="pass one bundle per phase"
                )
            found[name] = folder
    return found


def timings(folder: Optional[Path], system: str) -> Optional[dict]:
    if folder is None or not list((folder / "stages" / system).glob("stages-*.json")):
        return None
    return stages.load_timings(folder / "stages" / system)


def stage_row(timed: Optional[dict], system: str, c: int, graph: bool, missing: list) -> Optional[dict]:
    """One system's decomposition at batch c (stages.from_timings), or None (noted in `missing`)."""
    if timed is None:
        missing.append(f"{system} {'graph' if graph else 'eager'}: no stage timings")
        return None
    try:
        return stages.from_timings({system: timed}, bs=c, graph=graph)["systems"][0]
    except stages.StageSchemaError as e:
        missing.append(str(e))
        return None


def throughput_cells(phases: dict[str, Path], names: Sequence[str] = ("graph", "base")) -> list[dict]:
    """Cells of the paired rounds of the phases `names` (graph and base: 256-token outputs; tput: 1,024), with the
    within-round throughput ratios to builtin (`vs_builtin`) and dflash (`vs_dflash`)."""
    files = [p for name in names if name in phases for p in sorted(phases[name].glob("round*.jsonl"))]
    cells = metrics.pool_runs([metrics.aggregate(runner.read_results(p)) for p in files])
    metrics.add_paired_ratios(cells, "builtin", key="vs_builtin")
    metrics.add_paired_ratios(cells, "dflash", key="vs_dflash")
    return cells


def phase_cells(phases: dict[str, Path], names: Sequence[str], systems: Sequence[str]) -> dict:
    """{(system, c): the all-sets cell} of the paired rounds of the phases `names`, for `systems` only (a paired
    ratio is valid within one phase's rounds: each phase's DFLASH is its own reference)."""
    return {
        (c["system"], c["concurrency"]): c
        for c in throughput_cells(phases, names)
        if c["group"] == metrics.ALL and c["system"] in systems
    }


def _ratio(x: Optional[float], y: Optional[float]) -> Optional[float]:
    return x / y if x is not None and y else None


def raw_medians(timed: Optional[dict], c: int) -> Optional[dict]:
    """{"gpu_ms": {stage: median}, "host_ms": {...}} of the graph-captured steps at batch c, as recorded
    (the host side shows what the scheduler and the worker's Python add to a block)."""
    row = next((r for r in (timed or {}).get("stages", []) if r["bs"] == c and r["graph"]), None)
    return (
        None
        if row is None
        else {kind: {k: v["median"] for k, v in row[kind].items()} for kind in ("gpu_ms", "host_ms")}
    )


def system_entry(
    system: str, c: int, graph: Optional[dict], eager: Optional[dict], step: Optional[float], cell: Optional[dict]
) -> dict:
    head = lambda row: None if row is None else (0.0 if system == "dflash" else row["stages"]["spec_head"])
    per_block = None if graph is None else graph["per_block_wall"]
    tps = None if cell is None else cell["tps"]
    return {
        "per_block_ms": per_block,
        "head_ms": head(graph),
        "decode_step_ms": step,
        "tok_s": tps,
        "per_block_ms_eager": None if eager is None else eager["per_block_wall"],
        "head_ms_eager": head(eager),
        "stages_ms": None if graph is None else graph["stages"],
        "stages_ms_eager": None if eager is None else eager["stages"],
        "n_blocks": None if graph is None else graph["n_blocks"],
        "forced_commit_len": None if graph is None else graph["forced_commit_len"],
        "head_share": _ratio(head(graph), per_block),
        "block_over_decode_step": _ratio(per_block, step),
        "projected_speedup": None
        if per_block is None or step is None or system not in PAPER_TAU
        else PAPER_TAU[system] * step / per_block,
        "tok_s_per_round": None if cell is None else cell.get("tps_per_run"),
        "tok_s_vs_builtin": None if cell is None else (cell.get("vs_builtin") or {}).get("tps"),
        "tok_s_vs_dflash": None if cell is None else (cell.get("vs_dflash") or {}).get("tps"),
    }


def memory_entry(
    timed: Optional[dict], pre_empty: Optional[float], block: int, mem_fraction: float, request_tokens: int
) -> Optional[dict]:
    mem = (timed or {}).get("memory")
    if not mem or "error" in mem:
        return mem
    out = dict(mem)
    tokens, pool = mem.get("max_total_num_tokens"), mem.get("kv_pool_gib")
    per_token = pool * GIB / tokens if pool and tokens else None
    weights = (mem.get("target_gib") or 0.0) + (mem.get("draft_gib") or 0.0)
    out["kv_bytes_per_token"] = per_token
    out["server_gib"] = _diff(
        mem.get("pre_load_free_gib"), mem.get("free_after_graphs_gib", mem.get("free_after_init_gib"))
    )
    if per_token and pre_empty:
        pool_tokens = max(0, int((mem_fraction * pre_empty - weights) * GIB / per_token))
        out.update(pool_tokens_at_fraction=pool_tokens, largest_batch=pool_tokens // (request_tokens + block))
    return out


def _diff(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a - b if a is not None and b is not None else None


def _target(values: dict, ok) -> dict:
    known = {c: v for c, v in values.items() if v is not None}
    return {
        "met": all(ok(v) for v in known.values()) if known and len(known) == len(values) else None,
        "values": values,
    }


def targets(systems: dict, long_runs: dict) -> dict:
    """The issue's targets; the throughput one from the 1,024-token rounds (`long_runs`, the tput phase) where they
    were measured, else from the graph phase's."""
    lil, dfl, blt = (systems[s] for s in ("lilicorr", "dflash", "builtin"))
    cs = list(lil)
    lo = lambda ci: None if ci is None else ci["lo"]  # noqa: E731
    vs_builtin = {c: (long_runs.get(c) or {}).get("tok_s_vs_builtin") or lil[c]["tok_s_vs_builtin"] for c in cs}
    return {
        "head_share_c1_le_1.5pct": _target({"1": lil.get("1", {}).get("head_share")}, lambda v: v <= 0.015),
        "lilicorr_block_le_1.01x_dflash": _target(
            {c: _ratio(lil[c]["per_block_ms"], dfl[c]["per_block_ms"]) for c in cs}, lambda v: v <= 1.01
        ),
        "lilicorr_block_le_builtin": _target(
            {c: _ratio(lil[c]["per_block_ms"], blt[c]["per_block_ms"]) for c in cs}, lambda v: v <= 1.0
        ),
        "lilicorr_tok_s_ge_builtin_ci_lo": _target({c: lo(vs_builtin[c]) for c in cs}, lambda v: v >= 1.0),
        "lilicorr_head_below_domino": _target(  # the served heads, graph-captured
            {c: _ratio(lil[c]["head_ms"], systems["domino"][c]["head_ms"]) for c in cs}, lambda v: v < 1.0
        ),
    }


def summarize(
    phases: dict[str, Path],
    *,
    mem_fraction: float = 0.85,
    request_tokens: int = 4096,
    concurrency: Sequence[int] = CONCURRENCY,
) -> tuple[dict, dict]:
    """(summary.json's document, {c: the stage-decomposition document of Table cost's columns})."""
    missing: list[str] = []
    eager, base = (phases.get(n) for n in ("eager", "base"))
    timed = {s: timings(phases.get(PHASE_OF[s]), s) for s in SYSTEMS}
    timed_eager = {s: timings(eager, s) for s in SYSTEMS}
    timed_base = timings(base, "base")
    # the correctors' paired rounds pooled apart: a ratio pairs runs of one phase's rounds only
    cells = {
        **phase_cells(phases, ("graph", "base"), ("lilicorr", "dflash", "builtin", "base")),
        **phase_cells(phases, ("correctors",), ("domino", "dspark")),
    }
    reference = {p: timings(phases.get(p), "dflash") for p in sorted(set(PHASE_OF.values()))}  # each phase's DFLASH
    long_cells = {
        (c["system"], c["concurrency"]): c for c in throughput_cells(phases, ("tput",)) if c["group"] == metrics.ALL
    }
    long_runs = {
        str(c): {
            "tok_s": {s: long_cells[s, c]["tps"] for s in ("lilicorr", "builtin") if (s, c) in long_cells},
            "tok_s_vs_builtin": (long_cells.get(("lilicorr", c)) or {}).get("vs_builtin", {}).get("tps"),
        }
        for c in concurrency
        if ("lilicorr", c) in long_cells
    }
    systems: dict = {s: {} for s in SYSTEMS}
    base_out, tables = {}, {}
    for c in concurrency:
        rows = {
            (s, v): stage_row((timed if v == "graph" else timed_eager)[s], s, c, v == "graph", missing)
            for s in SYSTEMS
            for v in ("graph", "eager")
        }
        step = None
        if timed_base is not None:
            try:
                step = stages.plain_step_ms(timed_base, c)
            except stages.StageSchemaError as e:
                missing.append(str(e))
        dflash_block = {
            p: (stage_row(t, "dflash", c, True, []) or {}).get("per_block_wall") if t else None
            for p, t in reference.items()
        }
        for s in SYSTEMS:
            entry = system_entry(s, c, rows[s, "graph"], rows[s, "eager"], step, cells.get((s, c)))
            systems[s][str(c)] = {
                **entry,
                "block_vs_dflash": _ratio(entry["per_block_ms"], dflash_block[PHASE_OF[s]]),
                "recorded": raw_medians(timed[s], c),
            }
        base_cell = cells.get(("base", c))
        base_out[str(c)] = {
            "decode_step_ms": step,
            "tok_s": None if base_cell is None else base_cell["tps"],
            "tok_s_per_round": None if base_cell is None else base_cell.get("tps_per_run"),
        }
        for s in SYSTEMS:
            tps, base_tps = systems[s][str(c)]["tok_s"], base_out[str(c)]["tok_s"]
            systems[s][str(c)]["speedup_measured"] = _ratio(tps, base_tps)
        columns = [rows[k] for k in COLUMNS if rows[k] is not None]
        if columns:
            tables[c] = stages.validate({"benchmark": "scale-qwen3-8b", "batch_size": c, "systems": columns})
    every = [t for t in (*timed.values(), *timed_eager.values(), timed_base) if t]
    pre_empty = max((t.get("memory") or {}).get("pre_load_free_gib") or 0.0 for t in every) if every else None
    memory = {s: memory_entry(timed[s], pre_empty, BLOCK_SIZE, mem_fraction, request_tokens) for s in SYSTEMS}
    memory["base"] = memory_entry(timed_base, pre_empty, 0, mem_fraction, request_tokens)
    phase_info = {n: json.loads((f / "phase.json").read_text()) for n, f in phases.items()}
    cards = [(t.get("system") or {}).get("gpu") for t in every] + [p.get("gpu") for p in phase_info.values()]
    card = next((c for c in cards if c), None)
    doc = {
        "card": card,
        "phases": phase_info,
        "paper_tau": PAPER_TAU,
        "memory_derivation": {
            "mem_fraction_static": mem_fraction,
            "request_tokens": request_tokens,
            "free_before_load_gib": pre_empty,
        },
        "systems": systems,
        "base": base_out,
        "memory": memory,
        "targets": targets(systems, long_runs),
        "missing": list(dict.fromkeys(missing)),  # once each, first-seen order (a gap repeats at every c)
        "tok_s_1024": long_runs,
        "prefill": {s: (t or {}).get("prefill") for s, t in (*timed.items(), ("base", timed_base))},
        "widths": {name: widths_entry(phases, name) for name in ("widths2", "widths7") if name in phases},
    }
    return doc, tables


def widths_entry(phases: dict[str, Path], name: str) -> dict:
    """A widths phase by c: tok/s of the adaptive server (lilicorr) and of each pinned width, the best pinned width,
    adaptive over it (`vs_best`, the ratio of means; target >= 0.97) and each width's paired ratio to the adaptive."""
    cells = throughput_cells(phases, (name,))
    metrics.add_paired_ratios(cells, "lilicorr", key="vs_adaptive")
    by = {(c["system"], c["concurrency"]): c for c in cells if c["group"] == metrics.ALL}
    out = {}
    for c in sorted({c for _, c in by}):
        pinned = {s: by[s, c]["tps"] for s, cc in by if cc == c and s != "lilicorr"}
        if ("lilicorr", c) not in by or not pinned:
            continue
        best = max(pinned, key=pinned.get)
        out[str(c)] = {
            "tok_s": {"lilicorr": by["lilicorr", c]["tps"], **pinned},
            "best_pinned": best,
            "vs_best": by["lilicorr", c]["tps"] / pinned[best],
            "pinned_vs_adaptive": {s: by[s, c].get("vs_adaptive", {}).get("tps") for s in pinned},
        }
    return out


def _fmt(x: Optional[float], spec: str = ".2f") -> str:
    return "--" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _ci(ci: Optional[dict]) -> str:
    return "--" if not ci else f"{ci['mean']:.3f} [{ci['lo']:.3f}, {ci['hi']:.3f}]"


def markdown(doc: dict, tables: dict) -> str:
    systems, base = doc["systems"], doc["base"]
    lines = [
        f"# Cost at Qwen3-8B scale ({doc['card'] or 'unknown card'})",
        "",
        "Made by: "
        + "; ".join(f"{name}: `{info['command']}` ({info['seconds']} s)" for name, info in doc["phases"].items()),
        "",
    ]
    for c, table in tables.items():
        share = systems["lilicorr"][str(c)]["head_share"]
        lines += [
            f"## c = {c}: ms per block",
            "",
            stages.table(table).rstrip(),
            "",
            f"Plain decode step of the same target: {_fmt(base[str(c)]['decode_step_ms'])} ms. LILICORR head share "
            f"of its graph-captured block: {_fmt(None if share is None else 100 * share)} %.",
            "",
        ]
    lines += [
        "## The five systems (graph-captured; each ratio against the DFLASH of the same phase's paired rounds)",
        "",
        "| c | system | block ms | block / DFLASH | tok/s | tok/s / DFLASH (95 % CI) | head ms |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {c} | {s} | {_fmt(e['per_block_ms'])} | {_fmt(e['block_vs_dflash'], '.3f')} | {_fmt(e['tok_s'], '.0f')} | "
        f"{_ci(e['tok_s_vs_dflash'])} | {_fmt(e['head_ms'], '.3f')} |"
        for c in base
        for s in SYSTEMS
        for e in [systems[s][c]]
    ]
    lines += [
        "",
        "## Throughput (tok/s, mean over paired rounds) and projected speedup",
        "",
        "| c | no spec. | DFLASH | built-in | LILICORR | LILICORR / built-in (95 % CI) | LILICORR / DFLASH (95 % CI) | "
        "projected speedup LILICORR / DFLASH / built-in |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in base:
        e = {s: systems[s][c] for s in SYSTEMS}
        lines.append(
            f"| {c} | {_fmt(base[c]['tok_s'], '.0f')} | {_fmt(e['dflash']['tok_s'], '.0f')} | "
            f"{_fmt(e['builtin']['tok_s'], '.0f')} | {_fmt(e['lilicorr']['tok_s'], '.0f')} | "
            f"{_ci(e['lilicorr']['tok_s_vs_builtin'])} | {_ci(e['lilicorr']['tok_s_vs_dflash'])} | "
            + " / ".join(_fmt(e[s]["projected_speedup"]) for s in ("lilicorr", "dflash", "builtin"))
            + "x |"
        )
    if doc.get("tok_s_1024"):
        timer = "stage timer on" if doc["phases"]["tput"]["phase"].get("stage_timer", True) else "uninstrumented"
        lines += [
            "",
            "Throughput with 1,024-token outputs "
            f"(tput phase: LILICORR and the built-in alone, paired rounds, {timer}):",
            "",
            "| c | built-in | LILICORR | LILICORR / built-in (95 % CI) |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {c} | {_fmt(r['tok_s'].get('builtin'), '.0f')} | {_fmt(r['tok_s'].get('lilicorr'), '.0f')} | "
            f"{_ci(r['tok_s_vs_builtin'])} |"
            for c, r in doc["tok_s_1024"].items()
        ]
    d = doc["memory_derivation"]
    lines += [
        "",
        f"## GPU memory (GiB) and the largest batch at --mem-fraction-static {d['mem_fraction_static']} "
        f"({d['request_tokens']}-token requests)",
        "",
        "| system | draft (with head) | head | CUDA graphs | KV bytes / token | largest batch |",
        "|---|---|---|---|---|---|",
    ]
    for s, m in doc["memory"].items():
        m = m or {}
        lines.append(
            f"| {s} | {_fmt(m.get('draft_gib'), '.3f')} | {_fmt(m.get('head_gib'), '.3f')} | "
            f"{_fmt(m.get('graphs_gib'), '.3f')} | "
            f"{_fmt(m.get('kv_bytes_per_token'), '.0f')} | {m.get('largest_batch', '--')} |"
        )
    prefills = {s: p for s, p in doc.get("prefill", {}).items() if p and p["gpu_ms"]["count"]}
    if prefills:
        lines += [
            "",
            "## Prefill forwards (stage timer, every one the servers ran: warm-up and rounds)",
            "",
            "| system | prefills | requests per prefill | GPU ms (mean / median / max) | host ms (mean) |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {s} | {p['gpu_ms']['count']} | {_fmt(p['requests']['mean'], '.1f')} | {_fmt(p['gpu_ms']['mean'])} / "
            f"{_fmt(p['gpu_ms']['median'])} / {_fmt(p['gpu_ms'].get('max'))} | {_fmt(p['host_ms']['mean'])} |"
            for s, p in prefills.items()
        ]
    for name, cells in doc.get("widths", {}).items():
        forced = doc["phases"][name]["forced_commit_len"]
        lines += ["", f"## Adaptive verify width against each pinned width ({name}: blocks commit {forced})", ""]
        lines += ["| c | adaptive tok/s | best pinned | its tok/s | adaptive / best |", "|---|---|---|---|---|"]
        lines += [
            f"| {c} | {x['tok_s']['lilicorr']:.0f} | {x['best_pinned']} | {x['tok_s'][x['best_pinned']]:.0f} | "
            f"{x['vs_best']:.3f} |"
            for c, x in cells.items()
        ]
    lines += ["", "## Targets", ""]
    lines += [
        f"- {name}: {'met' if t['met'] else 'not met' if t['met'] is False else 'not measured'} ({t['values']})"
        for name, t in doc["targets"].items()
    ]
    if doc["missing"]:
        lines += ["", "Not measured: " + "; ".join(doc["missing"])]
    return "\n".join(lines) + "\n"


def plot(tables: dict, path: Path) -> Optional[Path]:
    if not tables:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(len(tables), 1, figsize=(7.5, 2.3 * len(tables) + 0.8), squeeze=False)
    for ax, (c, table) in zip(axes[:, 0], tables.items()):
        stages.draw(ax, table)
        ax.set_title(f"c = {c}", fontsize=9)
    axes[0, 0].legend(fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.15))
    return save(fig, path)


def write(
    inputs: Sequence[Path],
    out: Path,
    *,
    corrector_bench: Optional[Path] = None,
    baselines: Optional[Path] = None,
    **options,
) -> dict:
    bench = baselines_summary.read_bench(corrector_bench) if corrector_bench else None
    with tempfile.TemporaryDirectory() as scratch:
        doc, tables = summarize(phase_folders(inputs, Path(scratch)), **options)
    out.mkdir(parents=True, exist_ok=True)
    save_json(out / "summary.json", doc)
    text = markdown(doc, tables)
    (out / "cost.md").write_text(text)
    plot(tables, out / "cost.png")
    print(text)
    if baselines is not None:
        baselines_summary.merge(baselines, baselines_summary.cost_keys(doc, bench))
        print(f"cost keys merged into {baselines}")
    return doc


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", nargs="+", type=Path, help="scale_<phase>.tar.gz bundles or unpacked phase folders")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--mem-fraction", type=float, default=0.85, help="--mem-fraction-static the largest batch is derived at"
    )
    p.add_argument(
        "--request-tokens", type=int, default=4096, help="tokens (prompt + output) of a request, for the largest batch"
    )
    p.add_argument(
        "--corrector-bench",
        type=Path,
        help="corrector_bench's JSON: the Viterbi walk's per-block cost over the greedy's",
    )
    p.add_argument(
        "--baselines-summary",
        type=Path,
        help="merge cost_8b, head_ms_8b and viterbi.per_block_ms_8b into this summary.json (other keys kept)",
    )
    args = p.parse_args(argv)
    try:
        write(
            args.inputs,
            args.out,
            corrector_bench=args.corrector_bench,
            baselines=args.baselines_summary,
            mem_fraction=args.mem_fraction,
            request_tokens=args.request_tokens,
        )
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0
