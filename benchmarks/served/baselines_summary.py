"""The equal-budget comparison's `benchmarks/results/baselines/summary.json` (docs/BASELINES.md). The cost keys, from
the scale report and corrector_bench:

  cost_8b                {system: {c: per_block_ms}}   the graph-captured per-block wall at Qwen3-8B shapes
  head_ms_8b             {system: ms}                  the served head at c = 1 (proposal micro-benchmark; DFLASH 0;
                                                       Domino's and DSpark's from corrector_bench's bs = 1 row
                                                       where the correctors phase has not timed them)
  viterbi.per_block_ms_8b  ms                          LILICORR's block at c = 1 with the Viterbi walk: its greedy
                                                       block + (corrector_bench's lilicorr_viterbi - lilicorr_greedy)

systems dflash, lilicorr, domino, dspark, builtin. The equal-budget keys, from the testbed's `replay` and `compare`
steps (the four drafts of variants.EQUAL_BUDGET, checked to have run the same plan to its last step):

  tau                    {set: {system: {"t0", "t1"}}}  exact replay of the target's outputs; T = 1: mean over seeds
  tok_s                  {c: {system: tok/s}}          served, greedy, mean over the paired rounds
  viterbi.tau_t0         tau                           the LiLiCorr draft's exact Viterbi path by replay, T = 0,
                                                       the sets' average

  plan                   {"steps", "global_batch", "data"}  the four drafts' optimizer steps, global batch and
                                                       training data (train.jsonl's sha256, as `export` recorded it)

systems dflash, lilicorr, domino, dspark. `merge` writes either group into an existing summary without touching its
other keys; a key with no measurement is left out, not nulled. `python -m benchmarks baselines-summary
--replay TAU_JSON --rounds REPORT_SUMMARY --budget BUDGET_JSON --summary SUMMARY_JSON` merges the equal-budget keys
(the cost keys come through scale_report --baselines-summary). With `--budget-x N` (N > 1: the drafts of `eq-train`
with EQ_BUDGET=N, N times the one-GPU budget's steps on the same data) the same keys go under `equal_budget_xN`
instead, and where the summary holds both budgets:

  ranking_x1_xN          {"steps": {"x1", "xN"}, "same_data", "same_order",
                          "measures": {measure: {"x1": [systems, best first], "xN": [...], "same"}}}

(measures: `tau SET T=0|1` and `tok/s c=C`; the steps must be N times the x1 ones). Every run rewrites the markdown
table beside the summary (summary.md): each budget's figures, then the ranking comparison.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Mapping, Optional

from sglang_lilicorr.errors import UsageError
from benchmarks import save_json

COST_SYSTEMS = ("dflash", "lilicorr", "domino", "dspark", "builtin")
EQUAL_SYSTEMS = ("dflash", "lilicorr", "domino", "dspark")
BENCH_HEADS = ("domino", "dspark")  # corrector_bench's <system>_head: SGLang's Domino rollout, DSpark's Markov head
SAME_PLAN = (
    "step",
    "init",
    "global_batch",
    "train_config",
    "data_sha256",
)  # what the four drafts' testbed.json must share


def read_json(path: Path, flag: str, fix: str) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{flag} {path}: {e}", fix=fix) from e
    if not isinstance(doc, dict):
        raise UsageError(f"{flag} {path} holds a {type(doc).__name__}, not a JSON object", fix=fix)
    return doc


def read_bench(path: Path) -> dict:
    """corrector_bench's JSON -> its bs = 1 row, which must time both walks."""
    doc = read_json(path, "--corrector-bench", "pass the JSON corrector_bench --out wrote")
    row = next((r for r in doc.get("rows", []) if r.get("bs") == 1), None)
    if row is None or row.get("lilicorr_greedy") is None or row.get("lilicorr_viterbi") is None:
        raise UsageError(
            f"--corrector-bench {path}: no bs = 1 row with lilicorr_greedy and lilicorr_viterbi",
            fix="run corrector_bench with --bs 1 (its default list has it) and read its errors",
        )
    return row


def cost_keys(doc: Mapping[str, Any], bench: Optional[Mapping[str, Any]] = None) -> dict:
    """The scale report's summary (scale_report.summarize) [+ corrector_bench's bs = 1 row] -> the cost keys."""
    systems = doc["systems"]
    cost = {
        s: {c: e["per_block_ms"] for c, e in systems[s].items() if e["per_block_ms"] is not None} for s in COST_SYSTEMS
    }
    heads = {s: systems[s].get("1", {}).get("head_ms") for s in COST_SYSTEMS}
    for s in BENCH_HEADS:  # where no served phase timed them: SGLang's modules in corrector_bench's graph replay
        if heads[s] is None and bench is not None and bench.get(f"{s}_head") is not None:
            heads[s] = bench[f"{s}_head"]
    keys: dict = {
        "cost_8b": {s: v for s, v in cost.items() if v},
        "head_ms_8b": {s: v for s, v in heads.items() if v is not None},
    }
    greedy_block = systems["lilicorr"].get("1", {}).get("per_block_ms")
    if bench is not None and greedy_block is not None:
        keys["viterbi"] = {"per_block_ms_8b": greedy_block + bench["lilicorr_viterbi"] - bench["lilicorr_greedy"]}
    return keys


def merge(path: Path, keys: Mapping[str, Any], flag: str = "--baselines-summary") -> Path:
    """Writes `keys` into the summary at path (created if absent): top-level keys replaced, `viterbi` updated key by
    key; every other key of the file kept. `flag` names the path in an error."""
    path = Path(path)
    current = (
        read_json(path, flag, "point it at the baselines' summary.json, or move the file") if path.exists() else {}
    )
    for key, value in keys.items():
        if key == "viterbi":
            current["viterbi"] = {**(current.get("viterbi") or {}), **value}
        else:
            current[key] = value
    return save_json(path, current)


def check_budget(budget: Mapping[str, Any]) -> None:
    """The compare step's budget.json ({system: the draft's testbed.json}): every system of EQUAL_SYSTEMS ran the same
    plan (steps, start, global batch, settings) to its last step."""
    fix = "train the four from one draft in one `train` call (testbed_calls.sh eq-train) and export them together"
    missing = [s for s in EQUAL_SYSTEMS if not budget.get(s)]
    if missing:
        raise UsageError(f"--budget: no testbed.json of {missing}", fix=fix)
    for key in SAME_PLAN:
        values = {s: budget[s].get(key) for s in EQUAL_SYSTEMS}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            raise UsageError(f"--budget: the drafts' {key} differ ({values})", fix=fix)
    cut = [s for s in EQUAL_SYSTEMS if budget[s]["step"] != budget[s]["train_config"].get("max_steps")]
    if cut:
        raise UsageError(
            f"--budget: {cut} stopped at step {budget[cut[0]]['step']} of "
            f"{budget[cut[0]]['train_config'].get('max_steps')}",
            fix="give `train` a --max-minutes none of the runs reaches (the wall-time cap cuts the schedule)",
        )


def tau_keys(replay: Mapping[str, Any]) -> dict:
    """The replay's tau.json (its cells) -> `tau` and `viterbi.tau_t0`."""
    cells = replay.get("cells") or []
    found = {c["system"] for c in cells}
    missing = [s for s in (*EQUAL_SYSTEMS, "lilicorr_viterbi") if s not in found]
    if missing:
        raise UsageError(
            f"--replay: no tau of {missing}",
            fix="replay the four exported drafts: "
            "`python -m benchmarks testbed replay --drafts dflash lilicorr domino dspark`",
        )
    tau: dict = {}
    for c in cells:
        if c["system"] in EQUAL_SYSTEMS:
            key = "t0" if c["temperature"] == 0 else "t1"
            tau.setdefault(c["set"], {}).setdefault(c["system"], {})[key] = round(c["tau"], 4)
    viterbi = next(
        c for c in cells if c["system"] == "lilicorr_viterbi" and c["set"] == "average" and c["temperature"] == 0
    )
    return {"tau": tau, "viterbi": {"tau_t0": round(viterbi["tau"], 4)}}


def tok_s_keys(report: Mapping[str, Any]) -> dict:
    """`bench report`'s summary.json of the compare step's rounds -> `tok_s`: every c where all four were served."""
    per_c: dict = {}
    for c in report.get("cells") or []:
        if c.get("system") in EQUAL_SYSTEMS and c.get("group") == "all" and c.get("temperature") == 0:
            per_c.setdefault(str(c["concurrency"]), {})[c["system"]] = round(c["tps"], 1)
    tok_s = {c: {s: e[s] for s in EQUAL_SYSTEMS} for c, e in per_c.items() if set(EQUAL_SYSTEMS) <= set(e)}
    if not tok_s:
        raise UsageError(
            f"--rounds: no concurrency where all of {list(EQUAL_SYSTEMS)} were served greedily",
            fix="pass WORK/compare/report/summary.json after `python -m benchmarks testbed compare` played its rounds",
        )
    return {"tok_s": dict(sorted(tok_s.items(), key=lambda kv: int(kv[0])))}


def plan_keys(budget: Mapping[str, Any]) -> dict:
    """check_budget's drafts (one plan) -> `plan`: the steps, global batch and training data they share."""
    first = budget[EQUAL_SYSTEMS[0]]
    return {"plan": {"steps": first["step"], "global_batch": first["global_batch"], "data": first.get("data_sha256")}}


def group_key(x: int) -> Optional[str]:
    """Where a budget's keys go: the top level at x1 (the one-GPU budget), `equal_budget_xN` above it."""
    return None if x == 1 else f"equal_budget_x{x}"


def groups(doc: Mapping[str, Any]) -> dict[int, dict]:
    """{x: that budget's equal-budget keys} of the summary, the budgets it holds."""
    found = {1: doc} if doc.get("tau") else {}
    for key, value in doc.items():
        m = re.fullmatch(r"equal_budget_x(\d+)", key)
        if m:
            found[int(m.group(1))] = value
    return dict(sorted(found.items()))


def measures(keys: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """A budget's figures as {measure: {system: value}}, higher is better: tau per set and T, tokens/s per c."""
    out = {
        f"tau {name} T={t[1]}": {s: e[s][t] for s in EQUAL_SYSTEMS}
        for name, e in keys["tau"].items()
        for t in ("t0", "t1")
        if all(t in e.get(s, {}) for s in EQUAL_SYSTEMS)
    }
    return out | {f"tok/s c={c}": {s: e[s] for s in EQUAL_SYSTEMS} for c, e in (keys.get("tok_s") or {}).items()}


def ranking(values: Mapping[str, float]) -> list[str]:
    """The systems best first (a tie keeps EQUAL_SYSTEMS' order)."""
    return sorted(EQUAL_SYSTEMS, key=lambda s: -values[s])


def compare_rankings(one: Mapping[str, Any], other: Mapping[str, Any], x: int) -> dict:
    """The x1 and xN budgets' keys -> `ranking_x1_xN`: per measure both hold, the four best first at each budget
    and whether the order is the same; refused where the xN drafts did not train N times the x1 drafts' steps."""
    steps = {"x1": (one.get("plan") or {}).get("steps"), f"x{x}": (other.get("plan") or {}).get("steps")}
    if None not in steps.values() and steps[f"x{x}"] != x * steps["x1"]:
        raise UsageError(
            f"--budget-x {x}: the drafts trained {steps[f'x{x}']} steps, the x1 drafts {steps['x1']}: not {x} times",
            fix=f"train the x{x} drafts with eq-train's EQ_STEPS as at x1 and EQ_BUDGET={x}, or pass the --budget-x "
            "their steps are",
        )
    a, b = measures(one), measures(other)
    rows = {m: {"x1": ranking(a[m]), f"x{x}": ranking(b[m])} for m in a if m in b}
    for row in rows.values():
        row["same"] = row["x1"] == row[f"x{x}"]
    data = {(g.get("plan") or {}).get("data") for g in (one, other)}
    return {
        "steps": steps,
        "same_data": None if None in data else len(data) == 1,
        "same_order": all(r["same"] for r in rows.values()),
        "measures": rows,
    }


def markdown(doc: Mapping[str, Any]) -> str:
    """summary.md: every budget's figures (a row per measure and budget), then each ranking comparison."""
    lines = [
        "# Equal-budget comparison (docs/BASELINES.md; benchmarks/served/baselines_summary.py)",
        "",
        f"| measure | budget | {' | '.join(EQUAL_SYSTEMS)} | best first |",
        "|---|---|" + "---|" * (len(EQUAL_SYSTEMS) + 1),
    ]
    found = {x: measures(keys) for x, keys in groups(doc).items()}
    for m in dict.fromkeys(m for figures in found.values() for m in figures):
        for x, figures in found.items():
            if m in figures:
                steps = (groups(doc)[x].get("plan") or {}).get("steps")
                cells = " | ".join(f"{figures[m][s]:g}" for s in EQUAL_SYSTEMS)
                lines.append(f"| {m} | x{x} ({steps} steps) | {cells} | {' > '.join(ranking(figures[m]))} |")
    for key, cmp in doc.items():
        if re.fullmatch(r"ranking_x1_x\d+", key):
            x = key.rpartition("_")[2]
            lines += [
                "",
                f"## Ranking at x1 and {x} (same data: {cmp['same_data']}; same order on every measure: "
                f"{cmp['same_order']})",
                "",
                f"| measure | x1, best first | {x}, best first | same order |",
                "|---|---|---|---|",
            ]
            lines += [
                f"| {m} | {' > '.join(r['x1'])} | {' > '.join(r[x])} | {'yes' if r['same'] else 'no'} |"
                for m, r in cmp["measures"].items()
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Merge the equal-budget keys into the baselines' summary (module docstring)."
    )
    p.add_argument("--replay", type=Path, required=True, help="the testbed replay step's tau.json")
    p.add_argument("--rounds", type=Path, required=True, help="the compare step's report/summary.json")
    p.add_argument("--budget", type=Path, required=True, help="the compare step's budget.json")
    p.add_argument("--summary", type=Path, required=True, help="the summary.json to merge into (other keys kept)")
    p.add_argument(
        "--budget-x",
        type=int,
        default=1,
        help="the drafts' budget in one-GPU budgets (eq-train's EQ_BUDGET; default 1: the top-level keys; N > 1: "
        "under equal_budget_xN, and the ranking at x1 and xN compared where the summary holds both)",
    )
    args = p.parse_args(argv)
    try:
        if args.budget_x < 1:
            raise UsageError(f"--budget-x {args.budget_x}", fix="pass 1 or more (eq-train's EQ_BUDGET)")
        budget = read_json(args.budget, "--budget", "pass WORK/compare/budget.json")
        check_budget(budget)
        keys = tau_keys(read_json(args.replay, "--replay", "pass WORK/replay/tau.json")) | plan_keys(budget)
        keys |= tok_s_keys(read_json(args.rounds, "--rounds", "pass WORK/compare/report/summary.json"))
        group = group_key(args.budget_x)
        new = {group: keys} if group else keys
        current = (
            read_json(args.summary, "--summary", "point it at the baselines' summary.json")
            if args.summary.exists()
            else {}
        )
        found = groups({**current, **new})
        rankings = {
            f"ranking_x1_x{x}": compare_rankings(found[1], g, x) for x, g in found.items() if x > 1 and 1 in found
        }
        path = merge(args.summary, new | rankings, "--summary")
        path.with_suffix(".md").write_text(markdown(json.loads(path.read_text())))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    where = f"{args.summary} ({group or 'top level'})"
    print(f"-> {where}: tau ({len(keys['tau'])} sets), tok_s (c = {', '.join(keys['tok_s'])}), viterbi.tau_t0, plan")
    for key, cmp in rankings.items():
        print(f"-> {key}: same order on every measure: {cmp['same_order']}, same data: {cmp['same_data']}")
    print(f"-> {path.with_suffix('.md')}")
    return 0
