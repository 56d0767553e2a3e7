"""Dataset registry: a name or a SPEED-Bench file -> (dataset name, prompts)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from . import packaged, prompt_file, speed_bench
from .prompt import Prompt

# WritingBench is benchmarked on a fixed sample, as in the issue; others run whole unless --limit.
DEFAULT_LIMITS = {"writingbench": 100}


def names() -> List[str]:
    return sorted(packaged.LOADERS)


def sample(prompts: Sequence[Prompt], limit: Optional[int], seed: int = 0) -> List[Prompt]:
    """A seeded sample of `limit` prompts in their original order (all of them if limit is None)."""
    if limit is None or limit >= len(prompts):
        return list(prompts)
    if limit <= 0:
        raise ValueError(f"limit must be positive, got {limit}.")
    return [prompts[i] for i in sorted(random.Random(seed).sample(range(len(prompts)), limit))]


def load_prompts(
    spec: str, limit: Optional[int] = None, categories: Optional[Sequence[str]] = None
) -> Tuple[str, List[Prompt]]:
    """Prompts of a packaged set (`gsm8k`, ...), a SPEED-Bench split file or a prompt file (.jsonl)."""
    path = Path(spec)
    if path.suffix == ".jsonl" and path.stem not in speed_bench.SPLITS:
        prompts, name = prompt_file.load(path, categories=categories), path.stem
    elif path.suffix in (".parquet", ".jsonl", ".json"):
        prompts, name = speed_bench.load(path, categories=categories), f"speed_{path.stem}"
    elif spec in packaged.LOADERS:
        if categories:
            raise ValueError(f"--category applies to SPEED-Bench files only; {spec} has one category.")
        prompts, name = packaged.LOADERS[spec](), spec
        limit = limit if limit is not None else DEFAULT_LIMITS.get(spec)
    else:
        raise ValueError(
            f"Unknown dataset {spec!r}: give one of {names()}, the path of a SPEED-Bench split "
            "file (.parquet or .jsonl) or of a prompt file (.jsonl)."
        )
    return name, sample(prompts, limit)
