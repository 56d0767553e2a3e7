"""The cost keys of issue 42's `benchmarks/results/baselines/summary.json`, from the scale report and corrector_bench:

  cost_8b                {system: {c: per_block_ms}}   the graph-captured per-block wall at Qwen3-8B shapes
  head_ms_8b             {system: ms}                  the served head at c = 1 (proposal micro-benchmark; DFLASH 0)
  viterbi.per_block_ms_8b  ms                          LILICORR's block at c = 1 with the Viterbi walk: its greedy
                                                       block + (corrector_bench's lilicorr_viterbi - lilicorr_greedy)

systems dflash, lilicorr, domino, dspark, builtin. `merge` writes them into an existing summary without touching its
other keys (`tau`, `tok_s`, `viterbi.tau_t0`: other work's); a key with no measurement is left out, not nulled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional

from ..errors import UsageError
from ..jsonl import save_json

COST_SYSTEMS = ("dflash", "lilicorr", "domino", "dspark", "builtin")


def read_bench(path: Path) -> dict:
    """corrector_bench's JSON -> its bs = 1 row, which must time both walks."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--corrector-bench {path}: {e}", fix="pass the JSON corrector_bench --out wrote") from e
    row = next((r for r in doc.get("rows", []) if r.get("bs") == 1), None) if isinstance(doc, dict) else None
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
    keys: dict = {
        "cost_8b": {s: v for s, v in cost.items() if v},
        "head_ms_8b": {s: v for s, v in heads.items() if v is not None},
    }
    greedy_block = systems["lilicorr"].get("1", {}).get("per_block_ms")
    if bench is not None and greedy_block is not None:
        keys["viterbi"] = {"per_block_ms_8b": greedy_block + bench["lilicorr_viterbi"] - bench["lilicorr_greedy"]}
    return keys


def merge(path: Path, keys: Mapping[str, Any]) -> Path:
    """Writes `keys` into the summary at path (created if absent): top-level keys replaced, `viterbi` updated key by
    key; every other key of the file kept."""
    path = Path(path)
    current: dict = {}
    if path.exists():
        try:
            current = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise UsageError(f"--baselines-summary {path}: {e}", fix="repair or move the file, then re-run") from e
        if not isinstance(current, dict):
            raise UsageError(
                f"--baselines-summary {path} holds a {type(current).__name__}, not a JSON object",
                fix="point it at issue 42's summary.json",
            )
    for key, value in keys.items():
        if key == "viterbi":
            current["viterbi"] = {**(current.get("viterbi") or {}), **value}
        else:
            current[key] = value
    return save_json(path, current)
