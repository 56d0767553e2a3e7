"""Figures (matplotlib, Agg) of a report's cells."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Sequence

from .metrics import ALL
from .tables import systems_of


def pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError("Plots need matplotlib: `pip install matplotlib`.") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    """Lay out, write (120 dpi, a 256-colour PNG: a third of the bytes) and close a figure."""
    from PIL import Image

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)
    if Path(path).suffix.lower() == ".png":
        Image.open(path).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return Path(path)


def _colors(cells: Sequence[dict], baseline: Optional[str]) -> dict:
    """One fixed color per system across all figures."""
    return {s: f"C{i}" for i, s in enumerate(systems_of(cells, baseline))}


def _slug(*parts) -> str:
    return "_".join(str(p).replace("/", "-").replace(" ", "-") for p in parts)


def _cells_at(cells: Sequence[dict], dataset: str, temperature: float, concurrency: int) -> List[dict]:
    """The cells of one dataset at one temperature and concurrency."""
    at = (dataset, temperature, concurrency)
    return [c for c in cells if (c["dataset"], c["temperature"], c["concurrency"]) == at]


def plot_vs_concurrency(
    cells: Sequence[dict], dataset: str, temperature: float, metric: str, baseline: Optional[str], out_dir: Path
) -> Path:
    """metric ("tps" or "speedup") vs concurrency, one panel per group, one line per system."""
    plt = pyplot()
    mine = [c for c in cells if c["dataset"] == dataset and c["temperature"] == temperature]
    groups = sorted({c["group"] for c in mine} - {ALL}) or [ALL]
    systems = [s for s in systems_of(mine, baseline) if not (metric == "speedup" and s == baseline)]
    colors = _colors(cells, baseline)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), squeeze=False)
    for ax, g in zip(axes[0], groups):
        for s in systems:
            pts = sorted(
                (c["concurrency"], c.get(metric))
                for c in mine
                if c["system"] == s and c["group"] == g and c.get(metric) is not None
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s, color=colors[s])
        ax.set_xscale("log", base=2)
        concurrencies = sorted({c["concurrency"] for c in mine})
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ylabel = {"tps": "output tokens / s", "speedup": "speedup over baseline"}[metric]
        ax.set(xlabel="concurrency c", ylabel=ylabel, title=f"{dataset} {g}, T={temperature:g}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    return save(fig, Path(out_dir) / f"{_slug(metric, 'vs_concurrency', dataset, f'T{temperature:g}')}.png")


def plot_tau_by_category(
    cells: Sequence[dict], dataset: str, temperature: float, concurrency: int, baseline: Optional[str], out_dir: Path
) -> Path:
    """Grouped bars: tau per category, one bar per speculative system."""
    plt = pyplot()
    mine = [
        c for c in _cells_at(cells, dataset, temperature, concurrency) if c["tau"] is not None and c["group"] != ALL
    ]
    groups = sorted({c["group"] for c in mine})
    systems = sorted({c["system"] for c in mine})
    width = 0.8 / max(len(systems), 1)
    colors = _colors(cells, baseline)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.7 * len(groups) * max(len(systems), 1)), 3.6))
    for i, s in enumerate(systems):
        taus = {c["group"]: c["tau"] for c in mine if c["system"] == s}
        xs = [j + i * width for j, g in enumerate(groups) if g in taus]
        ax.bar(xs, [taus[g] for g in groups if g in taus], width, label=s, color=colors[s])
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(groups))])
    ax.set_xticklabels(groups, rotation=30, ha="right")
    ax.set(ylabel="τ (block-weighted)", title=f"{dataset}, T={temperature:g}, c={concurrency}")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return save(fig, Path(out_dir) / f"{_slug('tau_by_category', dataset, f'T{temperature:g}', f'c{concurrency}')}.png")


def plot_repeated_runs(
    cells: Sequence[dict], dataset: str, temperature: float, concurrency: int, baseline: Optional[str], out_dir: Path
) -> Path:
    """Repeated runs (metrics.pool_runs), group "all": per system each run's TPS and ms per block beside the mean."""
    plt = pyplot()
    mine = [c for c in _cells_at(cells, dataset, temperature, concurrency) if c["group"] == ALL]
    systems = systems_of(mine, baseline)
    colors = _colors(cells, baseline)
    fig, axes = plt.subplots(1, 2, figsize=(max(6.0, 1.6 * len(systems) * 2), 3.4))
    for ax, metric, label in zip(axes, ("tps", "block_ms"), ("output tokens / s", "ms of request latency per block")):
        for i, s in enumerate(systems):
            (cell,) = [c for c in mine if c["system"] == s]
            if cell.get(metric) is None:
                continue
            ax.bar(i, cell[metric], 0.6, color=colors[s], alpha=0.5)
            values = [v for v in cell.get(f"{metric}_per_run", [cell[metric]]) if v is not None]
            ax.plot([i] * len(values), values, "o", color=colors[s])
        ax.set_xticks(range(len(systems)), systems)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{dataset}, T={temperature:g}, c={concurrency}: each run (dots) and the mean (bars)", fontsize=10)
    return save(fig, Path(out_dir) / f"{_slug('runs', dataset, f'T{temperature:g}', f'c{concurrency}')}.png")


def _share_panels(plt, cells: Sequence[dict], dataset: str, temperature: float, field: str, baseline: Optional[str]):
    """(figure, [(axis, system, its group "all" cells holding `field`, by c)]): a panel per system that has them."""
    at = (dataset, temperature, ALL)
    mine = [c for c in cells if (c["dataset"], c["temperature"], c["group"]) == at and c.get(field)]
    systems = [s for s in systems_of(mine, baseline) if any(c["system"] == s for c in mine)]
    fig, axes = plt.subplots(1, len(systems), figsize=(4.2 * len(systems), 3.4), squeeze=False)
    panels = [
        (ax, s, sorted((c for c in mine if c["system"] == s), key=lambda c: c["concurrency"]))
        for ax, s in zip(axes[0], systems)
    ]
    return fig, panels


def plot_acceptance(
    cells: Sequence[dict], dataset: str, temperature: float, baseline: Optional[str], out_dir: Path
) -> Path:
    """Per speculative system, the share of verify steps accepting at least i drafts against i, a line per c."""
    fig, panels = _share_panels(pyplot(), cells, dataset, temperature, "acceptance", baseline)
    for ax, system, mine in panels:
        for k, c in enumerate(mine):
            shares = c["acceptance"]
            ax.plot(range(1, len(shares) + 1), shares, marker="o", ms=3, color=f"C{k}", label=f"c={c['concurrency']}")
        ax.set(xlabel="draft position i", ylabel="verify steps accepting >= i drafts", ylim=(0, 1))
        ax.set_title(f"{system}: {dataset}, T={temperature:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return save(fig, Path(out_dir) / f"{_slug('acceptance', dataset, f'T{temperature:g}')}.png")


def plot_tiers(cells: Sequence[dict], dataset: str, temperature: float, baseline: Optional[str], out_dir: Path) -> Path:
    """Per system that reported its verify widths, each width's share of the verify steps, stacked, a bar per c."""
    fig, panels = _share_panels(pyplot(), cells, dataset, temperature, "tiers", baseline)
    widths = sorted({int(w) for _, _, mine in panels for c in mine for w in c["tiers"]})
    for ax, system, mine in panels:
        labels = [str(c["concurrency"]) for c in mine]
        bottom = [0.0] * len(mine)
        for k, w in enumerate(widths):
            heights = [c["tiers"].get(str(w), 0.0) for c in mine]
            ax.bar(labels, heights, bottom=bottom, color=f"C{k}", label=f"width {w}")
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set(xlabel="concurrency c", ylabel="share of verify steps", ylim=(0, 1))
        ax.set_title(f"{system}: {dataset}, T={temperature:g}")
        ax.legend(fontsize=8)
    return save(fig, Path(out_dir) / f"{_slug('tiers', dataset, f'T{temperature:g}')}.png")


def plot_all(cells: Sequence[dict], baseline: Optional[str], out_dir: Path) -> List[Path]:
    """Every figure the cells support -> their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for d in sorted({c["dataset"] for c in cells}):
        mine = [c for c in cells if c["dataset"] == d]
        for t in sorted({c["temperature"] for c in mine}):
            if len({c["concurrency"] for c in mine if c["temperature"] == t}) > 1:
                paths.append(plot_vs_concurrency(cells, d, t, "tps", baseline, out_dir))
                if any(c.get("speedup") is not None and c["system"] != baseline for c in mine):
                    paths.append(plot_vs_concurrency(cells, d, t, "speedup", baseline, out_dir))
            lowest = min(c["concurrency"] for c in mine if c["temperature"] == t)  # tau barely moves with c
            if any(
                c["group"] != ALL and c["tau"] is not None and c["concurrency"] == lowest and c["temperature"] == t
                for c in mine
            ):
                paths.append(plot_tau_by_category(cells, d, t, lowest, baseline, out_dir))
            for conc in sorted(
                {c["concurrency"] for c in mine if c["temperature"] == t and c["group"] == ALL and c.get("runs", 1) > 1}
            ):
                paths.append(plot_repeated_runs(cells, d, t, conc, baseline, out_dir))
            for field, plot in (("acceptance", plot_acceptance), ("tiers", plot_tiers)):
                if any(c["temperature"] == t and c["group"] == ALL and c.get(field) for c in mine):
                    paths.append(plot(cells, d, t, baseline, out_dir))
    return paths
