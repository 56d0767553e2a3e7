"""The paper's metrics of a results file, pooled over requests: tau = sum(completion_tokens) / sum(spec_verify_ct),
block_ms = 1000 * sum(end - start) / sum(spec_verify_ct), TPS = sum(completion_tokens) / busy seconds (the union of the
requests' intervals), speedup = TPS / the baseline's; from SGLang's histograms, acceptance[i-1] (share of verify steps
accepting >= i drafts) and tiers[w] (share verifying w tokens). A cell = (system, dataset, group, concurrency,
temperature), averaged over seeds; repeated runs pool (pool_runs) or pair against a reference (add_paired_ratios)."""

from __future__ import annotations

import statistics
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from ..errors import LiLiCorrError

ALL = "all"
CELL_KEY = ("system", "dataset", "group", "concurrency", "temperature")
MATCH_KEY = ("dataset", "group", "concurrency", "temperature")  # a cell and its baseline share this


class ResultsError(LiLiCorrError, ValueError):
    """A results file (or a summary of one) cannot be read or holds nothing to report."""


def _turns(records: Iterable[dict]) -> List[dict]:
    return [t for r in records for t in r["turns"]]


def tau(records: Iterable[dict]) -> Optional[float]:
    """Block-weighted acceptance length of the records' turns (None without spec stats)."""
    spec = [t for t in _turns(records) if t.get("spec_verify_ct")]
    return sum(t["completion_tokens"] for t in spec) / sum(t["spec_verify_ct"] for t in spec) if spec else None


def block_ms(records: Iterable[dict]) -> Optional[float]:
    """Per-block wall: milliseconds of request latency per verification block (None without spec stats)."""
    spec = [t for t in _turns(records) if t.get("spec_verify_ct")]
    return 1000.0 * sum(t["end"] - t["start"] for t in spec) / sum(t["spec_verify_ct"] for t in spec) if spec else None


# a cell's summed histograms (the turns' lists of the same name, "spec_" dropped) and what each gives
HISTOGRAMS = {"correct_drafts_histogram": "acceptance", "cap_lens_histogram": "tiers"}


def summed_histogram(records: Iterable[dict], name: str) -> Optional[List[int]]:
    """The element-wise sum of the turns' `spec_<name>` lists (None where no turn holds one)."""
    return add_histograms(t.get(f"spec_{name}") for t in _turns(records))


def add_histograms(histograms: Iterable[Optional[Sequence[int]]]) -> Optional[List[int]]:
    """Element-wise sum of histograms of any lengths; None where none is given (Nones are skipped)."""
    total: Optional[List[int]] = None
    for h in histograms:
        if h is None:
            continue
        total = (total or []) + [0] * max(0, len(h) - len(total or []))
        for i, n in enumerate(h):
            total[i] += n
    return total


def acceptance(histogram: Optional[Sequence[int]]) -> Optional[List[float]]:
    """Verify steps by accepted drafts -> [share accepting at least i drafts, i = 1, ...] (None without steps)."""
    steps = sum(histogram or ())
    return [sum(histogram[i:]) / steps for i in range(1, max(len(histogram), 2))] if steps else None


def tier_shares(histogram: Optional[Sequence[int]]) -> Optional[Dict[str, float]]:
    """From the verify steps by width: {width: its share of the steps} for each width used (None without steps)."""
    steps = sum(histogram or ())
    return {str(w): n / steps for w, n in enumerate(histogram) if n} if steps else None


def with_shares(cell: dict) -> dict:
    """`cell` with acceptance and tiers taken from its summed histograms."""
    return {
        **cell,
        "acceptance": acceptance(cell.get("correct_drafts_histogram")),
        "tiers": tier_shares(cell.get("cap_lens_histogram")),
    }


def busy_seconds(intervals: Iterable[Tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, cur_start, cur_end = 0.0, None, None
    for s, e in sorted(intervals):
        if e < s:
            raise ValueError(f"interval ends before it starts: ({s}, {e}).")
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def output_tps(records: Iterable[dict]) -> float:
    """Output tokens per busy second."""
    turns = _turns(records)
    seconds = busy_seconds((t["start"], t["end"]) for t in turns)
    if seconds <= 0:
        raise ResultsError(
            "the records span no time; cannot compute tokens per second", fix="check their start/end times"
        )
    return sum(t["completion_tokens"] for t in turns) / seconds


def _mean_std(values: Sequence[Optional[float]]) -> Tuple[Optional[float], Optional[float]]:
    vals = [v for v in values if v is not None]
    return (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0) if vals else (None, None)


def aggregate(records: Iterable[dict]) -> List[dict]:
    """Cells of a results file, seeds averaged (histograms summed): each record in group "all" and its category's."""
    records = list(records)
    categories: Dict[str, set] = {}
    for r in records:
        categories.setdefault(r["dataset"], set()).add(r["category"])
    by_seed: Dict[Tuple, Dict[int, List[dict]]] = {}
    for r in records:
        groups = (ALL,) if len(categories[r["dataset"]]) == 1 else (ALL, r["category"])
        for group in groups:
            key = (r["system"], r["dataset"], group, r["concurrency"], float(r["temperature"]))
            by_seed.setdefault(key, {}).setdefault(r["seed"], []).append(r)
    cells = []
    for key, seeds in sorted(by_seed.items(), key=lambda kv: tuple(map(str, kv[0]))):
        cell = {**dict(zip(CELL_KEY, key)), "seeds": sorted(seeds), "n_prompts": max(len(rs) for rs in seeds.values())}
        for name, of_seed in (("tau", tau), ("block_ms", block_ms), ("tps", output_tps)):
            cell[name], cell[f"{name}_std"] = _mean_std([of_seed(rs) for rs in seeds.values()])
        pooled = [r for rs in seeds.values() for r in rs]
        turns = _turns(pooled)
        cell["completion_tokens"] = sum(t["completion_tokens"] for t in turns)
        cell["verify_blocks"] = sum(t.get("spec_verify_ct") or 0 for t in turns)
        cells.append(with_shares({**cell, **{name: summed_histogram(pooled, name) for name in HISTOGRAMS}}))
    return cells


# what a report adds by comparing cells (add_speedup, add_block_ratio, add_paired_ratios): pool_runs drops a summary's
# (they describe its runs) and the report computes them again
COMPARISONS = ("speedup", "block_ratio", "paired", "paired_speedup")


def pool_runs(runs: Sequence[List[dict]]) -> List[dict]:
    """Cells of repeated runs (one list per results file) -> one cell per key: tau, block_ms and TPS averaged over runs,
    their std, `*_per_run`, counts and histograms summed, "runs" and "run_ids"; COMPARISONS dropped."""
    by_key: Dict[Tuple, List[dict]] = {}
    for i, cells in enumerate(runs):
        for c in cells:
            own = {k: v for k, v in c.items() if k not in COMPARISONS}
            by_key.setdefault(tuple(c[k] for k in CELL_KEY), []).append({"run_ids": [i], **own})  # a summary's kept
    pooled = []
    for same in by_key.values():
        if len(same) == 1:
            pooled.append({**same[0], "runs": same[0].get("runs", 1)})
            continue
        if any(c.get("runs", 1) > 1 for c in same):  # its runs' counts are merged: they cannot be weighed again
            raise ResultsError(
                f"a summary of repeated runs pooled with other runs ({same[0]['system']}, {same[0]['dataset']})",
                fix="report from the runs' results files",
            )
        cell = {**same[0], "runs": sum(c.get("runs", 1) for c in same), "run_ids": [c["run_ids"][0] for c in same]}
        for name in ("tau", "block_ms", "tps"):
            cell[f"{name}_per_run"] = [c.get(name) for c in same]
            cell[name], cell[f"{name}_std"] = _mean_std(cell[f"{name}_per_run"])
        cell["seeds"] = sorted({s for c in same for s in c.get("seeds", [])})
        cell["n_prompts"] = max(c.get("n_prompts", 0) for c in same)
        for name in ("completion_tokens", "verify_blocks"):
            cell[name] = sum(c.get(name) or 0 for c in same)
        for name in HISTOGRAMS:
            cell[name] = add_histograms(c.get(name) for c in same)
        pooled.append(with_shares(cell))
    return pooled


def add_block_ratio(cells: List[dict], reference: str) -> List[dict]:
    """Sets cell["block_ratio"] = block_ms / block_ms of `reference`'s matching cell (None where either is missing)."""
    ref = {tuple(c[k] for k in MATCH_KEY): c.get("block_ms") for c in cells if c["system"] == reference}
    for c in cells:
        r = ref.get(tuple(c[k] for k in MATCH_KEY))
        c["block_ratio"] = c["block_ms"] / r if r and c.get("block_ms") is not None else None
    return cells


# two-sided 95 % quantiles of Student's t by degrees of freedom (a df between two entries takes the lower one's)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
_T975.update({15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000})


def mean_ci95(values: Sequence[float]) -> dict:
    """{n, mean, std, lo, hi}: the mean of `values` with its two-sided 95 % t interval (lo = hi = mean for n = 1)."""
    n = len(values)
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else 0.0
    # dof between two rows take the row below, past the last the last: a larger t, never a narrower interval
    t = _T975[max(d for d in _T975 if d <= max(n - 1, 1))]
    half = t * std / n**0.5 if n > 1 else 0.0
    return {"n": n, "mean": mean, "std": std, "lo": mean - half, "hi": mean + half}


def add_paired_ratios(cells: List[dict], reference: str, key: str = "paired") -> List[dict]:
    """Repeated runs as pairs: per cell (pool_runs) and `reference`'s matching cell, the ratio within each run both
    have -> cell[key] = {"tps": mean_ci95 of the ratios, "block_ms": the same, "runs": run_ids}."""
    ref = {tuple(c[k] for k in MATCH_KEY): c for c in cells if c["system"] == reference}
    for c in cells:
        r = ref.get(tuple(c[k] for k in MATCH_KEY))
        if c["system"] == reference or r is None or "tps_per_run" not in c or "tps_per_run" not in r:
            continue
        theirs = {i: j for j, i in enumerate(r["run_ids"])}
        both = [(j, theirs[i], i) for j, i in enumerate(c["run_ids"]) if i in theirs]
        paired = {"runs": [i for _, _, i in both]}
        for name in ("tps", "block_ms"):
            ratios = [
                c[f"{name}_per_run"][a] / r[f"{name}_per_run"][b]
                for a, b, _ in both
                if c[f"{name}_per_run"][a] is not None and r[f"{name}_per_run"][b]
            ]
            if ratios:
                paired[name] = mean_ci95(ratios)
        if len(paired) > 1:
            c[key] = paired
    return cells


def add_speedup(cells: List[dict], baseline: Optional[str]) -> List[dict]:
    """Sets cell["speedup"] = tps / baseline tps of the matching cell (None where no baseline cell)."""
    base = {tuple(c[k] for k in MATCH_KEY): c["tps"] for c in cells if c["system"] == baseline}
    for c in cells:
        b = base.get(tuple(c[k] for k in MATCH_KEY))
        c["speedup"] = c["tps"] / b if b else None
    return cells


def compare(base_cells: List[dict], spec_cells: List[dict]) -> List[dict]:
    """Speedup of every spec cell over the base cell that matches it (dataset, group, c, T)."""
    base = {tuple(c[k] for k in MATCH_KEY): c for c in base_cells}
    rows = []
    for c in spec_cells:
        b = base.get(tuple(c[k] for k in MATCH_KEY))
        if b is None:
            continue
        row = {k: c[k] for k in MATCH_KEY}
        row.update(base_system=b["system"], system=c["system"], tau=c["tau"], block_ms=c.get("block_ms"))
        rows.append({**row, "base_tps": b["tps"], "tps": c["tps"], "speedup": c["tps"] / b["tps"]})
    if not rows:
        raise ResultsError(
            "no cell of the speculative results matches a baseline cell",
            fix="compare runs of the same dataset, group, concurrency and temperature",
        )
    return rows
