"""Per-block stage decomposition (paper Table cost): result schema, markdown table, stacked-bar plot.

Schema (JSON), milliseconds per verification block:
{
  "benchmark": "mt_bench", "device": "H100",
  "systems": [
    {"system": "lilicorr", "variant": "optimized", "n_blocks": 5120,
     "stages": {"target_verify": 7.51, "draft_backbone": 1.29, "lm_head": 0.50, "spec_head": 0.28, "accept": 0.57},
     "per_block_wall": 10.15}          # optional; defaults to the sum of the stages
  ]
}
"""

from __future__ import annotations

import json
from pathlib import Path

from .plots import pyplot

STAGES = {
    "target_verify": "Target verify",
    "draft_backbone": "Draft backbone",
    "lm_head": "LM-head projection",
    "spec_head": "Speculative head",
    "accept": "Accept and residual",
}


class StageSchemaError(ValueError):
    """A stage-decomposition file does not follow the schema in this module's docstring."""


def validate(doc: dict) -> dict:
    """Checks a stage-decomposition document and fills per_block_wall where absent; returns it."""
    systems = doc.get("systems") if isinstance(doc, dict) else None
    if not isinstance(systems, list) or not systems:
        raise StageSchemaError("stage results need a non-empty `systems` list (see sglang_lilicorr.benchmarks.stages).")
    for i, s in enumerate(systems):
        name = s.get("system")
        if not name:
            raise StageSchemaError(f"systems[{i}] has no `system` name.")
        stages = s.get("stages")
        if not isinstance(stages, dict) or set(stages) != set(STAGES):
            got = sorted(stages) if isinstance(stages, dict) else stages
            raise StageSchemaError(f"systems[{i}] ({name}): `stages` must have exactly the keys {list(STAGES)}, got {got}.")
        for k, v in stages.items():
            if not isinstance(v, (int, float)) or v < 0:
                raise StageSchemaError(f"systems[{i}] ({name}): stage {k} must be a non-negative number of ms, got {v!r}.")
        s.setdefault("variant", "")
        s.setdefault("per_block_wall", sum(stages.values()))
    return doc


def load(path: Path) -> dict:
    with Path(path).open(encoding="utf-8") as f:
        return validate(json.load(f))


def _column(s: dict) -> str:
    return f"{s['system']} ({s['variant']})" if s["variant"] else s["system"]


def table(doc: dict) -> str:
    """Stages x systems markdown table, ms per block, lowest speculative-head cost in bold."""
    systems = validate(doc)["systems"]
    lowest_head = min(s["stages"]["spec_head"] for s in systems)
    lines = ["| Stage (ms / block) | " + " | ".join(_column(s) for s in systems) + " |", "|---|" + "---|" * len(systems)]
    for key, label in STAGES.items():
        vals = [f"{s['stages'][key]:.2f}" for s in systems]
        if key == "spec_head" and len(systems) > 1:
            vals = [f"**{v}**" if s["stages"][key] == lowest_head else v for v, s in zip(vals, systems)]
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    lines.append("| Per-block wall | " + " | ".join(f"{s['per_block_wall']:.2f}" for s in systems) + " |")
    return "\n".join(lines) + "\n"


def plot(doc: dict, out_path: Path) -> Path:
    """Stacked horizontal bars, one per system, one segment per stage."""
    plt = pyplot()
    systems = validate(doc)["systems"]
    fig, ax = plt.subplots(figsize=(7.0, 0.6 * len(systems) + 1.4))
    left = [0.0] * len(systems)
    labels = [_column(s) for s in systems]
    for key, label in STAGES.items():
        widths = [s["stages"][key] for s in systems]
        ax.barh(labels, widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("ms per verification block")
    ax.invert_yaxis()
    ax.legend(fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path

