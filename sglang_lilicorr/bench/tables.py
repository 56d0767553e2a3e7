"""Markdown tables in the paper's layouts from report cells; the baseline shows TPS / 1.00x, a row's best is bold."""

from __future__ import annotations

import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from .metrics import ALL

PARTS_FULL = ("tau", "tps", "speedup")
PARTS_TAU_TPS = ("tau", "tps")
NAMES = {"tau": "τ", "tps": "TPS", "speedup": "Sp.", "block_ms": "ms", "block_ratio": "ratio"}
LOWER_IS_BETTER = {"block_ms", "block_ratio"}
FORMATS = {"tau": "{:.2f}", "tps": "{:.0f}", "speedup": "{:.2f}x", "block_ms": "{:.2f}", "block_ratio": "{:.2f}x"}


def _temperature_label(t: float) -> str:
    return "Greedy, T=0" if t == 0 else f"Sampling, T={t:g}"


def systems_of(cells: Sequence[dict], baseline: Optional[str]) -> List[str]:
    """Baseline first, then the other systems in sorted order."""
    others = sorted({c["system"] for c in cells} - {baseline})
    return ([baseline] if baseline in {c["system"] for c in cells} else []) + others


def _format(part: str, value: Optional[float], bold: bool) -> str:
    if value is None:
        return "--"
    text = FORMATS[part].format(value)
    return f"**{text}**" if bold else text


def _row(by_system: Dict[str, Optional[dict]], systems: Sequence[str], baseline: Optional[str], parts) -> List[str]:
    """One table row's cell texts; best speculative value per part in bold (highest, or lowest for LOWER_IS_BETTER)."""
    spec = [s for s in systems if s != baseline]
    best = {}
    for part in parts:
        vals = [v for v in ((by_system.get(s) or {}).get(part) for s in spec) if v is not None]
        best[part] = (min if part in LOWER_IS_BETTER else max)(vals) if len(vals) > 1 else None
    out = []
    for s in systems:
        cell = by_system.get(s)
        shown = [p for p in parts if not (s == baseline and p == "tau")]
        if cell is None:
            out.append("--")
            continue
        bold = {p: s != baseline and best[p] is not None and cell.get(p) == best[p] for p in shown}
        out.append(" / ".join(_format(p, cell.get(p), bold[p]) for p in shown))
    return out


def _render(title_cols: Tuple[str, str], systems, baseline, parts, blocks, names=NAMES) -> str:
    """blocks: [(block_label, [(row_label, {system: cell}), ...]), ...] -> markdown."""
    heads = [f"{s} ({' / '.join(names[p] for p in parts if not (s == baseline and p == 'tau'))})" for s in systems]
    lines = ["| " + " | ".join(list(title_cols) + heads) + " |", "|" + "---|" * (2 + len(systems))]
    for block_label, rows in blocks:
        for i, (row_label, by_system) in enumerate(rows):
            row = [block_label if i == 0 else "", str(row_label)] + _row(by_system, systems, baseline, parts)
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _lookup(cells: Sequence[dict]) -> Dict[Tuple, dict]:
    return {(c["system"], c["dataset"], c["group"], c["concurrency"], c["temperature"]): c for c in cells}


def _average(rows: List[Tuple[str, Dict[str, dict]]], systems, parts) -> Dict[str, dict]:
    avg = {}
    for s in systems:
        avg[s] = {}
        for p in parts:
            vals = [by[s][p] for _, by in rows if by.get(s) and by[s].get(p) is not None]
            avg[s][p] = statistics.fmean(vals) if vals else None
    return avg


def main_table(cells: Sequence[dict], baseline: Optional[str], concurrency: int = 1) -> str:
    """Benchmarks x systems at one concurrency, one block per temperature, with an Average row."""
    idx, systems = _lookup(cells), systems_of(cells, baseline)
    datasets = sorted({c["dataset"] for c in cells})
    blocks = []
    for t in sorted({c["temperature"] for c in cells}):
        rows = [
            (d, {s: idx.get((s, d, ALL, concurrency, t)) for s in systems})
            for d in datasets
            if any((s, d, ALL, concurrency, t) in idx for s in systems)
        ]
        if rows:
            if len(rows) > 1:
                rows.append(("Average", _average(rows, systems, PARTS_FULL)))
            blocks.append((_temperature_label(t), rows))
    return _render(("", "Benchmark"), systems, baseline, PARTS_FULL, blocks)


def category_table(cells: Sequence[dict], dataset: str, baseline: Optional[str], concurrency: int = 1) -> str:
    """Categories of one dataset x systems, one block per temperature; cells tau / TPS."""
    idx, systems = _lookup(cells), systems_of(cells, baseline)
    groups = sorted({c["group"] for c in cells if c["dataset"] == dataset and c["group"] != ALL})
    blocks = []
    for t in sorted({c["temperature"] for c in cells if c["dataset"] == dataset}):
        rows = [(g, {s: idx.get((s, dataset, g, concurrency, t)) for s in systems}) for g in groups]
        rows = [r for r in rows if any(r[1].values())]
        if rows:
            blocks.append((_temperature_label(t), rows))
    return _render(("", "Category"), systems, baseline, PARTS_TAU_TPS, blocks)


def concurrency_table(cells: Sequence[dict], dataset: str, baseline: Optional[str], temperature: float = 0.0) -> str:
    """Concurrency x systems for one dataset and temperature, one block per group (entropy tier)."""
    idx, systems = _lookup(cells), systems_of(cells, baseline)
    mine = [c for c in cells if c["dataset"] == dataset and c["temperature"] == temperature]
    groups = sorted({c["group"] for c in mine} - {ALL}) or [ALL]
    blocks = []
    for g in groups:
        rows = [
            (c, {s: idx.get((s, dataset, g, c, temperature)) for s in systems})
            for c in sorted({c["concurrency"] for c in mine})
        ]
        blocks.append((f"{dataset}, {g}", rows))
    return _render(("", "c"), systems, baseline, PARTS_FULL, blocks)


def block_table(cells: Sequence[dict], concurrency: int, reference: Optional[str] = None) -> str:
    """Per-block wall (ms) of the speculative systems at one concurrency, with `reference`: the ratio to it."""
    mine = [c for c in cells if c["concurrency"] == concurrency]
    speculative = {c["system"] for c in mine if c.get("block_ms") is not None}
    systems = ([reference] if reference in speculative else []) + sorted(speculative - {reference})
    parts = ("block_ms", "block_ratio") if reference else ("block_ms",)
    idx = _lookup(mine)
    blocks = []
    for t in sorted({c["temperature"] for c in mine}):
        rows = []
        for d in sorted({c["dataset"] for c in mine}):
            for g in [ALL] + sorted({c["group"] for c in mine if c["dataset"] == d} - {ALL}):
                by_system = {s: idx.get((s, d, g, concurrency, t)) for s in systems}
                if any(by_system.values()):
                    rows.append((d if g == ALL else f"{d}, {g}", by_system))
        if rows:
            blocks.append((_temperature_label(t), rows))
    return _render(("", "Benchmark"), systems, None, parts, blocks, {**NAMES, "block_ratio": f"ratio vs {reference}"})


def paired_table(cells: Sequence[dict], reference: str) -> str:
    """Per (dataset, c, T) and system: runs paired with the reference, mean TPS and block-wall ratios with 95 % CI."""
    rows = [
        "| Benchmark | c | T | system | pairs | TPS / ref (95 % CI) | ms per block / ref (95 % CI) |",
        "|---|---|---|---|---|---|---|",
    ]
    fmt = lambda m: f"{m['mean']:.3f} ({m['lo']:.3f}-{m['hi']:.3f})" if m else "--"  # noqa: E731
    paired = [c for c in cells if c["group"] == ALL and c.get("paired")]
    for c in sorted(paired, key=lambda c: (c["dataset"], c["concurrency"], c["temperature"], c["system"])):
        p = c["paired"]
        rows.append(
            f"| {c['dataset']} | {c['concurrency']} | {c['temperature']:g} | {c['system']} | {len(p['runs'])} "
            f"| {fmt(p.get('tps'))} | {fmt(p.get('block_ms'))} |"
        )
    return "\n".join(rows) + "\n"


def _share_rows(cells: Sequence[dict], field: str) -> List[dict]:
    """Group "all" cells holding `field` (acceptance / tiers), by benchmark, T, system, c."""
    return sorted(
        (c for c in cells if c["group"] == ALL and c.get(field)),
        key=lambda c: (c["dataset"], c["temperature"], c["system"], c["concurrency"]),
    )


def _share_table(rows: List[dict], columns: List[str], shares: List[List[float]], histogram: str) -> str:
    """A row per cell: its shares under `columns`, then the verify steps its `histogram` counts."""
    head = ["Benchmark", "T", "system", "c", *columns, "verify steps"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c, values in zip(rows, shares):
        lines.append(
            f"| {c['dataset']} | {c['temperature']:g} | {c['system']} | {c['concurrency']} | "
            + " | ".join(f"{v:.3f}" for v in values)
            + f" | {sum(c.get(histogram) or ())} |"
        )
    return "\n".join(lines) + "\n"


def acceptance_table(cells: Sequence[dict]) -> str:
    """Per (benchmark, T, system, c): the share of verify steps that accepted at least i drafts."""
    rows = _share_rows(cells, "acceptance")
    positions = max(len(c["acceptance"]) for c in rows)
    shares = [c["acceptance"] + [0.0] * (positions - len(c["acceptance"])) for c in rows]
    return _share_table(rows, [str(i) for i in range(1, positions + 1)], shares, "correct_drafts_histogram")


def tier_table(cells: Sequence[dict]) -> str:
    """Per (benchmark, T, system, c): each verify width's share of the verify steps (widths any cell used)."""
    rows = _share_rows(cells, "tiers")
    widths = sorted({int(w) for c in rows for w in c["tiers"]})
    shares = [[c["tiers"].get(str(w), 0.0) for w in widths] for c in rows]
    return _share_table(rows, [f"w {w}" for w in widths], shares, "cap_lens_histogram")


def report(cells: Sequence[dict], baseline: Optional[str], block_reference: Optional[str] = None) -> str:
    """The full markdown report (every table); block_reference: the system the others' ms per block divide by."""
    out = ["# Benchmark report\n", f"Baseline (no speculation): {baseline or 'none given; speedup not shown'}.\n"]
    runs = max((c.get("runs", 1) for c in cells), default=1)
    if runs > 1:
        out.append(
            f"Repeated runs pooled: each value is the mean over the runs that have its cell (up to {runs}); "
            "summary.json holds the std across runs (`*_std`) and the count (`runs`).\n"
        )

    def section(title: str, table: str) -> None:
        out.extend((f"\n## {title}\n\n", table))

    if any(c.get("paired") for c in cells):
        pairs = f"Paired runs (each run's ratio to {block_reference}, then the mean with its 95 % t interval)"
        section(pairs, paired_table(cells, block_reference))
    for c in sorted({c["concurrency"] for c in cells}):
        section(f"τ / TPS / speedup, concurrency {c}", main_table(cells, baseline, c))
        if any(x.get("block_ms") is not None and x["concurrency"] == c for x in cells):
            ratio = f"; ratio = ms / ms of {block_reference}" if block_reference else ""
            wall = f"Per-block wall, concurrency {c} (ms of request latency per verification block{ratio})"
            section(wall, block_table(cells, c, block_reference))
    if any(c["group"] == ALL and c.get("acceptance") for c in cells):
        accepted = "Acceptance per position (share of verify steps that accepted at least i drafts)"
        section(accepted, acceptance_table(cells))
    if any(c["group"] == ALL and c.get("tiers") for c in cells):
        section("Verify width use (each width's share of the verify steps)", tier_table(cells))
    for d in sorted({c["dataset"] for c in cells}):
        if any(c["dataset"] == d and c["group"] != ALL for c in cells):
            for conc in sorted({c["concurrency"] for c in cells if c["dataset"] == d}):
                section(f"{d} per category, concurrency {conc} (τ / TPS)", category_table(cells, d, baseline, conc))
        if len({c["concurrency"] for c in cells if c["dataset"] == d}) > 1:
            for t in sorted({c["temperature"] for c in cells if c["dataset"] == d}):
                section(f"{d} vs concurrency, {_temperature_label(t)}", concurrency_table(cells, d, baseline, t))
    return "".join(out)
