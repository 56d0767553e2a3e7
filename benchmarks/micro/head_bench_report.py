"""head_bench's results read back: the table and the target verdicts it prints, the checks that fail it, and its
figure (`python -m benchmarks head-bench --plot`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from sglang_lilicorr.bench.plots import pyplot, save

TARGET_BS1_MS = {"H100": 0.10, "H200": 0.08}  # post_logits at bs=1
TARGET_RATIO = 0.6  # post_logits, ours / built-in, every bs
TARGET_TOPK_VS_BUILTIN, TARGET_TOPK_VS_TORCH = 1.2, 3.0  # speed-ups


def log(*a):
    print(*a, flush=True)


def fmt(x):
    return "n/a" if x is None else f"{x:.3f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def report(res) -> list[str]:
    """Print the table and the target verdicts; return the failed targets."""
    rows, meta = res["rows"], res["meta"]
    keys = {k for r in rows for k in r if k != "bs"}
    names = [n for n in ("topk_lse_ours", "topk_lse_builtin", "topk_lse_torch") if n in keys]
    for stage in ("head_walk", "post_logits", "select"):
        names += sorted(k for k in keys if k.startswith(stage + "_") and not k.endswith("_builtin"))
        names += [f"{stage}_builtin"] if f"{stage}_builtin" in keys else []
    log(
        f"\nhead_bench on {meta['gpu']} ({meta['date']}, commit {meta['git_commit']}): "
        "ms per block, CUDA-graph replay, median"
    )
    log("| bs | " + " | ".join(names) + " |")
    log("|---" * (len(names) + 1) + "|")
    for r in rows:
        log(f"| {r['bs']} | " + " | ".join(fmt(r.get(n)) for n in names) + " |")

    stage_names = [
        k for k in ("lm_head", "topk_lse", "projections", "nodes", "lattice", "factors") if f"stage_{k}" in keys
    ]
    if stage_names:
        log("\nper-stage split, fused variant (each stage captured alone; ms) and the sum vs select_fused:")
        log(
            "| bs | "
            + " | ".join(stage_names)
            + " | sum | select_fused | floor_dense_chain | floor_dense_chain_pdl | floor_launches |"
        )
        log("|---" * (len(stage_names) + 5) + "|")
        for r in rows:
            parts = [r.get(f"stage_{k}") for k in stage_names]
            total = sum(parts) if all(p is not None for p in parts) else None
            log(
                f"| {r['bs']} | "
                + " | ".join(fmt(p) for p in parts)
                + f" | {fmt(total)} | {fmt(r.get('select_fused'))} | {fmt(r.get('floor_dense_chain'))}"
                + f" | {fmt(r.get('floor_dense_chain_pdl'))} | {fmt(r.get('floor_launches'))} |"
            )
    for r in rows:
        sweep = {k[len("topk_splits_") :]: v for k, v in r.items() if k.startswith("topk_splits_")}
        if sweep:
            log(f"top-K splits per row, bs={r['bs']}: " + ", ".join(f"{k} {fmt(v)}" for k, v in sweep.items()))
    for bs_key, counts in res.get("launches", {}).items():
        if counts:
            log(f"kernel launches per call, {bs_key}: " + ", ".join(f"{k} {v:g}" for k, v in counts.items()))
    for key, table in res.get("kernels", {}).items():
        log(f"\nkernels by GPU time, {key} (launches per call, us per call):")
        for name, n, us in table[:14]:
            log(f"  {us:8.1f} us  x{n:g}  {name}")

    variants = sorted({k[len("post_logits_") :] for r in rows for k in r if k.startswith("post_logits_")} - {"builtin"})
    failed = []
    card = next((c for c in TARGET_BS1_MS if c in meta["gpu"]), None)
    if meta.get("geometry", "paper") != "paper":
        log(
            f"\ngeometry {meta.get('geometry')}: the targets are set at the paper geometry; "
            "ratios below are information"
        )
    log("\nratios (ours / built-in; < 1 is faster) and targets:")
    for r in rows:
        bs = r["bs"]
        t_up, t_torch, t_ours = r.get("topk_lse_builtin"), r.get("topk_lse_torch"), r.get("topk_lse_ours")
        sp_b, sp_t = ratio(t_up, t_ours), ratio(t_torch, t_ours)
        line = [
            f"bs={bs}: topk_lse speed-up vs built-in {fmt(sp_b)}x (target {TARGET_TOPK_VS_BUILTIN}), "
            f"vs torch {fmt(sp_t)}x (target {TARGET_TOPK_VS_TORCH})"
        ]
        if sp_b is not None and sp_b < TARGET_TOPK_VS_BUILTIN:
            failed.append(f"bs{bs}_topk_vs_builtin")
        if sp_t is not None and sp_t < TARGET_TOPK_VS_TORCH:
            failed.append(f"bs{bs}_topk_vs_torch")
        for v in variants:
            parts = []
            for stage in ("head_walk", "post_logits", "select"):
                q = ratio(r.get(f"{stage}_{v}"), r.get(f"{stage}_builtin"))
                parts.append(f"{stage} {fmt(q)}")
            line.append(f"  {v}: " + ", ".join(parts))
        best = min((r[f"post_logits_{v}"] for v in variants if r.get(f"post_logits_{v}") is not None), default=None)
        q = ratio(best, r.get("post_logits_builtin"))
        line.append(f"  best post_logits {fmt(best)} ms = {fmt(q)}x built-in (target <= {TARGET_RATIO})")
        if q is not None and q > TARGET_RATIO:
            failed.append(f"bs{bs}_post_logits_ratio")
        if bs == 1 and card and best is not None:
            line.append(
                f"  bs=1 target on {card}: <= {TARGET_BS1_MS[card]} ms -> "
                f"{'met' if best <= TARGET_BS1_MS[card] else 'MISSED'}"
            )
            if best > TARGET_BS1_MS[card]:
                failed.append("bs1_post_logits_ms")
        log("\n".join(line))
    return failed if meta.get("geometry", "paper") == "paper" else []


def failed_checks(checks) -> list[str]:
    bad = []
    for k, v in checks.items():
        if isinstance(v, bool) and not v:
            bad.append(k)
        if k.endswith("_logprob_max_err") and not v <= 1e-4:
            bad.append(k)
        if k.endswith("_score_max_err") and not v <= 0.25:
            bad.append(k)
    return bad


def plot(res: dict, out_path: Path, target_ratio: float, target_bs1_ms: Optional[float]) -> Path:
    """A head_bench result (its JSON) -> one figure: post-logits ms vs batch size for each of our variants
    and SGLang's built-in head, with the issue's bounds (target_ratio x the built-in, the bs-1 target),
    and top-K/LSE ms vs batch size (ours, the built-in kernel, torch)."""
    plt = pyplot()
    rows = sorted(res["rows"], key=lambda r: r["bs"])
    meta = res.get("meta", {})
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    bs = [r["bs"] for r in rows]
    variants = sorted({k[len("post_logits_") :] for r in rows for k in r if k.startswith("post_logits_")} - {"builtin"})
    for i, name in enumerate(["builtin"] + variants):
        pts = [(r["bs"], r[f"post_logits_{name}"]) for r in rows if r.get(f"post_logits_{name}") is not None]
        left.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker="o",
            color=f"C{i}",
            label=name,
            linestyle="--" if name == "builtin" else "-",
        )
    bound = [
        (r["bs"], target_ratio * r["post_logits_builtin"]) for r in rows if r.get("post_logits_builtin") is not None
    ]
    left.plot(
        [p[0] for p in bound], [p[1] for p in bound], color="gray", linestyle=":", label=f"{target_ratio:g} x built-in"
    )
    if target_bs1_ms is not None:
        left.scatter(
            [1], [target_bs1_ms], marker="*", s=120, color="black", zorder=5, label=f"bs-1 target {target_bs1_ms:g} ms"
        )
    left.set_ylabel("ms per block (top-K/LSE + head + walk)")
    left.set_title("post-logits select")
    for i, (key, label) in enumerate(
        (("topk_lse_ours", "ours"), ("topk_lse_builtin", "built-in kernel"), ("topk_lse_torch", "torch"))
    ):
        pts = [(r["bs"], r[key]) for r in rows if r.get(key) is not None]
        right.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=f"C{i}", label=label)
    right.set_yscale("log")
    right.set_ylabel("ms per block")
    right.set_title("top-K + logsumexp")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel("batch size (requests)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{meta.get('gpu', '?')}, {meta.get('geometry', '?')} head, commit {meta.get('git_commit', '?')}", fontsize=9
    )
    return save(fig, out_path)
