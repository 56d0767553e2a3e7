"""The `prompts` step (CPU machine): the held-out evaluation prompts -> benchmarks/testbed/eval_prompts.jsonl
(eval_sets.py)."""

from __future__ import annotations

from pathlib import Path

from . import eval_sets
from .common import Step


def cmd_prompts(args) -> int:
    rows = eval_sets.sample_sets(args.per_set, args.seed, args.max_chars)
    eval_sets.write(rows, Path(args.file))
    counts = {s: sum(r["set"] == s for r in rows) for s in eval_sets.SETS + eval_sets.WHOLE_SETS}
    print(f"{len(rows)} evaluation prompts -> {args.file}: {counts}")
    return 0


def arguments(parser) -> None:
    parser.add_argument("--per-set", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-chars", type=int, default=3000, help="skip longer prompts")
    parser.add_argument("--file", default=str(eval_sets.DEFAULT_FILE))


STEP = Step(
    "prompts", "CPU machine: the held-out eval prompts -> benchmarks/testbed/eval_prompts.jsonl", cmd_prompts, arguments
)
