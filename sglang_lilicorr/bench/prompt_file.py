"""Prompt files: jsonl rows with a unique `id` and user turns (`text` or `messages`), grouped by `set`/`category`."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, List, Optional

from ..errors import LiLiCorrError
from .prompt import Prompt
from .speed_bench import FIX_RECORD, read_records


class PromptFileError(LiLiCorrError, ValueError):
    """A prompt file row lacks an id or a user turn, or repeats an id."""


def _turns(row: dict, where: str) -> tuple:
    if isinstance(row.get("text"), str):
        return (row["text"],)
    messages = row.get("messages")
    if (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and m.get("role") == "user" for m in messages)
    ):
        return tuple(m.get("content") for m in messages)
    raise PromptFileError(
        "give the prompt as `text` (a string) or `messages` (a list of {role: user, content} dicts)",
        where=where,
        fix=FIX_RECORD,
    )


def load(path: Path, categories: Optional[Iterable[str]] = None) -> List[Prompt]:
    """Prompts of a prompt file in file order, optionally only those of some groups (`set`/`category`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Prompt file {path} does not exist; check the path given to --dataset.")
    rows = read_records(path)
    if not rows:
        raise PromptFileError(f"{path} holds no prompts.")
    prompts, seen = [], set()
    for lineno, row in enumerate(rows, 1):
        where = f"{path} row {lineno}"
        if "question_id" in row:
            raise PromptFileError(
                f"{where} looks like a SPEED-Bench record; name the file after its split (qualitative.jsonl, "
                "throughput_1k.jsonl, ...) so that the SPEED-Bench loader reads it."
            )
        prompt_id = str(row.get("id") or "")
        if not prompt_id:
            raise PromptFileError("every row needs a non-empty `id`", where=where, fix=FIX_RECORD)
        if prompt_id in seen:
            raise PromptFileError(f"duplicate id {prompt_id!r}", where=where, fix=FIX_RECORD)
        seen.add(prompt_id)
        group = str(row.get("set") or row.get("category") or path.stem)
        prompts.append(Prompt(prompt_id, group, _turns(row, where), f"file/{path.name}"))
    if categories:
        unknown = set(categories) - {p.category for p in prompts}
        if unknown:
            raise ValueError(
                f"{path}: no prompts in set(s) {sorted(unknown)}; it has {sorted({p.category for p in prompts})}."
            )
        prompts = [p for p in prompts if p.category in set(categories)]
    return prompts
