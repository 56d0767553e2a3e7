"""The `prompts` step (CPU machine): the held-out evaluation prompts -> testbed/eval_prompts.jsonl (eval_sets.py)."""

from __future__ import annotations

from pathlib import Path

from . import eval_sets


def cmd_prompts(args) -> int:
    rows = eval_sets.sample_sets(args.per_set, args.seed, args.max_chars)
    eval_sets.write(rows, Path(args.file))
    counts = {s: sum(r["set"] == s for r in rows) for s in eval_sets.SETS + eval_sets.WHOLE_SETS}
    print(f"{len(rows)} evaluation prompts -> {args.file}: {counts}")
    return 0
