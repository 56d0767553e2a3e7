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

`from_timings` builds it from the JSON that a server writes with LILICORR_STAGE_TIMING=<dir>
(benchmarks/instrumentation/stage_timer.py), medians throughout:
  target_verify  = GPU ms of the target verify forward
  lm_head        = micro-benchmarked [bs*(B-1), Hm] x [Hm, V] GEMM (graph or eager, as the variant)
  spec_head      = micro-benchmarked speculative head on those logits (DFLASH argmax; LILICORR top-K/LSE + head + walk;
                   the built-in head, Domino, DSpark: their proposal from the drafter's states less lm_head)
  draft_backbone = GPU ms of the draft forward (+ eager proposal) - lm_head - spec_head, floored at 0
  accept         = per_block_wall - the four above, floored at 0 (accept, draft KV append, host gaps)
  per_block_wall = host interval between consecutive decode-step starts
Each system also keeps `forced_commit_len` (tokens every block committed under SGLang's
SGLANG_SIMULATE_ACC_LEN knob; null when blocks committed what verification accepted), which the table
notes. `plain_step_ms` reads the decode step of a server without speculation from the same files.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sglang_lilicorr import ownership
from sglang_lilicorr.bench.plots import pyplot, save
from sglang_lilicorr.cli_args import Parser, run
from sglang_lilicorr.errors import LiLiCorrError, UsageError

STAGES = {
    "target_verify": "Target verify",
    "draft_backbone": "Draft backbone",
    "lm_head": "LM-head projection",
    "spec_head": "Speculative head",
    "accept": "Accept and residual",
}


class StageSchemaError(LiLiCorrError, ValueError):
    """A stage-decomposition file does not follow the schema in this module's docstring."""


def validate(doc: dict) -> dict:
    """Checks a stage-decomposition document and fills per_block_wall where absent; returns it."""
    systems = doc.get("systems") if isinstance(doc, dict) else None
    if not isinstance(systems, list) or not systems:
        raise StageSchemaError("stage results need a non-empty `systems` list (see benchmarks.served.stages).")
    for i, s in enumerate(systems):
        name = s.get("system") if isinstance(s, dict) else None
        if not name:
            raise StageSchemaError(f"systems[{i}] has no `system` name.")
        stages = s.get("stages")
        if not isinstance(stages, dict) or set(stages) != set(STAGES):
            got = sorted(stages) if isinstance(stages, dict) else stages
            raise StageSchemaError(
                f"systems[{i}] ({name}): `stages` must have exactly the keys {list(STAGES)}, got {got}."
            )
        for k, v in stages.items():
            if not isinstance(v, (int, float)) or v < 0:
                raise StageSchemaError(
                    f"systems[{i}] ({name}): stage {k} must be a non-negative number of ms, got {v!r}."
                )
        s.setdefault("variant", "")
        s.setdefault("per_block_wall", sum(stages.values()))
    return doc


def load(path: Path) -> dict:
    try:
        doc = json.loads(Path(path).read_bytes().decode("utf-8"))
    except ValueError as e:  # not UTF-8, not JSON
        raise StageSchemaError(f"not valid JSON ({e})", where=str(path), fix="pass a stage-decomposition JSON") from e
    return validate(doc)


def timings_arg(text: str) -> tuple:
    """CLI `SYSTEM=DIR` -> (system, Path(DIR))."""
    system, sep, folder = text.partition("=")
    if not sep or not system or not folder:
        raise argparse.ArgumentTypeError(f"expected SYSTEM=DIR (e.g. lilicorr=runs/stages/lilicorr), got {text!r}")
    return system, Path(folder)


def load_timings(folder: Path) -> dict:
    """The stage-timing JSON of one server: of the stages-<pid>.json in folder, the one with the most decode steps."""
    files = sorted(Path(folder).glob("stages-*.json"))
    if not files:
        raise StageSchemaError(
            f"no stages-<pid>.json in {folder}: serve with LILICORR_STAGE_TIMING={folder} and send requests first."
        )
    docs = [json.loads(f.read_text(encoding="utf-8")) for f in files]
    return max(docs, key=lambda d: d.get("decode_steps", 0))


def _median(gpu_ms: dict, stage: str, where: str) -> float:
    value = (gpu_ms.get(stage) or {}).get("median")
    if value is None:
        raise StageSchemaError(
            f"no `{stage}` samples", where=where, fix="the server recorded no such stage at this batch size"
        )
    return float(value)


def _step_row(timings: dict, bs: int, graph: bool, where: str) -> dict:
    rows = [r for r in timings.get("stages", []) if r["bs"] == bs and bool(r["graph"]) == graph]
    if not rows:
        have = sorted((r["bs"], "graph" if r["graph"] else "eager") for r in timings.get("stages", []))
        raise StageSchemaError(
            f"{where}: no decode steps recorded at this batch size and graph flag; recorded: {have}. "
            "Pick --bs / --eager to match, or run that concurrency."
        )
    return rows[0]


def plain_step_ms(timings: dict, bs: int, graph: bool = True) -> float:
    """Median decode-step wall (host interval between step starts) of a server without speculation."""
    where = f"plain decode step (bs={bs}, {'graph' if graph else 'eager'})"
    wall = _step_row(timings, int(bs), bool(graph), where)["step_interval_ms"].get("median")
    if wall is None:
        raise StageSchemaError("fewer than two consecutive decode steps", where=where, fix="send longer requests")
    return float(wall)


def _system_row(name: str, timings: dict, bs: int, graph: bool) -> dict:
    variant = "graph" if graph else "eager"
    where = f"{name} (bs={bs}, {variant})"
    row = _step_row(timings, bs, graph, where)
    proposal = ((timings.get("proposal") or {}).get("batch_sizes") or {}).get(str(bs), {}).get(variant)
    if not proposal or "lm_head" not in proposal or "spec_head" not in proposal:
        errors = (timings.get("proposal") or {}).get("errors")
        raise StageSchemaError(
            f"{where}: no proposal micro-benchmark at this batch size (errors: {errors}); "
            "set LILICORR_STAGE_TIMING_BS to include it."
        )
    wall = row["step_interval_ms"].get("median")
    if wall is None:
        raise StageSchemaError("fewer than two consecutive decode steps", where=where, fix="send longer requests")
    gpu = row["gpu_ms"]
    verify = _median(gpu, "target_verify", where)
    draft = _median(gpu, "draft_forward", where) + (
        _median(gpu, "draft_sample", where) if "draft_sample" in gpu else 0.0
    )
    lm_head, spec_head = float(proposal["lm_head"]), float(proposal["spec_head"])
    backbone = max(0.0, draft - lm_head - spec_head)
    accept = max(0.0, wall - verify - backbone - lm_head - spec_head)
    return {
        "system": name,
        "variant": variant,
        "n_blocks": row["n_blocks"],
        "per_block_wall": float(wall),
        "forced_commit_len": (timings.get("system") or {}).get("forced_commit_len"),
        "stages": {
            "target_verify": verify,
            "draft_backbone": backbone,
            "lm_head": lm_head,
            "spec_head": spec_head,
            "accept": accept,
        },
    }


def from_timings(docs_by_system: dict, bs: int = 1, graph: bool = True) -> dict:
    """{system: stage-timing JSON of its server} -> a stage-decomposition document (module docstring)."""
    if not docs_by_system:
        raise StageSchemaError("from_timings needs at least one system=timings pair.")
    systems = [_system_row(name, doc, int(bs), bool(graph)) for name, doc in docs_by_system.items()]
    first = next(iter(docs_by_system.values())).get("system") or {}
    return validate(
        {"benchmark": "serving", "device": first.get("gpu", "unknown"), "batch_size": int(bs), "systems": systems}
    )


def _column(s: dict) -> str:
    return f"{s['system']} ({s['variant']})" if s["variant"] else s["system"]


def table(doc: dict) -> str:
    """Stages x systems markdown table, ms per block, lowest speculative-head cost in bold."""
    systems = validate(doc)["systems"]
    lowest_head = min(s["stages"]["spec_head"] for s in systems)
    lines = [
        "| Stage (ms / block) | " + " | ".join(_column(s) for s in systems) + " |",
        "|---|" + "---|" * len(systems),
    ]
    for key, label in STAGES.items():
        vals = [f"{s['stages'][key]:.2f}" for s in systems]
        if key == "spec_head" and len(systems) > 1:
            vals = [f"**{v}**" if s["stages"][key] == lowest_head else v for v, s in zip(vals, systems)]
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    lines.append("| Per-block wall | " + " | ".join(f"{s['per_block_wall']:.2f}" for s in systems) + " |")
    forced = sorted({s["forced_commit_len"] for s in systems if s.get("forced_commit_len")})
    if forced:
        lines += [
            "",
            f"Forced acceptance: every block committed {' / '.join(f'{n:g}' for n in forced)} tokens "
            "(SGLang's SGLANG_SIMULATE_ACC_LEN), whatever verification accepted.",
        ]
    return "\n".join(lines) + "\n"


def draw(ax, doc: dict) -> None:
    """Stacked horizontal bars on `ax`, one per system, one segment per stage."""
    systems = validate(doc)["systems"]
    left = [0.0] * len(systems)
    labels = [_column(s) for s in systems]
    for key, label in STAGES.items():
        widths = [s["stages"][key] for s in systems]
        ax.barh(labels, widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("ms per verification block")
    ax.invert_yaxis()


def plot(doc: dict, out_path: Path) -> Path:
    """draw() as a figure of its own."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.0, 0.6 * len(validate(doc)["systems"]) + 1.4))
    draw(ax, doc)
    ax.legend(fontsize=7, ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    return save(fig, out_path)


def run_step(args) -> int:
    if (args.stages is None) == (not args.timings):
        raise UsageError(
            "give exactly one of a stage-decomposition FILE or --timings SYSTEM=DIR ...",
            where="stages",
            fix="see `python -m benchmarks stages --help`",
        )
    if args.stages is not None and not args.stages.is_file():
        raise UsageError(
            f"{args.stages} is not a file", where="FILE", fix="pass a stage-decomposition JSON (schema: this module's)"
        )
    out = ownership.claim_report_folder(args.out, create=False)
    if args.stages is not None:
        doc = load(args.stages)
    else:
        doc = from_timings({system: load_timings(folder) for system, folder in args.timings}, args.bs, not args.eager)
    ownership.claim_report_folder(out)  # the inputs read: now the folder is made and marked
    if args.stages is None:
        ownership.write_atomic(out / "stages.json", json.dumps(doc, indent=1))
    markdown = table(doc)
    ownership.write_atomic(out / "stages.md", markdown)
    plot(doc, out / "stages.png")
    print(markdown)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks stages`: the decomposition's table and plot, from a JSON or from servers' timings."""
    p = Parser(description=main.__doc__)
    p.add_argument("stages", type=Path, nargs="?", help="a stage-decomposition JSON (schema: this module's docstring)")
    p.add_argument(
        "--timings",
        type=timings_arg,
        nargs="+",
        metavar="SYSTEM=DIR",
        help="LILICORR_STAGE_TIMING folders of the servers, e.g. lilicorr=DIR dflash=DIR",
    )
    p.add_argument("--bs", type=int, default=1, help="batch size (requests per decode step) to report")
    p.add_argument("--eager", action="store_true", help="report the eager (no draft CUDA graph) steps")
    p.add_argument("--out", type=Path, default=Path("bench_report"))
    p.set_defaults(func=run_step)
    return run(p.parse_args(argv))
