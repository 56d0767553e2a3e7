"""The `export` step: each variant's final checkpoint -> WORK/drafts/<variant> (checked by loading it), a tarball and
its metrics copied to $OUT."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

from benchmarks import save_json

from .common import Step, metrics_rows, to_out
from .variants import VARIANTS


def cmd_export(args) -> int:
    from sglang_lilicorr.train.export import export_checkpoint
    from sglang_lilicorr.train.heads import load_exported_draft

    plan = json.loads((Path(args.work) / "train_config.json").read_text())
    for name in plan["variants"]:
        run_dir = Path(args.work) / "runs" / name
        rows = metrics_rows(run_dir)
        if not rows:
            print(f"[export] {name}: no metrics yet, skipped")
            continue
        draft = export_checkpoint(run_dir, Path(args.work) / "drafts" / name, "bfloat16", force=True)
        load_exported_draft(draft)
        save_json(
            draft / "testbed.json",
            {
                "variant": name,
                "objective": VARIANTS[name],
                "init": (plan.get("init") or {}).get(name),
                "step": rows[-1]["step"],
                "total_steps": rows[-1].get("total_steps"),
                "train_config": plan["options"],
                "global_batch": plan.get("global_batch"),
                "data_sha256": plan.get("data_sha256"),
            },
        )
        tar = Path(args.work) / "drafts" / f"draft_{name}.tar"
        with tarfile.open(tar, "w") as t:
            t.add(draft, arcname=name)
        shutil.copy(run_dir / "metrics.jsonl", Path(args.work) / "drafts" / f"metrics_{name}.jsonl")
        print(f"[export] {name}: step {rows[-1]['step']} -> {draft} ({tar.stat().st_size / 2**20:.1f} MiB)")
        to_out(args.out, tar, Path(args.work) / "drafts" / f"metrics_{name}.jsonl")
    return 0


STEP = Step("export", "final checkpoints -> WORK/drafts/<variant>, copies to $OUT", cmd_export)
