"""The testbed's results as the model card and checkpoints/results.json use them (the `tables` step).

Reads what the GPU steps wrote (or copies of it in one folder): the data manifest, the sweep
rounds, the training plan and metrics, the replay's tau cells, the served-speed summaries (one per
graph setting) and the server tau check. Writes RESULTS/results.json, RESULTS/tables.md and the plots: the curves
(held-out T = 0 tau and per-slot top-1 against training steps), the learning curves (held-out tau against training
tokens, every variant on one axis, where the plan records its tokens per step) and served throughput against
concurrency. Every piece is optional: a table is written for what is there.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from benchmarks.served import serve_speed
from sglang_lilicorr.bench.plots import pyplot, save
from benchmarks import save_json

from .common import Step
from .variants import VARIANT_LABELS, VARIANTS

SETS = ("gsm8k", "humaneval", "aime2025", "gpqa", "writingbench", "mtbench", "average")


def load(root: Path, name: str):
    """The first file under root matching `name` (a glob), or its gzipped copy (`name`.gz, as result folders keep
    large logs), parsed; None when there is none."""
    path = next(iter(sorted(root.rglob(name))), None) or next(iter(sorted(root.rglob(name + ".gz"))), None)
    if path is None:
        return None
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    if name.endswith(".jsonl"):
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def tau_summary(cells: list[dict]) -> dict:
    """{set: {system: {tau_t0, tau_t1_mean, tau_t1_std, tau_t1_per_seed}}} from the replay's cells."""
    out: dict = {}
    for c in cells:
        entry = out.setdefault(c["set"], {}).setdefault(c["system"], {})
        if c["temperature"] == 0:
            entry["tau_t0"] = round(c["tau"], 4)
        else:
            entry.update(
                tau_t1_mean=round(c["tau"], 4),
                tau_t1_std=None if c["tau_std"] is None else round(c["tau_std"], 4),
                tau_t1_per_seed={str(k): round(v, 4) for k, v in c["tau_per_seed"].items()},
            )
    return out


def speed_results(root: Path) -> dict:
    """{setting: serve_speed summary} of every speed_summary.json under root (the speed step's, per setting)."""
    return {
        doc["setting"]: doc["summary"]
        for doc in (json.loads(p.read_text()) for p in sorted(root.rglob("speed_summary.json")))
    }


def fmt(x, digits=3) -> str:
    return "--" if x is None else f"{x:.{digits}f}"


def tau_tables(taus: dict) -> list[str]:
    sets = [s for s in SETS if s in taus]
    lines = [
        "### Acceptance length tau (exact replay of the target's own outputs; T = 1: mean ± std over seeds 0, 1, 2)",
        "",
        "| T | set | LiLiCorr (greedy walk) | Vanilla DFlash | LiLiCorr ckpt, argmax block | LiLiCorr / DFlash |",
        "|---|---|---|---|---|---|",
    ]
    for t_key, label in (("tau_t0", "0"), ("tau_t1_mean", "1")):
        for s in sets:
            row = taus[s]
            ours, theirs, argmax = (row.get(k, {}).get(t_key) for k in ("lilicorr", "dflash", "lilicorr_argmax"))
            std = lambda k: (
                f" ± {row[k]['tau_t1_std']:.3f}"
                if t_key != "tau_t0" and row.get(k, {}).get("tau_t1_std") is not None
                else ""
            )
            ratio = f"{ours / theirs:.3f}x" if ours and theirs else "--"
            lines.append(
                f"| {label} | {s} | {fmt(ours)}{std('lilicorr')} | {fmt(theirs)}{std('dflash')} | "
                f"{fmt(argmax)} | {ratio} |"
            )
    lines += [
        "",
        "### Decode rule (same checkpoint, T = 0): greedy walk vs exact Viterbi",
        "",
        "| set | greedy walk | Viterbi | change |",
        "|---|---|---|---|",
    ]
    for s in sets:
        g, v = (taus[s].get(k, {}).get("tau_t0") for k in ("lilicorr", "lilicorr_viterbi"))
        lines.append(f"| {s} | {fmt(g)} | {fmt(v)} | {'--' if not (g and v) else f'{100 * (v / g - 1):+.2f} %'} |")
    ablations = [v for v in ("no_dist", "margin") if any(v in taus[s] for s in sets)]
    if ablations:
        lines += [
            "",
            "### Loss ablation (T = 0)",
            "",
            "| objective | " + " | ".join(sets) + " |",
            "|---|" + "---|" * len(sets),
        ]
        for v in ("lilicorr", *ablations):
            lines.append(
                f"| {VARIANT_LABELS[v]} | " + " | ".join(fmt(taus[s].get(v, {}).get("tau_t0")) for s in sets) + " |"
            )
    if any("lilicorr_w1024" in taus[s] for s in sets):
        lines += ["", "### Head width (T = 0, same data and steps)", "", "| head | " + " | ".join(sets) + " |"]
        lines.append("|---|" + "---|" * len(sets))
        for v in ("lilicorr", "lilicorr_w1024", "lilicorr_w1024_argmax"):
            label = VARIANT_LABELS.get(v, "the paper's head's checkpoint, argmax block")
            lines.append(f"| {label} | " + " | ".join(fmt(taus[s].get(v, {}).get("tau_t0")) for s in sets) + " |")
    return lines


def speed_table(speed: dict) -> list[str]:
    if not speed:
        return []
    lines = [
        "### Served throughput (greedy, paired rotated rounds, no instrumentation; 95 % t intervals over rounds)",
        "",
    ]
    for setting, summary in speed.items():
        lines += [serve_speed.table(summary, setting), ""]
    return lines


def optional_pyplot():
    """matplotlib's pyplot (Agg), or None where matplotlib is not installed: the plots are optional."""
    try:
        return pyplot()
    except ImportError:
        return None


def lineage(
    earlier: list[dict[str, list[dict]]], metrics: dict[str, list[dict]]
) -> tuple[dict[str, list[dict]], list[int]]:
    """Warm-started runs as one curve: each run's metrics (earlier runs first, then `metrics`) with its steps
    shifted past the previous run's last step. Returns the joined rows per variant and the steps where a run
    began (after the first)."""
    joined: dict[str, list[dict]] = {}
    starts: list[int] = []
    for run in [*earlier, metrics]:
        offset = max((rows[-1]["step"] for rows in joined.values() if rows), default=0)
        if offset and any(run.values()):
            starts.append(offset)
        for v, rows in run.items():
            joined.setdefault(v, []).extend({**r, "step": r["step"] + offset} for r in rows)
    return joined, starts


def curves(metrics: dict[str, list[dict]], path: Path, run_starts: list[int] = ()) -> Path | None:
    """Left: tokens per block against steps, on each logging step's training batch (teacher-forced,
    random anchors; lines) and on the held-out outputs (exact replay; markers). Then per variant the
    drafter's per-slot top-1 against steps: held-out where evaluated, else on the training batches.
    run_starts: steps where a warm-started run began on new data (its own held-out split): dotted lines."""
    plt = optional_pyplot()
    if plt is None:
        return None
    runs = {v: rows for v, rows in metrics.items() if rows}
    if not runs:
        return None
    fig, axes = plt.subplots(1, 1 + len(runs), figsize=(5.5 * (1 + len(runs)), 4.2))
    colors = plt.get_cmap("tab10")
    for i, (v, rows) in enumerate(runs.items()):
        for key, held, style in (
            ("accept_len/lilicorr_walk", "eval/tau_t0/lilicorr", "-"),
            ("accept_len/draft_argmax", "eval/tau_t0/argmax", "--"),
        ):
            train = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if train:
                axes[0].plot(
                    *zip(*train),
                    style,
                    color=colors(2 * i + (style == "--")),
                    label=f"{v}: {key.rsplit('/', 1)[1]} (training batch)",
                )
            evals = [(r["step"], r[held]) for r in rows if r.get(held) is not None]
            if evals:
                axes[0].plot(
                    *zip(*evals),
                    "o",
                    color=colors(2 * i + (style == "--")),
                    label=f"{v}: {held.rsplit('/', 1)[1]} (held-out tau)",
                )
    axes[0].set(xlabel="training step", ylabel="tokens per block (T = 0)", title="acceptance against training steps")
    axes[0].legend(fontsize=7)
    cmap = plt.get_cmap("viridis")
    for ax, (v, rows) in zip(axes[1:], runs.items()):
        prefix = "eval/top1_draft" if sum("eval/top1_draft/slot1" in r for r in rows) > 2 else "top1_draft"
        for s in range(1, 16):
            points = [(r["step"], r[f"{prefix}/slot{s}"]) for r in rows if r.get(f"{prefix}/slot{s}") is not None]
            if points:
                ax.plot(*zip(*points), color=cmap((s - 1) / 14), label=f"slot {s}" if s in (1, 5, 10, 15) else None)
        where = "held-out" if prefix.startswith("eval") else "training batch"
        ax.set(
            xlabel="training step",
            ylabel=f"drafter top-1 ({where})",
            title=f"{v}: per-slot top-1, slot 1 (top) .. 15",
            ylim=(0, 1),
        )
        ax.legend(fontsize=7)
    for ax in axes:
        for step in run_starts:
            ax.axvline(step, color="grey", linestyle=":", linewidth=1)
    return save(fig, path)


def labelled(fig, ax, path: Path, legend_size: int, **labels) -> Path:
    """The axis labelled (xlabel, ylabel, title), its legend drawn, the figure saved to `path`."""
    ax.set(**labels)
    ax.legend(fontsize=legend_size)
    return save(fig, path)


HELD_OUT_TAU = (("walk", "eval/tau_t0/lilicorr"), ("argmax", "eval/tau_t0/argmax"))


def tau_against_tokens(metrics: dict[str, list[dict]], tokens_per_step: float) -> dict[str, list[dict]]:
    """{variant: [{"step", "tokens", "walk", "argmax"}, ...]}: each evaluation's held-out T = 0 tau (the LiLiCorr
    walk where the variant has the head, the drafter's argmax block) at the training tokens so far (steps x the
    plan's mean tokens per step: every variant trains on the same batches, so a step is the same tokens for all)."""
    return {
        v: [
            {
                "step": r["step"],
                "tokens": round(r["step"] * tokens_per_step),
                **{k: r.get(key) for k, key in HELD_OUT_TAU},
            }
            for r in rows
            if any(r.get(key) is not None for _, key in HELD_OUT_TAU)
        ]
        for v, rows in metrics.items()
        if rows
    }


def token_curves(points: dict[str, list[dict]], path: Path) -> Path | None:
    """Held-out tau against training tokens, every variant on one axis (the walk solid, the argmax block dashed)."""
    plt = optional_pyplot()
    if plt is None or not any(points.values()):
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    colors = plt.get_cmap("tab10")
    for i, (v, rows) in enumerate(points.items()):
        for kind, style in (("walk", "o-"), ("argmax", "s--")):
            xy = [(r["tokens"] / 1e6, r[kind]) for r in rows if r.get(kind) is not None]
            if xy:
                ax.plot(*zip(*xy), style, color=colors(i), markersize=3, label=f"{v}: {kind}")
    return labelled(
        fig,
        ax,
        path,
        7,
        xlabel="training tokens (millions)",
        ylabel="held-out tau, T = 0 (exact replay)",
        title="learning curves: held-out tau against training tokens",
    )


def token_table(points: dict[str, list[dict]]) -> list[str]:
    """Held-out tau of every variant at each evaluated step (the walk, or the argmax block without a head)."""
    steps = sorted({r["step"] for rows in points.values() for r in rows})
    if not steps:
        return []
    by = {v: {r["step"]: r for r in rows} for v, rows in points.items()}
    tokens = {r["step"]: r["tokens"] for rows in points.values() for r in rows}
    lines = [
        "### Held-out tau (T = 0) against training tokens",
        "",
        "| step | tokens (M) | " + " | ".join(points) + " |",
        "|---|---|" + "---|" * len(points),
    ]
    for step in steps:
        cells = [by[v].get(step, {}) for v in points]
        taus = [fmt(c.get("walk") if c.get("walk") is not None else c.get("argmax")) for c in cells]
        lines.append(f"| {step} | {tokens[step] / 1e6:.2f} | " + " | ".join(taus) + " |")
    return lines


def tau_by_run(points: list[tuple[int, dict]], path: Path) -> Path | None:
    """Average T = 0 tau over the evaluation sets at the end of each run of a warm-started lineage, against the
    training steps so far (log scale): points [(steps, {system: tau})], oldest first."""
    plt = optional_pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for system, label in (("lilicorr", "LiLiCorr (greedy walk)"), ("dflash", "vanilla DFlash")):
        xy = [(steps, taus[system]) for steps, taus in points if taus.get(system)]
        if xy:
            ax.plot(*zip(*xy), "o-", label=label)
            for x, y in xy:
                ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(4, -12), fontsize=7)
    ax.set_xscale("log", base=2)
    return labelled(
        fig,
        ax,
        path,
        8,
        xlabel="training steps so far (log scale)",
        ylabel="tau, T = 0, average of the evaluation sets",
        title="evaluation-set tau at the end of each run",
    )


def write(args) -> int:
    root = Path(args.results or args.work)
    tau = load(root, "tau.json")
    tau_check = load(root, "tau_check/summary.json")
    variants = tuple(VARIANTS)
    metrics = {v: load(root, f"metrics_{v}.jsonl") or [] for v in variants}
    earlier = [{v: load(Path(d), f"metrics_{v}.jsonl") or [] for v in variants} for d in args.after or []]
    for d, run in zip(args.after or [], earlier):
        if not any(run.values()):
            raise SystemExit(
                f"tables --after {d}: no metrics_<variant>.jsonl there; name the result folders of the earlier runs."
            )
    history, run_starts = lineage(earlier, metrics)
    plan = load(root, "train_config.json") or {}
    by_tokens = tau_against_tokens(metrics, plan["tokens_per_step"]) if plan.get("tokens_per_step") else {}
    taus = tau_summary(tau["cells"]) if tau else {}
    speed = speed_results(root)
    results = {
        "sets": taus,
        "tok_s": {
            c: {s: e[s] for s in serve_speed.ALL_SYSTEMS if s in e} for c, e in speed.get("graphs32", {}).items()
        },
        "speed": speed,
        "server_tau_t0": {
            f"{c['system']}/{c['group']}": round(c["tau"], 4)
            for c in (tau_check or {}).get("cells", [])
            if c.get("tau")
        },
        "data": (load(root, "manifest.json") or {}).get("counts"),
        "sweep": {name: (load(root, f"{name}.json") or {}).get("choice") for name in ("depth", "batch")},
        "training": plan.get("options"),
        "learning_curves": {"tokens_per_step": plan.get("tokens_per_step"), "points": by_tokens} if by_tokens else None,
        "final_metrics": {
            v: {
                k: rows[-1].get(k)
                for k in (
                    "step",
                    "tokens_per_s",
                    "eval/tau_t0/lilicorr",
                    "eval/tau_t0/argmax",
                    "eval/top1_draft/slot1",
                    "time/target_ms",
                    "time/drafter_ms",
                    "time/head_ms",
                    "time/backward_ms",
                    "time/optimizer_ms",
                    "time/wall_ms",
                )
            }
            for v, rows in metrics.items()
            if rows
        },
        "provenance": {"replay_device": (tau or {}).get("device"), "outputs": (tau or {}).get("outputs")},
    }
    save_json(root / "results.json", results)
    lines = (
        (tau_tables(taus) + [""] if taus else []) + speed_table(speed) + (token_table(by_tokens) if by_tokens else [])
    )
    (root / "tables.md").write_text("\n".join(lines) + "\n")
    plot = curves(history, root / "curves.png", run_starts)
    plots = [plot, serve_speed.plot(speed, root / "speed.png") if speed else None]
    if by_tokens:
        plots.append(token_curves(by_tokens, root / "tau_by_tokens.png"))
    if args.after:
        ends = [*run_starts, max((rows[-1]["step"] for rows in history.values() if rows), default=0)]
        sets_by_run = [(load(Path(d), "results.json") or {}).get("sets", {}) for d in args.after] + [taus]
        averages = [{v: c.get("tau_t0") for v, c in (sets.get("average") or {}).items()} for sets in sets_by_run]
        plots.append(tau_by_run(list(zip(ends, averages)), root / "tau_by_run.png"))
    print("\n".join(lines))
    print(f"wrote {root / 'results.json'}, {root / 'tables.md'}" + "".join(f", {p}" for p in plots if p))
    return 0


def cmd_tables(args) -> int:
    return write(args)


def arguments(parser) -> None:
    parser.add_argument("--results", default=None, help="folder holding the fetched results (default: WORK)")
    parser.add_argument(
        "--after",
        nargs="+",
        metavar="DIR",
        help="result folders of the earlier runs these drafts were warm-started "
        "from, oldest first: the curves continue their steps",
    )


STEP = Step(
    "tables", "checkpoints/results.json fields, tables and curves from what the steps wrote", cmd_tables, arguments
)
