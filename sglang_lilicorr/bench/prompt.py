"""The Prompt record every loader returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ..errors import LiLiCorrError


class PromptError(LiLiCorrError, ValueError):
    """A prompt has no id or an empty or blank turn."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark conversation.

    turns are user messages, played in order: each turn is sent with the whole
    conversation so far (earlier user turns and the server's replies to them).
    category is the reporting group: a SPEED-Bench qualitative category, an
    entropy tier of a throughput split, or the dataset name for single-group sets.
    """

    prompt_id: str
    category: str
    turns: Tuple[str, ...]
    source: str = ""

    def __post_init__(self):
        if not self.prompt_id:
            raise PromptError("Prompt.prompt_id is empty: every prompt needs a unique id for resume.")
        if not self.turns or not all(isinstance(t, str) and t.strip() for t in self.turns):
            raise PromptError(
                f"Prompt {self.prompt_id!r} has an empty turn list or a blank turn; "
                "every turn must be a non-empty string."
            )
