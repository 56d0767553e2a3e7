"""The Prompt record every loader returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ..errors import LiLiCorrError


class PromptError(LiLiCorrError, ValueError):
    """A prompt has no id or an empty or blank turn."""


@dataclass(frozen=True)
class Prompt:
    """One conversation: `turns` are user messages, each sent with the conversation so far; `category` groups it."""

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
