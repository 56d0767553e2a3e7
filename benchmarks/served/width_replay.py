"""`python -m benchmarks width-replay ROUNDS... --target DIR --draft DIR --out DIR`: the adaptive verify width on real
acceptance, on the CPU.

Every distinct reply of one served system (--system, default no speculation) in the served-speed rounds
(round*.jsonl[.gz]) is replayed with the draft (`Replayer.matches`: per anchor i, how many of the block's drafted
tokens match the reply), and a c = 1 server is simulated over the replies in order, --repeat times: a step of width w
at position i commits min(m_i, w - 1) + 1 tokens (width 1: a chain of CHAIN) and costs that width's served step time
(--costs, ms at batch 1: a policy log line's "seen" figures; --replay: its start-up replay). Every fixed width and the
adaptive policy (`sglang_lilicorr.serving.verify_width.WidthPolicy`) meet the same replies. Defaults: the H100 of
ff8712a (`results/adaptive/h100_ff8712a/eval/policy_lines.txt`). Traces are kept in --out (TRACES) as they come;
the simulated speeds are plotted (PLOT).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import save_json
from benchmarks.served.bf16_noise import distinct_replies
from sglang_lilicorr.serving.verify_width import CHAIN, WIDTHS, AcceptanceRecord, StepCosts, WidthPolicy

TRACES = "width_traces.jsonl"
PLOT = "width_replay.png"
COSTS = "1=12.8,2=4.93,4=4.83,8=4.86,16=4.65"  # ms a step at batch 1 as served (width 1: a chain of CHAIN forwards)
REPLAY = "1=6.71,2=1.12,4=1.15,8=1.34,16=1.77"  # ms of the step's graphs replayed at start-up


def ms_by_width(text: str) -> dict[int, float]:
    """ "1=12.8,2=4.9" -> {1: 0.0128, 2: 0.0049} (seconds)."""
    return {int(w): float(ms) * 1e-3 for w, ms in (part.split("=") for part in text.split(","))}


def simulate(traces: list[dict], costs: dict[int, float], replay: dict[int, float], repeat: int) -> dict:
    """Tokens per second of a c = 1 server at every fixed width of `costs` and adaptive over them, and the adaptive's
    steps by width, over `traces` ({"matched": [m_i], "tokens": L}) met `repeat` times."""
    widths = tuple(sorted(costs))

    def serve(choose) -> tuple[float, dict[int, int]]:
        policy = WidthPolicy(
            widths if choose is None else (choose,),
            StepCosts({(w, 1): replay[w] for w in widths}),
            AcceptanceRecord(max(WIDTHS) - 1),
            chain=CHAIN,
        )
        tokens = seconds = 0.0
        steps: dict[int, int] = {}
        for trace in traces * repeat:
            matched, length, i = trace["matched"], trace["tokens"], 0
            while i < length - 1:
                w = policy.width(1)
                accepted = CHAIN - 1 if w == 1 else min(matched[i], w - 1)
                policy.verified([accepted])
                policy.costs.observe(w, 1, costs[w])
                emitted = min(accepted + 1, length - 1 - i)
                tokens, seconds, i = tokens + emitted, seconds + costs[w], i + emitted
                steps[w] = steps.get(w, 0) + 1
        return tokens / seconds, steps

    fixed = {w: serve(w)[0] for w in widths}
    adaptive, steps = serve(None)
    best = max(fixed, key=fixed.get)
    total = sum(steps.values())
    return {
        "fixed": {str(w): round(v, 1) for w, v in fixed.items()},
        "adaptive": round(adaptive, 1),
        "best_fixed": best,
        "adaptive_vs_best": round(adaptive / fixed[best], 4),
        "steps": {str(w): round(n / total, 4) for w, n in sorted(steps.items())},
    }


def trace_replies(replayer, found: dict, path: Path) -> list[dict]:
    """Replays each reply of `found` (distinct_replies) not yet in `path`, appending its trace; -> every trace."""
    done = (
        {json.loads(line)["key"]: json.loads(line) for line in path.read_text().splitlines()} if path.exists() else {}
    )
    with open(path, "a") as out:
        for n, (key, reply) in enumerate(found.items()):
            if key in done:
                continue
            (by_draft,) = replayer.matches(reply["input_ids"], reply["output_ids"]).values()
            matched = list(by_draft.values())[
                -1
            ]  # the served draft: the head's walk (the drafter's argmax without one)
            done[key] = {"key": key, "prompt_id": reply["prompt_id"], "tokens": len(reply["output_ids"])}
            done[key]["matched"] = matched
            out.write(json.dumps(done[key]) + "\n")
            out.flush()
            print(f"width-replay: {n + 1}/{len(found)} {reply['prompt_id']}")
    return [done[k] for k in found]


def plot(summary: dict, path: Path) -> Path:
    """Simulated tokens/s of every fixed width and of the adaptive policy (its steps' width shares on the bar)."""
    from sglang_lilicorr.bench.plots import pyplot, save

    plt = pyplot()
    names = [f"width {w}" + (" (chain)" if w == "1" else "") for w in summary["fixed"]] + ["adaptive"]
    speeds = list(summary["fixed"].values()) + [summary["adaptive"]]
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    ax.bar(names, speeds, color=["C0"] * len(summary["fixed"]) + ["C1"])
    shares = ", ".join(f"{w}: {share:.0%}" for w, share in summary["steps"].items() if share)
    ax.annotate(f"steps by width {shares}", (len(names) - 1, summary["adaptive"]), ha="right", va="bottom", fontsize=7)
    ax.set(ylabel="simulated tokens/s at c = 1")
    ax.set_title(
        f"{summary['replies']} replies replayed x {summary['repeat']}: adaptive {summary['adaptive_vs_best']:.3f}"
        " of the best fixed width",
        fontsize=9,
    )
    return save(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks width-replay", description=__doc__.split("\n\n")[0])
    p.add_argument("rounds", nargs="+", help="folders of served-speed round*.jsonl[.gz] (token ids recorded)")
    p.add_argument("--target", required=True, help="the target's HF folder")
    p.add_argument("--draft", required=True, help="the exported draft folder (lilicorr export)")
    p.add_argument("--out", required=True, help="folder for width_replay.json, .png and the traces")
    p.add_argument("--system", default="base", help="whose replies to replay (default: no speculation's)")
    p.add_argument("--costs", default=COSTS, help=f"served ms a step by width at batch 1 (default {COSTS})")
    p.add_argument("--replay", default=REPLAY, help=f"start-up replay ms by width (default {REPLAY})")
    p.add_argument("--repeat", type=int, default=4, help="times the server meets the replies (default 4)")
    a = p.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from sglang_lilicorr.frozen_target import FrozenTarget
    from sglang_lilicorr.reference.propose import BlockProposer
    from sglang_lilicorr.reference.replay import Replayer
    from sglang_lilicorr.train.heads import load_exported_draft

    found = {k: r for k, r in distinct_replies(a.rounds).items() if a.system in r["systems"]}
    if not found:
        print(f"width-replay: no reply of {a.system!r} with token ids under {', '.join(a.rounds)}")
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    drafter, head = load_exported_draft(a.draft)
    model = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32).eval()
    target = FrozenTarget(model, drafter.config.target_layer_ids)
    proposer = BlockProposer(target, drafter, None if head is None else head.eval(), ("greedy",))
    traces = trace_replies(Replayer(target, {"draft": proposer}), found, out / TRACES)
    costs, replay = ms_by_width(a.costs), ms_by_width(a.replay)
    summary = {"replies": len(traces), "tokens": sum(t["tokens"] for t in traces), "repeat": a.repeat}
    summary.update(costs_ms=a.costs, replay_ms=a.replay, **simulate(traces, costs, replay, a.repeat))
    save_json(out / "width_replay.json", summary)
    plot(summary, out / PLOT)
    print(json.dumps(summary, indent=1))
    return 0
