"""The `long-pack` step (with --long): WORK0's conversations packed into long ones in WORK/data (long_inputs.pack)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import save_json

from . import eval_sets, long_inputs
from .common import Step, to_out


def cmd_long_pack(args) -> int:
    from transformers import AutoTokenizer

    from sglang_lilicorr.jsonl import read_jsonl
    from sglang_lilicorr.train.config import TrainConfig
    from sglang_lilicorr.train.data import checked_messages, render

    source, out = Path(args.source) / "data", Path(args.work) / "data"
    if not args.long:
        raise SystemExit("long-pack belongs to the long-input lineage: pass --long (and a --work of its own).")
    if source.resolve() == out.resolve():
        raise SystemExit(f"long-pack --source {args.source}: that is this --work; pack into another work folder.")
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    chat_kwargs = TrainConfig.__dataclass_fields__["chat_template_kwargs"].default_factory()
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for name in ("train.jsonl", "heldout.jsonl"):
        if not (source / name).is_file():
            raise SystemExit(f"{source / name}: no conversations; run the `data` step in {args.source} first.")
        rows = [{"messages": checked_messages(row, f"{source / name}:{k}")} for k, row in read_jsonl(source / name)]
        lengths = [len(render(tokenizer, r["messages"], False, chat_kwargs)) for r in rows]
        packed = long_inputs.pack(rows, lengths, args.min_tokens, args.seed)
        eval_sets.write(packed, out / name)
        counts[name] = {"conversations": len(rows), "packed": len(packed), "tokens": sum(lengths)}
    save_json(
        out / "manifest.json",
        {"source": str(source), "min_tokens": args.min_tokens, "seed": args.seed, "counts": counts},
    )
    print(json.dumps(counts))
    to_out(args.out, out / "manifest.json")
    return 0


def arguments(parser) -> None:
    parser.add_argument("--source", required=True, help="the work folder whose `data` step wrote the conversations")
    parser.add_argument(
        "--min-tokens", type=int, default=3584, help="each packed conversation renders to at least this many tokens"
    )
    parser.add_argument("--seed", type=int, default=0)


STEP = Step(
    "long-pack", "(with --long) WORK0's conversations packed into long ones in WORK/data", cmd_long_pack, arguments
)
